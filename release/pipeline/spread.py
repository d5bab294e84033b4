"""``release build`` and ``release eval`` with ``--executor processes|slurm``: each build (made and verified, or
evaluated) as a submitit job (:mod:`release.pipeline.jobs`), after one job for what they share: the calibration
capture, or the BF16 reference rollouts (and the yardsticks). The same files as one process writes."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from release.check.verify import REFERENCE_BUILD
from release.core.config import builds_dir
from release.inputs.fixture import fixture_reference
from release.inputs.source import remember_inputs
from release.measure.evaluate import EvalRequest, run_eval
from release.pipeline.jobs import JOBS, Task, in_job, run_jobs
from release.pipeline.sweep import run_builds
from release.quantize.build import Builder, BuildRequest


def capture_job(request: BuildRequest, builds: Path, cap: str | None) -> None:
    in_job(builds, cap)
    Builder.prepare(request)


def build_job(request: BuildRequest, name: str, builds: Path, cap: str | None) -> bool:
    in_job(builds, cap)
    return run_builds(replace(request, builds=[b for b in request.builds if b.name == name]))


def build_as_jobs(request: BuildRequest, executor: str, cap: str | None) -> bool:
    """The builds as jobs: the capture, then RTN where the others verify against it (no fixture reference), then
    the others at once. True when every build passed its verification."""
    here = builds_dir()
    reference = [b for b in request.builds if b.name == REFERENCE_BUILD and fixture_reference(request.source) is None]
    stages = [[Task("capture", capture_job, (request, here, cap))]]
    stages += [[Task(b.name, build_job, (request, b.name, here, cap)) for b in group]
               for group in (reference, [b for b in request.builds if b not in reference]) if group]
    passed: dict[str, Any] = {}
    for tasks in stages:
        run_jobs(executor, request.release.executor, request.out / JOBS, tasks, {}, lambda *_: None,
                 passed.__setitem__)
    remember_inputs(request.out, request.source, request.observations)
    return all(bool(passed[b.name]) for b in request.builds)


def eval_job(request: EvalRequest, name: str | None, builds: Path, cap: str | None) -> list[Path]:
    """One build's evaluation; with ``name`` None the BF16 reference rollouts and the yardsticks alone."""
    in_job(builds, cap)
    subjects = [s for s in request.subjects if s.build.name == name]
    return run_eval(replace(request, subjects=subjects, yardsticks=request.yardsticks and name is None))


def eval_as_jobs(request: EvalRequest, executor: str, cap: str | None) -> list[Path]:
    """The evaluation as jobs: the BF16 reference (and the yardsticks), then each build's at once; the results files
    in the order one process lists them."""
    here = builds_dir()
    written: dict[str, Any] = {}
    stages = [[Task("bf16", eval_job, (request, None, here, cap))],
              [Task(s.build.name, eval_job, (request, s.build.name, here, cap)) for s in request.subjects]]
    for tasks in stages:
        if tasks:
            run_jobs(executor, request.release.executor, request.dist / JOBS, tasks, {}, lambda *_: None,
                     written.__setitem__)
    return [*(p for s in request.subjects for p in written[s.build.name]), *written["bf16"]]
