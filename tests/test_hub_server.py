"""Self-test of the Hub test double (tests/hub_server.py) against the real huggingface_hub client."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.conftest import HUB_TOKEN as TOKEN
from tests.hub_server import FakeHub, git_blob_sha1, lfs_pointer

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # from huggingface_hub

REPO = "org/model"


@pytest.fixture
def api(hub: FakeHub):
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub.url, token=TOKEN)


def _ops(files: dict[str, bytes]):
    from huggingface_hub import CommitOperationAdd

    return [CommitOperationAdd(path_in_repo=p, path_or_fileobj=c) for p, c in files.items()]


SMALL = b'{"hello": "world"}\n'
WEIGHTS = bytes(range(256)) * 4  # 1 KiB, LFS because of the .safetensors suffix


def test_create_repo_and_repo_info(hub: FakeHub, api) -> None:
    from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError

    with pytest.raises(RepositoryNotFoundError):
        api.repo_info(REPO)
    url = api.create_repo(REPO, repo_type="model", exist_ok=True, private=True)
    assert url.repo_id == REPO
    assert api.create_repo(REPO, exist_ok=True).repo_id == REPO
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_repo(REPO, exist_ok=False)
    assert exc.value.response.status_code == 409
    info = api.model_info(REPO, files_metadata=True)
    assert info.id == REPO and info.private is True
    assert info.sha == hub.commits(REPO)[-1]["id"]
    assert [s.rfilename for s in info.siblings] == [".gitattributes"]
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("org/missing", revision="main", files_metadata=True)


def test_commit_tree_paths_refs_download(hub: FakeHub, api, tmp_path: Path) -> None:
    api.create_repo(REPO, exist_ok=True)
    info = api.create_commit(
        REPO,
        operations=_ops({"config.json": SMALL, "weights/model.safetensors": WEIGHTS}),
        commit_message="Add model",
        commit_description="desc",
    )
    assert info.oid == hub.commits(REPO)[-1]["id"]
    assert info.commit_url == f"{hub.url}/{REPO}/commit/{info.oid}"
    last = hub.commits(REPO)[-1]
    assert (last["title"], last["message"], last["parent"]) == ("Add model", "desc", hub.commits(REPO)[-2]["id"])
    assert hub.files(REPO)["weights/model.safetensors"] == WEIGHTS
    assert hub.lfs_uploads == [hashlib.sha256(WEIGHTS).hexdigest()]

    tree = {e.path: e for e in api.list_repo_tree(REPO, recursive=True, expand=True)}
    assert set(tree) == {".gitattributes", "config.json", "weights", "weights/model.safetensors"}
    assert type(tree["weights"]).__name__ == "RepoFolder"
    cfg, w = tree["config.json"], tree["weights/model.safetensors"]
    assert cfg.blob_id == git_blob_sha1(SMALL) and cfg.size == len(SMALL) and cfg.lfs is None
    assert w.lfs is not None and w.lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest() and w.size == len(WEIGHTS)
    assert w.blob_id == git_blob_sha1(lfs_pointer(w.lfs.sha256, len(WEIGHTS)))  # git oid of the pointer, as on the Hub
    assert w.lfs.pointer_size == len(lfs_pointer(w.lfs.sha256, len(WEIGHTS)))
    assert w.last_commit.oid == info.oid
    top = {e.path for e in api.list_repo_tree(REPO)}
    assert top == {".gitattributes", "config.json", "weights"}

    paths = {e.path: e for e in api.get_paths_info(REPO, ["config.json", "weights", "nope.txt"])}
    assert set(paths) == {"config.json", "weights"}
    assert paths["config.json"].blob_id == git_blob_sha1(SMALL)

    sib = {s.rfilename: s for s in api.model_info(REPO, revision="main", files_metadata=True).siblings}
    assert sib["weights/model.safetensors"].lfs.sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    assert sib["config.json"].blob_id == git_blob_sha1(SMALL)

    refs = api.list_repo_refs(REPO)
    assert [(b.name, b.target_commit) for b in refs.branches] == [("main", info.oid)]

    assert [c.commit_id for c in api.list_repo_commits(REPO)] == [c["id"] for c in reversed(hub.commits(REPO))]

    for path, content in (("config.json", SMALL), ("weights/model.safetensors", WEIGHTS)):
        local = api.hf_hub_download(REPO, path, cache_dir=tmp_path / "cache")
        assert Path(local).read_bytes() == content
    local = api.hf_hub_download(REPO, "config.json", revision=info.oid, local_dir=tmp_path / "out")
    assert Path(local).read_bytes() == SMALL
    from huggingface_hub.errors import EntryNotFoundError

    with pytest.raises(EntryNotFoundError):
        api.hf_hub_download(REPO, "missing.txt", cache_dir=tmp_path / "cache")
    assert api.file_exists(REPO, "config.json") and not api.file_exists(REPO, "missing.txt")

    # second commit: unchanged file is skipped by the client (preupload returns its oid), delete works
    from huggingface_hub import CommitOperationDelete

    info2 = api.create_commit(
        REPO,
        operations=[*_ops({"config.json": SMALL}), CommitOperationDelete("weights/")],
        commit_message="Drop weights",
        parent_commit=info.oid,
    )
    assert set(hub.files(REPO)) == {".gitattributes", "config.json"}
    assert hub.commits(REPO)[-1]["parent"] == info.oid and info2.oid != info.oid


def test_stale_parent_commit_is_rejected_with_412(hub: FakeHub, api) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    api.create_repo(REPO, exist_ok=True)
    old = api.create_commit(REPO, operations=_ops({"a.txt": b"a"}), commit_message="a").oid
    new_head = hub.move_branch(REPO)
    assert new_head == api.model_info(REPO).sha != old
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_commit(REPO, operations=_ops({"b.txt": b"b"}), commit_message="b", parent_commit=old)
    assert exc.value.response.status_code == 412
    assert hub.commits(REPO)[-1]["id"] == new_head
    assert "b.txt" not in hub.files(REPO)


def test_create_pr_leaves_main_unchanged(hub: FakeHub, api) -> None:
    api.create_repo(REPO, exist_ok=True)
    head = api.create_commit(REPO, operations=_ops({"a.txt": b"a"}), commit_message="a").oid
    info = api.create_commit(
        REPO,
        operations=_ops({"b.txt": b"b", "w.safetensors": WEIGHTS}),
        commit_message="Proposal",
        commit_description="please merge",
        create_pr=True,
        parent_commit=head,
    )
    assert info.pr_revision == "refs/pr/1" and info.pr_num == 1
    assert info.pr_url == f"{hub.url}/{REPO}/discussions/1"
    assert hub.commits(REPO)[-1]["id"] == head
    assert "b.txt" not in hub.files(REPO)
    assert hub.files(REPO, "refs/pr/1")["w.safetensors"] == WEIGHTS
    (pr,) = hub.pull_requests(REPO)
    assert (pr["num"], pr["title"], pr["description"], pr["head"]) == (1, "Proposal", "please merge", info.oid)
    refs = api.list_repo_refs(REPO, include_pull_requests=True)
    assert [(r.ref, r.target_commit) for r in refs.pull_requests] == [("refs/pr/1", info.oid)]
    # commit on top of the PR
    api.create_commit(REPO, operations=_ops({"c.txt": b"c"}), commit_message="more", revision="refs/pr/1")
    assert hub.files(REPO, "refs/pr/1")["c.txt"] == b"c"
    assert hub.commits(REPO)[-1]["id"] == head


def test_tags_and_branches(hub: FakeHub, api) -> None:
    from huggingface_hub.errors import HfHubHTTPError, RevisionNotFoundError

    api.create_repo(REPO, exist_ok=True)
    head = api.create_commit(REPO, operations=_ops({"a.txt": b"a"}), commit_message="a").oid
    api.create_tag(REPO, tag="v1.0", revision=head, tag_message="release 1.0")
    assert hub.tags(REPO) == {"v1.0": head}
    with pytest.raises(HfHubHTTPError) as exc:
        api.create_tag(REPO, tag="v1.0")
    assert exc.value.response.status_code == 409
    api.create_tag(REPO, tag="v1.0", exist_ok=True)
    api.create_branch(REPO, branch="dev")
    refs = api.list_repo_refs(REPO)
    assert [(t.name, t.target_commit) for t in refs.tags] == [("v1.0", head)]
    assert {b.name for b in refs.branches} == {"main", "dev"}
    assert api.model_info(REPO, revision="v1.0").sha == head
    with pytest.raises(RevisionNotFoundError):
        api.model_info(REPO, revision="nope")


def test_dropped_lfs_upload_is_retried(hub: FakeHub, api, tmp_path: Path) -> None:
    api.create_repo(REPO, exist_ok=True)
    payload = hashlib.sha512(b"seed").digest() * 64  # 4 KiB
    hub.fail_next_lfs_upload = 1
    api.create_commit(REPO, operations=_ops({"model.safetensors": payload}), commit_message="weights")
    assert hub.fail_next_lfs_upload == 0 and hub.dropped_lfs_uploads == 1
    assert [m for m, p in hub.requests if p.startswith("/__lfs__/upload/")].count("PUT") == 2
    assert hub.files(REPO)["model.safetensors"] == payload
    local = api.hf_hub_download(REPO, "model.safetensors", cache_dir=tmp_path / "cache")
    assert hashlib.sha256(Path(local).read_bytes()).hexdigest() == hashlib.sha256(payload).hexdigest()


def test_validate_yaml(hub: FakeHub, api) -> None:
    api.create_repo(REPO, exist_ok=True)
    good = b"---\nlicense: apache-2.0\ntags:\n- quantized\n---\n# Card\n"
    api.create_commit(REPO, operations=_ops({"README.md": good}), commit_message="card")
    assert hub.files(REPO)["README.md"] == good
    bad = b"---\nlicense: [apache-2.0\ntags: : :\n---\n# Card\n"
    with pytest.raises(ValueError, match=r"Invalid metadata in README\.md"):
        api.create_commit(REPO, operations=_ops({"README.md": bad}), commit_message="bad card")
    assert hub.files(REPO)["README.md"] == good
    assert ("POST", "/api/validate-yaml") in hub.requests
