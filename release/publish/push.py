"""``release push``: publish sibling repos through huggingface_hub, planned read-only first.

Every file of a build is hashed once (cached by path and inode status): the hashes are compared with the manifest
of its verification report, and the secret scan runs over the same bytes. The plan compares every local file with the
remote without uploading: the sha256 of LFS files with the remote's ``lfs.sha256``, the git blob sha1 of small files
with the remote ``blob_id``. ``--dry-run`` prints it (the pull-request preview); a push makes one commit per repo on
the head seen at plan time (``parent_commit``), checks the remote against the hashes the plan approved, and then
tags the release ``v<version>`` (the release's version in ``builds/release.yaml``). Each commit's description is the
release's notes, the section of ``builds/RELEASES.md`` for that version. ``--target DIR`` publishes to a folder
instead, under a lock. A push says what goes where and each repo's progress on stderr (``release -q`` silences
them) and returns what it did, as text or JSON.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from release.core.config import BuildConfig
from release.core.errors import GateError, ReleaseError
from release.core.io import atomic_dir, cache_dir, clean_stale, exclusive_lock, sha256_file
from release.core.output import info, quiet
from release.publish.collection import apply_collection, plan_collection, render_collection
from release.publish.gate import checked_files
from release.publish.hashing import LFS_THRESHOLD, HashCache
from release.publish.hub_client import describe
from release.publish.manifest import locked_files, staged
from release.publish.plan import (
    FilePlan,
    RepoPlan,
    checked_by,
    destination,
    human_size,
    json_document,
    plan_repo,
    plural,
    render_plan,
    summary_line,
)
from release.publish.preview import write_preview
from release.publish.remotes import FolderRemote, HubRemote
from release.publish.request import PushRequest
from release.publish.scan import CHUNK

LOCK_NAME = ".release-push.lock"
_RERUN = ("run 'release push' again: it re-plans against the Hub, commits only what is missing and tags the "
          "commit")


@dataclass(frozen=True)
class Pushed:
    """What a push did to one repo, in words; the commit it made and where to see it (the commit or the pull request
    on the Hub, or the folder)."""

    result: str
    commit: str | None = None
    url: str | None = None


def _changed_after_hashing(path: Path) -> GateError:
    return GateError(f"{path}: changed after this push hashed it; nothing was published from it; run 'release push' "
                     "again")


def _operation(folder: Path, f: FilePlan, hashed: dict[str, Any]) -> Any:
    """The upload of one file, holding exactly the bytes that were hashed: small files are read once into memory
    and hashed again; for large ones huggingface_hub's own sha256 (the LFS object id) must equal ours."""
    from huggingface_hub import CommitOperationAdd

    path = folder / f.path
    if f.size < LFS_THRESHOLD:
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != hashed["sha256"]:
            raise _changed_after_hashing(path)
        return CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=data)
    op = CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(path))
    if op.upload_info.sha256.hex() != hashed["sha256"]:  # the LFS upload is checked against this id by the server
        raise _changed_after_hashing(path)
    return op


def _mismatches(remote: HubRemote, plan: RepoPlan, local: dict[str, dict[str, Any]], commit: str) -> str | None:
    """The first file whose remote hash differs from the hash the plan approved, compared the way the remote stores
    each, and why; then the LFS files this commit uploaded are checked by the Xet hash the Hub lists for them
    (derived from the bytes it stores) where it lists one, and read back (``_read_back``) where it does not."""
    try:
        state = remote.state(plan.repo_id, plan.revision)
    except ReleaseError as exc:  # a timeout, an answer refused: the commit stays untagged, a rerun checks it again
        return f"it could not be read back ({exc})"
    after = state.files
    for f in plan.files:
        if f.action == "delete":
            continue
        entry, mine = after.get(f.path), local[f.path]
        if entry is None or entry[1] != (mine["sha256"] if entry[2] else mine["sha1"]):
            return f"the remote {f.path} does not match the hashed local file"
    uploaded = [f.path for f in plan.changes if f.action in ("add", "modify") and after[f.path][2]]
    by_content = [name for name in uploaded if checked_by(name, local[name], state.xet, True) == "xet"]
    for name in by_content:  # the Xet hash is derived from the stored bytes: equal hashes, equal bytes
        if state.xet[name] != local[name]["xet"]:
            return (f"the bytes the Hub stores for {name} are not the hashed local file (Xet hash {state.xet[name]}, "
                    f"the local file's {local[name]['xet']})")
    return _read_back(remote, plan, [name for name in uploaded if name not in by_content], local, commit)


def _read_back(remote: HubRemote, plan: RepoPlan, paths: list[str], local: dict[str, dict[str, Any]],
               commit: str) -> str | None:
    """Each of ``paths`` downloaded back at ``commit`` and hashed, one at a time into a temporary folder: a listing
    gives only the object id the client declared, not the bytes stored under it. The first that differs, or could
    not be downloaded, and why; else None."""
    from huggingface_hub.errors import HfHubHTTPError

    failures: tuple[type[Exception], ...] = (HfHubHTTPError, OSError, *_transport_errors())
    with tempfile.TemporaryDirectory(prefix="release-readback-") as tmp:
        for name in paths:
            try:
                path = Path(remote.api.hf_hub_download(plan.repo_id, name, revision=commit, local_dir=tmp))
                got = sha256_file(path)
                path.unlink()
            except failures as exc:
                return f"{name} could not be downloaded back to check its bytes ({describe(exc)})"
            if got != local[name]["sha256"]:
                return (f"the bytes the Hub stores for {name}, downloaded back, are not the hashed local file "
                        f"(sha256 {got}, approved {local[name]['sha256']})")
    return None


def _changed_during_upload(folder: Path, plan: RepoPlan, local: dict[str, dict[str, Any]]) -> GateError | None:
    """An upload that failed because a file changed after it was hashed (the server checks each LFS object's id):
    the first such file, else None."""
    for f in plan.changes:
        path = folder / f.path
        if f.action in ("add", "modify") and (not path.is_file() or sha256_file(path) != local[f.path]["sha256"]):
            return _changed_after_hashing(path)
    return None


def _tag(remote: HubRemote, plan: RepoPlan, commit: str) -> str:
    """Carry out the plan's tag action on ``commit``; says only what happened."""
    from huggingface_hub.errors import HfHubHTTPError

    if plan.tag_action == "unchanged":
        return f"tag {plan.tag} already on {commit[:12]}"
    failures: tuple[type[Exception], ...] = (HfHubHTTPError, *_transport_errors())
    try:
        with remote.deadline(f"tagging {plan.repo_id}"):
            if plan.tag_action == "move":
                remote.api.delete_tag(plan.repo_id, tag=plan.tag)
            remote.api.create_tag(plan.repo_id, tag=plan.tag, revision=commit)  # a tag made meanwhile: an error
    except failures as exc:
        why = f"HTTP {exc.response.status_code if exc.response is not None else None}" \
            if isinstance(exc, HfHubHTTPError) else describe(exc)
        raise ReleaseError(f"{plan.repo_id}: {commit[:12]} is on the branch, but tagging it {plan.tag} failed "
                           f"({why}); check the repo's tags, then run 'release push' again (with --retag if the tag "
                           "exists)") from exc
    if plan.tag_action == "move":
        return f"moved tag {plan.tag} from {(plan.tag_target or '')[:12]} to {commit[:12]}"
    return f"tagged {plan.tag}"


@contextmanager
def _upload_bars() -> Iterator[None]:
    """huggingface_hub's upload progress bars (on stderr) while a commit uploads, unless quiet."""
    from huggingface_hub.utils import disable_progress_bars, enable_progress_bars

    if not quiet():
        enable_progress_bars()
    try:
        yield
    finally:
        disable_progress_bars()


def _push_hub(remote: HubRemote, plan: RepoPlan, folder: Path, request: PushRequest,
              local: dict[str, dict[str, Any]]) -> Pushed:
    from huggingface_hub import CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError

    api = remote.api
    ops: list[Any] = [_operation(folder, f, local[f.path]) for f in plan.changes if f.action in ("add", "modify")]
    ops += [CommitOperationDelete(path_in_repo=f.path) for f in plan.changes if f.action == "delete"]
    try:
        with remote.deadline(f"creating {plan.repo_id}" if not plan.exists else f"branching {plan.repo_id}"):
            if not plan.exists:  # not exist_ok: a repo made after the plan may be public; --private would not apply
                api.create_repo(plan.repo_id, private=request.private)
            if not plan.branch_exists:
                api.create_branch(plan.repo_id, branch=plan.revision, revision=plan.head)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        made = "the repo" if not plan.exists else f"branch {plan.revision}"
        raise ReleaseError(f"{plan.repo_id}: creating {made} failed (HTTP {status}; 409: it was created after the "
                           "plan); nothing was committed; run 'release push' again to re-plan") from exc
    except _transport_errors() as exc:
        raise ReleaseError(f"{plan.repo_id}: the connection to the Hub failed while the repo or branch was created "
                           f"({describe(exc)}); nothing was committed; run 'release push' again to re-plan") from exc
    created = f"created branch {plan.revision}, " if not plan.branch_exists else ""
    empty = "the repo was created and is empty; " if not plan.exists else ""
    if not plan.changes:
        if not plan.head or plan.tag_action == "none":
            return Pushed(f"{created}no changes, nothing uploaded")
        if plan.tag_action != "unchanged":
            # a commit this push did not make (an earlier push's, whose read-back failed or was cut off): its LFS
            # files are read back before the tag vouches for it
            wrong = _read_back(remote, plan, [f.path for f in plan.files if f.storage == "lfs"], local, plan.head)
            if wrong:
                raise ReleaseError(f"{plan.repo_id}: no changes to commit, but on {plan.head[:12]} {wrong}; not "
                                   "tagged")
        return Pushed(f"{created}no changes, nothing uploaded; {_tag(remote, plan, plan.head)}")
    try:
        with _upload_bars():
            done = api.create_commit(plan.repo_id, operations=ops, commit_message=plan.commit_message,
                                     commit_description=request.notes, revision=plan.revision,
                                     parent_commit=plan.head, create_pr=request.create_pr)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        changed = _changed_during_upload(folder, plan, local)
        if changed is not None:
            raise changed from exc
        if status == 412:
            raise ReleaseError(f"{plan.repo_id}: the branch moved after the plan (parent {plan.head}); nothing "
                               "was overwritten; run 'release push' again to re-plan") from exc
        raise ReleaseError(f"{plan.repo_id}: the Hub refused the commit: HTTP {status}; nothing was committed; "
                           f"{empty}run 'release push' again") from exc
    except RuntimeError as exc:  # huggingface_hub: an LFS upload that still failed after its retries
        changed = _changed_during_upload(folder, plan, local)
        if changed is not None:
            raise changed from exc
        cause = exc.__cause__ or exc
        raise ReleaseError(f"{plan.repo_id}: {exc} ({describe(cause)}, after huggingface_hub's retries); "
                           f"nothing was committed; {empty}run 'release push' again (uploaded files are not sent "
                           "twice)") from exc
    except _transport_errors() as exc:
        raise ReleaseError(f"{plan.repo_id}: the connection dropped during the commit ({describe(exc)}): the Hub "
                           f"may have applied it; {_RERUN}") from exc
    except (ValueError, KeyError) as exc:  # an answer that is not the Hub's (not JSON, not its fields)
        raise ReleaseError(f"{plan.repo_id}: the answer to the commit is not one huggingface_hub reads "
                           f"({type(exc).__name__}): the Hub may have applied it; {_RERUN}") from exc
    commit = done.oid
    if request.create_pr:
        return Pushed(f"{created}opened a pull request ({plural(len(ops), 'file')})", commit, done.pr_url)
    wrong = _mismatches(remote, plan, local, commit)
    if wrong:
        raise ReleaseError(f"{plan.repo_id}: committed {commit[:12]}, but {wrong}; not tagged")
    tagged = _tag(remote, plan, commit) if plan.tag_action != "none" else f"not tagged (branch {plan.revision})"
    return Pushed(f"{created}committed {commit[:12]} to {plan.revision} ({plural(len(ops), 'file')}), {tagged}, "
                  "checksums verified", commit, done.commit_url)


def _transport_errors() -> tuple[type[Exception], ...]:
    """What huggingface_hub's HTTP client raises when a connection fails (no HTTP status to report)."""
    import httpx2

    return (httpx2.TransportError,)


def _copy_hashed(src: Path, dst: Path, sha256: str) -> None:
    """Copy ``src`` to ``dst`` hashing the bytes written; they must be the bytes the plan hashed."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with src.open("rb") as fin, dst.open("wb") as fout:
        while chunk := fin.read(CHUNK):
            h.update(chunk)
            fout.write(chunk)
    if h.hexdigest() != sha256:
        raise _changed_after_hashing(src)


def _push_folder(remote: FolderRemote, plan: RepoPlan, folder: Path, local: dict[str, dict[str, Any]]) -> Pushed:
    """Write the repo beside its old copy, each file checked against its planned hash while it is copied, and swap
    it in only when complete (``atomic_dir``): a failure leaves the old copy and no staging folder. What a killed
    earlier push left beside the repo (its old copy after the exchange, a partial new one) goes first, also when
    nothing changed."""
    dest = remote.folder(plan.repo_id)
    clean_stale(dest)
    if not plan.changes:
        return Pushed("no changes, nothing copied")
    with atomic_dir(dest) as staging:
        for f in plan.files:
            if f.action != "delete":
                _copy_hashed(folder / f.path, staging / f.path, local[f.path]["sha256"])
    return Pushed(f"{len(plan.changes)} changes published, checksums verified", url=str(dest))


def _doing(plan: RepoPlan, verb: str) -> str:
    """What the push is about to do to a repo, for the progress on stderr."""
    if not plan.changes:
        return "no changes"
    sent, deleted = plan.counts["add"] + plan.counts["modify"], plan.counts["delete"]
    deleting = f", deleting {deleted}" if deleted else ""
    return f"{verb} {plural(sent, 'file')} ({human_size(plan.upload_bytes)}){deleting}"


def render_pushed(plans: list[RepoPlan], pushed: list[Pushed], request: PushRequest,
                  collection: str | None = None) -> str:
    """What a push did (``request.fmt``: text or json): each repo's result with its commit and where to see it,
    what it did to the release's collection, then the totals."""
    if request.fmt == "json":
        return json_document(plans, request, [
            {"repo_id": p.repo_id, "build": p.build, "status": p.status, "revision": p.revision, "files": p.counts,
             "upload_bytes": p.upload_bytes, "tag": p.tag if p.tag_action != "none" else None,
             "tag_action": p.tag_action, "commit": done.commit, "url": done.url, "result": done.result}
            for p, done in zip(plans, pushed, strict=True)], collection)
    lines = []
    for p, done in zip(plans, pushed, strict=True):
        lines += [f"{p.repo_id}: {done.result}", *([f"  {done.url}"] if done.url else [])]
    lines += [collection] if collection else []
    how = " as pull requests" if request.create_pr else ""
    return "\n".join([*lines, f"Pushed release {request.release.version} to {destination(request)}{how}: "
                               f"{summary_line(plans, done=True)}."])


def run_push(request: PushRequest) -> str:
    """Plan every repo; for a dry run return the plan, else push (saying on stderr what goes where, then each repo
    as it goes) and return what it did.

    With a release manifest the build folders are staged from its sidecars, with freshly rendered cards, and each
    file that is not there is planned by the hashes the manifest holds. A push to a folder holds
    ``TARGET/.release-push.lock`` from the plan to the last copy: a second push to the same target fails at once,
    naming the process that holds it.
    """
    if request.lock is None:
        cache = HashCache(cache_dir() / "hashes.json")
        return _run_push(request, request.dist, cache, lambda folder, build: checked_files(
            folder, build.name, request.reports.get(build.name), cache, request.release.languages))
    lock, lock_path = request.lock, request.lock_path
    assert lock_path is not None
    with staged(lock, request.builds, request.release.languages) as dist:  # temporary: its hashes are not kept
        cache = HashCache(dist / ".hashes.json")
        return _run_push(request, dist, cache, lambda folder, build: locked_files(
            lock, lock_path, folder, build, request.reports.get(build.name), cache))


def _run_push(request: PushRequest, dist: Path, cache: HashCache,
              files: Callable[[Path, BuildConfig], dict[str, dict[str, Any]]]) -> str:
    """Plan (and push) the builds in ``dist``; ``files`` gives a build folder's checked files and hashes."""
    remote: HubRemote | FolderRemote = FolderRemote(request.target) if request.target \
        else HubRemote(request.endpoint)
    lock = exclusive_lock(request.target / LOCK_NAME, f"push to {request.target}") \
        if request.target is not None and not request.dry_run else nullcontext()
    with lock:
        plans, hashes = [], []
        for build in request.builds:
            folder = dist / build.repo
            local = files(folder, build)
            hashes.append(local)
            with remote.deadline(f"the plan of {request.org}/{build.repo}"):
                plans.append(plan_repo(remote, request, build, folder, local))
        cache.save()
        collection = plan_collection(remote, request, plans, dist) if isinstance(remote, HubRemote) else None
        if request.preview is not None:
            write_preview(request.preview, plans, request, dist)
        if request.dry_run:
            return render_plan(plans, request, request.fmt, render_collection(collection))
        info(f"Pushing release {request.release.version} to {destination(request)}: "
             f"{summary_line(plans, done=False)}")
        pushed: list[Pushed] = []
        for i, (build, plan, local) in enumerate(zip(request.builds, plans, hashes, strict=True), 1):
            folder = dist / build.repo
            info(f"{plan.repo_id} ({i}/{len(plans)}): {_doing(plan, 'copying' if request.target else 'uploading')}")
            try:
                pushed.append(_push_folder(remote, plan, folder, local) if isinstance(remote, FolderRemote)
                              else _push_hub(remote, plan, folder, request, local))
            except ReleaseError as exc:
                if not pushed:
                    raise
                before = "; ".join(f"{p.repo_id}: {d.result}" for p, d in zip(plans, pushed, strict=False))
                raise type(exc)(f"{exc}. Published before it ({len(pushed)} of {len(plans)} repos): {before}") \
                    from exc
        kept = apply_collection(remote, collection) if isinstance(remote, HubRemote) else None
    return render_pushed(plans, pushed, request, kept)
