"""The conclusions a card states (release/publish/card/conclusions.py), in English and Korean, from crafted results.

Each dist is written directly, as in tests/test_faults_stats.py: every build's candidate is one reference plus one
noise times a scale of its own, so a build's overall error is its scale times the baseline's (RTN, scale 1) and its
per-observation difference to the baseline has one sign throughout (its sign-flip p is the smallest there is). Each
dist goes through `release tables` and `release card sq_auto --lang en,ko` once; the tests read what they wrote.
The Korean sentences are checked by fragments of their msgstr in locales/ko/LC_MESSAGES/messages.po, so that an
English fallback fails.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from release.measure.paired import min_observations, min_resamples
from release.measure.stats import decimals
from tests.conftest import ROOT
from tests.test_faults_stats import CARD_INPUTS, RESAMPLES, _chunks, _repo, cards, csv, row, tables, write_results

N = 12  # observations: intervals and p-values up to m = 8 builds a family (min_observations), and fast
LABS = np.repeat(["AUTOLab", "IPRL", "PennPAL", "RPL"], N // 4)  # the held-out labs, 3 observations each
LANGS = ("en", "ko")
BASELINE = {"en": "FP8 (RTN, NVIDIA-identical recipe)", "ko": "FP8 (RTN, NVIDIA와 같은 레시피)"}
SQ_AUTO = {"en": "FP8 + SmoothQuant (alpha searched per layer)", "ko": "FP8 + SmoothQuant (레이어별 α 탐색)"}
MAVG = {"en": "FP8 RTN + moving-average observer 0.01", "ko": "FP8 RTN + 이동평균 옵저버 0.01"}
GPTQ = {"en": "FP8 GPTQ", "ko": "FP8 GPTQ"}
NVIDIA = {"en": "NVIDIA's format (W8A8 FP8, per-tensor static)", "ko": "NVIDIA 형식 (W8A8 FP8, 텐서별 정적)"}
DEPLOYED = {"en": "Deployed, CPU emulation, held-out labs", "ko": "배포, CPU 에뮬레이션, 홀드아웃 랩"}
DEPLOYED_ALL = {"en": "Deployed, CPU emulation, all labs", "ko": "배포, CPU 에뮬레이션, 전체 랩"}

Records = dict[tuple[str, str, str], dict[str, Any]]


def crafted(root: Path, files: dict[str, dict[str, float]], n: int = N, labs: np.ndarray | None = None) -> Path:
    """A dist of the committed card inputs and, for each results file (``"deployed-validation"``) and build, the
    reference plus the noise times the build's scale; and an eager-vs-compile yardstick on the validation split of a
    tenth of RTN's error (the 'compile' margin there)."""
    dist = root / "dist"
    shutil.copytree(CARD_INPUTS, dist, ignore=shutil.ignore_patterns("tables", "selection.json"))
    ref, ids = _chunks(n), np.arange(100, 100 + n)
    noise = np.random.default_rng(1).normal(scale=0.05, size=ref.shape)
    for name, scales in files.items():
        for build, scale in scales.items():
            write_results(dist / _repo(build) / "results" / f"{name}.npz", ref, ref + noise * scale, ids, labs=labs)
    write_results(dist / "yardsticks" / "compile-validation.npz", ref, ref + noise * 0.1, ids)
    return dist


def rendered(dist: Path) -> tuple[Records, dict[str, str], Path]:
    """`release tables` (RESAMPLES resamples) and the cards of sq_auto: the records by (build, path, split), the
    English and Korean README, and the dist."""
    tables(dist)
    doc = json.loads((dist / "tables" / "tables.json").read_text())
    en, ko = cards(dist)
    return {(r["build"], r["path"], r["split"]): r for r in doc["records"]}, {"en": en, "ko": ko}, dist


def section(card: str, heading: str) -> str:
    """The text of the card's ``###`` section whose heading starts with ``heading`` (a number aside)."""
    for part in card.split("\n### ")[1:]:
        if part.split(". ", 1)[-1].startswith(heading) or part.startswith(heading):
            return part
    raise AssertionError(f"no section {heading!r}")


def conclusions(card: str) -> list[str]:
    """The statements of the card's Conclusions."""
    part = section(card, "Conclusions") if "### Conclusions" in card else section(card, "결론")
    return [line[2:] for line in part.splitlines() if line.startswith("- ")]


def advice(card: str) -> str:
    return next(line for line in card.splitlines() if line.startswith(("Which build to use", "사용할 빌드")))


# verdicts against the baseline ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> tuple[Records, dict[str, str], Path]:
    """Deployed results on the held-out labs (with the lab of each observation) under a copy of builds/ with a
    margin of 0.02 sigma and no selection rule (every build with a repo is delivered): sq_auto's error is 0.97 x
    RTN's on every observation (p as small as it gets, the difference far inside the margin), rtn_mavg's twice
    RTN's, gptq's equal to RTN's. Besides, fake quant on the calibration labs of RTN and awq, 1.03 x RTN's."""
    root = tmp_path_factory.mktemp("verdicts")
    shutil.copytree(ROOT / "builds", root / "builds")
    release = root / "builds" / "release.yaml"
    text = release.read_text()
    text = text[:text.index("\nselection:")] + text[text.index("\n# The practical floor"):]
    release.write_text(text.replace("equivalence_margin: {of_baseline: 0.1}", "equivalence_margin: {sigma: 0.02}"))
    dist = crafted(root, {"deployed-validation": {"rtn": 1.0, "sq_auto": 0.97, "rtn_mavg": 2.0, "gptq": 1.0},
                          "fakequant-calibration": {"rtn": 1.0, "awq": 1.03}}, labs=LABS)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELEASE_BUILDS", str(root / "builds"))
        return rendered(dist)


def test_a_significant_difference_inside_the_margin_says_both(verdicts: tuple[Records, dict[str, str],
                                                                            Path]) -> None:
    """sq_auto is lower than RTN (Holm-adjusted p < 0.05) by far less than the margin: the verdict says "lower" and
    "within +-0.020 sigma" side by side, and each conclusion bullet lists exactly the builds its criterion selects."""
    rows, card, dist = verdicts
    sq = rows[("sq_auto", "deployed", "validation")]
    assert sq["diff_to_baseline"] < 0 and sq["diff_p_corrected"] < 0.05  # a difference the test supports ...
    assert -0.02 < sq["diff_ci_corrected"][0] < sq["diff_ci_corrected"][1] < 0  # ... far inside the margin
    assert sq["diff_verdict"] == "lower" and sq["within_margin"] is True and sq["margin"] == 0.02
    assert sq["non_inferior"] is True
    ranking = csv(dist, "ranking").set_index("build")
    assert ranking.loc[SQ_AUTO["en"], "verdict"] == "lower; within +-0.02"
    p = f"{sq['diff_p_corrected']:.2g}"
    lower = {
        "en": f"{DEPLOYED['en']}, {NVIDIA['en']}: lower error than {BASELINE['en']} (sign-flip test, Holm-adjusted "
              f"p < 0.05 over m = 3): {SQ_AUTO['en']}.",
        "ko": f"{DEPLOYED['ko']}, {NVIDIA['ko']}: {BASELINE['ko']}보다 오차가 낮은 빌드(부호 반전 검정, m = 3에 대한 "
              f"Holm 보정 p < 0.05): {SQ_AUTO['ko']}."}
    within = {
        "en": f"{DEPLOYED['en']}, {NVIDIA['en']}: within +-0.020 sigma of {BASELINE['en']} (the Holm-adjusted 95% CI "
              f"lies inside the margin, the practical floor of `builds/release.yaml`): {SQ_AUTO['en']} (lower, "
              f"Holm-adjusted p = {p}), {GPTQ['en']}.",
        "ko": f"{DEPLOYED['ko']}, {NVIDIA['ko']}: {BASELINE['ko']}와의 차이가 ±0.020σ 안에 있는 빌드(Holm 보정 95% "
              f"CI가 `builds/release.yaml`의 실용 하한인 허용 폭 안에 있음): {SQ_AUTO['ko']}(낮음, Holm 보정 p = "
              f"{p}), {GPTQ['ko']}."}
    for lang, label in (("en", "lower, within +-0.020 sigma"), ("ko", "낮음, ±0.020σ 이내")):
        said = conclusions(card[lang])
        assert lower[lang] in said and within[lang] in said, said
        assert row(card[lang], SQ_AUTO[lang], cells=9)[4] == label


def test_each_conclusion_lists_exactly_what_its_criterion_selects(verdicts: tuple[Records, dict[str, str],
                                                                                Path]) -> None:
    """Every bullet of a family, extracted from the English card, names exactly the builds whose tables.json record
    meets its criterion: lower / higher (Holm-adjusted p < 0.05, diff_verdict) and within the margin."""
    rows, card, _ = verdicts
    titles = {r["title"]: r for r in rows.values()}
    checked = 0
    for bullet in conclusions(card["en"]):
        head, _, listed = bullet.rpartition("): ")
        if not listed or not head.startswith(DEPLOYED["en"]):
            continue
        family = {k: r for k, r in rows.items() if k[1:] == ("deployed", "validation") and r["comparisons"]}
        if "within +-" in head:
            wanted = {r["title"] for r in family.values() if r["within_margin"]}
        else:
            kind = "lower" if "lower error than" in head else "higher"
            wanted = {r["title"] for r in family.values() if r["diff_verdict"] == kind}
        named = {t for t in titles if t in listed}
        assert named == wanted, (bullet, named, wanted)
        checked += 1
    assert checked == 3  # lower, higher and within the margin


def test_a_significantly_worse_build_has_a_higher_error(verdicts: tuple[Records, dict[str, str], Path]) -> None:
    rows, card, _ = verdicts
    mavg = rows[("rtn_mavg", "deployed", "validation")]
    assert mavg["diff_verdict"] == "higher" and mavg["diff_p_corrected"] < 0.05 and mavg["diff_ci_corrected"][0] > 0
    assert mavg["non_inferior"] is False
    higher = {
        "en": f"{DEPLOYED['en']}, {NVIDIA['en']}: higher error than {BASELINE['en']} (Holm-adjusted p < 0.05 over "
              f"m = 3): {MAVG['en']}.",
        "ko": f"{DEPLOYED['ko']}, {NVIDIA['ko']}: {BASELINE['ko']}보다 오차가 높은 빌드(m = 3에 대한 Holm 보정 "
              f"p < 0.05): {MAVG['ko']}."}
    for lang, label in (("en", "higher"), ("ko", "높음")):
        assert higher[lang] in conclusions(card[lang])
        assert row(card[lang], MAVG[lang], cells=9)[4] == label


def test_an_identical_build_is_within_a_margin(verdicts: tuple[Records, dict[str, str], Path]) -> None:
    """gptq equals RTN: the difference is 0 on every observation, so its interval is [0, 0], inside any margin; the
    attribution finds no observation that moves it."""
    rows, card, _ = verdicts
    gptq = rows[("gptq", "deployed", "validation")]
    assert gptq["diff_to_baseline"] == 0 and gptq["diff_ci_corrected"] == [0, 0] and gptq["diff_p_corrected"] == 1
    assert gptq["diff_verdict"] == "not shown" and gptq["within_margin"] is True and gptq["attribution"]["diff"] == 0
    for lang, nothing in (("en", "no difference"), ("ko", "차이 없음")):
        assert row(card[lang], GPTQ[lang], cells=5)[2:4] == [nothing, "-"]


def test_use_advice_states_the_verdict_and_the_labs(verdicts: tuple[Records, dict[str, str], Path]) -> None:
    """Without a selection rule the advice names the delivered build of lowest error on the held-out deployed
    results, sq_auto, with its verdict against RTN (lower, within the margin), the Holm-adjusted figures, and how
    far leaving one of the 4 labs out moves it."""
    rows, card, _ = verdicts
    sq = rows[("sq_auto", "deployed", "validation")]
    assert sq["labs"] == 4
    lo, hi = sq["diff_without_one_lab"]
    assert lo <= sq["diff_to_baseline"] <= hi < 0
    digits, lab_digits = decimals(sq["diff_ci_corrected"]), decimals(sq["diff_without_one_lab"])
    ci = sq["diff_ci_corrected"]
    figures = f"{sq['diff_to_baseline']:.{digits}f} [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    by_lab = f"{lo:.{lab_digits}f}", f"{hi:.{lab_digits}f}"
    p = f"{sq['diff_p_corrected']:.2g}"
    en, ko = advice(card["en"]), advice(card["ko"])
    assert en.startswith(f"Which build to use: **{SQ_AUTO['en']}** ")
    assert (f"Against {BASELINE['en']}: lower, within +-0.020 sigma ({figures}, Holm-adjusted sign-flip p = {p}). "
            "These observations come from 4 labs, so a claim about other labs rests on 4 clusters: leaving one lab "
            f"out at a time, the difference ranges from {by_lab[0]} to {by_lab[1]} sigma.") in en, en
    assert ko.startswith(f"사용할 빌드: **{SQ_AUTO['ko']}** ")
    assert f"{BASELINE['ko']} 대비: 낮음, ±0.020σ 이내({figures}, Holm 보정 부호 반전 p = {p})." in ko, ko
    assert "랩 4곳에서 나왔으므로" in ko and f"랩을 하나씩 빼면 차이는 {by_lab[0]}σ에서 {by_lab[1]}σ 사이" in ko, ko


# an identical build without a margin, and rank agreement -------------------------------------------------------------

@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Records, dict[str, str], Path]:
    """Five builds on fake quant, deployed and served, on the held-out labs: deployed ranks them as fake quant does
    (Spearman rho = 1), served in an order of rho = 0 to it. On all labs, deployed gives every build RTN's very
    results (rho undefined); that split has no eager-vs-compile yardstick, so no margin."""
    fakequant = {"sq_auto": 0.6, "rtn_mavg": 0.8, "rtn": 1.0, "gptq": 1.2, "awq": 1.4}  # ranks 1 2 3 4 5
    served = {"sq_auto": 0.8, "rtn_mavg": 1.4, "rtn": 1.0, "gptq": 0.6, "awq": 1.2}  # ranks 2 5 3 1 4
    assert int(RESAMPLES) >= min_resamples(4) and N >= min_observations(4)
    return rendered(crafted(tmp_path_factory.mktemp("ranks"), {
        "fakequant-validation": fakequant, "deployed-validation": fakequant, "served-validation": served,
        "deployed-all": dict.fromkeys(fakequant, 1.0)}))


def test_builds_ranked_alike_with_the_permutation_p(ranks: tuple[Records, dict[str, str], Path]) -> None:
    """rho = 1 over 5 builds: 2 of the 5! orderings are as extreme, p = 1/60 < 0.05."""
    _, card, _ = ranks
    alike = {"en": "Fake quant and deployed, CPU emulation, held-out labs rank the 5 builds they share alike "
                   "(Spearman rho = 1.00, n = 5, exact permutation p = 0.017).",
             "ko": "모의 양자화와 배포, CPU 에뮬레이션, 홀드아웃 랩에서 함께 평가한 빌드 5개의 순위가 비슷합니다 "
                   "(Spearman ρ = 1.00, n = 5, 정확 순열 p = 0.017)."}
    for lang in LANGS:
        assert alike[lang] in conclusions(card[lang]), conclusions(card[lang])


def test_rho_of_zero_is_no_rank_agreement(ranks: tuple[Records, dict[str, str], Path]) -> None:
    _, card, _ = ranks
    none = {"en": "Fake quant and policy server, FP8 GEMM, held-out labs: too few builds for a rank test short of a "
                  "perfect agreement (Spearman rho = 0.00, n = 5, exact permutation p = 1; with 5 builds only rho = "
                  "+-1 reaches p < 0.05).",
            "ko": "모의 양자화와 정책 서버, FP8 GEMM, 홀드아웃 랩: 빌드가 적어서 순위가 완전히 일치할 때만 순위 "
                  "검정으로 일치를 보일 수 있습니다 (Spearman ρ = 0.00, n = 5, 정확 순열 p = 1; 빌드 5개로는 ρ = "
                  "±1만 p < 0.05에 이릅니다)."}
    for lang in LANGS:
        assert none[lang] in conclusions(card[lang]), conclusions(card[lang])
        assert not any(("policy server" in c and "alike" in c) or ("정책 서버" in c and "비슷합니다" in c)
                       for c in conclusions(card[lang]))


def test_undefined_rho_is_never_alike(ranks: tuple[Records, dict[str, str], Path]) -> None:
    _, card, _ = ranks
    undefined = {"en": "Fake quant and deployed, CPU emulation, all labs cannot be compared by rank: one of them "
                       "gives the 5 builds they share the same error (Spearman rho undefined).",
                 "ko": "모의 양자화와 배포, CPU 에뮬레이션, 전체 랩의 순위는 비교할 수 없습니다. 한쪽이 함께 평가한 "
                       "빌드 5개에 모두 같은 오차를 줍니다(Spearman ρ 정의되지 않음)."}
    for lang in LANGS:
        said = conclusions(card[lang])
        assert undefined[lang] in said, said
        assert not any(("all labs" in c or "전체 랩" in c) and ("alike" in c or "opposite" in c or "비슷합니다" in c)
                       for c in said), said


def test_identical_builds_show_no_difference_and_lie_within_the_default_margin(
        ranks: tuple[Records, dict[str, str], Path]) -> None:
    """On all labs every build equals RTN: each difference is 0 with p = 1, "no difference shown" (not lower or
    higher), inside the default margin (10% of RTN's error there), and the attribution says "no difference"."""
    rows, card, _ = ranks
    sq, rtn = rows[("sq_auto", "deployed", "all")], rows[("rtn", "deployed", "all")]
    assert sq["diff_to_baseline"] == 0 and sq["diff_p"] == sq["diff_p_corrected"] == 1
    assert sq["margin"] == pytest.approx(0.1 * rtn["overall_sigma"]) and sq["diff_verdict"] == "not shown"
    assert sq["within_margin"] is True
    no_lower = {"en": f"{DEPLOYED_ALL['en']}, {NVIDIA['en']}: no build has a lower error than {BASELINE['en']} "
                      "(sign-flip test, Holm-adjusted p < 0.05 over m = 4).",
                "ko": f"{DEPLOYED_ALL['ko']}, {NVIDIA['ko']}: {BASELINE['ko']}보다 오차가 낮은 빌드는 없습니다"}
    for lang, shown, nothing in (("en", "no difference shown, within", "no difference"),
                                 ("ko", "차이 드러나지 않음, ±", "차이 없음")):
        said = conclusions(card[lang])
        family = [c for c in said if c.startswith(DEPLOYED_ALL[lang])]
        assert len(family) == 2 and family[0].startswith(no_lower[lang]), said  # nothing lower or higher
        table = section(card[lang], DEPLOYED_ALL[lang])
        assert row(table, SQ_AUTO[lang], cells=9)[4].startswith(shown)
        assert row(table, SQ_AUTO[lang], cells=5)[2:4] == [nothing, "-"]


# too few observations ------------------------------------------------------------------------------------------------

def test_too_few_observations_print_no_interval(tmp_path: Path) -> None:
    """5 observations, below the 6 an interval needs: no interval of any kind in the rows (overall, gripper,
    difference), no p and no verdict; the conclusions say why."""
    assert 5 < min_observations()
    rows, card, _ = rendered(crafted(tmp_path, {"deployed-validation": {"rtn": 1.0, "sq_auto": 0.5,
                                                                        "rtn_mavg": 2.0}}, n=5))
    sq = rows[("sq_auto", "deployed", "validation")]
    assert sq["too_few_observations"] and sq["diff_too_few_observations"]
    assert [sq[k] for k in ("overall_ci", "gripper_ci", "diff_ci", "diff_ci_corrected", "diff_p", "diff_p_corrected",
                            "diff_verdict", "gate_within_noise")] == [None] * 8
    too_few = {"en": f"{DEPLOYED['en']}: too few observations to compare the builds with {BASELINE['en']}.",
               "ko": f"{DEPLOYED['ko']}: 관측 수가 너무 적어 빌드를 {BASELINE['ko']}와 비교할 수 없습니다."}
    cannot_rank = {"en": "So these observations (5 per split) cannot rank the builds of NVIDIA's format against each "
                         "other.",
                   "ko": "그래서 이 관측(분할마다 5개)으로는 NVIDIA 형식 빌드 사이의 순위를 가를 수 없습니다."}
    for lang, reason in (("en", "too few observations"), ("ko", "관측 수 부족")):
        said = conclusions(card[lang])
        assert too_few[lang] in said and cannot_rank[lang] in said, said
        fidelity = row(card[lang], SQ_AUTO[lang], cells=7)
        deployed = row(card[lang], SQ_AUTO[lang], cells=9)
        assert fidelity[2].endswith(f" ({reason})") and fidelity[6].endswith(f" ({reason})")  # overall, gripper
        assert deployed[1].endswith(f" ({reason})") and deployed[2].endswith(f" ({reason})")  # sigma, difference
        assert deployed[3:5] == [reason, reason]  # p, verdict
        assert not any("[" in cell for cell in fidelity + deployed), (fidelity, deployed)
