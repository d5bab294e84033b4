"""Build files: validation, and the one-line errors that name file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from release.core.builds import available_builds, load_build, load_release
from release.core.config import NANO_QUANTIZED
from release.core.errors import ReleaseError
from tests.conftest import ROOT, invoke


def test_delivered_builds_validate() -> None:
    release = load_release(ROOT / "builds")
    assert release.license.name == "OpenMDW-1.1"
    assert release.selection is not None and set(release.repos) == set(release.selection.candidates)
    assert release.override == {}  # the shipped release delivers what its selection chooses
    assert set(available_builds(ROOT / "builds")) >= {"rtn", "sq_auto", "rtn_mavg"}
    for name in ("rtn", "sq_auto", "rtn_mavg"):
        build = load_build(name, ROOT / "builds")
        assert build.quantized == NANO_QUANTIZED and len(build.quantized) == 14
        assert build.calibration_calls == 256 and build.algorithm_calls == 32


def _replace(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


def test_unknown_field_names_file_line_and_field(builds: Path) -> None:
    _replace(builds / "rtn.yaml", "repo: Cosmos3-Nano-Policy-DROID-FP8\n",
             "repo: Cosmos3-Nano-Policy-DROID-FP8\ncalibrater: max\n")
    with pytest.raises(ReleaseError) as err:
        load_build("rtn")
    msg = str(err.value)
    assert f"{builds / 'rtn.yaml'}:6:" in msg and "'calibrater'" in msg and "valid fields" in msg
    assert "calibrator" in msg  # the valid names are listed


def test_nested_type_error_points_at_the_line(builds: Path) -> None:
    _replace(builds / "rtn.yaml", "  overall_sigma: 0.13", "  overall_sigma: lots")
    with pytest.raises(ReleaseError, match=r"rtn\.yaml:33: field 'gate\.overall_sigma'"):
        load_build("rtn")


def test_yaml_syntax_error_names_line(builds: Path) -> None:
    _replace(builds / "release.yaml", "org: np-cr", "org: [np-cr")
    with pytest.raises(ReleaseError, match=r"release\.yaml:\d+: YAML syntax error"):
        load_release()


def test_missing_field(builds: Path) -> None:
    _replace(builds / "sq_auto.yaml", "repo: Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant\n", "")
    with pytest.raises(ReleaseError, match=r"sq_auto\.yaml:1: field 'repo': required field is missing"):
        load_build("sq_auto")


def test_unknown_recipe_lists_valid_ones(builds: Path) -> None:
    _replace(builds / "rtn.yaml", "recipe: rtn", "recipe: quarot")
    with pytest.raises(ReleaseError, match=r"rtn\.yaml:6: field 'recipe.0': Input should be 'rtn', 'smoothquant', "):
        load_build("rtn")


def test_unknown_build_lists_available() -> None:
    with pytest.raises(ReleaseError, match=r"unknown build 'nope'.*available builds: autoround, .*, rtn, rtn_hist, "
                                           r".*sq_auto"):
        load_build("nope", ROOT / "builds")


def test_cli_config_error_is_one_line_exit_2_and_writes_nothing(builds: Path, tiny: Path, tmp_path: Path) -> None:
    _replace(builds / "rtn.yaml", "scheme:", "scheme: [")
    out = tmp_path / "dist"
    result = invoke("build", "rtn", "--source", tiny / "source", "--out", out)
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith("error: ")
    assert "Traceback" not in result.output
    assert not out.exists()


def test_unknown_field_in_an_optional_section_lists_its_fields(builds: Path) -> None:
    _replace(builds / "sq_auto.yaml", "  alpha: auto\n", "  alpha: auto\n  alhpa: 0.5\n")
    with pytest.raises(ReleaseError, match=r"field 'smoothquant\.alhpa': unknown field; valid fields here: alpha, "
                                           r"alpha_step, fold_up_down$"):
        load_build("sq_auto")


def test_duplicate_key_in_a_nested_mapping(builds: Path) -> None:
    original = (builds / "rtn.yaml").read_text()
    _replace(builds / "rtn.yaml", "  overall_sigma: 0.13", "  overall_sigma: 0.13\n  overall_sigma: 0.5")
    with pytest.raises(ReleaseError, match=r"rtn\.yaml:34: duplicate key 'overall_sigma' \(first on line 33\)"):
        load_build("rtn")
    # a merge key ('<<') is no duplicate: an explicit key overrides a merged one, as YAML defines
    (builds / "rtn.yaml").write_text(original.replace("  overall_sigma: 0.13", "  <<: {overall_sigma: 0.5}\n"
                                                      "  overall_sigma: 0.2"))
    assert load_build("rtn").gate.overall_sigma == 0.2


def test_alpha_is_auto_or_a_number_in_0_1(builds: Path) -> None:
    import yaml

    original = (builds / "sq_auto.yaml").read_text()
    for alpha in ("1.5", "-0.1", "yes", "best", "null", "[0.5]"):
        (builds / "sq_auto.yaml").write_text(original.replace("alpha: auto", f"alpha: {alpha}"))
        with pytest.raises(ReleaseError) as err:
            load_build("sq_auto")
        assert str(err.value).endswith("field 'smoothquant.alpha': alpha must be 'auto' or a number in 0..1, got "
                                       f"{yaml.safe_load(alpha)!r}"), err.value
    for alpha, value in (("auto", "auto"), ("0", 0.0), ("1", 1.0), ("0.35", 0.35)):
        (builds / "sq_auto.yaml").write_text(original.replace("alpha: auto", f"alpha: {alpha}"))
        smoothquant = load_build("sq_auto").smoothquant
        assert smoothquant is not None and smoothquant.alpha == value


def test_title_and_description_take_a_text_per_language() -> None:
    sq = load_build("sq_auto", ROOT / "builds")
    assert sq.text("title") == "FP8 + SmoothQuant (alpha searched per layer)"
    assert sq.text("title", "ko") == "FP8 + SmoothQuant (레이어별 α 탐색)"
    assert sq.text("description", "ko").startswith("SmoothQuant는 양자화 전에 활성값의 범위를 가중치로 옮기고")
    gptq = load_build("gptq", ROOT / "builds")
    assert gptq.text("title", "ko") == gptq.text("title") == "FP8 GPTQ"  # one text for every language
    for name in available_builds(ROOT / "builds"):  # every shipped build has a Korean title and description
        build = load_build(name, ROOT / "builds")
        assert build.text("title", "ko") and build.text("description", "ko")


@pytest.mark.parametrize("title", ["{ko: '한국어만'}", "{en: '', ko: '영어가 빈 제목'}", "{en: x, Korean: y}",
                                   "{en: x, ko: 3}", "[FP8, GPTQ]"])
def test_a_per_language_title_needs_en_and_language_codes(builds: Path, title: str) -> None:
    _replace(builds / "gptq.yaml", 'title: "FP8 GPTQ"', f"title: {title}")
    with pytest.raises(ReleaseError) as err:
        load_build("gptq")
    msg = str(err.value)
    assert msg.startswith(f"{builds / 'gptq.yaml'}:2: field 'title': give one text, or a text per language such as "
                          "{en: 'FP8 GPTQ', ko: 'FP8 GPTQ 빌드'}: 'en' is required")
    assert "\n" not in msg and "more)" not in msg  # one line, one error (not one per member of the union)


def test_a_card_language_missing_from_a_per_language_field_is_refused(builds: Path) -> None:
    _replace(builds / "rtn.yaml", '  ko: "FP8 (RTN, NVIDIA와 같은 레시피)"\n', "")
    rtn = load_build("rtn")
    assert rtn.text("title") == "FP8 (RTN, NVIDIA-identical recipe)"
    with pytest.raises(ReleaseError, match=r"rtn\.yaml: field 'title' has no 'ko' text; the ko card would show English "
                                           r"there: add 'ko: \.\.\.' under 'title'$"):
        rtn.text("title", "ko")


def test_a_per_language_title_is_shown_in_its_language(builds: Path) -> None:
    _replace(builds / "gptq.yaml", 'title: "FP8 GPTQ"', "title: {en: FP8 GPTQ, ko: FP8 GPTQ 빌드}")
    gptq = load_build("gptq")
    assert (gptq.text("title"), gptq.text("title", "ko")) == ("FP8 GPTQ", "FP8 GPTQ 빌드")
    assert load_build("awq").text("title", "ko") == load_build("awq").text("title")  # one text for every language
    with pytest.raises(ReleaseError, match=r"gptq\.yaml: field 'title' has no 'de' text; the de card would show "
                                           r"English there: add 'de: \.\.\.' under 'title'$"):
        gptq.text("title", "de")


def test_an_alias_bomb_a_deep_nesting_or_a_huge_file_is_refused_before_it_is_built(builds: Path) -> None:
    """Issue 34: a YAML "billion laughs" (3.9 GB and a crash before), a title nested 5,000 deep, a file of megabytes:
    each a one-line error naming the file, from the parsed nodes, before any value is constructed."""
    original = (builds / "rtn.yaml").read_text()
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, "
        f"*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]\n"
        for i in range(8))
    (builds / "rtn.yaml").write_text(bomb + original)
    with pytest.raises(ReleaseError, match=r"rtn\.yaml: more than 100,000 values once its aliases are expanded"):
        load_build("rtn")
    for depth, says in ((100, r"rtn\.yaml:\d+: nested deeper than 64 levels"),
                        (5000, r"rtn\.yaml(:\d+)?: (YAML syntax error: exceeded maximum nesting depth|"
                               r"nested too deeply)")):
        (builds / "rtn.yaml").write_text(original.replace("title:", f"title: {'[' * depth}{']' * depth}\nx_title:", 1))
        with pytest.raises(ReleaseError, match=says):
            load_build("rtn")
    (builds / "rtn.yaml").write_text(original + "#" * 1_000_001 + "\n")
    with pytest.raises(ReleaseError, match=r"rtn\.yaml: 1,00\d,\d{3} characters; a build file holds at most 1,000,000"):
        load_build("rtn")
    (builds / "rtn.yaml").write_text(original)
    assert load_build("rtn").name == "rtn"


@pytest.mark.parametrize(("file", "old", "new", "field", "why"), [
    # issue 52: values that pydantic would coerce are refused, each naming its field
    ("rtn.yaml", "calibration_calls: 256", "calibration_calls: true", "calibration_calls", "valid integer"),
    ("rtn.yaml", "  overall_sigma: 0.13", "  overall_sigma: .inf", "gate.overall_sigma", "finite number"),
    ("release.yaml", "equivalence_margin: {of_baseline: 0.1}", "equivalence_margin: {sigma: .inf}",
     "equivalence_margin.sigma", "finite number"),
    ("release.yaml", "equivalence_margin: {of_baseline: 0.1}", "equivalence_margin: true", "equivalence_margin",
     "not true or false"),
    ("release.yaml", "equivalence_margin: {of_baseline: 0.1}", "equivalence_margin: compile", "equivalence_margin",
     "'compile' is no longer a margin"),
    ("release.yaml", "  count: 2", "  count: 2.0", "selection.count", "valid integer"),
])
def test_coercible_or_infinite_numbers_are_refused(builds: Path, file: str, old: str, new: str, field: str,
                                                   why: str) -> None:
    _replace(builds / file, old, new)
    with pytest.raises(ReleaseError, match=rf"{file.replace('.', chr(92) + '.')}:\d+: field '{field}'") as err:
        load_build("rtn") if file == "rtn.yaml" else load_release()
    assert why in str(err.value) and "\n" not in str(err.value)
