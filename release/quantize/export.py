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
import hashlib
import io
import json
import shutil
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

import release.inputs.policy  # noqa: F401  (sets diffusers up without progress bars)
from release.core.config import BuildConfig
from release.core.device import modelopt_imported
from release.core.errors import ReleaseError
from release.core.fp8 import serving_scale, weight_codes
from release.core.io import canonical_modelopt_state, read_json, write_json
from release.core.memory import execution_device, is_placed, placed, unplace
from release.core.profile import stage
from release.inputs.source import SourceModel
from release.quantize.recipes import Quantized, per_channel, quant_config, quantized_linears
from release.quantize.recipes.base import module_weight

TRANSFORMER_INDEX = "diffusion_pytorch_model.safetensors.index.json"
SMOOTHING_SIDECAR = "smoothing_scales.safetensors"  # per-channel s of each group: W_fp8 * scale / s ~ W_source
BUILD_FILES = "builds"  # the build file and release.yaml the build was made from, beside the checkpoint
# Tensors only vLLM / TensorRT-LLM read; diffusers would warn that they are unused.
SERVING_ONLY = [r"\.weight_scale$", r"\.input_scale$"]


def _shard_size(source_transformer: Path) -> int:
    """Largest source shard: the export is sharded like its source (5 GB on Nano, a few hundred KB on the tiny)."""
    return max(p.stat().st_size for p in source_transformer.glob("*.safetensors"))


def nvidia_quantization_config(model: torch.nn.Module, build: BuildConfig) -> dict[str, Any]:
    """``quantization_config`` of ``transformer/config.json``: ModelOpt's own conversion of its export config
    (``convert_hf_quant_config_format``: ``quant_algo``, ``config_groups``, ``ignore``, ``producer``), the fields
    diffusers' ``NVIDIAModelOptConfig`` reads (``quant_type``, ``modelopt_config``) and the step policy."""
    modelopt_imported()
    import modelopt
    from diffusers.pipelines.cosmos.mixed_precision import FIRST_LAST_N_FP8_POLICY
    from modelopt.torch.export.convert_hf_config import convert_hf_quant_config_format

    quantized = set(quantized_linears(model))
    ignore = []
    for name, module in model.named_modules():
        if name and name not in quantized and isinstance(module, torch.nn.Linear | torch.nn.Embedding):
            top = name.split(".")[0] if name.startswith("action_proj_") else name
            if top not in ignore:
                ignore.append(top)
    per_tensor = build.scheme != per_channel.SCHEME
    config = convert_hf_quant_config_format({
        "producer": {"name": "modelopt", "version": modelopt.__version__},
        "quantization": {"quant_algo": "FP8" if per_tensor else per_channel.QUANT_ALGO, "exclude_modules": ignore},
    })
    if not per_tensor:
        config["config_groups"] = per_channel.config_groups()
    return {
        **config,
        "quant_type": "FP8_FP8",
        "modelopt_config": json.loads(json.dumps(quant_config(build))),
        "runtime": {"diffusion_step_policy": copy.deepcopy(FIRST_LAST_N_FP8_POLICY)},
    }


def _export_model(quantized: Quantized, build: BuildConfig, source: SourceModel, call: dict[str, Any],
                  compute: str) -> Any:
    """A fresh source model holding the recipe's weights (folded norms, its own Linear weights) and scales,
    quantized with the plain configuration of the build's scheme: whatever algorithm made the weights (GPTQ,
    layer-by-layer calibration), the checkpoint then carries NVIDIA's structure, ``quantization_config`` and
    ModelOpt state (one transformer call on ``compute`` initialises the quantizers; their amax values are then
    replaced). The recipe's model is consumed: the new one takes over its tensors (one copy of the weights in
    memory, not two) and the recipe's are left on the meta device. Under a GPU memory cap the recipe's model leaves
    the GPU first, and the new one is kept in CPU memory, placed within the cap for its call."""
    modelopt_imported()
    import modelopt.torch.quantization as mtq

    recipe = quantized.model
    bounded = is_placed(recipe)
    if bounded:
        unplace(recipe)
    modules: dict[str, Any] = {n: recipe.get_submodule(n) for n in quantized_linears(recipe)}
    amax = {n: (_clone(m.weight_quantizer.amax), _clone(getattr(m.input_quantizer, "_amax", None)))
            for n, m in modules.items()}
    model = source.instantiate("cpu" if bounded else compute, recipe.state_dict(), bounded=False, share=True)
    recipe.to("meta")
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), torch.no_grad(), \
            placed(model, compute) if bounded else contextlib.nullcontext():
        warnings.simplefilter("ignore")
        mtq.quantize(model, quant_config(build), forward_loop=lambda m: m(**call))
    for name, (weight_amax, input_amax) in amax.items():
        module: Any = model.get_submodule(name)
        module.weight_quantizer.amax = weight_amax
        if input_amax is not None:
            module.input_quantizer.amax = input_amax
    return model


def _clone(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return None if tensor is None else tensor.detach().clone()


def export_build(quantized: Quantized, build: BuildConfig, source: SourceModel, call: dict[str, Any], out: Path,
                 build_files: dict[str, bytes]) -> dict[str, Any]:
    """Write the build folder ``out``: the quantized transformer in NVIDIA's layout (or the per-channel scheme's),
    the source's other parts and ``build_files`` (the build file and release.yaml, under ``builds/``).

    Returns what provenance.json records of the export: the number of quantized Linears, the digest of all FP8
    codes (:func:`_write_shards`: two builds with the same digest have byte-equal codes) and every static input
    amax (so that the card can say how two builds' activation calibrations differ).
    """
    modelopt_imported()
    import modelopt.torch.opt as mto
    import modelopt.torch.quantization as mtq
    from huggingface_hub import split_torch_state_dict_into_shards
    from safetensors.torch import save_file

    compute = execution_device(quantized.model)
    with stage("export: prepare the model"):
        model = _export_model(quantized, build, source, call, compute)
    qconfig = nvidia_quantization_config(model, build)
    names = quantized_linears(model)
    # the codes are those of the arithmetic the build ran in, wherever the export computes them
    arithmetic = compute if build.arithmetic == "native" else build.arithmetic
    emulate = arithmetic != next(model.parameters()).device.type
    # ModelOpt's compress reads the amax and leaves it as it is: the codes of another arithmetic are made before
    # it, from the bf16 weights it replaces, one weight at a time (no second copy of the weights)
    emulated = {n: weight_codes(module_weight(model, n).detach(), model.get_submodule(n).weight_quantizer._amax,
                                arithmetic) for n in names} if emulate else {}
    with stage("export: compress (ModelOpt)"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mtq.compress(model)  # FP8 codes = (w / (amax / 448)) with the quotient in bf16, as ModelOpt's GEMM expects
    # where the model is: each shard passes through the CPU as it is written (below)
    state = {k: v.detach().as_subclass(torch.Tensor).contiguous() for k, v in model.state_dict().items()}
    for name in names:
        module: Any = model.get_submodule(name)  # a ModelOpt QuantLinear
        if state[f"{name}.weight"].dtype != torch.float8_e4m3fn:
            raise ReleaseError(f"tensor {name}.weight was not compressed to FP8 by ModelOpt")
        if emulate:
            state[f"{name}.weight"], state[f"{name}.weight_quantizer._scale"] = emulated.pop(name)
        weight_scale = serving_scale(module.weight_quantizer._amax, arithmetic)
        state[f"{name}.weight_scale"] = weight_scale if build.scheme == per_channel.SCHEME \
            else weight_scale.reshape(())
        if build.scheme != per_channel.SCHEME:  # per token: the input scales are computed at run time
            state[f"{name}.input_scale"] = serving_scale(module.input_quantizer._amax, arithmetic).reshape(())
        for key in (f"{name}.weight_scale", f"{name}.input_scale"):
            bad = state[key][~(torch.isfinite(state[key]) & (state[key] > 0))] if key in state else None
            if bad is not None and bad.numel():
                raise ReleaseError(f"tensor {key} holds {bad.reshape(-1)[0].item()}; calibration saw no finite, "
                                   "non-zero data")
    if quantized.smoothing_scales:
        save_file({k: v.float().cpu().contiguous() for k, v in sorted(quantized.smoothing_scales.items())},
                  str(out / SMOOTHING_SIDECAR), metadata={"format": "pt"})

    tdir = out / "transformer"
    tdir.mkdir(parents=True)
    split = split_torch_state_dict_into_shards(
        state, filename_pattern="diffusion_pytorch_model{suffix}.safetensors",
        max_shard_size=_shard_size(source.folder / "transformer"),
    )
    with stage("export: state to the CPU, write the shards"):
        codes_sha256 = _write_shards(state, sorted(split.filename_to_tensors.items()), tdir,
                                     {f"{n}.weight" for n in names})
    total = sum(t.numel() * t.element_size() for t in state.values())
    write_json(tdir / TRANSFORMER_INDEX,
               {"metadata": {"total_size": total}, "weight_map": dict(sorted(split.tensor_to_filename.items()))})
    config = read_json(source.folder / "transformer" / "config.json", "transformer config", "hf download")
    write_json(tdir / "config.json", {**config, "quantization_config": qconfig})
    write_json(out / "hf_quant_config.json", {k: v for k, v in qconfig.items() if k != "runtime"})
    with stage("export: modelopt_state.pth"):
        modelopt_state = canonical_modelopt_state(mto.modelopt_state(model))
        torch.save(modelopt_state, tdir / "modelopt_state.pth")
        torch.save(modelopt_state, out / "modelopt_state.pth")
    with stage("export: copy the other components"):
        _copy_components(source.folder, out)
    for rel, data in build_files.items():
        (out / BUILD_FILES).mkdir(exist_ok=True)
        (out / BUILD_FILES / rel).write_bytes(data)
    write_json(out / "model.safetensors.index.json", {
        "metadata": {"total_size": total},
        "weight_map": {k: f"transformer/{v}" for k, v in sorted(split.tensor_to_filename.items())},
    })
    return {"quantized_linears": len(names), "codes_sha256": codes_sha256,
            "codes": sum(state[f"{n}.weight"].numel() for n in names),
            "input_amax": {n: float(state[f"{n}.input_quantizer._amax"]) for n in sorted(names)
                           if f"{n}.input_quantizer._amax" in state}}


HASH_THREADS = 8  # hashlib releases the GIL on large buffers: the codes of a 5 GB shard in ~0.7 s (H200 machine)
_STAGING: list[torch.Tensor] = []  # one page-locked buffer per process, reused by every build's export
_STAGING_LOCK = threading.Lock()
STAGING_SLACK = 1 << 24  # a shard's tensors each start on 16 bytes: room for the padding of a million of them


def _staging(nbytes: int) -> torch.Tensor:
    """A page-locked buffer of at least ``nbytes``, kept for the process: page-locking fresh host memory costs as much
    as the copy it speeds up (1.3 GB/s on the H200 machine, BENCHMARKS.md), so one shard's worth is locked once and
    every shard of every build passes through it, at the link's speed."""
    with _STAGING_LOCK:
        if not _STAGING or _STAGING[0].numel() < nbytes:
            _STAGING[:] = [torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)]
        return _STAGING[0]


def reserve_staging(source: Path, device: str) -> None:
    """Lock the export's staging buffer for shards like ``source``'s (the largest, and the tensors' padding) in a
    thread, while the capture and the first quantization run: 4 s of the first build's export at the Nano's size
    otherwise. For builds on CUDA without a memory cap only (elsewhere the exported model is in CPU memory and its
    shards are written from its own tensors)."""
    from release.core.memory import cap

    if device == "cuda" and cap() is None:
        threading.Thread(target=_staging, args=(_shard_size(source / "transformer") + STAGING_SLACK,),
                         daemon=True).start()


def _aligned(nbytes: int) -> int:
    return -(-nbytes // 16) * 16


def _on_host(state: dict[str, torch.Tensor], keys: list[str]) -> dict[str, torch.Tensor]:
    """``state``'s tensors ``keys`` in CPU memory: those already there as they are, GPU ones copied into views of the
    staging buffer (valid until the next call)."""
    on_gpu = [k for k in keys if state[k].is_cuda]
    host = {k: state[k] for k in keys if k not in on_gpu}
    if on_gpu:
        buffer = _staging(sum(_aligned(state[k].numel() * state[k].element_size()) for k in on_gpu))
        offset = 0
        for k in on_gpu:
            t = state[k]
            nbytes = t.numel() * t.element_size()
            host[k] = buffer[offset:offset + nbytes].view(t.dtype).view(t.shape)
            host[k].copy_(t, non_blocking=True)
            offset += _aligned(nbytes)
        torch.cuda.current_stream().synchronize()
    return host


def _write_shards(state: dict[str, torch.Tensor], shards: list[tuple[str, list[str]]], folder: Path,
                  codes: set[str]) -> str:
    """Write each shard from CPU memory and hash the FP8 codes ``codes`` (weight names) while it is written; return
    the codes' digest: the sha256 of every FP8 weight's name and the sha256 of its codes, in name order (two builds
    with the same digest have byte-equal codes; hashed per tensor, in parallel, instead of one 15 GB stream, which
    took 16 s on one core at the Nano's size)."""
    from safetensors.torch import save_file

    digests: dict[str, str] = {}
    with ThreadPoolExecutor(HASH_THREADS) as hasher:
        for filename, keys in shards:
            host = _on_host(state, sorted(keys))
            hashing = {k: hasher.submit(_sha256, host[k]) for k in keys if k in codes}
            save_file(host, str(folder / filename), metadata={"format": "pt"})
            digests.update({k: f.result() for k, f in hashing.items()})  # before the buffer takes the next shard
    top = hashlib.sha256()
    for key in sorted(digests):
        top.update(f"{key.removesuffix('.weight')} {digests[key]}\n".encode())
    return top.hexdigest()


def _sha256(tensor: torch.Tensor) -> str:
    return hashlib.sha256(tensor.reshape(-1).view(torch.uint8).numpy().data).hexdigest()  # its own bytes, no copy


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


def kept_dtypes(build: BuildConfig, transformer: Path) -> dict[str, list[str]]:
    """The dtypes in which the exported ``transformer`` stores each module that ``kept_bf16`` names (its safetensors
    headers: ``time_embedder`` is F32), for the card's "Not quantized" row; recorded in ``provenance.json`` so that a
    card rendered without the weights (from the manifest) says the same. A name covers the tensors with it as a part
    of their module path, a plural (``norms``) every module whose name holds its singular; none: an empty list."""
    from release.inputs.source import read_headers

    dtypes: dict[str, set[str]] = {k: set() for k in build.kept_bf16}
    for key, (dtype, _shape, _file) in read_headers(transformer, TRANSFORMER_INDEX).items():
        parts = key.split(".")[:-1]
        name = next((k for k in build.kept_bf16 if any(p == k or (k.endswith("s") and k[:-1] in p) for p in parts)),
                    None)
        if name is not None:
            dtypes[name].add(dtype)
    return {k: sorted(v) for k, v in dtypes.items()}
