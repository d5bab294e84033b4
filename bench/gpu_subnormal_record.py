"""Made on the GPU machine: what Hopper's FP8 GEMM (``torch._scaled_mm`` with fast accumulation, unit scales, fp32
out) returns on inputs whose FP8 codes are subnormal, so the CPU model of its accumulation can be fitted there too.

Usage (CUDA machine, torch only): python3 bench/gpu_subnormal_record.py OUT_PREFIX
(writes OUT_PREFIX-step.npz, -act.npz, -splitk.npz and -rowwise.npz, each below 16 MiB)

Every case stores its codes ``<tag>/a`` [M, K], ``<tag>/b`` [N, K] (uint8) and the kernel's ``<tag>/acc`` (fp32 bits
as int32). Cases (numpy PCG64, seeded, so a CPU can redraw them too):
- ``step``: one k-step (K = 32) and two (K = 64), codes drawn from chosen classes for a and for b: ``sub``
  (exponent field 0: 0.mmm x 2^-6), ``low`` (exponent fields 1-3), ``any`` (every finite code), ``mix`` (half
  ``sub``, half ``any`` per row);
- ``act``: activations as a per-tensor amax set by outlier channels leaves them (normal data ~1e-3 cast to FP8,
  a few channels at full scale), against normal weights, at model widths, K not a multiple of 32 included;
- ``splitk``: normal data at shapes where cuBLAS may split K across thread blocks (64 x 12288 x 256 was seen);
- ``rowwise``: the per-channel family's kernel, row-wise fp32 scales ``<tag>/sa`` [M, 1] and ``<tag>/sb`` [1, N],
  a bf16 bias ``<tag>/bias`` and bf16 output ``<tag>/out`` (bits as int16) beside the unit-scale ``acc``, on
  subnormal-heavy and mixed-magnitude rows.
"""

from __future__ import annotations

import sys

import numpy as np
import torch

CLASSES = ("sub", "low", "any", "mix")


def draw(rng: np.random.Generator, shape: tuple[int, int], kind: str) -> np.ndarray:
    sign = rng.integers(0, 2, size=shape, dtype=np.uint8) << 7
    if kind == "sub":
        return (sign | rng.integers(0, 8, size=shape, dtype=np.uint8)).astype(np.uint8)
    if kind == "low":
        return (sign | rng.integers(8, 32, size=shape, dtype=np.uint8)).astype(np.uint8)
    if kind == "any":
        c = rng.integers(0, 127, size=shape, dtype=np.uint8)  # 0x7F is NaN
        return (sign | c).astype(np.uint8)
    sub, other = draw(rng, shape, "sub"), draw(rng, shape, "any")
    return np.where(rng.random(shape) < 0.5, sub, other).astype(np.uint8)


def activations(rng: np.random.Generator, m: int, k: int, sigma: float = 1e-3) -> np.ndarray:
    """N(0, sigma) with k // 64 outlier channels at ~400: a per-tensor amax of 448 leaves most codes subnormal."""
    x = rng.standard_normal((m, k)).astype(np.float32) * sigma
    x[:, rng.choice(k, max(1, k // 64), replace=False)] *= 400 / sigma
    x = np.clip(x, -448, 448)
    return torch.from_numpy(x).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def normal(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    x = rng.standard_normal(shape).astype(np.float32)
    return torch.from_numpy(x * (448 / np.abs(x).max())).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def kernel(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    one = torch.ones((), device="cuda")
    ta = torch.from_numpy(a).cuda().view(torch.float8_e4m3fn)
    tb = torch.from_numpy(b).cuda().view(torch.float8_e4m3fn)
    out = torch._scaled_mm(ta, tb.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
    return out.view(torch.int32).cpu().numpy()


def main(path: str) -> None:
    rng = np.random.default_rng(20261201)
    arrays: dict[str, np.ndarray] = {}

    def case(tag: str, a: np.ndarray, b: np.ndarray) -> None:
        arrays[f"{tag}/a"], arrays[f"{tag}/b"], arrays[f"{tag}/acc"] = a, b, kernel(a, b)

    for k in (32, 64):
        for ca in CLASSES:
            for cb in CLASSES:
                case(f"step_{ca}_{cb}_k{k}", draw(rng, (64, k), ca), draw(rng, (64, k), cb))
    for m, k, n in ((16, 48, 64), (77, 4096, 256), (128, 1040, 256), (64, 12288, 128), (200, 4096, 256)):
        case(f"act_{m}x{k}x{n}", activations(rng, m, k), normal(rng, (n, k)))
        case(f"act4_{m}x{k}x{n}", activations(rng, m, k, 4e-3), normal(rng, (n, k)))
        case(f"actboth_{m}x{k}x{n}", activations(rng, m, k), activations(rng, n, k))
    for m, k, n in ((64, 12288, 256), (32, 12288, 256), (64, 8192, 256), (16, 16384, 128), (64, 4096, 256)):
        case(f"splitk_{m}x{k}x{n}", normal(rng, (m, k)), normal(rng, (n, k)))
    for m, k, n in ((64, 4096, 256), (96, 1040, 128)):
        for kind in ("act", "mix"):
            tag = f"rowwise_{kind}_{m}x{k}x{n}"
            a = activations(rng, m, k) if kind == "act" else draw(rng, (m, k), "mix")
            b = normal(rng, (n, k))
            case(tag, a, b)
            sa = rng.uniform(1e-4, 1e-1, size=(m, 1)).astype(np.float32)
            sb = rng.uniform(1e-4, 1e-2, size=(1, n)).astype(np.float32)
            bias = torch.from_numpy(rng.standard_normal(n).astype(np.float32)).to(torch.bfloat16)
            out = torch._scaled_mm(torch.from_numpy(a).cuda().view(torch.float8_e4m3fn),
                                   torch.from_numpy(b).cuda().view(torch.float8_e4m3fn).t(),
                                   scale_a=torch.from_numpy(sa).cuda(), scale_b=torch.from_numpy(sb).cuda(),
                                   bias=bias.cuda(), out_dtype=torch.bfloat16, use_fast_accum=True)
            arrays[f"{tag}/sa"], arrays[f"{tag}/sb"] = sa, sb
            arrays[f"{tag}/bias"] = bias.view(torch.int16).numpy()
            arrays[f"{tag}/out"] = out.view(torch.int16).cpu().numpy()
    for group in ("step", "act", "splitk", "rowwise"):
        mine = {k: v for k, v in arrays.items() if k.split("_")[0].rstrip("0123456789").removesuffix("both") == group}
        np.savez_compressed(f"{path}-{group}.npz", device=np.array(torch.cuda.get_device_name()),
                            torch=np.array(torch.__version__), **mine)
        print(f"{group}: {len({k.rsplit('/', 1)[0] for k in mine})} cases -> {path}-{group}.npz")


if __name__ == "__main__":
    main(sys.argv[1])
