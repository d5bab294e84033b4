"""Rollout latency and peak GPU memory of BF16 and of the deployed FP8 build (ModelOpt's FP8 GEMM), each eager and
with the decoder stack in CUDA graphs (``release.inputs.graphs``, as ``release eval`` runs them), and how many action
elements differ graphed vs eager (issue 32: they must not).

Per path the policy is loaded once. Eager: one warm-up rollout, then the split's first N observations, each timed
with the GPU synchronised. Graphed: the graphs installed on the same pipeline, one warm-up rollout (it captures the
first prompt length's graphs and the unconditional pass's), then the same N rollouts; a rollout whose prompt length
is new captures within it, and is counted. Peak memory: allocated and reserved, over each mode's timed rollouts, the
weights included (the reserved figure holds the graphs' private pool, which the allocated one does not count).
Prints a Markdown table and writes every figure as JSON.
Usage (GPU machine): python bench/gpu_graphs.py SOURCE OBSERVATIONS BUILD_FOLDER OUT_JSON [N (default 16)]
"""

from __future__ import annotations

import json
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from release.core.builds import load_release
from release.core.device import free_memory
from release.inputs.graphs import capturable, graph_decoder_stack
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.measure.evaluate import select
from release.quantize.load import deployed_transformer

GIB = 2**30


def timed(pipe: Any, observations: list[Any], settings: Any, kwargs: dict[str, Any],
          graphs: Any = None) -> dict[str, Any]:
    """The rollouts of ``observations``: actions, seconds each, the peak memory over them, the rollouts that
    captured."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    actions, seconds, captured = [], [], 0
    for obs in observations:
        before = len(graphs.graphs) if graphs is not None else 0
        start = time.perf_counter()
        actions.append(rollout(pipe, obs, settings, **kwargs))
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
        captured += graphs is not None and len(graphs.graphs) > before
    return {"actions": np.stack(actions), "seconds": seconds, "median_s": float(np.median(seconds)),
            "mean_s": float(np.mean(seconds)), "max_s": max(seconds), "rollouts_that_captured": captured,
            "peak_allocated_gib": torch.cuda.max_memory_allocated() / GIB,
            "peak_reserved_gib": torch.cuda.max_memory_reserved() / GIB}


def run(source: Path, observations_dir: Path, build: Path, out: Path, n: int) -> None:
    release = load_release()
    settings = release.policy
    observations = select(load_observations(observations_dir), release, "validation")[:n]
    figures: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                               "cuda": torch.version.cuda, "modelopt": version("nvidia-modelopt"),
                               "diffusers": version("diffusers"), "rollouts": len(observations)}
    for path in ("bf16", "deployed"):
        model = None if path == "bf16" else deployed_transformer(build)
        kwargs = {} if model is None else {"mixed_precision_format": "none"}  # as release eval --path deployed
        pipe = load_pipeline(source, settings, transformer=model)
        rollout(pipe, observations[0], settings, **kwargs)  # warm-up: compiles, kernel choices, VAE encodes
        eager = timed(pipe, observations, settings, kwargs)
        if model is None:
            capturable(pipe.transformer)
        graphs = graph_decoder_stack(pipe.transformer)
        if graphs is None:
            raise SystemExit(f"{path}: the decoder stack was not graphed (RELEASE_CUDA_GRAPHS=0, or not on CUDA)")
        rollout(pipe, observations[0], settings, **kwargs)  # warm-up: the first captures
        graphed = timed(pipe, observations, settings, kwargs, graphs)
        graphed.update(graphs=len(graphs.graphs), replays=graphs.replays)
        bits = (eager.pop("actions").view(np.uint32), graphed.pop("actions").view(np.uint32))
        figures[path] = {"eager": eager, "graphed": graphed, "elements": int(bits[0].size),
                         "differing_elements": int(np.count_nonzero(bits[0] != bits[1]))}
        del pipe, model, graphs
        free_memory()
    for mode in ("eager", "graphed"):
        figures[f"fp8_over_bf16_{mode}"] = figures["deployed"][mode]["median_s"] / figures["bf16"][mode]["median_s"]
    out.write_text(json.dumps(figures, indent=2))
    print(f"{figures['device']}, torch {figures['torch']}, ModelOpt {figures['modelopt']}, "
          f"{figures['rollouts']} held-out rollouts per row\n")
    print("| path | median s | mean s | max s | rollouts that captured | peak allocated GiB | peak reserved GiB |"
          " elements differing graphed vs eager |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for path in ("bf16", "deployed"):
        for mode in ("eager", "graphed"):
            f = figures[path][mode]
            differ = f"{figures[path]['differing_elements']} of {figures[path]['elements']}" if mode == "graphed" \
                else ""
            print(f"| {path} {mode} | {f['median_s']:.3f} | {f['mean_s']:.3f} | {f['max_s']:.3f} | "
                  f"{f['rollouts_that_captured']} | {f['peak_allocated_gib']:.2f} | "
                  f"{f['peak_reserved_gib']:.2f} | {differ} |")
    print(f"\nFP8 / BF16 median latency: eager {figures['fp8_over_bf16_eager']:.2f}, "
          f"graphed {figures['fp8_over_bf16_graphed']:.2f}")


if __name__ == "__main__":
    run(*map(Path, sys.argv[1:5]), int(sys.argv[5]) if len(sys.argv) > 5 else 16)
