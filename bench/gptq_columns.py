"""ModelOpt's GPTQ column loop as ModelOpt runs it against the tool's
(:func:`release.quantize.recipes.gptq.faster_update`: on a CPU the same loop with each column fake-quantized alone, on a
CUDA GPU the fused Triton kernel): seconds per Linear and whether the updated weights are the same bits.

One Linear of each of the Nano's four shapes divided by DIVIDE (1 on a GPU: the Nano's own; a CPU needs 4 or more),
random weights of mixed magnitudes, a Hessian from 1,024 random tokens, FP8 weight quantizers per tensor (NVIDIA's
scheme) and per output row (the per-channel family), max-calibrated. The 504-Linear total scales each shape's time
by its count in the Nano (36 layers x 2 towers).

Usage: python3 bench/gptq_columns.py [DIVIDE] [cpu|cuda]
"""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Any

import torch

SHAPES = {"q/o": (4096, 4096, 144), "k/v": (4096, 1024, 144), "gate/up": (4096, 12288, 144),
          "down": (12288, 4096, 72),  # in, out, Linears in the Nano
          "odd": (1000, 200, 0)}  # not the Nano's: a last block of 104 columns and a partial tile of rows


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def run(in_f: int, out_f: int, axis: int | None, device: str, columns: bool) -> tuple[torch.Tensor, float]:
    from modelopt.torch.quantization.nn import TensorQuantizer
    from modelopt.torch.quantization.utils import calib_utils

    from release.quantize.recipes.gptq import faster_update

    torch.manual_seed(0)
    weight = (torch.randn(out_f, in_f, device=device) * torch.logspace(-2, 0, in_f, device=device)).bfloat16().float()
    x = torch.randn(1024, in_f, device=device)
    h_inv = calib_utils.compute_hessian_inverse(x.T @ x / 1024, weight, 0.01)
    quantizer = TensorQuantizer().to(device)
    quantizer.num_bits, quantizer.axis = (4, 3), axis
    quantizer.amax = (weight.abs().amax(dim=1, keepdim=True) if axis == 0 else weight.abs().amax()).bfloat16()
    _sync(device)
    start = time.perf_counter()
    with faster_update() if columns else contextlib.nullcontext():
        calib_utils.gptq_blockwise_update(weight, h_inv, 128, quantizer)
    _sync(device)
    return weight, time.perf_counter() - start


def main(divide: int = 1, device: str = "cuda") -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{name}, torch {torch.__version__}, shapes / {divide}")
    print("| shape | scheme | ModelOpt (s) | the tool's (s) | speed-up | weights that differ |")
    print("|---|---|---:|---:|---:|---:|")
    for columns in (True, False):  # warm-up: kernels, extensions, each kernel's compilation
        for axis in (None, 0):
            run(256, 256, axis, device, columns)
    totals: dict[str, Any] = {}
    for label, (in_f, out_f, count) in SHAPES.items():
        in_f, out_f = in_f // divide, out_f // divide
        for axis, scheme in ((None, "per tensor"), (0, "per channel")):
            theirs, t_theirs = run(in_f, out_f, axis, device, False)
            ours, t_ours = run(in_f, out_f, axis, device, True)
            differ = int((ours.view(torch.int32) != theirs.view(torch.int32)).sum())
            total = totals.setdefault(scheme, [0.0, 0.0])
            total[0] += t_theirs * count
            total[1] += t_ours * count
            print(f"| {label} ({in_f}->{out_f}) | {scheme} | {t_theirs:.2f} | {t_ours:.2f} | "
                  f"{t_theirs / t_ours:.1f}x | {differ} of {ours.numel()} |", flush=True)
    for scheme, (a, b) in totals.items():
        print(f"504 Linears, {scheme}: ModelOpt {a:.0f} s, the tool's {b:.1f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1, sys.argv[2] if len(sys.argv) > 2 else "cuda")
