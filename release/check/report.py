"""``verification/report.json``: the checks' results and the manifest of the bytes they saw, read back with
every field validated, and the gate ``release push`` applies to it. The manifest holds the sha256 and size of every
file the checks saw, hashed before they ran: ``release push`` publishes a build only while its files are exactly those
bytes (plus the cards and results, written after verification)."""

from __future__ import annotations

import fnmatch
import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from release.core.errors import ReleaseError
from release.core.files import plain_files
from release.core.io import parse_json, sha256_file

REPORT_DIR = "verification"
REPORT_JSON = f"{REPORT_DIR}/report.json"
REPORT_MD = f"{REPORT_DIR}/report.md"
REPORT_FORMAT = "release-verification/2"
# Written after verification, by ``release card`` (the card files) and ``release eval`` / ``import-served`` (the
# results): not in the manifest, pushed as they are (and scanned for secrets). ``*`` does not cross a ``/``.
CARD_FILES = ("README.md", "README.*.md", "LICENSE", "forest.*.png")  # what 'release card' writes
WEIGHT_SUFFIXES = (".safetensors", ".pth")  # a build's weights and ModelOpt state: what a campaign drops
CAMPAIGN_JOURNAL = "campaign.json"  # DIST/campaign.json: release.pipeline.campaign's journal
WRITTEN = f"{REPORT_DIR}/written.json"  # what card and eval wrote after verification (release.check.written)
RESULT_FILES = ("results/*.npz", "results/*.perf.json")  # what 'release eval' and 'import-served' write
AFTER_VERIFICATION = (*CARD_FILES, *RESULT_FILES, WRITTEN)
Status = Literal["passed", "failed", "skipped"]
# What a reference is, recorded by the checks against it in ``details["reference"]["kind"]``
# (release.check.layout.reference_origin) and read by the cards.
SELF_REFERENCE = "self-reference"  # the build itself, or another build of this tool: evidence of nothing independent
MODELOPT_EXPORT = "modelopt-export"  # ModelOpt's own HF export (the tiny fixture's reference, release.inputs.reference)
INDEPENDENT = "independent"  # a checkpoint this tool did not make (NVIDIA's Cosmos3-Nano@fp8)


@dataclass
class Check:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def status_of(ok: bool) -> Status:
    return "passed" if ok else "failed"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Report(BaseModel):
    """``verification/report.json``. ``status`` is ``incomplete`` when no check failed but some were skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["release-verification/2"]
    build: str
    repo: str
    reference: str | None
    status: Literal["passed", "failed", "incomplete"]
    checks: list[Check]
    manifest: dict[str, FileEntry] = Field(description="every file the checks saw (and report.md), by path")
    after_verification: list[str] = Field(description="patterns of the files card and eval add afterwards")


def matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether the relative path matches one of the patterns (``*`` does not cross a ``/``)."""
    return any(rel.count("/") == p.count("/") and fnmatch.fnmatchcase(rel, p) for p in patterns)


def after_verification(rel: str) -> bool:
    return matches(rel, AFTER_VERIFICATION)


def card_name(lang: str, first: bool) -> str:
    """The card of ``lang`` when ``release card --lang`` names it first (``README.md``) or later."""
    return "README.md" if first else f"README.{lang}.md"


def may_follow_verification(rel: str, languages: list[str]) -> bool:
    """Whether a build folder of a release in ``languages`` may hold ``rel`` after its verification: the one rule
    ``verify`` (which ignores these files), ``card`` (which removes the card files it did not render) and ``push``
    (which publishes no other) share. The cards, LICENSE and forest plots of the release's languages only (a
    ``README.xx.md`` of another language is no file this release writes), the results, and the record of them."""
    cards = {"README.md", "LICENSE", *(f"README.{code}.md" for code in languages),
             *(f"forest.{code}.png" for code in languages)}
    return rel in cards or rel == WRITTEN or matches(rel, RESULT_FILES)


def manifest_files(folder: Path) -> list[str]:
    """The files a manifest covers: every file of the build but ``verification/`` and what is added later (links
    and other non-files refused, :func:`release.core.files.plain_files`)."""
    return [rel for rel in plain_files(folder) if not rel.startswith(f"{REPORT_DIR}/") and not after_verification(rel)]


def file_manifest(folder: Path, files: list[str]) -> dict[str, FileEntry]:
    """sha256 and size of ``files`` of the build (:func:`manifest_files`), hashed afresh."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sizes = [(folder / rel).stat().st_size for rel in files]
        digests = list(pool.map(lambda rel: sha256_file(folder / rel), files))
    return {rel: FileEntry(sha256=d, size=n) for rel, d, n in zip(files, digests, sizes, strict=True)}


def load_report(folder: Path, build: str) -> tuple[Report, str] | None:
    """The build's verification report and the sha256 of the bytes read, or None when it has none."""
    path = folder / REPORT_JSON
    if not path.is_file():
        return None
    return parse_report(path.read_bytes(), str(path), build, folder.name)


def parse_report(data: bytes, where: str, build: str, repo: str) -> tuple[Report, str]:
    """The report in ``data`` (read from ``where``, named in errors) of the build ``build`` in repo ``repo``, and
    the sha256 of ``data``."""
    rerun = f"rerun 'release verify {build}'"
    raw = parse_json(data, where, rerun)
    if isinstance(raw, dict) and "format" not in raw and "checks" in raw:
        raise ReleaseError(f"{where}: written by an older 'release verify' (no file manifest); {rerun}")
    try:
        report = Report.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ReleaseError(f"{where}: field '{field_name}': {err['msg']}; not a report of 'release verify', "
                           f"{rerun}") from exc
    if report.repo != repo:
        raise ReleaseError(f"{where}: the report of {report.repo}, not of {repo}; {rerun}")
    return report, hashlib.sha256(data).hexdigest()


def dropped_weights(folder: Path, build: str) -> list[str]:
    """The weight files the build's verification report lists that are gone: a campaign drops the weights of the
    builds it does not deliver and keeps their reports (none without a report)."""
    loaded = load_report(folder, build)
    manifest = loaded[0].manifest if loaded is not None else {}
    return [rel for rel in manifest if rel.endswith(WEIGHT_SUFFIXES) and not (folder / rel).is_file()]


def dropped_by_campaign(dist: Path) -> set[str]:
    """The builds whose weights the campaign of ``dist`` dropped, as its journal (``DIST/campaign.json``) records:
    never published, so no command documents them unless named (an unreadable journal drops none)."""
    path = dist / CAMPAIGN_JOURNAL
    try:
        builds = parse_json(path.read_bytes(), str(path), "").get("builds") if path.is_file() else None
    except (ReleaseError, AttributeError):
        return set()
    return {name for name, e in builds.items() if isinstance(e, dict) and e.get("dropped")} \
        if isinstance(builds, dict) else set()


def gate(folder: Path, report: Report | None) -> str | None:
    """Why ``release push`` must refuse the build in ``folder`` (``--force`` overrides), or None when it passed."""
    if report is None:
        return f"{folder.name} has no verification report; run 'release verify' on it"
    failed = [c for c in report.checks if c.status == "failed"]
    if failed:
        return f"{folder.name} failed verification ({failed[0].name}: {failed[0].summary})"
    skipped = [c for c in report.checks if c.status == "skipped"]
    if skipped:
        return (f"{folder.name} was not fully verified ({', '.join(c.name for c in skipped)} "
                f"{skipped[0].summary})")
    return None
