"""`release manifest` and `release push --dry-run --from-manifest`: a real build's files planned without its weights,
against the local Hub server."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from release.check.report import WRITTEN
from tests.conftest import invoke
from tests.hub_server import FakeHub

RTN = "Cosmos3-Nano-Policy-DROID-FP8"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub


def _files(plan: str) -> list[dict[str, Any]]:
    repos = json.loads(plan)["repos"]
    assert len(repos) == 1
    return [{k: f[k] for k in ("path", "action", "size", "storage", "local_hash")} for f in repos[0]["files"]]


def test_the_manifest_records_every_file_and_is_deterministic(carded: Path, release_lock: Path,
                                                              tmp_path: Path) -> None:
    lock = json.loads(release_lock.read_text())
    assert lock["format"] == "release-manifest/1" and lock["version"] == "1.0.0"
    [sibling] = lock["siblings"]
    folder = carded / RTN
    on_disk = sorted(rel for rel in (p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
                     if rel != WRITTEN)  # the record of what came after verification stays local
    assert sibling["build"] == "rtn" and sibling["repo"] == RTN and sorted(sibling["files"]) == on_disk
    for rel, entry in sibling["files"].items():
        data = (folder / rel).read_bytes()
        assert (entry["sha256"], entry["size"]) == (hashlib.sha256(data).hexdigest(), len(data))
        lfs = rel.endswith((".safetensors", ".pth", ".png", ".npz"))
        assert entry["storage"] == ("lfs" if lfs else "git")
        assert entry["sha1"] == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    report = json.loads((folder / "verification" / "report.json").read_text())
    assert all(sibling["files"][rel]["sha256"] == e["sha256"] for rel, e in report["manifest"].items())
    assert sorted(lock["sidecars"]) == [f"{RTN}/provenance.json", f"{RTN}/transformer/config.json",
                                        f"{RTN}/verification/report.json", "selection.json", "tables/tables.json"]
    tables = lock["sidecars"]["tables/tables.json"]
    assert "\n".join(tables["lines"]).encode() == (carded / "tables" / "tables.json").read_bytes()
    again = invoke("manifest", "--dist", carded, "--out", tmp_path / "again.json")
    assert again.exit_code == 0 and "manifest: " in again.output and "1 repos, " in again.output
    assert (tmp_path / "again.json").read_bytes() == release_lock.read_bytes()  # sorted, no dates
    text = release_lock.read_text()
    assert text == json.dumps(lock, indent=2, sort_keys=True) + "\n"


def test_a_plan_from_the_manifest_needs_no_weights_and_shows_only_what_changed(
        hub: FakeHub, carded: Path, release_lock: Path, builds: Path, tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    shutil.copytree(carded, dist)
    lock = tmp_path / "release.lock.json"
    shutil.copy(release_lock, lock)
    from_dist = invoke("push", "--dist", dist, "--endpoint", hub.url, "--dry-run", "--format", "json")
    assert from_dist.exit_code == 0, from_dist.output
    from_lock = invoke("push", "--from-manifest", lock, "--endpoint", hub.url, "--dry-run", "--format", "json")
    assert from_lock.exit_code == 0, from_lock.output
    assert _files(from_lock.stdout) == _files(from_dist.stdout)  # the cards rendered afresh are the same bytes
    assert {f["action"] for f in _files(from_lock.stdout)} == {"add"} and not hub.repos
    assert invoke("push", "--dist", dist, "--endpoint", hub.url).exit_code == 0
    shutil.rmtree(dist)  # from here on no build folder exists: only the manifest
    same = invoke("push", "--from-manifest", lock, "--endpoint", hub.url, "--dry-run")
    assert same.exit_code == 0, same.output
    assert f"## np-cr/{RTN} (rtn): exists, public" in same.output
    assert "No changes: nothing will be uploaded." in same.output and "Tag `v1.0.0`: unchanged" in same.output
    rtn = builds / "rtn.yaml"  # a pull request that changes the build's title changes its cards and plots (which
    # label the build by its title), nothing else
    rtn.write_text(rtn.read_text().replace('  en: "', '  en: "Renamed ', 1).replace('  ko: "', '  ko: "Renamed ', 1))
    changed = invoke("push", "--from-manifest", lock, "--endpoint", hub.url, "--dry-run", "--format", "json",
                     "--retag")
    assert changed.exit_code == 0, changed.output
    assert {f["path"] for f in _files(changed.stdout) if f["action"] != "unchanged"} == {
        "README.md", "README.ko.md", "forest.en.png", "forest.ko.png"}
    assert "+# Cosmos3-Nano-Policy-DROID, Renamed " in json.loads(changed.stdout)["repos"][0]["readme_diff"]
    refused = invoke("push", "--from-manifest", lock, "--endpoint", hub.url)
    assert refused.exit_code == 2 and "only with --dry-run" in refused.output


def _twenty_two(release_lock: Path, builds: Path, tmp_path: Path) -> Path:
    """A manifest of 22 siblings, as the campaign's 22 builds would make: RTN and 21 copies of its build file (each
    its own repo), with RTN's files, sidecars and table records; builds/release.yaml maps them all to repos and has
    no selection rule, so it delivers them all."""
    lock = json.loads(release_lock.read_text())
    [rtn] = lock["siblings"]
    sidecars = lock["sidecars"]
    tables = json.loads("\n".join(sidecars["tables/tables.json"]["lines"]))
    del sidecars["selection.json"]  # made from the three-build tables
    release = (builds / "release.yaml").read_text()
    siblings = [f"  rtn: {RTN}"]
    for i in range(1, 22):
        name, repo = f"rtn_copy{i:02d}", f"{RTN}-Copy{i:02d}"
        text = (builds / "rtn.yaml").read_text().replace("name: rtn", f"name: {name}", 1)
        (builds / f"{name}.yaml").write_text(text.replace(f"repo: {RTN}", f"repo: {repo}", 1))
        siblings.append(f"  {name}: {repo}")
        tables["records"] += [{**r, "build": name} for r in tables["records"] if r["build"] == "rtn"]
        report = json.loads("\n".join(sidecars[f"{RTN}/verification/report.json"]["lines"]))
        data = json.dumps({**report, "build": name, "repo": repo}, indent=2).encode()
        sidecars[f"{repo}/verification/report.json"] = {"sha256": hashlib.sha256(data).hexdigest(),
                                                       "lines": data.decode().split("\n")}
        sidecars[f"{repo}/provenance.json"] = sidecars[f"{RTN}/provenance.json"]
        files = {**rtn["files"], "verification/report.json": {**rtn["files"]["verification/report.json"],
                 "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                 "sha1": hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()}}
        lock["siblings"].append({"build": name, "repo": repo, "files": files})
    data = json.dumps(tables, indent=2).encode()
    sidecars["tables/tables.json"] = {"sha256": hashlib.sha256(data).hexdigest(), "lines": data.decode().split("\n")}
    start = release.index("repos:\n") + len("repos:\n")
    end = release.index("# A release that delivers otherwise")
    release = release[:start] + "\n".join(siblings) + "\n" + release[end:]
    rule = release[release.index("# How the delivered builds were chosen"):release.index("# The campaign")]
    (builds / "release.yaml").write_text(release.replace(rule, ""))
    out = tmp_path / "release.lock.json"
    out.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return out


def test_a_22_sibling_manifest_makes_a_comment_under_githubs_limit(hub: FakeHub, release_lock: Path, builds: Path,
                                                                  tmp_path: Path) -> None:
    from release.publish.preview import COMMENT_BUDGET, COMMENT_LIMIT

    lock = _twenty_two(release_lock, builds, tmp_path)
    preview = tmp_path / "preview"
    result = invoke("push", "--from-manifest", lock, "--endpoint", hub.url, "--dry-run", "--preview", preview)
    assert result.exit_code == 0, result.output
    assert result.output.count("will be created, public") == 22  # the worst case: every file of 22 new repos
    comment = (preview / "comment.md").read_text()
    assert len(comment.encode("utf-16-le")) // 2 <= COMMENT_BUDGET < COMMENT_LIMIT
    assert comment.startswith("<!-- release-push-preview -->\n### Release preview: release 1.0.0 to np-cr")
    assert comment.count(" | will be created, public | ") == 22  # every repo has its summary row
    assert comment.count("<details>") == comment.count("</details>") == 22 and "left out" not in comment
    assert "are in this run's artifact" in comment
    plan = (preview / "plan.md").read_text()
    assert len(plan) > COMMENT_LIMIT and plan.count("## np-cr/") == 22  # the full plan is the artifact's
    assert len(json.loads((preview / "plan.json").read_text())["repos"]) == 22
    for i in (0, 21):
        repo = RTN if i == 0 else f"{RTN}-Copy{i:02d}"
        cards = sorted(p.name for p in (preview / "cards" / repo).iterdir())
        assert cards == ["LICENSE", "README.ko.md", "README.md", "forest.en.png", "forest.ko.png"]


@pytest.mark.parametrize("repos, files, cut", [(3, 2, None), (60, 40, "details"), (1200, 1, "rows")])
def test_the_comment_is_cut_with_a_pointer_rather_than_fail(repos: int, files: int, cut: str | None) -> None:
    from release.core.builds import load_release
    from release.publish.plan import FilePlan, RepoPlan
    from release.publish.preview import COMMENT_BUDGET, render_comment
    from release.publish.request import PushRequest

    request = PushRequest(load_release(), [], "np-cr", Path("dist"), True, None, False, "markdown", None, None)
    plans = [RepoPlan(f"np-cr/repo-{i:04d}", "rtn", True, "a" * 40, commit_message="Release 1.0.0: rtn",
                      files=[FilePlan(f"transformer/diffusion_pytorch_model-{j:05d}-of-{files:05d}.safetensors",
                                      "modify", 5 << 30, "lfs", "b" * 64, "c" * 64) for j in range(files)])
             for i in range(repos)]
    comment = render_comment(plans, request)
    assert len(comment) <= COMMENT_BUDGET and comment.endswith("are in this run's artifact.\n")
    rows, blocks = comment.count(" | rtn | exists | "), comment.count("<details>")
    assert comment.count("</details>") == blocks
    if cut is None:
        assert rows == blocks == repos and "left out" not in comment
    elif cut == "details":
        assert rows == repos and 0 < blocks < repos
        assert f"The details of {repos - blocks} more repos are left out here" in comment
    else:
        assert blocks == 0 and 0 < rows < repos
        assert f"{repos - rows} more repos and every repo's details are left out here" in comment
