"""Recipes: how a build's FP8 weights and scales are made, on ModelOpt's quantizers.

A build file's ``recipe`` lists its steps (``RECIPES``, one module per family): at most one smoothing step
(``smoothing``: SmoothQuant, AWQ), then at most one weight step (``gptq``; ``autoround``); ``rtn`` alone is ModelOpt's
round-to-nearest, NVIDIA's recipe. The input scales come from the build's calibrator (``observers``), its scheme is
per-tensor (NVIDIA's) or per-channel (``per_channel``). :func:`quantize` runs them in that order on a BF16 model.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from release.core.config import BuildConfig
from release.core.device import modelopt_imported
from release.core.errors import ReleaseError
from release.core.fp8 import dequantize, weight_codes
from release.core.memory import execution_device, state_dict
from release.core.profile import stage
from release.quantize.recipes import per_channel
from release.quantize.recipes.autoround import AutoRound
from release.quantize.recipes.base import (
    Context,
    Quantized,
    Step,
    input_hooks,
    quant_config,
    quantized_linears,
    quantized_linears_of,
    register_decoder_layers,
    sample_rows,
    stoppable,
)
from release.quantize.recipes.gptq import Gptq
from release.quantize.recipes.observers import Observer, ObserverPasses, observed_layers, tail_quantiles
from release.quantize.recipes.smoothing import Awq, SmoothQuant, folded, smoothed_weight

__all__ = ["RECIPES", "Observer", "ObserverPasses", "Quantized", "changes_weights", "folded", "max_weight_error",
           "observes_source", "quant_config", "quantize", "quantized_linears", "steps", "tail_quantiles"]

RECIPES: dict[str, Step] = {step.name: step for step in (Step(), SmoothQuant(), Awq(), Gptq(), AutoRound())}
RECONSTRUCTION_ROWS = 32  # activation rows per algorithm call kept for the reconstruction error


def steps(build: BuildConfig) -> list[Step]:
    return [RECIPES[name] for name in build.recipe]


def changes_weights(build: BuildConfig) -> bool:
    """Whether the build's FP8 codes are its recipe's own rather than a round-to-nearest of the (smoothed) source."""
    return any(step.changes_weights(build) for step in steps(build))


def observes_source(build: BuildConfig) -> bool:
    """Whether the build's calibrator observes the source model as it is: no step transforms it first and ModelOpt
    does not calibrate it layer by layer (its observer pass can then be another build's, :class:`ObserverPasses`)."""
    return not build.layerwise and not any(step.transforms(build) for step in steps(build))


def max_weight_error(build: BuildConfig) -> float | None:
    bounds = [b for step in steps(build) if (b := step.max_weight_error(build)) is not None]
    return max(bounds) if bounds else None


def quantize(model: torch.nn.Module, build: BuildConfig, calls: list[dict[str, Any]],
             algorithm_calls: list[dict[str, Any]], observed: ObserverPasses | None = None,
             source: dict[str, torch.Tensor] | None = None) -> Quantized:
    """Apply the build's recipe to ``model`` (BF16, on the device the calls are on) and calibrate it with ModelOpt:
    smoothing first, then a weight step that tunes the BF16 weights (auto-round), then ModelOpt's quantization with
    the weight step's algorithm (first pass: the calibration calls, observed by the calibrator; a second pass,
    GPTQ's Hessians: the algorithm calls), then the calibrator's input scales and any step that works on the
    calibrated model.

    ``observed``: the observer passes of the run's builds (``release build --all``): a build that observes the source
    model as it is (:func:`observes_source`) takes its calibrator's observer from the pass that recorded it (RTN,
    GPTQ, the observer builds and their per-channel siblings: one pass). ``source``: the source's tensors ``model``
    was made from; a weight step reads its starting weights there for the reconstruction error, smoothed as the
    recipe smoothed the model (:class:`_Start`), instead of copying the model's (30 GB to the CPU: 15-23 s of a Nano
    GPTQ build on an H200, BENCHMARKS.md)."""
    modelopt_imported()
    import modelopt.torch.quantization as mtq

    ctx = Context(build, Quantized(model), calls, algorithm_calls)
    recipe = steps(build)
    names = quantized_linears_of(model, build)
    if not names:
        raise ReleaseError(f"builds/{build.name}.yaml: field 'quantized': no Linear matches the patterns")
    for step in recipe:  # smoothing
        if not step.changes_weights(build):
            step.before(ctx)
    weighing = changes_weights(build)  # the weights the weight step starts from, and their inputs
    start: Mapping[str, torch.Tensor] = {}
    if weighing and source is not None:  # the same values, where the source is kept (smoothed when read)
        start = _Start(source, names, ctx.result, execution_device(model))
    elif weighing:
        weights = state_dict(model)
        start = {n: weights[f"{n}.weight"].detach().to("cpu", copy=True) for n in names}
    rows: dict[str, torch.Tensor] = {}
    if weighing:
        with stage("quantize: input rows for the reconstruction error"):
            rows = _input_rows(model, names, algorithm_calls)
    for step in recipe:  # tuned AutoRound
        if step.changes_weights(build):
            step.before(ctx)
    algorithm = next((a for step in recipe if (a := step.algorithm(build)) != "max"), "max")
    if build.layerwise:
        register_decoder_layers()
    observer = Observer(build.calibrator, names)
    if not build.layerwise:  # layer by layer, ModelOpt's calibration runs the calls through the model itself
        shared = observed if observed is not None and observes_source(build) else ObserverPasses()
        observer = shared.observer(model, build.calibrator, names, calls)
    passes = [0]

    @torch.no_grad()
    def forward_loop(m: torch.nn.Module) -> None:
        first = passes[0] == 0
        passes[0] += 1
        if first and not build.layerwise:
            # ModelOpt's max calibration would take the max |x| of the same inputs through its quantizers, whose
            # Python code and checks on every Linear and call cost more than the model's compute (issue 14: 140 s of
            # a 189 s build at the Nano's size); the observer's pass holds the same values.
            for name in names:
                quantizer: Any = m.get_submodule(name).input_quantizer
                if quantizer.is_enabled and not getattr(quantizer, "_dynamic", False):
                    quantizer.amax = observer.max[name]
            return
        if first:  # layer by layer: ModelOpt's own pass, observed
            observer.observe(m, calls)
            return
        for call in calls if build.layerwise else algorithm_calls:
            with stoppable():  # a GPTQ pass of a group of Linears ends after the group (``gptq.grouped``)
                m(**call)

    quiet = contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO())
    with warnings.catch_warnings(), quiet[0], quiet[1], contextlib.ExitStack() as steps_context:
        warnings.simplefilter("ignore")  # ModelOpt prints progress and tqdm bars; errors still raise
        for step in recipe:
            steps_context.enter_context(step.calibrating(build))
        if build.layerwise:
            steps_context.enter_context(observed_layers())
        with stage("quantize: ModelOpt"):
            mtq.quantize(model, quant_config(build, algorithm), forward_loop=forward_loop)
    for name, amax in observer.amax().items():
        quantizer: Any = model.get_submodule(name).input_quantizer
        quantizer.amax = amax.to(quantizer.amax.dtype)
    for step in recipe:
        step.after(ctx)
    if weighing:
        with stage("quantize: reconstruction error"):
            ctx.result.reconstruction = reconstruction(model, build, start, rows)
    return ctx.result


class _Start(Mapping[str, torch.Tensor]):
    """The weights a weight step starts from, read from the source's tensors when asked for, with the recipe's
    smoothing folded in (:func:`smoothed_weight`: the same bits as the smoothed model's), instead of a copy of the
    model's weights made before the step changes them (30 GB to the CPU: 15-23 s of a smoothed GPTQ build at the
    Nano's size on an H200, BENCHMARKS.md)."""

    def __init__(self, source: dict[str, torch.Tensor], names: list[str], result: Quantized, device: str) -> None:
        self.source, self.names, self.result, self.device = source, names, result, device

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.names:
            raise KeyError(name)
        return smoothed_weight(self.source[f"{name}.weight"].to(self.device), name, self.result.alpha_table,
                               self.result.smoothing_scales)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _input_rows(model: torch.nn.Module, names: list[str], calls: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Evenly spaced input rows of every quantized Linear on ``calls`` (BF16 model, before any weight step), kept on
    the CPU for the reconstruction error."""
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in names}
    with input_hooks(model, names, lambda n, x: rows[n].append(sample_rows(x, RECONSTRUCTION_ROWS).cpu())), \
            torch.no_grad():
        for call in calls:
            model(**call)
    return {n: torch.cat(r) for n, r in rows.items() if r}


def _rtn(weight: torch.Tensor, build: BuildConfig, arithmetic: str, device: str) -> torch.Tensor:
    """Round-to-nearest of ``weight`` in the build's scheme, dequantized (what ModelOpt's max calibration and
    compress make of it)."""
    w = weight.to(torch.bfloat16)
    amax = w.abs().amax(dim=1, keepdim=True) if build.scheme == per_channel.SCHEME else w.abs().amax()
    return dequantize(*weight_codes(w, amax, arithmetic, device))


def reconstruction(model: torch.nn.Module, build: BuildConfig, start: Mapping[str, torch.Tensor],
                   rows: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """Per quantized Linear, on calibration rows X of the algorithm calls: the relative output error
    ``|X Wq^T - X W^T|^2 / |X W^T|^2`` of the build's FP8 weight Wq and of round-to-nearest's, W the weight before the
    weight step, and the relative weight error ``|Wq - W| / |W|`` (Frobenius). Computed where the model computes, one
    Linear at a time (BENCHMARKS.md: on the CPU it was most of a GPTQ build's quantization at the Nano's size)."""
    device = execution_device(model)
    arithmetic = build.arithmetic if build.arithmetic != "native" else device
    weights = state_dict(model)
    table = []
    for name, w0 in start.items():
        module: Any = model.get_submodule(name)
        w = w0.to(device).float()
        built = dequantize(*weight_codes(weights[f"{name}.weight"].detach(), module.weight_quantizer.amax.detach(),
                                         arithmetic, device))
        rtn = _rtn(w, build, arithmetic, device)
        x = rows[name].to(device).float()
        ref = x @ w.T
        energy = float((ref**2).sum()) or 1e-30
        table.append({"linear": name, "error": float(((x @ built.T - ref) ** 2).sum()) / energy,
                      "rtn_error": float(((x @ rtn.T - ref) ** 2).sum()) / energy,
                      "weight_error": float((built - w).norm() / w.norm().clamp_min(1e-30))})
    return table
