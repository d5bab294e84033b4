"""Made on the GPU machine: an eager FP8 per-tensor Linear (``cuda_per_tensor_forward`` below) against ModelOpt's
FP8 per-tensor GEMM (``fp8_per_tensor_gemm``, what a server runs), bit for bit and in CPU time per call.

1. Linears at the Nano's four widths (and the tiny model's), quantized and compressed by ModelOpt with random bf16
   weights, on normal, outlier-channel and subnormal-heavy inputs of several token counts: differing bf16 outputs,
   and the time of 200 calls of each path at 1 and 333 tokens (GPU synchronised).
2. With ``FIXTURE BUILD``: 4 policy rollouts of the tiny RTN build through diffusers, ModelOpt's path vs eager:
   differing actions.

Usage: python3 bench/gpu_fast_deployed_check.py OUT.json [FIXTURE BUILD]
"""

from __future__ import annotations

import functools
import json
import sys
import time
import types
from pathlib import Path
from typing import Any

import torch

from release.core.fp8 import FP8_MAX


def cuda_per_tensor_forward(self: Any, input: torch.Tensor, *args: Any, scales: tuple[torch.Tensor, torch.Tensor],
                            **kwargs: Any) -> torch.Tensor:
    """The candidate: ModelOpt's FP8 per-tensor GEMM on CUDA (``fp8_per_tensor_gemm``) as eager PyTorch, the same fp32
    quotient of the input by scale_a, clamped and cast to FP8, and a ``torch._scaled_mm`` call of the same arguments,
    without the per-call ``torch.compile`` guards and checks. ``scales``: (scale_a, scale_b), amax / 448.0 in fp32."""
    scale_a, scale_b = scales
    codes = (input.float() / scale_a).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = torch._scaled_mm(codes.reshape(-1, codes.shape[-1]), self.weight.data.t(), scale_a=scale_a,
                           scale_b=scale_b, bias=self.bias, out_dtype=input.dtype, use_fast_accum=True)
    return out.reshape(*input.shape[:-1], out.shape[-1])


def scales(module: Any) -> tuple[torch.Tensor, torch.Tensor]:
    device = module.weight.device  # a restored build may keep its amax buffers on the CPU
    return (module.input_quantizer.amax.float().to(device) / 448.0,
            module.weight_quantizer.amax.float().to(device) / 448.0)


def linear(k: int, n: int, bias: bool, calib: torch.Tensor) -> Any:
    import modelopt.torch.quantization as mtq
    import modelopt.torch.quantization.backends.fp8_per_tensor_gemm  # noqa: F401  (registers the kernel)

    model = torch.nn.Sequential(torch.nn.Linear(k, n, bias=bias)).cuda().to(torch.bfloat16)
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, forward_loop=lambda m: m(calib))
    mtq.compress(model)
    return model[0]


def inputs(g: torch.Generator, m: int, k: int, kind: str) -> torch.Tensor:
    x = torch.randn(m, k, device="cuda", generator=g)
    if kind == "outliers":
        x[:, torch.randint(0, k, (max(1, k // 64),), device="cuda", generator=g)] *= 60
    if kind == "subnormal":  # the calibration's amax is set by outliers: ordinary channels land below 2^-6
        x = x * 1e-3
        x[:, :2] = 300.0
    return x.to(torch.bfloat16)


def timed(fn: Any, x: torch.Tensor, calls: int = 200) -> float:
    for _ in range(10):
        fn(x)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(x)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def modules_check() -> list[dict[str, Any]]:
    g = torch.Generator(device="cuda").manual_seed(20261201)
    rows = []
    with torch.no_grad():
        for k, n in ((4096, 4096), (4096, 1024), (4096, 12288), (12288, 4096), (64, 128), (128, 64)):
            for bias in (False, True):
                for kind in ("normal", "outliers", "subnormal"):
                    calib = inputs(g, 256, k, "outliers" if kind == "subnormal" else kind) * 4
                    module = linear(k, n, bias, calib)
                    row: dict[str, Any] = {"k": k, "n": n, "bias": bias, "kind": kind,
                                           "module": type(module).__name__, "weight": str(module.weight.dtype)}
                    eager = functools.partial(cuda_per_tensor_forward, module, scales=scales(module))
                    differ = total = 0
                    try:
                        for shape in ((1, k), (77, k), (333, k), (2, 77, k)):
                            x = inputs(g, int(torch.tensor(shape[:-1]).prod()), k, kind).reshape(shape)
                            ref, out = module(x), eager(x)
                            differ += int((ref.view(torch.int16) != out.view(torch.int16)).sum())
                            total += ref.numel()
                    except Exception as exc:  # recorded, so that one failure does not cost the other cases
                        row["error"] = f"{type(exc).__name__}: {exc}"[:200]
                    row.update(differ=differ, of=total)
                    if kind == "normal" and not bias and "error" not in row:
                        for m in (1, 333):
                            x = inputs(g, m, k, kind)
                            row[f"us_per_call_modelopt_m{m}"] = timed(module, x)
                            row[f"us_per_call_eager_m{m}"] = timed(eager, x)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    return rows


def rollouts_check(fixture: Path, build: Path) -> dict[str, Any]:
    from release.core.builds import load_release
    from release.inputs.observations import load_observations
    from release.inputs.policy import load_pipeline, rollout
    from release.quantize.load import deployed_transformer
    from release.quantize.recipes import quantized_linears

    settings = load_release().policy
    observations = load_observations(fixture / "observations")[:4]
    kwargs = {"mixed_precision_format": "none"}
    actions: dict[str, list[Any]] = {}
    seconds: dict[str, float] = {}
    for label in ("modelopt", "eager"):
        model = deployed_transformer(build)
        if label == "eager":
            for name in quantized_linears(model):
                module = model.get_submodule(name)
                module.forward = types.MethodType(functools.partial(cuda_per_tensor_forward, scales=scales(module)),
                                                  module)
        pipe = load_pipeline(fixture / "source", settings, transformer=model)
        rollout(pipe, observations[0], settings, **kwargs)  # warm-up
        torch.cuda.synchronize()
        start = time.perf_counter()
        actions[label] = [rollout(pipe, o, settings, **kwargs) for o in observations]
        torch.cuda.synchronize()
        seconds[label] = (time.perf_counter() - start) / len(observations)
    differ = sum(int((a != b).sum()) for a, b in zip(actions["modelopt"], actions["eager"], strict=True))
    return {"rollouts": len(observations), "differing_action_values": differ,
            "values": sum(a.size for a in actions["modelopt"]), "seconds_per_rollout": seconds}


if __name__ == "__main__":
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "modules": modules_check()}
    if len(sys.argv) > 3:
        result["rollouts"] = rollouts_check(Path(sys.argv[2]), Path(sys.argv[3]))
        print(json.dumps(result["rollouts"]), flush=True)
    Path(sys.argv[1]).write_text(json.dumps(result, indent=1))
