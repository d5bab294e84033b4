"""What vLLM-Omni does with a delivered build, for the card's Use section: the checkpoint's side is read from the
build's own ``transformer/config.json`` (its ``quant_algo`` and the step policy stored under
``quantization_config.runtime.diffusion_step_policy``); vLLM-Omni's side is what its source says, read at
``VLLM_OMNI_COMMIT`` and not run (the GPU machine cannot install vLLM): at that commit
``vllm_omni/diffusion/models/cosmos3/mixed_precision/checkpoint.py`` applies the checkpoint's policy unless
``additional_config["cosmos3_mixed_precision"]`` is given, and ``config.py`` turns it off with ``enabled: false``
(README, "vLLM-Omni").

The step policy of the Use section (:func:`serving`): what each evaluated path ran, as its results record it; the
diffusers setting printed, the one the fake-quant and deployed evaluations pass to the pipeline
(``release.core.config.NATIVE_STEPS``), and what diffusers runs with and without it, read with diffusers' own
schedule (``Cosmos3MixedPrecisionConfig``) from the build's ``quantization_config``. A result that ran other steps
than the card prints for its runtime is refused: the printed setting would not reproduce it. The Use code imports
ModelOpt's ``fp8_per_tensor_gemm``, which registers its FP8 GEMM (ModelOpt 0.47 never imports it): without it each
restored FP8 Linear's W8A8 forward raises ModelOpt's "self._dequantize is True and self.fake_quant is False", and
with it runs ``Fp8PerTensorLinear`` (seen on an H200, torch 2.11.0+cu130, with the tiny RTN build)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from release.core.config import NATIVE_STEPS, ReleaseConfig, StepPolicy
from release.core.errors import ReleaseError
from release.core.io import read_json
from release.publish.card.i18n import _
from release.publish.card.labels import PATH_SHORT, SPLIT_SHORT, steps_text

VLLM_OMNI_COMMIT = "7a53128c"


def _stored_policy(path: Path, quantization: dict[str, Any]) -> StepPolicy | None:
    """The first/last W8A16 counts of the ``first_last_n`` policy stored in a ``quantization_config``, None where it
    stores none; any other policy is a one-line error naming the file (vLLM-Omni refuses it too)."""
    runtime = quantization.get("runtime")
    policy = runtime.get("diffusion_step_policy") if isinstance(runtime, dict) else None
    if policy is None:
        return None
    try:
        if policy["type"] != "first_last_n":
            raise TypeError
        return StepPolicy(w8a16_first_steps=policy["first_steps"]["count"],
                          w8a16_last_steps=policy["last_steps"]["count"])
    except (KeyError, TypeError, ValidationError) as exc:
        raise ReleaseError(f"{path}: field 'quantization_config.runtime.diffusion_step_policy' is not a first_last_n "
                           "policy with first_steps.count and last_steps.count; run 'release build NAME' to rewrite "
                           "the build") from exc


def _quantization(folder: Path) -> tuple[Path, dict[str, Any]] | None:
    """The build's ``transformer/config.json`` and its ``quantization_config``, None where it has no exported
    transformer config to read."""
    path = folder / "transformer" / "config.json"
    if not path.is_file():
        return None
    config = read_json(path, "transformer config", "release build")
    quantization = config.get("quantization_config")
    if not isinstance(quantization, dict) or not isinstance(quantization.get("quant_algo"), str):
        raise ReleaseError(f"{path}: no field 'quantization_config' with a 'quant_algo' (an FP8 build's, which "
                           "diffusers and vLLM-Omni require); run 'release build NAME' to rewrite the build")
    return path, quantization


def vllm_omni(folder: Path, release: ReleaseConfig, t: Any) -> str:
    """The card's paragraph on vLLM-Omni, or "" where the build has no exported transformer config to read."""
    found = _quantization(folder)
    if found is None:
        return ""
    path, quantization = found
    algo = quantization["quant_algo"]
    steps, served = release.policy.steps, release.served_steps
    stored = _stored_policy(path, quantization)
    text = t(_("vLLM-Omni was not run with this build. By its source (vllm-project/vllm-omni at commit {commit}), it "
               "serves this policy over its OpenPI endpoint `/v1/realtime/robot/openpi`, reads this checkpoint's "
               "`quant_algo` {algo} with each Linear's `weight_scale` and `input_scale` as static per-tensor FP8, "
               "and applies the step policy stored in `transformer/config.json` unless `--additional-config` sets "
               "another.")).format(commit=VLLM_OMNI_COMMIT, algo=algo)
    if stored is None:
        return text + " " + t(_("This checkpoint stores no step policy, so every step runs W8A8 there."))
    w8a16 = sum(stored.mode(i, steps) == "W8A16" for i in range(steps))
    text += " " + t(_("This checkpoint stores W8A16 on the first {first} and the last {last} steps: {n} of this "
                      "policy's {steps} steps.")).format(first=stored.w8a16_first_steps,
                                                        last=stored.w8a16_last_steps, n=w8a16, steps=steps)
    if all(stored.mode(i, steps) == served.mode(i, steps) for i in range(steps)):
        return text
    fields: dict[str, Any] = {"enabled": False} if all(served.mode(i, steps) == "W8A8" for i in range(steps)) else \
        {"first_steps": served.w8a16_first_steps, "last_steps": served.w8a16_last_steps}
    option = json.dumps({"cosmos3_mixed_precision": fields})
    return text + " " + t(_("For the step policy above, pass `--additional-config '{option}'`.")).format(option=option)


PATHS = ("fakequant", "deployed", "served")  # the evaluated paths, in the card's order
DIFFUSERS_PATHS = ("fakequant", "deployed")  # rolled out through diffusers' pipeline with the diffusers setting


@dataclass(frozen=True)
class Serving:
    """The Use section's step policy and runtimes: what the results record, the diffusers setting (a Python dict
    literal) with what diffusers runs with and without it, and the vLLM-Omni paragraph; "" for what a build that is
    not delivered does not print."""

    evaluated: str
    setting: str = ""
    diffusers: str = ""
    vllm_omni: str = ""


def _schedule(path: Path, quantization: dict[str, Any], **kwargs: Any) -> Any:
    """diffusers' own step schedule (``Cosmos3MixedPrecisionConfig``) for a transformer of this
    ``quantization_config`` in a pipeline called with ``kwargs`` (its ``mixed_precision_*`` arguments); a stored
    policy diffusers refuses is a one-line error naming ``path``."""
    from diffusers.pipelines.cosmos.mixed_precision import Cosmos3MixedPrecisionConfig

    try:
        return Cosmos3MixedPrecisionConfig.resolve(quantization_config=quantization, **kwargs)
    except (ValueError, TypeError) as exc:
        raise ReleaseError(f"{path}: diffusers refuses its step policy ({str(exc).splitlines()[0]}); run 'release "
                           "build NAME' to rewrite the build") from exc


def _diffusers_steps(schedule: Any, steps: int) -> tuple[list[str], list[str]]:
    """Each step's mode of the generation Linears and of the reasoner's under diffusers' ``schedule``: with the
    policy off every step runs the checkpoint's own forward, W8A8; with it on, the reasoner runs one mode on every
    step (the stored ``reasoner: a16``: W8A16)."""
    if not schedule.enabled:
        return ["W8A8"] * steps, ["W8A8"] * steps
    reasoner = "W8A16" if schedule.reasoner_policy == "high_precision" else "W8A8"
    return [schedule.precision_name(i, steps) for i in range(steps)], [reasoner] * steps


def recorded_steps(records: list[dict[str, Any]]) -> dict[str, dict[str, list[str] | None]]:
    """Path -> split -> each step's mode as its results record it (``computed.steps``), None where they record
    none (imported from a policy server, or written by an older release eval)."""
    out: dict[str, dict[str, list[str] | None]] = {}
    for r in sorted((r for r in records if r["path"] in PATHS), key=lambda r: PATHS.index(r["path"])):
        steps = (r.get("computed") or {}).get("steps")
        out.setdefault(r["path"], {})[r["split"]] = list(steps) if steps else None
    return out


def _evaluated(recorded: dict[str, dict[str, list[str] | None]], t: Any) -> str:
    def shown(steps: list[str] | None) -> str:
        return steps_text(steps, t) if steps else str(t(_("not recorded")))

    parts = []
    for path, splits in recorded.items():
        texts = {split: shown(steps) for split, steps in splits.items()}
        if len(set(texts.values())) == 1:
            parts.append(f"{t(PATH_SHORT[path])}: {next(iter(texts.values()))}")
        else:
            parts += [f"{t(PATH_SHORT[path])}, {t(SPLIT_SHORT[split])}: {text}" for split, text in texts.items()]
    return str(t(_("This build's results were computed under these step policies, as each results file records "
                   "them: {paths}.")).format(paths="; ".join(parts)))


def _check(recorded: dict[str, dict[str, list[str] | None]], paths: tuple[str, ...], expected: list[str],
           build: str, printed: str, other: str = "") -> list[str]:
    """The ``paths`` whose results record steps, all of which must have run ``expected`` (what the card's ``printed``
    setting runs); any other is a one-line error naming the results, with ``other`` fix."""
    same = []
    for path in (p for p in paths if p in recorded):
        for split, steps in recorded[path].items():
            if steps is not None and steps != expected:
                raise ReleaseError(
                    f"tables.json: the {path} results of {build!r} ({split}) ran {steps_text(steps, str)}, but "
                    f"{printed}, which the card prints, runs {steps_text(expected, str)}; rerun 'release eval "
                    f"{build} --path {path} --split {split}' and 'release tables' under it{other}")
        if any(steps is not None for steps in recorded[path].values()):
            same.append(path)
    return same


def serving(folder: Path, release: ReleaseConfig, records: list[dict[str, Any]], build: str, deliverable: bool,
            t: Any) -> Serving:
    """The Use section's step policy from the build's ``records`` (tables.json) and its folder: for a build that is
    not delivered, what its evaluation ran alone."""
    recorded = recorded_steps(records)
    evaluated = _evaluated(recorded, t)
    if not deliverable:
        return Serving(evaluated)
    steps = release.policy.steps
    _check(recorded, ("served",), [release.served_steps.mode(i, steps) for i in range(steps)], build,
           "release.yaml's served_steps (the policy server's and vLLM-Omni's setting)",
           ", or set served_steps to the steps evaluated")
    found = _quantization(folder)
    path, quantization = found or (folder, {"quant_algo": "FP8"})  # without a config: the setting's own effect
    setting = json.dumps(NATIVE_STEPS)
    generation, reasoner = _diffusers_steps(_schedule(path, quantization, **NATIVE_STEPS), steps)
    same = _check(recorded, DIFFUSERS_PATHS, generation, build, f"the diffusers setting {setting}")
    text = t(_("Pass `step_policy` to every call of the pipeline that runs this transformer, as `pipe(..., "
               "**step_policy)`: by diffusers' step schedule (`diffusers/pipelines/cosmos/mixed_precision.py`) it "
               "then runs {modes}.")).format(modes=_modes(generation, reasoner, t))
    if same:
        text += " " + t(_("That is the step policy the results of these paths record: {paths}.")).format(
            paths=", ".join(t(PATH_SHORT[p]) for p in same))
    if found is not None:
        text += " " + _default(_schedule(path, quantization), steps, t)
    text += " " + t(_("The second import registers ModelOpt's FP8 GEMM, which runs the W8A8 steps: ModelOpt does not "
                      "import it itself, and without it a restored Linear's W8A8 forward fails."))
    return Serving(evaluated, setting, text, vllm_omni(folder, release, t))


def _modes(generation: list[str], reasoner: list[str], t: Any) -> str:
    if generation == reasoner:
        return steps_text(generation, t)
    return str(t(_("{generation} (the reasoner's Linears: {reasoner})")).format(
        generation=steps_text(generation, t), reasoner=steps_text(reasoner, t)))


def _default(schedule: Any, steps: int, t: Any) -> str:
    """What diffusers runs called without the setting (``schedule``): the step policy stored in
    ``transformer/config.json``."""
    if not schedule.enabled:
        return str(t(_("Called without `step_policy`, diffusers runs the same: `transformer/config.json` stores no "
                       "step policy.")))
    return str(t(_("Called without `step_policy`, diffusers applies the step policy stored in "
                   "`transformer/config.json`, W8A16 on the first {first} and the last {last} steps, and runs "
                   "{modes}.")).format(first=schedule.first_steps, last=schedule.last_steps,
                                        modes=_modes(*_diffusers_steps(schedule, steps), t)))
