"""The time of ``release tables`` for a whole campaign: the 22 builds of builds/, each with results on every path
and split the baseline has in DIST (so every family holds 21 comparisons: the largest the campaign makes), at
10,000 resamples.

Each build's results are the baseline's own reference rows with the baseline's error scaled per observation (a
different draw per build), so that the tests, intervals and Holm's correction run on data of the real shapes.

Usage: .venv/bin/python bench/tables_time.py DIST   (DIST: a dist with the baseline's results, e.g. demo/dist)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from release.core.builds import available_builds, load_build
from release.measure.layout import RESULTS, YARDSTICKS
from release.measure.tables import RESAMPLES, TablesRequest, run_tables

BASELINE = "rtn"


def campaign(source: Path, dist: Path) -> int:
    """Results of every build in ``dist`` from the baseline's in ``source``; the number of builds."""
    base = source / load_build(BASELINE).repo / RESULTS
    names = available_builds()
    for i, name in enumerate(names):
        folder = dist / load_build(name).repo / RESULTS
        folder.mkdir(parents=True)
        for file in sorted(base.glob("*.npz")):
            arrays = dict(np.load(file))
            if name != BASELINE:
                scale = np.random.default_rng(i).lognormal(0, 0.2, size=(len(arrays["obs_ids"]), 1, 1))
                err = arrays["candidate"] - arrays["reference"]
                arrays["candidate"] = arrays["reference"] + err * scale
            np.savez(folder / file.name, **arrays)
    shutil.copytree(source / YARDSTICKS, dist / YARDSTICKS)
    return len(names)


def main(source: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dist = Path(tmp) / "dist"
        n = campaign(source, dist)
        files = sorted(p.name for p in (dist / load_build(BASELINE).repo / RESULTS).glob("*.npz"))
        t = time.perf_counter()
        run_tables(TablesRequest.create((), dist, None, BASELINE, RESAMPLES))
        inside = time.perf_counter() - t
        t = time.perf_counter()
        subprocess.run([Path(sys.executable).parent / "release", "tables", "--dist", str(dist), "--resamples",
                        str(RESAMPLES)], check=True, env=os.environ | {"RELEASE_DEBUG": "1"}, capture_output=True)
        whole = time.perf_counter() - t
    print(f"{n} builds, results {', '.join(files)}, {RESAMPLES:,} resamples")
    print(f"| release tables: statistics, CSV and tables.json (in process) | {inside:.2f} s |")
    print(f"| release tables: the whole command (interpreter start and imports included) | {whole:.2f} s |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(Path(sys.argv[1]))
