"""Bilingual cards: the seed card's tables reproduced from its figures, complete catalogs, golden files, errors."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po
from huggingface_hub import ModelCard

from release.card import (
    Formatter,
    conclusions,
    fakequant_tables,
    fidelity_rows,
    path_tables,
    paths_rows,
    setup_rows,
    translations,
)
from release.config import load_build, load_release
from tests.conftest import ROOT, invoke

SEED = ROOT / "tests" / "data" / "seed-model-card.txt"  # a copy of ../shared/seed/model-card.txt
CARD_INPUTS = ROOT / "tests" / "data" / "cards"
GOLDEN = ROOT / "tests" / "golden"
DELIVERED = {"rtn": "Cosmos3-Nano-Policy-DROID-FP8", "sq_auto": "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant",
             "rtn_mavg": "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvgObserver"}


def _seed_rows(header_start: str, count: int) -> list[list[str]]:
    lines = SEED.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    return [line.split("\t") for line in lines[start + 1 : start + 1 + count]]


@pytest.fixture(scope="module")
def seed_records() -> list[dict[str, Any]]:
    import json

    return list(json.loads((ROOT / "tests/data/seed_figures.json").read_text())["records"])


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_fidelity_table_matches_the_seed(seed_records: list[dict[str, Any]], lang: str) -> None:
    pick = [("sq_auto", "served"), ("sq_auto", "fakequant"), ("rtn", "served"), ("yardstick-compile", "yardstick"),
            ("yardstick-seed", "yardstick")]
    records = [next(r for r in seed_records if (r["build"], r["path"]) == p) for p in pick]
    rows = fidelity_rows(records, Formatter(lang), translations(lang).gettext)
    seed = _seed_rows("Comparison\tPath\toverall (sigma)", 5)
    for mine, theirs in zip(rows, seed, strict=True):
        assert [mine["overall"], mine["ratio"], mine["mae"], mine["snr"], mine["gripper"]] == theirs[2:]


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_served_table_matches_the_seed(seed_records: list[dict[str, Any]], lang: str) -> None:
    t = translations(lang).gettext
    table = path_tables(seed_records, "RTN", 2, Formatter(lang), t)[0]
    seed = _seed_rows("build\t서빙 σ [95% CI]", 5)
    cells = [[r["build"], r["sigma"], r["diff"], r["changes"], r["fq_sigma"], r["fq_changes"], r["gates"]]
             for r in table["rows"]]
    if lang == "ko":
        assert cells == seed
        header = next(x for x in SEED.read_text(encoding="utf-8").splitlines() if x.startswith("build\t서빙 σ"))
        h = table["headers"]
        assert [t("build"), h["sigma"], h["diff"], h["changes"], t("fake quant sigma"), t("fake quant changes"),
                h["gate"]] == header.split("\t")
    else:
        assert [c[1:6] for c in cells] == [s[1:6] for s in seed]
        assert [c[6] for c in cells] == ["fail / fail", "pass / fail", "fail / fail", "pass / pass", "pass / pass"]


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_attribution_and_its_notes_match_the_seed(seed_records: list[dict[str, Any]], lang: str) -> None:
    """Section 2's attribution table and the two findings the seed states under it: observation 28 recurs, and
    served RTN's error is concentrated in observations other than fake quant's."""
    table = path_tables(seed_records, "RTN", 2, Formatter(lang), translations(lang).gettext)[0]
    seed = _seed_rows("build\t서빙 RTN 대비\tRTN 대비 차이를 가장 키운 관측 2개", 4)
    cells = [[r["build"], r["diff"], r["top"], r["without"]] for r in table["attribution"]]
    assert [c[1:] for c in cells] == [s[1:] for s in seed]
    if lang == "ko":
        assert [c[0] for c in cells] == [s[0].removesuffix(" (전달)") for s in seed]
        assert table["notes"][0] == "4개 build 모두 관측 28번이 차이를 키운 관측 2개에 들어 있습니다."
        assert table["notes"][1] == ("이 경로의 RTN은 오차 상위 관측 3개(5, 28, 2)가 제곱오차의 46%를 차지합니다. "
                                     "같은 체크포인트를 fake quant로 돌리면 상위 관측이 7, 12, 15번으로 바뀝니다.")
    else:
        assert table["notes"][0] == "Observation 28 is among the two that move the difference most for all 4 builds."


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_fakequant_rankings_per_family_match_the_seed(seed_records: list[dict[str, Any]], lang: str) -> None:
    """Sections 3.1 (NVIDIA's format, 16 builds) and 3.2 (per-channel weight / per-token activation, 6 builds)."""
    t = translations(lang).gettext
    [table] = fakequant_tables(seed_records, "RTN", {}, 3, Formatter(lang), t)
    nvidia, explore = table["families"]
    lines = SEED.read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("순위\tbuild\tσ [95% CI]\tRTN 대비 [95% CI]")]
    for family, start, n in ((nvidia, starts[0], 16), (explore, starts[1], 6)):
        seed = [line.split("\t") for line in lines[start + 1: start + 1 + n]]
        cells = [[r["rank"], r["build"], r["sigma"], r["diff"], r["changes"]] for r in family["rows"]]
        if lang == "ko":
            assert cells == seed
        else:
            assert [[c[0], *c[2:]] for c in cells] == [[s[0], *s[2:]] for s in seed]
    if lang == "ko":
        assert nvidia["heading"] == "3.1 NVIDIA 형식 (W8A8 FP8, per-tensor static): 16개"
        assert explore["vs"] == "RTN 대비 차이는 NVIDIA 형식 RTN(per-tensor)과 비교한 값입니다."
        assert explore["reasons"][0].startswith("NVIDIA 서버의 ModelOpt 체크포인트 로더(`apply_modelopt_fp8_checkpoint_"
                                                "inplace`)는 두 scale을 (1, 1)로 읽어")
    assert not explore["notes"] and len(explore["reasons"]) == 2


def test_setup_and_paths_tables_hold_the_seed_figures(seed_records: list[dict[str, Any]]) -> None:
    """Section 1 from the seed's data: 504 Linears in 36 layers, 32 algorithm calls, 256 = 32 x 4 x 2 calibration
    calls, 10,000 resamples, the gate with its 5 of 1024 steps, both yardsticks; and the two evaluation paths."""
    t = translations("ko").gettext
    prov = {"quantized_linears": 504, "source": {"architecture": {"num_hidden_layers": 36}},
            "calibration": {"calls": 256, "observations": 32}, "versions": {"modelopt": "0.44.0"}}
    rows = {r["item"]: r["value"] for r in setup_rows(seed_records, load_release(), load_build("sq_auto"), prov,
                                                      10_000, "RTN", Formatter("ko"), t)}
    assert rows["양자화 대상"].startswith("transformer의 Linear 504개 (두 tower × 36 layer × q/k/v/o, gate/up/down)")
    assert rows["알고리즘 데이터"] == "관측당 transformer 호출 1개씩, 32개"
    assert rows["activation calibration"] == "BF16 정책의 transformer 호출 256개 (관측 32 × denoising 4 step × CFG 2)"
    assert rows["통계"].startswith("관측 단위 bootstrap 10,000회. RTN과의 차이는 같은 resample로 짝지어 계산")
    assert rows["gate"] == "전체 오차 ≤ 0.13σ, 판정 변화 ≤ 0.5% (≤ 5/1024)"
    assert rows["참고 크기"] == "BF16 eager vs torch.compile 0.130σ, BF16 시드만 바꿀 때 0.392σ"
    assert "DROID calibration lab (in-sample) 관측 32개" in rows["평가 관측"]
    paths = {r["path"]: r["builds"] for r in paths_rows(seed_records, t)}
    assert paths == {"fake quant, 오프라인 재생": "22개 전부", "정책 서버, FP8 GEMM": "22개 중 5개"}


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_conclusions_from_the_seed_figures(seed_records: list[dict[str, Any]], lang: str) -> None:
    """The seed's conclusions, derived: no NVIDIA-format build beats RTN on fake quant, fake quant and the server
    rank the shared builds in opposite order, two observations carry most served differences, and the per-channel
    family has the lowest fake-quant error without a difference to RTN. The seed's figures are its uncorrected
    intervals (stored as m = 1), so the moving-average observer's served interval counts as excluding zero here."""
    found = conclusions(seed_records, "RTN", Formatter(lang), translations(lang).gettext)
    if lang == "ko":
        assert found == [
            "- Fake quant, 오프라인 재생, calibration lab (in-sample), NVIDIA 형식 (W8A8 FP8, per-tensor static): "
            "Bonferroni 보정 95% CI (m = 1)가 0을 배제하며 RTN보다 오차가 낮은 build는 없습니다.",
            "- 정책 서버, FP8 GEMM, 전체 lab, NVIDIA 형식 (W8A8 FP8, per-tensor static): Bonferroni 보정 95% CI "
            "(m = 1)가 0을 배제하며 RTN보다 오차가 낮은 build: RTN + 이동평균 observer 0.01.",
            "- Fake quant와 정책 서버, FP8 GEMM, 전체 lab에서 함께 평가한 build 5개의 순위가 서로 반대입니다 "
            "(Spearman rho = -0.30).",
            "- 정책 서버, FP8 GEMM, 전체 lab에서 RTN과 벌어진 차이도 대부분 관측 2개에서 나옵니다. 그 2개를 빼면 "
            "차이 4개 중 4개가 절반 아래로 줄어듭니다.",
            "- Per-channel weight / per-token activation (탐색용) 계열은 fake quant 오차가 가장 낮습니다 "
            "(SQ auto-α + GPTQ, 0.088σ). 그러나 보정 CI가 0을 배제하는 RTN 대비 차이가 없고, NVIDIA 정책 서버가 읽는 "
            "형식도 아닙니다."]
    else:
        assert found[0].startswith("- Fake quant, offline replay, calibration labs (in-sample), NVIDIA's format")
        assert "rank the 5 builds they share in opposite order (Spearman rho = -0.30)" in found[2]
        assert found[4].startswith("- The per-channel weight / per-token activation (exploratory) family has the "
                                   "lowest fake-quant error (SQ auto-α + GPTQ, 0.088 sigma)")


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_formatter_edge_values(lang: str) -> None:
    """tables.json's undefined (null) and infinite ("inf") values, and p-values with their resolution."""
    f = Formatter(lang)
    assert (f.num(None), f.num("inf"), f.num("-inf", 1), f.num("inf", sign=True)) == ("-", "∞", "-∞", "+∞")
    assert f.num(float("inf"), 2) == "∞" and f.pct(None) == "-"
    assert f.p(0.0004, bound=True) == "< 0.0004" and f.p(2e-6, bound=True) == "< 0.000002"
    assert f.p(0.5944, bound=False) == "0.5944" and f.p(1.0, False) == "1"


def test_korean_catalog_is_complete() -> None:
    method_map = [("templates/**.j2", "jinja2"), ("release/card.py", "python")]
    options = {"templates/**.j2": {"extensions": "jinja2.ext.i18n"}}
    extracted = {m[2] for m in extract_from_dir(str(ROOT), method_map, options, keywords={"_": None,
                                                                                         "gettext": None})}
    with (ROOT / "locales/ko/LC_MESSAGES/messages.po").open("rb") as f:
        catalog = read_po(f)
    entries = {m.id: m for m in catalog if m.id}
    missing = sorted(str(e) for e in extracted if e and e not in entries)
    assert not missing, f"not in the Korean catalog (run 'make i18n'): {missing}"
    untranslated = [m.id for m in entries.values() if not m.string]
    fuzzy = [m.id for m in entries.values() if m.fuzzy]
    assert not untranslated and not fuzzy


@pytest.fixture
def card_dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    shutil.copytree(CARD_INPUTS, dist)
    return dist


def test_cards_match_golden_files(card_dist: Path, request: pytest.FixtureRequest) -> None:
    result = invoke("card", "rtn", "sq_auto", "rtn_mavg", "--dist", card_dist, "--lang", "en,ko")
    assert result.exit_code == 0, result.output
    update = request.config.getoption("--update-golden")
    for build, repo in DELIVERED.items():
        for name, lang in (("README.md", "en"), ("README.ko.md", "ko")):
            text = (card_dist / repo / name).read_text(encoding="utf-8")
            golden = GOLDEN / build / f"README.{lang}.md"
            if update:
                golden.parent.mkdir(parents=True, exist_ok=True)
                golden.write_text(text, encoding="utf-8")
            assert text == golden.read_text(encoding="utf-8"), f"{golden} differs (rerun with --update-golden)"
        assert (card_dist / repo / "forest.en.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (card_dist / repo / "forest.ko.png").is_file() and (card_dist / repo / "LICENSE").is_file()


def test_card_metadata_round_trips(card_dist: Path) -> None:
    assert invoke("card", "sq_auto", "--dist", card_dist).exit_code == 0
    readme = card_dist / DELIVERED["sq_auto"] / "README.md"
    card = ModelCard(readme.read_text(encoding="utf-8"))
    data = card.data.to_dict()
    assert data["base_model"] == "nvidia/Cosmos3-Nano-Policy-DROID" and data["base_model_relation"] == "quantized"
    assert (data["license"], data["license_name"]) == ("other", "OpenMDW-1.1")
    assert data["pipeline_tag"] == "robotics" and data["language"] == ["en", "ko"]
    assert "[ko](README.ko.md)" in card.text
    ko = (card_dist / DELIVERED["sq_auto"] / "README.ko.md").read_text(encoding="utf-8")
    assert "## 검증" in ko and "2026년" in ko and "## 라이선스" in ko


def test_check_writes_nothing(card_dist: Path) -> None:
    result = invoke("card", "--dist", card_dist, "--check")
    assert result.exit_code == 0, result.output
    assert not list(card_dist.rglob("README*.md"))


def test_card_errors(card_dist: Path) -> None:
    result = invoke("card", "--dist", card_dist, "--lang", "en,xx")
    assert result.exit_code == 2 and "unknown language code 'xx'; supported: en, ko" in result.output
    result = invoke("card", "rtn_hist", "--dist", card_dist)
    assert result.exit_code == 2 and "run 'release build rtn_hist' first" in result.output
    (card_dist / DELIVERED["rtn"] / "provenance.json").unlink()
    result = invoke("card", "rtn", "--dist", card_dist)
    assert result.exit_code == 2 and "provenance.json: missing (provenance); run 'release build rtn'" in result.output
    (card_dist / "tables" / "tables.json").unlink()
    result = invoke("card", "sq_auto", "--dist", card_dist)
    assert result.exit_code == 2 and "tables.json: missing (fidelity tables); run 'release tables'" in result.output


def test_undefined_variable_names_template_and_line(card_dist: Path, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    import release.card as card

    templates = tmp_path / "templates"
    shutil.copytree(ROOT / "templates", templates)
    partial = templates / "partials" / "use.md.j2"
    partial.write_text(partial.read_text() + "\n{{ no_such_value }}\n")
    monkeypatch.setattr(card, "TEMPLATES", templates)
    monkeypatch.setattr(card, "ROOT", tmp_path)
    result = invoke("card", "rtn", "--dist", card_dist, "--check")
    assert result.exit_code == 2
    assert "templates/partials/use.md.j2:" in result.output and "'no_such_value' is undefined" in result.output
