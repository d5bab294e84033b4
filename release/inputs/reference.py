"""The tiny fixture's reference FP8 checkpoint, made by ModelOpt's own Hugging Face export.

``release fixture tiny`` writes ``reference/`` beside ``source/``: the source's transformer quantized with ModelOpt's
FP8 per-tensor recipe (``mtq.FP8_DEFAULT_CFG``, max calibration) and written by
``modelopt.torch.export.export_hf_checkpoint``, not by this tool's export (:mod:`release.quantize.export`). The demo's
verification compares its builds with it, so that its layout checks compare against something this tool did not
write. Its ``provenance.json`` says how it was made (``made_by``); :mod:`release.check.layout` reads it.

ModelOpt's diffusers export cannot give NVIDIA's Cosmos3-Nano@fp8 layout exactly. What it writes differently, and the
documented transformations that complete its folder as a repo, are :data:`DIFFERENCES` and :data:`TRANSFORMATIONS`;
the layout checks tolerate exactly the former and list them in their details.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from release.core.device import modelopt_imported
from release.core.io import canonical_modelopt_state, write_json

REFERENCE_DIR = "reference"  # beside the fixture's source/ and observations/
MADE_BY = "modelopt.torch.export.export_hf_checkpoint"
# NVIDIA keeps these Linears in BF16 (domain notes §2); FP8_DEFAULT_CFG would quantize them (lm_head and proj_out it
# already leaves out).
KEPT_BF16 = ("*proj_in*", "*time_embedder*")
CALIBRATION_OBSERVATIONS = 1  # BF16 policy rollouts the reference is max-calibrated on (8 calls; a build: 256 of 32)
# The ModelOpt buffers NVIDIA's layout keeps per quantized Linear for diffusers' loader; ModelOpt's HF export removes
# the quantizers from the state dict (hide_quantizers_from_state_dict) and writes only weight_scale and input_scale.
QUANTIZER_BUFFERS = ("weight_quantizer._amax", "weight_quantizer._scale", "input_quantizer._amax")
# The fields of quantization_config that diffusers' NVIDIAModelOptConfig reads and the step policy; ModelOpt's export
# writes only its own (quant_method, quant_algo, config_groups, ignore, producer).
DIFFUSERS_FIELDS = ("quant_type", "modelopt_config", "runtime")
NO_BUFFERS = ("tensors: ModelOpt's export has no quantizer buffers (" + ", ".join(QUANTIZER_BUFFERS) + ") per "
              "quantized Linear")
NO_DIFFUSERS_FIELDS = ("quantization_config and hf_quant_config.json: ModelOpt's export has none of "
                       + ", ".join(DIFFUSERS_FIELDS))
WILDCARD_IGNORE = ("quantization_config and hf_quant_config.json: ModelOpt's export writes its ignore list with "
                   "wildcards (time_embedder*, action_proj_in*), the build the modules' names (the modules each list "
                   "covers are compared)")
DEFAULT_LIST = ("modelopt_state.pth: the quantizer configuration is ModelOpt's FP8_DEFAULT_CFG list, not the build's "
                "own list, which also sets the FP8 format on quantizers it then disables (the configuration of every "
                "enabled quantizer is compared)")
DIFFERENCES = (NO_BUFFERS, NO_DIFFUSERS_FIELDS, WILDCARD_IGNORE, DEFAULT_LIST)
TRANSFORMATIONS = (
    "transformer/ is export_hf_checkpoint's output, sharded like the source",
    "the other components and the root config.json are the source's files (the exporter writes the component it is "
    "given)",
    "model.safetensors.index.json maps the exporter's transformer shards, as in NVIDIA's layout",
    "hf_quant_config.json is the exporter's quantization_config (ModelOpt's diffusers export writes none)",
    "modelopt_state.pth and transformer/modelopt_state.pth are mto.modelopt_state of the calibrated model after "
    "mtq.compress, taken before the export converts its weights (ModelOpt's diffusers export ignores "
    "save_modelopt_state)",
)


def reference_config() -> dict[str, Any]:
    """ModelOpt's FP8 per-tensor configuration, with NVIDIA's BF16 Linears left out."""
    modelopt_imported()
    import modelopt.torch.quantization as mtq

    config: dict[str, Any] = copy.deepcopy(mtq.FP8_DEFAULT_CFG)
    config["quant_cfg"] = [*config["quant_cfg"], *({"quantizer_name": p, "enable": False} for p in KEPT_BF16)]
    return config


def write_reference(out: Path, source: Path, observations: Path, generator: str, revision: str) -> None:
    """Quantize ``source``'s transformer with :func:`reference_config`, max-calibrated on the BF16 policy's rollouts of
    the first calibration observations, and write it with ModelOpt's exporter into ``out`` laid out as a repo."""
    modelopt_imported()
    import modelopt
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    from modelopt.torch.export import export_hf_checkpoint

    from release.core.builds import load_release
    from release.inputs.observations import load_observations, split
    from release.inputs.policy import load_pipeline, rollout

    release = load_release()
    pipe = load_pipeline(source, release.policy)
    calibration = split(load_observations(observations), release.calibration_labs)[:CALIBRATION_OBSERVATIONS]
    shard = max(p.stat().st_size for p in (source / "transformer").glob("*.safetensors"))
    calls: list[int] = []
    counting = pipe.transformer.register_forward_pre_hook(lambda *_: calls.append(1))
    quiet = contextlib.redirect_stdout(io.StringIO())  # ModelOpt prints every quantizer and component
    with warnings.catch_warnings(), quiet, torch.no_grad():
        warnings.simplefilter("ignore")
        mtq.quantize(pipe.transformer, reference_config(),
                     forward_loop=lambda _: [rollout(pipe, o, release.policy) for o in calibration])
        counting.remove()
        compressed = copy.deepcopy(pipe.transformer)  # the exporter converts the weights in place
        mtq.compress(compressed)
        state = canonical_modelopt_state(mto.modelopt_state(compressed))  # the same pickle in every process
        export_hf_checkpoint(pipe.transformer, export_dir=out / "transformer", max_shard_size=shard)
    torch.save(state, out / "transformer" / "modelopt_state.pth")
    torch.save(state, out / "modelopt_state.pth")
    for item in sorted(source.iterdir()):
        if item.is_dir() and item.name != "transformer":
            shutil.copytree(item, out / item.name)
        elif item.is_file() and item.name not in ("model.safetensors.index.json", "fixture.json"):
            shutil.copy2(item, out / item.name)
    tindex = json.loads((out / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    write_json(out / "model.safetensors.index.json", {
        "metadata": tindex.get("metadata", {}),
        "weight_map": {k: f"transformer/{v}" for k, v in sorted(tindex["weight_map"].items())}})
    qconfig = json.loads((out / "transformer" / "config.json").read_text())["quantization_config"]
    write_json(out / "hf_quant_config.json", qconfig)
    write_json(out / "provenance.json", {
        "made_by": MADE_BY, "generator": generator,
        "recipe": {"config": "mtq.FP8_DEFAULT_CFG", "left_out": list(KEPT_BF16), "algorithm": "max"},
        "calibration": {"observations": len(calibration), "calls": len(calls),
                        "labs": sorted({o.lab for o in calibration})},
        "source": {"revision": revision},
        "versions": {"modelopt": modelopt.__version__, "torch": torch.__version__},
        "transformations": list(TRANSFORMATIONS), "differences": list(DIFFERENCES)})
