"""``release select``: the selection rule of builds/release.yaml applied to crafted tables (gate, lowest overall, each
tie-break level, candidates without results or outside the rule's path and split), its one-line errors, and the
card's "How it was selected" rendered from selection.json in English and Korean."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, invoke, relax_gate

CARD_INPUTS = ROOT / "tests" / "data" / "cards"
RULE = """selection:
  candidates: [{candidates}]
  path: fakequant
  split: calibration
  tie_break: [{tie_break}]
  always: [{always}]
  count: {count}
"""


def record(build: str, overall: float, changes: int = 2, mae: float = 1.0, agree: float | None = None,
           path: str = "fakequant", split: str = "calibration", steps: int = 1024) -> dict[str, Any]:
    """A tables.json record; the gate as the build files' default gate (overall <= 0.13, changes <= 0.5% of steps)."""
    return {"build": build, "title": f"title of {build}", "path": path, "split": split, "overall_sigma": overall,
            "overall_ci": [overall * 0.9, overall * 1.1], "gripper_agree": 1 - changes / steps if agree is None
            else agree, "gripper_ci": [0.98, 1.0], "gripper_changes": changes, "joint_mae_deg": mae, "n_obs": 32,
            "n_steps": steps, "gate": overall <= 0.13 and changes <= 0.005 * steps}


@pytest.fixture
def builds(builds: Path) -> Path:
    """The private copy of builds/, its release.yaml without a selection section yet (``rule`` writes one)."""
    text = (builds / "release.yaml").read_text()
    (builds / "release.yaml").write_text(text[:text.index("# How the delivered builds were chosen")])
    return builds


def rule(builds: Path, candidates: str, count: int = 1, always: str = "",
         tie_break: str = "gripper_agree, joint_mae_deg") -> None:
    with (builds / "release.yaml").open("a") as f:
        f.write(RULE.format(candidates=candidates, count=count, always=always, tie_break=tie_break))


def tables(dist: Path, records: list[dict[str, Any]]) -> Path:
    path = dist / "tables" / "tables.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"baseline": "rtn", "records": records}))
    return path


def select(dist: Path) -> dict[str, Any]:
    result = invoke("select", "--dist", dist)
    assert result.exit_code == 0, result.output
    doc: dict[str, Any] = json.loads((dist / "selection.json").read_text())
    return doc


@pytest.fixture
def seed_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the shipped builds/ whose rule scores the calibration labs, in-sample, as the seed's did (the
    seed's figures and the committed card data have no held-out fake quant)."""
    builds = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", builds)
    text = (builds / "release.yaml").read_text()
    assert "\n  split: validation\n" in text
    (builds / "release.yaml").write_text(text.replace("\n  split: validation\n", "\n  split: calibration\n"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    return builds


def order(doc: dict[str, Any]) -> list[tuple[str, int | None]]:
    return [(c["build"], c["rank"]) for c in doc["candidates"]]


def test_the_seed_selection_from_the_seed_figures(tmp_path: Path, seed_rule: Path) -> None:
    """builds/release.yaml (scored in-sample) applied to the seed card's own figures chooses the seed's three builds:
    RTN as the reference, then SQ auto-alpha and the moving-average observer, the only two of the seven that pass the
    gate."""
    seed = json.loads((ROOT / "tests" / "data" / "seed_figures.json").read_text())
    tables(tmp_path, seed["records"])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn", "sq_auto", "rtn_mavg"]
    assert order(doc) == [("sq_auto", 1), ("rtn_mavg", 2), ("rtn", 3), ("sq_auto_gptq", 4), ("sq_auto_normfc", 5),
                          ("sq_a05", 6), ("rtn_mavg005", 7)]  # 0.103 tie: higher gripper agreement first
    by_name = {c["build"]: c for c in doc["candidates"]}
    assert by_name["rtn"]["chosen"] == "always" and by_name["rtn"]["gate"]["failed"] == ["gripper_changes"]
    assert by_name["rtn"]["gate"]["gripper_changes_limit"] == pytest.approx(5.12)
    assert by_name["sq_auto_gptq"]["gate"]["failed"] == ["gripper_changes"]  # 8 changes > 5.12
    assert doc["rule"]["candidates"][1] == "sq_auto_gptq" and doc["rule"]["count"] == 2


def test_select_as_json_is_the_selection_and_the_delivery(tmp_path: Path, seed_rule: Path) -> None:
    seed = json.loads((ROOT / "tests" / "data" / "seed_figures.json").read_text())
    tables(tmp_path, seed["records"])
    result = invoke("select", "--dist", tmp_path, "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # one document, nothing else on stdout: the table is not printed
    assert list(doc) == ["delivered", "document", "selection"] and doc["delivered"] == ["rtn", "sq_auto", "rtn_mavg"]
    assert doc["document"] == json.loads((tmp_path / "selection.json").read_text())
    assert doc["selection"] == str(tmp_path / "selection.json") and "build files: " in result.stderr
    quiet = invoke("-q", "select", "--dist", tmp_path, "--format", "json")
    assert quiet.stderr == "" and json.loads(quiet.stdout)["delivered"] == doc["delivered"]


@pytest.mark.parametrize(("tie_break", "winner"), [("gripper_agree, joint_mae_deg", "sq_auto"),
                                                   ("joint_mae_deg, gripper_agree", "rtn_mavg")])
def test_equal_overall_goes_to_the_tie_breaks_in_their_order(builds: Path, tmp_path: Path, tie_break: str,
                                                             winner: str) -> None:
    """Same overall: sq_auto agrees more often on the gripper, rtn_mavg has the lower joint MAE; the rule's order of
    the two metrics decides (the candidate order would pick rtn_mavg, listed first)."""
    rule(builds, "rtn_mavg, sq_auto", tie_break=tie_break)
    tables(tmp_path, [record("rtn_mavg", 0.1, changes=4, mae=1.0), record("sq_auto", 0.1, changes=2, mae=2.0)])
    doc = select(tmp_path)
    assert doc["chosen"] == [winner] and order(doc)[0] == (winner, 1)


def test_gripper_agreement_breaks_a_tie_before_the_candidate_order(builds: Path, tmp_path: Path) -> None:
    rule(builds, "rtn_mavg, sq_auto", tie_break="gripper_agree")
    tables(tmp_path, [record("rtn_mavg", 0.1, changes=3), record("sq_auto", 0.1, changes=1)])
    assert select(tmp_path)["chosen"] == ["sq_auto"]


def test_joint_mae_breaks_a_tie_of_overall_and_gripper(builds: Path, tmp_path: Path) -> None:
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [record("rtn_mavg", 0.1, mae=1.5), record("sq_auto", 0.1, mae=1.2)])
    assert select(tmp_path)["chosen"] == ["sq_auto"]


@pytest.mark.parametrize("candidates", ["rtn_mavg, sq_auto", "sq_auto, rtn_mavg"])
def test_a_full_tie_goes_to_the_candidate_order(builds: Path, tmp_path: Path, candidates: str) -> None:
    rule(builds, candidates)
    tables(tmp_path, [record("rtn_mavg", 0.1), record("sq_auto", 0.1)])
    first = candidates.split(", ")[0]
    doc = select(tmp_path)
    assert doc["chosen"] == [first] and [c["position"] for c in doc["candidates"]] == [1, 2]


def test_a_build_that_fails_its_gate_is_not_chosen(builds: Path, tmp_path: Path) -> None:
    """The lowest overall fails on the gripper, the next on overall: the third, passing, is chosen and ranks first."""
    rule(builds, "rtn, sq_auto, rtn_mavg, sq_a05", count=2)
    tables(tmp_path, [record("rtn", 0.05, changes=9), record("sq_auto", 0.14), record("rtn_mavg", 0.12),
                      record("sq_a05", 0.2, changes=30)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn_mavg"]
    assert order(doc) == [("rtn_mavg", 1), ("rtn", 2), ("sq_auto", 3), ("sq_a05", 4)]
    gates = {c["build"]: c["gate"] for c in doc["candidates"]}
    assert gates["rtn"]["failed"] == ["gripper_changes"] and gates["sq_auto"]["failed"] == ["overall_sigma"]
    assert gates["sq_a05"]["failed"] == ["overall_sigma", "gripper_changes"] and gates["rtn_mavg"]["passed"]
    assert "only 1 of 2 to choose by rank pass their gate" in invoke("select", "--dist", tmp_path).output


def test_always_is_chosen_whatever_its_scores_and_outside_the_count(builds: Path, tmp_path: Path) -> None:
    rule(builds, "rtn, sq_auto, rtn_mavg", always="rtn", count=1)
    tables(tmp_path, [record("rtn", 0.5, changes=50), record("sq_auto", 0.11), record("rtn_mavg", 0.1)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn", "rtn_mavg"]
    assert [c["chosen"] for c in doc["candidates"]] == ["rank", None, "always"]


def test_candidates_without_results_are_listed_and_never_chosen(builds: Path, tmp_path: Path) -> None:
    """A defined build without results and an undefined one: listed as not evaluated, in list order, after the
    ranking, never chosen, even with room in the count."""
    rule(builds, "sq_gptq_future, sq_a03, rtn_mavg", count=3)
    tables(tmp_path, [record("rtn_mavg", 0.12)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn_mavg"]
    assert [(c["build"], c["rank"], c["not_evaluated"], c["chosen"]) for c in doc["candidates"]] == [
        ("rtn_mavg", 1, None, "rank"), ("sq_gptq_future", None, "no_build_file", None),
        ("sq_a03", None, "no_results", None)]
    assert doc["candidates"][2]["title"] == "FP8 + SmoothQuant alpha 0.3" and doc["candidates"][1]["title"] is None


def test_results_outside_the_rules_path_and_split_do_not_count(builds: Path, tmp_path: Path) -> None:
    rule(builds, "sq_auto, rtn_mavg")
    tables(tmp_path, [record("sq_auto", 0.01, path="deployed", split="validation"),
                      record("sq_auto", 0.02, split="validation"), record("rtn_mavg", 0.12),
                      record("rtn_mavg", 0.3, path="deployed", split="all")])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn_mavg"] and doc["candidates"][0]["scores"]["overall_sigma"] == 0.12
    outside = doc["candidates"][1]
    assert (outside["build"], outside["rank"], outside["not_evaluated"]) == ("sq_auto", None, "no_results")
    assert outside["evaluated_on"] == ["deployed/validation", "fakequant/validation"]


def test_selection_is_deterministic_and_dated_by_source_date_epoch(builds: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [record("rtn_mavg", 0.1), record("sq_auto", 0.11)])
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796004000")
    first = (select(tmp_path), (tmp_path / "selection.json").read_bytes())[1]
    assert select(tmp_path)["date"] == "2026-11-30T02:00:00Z"
    assert (tmp_path / "selection.json").read_bytes() == first


def _fails(dist: Path, *needles: str) -> None:
    """Exit 2, one line naming what to fix, and no selection.json written."""
    result = invoke("select", "--dist", dist)
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and result.output.count("\n") == 1, result.output
    for needle in needles:
        assert needle in result.output
    assert not (dist / "selection.json").exists()


def test_missing_or_corrupt_tables_are_one_line_errors(builds: Path, tmp_path: Path) -> None:
    rule(builds, "rtn_mavg, sq_auto")
    path = tmp_path / "tables" / "tables.json"
    _fails(tmp_path, f"{path}: missing (fidelity tables); run 'release tables' first")
    path.parent.mkdir()
    path.write_text('{"records": [')
    _fails(tmp_path, f"{path}: not valid JSON", "run 'release tables' to rewrite it")
    path.write_text('["records"]')
    _fails(tmp_path, f"{path}: expected a JSON object")
    path.write_text('{"records": {"build": "rtn"}}')
    _fails(tmp_path, f"{path}: field 'records' must be a list of records")
    path.write_bytes(b"\xff\xfe")
    _fails(tmp_path, f"{path}: not valid JSON")
    path.write_text("[" * 100_000 + "]" * 100_000)
    _fails(tmp_path, f"{path}: nested too deeply to read (fidelity tables)")
    broken = record("rtn_mavg", 0.1)
    broken["overall_sigma"] = "low"
    tables(tmp_path, [broken])
    _fails(tmp_path, f"{path}: the record of build 'rtn_mavg' (fakequant, calibration): field 'overall_sigma'")
    broken = record("rtn_mavg", 0.1)
    del broken["gate"]
    tables(tmp_path, [broken])
    _fails(tmp_path, "field 'gate' is None: must be true or false")
    for field, value, why in (("overall_sigma", -1.0, "greater than or equal to 0"),
                              ("overall_sigma", "nan", "finite number"), ("gripper_agree", "nan", "finite number"),
                              ("gripper_agree", 1.5, "less than or equal to 1"), ("joint_mae_deg", -0.5, "greater"),
                              ("gripper_ci", [0.9, float("inf")], "finite number"), ("n_obs", 0, "greater"),
                              ("gripper_changes", -1, "greater")):
        broken = record("rtn_mavg", 0.1)
        broken[field] = value
        tables(tmp_path, [broken])  # a figure out of its range is refused, never ranked nor written as NaN
        _fails(tmp_path, f"the record of build 'rtn_mavg' (fakequant, calibration): field '{field}' is {value!r}", why)
        assert not (tmp_path / "selection.json").exists()


def test_a_gate_older_than_the_build_file_is_refused(builds: Path, tmp_path: Path) -> None:
    """tables.json says pass, but the build file's gate has since become stricter: rerun release tables."""
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [record("rtn_mavg", 0.12)])
    text = (builds / "rtn_mavg.yaml").read_text()
    (builds / "rtn_mavg.yaml").write_text(text.replace("overall_sigma: 0.13", "overall_sigma: 0.11"))
    _fails(tmp_path, "the gate of build 'rtn_mavg' (pass) disagrees with the limits in", "overall <= 0.11",
           "rerun 'release tables'")
    (builds / "rtn_mavg.yaml").unlink()
    _fails(tmp_path, "has results for build 'rtn_mavg' but", "rtn_mavg.yaml is missing")


def test_no_selection_section_or_a_bad_one(builds: Path, tmp_path: Path) -> None:
    tables(tmp_path, [record("rtn_mavg", 0.1)])
    _fails(tmp_path, f"{builds / 'release.yaml'}: no 'selection' section; add one")
    base = (builds / "release.yaml").read_text()
    bad = {"rtn_mavg, rtn_mavg": "'rtn_mavg' is listed twice in 'candidates'",
           "rtn_mavg, ../sq_auto": "'../sq_auto' is not a build name"}
    for candidates, message in bad.items():
        (builds / "release.yaml").write_text(base)
        rule(builds, candidates)
        _fails(tmp_path, "release.yaml:", "field 'selection.candidates'", message)
    (builds / "release.yaml").write_text(base)
    rule(builds, "rtn_mavg, sq_auto", always="rtn")
    _fails(tmp_path, "'always' names 'rtn', which is not in 'candidates'")
    (builds / "release.yaml").write_text(base)
    rule(builds, "rtn_mavg", tie_break="snr_db")
    _fails(tmp_path, "field 'selection.tie_break.0'", "'gripper_agree' or 'joint_mae_deg'")
    (builds / "release.yaml").write_text(base)
    rule(builds, "rtn_mavg", count=0)
    _fails(tmp_path, "field 'selection.count'")


def test_dist_that_is_a_file_is_refused(tmp_path: Path) -> None:
    (tmp_path / "dist").write_text("")
    result = invoke("select", "--dist", tmp_path / "dist")
    assert result.exit_code == 2 and "exists and is not a folder" in result.output


# The card's "How it was selected", from selection.json.

REPOS = {"rtn": "Cosmos3-Nano-Policy-DROID-FP8", "sq_auto": "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant",
         "rtn_mavg": "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvgObserver"}


@pytest.fixture
def card_dist(tmp_path: Path) -> Path:
    """The committed card inputs without their selection.json."""
    dist = tmp_path / "dist"
    shutil.copytree(CARD_INPUTS, dist)
    (dist / "selection.json").unlink()
    return dist


def _section(dist: Path, build: str, lang: str) -> str:
    text = (dist / REPOS[build] / ("README.md" if lang == "en" else f"README.{lang}.md")).read_text(encoding="utf-8")
    start = text.index("## How it was selected" if lang == "en" else "## 선정 방법")
    return text[start:text.index("\n## ", start + 1)]


def test_the_card_tells_the_selection_in_english_and_korean(builds: Path, card_dist: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The card data's rule, with the moving-average build's gate at 1% of steps (its 7 changes in 1024 pass it):
    the rule ranks it first (a build that passes its gate ranks above one that fails) and chooses it, beside RTN."""
    rule(builds, "rtn, sq_auto_gptq, sq_auto, sq_auto_normfc, sq_a05, rtn_mavg005, rtn_mavg", count=2, always="rtn")
    relax_gate(builds, card_dist)
    assert invoke("card", "--dist", card_dist, "--lang", "en,ko").exit_code == 0
    before = _section(card_dist, "rtn_mavg", "en")
    assert "Selected on" not in before and before.count("\n\n") == 1  # today's text: build date, gate, verdict
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1795996800")
    assert invoke("select", "--dist", card_dist).exit_code == 0
    assert invoke("card", "--dist", card_dist, "--lang", "en,ko").exit_code == 0
    en = {b: _section(card_dist, b, "en") for b in REPOS}
    assert "Selected on November 30, 2026 from 7 candidate builds of the same scheme" in en["rtn"]
    assert "on 32 observations of the calibration labs (in-sample)" in en["rtn"]
    assert ("ties go to the higher gripper agreement, then the lower joint MAE, then the order of the candidate "
            "list") in en["rtn"]
    assert "Chosen by rank, up to 2 that pass their gate: `rtn_mavg`." in en["rtn"]
    assert "This build was chosen: rank 1 of 3." in en["rtn_mavg"]
    assert "This build is chosen in any case, as the reference: rank 2 of 3." in en["rtn"]
    assert "This build was not chosen: rank 3 of 3." in en["sq_auto"]
    assert ("| - | FP8 + SmoothQuant auto-alpha + GPTQ | - | - | - | not evaluated on this path and split | - |"
            in en["rtn"])
    assert "| 6 / 1024 | fail (gripper changes), within noise | - |" in en["sq_auto"]
    assert en["rtn_mavg"].endswith(before.split("\n\n", 1)[1])  # the build date and gate follow, as before
    ko = {b: _section(card_dist, b, "ko") for b in REPOS}
    assert "2026년 11월 30일에 같은 방식의 후보 빌드 7개 중에서 선정했습니다." in ko["rtn"]
    assert "이 빌드는 선정되었습니다: 3개 중 1위." in ko["rtn_mavg"]
    assert "이 빌드는 기준이므로 점수와 관계없이 선정됩니다: 3개 중 2위." in ko["rtn"]
    assert "이 빌드는 선정되지 않았습니다: 3개 중 3위." in ko["sq_auto"]
    assert "| 9 / 1024 | 초과 (그리퍼 판정 변화), 잡음 범위 | 예 (기준) |" in ko["rtn"]
    assert "| - | FP8 + SmoothQuant 자동 α + GPTQ | - | - | - | 이 경로와 분할에서 평가 안 함 | - |" in ko["rtn"]
    assert "동률일 때의 기준: 그리퍼 일치율이 높은 쪽, 그다음 관절 MAE가 낮은 쪽, 그다음 후보 목록에서 앞선 쪽." \
        in ko["rtn"]


def test_the_card_of_a_build_outside_the_rule_and_an_empty_choice(builds: Path, card_dist: Path) -> None:
    rule(builds, "rtn, sq_auto", always="rtn")
    assert invoke("select", "--dist", card_dist).exit_code == 0
    assert invoke("card", "--dist", card_dist, "--lang", "en,ko").exit_code == 0
    assert "This build is not one of the candidates." in _section(card_dist, "rtn_mavg", "en")
    assert "이 빌드는 후보가 아니었습니다." in _section(card_dist, "rtn_mavg", "ko")
    assert "Chosen by rank, up to 1 that pass their gate: none." in _section(card_dist, "sq_auto", "en")
    assert "from 2 candidate builds" in _section(card_dist, "sq_auto", "en")
    assert "게이트를 통과한 빌드 중 순위대로 최대 1개 선정: 없음." in _section(card_dist, "sq_auto", "ko")


def test_the_card_refuses_a_stale_or_damaged_selection(card_dist: Path, seed_rule: Path) -> None:
    assert invoke("select", "--dist", card_dist).exit_code == 0
    selection = card_dist / "selection.json"
    table = card_dist / "tables" / "tables.json"
    doc = json.loads(table.read_text())
    doc["records"][0]["overall_sigma"] += 1e-10
    table.write_text(json.dumps(doc))
    result = invoke("card", "--dist", card_dist, "--check")
    assert result.exit_code == 2
    assert f"{selection}: made from other tables than {table}; run 'release select'" in result.output
    doc = json.loads(selection.read_text())
    doc["candidates"][0]["rank"] = None
    selection.write_text(json.dumps(doc))
    result = invoke("card", "--dist", card_dist, "--check")
    assert result.exit_code == 2 and f"{selection}: field 'candidates.0'" in result.output
    assert "run 'release select' to rewrite it" in result.output
    selection.write_text("{")
    result = invoke("card", "--dist", card_dist, "--check")
    assert result.exit_code == 2 and f"{selection}: not valid JSON" in result.output


def test_committed_card_selection_matches_the_committed_tables(tmp_path: Path, seed_rule: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """tests/data/cards/selection.json is what 'release select' makes of the committed tables.json (the golden cards
    show it) under the shipped rule scored in-sample, as the seed scored it (the committed data has no held-out fake
    quant); regenerate it with SOURCE_DATE_EPOCH=1796004000 when the tables or the rule change."""
    dist = tmp_path / "dist"
    shutil.copytree(CARD_INPUTS, dist)
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796004000")
    assert invoke("select", "--dist", dist).exit_code == 0
    assert (dist / "selection.json").read_bytes() == (CARD_INPUTS / "selection.json").read_bytes()


# Selection stability: the rule on bootstrap resamples of the observations, from the results files.

STEPS, DIMS = 4, 8


def results(dist: Path, build: str, errors: list[float], rows: int = 1, changes: int = 0,
            dim: int = 0) -> dict[str, Any]:
    """``<dist>/<repo>/results/fakequant-calibration.npz`` whose candidate is off by ``errors[i]`` sigma in dimension
    ``dim`` (a joint, or 7: the gripper, by less than flips it) on observation i (``rows`` noise seeds each) and
    flips the gripper on its first ``changes`` steps; returns its tables.json record (the figures ``release tables``
    would record, the gate as the build files' default one)."""
    import numpy as np

    from release.core.builds import load_build
    from release.measure.layout import RESULTS
    from release.measure.stats import overall, per_observation

    n = len(errors) * rows
    reference = np.zeros((n, STEPS, DIMS))
    candidate = reference.copy()
    candidate[:, :, dim] = np.repeat(errors, rows)[:, None]
    candidate.reshape(-1, DIMS)[:changes, 7] = 1.0
    ids = np.repeat(np.arange(len(errors)), rows)
    file = dist / load_build(build).repo / RESULTS / "fakequant-calibration.npz"
    file.parent.mkdir(parents=True, exist_ok=True)
    np.savez(file, reference=reference, candidate=candidate, obs_ids=ids, sigma=np.ones(DIMS))
    po = per_observation(reference, candidate, np.ones(DIMS), ids)
    sigma, steps = float(overall(po)), n * STEPS
    return {"build": build, "title": f"title of {build}", "path": "fakequant", "split": "calibration",
            "overall_sigma": sigma, "overall_ci": None, "gripper_agree": 1 - changes / steps, "gripper_ci": None,
            "gripper_changes": changes, "joint_mae_deg": float(po.abs_joint_deg.sum() / (steps * 7)),
            "n_obs": len(errors), "n_steps": steps, "gate": sigma <= 0.13 and changes <= 0.005 * steps}


def shares(doc: dict[str, Any]) -> dict[str, float]:
    return {s["build"]: s["chosen_share"] for s in doc["stability"]["candidates"]}


def test_a_near_tie_is_an_unstable_choice(builds: Path, tmp_path: Path) -> None:
    """rtn_mavg and sq_auto err 0.2 and 0.1 sigma on alternate observations, sq_auto by 1e-4 more: rtn_mavg wins on
    all 16 observations, but a resample of them picks either about as often; RTN ('always') is chosen in every one."""
    rule(builds, "rtn, rtn_mavg, sq_auto", always="rtn")
    tables(tmp_path, [results(tmp_path, "rtn", [0.3] * 16, changes=64),
                      results(tmp_path, "rtn_mavg", [0.2, 0.1] * 8),
                      results(tmp_path, "sq_auto", [0.1, 0.2001] * 8)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn", "rtn_mavg"] and doc["stability_skipped"] is None
    stability = doc["stability"]
    assert (stability["resamples"], stability["seed"], stability["observations"]) == (1000, 0, 16)
    assert 0.3 < stability["same_choice"] < 0.7
    by_build = shares(doc)
    assert by_build["rtn"] == 1.0 and by_build["rtn_mavg"] == stability["same_choice"]
    assert by_build["rtn_mavg"] + by_build["sq_auto"] == 1.0  # one of the two, in every resample
    rtn = next(s for s in stability["candidates"] if s["build"] == "rtn")
    assert rtn["passed_share"] == 0.0 and rtn["first_share"] == 0.0  # every step flips the gripper
    assert [s["build"] for s in stability["candidates"]] == [c["build"] for c in doc["candidates"]]
    output = invoke("select", "--dist", tmp_path).output
    assert f"the same set is chosen in {stability['same_choice']:.1%} of 1,000 bootstrap resamples" in output


def test_a_dominant_candidate_is_chosen_in_every_resample(builds: Path, tmp_path: Path) -> None:
    """sq_auto errs 0.01 sigma where rtn_mavg errs 0.05-0.1 (and rtn_mavg005 fails its gate): the same choice in
    every resample, each with its seed rows drawn together."""
    rule(builds, "rtn_mavg, sq_auto, rtn_mavg005", count=1)
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.05, 0.1] * 6, rows=3),
                      results(tmp_path, "sq_auto", [0.01] * 12, rows=3),
                      results(tmp_path, "rtn_mavg005", [0.5] * 12, rows=3)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["sq_auto"] and doc["stability"]["same_choice"] == 1.0
    assert shares(doc) == {"sq_auto": 1.0, "rtn_mavg": 0.0, "rtn_mavg005": 0.0}
    assert doc["stability"]["observations"] == 12
    assert [s["passed_share"] for s in doc["stability"]["candidates"]] == [1.0, 1.0, 0.0]


def test_the_bootstrap_is_deterministic(builds: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796004000")
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.2, 0.1] * 5), results(tmp_path, "sq_auto", [0.1, 0.2] * 5)])
    first = (select(tmp_path), (tmp_path / "selection.json").read_bytes())[1]
    assert select(tmp_path)["stability"]["same_choice"] < 1.0
    assert (tmp_path / "selection.json").read_bytes() == first


def test_the_bootstrap_takes_the_rules_tie_breaks(builds: Path, tmp_path: Path) -> None:
    """The same errors on every observation, sq_auto's in the gripper (not a joint): every resample ties on overall
    and gripper agreement, so the lower joint MAE decides as on the whole sample, and the full tie of rtn_mavg and
    sq_a05 goes to the candidate order."""
    rule(builds, "sq_a05, rtn_mavg, sq_auto", count=2)
    errors = [0.1, 0.05, 0.12, 0.02] * 2
    tables(tmp_path, [results(tmp_path, "sq_a05", errors), results(tmp_path, "rtn_mavg", errors),
                      results(tmp_path, "sq_auto", errors, dim=7)])
    doc = select(tmp_path)
    assert doc["chosen"] == ["sq_auto", "sq_a05"] and doc["stability"]["same_choice"] == 1.0
    assert [(s["build"], s["first_share"], s["chosen_share"]) for s in doc["stability"]["candidates"]] == [
        ("sq_auto", 1.0, 1.0), ("sq_a05", 0.0, 1.0), ("rtn_mavg", 0.0, 0.0)]


def test_no_bootstrap_without_results_or_with_too_few_observations(builds: Path, tmp_path: Path) -> None:
    """The seed's tables alone (no results files), or five observations (fewer than an interval needs): no
    stability, and why."""
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [record("rtn_mavg", 0.1), record("sq_auto", 0.11)])
    doc = select(tmp_path)
    assert (doc["stability"], doc["stability_skipped"]) == (None, "no_results_file")
    assert "no bootstrap of the choice: a candidate's results file is missing" in \
        invoke("select", "--dist", tmp_path).output
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.1] * 5), results(tmp_path, "sq_auto", [0.2] * 5)])
    doc = select(tmp_path)
    assert (doc["stability"], doc["stability_skipped"]) == (None, "too_few_observations")
    assert doc["chosen"] == ["rtn_mavg"]


def test_results_newer_than_the_tables_are_refused(builds: Path, tmp_path: Path) -> None:
    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.1] * 8), results(tmp_path, "sq_auto", [0.2] * 8)])
    results(tmp_path, "sq_auto", [0.05] * 8)  # re-evaluated since 'release tables'
    _fails(tmp_path, "fakequant-calibration.npz: gives overall 0.0176777", "but", "tables.json records 0.0707107",
           "the tables are older than the results; rerun 'release tables'")
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.1] * 8), results(tmp_path, "sq_auto", [0.2] * 9)])
    _fails(tmp_path, "obs_ids differ from those of", "the same observations in the same order")


def test_a_selection_without_stability_still_reads(builds: Path, tmp_path: Path) -> None:
    """A selection.json written before the bootstrap was recorded (neither field) reads as one without it."""
    from release.measure.select import read_selection

    rule(builds, "rtn_mavg, sq_auto")
    tables(tmp_path, [results(tmp_path, "rtn_mavg", [0.1] * 8), results(tmp_path, "sq_auto", [0.2] * 8)])
    doc = select(tmp_path)
    old = {k: v for k, v in doc.items() if k not in ("stability", "stability_skipped")}
    (tmp_path / "selection.json").write_text(json.dumps(old))
    read = read_selection(tmp_path)
    assert read is not None and read.stability is None and read.chosen == ["rtn_mavg"]
    doc["stability_skipped"] = "no_results_file"  # both: refused in the one-line style
    (tmp_path / "selection.json").write_text(json.dumps(doc))
    with pytest.raises(Exception, match="'stability' and 'stability_skipped' exclude each other; run 'release "
                                        "select' to rewrite it"):
        read_selection(tmp_path)


def test_bootstrap_of_seven_candidates_is_fast() -> None:
    """The seed's seven candidates on 32 observations x 4 seeds: 1,000 resamples well under a second."""
    import time

    import numpy as np

    from release.core.rules import Selection
    from release.measure.stability import Entry, Sums, bootstrap

    rng = np.random.default_rng(1)
    names = ["rtn", "sq_auto_gptq", "sq_auto", "sq_auto_normfc", "sq_a05", "rtn_mavg005", "rtn_mavg"]
    rule_ = Selection(candidates=names, path="fakequant", split="calibration",
                      tie_break=["gripper_agree", "joint_mae_deg"], always=["rtn"], count=2)
    entries = [Entry(n, n, i, 0.1, 0, 32, 32 * 128, 0.13, 0.005) for i, n in enumerate(names, start=1)]
    sums = [Sums(sq_err=rng.gamma(2.0, 1.0, 32) * 0.002 * 128 * 8, steps=np.full(32, 128.0),
                 agree=128.0 - rng.integers(0, 2, 32), abs_joint_deg=rng.gamma(2.0, 1.0, 32) * 100, per_step=8)
            for _ in names]
    start = time.perf_counter()
    stability = bootstrap(rule_, entries, sums, ["rtn", "sq_auto", "rtn_mavg"])
    assert time.perf_counter() - start < 1.0
    assert stability.resamples == 1000 and len(stability.candidates) == 7
    assert sum(s.chosen_share for s in stability.candidates) == pytest.approx(3.0)  # rtn + 2 by rank, each resample


def test_the_card_tells_how_often_the_choice_recurs(card_dist: Path, seed_rule: Path) -> None:
    """A selection.json with a bootstrap: the share of resamples with the same set, and each candidate's share in
    a last column of the ranking (English; the translations follow)."""
    assert invoke("select", "--dist", card_dist).exit_code == 0
    path = card_dist / "selection.json"
    doc = json.loads(path.read_text())
    assert (doc["stability"], doc["stability_skipped"]) == (None, "no_results_file")  # the committed data: no results
    evaluated = [c["build"] for c in doc["candidates"] if c["rank"] is not None]
    share = {"rtn": 1.0, "sq_auto": 0.347, "rtn_mavg": 0.75}
    doc["stability_skipped"] = None
    doc["stability"] = {"resamples": 1000, "seed": 0, "observations": 32, "same_choice": 0.347, "candidates": [
        {"build": b, "passed_share": 0.5, "first_share": 0.25, "chosen_share": share.get(b, 0.0)} for b in evaluated]}
    path.write_text(json.dumps(doc))
    result = invoke("card", "--dist", card_dist, "--lang", "en")
    assert result.exit_code == 0, result.output
    en = _section(card_dist, "sq_auto", "en")
    assert ("the rule was applied again, gates included, to each of 1,000 bootstrap resamples of the 32 observations"
            in en)
    assert "The same set is chosen in 34.7% of resamples" in en
    assert "This build was not chosen: rank 3 of 3. The rule chooses it in 34.7% of 1,000 bootstrap resamples" in en
    assert "| gate | chosen | chosen in resamples |\n|---|---|---|---|---|---|---|---|\n" in en
    assert "| yes, as the reference | 100.0% |" in en
    assert "| not evaluated on this path and split | - | - |" in en


# The rule on the held-out labs, beside the other splits; gates within noise (issue 46).

def test_the_rule_ranks_the_other_split_too_and_says_when_they_disagree(builds: Path, tmp_path: Path) -> None:
    """Scored on the held-out labs (the rule's split), sq_auto wins; on the calibration labs rtn_mavg would: the
    selection records both rankings, the choice made on its own split, and that they disagree."""
    rule(builds, "rtn_mavg, sq_auto, sq_a05", count=1)
    text = (builds / "release.yaml").read_text()
    (builds / "release.yaml").write_text(text.replace("split: calibration", "split: validation"))
    tables(tmp_path, [record("rtn_mavg", 0.05), record("sq_auto", 0.06), record("sq_a05", 0.07),
                      record("rtn_mavg", 0.09, split="validation"), record("sq_auto", 0.08, split="validation"),
                      record("sq_a05", 0.2, split="validation")])
    doc = select(tmp_path)
    assert doc["rule"]["split"] == "validation" and doc["chosen"] == ["sq_auto"]
    assert doc["elsewhere"] == [{"split": "calibration", "ranking": ["rtn_mavg", "sq_auto", "sq_a05"],
                                 "chosen": ["rtn_mavg"], "agrees": False}]
    # every path and split a candidate has results on, the scored one included
    assert doc["candidates"][0]["evaluated_on"] == ["fakequant/calibration", "fakequant/validation"]


def test_the_default_rule_scores_the_held_out_labs() -> None:
    from release.core.rules import Selection

    assert Selection(candidates=["rtn"]).split == "validation"
    shipped = (ROOT / "builds" / "release.yaml").read_text()
    assert "\n  split: validation\n" in shipped[shipped.index("\nselection:"):]


def _noisy(build: str, overall: float, ci: tuple[float, float]) -> dict[str, Any]:
    return {**record(build, overall), "overall_ci": list(ci), "gate_within_noise": ci[0] <= 0.13 <= ci[1]}


def test_a_gate_within_noise_is_marked_and_an_interval_gate_fails_it(builds: Path, tmp_path: Path) -> None:
    """rtn_mavg passes its gate (0.12 <= 0.13) but its interval holds the limit; sq_auto passes clear of it. The
    point gate chooses rtn_mavg and marks its pass "within noise"; 'gate: interval' fails it and chooses sq_auto."""
    rule(builds, "rtn_mavg, sq_auto", count=1)
    tables(tmp_path, [_noisy("rtn_mavg", 0.12, (0.11, 0.135)), _noisy("sq_auto", 0.125, (0.12, 0.128))])
    doc = select(tmp_path)
    assert doc["chosen"] == ["rtn_mavg"]
    gates = {c["build"]: c["gate"] for c in doc["candidates"]}
    assert gates["rtn_mavg"]["passed"] and gates["rtn_mavg"]["within_noise"] is True
    assert gates["sq_auto"]["within_noise"] is False
    assert "pass, within noise" in invoke("select", "--dist", tmp_path).output
    text = (builds / "release.yaml").read_text()
    (builds / "release.yaml").write_text(text.replace("  count: 1\n", "  count: 1\n  gate: interval\n"))
    doc = select(tmp_path)
    assert doc["chosen"] == ["sq_auto"]
    gates = {c["build"]: c["gate"] for c in doc["candidates"]}
    assert not gates["rtn_mavg"]["passed"] and gates["rtn_mavg"]["failed"] == ["within_noise"]
    assert [c["build"] for c in doc["candidates"]] == ["sq_auto", "rtn_mavg"]


def test_the_card_recommends_the_first_pick_over_a_reference_ranked_lower(builds: Path, card_dist: Path) -> None:
    """Held-out fake quant (crafted from the card data's in-sample rows) where sq_auto ranks 1, rtn_mavg 2 and RTN
    3, while in-sample rtn_mavg ranks first: the card opens with sq_auto, the selection's first pick, with its
    deployed figures, and "How it was selected" says that the two splits disagree."""
    rule(builds, "rtn, sq_auto, rtn_mavg", count=1, always="rtn")
    text = (builds / "release.yaml").read_text()
    (builds / "release.yaml").write_text(text.replace("split: calibration", "split: validation"))
    relax_gate(builds, card_dist, "rtn_mavg", 0.01)
    relax_gate(builds, card_dist, "sq_auto", 0.01)
    path = card_dist / "tables" / "tables.json"
    doc = json.loads(path.read_text())
    scale = {"sq_auto": 0.8, "rtn_mavg": 1.0, "rtn": 1.2}
    doc["records"] += [{**r, "split": "validation", "overall_sigma": r["overall_sigma"] * scale[r["build"]],
                        "overall_ci": [v * scale[r["build"]] for v in r["overall_ci"]]}
                       for r in doc["records"] if r["path"] == "fakequant" and r["build"] in scale]
    path.write_text(json.dumps(doc))
    selection = select(card_dist)
    assert selection["chosen"] == ["rtn", "sq_auto"]
    assert [(c["build"], c["rank"]) for c in selection["candidates"]] == [("sq_auto", 1), ("rtn_mavg", 2),
                                                                         ("rtn", 3)]
    assert selection["elsewhere"] == [{"split": "calibration", "ranking": ["rtn_mavg", "sq_auto", "rtn"],
                                       "chosen": ["rtn", "rtn_mavg"], "agrees": False}]
    assert invoke("card", "--dist", card_dist, "--lang", "en,ko").exit_code == 0
    for build in ("rtn", "sq_auto"):
        card = (card_dist / REPOS[build] / "README.md").read_text(encoding="utf-8")
        advice = next(line for line in card.splitlines() if line.startswith("Which build to use"))
        assert advice.startswith("Which build to use: **FP8 + SmoothQuant (alpha searched per layer)** (`np-cr/"
                                 "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant`), the selection's first pick: rank 1 of "
                                 "3 by overall action error on fake quant, offline replay, held-out labs, where it "
                                 "passes its gate"), advice
        assert "On deployed, CPU emulation, all labs: 0.02318 [0.02273, 0.02360] sigma over 48 observations." in advice
        section = _section(card_dist, build, "en")
        assert ("On the calibration labs (in-sample) the same rule ranks `rtn_mavg`, `sq_auto`, `rtn` and would "
                "choose `rtn`, `rtn_mavg`. The two splits disagree: the choice above is the one made on the held-out "
                "labs.") in section, section
        assert "on 32 observations of the held-out labs: a candidate must pass its own gate" in section
    ko = (card_dist / REPOS["sq_auto"] / "README.ko.md").read_text(encoding="utf-8")
    assert next(line for line in ko.splitlines() if line.startswith("사용할 빌드")).startswith(
        "사용할 빌드: **FP8 + SmoothQuant (레이어별 α 탐색)**")
    assert "두 분할의 선택이 다릅니다." in ko
