"""``release push``: publish sibling repos through huggingface_hub, planned read-only first.

Every file of a build is hashed once (cached by path and inode status): the hashes are compared with the manifest
of its verification report, and the secret scan runs over the same bytes. The plan compares every local file with the
remote without uploading: the sha256 of LFS files with the remote's ``lfs.sha256``, the git blob sha1 of small files
with the remote ``blob_id``. ``--dry-run`` prints it (the pull-request preview); a push makes one commit per repo on
the head seen at plan time (``parent_commit``), checks the remote against the hashes the plan approved, and then
tags the release ``v<version>`` (the release's version in ``builds/release.yaml``). Each commit's description is the
release's notes, the section of ``builds/RELEASES.md`` for that version. ``--target DIR`` publishes to a folder
instead, under a lock.
"""

from __future__ import annotations

import difflib
import fnmatch
import hashlib
import json
import os
import re
import struct
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from release import GateError, ReleaseError, __version__
from release.config import (
    RELEASE_NOTES,
    BuildConfig,
    ReleaseConfig,
    builds_dir,
    hub_name,
    load_build,
    load_release,
    release_notes,
)
from release.io import atomic_dir, atomic_write, exclusive_lock, output_folder, write_json
from release.verify import (
    CARD_FILES,
    REPORT_JSON,
    Report,
    after_verification,
    build_files,
    gate,
    load_report,
    matches,
)

if TYPE_CHECKING:
    from release.manifest import Lock

# The Hub stores files of this size or larger, and every binary checkpoint file, through LFS.
LFS_THRESHOLD = 10 * 1024 * 1024
LFS_SUFFIXES = (".safetensors", ".pth", ".bin", ".png", ".npz")
SECRET_NAMES = (".env", "*.pem", "*.key", "id_rsa*", "id_ed25519*", ".netrc", "*credentials*", "*.token",
                ".huggingface/*", "token")
# One compiled pattern over whole chunks; minimal matches are at most 67 bytes long. No capturing groups: with them
# the regex engine loses its first-character prefilter and runs 10 times slower (bench/secret_scan.py).
SECRETS = re.compile(rb"hf_[A-Za-z0-9]{30,}|gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}"
                     rb"|(?:AKIA|ASIA)[0-9A-Z]{16}|-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----")
# kind by the match's start, and how much of the match is public (its prefix; a key's header line is not secret)
SECRET_KINDS = (("hf_", "Hugging Face token", 3), ("github_pat_", "GitHub token", 11), ("gh", "GitHub token", 4),
                ("AKIA", "AWS access key id", 4), ("ASIA", "AWS access key id", 4), ("-----", "private key", 0))
SCAN_VERSION = 3  # bump when SECRETS changes: cached scan results of older versions are redone
CHUNK = 1 << 24
OVERLAP = 256
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TEXT_LIMIT = 64 << 20  # a compressed PNG text chunk that inflates beyond this is refused, not scanned
CACHE_ENV = "RELEASE_CACHE"
LOCK_NAME = ".release-push.lock"
MAIN = "main"
COMMENT_LIMIT = 65_536  # GitHub's limit on the body of a comment, in characters
COMMENT_BUDGET = COMMENT_LIMIT - 1_024  # what --preview's comment.md may use: the rest is the posting job's link
COMMENT_MARKER = "<!-- release-push-preview -->"  # the posting job updates the comment that starts with it
# a branch name git and the Hub accept: no '..', '//', '@{', leading '-' or '/', trailing '/' or '.lock'
BRANCH = re.compile(r"(?!-|/|refs/)(?!.*(\.\.|//|@\{|/$|\.lock$|/\.))[A-Za-z0-9._/-]{1,200}")
Action = Literal["add", "modify", "delete", "unchanged"]
TagAction = Literal["create", "move", "unchanged", "none"]


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
    retag: bool = False
    reports: dict[str, tuple[Report, str] | None] = field(default_factory=dict)  # by build name
    notes: str | None = None  # the commit description: the release notes (none for a folder target)
    private: bool = False  # new repos are created private
    commit_message: str | None = None  # the summary line of every commit, instead of the default
    revision: str = MAIN  # the branch pushed to (created from main's head when missing)
    lock: Lock | None = None  # --from-manifest: the files and sidecars of a real build, planned without weights
    lock_path: Path | None = None
    preview: Path | None = None  # --preview DIR: the pull-request comment, the full plan and the cards

    @property
    def tag(self) -> str:
        return f"v{self.release.version}"

    @classmethod
    def create(cls, names: tuple[str, ...], org: str | None, dist: Path, dry_run: bool, endpoint: str | None = None,
               create_pr: bool = False, fmt: str = "markdown", force: str | None = None,
               target: Path | None = None, retag: bool = False, private: bool = False,
               commit_message: str | None = None, revision: str = MAIN,
               manifest: Path | None = None, preview: Path | None = None) -> PushRequest:
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
            output_folder(preview, "--preview")
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
            from release.manifest import load_lock, locked_builds  # release.manifest imports this module

            lock = load_lock(manifest)
            release, builds, reports = locked_builds(lock, manifest, names, force)
        notes = release_notes(release.version) if target is None else None
        return cls(release, builds, org or release.org, dist, dry_run, endpoint, create_pr, fmt,  # type: ignore[arg-type]
                   force, target, retag, reports, notes, private, commit_message, revision, lock, manifest,
                   preview)


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


def verified_builds(names: tuple[str, ...], dist: Path, force: str | None,
                    command: str) -> tuple[ReleaseConfig, list[BuildConfig], Reports]:
    """The named builds (default: the siblings of release.yaml built in ``dist``), each deliverable, with its
    verification report, past the gate (unless ``force``; ``command`` is named in the refusal) and with its
    card."""
    release = load_release()
    wanted = list(names) or [s.build for s in release.siblings if (dist / load_build(s.build).repo).is_dir()]
    if not wanted:
        raise ReleaseError(f"{dist}: no built repos to push; run 'release build NAME' first")
    builds = [load_build(n) for n in wanted]
    refuse_undeliverable(builds)
    reports: Reports = {}
    for b in builds:
        folder = dist / b.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {b.name}' first")
        verified = reports[b.name] = load_report(folder, b.name)
        gate_or_force(b.repo, verified, force, command)
        for name in ("README.md", "LICENSE"):
            if not (folder / name).is_file():
                raise ReleaseError(f"{folder / name}: missing; a repo is published with its card and license: "
                                   f"run 'release card {b.name}' first")
    return release, builds, reports


class _Scanner:
    """Searches SECRETS in a stream of chunks. The last OVERLAP bytes of each chunk are searched again together with
    the start of the next one, so a token across a chunk boundary is found."""

    def __init__(self) -> None:
        self.tail = b""
        self.offset = 0
        self.found: dict[str, Any] | None = None

    def feed(self, chunk: bytes) -> None:
        if self.found is None:
            for base, text in ((self.offset - len(self.tail), self.tail + chunk[:OVERLAP]), (self.offset, chunk)):
                if m := SECRETS.search(text):
                    self.found = _finding(m, f"at byte {base + m.start()}")
                    break
            self.tail = chunk[-OVERLAP:]
        self.offset += len(chunk)


def _finding(m: re.Match[bytes], where: str) -> dict[str, Any]:
    """The kind of a match and a redacted form of it (its public prefix, never the secret part)."""
    text = m.group().decode("ascii")
    kind, public = next((k, n or len(text)) for prefix, k, n in SECRET_KINDS if text.startswith(prefix))
    return {"kind": kind, "shown": text[:public] + ("…" if public < len(text) else ""), "where": where}


class HashCache:
    """sha256 / git blob sha1 of local files and their secret scan, cached in a JSON file.

    An entry is reused only while the file's size, mtime, ctime, inode and device are unchanged. ctime cannot be
    set back by a user (``os.utime`` restores mtime, and itself moves ctime), so bytes flipped in place are hashed
    again; mtime alone would not notice.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.entries: dict[str, dict[str, Any]] = json.loads(path.read_text()) if path.is_file() else {}
        except ValueError:  # a damaged cache is only a cache: start afresh
            self.entries = {}
        self.hashed_bytes = 0

    def _hash(self, file: Path, scan: bool) -> dict[str, Any]:
        st = file.stat()
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_dev]
        hit = self.entries.get(str(file.resolve()))
        if hit and hit.get("stamp") == stamp and (not scan or hit.get("scan") == SCAN_VERSION):
            return hit
        # sha256 for LFS comparisons; the git blob sha1 only where a file can be stored in git (small files)
        h = hashlib.sha256()
        blob = hashlib.sha1(b"blob %d\0" % st.st_size) if st.st_size < LFS_THRESHOLD else None
        scanner = _Scanner() if scan else None
        read = 0
        with file.open("rb") as f:
            while chunk := f.read(CHUNK):
                read += len(chunk)
                h.update(chunk)
                if blob is not None:
                    blob.update(chunk)
                if scanner is not None:
                    scanner.feed(chunk)
        if read != st.st_size:
            raise ReleaseError(f"{file}: changed size while it was read; run 'release push' again")
        self.hashed_bytes += read
        entry = {"stamp": stamp, "size": st.st_size, "sha256": h.hexdigest(),
                 "sha1": blob.hexdigest() if blob is not None else None}
        if scanner is not None:
            entry.update(scan=SCAN_VERSION, secret=scanner.found)
        return entry

    def hash_all(self, files: list[Path], scan: bool = False, workers: int | None = None) -> dict[Path, dict[str, Any]]:
        """Hash (and with ``scan`` search for secrets) in parallel: hashlib releases the GIL on large buffers."""
        with ThreadPoolExecutor(max_workers=workers or min(8, os.cpu_count() or 1)) as pool:
            results = dict(zip(files, pool.map(lambda f: self._hash(f, scan), files), strict=True))
        for file, entry in results.items():
            self.entries[str(file.resolve())] = entry
        return results

    def save(self) -> None:
        write_json(self.path, self.entries)


def _json_secret(value: Any, where: str) -> tuple[re.Match[bytes], str] | None:
    """The first secret in the decoded strings (keys and values) of a JSON document, with its path."""
    stack = [(value, where)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            if m := SECRETS.search(item.encode("utf-8", "replace")):
                return m, path
        elif isinstance(item, dict):
            for key, sub in item.items():
                stack += [(key, f"{path} (a key)"), (sub, f"{path}.{key}")]
        elif isinstance(item, list):
            stack += [(sub, f"{path}[{i}]") for i, sub in enumerate(item)]
    return None


def _inflate(data: bytes, what: str) -> bytes:
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(data, TEXT_LIMIT)
    except zlib.error as exc:
        raise ReleaseError(f"{what} is not valid zlib data, so it cannot be checked for secrets; remove it") from exc
    if inflater.unconsumed_tail:
        raise ReleaseError(f"{what} inflates to more than {TEXT_LIMIT >> 20} MiB; remove it")
    return text


def _png_secret(path: Path) -> tuple[re.Match[bytes], str] | None:
    """Text chunks of a PNG: tEXt as it is, zTXt and compressed iTXt inflated."""
    with path.open("rb") as f:
        f.seek(len(PNG_MAGIC))
        while len(header := f.read(8)) == 8:
            length, kind = struct.unpack(">I4s", header)
            if kind not in (b"tEXt", b"zTXt", b"iTXt"):
                f.seek(length + 4, os.SEEK_CUR)
                continue
            keyword, _, rest = f.read(length).partition(b"\0")
            f.seek(4, os.SEEK_CUR)  # CRC
            where = f"in PNG chunk {kind.decode()} '{keyword.decode('latin-1')}'"
            if kind == b"zTXt":
                rest = _inflate(rest[1:], f"{path}: PNG chunk zTXt '{keyword.decode('latin-1')}'")
            elif kind == b"iTXt":
                compressed, text = rest[:1] == b"\1", rest[2:].split(b"\0", 2)[-1]
                rest = _inflate(text, f"{path}: PNG chunk iTXt '{keyword.decode('latin-1')}'") if compressed \
                    else text
            if m := SECRETS.search(keyword) or SECRETS.search(rest):
                return m, where
    return None


def _structured_secret(path: Path) -> dict[str, Any] | None:
    """Secrets the byte scan cannot see or place: PNG text chunks (compressed ones inflated), the decoded strings of
    JSON files and of a safetensors header (``__metadata__``), with where they are."""
    found: tuple[re.Match[bytes], str] | None = None
    with path.open("rb") as f:
        head = f.read(8)
        if head == PNG_MAGIC:
            found = _png_secret(path)
        elif path.suffix in (".safetensors", ".json"):
            try:
                if path.suffix == ".safetensors":
                    (n,) = struct.unpack("<Q", head) if len(head) == 8 else (0,)
                    doc = json.loads(f.read(n)) if 0 < n <= 100_000_000 else None
                else:
                    doc = json.loads(head + f.read())
            except ValueError:  # not JSON: verification judges the file, the byte scan has read it
                doc = None
            where = "in the safetensors header at $" if path.suffix == ".safetensors" else "in JSON at $"
            found = _json_secret(doc, where) if doc is not None else None
    return _finding(*found) if found else None


def text_secret(data: bytes, json_text: bool) -> dict[str, Any] | None:
    """A secret in a small text held in memory (a sidecar of a release manifest): in its decoded JSON strings
    (``json_text``), else in its bytes."""
    if json_text:
        try:
            found = _json_secret(json.loads(data), "in JSON at $")
        except ValueError:
            found = None
        if found:
            return _finding(*found)
    m = SECRETS.search(data)
    return _finding(m, f"at byte {m.start()}") if m else None


def secret_name(rel: str) -> bool:
    return any(fnmatch.fnmatch(rel.split("/")[-1], p) or fnmatch.fnmatch(rel, p) for p in SECRET_NAMES)


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
        found = _structured_secret(root / rel) or local[rel]["secret"]
        if found:
            raise ReleaseError(f"{root / rel}: contains what looks like a {found['kind']} ({found['shown']}, "
                               f"{found['where']}); remove it from the build folder")
    return local


def checked_files(folder: Path, build: str, verified: tuple[Report, str] | None,
                  cache: HashCache) -> dict[str, dict[str, Any]]:
    """Every file of a build folder with its hashes, after the checks a push needs.

    No links or special files, no secrets (``scanned``: a secret is named first, it must go whatever else is
    wrong); and with a verification report, exactly its manifest's bytes plus the cards and results.
    """
    local = scanned(folder, build_files(folder), cache)
    if verified is not None:
        check_verified(build, verified, local, lambda rel: str(folder / rel),
                       f"rerun 'release verify {build}' (and 'release card {build}')")
    return local


def is_lfs(path: str, size: int) -> bool:
    return size >= LFS_THRESHOLD or path.endswith(LFS_SUFFIXES)


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


@dataclass(frozen=True)
class RemoteState:
    head: str | None  # None: no such repo
    files: dict[str, tuple[int, str, bool]]  # path: (size, sha256 if LFS else git blob sha1, is LFS)
    tags: dict[str, str]  # tag: commit
    branch_exists: bool = True
    private: bool | None = None


class HubRemote:
    """A repo on the Hub (or a server speaking its API), read through huggingface_hub."""

    def __init__(self, endpoint: str | None) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # the plan and the result lines are the output
        self.api = HfApi(endpoint=endpoint, token=os.environ.get("HF_TOKEN") or None)

    def state(self, repo_id: str, revision: str = MAIN) -> RemoteState:
        """The repo at the head of ``revision``; a branch that does not exist yet is read at main's head (where the
        push creates it)."""
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        try:
            info = self.api.repo_info(repo_id)
            refs = self.api.list_repo_refs(repo_id)
            branches = {b.name: b.target_commit for b in refs.branches}
            head = branches.get(revision, info.sha)
            tree = list(self.api.list_repo_tree(repo_id, recursive=True, revision=head))
        except (RepositoryNotFoundError, RevisionNotFoundError):
            return RemoteState(None, {}, {}, revision == MAIN)
        except Exception as exc:  # offline mode, DNS, refused connection: say where and stop
            raise ReleaseError(f"cannot read {repo_id} from {self.api.endpoint}: {type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''}; check --endpoint and the "
                               "network, or plan against a folder with --target DIR") from exc
        from huggingface_hub.hf_api import RepoFile

        files = {}
        for entry in tree:
            if isinstance(entry, RepoFile):
                files[entry.path] = (entry.size, entry.lfs.sha256 if entry.lfs else entry.blob_id, bool(entry.lfs))
        return RemoteState(head, files, {t.name: t.target_commit for t in refs.tags}, revision in branches,
                           info.private)

    def read(self, repo_id: str, path: str, revision: str) -> str:
        local = self.api.hf_hub_download(repo_id, path, revision=revision)
        return Path(local).read_text(encoding="utf-8", errors="replace")


class FolderRemote:
    """A local folder standing in for the Hub (``--target``: air-gapped staging); it has no tags."""

    def __init__(self, root: Path, cache: HashCache) -> None:
        self.root, self.cache = root, cache

    def folder(self, repo_id: str) -> Path:
        """``root/ORG/REPO``, refused if it resolves outside the root (an org or repo folder that is a link)."""
        dest = self.root / repo_id
        if not dest.resolve().is_relative_to(self.root.resolve()):
            raise ReleaseError(f"{dest}: resolves to {dest.resolve()}, outside the target {self.root}; remove the "
                               "link, or choose another --target")
        return dest

    def state(self, repo_id: str, revision: str = MAIN) -> RemoteState:
        folder = self.folder(repo_id)
        if not folder.is_dir():
            return RemoteState(None, {}, {})
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        hashes = self.cache.hash_all(files)
        out = {}
        for p in files:
            rel = p.relative_to(folder).as_posix()
            h = hashes[p]
            lfs = is_lfs(rel, h["size"])
            out[rel] = (h["size"], h["sha256"] if lfs else h["sha1"], lfs)
        head = hashlib.sha1(json.dumps(sorted(out.items())).encode()).hexdigest()
        return RemoteState(head, out, {})

    def read(self, repo_id: str, path: str, revision: str) -> str:
        return (self.folder(repo_id) / path).read_text(encoding="utf-8", errors="replace")


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
        action: Action = "add" if remote_entry is None else "unchanged" if mine == theirs else "modify"
        plan.files.append(FilePlan(rel, action, h["size"], "lfs" if lfs else "git", mine, theirs))
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
    try:
        revision = json.loads(prov.read_text())["source"]["revision"] if prov.is_file() else "unknown"
    except (ValueError, KeyError, TypeError) as exc:
        raise ReleaseError(f"{prov}: no source revision ({type(exc).__name__}); rerun 'release build "
                           f"{build.name}'") from exc
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


def _human(n: int) -> str:
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


def _status(p: RepoPlan, request: PushRequest) -> str:
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


def _remote(request: PushRequest) -> str:
    return f"`{request.target}`" if request.target else f"`{request.endpoint or 'https://huggingface.co'}`"


def render_plan(plans: list[RepoPlan], request: PushRequest, fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"org": request.org, "dry_run": request.dry_run, "version": request.release.version,
                           "tool": __version__, "description": request.notes, "repos": [asdict(p) for p in plans]},
                          indent=2)
    lines = [f"# Release plan: release {request.release.version} to {_remote(request)} (`release` {__version__})", ""]
    if request.notes is not None:
        lines += [f"<details><summary>Commit description: the release notes of {request.release.version} "
                  f"({builds_dir() / RELEASE_NOTES})</summary>", "", request.notes, "", "</details>", ""]
    for p in plans:
        counts = {a: sum(1 for f in p.files if f.action == a) for a in ("add", "modify", "delete", "unchanged")}
        upload = sum(f.size for f in p.files if f.action in ("add", "modify"))
        lines += [f"## {p.repo_id} ({p.build}): {_status(p, request)}", "",
                  f"{counts['add']} to add, {counts['modify']} to modify, {counts['delete']} to delete, "
                  f"{counts['unchanged']} unchanged; {_human(upload)} to upload.", ""]
        if not p.changes:
            lines += ["No changes: nothing will be uploaded.", ""]
        else:
            lines += [f"Commit message: `{p.commit_message}`" + (f" on parent `{p.head[:12]}`" if p.head else ""),
                      "", "| file | action | size | storage |", "|---|---|---:|---|"]
            lines += [f"| `{f.path}` | {f.action} | {_human(f.size)} | {f.storage} |" for f in p.changes]
            lines.append("")
        if p.tag_action != "none":
            lines += [_tag_line(p), ""]
        elif p.revision != MAIN:
            lines += [f"No tag: the release tag `{p.tag}` is made on main only.", ""]
        if p.readme_diff:
            lines += ["<details><summary>README.md diff</summary>", "", "```diff", p.readme_diff, "```", "",
                      "</details>", ""]
    return "\n".join(lines)


def _units(text: str) -> int:
    """The length of ``text`` as JavaScript and GitHub count it (UTF-16 code units: at least its characters)."""
    return len(text.encode("utf-16-le")) // 2


def _take(text: str, items: list[str], room: int) -> tuple[str, int]:
    """``text`` with as many of ``items`` appended, each on a line, as fit in ``room``; and how many did not."""
    for i, item in enumerate(items):
        if _units(text) + 1 + _units(item) > room:
            return text, len(items) - i
        text += "\n" + item
    return text, 0


def _diff_stat(diff: str) -> str:
    lines = diff.splitlines()[2:]  # after the ---/+++ header
    return f"README.md +{sum(1 for x in lines if x.startswith('+'))} -{sum(1 for x in lines if x.startswith('-'))}"


def _details(p: RepoPlan) -> str:
    """One repo's changes, collapsed: the commit and the changed files (the README diff is in the full plan)."""
    counts = ", ".join(f"{n} to {a}" for a in ("add", "modify", "delete")
                       if (n := sum(1 for f in p.files if f.action == a)))
    stat = f"; {_diff_stat(p.readme_diff)}" if p.readme_diff else ""
    parent = f" on `{p.head[:12]}`" if p.head else ""
    lines = [f"<details><summary><code>{p.repo_id}</code> ({p.build}): {counts}{stat}</summary>", "",
             f"Commit `{p.commit_message}`{parent}.", "", "| file | action | size | storage |", "|---|---|---:|---|"]
    lines += [f"| `{f.path}` | {f.action} | {_human(f.size)} | {f.storage} |" for f in p.changes]
    return "\n".join([*lines, "", "</details>", ""])


def render_comment(plans: list[RepoPlan], request: PushRequest) -> str:
    """The pull-request comment: one summary row per repo, each repo's changes collapsed. At most COMMENT_BUDGET
    characters: what does not fit is left out with a pointer to the full plan in the workflow's artifact."""
    where = f"`{request.lock_path}` (a real build's manifest)" if request.lock_path else f"`{request.dist}`"
    changing = [p for p in plans if p.changes]
    head = [COMMENT_MARKER, f"### Release preview: release {request.release.version} to {request.org}", "",
            f"Planned read-only from {where} against {_remote(request)} by "
            f"`release` {__version__}: {len(plans)} repos, {len(changing)} with changes, "
            f"{sum(1 for p in plans if not p.exists)} to create.", "",
            "| repo | build | status | add | modify | delete | unchanged | upload | tag |",
            "|---|---|---|--:|--:|--:|--:|--:|---|"]
    rows = []
    for p in plans:
        n = {a: sum(1 for f in p.files if f.action == a) for a in ("add", "modify", "delete", "unchanged")}
        upload = sum(f.size for f in p.files if f.action in ("add", "modify"))
        tag = {"create": "create", "move": "move (--retag)", "unchanged": "unchanged", "none": "-"}[p.tag_action]
        rows.append(f"| `{p.repo_id}` | {p.build} | {_status(p, request)} | {n['add']} | {n['modify']} | "
                    f"{n['delete']} | {n['unchanged']} | {_human(upload)} | {tag} |")
    footer = "\nThe full plan (`plan.md`, `plan.json`: README diffs and the commit description) and the cards " \
        "rendered in every language, with their plots (`cards/`), are in this run's artifact."
    room = COMMENT_BUDGET - _units(footer) - 200  # 200: the note on what was left out
    text, rows_left = _take("\n".join(head), rows, room)
    if rows_left:
        text += f"\n\n{rows_left} more repos and every repo's details are left out here to stay under GitHub's " \
            "comment limit."
    else:
        text, details_left = _take(text + "\n", [_details(p) for p in changing], room)
        if details_left:
            text += f"\nThe details of {details_left} more repos are left out here to stay under GitHub's comment " \
                "limit."
    return text + "\n" + footer + "\n"


def write_preview(out: Path, plans: list[RepoPlan], request: PushRequest, dist: Path) -> None:
    """``out``: ``comment.md`` (``render_comment``), the full plan as ``plan.md`` and ``plan.json``, and the card
    files of each repo under ``cards/REPO/``; written aside and put in place whole."""
    with atomic_dir(out) as tmp:
        atomic_write(tmp / "comment.md", render_comment(plans, request))
        atomic_write(tmp / "plan.md", render_plan(plans, request, "markdown") + "\n")
        atomic_write(tmp / "plan.json", render_plan(plans, request, "json") + "\n")
        for build in request.builds:
            for rel in build_files(dist / build.repo):
                if matches(rel, CARD_FILES):
                    atomic_write(tmp / "cards" / build.repo / rel, (dist / build.repo / rel).read_bytes())


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


def _mismatches(remote: HubRemote, plan: RepoPlan, local: dict[str, dict[str, Any]]) -> list[str]:
    """Files whose remote hash differs from the hash the plan approved, compared the way the remote stores each."""
    after = remote.state(plan.repo_id, plan.revision).files
    wrong = []
    for f in plan.files:
        if f.action == "delete":
            continue
        entry, mine = after.get(f.path), local[f.path]
        if entry is None or entry[1] != (mine["sha256"] if entry[2] else mine["sha1"]):
            wrong.append(f.path)
    return wrong


def _tag(remote: HubRemote, plan: RepoPlan, commit: str) -> str:
    """Carry out the plan's tag action on ``commit``; says only what happened."""
    from huggingface_hub.errors import HfHubHTTPError

    if plan.tag_action == "unchanged":
        return f"tag {plan.tag} already on {commit[:12]}"
    try:
        if plan.tag_action == "move":
            remote.api.delete_tag(plan.repo_id, tag=plan.tag)
        remote.api.create_tag(plan.repo_id, tag=plan.tag, revision=commit)  # a tag made meanwhile: an error
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise ReleaseError(f"{plan.repo_id}: {commit[:12]} is on the branch, but tagging it {plan.tag} failed "
                           f"(HTTP {status}); check the repo's tags, then run 'release push' again (with --retag "
                           "if the tag exists)") from exc
    if plan.tag_action == "move":
        return f"moved tag {plan.tag} from {(plan.tag_target or '')[:12]} to {commit[:12]}"
    return f"tagged {plan.tag}"


def _push_hub(remote: HubRemote, plan: RepoPlan, folder: Path, request: PushRequest,
              local: dict[str, dict[str, Any]]) -> str:
    from huggingface_hub import CommitOperationDelete
    from huggingface_hub.errors import HfHubHTTPError

    api = remote.api
    ops: list[Any] = [_operation(folder, f, local[f.path]) for f in plan.changes if f.action in ("add", "modify")]
    ops += [CommitOperationDelete(path_in_repo=f.path) for f in plan.changes if f.action == "delete"]
    try:
        if not plan.exists:  # not exist_ok: a repo made after the plan may be public, and --private would not apply
            api.create_repo(plan.repo_id, private=request.private)
        if not plan.branch_exists:
            api.create_branch(plan.repo_id, branch=plan.revision, revision=plan.head)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        made = "the repo" if not plan.exists else f"branch {plan.revision}"
        raise ReleaseError(f"{plan.repo_id}: creating {made} failed (HTTP {status}; 409: it was created after the "
                           "plan); nothing was committed; run 'release push' again to re-plan") from exc
    created = f"created branch {plan.revision}, " if not plan.branch_exists else ""
    if not plan.changes:
        tagged = f"; {_tag(remote, plan, plan.head)}" if plan.head and plan.tag_action != "none" else ""
        return f"{plan.repo_id}: {created}no changes, nothing uploaded{tagged}"
    try:
        info = api.create_commit(plan.repo_id, operations=ops, commit_message=plan.commit_message,
                                 commit_description=request.notes, revision=plan.revision, parent_commit=plan.head,
                                 create_pr=request.create_pr)
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 412:
            raise ReleaseError(f"{plan.repo_id}: the branch moved after the plan (parent {plan.head}); nothing "
                               "was overwritten; run 'release push' again to re-plan") from exc
        raise ReleaseError(f"{plan.repo_id}: the Hub refused the commit: HTTP {status}") from exc
    commit = info.oid
    if request.create_pr:
        return f"{plan.repo_id}: opened {info.pr_url}"
    wrong = _mismatches(remote, plan, local)
    if wrong:
        raise ReleaseError(f"{plan.repo_id}: committed {commit[:12]}, but the remote {wrong[0]} does not match the "
                           "hashed local file; not tagged")
    tagged = _tag(remote, plan, commit) if plan.tag_action != "none" else f"not tagged (branch {plan.revision})"
    return f"{plan.repo_id}: {created}committed {commit[:12]} to {plan.revision} ({len(ops)} files), {tagged}, " \
        "checksums verified"


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


def _push_folder(remote: FolderRemote, plan: RepoPlan, folder: Path, local: dict[str, dict[str, Any]]) -> str:
    """Write the repo beside its old copy, each file checked against its planned hash while it is copied, and swap
    it in only when complete (``atomic_dir``): a failure leaves the old copy and no staging folder."""
    if not plan.changes:
        return f"{plan.repo_id}: no changes, nothing copied"
    dest = remote.folder(plan.repo_id)
    with atomic_dir(dest) as staging:
        for f in plan.files:
            if f.action != "delete":
                _copy_hashed(folder / f.path, staging / f.path, local[f.path]["sha256"])
    return f"{plan.repo_id}: {len(plan.changes)} changes published to {dest}, checksums verified"


def run_push(request: PushRequest) -> str:
    """Plan every repo; for a dry run return the plan, else push and return the plan plus what happened.

    With a release manifest the build folders are staged from its sidecars, with freshly rendered cards, and each
    file that is not there is planned by the hashes the manifest holds. A push to a folder holds
    ``TARGET/.release-push.lock`` from the plan to the last copy: a second push to the same target fails at once,
    naming the process that holds it.
    """
    if request.lock is None:
        cache = HashCache(Path(os.environ.get(CACHE_ENV, ".cache/release")) / "hashes.json")
        return _run_push(request, request.dist, cache, lambda folder, build: checked_files(
            folder, build.name, request.reports.get(build.name), cache))
    from release.manifest import locked_files, staged  # release.manifest imports this module

    with staged(request) as dist:  # a temporary folder: its hashes are not worth keeping
        cache = HashCache(dist / ".hashes.json")
        return _run_push(request, dist, cache, lambda folder, build: locked_files(
            request, folder, build, request.reports.get(build.name), cache))


def _run_push(request: PushRequest, dist: Path, cache: HashCache,
              files: Callable[[Path, BuildConfig], dict[str, dict[str, Any]]]) -> str:
    """Plan (and push) the builds in ``dist``; ``files`` gives a build folder's checked files and hashes."""
    remote: HubRemote | FolderRemote = FolderRemote(request.target, cache) if request.target \
        else HubRemote(request.endpoint)
    lock = exclusive_lock(request.target / LOCK_NAME, f"push to {request.target}") \
        if request.target is not None and not request.dry_run else nullcontext()
    with lock:
        plans, hashes = [], []
        for build in request.builds:
            folder = dist / build.repo
            local = files(folder, build)
            hashes.append(local)
            plans.append(plan_repo(remote, request, build, folder, local))
        cache.save()
        text = render_plan(plans, request, request.fmt)
        if request.preview is not None:
            write_preview(request.preview, plans, request, dist)
        if request.dry_run:
            return text
        done = []
        for build, plan, local in zip(request.builds, plans, hashes, strict=True):
            folder = dist / build.repo
            if isinstance(remote, FolderRemote):
                done.append(_push_folder(remote, plan, folder, local))
            else:
                done.append(_push_hub(remote, plan, folder, request, local))
    return text + "\n" + "\n".join(done) if request.fmt == "markdown" else "\n".join(done)
