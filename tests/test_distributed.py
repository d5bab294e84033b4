"""torchrun on the CPU (gloo's store, 2 processes): builds and rollouts split across ranks, merged results equal to
one process byte for byte, under the same cache keys."""

from __future__ import annotations

import datetime as dt
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from release.core.builds import load_build
from tests.conftest import ROOT, fewer_calls, invoke

BUILDS = ("rtn", "sq_auto")  # one per rank


def _release(args: list[str], cache: Path, builds: Path, ranks: int) -> subprocess.CompletedProcess[str]:
    """``release ARGS`` in a fresh process, or under ``torchrun --nproc-per-node RANKS``. One thread each: CPU torch
    sums in an order that depends on the thread count, and the comparison is of bytes."""
    env = {**os.environ, "RELEASE_CACHE": str(cache), "RELEASE_DEVICE": "cpu", "OMP_NUM_THREADS": "1",
           "SOURCE_DATE_EPOCH": "1700000000", "RELEASE_BUILDS": str(builds)}
    launcher = [] if ranks == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return subprocess.run([sys.executable, *launcher, "-m", "release", *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=1800)


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(small: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Path]]:
    """The same builds and deployed eval, in one process and in two: {ranks: (dist, cache)}. On the 10 + 10
    observations of ``small``, with fewer calibration and algorithm calls than shipped (the comparison is of two
    ways of making the same builds)."""
    builds = tmp_path_factory.mktemp("ranks-builds") / "builds"
    shutil.copytree(ROOT / "builds", builds)
    fewer_calls(builds, *BUILDS)
    out = {}
    for ranks in (1, 2):
        base = tmp_path_factory.mktemp(f"ranks{ranks}")
        dist, cache = base / "dist", base / "cache"
        src = ["--source", str(small / "source"), "--observations", str(small / "observations"), "--dist", str(dist)]
        done = _release(["build", *BUILDS, *src[:4], "--out", str(dist)], cache, builds, ranks)
        assert done.returncode == 0, done.stdout + done.stderr
        done = _release(["eval", "rtn", "sq_auto", "--path", "deployed", "--split", "validation", *src], cache,
                        builds, ranks)
        assert done.returncode == 0, done.stdout + done.stderr
        out[ranks] = (dist, cache)
    return out


def test_two_ranks_build_the_same_bytes(runs: dict[int, tuple[Path, Path]]) -> None:
    one, two = _files(runs[1][0]), _files(runs[2][0])
    # the build folders, and where their source and observations are (release.inputs.source.remember_inputs)
    assert {p.split("/")[0] for p in one} == {load_build(b).repo for b in BUILDS} | {".release-inputs.json"}
    assert sorted(one) == sorted(two)
    assert [p for p in one if one[p] != two[p]] == []  # weights, scales, provenance, verification, results


def test_two_ranks_fill_the_same_caches(runs: dict[int, tuple[Path, Path]]) -> None:
    """Calibration captures and rollouts under the same keys with the same contents."""
    one, two = _files(runs[1][1]), _files(runs[2][1])
    captures = [p for p in one if p.startswith("calibration/")]
    rollouts = [p for p in one if p.startswith("rollouts/")]
    assert captures and rollouts
    for kept in (captures, rollouts):
        assert [p for p in kept if two.get(p) != one[p]] == []
    assert sorted(p for p in two if p.startswith(("calibration/", "rollouts/"))) == sorted(captures + rollouts)
    npz = [p for p in _files(runs[2][0]) if p.endswith("deployed-validation.npz")]
    assert len(npz) == 2  # rank 0 wrote both builds' results


@pytest.mark.parametrize("command", ["tables", "card", "push", "fixture", "campaign"])
def test_commands_that_do_not_split_refuse_torchrun(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    result = invoke(command, "rtn")
    assert result.exit_code == 2, result.output
    assert f"'release {command}' does not split across processes (WORLD_SIZE=2)" in result.output


def test_a_rank_that_starts_late_gets_the_same_split() -> None:
    """Rank 1 lists what is unfinished only after rank 0 could have finished its first item (as when a loaded
    machine starts it seconds later): every item still goes to exactly one rank (the capture once left obs 1 to
    nobody, and every rank then failed reading it)."""
    import threading
    import time

    from torch.distributed import HashStore

    from release.core.distributed import World

    store, done, shares = HashStore(), set(), {}
    store.set_timeout(dt.timedelta(seconds=30))

    def rank(r: int) -> None:
        if r == 1:
            deadline = time.monotonic() + 1.0
            while 0 not in done and time.monotonic() < deadline:
                time.sleep(0.01)
        _, mine = World(r, 2, store).unfinished(list(range(8)), lambda i: i in done)
        for i in mine:
            done.add(i)
        shares[r] = mine

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sorted(shares[0] + shares[1]) == list(range(8))
    assert shares == {0: [0, 2, 4, 6], 1: [1, 3, 5, 7]}
