"""What vLLM-Omni does with a delivered build, for the card's Use section: the checkpoint's side is read from the
build's own ``transformer/config.json`` (its ``quant_algo`` and the step policy stored under
``quantization_config.runtime.diffusion_step_policy``); vLLM-Omni's side is what its source says, read at
``VLLM_OMNI_COMMIT`` and not run (the GPU machine cannot install vLLM): at that commit
``vllm_omni/diffusion/models/cosmos3/mixed_precision/checkpoint.py`` applies the checkpoint's policy unless
``additional_config["cosmos3_mixed_precision"]`` is given, and ``config.py`` turns it off with ``enabled: false``
(README, "vLLM-Omni")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from release.core.config import ReleaseConfig, StepPolicy
from release.core.errors import ReleaseError
from release.core.io import read_json
from release.publish.card.i18n import _

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


def vllm_omni(folder: Path, release: ReleaseConfig, t: Any) -> str:
    """The card's paragraph on vLLM-Omni, or "" where the build has no exported transformer config to read."""
    path = folder / "transformer" / "config.json"
    if not path.is_file():
        return ""
    config = read_json(path, "transformer config", "release build")
    quantization = config.get("quantization_config")
    algo = quantization.get("quant_algo") if isinstance(quantization, dict) else None
    if not isinstance(quantization, dict) or not isinstance(algo, str):
        raise ReleaseError(f"{path}: no field 'quantization_config' with a 'quant_algo' (an FP8 build's, which "
                           "vLLM-Omni requires); run 'release build NAME' to rewrite the build")
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
