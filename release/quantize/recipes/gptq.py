"""GPTQ with ModelOpt's own ``gptq`` algorithm on the scheme's FP8 quantizers (``GPTQCalibConfig``).

ModelOpt's GPTQ first max-calibrates (the weight and input amax of the unchanged weights: the same as round-to-nearest
on the same data), then collects each Linear's Hessian in a second pass and updates the weights column by column so
that the layer's output error on that data shrinks. The first pass reads the calibration calls, the second the
algorithm calls (the seed: 256 calls for the scales, 32 for the algorithm); observers record the first only. With
``layerwise`` ModelOpt calibrates decoder layer by decoder layer, each from the quantized outputs of the layers before
it, both passes on the calibration calls.

ModelOpt's column loop (``gptq_blockwise_update``) fake-quantizes the whole weight matrix for each column and keeps
that one column: a Linear costs in_features x out_features x in_features element operations, and on a GPU each column
costs its launches and Python besides (0.34 ms; the Nano's 504 Linears took 897 s on an H200). The scheme's weight
quantizers are elementwise with a calibrated amax (one per tensor or per output row), so the column quantized alone is
the same bits, and :func:`faster_update` runs the same loop faster, with the same bits: on a CPU ModelOpt's loop with a
quantizer that quantizes only the column it is asked for (:class:`Columns`, 9-26x); on a CUDA GPU that converts to FP8
(compute capability 8.9 or later) with Triton, one fused launch per block of columns
(:mod:`release.quantize.recipes.gptq_triton`: the Nano's 504 Linears in 5.8 s instead of 1,096 s on an H200, the same
bits). Any other quantizer keeps ModelOpt's loop as it is.

ModelOpt allocates every Linear's Hessian (in_features^2 fp32) before one pass collects them all: 67.5 GiB for the
Nano's 504 Linears. Beside a 30 GB model on an 80 GB GPU most of them went to the CPU, whose updates per call made a
GPTQ build run for over 1,000 s (H100, BENCHMARKS.md). :func:`grouped` collects them a group of Linears at a time,
each group sized to the GPU's free memory, in the order the model calls them, from the last group to the first, each
pass ending after its group: the same Hessians, since no Linear's input depends on the Linears after it.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from release.core.config import BuildConfig
from release.core.device import modelopt_imported
from release.quantize.recipes.base import Step

# GPTQ trades weight error for output error, so its weights sit further from the source than round-to-nearest's
# (relative Frobenius error about 0.03 in FP8 E4M3); the bound that verification holds the codes to.
MAX_WEIGHT_ERROR = 0.25


class Columns:
    """What ``quantize_fn(weight)`` returns inside ModelOpt's column loop: the fake-quantized weight, computed for a
    column when the loop reads ``[:, j]`` (as a ``(out, 1)`` slice, so a per-row amax still broadcasts by row), and
    whole for any other index. The loop reads column j twice before it changes ``weight``; the last column is kept."""

    def __init__(self, quantizer: Callable[[torch.Tensor], torch.Tensor], weight: torch.Tensor) -> None:
        self.quantizer, self.weight = quantizer, weight
        self.column: tuple[int, torch.Tensor] | None = None

    def __getitem__(self, index: Any) -> torch.Tensor:
        if not (isinstance(index, tuple) and len(index) == 2 and index[0] == slice(None) and isinstance(index[1], int)):
            return self.quantizer(self.weight)[index]
        j = index[1]
        if self.column is None or self.column[0] != j:
            self.column = (j, self.quantizer(self.weight[:, j:j + 1].contiguous())[:, 0])
        return self.column[1]


def elementwise(quantizer: Any) -> bool:
    """Whether ``quantizer`` maps each weight on its own: a calibrated amax (per tensor or per output row), not
    recomputed from its input (dynamic) nor shared across blocks of a row. Any other keeps ModelOpt's whole-matrix
    quantization."""
    amax = getattr(quantizer, "amax", None)
    if amax is None or getattr(quantizer, "_dynamic", False) or getattr(quantizer, "block_sizes", None):
        return False
    return bool(amax.numel() == 1 or (amax.dim() == 2 and amax.shape[1] == 1))


def fp8_scales(quantizer: Any, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale`` and ``1 / scale`` as ModelOpt's FP8 fake quantization of ``weight`` computes them from the quantizer's
    amax (an amax at or below 2^-24 taken as 1): for a CUDA tensor its CUDA extension, where built, divides 448 by the
    amax; its eager path (a CPU tensor, or no extension) multiplies the amax's reciprocal by 448 (Python's
    ``448.0 / tensor``), which can differ in the last bit (``scaled_e4m3_impl`` chooses the same way)."""
    modelopt_imported()
    from modelopt.torch.quantization.extensions import get_cuda_ext_fp8

    amax = quantizer.amax.float()
    amax = torch.where(amax <= 1.0 / (1 << 24), torch.ones_like(amax), amax)
    if weight.is_cuda and get_cuda_ext_fp8(raise_if_failed=False) is not None:
        scale = torch.full_like(amax, 448.0).div_(amax)
        return scale, torch.full_like(scale, 1.0).div_(scale)
    scale = 448.0 / amax
    return scale, 1 / scale


def fused(quantizer: Any, weight: torch.Tensor) -> bool:
    """Whether :mod:`release.quantize.recipes.gptq_triton` updates ``weight``: an elementwise FP8 E4M3 quantizer, an
    fp32 weight on a CUDA GPU that converts to FP8 (8.9 or later), and Triton installed."""
    return (elementwise(quantizer) and tuple(getattr(quantizer, "num_bits", ())) == (4, 3)
            and weight.is_cuda and weight.dtype == torch.float32
            and torch.cuda.get_device_capability(weight.device) >= (8, 9)
            and importlib.util.find_spec("triton") is not None)


HESSIAN_HEADROOM = 8 * 2**30  # GPU memory left free beside the Hessians: the Hessian pass's activations, an update
HOST_GROUP = 8 * 2**30  # the Hessians of one group held in CPU memory (a CPU build, or a GPU under a memory cap)


def hessian_on_cpu(free: int, capped: bool) -> bool:
    """Where the next Linear's Hessian goes (``free``: the GPU's free bytes). ModelOpt puts it on the CPU once 65% of
    the GPU is in use, whatever is left: on an H200 42 of the Nano's 504 fp32 Hessians (71 GB) went to the CPU, their
    updates 41 s of a 151 s build, with a third of the GPU still free. Here a Hessian stays on the GPU while
    ``HESSIAN_HEADROOM`` remains free. Under a memory cap every Hessian goes to the CPU: the cap's room beside the
    resident layers is the forward's (``release.core.memory.RESERVE``), and the GPU's own free memory does not see the
    cap. The Hessians sum in the same IEEE operations on either device (the products are computed on the GPU either
    way)."""
    return capped or free < HESSIAN_HEADROOM


def hessian_bytes(module: Any) -> int:
    return int(module.weight.shape[-1]) ** 2 * 4


def group_budget(device: Any) -> int:
    """The bytes of Hessians one group holds: on a GPU without a memory cap, what its free memory holds beside
    ``HESSIAN_HEADROOM`` (every Hessian of the group stays on the GPU, :func:`hessian_on_cpu`); else ``HOST_GROUP``."""
    from release.core.memory import cap

    if torch.device(device).type == "cuda" and cap() is None:
        torch.cuda.empty_cache()
        return max(HOST_GROUP, torch.cuda.mem_get_info(device)[0] - HESSIAN_HEADROOM)
    return HOST_GROUP


def call_order(model: torch.nn.Module, names: list[str], forward_loop: Callable[[torch.nn.Module], None]) -> list[str]:
    """The named Linears in the order the model's first call runs them, repeats included (one call: the others end
    at their start)."""
    from release.quantize.recipes.base import StopForward, input_hooks

    seen: list[str] = []
    calls = [0]

    def count(_module: torch.nn.Module, _args: Any, _kwargs: Any) -> None:
        calls[0] += 1
        if calls[0] > 1:
            raise StopForward

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        with input_hooks(model, names, lambda name, _x: seen.append(name)):
            forward_loop(model)
    finally:
        handle.remove()
    return seen


def groups(order: list[str], names: list[str], sizes: dict[str, int], budget: int) -> list[list[str]]:
    """``names`` in groups of consecutive Linears of the call ``order``, each at most ``budget`` bytes of Hessians
    where a cut is possible: a cut falls only where every Linear before it has run its last time in the call, so a
    pass that ends at the next group's first Linear has seen all of its group's inputs. Linears the call never runs
    join the last group (their Hessians stay empty either way)."""
    first = {n: len(order) - 1 - i for i, n in enumerate(reversed(order))}
    last = {n: i for i, n in enumerate(order)}
    unique = sorted(first, key=first.__getitem__)
    out: list[list[str]] = [[]]
    held = reach = 0  # bytes in the open group; the last position its Linears run at
    for name in unique:
        if out[-1] and held + sizes[name] > budget and reach < first[name]:
            out.append([])
            held = 0
        out[-1].append(name)
        held += sizes[name]
        reach = max(reach, last[name])
    out[-1] += [n for n in names if n not in first]
    return out


def grouped(model: torch.nn.Module, forward_loop: Callable[[torch.nn.Module], None], perc_damp: float = 0.01,
            block_size: int = 128, fused: bool = False) -> None:
    """ModelOpt's ``gptq`` (0.47, ``model_calib.gptq``: max calibration, every Linear's Hessian from one pass with the
    weight quantizers off, then each Linear's update) with the Hessians collected by :func:`groups`, from the last
    group to the first, each pass ending at the start of the group after it (:class:`StopForward`). The groups'
    inputs are those of ModelOpt's single pass: the Linears before a group are unchanged when its pass runs, and those
    after it do not reach its inputs. A model whose Hessians fit one group, or a decoder layer of ModelOpt's
    layer-by-layer calibration, runs ModelOpt's ``gptq`` itself."""
    modelopt_imported()
    from modelopt.torch.quantization import model_calib as mc

    from release.quantize.recipes.base import StopForward, is_cosmos3

    if not is_cosmos3(model):
        return mc.gptq(model, forward_loop, perc_damp=perc_damp, block_size=block_size, fused=fused)
    layers = {n: m for n, m in model.named_modules() if mc.is_quantized_linear(m) and m.weight_quantizer.is_enabled}
    sizes = {n: hessian_bytes(m) for n, m in layers.items()}
    budget = group_budget(next(iter(layers.values())).weight.device) if layers else 0
    if sum(sizes.values()) <= budget:
        return mc.gptq(model, forward_loop, perc_damp=perc_damp, block_size=block_size, fused=fused)
    mc.max_calibrate(model, forward_loop=forward_loop)
    off = [{"quantizer_name": "*weight_quantizer", "enable": False}]
    with mc.set_quantizer_by_cfg_context(model, off):
        order = call_order(model, list(layers), forward_loop)
    parts = groups(order, list(layers), sizes, budget)
    name_to_module = dict(model.named_modules())
    for index in reversed(range(len(parts))):
        handles = {}
        for name in parts[index]:
            module = layers[name]
            helper = mc._GPTQ_HELPER_REGISTRY.get(getattr(module.weight_quantizer, "backend", None), mc.GPTQHelper)
            handles[name] = helper(module, name, offload_to_cpu=True, fused=fused)
            handles[name].setup()

        def stop(_module: torch.nn.Module, _args: Any) -> None:
            raise StopForward

        ends = [layers[parts[index + 1][0]].register_forward_pre_hook(stop)] if index + 1 < len(parts) else []
        try:
            with mc.set_quantizer_by_cfg_context(model, off):
                forward_loop(model)
        finally:
            for end in ends:
                end.remove()
            for handle in handles.values():
                handle.cleanup()
        for handle in handles.values():
            with mc.enable_weight_access_and_writeback(handle.module, model, name_to_module):
                handle.update_weights(block_size, perc_damp)
            handle.free()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return None


@contextmanager
def faster_update() -> Iterator[None]:
    """ModelOpt's GPTQ with its Hessians collected in groups (:func:`grouped`) and placed by :func:`hessian_on_cpu`,
    its column loop run by the fused kernel or with :class:`Columns`, and without its per-Linear log of the
    Hessian-weighted error (two products of the weight and the Hessian, only printed, and the build silences
    ModelOpt's output: 7.2 s of the Nano's GPTQ build on an H200), for the duration."""
    modelopt_imported()
    from modelopt.torch.quantization.mode import GPTQModeDescriptor
    from modelopt.torch.quantization.utils import calib_utils

    from release.core.memory import cap

    collect = GPTQModeDescriptor.__dict__["_calib_func"]
    update, log = calib_utils.gptq_blockwise_update, calib_utils.GPTQHelper._print_mse_error
    used = calib_utils.get_used_gpu_mem_fraction

    def blockwise(weight: torch.Tensor, h_inv: torch.Tensor, block_size: int, quantize_fn: Any) -> None:
        if fused(quantize_fn, weight):
            from release.quantize.recipes import gptq_triton

            gptq_triton.update(weight, h_inv, block_size, *fp8_scales(quantize_fn, weight))
        elif elementwise(quantize_fn) and not weight.is_cuda:
            update(weight, h_inv, block_size, lambda w: Columns(quantize_fn, w))
        else:  # not elementwise, or a GPU without the kernel: there the column alone is no faster (0.9x, H200)
            update(weight, h_inv, block_size, quantize_fn)

    def placement(device: Any) -> float:  # ModelOpt's test is "> 0.65": 1.0 sends the Hessian to the CPU
        if torch.device(device).type != "cuda":
            return 0.0  # a CPU build: the Hessian stays beside its weight
        return 1.0 if hessian_on_cpu(torch.cuda.mem_get_info(device)[0], cap() is not None) else 0.0

    calib_utils.gptq_blockwise_update = blockwise
    calib_utils.GPTQHelper._print_mse_error = lambda self, hessian: None
    calib_utils.get_used_gpu_mem_fraction = placement
    GPTQModeDescriptor._calib_func = grouped
    try:
        yield
    finally:
        GPTQModeDescriptor._calib_func = collect
        calib_utils.gptq_blockwise_update = update
        calib_utils.GPTQHelper._print_mse_error = log
        calib_utils.get_used_gpu_mem_fraction = used


class Gptq(Step):
    name = "gptq"

    def changes_weights(self, build: BuildConfig) -> bool:
        return True

    def max_weight_error(self, build: BuildConfig) -> float | None:
        return MAX_WEIGHT_ERROR

    def algorithm(self, build: BuildConfig) -> dict[str, Any]:
        g = build.section(self.name)
        return {"method": "gptq", "perc_damp": g.perc_damp, "block_size": g.block_size,
                "layerwise": {"enable": g.layerwise}}

    def calibrating(self, build: BuildConfig) -> Any:
        return faster_update()
