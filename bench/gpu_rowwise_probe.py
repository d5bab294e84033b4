"""Which epilogue the row-wise FP8 GEMM (``torch._scaled_mm`` with [M, 1] and [1, N] fp32 scales, fast accumulation)
applies after Hopper's accumulation: each candidate order of the scales and the bias is computed exactly from the
kernel's own unit-scale accumulator (the same codes through ``_scaled_mm`` at scales 1) and compared with the
kernel's bf16 output, on random shapes at the Nano's widths, with and without a bias.

Usage: python3 bench/gpu_rowwise_probe.py OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def candidates(acc: torch.Tensor, sa: torch.Tensor, sb: torch.Tensor,
               bias: torch.Tensor | None) -> dict[str, torch.Tensor]:
    b = 0 if bias is None else bias.float()
    b64 = 0 if bias is None else bias.double()
    return {
        "(acc * sa) * sb + bias": acc * sa * sb + b,
        "(acc * sb) * sa + bias": acc * sb * sa + b,
        "acc * (sa * sb) + bias": acc * (sa * sb) + b,
        "fma((acc * sb), sa, bias)": ((acc * sb).double() * sa.double() + b64).float(),
        "fma((acc * sa), sb, bias)": ((acc * sa).double() * sb.double() + b64).float(),
    }


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator(device="cuda").manual_seed(0)
    counts: dict[str, dict[str, int]] = {}
    total = 0
    for m, k, n in [(64, 4096, 4096), (256, 4096, 1024), (77, 4096, 12288), (200, 12288, 4096), (33, 1024, 256)]:
        for with_bias in (False, True):
            a = (torch.randn(m, k, device="cuda", generator=gen) * 60).to(torch.float8_e4m3fn)
            w = (torch.randn(n, k, device="cuda", generator=gen) * 60).to(torch.float8_e4m3fn)
            sa = torch.rand(m, 1, device="cuda", generator=gen) * 0.01 + 1e-4
            sb = torch.rand(1, n, device="cuda", generator=gen) * 0.01 + 1e-4
            bias = (torch.randn(n, device="cuda", generator=gen)).to(torch.bfloat16) if with_bias else None
            one_a = one_b = torch.ones((), device="cuda")  # tensor-wise unit scales: fp32 out (cuBLAS, same MMA)
            acc = torch._scaled_mm(a, w.t(), scale_a=one_a, scale_b=one_b, out_dtype=torch.float32,
                                   use_fast_accum=True)
            kernel = torch._scaled_mm(a, w.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16,
                                      use_fast_accum=True)
            total += kernel.numel()
            for name, value in candidates(acc, sa, sb, bias).items():
                key = "with bias" if with_bias else "no bias"
                counts.setdefault(name, {}).setdefault(key, 0)
                same = value.to(torch.bfloat16).view(torch.int16) == kernel.view(torch.int16)
                counts[name][key] += int((~same).sum())
    print(f"{total} outputs in all")
    print("| epilogue | differ (no bias) | differ (with bias) |\n|---|---:|---:|")
    for name, c in counts.items():
        print(f"| {name} | {c.get('no bias', 0)} | {c.get('with bias', 0)} |")
    (out / "rowwise_probe.json").write_text(json.dumps({"outputs": total, "differ": counts}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
