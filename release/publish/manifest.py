"""``release manifest``: ``release.lock.json``, what a real build publishes, so that a pull request can preview it.

The 15.7B release cannot be rebuilt in CI. After a real build (verified, evaluated, tabled, selected and carded),
``release manifest`` records every file of every sibling repo with the sha256 and size that verification saw, its
storage (LFS or git) and, for files under the LFS threshold, the git blob sha1 (the hash the Hub shows for a file it
stores in git); and the small sidecars the cards are made from: each sibling's ``provenance.json`` and
``verification/report.json``, ``tables/tables.json``, ``selection.json`` and the ``provenance.json`` of every other
build of the sweep (the cards compare their codes). The files pass the checks of a push first (verified bytes,
results in tables.json, no secrets). The manifest is deterministic (sorted keys and paths, no dates) and written
atomically.

``release push --dry-run --from-manifest release.lock.json`` stages the sidecars in a temporary folder, renders the
cards there with the checkout's templates and build files, and plans each sibling against the remote: the rendered
cards by their bytes, every other file by the hashes in the manifest, without the weights. Every name in the
manifest that becomes a path or a repo id is validated first, and every error names the manifest's field.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from release import __version__
from release.check.report import CARD_FILES, REPORT_JSON, Report, matches, parse_report
from release.check.written import publishable
from release.core.builds import available_builds, load_build, load_release
from release.core.config import BuildConfig, ReleaseConfig, builds_dir, hub_name
from release.core.errors import ReleaseError
from release.core.io import atomic_write, cache_dir, output_folder, parse_json, write_json
from release.core.rules import BUILD_NAME, BUILD_NAME_RULE
from release.measure.select import SELECTION, TABLES, SelectionDoc, check_delivered, delivery
from release.publish.gate import (
    Reports,
    check_verified,
    checked_files,
    gate_or_force,
    refuse_undeliverable,
    scanned,
    verified_builds,
)
from release.publish.hashing import LFS_THRESHOLD, HashCache, is_lfs
from release.publish.scan import secret_name, text_secret

LOCK_FORMAT = "release-manifest/1"
SIBLING_SIDECARS = ("provenance.json", REPORT_JSON)  # per sibling; besides: TABLES, SELECTION, other provenances
# per sibling where its folder has it: the card's vLLM-Omni paragraph reads the exported transformer config
CARD_SIDECARS = ("transformer/config.json",)
SHA256 = r"^[0-9a-f]{64}$"
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _repo_path(rel: str) -> str:
    """``rel`` if it is a plain relative path inside a repo, else ValueError (it becomes a path and a Hub path)."""
    if (not rel or len(rel) > 1000 or rel.startswith("/") or "\\" in rel
            or any(ord(c) < 32 or ord(c) == 127 for c in rel) or any(p in ("", ".", "..") for p in rel.split("/"))):
        raise ValueError(f"{rel!r} is not a path inside a repo (no '..', '.' or empty parts, no leading '/', no "
                         "backslashes or control characters)")
    return rel


class LockedFile(_Strict):
    sha256: str = Field(pattern=SHA256)
    size: int = Field(ge=0)
    storage: Literal["lfs", "git"]
    sha1: str | None = Field(pattern=r"^[0-9a-f]{40}$", description="git blob sha1, below the LFS threshold")


class LockedSibling(_Strict):
    build: str
    repo: str
    files: dict[str, LockedFile] = Field(min_length=1)

    @field_validator("build")
    @classmethod
    def _build(cls, v: str) -> str:
        if not BUILD_NAME.fullmatch(v):
            raise ValueError(f"{v!r} is not a build name ({BUILD_NAME_RULE})")
        return v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return hub_name(v, "repo")

    @field_validator("files")
    @classmethod
    def _files(cls, v: dict[str, LockedFile]) -> dict[str, LockedFile]:
        for rel, f in v.items():
            _repo_path(rel)
            if secret_name(rel):
                raise ValueError(f"{rel!r} looks like a secret (by its name); a push would refuse it")
            if f.storage != ("lfs" if is_lfs(rel, f.size) else "git") or (f.sha1 is None) != (f.size >= LFS_THRESHOLD):
                raise ValueError(f"{rel!r}: storage {f.storage!r} and sha1 do not fit its name and size {f.size}")
        return v


class Sidecar(_Strict):
    sha256: str = Field(pattern=SHA256)
    lines: list[str] = Field(description="the file's text split at newlines (joined with '\\n': the exact bytes)")

    @property
    def data(self) -> bytes:
        return "\n".join(self.lines).encode("utf-8")

    @model_validator(mode="after")
    def _hash(self) -> Sidecar:
        if hashlib.sha256(self.data).hexdigest() != self.sha256:
            raise ValueError("its lines do not hash to its sha256 (edited by hand?)")
        return self


def _sidecar_path(rel: str) -> str:
    head, _, tail = rel.partition("/")
    if rel in (TABLES.as_posix(), SELECTION) or (tail in SIBLING_SIDECARS + CARD_SIDECARS and _is_repo(head)):
        return rel
    raise ValueError(f"{rel!r} is not a sidecar: {TABLES.as_posix()}, {SELECTION}, or REPO/"
                     f"{' or REPO/'.join(SIBLING_SIDECARS + CARD_SIDECARS)} with a valid repo name")


def _is_repo(name: str) -> bool:
    try:
        hub_name(name, "repo")
    except ValueError:
        return False
    return True


class Lock(_Strict):
    """``release.lock.json``."""

    format: Literal["release-manifest/1"]
    version: str = Field(description="the release's version when the manifest was written")
    tool: str = Field(description="the version of release that wrote it")
    siblings: list[LockedSibling] = Field(min_length=1)
    sidecars: dict[str, Sidecar]

    @field_validator("sidecars")
    @classmethod
    def _sidecars(cls, v: dict[str, Sidecar]) -> dict[str, Sidecar]:
        for rel in v:
            _sidecar_path(rel)
        if TABLES.as_posix() not in v:
            raise ValueError(f"no {TABLES.as_posix()}: the cards are made from it")
        return v

    @model_validator(mode="after")
    def _siblings(self) -> Lock:
        for field in ("build", "repo"):
            names = [getattr(s, field) for s in self.siblings]
            twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
            if twice is not None:
                raise ValueError(f"{field} {twice!r} is listed as two siblings")
        for i, s in enumerate(self.siblings):
            for rel in SIBLING_SIDECARS + CARD_SIDECARS:
                sidecar, entry = self.sidecars.get(f"{s.repo}/{rel}"), s.files.get(rel)
                if rel in CARD_SIDECARS and sidecar is None:
                    continue
                if sidecar is None or entry is None:
                    raise ValueError(f"siblings[{i}] ({s.repo}) needs the sidecar and the file {rel}")
                if (sidecar.sha256, len(sidecar.data)) != (entry.sha256, entry.size):
                    raise ValueError(f"the sidecar {s.repo}/{rel} is not the file of siblings[{i}]: their sha256 "
                                     f"differ ({sidecar.sha256[:12]}, {entry.sha256[:12]})")
        return self


def _field(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif IDENTIFIER.fullmatch(str(part)):
            out += f".{part}" if out else str(part)
        else:
            out += f"[{str(part)!r}]"
    return out or "(top level)"


def _validated(raw: Any, where: Path, fix: str) -> Lock:
    try:
        return Lock.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        raise ReleaseError(f"{where}: field '{_field(tuple(err['loc']))}': {msg}; {fix}") from exc


def load_lock(path: Path) -> Lock:
    """The release manifest at ``path``, every field validated, its sidecars matching their hashes and free of
    secrets; else a one-line error naming the file and the field."""
    fix = "run 'release manifest' after a real build to rewrite it"
    if not path.is_file():
        raise ReleaseError(f"{path}: missing (the release manifest); run 'release manifest' after a real build and "
                           "commit it")
    raw = parse_json(path.read_bytes(), str(path), fix)
    lock = _validated(raw, path, fix)
    for rel, sidecar in sorted(lock.sidecars.items()):
        found = text_secret(sidecar.data, rel.endswith(".json"))
        if found:
            raise ReleaseError(f"{path}: field 'sidecars[{rel!r}]': contains what looks like a {found['kind']} "
                               f"({found['shown']}, {found['where']}); remove it from the build's file, then run "
                               "'release manifest' again")
    return lock


def locked_builds(lock: Lock, path: Path, names: tuple[str, ...],
                  force: str | None) -> tuple[ReleaseConfig, list[BuildConfig], Reports]:
    """The named builds (default: every build the release delivers, as the manifest's selection chose), each
    delivered, deliverable, its verification report (the manifest's sidecar) past the gate unless ``force``."""
    release = load_release()
    by_repo = {s.repo: (i, s) for i, s in enumerate(lock.siblings)}
    have = delivery(release, _locked_selection(lock, path))
    wanted = list(names) or [n for n in have.builds if release.repos[n] in by_repo]
    if not wanted:
        delivered = ", ".join(have.builds) or "none"
        raise ReleaseError(f"{path}: holds none of the builds the release delivers ({delivered}); run 'release "
                           "select', build them, then 'release manifest'")
    builds = [load_build(n) for n in wanted]
    refuse_undeliverable(builds)  # first: no override can deliver these
    check_delivered(wanted, have, "push")
    reports: Reports = {}
    for b in builds:
        if b.repo not in by_repo:
            raise ReleaseError(f"{path}: no sibling {b.repo} (build {b.name}); run 'release manifest' after "
                               "building it")
        i, sibling = by_repo[b.repo]
        if sibling.build != b.name:
            raise ReleaseError(f"{path}: field 'siblings[{i}].build' is {sibling.build!r}, but {b.repo} is the "
                               f"repo of build {b.name!r} in {builds_dir()}; run 'release manifest' again")
        rel = f"{b.repo}/{REPORT_JSON}"
        verified = reports[b.name] = parse_report(lock.sidecars[rel].data, f"{path}: sidecars[{rel!r}]", b.name,
                                                  b.repo)
        gate_or_force(b.repo, verified, force, "push")
    return release, builds, reports


def _locked_selection(lock: Lock, path: Path) -> SelectionDoc | None:
    sidecar = lock.sidecars.get(SELECTION)
    if sidecar is None:
        return None
    try:
        return SelectionDoc.model_validate_json(sidecar.data)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise ReleaseError(f"{path}: field 'sidecars[{SELECTION!r}]': {err['msg']}; run 'release select', then "
                           "'release manifest'") from exc


@contextlib.contextmanager
def staged(lock: Lock, builds: list[BuildConfig], languages: list[str]) -> Iterator[Path]:
    """A temporary dist folder with the manifest's sidecars and the cards of ``builds`` rendered from them."""
    from release.publish.card.render import CardRequest, render_cards

    with tempfile.TemporaryDirectory(prefix="release-manifest-") as tmp:
        dist = Path(tmp)
        for rel, sidecar in lock.sidecars.items():  # names validated: each inside ``dist``
            atomic_write(dist / rel, sidecar.data)
        render_cards(CardRequest.create(tuple(b.name for b in builds), dist, ",".join(languages)))
        yield dist


def locked_files(lock: Lock, lock_path: Path, folder: Path, build: BuildConfig, verified: tuple[Report, str] | None,
                 cache: HashCache) -> dict[str, dict[str, Any]]:
    """The files of a sibling as a push of the real build would have them: the staged sidecars and the fresh cards
    hashed (and scanned) on disk, every other file by the manifest's hashes; checked against the verification
    report like a build folder."""
    i, sibling = next((i, s) for i, s in enumerate(lock.siblings) if s.repo == build.repo)
    absent = {rel: {"sha256": f.sha256, "size": f.size, "sha1": f.sha1} for rel, f in sibling.files.items()
              if not matches(rel, CARD_FILES)}  # the manifest's cards are replaced by the ones rendered now
    local = {**absent, **scanned(folder, publishable(folder), cache)}
    if verified is not None:
        check_verified(build.name, verified, local,
                       lambda rel: f"{lock_path}: siblings[{i}] ({build.repo}) file {rel!r}",
                       f"run 'release verify {build.name}' and 'release manifest' again")
    return dict(sorted(local.items()))


@dataclass(frozen=True)
class ManifestRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    reports: Reports
    dist: Path
    out: Path

    @classmethod
    def create(cls, names: tuple[str, ...], dist: Path, out: Path) -> ManifestRequest:
        output_folder(out.parent, "--out")
        release, builds, reports = verified_builds(names, dist, None, "manifest")  # verified and evaluated only
        return cls(release, builds, reports, dist, out)


def _sidecar_paths(request: ManifestRequest) -> list[str]:
    """The siblings' sidecars, the tables, the selection when there is one, and every other built provenance."""
    paths = {f"{b.repo}/{rel}" for b in request.builds for rel in SIBLING_SIDECARS} | {TABLES.as_posix()}
    paths |= {rel for rel in [SELECTION, *(f"{load_build(n).repo}/provenance.json" for n in available_builds()),
                              *(f"{b.repo}/{rel}" for b in request.builds for rel in CARD_SIDECARS)]
              if (request.dist / rel).is_file()}
    return sorted(paths)


def run_manifest(request: ManifestRequest) -> Lock:
    """Hash and check every file of each sibling as a push would, read the sidecars, write the manifest."""
    cache = HashCache(cache_dir() / "hashes.json")
    siblings = []
    for b in request.builds:
        local = checked_files(request.dist / b.repo, b.name, request.reports[b.name], cache,
                              request.release.languages)
        files = {rel: {"sha256": h["sha256"], "size": h["size"], "sha1": h["sha1"],
                       "storage": "lfs" if is_lfs(rel, h["size"]) else "git"} for rel, h in local.items()}
        siblings.append({"build": b.name, "repo": b.repo, "files": files})
    paths = _sidecar_paths(request)
    hashed = scanned(request.dist, paths, cache)  # the push's secret scan, also for the dist's own files
    cache.save()
    sidecars = {}
    for rel in paths:
        data = (request.dist / rel).read_bytes()
        if hashlib.sha256(data).hexdigest() != hashed[rel]["sha256"]:
            raise ReleaseError(f"{request.dist / rel}: changed while 'release manifest' read it; run it again")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ReleaseError(f"{request.dist / rel}: not UTF-8 text; rerun the command that writes it") from exc
        sidecars[rel] = {"sha256": hashed[rel]["sha256"], "lines": text.split("\n")}
    lock = _validated({"format": LOCK_FORMAT, "version": request.release.version, "tool": __version__,
                       "siblings": siblings, "sidecars": sidecars}, request.out,
                      "the build folders hold what a manifest cannot record; fix them and run it again")
    write_json(request.out, lock.model_dump(mode="json"))
    return lock
