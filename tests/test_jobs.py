"""The campaign's jobs on submitit (``release.pipeline.jobs``): retries with the log named, a job found again by its
id, the sbatch script from ``release.yaml``'s ``executor`` section, and the tiny campaign as processes, byte-identical
to the one-process campaign with a killed job and a killed driver recovered."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import submitit
from submitit.helpers import CommandFunction

from release.core.errors import ReleaseError
from release.core.rules import Executor
from release.pipeline.jobs import Task, make_executor, run_jobs
from tests.conftest import EPOCH, ROOT, campaign_args, dist_files, invoke


def _run(tasks: list[Task], folder: Path, attached: dict[str, str] | None = None, retries: int = 1
         ) -> tuple[dict[str, Any], list[tuple[str, str | None]]]:
    done: dict[str, Any] = {}
    submitted: list[tuple[str, str | None]] = []
    run_jobs("processes", Executor(retries=retries), folder, tasks, attached or {},
             lambda name, job: submitted.append((name, job)), done.__setitem__)
    return done, submitted


def test_a_failed_job_is_submitted_again_and_its_log_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    marker = tmp_path / "tried"
    flaky = CommandFunction(["bash", "-c", f"test -f {marker} && echo second || {{ touch {marker}; exit 3; }}"])
    done, submitted = _run([Task("flaky", flaky, ())], tmp_path / "jobs")
    assert done == {"flaky": "second"}
    ids = [job for _, job in submitted if job is not None]
    assert len(ids) == 2 and submitted[-1] == ("flaky", None)
    err = capsys.readouterr().err
    assert f"job {ids[0]} of flaky failed" in err and f"{tmp_path / 'jobs' / ids[0]}" in err
    assert "submitted again (1 of 1 retries)" in err


def test_a_job_that_keeps_failing_is_one_line_naming_its_log(tmp_path: Path) -> None:
    why = r"_log\.err: job \d+ of broken failed 2 times, last: .*FailedJobError: nothing to do;"
    with pytest.raises(ReleaseError, match=why):
        _run([Task("broken", CommandFunction(["bash", "-c", "echo nothing to do >&2; exit 3"]), ())],
             tmp_path / "jobs")


def test_a_job_of_an_earlier_driver_is_found_again_by_its_id(tmp_path: Path) -> None:
    folder = tmp_path / "jobs"
    earlier = submitit.LocalExecutor(folder=folder)
    job = earlier.submit(CommandFunction(["bash", "-c", "sleep 2; echo finished"]))
    job_id = str(job.job_id)
    del job, earlier  # the driver that submitted it is gone: no process handle is left
    task = Task("slow", CommandFunction(["bash", "-c", "echo submitted anew"]), ())
    done, submitted = _run([task], folder, attached={"slow": job_id})
    assert done == {"slow": "finished"} and submitted == [("slow", None)]


def test_the_sbatch_script_carries_the_executor_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    srun = tmp_path / "bin" / "srun"  # submitit's SLURM executor looks for it on this machine before any job
    srun.parent.mkdir()
    srun.write_text("#!/bin/sh\nexit 1\n")
    srun.chmod(0o755)
    monkeypatch.setenv("PATH", f"{srun.parent}:{os.environ['PATH']}")
    settings = Executor(partition="gpu", account="robots", qos="normal", timeout_min=90, gpus_per_job=1,
                        cpus_per_job=8, mem_gb=120)
    slurm = make_executor("slurm", settings, tmp_path, "release-rtn")
    script = slurm._make_submission_file_text("python -m submitit.core._submit x", "uid")
    for line in ("--partition=gpu", "--account=robots", "--qos=normal", "--time=90", "--gpus-per-node=1",
                 "--cpus-per-task=8", "--mem=120GB", "--job-name=release-rtn", "--nodes=1", "--ntasks-per-node=1"):
        assert f"#SBATCH {line}\n" in script
    assert "--partition" not in make_executor("slurm", Executor(), tmp_path, "x")._make_submission_file_text(
        "python", "uid")


def test_slurm_without_srun_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no srun
    with pytest.raises(ReleaseError, match="--executor slurm: no 'srun' on this machine's PATH"):
        make_executor("slurm", Executor(), tmp_path / "jobs", "release-rtn")


def test_a_second_driver_on_the_same_dist_is_refused(small: Path, narrowed: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    dist = tmp_path / "dist"
    dist.mkdir()
    monkeypatch.setenv("RELEASE_BUILDS", str(narrowed))
    fd = os.open(dist, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        result = invoke(*campaign_args(small, dist))
    finally:
        os.close(fd)
    assert result.exit_code == 2, result.output
    assert f"{dist}: another 'release campaign' is running on this dist" in result.output
    assert list(dist.iterdir()) == []


def _journal(dist: Path) -> dict[str, Any]:
    try:
        return json.loads((dist / "campaign.json").read_text())
    except (OSError, ValueError):
        return {}


def _wait(what: Any, driver: subprocess.Popen[str], timeout: float = 600) -> Any:
    deadline = time.monotonic() + timeout
    while (found := what()) is None:
        assert driver.poll() is None, driver.communicate()[1]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)
    return found


def _tasks_of(job_id: str) -> list[int]:
    """The processes of a local submitit job: those whose environment names it."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"SUBMITIT_LOCAL_JOB_ID={job_id}".encode() in env:
            pids.append(int(proc.name))
    return pids


@pytest.mark.slow
def test_the_campaign_as_processes_equals_the_one_process_campaign_after_a_killed_job_and_driver(
        small: Path, narrowed: Path, tmp_path: Path, uninterrupted: tuple[Path, str]) -> None:
    dist = tmp_path / "dist"
    env = {**os.environ, "RELEASE_BUILDS": str(narrowed), "RELEASE_CACHE": str(tmp_path / "cache"),
           "SOURCE_DATE_EPOCH": EPOCH, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-m", "release", *campaign_args(small, dist), "--executor", "processes"]

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(args, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    driver = start()
    # 1. a build job killed while it runs: the driver submits it again
    first = _wait(lambda: next(iter(_journal(dist).get("jobs", {}).items()), None)
                  if set(_journal(dist).get("jobs", {})) - {"prepare"} else None, driver)
    name, record = next((n, r) for n, r in _journal(dist)["jobs"].items() if n != "prepare")
    tasks = _wait(lambda: _tasks_of(record["id"]) or None, driver)
    for pid in tasks:
        os.kill(pid, signal.SIGKILL)
    _wait(lambda: True if _journal(dist).get("jobs", {}).get(name, record)["id"] != record["id"] else None, driver)
    # 2. the driver killed while jobs run: they go on, and the next driver finds them again
    driver.kill()
    driver.communicate()
    assert _journal(dist).get("jobs"), first
    again = start()
    _, err = again.communicate(timeout=900)
    assert again.returncode == 0, err
    assert "found again, waiting on it" in err
    whole, _ = uninterrupted
    ours = {k: v for k, v in dist_files(dist).items() if not k.startswith(".jobs/")}
    theirs = dist_files(whole)
    assert sorted(ours) == sorted(theirs)
    assert [k for k in ours if ours[k] != theirs[k]] == []
    assert any(p.name.endswith("_log.err") for p in (dist / ".jobs").iterdir())


@pytest.mark.slow
def test_build_and_eval_as_processes_write_what_one_process_writes(tiny: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)  # the jobs' environment is this process's
    src = ["--source", tiny / "source", "--observations", tiny / "observations"]
    dists = {"local": tmp_path / "local", "processes": tmp_path / "processes"}
    for executor, dist in dists.items():
        result = invoke("build", "rtn_mavg", *src, "--dist", dist, "--executor", executor)
        assert result.exit_code == 0, result.output
        result = invoke("eval", "rtn_mavg", "--path", "fakequant", "--split", "validation", *src, "--dist",
                        dist, "--executor", executor)
        assert result.exit_code == 0, result.output
        assert result.output.count("results: ") == 1, result.output
    ours = {k: v for k, v in dist_files(dists["processes"]).items() if not k.startswith(".jobs/")}
    theirs = dist_files(dists["local"])
    assert sorted(ours) == sorted(theirs) and any("/results/" in k for k in ours)
    assert [k for k in ours if ours[k] != theirs[k]] == []
    assert len({p.name.split("_")[0] for p in (dists["processes"] / ".jobs").glob("*_log.out")}) == 4  # 2 + 2 jobs
