"""Faults of build outputs: a kill -9 at any step of replacing a folder, and two builds of the same inputs.

The kills run in child processes (a SIGKILL cannot be caught, so nothing of the tool's cleanup runs); the reruns and
the checks run here.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from release.core.io import atomic_dir, clean_stale
from tests.conftest import ROOT, invoke

REPO = "Cosmos3-Nano-Policy-DROID-FP8"
OLD = {"README.md": "old build\n", "transformer/a.safetensors": "old weights", "transformer/old.json": "{}",
       "old-only.txt": "old"}
NEW = {"README.md": "new build\n", "transformer/a.safetensors": "new weights", "transformer/b.safetensors": "more",
       "new-only.txt": "new"}

# Replaces FINAL by NEW through atomic_dir and SIGKILLs itself before its KILL_AT-th file system change (0: never).
SWAP = r"""
import json, os, signal, sys
from pathlib import Path
import release.core.io as rio

final, kill_at, mode, new = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
steps = 0

def step():
    global steps
    steps += 1
    if steps == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)

def counted(fn):
    def wrapper(*args, **kwargs):
        step()
        return fn(*args, **kwargs)
    return wrapper

for name in ("mkdir", "rename", "replace", "unlink", "rmdir"):
    setattr(os, name, counted(getattr(os, name)))
rio._exchange = counted(rio._exchange) if mode == "exchange" else (lambda a, b: False)
with rio.atomic_dir(final) as tmp:
    for rel, text in new.items():
        (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
        step()
        (tmp / rel).write_text(text)
"""

# `release build ...` that SIGKILLs itself just before the complete new build is renamed to FINAL (its first
# argument), on the rename-aside path: the old build is out of the way, the new one not yet in.
BUILD_KILLED_AT_SWAP = r"""
import os, signal, sys
from pathlib import Path
import release.core.io as rio

final = Path(sys.argv.pop(1))
rio._exchange = lambda a, b: False

def killing(fn):
    def wrapper(src, dst, *args, **kwargs):
        if Path(dst) == final and Path(src).name.startswith(f".{final.name}."):
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(src, dst, *args, **kwargs)
    return wrapper

os.rename, os.replace = killing(os.rename), killing(os.replace)
from release.cli import main
main()
"""

# `release build ...` that SIGKILLs itself when its verification reaches the load-and-run check: the new build is
# complete and partly verified, its report not written.
BUILD_KILLED_IN_VERIFICATION = r"""
import os, signal
import release.check.verify as verify
verify.check_loadable = lambda request: os.kill(os.getpid(), signal.SIGKILL)
from release.cli import main
main()
"""


def _write(folder: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(text)


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _encoded(files: dict[str, str]) -> dict[str, bytes]:
    return {k: v.encode() for k, v in files.items()}


def _child(script: str, *args: str | os.PathLike[str], env: dict[str, str] | None = None) -> int:
    """Run ``script`` on this checkout's code; its exit status (-9: killed)."""
    env = {**os.environ, **(env or {}), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script, *map(str, args)], env=env, capture_output=True, text=True)
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode


@pytest.mark.parametrize("mode", ["exchange", "rename"])
def test_replacing_a_folder_survives_a_kill_at_every_step(mode: str, tmp_path: Path) -> None:
    """After a kill at any step the folder is the whole old one or the whole new one (or, on the rename-aside path,
    the whole old one under its ``.old`` name); the next run restores or cleans up, and a full run gives the new."""
    final = tmp_path / "dist" / REPO
    seen = set()
    kill_at = 0
    while True:
        kill_at += 1
        shutil.rmtree(final.parent, ignore_errors=True)
        _write(final, OLD)
        if _child(SWAP, final, kill_at, mode, json.dumps(NEW)) == 0:
            break  # kill_at is past the last step
        if final.exists():
            seen.add("old" if _files(final) == _encoded(OLD) else "new")
            assert _files(final) in (_encoded(OLD), _encoded(NEW)), f"killed at step {kill_at}: {sorted(_files(final))}"
        else:  # between the two renames: the old build is whole under its .old name
            seen.add("aside")
            aside = [p for p in final.parent.iterdir() if p.name.startswith(f".{REPO}.old-")]
            assert len(aside) == 1 and _files(aside[0]) == _encoded(OLD), f"killed at step {kill_at}"
        clean_stale(final)  # what the next run does first
        assert _files(final) in (_encoded(OLD), _encoded(NEW)), f"killed at step {kill_at}"
        assert os.listdir(final.parent) == [REPO], f"killed at step {kill_at}: temporaries left"
        assert _child(SWAP, final, 0, mode, json.dumps(NEW)) == 0
        assert _files(final) == _encoded(NEW) and os.listdir(final.parent) == [REPO]
    assert _files(final) == _encoded(NEW) and os.listdir(final.parent) == [REPO]
    assert seen == ({"old", "new"} if mode == "exchange" else {"old", "aside", "new"}), seen
    assert kill_at > 10


def test_only_this_outputs_dead_temporaries_are_removed(tmp_path: Path) -> None:
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    final = tmp_path / REPO
    _write(final, OLD)
    kept = [f".{REPO}.tmp-{os.getpid()}-0a1b2c3d",  # a running build's
            f".{REPO}-SmoothQuant.tmp-{dead}-0a1b2c3d",  # another output's
            f".{REPO}.tmp-{dead}-0a1b2c3d.keep", "notes"]  # not a temporary name
    removed = [f".{REPO}.tmp-{dead}-0a1b2c3d", f".{REPO}.old-{dead}-0a1b2c3d", f".{REPO}.del-{dead}-0a1b2c3d"]
    for name in kept + removed:
        _write(tmp_path / name, {"file": name})
    with atomic_dir(final) as tmp:
        _write(tmp, NEW)
    assert sorted(os.listdir(tmp_path)) == sorted([REPO, *kept])
    assert _files(final) == _encoded(NEW)


@pytest.fixture
def cheap_builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The release's build files with 16 calibration and 8 algorithm calls: a build takes seconds after capture."""
    folder = tmp_path / "builds"
    folder.mkdir()
    shutil.copy(ROOT / "builds" / "release.yaml", folder)
    for name in ("rtn", "sq_auto", "rtn_hist"):
        text = (ROOT / "builds" / f"{name}.yaml").read_text()
        text = text.replace("calibration_calls: 256", "calibration_calls: 16").replace("algorithm_calls: 32",
                                                                                       "algorithm_calls: 8")
        (folder / f"{name}.yaml").write_text(text)
    monkeypatch.setenv("RELEASE_BUILDS", str(folder))
    return folder


def test_killed_rebuild_then_failed_rebuild_keep_the_old_build(tiny: Path, cheap_builds: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """`release build` killed between moving the old build aside and the new one in, then a rebuild that fails:
    the old build is back, whole, and no temporary is left."""
    dist = tmp_path / "dist"
    _write(dist / REPO, OLD)
    args = ("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations", "--out", dist)
    assert _child(BUILD_KILLED_AT_SWAP, dist / REPO, *args) == -signal.SIGKILL
    assert not (dist / REPO).exists()  # killed in the window the rename-aside path has

    def disk_full(source: Path, out: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(out))

    monkeypatch.setattr("release.quantize.export._copy_components", disk_full)
    result = invoke(*args)
    assert result.exit_code == 2 and f"{dist / REPO}: the disk ran out of space while it was written" in \
        result.output, result.output
    assert "internal error" not in result.output and len(result.output.strip().splitlines()[-1]) < 300
    assert _files(dist / REPO) == _encoded(OLD)
    assert os.listdir(dist) == [REPO]


def test_a_rebuild_killed_during_its_verification_keeps_the_old_verified_build(tiny: Path, cheap_builds: Path,
                                                                              tmp_path: Path) -> None:
    """A new build is verified before it replaces the old one: killed during its verification, the old build, its
    report and its provenance are there byte for byte; the rebuild that follows puts the new one in place, verified,
    and leaves no temporary. The source records no reference, so the RTN build is its own (verified under its
    temporary name, reported under its repo's)."""
    source = tmp_path / "source"
    shutil.copytree(tiny / "source", source)
    record = json.loads((source / "fixture.json").read_text())
    del record["reference"]
    (source / "fixture.json").write_text(json.dumps(record))
    dist = tmp_path / "dist"
    args = ("build", "rtn", "--source", source, "--observations", tiny / "observations", "--out", dist)
    assert invoke(*args).exit_code == 0
    old = _files(dist / REPO)
    rtn = cheap_builds / "rtn.yaml"  # a different build of the same name: fewer calibration calls
    rtn.write_text(rtn.read_text().replace("calibration_calls: 16", "calibration_calls: 8"))
    assert _child(BUILD_KILLED_IN_VERIFICATION, *args) == -signal.SIGKILL
    assert _files(dist / REPO) == old
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    new = _files(dist / REPO)
    assert new["provenance.json"] != old["provenance.json"]
    report = json.loads(new["verification/report.json"])
    assert report["status"] == "passed" and report["reference"] == REPO  # its own reference, named as its repo
    assert sorted(p.name for p in dist.iterdir() if p.name.startswith(f".{REPO}")) == []


@pytest.mark.parametrize("where, error, free", [
    # safetensors says it in its own error type
    ("safetensors.torch.save_file", RuntimeError("Error while serializing: I/O error: No space left on device "
                                              "(os error 28)"), 10 * 2**30),
    # torch.save says only that a write failed: the disk has (almost) nothing left
    ("torch.save", RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534"), 2**20),
])
def test_a_full_disk_is_one_line_naming_the_build_and_leaves_nothing(where: str, error: Exception, free: int,
                                                                     tiny: Path, cheap_builds: Path, tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A disk that fills up while a build is written: exit 2 with a one-line error that names the build folder and
    says what to do, not an internal error; nothing of the build is left. Any other failure stays what it is."""
    from release.core import io

    def raising(*args: object, **kwargs: object) -> None:
        raise error

    real_usage = shutil.disk_usage
    monkeypatch.setattr(io.shutil, "disk_usage", lambda path: real_usage(path)._replace(free=free))
    monkeypatch.setattr(where, raising)
    dist = tmp_path / "dist"
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", dist)
    assert result.exit_code == 2, result.output
    assert f"error: {dist / REPO}: the disk ran out of space while it was written" in result.output, result.output
    assert "free space on it or write the outputs to another disk" in result.output
    assert not dist.exists() or os.listdir(dist) == []
    monkeypatch.setattr(io.shutil, "disk_usage", real_usage)
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", dist)
    # the same failure with room on the disk: only an error that says so is a full disk
    assert result.exit_code == (2 if "No space left" in str(error) else 1), result.output


@pytest.mark.parametrize("damage", ["cut short", "not torch's format"])
def test_a_damaged_calibration_capture_is_named_removed_and_captured_again(damage: str, tiny: Path, rtn_build: Path,
                                                                          cheap_builds: Path, tmp_path: Path) -> None:
    """Issue 34: a capture file of the cache damaged on disk is named on stderr, removed and captured again; the
    build goes on, its bytes those of a build from the intact capture."""
    from release.core.builds import load_release
    from release.core.io import cache_dir
    from release.quantize.build import capture_folder

    damaged = capture_folder(cache_dir(), tiny / "source", tiny / "observations", load_release().policy) / \
        "obs-00003.pt"
    assert damaged.is_file(), "the session's RTN build left its capture in the cache"
    intact = damaged.read_bytes()
    damaged.write_bytes(intact[: len(intact) // 2] if damage == "cut short" else b"not a torch file")
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    assert f"{damaged}: a damaged calibration capture (" in result.stderr
    assert "removed, captured again" in result.stderr
    assert damaged.read_bytes() == intact  # the capture is deterministic: the same calls again


def test_same_inputs_give_byte_identical_builds(tiny: Path, cheap_builds: Path, tmp_path: Path) -> None:
    """Two builds in two processes (so with different string hashing) into the same --out: every file, including
    both modelopt_state.pth, provenance.json and the verification report, is the same byte for byte."""
    dist, first = tmp_path / "dist", tmp_path / "first"
    args = ("build", "rtn", "sq_auto", "rtn_hist", "--source", tiny / "source", "--observations",
            tiny / "observations", "--out", dist)
    script = "from release.cli import main; main()"
    for hash_seed in ("1", "2"):
        assert _child(script, *args, env={"PYTHONHASHSEED": hash_seed, "SOURCE_DATE_EPOCH": "1767225600"}) == 0
        if hash_seed == "1":
            dist.rename(first)
    one, two = _files(first), _files(dist)
    assert len(one) > 3 * 20 and {p.split("/")[0] for p in one} >= {REPO, f"{REPO}-SmoothQuant"}
    assert sorted(one) == sorted(two)
    assert [p for p in one if one[p] != two[p]] == []


def test_a_terminated_build_leaves_no_output_and_keeps_its_profile(tiny: Path, tmp_path: Path) -> None:
    """SIGTERM (``kill``, a scheduler, torchrun stopping a rank) ends `release build` as Ctrl-C does: exit 143, the
    one-line notice, no build folder nor temporary, and RELEASE_PROFILE holds the stages that had ended (it is
    rewritten as each outer stage ends)."""
    dist, profile, log = tmp_path / "dist", tmp_path / "profile.json", tmp_path / "stderr.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RELEASE_PROFILE": str(profile),
           "RELEASE_CACHE": str(tmp_path / "cache")}  # an empty cache: the capture's rollouts come first
    with log.open("w") as stderr:
        child = subprocess.Popen([sys.executable, "-m", "release", "build", "rtn", "--source", str(tiny / "source"),
                                  "--observations", str(tiny / "observations"), "--out", str(dist)],
                                 env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = time.monotonic() + 300
        while not profile.exists():  # the first outer stage has ended: the capture is under way
            assert child.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "no profile written"
            time.sleep(0.02)
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=300) == 128 + signal.SIGTERM, log.read_text()
    assert "interrupted; outputs were left untouched, rerun to resume" in log.read_text()
    assert not dist.exists() or os.listdir(dist) == []
    stages = [s["stage"] for s in json.loads(profile.read_text())["stages"]]
    assert stages and "build rtn" not in stages


def test_a_file_written_on_a_full_disk_keeps_its_old_content_and_leaves_no_temporary(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The single files written in place (verification reports, provenance, JSON tables): a write that the disk cuts
    short leaves the old file whole and no temporary beside it, and says so in one line naming the file; any other
    failure is re-raised as it was, its temporary removed too."""
    from release.core.errors import ReleaseError
    from release.core.io import atomic_write

    target = tmp_path / "verification" / "report.json"
    atomic_write(target, "old\n")
    fdopen = os.fdopen

    def failing(error: OSError) -> Callable[..., Any]:
        """``os.fdopen`` whose file takes two bytes and then fails with ``error``."""
        def opened(fd: int, *args: Any, **kwargs: Any) -> Any:
            file = fdopen(fd, *args, **kwargs)

            class Short:
                def __enter__(self) -> Short:
                    return self

                def __exit__(self, *exc: object) -> None:
                    file.close()

                def write(self, data: bytes) -> int:
                    file.write(data[:2])
                    raise error
            return Short()
        return opened

    monkeypatch.setattr(os, "fdopen", failing(OSError(errno.ENOSPC, "No space left on device")))
    with pytest.raises(ReleaseError, match=r"report\.json: the disk ran out of space while it was written"):
        atomic_write(target, "new content\n")
    assert target.read_text() == "old\n" and os.listdir(target.parent) == ["report.json"]
    monkeypatch.setattr(os, "fdopen", failing(PermissionError(errno.EACCES, "Permission denied")))
    with pytest.raises(PermissionError):
        atomic_write(target, "new content\n")
    assert target.read_text() == "old\n" and os.listdir(target.parent) == ["report.json"]


def test_a_link_where_a_temporary_or_a_lock_goes_is_never_written_through(tmp_path: Path) -> None:
    """Issue 34: a link planted at a temporary's or a lock's name leaves the file it points to as it was; the
    output is a regular file, never the link."""
    from release.core.errors import ReleaseError
    from release.core.io import atomic_write, exclusive_lock

    outside = tmp_path / "outside.txt"
    outside.write_text("keep me")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / ".selection.json.tmp").symlink_to(outside)  # the fixed name earlier versions wrote through
    atomic_write(dist / "selection.json", "{}\n")
    assert not (dist / "selection.json").is_symlink() and (dist / "selection.json").read_text() == "{}\n"
    (dist / f".selection.json.{os.getpid()}.tmp").symlink_to(outside)
    with pytest.raises(ReleaseError, match=r"\.selection\.json\.\d+\.tmp: a link where this command writes"):
        atomic_write(dist / "selection.json", "[]\n")
    lock = tmp_path / "hub" / ".release-push.lock"
    lock.parent.mkdir()
    lock.symlink_to(outside)
    with pytest.raises(ReleaseError, match=r"\.release-push\.lock: a link where push keeps its lock file"):
        with exclusive_lock(lock, "push"):
            pass
    lock.unlink()
    os.link(outside, lock)
    with pytest.raises(ReleaseError, match=r"\.release-push\.lock: the lock file has other names"):
        with exclusive_lock(lock, "push"):
            pass
    assert outside.read_text() == "keep me" and (dist / "selection.json").read_text() == "{}\n"
