"""Where models run (``RELEASE_DEVICE``), and freeing what a dropped model held there."""

from __future__ import annotations

import gc
import os

import torch

from release.core.errors import ReleaseError

DEVICE_ENV = "RELEASE_DEVICE"


def compute_device() -> str:
    """Where models run: ``RELEASE_DEVICE`` (``auto``, ``cpu`` or ``cuda``); ``auto`` takes CUDA when present."""
    wanted = os.environ.get(DEVICE_ENV, "auto")
    if wanted not in ("auto", "cpu", "cuda"):
        raise ReleaseError(f"{DEVICE_ENV}={wanted}: expected auto, cpu or cuda")
    if wanted == "cuda" and not torch.cuda.is_available():
        raise ReleaseError(f"{DEVICE_ENV}=cuda but torch sees no CUDA device; unset it to run on the CPU")
    return "cuda" if wanted != "cpu" and torch.cuda.is_available() else "cpu"


def free_memory() -> None:
    """Collect now what was just dropped. A rollout leaves the pipeline in reference cycles, so a pipeline its
    caller dropped keeps its GPU memory (28 GiB at the Nano's size) until the collector happens to run, which on an
    H200 was after the next model had been placed beside it (BENCHMARKS.md)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
