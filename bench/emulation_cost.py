"""CPU cost of the exact FP8 GEMM emulation of ``--path deployed``: warm tiny rollouts with the Hopper model vs an
exact fp32 matmul of the same codes (which is what the emulation did before it modelled the tensor cores).

Usage: .venv/bin/python bench/emulation_cost.py FIXTURE_DIR BUILD_DIR   (e.g. demo/fixture demo/dist/<rtn repo>)
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

import release.core.fp8 as fp8
from release.core.builds import load_release
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.quantize.load import deployed_transformer


def main(fixture: Path, build: Path, n: int = 4) -> None:
    release = load_release()
    observations = load_observations(fixture / "observations")[:n]
    pipe = load_pipeline(fixture / "source", release.policy, transformer=deployed_transformer(build))
    for obs in observations:  # warm-up: the VAE encodes of the observations are memoised
        rollout(pipe, obs, release.policy, mixed_precision_format="none")
    exact = fp8.hopper_accumulate
    variants = {"Hopper model (exact)": exact, "fp32 matmul": lambda a, b: a.float() @ b.float().T}
    print(f"torch threads: {torch.get_num_threads()}\n\n| FP8 GEMM accumulation | s per warm rollout |\n|---|---:|")
    for label, fn in variants.items():
        fp8.hopper_accumulate = fn
        start = time.perf_counter()
        for obs in observations:
            rollout(pipe, obs, release.policy, mixed_precision_format="none")
        print(f"| {label} | {(time.perf_counter() - start) / n:.2f} |")
    fp8.hopper_accumulate = exact


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
