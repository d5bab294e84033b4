"""Plan a release of full size against a folder target: first run (hashing) vs cached run, and hashing throughput
against single-core sha256.

Usage: .venv/bin/python bench/push_hash.py NANO_DIR   (NANO_DIR from bench/layout_check.py: a Nano-size FP8 checkpoint)
Three sibling repos are made of hard links to NANO_DIR's shards (distinct paths, so each is hashed); the plan hashes
and scans every file for secrets (no verification manifest to compare). The target is empty: a target's own files are
hashed by content on every plan (release.publish.remotes.FolderRemote), never from the cache.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from release.core.builds import load_build
from release.publish.gate import checked_files
from release.publish.hashing import HashCache
from release.publish.plan import plan_repo

SEED_DELIVERED = ("rtn", "sq_auto", "rtn_mavg")  # the seed's three repos: the bench hashes three Nano-size builds


def main(nano: Path) -> None:
    with tempfile.TemporaryDirectory(dir=nano.parent) as tmp:
        dist = Path(tmp) / "dist"
        total = 0
        for name in SEED_DELIVERED:
            folder = dist / load_build(name).repo
            (folder / "transformer").mkdir(parents=True)
            for shard in (nano / "transformer").iterdir():
                os.link(shard, folder / "transformer" / shard.name)
                total += shard.stat().st_size
        builds = [load_build(n) for n in SEED_DELIVERED]
        from release.publish.remotes import FolderRemote

        request = SimpleNamespace(org="np-cr", revision="main", private=False, tag="v1.0.0",  # what a plan reads
                                  commit_message="bench", force=None, create_pr=False)
        for label in ("first run (hashes everything)", "second run (hash cache)"):
            cache = HashCache(Path(tmp) / "hashes.json")
            remote = FolderRemote(Path(tmp) / "hub")  # empty: the target's own files are hashed on every plan
            t = time.perf_counter()
            for build in builds:
                local = checked_files(dist / build.repo, build.name, None, cache, ["en"])
                plan_repo(remote, request, build, dist / build.repo, local)  # type: ignore[arg-type]
            cache.save()
            wall = time.perf_counter() - t
            rate = f", {cache.hashed_bytes / wall / 1e9:.2f} GB/s hashed" if cache.hashed_bytes else ""
            print(f"| plan 3 repos, {total / 1e9:.1f} GB, {label} | {wall:.2f} s{rate} |")
    buf = os.urandom(1 << 30)
    t = time.perf_counter()
    hashlib.sha256(buf).hexdigest()
    print(f"| single-core sha256 of 1 GiB in memory | {(1 << 30) / (time.perf_counter() - t) / 1e9:.2f} GB/s |")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
