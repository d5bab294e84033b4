"""GPU probe: how CUDA forms FP8 codes (w / (amax / 448)).to(fp8) for bf16 weights, bf16 or fp32 amax.

Usage: python bench/gpu_rounding_probe.py  (on a CUDA machine); prints JSON with the number of codes that differ
between the GPU and each CPU formula.
"""

from __future__ import annotations

import json

import torch


def codes(w: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    return (w / (amax / 448.0)).to(torch.float8_e4m3fn).view(torch.uint8)


def _fp8(quotient: torch.Tensor) -> torch.Tensor:
    return quotient.to(torch.bfloat16).to(torch.float8_e4m3fn).view(torch.uint8)


def main() -> None:
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(256, 1024, generator=g) * 0.05).to(torch.bfloat16)
    report: dict[str, dict[str, int]] = {}
    for amax_dtype in (torch.bfloat16, torch.float32):
        diffs = {"cpu_native": 0, "emul_bf16_scale_recip": 0, "emul_f32_scale_div": 0, "emul_bf16_scale_div": 0}
        for i in range(200):
            a = w.abs().max().float() * (0.5 + i / 200)
            amax = a.to(amax_dtype)
            gpu = codes(w.cuda(), amax.cuda()).cpu()
            cpu = codes(w, amax)
            s_recip = (amax.float() * torch.tensor(1 / 448.0, dtype=torch.float32)).to(torch.bfloat16)
            s_div = (amax.float() / 448.0)
            cands = {
                "cpu_native": cpu,
                "emul_bf16_scale_recip": _fp8(w.float() / s_recip.float()),
                "emul_f32_scale_div": _fp8(w.float() / s_div),
                "emul_bf16_scale_div": _fp8(w.float() / s_div.to(torch.bfloat16).float()),
            }
            for k, c in cands.items():
                diffs[k] += int((c != gpu).sum())
        report[str(amax_dtype)] = diffs
    report["total_codes"] = {"n": 200 * w.numel()}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
