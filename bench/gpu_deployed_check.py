"""Made on the GPU machine: the deployed path's emulation against ModelOpt's FP8 GEMM on an H200, on one device.

Usage (CUDA machine, nvidia-modelopt and diffusers importable):
    python3 bench/gpu_deployed_check.py OUT_DIR FIXTURE_DIR BUILD_DIR [rollouts]   (rollouts: part 2 only)

1. GEMMs at the Nano's widths (hidden 4096, MLP 12288) for several token counts: ``torch._scaled_mm`` with fast
   accumulation (fp32 out, unit scales) against ``release.core.fp8.hopper_accumulate`` run on the same GPU, on
   FP8 codes of N(0, 1) data: how many outputs differ (cuBLAS splitting K shows here).
2. The tiny build's deployed rollouts on the GPU for every validation observation, once with ModelOpt's FP8 GEMM
   and once with the emulation (also on the GPU, so that nothing else differs): every FP8 Linear output of every
   transformer call compared bit for bit, and the action chunks.
Writes ``OUT_DIR/deployed_check.json`` and prints it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

TOKENS = (64, 256, 1024, 4096)
WIDTHS = ((4096, 4096), (4096, 12288), (12288, 4096))  # (in, out)


def gemm_sweep() -> list[dict]:
    from release.core.fp8 import hopper_accumulate

    gen = torch.Generator(device="cuda").manual_seed(0)
    one = torch.ones((), device="cuda")
    rows = []
    for m in TOKENS:
        for k, n in WIDTHS:
            a = torch.randn(m, k, device="cuda", generator=gen)
            b = torch.randn(n, k, device="cuda", generator=gen)
            a = (a * (448 / a.abs().max())).to(torch.float8_e4m3fn)
            b = (b * (448 / b.abs().max())).to(torch.float8_e4m3fn)
            kernel = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                      use_fast_accum=True)
            t0 = time.time()
            emulated = hopper_accumulate(a, b, max_elements=1 << 27)
            torch.cuda.synchronize()
            differ = int((kernel.view(torch.int32) != emulated.view(torch.int32)).sum())
            rows.append({"tokens": m, "in": k, "out": n, "differ": differ, "of": m * n,
                         "emulation_s": round(time.time() - t0, 2)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def rollouts(fixture: Path, build: Path, emulate: bool) -> tuple[np.ndarray, list[torch.Tensor], float]:
    """Actions [N, chunk, 8] for every validation observation and every FP8 Linear output, in call order."""
    from release.core.builds import load_release
    from release.inputs.observations import load_observations
    from release.inputs.policy import load_pipeline, rollout
    from release.measure.evaluate import select
    from release.quantize.load import deployed_transformer
    from release.quantize.recipes import quantized_linears

    release = load_release()
    model = deployed_transformer(build, emulate=emulate)
    outputs: list[torch.Tensor] = []
    for name in quantized_linears(model):
        model.get_submodule(name).register_forward_hook(lambda mod, args, out: outputs.append(out.detach().cpu()))
    pipe = load_pipeline(fixture / "source", release.policy, transformer=model)
    pipe.to("cuda")
    obs = select(load_observations(fixture / "observations"), release, "validation")
    t0 = time.time()
    actions = np.stack([rollout(pipe, o, release.policy, mixed_precision_format="none") for o in obs])
    return actions, outputs, time.time() - t0


def main(out: Path, fixture: Path, build: Path, parts: str = "all") -> None:
    report: dict = {"torch": torch.__version__, "device": torch.cuda.get_device_name(),
                    "gemms": gemm_sweep() if parts == "all" else None}
    kernel, kernel_out, kernel_s = rollouts(fixture, build, emulate=False)
    emulated, emulated_out, emulated_s = rollouts(fixture, build, emulate=True)
    same = [bool(torch.equal(a, b)) for a, b in zip(kernel_out, emulated_out, strict=True)]
    report["tiny_rollouts"] = {
        "observations": len(kernel), "fp8_linear_calls": len(same), "fp8_linear_calls_bit_equal": sum(same),
        "actions_bit_equal": bool(np.array_equal(kernel, emulated)),
        "max_abs_action_difference": float(np.abs(kernel - emulated).max()),
        "kernel_s": round(kernel_s, 1), "emulation_s": round(emulated_s, 1)}
    (out / "deployed_check.json").write_text(json.dumps(report, indent=1))
    print(json.dumps(report["tiny_rollouts"], indent=1))


if __name__ == "__main__":
    main(*(Path(p) for p in sys.argv[1:4]), *sys.argv[4:5])
