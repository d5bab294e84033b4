"""``release push``: publish sibling repos through huggingface_hub, planned read-only first.

The plan compares every local file with the remote without uploading: the sha256 of LFS files with the remote's
``lfs.sha256``, the git blob sha1 of small files with the remote ``blob_id``. ``--dry-run`` prints it (the
pull-request preview); a push makes one commit per repo on the head seen at plan time (``parent_commit``), tags the
release, and checks the remote against the local folder afterwards. ``--target DIR`` publishes to a folder instead.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from release import GateError, ReleaseError, __version__
from release.config import BuildConfig, ReleaseConfig, load_build, load_release
from release.io import write_json
from release.verify import gate

# The Hub stores files of this size or larger, and every binary checkpoint file, through LFS.
LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".pth", ".bin", ".png", ".npz")
SECRET_NAMES = (".env", "*.pem", "*.key", "id_rsa*", "id_ed25519*", ".netrc", "*credentials*", "*.token",
                ".huggingface/*", "token")
SECRET_CONTENT = re.compile(rb"hf_[A-Za-z0-9]{30,}|-----BEGIN [A-Z ]*PRIVATE KEY-----|AKIA[0-9A-Z]{16}")
CACHE_ENV = "RELEASE_CACHE"
Action = Literal["add", "modify", "delete", "unchanged"]


@dataclass(frozen=True)
class PushRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    org: str
    dist: Path
    dry_run: bool
    endpoint: str | None
    create_pr: bool
    fmt: Literal["markdown", "json"]
    force: str | None
    target: Path | None

    @classmethod
    def create(cls, names: tuple[str, ...], org: str | None, dist: Path, dry_run: bool, endpoint: str | None = None,
               create_pr: bool = False, fmt: str = "markdown", force: str | None = None,
               target: Path | None = None) -> PushRequest:
        release = load_release()
        wanted = list(names) or [s.build for s in release.siblings if (dist / load_build(s.build).repo).is_dir()]
        if not wanted:
            raise ReleaseError(f"{dist}: no built repos to push; run 'release build NAME' first")
        builds = [load_build(n) for n in wanted]
        if force is not None and not force.strip():
            raise ReleaseError("--force needs a reason (it goes into the commit message)")
        for b in builds:
            folder = dist / b.repo
            if not folder.is_dir():
                raise ReleaseError(f"{folder}: missing; run 'release build {b.name}' first")
            refusal = gate(folder)
            if refusal and force is None:
                raise GateError(f"push refused: {refusal}; fix it, or pass --force REASON")
            _refuse_unsafe(folder)
        return cls(release, builds, org or release.org, dist, dry_run, endpoint, create_pr, fmt,  # type: ignore[arg-type]
                   force, target)


def _refuse_unsafe(folder: Path) -> None:
    """Links that leave the build folder and files that look like secrets are never uploaded."""
    root = folder.resolve()
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder).as_posix()
        if path.is_symlink() and not path.resolve().is_relative_to(root):
            raise ReleaseError(f"{path}: a link to {os.readlink(path)}, outside the build folder; replace it with "
                               "the file or remove it")
        if not path.is_file():
            continue
        if any(fnmatch.fnmatch(path.name, p) or fnmatch.fnmatch(rel, p) for p in SECRET_NAMES):
            raise ReleaseError(f"{path}: looks like a secret (by its name); remove it from the build folder")
        if path.stat().st_size < LFS_THRESHOLD and path.suffix not in LFS_SUFFIXES:
            if SECRET_CONTENT.search(path.read_bytes()):
                raise ReleaseError(f"{path}: contains what looks like a token or private key; remove it")


def is_lfs(path: str, size: int) -> bool:
    return size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)


class HashCache:
    """sha256 / git blob sha1 of local files, cached by absolute path, size and mtime (a JSON file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}
        self.hashed_bytes = 0

    def _hash(self, file: Path) -> dict[str, Any]:
        st = file.stat()
        key = str(file.resolve())
        hit = self.entries.get(key)
        if hit and hit["size"] == st.st_size and hit["mtime_ns"] == st.st_mtime_ns:
            return hit
        # sha256 for LFS comparisons; the git blob sha1 only where a file can be stored in git (small files)
        h = hashlib.sha256()
        blob = hashlib.sha1(b"blob %d\0" % st.st_size) if st.st_size < LFS_THRESHOLD else None
        with file.open("rb") as f:
            while chunk := f.read(1 << 24):
                h.update(chunk)
                if blob is not None:
                    blob.update(chunk)
        self.hashed_bytes += st.st_size
        return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": h.hexdigest(),
                "sha1": blob.hexdigest() if blob is not None else None}

    def hash_all(self, files: list[Path], workers: int | None = None) -> dict[Path, dict[str, Any]]:
        """Hash in parallel (hashlib releases the GIL on large buffers)."""
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            results = dict(zip(files, pool.map(self._hash, files), strict=True))
        for file, entry in results.items():
            self.entries[str(file.resolve())] = entry
        return results

    def save(self) -> None:
        write_json(self.path, self.entries)


@dataclass
class FilePlan:
    path: str
    action: Action
    size: int
    storage: Literal["lfs", "git"]
    local_hash: str | None
    remote_hash: str | None


@dataclass
class RepoPlan:
    repo_id: str
    build: str
    exists: bool
    head: str | None
    files: list[FilePlan] = field(default_factory=list)
    readme_diff: str = ""
    commit_message: str = ""

    @property
    def changes(self) -> list[FilePlan]:
        return [f for f in self.files if f.action != "unchanged"]


class HubRemote:
    """A repo on the Hub (or a server speaking its API), read through huggingface_hub."""

    def __init__(self, endpoint: str | None) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # the plan and the result lines are the output
        self.api = HfApi(endpoint=endpoint, token=os.environ.get("HF_TOKEN") or None)

    def state(self, repo_id: str) -> tuple[str | None, dict[str, tuple[int, str, bool]]]:
        """(head commit or None if the repo does not exist, {path: (size, sha256 if LFS else blob sha1, is LFS)})."""
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            head = self.api.repo_info(repo_id).sha
            tree = list(self.api.list_repo_tree(repo_id, recursive=True, revision=head))
        except (RepositoryNotFoundError, RevisionNotFoundError):
            return None, {}
        except Exception as exc:  # offline mode, DNS, refused connection: say where and stop
            raise ReleaseError(f"cannot read {repo_id} from {self.api.endpoint}: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}; check --endpoint and the "
                               "network, or plan against a folder with --target DIR") from exc
        from huggingface_hub.hf_api import RepoFile

        files = {}
        for entry in tree:
            if isinstance(entry, RepoFile):
                files[entry.path] = (entry.size, entry.lfs.sha256 if entry.lfs else entry.blob_id, bool(entry.lfs))
        return head, files

    def read(self, repo_id: str, path: str, revision: str) -> str:
        local = self.api.hf_hub_download(repo_id, path, revision=revision)
        return Path(local).read_text(encoding="utf-8")


class FolderRemote:
    """A local folder standing in for the Hub (``--target``: air-gapped staging)."""

    def __init__(self, root: Path, cache: HashCache) -> None:
        self.root, self.cache = root, cache

    def state(self, repo_id: str) -> tuple[str | None, dict[str, tuple[int, str, bool]]]:
        folder = self.root / repo_id
        if not folder.is_dir():
            return None, {}
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        hashes = self.cache.hash_all(files)
        out = {}
        for p in files:
            rel = p.relative_to(folder).as_posix()
            h = hashes[p]
            lfs = is_lfs(rel, h["size"])
            out[rel] = (h["size"], h["sha256"] if lfs else h["sha1"], lfs)
        head = hashlib.sha1(json.dumps(sorted(out.items())).encode()).hexdigest()
        return head, out

    def read(self, repo_id: str, path: str, revision: str) -> str:
        return (self.root / repo_id / path).read_text(encoding="utf-8")


def plan_repo(remote: HubRemote | FolderRemote, build: BuildConfig, folder: Path, repo_id: str, cache: HashCache,
              force: str | None) -> RepoPlan:
    head, remote_files = remote.state(repo_id)
    local = sorted(p for p in folder.rglob("*") if p.is_file())
    hashes = cache.hash_all(local)
    plan = RepoPlan(repo_id, build.name, head is not None, head)
    seen = set()
    for p in local:
        rel = p.relative_to(folder).as_posix()
        h = hashes[p]
        remote_entry = remote_files.get(rel)
        # compare the way the remote stores the file (its LFS rules are its own); a new file by ours
        lfs = remote_entry[2] if remote_entry is not None and h["sha1"] is not None else is_lfs(rel, h["size"])
        mine = h["sha256"] if lfs else h["sha1"]
        theirs = remote_entry[1] if remote_entry is not None else None
        action: Action = "add" if remote_entry is None else "unchanged" if mine == theirs else "modify"
        plan.files.append(FilePlan(rel, action, h["size"], "lfs" if lfs else "git", mine, theirs))
        seen.add(rel)
    for rel, (size, theirs, lfs) in sorted(remote_files.items()):
        if rel not in seen and rel != ".gitattributes":
            plan.files.append(FilePlan(rel, "delete", size, "lfs" if lfs else "git", None, theirs))
    readme = next((f for f in plan.files if f.path == "README.md"), None)
    if readme is not None and readme.action != "unchanged":
        old = remote.read(repo_id, "README.md", head).splitlines() if readme.action == "modify" and head else []
        new = (folder / "README.md").read_text(encoding="utf-8").splitlines()
        plan.readme_diff = "\n".join(difflib.unified_diff(old, new, "remote/README.md", "local/README.md",
                                                          lineterm=""))
    prov = json.loads((folder / "provenance.json").read_text()) if (folder / "provenance.json").is_file() else {}
    plan.commit_message = f"release {__version__}: {build.name} ({build.recipe}, {build.calibrator.method})" \
        f" from {prov.get('source', {}).get('revision', 'unknown')[:12]}"
    if force:
        plan.commit_message += f" [forced past verification: {force}]"
    return plan


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def render_plan(plans: list[RepoPlan], request: PushRequest) -> str:
    if request.fmt == "json":
        return json.dumps({"org": request.org, "dry_run": request.dry_run, "version": __version__,
                           "repos": [asdict(p) for p in plans]}, indent=2)
    where = f"`{request.target}`" if request.target else f"`{request.endpoint or 'https://huggingface.co'}`"
    lines = [f"# Release plan: `release` {__version__} to {where}", ""]
    for p in plans:
        counts = {a: sum(1 for f in p.files if f.action == a) for a in ("add", "modify", "delete", "unchanged")}
        status = "exists" if p.exists else "will be created"
        upload = sum(f.size for f in p.files if f.action in ("add", "modify"))
        lines += [f"## {p.repo_id} ({p.build}): {status}", "",
                  f"{counts['add']} to add, {counts['modify']} to modify, {counts['delete']} to delete, "
                  f"{counts['unchanged']} unchanged; {_human(upload)} to upload.", ""]
        if not p.changes:
            lines += ["No changes: nothing will be uploaded.", ""]
        else:
            lines += [f"Commit message: `{p.commit_message}`" + (f" on parent `{p.head[:12]}`" if p.head else ""),
                      "", "| file | action | size | storage |", "|---|---|---:|---|"]
            lines += [f"| `{f.path}` | {f.action} | {_human(f.size)} | {f.storage} |" for f in p.changes]
            lines.append("")
        if p.readme_diff:
            lines += ["<details><summary>README.md diff</summary>", "", "```diff", p.readme_diff, "```", "",
                      "</details>", ""]
    return "\n".join(lines)


def _mismatches(remote: HubRemote | FolderRemote, plan: RepoPlan, folder: Path, cache: HashCache) -> list[str]:
    """Files whose remote hash differs from the local file's, compared the way the remote stores each."""
    _, after = remote.state(plan.repo_id)
    wrong = []
    for f in plan.files:
        if f.action == "delete":
            continue
        entry = after.get(f.path)
        local = cache.hash_all([folder / f.path])[folder / f.path]
        if entry is None or entry[1] != (local["sha256"] if entry[2] else local["sha1"]):
            wrong.append(f.path)
    return wrong


def _push_hub(remote: HubRemote, plan: RepoPlan, folder: Path, request: PushRequest, cache: HashCache) -> str:
    from huggingface_hub import CommitOperationAdd, CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError

    if not plan.changes:
        return f"{plan.repo_id}: no changes, nothing uploaded"
    api = remote.api
    if not plan.exists:
        api.create_repo(plan.repo_id, exist_ok=True)
    ops: list[Any] = [CommitOperationAdd(path_in_repo=f.path, path_or_fileobj=str(folder / f.path))
                      for f in plan.changes if f.action in ("add", "modify")]
    ops += [CommitOperationDelete(path_in_repo=f.path) for f in plan.changes if f.action == "delete"]
    try:
        info = api.create_commit(plan.repo_id, operations=ops, commit_message=plan.commit_message,
                                 parent_commit=plan.head, create_pr=request.create_pr)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 412:
            raise ReleaseError(f"{plan.repo_id}: the branch moved after the plan (parent {plan.head}); nothing "
                               "was overwritten; run 'release push' again to re-plan") from exc
        raise ReleaseError(f"{plan.repo_id}: the Hub refused the commit: HTTP {status}") from exc
    commit = info.oid
    if request.create_pr:
        return f"{plan.repo_id}: opened {info.pr_url}"
    api.create_tag(plan.repo_id, tag=f"v{__version__}", revision=commit, exist_ok=True)
    wrong = _mismatches(remote, plan, folder, cache)
    if wrong:
        raise ReleaseError(f"{plan.repo_id}: after the push the remote {wrong[0]} does not match the local file")
    return f"{plan.repo_id}: committed {commit[:12]} ({len(ops)} files), tagged v{__version__}, checksums verified"


def _push_folder(remote: FolderRemote, plan: RepoPlan, folder: Path, cache: HashCache) -> str:
    if not plan.changes:
        return f"{plan.repo_id}: no changes, nothing copied"
    dest = remote.root / plan.repo_id
    staging = dest.with_name(f".{dest.name}.tmp")
    if staging.exists():
        shutil.rmtree(staging)
    shutil.copytree(folder, staging)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(staging, dest)
    wrong = _mismatches(remote, plan, folder, cache)
    if wrong:
        raise ReleaseError(f"{dest}: {wrong[0]} does not match the local file after copying")
    return f"{plan.repo_id}: {len(plan.changes)} changes published to {dest}, checksums verified"


def run_push(request: PushRequest) -> str:
    """Plan every repo; for a dry run return the plan, else push and return the plan plus what happened."""
    cache = HashCache(Path(os.environ.get(CACHE_ENV, ".cache/release")) / "hashes.json")
    remote: HubRemote | FolderRemote = FolderRemote(request.target, cache) if request.target \
        else HubRemote(request.endpoint)
    plans = []
    for build in request.builds:
        plans.append(plan_repo(remote, build, request.dist / build.repo, f"{request.org}/{build.repo}", cache,
                               request.force))
    cache.save()
    text = render_plan(plans, request)
    if request.dry_run:
        return text
    done = []
    for build, plan in zip(request.builds, plans, strict=True):
        folder = request.dist / build.repo
        if isinstance(remote, FolderRemote):
            done.append(_push_folder(remote, plan, folder, cache))
        else:
            done.append(_push_hub(remote, plan, folder, request, cache))
    cache.save()
    return text + "\n" + "\n".join(done) if request.fmt == "markdown" else "\n".join(done)
