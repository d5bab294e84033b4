"""Honest card statements (issue 46): the deployed path says what the CPU emulation covers and what it does not
reproduce; a build of the random-weight fixture says so and claims no relation to NVIDIA's model; the Scheme table's
dtypes come from the checkpoint; the NormFC text counts the norms smoothing changed; the rank test says when too few
builds can reach p < 0.05; Korean particles after an aside, brackets for nested parentheses; the plot's labels fit."""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from huggingface_hub import ModelCard
from safetensors.torch import save_file

from release.core.builds import load_build
from release.core.conformance import EMULATION, MODELOPT
from release.publish.card.conclusions import _rank_statement
from release.publish.card.deployed import bound, checked_gpus, deployed_how
from release.publish.card.i18n import Formatter, translations
from release.publish.card.labels import PER_CHANNEL
from release.publish.card.particles import outer_brackets, particle
from release.publish.card.sections import scheme_rows
from tests.conftest import ROOT, invoke

CARD_INPUTS = ROOT / "tests" / "data" / "cards"
RTN = "Cosmos3-Nano-Policy-DROID-FP8"
SQ = "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant"
H100 = "NVIDIA H100 80GB HBM3"


@pytest.fixture
def card_dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    shutil.copytree(CARD_INPUTS, dist)
    return dist


@pytest.fixture(scope="module")
def deployed() -> list[dict[str, Any]]:
    """The card data's deployed records: the emulation on the CPU, per-tensor builds."""
    records = json.loads((CARD_INPUTS / "tables" / "tables.json").read_text(encoding="utf-8"))["records"]
    out = [r for r in records if r["path"] == "deployed"]
    assert out and all(r["computed"]["kernel"] == EMULATION and r["computed"]["device"] == "cpu" for r in out)
    return out


def _on(records: list[dict[str, Any]], **computed: Any) -> list[dict[str, Any]]:
    out = copy.deepcopy(records)
    for r in out:
        r["computed"].update(computed)
    return out


def test_deployed_sentence_says_what_the_cpu_emulation_covers(deployed: list[dict[str, Any]]) -> None:
    text = deployed_how(deployed, str)
    assert "The conformance table checks the emulation's FP8 GEMM alone: 20 of the 20 GEMM shapes" in text
    assert "recorded on H200 (torch 2.11.0+cu130, CUDA 13.0)" in text  # the conformance table's machine
    assert "x times fp32(1 / s)" in text and "Triton reciprocal differs from it for some scales" in text
    assert "Attention, norms and the other BF16 layers ran on the CPU" in text
    assert text.endswith("these rows estimate the error of FP8 rather than measure a deployment on a GPU.")
    assert "46" not in text and "504" not in text  # one H100 build's figure (BENCHMARKS.md) is not this card's
    rowwise = [{**r, "scheme": PER_CHANNEL} for r in deployed]
    text = bound(rowwise, str) or ""
    assert "per token by an IEEE division" in text and "fp32(1 / s)" not in text


def test_deployed_rows_on_a_gpu_name_device_and_kernel(deployed: list[dict[str, Any]]) -> None:
    gpu = _on(deployed, device=H100, kernel=MODELOPT, cuda="13.0")
    assert bound(gpu, str) is None
    text = deployed_how(gpu, str)
    assert text == ("the exported build through diffusers, its FP8 Linears run by ModelOpt's FP8 GEMM on H100 80GB "
                    f"HBM3 (torch {deployed[0]['computed']['torch']}, CUDA 13.0)")
    assert checked_gpus(gpu, str) == "H200, H100 80GB HBM3" and checked_gpus(deployed, str) == "H200"


def test_korean_deployed_sentence(deployed: list[dict[str, Any]]) -> None:
    text = deployed_how(deployed, translations("ko").gettext)
    assert "에뮬레이션 (torch 2.13.0+cpu)으로 계산" in text  # the particle agrees with the word before the aside
    assert "FP8의 오차를 추정한 값입니다." in text and "니다;" not in text


def _card(dist: Path, repo: str, lang: str = "en") -> str:
    return (dist / repo / ("README.md" if lang == "en" else f"README.{lang}.md")).read_text(encoding="utf-8")


def test_fixture_card_says_random_weights_and_claims_no_relation(card_dist: Path) -> None:
    result = invoke("card", "rtn", "sq_auto", "--dist", card_dist, "--lang", "en,ko")
    assert result.exit_code == 0, result.output
    card = ModelCard(_card(card_dist, RTN))
    data = card.data.to_dict()
    assert "base_model" not in data and "base_model_relation" not in data  # the Hub would infer one from base_model
    assert card.text.lstrip().startswith("> **A demonstration on random weights:**")
    assert card.text.count("\n") > 10 and card.text.lstrip().split("\n", 1)[0].count(".") == 1  # one line
    revision = json.loads((card_dist / RTN / "provenance.json").read_text())["source"]["revision"]
    assert "a random-weight fixture in the architecture of [nvidia/Cosmos3-Nano-Policy-DROID]" in card.text
    assert f"(content sha256 `{revision}`)" in card.text and f"(revision `{revision}`)" not in card.text
    ko = _card(card_dist, RTN, "ko")
    assert "**무작위 가중치로 만든 시연용 빌드입니다.**" in ko and f"(내용 sha256 `{revision}`)" in ko
    # NormFC and sq_auto: the count is of the norms smoothing changed; a smoothed up_proj is an FP8 weight
    values = next(line for line in _card(card_dist, SQ).splitlines() if line.startswith("| Values |"))
    assert "except 8 norms with folded smoothing" in values and "up_proj" not in values


def test_hub_source_keeps_its_revision_and_relation(card_dist: Path) -> None:
    path = card_dist / RTN / "provenance.json"
    prov = json.loads(path.read_text())
    prov["source"]["origin"] = "hub cache"
    path.write_text(json.dumps(prov))
    assert invoke("card", "rtn", "--dist", card_dist).exit_code == 0
    card = ModelCard(_card(card_dist, RTN))
    data = card.data.to_dict()
    assert data["base_model"] == "nvidia/Cosmos3-Nano-Policy-DROID" and data["base_model_relation"] == "quantized"
    assert "random weights:**" not in card.text and f"(revision `{prov['source']['revision']}`)" in card.text


def test_use_says_which_gpus_were_checked(card_dist: Path) -> None:
    assert invoke("card", "rtn", "--dist", card_dist, "--lang", "en,ko").exit_code == 0
    assert ("- an NVIDIA Hopper GPU (compute capability 9.0): the FP8 GEMM this build runs was checked on H200 only; "
            "GPUs of compute capability 8.9 (Ada) also run FP8 GEMMs but were not checked;") in _card(card_dist, RTN)
    ko = _card(card_dist, RTN, "ko")
    assert "H200에서만 확인했습니다." in ko and not re.search(r"니다;", ko)


def test_kept_modules_take_their_dtypes_from_the_checkpoint(tmp_path: Path) -> None:
    """The build records the stored dtype of each kept module in provenance.json (``kept_dtypes``, from the exported
    safetensors headers), so that a card rendered without the weights, from the manifest, says the same."""
    from release.quantize.export import kept_dtypes

    build = load_build("rtn")
    prov = json.loads((CARD_INPUTS / RTN / "provenance.json").read_text())
    t = translations("en").gettext
    assert scheme_rows(build, prov, t, False)["kept"] == ", ".join(f"`{k}`" for k in build.kept_bf16)
    (tmp_path / "transformer").mkdir()
    tensors = {"time_embedder.linear_1.weight": torch.zeros(2, dtype=torch.float32),
               "layers.0.input_layernorm.weight": torch.zeros(2, dtype=torch.bfloat16),
               "norm.weight": torch.zeros(2, dtype=torch.bfloat16),
               "layers.0.mlp.up_proj.weight": torch.zeros(2, dtype=torch.float8_e4m3fn)}
    tensors |= {f"{k}.weight": torch.zeros(2, dtype=torch.bfloat16) for k in build.kept_bf16
                if k not in ("time_embedder", "vision_encoder", "norms")}
    save_file(tensors, str(tmp_path / "transformer" / "diffusion_pytorch_model.safetensors"))
    prov["kept_dtypes"] = kept_dtypes(build, tmp_path / "transformer")
    assert prov["kept_dtypes"]["time_embedder"] == ["F32"] and prov["kept_dtypes"]["vision_encoder"] == []
    kept = scheme_rows(build, prov, t, False)["kept"]
    assert kept.startswith("BF16: `proj_in`, `proj_out`, ") and "`embed_tokens`, `norms`; F32: `time_embedder`" in kept
    assert kept.endswith("; not in the transformer: `vision_encoder`") and "F8_E4M3" not in kept
    assert "트랜스포머에 없음: `vision_encoder`" in scheme_rows(build, prov, translations("ko").gettext, False)["kept"]


@pytest.mark.parametrize(("other", "expected"), [
    ([1.0, 2.0, 3.0], ": too few builds for a rank test (Spearman rho = 1.00, n = 3, exact permutation p = 0.33; "
                      "with 3 builds even a perfect agreement has p = 0.33)."),
    ([2.0, 1.0, 3.0, 4.0, 5.0], ": too few builds for a rank test short of a perfect agreement (Spearman rho = 0.90, "
                                "n = 5, exact permutation p = 0.083; with 5 builds only rho = +-1 reaches p < 0.05)."),
    ([1.0, 2.0, 3.0, 4.0, 5.0], " rank the 5 builds they share alike (Spearman rho = 1.00, n = 5, exact permutation "
                                "p = 0.017)."),
    ([2.0, 1.0, 3.0, 4.0, 5.0, 6.0], " rank the 6 builds they share alike (Spearman rho = 0.94, n = 6, exact "
                                     "permutation p = 0.017)."),
])
def test_rank_statement_says_when_too_few_builds_can_agree(other: list[float], expected: str) -> None:
    builds = [f"b{i}" for i in range(len(other))]
    fq = {b: {"overall_sigma": float(i + 1)} for i, b in enumerate(builds)}
    on = {b: {"overall_sigma": v} for b, v in zip(builds, other, strict=True)}
    text = _rank_statement(fq, on, "deployed", Formatter("en"), str)
    assert text == f"Fake quant and deployed{expected}"
    ko = _rank_statement(fq, on, "배포", Formatter("ko"), translations("ko").gettext)
    assert ko is not None and ko.startswith("모의 양자화와 배포")


@pytest.mark.parametrize(("word", "marker", "expected"), [
    ("에뮬레이션 (torch 2.13.0+cpu)", "(으)로", "에뮬레이션 (torch 2.13.0+cpu)으로"),  # the "…cpu)로"
    ("FP8 (RTN, NVIDIA와 같은 레시피)", "과(와)", "FP8 (RTN, NVIDIA와 같은 레시피)와"),  # Korean words: read aloud
    ("`rtn` (RTN)", "을(를)", "`rtn` (RTN)을"),  # a gloss in Latin letters is not: after `rtn`
    ("(전달)", "이(가)", "(전달)이"),  # nothing before the aside: read through it
])
def test_particle_after_a_latin_aside_agrees_with_the_word_before(word: str, marker: str, expected: str) -> None:
    assert particle(word, marker) == expected


def test_nested_parentheses_take_brackets_outside() -> None:
    assert outer_brackets("속도(캘리브레이션 랩 (표본 내), `H100`)") == "속도[캘리브레이션 랩 (표본 내), `H100`]"
    assert outer_brackets("`((a) / b)` and (a) (b)") == "`((a) / b)` and (a) (b)"  # code spans, no nesting
    assert outer_brackets("(see [x](https://a/b_(c)))") == "(see [x](https://a/b_(c)))"  # a link's target
    text = translations("ko").gettext("Speed and memory ({where}, `{device}`): {seconds} s vs {bf16_seconds} s per "
                                      "rollout for BF16, peak GPU memory {gib} GiB vs {bf16_gib} GiB.")
    assert "[캘리브레이션 랩 (표본 내), `H100`]" in text.format(
        where="캘리브레이션 랩 (표본 내)", device="H100", seconds=1, bf16_seconds=1, gib=1, bf16_gib=1)


def test_plot_labels_fit_their_panels_and_korean_gate_reads_ihha() -> None:
    from release.publish.card.plot import forest_figure

    tables = json.loads((CARD_INPUTS / "tables" / "tables.json").read_text(encoding="utf-8"))
    for r in tables["records"]:
        if r["build"] == "rtn":
            r["title"] = "FP8 (RTN, NVIDIA-identical recipe, max calibration on 256 calls)"  # a long baseline
    gates = {r["build"]: load_build(r["build"]).gate for r in tables["records"] if r["path"] != "yardstick"}
    for lang in ("en", "ko"):
        fig = forest_figure(tables, load_build("rtn"), lang, gates)
        renderer = fig.canvas.get_renderer()
        left, right = fig.axes[:2]
        boxes = [ax.xaxis.label.get_window_extent(renderer) for ax in (left, right)]
        assert boxes[0].x1 < boxes[1].x0, lang  # the two x labels do not overlap
        assert boxes[1].width <= right.get_window_extent(renderer).width
        legend = [text.get_text() for text in fig.legends[0].get_texts()]
        if lang == "ko":
            assert "게이트: 전체 오차 0.13σ 이하" in legend  # NanumGothic's small "≤" read as "<"
