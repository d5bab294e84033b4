"""The seed's campaign: all 22 builds of the sweep (GPTQ, AWQ, the seed's AutoRound, the per-channel family), the
tuned AutoRound, verification of recipes that make their own codes, and the replay of a build's own codes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from release.core.builds import load_build, load_release
from release.core.errors import ReleaseError
from release.core.fp8 import dequantize, rowwise_forward
from tests.conftest import ROOT, invoke

REPO = {name: load_build(name, ROOT / "builds").repo for name in load_release(ROOT / "builds").sweep}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted((folder / "transformer").glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def _provenance(folder: Path) -> dict[str, Any]:
    return dict(json.loads((folder / "provenance.json").read_text()))


def _codes_differ(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> int:
    fp8 = [k for k, v in a.items() if v.dtype == torch.float8_e4m3fn]
    assert fp8 and all(b[k].dtype == torch.float8_e4m3fn for k in fp8)
    return sum(int((a[k].view(torch.uint8) != b[k].view(torch.uint8)).sum()) for k in fp8)


def test_all_builds_the_sweep_and_every_build_verifies(campaign: Path) -> None:
    sweep = load_release(ROOT / "builds").sweep
    assert len(sweep) == 22 and len(set(sweep)) == 22
    for name in sweep:
        report = json.loads((campaign / REPO[name] / "verification" / "report.json").read_text())
        assert report["status"] == "passed", (name, [c for c in report["checks"] if c["status"] != "passed"])
        loadable = next(c for c in report["checks"] if c["name"] == "loadable")
        assert loadable["status"] == "passed" and "finite actions [32, 8]" in loadable["summary"]
    # the build folders, and where their source and observations are (release.inputs.source.remember_inputs)
    assert sorted(p.name for p in campaign.iterdir()) == sorted([*REPO.values(), ".release-inputs.json"])
    # one calibration set: every build of the sweep records the same calibration data
    digests = {_provenance(campaign / REPO[n])["calibration"]["sha256"] for n in sweep}
    assert len(digests) == 1


def test_gptq_reconstructs_better_than_rtn_with_rtns_scales(campaign: Path) -> None:
    """GPTQ's error on calibration data is below round-to-nearest's for every Linear; its weight amax (and, from the
    same first pass on the same data, its input amax) equal RTN's; about a third of its codes differ."""
    gptq, rtn = _tensors(campaign / REPO["gptq"]), _tensors(campaign / REPO["rtn"])
    for key in (k for k in rtn if k.endswith(("weight_quantizer._amax", "input_quantizer._amax"))):
        assert torch.equal(gptq[key], rtn[key]), key
    assert 0.1 < _codes_differ(gptq, rtn) / sum(v.numel() for v in rtn.values() if v.dtype == torch.float8_e4m3fn)
    recipe = _provenance(campaign / REPO["gptq"])["recipe"]
    assert recipe["changes_weights"] and recipe["max_weight_error"] == 0.25
    rows = recipe["reconstruction"]
    assert len(rows) == 28 and all(r["error"] < r["rtn_error"] for r in rows)
    assert sum(r["error"] for r in rows) < 0.5 * sum(r["rtn_error"] for r in rows)
    values = next(c for c in json.loads((campaign / REPO["gptq"] / "verification/report.json").read_text())["checks"]
                  if c["name"] == "values")
    assert values["details"]["own_codes"] and values["details"]["worst_weight_error"] < 0.25
    assert "reconstruction error on calibration data" in values["summary"]


def test_seed_autoround_keeps_the_codes_and_changes_the_calibration(campaign: Path) -> None:
    """The seed's AutoRound rows: FP8 codes byte-equal to RTN's and SQ auto's, only input scales differ (the
    layer-by-layer calibration: the first decoder layer sees the same inputs, the second does not)."""
    for build, twin in (("autoround", "rtn"), ("sq_auto_autoround", "sq_auto")):
        ours, theirs = _tensors(campaign / REPO[build]), _tensors(campaign / REPO[twin])
        assert _codes_differ(ours, theirs) == 0, build
        inputs = [k for k in ours if k.endswith("input_quantizer._amax")]
        changed = [k for k in inputs if not torch.equal(ours[k], theirs[k])]
        assert changed and all(k.startswith("layers.1.") for k in changed), changed
        for key in ours:
            if key not in inputs and not key.endswith("input_scale"):
                assert torch.equal(ours[key].reshape(-1).view(torch.uint8),
                                   theirs[key].reshape(-1).view(torch.uint8)), key
        prov, twin_prov = _provenance(campaign / REPO[build]), _provenance(campaign / REPO[twin])
        assert prov["fp8"]["codes_sha256"] == twin_prov["fp8"]["codes_sha256"]
        assert prov["recipe"]["layerwise_calibration"] and not prov["recipe"]["changes_weights"]


def test_per_channel_scales_and_codes(campaign: Path, tiny: Path) -> None:
    """(out, 1) weight scales, no static input scales, codes = w / (rowmax / 448); the config names the scheme."""
    built = _tensors(campaign / REPO["pc_rtn"])
    source: dict[str, torch.Tensor] = {}
    for shard in sorted((tiny / "source/transformer").glob("*.safetensors")):
        source.update(load_file(shard))
    fp8 = [k for k, v in built.items() if v.dtype == torch.float8_e4m3fn]
    assert len(fp8) == 28
    for key in fp8:
        linear = key.removesuffix(".weight")
        out = built[key].shape[0]
        for suffix in ("weight_scale", "weight_quantizer._amax", "weight_quantizer._scale"):
            assert built[f"{linear}.{suffix}"].shape == (out, 1), (linear, suffix)
        assert f"{linear}.input_scale" not in built and f"{linear}.input_quantizer._amax" not in built
        w = source[key]
        rowmax = w.abs().amax(dim=1, keepdim=True)
        expected = (w / (rowmax / 448)).to(torch.float8_e4m3fn)
        assert torch.equal(expected.view(torch.uint8), built[key].view(torch.uint8)), key
    qc = json.loads((campaign / REPO["pc_rtn"] / "transformer/config.json").read_text())["quantization_config"]
    assert qc["quant_algo"] == "FP8_PER_CHANNEL_PER_TOKEN"
    assert qc["config_groups"]["group_0"]["weights"]["strategy"] == "channel"
    assert not load_build("pc_rtn").deliverable


def test_per_channel_verification_names_the_scheme(campaign: Path) -> None:
    report = json.loads((campaign / REPO["pc_gptq"] / "verification/report.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert "per-channel scheme" in checks["quantization_config"]["summary"]
    assert "set by the per-channel scheme" in checks["modelopt_state"]["summary"]
    assert checks["modelopt_state"]["details"]["counts"]["modelopt_state.pth"]["differ"] == 0
    assert "row-wise FP8 kernel" in checks["loadable"]["summary"]
    assert checks["values"]["details"]["own_codes"]


def test_awq_exports_no_key_that_rtn_lacks(campaign: Path) -> None:
    awq, rtn = _tensors(campaign / REPO["awq"]), _tensors(campaign / REPO["rtn"])
    assert awq.keys() == rtn.keys()
    assert all(awq[k].shape == rtn[k].shape and awq[k].dtype == rtn[k].dtype for k in rtn)
    assert not [k for k in awq if "pre_quant_scale" in k]
    folded = [k for k in awq if "layernorm" in k and not torch.equal(awq[k], rtn[k])]
    assert folded, "AWQ folds its scales into the norms"
    table = _provenance(campaign / REPO["awq"])["recipe"]["alpha_table"]
    assert len(table) == 12 and {row["alpha"] for row in table} <= {i / 20 for i in range(20)}
    assert (campaign / REPO["awq"] / "smoothing_scales.safetensors").is_file()


def test_build_files_travel_with_the_checkpoint(campaign: Path) -> None:
    folder = campaign / REPO["sq_auto_gptq"]
    assert (folder / "builds/sq_auto_gptq.yaml").read_bytes() == (ROOT / "builds/sq_auto_gptq.yaml").read_bytes()
    assert (folder / "builds/release.yaml").read_bytes() == (ROOT / "builds/release.yaml").read_bytes()
    manifest = json.loads((folder / "verification/report.json").read_text())["manifest"]
    assert "builds/sq_auto_gptq.yaml" in manifest


def test_fakequant_replays_the_builds_own_codes(campaign: Path, tiny: Path) -> None:
    """A GPTQ build's fake-quant model replays its own dequantized codes, not a re-rounding of the source: the
    weight it holds is ModelOpt's fake quantization of them, done once (folded), which falls onto its own codes."""
    from release.quantize.load import fakequant_transformer
    from release.quantize.recipes import quantized_linears

    folder = campaign / REPO["gptq"]
    built = _tensors(folder)
    model = fakequant_transformer(tiny / "source", folder, load_build("gptq"))
    assert quantized_linears(model) == []  # every weight quantizer folded into its weight, then disabled
    names = sorted(k.removesuffix(".weight") for k, v in built.items() if v.dtype == torch.float8_e4m3fn)
    assert len(names) == 28
    for name in names:
        module: Any = model.get_submodule(name)
        codes, scale = built[f"{name}.weight"], built[f"{name}.weight_quantizer._scale"]
        own = dequantize(codes, scale).to(torch.bfloat16)
        quantizer = module.weight_quantizer
        assert not quantizer.is_enabled, name  # folded: the forward uses the held weight as it is
        quantizer.enable()
        replayed = quantizer(own.float()).to(own.dtype)  # ModelOpt's fake quantization of the build's own codes
        quantizer.disable()
        assert torch.equal(module.weight.detach(), replayed), name
        recoded = (replayed.float() / (quantizer.amax.float() / 448)).to(torch.float8_e4m3fn)
        assert torch.equal(recoded.view(torch.uint8), codes.view(torch.uint8)), name  # onto its own codes again


def test_rowwise_emulation_is_the_per_token_arithmetic() -> None:
    """The per-channel deployed kernel's CPU emulation equals its definition where the arithmetic is exact: inputs
    whose per-token quotients round back to small integer codes, K of one 32-product step (exact sums); a per-tensor
    input scale would give other codes for the rows of small scale."""
    torch.manual_seed(0)
    out_features, k, tokens = 8, 32, 5
    codes = torch.randint(-4, 5, (out_features, k)).float().to(torch.float8_e4m3fn)
    scale_w = torch.rand(out_features, 1) + 0.5

    class Linear(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(codes, requires_grad=False)
            self.bias = None
            self.weight_quantizer = type("Q", (), {"amax": scale_w * 448})()

    x_codes = torch.randint(-6, 7, (tokens, k)).float()
    x_codes[:, 0] = 448  # each row's amax is 448 codes: the per-token scale is its row scale exactly
    row_scale = torch.tensor([[0.3], [1.7], [2.9], [0.11], [5.3]])
    x = (x_codes * row_scale).to(torch.bfloat16)
    out = rowwise_forward(Linear(), x, emulate=True)
    reciprocal = torch.tensor(1 / 448, dtype=torch.float32)
    scale_a = x.float().abs().amax(dim=-1, keepdim=True) * reciprocal  # per token: its amax / 448 in fp32
    scale_b = (scale_w * 448).reshape(1, -1) * reciprocal  # per output channel: amax_w / 448
    # the kernel's epilogue order, measured on an H200: (acc * weight scale) * input scale; sums below 2^12: exact
    expected = ((x_codes @ codes.float().T) * scale_b * scale_a).to(torch.bfloat16)
    assert torch.equal(out, expected)
    one_scale = x.float().abs().max() * reciprocal  # a per-tensor input scale rounds the small rows away
    per_tensor = (x.float() / one_scale).to(torch.float8_e4m3fn).float() @ codes.float().T * one_scale * scale_b
    assert not torch.equal(out, per_tensor.to(torch.bfloat16))


@pytest.mark.gpu
def test_rowwise_kernel_equals_the_emulation_on_a_gpu() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA (the row-wise torch._scaled_mm)")
    torch.manual_seed(0)
    module = torch.nn.Linear(256, 128, bias=True).cuda().to(torch.bfloat16)
    amax = module.weight.detach().float().abs().amax(dim=1, keepdim=True)
    module.weight.data = (module.weight.detach().float() / (amax / 448)).to(torch.float8_e4m3fn)  # type: ignore[assignment]
    module.weight_quantizer = type("Q", (), {"amax": amax})()  # type: ignore[assignment]
    x = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    assert torch.equal(rowwise_forward(module, x, emulate=False), rowwise_forward(module, x, emulate=True))


def _variant(builds: Path, base: str, name: str, edits: list[tuple[str, str]]) -> None:
    text = (builds / f"{base}.yaml").read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    text = text.replace(f"name: {base}\n", f"name: {name}\n").replace(
        f"repo: {load_build(base, ROOT / 'builds').repo}\n", f"repo: Variant-{name}\n")
    (builds / f"{name}.yaml").write_text(text)


def test_observers_record_one_of_gptqs_two_passes(campaign: Path, builds: Path, tiny: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """GPTQ runs the forward loop twice (scales, then Hessians); a moving-average observer beside it records the
    first pass only, so its input scales equal the plain moving-average build's (two passes would move the EMA).
    ModelOpt's column loop runs with the column-wise quantizer on the CPU
    (release.quantize.recipes.gptq.faster_update)."""
    from release.quantize.recipes.gptq import Columns

    columns: list[Any] = []
    read = Columns.__getitem__
    monkeypatch.setattr(Columns, "__getitem__", lambda self, index: columns.append(index) or read(self, index))
    _variant(builds, "gptq", "gptq_mavg", [("method: max", "method: moving_average\n  momentum: 0.01")])
    result = invoke("build", "gptq_mavg", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    ours, mavg = _tensors(tmp_path / "dist/Variant-gptq_mavg"), _tensors(campaign / REPO["rtn_mavg"])
    inputs = [k for k in mavg if k.endswith("input_quantizer._amax")]
    assert all(torch.equal(ours[k], mavg[k]) for k in inputs)
    assert columns and all(i[0] == slice(None) and isinstance(i[1], int) for i in columns)  # one column each read


def test_layerwise_gptq_runs_on_the_registered_decoder_layers(campaign: Path, builds: Path, tiny: Path,
                                                             tmp_path: Path) -> None:
    """ModelOpt's layer-by-layer GPTQ on a diffusers model (it finds the Cosmos3 decoder layers only once they are
    registered): it verifies, reconstructs better than RTN, and differs from the one-pass GPTQ."""
    _variant(builds, "gptq", "gptq_layerwise", [("layerwise: false", "layerwise: true")])
    result = invoke("build", "gptq_layerwise", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "dist/Variant-gptq_layerwise"
    rows = _provenance(folder)["recipe"]["reconstruction"]
    assert sum(r["error"] for r in rows) < sum(r["rtn_error"] for r in rows)
    assert _codes_differ(_tensors(folder), _tensors(campaign / REPO["gptq"])) > 0


def test_tuned_autoround_moves_the_codes(campaign: Path, builds: Path, tiny: Path, tmp_path: Path) -> None:
    """auto-round's FP8 tuning (the 'autoround' extra), shortened to 10 steps: the codes differ from RTN's, the weight
    scales shrink, the build verifies against its stated bound."""
    pytest.importorskip("auto_round", reason="the 'autoround' extra is not installed")
    path = builds / "autoround_tuned.yaml"
    path.write_text(path.read_text().replace("iters: 200", "iters: 10"))
    result = invoke("build", "autoround_tuned", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    folder = tmp_path / "dist" / load_build("autoround_tuned").repo
    tuned, rtn = _tensors(folder), _tensors(campaign / REPO["rtn"])
    assert _codes_differ(tuned, rtn) > 1000
    amax = [k for k in rtn if k.endswith("weight_quantizer._amax")]
    assert sum(bool(tuned[k] < rtn[k]) for k in amax) > len(amax) // 2  # the tuned clipping shrinks most scales
    recipe = _provenance(folder)["recipe"]
    assert recipe["changes_weights"] and recipe["max_weight_error"] == 0.15
    result = invoke("verify", "autoround_tuned", "--dist", tmp_path / "dist", "--reference", campaign / REPO["rtn"],
                    "--source", tiny / "source", "--observations", tiny / "observations")
    assert result.exit_code == 0, result.output
    assert json.loads((folder / "verification/report.json").read_text())["status"] == "passed"


def test_tuned_autoround_without_the_extra_names_it(builds: Path, tiny: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "auto_round", None)  # import auto_round raises ImportError
    result = invoke("build", "autoround_tuned", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2, result.output
    assert "needs the auto-round library, the 'autoround' extra: pip install 'release[autoround]'" in result.output
    assert not (tmp_path / "dist").exists()


def test_weight_changing_recipe_outside_its_bound_fails_verification(campaign: Path, tmp_path: Path,
                                                                     tiny: Path) -> None:
    """A GPTQ build's codes are its own, so verification cannot recompute them; it holds the dequantized weight to
    the recipe's bound instead: codes pushed far from the source fail by tensor."""
    from safetensors.torch import save_file

    dist = tmp_path / "dist"
    for name in ("rtn", "gptq"):
        shutil.copytree(campaign / REPO[name], dist / REPO[name])
    index = json.loads((dist / REPO["gptq"] / "transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    key = "layers.0.mlp.up_proj.weight"
    shard = dist / REPO["gptq"] / "transformer" / index["weight_map"][key]
    tensors = load_file(shard)
    tensors[key] = (-tensors[key].float()).to(torch.float8_e4m3fn)  # every code's sign flipped
    save_file(tensors, str(shard), metadata={"format": "pt"})
    result = invoke("verify", "gptq", "--dist", dist, "--source", tiny / "source", "--observations",
                    tiny / "observations")
    assert result.exit_code == 1
    values = next(c for c in json.loads((dist / REPO["gptq"] / "verification/report.json").read_text())["checks"]
                  if c["name"] == "values")
    assert values["status"] == "failed"
    assert f"tensor {key}: dequantizes" in values["summary"] and "more than the recipe's 0.25" in values["summary"]


@pytest.mark.parametrize(("build", "edits", "message"), [
    ("autoround", [("method: max", "method: moving_average")], "cannot follow layer-by-layer calibration"),
    ("pc_rtn", [("method: max", "method: histogram")], "quantizes activations per token at run time"),
    ("pc_rtn", [("deliverable: false", "deliverable: false\ndelivered: true")], "field 'delivered' is gone"),
    ("gptq", [("recipe: [gptq]", "recipe: [gptq, autoround]")], "at most one smoothing step"),
    ("awq", [("recipe: [awq]", "recipe: [awq, gptq]"), ("algorithm_calls: 32", "algorithm_calls: 0")],
     "needs algorithm_calls >= 1"),
    ("gptq", [("  layerwise: false", "  layerwise: maybe")], "field 'gptq.layerwise'"),
])
def test_recipe_combinations_are_validated(builds: Path, build: str, edits: list[tuple[str, str]],
                                           message: str) -> None:
    path = builds / f"{build}.yaml"
    text = path.read_text()
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new)
    path.write_text(text)
    with pytest.raises(ReleaseError, match=message):
        load_build(build)


def test_push_refuses_an_undeliverable_build(campaign: Path, tmp_path: Path) -> None:
    result = invoke("push", "pc_rtn", "--dist", campaign, "--target", tmp_path / "hub", "--dry-run")
    assert result.exit_code == 1
    assert "marks 'pc_rtn' 'deliverable: false'" in result.output and not (tmp_path / "hub").exists()


def test_the_card_says_which_builds_share_their_codes(campaign: Path) -> None:
    """The seed's AutoRound note, from the builds' provenance: byte-equal codes, how many input scales differ; and the
    per-channel AutoRound, which quantizes exactly as per-channel RTN (no static input scales at all)."""
    from release.publish.card.conclusions import same_codes_notes
    from release.publish.card.context import sweep_provenances
    from release.publish.card.i18n import Formatter, translations

    provenances = sweep_provenances(campaign)
    assert set(provenances) == set(REPO)
    titles = {n: load_build(n).text("title") for n in REPO}
    rows = [{"build": n, "title": titles[n]} for n in ("rtn", "autoround", "sq_auto", "sq_auto_autoround", "gptq")]
    notes = same_codes_notes(rows, provenances, Formatter("en"), translations("en").gettext)

    def differing(a: str, b: str) -> int:
        """Input scales of two builds that differ. How many depends on the CPU's bf16 arithmetic: 5 and 5 of 28
        where this test was written, 5 and 8 on an AVX2-only AMD EPYC; never none, never all (the layer-by-layer
        calibration moves some)."""
        ours, theirs = (provenances[n]["fp8"]["input_amax"] for n in (a, b))
        count = sum(ours[k] != theirs[k] for k in ours)
        assert len(ours) == 28 and 0 < count < 28
        return count

    assert notes == [
        f"The FP8 codes of {titles['autoround']} are byte-equal to those of {titles['rtn']} (all 147,456 codes); the "
        f"two differ only in their input scales ({differing('autoround', 'rtn')} of 28 differ), so the gap between "
        "their rows is the activation calibration's.",
        f"The FP8 codes of {titles['sq_auto_autoround']} are byte-equal to those of {titles['sq_auto']} (all 147,456 "
        f"codes); the two differ only in their input scales ({differing('sq_auto_autoround', 'sq_auto')} of 28 "
        "differ), so the gap between their rows is the activation calibration's."]
    ko = {n: load_build(n).text("title", "ko") for n in ("pc_rtn", "pc_autoround", "pc_gptq")}
    pc = [{"build": n, "title": title} for n, title in ko.items()]
    [note] = same_codes_notes(pc, provenances, Formatter("ko"), translations("ko").gettext)
    assert note.startswith("FP8 채널별 / 토큰별: AutoRound (기존 캠페인 방식: RTN 코드)는 FP8 채널별 가중치, 토큰별 "
                           "활성값: RTN과 똑같이 양자화합니다.")  # 코드는, RTN과: the particles follow the titles


def test_builds_that_observe_the_source_alike_share_one_observer_pass(campaign: Path, tiny: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """In one run, builds that observe the unchanged source on the same calls (RTN, GPTQ, the observer builds and
    their per-channel siblings) take one observer pass, which records every calibrator they use; a smoothed build
    runs its own. The bytes are those of the same builds made in the campaign, where the pass ran in another order."""
    monkeypatch.setenv("RELEASE_PROFILE", str(tmp_path / "profile.json"))
    dist = tmp_path / "dist"
    result = invoke("build", "pc_gptq", "rtn_mavg", "rtn_hist", "pc_rtn", "sq_auto", "--source", tiny / "source",
                    "--observations", tiny / "observations", "--out", dist)
    assert result.exit_code == 0, result.output
    timeline = [e["stage"] for e in json.loads((tmp_path / "profile.json").read_text())["timeline"]
                if e["stage"].startswith("build ") or e["stage"] == "quantize: observer pass"]
    assert timeline == ["quantize: observer pass", "build pc_gptq", "build rtn_mavg", "build rtn_hist", "build pc_rtn",
                        "quantize: observer pass", "build sq_auto"]
    for build in ("pc_gptq", "rtn_mavg", "rtn_hist", "pc_rtn"):
        files = [*sorted((campaign / REPO[build] / "transformer").glob("*.safetensors")),
                 campaign / REPO[build] / "modelopt_state.pth", campaign / REPO[build] / "transformer" / "config.json"]
        for theirs in files:
            ours = dist / theirs.relative_to(campaign)
            assert ours.read_bytes() == theirs.read_bytes(), ours
    mavg, hist = (_provenance(dist / REPO[b])["fp8"]["input_amax"] for b in ("rtn_mavg", "rtn_hist"))
    assert mavg.keys() == hist.keys() and mavg != hist  # each took its own calibrator's values from the one pass


def test_layer_by_layer_max_calibration_by_hooks_is_modelopts(campaign: Path, tiny: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The seed's AutoRound calibrates layer by layer; each layer's input maxima are taken by hooks on a plain replay
    (release.quantize.recipes.observers.observed_layers). Made with ModelOpt's own calibrators instead, every byte is
    the same."""
    import contextlib

    import release.quantize.recipes

    monkeypatch.setattr(release.quantize.recipes, "observed_layers", contextlib.nullcontext)
    result = invoke("build", "sq_auto_autoround", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    theirs = campaign / REPO["sq_auto_autoround"]
    for ours in [*sorted((tmp_path / "dist" / theirs.name / "transformer").glob("*.safetensors")),
                 tmp_path / "dist" / theirs.name / "modelopt_state.pth"]:
        assert ours.read_bytes() == (theirs / ours.relative_to(tmp_path / "dist" / theirs.name)).read_bytes(), ours


def test_layer_by_layer_inputs_are_modelopts_on_a_deeper_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    """Layer by layer, each next layer's inputs are the calibrated layer's outputs on its own inputs
    (release.quantize.recipes.observers._next_layer_inputs), not ModelOpt's forward of every call up to that layer. The
    tiny model has two decoder layers, so only the first layer's outputs are ever needed; on four, the seed's AutoRound
    build is ModelOpt's own byte for byte."""
    import contextlib

    import release.inputs.fixture
    import release.quantize.recipes

    deeper = {**release.inputs.fixture.TINY_TRANSFORMER, "num_hidden_layers": 4}
    monkeypatch.setitem(release.inputs.fixture.SIZES, "tiny", (deeper, release.inputs.fixture.TINY_VAE, "400KB"))
    release.inputs.fixture.write_fixture(tmp_path / "fixture")
    folders = []
    for way in ("hooks", "modelopt"):
        if way == "modelopt":
            monkeypatch.setattr(release.quantize.recipes, "observed_layers", contextlib.nullcontext)
        result = invoke("build", "autoround", "--source", tmp_path / "fixture" / "source", "--observations",
                        tmp_path / "fixture" / "observations", "--out", tmp_path / way)
        assert result.exit_code == 0, result.output
        folders.append(tmp_path / way / REPO["autoround"])
    ours, theirs = folders
    files = [*sorted((theirs / "transformer").glob("*.safetensors")), theirs / "modelopt_state.pth"]
    assert len(files) > 2 and "layers.3.mlp.down_proj.input_quantizer._amax" in _tensors(theirs)
    for file in files:
        assert (ours / file.relative_to(theirs)).read_bytes() == file.read_bytes(), file
