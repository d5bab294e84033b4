"""Recipes on top of ModelOpt: SmoothQuant (auto and fixed alpha), observers, device arithmetic, bad input."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from release.core.builds import load_build
from release.core.errors import ReleaseError
from release.core.fp8 import weight_codes
from release.inputs.observations import CALIBRATION_LABS, load_observations, split
from release.inputs.source import SourceModel, read_headers
from release.quantize.build import CalibrationData
from release.quantize.export import SMOOTHING_SIDECAR
from release.quantize.recipes import quantize
from tests.conftest import ROOT, edited_source, invoke

INDEX = "diffusion_pytorch_model.safetensors.index.json"
GPU_REFERENCE = ROOT / "tests" / "data" / "gpu_rtn_weights.safetensors"


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def test_smoothquant_keeps_rtn_structure_and_undoes_to_source(recipe_builds: Path, tiny: Path) -> None:
    rtn = recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8"
    sq = recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant"
    strip = {k: v[:2] for k, v in read_headers(rtn / "transformer", INDEX).items()}
    assert strip == {k: v[:2] for k, v in read_headers(sq / "transformer", INDEX).items()}
    source, built = _tensors(tiny / "source/transformer"), _tensors(sq / "transformer")
    scales = load_file(sq / SMOOTHING_SIDECAR)
    norms = [k for k in source if "layernorm" in k]
    assert norms and all(not torch.equal(source[k], built[k]) for k in norms)
    # Undo the smoothing: W_source ~ W_fp8 * scale / s_in (per column) * s_out (per row, up_proj only), within one
    # FP8 step of the smoothed value (3 mantissa bits: 2^-3 relative; 2^-9 of the scale in the subnormal range).
    checked = 0
    for key, value in built.items():
        if value.dtype != torch.float8_e4m3fn:
            continue
        linear = key.removesuffix(".weight")
        layer, tail = ".".join(linear.split(".")[:2]), linear.split(".", 2)[2]
        gen = "_moe_gen" if tail.startswith(("self_attn.add_", "mlp_moe_gen.")) else ""
        s_in = torch.ones(value.shape[1])
        if tail.split(".")[-1] in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj"):
            s_in = scales[f"{layer}.input_layernorm{gen}"]
        elif tail.endswith(("gate_proj", "up_proj")):
            s_in = scales[f"{layer}.post_attention_layernorm{gen}"]
        elif tail.endswith("down_proj"):
            s_in = scales[f"{layer}.{tail.split('.')[0]}.up_proj"]
        s_out = scales[linear] if tail.endswith("up_proj") else torch.ones(value.shape[0])
        scale = built[f"{linear}.weight_quantizer._scale"].float()
        undone = value.float() * scale / s_in[None, :] * s_out[:, None]
        ref = source[key].float()
        tolerance = torch.maximum(ref.abs() * 2**-3, scale * 2**-9 / s_in[None, :] * s_out[:, None])
        assert bool(((undone - ref).abs() <= tolerance).all()), linear
        assert not torch.equal(s_in, torch.ones_like(s_in)) or tail.endswith(("to_out", "to_add_out")), linear
        checked += 1
    assert checked == 28
    prov = json.loads((sq / "provenance.json").read_text())
    table = prov["recipe"]["alpha_table"]
    assert len(table) == 12 and all(0.0 <= row["alpha"] <= 1.0 for row in table)
    assert all(row["error_after"] <= row["error_before"] * 1.05 for row in table)
    assert prov["algorithm_data"]["calls"] == 32 and len(prov["algorithm_data"]["sha256"]) == 64


def test_moving_average_changes_input_scales_only(recipe_builds: Path) -> None:
    rtn = _tensors(recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8/transformer")
    mavg = _tensors(recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvgObserver/transformer")
    assert rtn.keys() == mavg.keys()
    inputs = [k for k in rtn if k.endswith(("input_scale", "input_quantizer._amax"))]
    for key in rtn:
        if key not in inputs:
            assert torch.equal(rtn[key].reshape(-1).view(torch.uint8), mavg[key].reshape(-1).view(torch.uint8)), key
    changed = [k for k in inputs if k.endswith("input_scale") and not torch.equal(rtn[k], mavg[k])]
    assert len(changed) >= 14
    assert all(mavg[k] <= rtn[k] for k in inputs)  # an average of per-call maxima never exceeds the maximum


def test_sq_build_is_byte_identical_when_repeated(recipe_builds: Path, tiny: Path, tmp_path: Path) -> None:
    result = invoke("build", "sq_auto", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path)
    assert result.exit_code == 0, result.output
    first = recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant"
    again = tmp_path / first.name
    compared = 0
    for path in sorted(again.rglob("*")):  # what a build writes (later stages add results and cards to `first`)
        rel = path.relative_to(again).as_posix()
        if path.is_file() and rel != "provenance.json" and not rel.startswith("verification/"):
            assert path.read_bytes() == (first / rel).read_bytes(), rel
            compared += 1
    assert compared >= 15


def test_cpu_build_with_cuda_arithmetic_matches_gpu_export(rtn_build: Path, cuda_rtn_build: tuple[Path, Path]) -> None:
    built = _tensors(cuda_rtn_build[0] / "transformer")
    gpu = load_file(GPU_REFERENCE)
    linears = [k.removesuffix(".weight") for k in gpu if k.endswith(".weight") and not k.startswith("fp32amax.")]
    assert len(linears) == 28
    for name in linears:
        for suffix in ("weight", "weight_quantizer._amax", "weight_quantizer._scale"):
            assert built[f"{name}.{suffix}"].dtype == gpu[f"{name}.{suffix}"].dtype
            mine, theirs = built[f"{name}.{suffix}"].reshape(-1), gpu[f"{name}.{suffix}"].reshape(-1)
            assert torch.equal(mine.view(torch.uint8), theirs.view(torch.uint8)), f"{name}.{suffix}"
    # the serving scales as ModelOpt's export makes them on CUDA (amax x fp32(1/448)), which its FP8 GEMM uses at run
    # time; the CPU build's are the CPU's quotient amax / 448, and some of the two differ
    on_cpu = _tensors(rtn_build / "transformer")
    reciprocal = torch.tensor(1 / 448, dtype=torch.float32)
    quotients_differ = 0
    for name in linears:
        for part in ("weight", "input"):
            amax, scale = built[f"{name}.{part}_quantizer._amax"].float(), built[f"{name}.{part}_scale"]
            assert scale.dtype == torch.float32 and scale.shape == ()
            assert torch.equal(scale, (amax * reciprocal).reshape(())), f"{name}.{part}_scale"
            cpu_amax = on_cpu[f"{name}.{part}_quantizer._amax"].float()
            assert torch.equal(on_cpu[f"{name}.{part}_scale"], (cpu_amax / 448).reshape(())), f"{name}.{part}_scale"
            quotients_differ += int(not torch.equal(amax / 448, amax * reciprocal))
    assert quotients_differ > 0


def test_cuda_emulation_where_cpu_and_cuda_differ(tiny: Path) -> None:
    """With an fp32 amax, CUDA rounds differently; the emulation reproduces the GPU export and the CPU's does not."""
    source, gpu = _tensors(tiny / "source/transformer"), load_file(GPU_REFERENCE)
    cpu_differs = 0
    for key in [k for k in gpu if k.startswith("fp32amax.") and k.endswith(".weight")]:
        name = key.removeprefix("fp32amax.").removesuffix(".weight")
        amax = gpu[f"fp32amax.{name}.weight_quantizer._amax"]
        assert amax.dtype == torch.float32
        codes, scale = weight_codes(source[f"{name}.weight"], amax, "cuda")
        assert torch.equal(codes.view(torch.uint8), gpu[key].view(torch.uint8)), name
        assert torch.equal(scale, gpu[f"fp32amax.{name}.weight_quantizer._scale"])
        cpu_codes, _ = weight_codes(source[f"{name}.weight"], amax, "cpu")
        cpu_differs += int((cpu_codes.view(torch.uint8) != gpu[key].view(torch.uint8)).sum())
    assert cpu_differs > 1000  # about 3% of 147,456 codes


def test_non_finite_weight_names_the_tensor(tiny: Path, tmp_path: Path) -> None:
    def nan_at_3_5(w: torch.Tensor) -> torch.Tensor:
        w[3, 5] = float("nan")
        return w

    bad = edited_source(tiny, tmp_path / "source", "layers.0.mlp.gate_proj.weight", nan_at_3_5)
    result = invoke("build", "rtn", "--source", bad, "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2, result.output
    assert "tensor layers.0.mlp.gate_proj.weight holds NaN or Inf" in result.output
    assert not (tmp_path / "dist").exists()


def test_non_finite_activation_names_layer_and_call(rtn_build: Path, tiny: Path) -> None:
    calibration = split(load_observations(tiny / "observations"), CALIBRATION_LABS)
    folder = next((Path(os.environ["RELEASE_CACHE"]) / "calibration").iterdir())
    data = CalibrationData.load(folder, calibration[:2])
    calls = [dict(c) for c in data.per_observation[0]]
    calls[3] = {**calls[3], "vision_tokens": [torch.full_like(calls[3]["vision_tokens"][0], float("inf"))]}
    with pytest.raises(ReleaseError, match=r"non-finite activation .* at the input of layers\.0\.\S+ in "
                                           r"transformer call 3"):
        quantize(SourceModel(tiny / "source").instantiate("cpu"), load_build("rtn"), calls, [])


@pytest.mark.parametrize("edit, message", [
    (("alpha: auto", "alpha: 1.5"), "field 'smoothquant.alpha"),
    (("algorithm_calls: 32", "algorithm_calls: 0"), "needs algorithm_calls >= 1"),
    (("method: max", "method: minmax"), "Input should be 'max', 'moving_average', 'histogram' or 'range_shrink'"),
    (("recipe: smoothquant", "recipe: quarot"), "Input should be 'rtn', 'smoothquant', 'awq', 'gptq' or 'autoround'"),
    (("recipe: smoothquant", "recipe: [gptq, smoothquant]"), "'smoothquant' must come before 'gptq'"),
    (("recipe: smoothquant", "recipe: [smoothquant, awq]"), "at most one smoothing step"),
    (("recipe: smoothquant", "recipe: [rtn, gptq]"), "'rtn' is the recipe without steps"),
    (("recipe: smoothquant", "recipe: gptq"), "'smoothquant' section given, but 'recipe' has no step"),
])
def test_bad_recipe_parameters(edit: tuple[str, str], message: str, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    builds = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", builds)
    path = builds / "sq_auto.yaml"
    path.write_text(path.read_text().replace(*edit))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    with pytest.raises(ReleaseError, match=message):
        load_build("sq_auto")


def test_too_little_algorithm_data(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    builds = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", builds)
    path = builds / "sq_auto.yaml"
    path.write_text(path.read_text().replace("algorithm_calls: 32", "algorithm_calls: 64"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    result = invoke("build", "sq_auto", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2
    assert "field 'algorithm_calls' asks for 64 calls" in result.output and "only 32" in result.output
    assert not (tmp_path / "dist").exists()


def _gptq_update(axis: int | None, device: str, columns: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """ModelOpt's GPTQ column loop on one random Linear with a max-calibrated FP8 weight quantizer (per tensor or per
    output row), as ModelOpt runs it or through :func:`release.quantize.recipes.gptq.faster_update` (column-wise on the
    CPU, the fused kernel on CUDA; blocks of 48 columns and a last one of 8: masked tiles); and round-to-nearest."""
    from modelopt.torch.quantization.nn import TensorQuantizer
    from modelopt.torch.quantization.utils import calib_utils

    from release.quantize.recipes.gptq import faster_update

    torch.manual_seed(3)
    weight = torch.randn(96, 200, device=device) * torch.logspace(-2, 1, 200, device=device)  # mixed magnitudes
    weight[5] *= 1e-4  # a row of subnormal codes
    x = torch.randn(512, 200, device=device)
    h = x.T @ x / 512
    h_inv = calib_utils.compute_hessian_inverse(h, weight, 0.01)
    quantizer = TensorQuantizer()
    quantizer.num_bits, quantizer.axis = (4, 3), axis
    quantizer.amax = (weight.abs().amax(dim=1, keepdim=True) if axis == 0 else weight.abs().amax()).to(torch.bfloat16)
    w = weight.clone()
    if columns:
        with faster_update():
            calib_utils.gptq_blockwise_update(w, h_inv, 48, quantizer)
    else:
        calib_utils.gptq_blockwise_update(w, h_inv, 48, quantizer)
    return w, quantizer(weight)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (ModelOpt's fake-quant kernel, the fused Triton kernel)"))])
@pytest.mark.parametrize("axis", [None, 0], ids=["per-tensor", "per-channel"])
def test_gptq_faster_update_is_modelopts_update_bit_for_bit(axis: int | None, device: str) -> None:
    from modelopt.torch.quantization.utils import calib_utils

    update, log = calib_utils.gptq_blockwise_update, calib_utils.GPTQHelper._print_mse_error
    (ours, rtn), (theirs, _) = _gptq_update(axis, device, columns=True), _gptq_update(axis, device, columns=False)
    assert calib_utils.gptq_blockwise_update is update  # the context put ModelOpt's functions back
    assert calib_utils.GPTQHelper._print_mse_error is log
    assert (theirs != rtn).float().mean() > 0.1  # GPTQ chose other codes than round-to-nearest for many weights
    assert torch.equal(ours.view(torch.int32), theirs.view(torch.int32))


def test_gptq_columns_answer_any_other_index_from_the_whole_matrix() -> None:
    from release.quantize.recipes.gptq import Columns

    calls: list[tuple[int, ...]] = []

    def quantizer(t: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(t.shape))
        return t.round()

    w = torch.arange(12.0).reshape(3, 4) / 3
    columns = Columns(quantizer, w)
    assert torch.equal(columns[:, 2], w[:, 2].round()) and torch.equal(columns[:, 2], w[:, 2].round())
    assert calls == [(3, 1)]  # one column quantized, once for both reads
    assert torch.equal(columns[1:, :2], w.round()[1:, :2]) and calls[-1] == (3, 4)


def test_gptq_keeps_modelopts_whole_matrix_quantization_for_a_quantizer_that_is_not_elementwise() -> None:
    """A dynamic quantizer (its amax from the matrix it is given) would see another amax in one column alone."""
    from modelopt.torch.quantization.nn import TensorQuantizer
    from modelopt.torch.quantization.utils import calib_utils

    from release.quantize.recipes.gptq import elementwise, faster_update

    torch.manual_seed(4)
    weight = torch.randn(32, 64) * torch.logspace(-2, 1, 64)
    x = torch.randn(256, 64)
    h_inv = calib_utils.compute_hessian_inverse(x.T @ x / 256, weight, 0.01)
    dynamic = TensorQuantizer()
    dynamic.num_bits, dynamic.axis = (4, 3), None
    assert not elementwise(dynamic)
    ours, theirs = weight.clone(), weight.clone()
    with faster_update():
        calib_utils.gptq_blockwise_update(ours, h_inv, 16, dynamic)
    calib_utils.gptq_blockwise_update(theirs, h_inv, 16, dynamic)
    assert torch.equal(ours, theirs)
    dynamic.amax = weight.abs().amax()
    assert elementwise(dynamic)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (ModelOpt's fake-quant extension)"))])
@pytest.mark.parametrize("axis", [None, 0], ids=["per-tensor", "per-channel"])
def test_the_fused_kernels_scales_are_modelopts_fake_quantization(axis: int | None, device: str) -> None:
    """The fused GPTQ kernel quantizes ``x * scale`` and multiplies by ``1 / scale``: with the scales of
    :func:`release.quantize.recipes.gptq.fp8_scales` that is the quantizer's own output, bit for bit (ModelOpt's eager
    arithmetic on the CPU, its extension's on a GPU where it is built; amax in bf16 as ModelOpt keeps it, one amax
    tiny enough to count as zero). The path follows the weight's device, as ModelOpt's does: on an H200, where the
    extension is built, this test once gave a CPU weight the extension's scales and differed in the last bit."""
    from modelopt.torch.quantization.nn import TensorQuantizer

    from release.quantize.recipes.gptq import fp8_scales, fused

    torch.manual_seed(5)
    weight = (torch.randn(64, 96) * torch.logspace(-3, 2, 96)).to(device)
    weight[7] = 1e-9  # its own amax is below 2^-24: ModelOpt takes 1
    quantizer = TensorQuantizer()
    quantizer.num_bits, quantizer.axis = (4, 3), axis
    quantizer.amax = (weight.abs().amax(dim=1, keepdim=True) if axis == 0 else weight.abs().amax()).bfloat16()
    scale, inv = fp8_scales(quantizer, weight)
    ours = (weight * scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn).float() * inv
    assert torch.equal(ours.view(torch.int32), quantizer(weight).view(torch.int32))
    if device == "cpu":
        assert not fused(quantizer, weight)  # a CPU weight: the column-wise loop


def test_gptq_skips_modelopts_printed_error_only_for_the_duration() -> None:
    """ModelOpt's per-Linear log multiplies the weights by the Hessian twice to print a figure the build silences."""
    from modelopt.torch.quantization.utils import calib_utils

    from release.quantize.recipes.gptq import faster_update

    with faster_update():
        assert calib_utils.GPTQHelper._print_mse_error(object(), None) is None
    with pytest.raises(AttributeError):  # ModelOpt's own reads the module's weight
        calib_utils.GPTQHelper._print_mse_error(object(), None)


def test_gptq_hessians_stay_on_the_gpu_while_there_is_room_and_go_to_the_cpu_under_a_cap() -> None:
    """ModelOpt moves a Hessian to the CPU once 65% of the GPU is used, whatever is free, and reads the GPU's own free
    memory, which a cap does not lower: the tool decides by the headroom left, and under a cap sends them all to the
    CPU; a CPU build's Hessians stay on the CPU (ModelOpt's rule asked no GPU), and ModelOpt's rule is back after."""
    from modelopt.torch.quantization.utils import calib_utils

    from release.quantize.recipes.gptq import HESSIAN_HEADROOM, faster_update, hessian_on_cpu

    assert not hessian_on_cpu(HESSIAN_HEADROOM + 2**30, capped=False)
    assert hessian_on_cpu(HESSIAN_HEADROOM - 1, capped=False)
    assert hessian_on_cpu(100 * 2**30, capped=True)
    rule = calib_utils.get_used_gpu_mem_fraction
    with faster_update():
        assert calib_utils.get_used_gpu_mem_fraction is not rule
        assert calib_utils.get_used_gpu_mem_fraction(torch.device("cpu")) == 0.0
    assert calib_utils.get_used_gpu_mem_fraction is rule


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gptq_hessians_sum_the_same_on_the_gpu_and_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where a Hessian lives changes only where its running sum is kept (ModelOpt's ``update_hessian``: the product
    on the input's device, the scaling and the sum on the Hessian's): the same bits either way; under a cap a CUDA
    weight's Hessian is made on the CPU."""
    from modelopt.torch.quantization.utils import calib_utils

    from release.core import memory
    from release.quantize.recipes.gptq import faster_update

    torch.manual_seed(6)
    inputs = [torch.randn(3, 77, 256, device="cuda") * 10 ** torch.randn(1, device="cuda") for _ in range(9)]
    sums = []
    for device in ("cuda", "cpu"):
        hessian, n = torch.zeros(256, 256, device=device), 0
        for x in inputs:
            hessian, n = calib_utils.update_hessian(x, hessian, n)
        sums.append(hessian.cpu())
    assert torch.equal(sums[0].view(torch.int32), sums[1].view(torch.int32))
    linear = torch.nn.Linear(256, 64, device="cuda")
    with faster_update():
        assert calib_utils.GPTQHelper(linear, "x", offload_to_cpu=True).hessian.is_cuda
        monkeypatch.setattr(memory, "_CAP", [22 * 2**30])
        assert not calib_utils.GPTQHelper(linear, "x", offload_to_cpu=True).hessian.is_cuda


def test_a_weight_steps_start_is_the_smoothed_models_weight_bit_for_bit(tiny: Path) -> None:
    """A smoothed GPTQ build's reconstruction error starts from the smoothed weights; they are folded from the
    source's tensors when read instead of copied from the model before GPTQ changes it: every quantized Linear's equals
    the model's after the folds, an ``up_proj`` folded twice (its norm's group, then as ``down_proj``'s anchor)."""
    from release.quantize.recipes import _Start
    from release.quantize.recipes.base import Quantized, module_weight, quantized_linears_of
    from release.quantize.recipes.smoothing import _fold, smoothing_groups

    source = SourceModel(tiny / "source")
    before = {k: v.clone() for k, v in source.state.items()}
    model = source.instantiate("cpu")
    names = quantized_linears_of(model, load_build("sq_auto_gptq"))
    groups = smoothing_groups(1 + max(int(n.split(".")[1]) for n in names), set(names), True)
    result, generator = Quantized(model), torch.Generator().manual_seed(0)
    with torch.no_grad():
        for g in groups:
            s = torch.rand(module_weight(model, g.anchor).shape[0], generator=generator) + 0.5
            _fold(model, g, s)
            result.alpha_table.append({"group": g.anchor, "linears": list(g.linears)})
            result.smoothing_scales[g.anchor] = s
    twice = {n for g in groups for n in g.linears} & {g.anchor for g in groups}
    assert twice and all(n.endswith("up_proj") for n in twice)
    start = _Start(source.state, names, result, "cpu")
    assert list(start) == names
    changed = 0
    for name in names:
        assert torch.equal(start[name].view(torch.int16), module_weight(model, name).view(torch.int16)), name
        changed += not torch.equal(start[name], before[f"{name}.weight"])
    assert changed == len({n for g in groups for n in g.linears} | twice)
    assert all(torch.equal(v, before[k]) for k, v in source.state.items())  # the source itself is left as it was


def test_too_few_calibration_calls_are_refused_before_the_capture(tiny: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """32 observations give 32 x 4 steps x 2 guidance passes = 256 calls: 512 are refused before any rollout, in a
    cache of its own that stays without a capture."""
    builds = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", builds)
    path = builds / "rtn.yaml"
    path.write_text(path.read_text().replace("calibration_calls: 256", "calibration_calls: 512"))
    monkeypatch.setenv("RELEASE_BUILDS", str(builds))
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2, result.output
    assert f"{builds / 'rtn.yaml'}: field 'calibration_calls' asks for 512 calls, the 32 calibration observations " \
           "give 256" in result.output.replace("\n", "")
    assert not (tmp_path / "cache" / "calibration").exists() and not (tmp_path / "dist").exists()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_sampled_rows_hold_only_themselves(dtype: torch.dtype) -> None:
    """The statistics keep a sample of every call's activation: each sample must own its rows, not keep the whole
    activation alive through a view (at the Nano's size 2.5 GB a call, an 80 GB GPU full in 20 calls)."""
    from release.quantize.recipes.base import sample_rows

    x = torch.randn(1, 420, 96).to(dtype)
    rows = sample_rows(x, 64)
    assert rows.dtype == torch.float32 and rows.shape == (64, 96)
    assert rows.untyped_storage().nbytes() == 64 * 96 * 4
    assert torch.equal(rows, x.reshape(-1, 96).float()[::6][:64])  # the rows the statistics always took
    assert rows.untyped_storage().data_ptr() != x.untyped_storage().data_ptr()


def test_gptq_hessians_collected_in_groups_give_modelopts_weights_bit_for_bit(
        rtn_build: Path, tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GPTQ's Hessians a group of Linears at a time (the last group first, each pass ending after its group) update
    the weights exactly as ModelOpt's one pass over all of them: every tensor of the model bit for bit."""
    from release.quantize.recipes import gptq

    calibration = split(load_observations(tiny / "observations"), CALIBRATION_LABS)
    folder = next((Path(os.environ["RELEASE_CACHE"]) / "calibration").iterdir())
    data = CalibrationData.load(folder, calibration[:3])
    assert data is not None
    calls = [dict(c) for per in data.per_observation for c in per][:6]
    algorithm_calls = [dict(per[i]) for i, per in enumerate(data.per_observation)]
    build = load_build("gptq")
    parts: list[list[str]] = []

    def recorded(*args: object) -> list[list[str]]:
        parts.extend(made := split_into(*args))  # type: ignore[arg-type]
        return made

    split_into = gptq.groups
    monkeypatch.setattr(gptq, "groups", recorded)
    states = []
    for budget in (1, 2**62):  # every cut the call order allows; one group: ModelOpt's gptq itself
        monkeypatch.setattr(gptq, "HOST_GROUP", budget)
        model = SourceModel(tiny / "source").instantiate("cpu")
        quantize(model, build, calls, algorithm_calls)
        states.append({k: v.clone() for k, v in model.state_dict().items()})
    assert len(parts) >= 8 and sum(map(len, parts)) == 28  # the tiny model's 28 Linears, in groups
    grouped, theirs = states
    assert grouped.keys() == theirs.keys()
    changed = 0
    for key, value in theirs.items():
        assert torch.equal(grouped[key].reshape(-1).view(torch.uint8), value.reshape(-1).view(torch.uint8)), key
        changed += key.endswith(".weight") and "layers." in key
    assert changed >= 28


def test_gptq_groups_cut_only_where_every_linear_before_has_run() -> None:
    from release.quantize.recipes.gptq import groups

    order = ["a", "b", "c", "a", "d", "e", "f", "e"]  # a runs again after c; e after f
    sizes = dict.fromkeys("abcdefg", 1)
    assert groups(order, list("abcdefg"), sizes, 1) == [["a", "b", "c"], ["d"], ["e", "f", "g"]]
    assert groups(order, list("abcdefg"), sizes, 4) == [["a", "b", "c", "d"], ["e", "f", "g"]]
