"""A local, in-memory HTTP test double of the Hugging Face Hub API (standard library only).

It speaks the subset of the Hub protocol that ``huggingface_hub`` 2.4 (``HfApi``) uses for: repo creation and info,
tree / paths-info / refs / commits listings, the commit pipeline (preupload, LFS batch + basic PUT upload + verify,
NDJSON ``/commit``), pull requests created by commits, tags, branches, ``/api/validate-yaml`` and file downloads
(``/{repo_id}/resolve/{revision}/{path}``, GET and HEAD).

Usage in a test::

    from huggingface_hub import HfApi, constants

    def test_push(tmp_path, monkeypatch):
        # Environment (set BEFORE huggingface_hub is imported when you can):
        monkeypatch.setenv("HF_HUB_OFFLINE", "0")
        monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
        monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
        monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
        monkeypatch.setenv("HF_TOKEN", "hf_test_token")
        # ...but huggingface_hub.constants reads ENDPOINT, HF_HUB_OFFLINE, HF_HUB_DISABLE_XET, HF_HUB_CACHE once,
        # at import time.  In a pytest session the module is usually already imported (and tests/conftest.py sets
        # HF_HUB_OFFLINE=1 for the whole session), so ALSO patch the constants:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)   # hf_xet is installed: without this, uploads
                                                                      # go through Xet, which this double lacks
        hub = FakeHub().start()
        try:
            api = HfApi(endpoint=hub.url, token="hf_test_token")   # preferred: covers every HfApi call
            ...
            api.hf_hub_download(repo_id, "x.bin", cache_dir=tmp_path / "cache")  # HfApi method passes its endpoint
        finally:
            hub.stop()

``HfApi(endpoint=hub.url, ...)`` routes every call (including ``HfApi.hf_hub_download``, the LFS upload URLs
returned by this server and ``create_commit``'s helpers) to the double.  Module-level functions
(``huggingface_hub.hf_hub_download``, ``create_commit``, ...) use ``constants.ENDPOINT``, which is frozen at import
from ``HF_ENDPOINT``: either pass ``endpoint=hub.url`` to them, or ``monkeypatch.setattr(constants, "ENDPOINT",
hub.url)`` (and ``HUGGINGFACE_CO_URL_TEMPLATE``), or set ``HF_ENDPOINT`` before the first import.

Behaviour worth knowing:

* ``create_repo`` makes an ``"initial commit"`` holding a ``.gitattributes`` file, like the real Hub
  (``FakeHub(gitattributes=False)`` gives an empty initial commit instead).
* Upload mode (preupload): ``lfs`` for files >= 10 MB or whose name ends with one of ``FakeHub.lfs_suffixes``
  (``.safetensors .pth .bin .png``), else ``regular``.  ``shouldIgnore`` is always false.
* Tree/paths-info ``oid`` is the git blob sha1 of what git stores: the content for regular files, the LFS pointer
  file for LFS files (as on the real Hub); ``lfs`` is ``{"oid": sha256, "size", "pointerSize"}``.  Preupload
  returns the sha1 (regular) or the sha256 (LFS) of an existing file, as the client expects.
* The LFS batch answers ``transfer: basic`` with ``upload`` + ``verify`` actions for unknown objects and no actions
  for stored ones.  The PUT checks size and sha256 of the body (400 otherwise).
* ``fail_next_lfs_upload = N``: the next N LFS PUTs read part of the body and then close the socket without a
  response.  huggingface_hub's ``http_backoff`` retries ``PUT`` on ``httpx2.NetworkError`` /
  ``RemoteProtocolError`` (up to 5 retries, sleeping 1 s, 2 s, ...), so the commit still succeeds.
* ``store_lfs = fn``: each LFS object is stored as ``fn(body)`` under the id the client declared (the body's
  sha256 is still checked): a server that keeps other bytes than it was sent, which a listing does not show (with
  a Xet store, the store keeps them under their own Xet hash, which listings and downloads then carry).
* ``fail_next_commits = [...]``: each ``/commit`` takes the first item: an HTTP status (the commit refused with it,
  nothing applied) or ``"drop after"`` (the commit applied, then the socket closed without a response).
* ``/commit`` with a ``parentCommit`` that is not the head of the target branch -> HTTP 412 (``HfHubHTTPError``).
  With ``create_pr=1`` the PR (``refs/pr/N``) starts from ``parentCommit`` (or the branch head) and the branch is
  left unchanged; the response carries ``pullRequestUrl`` (``.../discussions/N``) and ``pullRequestRevision``.
* Errors follow the Hub: ``X-Error-Code`` ``RepoNotFound`` / ``RevisionNotFound`` / ``EntryNotFound`` headers
  (-> ``RepositoryNotFoundError`` ...), a JSON body ``{"error": message}`` and ``X-Error-Message``.
* Tokens are not checked unless ``hub.expected_token`` is set (then other bearer tokens get 401).
* Commit ids are sha1 of (repo, parent, message, tree, server-wide sequence number): deterministic for a given
  sequence of operations.  Dates are fake (2024-01-01 plus one second per commit).
* ``hub.requests`` logs ``(method, path)`` of every request, for assertions; ``hub.authorizations`` logs each
  request's ``Authorization`` header (None without one), so a test can show that no token was sent.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

__all__ = ["Commit", "FakeHub", "Repo", "TreeEntry", "git_blob_sha1", "lfs_pointer"]

LFS_THRESHOLD = 10 * 1024 * 1024
REPO_TYPES = {"models": "model", "datasets": "dataset", "spaces": "space"}
URL_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
_HEX40 = re.compile(r"^[0-9a-f]{40}$")
_EPOCH = datetime(2024, 1, 1, tzinfo=UTC)
_GITATTRIBUTES = (
    b"*.bin filter=lfs diff=lfs merge=lfs -text\n"
    b"*.pth filter=lfs diff=lfs merge=lfs -text\n"
    b"*.png filter=lfs diff=lfs merge=lfs -text\n"
    b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"
)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass(frozen=True)
class TreeEntry:
    """One file in a commit's tree. ``blob_id`` is the git oid (of the pointer for LFS files)."""

    blob_id: str
    size: int
    lfs_sha256: str | None = None
    pointer_size: int | None = None


@dataclass
class Commit:
    id: str
    title: str
    message: str
    parent: str | None
    tree: dict[str, TreeEntry]
    date: str


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    private: bool
    created_at: str
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit id
    tags: dict[str, str] = field(default_factory=dict)  # name -> commit id
    tag_messages: dict[str, str | None] = field(default_factory=dict)
    prs: list[dict[str, Any]] = field(default_factory=list)  # num starts at 1
    commits: dict[str, Commit] = field(default_factory=dict)


class _HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.extra = status, message, code, extra or {}


class _DropConnection(Exception):
    pass


class FakeHub:
    lfs_suffixes: tuple[str, ...] = (".safetensors", ".pth", ".bin", ".png")
    user = "test-user"

    def __init__(self, *, gitattributes: bool = True, xet_cas: Path | None = None) -> None:
        """``xet_cas``: a folder for a local Xet store (hf_xet's ``local://`` endpoint): the Xet token endpoints hand
        it out, a committed LFS file that no LFS PUT brought is looked up there by its sha256, and tree listings
        and downloads carry its Xet hash, as on the Hub."""
        self.xet_cas = xet_cas
        self.xet_hashes: dict[str, str] = {}  # sha256 -> Xet hash of what hf_xet uploaded
        self.xet_tokens: list[str] = []  # the token routes asked for
        self.mask_xet = False  # list Xet hashes masked (64 asterisks), as the Hub may
        self.collections: dict[str, dict[str, Any]] = {}  # slug -> the collection as the Hub returns it
        self.refuse_collection_writes: int | None = None  # an HTTP status every collection write is answered with
        self.repos: dict[str, Repo] = {}
        self.blobs: dict[str, bytes] = {}  # git sha1 -> content (regular files)
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> content
        self.fail_next_lfs_upload = 0
        self.dropped_lfs_uploads = 0
        self.fail_next_commits: list[int | str] = []
        self.store_lfs: Callable[[bytes], bytes] | None = None
        self.lfs_uploads: list[str] = []  # sha256 of every completed LFS PUT
        self.expected_token: str | None = None
        self.requests: list[tuple[str, str]] = []
        self.authorizations: list[str | None] = []
        self.gitattributes = gitattributes
        self._seq = 0
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> FakeHub:
        hub = self

        class Handler(_Handler):
            fake = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, name="FakeHub", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeHub:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ inspection
    def commits(self, repo_id: str, branch: str = "main") -> list[dict[str, Any]]:
        """History of ``branch`` (a branch, tag, ``refs/pr/N`` or commit id), oldest first."""
        with self._lock:
            repo = self._repo(repo_id)
            return [
                {
                    "id": c.id,
                    "title": c.title,
                    "message": c.message,
                    "parent": c.parent,
                    "date": c.date,
                    "files": {p: e.blob_id for p, e in sorted(c.tree.items())},
                    "lfs_files": {p: e.lfs_sha256 for p, e in sorted(c.tree.items()) if e.lfs_sha256},
                }
                for c in self._history(repo, branch)
            ][::-1]

    def _history(self, repo: Repo, revision: str) -> list[Commit]:
        """The commits reachable from ``revision`` through first parents, newest first."""
        out = []
        cid: str | None = self._resolve(repo, revision)
        while cid is not None:
            out.append(repo.commits[cid])
            cid = out[-1].parent
        return out

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        with self._lock:
            repo = self._repo(repo_id)
            tree = repo.commits[self._resolve(repo, revision)].tree
            return {p: self._content(e) for p, e in sorted(tree.items())}

    def tags(self, repo_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._repo(repo_id).tags)

    def branches(self, repo_id: str) -> dict[str, str]:
        with self._lock:
            return dict(self._repo(repo_id).branches)

    def pull_requests(self, repo_id: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(pr) for pr in self._repo(repo_id).prs]

    def head(self, repo_id: str, revision: str = "main") -> str:
        with self._lock:
            repo = self._repo(repo_id)
            return self._resolve(repo, revision)

    # ------------------------------------------------------------------ fault injection
    def move_branch(self, repo_id: str, branch: str = "main") -> str:
        """Add an empty commit (same files) on ``branch`` behind the client's back; returns the new head."""
        with self._lock:
            repo = self._repo(repo_id)
            return self._apply_commit(repo, branch, f"Concurrent commit {self._seq + 1}", "", [])[0]

    # ------------------------------------------------------------------ state helpers (hold the lock)
    def _repo(self, repo_id: str, repo_type: str | None = None) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo_type is not None and repo.repo_type != repo_type):
            raise _HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _resolve(self, repo: Repo, revision: str) -> str:
        rev = revision
        if rev.startswith("refs/heads/"):
            rev = rev[len("refs/heads/") :]
        elif rev.startswith("refs/tags/"):
            rev = rev[len("refs/tags/") :]
            if rev in repo.tags:
                return repo.tags[rev]
        if rev in repo.branches:
            return repo.branches[rev]
        if rev in repo.tags:
            return repo.tags[rev]
        m = re.fullmatch(r"refs/pr/(\d+)", rev)
        if m and 1 <= int(m[1]) <= len(repo.prs):
            return repo.prs[int(m[1]) - 1]["head"]
        if _HEX40.match(rev) and rev in repo.commits:
            return rev
        raise _HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def _content(self, e: TreeEntry) -> bytes:
        return self.lfs_objects[e.lfs_sha256] if e.lfs_sha256 else self.blobs[e.blob_id]

    def _new_commit(self, repo: Repo, parent: str | None, title: str, message: str, tree: dict[str, TreeEntry]) -> str:
        self._seq += 1
        listing = json.dumps({p: [e.blob_id, e.lfs_sha256] for p, e in sorted(tree.items())})
        raw = f"commit\n{repo.repo_type}/{repo.repo_id}\n{parent}\n{title}\n{message}\n{listing}\n{self._seq}"
        cid = hashlib.sha1(raw.encode()).hexdigest()
        date = (_EPOCH + timedelta(seconds=self._seq)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        repo.commits[cid] = Commit(cid, title, message, parent, dict(tree), date)
        return cid

    def _create_repo(self, repo_id: str, repo_type: str, private: bool) -> Repo:
        date = (_EPOCH + timedelta(seconds=self._seq)).strftime("%Y-%m-%dT%H:%M:%S.000Z")
        repo = Repo(repo_id=repo_id, repo_type=repo_type, private=private, created_at=date)
        tree: dict[str, TreeEntry] = {}
        if self.gitattributes:
            oid = git_blob_sha1(_GITATTRIBUTES)
            self.blobs[oid] = _GITATTRIBUTES
            tree[".gitattributes"] = TreeEntry(oid, len(_GITATTRIBUTES))
        repo.branches["main"] = self._new_commit(repo, None, "initial commit", "", tree)
        self.repos[repo_id] = repo
        return repo

    def _from_xet(self, sha: str) -> None:
        """The bytes hf_xet stored for ``sha`` (the sha256 its shards record beside each file's Xet hash), read back
        through hf_xet, kept as the LFS object; with ``store_lfs``, its output stored in their place, in the Xet
        store too (the Hub lists and serves that Xet hash under the declared sha256)."""
        import hf_xet

        assert self.xet_cas is not None
        found = xet_shard_files(self.xet_cas).get(sha)
        if found is None:
            return
        xet_hash, size = found
        session, cas = hf_xet.XetSession(), f"local://{self.xet_cas}"
        with session.new_download_stream_group(endpoint=cas) as group:
            data = b"".join(group.download_stream(hf_xet.XetFileInfo(xet_hash, size)))
        if self.store_lfs is not None:  # other bytes kept under the sha256 the client declared: in the store too
            data = self.store_lfs(data)
            with session.new_upload_commit(endpoint=cas) as commit:
                stored = commit.start_upload_bytes(data, sha256=hf_xet.SKIP_SHA256)
            xet_hash = stored.result().xet_info.hash
        self.xet_hashes[sha] = xet_hash
        self.lfs_objects[sha] = data

    def _apply_commit(
        self,
        repo: Repo,
        revision: str,
        summary: str,
        description: str,
        ops: list[tuple[str, dict[str, Any]]],
        parent_commit: str | None = None,
        create_pr: bool = False,
    ) -> tuple[str, dict[str, Any] | None]:
        """Apply NDJSON operations; returns the new commit id and the PR created (if ``create_pr``)."""
        pr: dict[str, Any] | None = None
        pr_match = re.fullmatch(r"refs/pr/(\d+)", revision)
        if pr_match:
            num = int(pr_match[1])
            if not 1 <= num <= len(repo.prs):
                raise _HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
            head = repo.prs[num - 1]["head"]
        elif revision in repo.branches:
            head = repo.branches[revision]
        elif revision in repo.tags or (_HEX40.match(revision) and revision in repo.commits):
            raise _HubError(400, f"Invalid rev id: {revision} is not a branch")
        else:
            raise _HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

        if create_pr:
            if pr_match:
                raise _HubError(400, "Cannot create a PR from a PR ref")
            if parent_commit is not None and parent_commit not in repo.commits:
                raise _HubError(400, f"Invalid parent commit: {parent_commit}")
            base = parent_commit or head
        else:
            if parent_commit is not None and parent_commit != head:
                raise _HubError(412, "A commit has happened since. Please refresh and try again.")
            base = head

        tree = dict(repo.commits[base].tree)
        for key, value in ops:
            path = str(value.get("path", "")).strip("/")
            if key == "file":
                data = (
                    base64.b64decode(value["content"])
                    if value.get("encoding", "base64") == "base64"
                    else (str(value["content"]).encode())
                )
                oid = git_blob_sha1(data)
                self.blobs[oid] = data
                tree[path] = TreeEntry(oid, len(data))
            elif key == "lfsFile":
                if value.get("algo", "sha256") != "sha256":
                    raise _HubError(400, f"Unsupported LFS algo for {path}")
                sha = value["oid"]
                if sha not in self.lfs_objects and self.xet_cas is not None:
                    self._from_xet(sha)
                if sha not in self.lfs_objects:
                    raise _HubError(422, f"LFS file {path} with oid {sha} was not uploaded")
                size = len(self.lfs_objects[sha])
                if value.get("size") is not None and int(value["size"]) != size:
                    raise _HubError(422, f"LFS file {path}: size {value['size']} != stored size {size}")
                pointer = lfs_pointer(sha, size)
                tree[path] = TreeEntry(git_blob_sha1(pointer), size, sha, len(pointer))
            elif key == "deletedFile":
                if path not in tree:
                    raise _HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                del tree[path]
            elif key == "deletedFolder":
                doomed = [p for p in tree if p.startswith(path + "/")] if path else list(tree)
                if not doomed:
                    raise _HubError(404, f"A folder with this name doesn't exist: {path}", "EntryNotFound")
                for p in doomed:
                    del tree[p]
            else:
                raise _HubError(400, f"Unknown commit operation key: {key}")

        new = self._new_commit(repo, base, summary, description, tree)
        if create_pr:
            num = len(repo.prs) + 1
            pr = {
                "num": num,
                "ref": f"refs/pr/{num}",
                "title": summary,
                "description": description,
                "status": "open",
                "is_pull_request": True,
                "base_branch": revision,
                "base": base,
                "head": new,
            }
            repo.prs.append(pr)
        elif pr_match:
            repo.prs[int(pr_match[1]) - 1]["head"] = new
        else:
            repo.branches[revision] = new
        return new, pr

    def _last_commit_touching(self, repo: Repo, head: str, path: str, is_dir: bool) -> Commit:
        def sub(tree: dict[str, TreeEntry]) -> Any:
            if is_dir:
                return {p: e for p, e in tree.items() if p.startswith(path + "/")}
            return tree.get(path)

        c = repo.commits[head]
        while c.parent is not None:
            if sub(repo.commits[c.parent].tree) != sub(c.tree):
                return c
            c = repo.commits[c.parent]
        return c


def _folder_oid(tree: dict[str, TreeEntry], folder: str) -> str:
    items = sorted((p, e.blob_id) for p, e in tree.items() if p.startswith(folder + "/"))
    return hashlib.sha1(("tree\n" + json.dumps(items)).encode()).hexdigest()


def _folders(tree: dict[str, TreeEntry]) -> set[str]:
    out: set[str] = set()
    for p in tree:
        parts = p.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            out.add("/".join(parts[:i]))
    return out


def _truthy(v: str | None) -> bool:
    return v is not None and v.lower() in ("1", "true", "yes")


# ---------------------------------------------------------------------- YAML front matter
def _front_matter(content: str) -> str | None:
    lines = content.lstrip("\ufeff").splitlines()
    if not lines or lines[0].strip() != "---":
        return None
    for i in range(1, len(lines)):
        if lines[i].strip() == "---":
            return "\n".join(lines[1:i])
    raise ValueError("YAML front matter is not closed with '---'")


def _validate_yaml_text(text: str) -> str | None:
    """Return an error message for invalid YAML metadata, else None."""
    try:
        import yaml  # PyYAML is a dependency of huggingface_hub; fall back to a crude check without it.
    except ImportError:  # pragma: no cover
        yaml = None
    if yaml is not None:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as err:
            return f"Invalid YAML in README.md metadata: {err}"
        if data is not None and not isinstance(data, dict):
            return "README.md metadata must be a YAML mapping"
        return None
    for n, line in enumerate(text.splitlines(), 1):  # pragma: no cover
        if line.startswith("\t") or (
            line.strip()
            and not line.lstrip().startswith("#")
            and ":" not in line
            and not line.lstrip().startswith("- ")
        ):
            return f"Invalid YAML in README.md metadata at line {n}: {line!r}"
        if line.count("[") != line.count("]") or line.count("{") != line.count("}"):
            return f"Invalid YAML in README.md metadata at line {n}: unbalanced brackets"
    return None


# ---------------------------------------------------------------------- HTTP handler
class _Handler(BaseHTTPRequestHandler):
    fake: FakeHub
    protocol_version = "HTTP/1.1"
    server_version = "FakeHub/1.0"

    def log_message(self, format: str, *args: Any) -> None:  # silence
        pass

    # -------------------------------------------------------------- plumbing
    def _read_body(self, limit: int | None = None) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size_line = self.rfile.readline()
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
                if limit is not None and len(out) >= limit:
                    return bytes(out)
        length = int(self.headers.get("Content-Length") or 0)
        if limit is not None:
            length = min(length, limit)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None, head: bool = False) -> None:
        self.send_response(status)
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        for k, v in hdrs.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if body and not head:
            self.wfile.write(body)

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers)

    def _error(self, err: _HubError) -> None:
        headers = {"X-Error-Message": err.message.encode("ascii", "replace").decode()}
        if err.code:
            headers["X-Error-Code"] = err.code
        body = json.dumps({"error": err.message, **err.extra}).encode()
        self._send(err.status, body, headers, head=self.command == "HEAD")

    def _dispatch(self) -> None:
        split = urlsplit(self.path)
        self.query = {k: v[-1] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        self.segments = split.path.split("/")[1:]  # raw (still percent-encoded) segments
        self.fake.requests.append((self.command, split.path))
        self.fake.authorizations.append(self.headers.get("Authorization"))
        try:
            self._check_auth()
            self._route()
        except _DropConnection:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        except _HubError as err:
            self._error(err)
        except Exception as err:
            self._error(_HubError(500, f"FakeHub internal error: {type(err).__name__}: {err}"))

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = _dispatch

    def _check_auth(self) -> None:
        expected = self.fake.expected_token
        if expected is None:
            return
        auth = self.headers.get("Authorization")
        if auth is not None and auth != f"Bearer {expected}":
            raise _HubError(401, "Invalid credentials in Authorization header")

    def _repo_from(self, i: int) -> tuple[str, int]:
        """Repo id from raw segments i, i+1; returns (repo_id, next index)."""
        if len(self.segments) < i + 2:
            raise _HubError(404, "Not found")
        return f"{unquote(self.segments[i])}/{unquote(self.segments[i + 1])}", i + 2

    # -------------------------------------------------------------- routing
    def _route(self) -> None:
        s, m = self.segments, self.command
        if s[:1] == ["api"]:
            return self._route_api(s[1:], m)
        # LFS: /{prefix}{ns}/{name}.git/info/lfs/objects/batch
        if m == "POST" and s[-4:] == ["info", "lfs", "objects", "batch"]:
            return self._lfs_batch(s[:-4])
        if s[:2] == ["__lfs__", "upload"] and m == "PUT" and len(s) == 3:
            return self._lfs_put(s[2])
        if s[:2] == ["__lfs__", "verify"] and m == "POST":
            return self._lfs_verify()
        # /{prefix}{ns}/{name}/resolve/{rev}/{path...}
        repo_type, i = "model", 0
        if s and s[0] in REPO_TYPES:
            repo_type, i = REPO_TYPES[s[0]], 1
        if len(s) >= i + 5 and s[i + 2] == "resolve" and m in ("GET", "HEAD"):
            repo_id, _ = self._repo_from(i)
            return self._resolve_file(repo_type, repo_id, unquote(s[i + 3]), unquote("/".join(s[i + 4 :])))
        raise _HubError(404, f"FakeHub: no route for {m} {self.path}")

    def _route_api(self, s: list[str], m: str) -> None:
        hub = self.fake
        if s[:1] == ["collections"]:
            return self._collections(s[1:], m)
        if m == "GET" and len(s) == 5 and s[3] in ("xet-read-token", "xet-write-token") and hub.xet_cas is not None:
            # hf_xet reads the JSON body (its token refresher), huggingface_hub's download the headers
            hub.xet_tokens.append("/".join(s))
            cas, token, exp = f"local://{hub.xet_cas}", "xet-test-token", int(time.time()) + 3600
            return self._json(200, {"casUrl": cas, "accessToken": token, "exp": exp},
                              {"X-Xet-Cas-Url": cas, "X-Xet-Access-Token": token, "X-Xet-Token-Expiration": str(exp)})
        if s == ["validate-yaml"] and m == "POST":
            return self._validate_yaml()
        if s in (["whoami-v2"], ["whoami"]) and m == "GET":
            return self._json(
                200,
                {
                    "type": "user",
                    "name": hub.user,
                    "fullname": "Test User",
                    "orgs": [],
                    "auth": {"type": "access_token", "accessToken": {"role": "write"}},
                },
            )
        if s == ["repos", "create"] and m == "POST":
            return self._create_repo()
        if s == ["repos", "delete"] and m == "DELETE":
            body = json.loads(self._read_body() or b"{}")
            repo_id = f"{body.get('organization') or hub.user}/{body['name']}"
            with hub._lock:
                hub._repo(repo_id, body.get("type") or "model")
                del hub.repos[repo_id]
            return self._json(200, {})
        if not s or s[0] not in REPO_TYPES:
            raise _HubError(404, f"FakeHub: no route for {m} /api/{'/'.join(s)}")
        repo_type = REPO_TYPES[s[0]]
        repo_id, i = self._repo_from_list(s, 1)
        rest = s[i:]
        with hub._lock:
            repo = hub._repo(repo_id, repo_type)
            if not rest and m == "GET":
                return self._repo_info(repo, "main")
            if len(rest) == 2 and rest[0] == "revision" and m == "GET":
                return self._repo_info(repo, unquote(rest[1]))
            if len(rest) >= 2 and rest[0] == "tree" and m == "GET":
                return self._tree(repo, unquote(rest[1]), unquote("/".join(rest[2:])))
            if len(rest) == 2 and rest[0] == "paths-info" and m == "POST":
                return self._paths_info(repo, unquote(rest[1]))
            if rest == ["refs"] and m == "GET":
                return self._refs(repo)
            if len(rest) == 2 and rest[0] == "commits" and m == "GET":
                return self._list_commits(repo, unquote(rest[1]))
            if len(rest) == 2 and rest[0] == "preupload" and m == "POST":
                return self._preupload(repo, unquote(rest[1]))
            if len(rest) == 2 and rest[0] == "commit" and m == "POST":
                return self._commit(repo, unquote(rest[1]))
            if len(rest) == 2 and rest[0] == "tag" and m == "POST":
                return self._create_tag(repo, unquote(rest[1]))
            if len(rest) == 2 and rest[0] == "tag" and m == "DELETE":
                if repo.tags.pop(unquote(rest[1]), None) is None:
                    raise _HubError(404, "Tag not found", "RevisionNotFound")
                return self._json(200, {})
            if len(rest) == 2 and rest[0] == "branch" and m == "POST":
                return self._create_branch(repo, unquote(rest[1]))
            if len(rest) == 2 and rest[0] == "branch" and m == "DELETE":
                if unquote(rest[1]) == "main" or repo.branches.pop(unquote(rest[1]), None) is None:
                    raise _HubError(404 if unquote(rest[1]) != "main" else 403, "Cannot delete branch")
                return self._json(200, {})
        raise _HubError(404, f"FakeHub: no route for {m} /api/{'/'.join(s)}")

    def _repo_from_list(self, s: list[str], i: int) -> tuple[str, int]:
        if len(s) < i + 2:
            raise _HubError(404, "Repository not found", "RepoNotFound")
        return f"{unquote(s[i])}/{unquote(s[i + 1])}", i + 2

    # -------------------------------------------------------------- endpoints
    def _validate_yaml(self) -> None:
        body = json.loads(self._read_body() or b"{}")
        content = body.get("content")
        if not isinstance(content, str):
            return self._json(
                400, {"error": "content must be a string", "errors": [{"message": "content missing"}], "warnings": []}
            )
        try:
            fm = _front_matter(content)
            msg = _validate_yaml_text(fm) if fm is not None else None
        except ValueError as err:
            msg = str(err)
        if msg:
            return self._json(
                400,
                {"error": msg, "errors": [{"message": msg}], "warnings": []},
                {"X-Error-Message": msg.encode("ascii", "replace").decode().replace("\n", " ")},
            )
        return self._json(200, {"errors": [], "warnings": []})

    def _create_repo(self) -> None:
        hub = self.fake
        body = json.loads(self._read_body() or b"{}")
        name, org = body.get("name"), body.get("organization") or hub.user
        repo_type = body.get("type") or "model"
        if not name or repo_type not in URL_PREFIX:
            raise _HubError(400, "Invalid repo name or type")
        repo_id = f"{org}/{name}"
        private = body.get("visibility") == "private" or bool(body.get("private"))
        url = f"{hub.url}/{URL_PREFIX[repo_type]}{repo_id}"
        with hub._lock:
            if repo_id in hub.repos:
                raise _HubError(409, f"You already created this {repo_type} repo", extra={"url": url})
            hub._create_repo(repo_id, repo_type, private)
        self._json(200, {"url": url, "name": repo_id, "id": hashlib.sha1(repo_id.encode()).hexdigest()[:24]})

    def _entry_json(self, repo: Repo, head: str, path: str, e: TreeEntry | None, expand: bool) -> dict[str, Any]:
        tree = repo.commits[head].tree
        if e is None:
            d: dict[str, Any] = {"type": "directory", "oid": _folder_oid(tree, path), "size": 0, "path": path}
        else:
            d = {"type": "file", "oid": e.blob_id, "size": e.size, "path": path}
            if e.lfs_sha256:
                d["lfs"] = {"oid": e.lfs_sha256, "size": e.size, "pointerSize": e.pointer_size}
                if e.lfs_sha256 in self.fake.xet_hashes:
                    d["xetHash"] = "*" * 64 if self.fake.mask_xet else self.fake.xet_hashes[e.lfs_sha256]
        if expand:
            c = self.fake._last_commit_touching(repo, head, path, e is None)
            d["lastCommit"] = {"id": c.id, "title": c.title, "date": c.date}
            if e is not None:
                d["securityFileStatus"] = {
                    "status": "safe",
                    "avScan": {"virusFound": False, "virusNames": None},
                    "pickleImportScan": None,
                }
        return d

    def _repo_info(self, repo: Repo, revision: str) -> None:
        hub = self.fake
        head = hub._resolve(repo, revision)
        c = repo.commits[head]
        blobs = _truthy(self.query.get("blobs"))
        siblings = []
        for p, e in sorted(c.tree.items()):
            sib: dict[str, Any] = {"rfilename": p}
            if blobs:
                sib.update(size=e.size, blobId=e.blob_id)
                if e.lfs_sha256:
                    sib["lfs"] = {"size": e.size, "sha256": e.lfs_sha256, "pointerSize": e.pointer_size}
            siblings.append(sib)
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": head,
            "lastModified": c.date,
            "createdAt": repo.created_at,
            "private": repo.private,
            "gated": False,
            "disabled": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
        }
        if repo.repo_type == "model":
            info["modelId"] = repo.repo_id
        self._json(200, info)

    def _tree(self, repo: Repo, revision: str, path: str) -> None:
        hub = self.fake
        head = hub._resolve(repo, revision)
        tree = repo.commits[head].tree
        path = path.strip("/")
        recursive, expand = _truthy(self.query.get("recursive")), _truthy(self.query.get("expand"))
        folders = _folders(tree)
        if path and path not in folders:
            if path in tree:
                raise _HubError(400, f"{path} is a file, not a folder")
            raise _HubError(404, f"Entry not found: {path}", "EntryNotFound")
        prefix = path + "/" if path else ""
        out = []
        for f in sorted(folders):
            if f.startswith(prefix) and (recursive or "/" not in f[len(prefix) :]):
                out.append(self._entry_json(repo, head, f, None, expand))
        for p, e in sorted(tree.items()):
            if p.startswith(prefix) and (recursive or "/" not in p[len(prefix) :]):
                out.append(self._entry_json(repo, head, p, e, expand))
        self._json(200, out)

    def _paths_info(self, repo: Repo, revision: str) -> None:
        hub = self.fake
        raw = self._read_body()
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            body = json.loads(raw or b"{}")
            paths, expand = body.get("paths", []), bool(body.get("expand"))
            paths = [paths] if isinstance(paths, str) else paths
        else:
            form = parse_qs(raw.decode(), keep_blank_values=True)
            paths, expand = form.get("paths", []), _truthy((form.get("expand") or ["false"])[-1])
        head = hub._resolve(repo, revision)
        tree = repo.commits[head].tree
        folders = _folders(tree)
        out = []
        for p in paths:
            p = p.strip("/")
            if p in tree:
                out.append(self._entry_json(repo, head, p, tree[p], expand))
            elif p in folders:
                out.append(self._entry_json(repo, head, p, None, expand))
        self._json(200, out)

    def _refs(self, repo: Repo) -> None:
        def ref(name: str, kind: str, target: str) -> dict[str, str]:
            return {"name": name, "ref": f"refs/{kind}/{name}", "targetCommit": target}

        data: dict[str, Any] = {
            "branches": [ref(n, "heads", c) for n, c in sorted(repo.branches.items())],
            "tags": [ref(n, "tags", c) for n, c in sorted(repo.tags.items())],
            "converts": [],
        }
        if _truthy(self.query.get("include_prs")):
            data["pullRequests"] = [
                {"name": pr["ref"], "ref": pr["ref"], "targetCommit": pr["head"]} for pr in repo.prs
            ]
        self._json(200, data)

    def _list_commits(self, repo: Repo, revision: str) -> None:
        self._json(200, [{"id": c.id, "title": c.title, "message": c.message, "date": c.date,
                          "authors": [{"user": self.fake.user}]} for c in self.fake._history(repo, revision)])

    def _preupload(self, repo: Repo, revision: str) -> None:
        hub = self.fake
        body = json.loads(self._read_body() or b"{}")
        try:
            tree = repo.commits[hub._resolve(repo, revision)].tree
        except _HubError:
            tree = {}
        files = []
        for f in body.get("files", []):
            path, size = f["path"], int(f.get("size", 0))
            lfs = size >= LFS_THRESHOLD or path.lower().endswith(hub.lfs_suffixes)
            existing = tree.get(path)
            oid = None
            if existing is not None:
                oid = existing.lfs_sha256 if existing.lfs_sha256 else existing.blob_id
            files.append({"path": path, "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False, "oid": oid})
        self._json(200, {"files": files})

    def _commit(self, repo: Repo, revision: str) -> None:
        hub = self.fake
        raw = self._read_body()
        header: dict[str, Any] | None = None
        ops: list[tuple[str, dict[str, Any]]] = []
        for line in raw.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            if item.get("key") == "header":
                header = item.get("value", {})
            else:
                ops.append((item.get("key"), item.get("value", {})))
        if header is None:
            raise _HubError(400, "Missing commit header")
        summary = header.get("summary") or ""
        if not summary:
            raise _HubError(400, "Commit summary is required")
        create_pr = _truthy(self.query.get("create_pr"))
        parent = header.get("parentCommit")
        with hub._lock:
            failure = hub.fail_next_commits.pop(0) if hub.fail_next_commits else None
        if isinstance(failure, int):
            raise _HubError(failure, "commit refused (FakeHub.fail_next_commits)")
        new, pr = hub._apply_commit(repo, revision, summary, header.get("description") or "", ops, parent, create_pr)
        if failure == "drop after":
            raise _DropConnection()
        prefix = f"{hub.url}/{URL_PREFIX[repo.repo_type]}{repo.repo_id}"
        resp: dict[str, Any] = {
            "success": True,
            "commitOid": new,
            "commitUrl": f"{prefix}/commit/{new}",
            "hookOutput": "",
        }
        if pr is not None:
            resp["pullRequestUrl"] = f"{prefix}/discussions/{pr['num']}"
            resp["pullRequestRevision"] = pr["ref"]
        self._json(200, resp)

    def _create_tag(self, repo: Repo, revision: str) -> None:
        body = json.loads(self._read_body() or b"{}")
        tag = body.get("tag")
        if not tag:
            raise _HubError(400, "Missing tag name")
        target = self.fake._resolve(repo, revision)
        if tag in repo.tags:
            raise _HubError(409, f"Tag {tag} already exists")
        repo.tags[tag] = target
        repo.tag_messages[tag] = body.get("message")
        self._json(200, {})

    def _create_branch(self, repo: Repo, branch: str) -> None:
        body = json.loads(self._read_body() or b"{}")
        target = self.fake._resolve(repo, body.get("startingPoint") or "main")
        if branch in repo.branches:
            raise _HubError(409, f"Branch {branch} already exists")
        if body.get("emptyBranch"):
            target = self.fake._new_commit(repo, None, "initial commit", "", {})
        repo.branches[branch] = target
        self._json(200, {})

    # -------------------------------------------------------------- LFS
    def _lfs_batch(self, prefix_segments: list[str]) -> None:
        hub = self.fake
        s = prefix_segments
        repo_type = "model"
        if s and s[0] in REPO_TYPES:
            repo_type, s = REPO_TYPES[s[0]], s[1:]
        if len(s) != 2 or not s[1].endswith(".git"):
            raise _HubError(404, "Not found")
        repo_id = f"{unquote(s[0])}/{unquote(s[1][:-4])}"
        body = json.loads(self._read_body() or b"{}")
        with hub._lock:
            hub._repo(repo_id, repo_type)
            if body.get("operation") != "upload":
                raise _HubError(400, "FakeHub only supports the upload operation")
            objects = []
            for obj in body.get("objects", []):
                oid, size = obj["oid"], int(obj["size"])
                entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
                if oid not in hub.lfs_objects:
                    entry["actions"] = {
                        "upload": {"href": f"{hub.url}/__lfs__/upload/{oid}?size={size}", "header": {}},
                        "verify": {"href": f"{hub.url}/__lfs__/verify", "header": {}},
                    }
                objects.append(entry)
        self._json(
            200,
            {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
            {"Content-Type": "application/vnd.git-lfs+json"},
        )

    def _lfs_put(self, oid: str) -> None:
        hub = self.fake
        with hub._lock:
            drop = hub.fail_next_lfs_upload > 0
            if drop:
                hub.fail_next_lfs_upload -= 1
                hub.dropped_lfs_uploads += 1
        if drop:
            expected = int(self.headers.get("Content-Length") or self.query.get("size") or 2)
            self._read_body(limit=max(1, expected // 2))
            raise _DropConnection()
        data = self._read_body()
        if hashlib.sha256(data).hexdigest() != oid:
            raise _HubError(400, f"sha256 mismatch for LFS object {oid} ({len(data)} bytes received)")
        if "size" in self.query and int(self.query["size"]) != len(data):
            raise _HubError(400, f"size mismatch for LFS object {oid}")
        with hub._lock:
            hub.lfs_objects[oid] = data if hub.store_lfs is None else hub.store_lfs(data)
            hub.lfs_uploads.append(oid)
        self._send(200, b"", {"Content-Type": "text/plain", "ETag": f'"{oid}"'})

    def _lfs_verify(self) -> None:
        body = json.loads(self._read_body() or b"{}")
        data = self.fake.lfs_objects.get(body.get("oid", ""))
        if data is None or len(data) != int(body.get("size", -1)):
            raise _HubError(404, f"LFS object {body.get('oid')} not found")
        self._json(200, {"success": True})

    # -------------------------------------------------------------- collections
    def _collections(self, s: list[str], m: str) -> None:
        """The Hub's collection endpoints as huggingface_hub 2.4 calls them (``list_collections``, ``get_collection``,
        ``create_collection``, ``update_collection_metadata``, ``add_collection_item``, ``update_collection_item``)."""
        hub = self.fake
        body = json.loads(self._read_body() or b"{}") if m in ("POST", "PATCH") else {}  # read whole: keep-alive
        if m in ("POST", "PATCH") and hub.refuse_collection_writes is not None:
            raise _HubError(hub.refuse_collection_writes, "You don't have the rights to edit this collection")
        with hub._lock:
            if not s and m == "GET":
                owner = self.query.get("owner")
                return self._json(200, [{k: v for k, v in c.items() if k != "position"}
                                        for c in hub.collections.values() if owner in (None, c["owner"]["name"])])
            if not s and m == "POST":
                hub._seq += 1
                slug = f"{body['namespace']}/{re.sub(r'[^a-z0-9]+', '-', body['title'].lower()).strip('-')}-" \
                       f"{hub._seq:024x}"
                hub.collections[slug] = {
                    "slug": slug, "title": body["title"], "description": body.get("description"),
                    "owner": {"name": body["namespace"], "type": "org"}, "items": [], "position": 0,
                    "private": bool(body.get("private")), "theme": "default", "upvotes": 0,
                    "lastUpdated": "2024-01-01T00:00:00.000Z"}
                return self._json(200, hub.collections[slug])
            slug = "/".join(unquote(x) for x in s[:2])
            c = hub.collections.get(slug)
            if c is None:
                raise _HubError(404, f"Collection {slug} not found")
            rest = s[2:]
            if not rest and m == "GET":
                return self._json(200, c)
            if not rest and m == "PATCH":
                c.update({k: v for k, v in body.items() if k in ("title", "description", "private", "theme")})
                return self._json(200, {"data": c})
            if rest == ["items"] and m == "POST":
                item = body["item"]
                if any(i["id"] == item["id"] and i["type"] == item["type"] for i in c["items"]):
                    raise _HubError(409, "Item already in the collection")
                hub._seq += 1
                c["items"].append({"_id": f"{hub._seq:024x}", "id": item["id"], "type": item["type"],
                                   "position": len(c["items"]),
                                   **({"note": {"text": body["note"]}} if body.get("note") else {})})
                return self._json(200, c)
            if len(rest) == 2 and rest[0] == "items" and m == "PATCH":
                item = next((i for i in c["items"] if i["_id"] == rest[1]), None)
                if item is None:
                    raise _HubError(404, f"Item {rest[1]} not found")
                if "note" in body:
                    item["note"] = {"text": body["note"]}
                if "position" in body:
                    c["items"].remove(item)
                    c["items"].insert(int(body["position"]), item)
                    for i, x in enumerate(c["items"]):
                        x["position"] = i
                return self._json(200, {"success": True})
        raise _HubError(404, f"FakeHub: no route for {m} {self.path}")

    # -------------------------------------------------------------- downloads
    def _resolve_file(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        hub = self.fake
        with hub._lock:
            repo = hub._repo(repo_id, repo_type)
            head = hub._resolve(repo, revision)
            e = repo.commits[head].tree.get(path)
            if e is None:
                raise _HubError(404, f"Entry not found: {path}", "EntryNotFound", extra={})
            data = hub._content(e)
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": head,
            "ETag": f'"{e.lfs_sha256 or e.blob_id}"',
            "Accept-Ranges": "bytes",
        }
        if e.lfs_sha256:
            headers["X-Linked-Etag"] = f'"{e.lfs_sha256}"'
            headers["X-Linked-Size"] = str(e.size)
            if e.lfs_sha256 in hub.xet_hashes:  # huggingface_hub then downloads through hf_xet (xet_get)
                headers["X-Xet-Hash"] = hub.xet_hashes[e.lfs_sha256]
                headers["X-Xet-Refresh-Route"] = f"{hub.url}/api/{URL_PREFIX[repo_type] or 'models/'}{repo_id}" \
                                                 f"/xet-read-token/{head}"
        status = 200
        rng = self.headers.get("Range")
        m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip()) if rng else None
        if m and (m[1] or m[2]):
            start = int(m[1]) if m[1] else max(0, len(data) - int(m[2]))
            end = int(m[2]) if (m[1] and m[2]) else len(data) - 1
            if start >= len(data) and len(data) > 0:
                headers["Content-Range"] = f"bytes */{len(data)}"
                return self._send(416, b"", headers, head=self.command == "HEAD")
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            data, status = data[start : end + 1], 206
        self._send(status, data, headers, head=self.command == "HEAD")


def hub_url_for(hub: FakeHub, repo_id: str, path: str, revision: str = "main", repo_type: str = "model") -> str:
    """URL of a file on the double, as ``hf_hub_url`` would build it."""
    return f"{hub.url}/{URL_PREFIX[repo_type]}{repo_id}/resolve/{quote(revision, safe='')}/{quote(path)}"


def xet_shard_files(cas: Path) -> dict[str, tuple[str, int]]:
    """sha256 -> (Xet hash, size) of every file in a local Xet store's shards (xet-core's MDB shard format,
    ``xet_core_structures/src/metadata_shard``: a footer pointing at the file records; each record a 48-byte header
    (file hash, flags, entry count), its entries, verification entries when flagged, and the sha256 extension when
    flagged). A hash prints as its four little-endian u64 words in hex."""
    import struct

    def hexed(b: bytes) -> str:
        return "".join(f"{u:016x}" for u in struct.unpack("<4Q", b))

    out = {}
    for path in sorted((cas / "xet" / "xorbs" / "shards").glob("*.mdb")):
        data = path.read_bytes()
        footer = len(data) - struct.unpack_from("<Q", data, 40)[0]
        off = struct.unpack_from("<QQ", data, footer)[1]
        while data[off:off + 32] != b"\xff" * 32:
            file_hash, (flags, n) = data[off:off + 32], struct.unpack_from("<II", data, off + 32)
            off += 48
            size = sum(struct.unpack_from("<I", data, off + i * 48 + 36)[0] for i in range(n))
            off += 48 * n * (2 if flags & (1 << 31) else 1)
            if flags & (1 << 30):
                out[hexed(data[off:off + 32])] = (hexed(file_hash), size)
                off += 48
    return out
