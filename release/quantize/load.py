"""A build loaded back from its folder, three ways: as diffusers loads the exported checkpoint (ModelOpt's restore,
real FP8 weights), with the kernels a server runs on it (the deployed path), and as the seed's offline fake-quant
replay of its codes and scales on the source."""

from __future__ import annotations

import contextlib
import functools
import io
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

import release.inputs.policy  # noqa: F401  (sets diffusers up without progress bars)
from release.core import fp8
from release.core.config import BuildConfig
from release.core.device import compute_device
from release.core.errors import ReleaseError
from release.core.io import read_json
from release.core.memory import keep_whole
from release.quantize.export import SERVING_ONLY
from release.quantize.recipes import per_channel, quant_config, quantized_linears


@contextmanager
def _serving_keys_ignored() -> Iterator[None]:
    from diffusers import Cosmos3OmniTransformer

    before = Cosmos3OmniTransformer._keys_to_ignore_on_load_unexpected
    Cosmos3OmniTransformer._keys_to_ignore_on_load_unexpected = SERVING_ONLY
    try:
        yield
    finally:
        Cosmos3OmniTransformer._keys_to_ignore_on_load_unexpected = before


def load_build_transformer(build_dir: Path) -> torch.nn.Module:
    """A build's transformer through diffusers, with ModelOpt's restore enabled (real FP8 weights), to be placed on
    the GPU whole (:func:`release.core.memory.keep_whole`)."""
    import modelopt.torch.opt as mto
    from diffusers import Cosmos3OmniTransformer

    if not (build_dir / "transformer" / "modelopt_state.pth").is_file():
        raise ReleaseError(f"{build_dir}/transformer/modelopt_state.pth: missing; rebuild with 'release build'")
    with contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints what it patches and restores
        mto.enable_huggingface_checkpointing()
    with _serving_keys_ignored(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        model = Cosmos3OmniTransformer.from_pretrained(str(build_dir / "transformer"), dtype=torch.bfloat16)
    return keep_whole(model.eval())


def deployed_transformer(folder: Path, emulate: bool | None = None) -> torch.nn.Module:
    """The exported build through diffusers, its FP8 Linears running the kernel a server runs: per-tensor builds
    ModelOpt's FP8 GEMM on CUDA (``torch._scaled_mm`` with fast accumulation), per-channel builds a row-wise
    ``torch._scaled_mm`` with per-token input scales; or that arithmetic emulated exactly (``release.core.fp8``), by
    default where models run on the CPU (on a GPU, to show the two equal)."""
    model = load_build_transformer(folder)
    if emulate is None:
        emulate = compute_device() != "cuda"
    provenance = folder / "provenance.json"  # an external checkpoint has none: NVIDIA's per-tensor scheme
    rowwise = provenance.is_file() and read_json(provenance, "provenance", "release build").get("recipe", {}).get(
        "scheme") == per_channel.SCHEME
    for name in quantized_linears(model):
        module = model.get_submodule(name)
        if rowwise:
            module.forward = types.MethodType(functools.partial(fp8.rowwise_forward, emulate=emulate), module)
        elif emulate:
            module.forward = types.MethodType(fp8.per_tensor_forward, module)
    if not (emulate or rowwise):
        # ModelOpt 0.47 never imports its FP8 GEMM backend; importing it registers the kernel before the first call.
        import modelopt.torch.quantization.backends.fp8_per_tensor_gemm  # noqa: F401
    return model


def fakequant_transformer(source: Path, folder: Path, build: BuildConfig) -> torch.nn.Module:
    """The seed's offline replay: the build's own tensors (folded norms included), its FP8 weights dequantized
    (codes x scale, so a GPTQ or tuned build is replayed with its own codes), under ModelOpt fake quantization at
    the build's scales: the weights re-quantize to the same codes, the inputs are quantized per tensor at the
    build's static scales or per token (the per-channel scheme)."""
    import contextlib
    import io
    import warnings

    import modelopt.torch.quantization as mtq
    from diffusers import Cosmos3OmniTransformer
    from safetensors.torch import load_file

    model = Cosmos3OmniTransformer.from_pretrained(str(source / "transformer"), dtype=torch.bfloat16).eval()
    built: dict[str, torch.Tensor] = {}
    for shard in sorted((folder / "transformer").glob("*.safetensors")):
        built.update(load_file(shard))
    state = model.state_dict()
    for key in state:
        value = built[key]
        if value.dtype == torch.float8_e4m3fn:
            value = fp8.dequantize(value, built[f"{key.removesuffix('.weight')}.weight_quantizer._scale"])
        state[key] = value.to(state[key].dtype)
    model.load_state_dict(state)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        mtq.quantize(model, quant_config(build), forward_loop=None)
    for name in quantized_linears(model):
        module: Any = model.get_submodule(name)
        module.weight_quantizer.amax = built[f"{name}.weight_quantizer._amax"]
        if f"{name}.input_quantizer._amax" in built:
            module.input_quantizer.amax = built[f"{name}.input_quantizer._amax"]
    return model
