"""``release push``'s validated request: the builds and their reports (from the build folders, or from a release
manifest), where to and how."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from release.check.report import Report
from release.core.builds import RELEASE_NOTES, release_notes
from release.core.config import BuildConfig, ReleaseConfig, hub_name
from release.core.errors import ReleaseError
from release.core.io import replaceable_folder
from release.publish.gate import verified_builds
from release.publish.manifest import Lock, load_lock, locked_builds
from release.publish.remotes import MAIN

PUSH_PREVIEW = frozenset({"comment.md", "plan.md", "plan.json", "cards"})  # what push --dry-run --preview writes

# a branch name git and the Hub accept: no '..', '//', '@{', leading '-' or '/', trailing '/' or '.lock'
BRANCH = re.compile(r"(?!-|/|refs/)(?!.*(\.\.|//|@\{|/$|\.lock$|/\.))[A-Za-z0-9._/-]{1,200}")


@dataclass(frozen=True)
class PushRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    org: str
    dist: Path
    dry_run: bool
    endpoint: str | None
    create_pr: bool
    fmt: Literal["text", "json"]
    force: str | None
    target: Path | None
    retag: bool = False
    reports: dict[str, tuple[Report, str] | None] = field(default_factory=dict)  # by build name
    notes: str | None = None  # the commit description: the release notes (none for a folder target)
    private: bool = False  # new repos are created private
    commit_message: str | None = None  # the summary line of every commit, instead of the default
    revision: str = MAIN  # the branch pushed to (created from main's head when missing)
    lock: Lock | None = None  # --from-manifest: the files and sidecars of a real build, planned without weights
    lock_path: Path | None = None
    preview: Path | None = None  # --preview DIR: the pull-request comment, the full plan and the cards
    collection: bool = True  # keep the release's Hub collection (release.collection) up to date

    @property
    def tag(self) -> str:
        return f"v{self.release.version}"

    @classmethod
    def create(cls, names: tuple[str, ...], org: str | None, dist: Path, dry_run: bool, endpoint: str | None = None,
               create_pr: bool = False, fmt: str = "text", force: str | None = None,
               target: Path | None = None, retag: bool = False, private: bool = False,
               commit_message: str | None = None, revision: str = MAIN,
               manifest: Path | None = None, preview: Path | None = None, collection: bool = True) -> PushRequest:
        if commit_message is not None and (not commit_message.strip() or "\n" in commit_message
                                           or "\r" in commit_message):
            raise ReleaseError(f"--commit-message {commit_message!r}: give one non-empty line, the commit summary "
                               f"(the description is the release notes of {RELEASE_NOTES})")
        if not BRANCH.fullmatch(revision) or re.fullmatch(r"[0-9a-f]{40}", revision):
            raise ReleaseError(f"--revision {revision!r}: not a branch name (letters, digits, '.', '_', '-', '/'; "
                               "no '..', no leading '-' or '/', not refs/..., not a commit id)")
        if target is not None and (private or revision != MAIN):
            option = "--private" if private else "--revision"
            raise ReleaseError(f"{option}: the Hub's; a --target folder has no visibility or branches: drop it, or "
                               "push to the Hub")
        if preview is not None and not dry_run:
            raise ReleaseError(f"--preview {preview}: a preview of a plan, so only with --dry-run")
        if preview is not None:
            replaceable_folder(preview, "--preview", PUSH_PREVIEW)
        if manifest is not None and not dry_run:
            raise ReleaseError(f"--from-manifest {manifest}: plans without the weights, so only with --dry-run; a "
                               "push reads the build folders (--dist)")
        if org is not None:
            try:
                hub_name(org, "org")
            except ValueError as exc:
                raise ReleaseError(f"--org: {exc}") from exc
        if force is not None and not force.strip():
            raise ReleaseError("--force needs a reason (it goes into the commit message)")
        lock = None
        if manifest is None:
            release, builds, reports = verified_builds(names, dist, force, "push")
        else:
            lock = load_lock(manifest)
            release, builds, reports = locked_builds(lock, manifest, names, force)
        notes = release_notes(release.version) if target is None else None
        return cls(release, builds, org or release.org, dist, dry_run, endpoint, create_pr, fmt,  # type: ignore[arg-type]
                   force, target, retag, reports, notes, private, commit_message, revision, lock, manifest,
                   preview, collection)
