"""`release build rtn`: NVIDIA's FP8 layout, values that ModelOpt's arithmetic reproduces, loadable in diffusers."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from release.core.config import NANO_QUANTIZED, PolicySettings
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.inputs.source import read_headers
from release.quantize.load import load_build_transformer
from tests.conftest import edited_source, invoke

INDEX = "diffusion_pytorch_model.safetensors.index.json"


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


def test_layout(rtn_build: Path) -> None:
    layers = json.loads((rtn_build / "transformer/config.json").read_text())["num_hidden_layers"]
    headers = read_headers(rtn_build / "transformer", INDEX)
    fp8 = sorted(k for k, v in headers.items() if v[0] == "F8_E4M3")
    assert len(fp8) == 14 * layers
    expected = sorted(f"{p.replace('*', str(i))}.weight" for p in NANO_QUANTIZED for i in range(layers))
    assert fp8 == expected
    for weight in fp8:
        linear = weight.removesuffix(".weight")
        for suffix, dtype in [("weight_scale", "F32"), ("input_scale", "F32"), ("weight_quantizer._amax", "BF16"),
                              ("weight_quantizer._scale", "BF16"), ("input_quantizer._amax", "BF16")]:
            assert headers[f"{linear}.{suffix}"][:2] == (dtype, ()), f"{linear}.{suffix}"
    shards = {v[2] for v in headers.values()}
    assert len(shards) >= 2
    assert set(json.loads((rtn_build / "transformer" / INDEX).read_text())["weight_map"].values()) == shards
    for part in ("model_index.json", "config.json", "vae/config.json", "scheduler/scheduler_config.json",
                 "text_tokenizer/tokenizer.json", "modelopt_state.pth", "transformer/modelopt_state.pth",
                 "model.safetensors.index.json", "provenance.json"):
        assert (rtn_build / part).is_file(), part
    assert not (rtn_build / "fixture.json").exists()


def test_quantization_configs(rtn_build: Path) -> None:
    qc = json.loads((rtn_build / "transformer/config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "modelopt" and qc["quant_algo"] == "FP8" and qc["quant_type"] == "FP8_FP8"
    group = qc["config_groups"]["group_0"]
    assert group["weights"] == group["input_activations"] == {"dynamic": False, "num_bits": 8, "type": "float"}
    assert group["targets"] == ["Linear"]
    assert {"lm_head", "proj_in", "proj_out", "action_proj_in", "action_proj_out"} <= set(qc["ignore"])
    assert qc["producer"]["name"] == "modelopt"
    assert qc["runtime"]["diffusion_step_policy"]["type"] == "first_last_n"
    root = json.loads((rtn_build / "hf_quant_config.json").read_text())
    assert root == {k: v for k, v in qc.items() if k != "runtime"}


def test_modelopt_states_load_weights_only(rtn_build: Path) -> None:
    import modelopt.torch.quantization  # noqa: F401  (registers ModelOpt's safe globals)

    for path in (rtn_build / "modelopt_state.pth", rtn_build / "transformer/modelopt_state.pth"):
        state = torch.load(path, weights_only=True)
        modes = [m[0] for m in state["modelopt_state_dict"]]
        assert modes == ["quantize", "max_calibrate", "real_quantize"]


def test_values_follow_modelopt_arithmetic(rtn_build: Path, tiny: Path) -> None:
    """FP8 codes are ModelOpt's compress of the source weight; everything not quantized is the source, bit for bit."""
    source = _tensors(tiny / "source/transformer")
    built = _tensors(rtn_build / "transformer")
    fp8 = [k for k, v in built.items() if v.dtype == torch.float8_e4m3fn]
    for key in fp8:
        linear = key.removesuffix(".weight")
        amax = built[f"{linear}.weight_quantizer._amax"]
        assert amax == source[key].abs().max(), key
        codes = (source[key] / (amax / 448.0)).to(torch.float8_e4m3fn)
        assert torch.equal(codes.view(torch.uint8), built[key].view(torch.uint8)), key
        assert built[f"{linear}.weight_scale"] == amax.float() / 448.0
        assert built[f"{linear}.input_scale"] > 0
        rel = (built[key].float() * built[f"{linear}.weight_quantizer._scale"].float() - source[key].float()).abs()
        assert float((rel / source[key].float().abs().clamp_min(1e-3)).max()) < 0.07  # FP8 E4M3: 3 mantissa bits
    for key, value in source.items():
        if key not in fp8:
            assert torch.equal(value, built[key]), key


def test_provenance(rtn_build: Path, tiny: Path) -> None:
    prov = json.loads((rtn_build / "provenance.json").read_text())
    assert prov["source"]["repo"] == "nvidia/Cosmos3-Nano-Policy-DROID"
    assert prov["source"]["revision"] == json.loads((tiny / "source/fixture.json").read_text())["revision"]
    assert prov["calibration"]["calls"] == 256 and prov["calibration"]["observations"] == 32
    assert len(prov["calibration"]["sha256"]) == 64 and len(prov["config_sha256"]) == 64
    assert set(prov["versions"]) >= {"modelopt", "torch", "diffusers"}
    assert prov["tool"]["commit"] and prov["date"] and prov["quantized_linears"] == 28
    assert prov["device"].split()[0] == "cpu"  # verification recomputes the codes in this device's arithmetic


def test_loads_in_diffusers_and_rolls_out(rtn_build: Path, tiny: Path) -> None:
    transformer = load_build_transformer(rtn_build)
    layer = transformer.get_submodule("layers.0.self_attn.to_q")
    assert type(layer).__name__ == "RealQuantQuantLinear" and layer.weight.dtype == torch.float8_e4m3fn
    settings = PolicySettings()
    pipe = load_pipeline(rtn_build, settings, transformer=transformer)
    obs = load_observations(tiny / "observations")[0]
    actions = rollout(pipe, obs, settings)
    assert actions.shape == (32, 8) and np.isfinite(actions).all()
    reference = rollout(load_pipeline(tiny / "source", settings), obs, settings)
    assert 0 < np.abs(actions - reference).max() < 0.5  # FP8, yet close to the BF16 policy


def test_a_load_that_restores_no_quantizer_is_refused(rtn_build: Path, tmp_path: Path) -> None:
    """What the old Use code got from the Hub (ModelOpt found no state, diffusers made plain Linears holding the FP8
    weights) fails the load that verification's loadable check runs."""
    import shutil

    import modelopt.torch.opt as mto

    from release.core.errors import ReleaseError

    folder = tmp_path / rtn_build.name
    shutil.copytree(rtn_build, folder, ignore=shutil.ignore_patterns("results"))
    torch.save(mto.modelopt_state(torch.nn.Linear(1, 1)), folder / "transformer" / "modelopt_state.pth")  # no mode
    with pytest.raises(ReleaseError, match=r"transformer: 28 Linears \(the first layers\.0\.self_attn\.to_q\) hold "
                                           r"FP8 weights as plain torch\.nn\.Linear: ModelOpt's restore did not run"):
        load_build_transformer(folder)


def test_second_build_reuses_calibration_and_is_identical(rtn_build: Path, tiny: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """... and RELEASE_PROFILE times its stages (no GPU here: no memory figures)."""
    monkeypatch.setenv("RELEASE_PROFILE", str(tmp_path / "profile.json"))
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    assert "capturing" not in result.output
    again = tmp_path / "dist" / rtn_build.name
    for shard in sorted((rtn_build / "transformer").glob("*.safetensors")):
        assert shard.read_bytes() == (again / "transformer" / shard.name).read_bytes()
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["command"] == "build" and profile["device"] == "cpu"
    stages = {s["stage"]: s for s in profile["stages"]}
    assert list(stages)[:6] == ["load the calibration capture", "load the source", "instantiate the BF16 transformer",
                                "quantize: observer pass", "quantize: ModelOpt", "quantize (recipe, calibration)"]
    assert {"export: compress (ModelOpt)", "export: state to the CPU, write the shards", "build rtn",
            "verify: read the source", "verify: hash the files (what the checks left)", "verify: values",
            "verify: loadable", "verify rtn"} <= set(stages)
    assert "capture: rollouts" not in stages  # the capture was cached
    assert all(s["calls"] == 1 and s["seconds"] >= 0 and s["peak_gib"] is None for s in stages.values())
    inner = sum(stages[s]["seconds"] for s in stages if s.startswith(("instantiate", "quantize (", "export")))
    assert inner <= stages["build rtn"]["seconds"]
    # the timeline: every entry in the order it ended, with its start and nesting; the build's parts inside it
    timeline = profile["timeline"]
    assert [e["stage"] for e in timeline] == list(stages)  # each stage entered once here
    build = next(e for e in timeline if e["stage"] == "build rtn")
    parts = [e for e in timeline if e["stage"].startswith(("quantize", "export"))]
    assert all(build["start"] <= e["start"] and e["depth"] > build["depth"] for e in parts)
    assert all(e["start"] + e["seconds"] <= build["start"] + build["seconds"] + 1e-3 for e in parts)
    assert "release build: stages (cpu)" in result.output
    # outside a terminal: the builds counted, each build's closing line with its parts' seconds, and its verification
    seconds = r"\d+\.\d s"
    said = [line for line in result.stderr.splitlines() if re.fullmatch(
        rf"builds: 0/1|build rtn: 28 FP8 Linears written in {seconds} \(instantiate {seconds}, quantize {seconds}, "
        rf"export {seconds}\)|verify rtn: 6 checks passed in {seconds} \(read the source {seconds}\)|builds: 1/1 in "
        rf"{seconds}", line)]
    assert [line.split(":")[0] for line in said] == ["builds", "build rtn", "verify rtn", "builds"]


def test_the_reference_is_built_first_and_each_build_verified_as_it_is_made(tiny: Path, tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Of a source with no recorded reference (not a tiny fixture's), the RTN build, the others' reference, comes
    first whatever the order asked; every build is verified right after it is made, against it (a sweep's builds need
    not all be on disk at once)."""
    monkeypatch.setenv("RELEASE_PROFILE", str(tmp_path / "profile.json"))
    source = tmp_path / "source"
    shutil.copytree(tiny / "source", source)
    record = json.loads((source / "fixture.json").read_text())
    del record["reference"]  # the revision is unchanged: the calibration capture is the session's
    (source / "fixture.json").write_text(json.dumps(record))
    dist = tmp_path / "dist"
    result = invoke("build", "rtn_mavg", "rtn", "--source", source, "--observations", tiny / "observations",
                    "--out", dist)
    assert result.exit_code == 0, result.output
    timeline = json.loads((tmp_path / "profile.json").read_text())["timeline"]
    per_build = [e["stage"] for e in timeline if e["stage"].startswith(("build ", "verify ")) and ":" not in e["stage"]]
    assert per_build == ["build rtn", "verify rtn", "build rtn_mavg", "verify rtn_mavg"]
    report = json.loads((dist / "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvgObserver" / "verification" /
                         "report.json").read_text())
    assert report["reference"] == "Cosmos3-Nano-Policy-DROID-FP8" and report["status"] == "passed"


@pytest.mark.parametrize("args, message", [
    (["rtn", "--source", "/nonexistent/src"], "source directory /nonexistent/src does not exist"),
    (["nope"], "unknown build 'nope'"),
    ([], "name at least one build"),
])
def test_bad_input_is_one_line(args: list[str], message: str, tmp_path: Path) -> None:
    result = invoke("build", *args, "--out", tmp_path / "dist")
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and message in result.output and result.output.count("\n") == 1
    assert not (tmp_path / "dist").exists()


def test_missing_observations(tiny: Path, tmp_path: Path) -> None:
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", "/nonexistent/obs",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2 and "observation set /nonexistent/obs not found" in result.output
    assert not (tmp_path / "dist").exists()


def test_source_without_cache_entry_says_how_to_fix(tmp_path: Path) -> None:
    result = invoke("build", "rtn", "--out", tmp_path / "dist")
    assert result.exit_code == 2
    assert "not in the local Hugging Face cache (HF_HOME); download it first, e.g. 'hf download " \
           "nvidia/Cosmos3-Nano-Policy-DROID --revision " in result.output and "or pass --source DIR" in result.output


def test_mismatched_source_names_first_tensor(tiny: Path, tmp_path: Path) -> None:
    bad = edited_source(tiny, tmp_path / "source", "layers.1.mlp.up_proj.weight", lambda w: w[:, :32])
    result = invoke("build", "rtn", "--source", bad, "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2
    assert "tensor layers.1.mlp.up_proj.weight has shape [128, 32]" in result.output
    assert "expects [128, 64]" in result.output
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize(("value", "message"), [
    ("tpu", "RELEASE_DEVICE=tpu: expected auto, cpu or cuda"),
    pytest.param("cuda", "RELEASE_DEVICE=cuda but torch sees no CUDA device; unset it to run on the CPU",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_device_setting_is_checked(value: str, message: str, tiny: Path, tmp_path: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASE_DEVICE", value)
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))  # no capture cached: the device is asked for
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1, result.output
    assert not (tmp_path / "dist").exists()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA (the page-locked staging buffer)"))])
def test_shards_are_safetensors_own_files_and_the_codes_digest_hashes_each_weight(device: str,
                                                                                  tmp_path: Path) -> None:
    """The export writes each shard with safetensors from CPU memory (GPU tensors through one page-locked buffer,
    reused shard after shard: the second shard overwrites the first's views) and hashes every FP8 weight on its own:
    the files are ``save_file``'s own bytes, and the digest is the sha256 of each weight's name and code sha256."""
    import hashlib

    from safetensors.torch import save_file

    from release.quantize import export

    torch.manual_seed(7)
    state = {f"layers.{i}.{part}": t.to(device) for i in range(3) for part, t in (
        ("to_q.weight", (torch.randn(48, 40) * 30).to(torch.float8_e4m3fn)), ("to_q.weight_scale", torch.rand(())),
        ("norm.weight", torch.randn(40).to(torch.bfloat16)))}
    shards = [("a.safetensors", [k for k in state if k.startswith("layers.0")]),
              ("b.safetensors", [k for k in state if not k.startswith("layers.0")])]
    codes = {k for k in state if k.endswith("to_q.weight")}
    digest = export._write_shards(state, shards, tmp_path, codes)
    for name, keys in shards:
        save_file({k: state[k].cpu() for k in keys}, str(tmp_path / f"{name}.expected"), metadata={"format": "pt"})
        assert (tmp_path / name).read_bytes() == (tmp_path / f"{name}.expected").read_bytes()
    per_weight = "".join(f"{k.removesuffix('.weight')} "
                         f"{hashlib.sha256(state[k].cpu().view(torch.uint8).numpy().tobytes()).hexdigest()}\n"
                         for k in sorted(codes))
    assert digest == hashlib.sha256(per_weight.encode()).hexdigest()
    state["layers.2.to_q.weight"] = state["layers.2.to_q.weight"].clone()
    state["layers.2.to_q.weight"].view(torch.uint8)[0, 0] ^= 1  # one code, one bit
    assert export._write_shards(state, shards, tmp_path, codes) != digest


def test_the_profile_is_rewritten_at_most_every_few_seconds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each rewrite holds the whole timeline: rewritten at every outer stage, an eval's thousands of rollouts cost a
    quadratic number of bytes. The first outer stage writes the file (a killed run keeps what ran), later ones once
    ``REWRITE_EVERY`` has passed, and the command's end writes everything."""
    from release.core import profile

    monkeypatch.setenv("RELEASE_PROFILE", str(tmp_path / "profile.json"))
    writes: list[int] = []
    write = profile._write
    monkeypatch.setattr(profile, "_write", lambda command, rank: writes.append(len(profile._TIMELINE)) or
                        write(command, rank))
    profile.begin("eval")
    for _ in range(200):
        with profile.stage("rollout"):
            pass
    assert writes == [1]
    monkeypatch.setattr(profile, "REWRITE_EVERY", 0.0)
    with profile.stage("rollout"):
        pass
    assert writes == [1, 201]
    profile.report("eval")
    assert writes == [1, 201, 201]
    assert json.loads((tmp_path / "profile.json").read_text())["stages"][0]["calls"] == 201
