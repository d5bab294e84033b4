"""``release campaign``: the seed card's whole campaign in one command, resumable, within a small disk.

From one load of the source and one calibration capture, each build of the sweep is made, verified and evaluated on
the paths and splits of ``campaign.evals`` (``builds/release.yaml``); then the tables and the selection; then the
evaluations of the delivered builds (``builds: chosen``: the evidence their cards cite); then the tables and the
selection again, and the cards of the delivered builds. A build's checkpoint (its ``*.safetensors`` and ``*.pth``
files) is dropped once it is evaluated, unless it is sure to be delivered or is the other builds' verification
reference: its provenance, verification report and results stay. Builds are byte-reproducible, so a dropped build
that the selection chooses is rebuilt and put back only if every file equals the bytes its verification report
recorded.

``DIST/campaign.json`` records each finished step, with the key of the inputs it ran on (source revision,
observation set, build configuration, tool version): a killed campaign resumes after its last finished step (the
rollouts and the capture resume from their caches), and a changed input redoes what it touches.
"""

from __future__ import annotations

import fcntl
import functools
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from release import __version__
from release.check.report import (
    CAMPAIGN_JOURNAL,
    REPORT_JSON,
    WEIGHT_SUFFIXES,
    file_manifest,
    load_report,
    manifest_files,
)
from release.check.verify import REFERENCE_BUILD, Verifier, VerifyRequest
from release.core.builds import load_build
from release.core.config import BuildConfig, ReleaseConfig, builds_dir
from release.core.device import libraries_loaded
from release.core.errors import ReleaseError
from release.core.io import json_digest, parse_json, write_json
from release.core.output import info, progress
from release.core.profile import stage
from release.core.provenance import read_provenance
from release.core.rules import CampaignEval
from release.inputs.fixture import fixture_reference
from release.inputs.observations import observation_set_digest
from release.inputs.source import SourceModel, remember_inputs
from release.measure.evaluate import EvalRequest, Subject, roll_out, run_eval
from release.measure.select import SelectRequest, delivery, run_select
from release.measure.tables import TablesRequest, run_tables
from release.pipeline.jobs import JOBS, Task, in_job, run_jobs, submitit_module
from release.publish.card.render import CardRequest, render_cards
from release.quantize.build import Builder, BuildRequest
from release.quantize.recipes import ObserverPasses, observes_source

JOURNAL = CAMPAIGN_JOURNAL
JOURNAL_FORMAT = "release-campaign/1"
REBUILD = ".campaign-rebuild"  # under DIST: where a dropped build is rebuilt before its bytes are compared
PARTS = ".campaign-parts"  # under DIST: each build job's record while it runs, merged into the journal by the driver


@dataclass(frozen=True)
class CampaignRequest:
    build: BuildRequest  # every build of the sweep, the source, the observations, DIST
    keep_checkpoints: bool
    baseline: str
    resamples: int
    executor: str = "local"  # or "processes", "slurm": the sweep's builds as submitit jobs (release.pipeline.jobs)
    max_gpu_memory: str | None = None  # --max-gpu-memory, which each job applies to itself
    builds_folder: Path = field(default_factory=builds_dir)  # the build files the jobs read

    @classmethod
    def create(cls, source: str | None, observations: Path | None, dist: Path, keep_checkpoints: bool,
               baseline: str, resamples: int, allow_revision_mismatch: bool = False, *, executor: str = "local",
               max_gpu_memory: str | None = None) -> CampaignRequest:
        request = BuildRequest.create((), True, source, observations, dist, allow_revision_mismatch)
        evals(request, request.builds[0])  # a release.yaml whose selection cannot be evaluated fails here
        for e in request.release.campaign.evals:
            for name in e.builds if isinstance(e.builds, list) else []:
                load_build(name)  # a name without a build file is refused before any work
        if executor != "local":
            submitit_module()  # not installed: one line before any work
        return cls(request, keep_checkpoints, baseline, resamples, executor, max_gpu_memory)

    @property
    def dist(self) -> Path:
        return self.build.out


def evals(request: BuildRequest, build: BuildConfig, chosen: bool = False) -> list[CampaignEval]:
    """The evaluations of ``build`` as it is made: ``campaign.evals`` that name it (or name no builds), else the
    selection's path and split; with ``chosen``, those the release runs on its delivered builds after the selection
    (``builds: chosen``)."""
    release = request.release
    listed = release.campaign.evals
    if not listed:
        rule = release.selection
        if rule is None:
            raise ReleaseError(f"{builds_dir() / 'release.yaml'}: 'campaign.evals' is empty and there is no "
                               "selection to take its path and split from; list the evaluations under "
                               "'campaign.evals'")
        listed = [CampaignEval(path=rule.path, split=rule.split)]
    if chosen:
        return [e for e in listed if e.after_selection]
    return [e for e in listed if e.builds is None or (isinstance(e.builds, list) and build.name in e.builds)]


def evaluation_key(release: ReleaseConfig, wanted: list[CampaignEval]) -> str:
    """What an evaluation's results depend on in ``release.yaml`` (the evaluations, the policy and step policy, the
    splits' labs, the action statistics): the journal records it, and an edit of any of them evaluates again."""
    return json_digest({"evals": [e.model_dump(mode="json") for e in wanted], "policy": release.policy.model_dump(),
                    "served_steps": release.served_steps.model_dump(), "labs": [release.calibration_labs,
                    release.heldout_labs], "action_stats": release.action_stats})


class Journal:
    """``DIST/campaign.json``: per build, the key of its inputs and its finished steps (verified, evaluated under
    the key of :func:`evaluation_key`, dropped files), written atomically after each step."""

    def __init__(self, request: BuildRequest, part: str | None = None) -> None:
        """The journal of DIST; with ``part`` (a build job's), that build's record alone, kept in PARTS while the
        job runs (it starts from the journal's record of that build)."""
        self.path = request.out / JOURNAL if part is None else request.out / PARTS / f"{part}.json"
        release = request.release  # what a build depends on in release.yaml: the capture runs the policy's steps
        made_under = json_digest({"policy": release.policy.model_dump(), "calibration_labs": release.calibration_labs})
        self.inputs = (f"{request.identity.revision}|{observation_set_digest(request.observations)}|{__version__}|"
                       f"{made_under}")
        read = self.path if self.path.is_file() or part is None else request.out / JOURNAL
        builds, jobs = _read_journal(read)
        self.builds: dict[str, dict[str, Any]] = builds if part is None else {k: builds[k] for k in builds if k == part}
        self.jobs: dict[str, dict[str, Any]] = jobs if part is None else {}  # job ids of the builds' running jobs

    def entry(self, build: BuildConfig) -> dict[str, Any]:
        """The build's record; a record of other inputs (another source, data, configuration or tool) is dropped."""
        key = f"{self.inputs}|{build.digest()}"
        if self.builds.get(build.name, {}).get("key") != key:
            self.builds[build.name] = {"key": key}
        return self.builds[build.name]

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_json(self.path, {"format": JOURNAL_FORMAT, "builds": self.builds, **({"jobs": self.jobs} if self.jobs
                                                                                     else {})})


def _read_journal(path: Path) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    doc: Any = {}
    if path.is_file():
        doc = parse_json(path.read_bytes(), str(path), "delete it to run the campaign from its start (finished "
                         "builds are then verified again, rollouts come from the cache)")
    fields = doc if isinstance(doc, dict) and doc.get("format") == JOURNAL_FORMAT else {}
    builds, jobs = fields.get("builds", {}), fields.get("jobs", {})
    for name, value in (("builds", builds), ("jobs", jobs)):
        if not isinstance(value, dict) or not all(isinstance(v, dict) for v in value.values()):
            raise ReleaseError(f"{path}: field '{name}' must map build names to records; delete the file to run the "
                               "campaign from its start")
    return builds, jobs


def checkpoint_files(folder: Path) -> list[str]:
    """The files of a build that its campaign may drop and must restore byte for byte: its weights."""
    return [rel for rel in manifest_files(folder) if rel.endswith(WEIGHT_SUFFIXES)]


def drop_checkpoint(folder: Path, entry: dict[str, Any], journal: Journal) -> None:
    files = entry.get("dropped") or checkpoint_files(folder)
    entry["dropped"] = files  # recorded first: a kill mid-way leaves the list to finish with
    journal.save()
    for rel in files:
        (folder / rel).unlink(missing_ok=True)


def restore_checkpoints(request: CampaignRequest, builds: list[BuildConfig], journal: Journal) -> None:
    """Rebuild dropped builds beside DIST (one load of the source) and put their weights back, each only if every
    file equals the bytes its verification report recorded (sha256 and size); else a one-line error naming it."""
    staging = request.dist / REBUILD
    _check_space(request.dist, builds, journal)
    builder = Builder.prepare(replace(request.build, builds=builds, out=staging))
    observed = ObserverPasses(b.calibrator for b in builds if observes_source(b))
    for build in builds:
        folder, entry = request.dist / build.repo, journal.entry(build)
        loaded = load_report(folder, build.name)
        if loaded is None:
            raise ReleaseError(f"{folder / REPORT_JSON}: missing; the dropped checkpoint of {build.name} cannot be "
                               f"checked; run 'release build {build.name}' and 'release verify {build.name}'")
        recorded = loaded[0].manifest
        with stage(f"campaign: rebuild {build.name}"):
            builder.make(build, observed)
        files: list[str] = entry["dropped"]
        rebuilt = file_manifest(staging / build.repo, files)
        for rel in files:
            if rel not in recorded or rebuilt[rel] != recorded[rel]:
                was = recorded[rel].sha256 if rel in recorded else "no entry"
                raise ReleaseError(f"{staging / build.repo / rel}: the rebuilt {build.name} differs from the bytes "
                                   f"its verification saw (sha256 {rebuilt[rel].sha256}, {folder / REPORT_JSON}: "
                                   f"{was}); this machine does not reproduce it: rerun 'release campaign "
                                   "--keep-checkpoints'")
        for rel in files:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            os.replace(staging / build.repo / rel, folder / rel)
        del entry["dropped"]
        journal.save()
        info(f"  {build.name}: rebuilt, its {len(files)} weight files equal the verified bytes, put back")
    shutil.rmtree(staging)


def _check_space(dist: Path, builds: list[BuildConfig], journal: Journal) -> None:
    """Refuse before any rebuild when the disk cannot hold the weights to put back (their sizes, as verified)."""
    needed = 0
    for build in builds:
        loaded = load_report(dist / build.repo, build.name)
        manifest = loaded[0].manifest if loaded is not None else {}
        needed += sum(manifest[rel].size for rel in journal.entry(build)["dropped"] if rel in manifest)
    free = shutil.disk_usage(dist).free
    if needed > free:
        raise ReleaseError(f"{dist}: putting back the weights of {', '.join(b.name for b in builds)} needs "
                           f"{needed / 1e9:.1f} GB, {free / 1e9:.1f} GB are free; free disk space and rerun "
                           "'release campaign' (it resumes here)")


def _kept(request: CampaignRequest) -> set[str]:
    """Builds whose checkpoints stay through the sweep: those delivered whatever the data say, and the RTN build
    while it is the other builds' verification reference (no fixture reference)."""
    sure = set(delivery(request.build.release, None).builds)  # without a rule: every repo, as delivery says
    return sure | ({REFERENCE_BUILD} if fixture_reference(request.build.source) is None else set())


def _evaluate(request: CampaignRequest, build: BuildConfig, wanted: list[CampaignEval],
              resident: SourceModel | None = None) -> None:
    """The evaluations ``wanted`` of the build; each path's splits rolled out from one load of each model (the fake
    quant replay made from the build's files and the ``resident`` source's architecture)."""
    dist, b = request.dist, request.build
    subject = Subject(build, dist / build.repo, dist / build.repo)
    for path in dict.fromkeys(e.path for e in wanted):
        splits = [e.split for e in wanted if e.path == path]
        base = EvalRequest(b.release, [subject], path, splits[0], dist, b.source, b.observations, b.cache, False,
                           b.release.served_steps, resident)
        with stage(f"campaign: eval {path}"):
            roll_out(base, list(splits))
            for split in splits:
                run_eval(replace(base, split=split))


def _yardsticks(request: CampaignRequest) -> None:
    b = request.build
    for split in b.release.campaign.yardsticks:
        with stage("campaign: yardsticks"):
            run_eval(EvalRequest(b.release, [], "fakequant", split, request.dist, b.source, b.observations, b.cache,
                                 True, b.release.served_steps))


def _verified(verifier: Verifier, request: CampaignRequest, build: BuildConfig, at: Path | None = None) -> bool:
    """The build's verification in the dist, or of ``at`` (the build before it is put in place)."""
    b = request.build
    return verifier(VerifyRequest.create(build.name, request.dist, None, b.source, b.observations,
                                         require_reference=False, at=at))


@contextmanager
def _one_driver(dist: Path) -> Iterator[None]:
    """Hold DIST for this campaign: a second ``release campaign`` on it (on any machine that shares it) is refused
    while this one runs. The lock is on the folder itself (``flock``): nothing is left behind."""
    dist.mkdir(parents=True, exist_ok=True)
    fd = os.open(dist, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReleaseError(f"{dist}: another 'release campaign' is running on this dist; wait for it to end (or "
                               "stop it) and rerun") from None
        yield
    finally:
        os.close(fd)


def run_campaign(request: CampaignRequest) -> tuple[list[Path], bool]:
    """The campaign (module docstring), in the order a decision needs: builds and their evaluations, tables, the
    selection, the evaluations of the chosen builds (``builds: chosen``: the deployed path of what the cards
    recommend), tables and selection again on the complete results, then the cards. Returns the cards written and
    whether every build passed its verification. With ``executor`` processes or slurm the sweep's builds are jobs
    (:func:`_sweep_as_jobs`) and the rest runs here, as in one process."""
    libraries_loaded()
    with _one_driver(request.dist):
        return _campaign(request)


def _campaign(request: CampaignRequest) -> tuple[list[Path], bool]:
    b, dist = request.build, request.dist
    journal = Journal(b)
    ok = _sweep(request, journal) if request.executor == "local" else _sweep_as_jobs(request, journal)
    remember_inputs(dist, b.source, b.observations)  # verify and eval on this dist find them without the options
    delivered: list[str] = []
    for _ in range(len(b.builds) + 1):  # until the choice holds on the complete results (the rule may score them)
        run_tables(TablesRequest.create((), dist, None, request.baseline, request.resamples))
        chosen = delivery(b.release, run_select(SelectRequest.create(dist))).builds
        if chosen == delivered:
            break
        delivered = chosen
        _deliver(request, journal, [x for x in b.builds if x.name in delivered])
    for build in b.builds:
        if build.name not in delivered and not request.keep_checkpoints:
            drop_checkpoint(dist / build.repo, journal.entry(build), journal)
    cards = render_cards(CardRequest.create(tuple(delivered), dist, ",".join(b.release.languages)))
    return cards, ok


def _sweep(request: CampaignRequest, journal: Journal) -> bool:
    """Each build of the sweep made, verified and evaluated in turn (the verification reference first), after the
    yardsticks. Whether every build passed."""
    _yardsticks(request)
    builds = _order(request.build.builds)
    sweep = _Sweep(request, journal, ObserverPasses(x.calibrator for x in builds if observes_source(x)))
    ok = True
    with progress("campaign: builds", len(builds)) as bar:
        for build in builds:
            ok &= sweep.step(build)
            bar.advance()
    return ok


def _order(builds: list[BuildConfig]) -> list[BuildConfig]:
    return sorted(builds, key=lambda x: x.name != REFERENCE_BUILD)


@dataclass
class _Sweep:
    """What the builds made in one process share: the source loaded once, the verifier, the observer passes."""

    request: CampaignRequest
    journal: Journal
    observed: ObserverPasses
    builder: Builder | None = None
    verifier: Verifier | None = None

    def step(self, build: BuildConfig) -> bool:
        """The build made (or found) and verified, then evaluated. The weights of a build this step put in place are
        dropped once it is evaluated unless it is kept (:func:`_kept`); those a resumed or repeated run finds in
        place stay until the selection has chosen (a finished campaign's rerun, or one after an edit of the
        evaluations, keeps the delivered builds whole). Whether it passed its verification."""
        request, journal, b = self.request, self.journal, self.request.build
        entry, folder = journal.entry(build), request.dist / build.repo
        made = False
        if "verified" not in entry:
            if _built(folder, build, b):
                self.verifier = self.verifier or Verifier(self.builder.source if self.builder is not None else None)
                entry["verified"] = _verified(self.verifier, request, build)
            else:  # verified before it is put in place, as by 'release build'
                self.builder = self.builder or Builder.prepare(b)
                self.verifier = self.verifier or Verifier(self.builder.source)
                entry["verified"] = bool(self.builder.make(build, self.observed, functools.partial(
                    _verified, self.verifier, request, build)))
                made = True
            journal.save()
        wanted = evals(b, build)
        key = evaluation_key(b.release, wanted)
        if entry["verified"] and entry.get("evaluated") != key:
            if entry.get("dropped"):  # evaluated again (an edited release.yaml): its weights put back first
                restore_checkpoints(request, [build], journal)
                made = True
            _evaluate(request, build, wanted, self.builder.source if self.builder is not None else None)
            entry["evaluated"] = key
            journal.save()
        if made and (build.name not in _kept(request) or not entry["verified"]) and not request.keep_checkpoints:
            drop_checkpoint(folder, entry, journal)
        return bool(entry["verified"])


def _finished(b: BuildRequest, build: BuildConfig, entry: dict[str, Any]) -> bool:
    """Whether a build's step is done: verified, and failed or evaluated under the current evaluations."""
    return "verified" in entry and (not entry["verified"] or entry.get("evaluated") == evaluation_key(
        b.release, evals(b, build)))


def prepare_job(request: CampaignRequest) -> None:
    """The first job of ``--executor processes|slurm``: the BF16 yardsticks and the calibration capture, into the
    dist and the shared cache (RELEASE_CACHE) where the build jobs find them."""
    in_job(request.builds_folder, request.max_gpu_memory)
    _yardsticks(request)
    Builder.prepare(request.build)


def build_job(request: CampaignRequest, name: str) -> dict[str, Any]:
    """A build job of ``--executor processes|slurm``: the step of :class:`_Sweep` for one build, as in one process,
    its record kept in PARTS while it runs (a job submitted again resumes from it); returns the record."""
    in_job(request.builds_folder, request.max_gpu_memory)
    build = next(x for x in request.build.builds if x.name == name)
    journal = Journal(request.build, part=name)
    _Sweep(request, journal, ObserverPasses([build.calibrator] if observes_source(build) else [])).step(build)
    return journal.entry(build)


def _sweep_as_jobs(request: CampaignRequest, journal: Journal) -> bool:
    """The sweep as submitit jobs: the capture and yardsticks first, then the verification reference (when the
    fixture has none), then every other unfinished build at once (up to ``executor.max_jobs``). Each finished
    build's record is merged into the journal in the sweep's order, as one process writes it; the job ids are kept
    in the journal until their jobs end, so that a driver started again waits on the jobs still running."""
    b, dist = request.build, request.dist
    builds = _order(b.builds)
    for build in builds:
        journal.entry(build)  # the records in the sweep's order
    todo = [x for x in builds if not _finished(b, x, journal.entry(x))]
    reference = [x for x in todo if x.name == REFERENCE_BUILD and fixture_reference(b.source) is None]
    stages = [[Task("prepare", prepare_job, (request,))]] if todo else []
    stages += [[Task(x.name, build_job, (request, x.name)) for x in group]
               for group in (reference, [x for x in todo if x not in reference]) if group]
    attached = {name: str(record.get("id")) for name, record in journal.jobs.items()}

    def submitted(name: str, job_id: str | None) -> None:
        if job_id is None:
            journal.jobs.pop(name, None)
        else:
            journal.jobs[name] = {"id": job_id}
        journal.save()

    def done(name: str, record: Any) -> None:
        if isinstance(record, dict):  # a build's record (the prepare job returns none)
            journal.builds[name] = record
            journal.save()
            (dist / PARTS / f"{name}.json").unlink(missing_ok=True)

    with progress("campaign: build jobs", len(todo)) as bar:
        def finished(name: str, record: Any) -> None:
            done(name, record)
            if name != "prepare":
                bar.advance()

        for stage_tasks in stages:
            run_jobs(request.executor, b.release.executor, dist / JOBS, stage_tasks, attached, submitted, finished)
    journal.jobs.clear()
    journal.save()
    if (dist / PARTS).is_dir() and not any((dist / PARTS).iterdir()):
        (dist / PARTS).rmdir()
    return all(bool(journal.entry(x).get("verified")) for x in builds)


def _deliver(request: CampaignRequest, journal: Journal, builds: list[BuildConfig]) -> None:
    """The delivered ``builds`` made whole (dropped weights rebuilt and checked byte for byte) and evaluated as
    ``builds: chosen`` asks, each evaluation once (the journal's ``chosen_evaluated``)."""
    dropped = [x for x in builds if journal.entry(x).get("dropped")]
    if dropped:
        restore_checkpoints(request, dropped, journal)
    for build in builds:
        entry = journal.entry(build)
        wanted = evals(request.build, build, chosen=True)
        key = evaluation_key(request.build.release, wanted)
        if wanted and entry.get("verified") and entry.get("chosen_evaluated") != key:
            _evaluate(request, build, wanted)
            entry["chosen_evaluated"] = key
            journal.save()


def _built(folder: Path, build: BuildConfig, request: BuildRequest) -> bool:
    """Whether ``folder`` holds this build of this source under this policy whole: its provenance (a build folder is
    put in place atomically) and, where it was verified before, every weight file its report lists (none dropped)."""
    path = folder / "provenance.json"
    if not path.is_file():
        return False
    prov = read_provenance(path, build.name)
    if (prov["config_sha256"] != build.digest() or prov["source"]["revision"] != request.identity.revision
            or prov.get("policy") != request.release.policy.model_dump()):
        return False
    loaded = load_report(folder, build.name)
    return loaded is None or all((folder / rel).is_file() for rel in loaded[0].manifest
                                if rel.endswith(WEIGHT_SUFFIXES))
