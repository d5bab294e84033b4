"""What `release push` prints: a dry run's plan ending with its totals; a push's header and progress on stderr, then
each repo's result with its commit and the totals, never the plan; `--format json` as one document on stdout; `-q`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from release.check.written import WRITTEN
from release.publish.plan import human_size
from tests.conftest import invoke, write_card
from tests.hub_server import FakeHub
from tests.test_push import RTN

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub
REPO = f"np-cr/{RTN}"
PLAN_LINES = (f"## {REPO}", "| file | action | size | storage |", "Commit message: ", "Tag `v1.0.0`")


def _files(dist: Path) -> tuple[int, str]:
    """How many files of the build folder a push publishes (all but the record of what came after verification),
    and their size as the output shows it."""
    files = [p for p in (dist / RTN).rglob("*") if p.is_file() and p.relative_to(dist / RTN).as_posix() != WRITTEN]
    return len(files), human_size(sum(p.stat().st_size for p in files))


def test_a_dry_run_ends_with_its_totals(dist: Path, tmp_path: Path) -> None:
    n, size = _files(dist)
    target = tmp_path / "hub"
    plan = invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run")
    assert plan.exit_code == 0, plan.output
    assert plan.stdout.startswith("# Release plan: release 1.0.0 to ") and f"## {REPO} (rtn)" in plan.stdout
    assert plan.stdout.splitlines()[-1] == f"Summary: 1 repo (1 to create, 0 to update, 0 unchanged); {n} files to " \
        f"upload ({size}), 0 unchanged, 0 to delete; nothing was uploaded (dry run)."
    assert invoke("push", "rtn", "--dist", dist, "--target", target).exit_code == 0
    write_card(dist / RTN, "README.md", "# changed card\n")
    again = invoke("push", "rtn", "--dist", dist, "--target", target, "--dry-run")
    assert again.stdout.splitlines()[-1] == "Summary: 1 repo (0 to create, 1 to update, 0 unchanged); 1 file to " \
        f"upload ({human_size(len('# changed card') + 1)}), {n - 1} unchanged, 0 to delete; nothing was uploaded " \
        "(dry run)."


def test_a_push_says_what_goes_where_then_what_it_did_not_the_plan(hub: FakeHub, dist: Path) -> None:
    n, size = _files(dist)
    first = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url)
    assert first.exit_code == 0, first.output
    commit = hub.commits(REPO)[-1]["id"]
    slug = next(iter(hub.collections))
    assert first.stderr.startswith(f"Pushing release 1.0.0 to {hub.url}: 1 repo (1 to create, 0 to update, 0 "
                                   f"unchanged); {n} files to upload ({size}), 0 unchanged, 0 to delete\n"
                                   f"{REPO} (1/1): uploading {n} files ({size})\n")
    assert first.stdout == (f"{REPO}: committed {commit[:12]} to main ({n} files), tagged v1.0.0, checksums "
                            f"verified\n  {hub.url}/{REPO}/commit/{commit}\n"
                            "collection Cosmos3-Nano-Policy-DROID FP8: created (1 repo), "
                            f"{hub.url}/collections/{slug}\n"
                            f"Pushed release 1.0.0 to {hub.url}: 1 repo (1 created, 0 updated, 0 unchanged); "
                            f"{n} files uploaded ({size}), 0 unchanged, 0 deleted.\n")
    again = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url)
    assert f"{REPO} (1/1): no changes\n" in again.stderr
    assert again.stdout == (f"{REPO}: no changes, nothing uploaded; tag v1.0.0 already on {commit[:12]}\n"
                            "collection Cosmos3-Nano-Policy-DROID FP8: unchanged\n"
                            f"Pushed release 1.0.0 to {hub.url}: 1 repo (0 created, 0 updated, 1 unchanged); "
                            f"0 files uploaded (0 B), {n} unchanged, 0 deleted.\n")
    for line in PLAN_LINES:
        assert line not in first.output + again.output
    write_card(dist / RTN, "README.md", "---\nlicense: other\n---\n# proposed\n")
    pr = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--create-pr")
    assert pr.exit_code == 0, pr.output
    assert pr.stdout == (f"{REPO}: opened a pull request (1 file)\n  {hub.url}/{REPO}/discussions/1\n"
                         f"Pushed release 1.0.0 to {hub.url} as pull requests: 1 repo (0 created, 1 updated, 0 "
                         f"unchanged); 1 file uploaded (34 B), {n - 1} unchanged, 0 deleted.\n")


def test_json_is_one_document_on_stdout(hub: FakeHub, dist: Path) -> None:
    n, _ = _files(dist)
    upload = sum(p.stat().st_size for p in (dist / RTN).rglob("*")
                 if p.is_file() and p.relative_to(dist / RTN).as_posix() != WRITTEN)
    totals = {"repos": {"create": 1, "update": 0, "unchanged": 0},
              "files": {"add": n, "modify": 0, "delete": 0, "unchanged": 0}, "upload_bytes": upload}
    plan = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--dry-run", "--format", "json")
    assert plan.exit_code == 0, plan.output
    doc = json.loads(plan.stdout)
    assert list(doc) == sorted(doc) and doc["dry_run"] is True and doc["destination"] == hub.url
    assert doc["summary"] == totals and [r["repo_id"] for r in doc["repos"]] == [REPO]
    assert len(doc["repos"][0]["files"]) == n and not hub.repos
    pushed = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--format", "json")
    assert pushed.exit_code == 0, pushed.output
    assert pushed.stderr.startswith(f"Pushing release 1.0.0 to {hub.url}: ")  # the progress is not on stdout
    doc = json.loads(pushed.stdout)
    commit = hub.commits(REPO)[-1]["id"]
    assert doc["dry_run"] is False and doc["version"] == "1.0.0" and doc["summary"] == totals
    [repo] = doc["repos"]
    assert list(repo) == sorted(repo)
    assert {k: repo[k] for k in ("repo_id", "build", "status", "commit", "url", "tag", "tag_action")} == {
        "repo_id": REPO, "build": "rtn", "status": "create", "commit": commit,
        "url": f"{hub.url}/{REPO}/commit/{commit}", "tag": "v1.0.0", "tag_action": "create"}
    assert repo["files"] == totals["files"] and repo["upload_bytes"] == upload
    again = json.loads(invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--format", "json").stdout)
    assert again["summary"]["repos"] == {"create": 0, "update": 0, "unchanged": 1}
    assert again["repos"][0]["commit"] is None and again["repos"][0]["status"] == "unchanged"


@pytest.mark.parametrize("quiet", [("-q", "push"), ("push", "--quiet")])
def test_quiet_leaves_the_result_alone(quiet: tuple[str, ...], hub: FakeHub, dist: Path) -> None:
    loud = invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert "build files: " in loud.stderr  # said without -q
    plan = invoke(*quiet, "rtn", "--dist", dist, "--endpoint", hub.url, "--dry-run")
    assert plan.exit_code == 0 and plan.stderr == "" and plan.stdout == loud.stdout  # the plan is the result
    pushed = invoke(*quiet, "rtn", "--dist", dist, "--endpoint", hub.url)
    assert pushed.exit_code == 0, pushed.output
    assert pushed.stderr == ""  # no header, progress, upload bars or build files line
    commit = hub.commits(REPO)[-1]["id"]
    assert pushed.stdout.startswith(f"{REPO}: committed {commit[:12]} to main")
    assert "\nPushed release 1.0.0 to " in pushed.stdout
    assert invoke("push", "rtn", "--dist", dist, "--endpoint", hub.url).stderr != ""  # each run starts loud


def test_quiet_errors_stay(dist: Path, tmp_path: Path) -> None:
    (dist / RTN / ".env").write_text("HF_TOKEN=x\n")
    result = invoke("-q", "push", "rtn", "--dist", dist, "--target", tmp_path / "hub")
    assert result.exit_code == 2 and result.stdout == ""
    assert result.stderr.startswith("error: ") and ".env: looks like a secret" in result.stderr
