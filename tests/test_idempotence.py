"""No command damages a good state (issues 47 and 52). On a finished campaign (the narrowed campaign of
``tests/conftest.py``: three builds, one dropped), every command a user may re-run leaves every file byte-identical
and the release pushable; a dropped build is refused in one line; a card run of fewer languages removes the others;
publishing trusts neither a hand-edited record nor a poisoned hash cache; SIGTERM during ``card`` or a campaign's
rerun leaves no temporary and nothing verified lost; an edit of the release's policy redoes what depends on it and
keeps every delivered build's verified weights."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import EPOCH, MAVG, MAVG005, ROOT, RTN, campaign_args, dist_files, invoke


@pytest.fixture
def finished(uninterrupted: tuple[Path, str], narrowed: Path, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the finished campaign's dist, with its own cache, under the campaign's builds and date."""
    dist = tmp_path / "dist"
    shutil.copytree(uninterrupted[0], dist)
    shutil.copytree(uninterrupted[0].parent / "cache", tmp_path / "cache")
    monkeypatch.setenv("RELEASE_BUILDS", str(narrowed))
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SOURCE_DATE_EPOCH", EPOCH)
    return dist


def _ok(*args: str | os.PathLike[str]) -> str:
    result = invoke(*args)
    assert result.exit_code == 0, f"{args}: {result.output}"
    return result.output


def _weights(dist: Path, repo: str) -> dict[str, bytes]:
    return {rel: data for rel, data in dist_files(dist / repo).items() if rel.endswith((".safetensors", ".pth"))}


def _verified_or_dropped(folder: Path) -> None:
    """Every file the folder's verification report lists is there with those bytes, or is a dropped weight file."""
    from release.core.io import sha256_file

    manifest = json.loads((folder / "verification" / "report.json").read_text())["manifest"]
    for rel, entry in manifest.items():
        if (folder / rel).is_file():
            assert sha256_file(folder / rel) == entry["sha256"], f"{folder / rel}: not the verified bytes"
        else:
            assert rel.endswith((".safetensors", ".pth")), f"{folder / rel}: verified, and gone"


def test_every_command_rerun_on_a_finished_release_changes_no_byte(finished: Path, small: Path,
                                                                   tmp_path: Path) -> None:
    dist, target = finished, tmp_path / "hub"
    before = dist_files(dist)
    # carded builds: the cards and plots are not "unexpected"; the dropped one is left out, and said so
    assert "rtn_mavg: dropped by the campaign" in _ok("verify", "--all", "--dist", dist)
    _ok("tables", "--dist", dist)
    _ok("select", "--dist", dist)
    _ok("card", "--dist", dist)
    _ok("manifest", "--dist", dist, "--out", tmp_path / "release.lock.json")
    plan = _ok("push", "--dist", dist, "--target", target, "--dry-run")
    assert "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvg005" in plan
    _ok("push", "--dist", dist, "--target", target)
    assert "no changes" in _ok("push", "--dist", dist, "--target", target)
    _ok(*campaign_args(small, dist))
    after = dist_files(dist)
    assert sorted(after) == sorted(before)
    assert [rel for rel in after if after[rel] != before[rel]] == []
    # and the release is still pushable: a dry run against the pushed target plans no change
    assert "no changes" in _ok("push", "--dist", dist, "--target", target, "--dry-run").lower()


def test_verify_of_a_dropped_build_is_one_line_and_keeps_its_report(finished: Path) -> None:
    report = finished / MAVG / "verification" / "report.json"
    kept = report.read_bytes()
    result = invoke("verify", "rtn_mavg", "--dist", finished)
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and "was dropped" in line and "'release build rtn_mavg'" in line
    assert "Traceback" not in line and report.read_bytes() == kept


def test_values_check_of_a_build_without_weights_fails(finished: Path, small: Path) -> None:
    """A check that looked at nothing must not pass: the weights gone (no report to say so)."""
    from release.check.values import check_values

    check = check_values(finished / MAVG, small / "source")
    assert check.status == "failed" and "0 FP8 weights" in check.summary, check.summary


def test_a_card_run_of_fewer_languages_removes_the_others(finished: Path, tmp_path: Path) -> None:
    folder = finished / RTN
    assert (folder / "README.ko.md").is_file() and (folder / "forest.ko.png").is_file()
    _ok("card", "--dist", finished, "--lang", "en")
    assert not (folder / "README.ko.md").exists() and not (folder / "forest.ko.png").exists()
    written = json.loads((folder / "verification" / "written.json").read_text())["files"]
    assert not [rel for rel in written if "ko" in rel]
    _ok("push", "--dist", finished, "--target", tmp_path / "hub")
    published = {p.name for p in (tmp_path / "hub" / "np-cr" / RTN).iterdir()}
    assert "README.md" in published and "README.ko.md" not in published and "forest.ko.png" not in published
    result = invoke("card", "--dist", finished, "--lang", "en,ko,fr")
    assert result.exit_code == 2 and "unknown language code 'fr'" in result.output


def test_a_hand_edited_record_cannot_approve_a_language_the_release_does_not_render(finished: Path,
                                                                                  tmp_path: Path) -> None:
    import hashlib

    folder = finished / RTN
    data = (folder / "README.md").read_bytes()
    (folder / "README.xx.md").write_bytes(data)
    path = folder / "verification" / "written.json"
    doc = json.loads(path.read_text())
    doc["files"]["README.xx.md"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
                                    "by": "release card"}
    path.write_text(json.dumps(doc))
    result = invoke("push", "--dist", finished, "--target", tmp_path / "hub")
    assert result.exit_code == 1, result.output
    assert "README.xx.md: no file this release writes (its languages: en, ko" in result.output
    assert not (tmp_path / "hub" / "np-cr").exists()


def test_a_poisoned_hash_cache_does_not_keep_a_tampered_target_file(finished: Path, tmp_path: Path) -> None:
    from release.core.digest import stamp

    target = tmp_path / "hub"
    _ok("push", "--dist", finished, "--target", target)
    shard = next((target / "np-cr" / RTN / "transformer").glob("*.safetensors"))
    good = (finished / RTN / "transformer" / shard.name).read_bytes()
    cache_file = Path(os.environ["RELEASE_CACHE"]) / "hashes.json"
    cache = json.loads(cache_file.read_text())
    honest = cache[str((finished / RTN / "transformer" / shard.name).resolve())]  # the pushed bytes' digests
    tampered = bytearray(good)
    tampered[-1] ^= 1
    shard.write_bytes(bytes(tampered))
    cache[str(shard.resolve())] = {**honest, "stamp": stamp(shard.stat())}  # claimed for the tampered target file
    cache_file.write_text(json.dumps(cache))
    plan = _ok("push", "--dist", finished, "--target", target, "--dry-run")
    assert "no changes" not in plan.splitlines()[-1].lower()
    _ok("push", "--dist", finished, "--target", target)
    assert shard.read_bytes() == good


def _terminated(args: list[str], env: dict[str, str], delay: float) -> int:
    """Run ``release ARGS``, send SIGTERM after ``delay`` seconds (or let it finish first); its exit status."""
    proc = subprocess.Popen([sys.executable, "-m", "release", *args], env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        proc.wait(delay)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(120)


def _temporaries(dist: Path) -> list[str]:
    return [str(p) for p in dist.rglob("*") if p.name.endswith(".tmp") or ".tmp-" in p.name]


@pytest.mark.parametrize("command", ["card", "campaign"])
def test_sigterm_during_a_rerun_leaves_no_temporary_and_loses_nothing(finished: Path, small: Path, tmp_path: Path,
                                                                      command: str) -> None:
    """SIGTERM at growing instants of a rerun of ``card`` or of the whole finished campaign: after each, no temporary,
    every file as it was, and the release pushes at once."""
    dist, env = finished, {**os.environ, "PYTHONPATH": str(ROOT)}
    before = dist_files(dist)
    args = ["card", "--dist", str(dist)] if command == "card" else [str(a) for a in campaign_args(small, dist)]
    start = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "release", *args], env=env, cwd=ROOT, capture_output=True, timeout=300)
    whole = time.monotonic() - start
    assert run.returncode == 0, run.stderr
    statuses = set()
    for fraction in (0.3, 0.6, 0.8, 0.95):
        statuses.add(_terminated(args, env, whole * fraction))
        assert _temporaries(dist) == []
        after = dist_files(dist)
        assert sorted(after) == sorted(before) and [r for r in after if after[r] != before[r]] == []
    assert statuses & {143, 130, 1}, statuses  # at least one instant was inside the run
    _ok("push", "--dist", dist, "--target", tmp_path / "hub")


def test_an_edited_policy_redoes_what_depends_on_it_and_keeps_the_delivered_weights(
        finished: Path, small: Path, narrowed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The step policy's guidance edited in release.yaml: every build is made again under it (the capture runs the
    policy) and evaluated again; the delivered builds end with their weights, each equal to what its new
    verification saw, and the release pushes."""
    from release.core.io import sha256_file

    builds = tmp_path / "builds"
    shutil.copytree(narrowed, builds)
    path = builds / "release.yaml"
    path.write_text(path.read_text().replace("  guidance: 3.0", "  guidance: 2.0"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    old = {repo: _weights(finished, repo) for repo in (RTN, MAVG005)}
    # killed (SIGKILL) once the first build made under the new policy is in place: every folder's files are still
    # the bytes its report verified (or dropped weights)
    provenance = finished / RTN / "provenance.json"
    proc = subprocess.Popen([sys.executable, "-m", "release", *map(str, campaign_args(small, finished))],
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while json.loads(provenance.read_text())["policy"]["guidance"] != 2.0:
        assert proc.poll() is None and time.monotonic() < deadline, "the campaign ended before the kill point"
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    for repo in (RTN, MAVG, MAVG005):
        _verified_or_dropped(finished / repo)
    _ok(*campaign_args(small, finished))
    chosen = json.loads((finished / "selection.json").read_text())["chosen"]
    journal = json.loads((finished / "campaign.json").read_text())["builds"]
    repos = {"rtn": RTN, "rtn_mavg": MAVG, "rtn_mavg005": MAVG005}
    for name in chosen:
        report = json.loads((finished / repos[name] / "verification" / "report.json").read_text())["manifest"]
        weights = [rel for rel in report if rel.endswith((".safetensors", ".pth"))]
        assert weights and all(sha256_file(finished / repos[name] / rel) == report[rel]["sha256"] for rel in weights)
        assert "dropped" not in journal[name]
    assert _weights(finished, RTN) != old[RTN]  # made again under the new policy
    prov = json.loads((finished / RTN / "provenance.json").read_text())
    assert prov["policy"]["guidance"] == 2.0
    _ok("push", "--dist", finished, "--target", tmp_path / "hub")


def test_an_edited_build_file_redoes_only_that_build(finished: Path, small: Path, narrowed: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The dropped moving-average build's gate edited: that build is made, verified and evaluated again (and dropped
    again); no other build's file changes but the tables, the selection, the journal and the cards that cite them."""
    builds = tmp_path / "builds"
    shutil.copytree(narrowed, builds)
    path = builds / "rtn_mavg.yaml"
    path.write_text(path.read_text().replace("gripper_change_rate: 0.005", "gripper_change_rate: 0.004"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    before = dist_files(finished)
    _ok(*campaign_args(small, finished))
    after = dist_files(finished)
    changed = {rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)}
    assert f"{MAVG}/provenance.json" in changed
    others = {rel for rel in changed if not rel.startswith((f"{MAVG}/", "tables/"))
              and rel not in ("selection.json", "campaign.json")}
    assert all(Path(rel).name.startswith(("README", "forest.")) or rel.endswith("written.json") for rel in others), \
        sorted(others)
    assert not [rel for rel in changed if rel.endswith((".safetensors", ".pth")) and not rel.startswith(f"{MAVG}/")]


def test_an_edited_template_or_catalog_rewrites_only_the_cards_it_renders(finished: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A line added to the card template changes both cards of each delivered build (and their records), nothing
    else; then a Korean msgstr edited in the catalog changes only the Korean cards."""
    from release.publish.card import i18n
    from tests.test_workflows import _a_korean_string_of_every_card

    korean = _a_korean_string_of_every_card()
    templates, locales = tmp_path / "templates", tmp_path / "locales"
    shutil.copytree(ROOT / "templates", templates)
    shutil.copytree(ROOT / "locales", locales)
    monkeypatch.setattr(i18n, "TEMPLATES", templates)
    monkeypatch.setattr(i18n, "LOCALES", locales)
    template = templates / "card.md.j2"
    template.write_text(template.read_text() + "\nA line this edit adds to the template.\n")

    def changed_by_card() -> set[str]:
        before = dist_files(finished)
        _ok("card", "--dist", finished)
        after = dist_files(finished)
        return {rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)}

    cards = {f"{repo}/{name}" for repo in (RTN, MAVG005) for name in ("README.md", "README.ko.md")}
    records = {f"{repo}/verification/written.json" for repo in (RTN, MAVG005)}
    assert changed_by_card() == cards | records
    po = locales / "ko" / "LC_MESSAGES" / "messages.po"
    po.write_text(po.read_text(encoding="utf-8").replace(f'\nmsgstr "{korean}"\n', f'\nmsgstr "{korean} (수정)"\n', 1),
                  encoding="utf-8")
    for cached in (i18n._catalog, i18n._compiled):  # a new process reads the catalog afresh; this one cached it
        cached.cache_clear()
    assert changed_by_card() == {rel for rel in cards if rel.endswith("ko.md")} | records
    assert "A line this edit adds to the template." in (finished / RTN / "README.md").read_text()
