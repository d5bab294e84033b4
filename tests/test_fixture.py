"""The embedded tiny checkpoint: NVIDIA's folder layout, the real architecture, deterministic."""

from __future__ import annotations

import json
import re
from pathlib import Path

from PIL import Image

from release.inputs.fixture import content_revision
from release.inputs.observations import CALIBRATION_LABS, CAMERAS, HELDOUT_LABS, load_observations
from release.inputs.source import check_architecture, read_headers
from tests.conftest import invoke


def test_layout(tiny: Path) -> None:
    src = tiny / "source"
    index = json.loads((src / "model_index.json").read_text())
    assert index["_class_name"] == "Cosmos3OmniPipeline"
    assert index["transformer"] == ["diffusers", "Cosmos3OmniTransformer"]
    assert json.loads((src / "config.json").read_text())["model_type"] == "cosmos3_omni"
    shards = sorted((src / "transformer").glob("diffusion_pytorch_model-*.safetensors"))
    assert len(shards) >= 2
    tindex = json.loads((src / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert sorted(set(tindex["weight_map"].values())) == [p.name for p in shards]
    root_index = json.loads((src / "model.safetensors.index.json").read_text())
    assert all(v.startswith("transformer/") for v in root_index["weight_map"].values())
    for part in ("vae/config.json", "text_tokenizer/tokenizer.json", "scheduler/scheduler_config.json"):
        assert (src / part).is_file(), part


def test_real_architecture_names(tiny: Path) -> None:
    config = check_architecture(tiny / "source")
    headers = read_headers(tiny / "source" / "transformer", "diffusion_pytorch_model.safetensors.index.json")
    layers = config["num_hidden_layers"]
    assert isinstance(layers, int)
    linears = [k for k in headers if ".self_attn." in k or ".mlp" in k]
    assert len([k for k in linears if k.endswith("proj.weight") or k.endswith(("to_q.weight", "to_k.weight",
               "to_v.weight", "to_out.weight", "to_add_out.weight"))]) == 14 * layers
    assert headers["layers.0.mlp_moe_gen.down_proj.weight"][0] == "BF16"
    assert headers["time_embedder.linear_1.weight"][0] == "F32"
    assert "action_proj_in.fc.weight" in headers


def test_deterministic_revision(tiny: Path, tmp_path: Path) -> None:
    """... through the command, which says on stderr what it writes and, when done, each part's seconds."""
    result = invoke("fixture", "tiny", "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again" / "source" / "fixture.json").read_text())
    recorded = json.loads((tiny / "source" / "fixture.json").read_text())["revision"]
    assert again["revision"] == recorded == content_revision(tiny / "source")
    seconds = r"\d+\.\d s"
    assert re.fullmatch(rf"fixture tiny: writing {re.escape(str(tmp_path / 'again'))}: source, 32 calibration and 16 "
                        rf"held-out observations, reference\nfixture tiny: done in {seconds} \(source {seconds}, "
                        rf"observations {seconds}, reference {seconds}\)\n", result.stderr)
    assert result.stdout.startswith(f"source:       {tmp_path / 'again' / 'source'} (revision {recorded[:12]})")
    assert (tmp_path / "again/observations/observations.jsonl").read_bytes() == \
        (tiny / "observations/observations.jsonl").read_bytes()


def test_observations(tiny: Path) -> None:
    obs = load_observations(tiny / "observations")
    assert len([o for o in obs if o.lab in CALIBRATION_LABS]) == 32
    assert {o.lab for o in obs if o.lab not in CALIBRATION_LABS} == set(HELDOUT_LABS)
    assert len({o.obs_id for o in obs}) == len(obs)
    first = obs[0]
    assert len(first.state) == 8 and first.state[7] in (0.0, 1.0) and first.instruction
    for cam in CAMERAS:
        assert Image.open(first.images[cam]).size == (640, 360)
    assert first.concat_view().shape == (360, 1920, 3)


def test_the_reference_is_modelopts_own_export(tiny: Path) -> None:
    """``reference/``: written by ModelOpt's exporter (its provenance says so and names no tool of this project),
    recorded in ``fixture.json``, laid out as a repo, and without what only this tool's export writes."""
    from release.inputs.fixture import fixture_reference
    from release.inputs.reference import MADE_BY, QUANTIZER_BUFFERS

    ref = tiny / "reference"
    assert fixture_reference(tiny / "source") == ref
    prov = json.loads((ref / "provenance.json").read_text())
    assert prov["made_by"] == MADE_BY and "tool" not in prov and "build" not in prov
    assert prov["source"]["revision"] == json.loads((tiny / "source" / "fixture.json").read_text())["revision"]
    assert prov["calibration"]["calls"] == 8 * prov["calibration"]["observations"] > 0
    assert prov["transformations"] and prov["differences"]
    headers = read_headers(ref / "transformer", "diffusion_pytorch_model.safetensors.index.json")
    assert headers["layers.0.self_attn.to_q.weight"][0] == "F8_E4M3"
    assert headers["layers.1.mlp_moe_gen.down_proj.input_scale"][0] == "F32"
    assert headers["proj_in.weight"][0] == "BF16"  # NVIDIA's BF16 Linears are left out of FP8_DEFAULT_CFG
    assert not [k for k in headers if k.endswith(QUANTIZER_BUFFERS)]  # what ModelOpt's HF export does not write
    config = json.loads((ref / "transformer" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "modelopt" and config["quant_algo"] == "FP8" and "modelopt_config" not in config
    assert json.loads((ref / "hf_quant_config.json").read_text()) == config
    for part in ("modelopt_state.pth", "transformer/modelopt_state.pth", "model_index.json", "vae/config.json",
                 "model.safetensors.index.json"):
        assert (ref / part).is_file(), part

