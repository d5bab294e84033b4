"""The step policy a user gets is the one evaluated (issue 46). ``release eval`` records what each step ran; the card
states it per path, prints the diffusers setting in its Use code and says what diffusers runs with and without it.
Run as a user runs it (from the local Hub server, an empty cache, a fresh interpreter), hooks on every restored
ModelOpt Linear tell, call by call and step by step, whether its input was quantized (W8A8: ModelOpt's own forward)
or not (W8A16: diffusers' dequantized BF16 matmul): the printed setting must run the recorded steps, and diffusers'
default what the card says it runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from release.core.builds import load_release
from release.core.config import StepPolicy
from release.core.errors import ReleaseError
from release.measure.tables import read_computed
from release.publish.card.i18n import translations
from release.publish.card.labels import steps_text
from release.publish.card.serving import serving
from tests.conftest import invoke
from tests.hub_server import FakeHub
from tests.test_use_code import RTN, run_as_a_user, use_code

pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub

# After the card's code, in the same interpreter: three rollouts of one observation, diffusers' default and the
# printed ``step_policy`` at the policy's steps, and the default at 8 steps (where the stored 3 + 3 leave steps 4 and
# 5 between); per step, the modes that the generation Linears and the reasoner's ran (diffusers names the two). A
# W8A16 call is diffusers' ``_w8a16_linear``; a W8A8 call is ModelOpt's restored forward dispatching to a real-quant
# GEMM of its registry, which the card's code must fill with ModelOpt's FP8 GEMM. That one runs on CUDA only: on a
# CPU the deployed path's emulation of it (release.core.fp8) is registered beside it, and NVTX ranges are no-ops.
CHECKS = """
import contextlib as _contextlib
import json as _json
import sys as _sys
import torch as _torch
from pathlib import Path as _Path
import diffusers.pipelines.cosmos.mixed_precision as _mixed
from modelopt.torch.quantization.backends import gemm_registry as _registry
from modelopt.torch.quantization.nn import QuantModule as _QuantModule
from release.core.builds import load_release as _load_release
from release.core.fp8 import per_tensor_forward as _emulated
from release.inputs.observations import load_observations as _load_observations
from release.inputs.policy import load_pipeline as _load_pipeline, rollout as _rollout

_fp8 = _sys.modules.get("modelopt.torch.quantization.backends.fp8_per_tensor_gemm")
assert _fp8 is not None and any(e["gemm_func"] == _fp8.Fp8PerTensorLinear.apply for e in _registry._registry), \
    "the card's code does not register ModelOpt's FP8 GEMM"
if not _torch.cuda.is_available():
    _torch.cuda.nvtx.range = lambda *a, **k: _contextlib.nullcontext()
    _registry.register(lambda module, x, weight, bias, *a, **k: _emulated(module, x),
                       lambda module, x, args, kwargs: x.device.type == "cpu")
_ran, _mode, _step = [], {}, [0]
for _entry in _registry._registry:
    def _gemm(module, *args, __gemm=_entry["gemm_func"], **kwargs):
        _mode[module] = "W8A8"
        return __gemm(module, *args, **kwargs)
    _entry["gemm_func"] = _gemm
_w8a16 = _mixed._w8a16_linear
def _dense(layer, inputs, name):
    _mode[layer] = "W8A16"
    return _w8a16(layer, inputs, name)
_mixed._w8a16_linear = _dense
_linears = {n: m for n, m in transformer.named_modules() if isinstance(m, _QuantModule)
            and isinstance(m, _torch.nn.Linear) and _mixed._classify_cosmos3_linear(n) is not None}
assert _linears, "no restored ModelOpt Linear of either path"
for _n, _m in _linears.items():
    _m.register_forward_pre_hook(lambda m, a: _mode.pop(m, None))
    _m.register_forward_hook(lambda m, a, o, n=_n: _ran.append((_step[0], _mixed._classify_cosmos3_linear(n),
                                                                _mode.pop(m))))


def _next(_pipe, i, _t, _tensors):
    _step[0] = i + 1
    return {}


_settings = _load_release().policy
_pipe = _load_pipeline(_Path(path), _settings, transformer=transformer)
_observation = _load_observations(_Path(OBSERVATIONS))[0]
_seen = {}
for _name, _kwargs, _steps in (("default", {}, _settings.steps), ("printed", step_policy, _settings.steps),
                               ("default8", {}, 8)):
    _ran.clear()
    _step[0] = 0
    _rollout(_pipe, _observation, _settings.model_copy(update={"steps": _steps}), callback_on_step_end=_next,
             **_kwargs)
    _seen[_name] = [{p: sorted({m for s, q, m in _ran if s == i and q == p}) for p in ("generation", "reasoner")}
                    for i in range(_steps)]
print("STEP-MODES " + _json.dumps(_seen))
"""


def _one_heldout_lab(builds: Path) -> None:
    """The validation split narrowed to one lab (4 observations), for speed."""
    path = builds / "release.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["heldout_labs"] = ["RPL"]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


@pytest.fixture
def evaluated(rtn_build: Path, tiny: Path, builds: Path, tmp_path: Path) -> Path:
    """The RTN build evaluated on the fake-quant and deployed paths (held-out labs), its tables and its cards."""
    _one_heldout_lab(builds)
    dist = tmp_path / "dist"
    shutil.copytree(rtn_build, dist / RTN)
    shutil.rmtree(dist / RTN / "results", ignore_errors=True)  # what other tests evaluated
    common: list[str | Path] = ["--dist", dist, "--source", tiny / "source", "--observations", tiny / "observations"]
    commands: list[list[str | Path]] = [["eval", "rtn", "--path", path, "--split", "validation", *common]
                                        for path in ("fakequant", "deployed")]
    commands += [["tables", "--dist", dist, "--resamples", "200"], ["card", "rtn", "--dist", dist]]
    for command in commands:
        result = invoke(*command)
        assert result.exit_code == 0, result.output
    return dist


def _modes(steps: list[str]) -> list[dict[str, list[str]]]:
    """Every Linear of both paths in each step's mode: what a recorded step means."""
    return [{"generation": [m], "reasoner": [m]} for m in steps]


def test_the_printed_setting_runs_the_evaluated_steps_and_the_default_what_the_card_says(
        evaluated: Path, hub: FakeHub, tiny: Path, tmp_path: Path) -> None:
    release = load_release()
    recorded = {p: read_computed(evaluated / RTN / "results" / f"{p}-validation.npz")["steps"]
                for p in ("fakequant", "deployed")}
    assert recorded == {"fakequant": ["W8A8"] * 4, "deployed": ["W8A8"] * 4}  # diffusers' policy off, every step
    pushed = invoke("push", "rtn", "--dist", evaluated, "--endpoint", hub.url)
    assert pushed.exit_code == 0, pushed.output
    files = hub.files(f"np-cr/{RTN}")
    readme, korean = files["README.md"].decode(), files["README.ko.md"].decode()
    en, ko = translations("en").gettext, translations("ko").gettext
    for t, card in ((en, readme), (ko, korean)):  # the evaluated steps, per path, in both languages
        assert f"{t('fake quant')}: {steps_text(recorded['fakequant'], t)}; " \
               f"{t('deployed')}: {steps_text(recorded['deployed'], t)}." in card
    code = use_code(readme)
    assert 'step_policy = {"mixed_precision_format": "none"}' in code
    done = run_as_a_user(code, hub, tiny, tmp_path / "hf_home", CHECKS)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    seen: dict[str, Any] = json.loads(done.stdout.split("STEP-MODES ", 1)[1])
    assert seen["printed"] == _modes(recorded["deployed"])  # the printed setting: the evaluated policy
    # diffusers' default: the stored first_last_n (3 + 3) makes all 4 steps W8A16, as the card says
    assert seen["default"] == _modes(["W8A16"] * 4)
    assert f"runs {steps_text(recorded['deployed'], en)}. " in readme
    assert "W8A16 on the first 3 and the last 3 steps, and runs W8A16 on all 4 steps." in readme
    # at 8 steps the stored policy leaves steps 4 and 5 W8A8 for the generation Linears, not the reasoner's
    generation = [m for [m] in (s["generation"] for s in seen["default8"])]
    reasoner = [m for [m] in (s["reasoner"] for s in seen["default8"])]
    assert generation == [StepPolicy(w8a16_first_steps=3, w8a16_last_steps=3).mode(i, 8) for i in range(8)]
    assert reasoner == ["W8A16"] * 8
    eight = release.model_copy(update={"policy": release.policy.model_copy(update={"steps": 8})})
    text = serving(evaluated / RTN, eight, [], "rtn", True, en).diffusers
    assert f"and runs {steps_text(generation, en)} (the reasoner's Linears: {steps_text(reasoner, en)})." in text


def _record(path: str, split: str, steps: list[str] | None) -> dict[str, Any]:
    return {"build": "rtn", "path": path, "split": split, "computed": {} if steps is None else {"steps": steps}}


def test_results_that_ran_other_steps_than_the_card_prints_are_refused(tmp_path: Path) -> None:
    """The card's settings come from the release and the evaluation's own diffusers arguments; results recording
    other steps would make them wrong: refused, naming the results. Results recording none are said to."""
    release = load_release()
    en = translations("en").gettext
    served = [_record("served", "validation", ["W8A16", "W8A8", "W8A8", "W8A16"])]
    with pytest.raises(ReleaseError, match=r"the served results of 'rtn' \(validation\) ran W8A16 on steps 1, 4, "
                                           r"W8A8 on steps 2, 3, but release.yaml's served_steps"):
        serving(tmp_path, release, served, "rtn", True, en)
    one = release.model_copy(update={"served_steps": StepPolicy(w8a16_first_steps=1, w8a16_last_steps=1)})
    assert serving(tmp_path, one, served, "rtn", True, en).evaluated.endswith(
        "records them: served: W8A16 on steps 1, 4, W8A8 on steps 2, 3.")
    deployed = [_record("deployed", "all", ["W8A16"] * 4)]
    with pytest.raises(ReleaseError, match=r"deployed results of 'rtn' \(all\) ran W8A16 on all 4 steps, but the "
                                           r"diffusers setting \{\"mixed_precision_format\": \"none\"\}"):
        serving(tmp_path, release, deployed, "rtn", True, en)
    assert serving(tmp_path, release, deployed, "rtn", False, en).setting == ""  # not delivered: nothing printed
    mixed = [_record("fakequant", "calibration", ["W8A8"] * 4), _record("fakequant", "validation", None),
             _record("served", "all", None)]
    text = serving(tmp_path, release, mixed, "rtn", True, en)
    assert text.evaluated.endswith("fake quant, calibration labs: W8A8 on all 4 steps; fake quant, held-out labs: "
                                   "not recorded; served: not recorded.")
    assert "That is the step policy the results of these paths record: fake quant. The second import" in text.diffusers
