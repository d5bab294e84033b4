"""What a command prints besides its result: progress and informational lines, on stderr, which ``release -q``
silences. The result (stdout), warnings and errors are always printed.

Progress is told per unit of work (``progress``: the rollouts of one build, one build, one verification). In a
terminal each open unit is a live bar, all in one display, and a finished one leaves a closing line in its place.
Elsewhere (``release eval ... > eval.log 2>&1``, CI logs) nothing is drawn: a counted unit says when it starts, says
how far it is at most every ``LOG_EVERY`` seconds as it advances, and leaves the same closing line, with its count,
its result and its times: ``rollouts: fakequant rtn: 48/48 in 137.8 s (load 12.1 s)``."""

from __future__ import annotations

import contextlib
import io
import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.text import Text

console = Console(stderr=True)  # progress and informational lines; quiet under ``release -q``
LOG_EVERY = 30.0  # seconds between two lines of a unit's progress when stderr is not a terminal
_LIVE: list[Progress] = []  # the one live display of the open units, while stderr is a terminal


def set_quiet(quiet: bool) -> None:
    console.quiet = quiet


def quiet() -> bool:
    return console.quiet


def _write(line: str) -> None:
    """A line on stderr as written (no markup, no wrapping); above the bars while they are drawn (rich's redirect of
    stderr does not see click's writes, which go to the stream beneath it)."""
    if _LIVE:
        _LIVE[0].console.print(Text.from_ansi(line), soft_wrap=True)
    else:
        click.echo(line, err=True)


def info(line: str) -> None:
    """An informational line on stderr, unless quiet."""
    if not console.quiet:
        _write(line)


def warning(line: str) -> None:
    """A warning on stderr, also when quiet."""
    _write(f"{click.style('warning:', fg='yellow')} {line}")


def _duration(seconds: float) -> str:
    return f"{seconds:.1f} s"


class _Count(MofNCompleteColumn):
    """done/total, blank for a unit that is not counted (a build, a verification)."""

    def render(self, task: Task) -> Text:
        return Text("") if task.total is None else super().render(task)


class Work:
    """A unit of work under way: ``advance`` a counted one, time its ``part``s, say its ``result`` (``14 FP8 Linears
    written``); its closing line says them."""

    def __init__(self, what: str, total: int | None, bar: tuple[Progress, TaskID] | None) -> None:
        self.what, self.total, self.done, self.bar = what, total, 0, bar
        self.result: str | None = None
        self.parts: list[str] = []
        self.start = self.said = time.perf_counter()

    def advance(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar[0].advance(self.bar[1])
        elif self.done != self.total and time.perf_counter() - self.said >= LOG_EVERY:  # the last: the closing line
            self.said = time.perf_counter()
            info(f"{self.what}: {self.done}/{self.total} ({_duration(self.said - self.start)})")

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time a part of the unit; the closing line lists the parts that ended, with their seconds."""
        start = time.perf_counter()
        yield
        self.parts.append(f"{name} {_duration(time.perf_counter() - start)}")

    def closing(self) -> str:
        said = ([] if self.total is None else [f"{self.done}/{self.total}"]) + ([self.result] if self.result else [])
        parts = f" ({', '.join(self.parts)})" if self.parts else ""
        return f"{self.what}: {', '.join(said) or 'done'} in {_duration(time.perf_counter() - self.start)}{parts}"


@contextmanager
def progress(what: str, total: int | None = None) -> Iterator[Work]:
    """A unit of work called ``what``, of ``total`` steps (None: not counted), told as the module docstring says; no
    closing line when it fails (the error says why), nothing at all when quiet."""
    live = not console.quiet and console.is_terminal and not console.is_dumb_terminal
    if live and not _LIVE:
        _LIVE.append(Progress(TextColumn("{task.description}"), BarColumn(), _Count(), TimeElapsedColumn(),
                              console=console, transient=True))
        _LIVE[0].start()
    unit = Work(what, total, (_LIVE[0], _LIVE[0].add_task(what, total=total)) if live else None)
    if not live and total is not None:
        info(f"{what}: 0/{total}")
    try:
        yield unit
    finally:
        if unit.bar is not None and len(unit.bar[0].tasks) > 1:
            unit.bar[0].remove_task(unit.bar[1])
        elif unit.bar is not None:  # the last: the display goes (drawn without it, it would leave an empty line)
            unit.bar[0].stop()
            _LIVE.clear()
    info(unit.closing())


@contextmanager
def torchao_quiet() -> Iterator[None]:
    """TorchAO's import (by the served path, and by diffusers wherever TorchAO is installed) logs each CUDA kernel
    library it cannot load (none is used: the GEMM is ``torch._scaled_mm``) and warns of its own deprecations: kept
    off the user's terminal. Errors still propagate."""
    # torch's pytree logs through a handler that holds the stderr of its creation: its level is what quiets it
    loggers = [logging.getLogger(name) for name in ("torchao", "torch.utils._pytree")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)
