"""`release eval`, `release import-served` and `release tables` end to end on the tiny builds."""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from release.core.fp8 import emulated_gemm, hopper_accumulate, per_tensor_forward
from release.measure.evaluate import describe
from tests.conftest import invoke

RTN = "Cosmos3-Nano-Policy-DROID-FP8"


@pytest.fixture(scope="session")
def evaluated(recipe_builds: Path, tiny: Path) -> Path:
    common = ["--dist", recipe_builds, "--source", tiny / "source", "--observations", tiny / "observations"]
    for args in (["rtn", "sq_auto", "rtn_mavg", "--path", "fakequant", "--split", "validation", "--yardsticks"],
                 ["rtn", "rtn_mavg", "--path", "deployed", "--split", "validation"]):
        result = invoke("eval", *args, *common)
        assert result.exit_code == 0, result.output
    return recipe_builds


def test_results_hold_every_chunk(evaluated: Path, tiny: Path) -> None:
    data = np.load(evaluated / RTN / "results" / "fakequant-validation.npz")
    assert data["reference"].shape == data["candidate"].shape == (16, 32, 8)
    assert set(data["labs"]) == {"AUTOLab", "IPRL", "PennPAL", "RPL"}  # held-out labs only
    assert np.isfinite(data["candidate"]).all() and not np.array_equal(data["reference"], data["candidate"])
    deployed = np.load(evaluated / RTN / "results" / "deployed-validation.npz")
    assert np.array_equal(deployed["reference"], data["reference"])  # same BF16 rollouts, same seeds
    assert not np.array_equal(deployed["candidate"], data["candidate"])  # kernel arithmetic vs fake quant
    seeds = np.load(evaluated / "yardsticks" / "seed-validation.npz")
    assert seeds["reference"].shape == (24, 32, 8) and len(set(seeds["seeds"])) == 4
    assert describe(evaluated / "yardsticks" / "seed-validation.npz").startswith("24 rollouts of 6 observations, ")
    # each observation's metrics stored beside its chunks, recomputed here from the definitions
    diff = data["candidate"].astype(np.float64) - data["reference"]
    assert np.allclose(data["overall_sigma"], np.sqrt(((diff / data["sigma"]) ** 2).mean(axis=(1, 2))))
    assert np.allclose(data["joint_mae_deg"], np.degrees(np.abs(diff[..., :7])).mean(axis=(1, 2)))
    agree = (data["candidate"][..., 7] >= 0.5) == (data["reference"][..., 7] >= 0.5)
    assert np.array_equal(data["gripper_agree"], agree.sum(axis=1))
    assert np.allclose(data["max_err_sigma"], np.abs(diff / data["sigma"]).max(axis=(1, 2)))


def test_tables(evaluated: Path) -> None:
    result = invoke("tables", "--dist", evaluated, "--resamples", "2000")
    assert result.exit_code == 0, result.output
    assert "overall (sigma) [95% CI]" in result.output
    doc = json.loads((evaluated / "tables" / "tables.json").read_text())
    rows = {(r["build"], r["path"], r["split"]): r for r in doc["records"]}
    assert ("rtn", "deployed", "validation") in rows and ("sq_auto", "fakequant", "validation") in rows
    row = rows[("sq_auto", "fakequant", "validation")]
    for key in ("overall_sigma", "overall_ci", "joint_mae_deg", "snr_db", "gripper_agree", "gripper_ci",
                "gripper_changes", "n_obs", "n_steps", "gate", "diff_to_baseline", "diff_ci", "x_eager_vs_compile"):
        assert key in row, key
    assert row["n_obs"] == 16 and row["n_steps"] == 512
    assert row["overall_ci"][0] <= row["overall_sigma"] <= row["overall_ci"][1]
    assert row["comparisons"] == 2  # sq_auto and rtn_mavg against rtn: Bonferroni over two
    assert "diff_to_baseline" not in rows[("rtn", "fakequant", "validation")] or \
        rows[("rtn", "fakequant", "validation")]["diff_to_baseline"] is None
    for name in ("fidelity", "ranking", "attribution"):
        assert not pd.read_csv(evaluated / "tables" / f"{name}.csv").empty


def test_import_served(evaluated: Path, tiny: Path, tmp_path: Path) -> None:
    data = np.load(evaluated / RTN / "results" / "deployed-validation.npz")
    good = tmp_path / "served.npz"
    np.savez(good, reference=data["reference"], candidate=data["candidate"], obs_ids=data["obs_ids"])
    common = ["--dist", evaluated, "--source", tiny / "source", "--observations", tiny / "observations"]
    result = invoke("import-served", "rtn", good, *common)
    assert result.exit_code == 0, result.output
    assert "(16 observations, overall " in result.output and "/512 steps agree)" in result.output
    tables = invoke("tables", "rtn", "--dist", evaluated, "--resamples", "500", "--out", tmp_path / "t")
    assert tables.exit_code == 0, tables.output
    served = [r for r in json.loads((tmp_path / "t" / "tables.json").read_text())["records"] if r["path"] == "served"]
    assert served and served[0]["n_obs"] == 16

    def bad(name: str, **arrays: np.ndarray) -> str:
        path = tmp_path / f"{name}.npz"
        np.savez(path, **{"reference": data["reference"], "candidate": data["candidate"],
                          "obs_ids": data["obs_ids"], **arrays})
        res = invoke("import-served", "rtn", path, *common)
        assert res.exit_code == 2 and res.output.count("\n") == 1, res.output
        return res.output

    assert "'candidate' [16, 32, 7]" in bad("shape", candidate=data["candidate"][..., :7])
    nan = data["candidate"].copy()
    nan[0, 0, 0] = np.nan
    assert "array 'candidate' holds NaN or Inf" in bad("nan", candidate=nan)
    assert "unknown observation ids [9999]" in bad("ids", obs_ids=np.r_[data["obs_ids"][:-1], 9999])
    assert "'sigma' must be 8 positive numbers" in bad("sigma", sigma=np.zeros(8))


def test_eval_and_tables_errors(evaluated: Path, tiny: Path, tmp_path: Path) -> None:
    result = invoke("tables", "rtn_hist", "--dist", evaluated)
    assert result.exit_code == 2 and "has no results" in result.output and "release eval rtn_hist" in result.output
    result = invoke("eval", "rtn_hist", "--dist", evaluated, "--source", tiny / "source")
    assert result.exit_code == 2 and "run 'release build rtn_hist' first" in result.output


def _computed(file: Path) -> dict[str, Any]:
    return dict(json.loads(str(np.load(file)["computed"])))


def test_results_record_how_they_were_computed(evaluated: Path, tiny: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Every results file records its device, torch and CUDA versions, kernel and GEMM shapes: results from the CPU
    and from a mocked GPU record (the device facts and kernel name monkeypatched, the arithmetic the emulation's)
    label their paths differently in tables.json and the card, and the shapes a tiny deployed eval ran appear in
    the card's bound sentence, counted against the shipped conformance table. An older file is refused."""
    import release.measure.evaluate as evaluate
    import release.quantize.load as load
    from release.core.conformance import MODELOPT, conformance
    from release.core.errors import ReleaseError
    from release.publish.card.i18n import Formatter, translations
    from release.publish.card.rows import fidelity_rows
    from release.publish.card.sections import paths_rows

    dist = tmp_path / "dist"
    shutil.copytree(evaluated, dist, ignore=shutil.ignore_patterns("tables"))
    cpu = _computed(dist / RTN / "results" / "deployed-validation.npz")
    assert (cpu["device"], cpu["torch"], cpu["cuda"], cpu["kernel"]) == ("cpu", torch.__version__, torch.version.cuda,
                                                                         "emulation")
    shapes = {tuple(s) for s in cpu["gemm_shapes"]}
    assert shapes and {k for _, _, k in shapes} == {64, 128}  # the tiny model's widths, M its token counts
    assert _computed(dist / RTN / "results" / "fakequant-validation.npz")["kernel"] is None  # no FP8 GEMM
    monkeypatch.setattr(evaluate, "machine", lambda: {"device": "NVIDIA H200", "torch": "2.11.0+cu130",
                                                      "cuda": "13.0"})
    monkeypatch.setattr(load, "EMULATION", MODELOPT)  # the kernel a GPU would record
    cache = tmp_path / "cache"  # the mocked rollouts stay out of the session's cache; the BF16 ones are reused
    shutil.copytree(os.environ["RELEASE_CACHE"], cache)
    monkeypatch.setenv("RELEASE_CACHE", str(cache))
    common = ["--dist", dist, "--source", tiny / "source", "--observations", tiny / "observations"]
    result = invoke("eval", "sq_auto", "--path", "deployed", "--split", "validation", *common)
    assert result.exit_code == 0, result.output
    result = invoke("tables", "--dist", dist, "--resamples", "200")
    assert result.exit_code == 0, result.output
    records = json.loads((dist / "tables" / "tables.json").read_text())["records"]
    deployed = {r["build"]: r for r in records if r["path"] == "deployed"}
    assert deployed["sq_auto"]["computed"]["device"] == "NVIDIA H200"
    assert deployed["rtn"]["computed"] == cpu
    for lang, labels in (("en", ("deployed, CPU emulation, held-out labs",
                                 "deployed, H200, ModelOpt FP8 GEMM, held-out labs")),
                         ("ko", ("배포, CPU 에뮬레이션, 홀드아웃 랩", "배포, H200, ModelOpt FP8 GEMM, 홀드아웃 랩"))):
        t = translations(lang).gettext
        rows = fidelity_rows([deployed["rtn"], deployed["sq_auto"]], Formatter(lang), t)
        assert (rows[0]["path"], rows[1]["path"]) == labels
    t = translations("en").gettext
    emulated = {tuple(s) for r in deployed.values() if r["computed"]["kernel"] == "emulation"
                for s in r["computed"]["gemm_shapes"]}
    exact, differ, unverified = conformance().sort(emulated)
    how = next(r["how"] for r in paths_rows(records, t) if r["path"] == t("deployed FP8 build (diffusers)"))
    assert f"checks the emulation's FP8 GEMM alone: {len(exact)} of the {len(emulated)} GEMM shapes (tokens x out x " \
           "in) it ran" in how
    assert "these rows estimate the error of FP8 rather than measure a deployment on a GPU" in how
    assert "ModelOpt's FP8 GEMM on H200 (torch 2.11.0+cu130, CUDA 13.0)" in how and "not verified" not in how
    assert exact and not differ and not unverified  # the tiny rollouts' shapes were recorded on the H200
    deployed["rtn"]["computed"]["gemm_shapes"].append([5, 48, 4096])  # a shape no GPU ran
    how = next(r["how"] for r in paths_rows(records, t) if r["path"] == t("deployed FP8 build (diffusers)"))
    assert "Not verified on a GPU: 5 x 48 x 4,096." in how and f"of the {len(emulated) + 1} GEMM" in how
    del deployed["rtn"]["computed"]
    with pytest.raises(ReleaseError, match=r"'rtn' \(validation\) do not record how they were computed"):
        paths_rows(records, t)
    older = dist / RTN / "results" / "deployed-validation.npz"
    np.savez(older, **{k: v for k, v in np.load(older).items() if k != "computed"})
    result = invoke("tables", "--dist", dist, "--resamples", "200")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"{older}: does not record how it was computed" in result.output and "rerun 'release eval'" in result.output


H200 = np.load(Path(__file__).parent / "data" / "h200_fp8_gemm.npz")  # made by bench/gpu_accum_record.py
GEMMS = sorted({k.split("/")[1] for k in H200.files if k.startswith("gemm/")})
MODULES = sorted({k.split("/")[1] for k in H200.files if k.startswith("module/")})


def _fp8(name: str) -> torch.Tensor:
    return torch.from_numpy(H200[name]).view(torch.float8_e4m3fn)


def _bf16(name: str) -> torch.Tensor:
    return torch.from_numpy(H200[name]).view(torch.bfloat16)


@pytest.mark.parametrize("shape", GEMMS)
def test_accumulation_equals_the_h200(shape: str) -> None:
    """The tensor-core model gives the H200's fp32 accumulator bit for bit; an exact fp32 matmul does not."""
    a, b = _fp8(f"gemm/{shape}/a"), _fp8(f"gemm/{shape}/b")
    h200 = torch.from_numpy(H200[f"gemm/{shape}/acc_fast"])
    assert torch.equal(hopper_accumulate(a, b), h200)
    assert (a.float() @ b.float().T != h200).float().mean() > 0.5


@pytest.mark.parametrize("shape", GEMMS)
def test_gemm_epilogue_equals_the_h200(shape: str) -> None:
    """Scales and bias as cuBLAS's epilogue applies them: bf16 outputs equal, with and without a bias."""
    a, b = _fp8(f"gemm/{shape}/a"), _fp8(f"gemm/{shape}/b")
    scale_a, scale_b = (torch.tensor(s) for s in H200[f"gemm/{shape}/scales"])
    bias = _bf16(f"gemm/{shape}/bias")
    plain = emulated_gemm(a, b, scale_a, scale_b, None, torch.bfloat16)
    biased = emulated_gemm(a, b, scale_a, scale_b, bias, torch.bfloat16)
    assert torch.equal(plain, _bf16(f"gemm/{shape}/bf16_fast"))
    assert torch.equal(biased, _bf16(f"gemm/{shape}/bf16_bias_fast"))


@pytest.mark.parametrize("name", MODULES)
def test_deployed_linear_equals_modelopt_gemm_on_the_h200(name: str) -> None:
    """A quantized Linear of the tiny RTN build, fed the bf16 input it got in a rollout on the H200: the emulated
    forward (input quantization, accumulation, epilogue) returns the bf16 output of ModelOpt's FP8 GEMM there."""
    amax_in, amax_w = (torch.tensor(v).to(torch.bfloat16) for v in H200[f"module/{name}/amax"])
    module = types.SimpleNamespace(input_quantizer=types.SimpleNamespace(amax=amax_in),
                                   weight_quantizer=types.SimpleNamespace(amax=amax_w),
                                   weight=_fp8(f"module/{name}/weight"), bias=None)
    out = per_tensor_forward(module, _bf16(f"module/{name}/input"))
    assert torch.equal(out, _bf16(f"module/{name}/output"))


SUBNORMAL = np.load(Path(__file__).parent / "data" / "h200_subnormal.npz")  # made by bench/gpu_subnormal_record.py
SUBNORMAL_CASES = sorted({k.rsplit("/", 1)[0] for k in SUBNORMAL.files if "/" in k})


@pytest.mark.parametrize("case", SUBNORMAL_CASES)
def test_accumulation_equals_the_h200_on_subnormal_codes(case: str) -> None:
    """Recorded on the H200: subnormal-heavy codes (and zeros beside large codes), mixed classes per row, a long K that
    cuBLAS split; the row-wise kernel's bf16 output with scales and bias."""
    a, b = (torch.from_numpy(SUBNORMAL[f"{case}/{x}"]).view(torch.float8_e4m3fn) for x in "ab")
    acc = hopper_accumulate(a, b)
    assert torch.equal(acc.view(torch.int32), torch.from_numpy(SUBNORMAL[f"{case}/acc"]))
    if case.startswith("splitk_"):  # the split is what makes it exact
        assert not torch.equal(hopper_accumulate(a, b, split=1), acc)
    if case.startswith("rowwise_"):
        sa, sb = (torch.from_numpy(SUBNORMAL[f"{case}/{s}"]) for s in ("sa", "sb"))
        bias = torch.from_numpy(SUBNORMAL[f"{case}/bias"]).view(torch.bfloat16)
        out = emulated_gemm(a, b, sa, sb, bias, torch.bfloat16)
        assert torch.equal(out.view(torch.int16), torch.from_numpy(SUBNORMAL[f"{case}/out"]))


def test_the_progress_names_the_path_and_build_not_the_cache_key() -> None:
    from release.measure.evaluate import COMPILED, shown

    assert shown("bf16") == "bf16" and shown(COMPILED) == "bf16-compile repeated-blocks"
    assert shown("fakequant:rtn:f1cc876f:c02a67cc:0.1.0:fp8-gemm-emulation/5") == "fakequant rtn"
    assert shown("deployed:external:nvidia-fp8:0123abcd:0.1.0:fp8-gemm-emulation/5") == "deployed external nvidia-fp8"
