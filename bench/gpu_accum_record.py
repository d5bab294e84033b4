"""Made on the GPU machine: records what Hopper's FP8 GEMM returns, so its arithmetic can be modelled on a CPU.

Usage (CUDA machine, nvidia-modelopt and diffusers importable, the tiny fixture and RTN build at the paths given):
    python3 bench/gpu_accum_record.py OUT_DIR FIXTURE_DIR BUILD_DIR

Writes two files:
- ``accum.npz``: for GEMM shapes (tokens, in, out) of the tiny model and of the Nano, FP8 codes drawn with numpy
  (PCG64, so a CPU can redraw them) and ``torch._scaled_mm`` on them with fast accumulation: fp32 output at unit
  scales (the raw accumulator) and bf16 output with scales and a bias (the epilogue), and fp32 output without fast
  accumulation for comparison.
- ``modules.npz``: every quantized Linear of the tiny RTN build in its first transformer call of a deployed rollout
  on the GPU (ModelOpt's FP8 GEMM): the bf16 input, the bf16 output, the weight codes and both amax values.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

# (tokens, in, out): the tiny model's GEMMs (84/164/213 tokens), then Nano widths (4096 hidden, 12288 MLP)
SHAPES = [(84, 64, 32), (84, 64, 128), (213, 64, 64), (213, 128, 64), (164, 64, 128), (64, 32, 64),
          (64, 256, 64), (64, 1024, 64), (64, 4096, 256), (64, 12288, 256), (256, 4096, 4096)]
BIG = 64 * 4096  # outputs above this many elements are stored for their first 256 columns only


def codes(rng: np.random.Generator, shape: tuple[int, int], kind: str) -> np.ndarray:
    """FP8 E4M3 codes as uint8: 'wide' spans every finite code, 'normal' is N(0,1) scaled so amax hits 448."""
    if kind == "wide":
        c = rng.integers(0, 256, size=shape, dtype=np.uint8)
        return np.where((c & 0x7F) == 0x7F, c ^ 0x01, c).astype(np.uint8)  # no NaN codes
    x = rng.standard_normal(shape).astype(np.float32)
    x = torch.from_numpy(x * (448.0 / np.abs(x).max()))
    return x.to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def record_gemms(out: Path) -> None:
    rng = np.random.default_rng(20261130)
    arrays: dict[str, np.ndarray] = {}
    one = torch.ones((), device="cuda")
    for m, k, n in SHAPES:
        for kind in ("wide", "normal"):
            tag = f"{m}x{k}x{n}_{kind}"
            a_np, b_np = codes(rng, (m, k), kind), codes(rng, (n, k), kind)
            scale_a = np.float32(rng.uniform(1e-3, 1e-1))
            scale_b = np.float32(rng.uniform(1e-4, 1e-2))
            bias = rng.standard_normal(n).astype(np.float32)
            a = torch.from_numpy(a_np).cuda().view(torch.float8_e4m3fn)
            b = torch.from_numpy(b_np).cuda().view(torch.float8_e4m3fn)
            sa = torch.tensor(scale_a, device="cuda")
            sb = torch.tensor(scale_b, device="cuda")
            bias_t = torch.from_numpy(bias).cuda().to(torch.bfloat16)
            res = {
                "acc_fast": torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                             use_fast_accum=True),
                "acc_slow": torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32,
                                             use_fast_accum=False),
                "bf16_fast": torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, out_dtype=torch.bfloat16,
                                              use_fast_accum=True),
                "bf16_bias_fast": torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias_t,
                                                   out_dtype=torch.bfloat16, use_fast_accum=True),
            }
            keep = slice(None) if m * n <= BIG else slice(0, 256)
            if m * n <= BIG:
                arrays[f"{tag}/a"], arrays[f"{tag}/b"] = a_np, b_np
            for key, val in res.items():
                v = val[:, keep].cpu()
                arrays[f"{tag}/{key}"] = (v.view(torch.int16) if v.dtype == torch.bfloat16 else v).numpy()
            arrays[f"{tag}/scales"] = np.array([scale_a, scale_b], dtype=np.float32)
            arrays[f"{tag}/bias"] = bias_t.cpu().view(torch.int16).numpy()
    np.savez_compressed(out / "accum.npz", **arrays)


def record_modules(out: Path, fixture: Path, build: Path) -> None:
    from release.core.builds import load_release
    from release.inputs.observations import load_observations
    from release.inputs.policy import load_pipeline, rollout
    from release.quantize.load import deployed_transformer
    from release.quantize.recipes import quantized_linears

    release = load_release()
    model = deployed_transformer(build)
    arrays: dict[str, np.ndarray] = {}
    hooks = []
    seen: set[str] = set()

    def hook(name: str):
        def fn(module, args, output):
            if name in seen:
                return
            seen.add(name)
            arrays[f"{name}/input"] = args[0].detach().cpu().view(torch.int16).numpy()
            arrays[f"{name}/output"] = output.detach().cpu().view(torch.int16).numpy()
            arrays[f"{name}/weight"] = module.weight.data.cpu().view(torch.uint8).numpy()
            arrays[f"{name}/amax"] = np.array([float(module.input_quantizer.amax),
                                               float(module.weight_quantizer.amax)], dtype=np.float32)
            if module.bias is not None:
                arrays[f"{name}/bias"] = module.bias.detach().cpu().view(torch.int16).numpy()
        return fn

    for name in quantized_linears(model):
        hooks.append(model.get_submodule(name).register_forward_hook(hook(name)))
    pipe = load_pipeline(fixture / "source", release.policy, transformer=model)
    pipe.to("cuda")
    obs = load_observations(fixture / "observations")
    actions = rollout(pipe, obs[0], release.policy, mixed_precision_format="none")
    arrays["actions"] = actions
    np.savez_compressed(out / "modules.npz", **arrays)


if __name__ == "__main__":
    out_dir, fixture_dir, build_dir = (Path(p) for p in sys.argv[1:4])
    record_gemms(out_dir)
    record_modules(out_dir, fixture_dir, build_dir)
    print("recorded", sorted(p.name for p in out_dir.iterdir()))
