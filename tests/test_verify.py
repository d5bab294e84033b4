"""`release verify`: the six checks, the reports, and every kind of damage failing the gate by file and tensor."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import invoke

INDEX = "diffusion_pytorch_model.safetensors.index.json"


def _verify(folder: Path, reference: Path, tiny: Path) -> tuple[int, dict]:
    result = invoke("verify", "rtn", "--dist", folder.parent, "--reference", reference, "--source",
                    tiny / "source", "--observations", tiny / "observations")
    report = json.loads((folder / "verification" / "report.json").read_text())
    return result.exit_code, report


def test_build_verifies_and_writes_reports(rtn_build: Path) -> None:
    report = json.loads((rtn_build / "verification" / "report.json").read_text())
    assert report["passed"] is True
    names = [c["name"] for c in report["checks"]]
    assert names == ["layout", "quantization_config", "modelopt_state", "values", "consistency", "loadable"]
    values = next(c for c in report["checks"] if c["name"] == "values")
    assert values["details"]["fp8_weights"] == 28 and values["details"]["worst_fp8_steps"] <= 0.5 * (1 + 2**-4)
    md = (rtn_build / "verification" / "report.md").read_text()
    assert "| layout | yes |" in md and "common tensors" in md


def test_sq_values_undo_the_smoothing(recipe_builds: Path) -> None:
    sq = recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant"
    report = json.loads((sq / "verification" / "report.json").read_text())
    assert report["passed"], report
    values = next(c for c in report["checks"] if c["name"] == "values")
    assert values["details"]["folded"] > 0 and "smoothed source weight" in values["summary"]
    layout = next(c for c in report["checks"] if c["name"] == "layout")
    assert layout["details"]["files_one_side"] == {"smoothing_scales.safetensors": "tool sidecar"}


def _shard_of(folder: Path, tensor: str) -> Path:
    index = json.loads((folder / "transformer" / INDEX).read_text())
    return folder / "transformer" / index["weight_map"][tensor]


def _truncate(folder: Path) -> None:
    shard = _shard_of(folder, "layers.0.self_attn.to_q.weight")
    shard.write_bytes(shard.read_bytes()[:-1000])


def _corrupt_header(folder: Path) -> None:
    shard = _shard_of(folder, "layers.0.self_attn.to_q.weight")
    data = shard.read_bytes()
    shard.write_bytes(data[:8] + b"{garbage" + data[16:])


def _missing_shard(folder: Path) -> None:
    _shard_of(folder, "layers.1.mlp.down_proj.weight").unlink()


def _dtype_mismatch(folder: Path) -> None:
    shard = _shard_of(folder, "layers.1.mlp.down_proj.weight")
    tensors = load_file(shard)
    tensors["layers.1.mlp.down_proj.weight"] = tensors["layers.1.mlp.down_proj.weight"].to(torch.bfloat16)
    save_file(tensors, str(shard), metadata={"format": "pt"})


def _missing_config(folder: Path) -> None:
    (folder / "transformer" / "config.json").unlink()


def _changed_code(folder: Path) -> None:
    shard = _shard_of(folder, "layers.0.mlp.gate_proj.weight")
    tensors = load_file(shard)
    w = tensors["layers.0.mlp.gate_proj.weight"].view(torch.uint8).clone()
    w[0, 0] ^= 1
    tensors["layers.0.mlp.gate_proj.weight"] = w.view(torch.float8_e4m3fn)
    save_file(tensors, str(shard), metadata={"format": "pt"})


@pytest.mark.parametrize("damage, check, message", [
    (_truncate, "layout", "unreadable (Error while deserializing header: incomplete metadata"),
    (_corrupt_header, "layout", "unreadable (Error while deserializing header: invalid JSON"),
    (_missing_shard, "consistency", "which is missing"),
    (_dtype_mismatch, "layout", "tensor layers.1.mlp.down_proj.weight is BF16[64, 128], reference F8_E4M3[64, 128]"),
    (_missing_config, "quantization_config", "transformer/config.json: missing"),
    (_changed_code, "values", "tensor layers.0.mlp.gate_proj.weight: 1 FP8 codes differ"),
])
def test_damage_fails_the_gate(damage: Callable[[Path], None], check: str, message: str, rtn_build: Path,
                               tiny: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dist" / rtn_build.name
    shutil.copytree(rtn_build, folder)
    shutil.rmtree(folder / "verification")
    damage(folder)
    code, report = _verify(folder, rtn_build, tiny)
    assert code == 1
    assert report["passed"] is False
    failing = {c["name"]: c for c in report["checks"] if not c["passed"]}
    assert check in failing, failing.keys()
    assert message in failing[check]["summary"] or any(message in p for p in failing[check]["details"].get(
        "problems", []) + failing[check]["details"].get("dtype_or_shape_differences", [])), failing[check]
    if damage is _missing_shard:
        assert "loadable" in failing
    refused = invoke("push", "--dist", folder.parent, "--dry-run")
    assert refused.exit_code == 1 and "push refused: Cosmos3-Nano-Policy-DROID-FP8 failed verification" in \
        refused.output


def test_push_refuses_an_unverified_build(rtn_build: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dist" / rtn_build.name
    shutil.copytree(rtn_build, folder)
    shutil.rmtree(folder / "verification")
    result = invoke("push", "--dist", folder.parent, "--dry-run")
    assert result.exit_code == 1 and "has no verification report; run 'release verify'" in result.output
