"""FP8 GEMM conformance: ``torch._scaled_mm(..., use_fast_accum=True)`` on this GPU against ``release.core.fp8``'s
emulation, on random shapes (K not a multiple of 32 included) and data kinds drawn independently of the recordings
the model was fitted to. Run it in every session that touches the deployed path; record the result in BENCHMARKS.md.

Kinds: normal, outlier channels, ReLU-like, subnormal-heavy (values ~1e-3 before the cast, amax set by a few
outlier channels), mixed magnitudes within a row. For each case: differing fp32 accumulator outputs (unit scales),
GPU emulation vs kernel; the same on the CPU emulation for cases up to 2^26 multiply-adds; differing bf16 outputs
with per-tensor scales and a bias (cuBLAS's epilogue) and with row-wise scales (the per-channel family's kernel).
Then fixed shapes, each with every data kind: small M at the Nano's ``down_proj`` width (M = 3, 17, 48, 128 at
K = 12,288, N = 4,096: cuBLAS splits K for some of them), and the shapes of any ``bench/gpu_gemm_shapes.py`` files
given (a model's own rollout GEMMs). For a fixed shape whose fp32 outputs differ, the split of K into S parts that
makes the emulation exact on every kind is searched (S = 2 to 16) and printed, for ``release.core.fp8.SPLIT_K``.
``--table FILE`` writes the fixed shapes' results as ``release/core/fp8_conformance.json`` holds them.
Needs torch only (run from the checkout:
PYTHONPATH=. python3 bench/fp8_conformance.py [CASES] [SEED] [--shapes FILE ...] [--table FILE]).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import subprocess
from pathlib import Path
from typing import Any

import torch

from release.core.fp8 import emulated_gemm, hopper_accumulate

KINDS = ("normal", "outliers", "relu", "subnormal", "mixed")
SMALL_M = tuple((m, 4096, 12288) for m in (3, 17, 48, 128))  # (M, N, K): the Nano's down_proj at few tokens


def data(g: torch.Generator, m: int, k: int, kind: str) -> torch.Tensor:
    x = torch.randn(m, k, device="cuda", generator=g)
    if kind == "outliers":
        x[:, torch.randint(0, k, (max(1, k // 64),), device="cuda", generator=g)] *= 60
    if kind == "relu":
        x = x.clamp(min=0) ** 1.5
    if kind == "mixed":  # each row spans magnitudes 2^-12 .. 2^4 across its channels
        x = x * torch.pow(2.0, torch.randint(-12, 5, (m, k), device="cuda", generator=g).float())
    if kind == "subnormal":
        x = x * 1e-3
        x[:, torch.randint(0, k, (max(1, k // 64),), device="cuda", generator=g)] = 300.0
        return x.clamp(-448, 448).to(torch.float8_e4m3fn)
    return (x * (448 / x.abs().max())).to(torch.float8_e4m3fn)


def _differ(x: torch.Tensor, y: torch.Tensor) -> int:
    bits = torch.int32 if x.dtype == torch.float32 else torch.int16
    return int((x.view(bits) != y.view(bits)).sum())


def fixed_shape(g: torch.Generator, m: int, n: int, k: int) -> dict[str, Any]:
    """Every data kind at one (M, N, K): differing fp32 accumulator outputs (unit scales), bf16 outputs with
    per-tensor scales and a bias, and row-wise bf16 outputs, emulation (on this GPU) vs the kernel; and, where the
    fp32 outputs differ, the splits of K that the emulation needs to equal the kernel on every kind."""
    one = torch.ones((), device="cuda")
    row: dict[str, Any] = {"m": m, "n": n, "k": k, "kinds": len(KINDS), "outputs": m * n * len(KINDS),
                              "fp32_differ": 0, "bf16_differ": 0, "rowwise_differ": 0}
    pairs = []
    for kind in KINDS:
        a, b = data(g, m, k, kind), data(g, n, k, "normal")
        kernel = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
        pairs.append((a, b, kernel))
        row["fp32_differ"] += _differ(kernel, hopper_accumulate(a, b, max_elements=1 << 27))
        sa = torch.rand((), device="cuda", generator=g) * 0.1 + 1e-3
        sb = torch.rand((), device="cuda", generator=g) * 0.01 + 1e-4
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        kb = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16,
                              use_fast_accum=True)
        row["bf16_differ"] += _differ(kb, emulated_gemm(a, b, sa, sb, bias, torch.bfloat16))
        ra = torch.rand((m, 1), device="cuda", generator=g) * 0.1 + 1e-4
        rb = torch.rand((1, n), device="cuda", generator=g) * 0.01 + 1e-4
        try:
            kr = torch._scaled_mm(a, b.t(), scale_a=ra, scale_b=rb, bias=bias, out_dtype=torch.bfloat16,
                                  use_fast_accum=True)
            row["rowwise_differ"] += _differ(kr, emulated_gemm(a, b, ra, rb, bias, torch.bfloat16))
        except RuntimeError as exc:
            row["rowwise_error"] = str(exc)[:80]
    if row["fp32_differ"]:
        row["exact_splits"] = [s for s in range(1, 17) if all(
            _differ(kernel, hopper_accumulate(a, b, max_elements=1 << 27, split=s)) == 0 for a, b, kernel in pairs)]
    return row


def versions() -> dict[str, object]:
    driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                            capture_output=True, text=True, check=False).stdout.strip()
    cublas = None
    for name in ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12"):  # the wheel torch loads cuBLAS from
        try:
            cublas = importlib.metadata.version(name)
            break
        except importlib.metadata.PackageNotFoundError:
            continue
    return {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
            "cublas": cublas, "driver": driver or None}


def fixed(seed: int, shape_files: list[Path], table: Path | None) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    shapes = dict.fromkeys(SMALL_M)
    for file in shape_files:
        shapes.update(dict.fromkeys((s["m"], s["n"], s["k"]) for s in json.loads(file.read_text())["shapes"]))
    rows = []
    for m, n, k in shapes:
        rows.append(fixed_shape(g, m, n, k))
        print(json.dumps(rows[-1]), flush=True)
    if table is not None:
        table.write_text(json.dumps({**versions(), "seed": seed, "kinds": list(KINDS), "shapes": rows}, indent=1))


def main(cases: int, seed: int) -> None:
    g = torch.Generator(device="cuda").manual_seed(seed)
    one = torch.ones((), device="cuda")
    totals = {"gpu": [0, 0], "cpu": [0, 0], "bf16": [0, 0], "rowwise": [0, 0]}
    for i in range(cases):
        m = int(torch.randint(1, 400, (1,), generator=g, device="cuda"))
        k = int(torch.randint(1, 375, (1,), generator=g, device="cuda")) * 16  # cuBLAS needs K % 16 == 0
        n = int(torch.randint(1, 64, (1,), generator=g, device="cuda")) * 16
        kind = KINDS[i % len(KINDS)]
        a, b = data(g, m, k, kind), data(g, n, k, "normal")
        try:
            kernel = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True)
        except RuntimeError as exc:  # e.g. K not a multiple of 16 for this cuBLAS
            print(json.dumps({"m": m, "k": k, "n": n, "kind": kind, "kernel_error": str(exc)[:80]}), flush=True)
            continue
        row = {"m": m, "k": k, "n": n, "kind": kind, "outputs": m * n}
        emu = hopper_accumulate(a, b, max_elements=1 << 27)
        row["gpu_differ"] = int((kernel.view(torch.int32) != emu.view(torch.int32)).sum())
        totals["gpu"][0] += row["gpu_differ"]
        totals["gpu"][1] += m * n
        if m * n * k <= 1 << 26:
            cpu = hopper_accumulate(a.cpu(), b.cpu())
            row["cpu_differ"] = int((kernel.cpu().view(torch.int32) != cpu.view(torch.int32)).sum())
            totals["cpu"][0] += row["cpu_differ"]
            totals["cpu"][1] += m * n
        sa = torch.rand((), device="cuda", generator=g) * 0.1 + 1e-3
        sb = torch.rand((), device="cuda", generator=g) * 0.01 + 1e-4
        bias = torch.randn(n, device="cuda", generator=g).to(torch.bfloat16)
        kb = torch._scaled_mm(a, b.t(), scale_a=sa, scale_b=sb, bias=bias, out_dtype=torch.bfloat16,
                              use_fast_accum=True)
        row["bf16_differ"] = int((kb.view(torch.int16) != emulated_gemm(a, b, sa, sb, bias, torch.bfloat16)
                                  .view(torch.int16)).sum())
        ra = torch.rand((m, 1), device="cuda", generator=g) * 0.1 + 1e-4
        rb = torch.rand((1, n), device="cuda", generator=g) * 0.01 + 1e-4
        try:
            kr = torch._scaled_mm(a, b.t(), scale_a=ra, scale_b=rb, bias=bias, out_dtype=torch.bfloat16,
                                  use_fast_accum=True)
            row["rowwise_differ"] = int((kr.view(torch.int16) != emulated_gemm(a, b, ra, rb, bias, torch.bfloat16)
                                         .view(torch.int16)).sum())
        except RuntimeError as exc:
            row["rowwise_error"] = str(exc)[:80]
        for key in ("bf16", "rowwise"):
            if f"{key}_differ" in row:
                totals[key][0] += row[f"{key}_differ"]
                totals[key][1] += m * n
        print(json.dumps(row), flush=True)
    print(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": cases,
                      "seed": seed, **{f"{k}_differ_of": v for k, v in totals.items()}}), flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("cases", type=int, nargs="?", default=60)
    parser.add_argument("seed", type=int, nargs="?", default=20261201)
    parser.add_argument("--shapes", type=Path, nargs="*", default=[])
    parser.add_argument("--table", type=Path)
    args = parser.parse_args()
    fixed(args.seed, args.shapes, args.table)
    main(args.cases, args.seed)
