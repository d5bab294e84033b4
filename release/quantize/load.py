"""A build loaded back from its folder, three ways: as diffusers loads the exported checkpoint (ModelOpt's restore,
real FP8 weights), with the kernels a server runs on it (the deployed path), and as the seed's offline fake-quant
replay of its codes and scales on the source."""

from __future__ import annotations

import contextlib
import functools
import io
import pickle
import types
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import release.inputs.policy  # noqa: F401  (sets diffusers up without progress bars)
from release.core import fp8
from release.core.config import BuildConfig
from release.core.conformance import EMULATION, MODELOPT, SCALED_MM
from release.core.device import compute_device, modelopt_imported
from release.core.errors import ReleaseError
from release.core.memory import keep_whole
from release.core.provenance import read_provenance
from release.inputs.graphs import capturable
from release.inputs.source import SourceModel, load_transformer
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
    the GPU whole (:func:`release.core.memory.keep_whole`). The calls are the card's Use code
    (``templates/partials/use.md.j2``) on ``build_dir`` as the downloaded snapshot of the repo: ModelOpt restores from
    the ``modelopt_state.pth`` of the folder given to ``from_pretrained`` (given a repo id and ``subfolder=``, it looks
    at the repo's root in the local cache instead). A Linear left holding FP8 weights without ModelOpt's quantizers
    is refused."""
    modelopt_imported()
    import modelopt.torch.opt as mto
    from modelopt.torch.quantization.nn import QuantModule

    if not (build_dir / "transformer" / "modelopt_state.pth").is_file():
        raise ReleaseError(f"{build_dir}/transformer/modelopt_state.pth: missing; rebuild with 'release build'")
    with contextlib.redirect_stdout(io.StringIO()):  # ModelOpt prints what it patches and restores
        mto.enable_huggingface_checkpointing()
    with _serving_keys_ignored(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        try:
            model = load_transformer(build_dir / "transformer")
        except pickle.UnpicklingError as exc:  # torch.load(weights_only=True) refused it: nothing of it ran
            raise ReleaseError(f"{build_dir}/transformer/modelopt_state.pth: not a ModelOpt state that loads without "
                               "running code (it holds other pickled objects); rebuild with 'release build'") from exc
    plain = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)
             and module.weight.dtype == torch.float8_e4m3fn and not isinstance(module, QuantModule)]
    if plain:
        raise ReleaseError(f"{build_dir}/transformer: {len(plain)} Linears (the first {plain[0]}) hold FP8 weights "
                           "as plain torch.nn.Linear: ModelOpt's restore did not run; rebuild with 'release build'")
    return keep_whole(model.eval())


@dataclass
class GemmRecord:
    """What a deployed transformer's FP8 Linears ran: the kernel, and every GEMM shape (M tokens, N out, K in) since
    the shapes were last cleared (``release eval`` clears them before each rollout and keeps them beside it)."""

    kernel: str
    shapes: set[tuple[int, int, int]] = field(default_factory=set)

    def track(self, module: torch.nn.Module) -> None:
        """Record the shape of each GEMM ``module`` (a Linear) runs, from its input, before it runs."""
        n = int(module.weight.shape[0])  # type: ignore[index]

        def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            x = args[0] if args else kwargs["input"]
            self.shapes.add((x.numel() // x.shape[-1], n, int(x.shape[-1])))

        module.register_forward_pre_hook(hook, with_kwargs=True)


def deployed_transformer(folder: Path, emulate: bool | None = None) -> torch.nn.Module:
    """The exported build through diffusers, its FP8 Linears running the kernel a server runs: per-tensor builds
    ModelOpt's FP8 GEMM on CUDA (``torch._scaled_mm`` with fast accumulation), per-channel builds a row-wise
    ``torch._scaled_mm`` with per-token input scales; or that arithmetic emulated exactly (``release.core.fp8``), by
    default where models run on the CPU (on a GPU, to show the two equal). The model's ``gemm_record`` names the
    kernel and collects the GEMM shapes that run. ModelOpt's kernel is marked ``capturable`` (CUDA graphs in
    ``release eval``, as is the fake-quant replay); the row-wise Linear and the emulation are not."""
    model = load_build_transformer(folder)
    if emulate is None:
        emulate = compute_device() != "cuda"
    provenance = folder / "provenance.json"  # an external checkpoint has none: NVIDIA's per-tensor scheme
    rowwise = provenance.is_file() and \
        read_provenance(provenance, None)["recipe"]["scheme"] == per_channel.SCHEME
    record = GemmRecord(EMULATION if emulate else SCALED_MM if rowwise else MODELOPT)
    model.gemm_record = record  # type: ignore[assignment]  # read by release eval
    for name in quantized_linears(model):
        module = model.get_submodule(name)
        record.track(module)
        if rowwise:
            module.forward = types.MethodType(functools.partial(fp8.rowwise_forward, emulate=emulate), module)
        elif emulate:
            module.forward = types.MethodType(fp8.per_tensor_forward, module)
    if not (emulate or rowwise):
        # ModelOpt 0.47 never imports its FP8 GEMM backend; importing it registers the kernel before the first call.
        modelopt_imported()
        import modelopt.torch.quantization.backends.fp8_per_tensor_gemm  # noqa: F401
        # its first call caches the scales; later calls neither wait for the device nor copy from the host
        capturable(model)
    return model


def fakequant_transformer(source: Path, folder: Path, build: BuildConfig,
                          resident: SourceModel | None = None) -> torch.nn.Module:
    """The seed's offline replay: the build's own tensors (folded norms included), its FP8 weights dequantized
    (codes x scale, so a GPTQ or tuned build is replayed with its own codes), under ModelOpt fake quantization at
    the build's scales: the weights re-quantize to the same codes, the inputs are quantized per tensor at the
    build's static scales or per token (the per-channel scheme).

    Every tensor comes from the build's files; of the source only the architecture and each tensor's dtype are used,
    from ``resident`` (``release campaign``'s source, already in memory) or else read from ``source``. Without a GPU
    memory cap the build's tensors are read straight onto the device and the model is made there: no 30 GB copy
    through the host per build."""
    modelopt_imported()
    import modelopt.torch.quantization as mtq
    from safetensors.torch import load_file

    from release.core.memory import cap

    home = compute_device() if cap() is None else "cpu"  # under a cap, load_pipeline places it within the cap
    resident = resident or SourceModel(source)
    built: dict[str, torch.Tensor] = {}
    for shard in sorted((folder / "transformer").glob("*.safetensors")):
        built.update(load_file(shard, device=home))
    weights = {}
    for key, reference in resident.state.items():
        value = built[key]
        if value.dtype == torch.float8_e4m3fn:  # the codes dropped once dequantized: one copy of the weights at a time
            value = fp8.dequantize(built.pop(key), built[f"{key.removesuffix('.weight')}.weight_quantizer._scale"])
        weights[key] = value.to(reference.dtype)
    model = resident.instantiate(home, weights, bounded=False, share=True)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        mtq.quantize(model, quant_config(build), forward_loop=None)
    names = quantized_linears(model)  # before the fold disables the weight quantizers
    for name in names:
        module: Any = model.get_submodule(name)
        module.weight_quantizer.amax = built[f"{name}.weight_quantizer._amax"]
        if f"{name}.input_quantizer._amax" in built:
            module.input_quantizer.amax = built[f"{name}.input_quantizer._amax"]
    # The weights are fixed: quantize them once (ModelOpt's fold_weight writes the fake-quantized weight and disables
    # its quantizer) instead of on every call. The same operation on the same tensors: the actions are bit-identical
    # (bench/tiny_rollout.py --compare), at a fraction of a tiny rollout's cost.
    mtq.fold_weight(model, keep_attrs=True)
    for name in names:
        _lean(model.get_submodule(name))
    for module in model.modules():
        _plain(module)
    # What is left per call is each input's quantize-dequantize at a fixed scale (ModelOpt's fused kernel) or its
    # per-token amax on the device: no wait for the device and no copy from the host, so its decoder stack is
    # replayed from CUDA graphs in release eval, the same bits as eager (tests/test_graphs.py).
    return capturable(model)


def _lean(module: Any) -> None:
    """A folded ModelOpt Linear's call as its arithmetic alone, when nothing else of ModelOpt's per-call logic applies
    (an enabled FP8 input quantizer, static per tensor or dynamic per token; the weight folded; no output quantizer,
    pre-quant scale, bias, rotation, block scales or calibration: the smoothing recipes fold theirs into the norms
    and weights the build stores): its input quantize-dequantized by ModelOpt's own ``quantize_op`` at ModelOpt's
    own amax, then the Linear. The same operations on the same tensors as ModelOpt's forward, without the Python of
    its quantizer on every call (most of a tiny CPU rollout's fake-quant cost); the bits are ModelOpt's
    (tests/test_fakequant_load.py). An instance attribute over the class's forward: deleting it gives ModelOpt's
    back. The tensors are read at each call, so hooks that move them (a memory cap) still apply."""
    q, original = module.input_quantizer, getattr(module, "original_cls", None)
    plain = (original is not None and original.forward is torch.nn.Linear.forward
             and not module.weight_quantizer.is_enabled and not module.output_quantizer.is_enabled
             and not hasattr(module, "_forward_pre_dm"))
    fp8_inputs = (q.is_enabled and q.fake_quant and q._if_quant and q.num_bits == (4, 3) and q.backend is None
                  and _per_channel_blocks(q.block_sizes) and q.bias_calibrator is None and q.pre_quant_scale is None
                  and not q.rotate_is_enabled and not q._if_calib and not q._use_constant_amax)
    if not (plain and fp8_inputs):
        return
    modelopt_imported()
    from modelopt.torch.quantization import tensor_quant

    def quantize(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        return tensor_quant.quantize_op(x, amax, num_bits=8, exponent_bits=4, unsigned=False, narrow_range=False)

    table = Table(quantize)

    def forward(x: torch.Tensor) -> torch.Tensor:
        if x.numel():
            if q.block_sizes is not None:  # ModelOpt's first call: the per-token block sizes become an axis
                q._block_sizes_to_axis(x)
            x = x.contiguous()
            amax = q._get_amax(x)
            x = table(x, amax) if table.applies(x, amax) else quantize(x, amax)
        return torch.nn.functional.linear(x, module._parameters["weight"], module._parameters["bias"])

    module.forward = forward


def _plain(module: Any) -> None:
    """A ModelOpt Linear or Embedding whose quantizers are all off (a module the build keeps in BF16) called as the
    torch module it replaced: its quantizers would return their inputs as they are, and its weight is the stored one,
    without the Python of ModelOpt's wrapper on every call (12 of a tiny fake-quant rollout's 96 ms)."""
    modelopt_imported()
    from modelopt.torch.quantization.nn import SequentialQuantizer, TensorQuantizer

    original = getattr(module, "original_cls", None)
    if original is None or "forward" in vars(module) or hasattr(module, "_forward_pre_dm") \
            or original.forward not in (torch.nn.Linear.forward, torch.nn.Embedding.forward):
        return
    quantizers = list(module.children())
    if any(isinstance(q, SequentialQuantizer) for q in quantizers):
        return
    if any(q.is_enabled or q.pre_quant_scale is not None or q.rotate_is_enabled
           for q in quantizers if isinstance(q, TensorQuantizer)):
        return
    module.forward = types.MethodType(original.forward, module)


class Table:
    """A CPU input's quantize-dequantize at a static per-tensor amax as a lookup: the input is 16-bit (BF16 or FP16),
    so ``quantize`` takes one of 65,536 values to one output each, and the table holds ``quantize``'s own output for
    every one of them (computed by it, once per amax: the same bits by construction). One gather per call instead of
    ModelOpt's six elementwise operations, about 3x faster on a tiny rollout's inputs (BENCHMARKS.md); a GPU keeps
    ModelOpt's fused kernel, replayed from CUDA graphs."""

    def __init__(self, quantize: Any) -> None:
        self.quantize = quantize
        self.held: tuple[float, torch.dtype, torch.Tensor] | None = None  # the amax's value, the dtype, the table

    @staticmethod
    def applies(x: torch.Tensor, amax: torch.Tensor) -> bool:
        return x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16) and amax.numel() == 1

    def __call__(self, x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        held, value = self.held, amax.item()  # the output depends on the amax's value alone
        if held is None or held[0] != value or held[1] != x.dtype:
            every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(x.dtype)
            held = self.held = (value, x.dtype, self.quantize(every, amax))
        return torch.take(held[2], x.view(torch.int16).to(torch.int64) + (1 << 15))


def _per_channel_blocks(block_sizes: dict[Any, Any] | None) -> bool:
    """No block sizes, or ModelOpt's spelling of a per-channel axis (every dimension's block size None)."""
    return block_sizes is None or all(v is None for k, v in block_sizes.items() if isinstance(k, int))
