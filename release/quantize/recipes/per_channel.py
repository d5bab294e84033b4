"""The exploratory family: FP8 weights with one scale per output channel, activations quantized per token at run time
(ModelOpt's ``FP8_PER_CHANNEL_PER_TOKEN_CFG``).

After ``mtq.compress`` a Linear holds F8_E4M3 codes ``w / (rowmax / 448)`` with ``weight_quantizer._amax`` and
``_scale`` of shape (out, 1) and no input amax (the activation scale is computed per token at run time). ModelOpt
names the scheme ``quant_algo: FP8_PER_CHANNEL_PER_TOKEN`` with weight ``strategy: channel``. NVIDIA's policy server
cannot serve it: its ModelOpt checkpoint loader reads both scales as (1, 1) and installs a per-tensor kernel, so the
build files mark this family ``deliverable: false``.
"""

from __future__ import annotations

from typing import Any

from release.core.device import modelopt_imported

SCHEME = "fp8_per_channel_per_token"
QUANT_ALGO = "FP8_PER_CHANNEL_PER_TOKEN"
WEIGHT_CFG = {"num_bits": (4, 3), "axis": 0}
INPUT_CFG = {"num_bits": (4, 3), "axis": None, "type": "dynamic", "block_sizes": {-1: None}}
# Tensors of a per-tensor Linear that this scheme does not have (no static input scale).
ABSENT = ("input_scale", "input_quantizer._amax")
ROW_SCALED = ("weight_scale", "weight_quantizer._amax", "weight_quantizer._scale")


def config_groups() -> dict[str, Any]:
    """``config_groups`` as ModelOpt maps the scheme (its ``convert_hf_quant_config_format`` writes them for plain FP8
    only; the mapping of the other algorithms is its ``_quant_algo_to_group_config``)."""
    modelopt_imported()
    from modelopt.torch.export.convert_hf_config import _quant_algo_to_group_config

    return {"group_0": {**_quant_algo_to_group_config(QUANT_ALGO), "targets": ["Linear"]}}


def expected_headers(reference: dict[str, tuple[str, tuple[int, ...], str]]) -> dict[str, tuple[str, tuple[int, ...],
                                                                                             str]]:
    """A per-tensor reference's tensors as this scheme lays them out: each FP8 Linear's weight scales become (out, 1)
    and its static input scales are gone; everything else is unchanged."""
    expected = dict(reference)
    for key, (dtype, shape, file) in reference.items():
        if dtype != "F8_E4M3" or not key.endswith(".weight"):
            continue
        linear = key.removesuffix(".weight")
        for suffix in ROW_SCALED:
            if f"{linear}.{suffix}" in expected:
                scale_dtype = expected[f"{linear}.{suffix}"][0]
                expected[f"{linear}.{suffix}"] = (scale_dtype, (shape[0], 1), file)
        for suffix in ABSENT:
            expected.pop(f"{linear}.{suffix}", None)
    return expected


# ModelOpt state entries that this scheme sets differently from the per-tensor one, as fnmatch patterns over the
# flattened state (``release.check.verify``): the input quantizers' dynamic per-token settings (and no amax buffer), the
# weight quantizers' axis and (out, 1) amax, the compressed weights' (out, 1) scales, and the quantizer configuration.
STATE_DIFFERENCES = (
    "*.input_quantizer._dynamic", "*.input_quantizer._axis", "*.input_quantizer._block_sizes*",
    "*.input_quantizer._pytorch_state_metadata.buffers._amax.*", "*.weight_quantizer._axis",
    "*.weight_quantizer._pytorch_state_metadata.buffers._amax.shape", "*.real_quantizer_state.*._axis",
    "*.real_quantizer_state.*._pytorch_state_metadata.buffers._amax.shape",
    "*.real_quantizer_state.*._pytorch_state_metadata.buffers._scale.shape", "*.quantize.config.quant_cfg",
)
