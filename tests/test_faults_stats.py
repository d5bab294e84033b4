"""`release tables` and `release card` on edge-case and damaged results (issue 11, items 10 and 13-18).

The dist is written directly (results npz beside the committed card inputs), so no model runs: each test changes one
file and checks the tables and the cards in English and Korean.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from release.core.builds import load_build
from release.measure.paired import EXACT_MAX_N, min_resamples
from release.measure.stats import decimals
from tests.conftest import ROOT, invoke

CARD_INPUTS = ROOT / "tests" / "data" / "cards"
SIGMA = np.full(8, 0.5)
RESAMPLES = "500"


def _repo(name: str) -> str:
    return load_build(name).repo


def _chunks(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(n, 32, 8))
    ref[..., 7] = rng.uniform(0, 1, size=(n, 32))
    return ref


def write_results(path: Path, reference: np.ndarray, candidate: np.ndarray, obs_ids: np.ndarray,
                  sigma: np.ndarray = SIGMA, labs: np.ndarray | None = None) -> Path:
    """A results file as release eval writes it; ``labs``: the lab of each row (release eval records them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    computed = {"device": "cpu", "torch": "2.13.0+cpu", "cuda": None, "gemm_shapes": [[164, 64, 128]],
                "kernel": "emulation" if path.name.startswith("deployed") else None}  # as release eval records it
    arrays: dict[str, Any] = {"reference": reference, "candidate": candidate, "obs_ids": obs_ids, "sigma": sigma,
                              "computed": np.array(json.dumps(computed))}
    if labs is not None:
        arrays["labs"] = labs
    np.savez(path, **arrays)
    return path


def make_dist(root: Path, n: int = 16, sq_auto: float = 0.5) -> Path:
    """The committed card inputs (provenance, verification) plus deployed-validation results of rtn, sq_auto and
    rtn_mavg on ``n`` observations (ids 100...), an eager-vs-compile yardstick and a 4 x 4 seed yardstick. sq_auto's
    error is ``sq_auto`` x RTN's; rtn_mavg's differs from RTN's by observation, both ways."""
    dist = root / "dist"
    shutil.copytree(CARD_INPUTS, dist, ignore=shutil.ignore_patterns("tables", "selection.json"))  # tables anew
    ref, ids = _chunks(n), np.arange(100, 100 + n)
    noise = np.random.default_rng(1).normal(scale=0.05, size=ref.shape)
    mavg = np.random.default_rng(3).normal(1.0, 0.1, size=(n, 1, 1))
    scales: dict[str, float | np.ndarray] = {"rtn": 1.0, "sq_auto": sq_auto, "rtn_mavg": mavg}
    for name, scale in scales.items():
        write_results(dist / _repo(name) / "results" / "deployed-validation.npz", ref, ref + noise * scale, ids)
    write_results(dist / "yardsticks" / "compile-validation.npz", ref, ref + noise * 0.1, ids)
    few, few_ids = np.repeat(ref[:4], 4, axis=0), np.repeat(ids[:4], 4)  # as run_yardsticks writes it
    write_results(dist / "yardsticks" / "seed-validation.npz", few,
                  few + np.random.default_rng(2).normal(scale=0.3, size=few.shape), few_ids)
    return dist


@pytest.fixture
def dist(tmp_path: Path) -> Path:
    return make_dist(tmp_path)


def tables(dist: Path, *names: str) -> dict[tuple[str, str], dict[str, Any]]:
    result = invoke("tables", *names, "--dist", dist, "--resamples", RESAMPLES)
    assert result.exit_code == 0, result.output
    assert f"tables: {dist / 'tables'} (fidelity.csv, served.csv, ranking.csv, attribution.csv, tables.json)\n" in \
        result.output  # where it wrote
    doc = json.loads((dist / "tables" / "tables.json").read_text())
    return {(r["build"], r["path"]): r for r in doc["records"]}


def csv(dist: Path, name: str) -> pd.DataFrame:
    return pd.read_csv(dist / "tables" / f"{name}.csv", dtype=str, keep_default_na=False)


def cards(dist: Path, name: str = "sq_auto") -> tuple[str, str]:
    result = invoke("card", name, "--dist", dist, "--lang", "en,ko")
    assert result.exit_code == 0, result.output
    folder = dist / _repo(name)
    return (folder / "README.md").read_text(encoding="utf-8"), (folder / "README.ko.md").read_text(encoding="utf-8")


def row(card: str, label: str, cells: int | None = None) -> list[str]:
    """The cells of the first card table row whose first cell starts with ``label`` (and that has ``cells`` cells:
    the deployed results have 9, the fidelity table 7, the attribution 5)."""
    line = next(x for x in card.splitlines() if x.startswith(f"| {label}")
                and (cells is None or x.count("|") == cells + 1))
    return [c.strip() for c in line.strip("|").split("|")]


# item 13 -------------------------------------------------------------------------------------------------------------

def test_compile_yardstick_equal_to_its_reference(dist: Path) -> None:
    ref = np.load(dist / "yardsticks" / "compile-validation.npz")["reference"]
    write_results(dist / "yardsticks" / "compile-validation.npz", ref, ref, np.arange(100, 116))
    rows = tables(dist)
    compile_row = rows[("yardstick-compile", "yardstick")]
    assert compile_row["overall_sigma"] == 0 and compile_row["x_eager_vs_compile"] is None  # 0 / 0: undefined
    assert compile_row["snr_db"] == "inf"
    assert rows[("rtn", "deployed")]["x_eager_vs_compile"] == "inf"  # an error > 0 in units of a zero yardstick
    assert rows[("yardstick-seed", "yardstick")]["x_eager_vs_compile"] == "inf"
    assert set(csv(dist, "fidelity")["x eager-vs-compile"]) == {"∞"}
    # the yardstick is no margin (the default is 10% of the baseline's error): a zero yardstick changes no verdict
    mavg, rtn = rows[("rtn_mavg", "deployed")], rows[("rtn", "deployed")]
    assert mavg["margin"] == pytest.approx(0.1 * rtn["overall_sigma"]) and mavg["diff_verdict"] == "not shown"
    assert rows[("sq_auto", "deployed")]["diff_verdict"] == "lower"
    en, ko = cards(dist)
    for card, yardstick in ((en, "BF16 eager vs BF16 torch.compile"), (ko, "BF16 즉시 실행 대 BF16 `torch.compile`")):
        assert row(card, yardstick)[3:6:2] == ["-", "∞"]  # ratio, SNR
        assert row(card, "FP8 + SmoothQuant")[3] == "∞"


# items 14 and 10 (a damaged results file) ----------------------------------------------------------------------------

def _nan_candidate(path: Path) -> None:
    data = dict(np.load(path))
    data["candidate"][3, 5, 2] = np.nan
    np.savez(path, **data)


def _inf_reference(path: Path) -> None:
    data = dict(np.load(path))
    data["reference"][7, 0, 0] = np.inf
    np.savez(path, **data)


def _replace(**arrays: Any) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        data = dict(np.load(path))
        data.update(arrays)
        np.savez(path, **data)
    return edit


def _drop(key: str) -> Callable[[Path], None]:
    def edit(path: Path) -> None:
        data = dict(np.load(path))
        del data[key]
        np.savez(path, **data)
    return edit


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(b"not a zip file at all")


BAD_RESULTS: dict[str, tuple[Callable[[Path], None], str]] = {
    "nan": (_nan_candidate, "'candidate' of observation 103 (row 3) holds NaN or Inf"),
    "inf": (_inf_reference, "'reference' of observation 107 (row 7) holds NaN or Inf"),
    "zero sigma": (_replace(sigma=np.array([0.5, 0.5, 0.0, 0.5, 0.5, 0.5, 0.5, 0.5])), "sigma[2] is 0.0"),
    "nan sigma": (_replace(sigma=np.array([0.5] * 7 + [np.nan])), "sigma[7] is nan"),
    "negative sigma": (_replace(sigma=-SIGMA), "sigma[0] is -0.5"),
    "sigma shape": (_replace(sigma=SIGMA[:7]), "'sigma' [7] must be [16] and [8]"),
    "truncated": (_truncate, "not a readable results file"),
    "not a zip": (_garbage, "not a readable results file"),
    "missing array": (_drop("sigma"), "array 'sigma' is missing"),
    "shape": (_replace(candidate=np.zeros((16, 32, 7))), "'candidate' [16, 32, 7] must both be [N, chunk, 8]"),
    "no observations": (_replace(reference=np.zeros((0, 32, 8)), candidate=np.zeros((0, 32, 8)),
                                 obs_ids=np.zeros(0, dtype=np.int64)), "with N and chunk >= 1"),
    "float ids": (_replace(obs_ids=np.arange(16) + 0.7), "'obs_ids' holds float64, not integer observation ids"),
    "ids shape": (_replace(obs_ids=np.arange(15)), "'obs_ids' [15] and 'sigma' [8] must be [16] and [8]"),
    "too large": (_replace(candidate=np.full((16, 32, 8), 1e300)), "too large to square in sigma units"),
}


@pytest.mark.parametrize("where", ["build", "yardstick"])
@pytest.mark.parametrize("case", sorted(BAD_RESULTS))
def test_bad_results_are_a_one_line_error_naming_the_file(dist: Path, case: str, where: str) -> None:
    edit, message = BAD_RESULTS[case]
    file = (dist / _repo("rtn_mavg") / "results" / "deployed-validation.npz" if where == "build"
            else dist / "yardsticks" / "compile-validation.npz")
    edit(file)
    result = invoke("tables", "--dist", dist, "--resamples", RESAMPLES)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {file}: ") and message in result.output, result.output
    assert not (dist / "tables").exists()  # nothing written


# item 15 -------------------------------------------------------------------------------------------------------------

def test_too_few_observations(tmp_path: Path) -> None:
    dist = make_dist(tmp_path, n=2)
    rows = tables(dist)
    for key in (("rtn", "deployed"), ("sq_auto", "deployed"), ("yardstick-compile", "yardstick")):
        assert rows[key]["n_obs"] == 2 and rows[key]["overall_ci"] is None and rows[key]["too_few_observations"]
        assert rows[key]["gripper_ci"] is None and rows[key]["gate_within_noise"] is None
    sq = rows[("sq_auto", "deployed")]
    assert sq["diff_to_baseline"] < 0 and sq["diff_too_few_observations"] and sq["comparisons"] == 2
    assert [sq[k] for k in ("diff_ci", "diff_ci_corrected", "diff_p", "diff_p_corrected", "diff_verdict",
                            "non_inferior")] == [None] * 6
    fidelity = csv(dist, "fidelity")
    for column in ("overall (sigma) [95% CI]", "gripper agree [95% CI]"):
        assert all(cell.endswith(" (too few observations)") for cell in fidelity[column])
    ranking = csv(dist, "ranking").set_index("build")
    sq_title = load_build("sq_auto").text("title")
    assert ranking.loc[sq_title, "vs baseline [Holm-adjusted 95% CI]"].endswith(" (too few observations)")
    assert ranking.loc[sq_title, "p (sign-flip, Holm-adjusted)"] == "too few observations"
    en, ko = cards(dist)
    for card, too_few in ((en, "too few observations"), (ko, "관측 수 부족")):
        fidelity_row = row(card, "FP8 + SmoothQuant")
        assert fidelity_row[2].endswith(f" ({too_few})") and fidelity_row[6].endswith(f" ({too_few})")  # no interval
        deployed = row(card, "FP8 + SmoothQuant", cells=9)  # the comparison's deployed results
        assert deployed[1].endswith(f" ({too_few})") and deployed[2].endswith(f" ({too_few})")  # sigma, difference
        assert deployed[3:5] == [too_few, too_few]  # p and verdict
        assert not any("[" in cell for cell in fidelity_row + deployed)
    assert ("Deployed, CPU emulation, held-out labs: too few observations to compare the builds with FP8 (RTN, "
            "NVIDIA-identical recipe).") in en
    assert "관측 수가 너무 적어 빌드를 FP8 (RTN, NVIDIA와 같은 레시피)와 비교할 수 없습니다." in ko


# item 16 -------------------------------------------------------------------------------------------------------------

def test_candidate_equal_to_its_reference(tmp_path: Path) -> None:
    dist = make_dist(tmp_path, sq_auto=0.0)
    rows = tables(dist)
    sq = rows[("sq_auto", "deployed")]
    assert sq["overall_sigma"] == 0 and sq["snr_db"] == "inf" and sq["x_eager_vs_compile"] == 0
    assert sq["attribution"]["top3_error_share"] is None  # 0 / 0
    fidelity = csv(dist, "fidelity").set_index("build")
    assert fidelity.loc[load_build("sq_auto").text("title"), "SNR (dB)"] == "∞"
    share = csv(dist, "attribution").set_index("build").loc["sq_auto", "top3_error_share"]
    assert share == ""
    en, ko = cards(dist)
    for card in (en, ko):
        assert row(card, "FP8 + SmoothQuant")[5] == "∞"
        assert row(card, "FP8 + SmoothQuant", cells=5)[-1] == "-"  # the attribution's top-3 share: 0 / 0


# item 17 -------------------------------------------------------------------------------------------------------------

def test_holm_family_is_the_dist_not_the_command_line(dist: Path) -> None:
    full = tables(dist)[("sq_auto", "deployed")]
    alone = tables(dist, "sq_auto")[("sq_auto", "deployed")]
    assert type(full["comparisons"]) is int and full["comparisons"] == alone["comparisons"] == 2
    assert alone["diff_ci_corrected"] == full["diff_ci_corrected"]
    assert alone["diff_p_corrected"] == full["diff_p_corrected"] == 2 * full["diff_p"]


def test_smallest_exact_p_is_printed_and_the_interval_is_holms(dist: Path) -> None:
    """sq_auto's error is below RTN's on each of the 16 observations: its exact sign-flip p is the smallest there is,
    2 / 2^16 (the two patterns of all signs alike), an exact value and no bound; Holm's adjusted p is m = 2 times it,
    and its interval is at Holm's level for the smallest p, 0.05 / 2, wider than the plain one. rtn_mavg, Holm's
    second (p > 0.05), is tested at 0.05: its interval is the plain one."""
    rows = tables(dist)
    sq, mavg = rows[("sq_auto", "deployed")], rows[("rtn_mavg", "deployed")]
    assert "diff_p_bound" not in sq
    assert sq["diff_p"] == 2 / 2**16 and sq["diff_p_corrected"] == 4 / 2**16
    assert 0.05 < mavg["diff_p"] < 1 and mavg["diff_p_corrected"] == mavg["diff_p"]
    lo, hi = sq["diff_ci_corrected"]
    assert lo < sq["diff_ci"][0] and hi > sq["diff_ci"][1] and hi < 0
    assert mavg["diff_ci_corrected"] == mavg["diff_ci"]
    assert sq["diff_verdict"] == "lower"
    method = json.loads((dist / "tables" / "tables.json").read_text())["method"]
    assert (method["test"], method["correction"]) == ("sign-flip", "holm")
    assert [(f["path"], f["split"], f["m"], sorted(f["builds"]), f["patterns"]) for f in method["families"]] == [
        ("deployed", "validation", 2, ["rtn_mavg", "sq_auto"], "exact, all 2^16 sign patterns")]
    digits = decimals(sq["diff_ci_corrected"])
    shown = f"{sq['diff_to_baseline']:+.{digits}f} [{lo:+.{digits}f}, {hi:+.{digits}f}]"
    p_shown = "0.000061"  # 4 / 2^16 = 0.0000610...: exact, printed to two significant digits
    ranking = csv(dist, "ranking").set_index("build")
    sq_title = load_build("sq_auto").text("title")
    assert ranking.loc[sq_title, "vs baseline [Holm-adjusted 95% CI]"] == shown
    assert ranking.loc[sq_title, "p (sign-flip, Holm-adjusted)"] == p_shown
    assert ranking.loc[sq_title, "m"] == "2" and ranking.loc[sq_title, "verdict"] == "lower"
    en, ko = cards(dist)
    assert row(en, "build | deployed sigma")[2:5] == ["deployed vs baseline, Holm-adjusted 95% CI (m = 2)",
                                                      "p, sign-flip, Holm-adjusted (m = 2)", "verdict"]
    assert row(ko, "빌드 | 배포 σ")[2:5] == ["배포 기준 빌드 대비 [Holm 보정 95% CI (m = 2)]",
                                           "p값 (부호 반전, Holm 보정, m = 2)", "판정"]
    for card, lower in ((en, "lower"), (ko, "낮음")):
        assert row(card, "FP8 + SmoothQuant", cells=9)[2:5] == [shown, p_shown, lower]


def test_too_few_resamples_for_the_largest_family_are_refused(tmp_path: Path) -> None:
    """On EXACT_MAX_N + 4 = 36 observations (random sign patterns), gptq's deployed results beside those of
    sq_auto and rtn_mavg, and fake-quant results of sq_auto alone: the deployed family (m = 3) is the largest, and its
    corrected level 0.05 / 3 needs min_resamples(3) random sign patterns (the command line takes 100 at least, so
    m = 2 would not show it). On 16 observations every pattern is enumerated, and 100 resamples are enough."""
    exact = make_dist(tmp_path / "exact")
    assert invoke("tables", "--dist", exact, "--resamples", "100").exit_code == 0
    dist = make_dist(tmp_path / "sampled", n=EXACT_MAX_N + 4)
    results = dict(np.load(dist / _repo("rtn_mavg") / "results" / "deployed-validation.npz"))
    write_results(dist / _repo("gptq") / "results" / "deployed-validation.npz", results["reference"],
                  results["candidate"], results["obs_ids"])
    for name in ("rtn", "sq_auto"):
        results = dict(np.load(dist / _repo(name) / "results" / "deployed-validation.npz"))
        write_results(dist / _repo(name) / "results" / "fakequant-validation.npz", results["reference"],
                      results["candidate"], results["obs_ids"])
    need = min_resamples(3)
    assert need > 100 > min_resamples(1)
    result = invoke("tables", "--dist", dist, "--resamples", str(need - 1))
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: --resamples {need - 1}: ") and "deployed/validation (m = 3" in \
        result.output and f"pass --resamples {need} or more" in result.output, result.output
    assert not (dist / "tables").exists()  # nothing written
    result = invoke("tables", "--dist", dist, "--resamples", str(need))
    assert result.exit_code == 0, result.output
    assert json.loads((dist / "tables" / "tables.json").read_text())["resamples"] == need


def test_mismatched_observations_are_an_error_naming_both_files(dist: Path) -> None:
    build = dist / _repo("rtn_mavg") / "results" / "deployed-validation.npz"
    data = dict(np.load(build))
    np.savez(build, **{**data, "obs_ids": data["obs_ids"][::-1].copy()})
    baseline = dist / _repo("rtn") / "results" / "deployed-validation.npz"
    result = invoke("tables", "--dist", dist, "--resamples", RESAMPLES)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"{build}: obs_ids differ from those of the baseline's {baseline}" in result.output
    assert not (dist / "tables").exists()


# item 18 -------------------------------------------------------------------------------------------------------------

def test_seed_yardstick_resamples_observations(dist: Path) -> None:
    seed = tables(dist)[("yardstick-seed", "yardstick")]
    assert seed["n_obs"] == 4 and seed["n_steps"] == 16 * 32  # 4 observations x 4 seeds
    assert seed["overall_ci"] is None and seed["too_few_observations"]  # 4 observations: below the minimum of 6


# rollout latency and memory (issue 14, item 4) -----------------------------------------------------------------------

def _speed(seconds: float, gib: float, device: str = "NVIDIA H200", **more: Any) -> dict[str, Any]:
    return {"device": device, "rollouts": 16, "seconds_median": seconds, "peak_gib": gib, **more}


def test_rollout_speed_beside_the_results_reaches_tables_and_cards(dist: Path) -> None:
    """What 'release eval' on a GPU writes beside a results file: the card states it next to BF16's."""
    perf = dist / _repo("sq_auto") / "results" / "deployed-validation.perf.json"
    perf.write_text(json.dumps({"bf16": _speed(0.7612, 28.93), "build": _speed(0.9489, 15.91)}))
    results = dict(np.load(perf.with_suffix("").with_suffix(".npz")))  # computed on that GPU, by ModelOpt's GEMM
    results["computed"] = np.array(json.dumps({"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0",
                                               "kernel": "modelopt-fp8-gemm", "gemm_shapes": [[164, 4096, 4096]]}))
    np.savez(perf.with_suffix("").with_suffix(".npz"), **results)
    rows = tables(dist)
    assert rows[("sq_auto", "deployed")]["speed"] == {
        "bf16": {"device": "NVIDIA H200", "rollouts": 16, "seconds": 0.7612, "peak_gib": 28.93, "graphs": False},
        "build": {"device": "NVIDIA H200", "rollouts": 16, "seconds": 0.9489, "peak_gib": 15.91, "graphs": False}}
    assert rows[("rtn", "deployed")]["speed"] is None  # measured on a CPU: no figures
    en, ko = cards(dist)
    assert ("Speed and memory (deployed, H200, ModelOpt FP8 GEMM, held-out labs, `NVIDIA H200`): 0.95 s vs 0.76 s per "
            "rollout for BF16 (median of 16 rollouts each), peak GPU memory 15.9 vs 28.9 GiB.") in en
    assert ("롤아웃 한 번에 0.95초, BF16은 0.76초(각각 롤아웃 16번의 중앙값), 최대 GPU 메모리 15.9 GiB, "
            "BF16은 28.9 GiB") in ko
    assert "Speed and memory" not in cards(dist, "rtn")[0]
    # both replayed their decoder stacks as CUDA graphs (release eval on CUDA): the sentence says so; one each way:
    # it says the two do not compare
    perf.write_text(json.dumps({"bf16": _speed(0.3927, 29.04, graphs=True), "build": _speed(0.3519, 16.23,
                                                                                           graphs=True)}))
    assert tables(dist)[("sq_auto", "deployed")]["speed"]["build"]["graphs"] is True
    en, ko = cards(dist)
    assert ("Speed and memory (deployed, H200, ModelOpt FP8 GEMM, held-out labs, `NVIDIA H200`, both with the decoder "
            "stack replayed as CUDA graphs): 0.35 s vs 0.39 s per rollout for BF16") in en
    assert "둘 다 디코더 스택을 CUDA 그래프로 재생): 롤아웃 한 번에 0.35초, BF16은 0.39초" in ko
    perf.write_text(json.dumps({"bf16": _speed(0.9479, 28.85), "build": _speed(0.3519, 16.23, graphs=True)}))
    tables(dist)
    en, ko = cards(dist)
    assert "0.35 s vs 0.95 s per rollout for BF16" in en and "do not compare like with like" in en
    assert "같은 조건의 비교가 아닙니다" in ko


@pytest.mark.parametrize(("doc", "message"), [
    ("[1]", "expected a JSON object"),
    ("{", "not valid JSON"),
    (json.dumps({"bf16": _speed(0.7, 28.9)}), "field 'build' is missing"),
    (json.dumps({"bf16": _speed(0.7, 28.9), "build": {"device": "x"}}), "field 'rollouts' is missing"),
    (json.dumps({"bf16": _speed(0.7, 28.9), "build": _speed(-1.0, 15.9)}), "must be positive numbers"),
    (json.dumps({"bf16": _speed(1e308, 28.9), "build": _speed(0.9, 15.9)}), "from 1e-06 to 100000"),  # issue 47
    (json.dumps({"bf16": _speed(0.7, 28.9), "build": _speed(5e-324, 15.9)}), "must be positive numbers from"),
    (json.dumps({"bf16": _speed(0.7, 28.9), "build": _speed(0.9, -15.9)}), "must be positive numbers from"),
    (json.dumps({"bf16": {**_speed(0.7, 28.9), "rollouts": 0}, "build": _speed(0.9, 15.9)}), "rollouts at least 1"),
    (json.dumps({"bf16": _speed(0.7, 28.9), "build": _speed(0.9, 15.9, "NVIDIA L4")}),
     "BF16 ran on NVIDIA H200, the build on NVIDIA L4"),
])
def test_bad_rollout_speed_is_a_one_line_error(dist: Path, doc: str, message: str) -> None:
    perf = dist / _repo("sq_auto") / "results" / "deployed-validation.perf.json"
    perf.write_text(doc)
    result = invoke("tables", "--dist", dist, "--resamples", RESAMPLES)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {perf}: ") and message in result.output, result.output
    assert not (dist / "tables").exists()


# issue 47: the same results give the same bytes ----------------------------------------------------------------------

def test_tables_and_selection_rerun_on_the_same_results_write_the_same_bytes(dist: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Without SOURCE_DATE_EPOCH the tables take their date from the builds' provenance and the selection from the
    tables, never the wall clock: a rerun an hour later changes no byte."""
    import datetime as dt

    import release.core.io as io

    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    tables(dist)
    assert invoke("select", "--dist", dist).exit_code == 0
    first = {p: (dist / p).read_bytes() for p in ("tables/tables.json", "selection.json")}
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)

    class Clock(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> dt.datetime:  # type: ignore[override]
            return later

    monkeypatch.setattr(io, "datetime", Clock)
    tables(dist)
    assert invoke("select", "--dist", dist).exit_code == 0
    assert {p: (dist / p).read_bytes() for p in first} == first
    dates = [json.loads(first["tables/tables.json"])["date"], json.loads(first["selection.json"])["date"]]
    built = max(json.loads(p.read_text())["date"] for p in dist.glob("*/provenance.json"))
    assert dt.datetime.fromisoformat(dates[0]) == dt.datetime.fromisoformat(built)
    assert dt.datetime.fromisoformat(dates[1]) == dt.datetime.fromisoformat(built)
