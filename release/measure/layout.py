"""Where ``release eval`` leaves its results in a dist, and the external checkpoints evaluated into it: what
``release tables`` and ``release select`` read, without importing the policy (torch, diffusers) that made them."""

from __future__ import annotations

import re
from pathlib import Path

from release.core.builds import available_builds, load_build
from release.core.config import BuildConfig
from release.core.io import read_json
from release.core.provenance import read_provenance

RESULTS = "results"
PERF = ".perf.json"  # beside a cached rollout or a results file: latency and peak GPU memory
YARDSTICKS = "yardsticks"
EXTERNAL = "external"  # <dist>/external/<name>/: an FP8 checkpoint made elsewhere, evaluated beside the builds
EXTERNAL_TITLE = "published NVIDIA FP8"


def external_name(spec: str) -> str:
    """A folder name for an external checkpoint named by a Hub id or a path (``nvidia/Cosmos3-Nano@fp8`` ->
    ``nvidia-Cosmos3-Nano-fp8``): letters, digits, ``-`` and ``_`` only, so it stays inside ``<dist>/external``."""
    return re.sub(r"[^A-Za-z0-9_]+", "-", spec).strip("-")[:96] or "checkpoint"


def as_external(name: str, title: str) -> BuildConfig:
    """An external checkpoint as a build: RTN's configuration (NVIDIA's scheme and Linears) under its own name."""
    return load_build("rtn").model_copy(update={"name": name, "title": title, "delivered": False,
                                                "repo": f"{EXTERNAL}/{name}"})


def external_builds(dist: Path) -> list[BuildConfig]:
    """The external checkpoints evaluated into ``dist`` (``release eval --external``), as the build configuration
    ``release tables`` scores them with: RTN's, under their own name and title."""
    out = []
    for meta in sorted((dist / EXTERNAL).glob("*/external.json")):
        doc = read_json(meta, "external checkpoint", "release eval --external CHECKPOINT", ("name", "title"))
        out.append(as_external(external_name(str(doc["name"])), str(doc["title"])))
    return out


def sweep_builds(dist: Path) -> list[BuildConfig]:
    """Every build that may have results in ``dist``: each build file's, then the external checkpoints."""
    return [*map(load_build, available_builds()), *external_builds(dist)]


def builds_date(dist: Path, builds: list[BuildConfig]) -> str | None:
    """The latest build date that the provenance of ``builds`` in ``dist`` records (None without any): the date of
    the tables made from their results, so that a rerun on the same results writes the same bytes."""
    dates = [str(read_provenance(dist / b.repo / "provenance.json", b.name)["date"]) for b in builds
             if (dist / b.repo / "provenance.json").is_file()]
    return max(dates, default=None)
