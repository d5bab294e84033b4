"""The third round of bad inputs (issue 47, "Inputs still reaching an internal error or a wrong acceptance"): each is
refused in one line on stderr that names the file and the field or array, exit 2, before any work and with nothing
written. The configuration cases run the command that reads the build files first (``release build`` with a source
that does not exist, which is never reached); the results cases run ``release tables`` on a dist of crafted results.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

from release.core.builds import load_build
from tests.conftest import CARD_DATA, invoke
from tests.test_faults_inputs import refused
from tests.test_faults_stats import RESAMPLES, make_dist


def _replace(path: Path, old: str, new: str) -> int:
    """``old`` replaced by ``new`` in ``path``; the line ``new`` starts on."""
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))
    return text[: text.index(old)].count("\n") + 1


def _build_refused(tmp_path: Path, name: str, *names: str) -> str:
    out = tmp_path / "dist"
    message = refused(invoke("build", name, "--source", tmp_path / "no-source", "--out", out), *names)
    assert not out.exists()
    return message


# --- SmoothQuant's alpha grid: 1 to 1,000 alphas (a step of 1e-9 asked for 10^9 and ran out of memory) ---


@pytest.mark.parametrize("step", ["1.0e-9", "1.0e-5", "0.001", "5.0e-324"])
def test_an_alpha_step_that_makes_more_than_1000_alphas_is_refused(builds: Path, tmp_path: Path, step: str) -> None:
    line = _replace(builds / "sq_auto.yaml", "  alpha: auto\n", f"  alpha: auto\n  alpha_step: {step}\n") + 1
    _build_refused(tmp_path, "sq_auto", f"sq_auto.yaml:{line}:", "field 'smoothquant.alpha_step'",
                   "more than 1,000 alphas", "give a step of 0.001001 or more")


def test_the_step_the_refusal_gives_searches_1000_alphas(builds: Path) -> None:
    from release.quantize.recipes.smoothing import SmoothQuant

    path = builds / "sq_auto.yaml"
    original = path.read_text()
    path.write_text(original.replace("  alpha: auto\n", "  alpha: auto\n  alpha_step: 0.001001\n"))
    assert len(SmoothQuant().grid(load_build("sq_auto"))) == 1000  # the message's step: the largest grid allowed


# --- results npz holding Python objects: never unpickled, named by file and array ---


@pytest.mark.parametrize(("array", "where"), [("computed", "build"), ("computed", "yardstick"), ("labs", "build"),
                                              ("reference", "build")])
def test_a_results_array_of_python_objects_is_refused_by_name(tmp_path: Path, array: str, where: str) -> None:
    dist = make_dist(tmp_path)
    file = (dist / load_build("rtn_mavg").repo / "results" / "deployed-validation.npz" if where == "build"
            else dist / "yardsticks" / "compile-validation.npz")
    data = dict(np.load(file))
    value = {"computed": lambda: np.array(str(data["computed"]), dtype=object),
             "labs": lambda: np.array(["TRI"] * len(data["obs_ids"]), dtype=object),
             "reference": lambda: data["reference"].astype(object)}[array]()
    np.savez(file, **{**data, array: value})  # numpy pickles an object array: release must never load it
    result = invoke("tables", "--dist", dist, "--resamples", RESAMPLES)
    out = refused(result, f"error: {file}: array '{array}' is not readable", "Object arrays cannot be loaded",
                  "re-run 'release eval'" if array != "computed" else "rerun 'release eval'")
    assert len(out) < 400
    assert not (dist / "tables").exists()


# --- release.yaml: an override that changes nothing is a configuration error ---


@pytest.mark.parametrize("override", ["rtn: {deliver: true, reason: it is the reference}",  # 'always': chosen
                                      "sq_auto: {deliver: false, reason: kept back}"])  # selection.json: not chosen
def test_an_override_that_changes_nothing_is_a_configuration_error(builds: Path, tmp_path: Path,
                                                                   override: str) -> None:
    dist = tmp_path / "dist"
    shutil.copytree(CARD_DATA, dist)
    assert json.loads((dist / "selection.json").read_text())["chosen"] == ["rtn"]
    name = override.split(":")[0]
    (builds / "release.yaml").write_text((builds / "release.yaml").read_text() + f"override:\n  {override}\n")
    before = {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()}
    out = refused(invoke("card", "rtn", "--dist", dist, "--lang", "en"), f"{builds / 'release.yaml'}: ",
                  f"field 'override.{name}'", "changes nothing", "remove the override")
    assert "refused" not in out
    assert {p: p.read_bytes() for p in dist.rglob("*") if p.is_file()} == before


# --- release.yaml and build files: out-of-range values and unknown keys, refused at load ---


SERVED = "served_steps:\n  w8a16_first_steps: 0\n  w8a16_last_steps: 0\n"
MARGIN = "equivalence_margin: {of_baseline: 0.1}\n"


@pytest.mark.parametrize(("old", "new", "field", "why"), [
    # served_steps: more W8A16 steps than the policy has (accepted before)
    (SERVED, "served_steps:\n  w8a16_first_steps: 5\n  w8a16_last_steps: 0\n", "served_steps",
     "w8a16_first_steps is 5, more than the policy's 4 steps"),
    (SERVED, "served_steps:\n  w8a16_first_steps: 100\n  w8a16_last_steps: 100\n", "served_steps",
     "more than the policy's 4 steps"),
    (SERVED, "served_steps:\n  w8a16_first_steps: 0\n  w8a16_last_steps: 9\n", "served_steps",
     "w8a16_last_steps is 9"),
    (SERVED, "served_steps:\n  w8a16_first_steps: -1\n  w8a16_last_steps: 0\n", "served_steps.w8a16_first_steps",
     "greater than or equal to 0"),
    (SERVED, "served_steps:\n  w8a16_first: 1\n", "served_steps.w8a16_first", "unknown field"),
    # equivalence_margin: no margin at all (accepted before: {sigma: null} left neither key set)
    (MARGIN, "equivalence_margin: {sigma: null}\n", "equivalence_margin", "'sigma' is null"),
    (MARGIN, "equivalence_margin: {of_baseline: null}\n", "equivalence_margin", "'of_baseline' is null"),
    (MARGIN, "equivalence_margin: {}\n", "equivalence_margin", "not an empty mapping"),
    (MARGIN, "equivalence_margin: -1\n", "equivalence_margin.sigma", "greater than 0"),
    (MARGIN, "equivalence_margin: 0\n", "equivalence_margin.sigma", "greater than 0"),
    (MARGIN, "equivalence_margin: {sigma: -1}\n", "equivalence_margin.sigma", "greater than 0"),
    (MARGIN, "equivalence_margin: {of_baseline: 0}\n", "equivalence_margin.of_baseline", "greater than 0"),
    (MARGIN, "equivalence_margin: {sigma: 0.1, of_baseline: 0.1}\n", "equivalence_margin", "not both"),
    (MARGIN, "equivalence_margin: {sigma: null, of_baseline: null}\n", "equivalence_margin", "not both"),
    (MARGIN, "equivalence_margin: {sigma: 0.1, percent: 1}\n", "equivalence_margin.percent", "unknown field"),
])
def test_release_yaml_out_of_range_is_refused_at_load(builds: Path, tmp_path: Path, old: str, new: str, field: str,
                                                      why: str) -> None:
    _replace(builds / "release.yaml", old, new)
    out = _build_refused(tmp_path, "rtn", f"field '{field}'", why)
    assert re.match(rf"error: {re.escape(str(builds / 'release.yaml'))}:\d+: field '{re.escape(field)}': ", out), out


@pytest.mark.parametrize(("build", "old", "new", "field", "why"), [
    # accepted before: a damping lost in float32, an auto-round run of 10^12 steps per layer, a learning rate of 5
    ("gptq", "  perc_damp: 0.01", "  perc_damp: 1.0e-300", "gptq.perc_damp", "greater than or equal to 0.000001"),
    ("autoround_tuned", "  iters: 200", "  iters: 1000000000000", "autoround.iters", "less than or equal to 100000"),
    ("autoround_tuned", "  iters: 200", "  iters: 200\n  lr: 5.0", "autoround.lr", "less than or equal to 1"),
    # refused before, kept
    ("gptq", "  perc_damp: 0.01", "  perc_damp: 0", "gptq.perc_damp", "greater than"),
    ("rtn", "  gripper_change_rate: 0.005", "  gripper_change_rate: 1.5", "gate.gripper_change_rate",
     "less than or equal to 1"),
    ("rtn", "  gripper_change_rate: 0.005", "  gripper_change_rate: -0.1", "gate.gripper_change_rate",
     "greater than or equal to 0"),
    ("rtn", "calibration_calls: 256", "calibration_calls: 0", "calibration_calls", "greater than or equal to 1"),
    ("sq_auto", "  alpha: auto", "  alpha: 1.5", "smoothquant.alpha", "a number in 0..1"),
    ("rtn", "  method: max", "  method: histogram\n  percentile: 101", "calibrator.percentile",
     "less than or equal to 100"),
    ("rtn", "  overall_sigma: 0.13", "  overall_sigma: 0.13\n  max_sigma: 1", "gate.max_sigma", "unknown field"),
])
def test_a_build_file_out_of_range_is_refused_at_load(builds: Path, tmp_path: Path, build: str, old: str, new: str,
                                                      field: str, why: str) -> None:
    line = _replace(builds / f"{build}.yaml", old, new) + new.count("\n")
    _build_refused(tmp_path, build, f"{build}.yaml:{line}:", f"field '{field}'", why)
