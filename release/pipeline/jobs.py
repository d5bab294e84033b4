"""Named tasks as submitit jobs: on SLURM (``slurm``) or as processes of this machine (``processes``, submitit's
LocalExecutor: the same pickles, result files and job folders as on a cluster), each retried up to ``retries`` times
when it fails or is preempted, and found again by its job id after the driver itself was stopped.

The driver records each job's id through ``on_submit`` before it waits (``release campaign`` keeps them in
``campaign.json``); a driver started again passes them back as ``attached`` and waits on those jobs instead of
submitting new ones. A SLURM job is found again by submitit's own ``SlurmJob``; a local one by its process id (the
job's controller outlives the driver that started it) and its result file.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.device import libraries_loaded
from release.core.errors import ReleaseError
from release.core.output import info, warning
from release.core.rules import Executor

KINDS = ("local", "processes", "slurm")
POLL_S = 0.5  # how often the driver looks at its jobs
JOBS = ".jobs"  # under DIST: submitit's job folders (pickles, logs)


@dataclass(frozen=True)
class Task:
    """One job's work: ``fn(*args)`` in a process of its own; ``name`` says what it is (a build's name)."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]


def in_job(builds: Path, cap: str | None) -> None:
    """In a job's process: the driver's build files and GPU memory cap (``--builds`` and ``--max-gpu-memory`` are
    the driver's options; the environment comes with the job)."""
    from release.core import config
    from release.core.memory import set_cap

    config.BUILDS_OPTION[:] = [builds]
    set_cap(cap)
    libraries_loaded()


def submitit_module() -> Any:
    try:
        import submitit
    except ImportError as exc:
        raise ReleaseError("--executor processes or slurm needs submitit: pip install 'release[cluster]'") from exc
    return submitit


def make_executor(kind: str, settings: Executor, folder: Path, name: str) -> Any:
    """submitit's executor for ``kind``, its jobs' files under ``folder``; the SLURM parameters from
    ``release.yaml``'s ``executor`` section (one node and task, ``gpus_per_job`` GPUs)."""
    submitit = submitit_module()
    if kind == "processes":
        local = submitit.LocalExecutor(folder=folder)
        local.update_parameters(timeout_min=settings.timeout_min, gpus_per_node=0)
        return local
    if shutil.which("srun") is None:  # submitit's own check, as a one-line error
        raise ReleaseError("--executor slurm: no 'srun' on this machine's PATH; run the driver on a SLURM login or "
                           "compute node, or use --executor processes or local")
    slurm = submitit.SlurmExecutor(folder=folder, max_num_timeout=settings.retries)
    given = {"partition": settings.partition, "account": settings.account, "qos": settings.qos,
             "mem": None if settings.mem_gb is None else f"{settings.mem_gb}GB"}
    slurm.update_parameters(job_name=name, time=settings.timeout_min, nodes=1, ntasks_per_node=1,
                            gpus_per_node=settings.gpus_per_job, cpus_per_task=settings.cpus_per_job,
                            **{k: v for k, v in given.items() if v is not None})
    return slurm


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie, ended but not collected, does not)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    return "\nState:\tZ" not in status


def attach(kind: str, folder: Path, job_id: str) -> Any:
    """The job ``job_id`` of an earlier driver, found again."""
    submitit = submitit_module()
    if kind == "slurm":
        return submitit.SlurmJob(folder=folder, job_id=job_id)
    return submitit.LocalJob(folder=folder, job_id=job_id)


def _outcome(job: Any) -> tuple[str, Any]:
    """("running", None), ("done", its result) or ("failed", why) for one job."""
    from submitit.core.utils import FailedJobError, UncompletedJobError

    found_again = getattr(job, "_process", True) is None  # a local job of an earlier driver: no process handle
    if not job.paths.result_pickle.exists():
        if found_again and _alive(int(job.job_id)):
            return "running", None
        if found_again or not job.done():
            return ("failed", "its process ended without a result") if found_again else ("running", None)
    try:
        return "done", job.result()
    except FailedJobError as exc:  # the job's own error: the last line of its traceback says what it was
        trace = str(exc).split("-" * 22)
        lines = [line.strip() for line in (trace[1] if len(trace) > 2 else str(exc)).splitlines() if line.strip()]
        return "failed", lines[-1] if lines else type(exc).__name__
    except UncompletedJobError as exc:  # ended without a result: killed, preempted, out of time
        return "failed", str(exc).strip().splitlines()[0]


def run_jobs(kind: str, settings: Executor, folder: Path, tasks: Sequence[Task], attached: dict[str, str],
             on_submit: Callable[[str, str | None], None], on_done: Callable[[str, Any], None]) -> None:
    """Every task as a job (at most ``settings.max_jobs`` at once), the ``attached`` ones (task name: job id) waited
    on instead of submitted; ``on_submit(name, id)`` as each is submitted, ``on_done(name, result)`` then
    ``on_submit(name, None)`` as each finishes. A failed job is submitted again up to ``settings.retries`` times,
    each failure a warning naming its log; then a one-line error."""
    waiting = list(tasks)
    running: dict[str, tuple[Any, int]] = {}
    for task in list(waiting):
        if task.name in attached:
            running[task.name] = (attach(kind, folder, attached[task.name]), 1)
            waiting.remove(task)
            info(f"  {task.name}: job {attached[task.name]} found again, waiting on it")
    executors: dict[str, Any] = {}

    def submit(task: Task) -> Any:
        executor = executors.get(task.name) or make_executor(kind, settings, folder, f"release-{task.name}")
        executors[task.name] = executor
        job = executor.submit(task.fn, *task.args)
        on_submit(task.name, str(job.job_id))
        return job

    limit = settings.max_jobs or len(tasks)
    by_name = {t.name: t for t in tasks}
    while waiting or running:
        while waiting and len(running) < limit:
            task = waiting.pop(0)
            running[task.name] = (submit(task), 1)
            info(f"  {task.name}: job {running[task.name][0].job_id} submitted")
        for name, (job, attempt) in list(running.items()):
            state, value = _outcome(job)
            if state == "running":
                continue
            del running[name]
            if state == "done":  # its result kept first: a driver stopped between the two finds it done
                on_done(name, value)
                on_submit(name, None)
                continue
            log = job.paths.stderr
            if attempt > settings.retries:
                on_submit(name, None)
                raise ReleaseError(f"{log}: job {job.job_id} of {name} failed {attempt} times, last: {value}; "
                                   f"see its log, fix the cause and rerun (finished builds are kept)")
            warning(f"job {job.job_id} of {name} failed ({value}; log: {log}); submitted again "
                    f"({attempt} of {settings.retries} retries)")
            running[name] = (submit(by_name[name]), attempt + 1)
        if running:
            time.sleep(POLL_S)
