"""Plan a release of full size against a folder target: first run (hashing) vs cached run, and hashing throughput
against single-core sha256.

Usage: .venv/bin/python bench/push_hash.py NANO_DIR   (NANO_DIR from bench/layout_check.py: a Nano-size FP8 checkpoint)
Three sibling repos are made of hard links to NANO_DIR's shards (distinct paths, so each is hashed), with a
provenance.json each; the plan hashes and scans every file for secrets (no verification manifest to compare).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

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
            (folder / "provenance.json").write_text(json.dumps({"source": {"revision": "0" * 40}}))
        builds = [load_build(n) for n in SEED_DELIVERED]
        from release.publish.remotes import FolderRemote

        for label in ("first run (hashes everything)", "second run (hash cache)"):
            cache = HashCache(Path(tmp) / "hashes.json")
            remote = FolderRemote(Path(tmp) / "hub", cache)
            t = time.perf_counter()
            for build in builds:
                local = checked_files(dist / build.repo, build.name, None, cache)
                plan_repo(remote, build, dist / build.repo, f"np-cr/{build.repo}", local, None)
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
