"""CPU and wall time of the tiny end-to-end path: fixture, cold build (captures calibration), warm build.

Usage: .venv/bin/python bench/build_time.py [BUILD ...]   (default: every build in builds/)
       .venv/bin/python bench/build_time.py --all         (release build --all, cold then warm, each verified)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

from click.testing import CliRunner

from release.cli import main


def timed(label: str, args: list[str]) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    result = CliRunner().invoke(main, args)
    if result.exit_code != 0:
        sys.exit(f"{label} failed: {result.output}")
    print(f"| {label} | {time.perf_counter() - wall:.1f} | {time.process_time() - cpu:.1f} |")


def run() -> None:
    from release.core.builds import available_builds

    builds = sys.argv[1:] or available_builds()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        os.environ["RELEASE_CACHE"] = str(root / "cache")
        print(f"torch threads: {__import__('torch').get_num_threads()}, cores: {os.cpu_count()}\n")
        print("| step | wall (s) | CPU (s) |\n|---|---:|---:|")
        timed("fixture tiny", ["fixture", "tiny", "--out", str(root / "fx")])
        common = ["--source", str(root / "fx/source"), "--observations", str(root / "fx/observations")]
        if builds == ["--all"]:
            timed("build --all (cold: captures 256 calls; 22 builds, each verified)",
                  ["build", "--all", *common, "--out", str(root / "d1")])
            timed("build --all (warm calibration cache; 22 builds, each verified)",
                  ["build", "--all", *common, "--out", str(root / "d2")])
            return
        timed(f"build {builds[0]} (cold: captures 256 calls)", ["build", builds[0], *common, "--out", str(root / "d1")])
        for name in builds:
            timed(f"build {name} (warm calibration cache)", ["build", name, *common, "--out", str(root / "d2")])


if __name__ == "__main__":
    run()
