"""ModelOpt FP8 quantization of the transformer and its export in NVIDIA's Cosmos3-Nano@fp8 layout.

What diffusers loads (domain notes §3, §9): per quantized Linear an F8_E4M3 ``weight`` with the ModelOpt buffers
``weight_quantizer._amax``, ``weight_quantizer._scale`` and ``input_quantizer._amax``, plus the F32 ``weight_scale``
and ``input_scale`` that vLLM and TensorRT-LLM read; a ``quantization_config`` in ``transformer/config.json``
(``quant_method: modelopt`` with a ``modelopt_config``, and NVIDIA's fields); the root ``hf_quant_config.json``; and
``modelopt_state.pth`` of the *compressed* model, which ``mto.enable_huggingface_checkpointing()`` restores before
the weights are loaded.
"""

from __future__ import annotations

import contextlib
import copy
import fnmatch
import io
import json
import shutil
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import release.policy  # noqa: F401  (sets diffusers up without progress bars)
from release import ReleaseError
from release.config import BuildConfig
from release.io import write_json

FP8_E4M3 = {"num_bits": (4, 3), "axis": None}  # FP8_DEFAULT_CFG's per-tensor weight and input quantizers
FP8_MAX = 448.0
TRANSFORMER_INDEX = "diffusion_pytorch_model.safetensors.index.json"
# Tensors only vLLM / TensorRT-LLM read; diffusers would warn that they are unused.
SMOOTHING_SIDECAR = "smoothing_scales.safetensors"  # per-channel s of each group: W_fp8 * scale / s ~ W_source
SERVING_ONLY = [r"\.weight_scale$", r"\.input_scale$"]


def quant_config(build: BuildConfig) -> dict[str, Any]:
    """ModelOpt 0.47 list-form config: every quantizer off, then the build's Linears on (W8A8 per-tensor static)."""
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for pattern in build.quantized:
        for quantizer in ("weight_quantizer", "input_quantizer"):
            entries.append({"quantizer_name": f"*{pattern}.{quantizer}", "cfg": dict(FP8_E4M3)})
    # ModelOpt's max calibration always runs: it sets the weight amax; other observers replace the input amax after.
    return {"quant_cfg": entries, "algorithm": "max"}


def quantized_linears(model: torch.nn.Module) -> list[str]:
    """Linears whose ModelOpt weight quantizer is enabled."""
    return [name for name, module in model.named_modules()
            if getattr(getattr(module, "weight_quantizer", None), "is_enabled", False)]


def quantized_linears_of(model: torch.nn.Module, build: BuildConfig) -> list[str]:
    """Linears of the (not yet quantized) model that the build's patterns select."""
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and any(fnmatch.fnmatchcase(name, p) for p in build.quantized)]


def check_finite(model: torch.nn.Module, source: Path) -> None:
    """A corrupt source fails here, naming the tensor, before a rollout or calibration turns NaN into noise."""
    for name, param in model.named_parameters():
        if not torch.isfinite(param).all():
            raise ReleaseError(f"{source}/transformer: tensor {name} holds NaN or Inf; the source is corrupt")


@dataclass
class Quantized:
    """A fake-quantized, calibrated transformer and what the recipe decided on the way."""

    model: torch.nn.Module
    alpha_table: list[dict[str, Any]] = field(default_factory=list)
    smoothing_scales: dict[str, torch.Tensor] = field(default_factory=dict)


def quantize(source: Path, build: BuildConfig, calls: list[dict[str, Any]],
             algorithm_calls: list[dict[str, Any]]) -> Quantized:
    """The source transformer, smoothed if the recipe says so, fake-quantized by ModelOpt, calibrated on ``calls``."""
    import modelopt.torch.quantization as mtq
    from diffusers import Cosmos3OmniTransformer

    from release.policy import compute_device, map_tensors
    from release.recipes import Observer, input_hooks, smooth

    device = compute_device()
    model = Cosmos3OmniTransformer.from_pretrained(str(source / "transformer"), dtype=torch.bfloat16).eval()
    model.to(device)
    check_finite(model, source)
    calls, algorithm_calls = ([map_tensors(c, lambda t: t.to(device)) for c in cs] for cs in (calls, algorithm_calls))
    result = Quantized(model)
    if build.recipe == "smoothquant":
        result.alpha_table, result.smoothing_scales = smooth(model, build, algorithm_calls)
    names = quantized_linears_of(model, build)
    if not names:
        raise ReleaseError(f"builds/{build.name}.yaml: field 'quantized': no Linear matches the patterns")
    observer = Observer(build.calibrator, names)

    @torch.no_grad()
    def forward_loop(m: torch.nn.Module) -> None:
        with input_hooks(m, names, observer.record):
            for index, call in enumerate(calls):
                observer.call = index
                m(**call)

    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints its progress
        warnings.simplefilter("ignore")
        mtq.quantize(model, quant_config(build), forward_loop=forward_loop)
    for name, amax in observer.amax().items():
        quantizer: Any = model.get_submodule(name).input_quantizer
        quantizer.amax = amax.to(quantizer.amax.dtype)
    return result


def fp8_weight_codes(weight: torch.Tensor, amax: torch.Tensor, arithmetic: str) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes and scale of one weight, as ModelOpt's compress (``w / (amax / 448)``) makes them on a CPU or CUDA.

    Measured on an H200 (``bench/gpu_rounding_probe.py``): CUDA divides by a Python scalar as a multiplication by
    fp32(1/448), and casts the 0-dim scale to the weight's dtype before the division; the CPU keeps the scale in the
    amax dtype. With a bf16 amax (ModelOpt 0.47 on a bf16 model) both give the same codes; with an fp32 amax
    (as ModelOpt 0.44 keeps it) about 3% of the codes differ.
    """
    weight, amax = weight.cpu(), amax.cpu()
    if arithmetic == "cuda":
        scale = (amax.float() * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)).to(amax.dtype)
        codes = (weight.float() / scale.to(weight.dtype).float()).to(weight.dtype).to(torch.float8_e4m3fn)
    else:
        scale = amax / FP8_MAX
        codes = (weight / scale).to(torch.float8_e4m3fn)
    return codes, scale


def module_weight(model: torch.nn.Module, name: str) -> torch.Tensor:
    weight: torch.Tensor = model.get_submodule(name).weight  # type: ignore[assignment]
    return weight


def _shard_size(source_transformer: Path) -> int:
    """Largest source shard: the export is sharded like its source (5 GB on Nano, a few hundred KB on the tiny)."""
    return max(p.stat().st_size for p in source_transformer.glob("*.safetensors"))


def nvidia_quantization_config(model: torch.nn.Module, build: BuildConfig) -> dict[str, Any]:
    import modelopt
    from diffusers.pipelines.cosmos.mixed_precision import FIRST_LAST_N_FP8_POLICY

    quantized = set(quantized_linears(model))
    ignore = []
    for name, module in model.named_modules():
        if name and name not in quantized and isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            top = name.split(".")[0] if name.startswith("action_proj_") else name
            if top not in ignore:
                ignore.append(top)
    return {
        # read by diffusers' NVIDIAModelOptConfig (it fails without modelopt_config)
        "quant_method": "modelopt",
        "quant_type": "FP8_FP8",
        "modelopt_config": json.loads(json.dumps(quant_config(build))),
        # NVIDIA's fields, as ModelOpt's convert_hf_quant_config_format writes them for FP8
        "quant_algo": "FP8",
        "config_groups": {"group_0": {
            "input_activations": {"dynamic": False, "num_bits": 8, "type": "float"},
            "weights": {"dynamic": False, "num_bits": 8, "type": "float"},
            "targets": ["Linear"],
        }},
        "ignore": ignore,
        "producer": {"name": "modelopt", "version": modelopt.__version__},
        "runtime": {"diffusion_step_policy": copy.deepcopy(FIRST_LAST_N_FP8_POLICY)},
    }


def export_build(quantized: Quantized, build: BuildConfig, source: Path, out: Path) -> int:
    """Write the build folder ``out``: the quantized transformer in NVIDIA's layout and the source's other parts.

    The model is compressed in place (its weights become FP8 codes). Returns the number of quantized Linears.
    """
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    model = quantized.model
    qconfig = nvidia_quantization_config(model, build)
    names = quantized_linears(model)
    device = next(model.parameters()).device.type
    emulate = build.arithmetic not in ("native", device)
    bf16_weights = {n: module_weight(model, n).detach().clone() for n in names} if emulate else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mtq.compress(model)  # FP8 codes = (w / (amax / 448)) with the quotient in bf16, as ModelOpt's GEMM expects
    state = {k: v.detach().as_subclass(torch.Tensor).contiguous().cpu() for k, v in model.state_dict().items()}
    for name in names:
        module: Any = model.get_submodule(name)  # a ModelOpt QuantLinear
        if state[f"{name}.weight"].dtype != torch.float8_e4m3fn:
            raise ReleaseError(f"tensor {name}.weight was not compressed to FP8 by ModelOpt")
        if emulate:
            codes, scale = fp8_weight_codes(bf16_weights[name], module.weight_quantizer._amax, build.arithmetic)
            state[f"{name}.weight"], state[f"{name}.weight_quantizer._scale"] = codes, scale
        state[f"{name}.weight_scale"] = (module.weight_quantizer._amax.float().cpu() / FP8_MAX).reshape(())
        state[f"{name}.input_scale"] = (module.input_quantizer._amax.float().cpu() / FP8_MAX).reshape(())
        for key in (f"{name}.weight_scale", f"{name}.input_scale"):
            if not (torch.isfinite(state[key]) and state[key] > 0):
                raise ReleaseError(f"tensor {key} is {state[key].item()}; calibration saw no finite, non-zero data")
    if quantized.smoothing_scales:
        save_file({k: v.float().cpu().contiguous() for k, v in sorted(quantized.smoothing_scales.items())},
                  str(out / SMOOTHING_SIDECAR), metadata={"format": "pt"})

    tdir = out / "transformer"
    tdir.mkdir(parents=True)
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="diffusion_pytorch_model{suffix}.safetensors",
        max_shard_size=_shard_size(source / "transformer"),
    )
    for filename, keys in split.filename_to_tensors.items():
        save_file({k: state[k] for k in sorted(keys)}, str(tdir / filename), metadata={"format": "pt"})
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(tdir / TRANSFORMER_INDEX,
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(split.tensor_to_filename.items()))})
    config = json.loads((source / "transformer" / "config.json").read_text())
    write_json(tdir / "config.json", {**config, "quantization_config": qconfig})
    write_json(out / "hf_quant_config.json", {k: v for k, v in qconfig.items() if k != "runtime"})
    modelopt_state = canonical_modelopt_state(mto.modelopt_state(model))
    torch.save(modelopt_state, tdir / "modelopt_state.pth")
    torch.save(modelopt_state, out / "modelopt_state.pth")

    _copy_components(source, out)
    write_json(out / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": {k: f"transformer/{v}" for k, v in sorted(split.tensor_to_filename.items())},
    })
    return len(names)


def canonical_modelopt_state(state: dict[str, Any]) -> dict[str, Any]:
    """ModelOpt's state with each quantizer's properties in sorted order, so that the same build pickles the same.

    ModelOpt collects a quantizer's properties from a set difference of attribute names
    (``TensorQuantizer._get_properties_for_modelopt_state``): their order follows Python's string hashing, which
    changes with every process (``PYTHONHASHSEED``). Restoring sets them by name, so the order carries nothing.
    """
    for _, mode in state["modelopt_state_dict"]:
        for key in ("quantizer_state", "real_quantizer_state"):
            per_quantizer = mode["metadata"].get(key, {})
            for name, properties in per_quantizer.items():
                per_quantizer[name] = dict(sorted(properties.items()))
    return state


def _copy_components(source: Path, out: Path) -> None:
    """Everything of the source pipeline but the transformer and files this tool rewrites."""
    rewritten = {"transformer", "model.safetensors.index.json", "fixture.json", "README.md", ".cache"}
    for item in sorted(source.iterdir()):
        if item.name in rewritten:
            continue
        if item.is_dir():
            shutil.copytree(item, out / item.name)
        else:
            shutil.copy2(item, out / item.name)


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
    """A build's transformer through diffusers, with ModelOpt's restore enabled (real FP8 weights)."""
    import modelopt.torch.opt as mto
    from diffusers import Cosmos3OmniTransformer

    if not (build_dir / "transformer" / "modelopt_state.pth").is_file():
        raise ReleaseError(f"{build_dir}/transformer/modelopt_state.pth: missing; rebuild with 'release build'")
    with contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints what it patches and restores
        mto.enable_huggingface_checkpointing()
    with _serving_keys_ignored(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        model = Cosmos3OmniTransformer.from_pretrained(str(build_dir / "transformer"), dtype=torch.bfloat16)
    return model.eval()
