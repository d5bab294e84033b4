"""``release campaign``: the sweep made, verified and evaluated, then tables, selection and cards, in one command;
killed at three points (a real SIGKILL of the process) and resumed, it gives the bytes of an uninterrupted run; a
dropped checkpoint that the selection chooses is rebuilt and checked against the bytes its verification saw."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import EPOCH, MAVG, MAVG005, ROOT, RTN, campaign_args, dist_files, invoke


def test_the_campaign_selects_rebuilds_the_chosen_and_cards_the_delivered(uninterrupted: tuple[Path, str]) -> None:
    dist, output = uninterrupted
    selection = json.loads((dist / "selection.json").read_text())
    assert selection["chosen"] == ["rtn", "rtn_mavg005"] and selection["rule"]["split"] == "validation"
    journal = json.loads((dist / "campaign.json").read_text())["builds"]
    assert all(journal[b]["verified"] and journal[b]["evaluated"] for b in ("rtn", "rtn_mavg", "rtn_mavg005"))
    # the build not chosen keeps its provenance, report and results, not its weights
    assert "dropped" in journal["rtn_mavg"] and "dropped" not in journal["rtn_mavg005"]
    assert not list((dist / MAVG).rglob("*.safetensors")) and not list((dist / MAVG).rglob("*.pth"))
    assert {p.name for p in (dist / MAVG / "results").iterdir()} == {"fakequant-calibration.npz",
                                                                     "fakequant-validation.npz"}
    assert (dist / MAVG / "provenance.json").is_file()
    assert (dist / MAVG / "verification" / "report.json").is_file()
    # the dropped moving-average build, chosen, was rebuilt and every weight file equals what verification saw
    assert "rtn_mavg005: rebuilt, its 7 weight files equal the verified bytes, put back" in output
    report = json.loads((dist / MAVG005 / "verification" / "report.json").read_text())["manifest"]
    weights = [rel for rel in report if rel.endswith((".safetensors", ".pth"))]
    assert len(weights) == 7
    from release.core.io import sha256_file

    assert all(sha256_file(dist / MAVG005 / rel) == report[rel]["sha256"] for rel in weights)
    assert not (dist / ".campaign-rebuild").exists()
    # every delivered build, and only those, got its deployed results after the selection, before its card
    for repo in (RTN, MAVG005):
        assert (dist / repo / "results" / "deployed-validation.npz").is_file()
        assert (dist / repo / "README.md").is_file() and (dist / repo / "README.ko.md").is_file()
    assert all(journal[b].get("chosen_evaluated") for b in ("rtn", "rtn_mavg005"))
    assert not (dist / MAVG / "README.md").exists()
    card = (dist / MAVG005 / "README.md").read_text()
    advice = next(line for line in card.splitlines() if line.startswith("Which build to use"))
    assert "the selection's first pick: rank" in advice and "On deployed, CPU emulation, held-out labs:" in advice
    tables = json.loads((dist / "tables" / "tables.json").read_text())
    assert {r["build"] for r in tables["records"] if r["path"] == "deployed"} == {"rtn", "rtn_mavg005"}


def _run_until(args: list[str], env: dict[str, str], done: Callable[[], bool], timeout: float = 900) -> None:
    """Start the command, SIGKILL it once ``done()`` holds (polled every 50 ms); it must not finish before."""
    proc = subprocess.Popen([sys.executable, "-m", "release", *args], env=env, cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    start = time.monotonic()
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the campaign ended before the kill point (exit {proc.returncode}): "
                                 f"{proc.stderr.read() if proc.stderr else ''}")
        assert time.monotonic() - start < timeout, "the kill point was never reached"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_a_killed_campaign_resumes_to_the_same_bytes(small: Path, narrowed: Path, tmp_path: Path,
                                                    uninterrupted: tuple[Path, str]) -> None:
    dist = tmp_path / "dist"
    env = {**os.environ, "RELEASE_BUILDS": str(narrowed), "RELEASE_CACHE": str(tmp_path / "cache"),
           "SOURCE_DATE_EPOCH": EPOCH, "PYTHONPATH": str(ROOT)}
    args = campaign_args(small, dist)
    journal = dist / "campaign.json"
    # 1. after a build: the RTN build is in place, not yet recorded as verified
    _run_until(args, env, lambda: (dist / RTN / "provenance.json").is_file())
    # 2. mid-eval: the moving-average build's first split has results, its second not yet
    _run_until(args, env, lambda: (dist / MAVG / "results" / "fakequant-calibration.npz").is_file())
    # 3. after the selection, before the chosen build is rebuilt and the cards are written
    _run_until(args, env, lambda: (dist / "selection.json").is_file())
    assert journal.is_file() and not (dist / RTN / "README.md").exists()
    done = subprocess.run([sys.executable, "-m", "release", *args], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    whole, _ = uninterrupted
    ours, theirs = dist_files(dist), dist_files(whole)
    assert sorted(ours) == sorted(theirs)
    assert [name for name in ours if ours[name] != theirs[name]] == []


def test_a_rebuild_that_differs_from_the_verified_bytes_is_refused(uninterrupted: tuple[Path, str], small: Path,
                                                                 narrowed: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    dist = tmp_path / "dist"
    shutil.copytree(uninterrupted[0], dist)
    shard = "transformer/diffusion_pytorch_model-00001-of-00004.safetensors"
    # the chosen build's weights dropped, and its report recording other bytes for one shard
    path = dist / "campaign.json"
    doc = json.loads(path.read_text())
    doc["builds"]["rtn_mavg005"]["dropped"] = [shard]
    path.write_text(json.dumps(doc))
    (dist / MAVG005 / shard).unlink()
    report = dist / MAVG005 / "verification" / "report.json"
    raw = json.loads(report.read_text())
    raw["manifest"][shard]["sha256"] = "0" * 64
    report.write_text(json.dumps(raw))
    monkeypatch.setenv("RELEASE_BUILDS", str(narrowed))
    monkeypatch.setenv("RELEASE_CACHE", str(uninterrupted[0].parent / "cache"))
    result = invoke(*campaign_args(small, dist))
    assert result.exit_code == 2, result.output
    assert f"{shard}: the rebuilt rtn_mavg005 differs from the bytes its verification saw" in result.output
    assert "0" * 64 in result.output and not (dist / MAVG005 / shard).exists()


def _copy(uninterrupted: tuple[Path, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, narrowed: Path) -> Path:
    import shutil

    dist = tmp_path / "dist"
    shutil.copytree(uninterrupted[0], dist)
    monkeypatch.setenv("RELEASE_BUILDS", str(narrowed))
    monkeypatch.setenv("RELEASE_CACHE", str(uninterrupted[0].parent / "cache"))
    return dist


def test_a_damaged_journal_is_named(uninterrupted: tuple[Path, str], small: Path, narrowed: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    dist = _copy(uninterrupted, tmp_path, monkeypatch, narrowed)
    (dist / "campaign.json").write_text('{"format": "release-campaign/1", "builds": ')
    result = invoke(*campaign_args(small, dist))
    assert result.exit_code == 2, result.output
    assert f"error: {dist / 'campaign.json'}" in result.output and "Traceback" not in result.output


def test_too_little_disk_to_put_a_chosen_build_back_is_refused_before_the_rebuild(
        uninterrupted: tuple[Path, str], small: Path, narrowed: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil
    from collections import namedtuple

    dist = _copy(uninterrupted, tmp_path, monkeypatch, narrowed)
    journal = json.loads((dist / "campaign.json").read_text())
    shards = [rel for rel in json.loads((dist / MAVG005 / "verification" / "report.json").read_text())["manifest"]
              if rel.endswith(".safetensors")]
    journal["builds"]["rtn_mavg005"]["dropped"] = shards
    (dist / "campaign.json").write_text(json.dumps(journal))
    for rel in shards:
        (dist / MAVG005 / rel).unlink()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**9, 10**9 - 1000, 1000))
    result = invoke(*campaign_args(small, dist))
    assert result.exit_code == 2, result.output
    assert "putting back the weights of rtn_mavg005 needs" in result.output and "0.0 GB are free" in result.output
    assert not (dist / ".campaign-rebuild").exists()


def test_an_evaluation_naming_no_build_file_is_refused(narrowed: Path, small: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    import shutil

    builds = tmp_path / "builds"
    shutil.copytree(narrowed, builds)
    path = builds / "release.yaml"
    path.write_text(path.read_text().replace("  evals:\n", "  evals:\n    - {path: deployed, split: validation, "
                                                             "builds: [rtn, no_such_build]}\n"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    result = invoke(*campaign_args(small, tmp_path / "dist"))
    assert result.exit_code == 2, result.output
    assert "no_such_build" in result.output and not (tmp_path / "dist").exists()
