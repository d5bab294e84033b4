"""release observations import-lerobot on LeRobot datasets without DROID's own fields: the instruction from the
standard task (``task_index`` in ``meta/tasks.jsonl`` or ``meta/tasks.parquet``), the lab from ``--lab-field``, and
one-line errors that say which field is missing and how to fix it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from release.inputs.observations import load_observations
from tests.conftest import invoke
from tests.test_lerobot import EPISODES, Shape, write_dataset

pytest.importorskip("av")
pytest.importorskip("pandas")


def _import(dataset: Path, out: Path, *options: str) -> dict[str, object]:
    """Import 4 frames of TRI and AUTOLab through the CLI; the observation set's ``index.json`` source."""
    result = invoke("observations", "import-lerobot", dataset, "--out", out, "--per-lab", "4", "--labs",
                    "TRI,AUTOLab", *options)
    assert result.exit_code == 0, result.output
    for o in load_observations(out):
        lab, _, text = EPISODES[int(o.episode_id.split("/")[1])]
        assert o.lab == lab and o.instruction == text != ""
    source: dict[str, object] = json.loads((out / "index.json").read_text())["source"]
    return source


@pytest.mark.parametrize(("version", "tasks"), [("v2.1", "meta/tasks.jsonl"), ("v3.0", "meta/tasks.parquet")])
def test_the_instruction_comes_from_the_task_without_language_instruction(version: str, tasks: str,
                                                                          tmp_path: Path) -> None:
    """The frames' task_index in lerobot's task table (v3.0: indexed by the task string, as lerobot writes it); the
    episode whose task is empty is skipped as DROID's without a language_instruction is."""
    dataset = write_dataset(tmp_path / "tasks_only", version, Shape(droid_text=False))
    source = _import(dataset, tmp_path / "obs")
    assert source["instruction_field"] == f"task_index: {tasks}" and source["lab_field"] == "building"
    result = invoke("observations", "import-lerobot", dataset, "--out", tmp_path / "all", "--per-lab", "18",
                    "--labs", "AUTOLab")
    assert result.exit_code == 0, result.output
    assert {o.episode_id.split("/")[1] for o in load_observations(tmp_path / "all")} == {"1", "4"}


@pytest.mark.parametrize(("version", "per_episode"), [("v2.1", True), ("v3.0", False), ("v3.0", True)])
def test_lab_field_names_another_column(version: str, per_episode: bool, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "sites", version, Shape(lab="site", lab_per_episode=per_episode))
    source = _import(dataset, tmp_path / "obs", "--lab-field", "site")
    assert source["lab_field"] == "site" and source["instruction_field"] == "language_instruction"


@pytest.mark.parametrize(("shape", "message"), [
    (Shape(lab="site"), "lab field 'building' is neither a feature nor an episode column; pass --lab-field with the "
                        "column that names each episode's lab (string columns per frame: site; per episode: none)"),
    (Shape(lab="site", lab_per_episode=True), "(string columns per frame: none; per episode: site)"),
    (Shape(lab=None), "lab field 'building' is neither a feature nor an episode column, and the dataset has no lab "
                      "column at all"),
])
def test_a_missing_lab_field_is_a_one_line_error(shape: Shape, message: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "no_building", "v2.1", shape)
    result = invoke("observations", "import-lerobot", dataset, "--out", tmp_path / "obs", "--labs", "TRI")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert message in result.output and "--lab-field" in result.output, result.output
    assert str(dataset / "meta" / "info.json") in result.output
    assert not (tmp_path / "obs").exists()


@pytest.mark.parametrize("version", ["v2.1", "v3.0"])
def test_no_instruction_field_is_named_not_ask_for_fewer(version: str, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "mute", version, Shape(droid_text=False, tasks=False))
    result = invoke("observations", "import-lerobot", dataset, "--out", tmp_path / "obs", "--labs", "TRI")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert (": no instruction field (looked for language_instruction (_2, _3), task, or task_index with "
            "meta/tasks.jsonl (v2.1) or meta/tasks.parquet (v3.0))") in result.output, result.output
    assert "ask for fewer" not in result.output and not (tmp_path / "obs").exists()


def test_an_empty_language_instruction_gives_way_to_the_task(tmp_path: Path) -> None:
    """A dataset whose language_instruction is empty in every frame takes its instructions from the task table."""
    import pandas as pd

    dataset = write_dataset(tmp_path / "blank", "v3.0")
    path = dataset / "data/chunk-000/file-000.parquet"
    table = pd.read_parquet(path)
    table["language_instruction"] = ""
    table.to_parquet(path)
    assert _import(dataset, tmp_path / "obs")["instruction_field"] == "task_index: meta/tasks.parquet"
