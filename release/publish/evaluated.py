"""Which builds were evaluated: those with results in ``tables.json`` (``release tables``). Only they are documented
and published. ``card``, ``push`` and ``manifest`` given no names act on the builds that can be, and name on stderr
each built one they leave out for want of results, with how to include it; a build named on the command line, or one
that the release delivers, without results is the one-line error (exit 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.core.errors import ReleaseError
from release.core.output import warning


def not_evaluated(name: str) -> ReleaseError:
    return ReleaseError(f"tables.json has no results for build {name!r}; run 'release eval {name}' and 'release "
                        "tables' first")


def evaluated(tables: dict[str, Any]) -> set[str]:
    """The builds with at least one record in ``tables`` (tables.json), on any path and split."""
    return {r["build"] for r in tables["records"]}


def require_evaluated(names: list[str], tables: dict[str, Any]) -> None:
    """Every one of ``names`` has results in ``tables``; else the one-line error naming the first that has none."""
    done = evaluated(tables)
    missing = next((n for n in names if n not in done), None)
    if missing is not None:
        raise not_evaluated(missing)


def leave_out(names: list[str], tables: dict[str, Any], path: Path, then: str = "") -> list[str]:
    """``names`` less those without results in ``tables`` (read from ``path``); each of these is named on stderr, one
    warning line each, with why it is left out and how to include it (``then``: what to run after 'release
    tables')."""
    done = evaluated(tables)
    for name in names:
        if name not in done:
            warning(f"{name}: not evaluated (no results in {path}); left out: run 'release eval {name}' then 'release "
                    f"tables'{then}, or name it to see the error")
    return [n for n in names if n in done]
