"""What may be published: deliverable builds whose verification passed (or a push forced past it, with a reason),
with their cards; and of each, exactly the bytes verification hashed plus the files written after it, none of them a
link, a special file or a secret."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from release.check.report import REPORT_JSON, Report, after_verification, gate, load_report
from release.check.written import check_written, publishable
from release.core.builds import load_build, load_release
from release.core.config import BuildConfig, ReleaseConfig, builds_dir
from release.core.errors import GateError, ReleaseError
from release.core.io import left_by
from release.core.output import warning
from release.measure.select import TABLES, check_delivered, delivery, read_selection, read_tables_doc
from release.publish.evaluated import leave_out, require_evaluated
from release.publish.hashing import HashCache
from release.publish.scan import secret_name, structured_secret

Reports = dict[str, tuple[Report, str] | None]  # by build name: the report and the sha256 of its bytes


def refuse_undeliverable(builds: list[BuildConfig]) -> None:
    undeliverable = next((b for b in builds if not b.deliverable), None)
    if undeliverable is not None:  # not even with --force: such a repo could only mislead a server
        raise GateError(f"push refused: {builds_dir() / f'{undeliverable.name}.yaml'} marks "
                        f"{undeliverable.name!r} 'deliverable: false' (a scheme NVIDIA's policy server cannot "
                        "serve); it is evaluated and documented, not published")


def gate_or_force(repo: str, verified: tuple[Report, str] | None, force: str | None, command: str) -> None:
    refusal = gate(Path(repo), verified[0] if verified else None)
    if refusal and force is None:
        more = ", or pass --force REASON" if command == "push" else ""
        raise GateError(f"{command} refused: {refusal}; fix it{more}")
    if refusal:  # forced past the gate: said on every run, also under -q (the commit message records the reason)
        warning(f"{refusal}; {command} goes on under --force ({force})")


def verified_builds(names: tuple[str, ...], dist: Path, force: str | None,
                    command: str) -> tuple[ReleaseConfig, list[BuildConfig], Reports]:
    """The named builds (default: the builds the release delivers, as its selection in ``dist`` chose, that are
    built there), each delivered, deliverable, with its verification report, past the gate (unless ``force``;
    ``command`` is named in the refusal), with results in tables.json and with its card. Without names, each other
    build of the release's ``repos`` built there that has no results is named on stderr as left out."""
    release = load_release()
    have = delivery(release, read_selection(dist))
    built = [n for n, repo in release.repos.items() if (dist / repo).is_dir()]
    wanted = list(names) or [n for n in have.builds if n in built]
    if not wanted:
        raise ReleaseError(f"{dist}: none of the builds the release delivers ({', '.join(have.builds) or 'none'}) is "
                           "built there; run 'release build NAME' (and 'release select', which chooses them)")
    builds = [load_build(n) for n in wanted]
    refuse_undeliverable(builds)  # first: no override can deliver these
    check_delivered(wanted, have, command)
    reports: Reports = {}
    for b in builds:
        folder = dist / b.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {b.name}' first")
        verified = reports[b.name] = load_report(folder, b.name)
        gate_or_force(b.repo, verified, force, command)
    tables = read_tables_doc(dist / TABLES)
    require_evaluated(wanted, tables)  # named or delivered: published only once evaluated, whatever its card says
    for b in builds:
        for name in ("README.md", "LICENSE"):
            if not (dist / b.repo / name).is_file():
                raise ReleaseError(f"{dist / b.repo / name}: missing; a repo is published with its card and license: "
                                   f"run 'release card {b.name}' first")
    if not names:
        leave_out([n for n in built if n not in wanted], tables, dist / TABLES,
                  " and 'release select' (the release delivers it if chosen)")
    return release, builds, reports


def check_verified(build: str, verified: tuple[Report, str], local: dict[str, dict[str, Any]],
                   name: Callable[[str], str], rerun: str) -> None:
    """The files must be the bytes verification hashed, plus cards and results; nothing gained, changed or lost.
    ``name`` names a file in an error, ``rerun`` says what to run again."""
    report, report_sha = verified
    for rel, entry in local.items():
        if rel == REPORT_JSON:
            if entry["sha256"] != report_sha:
                raise GateError(f"{name(rel)}: changed while this push read it; run 'release push' again")
        elif not after_verification(rel):
            want = report.manifest.get(rel)
            if want is None and left_by(rel):
                raise GateError(f"{name(rel)}: a temporary of {left_by(rel)} that a killed command left; remove it "
                                f"(the next command that writes {left_by(rel)} removes it too)")
            if want is None:
                raise GateError(f"{name(rel)}: not in the verification manifest (added after 'release verify'); "
                                f"remove it, or {rerun}")
            if (want.sha256, want.size) != (entry["sha256"], entry["size"]):
                raise GateError(f"{name(rel)}: differs from the bytes 'release verify' hashed (sha256 "
                                f"{entry['sha256'][:12]}, verified {want.sha256[:12]}); {rerun}")
    lost = sorted(set(report.manifest) - set(local))
    if lost:
        raise GateError(f"{name(lost[0])}: verified, but no longer in the build folder; restore it, or {rerun}")


def scanned(root: Path, files: list[str], cache: HashCache) -> dict[str, dict[str, Any]]:
    """The hashes of ``files`` (relative to ``root``), none named like a secret and none holding one: no token or
    private key in its bytes, PNG text chunks, safetensors header or JSON strings."""
    for rel in files:
        if secret_name(rel):
            raise ReleaseError(f"{root / rel}: looks like a secret (by its name); remove it from the build folder")
    hashed = cache.hash_all([root / rel for rel in files], scan=True)
    local = {rel: hashed[root / rel] for rel in files}
    for rel in files:
        found = structured_secret(root / rel) or local[rel]["secret"]
        if found:
            raise ReleaseError(f"{root / rel}: contains what looks like a {found['kind']} ({found['shown']}, "
                               f"{found['where']}); remove it from the build folder")
    return local


def checked_files(folder: Path, build: str, verified: tuple[Report, str] | None, cache: HashCache,
                  languages: list[str]) -> dict[str, dict[str, Any]]:
    """Every file of a build folder with its hashes, after the checks a push needs.

    No links or special files, no secrets (``scanned``: a secret is named first, it must go whatever else is
    wrong); the cards and results as this tool wrote and recorded them (:mod:`release.check.written`); and with a
    verification report, exactly its manifest's bytes plus those.
    """
    local = scanned(folder, publishable(folder), cache)
    check_written(folder, local, f"rerun 'release card {build}' or 'release eval {build}' to write it", languages)
    if verified is not None:
        check_verified(build, verified, local, lambda rel: str(folder / rel),
                       f"rerun 'release verify {build}' (and 'release card {build}')")
    return local
