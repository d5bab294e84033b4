"""`release verify`: the six checks, the reports, and every kind of damage failing the gate by file and tensor."""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from click.testing import Result
from safetensors.torch import load_file, save_file

from release.check.report import after_verification
from tests.conftest import invoke

INDEX = "diffusion_pytorch_model.safetensors.index.json"


def _verify_result(folder: Path, reference: Path, tiny: Path, *args: str) -> Result:
    return invoke("verify", "rtn", "--dist", folder.parent, "--reference", reference, "--source", tiny / "source",
                  "--observations", tiny / "observations", *args)


def _verify(folder: Path, reference: Path, tiny: Path) -> tuple[int, dict]:
    result = _verify_result(folder, reference, tiny)
    report = json.loads((folder / "verification" / "report.json").read_text())
    return result.exit_code, report


def test_build_verifies_and_writes_reports(rtn_build: Path) -> None:
    report = json.loads((rtn_build / "verification" / "report.json").read_text())
    assert report["status"] == "passed" and {c["status"] for c in report["checks"]} == {"passed"}
    files = {p.relative_to(rtn_build).as_posix(): p for p in rtn_build.rglob("*") if p.is_file()}
    later = {r for r in files if after_verification(r)}  # results and cards: other tests may have added them
    assert set(report["manifest"]) == set(files) - later - {"verification/report.json"}
    for rel, entry in report["manifest"].items():
        data = files[rel].read_bytes()
        assert entry == {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    names = [c["name"] for c in report["checks"]]
    assert names == ["layout", "quantization_config", "modelopt_state", "values", "consistency", "loadable"]
    values = next(c for c in report["checks"] if c["name"] == "values")
    assert values["details"]["fp8_weights"] == 28 and values["details"]["worst_fp8_steps"] <= 0.5 * (1 + 2**-4)
    md = (rtn_build / "verification" / "report.md").read_text()
    assert "| layout | yes |" in md and "common tensors" in md


def test_the_fixtures_build_is_verified_against_modelopts_export(rtn_build: Path) -> None:
    """``release build`` of a tiny fixture's source compares with the fixture's reference (ModelOpt's own export),
    not with itself, and tolerates exactly what that export writes differently: the 3 quantizer buffers of each
    of the 28 FP8 Linears, the fields diffusers reads; every other tensor and field is compared."""
    report = json.loads((rtn_build / "verification" / "report.json").read_text())
    assert report["reference"] == "reference" and report["status"] == "passed"
    checks = {c["name"]: c for c in report["checks"]}
    for name in ("layout", "quantization_config", "modelopt_state"):
        assert checks[name]["details"]["reference"]["kind"] == "modelopt-export", checks[name]
        assert checks[name]["summary"].startswith("modelopt-export (ModelOpt's own export, ")
        assert "self-reference" not in checks[name]["summary"]
    layout = checks["layout"]["details"]
    assert layout["tolerated"]["quantizer_buffers"] == 3 * 28 and layout["problems"] == []
    assert layout["dtype_or_shape_differences"] == [] and set(layout["files_one_side"].values()) == {"tool sidecar"}
    fields = checks["quantization_config"]["details"]["tolerated"]["build_only_fields"]
    assert {f.split(": ")[1] for f in fields} == {"quant_type", "modelopt_config", "runtime"}
    assert "(modelopt-export: ModelOpt's own export" in (rtn_build / "verification" / "report.md").read_text()


@pytest.mark.parametrize("itself", [True, False])
def test_a_self_reference_says_so(itself: bool, rtn_build: Path, tiny: Path, tmp_path: Path) -> None:
    """Against the build itself, or another build of this tool, the reference checks pass but say "self-reference"
    in their summaries, details and report.md."""
    folder = tmp_path / "dist" / rtn_build.name
    shutil.copytree(rtn_build, folder)
    code, report = _verify(folder, folder if itself else rtn_build, tiny)
    assert code == 0, report
    what = "the build itself" if itself else "build 'rtn' of this tool"
    for check in report["checks"][:3]:
        assert check["details"]["reference"] == {"kind": "self-reference", "what": what}, check
        assert check["summary"].startswith(f"self-reference ({what}): "), check
    assert all("self-reference" not in c["summary"] for c in report["checks"][3:])
    assert f"Reference: `{rtn_build.name}` (self-reference: {what})" in \
        (folder / "verification" / "report.md").read_text()


def test_sq_values_undo_the_smoothing(recipe_builds: Path) -> None:
    sq = recipe_builds / "Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant"
    report = json.loads((sq / "verification" / "report.json").read_text())
    assert report["status"] == "passed", report
    values = next(c for c in report["checks"] if c["name"] == "values")
    assert values["details"]["folded"] > 0 and "smoothed source weight" in values["summary"]
    layout = next(c for c in report["checks"] if c["name"] == "layout")
    assert layout["details"]["files_one_side"] == {"smoothing_scales.safetensors": "tool sidecar",
                                                   "builds/release.yaml": "tool sidecar",
                                                   "builds/sq_auto.yaml": "tool sidecar"}


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
    assert report["status"] == "failed"
    failing = {c["name"]: c for c in report["checks"] if c["status"] == "failed"}
    assert check in failing, failing.keys()
    assert message in failing[check]["summary"] or any(message in p for p in failing[check]["details"].get(
        "problems", []) + failing[check]["details"].get("dtype_or_shape_differences", [])), failing[check]
    if damage is _missing_shard:
        assert "loadable" in failing
    refused = invoke("push", "--dist", folder.parent, "--dry-run")
    assert refused.exit_code == 1 and "push refused: Cosmos3-Nano-Policy-DROID-FP8 failed verification" in \
        refused.output


def test_verify_format_json_prints_each_builds_checks_alone_on_stdout(rtn_build: Path, tiny: Path,
                                                                      tmp_path: Path) -> None:
    """--format json: one document on stdout (no tables), the exit status as without it, the report's checks."""
    folder = tmp_path / "dist" / rtn_build.name
    shutil.copytree(rtn_build, folder)
    for damaged in (False, True):
        if damaged:
            _changed_code(folder)
        result = _verify_result(folder, rtn_build, tiny, "--format", "json")
        assert result.exit_code == (1 if damaged else 0), result.output
        doc = json.loads(result.stdout)
        report = json.loads((folder / "verification" / "report.json").read_text())
        [build] = doc["builds"]
        assert doc["passed"] is build["passed"] is (not damaged) and build["build"] == "rtn"
        assert build["repo"] == rtn_build.name and build["report"] == str(folder / "verification" / "report.json")
        assert build["checks"] == [{k: c[k] for k in ("name", "status", "summary")} for c in report["checks"]]
        failed = [c["name"] for c in build["checks"] if c["status"] == "failed"]
        assert ("values" in failed) is damaged and bool(failed) is damaged


def test_push_refuses_an_unverified_build(rtn_build: Path, tmp_path: Path) -> None:
    folder = tmp_path / "dist" / rtn_build.name
    shutil.copytree(rtn_build, folder)
    shutil.rmtree(folder / "verification")
    result = invoke("push", "--dist", folder.parent, "--dry-run")
    assert result.exit_code == 1 and "has no verification report; run 'release verify'" in result.output


def test_layout_classifies_eval_results_as_sidecars(rtn_build: Path, tmp_path: Path) -> None:
    """An evaluated reference (results/*.npz beside its checkpoint) is still a valid reference: what card and eval
    write after verification is not looked at (release.check.report.may_follow_verification)."""
    from release.check.layout import check_layout

    build, reference = tmp_path / "build", tmp_path / "reference"
    for folder in (build, reference):  # other tests may have evaluated the session's build
        shutil.copytree(rtn_build, folder, ignore=shutil.ignore_patterns("results"))
    (reference / "results").mkdir()
    (reference / "results" / "deployed-validation.npz").write_bytes(b"not read by the layout check")
    check = check_layout(build, reference)
    assert check.status == "passed", check.summary
    assert "results/deployed-validation.npz" not in check.details["files_one_side"]
    (build / "forest.ko.png").write_bytes(b"a plot card wrote")  # a carded build, verified again
    assert check_layout(build, reference, languages=["en", "ko"]).status == "passed"
    (build / "forest.fr.png").write_bytes(b"no file of this release")
    check = check_layout(build, reference, languages=["en", "ko"])
    assert check.status == "failed" and "forest.fr.png (build only)" in check.summary


def test_a_resident_source_is_read_only_where_it_equals_the_files(tmp_path: Path) -> None:
    """A sweep's verification reads the source's tensors where the build keeps them (on the GPU) only once they were
    found equal to the files in name, dtype, shape and bytes; otherwise from the files, as a lone verify does."""
    from safetensors.torch import save_file

    from release.check.verify import _files_hold

    files = {"a.weight": torch.arange(6.0).reshape(2, 3), "b.weight": torch.ones(4, dtype=torch.bfloat16)}
    save_file({"a.weight": files["a.weight"]}, tmp_path / "one.safetensors")
    save_file({"b.weight": files["b.weight"]}, tmp_path / "two.safetensors")
    resident = {k: v.clone() for k, v in files.items()}
    assert _files_hold(tmp_path, resident)
    for other in ({**resident, "a.weight": resident["a.weight"] + 1},
                  {**resident, "a.weight": files["a.weight"].double()},
                  {**resident, "b.weight": resident["b.weight"][:2]}, {"a.weight": resident["a.weight"]},
                  {**resident, "c.weight": resident["a.weight"]}):
        assert not _files_hold(tmp_path, other)
    (tmp_path / "two.safetensors").write_bytes(b"not a shard")
    assert not _files_hold(tmp_path, resident)


def test_verify_and_eval_find_the_source_and_observations_the_build_was_made_from(
        rtn_build: Path, tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """'release build --source S --observations O --out D' records both in D (never in a repo folder); verify and
    eval on D need neither option, --source still wins, and a recorded folder that is gone is passed over."""
    dist = tmp_path / "dist"
    shutil.copytree(rtn_build.parent, dist)
    recorded = json.loads((dist / ".release-inputs.json").read_text())
    assert recorded == {"source": str((tiny / "source").resolve()),
                        "observations": str((tiny / "observations").resolve())}
    result = invoke("verify", "--all", "--dist", dist)  # every build of the sweep that is there
    assert result.exit_code == 0, result.output
    assert "verification: Cosmos3-Nano-Policy-DROID-FP8 " in result.output and "loadable" in result.output
    result = invoke("verify", "--dist", dist)
    assert result.exit_code == 2 and "name at least one build, or pass --all" in result.output
    result = invoke("eval", "rtn", "--path", "fakequant", "--split", "validation", "--dist", dist)
    assert result.exit_code == 0, result.output
    monkeypatch.chdir(tmp_path)  # no ./builds: the shipped defaults, and no base model in the cache
    (dist / ".release-inputs.json").write_text(json.dumps({"source": str(tmp_path / "gone"),
                                                          "observations": str(tmp_path / "gone")}))
    result = invoke("verify", "rtn", "--dist", dist)
    assert result.exit_code == 2 and "base model" in result.output, result.output
