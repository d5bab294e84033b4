"""``release eval --path served``: the build as NVIDIA's policy server runs it (TorchAO's static FP8 tensor) under
the release's step policy, on the CPU with TorchAO's Hopper GEMM emulated, and the card's served rows."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import yaml

from release.core import fp8
from release.core.builds import load_build, load_release
from release.core.config import StepPolicy
from release.core.errors import ReleaseError
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.quantize.load import deployed_transformer
from release.quantize.recipes import quantized_linears
from release.quantize.served import ServedLinear, served_transformer, torchao_version
from tests.conftest import invoke

pytest.importorskip("torchao", reason="the served path needs the 'served' extra (TorchAO)")


def test_the_step_policy_names_each_step() -> None:
    assert [StepPolicy().mode(i, 4) for i in range(4)] == ["W8A8"] * 4  # the seed's server
    both = StepPolicy(w8a16_first_steps=1, w8a16_last_steps=1)
    assert [both.mode(i, 4) for i in range(4)] == ["W8A16", "W8A8", "W8A8", "W8A16"]
    default = StepPolicy(w8a16_first_steps=3, w8a16_last_steps=3)  # the server's default: every one of 4 steps
    assert [default.mode(i, 4) for i in range(4)] == ["W8A16"] * 4


def test_served_linears_run_the_step_policy(rtn_build: Path, tiny: Path) -> None:
    """Hooks on one served Linear see, call by call, the arithmetic its step asks for: on W8A16 steps the BF16
    matmul of the dequantized weight, on W8A8 steps TorchAO's FP8 GEMM as Hopper computes it, emulated on the CPU
    (which differs from the BF16 matmul); two transformer calls a step (guidance). TorchAO's own quantization of
    each W8A8 input gives the emulation's codes."""
    from torchao.prototype.quantization.float8_static_quant.prototype_float8_tensor import (
        _choose_quant_func_and_quantize_tensor,
    )

    release = load_release()
    policy = StepPolicy(w8a16_first_steps=1, w8a16_last_steps=1)
    model = served_transformer(rtn_build, policy, release.policy.steps)
    pipe = load_pipeline(tiny / "source", release.policy, transformer=model)
    name, linear = next((n, m) for n, m in model.named_modules() if isinstance(m, ServedLinear))
    weight: Any = linear.weight
    assert type(weight).__name__ == "PrototypeFloat8Tensor" and weight.qdata.dtype == torch.float8_e4m3fn
    assert linear.emulate and model.gemm_record.kernel == "torchao-float8-static-emulation"
    scale_a, scale_b = weight.act_quant_scale.reshape(()), weight.scale.reshape(())
    seen: list[tuple[str, bool]] = []

    def hook(module: ServedLinear, args: tuple[torch.Tensor, ...], output: torch.Tensor) -> None:
        x = args[0]
        dense = F.linear(x, weight.qdata.to(torch.bfloat16) * weight.scale.to(torch.bfloat16), module.bias)
        w8a8 = fp8.static_forward(x, weight.qdata, scale_a, scale_b, module.bias)
        assert torch.equal(output, dense if module.w8a16 else w8a8), name
        torchao = _choose_quant_func_and_quantize_tensor(x, weight.act_quant_kwargs,
                                                         act_quant_scale=weight.act_quant_scale)
        codes = (x.float() / scale_a).clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(torch.float8_e4m3fn)
        assert torch.equal(torchao.qdata.view(torch.uint8), codes.view(torch.uint8)), name
        seen.append(("W8A16" if module.w8a16 else "W8A8", torch.equal(dense, w8a8)))

    linear.register_forward_hook(hook)
    observation = next(o for o in load_observations(tiny / "observations") if o.lab in release.heldout_labs)
    schedule = model.step_schedule
    actions = rollout(pipe, observation, release.policy, mixed_precision_format="none", **schedule.pipe_kwargs())
    assert np.isfinite(actions).all()
    assert schedule.ran == ["W8A16", "W8A8", "W8A8", "W8A16"]
    assert [mode for mode, _ in seen] == ["W8A16"] * 2 + ["W8A8"] * 4 + ["W8A16"] * 2
    assert not any(same for mode, same in seen if mode == "W8A8")  # the FP8 GEMM is not the BF16 matmul


def _one_heldout_lab(builds: Path) -> None:
    """The validation split narrowed to one lab (4 observations), for speed."""
    path = builds / "release.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["heldout_labs"] = ["RPL"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_eval_served_records_its_kernel_and_steps_and_the_card_says_so(rtn_build: Path, tiny: Path, builds: Path,
                                                                        tmp_path: Path) -> None:
    from release.publish.card.i18n import translations
    from release.publish.card.labels import where_label
    from release.publish.card.sections import paths_rows, reproduction

    _one_heldout_lab(builds)
    dist = tmp_path / "dist"
    shutil.copytree(rtn_build, dist / rtn_build.name)
    shutil.rmtree(dist / rtn_build.name / "results", ignore_errors=True)  # what other tests evaluated (or imported)
    common = ["--dist", dist, "--source", tiny / "source", "--observations", tiny / "observations"]
    result = invoke("eval", "rtn", "--path", "served", "--split", "validation", "--w8a16-first", "3", *common)
    assert result.exit_code == 0, result.output
    out = dist / rtn_build.name / "results" / "served-validation.npz"
    data = np.load(out)
    computed = json.loads(str(data["computed"]))
    assert computed["kernel"] == "torchao-float8-static-emulation" and computed["torchao"] == torchao_version()
    assert computed["steps"] == ["W8A16", "W8A16", "W8A16", "W8A8"] and computed["device"] == "cpu"
    assert len(data["obs_ids"]) == 4 and {str(x) for x in data["labs"]} == {"RPL"}
    assert not np.array_equal(data["reference"], data["candidate"])
    # the same build on the deployed path: ModelOpt's arithmetic emulated, a different computation on the same seeds
    result = invoke("eval", "rtn", "--path", "deployed", "--split", "validation", *common)
    assert result.exit_code == 0, result.output
    deployed = np.load(dist / rtn_build.name / "results" / "deployed-validation.npz")
    assert np.array_equal(deployed["reference"], data["reference"])
    assert invoke("tables", "--dist", dist).exit_code == 0
    records = json.loads((dist / "tables" / "tables.json").read_text())["records"]
    served = [r for r in records if r["path"] == "served"]
    assert served and served[0]["computed"]["steps"] == computed["steps"]
    en = translations("en").gettext
    assert where_label("served", "validation", en, served) == \
        "served, the CPU, TorchAO static FP8 emulated, W8A16 on steps 1, 2, 3, W8A8 on steps 4, held-out labs"
    how = next(r["how"] for r in paths_rows(records, en) if r["path"] == "policy server, FP8 GEMM")
    assert f"TorchAO {torchao_version()}'s static FP8 tensor" in how and "W8A16 on steps 1, 2, 3" in how
    assert "emulated on the CPU" in how
    ko = translations("ko").gettext
    label = where_label("served", "validation", ko, served)
    assert "TorchAO" in label and "served" not in label and "held-out" not in label  # translated around the names
    assert any("--path served --split validation" in line
               for line in reproduction(records, load_release(), load_build("rtn"), None, ["en"]))
    # the server's own test of a checkpoint: a per-channel build (quant_algo) has no served path
    config = dist / rtn_build.name / "hf_quant_config.json"
    config.write_text(config.read_text().replace('"quant_algo": "FP8"', '"quant_algo": "FP8_PER_CHANNEL_PER_TOKEN"'))
    result = invoke("eval", "rtn", "--path", "served", "--split", "validation", *common)
    assert result.exit_code == 2 and "quant_algo 'FP8_PER_CHANNEL_PER_TOKEN'" in result.output
    assert "--path deployed" in result.output and "Traceback" not in result.output


def _rounded_apart(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Where ``x``'s FP8 code divided by ``scale`` (TorchAO's eager IEEE division) is not its code multiplied by
    fp32(1 / ``scale``) (ModelOpt's compiled quantizer)."""
    def codes(quotient: torch.Tensor) -> torch.Tensor:
        return quotient.clamp(-fp8.FP8_MAX, fp8.FP8_MAX).to(torch.float8_e4m3fn).view(torch.uint8)

    return codes(x.float() / scale) != codes(x.float() * (1.0 / scale))


def _split_by_rounding(scale: torch.Tensor) -> torch.Tensor:
    """Every finite bf16 value within the scale's range that the two rules round to other FP8 codes."""
    values = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
    values = values[values.float().isfinite() & (values.float().abs() <= fp8.FP8_MAX * scale)]
    return values[_rounded_apart(values, scale)]


def test_served_and_deployed_differ_only_in_how_the_input_is_scaled(cuda_rtn_build: tuple[Path, Path]) -> None:
    """W8A8, at the scales a GPU build stores (the ones ModelOpt's GEMM forms from the amax), on the CPU: the served
    Linear divides its input by the scale (TorchAO, eager), the deployed one multiplies it by fp32(1 / scale)
    (ModelOpt's compiled ``_to_fp8``: on an H100 its quotient is x times Triton's reciprocal, ``fp32(1 / s)`` for most
    scales, BENCHMARKS.md), and the GEMM after is the same. So a row of the bf16 values the two rules round to other
    codes gives other outputs, and a row they round alike gives the same bits."""
    cuda_build, _ = cuda_rtn_build
    release = load_release()
    deployed = deployed_transformer(cuda_build)
    served = served_transformer(cuda_build, StepPolicy(), release.policy.steps)  # W8A8 on every step
    for name in quantized_linears(deployed):
        scale = served.get_submodule(name).weight.act_quant_scale.reshape(()).float()
        split = _split_by_rounding(scale)
        if len(split):
            break
    else:
        pytest.fail("no Linear's input scale has bf16 inputs the two rules round to other codes")
    d, s = deployed.get_submodule(name), served.get_submodule(name)
    assert torch.equal(d.input_quantizer.amax.float() * torch.tensor(1 / fp8.FP8_MAX), scale)  # the same scale
    plain = (torch.randn(d.in_features, generator=torch.Generator().manual_seed(0)) * scale * 40).to(torch.bfloat16)
    x = torch.stack([split.repeat(d.in_features // len(split) + 1)[:d.in_features], plain])
    agree = not _rounded_apart(plain, scale).any()
    with torch.no_grad():
        out_deployed, out_served = d(x), s(x)
    assert not torch.equal(out_deployed[0], out_served[0]), name
    assert agree and torch.equal(out_deployed[1], out_served[1]), name


def test_diffusers_imports_torchao_without_a_word() -> None:
    """diffusers imports TorchAO wherever it is installed, and TorchAO's import logs each CUDA kernel library it
    cannot load and warns of its deprecations: none of it reaches a user's terminal (a fresh process)."""
    check = "import release.inputs.policy, sys; assert 'torchao' in sys.modules, 'diffusers no longer imports TorchAO'"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == "", done.stderr


def test_served_without_torchao_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torchao", None)  # an import of it fails as when it is not installed
    with pytest.raises(ReleaseError, match=r"pip install 'release\[served\]'"):
        torchao_version()


@pytest.mark.parametrize("case, message", [
    ("bf16 weight", "tensor l.weight is BF16, not F8_E4M3"),
    ("row scales", "tensor l.weight_scale has 4 values; the policy server takes one scale per tensor"),
    ("no input scale", "tensor l.input_scale is missing"),
])
def test_stored_tensors_the_server_cannot_take_are_named(case: str, message: str, tmp_path: Path) -> None:
    from safetensors.torch import save_file

    from release.quantize.served import _stored_tensors

    tensors = {"l.weight": torch.zeros(4, 8).to(torch.float8_e4m3fn), "l.weight_scale": torch.ones(()),
               "l.input_scale": torch.ones(())}
    if case == "bf16 weight":
        tensors["l.weight"] = torch.zeros(4, 8, dtype=torch.bfloat16)
    elif case == "row scales":
        tensors["l.weight_scale"] = torch.ones(4)
    else:
        del tensors["l.input_scale"]
    save_file(tensors, str(tmp_path / "model.safetensors"))
    with pytest.raises(ReleaseError, match=message):
        _stored_tensors(tmp_path, ["l"])


def test_the_card_says_what_vllm_omni_does_with_the_build(tmp_path: Path) -> None:
    """The Use section's vLLM-Omni paragraph reads the build's own transformer/config.json: its quant_algo and the
    step policy stored there (diffusers' first_last_n, 3 and 3), and gives the option that makes vLLM-Omni run the
    release's served_steps instead, or none where the two agree."""
    from release.publish.card.serving import vllm_omni

    exported = Path(__file__).parent / "data" / "cards" / "Cosmos3-Nano-Policy-DROID-FP8" / "transformer"
    config = json.loads((exported / "config.json").read_text())
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(config))
    release = load_release()
    text = vllm_omni(tmp_path, release, lambda s: s)
    assert "`quant_algo` FP8 " in text and "on the first 3 and the last 3 steps: 4 of this policy's 4 steps." in text
    assert text.endswith("""pass `--additional-config '{"cosmos3_mixed_precision": {"enabled": false}}'`.""")
    one = release.model_copy(update={"served_steps": StepPolicy(w8a16_first_steps=1, w8a16_last_steps=1)})
    assert vllm_omni(tmp_path, one, lambda s: s).endswith(
        """'{"cosmos3_mixed_precision": {"first_steps": 1, "last_steps": 1}}'`.""")
    same = release.model_copy(update={"served_steps": StepPolicy(w8a16_first_steps=2, w8a16_last_steps=2)})
    assert vllm_omni(tmp_path, same, lambda s: s).endswith("4 of this policy's 4 steps.")  # all 4 W8A16 either way
    for bad in ({"type": "per_layer"}, {"type": "first_last_n", "first_steps": 3}, "3/3"):
        broken = json.loads(json.dumps(config))
        broken["quantization_config"]["runtime"]["diffusion_step_policy"] = bad
        (tmp_path / "transformer" / "config.json").write_text(json.dumps(broken))
        with pytest.raises(ReleaseError) as refused:
            vllm_omni(tmp_path, release, lambda s: s)
        assert "config.json: field 'quantization_config.runtime.diffusion_step_policy' is not a first_last_n" in \
            str(refused.value)
    del config["quantization_config"]["runtime"]
    (tmp_path / "transformer" / "config.json").write_text(json.dumps(config))
    assert vllm_omni(tmp_path, release, lambda s: s).endswith("no step policy, so every step runs W8A8 there.")
    assert vllm_omni(tmp_path / "not-exported", release, lambda s: s) == ""
    for bare in ({}, {"quantization_config": {"quant_method": "modelopt"}}):  # a BF16 config; no quant_algo
        (tmp_path / "transformer" / "config.json").write_text(json.dumps(bare))
        with pytest.raises(ReleaseError, match="no field 'quantization_config' with a 'quant_algo'"):
            vllm_omni(tmp_path, release, lambda s: s)
