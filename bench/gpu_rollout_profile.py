"""Why a deployed FP8 rollout is slower than BF16's: one policy rollout of each under torch.profiler, after a warm-up.

Prints, per path, the wall time of a rollout, the GPU time by kernel family (GEMM, FP8 cast / input quantization,
attention, the rest) and the number of kernel launches, and the top kernels and CPU ops.
Usage (GPU machine): python bench/gpu_rollout_profile.py SOURCE OBSERVATIONS BUILD_FOLDER
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from release.core.builds import load_release
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.quantize.load import deployed_transformer

FAMILIES = (("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")),
            ("attention", ("flash", "fmha", "attention")),
            ("fp8 cast", ("float8", "fp8", "e4m3", "amax", "clamp")))


def family(name: str) -> str:
    low = name.lower()
    return next((f for f, keys in FAMILIES if any(k in low for k in keys)), "other")


def run(source: Path, observations: Path, build: Path) -> None:
    settings = load_release().policy
    obs = load_observations(observations)[0]
    deployed = {"mixed_precision_format": "none"}  # W8A8 on every step, as release eval --path deployed
    for label, make, kwargs in (("bf16", lambda: None, {}), ("deployed fp8", lambda: deployed_transformer(build),
                                                             deployed)):
        pipe = load_pipeline(source, settings, transformer=make())
        rollout(pipe, obs, settings, **kwargs)  # warm-up: kernels chosen, caches filled
        torch.cuda.synchronize()
        start = time.perf_counter()
        rollout(pipe, obs, settings, **kwargs)
        torch.cuda.synchronize()
        wall = time.perf_counter() - start
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            rollout(pipe, obs, settings, **kwargs)
            torch.cuda.synchronize()
        gpu: dict[str, float] = defaultdict(float)
        launches: dict[str, int] = defaultdict(int)
        for event in prof.key_averages():
            if event.device_type == torch.autograd.DeviceType.CUDA:
                gpu[family(event.key)] += event.device_time_total / 1e6
                launches[family(event.key)] += event.count
        print(f"## {label}: {wall:.3f} s per rollout (unprofiled), GPU busy {sum(gpu.values()):.3f} s, "
              f"{sum(launches.values())} kernel launches")
        for f in sorted(gpu, key=gpu.__getitem__, reverse=True):
            print(f"  {f:10s} {gpu[f]:.3f} s GPU, {launches[f]} launches")
        print(prof.key_averages().table(sort_by="device_time_total", row_limit=12, max_name_column_width=70))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=12, max_name_column_width=70))
        del pipe
        torch.cuda.empty_cache()


if __name__ == "__main__":
    run(*map(Path, sys.argv[1:4]))
