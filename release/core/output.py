"""What a command prints besides its result: progress bars and informational lines, on stderr, which ``release -q``
silences. The result (stdout), warnings and errors are always printed."""

from __future__ import annotations

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

console = Console(stderr=True)  # progress and informational lines; quiet under ``release -q``


def set_quiet(quiet: bool) -> None:
    console.quiet = quiet


def quiet() -> bool:
    return console.quiet


def info(line: str) -> None:
    """An informational line on stderr (as written: no markup, no wrapping), unless quiet."""
    if not console.quiet:
        click.echo(line, err=True)


def warning(line: str) -> None:
    """A warning on stderr, also when quiet."""
    click.echo(f"{click.style('warning:', fg='yellow')} {line}", err=True)


def progress(transient: bool = False) -> Progress:
    """Progress bars on stderr, silent when quiet; ``transient``: gone when done."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=transient)
