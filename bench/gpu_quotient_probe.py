"""Made on the GPU machine: how ModelOpt's ``torch.compile``d input quantization (``fp8_per_tensor_gemm._to_fp8``,
``(x / scale).clamp(-448, 448).to(float8_e4m3fn)``) forms the quotient, against candidate formulas a CPU can
reproduce: IEEE division, multiplication by a correctly rounded fp32 reciprocal, multiplication by CUDA's
``torch.reciprocal``.

For each of 64 random scales and 2^20 bf16 inputs (normal, and with outlier channels), it compares the FP8 codes
and, through a compiled ``x / scale`` of the same form, the fp32 quotients. Prints one JSON line per formula.
Run with TORCH_LOGS=output_code to see the Triton source inductor generated.
Usage: python3 bench/gpu_quotient_probe.py
"""

from __future__ import annotations

import json

import torch
from modelopt.torch.quantization.backends.fp8_per_tensor_gemm import _to_fp8


@torch.compile(dynamic=True)
def _quotient(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return x / scale  # the same graph as _to_fp8 up to the cast (bf16 x, fp32 0-dim scale)


def main() -> None:
    g = torch.Generator(device="cuda").manual_seed(20261201)
    counts: dict[str, list[int]] = {}
    for i in range(64):
        x = torch.randn(1024, 1024, device="cuda", generator=g)
        if i % 2:
            x[:, torch.randint(0, 1024, (16,), device="cuda", generator=g)] *= 60
        x = x.to(torch.bfloat16)
        amax = x.abs().max().float() * torch.empty((), device="cuda").uniform_(0.5, 4, generator=g)
        scale = (amax / 448.0).float()
        kernel = _to_fp8(x, scale).view(torch.uint8)
        q_kernel = _quotient(x, scale).float()
        recip_cpu = torch.tensor(1.0, dtype=torch.float32) / scale.cpu()  # correctly rounded fp32 reciprocal
        candidates = {
            "ieee_div": x.float() / scale,
            "mul_rn_reciprocal": x.float() * recip_cpu.cuda(),
            "mul_cuda_reciprocal": x.float() * torch.reciprocal(scale),
        }
        for name, q in candidates.items():
            codes = q.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
            c = counts.setdefault(name, [0, 0, 0, 0])
            c[0] += int((codes != kernel).sum())
            c[1] += int((q.view(torch.int32) != q_kernel.view(torch.int32)).sum())
            c[2] += kernel.numel()
            c[3] += int(not torch.equal(torch.reciprocal(scale).cpu(), recip_cpu)) if name == "mul_cuda_reciprocal" \
                else 0
    for name, (codes, quotients, n, recip_differ) in counts.items():
        print(json.dumps({"formula": name, "codes_differ": codes, "quotients_differ": quotients, "of": n,
                          "scales": 64, "cuda_reciprocal_not_correctly_rounded": recip_differ}))


if __name__ == "__main__":
    main()
