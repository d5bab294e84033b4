"""The plain English card and the dry-run listing of each repo's upload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from tests.conftest import invoke


@pytest.fixture
def dist(rtn_build: Path, tmp_path: Path) -> Path:
    d = tmp_path / "dist"
    shutil.copytree(rtn_build, d / rtn_build.name)
    return d


def test_card_renders_from_data(dist: Path) -> None:
    result = invoke("card", "--dist", dist, "--lang", "en")
    assert result.exit_code == 0, result.output
    readme = dist / "Cosmos3-Nano-Policy-DROID-FP8" / "README.md"
    card = ModelCard(readme.read_text())
    data = card.data.to_dict()
    assert data["base_model"] == "nvidia/Cosmos3-Nano-Policy-DROID"
    assert data["base_model_relation"] == "quantized"
    assert (data["license"], data["license_name"]) == ("other", "OpenMDW-1.1")
    assert data["pipeline_tag"] == "robotics" and data["language"] == ["en"]
    prov = json.loads((dist / "Cosmos3-Nano-Policy-DROID-FP8" / "provenance.json").read_text())
    text = card.text
    assert prov["source"]["revision"] in text and prov["calibration"]["sha256"] in text
    assert "28 Linear layers" in text and "256 transformer calls" in text
    assert "np-cr/Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant" in text  # siblings linked


def test_card_errors(dist: Path, tmp_path: Path) -> None:
    result = invoke("card", "--dist", dist, "--lang", "en,xx")
    assert result.exit_code == 2 and "unknown language code 'xx'" in result.output
    (dist / "Cosmos3-Nano-Policy-DROID-FP8" / "provenance.json").unlink()
    result = invoke("card", "rtn", "--dist", dist)
    assert result.exit_code == 2 and "run 'release build rtn' first" in result.output
    result = invoke("card", "--dist", tmp_path / "empty")
    assert result.exit_code == 2 and "no built repos" in result.output


def test_push_dry_run_lists_every_file(dist: Path) -> None:
    invoke("card", "--dist", dist)
    result = invoke("push", "--dist", dist, "--dry-run")
    assert result.exit_code == 0, result.output
    folder = dist / "Cosmos3-Nano-Policy-DROID-FP8"
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    assert "## np-cr/Cosmos3-Nano-Policy-DROID-FP8 (rtn)" in result.output
    for name in files:
        assert f"`{name}`" in result.output
    assert f"{len(files)} files" in result.output
    assert "| `transformer/modelopt_state.pth` |" in result.output
    other = invoke("push", "--dist", dist, "--dry-run", "--org", "someone")
    assert "someone/Cosmos3-Nano-Policy-DROID-FP8" in other.output


def test_push_without_dry_run_is_refused(dist: Path) -> None:
    result = invoke("push", "--dist", dist)
    assert result.exit_code == 2 and "add --dry-run" in result.output
