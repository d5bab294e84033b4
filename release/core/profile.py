"""Where a command's time and GPU memory go: named stages, each timed with the GPU synchronised and with the peak
GPU memory allocated while it ran. ``RELEASE_PROFILE=FILE`` writes them as JSON as outer stages end (a killed run keeps
what ran; at most every ``REWRITE_EVERY`` seconds) and when the command ends (then also as a table): each stage added
up over its entries, and the timeline of every entry (start, seconds, peak, nesting depth); ``release eval`` keeps
each rollout's measurement beside its cached actions.

Stages may nest (a rollout inside an eval): torch has one peak counter, so entering a stage hands the peak reached
so far to the stage around it before resetting the counter, and leaving hands its own peak up.
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_ENV = "RELEASE_PROFILE"
GIB = 2**30
# The file is rewritten as an outer stage ends at most this often: each rewrite holds the whole timeline, and an eval
# has thousands of outer stages (a rollout each). A command that ends, fails or is stopped (Ctrl-C, SIGTERM) writes
# everything (``report``).
REWRITE_EVERY = 10.0


@dataclass
class Measure:
    name: str
    seconds: float = 0.0
    peak_bytes: int | None = None  # None on the CPU
    calls: int = 0
    _seen: int = field(default=0, repr=False)  # the peak of the stages nested in the open one

    def row(self) -> dict[str, object]:
        return {"stage": self.name, "seconds": round(self.seconds, 3), "calls": self.calls,
                "peak_gib": None if self.peak_bytes is None else round(self.peak_bytes / GIB, 2)}


_OPEN: list[Measure] = []
_DONE: dict[str, Measure] = {}
_TIMELINE: list[dict[str, object]] = []  # every entry of every stage, when it started: one build's parts in a sweep
_ORIGIN = [time.perf_counter()]  # the command's start (begin), else this module's import
_RUN: dict[str, Any] = {}  # the command and rank profiled (begin): the file is rewritten as each outer stage ends


def _cuda() -> Any:
    """torch.cuda when a GPU is in use, else None (torch is not imported for a command that never loaded it)."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized() else None


@contextmanager
def stage(name: str) -> Iterator[Measure]:
    """Time ``name`` (added up over repeated entries); the Measure of this one entry is yielded, filled on exit."""
    this, cuda = Measure(name), _cuda()
    if cuda:
        cuda.synchronize()
        if _OPEN:
            _OPEN[-1]._seen = max(_OPEN[-1]._seen, cuda.max_memory_allocated())
        cuda.reset_peak_memory_stats()
    _OPEN.append(this)
    start = time.perf_counter()
    try:
        yield this
    finally:
        _OPEN.pop()
        cuda = cuda or _cuda()  # a stage may be the one that starts using the GPU
        if cuda:
            cuda.synchronize()
            this.peak_bytes = max(cuda.max_memory_allocated(), this._seen)
            if _OPEN:
                _OPEN[-1]._seen = max(_OPEN[-1]._seen, this.peak_bytes)
        this.seconds, this.calls = time.perf_counter() - start, 1
        _TIMELINE.append({**this.row(), "start": round(start - _ORIGIN[0], 3), "depth": len(_OPEN)})
        total = _DONE.setdefault(name, Measure(name))
        total.seconds += this.seconds
        total.calls += 1
        if this.peak_bytes is not None:
            total.peak_bytes = max(total.peak_bytes or 0, this.peak_bytes)
        if not _OPEN and _RUN and time.perf_counter() - _RUN["written"] >= REWRITE_EVERY:
            _write(_RUN["command"], _RUN["rank"])  # a run killed at any point keeps what ran, but the last seconds
            _RUN["written"] = time.perf_counter()


def begin(command: str, rank: int = 0) -> None:
    """Profile ``command``: its stages' start times count from here, and the file is rewritten as each outer stage
    ends."""
    _RUN.update(command=command, rank=rank, written=-math.inf)
    _ORIGIN[0] = time.perf_counter()


def check_target() -> None:
    """Before any work: ``RELEASE_PROFILE`` must name a file, so that a long run does not end on an unwritable one."""
    from release.core.errors import ReleaseError

    target = os.environ.get(PROFILE_ENV)
    if target and Path(target).is_dir():
        raise ReleaseError(f"{PROFILE_ENV}={target} is a folder; name a file to write the stages to, e.g. "
                           f"{Path(target) / 'profile.json'}")


def _write(command: str, rank: int) -> Path | None:
    """The stages so far as JSON into ``RELEASE_PROFILE`` (rank N > 0: FILE.rankN); the path, or None."""
    target = os.environ.get(PROFILE_ENV)
    if not target or not _DONE:
        return None
    from release.core.io import write_json

    path = Path(target if rank == 0 else f"{target}.rank{rank}")
    write_json(path, {"command": command, "device": device_name(), "stages": [m.row() for m in _DONE.values()],
                      "timeline": [{k: v for k, v in e.items() if k != "calls"} for e in _TIMELINE]})
    return path


def report(command: str, rank: int = 0) -> None:
    """Write and print the stages of ``command`` when ``RELEASE_PROFILE`` names a file; either way the next command
    starts with none (one process may run several: tests, notebooks)."""
    path = _write(command, rank)
    rows = [m.row() for m in _DONE.values()]
    _DONE.clear()
    _TIMELINE.clear()
    _RUN.clear()
    if path is None:
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"release {command}: stages ({device_name()}) -> {path}", title_justify="left")
    for column in ("stage", "seconds", "calls", "peak GiB"):
        table.add_column(column, justify="left" if column == "stage" else "right")
    for r in rows:
        table.add_row(str(r["stage"]), f"{r['seconds']:.2f}", str(r["calls"]),
                      "-" if r["peak_gib"] is None else f"{r['peak_gib']:.2f}")
    Console(stderr=True).print(table)


def device_name() -> str:
    cuda = _cuda()
    return str(cuda.get_device_name()) if cuda else "cpu"
