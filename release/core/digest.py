"""The content digest of a folder (a source checkpoint), its files' sha256 cached by their stat stamp.

A calibration capture is keyed by what it was captured from: the source's bytes, not the revision a ``fixture.json``
or a Hub snapshot declares (a source edited in place under the same declared revision must capture anew). Hashing
the Nano's 31 GB takes tens of seconds once; later runs read the cached digests of unchanged files
(``RELEASE_CACHE/digests.json``).
"""

from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from release.core.errors import ReleaseError
from release.core.io import cache_dir, keep_cached, parse_json, sha256_file


def stamp(st: os.stat_result) -> list[int]:
    """What a cached digest of a file is reused for: size, mtime, ctime, inode and device unchanged. ctime cannot be
    set back by a user (``os.utime`` restores mtime and itself moves ctime), so bytes flipped in place are hashed
    again; mtime alone would not notice."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]


def folder_digest(folder: Path) -> str:
    """sha256 over the relative path and the sha256 of every file under ``folder`` (links to files followed, as a
    Hub snapshot's are), in path order."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    path = cache_dir() / "digests.json"
    try:
        entries: dict[str, Any] = parse_json(path.read_bytes(), str(path), "") if path.is_file() else {}
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ReleaseError):  # a damaged cache is only a cache
        entries = {}

    def digest(file: Path) -> tuple[str, list[int], str]:
        resolved, now = str(file.resolve()), stamp(file.stat())
        hit = entries.get(resolved)
        if isinstance(hit, dict) and hit.get("stamp") == now and isinstance(hit.get("sha256"), str):
            return resolved, now, hit["sha256"]
        return resolved, now, sha256_file(file)

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        results = list(pool.map(digest, files))
    h = hashlib.sha256()
    changed = False
    for file, (resolved, now, sha) in zip(files, results, strict=True):
        h.update(f"{file.relative_to(folder).as_posix()}\0{sha}\n".encode())
        if entries.get(resolved) != {"stamp": now, "sha256": sha}:
            entries[resolved], changed = {"stamp": now, "sha256": sha}, True
    if changed:
        keep_cached(path, json.dumps(entries, sort_keys=True).encode())
    return h.hexdigest()
