"""The plan of a push: every local file against the remote, compared the way the remote stores it (the sha256 of LFS
files, the git blob sha1 of small ones), the commit message, the tag, the README diff; rendered as text (Markdown,
for the reviewers of a pull request) or JSON, each ending with the totals. Planning reads the remote and never
writes."""

from __future__ import annotations

import difflib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from release import __version__
from release.core.builds import RELEASE_NOTES
from release.core.config import BuildConfig, builds_dir
from release.core.errors import ReleaseError
from release.core.provenance import read_provenance
from release.publish.hashing import is_lfs
from release.publish.remotes import MAIN, FolderRemote, HubRemote
from release.publish.request import PushRequest

Action = Literal["add", "modify", "delete", "unchanged"]
ACTIONS: tuple[Action, ...] = ("add", "modify", "delete", "unchanged")
RepoStatus = Literal["create", "update", "unchanged"]
TagAction = Literal["create", "move", "unchanged", "none"]


@dataclass
class FilePlan:
    path: str
    action: Action
    size: int
    storage: Literal["lfs", "git"]
    local_hash: str | None
    remote_hash: str | None
    # what the comparison with the remote's file rested on: "xet" (the Xet hash the Hub lists, derived from the bytes
    # it stores), "sha256" (the LFS object id the client declared: the bytes are read back after a commit) or "sha1"
    # (the git blob id, derived from the bytes); "" for a file the remote does not have
    checked_by: str = ""


@dataclass
class RepoPlan:
    repo_id: str
    build: str
    exists: bool
    head: str | None  # the commit planned against: the branch's head, or main's when the branch is created
    files: list[FilePlan] = field(default_factory=list)
    readme_diff: str = ""
    commit_message: str = ""
    tag: str = ""
    tag_action: TagAction = "none"
    tag_target: str | None = None  # the commit the tag points at now
    revision: str = MAIN
    branch_exists: bool = True  # False: the push creates the branch at ``head``
    private: bool | None = None  # the repo's visibility: None when it does not exist yet (or for a folder)

    @property
    def changes(self) -> list[FilePlan]:
        return [f for f in self.files if f.action != "unchanged"]

    @property
    def counts(self) -> dict[str, int]:
        """Its files by action."""
        return {a: sum(1 for f in self.files if f.action == a) for a in ACTIONS}

    @property
    def upload_bytes(self) -> int:
        return sum(f.size for f in self.files if f.action in ("add", "modify"))

    @property
    def status(self) -> RepoStatus:
        """What the push does to the repo: creates it, commits to it, or leaves its files as they are."""
        return "create" if not self.exists else "update" if self.changes else "unchanged"


def checked_by(rel: str, local: dict[str, Any], xet: dict[str, str], lfs: bool) -> str:
    """How a file is compared with the remote's (:attr:`FilePlan.checked_by`)."""
    return "xet" if lfs and rel in xet and local.get("xet") else "sha256" if lfs else "sha1"


def plan_repo(remote: HubRemote | FolderRemote, request: PushRequest, build: BuildConfig, folder: Path,
              local: dict[str, dict[str, Any]]) -> RepoPlan:
    """What a push of ``local`` (from ``checked_files``) would change in the build's repo; reads, never writes."""
    repo_id = f"{request.org}/{build.repo}"
    state = remote.state(repo_id, request.revision)
    head, remote_files, tags = state.head, state.files, state.tags
    if request.private and state.private is False:
        raise ReleaseError(f"{repo_id}: exists and is public; --private makes only new repos private and never "
                           "changes an existing repo's visibility; nothing was pushed: make it private in its settings "
                           "on the Hub first, or push without --private")
    plan = RepoPlan(repo_id, build.name, head is not None, head, tag=request.tag, revision=request.revision,
                    branch_exists=state.branch_exists, private=state.private)
    for rel, h in local.items():
        remote_entry = remote_files.get(rel)
        # compare the way the remote stores the file (its LFS rules are its own); a new file by ours
        lfs = remote_entry[2] if remote_entry is not None and h["sha1"] is not None else is_lfs(rel, h["size"])
        mine = h["sha256"] if lfs else h["sha1"]
        theirs = remote_entry[1] if remote_entry is not None else None
        by = "" if remote_entry is None else checked_by(rel, h, state.xet, lfs)
        same = mine == theirs and (by != "xet" or state.xet[rel] == h.get("xet"))  # the stored bytes, where listed
        action: Action = "add" if remote_entry is None else "unchanged" if same else "modify"
        plan.files.append(FilePlan(rel, action, h["size"], "lfs" if lfs else "git", mine, theirs, by))
    for rel, (size, theirs, lfs) in sorted(remote_files.items()):
        if rel not in local and rel != ".gitattributes":
            plan.files.append(FilePlan(rel, "delete", size, "lfs" if lfs else "git", None, theirs))
    readme = next((f for f in plan.files if f.path == "README.md"), None)
    if readme is not None and readme.action != "unchanged":
        old = remote.read(repo_id, "README.md", head).splitlines() if readme.action == "modify" and head else []
        new = (folder / "README.md").read_text(encoding="utf-8", errors="replace").splitlines()
        plan.readme_diff = "\n".join(difflib.unified_diff(old, new, "remote/README.md", "local/README.md",
                                                          lineterm=""))
    prov = folder / "provenance.json"
    revision = read_provenance(prov, build.name)["source"]["revision"] if prov.is_file() else "unknown"
    plan.commit_message = request.commit_message or f"Release {request.release.version}: {build.name} " \
        f"({'+'.join(build.recipe)}, {build.calibrator.method}) from {str(revision)[:12]}"
    if request.force:
        plan.commit_message += f" [forced past verification: {request.force}]"
    if isinstance(remote, HubRemote) and not request.create_pr and request.revision == MAIN:  # a release is on main
        plan.tag_target = tags.get(plan.tag)
        if plan.tag_target is None:
            plan.tag_action = "create"
        elif not plan.changes and plan.tag_target == head:
            plan.tag_action = "unchanged"
        elif request.retag:
            plan.tag_action = "move"
        else:
            now = "the new commit" if plan.changes else f"the head {head[:12] if head else ''}"
            raise ReleaseError(f"{repo_id}: tag {plan.tag} already points at {plan.tag_target[:12]}, not at {now}; "
                               "nothing was pushed: pass --retag to move the tag, or release under a new version")
    return plan


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def _tag_line(p: RepoPlan) -> str:
    on = "the new commit" if p.changes else f"`{(p.head or '')[:12]}`"
    return {"create": f"Tag `{p.tag}`: create on {on}.",
            "move": f"Tag `{p.tag}`: move from `{(p.tag_target or '')[:12]}` to {on} (--retag).",
            "unchanged": f"Tag `{p.tag}`: unchanged, already on `{(p.head or '')[:12]}`.", "none": ""}[p.tag_action]


def repo_status(p: RepoPlan, request: PushRequest) -> str:
    """Whether the repo exists (and its visibility), and the branch pushed to when it is not main."""
    hub = request.target is None
    if p.exists:
        status = "exists" + ("" if p.private is None or not hub else ", private" if p.private else ", public")
    else:
        status = "will be created" + ((", private" if request.private else ", public") if hub else "")
    if p.revision != MAIN:
        start = f"from main at `{p.head[:12]}`" if p.head else "from the repo's first commit"
        status += f"; branch `{p.revision}`" + ("" if p.branch_exists else f" will be created {start}")
    return status


def hub_endpoint(endpoint: str | None) -> str:
    """The Hub a push or a plan talks to: ``--endpoint``, else huggingface_hub's (``HF_ENDPOINT``, or the public
    Hub)."""
    from huggingface_hub import constants

    return endpoint or constants.ENDPOINT


def destination(request: PushRequest) -> str:
    """Where a push goes: the ``--target`` folder, or the Hub's endpoint."""
    return str(request.target) if request.target else hub_endpoint(request.endpoint)


def remote_label(request: PushRequest) -> str:
    return f"`{destination(request)}`"


def summary(plans: list[RepoPlan]) -> dict[str, Any]:
    """The totals of a push: its repos by status, its files by action, the bytes it uploads."""
    return {"repos": {s: sum(1 for p in plans if p.status == s) for s in ("create", "update", "unchanged")},
            "files": {a: sum(p.counts[a] for p in plans) for a in ACTIONS},
            "upload_bytes": sum(p.upload_bytes for p in plans)}


def plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def summary_line(plans: list[RepoPlan], done: bool) -> str:
    """The totals in words: what a push will do, or (``done``) what it did."""
    create, update, upload, delete = ("created", "updated", "uploaded", "deleted") if done else \
        ("to create", "to update", "to upload", "to delete")
    totals = summary(plans)
    repos, files = totals["repos"], totals["files"]
    return (f"{plural(len(plans), 'repo')} ({repos['create']} {create}, {repos['update']} {update}, "
            f"{repos['unchanged']} unchanged); {plural(files['add'] + files['modify'], 'file')} {upload} "
            f"({human_size(totals['upload_bytes'])}), {files['unchanged']} unchanged, {files['delete']} {delete}")


def json_document(plans: list[RepoPlan], request: PushRequest, repos: list[dict[str, Any]],
                  collection: Any = None) -> str:
    """A push's plan or result as one JSON document, its keys sorted: the release, where it goes, ``repos``, the
    collection (its plan's lines, or what the push did to it) and the totals."""
    return json.dumps({"org": request.org, "dry_run": request.dry_run, "version": request.release.version,
                       "tool": __version__, "destination": destination(request), "description": request.notes,
                       "repos": repos, "collection": collection, "summary": summary(plans)}, indent=2,
                      sort_keys=True)


def render_plan(plans: list[RepoPlan], request: PushRequest, fmt: str, collection: list[str] | None = None) -> str:
    """The plan of a dry run (``fmt``: text or json), the collection's lines (``collection``), then the totals."""
    if fmt == "json":
        return json_document(plans, request, [asdict(p) for p in plans], "\n".join(collection or []) or None)
    lines = [f"# Release plan: release {request.release.version} to {remote_label(request)} "
             f"(`release` {__version__})", ""]
    if request.notes is not None:
        lines += [f"<details><summary>Commit description: the release notes of {request.release.version} "
                  f"({builds_dir() / RELEASE_NOTES})</summary>", "", request.notes, "", "</details>", ""]
    for p in plans:
        counts = p.counts
        lines += [f"## {p.repo_id} ({p.build}): {repo_status(p, request)}", "",
                  f"{counts['add']} to add, {counts['modify']} to modify, {counts['delete']} to delete, "
                  f"{counts['unchanged']} unchanged; {human_size(p.upload_bytes)} to upload.", ""]
        compared = [f for f in p.files if f.checked_by]
        if compared and request.target is None:  # a folder target's copies are hashed again as they are made
            by = {k: sum(1 for f in compared if f.checked_by == k) for k in ("xet", "sha256", "sha1")}
            lines += [f"Compared with the remote: {by['xet']} by the Xet hash of the stored bytes, {by['sha256']} "
                      f"by the declared sha256 only (no Xet hash listed: read back after a commit), {by['sha1']} by "
                      "git blob sha1.", ""]
        if not p.changes:
            lines += ["No changes: nothing will be uploaded.", ""]
        else:
            lines += [f"Commit message: `{p.commit_message}`" + (f" on parent `{p.head[:12]}`" if p.head else ""),
                      "", "| file | action | size | storage |", "|---|---|---:|---|"]
            lines += [f"| `{f.path}` | {f.action} | {human_size(f.size)} | {f.storage} |" for f in p.changes]
            lines.append("")
        if p.tag_action != "none":
            lines += [_tag_line(p), ""]
        elif p.revision != MAIN:
            lines += [f"No tag: the release tag `{p.tag}` is made on main only.", ""]
        if p.readme_diff:
            lines += ["<details><summary>README.md diff</summary>", "", "```diff", p.readme_diff, "```", "",
                      "</details>", ""]
    return "\n".join([*lines, *(collection or []),
                      f"Summary: {summary_line(plans, done=False)}; nothing was uploaded (dry run)."])
