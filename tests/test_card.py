"""Bilingual cards: the seed card's tables reproduced from its figures, complete catalogs, golden files, errors."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from babel.messages.extract import extract_from_dir
from babel.messages.pofile import read_po
from huggingface_hub import ModelCard

from release.card import Formatter, diff_headers, fidelity_rows, ranking_tables, served_rows, translations
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
    rows = served_rows(seed_records, Formatter(lang), t)
    seed = _seed_rows("build\t서빙 σ [95% CI]", 5)
    cells = [[r["build"], r["sigma"], r["diff"], r["changes"], r["fq_sigma"], r["fq_changes"], r["gates"]]
             for r in rows]
    if lang == "ko":
        assert cells == seed
        header = next(x for x in SEED.read_text(encoding="utf-8").splitlines() if x.startswith("build\t서빙 σ"))
        served_diff = diff_headers([r for r in seed_records if r["path"] == "served"], t, served=True)["diff"]
        assert [t("build"), t("served sigma [95% CI]"), served_diff, t("served changes"),
                t("fake quant sigma"), t("fake quant changes"), t("gate (fake quant / served)")] == header.split("\t")
    else:
        assert [c[1:6] for c in cells] == [s[1:6] for s in seed]
        assert [c[6] for c in cells] == ["fail / fail", "pass / fail", "fail / fail", "pass / pass", "pass / pass"]


@pytest.mark.parametrize("lang", ["en", "ko"])
def test_fakequant_ranking_matches_the_seed(seed_records: list[dict[str, Any]], lang: str) -> None:
    t = translations(lang).gettext
    table = next(x for x in ranking_tables(seed_records, Formatter(lang), t) if x["steps"] == 1024)
    seed = _seed_rows("순위\tbuild\tσ [95% CI]\tRTN 대비 [95% CI]\t판정 변화 /1024", 16)
    cells = [[r["rank"], r["build"], r["sigma"], r["diff"], r["changes"]] for r in table["rows"]]
    if lang == "ko":
        assert cells == seed
    else:
        assert [[c[0], *c[2:]] for c in cells] == [[s[0], *s[2:]] for s in seed]


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
