"""`release push`: the plan, the folder target, refusals; the Hub path against a local server of its API."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result

from release.check.written import WRITTEN
from release.core.builds import release_notes
from release.core.errors import ReleaseError
from tests.conftest import HUB_TOKEN, add_card, choose, invoke, write_card
from tests.hub_server import FakeHub

RTN = "Cosmos3-Nano-Policy-DROID-FP8"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub


def test_folder_target_plan_push_and_noop(dist: Path, tmp_path: Path) -> None:
    target = tmp_path / "hub"
    plan = invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run")
    assert plan.exit_code == 0, plan.output
    folder = dist / RTN
    files = sorted(rel for rel in (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
                   if rel != WRITTEN)  # the record of what came after verification stays local
    assert f"## np-cr/{RTN} (rtn): will be created" in plan.output
    assert f"{len(files)} to add, 0 to modify, 0 to delete, 0 unchanged" in plan.output
    for name in files:
        assert f"| `{name}` | add |" in plan.output
    assert not target.exists()  # a dry run changes nothing
    as_json = json.loads(invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run",
                                "--format", "json").stdout)  # the JSON is stdout; stderr says which build files
    assert {f["action"] for f in as_json["repos"][0]["files"]} == {"add"}
    pushed = invoke("push", "rtn", "--dist", dist, "--target", target)
    assert pushed.exit_code == 0 and "checksums verified" in pushed.output
    assert sorted(p.relative_to(target / "np-cr" / RTN).as_posix()
                  for p in (target / "np-cr" / RTN).rglob("*") if p.is_file()) == files
    again = invoke("push", "rtn", "--dist", dist, "--target", target)
    assert "no changes, nothing copied" in again.stdout  # what the push did, not its plan:
    assert "No changes: nothing will be uploaded." not in again.output and "## np-cr/" not in again.output
    write_card(folder, "README.md", "# changed card\n")
    changed = invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run", "--org", "someone")
    assert "## someone/" in changed.output
    changed = invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run")
    assert f"0 to add, 1 to modify, 0 to delete, {len(files) - 1} unchanged" in changed.output
    assert "+# changed card" in changed.output and "-# card" in changed.output


def test_refusals(dist: Path, tmp_path: Path) -> None:
    folder = dist / RTN
    report = folder / "verification" / "report.json"
    data = json.loads(report.read_text())
    data["checks"][0]["status"] = "failed"
    report.write_text(json.dumps(data))
    refused = invoke("push", "rtn", "--dist", dist, "--target", tmp_path / "hub", "--dry-run")
    assert refused.exit_code == 1 and "push refused" in refused.output and "--force REASON" in refused.output
    forced = invoke("push", "rtn", "--dist", dist, "--target", tmp_path / "hub", "--dry-run", "--force",
                    "layout checked by hand")
    assert forced.exit_code == 0 and "[forced past verification: layout checked by hand]" in forced.output
    (folder / ".env").write_text("HF_TOKEN=x\n")
    secret = invoke("push", "rtn", "--dist", dist, "--target", tmp_path / "hub", "--dry-run", "--force", "x")
    assert secret.exit_code == 2 and ".env: looks like a secret" in secret.output
    (folder / ".env").unlink()
    (folder / "notes.txt").write_text("token: hf_" + "a" * 34 + "\n")
    secret = invoke("push", "rtn", "--dist", dist, "--target", tmp_path / "hub", "--dry-run", "--force", "x")
    assert secret.exit_code == 2 and "contains what looks like a Hugging Face token (hf_…, at byte 7)" in secret.output
    assert "a" * 30 not in secret.output
    (folder / "notes.txt").unlink()
    os.symlink("/etc/hostname", folder / "link")
    link = invoke("push", "rtn", "--dist", dist, "--target", tmp_path / "hub", "--dry-run", "--force", "x")
    assert link.exit_code == 2 and "outside the build folder" in link.output


def test_unverified_build_is_refused(dist: Path, tmp_path: Path) -> None:
    shutil.rmtree(dist / RTN / "verification")
    result = invoke("push", "--dist", dist, "--dry-run", "--target", tmp_path / "hub")
    assert result.exit_code == 1 and "has no verification report; run 'release verify'" in result.output


def test_unreachable_hub_is_one_line(dist: Path) -> None:
    result = invoke("push", "rtn", "--dist", dist, "--dry-run")
    assert result.exit_code == 2 and result.output.startswith("error: cannot read np-cr/")
    assert result.output.count("\n") == 1


def _push(hub: FakeHub, dist: Path, *args: str) -> Result:
    return invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, *args)


def test_hub_first_push_then_noop(hub: FakeHub, dist: Path) -> None:
    plan = _push(hub, dist, "--dry-run")
    assert plan.exit_code == 0 and "will be created" in plan.output
    assert not hub.repos  # the dry run created nothing
    first = _push(hub, dist)
    assert first.exit_code == 0, first.output
    assert "tagged v1.0.0, checksums verified" in first.output  # the release's version, from builds/release.yaml
    repo = f"np-cr/{RTN}"
    local = {p.relative_to(dist / RTN).as_posix(): p.read_bytes() for p in (dist / RTN).rglob("*") if p.is_file()}
    del local[WRITTEN]  # the record of what came after verification stays local
    remote = {k: v for k, v in hub.files(repo).items() if k != ".gitattributes"}
    assert remote == local
    assert len(hub.commits(repo)) == 2 and "v1.0.0" in hub.tags(repo)  # the initial commit, then ours
    commit = hub.commits(repo)[-1]
    assert commit["title"].startswith("Release 1.0.0: rtn (rtn, max) from ")
    assert commit["message"] == release_notes("1.0.0") and commit["message"].startswith("### Added\n- Cosmos3")
    again = _push(hub, dist)
    assert again.exit_code == 0 and "no changes, nothing uploaded" in again.output
    assert len(hub.commits(repo)) == 2  # a second push of the same release makes no commit
    assert HUB_TOKEN not in first.output + again.output


def test_hub_changed_card_and_deleted_file(hub: FakeHub, dist: Path) -> None:
    write_card(dist / RTN, "README.ko.md", "# 카드\n")
    assert _push(hub, dist).exit_code == 0
    repo = f"np-cr/{RTN}"
    write_card(dist / RTN, "README.md", "---\nlicense: other\n---\n# new card\n")
    (dist / RTN / "README.ko.md").unlink()
    plan = _push(hub, dist, "--dry-run", "--format", "json", "--retag")
    files = {f["path"]: f["action"] for f in json.loads(plan.stdout)["repos"][0]["files"]}
    assert files["README.md"] == "modify" and files["README.ko.md"] == "delete"
    assert sum(1 for a in files.values() if a != "unchanged") == 2
    result = _push(hub, dist, "--retag")  # the release commit moves the version's tag
    assert result.exit_code == 0, result.output
    last = hub.commits(repo)[-1]
    assert "README.ko.md" not in hub.files(repo) and hub.files(repo)["README.md"].endswith(b"# new card\n")
    assert set(last["files"]) ^ set(hub.commits(repo)[-2]["files"]) >= {"README.ko.md"}
    assert last["files"]["README.md"] != hub.commits(repo)[-2]["files"]["README.md"]
    assert hub.tags(repo)["v1.0.0"] == last["id"]


def test_hub_stale_parent_is_refused(hub: FakeHub, dist: Path) -> None:
    from release.core.builds import load_build
    from release.publish.gate import checked_files
    from release.publish.hashing import HashCache
    from release.publish.plan import plan_repo
    from release.publish.push import _push_hub
    from release.publish.remotes import HubRemote
    from release.publish.request import PushRequest

    assert _push(hub, dist).exit_code == 0
    write_card(dist / RTN, "README.md", "---\nlicense: other\n---\n# stale\n")
    request = PushRequest.create(("rtn",), None, dist, False, hub.url, retag=True)
    remote = HubRemote(hub.url)
    local = checked_files(dist / RTN, "rtn", request.reports["rtn"], HashCache(dist / "h.json"), ["en", "ko"])
    plan = plan_repo(remote, request, load_build("rtn"), dist / RTN, local)
    hub.move_branch(f"np-cr/{RTN}")  # someone else commits between plan and push
    with pytest.raises(ReleaseError, match=r"the branch moved after the plan .* nothing was overwritten"):
        _push_hub(remote, plan, dist / RTN, request, local)
    assert b"# stale" not in hub.files(f"np-cr/{RTN}").get("README.md", b"")


def test_hub_dropped_upload_is_retried(hub: FakeHub, dist: Path) -> None:
    hub.fail_next_lfs_upload = 1
    result = _push(hub, dist)
    assert result.exit_code == 0, result.output
    assert hub.dropped_lfs_uploads == 1
    repo = f"np-cr/{RTN}"
    assert len(hub.commits(repo)) == 2  # exactly one commit, never a partial one
    for shard in (dist / RTN / "transformer").glob("*.safetensors"):
        assert hub.files(repo)[f"transformer/{shard.name}"] == shard.read_bytes()


def _error_line(result: Result) -> str:
    """The one error line of a failed push (exit 2; its progress lines on stderr come before it), no traceback."""
    assert result.exit_code == 2, result.output
    errors = [line for line in result.output.splitlines() if line.startswith(("error", "internal error"))]
    assert len(errors) == 1 and errors[0].startswith("error: ") and "Traceback" not in result.output, result.output
    return errors[0]


def test_a_commit_the_hub_applied_before_the_connection_dropped_is_tagged_by_the_rerun(hub: FakeHub,
                                                                                    dist: Path) -> None:
    """Issue 34: the commit applied, then the connection dropped (``RemoteProtocolError``): one line that says the
    Hub may have applied it and that a rerun tags it; the rerun uploads nothing and tags the commit."""
    hub.fail_next_commits = ["drop after"]
    error = _error_line(_push(hub, dist))
    assert "the connection dropped during the commit" in error and "may have applied it" in error
    repo = f"np-cr/{RTN}"
    assert len(hub.commits(repo)) == 2 and "v1.0.0" not in hub.tags(repo)  # committed, not tagged
    again = _push(hub, dist)
    assert again.exit_code == 0, again.output
    assert "no changes, nothing uploaded; tagged v1.0.0" in again.output
    assert hub.tags(repo)["v1.0.0"] == hub.head(repo) and len(hub.commits(repo)) == 2


def test_an_lfs_upload_that_fails_every_time_is_one_line(hub: FakeHub, dist: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: huggingface_hub retries the dropped upload, then gives up with a RuntimeError: one line naming the
    repo and the file, saying nothing was committed and the repo is left empty."""
    import huggingface_hub.utils._http as http

    monkeypatch.setattr(http.time, "sleep", lambda seconds: None)  # its back-off between retries
    hub.fail_next_lfs_upload = 1000
    error = _error_line(_push(hub, dist))
    assert f"np-cr/{RTN}: Error while uploading '" in error and "nothing was committed" in error
    assert "the repo was created and is empty" in error
    assert len(hub.commits(f"np-cr/{RTN}")) == 1  # the initial commit only


def test_a_push_that_fails_on_a_later_repo_says_what_was_published_before(hub: FakeHub, dist: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 34: the second repo's push fails after the first was committed and tagged: the error says so, with
    the first repo's commit. (Two plans of one build stand for two repos; the second's failure is injected.)"""
    import dataclasses

    import release.publish.push as push
    from release.publish.request import PushRequest

    request = PushRequest.create(("rtn",), None, dist, False, hub.url)
    twice = dataclasses.replace(request, builds=[*request.builds, *request.builds])
    real, calls = push._push_hub, []

    def second_refused(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 2:
            raise ReleaseError(f"np-cr/{RTN}: the Hub refused the commit: HTTP 500; nothing was committed")
        return real(*args)

    monkeypatch.setattr(push, "_push_hub", second_refused)
    with pytest.raises(ReleaseError) as caught:
        push.run_push(twice)
    message = str(caught.value)
    head = hub.head(f"np-cr/{RTN}")
    assert message.startswith(f"np-cr/{RTN}: the Hub refused the commit: HTTP 500; nothing was committed. ")
    assert f"Published before it (1 of 2 repos): np-cr/{RTN}: committed {head[:12]} to main" in message
    assert "tagged v1.0.0" in message


def test_hub_pull_request_mode(hub: FakeHub, dist: Path) -> None:
    assert _push(hub, dist).exit_code == 0
    repo = f"np-cr/{RTN}"
    head = hub.head(repo)
    write_card(dist / RTN, "README.md", "---\nlicense: other\n---\n# proposed\n")
    result = _push(hub, dist, "--create-pr")  # a pull request leaves the tags alone
    assert result.exit_code == 0 and "opened" in result.output
    assert hub.head(repo) == head and len(hub.pull_requests(repo)) == 1


def test_three_delivered_repos_pushed_twice_make_one_commit_each(hub: FakeHub, recipe_builds: Path,
                                                                 tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for repo in (RTN, f"{RTN}-SmoothQuant", f"{RTN}-RTN-MovingAvgObserver"):
        shutil.copytree(recipe_builds / repo, dist / repo)
        add_card(dist / repo)
    choose(dist, ["rtn", "sq_auto", "rtn_mavg"])
    plan = invoke("push", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert plan.exit_code == 0 and plan.output.count("will be created") == 3
    assert "## Collection: Cosmos3-Nano-Policy-DROID FP8 (np-cr): to create" in plan.output
    for _ in range(2):
        result = invoke("push", "--dist", dist, "--endpoint", hub.url)
        assert result.exit_code == 0, result.output
    assert sorted(hub.repos) == sorted(f"np-cr/{r}" for r in (RTN, f"{RTN}-SmoothQuant",
                                                              f"{RTN}-RTN-MovingAvgObserver"))
    for repo in hub.repos:
        assert len(hub.commits(repo)) == 2  # the repo's initial commit and exactly one release commit
    assert result.output.count("no changes, nothing uploaded") == 3


def test_release_notes_are_required_for_the_hub_and_found_by_version(hub: FakeHub, dist: Path, builds: Path) -> None:
    notes = builds / "RELEASES.md"
    text = notes.read_text()
    notes.write_text(text.replace("## [1.0.0]", "## [0.9.0] - 2025-12-01"))
    for args in (("--dry-run",), ()):
        result = _push(hub, dist, *args)
        assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
        assert f"error: {notes}: no section for release 1.0.0 (the version in release.yaml); add a section " \
               "'## [1.0.0]'" in result.output
    assert not hub.repos
    notes.write_text(text.replace("## [1.0.0]", "## [1.0.0] - 2026-01-31\n\n## [0.9.0]"))
    result = _push(hub, dist, "--dry-run")
    assert result.exit_code == 2 and "the section of release 1.0.0 is empty" in result.output
    notes.unlink()
    assert "RELEASES.md: missing (the release notes" in _push(hub, dist, "--dry-run").output
    folder = invoke("push", "rtn", "--dist", dist, "--target", dist.parent / "hub", "--dry-run")
    assert folder.exit_code == 0, folder.output  # a folder target makes no commit: it needs no notes
    (builds / "release.yaml").write_text((builds / "release.yaml").read_text().replace("version: 1.0.0",
                                                                                       "version: '1.0'"))
    result = _push(hub, dist, "--dry-run")
    assert result.exit_code == 2 and "field 'version': '1.0' is not a release version" in result.output


def test_hub_private_commit_message_and_revision(hub: FakeHub, dist: Path) -> None:
    repo = f"np-cr/{RTN}"
    plan = _push(hub, dist, "--private", "--dry-run")
    assert f"## {repo} (rtn): will be created, private" in plan.output
    first = _push(hub, dist, "--private", "--commit-message", "First FP8 release")
    assert first.exit_code == 0, first.output
    assert hub.repos[repo].private and hub.commits(repo)[-1]["title"] == "First FP8 release"
    assert hub.commits(repo)[-1]["message"] == release_notes("1.0.0")  # --commit-message sets the summary only
    main, tags = hub.head(repo), hub.tags(repo)
    write_card(dist / RTN, "README.md", "---\nlicense: other\n---\n# staged card\n")
    plan = _push(hub, dist, "--revision", "staging", "--dry-run")
    assert f"exists, private; branch `staging` will be created from main at `{main[:12]}`" in plan.output
    assert "1 to modify" in plan.output and "No tag: the release tag `v1.0.0` is made on main only." in plan.output
    staged = _push(hub, dist, "--revision", "staging")
    assert staged.exit_code == 0, staged.output
    assert "created branch staging, committed" in staged.output and "not tagged (branch staging)" in staged.output
    branches = hub.branches(repo)
    assert branches["main"] == main and branches["staging"] != main and hub.tags(repo) == tags
    assert hub.files(repo, "staging")["README.md"].endswith(b"# staged card\n")
    again = _push(hub, dist, "--revision", "staging", "--dry-run")  # planned against the branch, not main
    assert "; branch `staging`\n" in again.output and "No changes: nothing will be uploaded." in again.output
    assert _push(hub, dist, "--org", "public-org").exit_code == 0
    refused = _push(hub, dist, "--org", "public-org", "--private", "--dry-run")
    assert refused.exit_code == 2 and refused.output.count("\n") == 1
    assert "public-org/Cosmos3-Nano-Policy-DROID-FP8: exists and is public; --private makes only new repos " \
           "private and never changes an existing repo's visibility" in refused.output
    assert not hub.repos[f"public-org/{RTN}"].private


@pytest.mark.parametrize("args, message", [
    (("--commit-message", "two\nlines"), "--commit-message 'two\\nlines': give one non-empty line"),
    (("--commit-message", " "), "give one non-empty line"),
    (("--revision", "../main"), "--revision '../main': not a branch name"),
    (("--revision", "refs/pr/1"), "not a branch name"),
    (("--revision", "a" * 40), "not a branch name"),
    (("--revision", "staging", "--target", "hub"), "--revision: the Hub's; a --target folder has no visibility"),
    (("--private", "--target", "hub"), "--private: the Hub's"),
])
def test_push_options_are_checked_first(args: tuple[str, ...], message: str, dist: Path) -> None:
    result = invoke("push", "rtn", "--dist", dist, "--dry-run", *args)
    assert result.exit_code == 2 and result.output.count("\n") == 1 and message in result.output, result.output


def test_a_push_through_xet_uploads_and_reads_back_with_the_real_client(xet_hub: FakeHub, dist: Path) -> None:
    """With hf_xet on (as huggingface_hub runs against today's Hub), the build's LFS files go through hf_xet into the
    double's local Xet store, no LFS transfer is made, and the Hub lists each under the Xet hash hf_xet computes
    locally for the file: the push checks them by it, with nothing downloaded back."""
    import hf_xet

    first = _push(xet_hub, dist)
    assert first.exit_code == 0, first.output
    assert "tagged v1.0.0, checksums verified" in first.output
    repo = f"np-cr/{RTN}"
    assert xet_hub.lfs_uploads == [] and xet_hub.xet_hashes  # every large file came through Xet
    assert any("/xet-write-token/" in t for t in xet_hub.xet_tokens)
    assert not any("/xet-read-token/" in t for t in xet_hub.xet_tokens)  # checked by content, not downloaded
    local = {p.relative_to(dist / RTN).as_posix(): p for p in (dist / RTN).rglob("*") if p.is_file()}
    remote = xet_hub.files(repo)
    assert {k: v.read_bytes() for k, v in local.items() if k != WRITTEN} == \
        {k: v for k, v in remote.items() if k != ".gitattributes"}
    assert len(xet_hub.commits(repo)) == 2  # one commit per repo, Xet or not
    lfs = xet_hub.commits(repo)[-1]["lfs_files"]
    assert lfs and all(xet_hub.xet_hashes[sha] == hf_xet.hash_files([str(local[path])])[0].hash
                       for path, sha in lfs.items())
    plan = _push(xet_hub, dist, "--dry-run")
    assert f"Compared with the remote: {len(lfs)} by the Xet hash of the stored bytes, 0 by the declared" in plan.output
    again = _push(xet_hub, dist)
    assert again.exit_code == 0 and "no changes, nothing uploaded" in again.output


def test_masked_xet_hashes_prove_nothing_and_the_files_are_read_back(xet_hub: FakeHub, dist: Path) -> None:
    """A listing with masked Xet hashes (64 asterisks, as the Hub may give): the push reads the uploaded files back,
    through Xet, before it tags, and the plan says the comparison rests on the declared sha256."""
    xet_hub.mask_xet = True
    pushed = _push(xet_hub, dist)
    assert pushed.exit_code == 0 and "checksums verified" in pushed.output
    assert xet_hub.lfs_uploads == [] and any("/xet-read-token/" in t for t in xet_hub.xet_tokens)
    lfs = len(xet_hub.commits(f"np-cr/{RTN}")[-1]["lfs_files"])
    plan = _push(xet_hub, dist, "--dry-run")
    assert f"0 by the Xet hash of the stored bytes, {lfs} by the declared sha256 only" in plan.output


def test_the_delivered_repos_are_kept_as_one_collection(hub: FakeHub, recipe_builds: Path, tmp_path: Path) -> None:
    """The push creates the release's collection (title and description from release.yaml) with the delivered repos
    in the order the push takes them (the selection's), each noted by its card's title; a second push writes nothing
    to it; a collection changed on the Hub (an item's note, the order) is put back; --no-collection leaves it
    alone."""
    from release.core.builds import load_release

    dist = tmp_path / "dist"
    for repo in (RTN, f"{RTN}-SmoothQuant", f"{RTN}-RTN-MovingAvgObserver"):
        shutil.copytree(recipe_builds / repo, dist / repo)
        add_card(dist / repo, f"---\nlicense: other\n---\nintro\n# the card of {repo}\n")
    choose(dist, ["rtn", "sq_auto", "rtn_mavg"])
    plan = invoke("push", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert plan.exit_code == 0, plan.output
    repos = re.findall(r"^## (np-cr/\S+) \(", plan.output, flags=re.M)  # the order the push takes them
    assert len(repos) == 3
    listed = "\n".join(f"{i}. `{r}`: the card of {r[6:]}" for i, r in enumerate(repos, 1))
    assert f"## Collection: Cosmos3-Nano-Policy-DROID FP8 (np-cr): to create\n\n{listed}\n" in plan.output
    assert not hub.collections  # a dry run writes nothing
    assert invoke("push", "--dist", dist, "--endpoint", hub.url).exit_code == 0
    (slug, made), = hub.collections.items()
    config = load_release().collection
    assert config is not None and (made["title"], made["description"]) == (config.title, config.description)
    wanted = [(r, f"the card of {r[6:]}") for r in repos]
    assert [(i["id"], i["note"]["text"]) for i in made["items"]] == wanted

    def writes() -> list[tuple[str, str]]:
        return [r for r in hub.requests if r[0] in ("POST", "PATCH") and "/collections" in r[1]]

    before = writes()
    again = invoke("push", "--dist", dist, "--endpoint", hub.url)
    assert "collection Cosmos3-Nano-Policy-DROID FP8: unchanged" in again.output and writes() == before
    made["items"].reverse()  # edited on the Hub: the order and a note
    made["items"][0]["note"] = {"text": "edited"}
    for i, item in enumerate(made["items"]):
        item["position"] = i
    plan = invoke("push", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert "(np-cr): to update" in plan.output and f"set the note of {repos[2]}" in plan.output
    assert "updated (3 repos)" in invoke("push", "--dist", dist, "--endpoint", hub.url).output
    assert [(i["id"], i["note"]["text"]) for i in hub.collections[slug]["items"]] == wanted
    hub.collections[slug]["items"][0]["note"] = {"text": "edited"}
    skipped = invoke("push", "--dist", dist, "--endpoint", hub.url, "--no-collection")
    assert skipped.exit_code == 0 and "collection" not in skipped.output
    assert hub.collections[slug]["items"][0]["note"] == {"text": "edited"}
