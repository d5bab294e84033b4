"""File hashes as the Hub compares them (sha256 for LFS files, the git blob sha1 for files it stores in git, the Xet
hash of LFS files for the content the Hub stores through Xet), each file read once with its secret scan (the Xet hash
by hf_xet), and cached by path and inode status."""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from release.core.digest import stamp as file_stamp
from release.core.errors import ReleaseError
from release.core.io import parse_json, write_json
from release.publish.scan import CHUNK, SCAN_VERSION, WEIGHTS, Scanner

# The Hub stores files of this size or larger, and every binary checkpoint file, through LFS.
LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".pth", ".bin", ".png", ".npz")


class HashCache:
    """sha256 / git blob sha1 of local files and their secret scan, cached in a JSON file.

    An entry is reused only while the file's stat stamp (:func:`release.core.digest.stamp`: size, mtime, ctime,
    inode, device) is unchanged.
    """

    def __init__(self, path: Path | None) -> None:
        """``path`` None: a cache of this process only, neither read nor saved."""
        self.path = path
        try:
            entries = parse_json(path.read_bytes(), str(path), "") if path is not None and path.is_file() else {}
        except ReleaseError:  # a damaged cache is only a cache: start afresh
            entries = {}
        self.entries: dict[str, dict[str, Any]] = entries if isinstance(entries, dict) else {}
        self.hashed_bytes = 0

    def _hash(self, file: Path, scan: bool) -> dict[str, Any]:
        st = file.stat()
        stamp = file_stamp(st)
        hit = self.entries.get(str(file.resolve()))
        if hit and hit.get("stamp") == stamp and (not scan or hit.get("scan") == SCAN_VERSION) and "xet" in hit:
            return hit
        # sha256 for LFS comparisons; the git blob sha1 only where a file can be stored in git (small files)
        h = hashlib.sha256()
        blob = hashlib.sha1(b"blob %d\0" % st.st_size) if st.st_size < LFS_THRESHOLD else None
        scanner = Scanner(decode=file.suffix not in WEIGHTS) if scan else None
        read = 0
        with file.open("rb") as f:
            while chunk := f.read(CHUNK):
                read += len(chunk)
                h.update(chunk)
                if blob is not None:
                    blob.update(chunk)
                if scanner is not None:
                    scanner.feed(chunk)
        if read != st.st_size:
            raise ReleaseError(f"{file}: changed size while it was read; run 'release push' again")
        self.hashed_bytes += read
        entry = {"stamp": stamp, "size": st.st_size, "sha256": h.hexdigest(),
                 "sha1": blob.hexdigest() if blob is not None else None,
                 "xet": xet_hash(file) if is_lfs(file.name, st.st_size) else None}
        if scanner is not None:
            entry.update(scan=SCAN_VERSION, secret=scanner.found)
        return entry

    def hash_all(self, files: list[Path], scan: bool = False, workers: int | None = None) -> dict[Path, dict[str, Any]]:
        """Hash (and with ``scan`` search for secrets) in parallel: hashlib releases the GIL on large buffers."""
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            results = dict(zip(files, pool.map(lambda f: self._hash(f, scan), files), strict=True))
        for file, entry in results.items():
            self.entries[str(file.resolve())] = entry
        return results

    def save(self) -> None:
        if self.path is not None:
            write_json(self.path, self.entries)


def xet_hash(file: Path) -> str | None:
    """The file's Xet hash, computed locally by hf_xet (``hash_files``: its chunks and their Merkle hash, nothing
    uploaded): the content identifier the Hub lists for a file stored through Xet (``RepoFile.xet_hash``), derived
    from the bytes it stores, where the sha256 it lists is the one the client declared. None without hf_xet."""
    try:
        import hf_xet
    except ImportError:
        return None
    return str(hf_xet.hash_files([str(file)])[0].hash)


def valid_xet_hash(value: object) -> bool:
    """A listed Xet hash that identifies content: 64 hex digits (the Hub may list a masked one, 64 asterisks)."""
    return isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)


def is_lfs(path: str, size: int) -> bool:
    return size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)
