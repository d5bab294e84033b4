"""The dry-run listing of each repo's upload."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import invoke


@pytest.fixture
def dist(rtn_build: Path, tmp_path: Path) -> Path:
    d = tmp_path / "dist"
    shutil.copytree(rtn_build, d / rtn_build.name)
    return d


def test_push_dry_run_lists_every_file(dist: Path) -> None:
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
