"""Where models run (``RELEASE_DEVICE``), freeing what a dropped model held there (and ModelOpt imported so that it
holds nothing, the libraries' objects out of the collector's walk), and torch's default dtype kept across a load."""

from __future__ import annotations

import functools
import gc
import importlib
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from release.core.errors import ReleaseError

DEVICE_ENV = "RELEASE_DEVICE"
MODELOPT_PACKAGE = "modelopt.torch.quantization"  # imports modelopt.torch, and pulp with it


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


def modelopt_imported() -> None:
    """ModelOpt imported, the first time on a thread of its own; every function that imports it calls this first.

    ModelOpt's import runs pulp's, whose solver classes keep the errors of their failed imports (``No module named
    'cplex'``) with their tracebacks, and a traceback's frames chain up to the importing call's callers: imported in
    a build, the build's model and everything its callers held lived as long as the process (in a campaign under
    ``--max-gpu-memory``, the first build's GPU memory beside every later model). A thread's frames end at the
    thread."""
    if MODELOPT_PACKAGE in sys.modules:
        return
    failed: list[BaseException] = []

    def run() -> None:
        try:
            importlib.import_module(MODELOPT_PACKAGE)
        except BaseException as exc:  # raised again on the calling thread
            failed.append(exc)

    thread = threading.Thread(target=run, name=f"import {MODELOPT_PACKAGE}")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


@functools.cache
def libraries_loaded() -> None:
    """diffusers' policy classes imported (torch and transformers with them), then everything the process holds
    moved out of the cyclic collector's reach (``gc.freeze``), once per process.

    A full collection walked about 620,000 objects with diffusers and ModelOpt imported, 450,000 of them these
    libraries', all living as long as the process: 0.35 s on the CPU machine, and the tiny campaign made 65 such
    collections (:func:`free_memory`'s and the collector's own), 26 s of its 430 (BENCHMARKS.md). Each stage that
    loads models calls this first, while it holds none: what is frozen is never collected as a cycle, so a model
    frozen in one would stay for the life of the process. ModelOpt is not imported here: a stage that needs no
    build (a finished campaign's rerun) does not pay its 11 s, and its first import happens inside a build, where
    a freeze would take the build's model with it."""
    from diffusers import AutoencoderKLWan, Cosmos3OmniPipeline, Cosmos3OmniTransformer  # noqa: F401

    gc.collect()
    gc.freeze()


@contextmanager
def default_dtype_kept() -> Iterator[None]:
    """torch's default dtype as it was, whatever happens inside. diffusers' ``from_pretrained`` sets it to the
    load's dtype and puts it back only when the load succeeds: a load that raises (a bad config, a refused pickle)
    would leave every later tensor of the process bfloat16 and change the bytes of everything computed after."""
    dtype = torch.get_default_dtype()
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)
