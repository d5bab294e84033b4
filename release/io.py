"""File helpers shared by the stages: atomic outputs, JSON, hashing."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


@contextlib.contextmanager
def atomic_dir(final: Path) -> Iterator[Path]:
    """Yield a temporary folder beside ``final``; rename it to ``final`` only if the block succeeds.

    A failure (or Ctrl-C) removes the temporary folder, so ``final`` is either complete or untouched.
    """
    created = not final.parent.exists()
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", suffix=".tmp", dir=final.parent))
    ok = False
    try:
        yield tmp
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        ok = True
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok and created and not any(final.parent.iterdir()):
            final.parent.rmdir()  # the failed run created the output folder: leave no trace


def atomic_write(path: Path, data: bytes | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data.encode() if isinstance(data, str) else data)
    os.replace(tmp, path)


def write_json(path: Path, obj: Any) -> None:
    atomic_write(path, json.dumps(obj, indent=2, sort_keys=True) + "\n")


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
