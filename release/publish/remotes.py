"""Where a push goes: a repo on the Hub (or a server speaking its API) through huggingface_hub, or a local folder
standing in for it; each read as a :class:`RemoteState`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from release.core.errors import ReleaseError
from release.publish import hub_client
from release.publish.hashing import HashCache, is_lfs, valid_xet_hash

MAIN = "main"


@dataclass(frozen=True)
class RemoteState:
    head: str | None  # None: no such repo
    files: dict[str, tuple[int, str, bool]]  # path: (size, sha256 if LFS else git blob sha1, is LFS)
    tags: dict[str, str]  # tag: commit
    branch_exists: bool = True
    private: bool | None = None
    xet: dict[str, str] = field(default_factory=dict)  # path: the Xet hash the Hub lists (valid ones only)


class HubRemote:
    """A repo on the Hub (or a server speaking its API), read through huggingface_hub, whose requests are bounded
    (``hub_client``: timeouts, deadlines, answer sizes, redirects); the token is checked before the first."""

    def __init__(self, endpoint: str | None) -> None:
        from huggingface_hub import HfApi
        from huggingface_hub.utils import disable_progress_bars

        token = hub_client.token()
        hub_client.install()
        disable_progress_bars()  # but while a commit uploads (push._upload_bars): reading the remote is quick
        self.api = HfApi(endpoint=endpoint, token=token)

    def deadline(self, what: str) -> AbstractContextManager[None]:
        """The Hub requests within end within ``RELEASE_HUB_DEADLINE``, all together (``hub_client.deadline``)."""
        return hub_client.deadline(what)

    @contextmanager
    def reading(self, what: str) -> Iterator[None]:
        """Reads of the remote under a deadline; a failure (offline mode, DNS, a refused connection, a timeout) says
        where and stops."""
        try:
            with self.deadline(f"reading {what}"):
                yield
        except ReleaseError:
            raise
        except Exception as exc:
            raise ReleaseError(f"cannot read {what} from {self.api.endpoint}: {hub_client.describe(exc)}; check "
                               "--endpoint and the network, or plan against a folder with --target DIR") from exc

    def state(self, repo_id: str, revision: str = MAIN) -> RemoteState:
        """The repo at the head of ``revision``; a branch that does not exist yet is read at main's head (where the
        push creates it)."""
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        with self.reading(repo_id):
            try:
                info = self.api.repo_info(repo_id)
                refs = self.api.list_repo_refs(repo_id)
                branches = {b.name: b.target_commit for b in refs.branches}
                head = branches.get(revision, info.sha)
                tree = list(self.api.list_repo_tree(repo_id, recursive=True, revision=head))
            except (RepositoryNotFoundError, RevisionNotFoundError):
                return RemoteState(None, {}, {}, revision == MAIN)
        from huggingface_hub.hf_api import RepoFile

        files, xet = {}, {}
        for entry in tree:
            if isinstance(entry, RepoFile):
                files[entry.path] = (entry.size, entry.lfs.sha256 if entry.lfs else entry.blob_id, bool(entry.lfs))
                if entry.lfs and valid_xet_hash(getattr(entry, "xet_hash", None)):
                    xet[entry.path] = str(entry.xet_hash)
        return RemoteState(head, files, {t.name: t.target_commit for t in refs.tags}, revision in branches,
                           info.private, xet)

    def read(self, repo_id: str, path: str, revision: str) -> str:
        with self.reading(f"{path} of {repo_id}"):
            local = self.api.hf_hub_download(repo_id, path, revision=revision)
        return Path(local).read_text(encoding="utf-8", errors="replace")


class FolderRemote:
    """A local folder standing in for the Hub (``--target``: air-gapped staging); it has no tags. Its files are
    hashed by content on every plan, never taken from the hash cache: a cached digest is a speed-up for the files a
    push sends, which are hashed again as they are copied, but it cannot prove that a target file is "unchanged" (an
    edited ``hashes.json`` would let a tampered shard stay)."""

    def __init__(self, root: Path) -> None:
        self.root, self.cache = root, HashCache(None)

    def deadline(self, what: str) -> AbstractContextManager[None]:
        """A folder is read without one."""
        return nullcontext()

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
