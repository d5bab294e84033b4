"""``release verify``: a build against a reference checkpoint and its source, as a report and a gate.

Six checks, as in the seed card's "Verification" table: layout (safetensors headers only), quantization configs,
ModelOpt state files (:mod:`release.check.layout`), values (recomputed from the source), index consistency
(:mod:`release.check.values`), and loadability in diffusers (here). Every problem is reported by file and tensor;
nothing here raises on a damaged checkpoint. The report and its manifest are :mod:`release.check.report`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from release.check.layout import (
    ReferenceOrigin,
    check_layout,
    check_modelopt_states,
    check_quant_configs,
    reference_origin,
)
from release.check.report import (
    AFTER_VERIFICATION,
    INDEPENDENT,
    REPORT_FORMAT,
    REPORT_JSON,
    REPORT_MD,
    Check,
    FileEntry,
    Report,
    dropped_weights,
    file_manifest,
    manifest_files,
)
from release.check.values import check_consistency, check_values, read_tensors
from release.core.builds import load_build, load_release
from release.core.config import BuildConfig, ReleaseConfig
from release.core.device import libraries_loaded
from release.core.errors import ReleaseError
from release.core.io import json_text, write_set
from release.core.output import progress, warning
from release.core.profile import stage
from release.inputs.fixture import fixture_reference
from release.inputs.source import SourceModel, recalled_inputs, resolve_checkpoint, resolve_source

REFERENCE_BUILD = "rtn"  # NVIDIA's recipe: the reference of the layout checks when no --reference is given


@dataclass(frozen=True)
class VerifyRequest:
    release: ReleaseConfig
    build: BuildConfig
    folder: Path
    reference: Path | None
    source: Path
    observations: Path | None
    origin: ReferenceOrigin | None = None  # what the reference is (release.check.layout.reference_origin)

    @property
    def reference_name(self) -> str | None:
        """The reference as the report names it (no local path): its folder's name, or the build's repo when the
        build is its own reference (verified under a temporary name before it is put in place)."""
        if self.reference is None:
            return None
        return self.build.repo if self.reference == self.folder else self.reference.name

    @classmethod
    def create(cls, name: str, dist: Path, reference: str | Path | None, source: str | Path | None,
               observations: Path | None, require_reference: bool = True, at: Path | None = None) -> VerifyRequest:
        """Without ``reference``: the fixture's (ModelOpt's own export, when the source is a tiny fixture), else the
        RTN build in ``dist`` (a self-reference); ``require_reference=False`` (after a build): without the RTN build
        the reference checks are skipped. ``at``: the folder to verify in place of ``dist``'s, a new build before it
        is put in place (the RTN build there is then its own reference)."""
        release = load_release()
        build = load_build(name)
        folder = at or dist / build.repo
        source, observations = recalled_inputs(dist, source, observations)
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {name}' first")
        refuse_dropped(folder, build)
        src = resolve_source(release, source)
        ref: Path | None = fixture_reference(src) if reference is None else None
        if reference is None and ref is None:
            ref = dist / release.repos[REFERENCE_BUILD] if REFERENCE_BUILD in release.repos else None
            if at is not None and ref == dist / build.repo:
                ref = at
            if not require_reference and ref is not None and not ref.is_dir():
                ref = None
            if ref is not None and not ref.is_dir():
                raise ReleaseError(f"reference {ref} does not exist; pass --reference DIR (NVIDIA's "
                                   "Cosmos3-Nano@fp8, or the RTN build)")
        elif reference is not None:
            ref = resolve_checkpoint(reference, "--reference")
        if observations is None and (src.parent / "observations").is_dir():
            observations = src.parent / "observations"
        return cls(release, build, folder, ref, src, observations,
                   reference_origin(folder, ref) if ref is not None else None)


def refuse_dropped(folder: Path, build: BuildConfig) -> None:
    """A build whose weight files, listed by its verification report, are gone (a campaign drops the weights of the
    builds it does not deliver) is refused in one line: its checks would look at nothing, and its passed report,
    which still vouches for the bytes it saw, would be replaced by a failed one."""
    gone = dropped_weights(folder, build.name)
    if gone:
        raise ReleaseError(f"{folder}: {len(gone)} weight files its verification saw are gone ({gone[0]}, ...): the "
                           "build was dropped (a campaign keeps only the delivered builds' weights); its report is "
                           f"kept. Restore it with 'release build {build.name}' (verified again), or 'release "
                           "campaign', which rebuilds the builds it delivers and checks them against the report")


def check_loadable(request: VerifyRequest) -> Check:
    """The build loads as the card's Use code loads the published repo (:func:`load_build_transformer`: diffusers
    with ModelOpt's restore, the folder as the downloaded snapshot; plain Linears holding FP8 weights fail the
    check) and one policy rollout gives finite actions, with diffusers' default step policy (W8A16 on the first and
    last steps). A per-channel build cannot run either way: that policy refuses its scales ("requires one tensorwise
    ModelOpt FP8 weight scale") and ModelOpt has no kernel for a restored per-channel weight with per-token inputs
    ("self._dequantize is True and self.fake_quant is False"); it is rolled out W8A8 on every step through the
    row-wise FP8 kernel of ``release eval --path deployed``."""
    from release.core.device import free_memory
    from release.inputs.observations import load_observations, split
    from release.inputs.policy import load_pipeline, rollout
    from release.quantize.load import deployed_transformer, load_build_transformer
    from release.quantize.recipes import per_channel

    if request.observations is None:
        return Check("loadable", "failed", "no observation set to roll out on; pass --observations DIR")
    every_step = request.build.scheme == per_channel.SCHEME
    observations = request.observations

    def roll_out() -> Any:  # the pipeline is dropped on return, and collected in ``finally``
        transformer = deployed_transformer(request.folder) if every_step else load_build_transformer(request.folder)
        obs = split(load_observations(observations), request.release.calibration_labs)[0]
        pipe = load_pipeline(request.folder, request.release.policy, transformer=transformer)
        kwargs: dict[str, Any] = {"mixed_precision_format": "none"} if every_step else {}
        return rollout(pipe, obs, request.release.policy, **kwargs)

    try:
        actions = roll_out()
    except ReleaseError as exc:
        return Check("loadable", "failed", str(exc))
    except Exception as exc:  # diffusers / ModelOpt refusing a damaged checkpoint
        return Check("loadable", "failed", f"diffusers could not load or run the build: {str(exc).splitlines()[0]}")
    finally:
        free_memory()
    how = " (W8A8 on every step, row-wise FP8 kernel)" if every_step else ""
    return Check("loadable", "passed", f"loads in diffusers with ModelOpt's restore; one policy rollout{how} gives "
                                   f"finite actions {list(actions.shape)}")


def _run_checks(request: VerifyRequest, source_tensors: dict[str, torch.Tensor] | None) -> list[Check]:
    checks: list[Check] = []
    runners: list[tuple[str, Callable[[], Check]]] = []
    if request.reference is not None:
        ref = request.reference
        scheme = request.build.scheme
        origin = request.origin or reference_origin(request.folder, ref)
        runners += [("layout", lambda: check_layout(request.folder, ref, scheme, origin,
                                                          request.release.languages)),
                    ("quantization_config", lambda: check_quant_configs(request.folder, ref, scheme, origin)),
                    ("modelopt_state", lambda: check_modelopt_states(request.folder, ref, scheme, origin))]
    else:
        checks += [Check(name, "skipped", "skipped: no reference (build 'rtn' into the same folder, or run "
                                          "'release verify --reference DIR')")
                   for name in ("layout", "quantization_config", "modelopt_state")]
    runners += [("values", lambda: check_values(request.folder, request.source, source_tensors)),
                ("consistency", lambda: check_consistency(request.folder)),
                ("loadable", lambda: check_loadable(request))]
    for name, run in runners:
        with stage(f"verify: {name}"):
            checks.append(run())
    return checks


def verify(request: VerifyRequest, source_tensors: dict[str, torch.Tensor] | None = None) -> list[Check]:
    """Run every check, write ``verification/report.{json,md}`` into the build folder, return the checks
    (``source_tensors``: the source's transformer tensors, when several builds of one source are verified)."""
    # The files are hashed while the checks run (sha256 takes one core per file: 5 s of a Nano build's 16 GB). Either
    # way a file that differs from the manifest when the build is pushed, changed at any time after it was listed,
    # fails the push.
    files = manifest_files(request.folder)  # a link or a pipe is refused before any check runs
    with ThreadPoolExecutor(1) as hashing:
        hashed = hashing.submit(file_manifest, request.folder, files)
        checks = _run_checks(request, source_tensors)
        with stage("verify: hash the files (what the checks left)"):
            manifest = hashed.result()
    markdown = render_markdown(request, checks).encode()
    manifest[REPORT_MD] = FileEntry(sha256=hashlib.sha256(markdown).hexdigest(), size=len(markdown))
    statuses = {c.status for c in checks}
    report = Report(format=REPORT_FORMAT, build=request.build.name, repo=request.build.repo,
                    reference=request.reference_name,  # no local path in it
                    status="failed" if "failed" in statuses else "incomplete" if "skipped" in statuses else "passed",
                    checks=checks, manifest=manifest,
                    after_verification=list(AFTER_VERIFICATION))
    write_set({request.folder / REPORT_MD: markdown,  # then report.json, which the gate reads
               request.folder / REPORT_JSON: json_text(report.model_dump(mode="json"))})
    return checks


def render_markdown(request: VerifyRequest, checks: list[Check]) -> str:
    ref = f"`{request.reference_name}`" if request.reference else "none"
    if request.reference is not None and request.origin is not None and request.origin.kind != INDEPENDENT:
        ref += f" ({request.origin.kind}: {request.origin.what})"
    lines = [f"# Verification of {request.build.repo}", "", f"Reference: {ref}", "", "| Check | Passed | Result |",
             "|---|---|---|"]
    shown = {"passed": "yes", "failed": "NO", "skipped": "skipped"}
    lines += [f"| {c.name} | {shown[c.status]} | {c.summary} |" for c in checks]
    return "\n".join(lines) + "\n"


def counted(checks: list[Check]) -> str:
    """The checks in a few words: ``6 checks passed``, or ``6 checks: 4 passed, 1 failed, 1 skipped``."""
    counts = {status: sum(c.status == status for c in checks) for status in ("passed", "failed", "skipped")}
    if counts["passed"] == len(checks):
        return f"{len(checks)} checks passed"
    return f"{len(checks)} checks: " + ", ".join(f"{n} {status}" for status, n in counts.items() if n)


def summary_table(request: VerifyRequest, checks: list[Check]) -> Any:
    """A rich table of the checks, for the terminal."""
    from rich.table import Table

    table = Table(title=f"verification: {request.build.repo}", title_justify="left", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("details", overflow="fold")
    shown = {"passed": "[green]pass[/]", "failed": "[red]FAIL[/]", "skipped": "[yellow]skipped[/]"}
    for c in checks:
        table.add_row(c.name, shown[c.status], c.summary)
    return table


class Verifier:
    """Verifies builds and prints each summary, reading each source's transformer once however many builds of it
    it verifies. ``source``: the build's source model; where its tensors stay on the GPU
    (:class:`release.inputs.source.SourceModel`) and equal the files' byte for byte, the checks read them there instead
    of copying the files' tensors to the GPU for every build. The comparison starts at once, in a thread, so that it
    runs while the first build is made (5 s of a Nano build on an H200, BENCHMARKS.md)."""

    def __init__(self, source: SourceModel | None = None, tables: bool = True) -> None:
        from rich.console import Console

        self.console = Console(width=160)
        self.tables = tables  # False (verify --format json): no summary tables, the results kept in ``results``
        self.results: list[dict[str, Any]] = []
        self.sources: dict[Path, dict[str, torch.Tensor]] = {}
        self.resident = source if source is not None and source.resident else None
        self.compared: Future[bool] | None = None
        if self.resident is not None:
            comparing = ThreadPoolExecutor(1)
            self.compared = comparing.submit(_files_hold, self.resident.folder / "transformer", self.resident.state)
            comparing.shutdown(wait=False)  # the comparison runs on; its result is awaited by the first verification

    def _resident_state(self, source: Path) -> dict[str, torch.Tensor] | None:
        if self.resident is None or self.compared is None or self.resident.folder != source:
            return None
        return self.resident.state if self.compared.result() else None

    def __call__(self, request: VerifyRequest) -> bool:
        """Verify one build; True when no check failed (skipped ones are shown)."""
        with progress(f"verify {request.build.name}") as bar:
            if request.source not in self.sources:
                self.sources.clear()
                problems: list[str] = []
                with bar.part("read the source"), stage("verify: read the source"):
                    tensors = self._resident_state(request.source)
                    if tensors is None:
                        tensors = read_tensors(request.source / "transformer", problems)
                if not problems:
                    self.sources[request.source] = tensors
            with stage(f"verify {request.build.name}"):
                checks = verify(request, self.sources.get(request.source))
            bar.result = counted(checks)
        passed = all(c.status != "failed" for c in checks)
        if self.tables:
            self.console.print(summary_table(request, checks))
        self.results.append({"build": request.build.name, "repo": request.build.repo, "passed": passed,
                             "report": str(request.folder / REPORT_JSON),
                             "checks": [{"name": c.name, "status": c.status, "summary": c.summary} for c in checks]})
        return passed


def _files_hold(folder: Path, resident: dict[str, torch.Tensor]) -> bool:
    """Whether the shards of ``folder`` hold exactly ``resident``'s tensors (names, dtypes, shapes, bytes), read one
    tensor at a time; False on any shard it cannot read (the checks then read the files and name the problem)."""
    from safetensors import safe_open

    seen: set[str] = set()
    try:
        for shard in sorted(folder.glob("*.safetensors")):
            with safe_open(shard, framework="pt") as f:
                for key in f.keys():
                    kept, read = resident.get(key), f.get_tensor(key)
                    if kept is None or key in seen or read.dtype != kept.dtype or read.shape != kept.shape \
                            or not torch.equal(read.to(kept.device), kept):
                        return False
                    seen.add(key)
    except Exception:  # an unreadable shard: the checks that read the files name it
        return False
    return seen == resident.keys()


def verify_names(names: tuple[str, ...], all_builds: bool, dist: Path) -> tuple[str, ...]:
    """The builds to verify: ``names``, or with ``--all`` every build of the sweep (else every build file) that has
    a folder in ``dist``."""
    from release.core.builds import available_builds

    if all_builds:
        names = tuple(n for n in load_release().sweep or available_builds() if (dist / load_build(n).repo).is_dir())
        dropped = [n for n in names if dropped_weights(dist / load_build(n).repo, n)]
        if dropped:  # named, each is a one-line error (refuse_dropped); in --all, left out and said so
            warning(f"{', '.join(dropped)}: dropped by the campaign (weights gone, reports kept); left out: restore "
                    "one with 'release build NAME', or name it to see why")
        names = tuple(n for n in names if n not in dropped)
        if not names:
            raise ReleaseError(f"{dist}: no build of the sweep is there; run 'release build --all --out {dist}' first")
    if not names:
        raise ReleaseError("name at least one build, or pass --all (every build of the sweep in --dist)")
    return names


def verify_builds(requests: list[VerifyRequest], fmt: str = "text") -> bool:
    """Verify each build; True when no check of any build failed. Under torchrun each rank verifies its share and
    all get the same answer. ``fmt`` json: instead of the summary tables, one JSON document on stdout (each build's
    checks, whether it passed and where its report is; one process only)."""
    import json

    import click

    from release.core.distributed import world

    if fmt == "json" and world().size > 1:
        raise ReleaseError("--format json: one process prints one document; run release verify without torchrun")
    libraries_loaded()
    verifier = Verifier(tables=fmt == "text")
    ok = True
    for request in world().share(requests):
        ok &= verifier(request)
    if fmt == "json":
        click.echo(json.dumps({"passed": ok, "builds": verifier.results}, indent=2, sort_keys=True))
    return world().all_true(ok)
