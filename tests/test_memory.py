"""``--max-gpu-memory``: a capped run (here on the CPU, every decoder layer streamed from its CPU copy through
accelerate's hooks) builds and evaluates exactly what an uncapped one does."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from release.core import memory
from release.core.builds import load_build
from release.core.errors import ReleaseError
from release.inputs.source import SourceModel
from tests.conftest import ROOT, fewer_calls, invoke

BUILDS = ("rtn", "sq_auto_gptq")  # observers; smoothing + ModelOpt's GPTQ
# Above the tiny FP8 build (1.02 MB, placed whole as a server runs it) and below the BF16 transformer's 1.17 MB less
# the reserve: the BF16 model is streamed from CPU memory in every stage that runs it.
CAP = "1050KB"


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(small: Path, tmp_path_factory: pytest.TempPathFactory,
         monkeypatch_module: pytest.MonkeyPatch) -> dict[str, Path]:
    """The same builds and evals without a cap and with one, each with its own cache: {cap: dist}. On the 10 + 10
    observations of ``small``, with fewer calibration and algorithm calls than shipped (the comparison is of two
    ways of making the same builds)."""
    out = {}
    builds = tmp_path_factory.mktemp("cap-builds") / "builds"
    shutil.copytree(ROOT / "builds", builds)
    fewer_calls(builds, *BUILDS, "autoround_tuned")
    monkeypatch_module.setenv("RELEASE_BUILDS", str(builds))
    monkeypatch_module.setenv("SOURCE_DATE_EPOCH", "1700000000")
    for cap in ("none", CAP):
        base = tmp_path_factory.mktemp(f"cap-{cap}")
        monkeypatch_module.setenv("RELEASE_CACHE", str(base / "cache"))
        dist = base / "dist"
        limit = [] if cap == "none" else ["--max-gpu-memory", cap]
        src = ["--source", small / "source", "--observations", small / "observations"]
        result = invoke("build", *BUILDS, *src, "--out", dist, *limit)
        assert result.exit_code == 0, result.output
        for path in ("deployed", "fakequant"):
            result = invoke("eval", "rtn", "sq_auto_gptq", "--path", path, "--split", "validation", *src,
                            "--dist", dist, *limit)
            assert result.exit_code == 0, result.output
        out[cap] = dist
    memory.set_cap(None)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module() -> pytest.MonkeyPatch:
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_capped_builds_and_evals_equal_the_uncapped_bytes(runs: dict[str, Path]) -> None:
    free, capped = _files(runs["none"]), _files(runs[CAP])
    # the build folders, and where their source and observations are (release.inputs.source.remember_inputs)
    assert {p.split("/")[0] for p in free} == {load_build(b).repo for b in BUILDS} | {".release-inputs.json"}
    assert sorted(free) == sorted(capped)
    assert any("/results/" in p for p in free)
    assert [p for p in free if free[p] != capped[p]] == []  # shards, scales, ModelOpt state, provenance, results


def test_plan_keeps_the_small_parts_and_the_first_layers_within_the_budget(tiny: Path) -> None:
    model = SourceModel(tiny / "source").instantiate("cpu", bounded=False)
    layers = [memory._bytes(layer) for layer in model.layers]
    rest = memory._bytes(model) - sum(layers)
    limit = int((rest + layers[0] + layers[1] // 2) / (1 - memory.RESERVE))  # room for the first layer only
    plan = memory.plan(model, limit)
    assert {name: off for name, off in plan.items() if name.startswith("layers.")} == {"layers.0": False,
                                                                                      "layers.1": True}
    assert not any(off for name, off in plan.items() if not name.startswith("layers."))
    assert all(memory.plan(model, 1).values())  # nothing fits: everything streamed

def test_placed_model_streams_offloaded_layers_and_restores_them_whole(tiny: Path) -> None:
    source = SourceModel(tiny / "source")
    model = source.instantiate("cpu", bounded=False)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    memory.set_cap("64KiB")  # nothing fits
    try:
        with memory.placed(model, "cpu"):
            assert memory.is_placed(model)
            assert model.layers[0].mlp.down_proj.weight.device.type == "meta"  # not resident
            state = memory.state_dict(model)
            assert all(torch.equal(state[k], v) for k, v in before.items())
    finally:
        memory.set_cap(None)
    assert not memory.is_placed(model)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_a_deployed_build_larger_than_the_cap_is_refused_not_streamed(runs: dict[str, Path], small: Path,
                                                                     tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))  # nothing cached: the build is loaded
    result = invoke("eval", "rtn", "--path", "deployed", "--split", "validation", "--source", small / "source",
                    "--observations", small / "observations", "--dist", runs[CAP], "--max-gpu-memory", "64KiB")
    memory.set_cap(None)
    assert result.exit_code == 2, result.output
    assert "runs it whole" in result.output and "--max-gpu-memory" in result.output


def test_auto_round_tuning_under_a_cap_is_refused(runs: dict[str, Path], small: Path, tmp_path: Path) -> None:
    """auto-round's tuner refuses offloaded layers: the build says so before any output (the capture is cached)."""
    result = invoke("build", "autoround_tuned", "--source", small / "source", "--observations", small / "observations",
                    "--out", tmp_path / "dist", "--max-gpu-memory", CAP)
    memory.set_cap(None)
    assert result.exit_code == 2, result.output
    assert "builds/autoround_tuned.yaml" in result.output and "--max-gpu-memory" in result.output
    assert not (tmp_path / "dist" / load_build("autoround_tuned").repo).exists()


@pytest.mark.parametrize("size", ["22GiB", "24GB", "512MiB", "1024", "1.5GiB"])
def test_sizes_parse(size: str) -> None:
    assert memory.parse_size(size, "--max-gpu-memory") > 0


@pytest.mark.parametrize("size", ["lots", "22 GiBs", "-1GiB", "0", "GiB"])
def test_bad_sizes_are_refused(size: str) -> None:
    with pytest.raises(ReleaseError, match="--max-gpu-memory"):
        memory.parse_size(size, "--max-gpu-memory")


def test_bad_cap_option_and_env_exit_2_before_any_work(tiny: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    src = ["--source", tiny / "source", "--observations", tiny / "observations"]
    result = invoke("build", "rtn", *src, "--out", tmp_path / "dist", "--max-gpu-memory", "lots")
    assert result.exit_code == 2 and "--max-gpu-memory='lots'" in result.output
    monkeypatch.setenv(memory.CAP_ENV, "22 parsecs")
    result = invoke("eval", "rtn", "--dist", tmp_path / "dist", *src)
    assert result.exit_code == 2 and memory.CAP_ENV in result.output
    assert not (tmp_path / "dist").exists()
    monkeypatch.delenv(memory.CAP_ENV)
    memory.set_cap(None)



def test_a_build_holds_one_copy_of_the_model_at_a_time(tiny: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """No model is held twice. A rollout leaves the pipeline in reference cycles: with the collector off (it runs
    at times of its own choosing), the capture's BF16 transformer must still be gone when the builds start, or it
    holds its GPU memory beside theirs (28 GiB at the Nano's size). And the export's model takes over the recipe's
    tensors instead of copying them, leaving the recipe's on the meta device."""
    import gc
    import weakref

    from release.inputs import policy
    from release.quantize import build, export

    loaded: list[weakref.ref[torch.nn.Module]] = []
    load_pipeline = policy.load_pipeline

    def spy(*args: object, **kwargs: object) -> object:
        pipe = load_pipeline(*args, **kwargs)  # type: ignore[arg-type]
        loaded.append(weakref.ref(pipe.transformer))
        return pipe

    alive_at_load: list[bool] = []
    load_capture = build.CalibrationData.load

    def check(*args: object) -> object:
        alive_at_load.extend(ref() is not None for ref in loaded)
        return load_capture(*args)  # type: ignore[arg-type]

    shared: list[tuple[int, int, set[str]]] = []
    export_model = export._export_model

    def takes_over(quantized: Any, *args: object) -> object:
        before = {k: v.data_ptr() for k, v in quantized.model.state_dict().items()}
        model = export_model(quantized, *args)  # type: ignore[arg-type]
        after = {k: v.data_ptr() for k, v in model.state_dict().items() if k in before and k.endswith("weight")}
        shared.append((sum(before[k] == p for k, p in after.items()), len(after),
                       {p.device.type for p in quantized.model.parameters()}))
        return model

    monkeypatch.setattr(policy, "load_pipeline", spy)
    monkeypatch.setattr(build.CalibrationData, "load", check)
    monkeypatch.setattr(export, "_export_model", takes_over)
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    gc.disable()
    try:
        result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                        "--out", tmp_path / "dist")
    finally:
        gc.enable()
    assert result.exit_code == 0, result.output
    assert alive_at_load == [False]  # one capture pipeline, collected
    [(same, weights, devices)] = shared
    assert weights > 28 and same == weights and devices == {"meta"}


LEAK = """
import gc, sys, weakref
from release.core.device import modelopt_imported
class Held: pass
def caller(guarded):
    held = Held()  # a build's model, in the frame of the call that first imports ModelOpt
    if guarded:
        modelopt_imported()
    import modelopt.torch.quantization
    return weakref.ref(held)
ref = caller(sys.argv[1] == "guarded")
gc.collect()
print("alive" if ref() is not None else "freed")
"""


@pytest.mark.parametrize("how, held", [("plain", "alive"), ("guarded", "freed")])
def test_the_first_import_of_modelopt_keeps_nothing_of_its_caller(how: str, held: str) -> None:
    """The first ModelOpt import of a process, made plainly inside a function, keeps that function's locals alive
    for the process's life (pulp's cached import errors hold the frames: a campaign under a cap kept its first
    build's model on the GPU); made through ``modelopt_imported()``, it keeps nothing. Fresh processes: the first
    import is the one that counts."""
    out = subprocess.run([sys.executable, "-c", LEAK, how], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [held], out.stderr[-2000:]


FROZEN = """
import gc, sys, weakref
from release.check.verify import verify_builds
class Held: pass
before = len(gc.get_objects())  # torch imported, not diffusers
verify_builds([])  # a stage: it loads its libraries first, then freezes what the process holds
frozen = gc.get_freeze_count()
cycle = Held()
cycle.self = cycle  # made after: a pipeline that a rollout left in reference cycles
ref = weakref.ref(cycle)
del cycle
from release.core.device import free_memory, libraries_loaded
free_memory()
libraries_loaded()  # once a process: a second call freezes nothing more
print("diffusers" in sys.modules, frozen > 2 * before, len(gc.get_objects()) < frozen, ref() is None,
      gc.get_freeze_count() == frozen)
"""


def test_a_stage_freezes_its_libraries_out_of_the_collector_and_later_cycles_are_still_collected() -> None:
    """A full collection with diffusers and ModelOpt imported walked ~620,000 objects (0.35 s, 65 times in the tiny
    campaign): a stage imports diffusers' classes and freezes what the process holds first, so the collections walk
    only what came after, and a cycle made after is still collected. A fresh process: the freeze is once per
    process."""
    out = subprocess.run([sys.executable, "-c", FROZEN], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["True"] * 5, out.stderr[-2000:]
