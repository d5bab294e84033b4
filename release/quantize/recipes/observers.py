"""Activation observers ModelOpt lacks for FP8 (domain notes §6): their input amax values replace ModelOpt's max
calibration in the input quantizers. The observer also takes each input's max |x| on every build, the same value
ModelOpt's max calibrator collects, in one pass of the BF16 model with a hook per Linear.

* a moving average of each call's maximum;
* the range-shrink observer (Texas Instruments edgeai-tensorlab): a moving average of each call's signed bounds with
  ``shrink_percent`` percent of each tail dropped;
* ModelOpt's own histogram calibrator, at a percentile.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from release.core.config import Calibrator
from release.core.device import modelopt_imported
from release.core.profile import stage
from release.quantize.recipes.base import FiniteCheck, input_hooks, is_cosmos3


def tail_quantiles(x: torch.Tensor, q: float) -> torch.Tensor:
    """The ``q`` and ``1 - q`` quantiles of ``x``'s signed values, ``torch.stack([lo, hi])``.

    The convention is ``torch.quantile``'s default ``'linear'``: of the sorted values ``v``, the rank ``q * (n - 1)``
    interpolated between its two neighbours (and mirrored from the top for ``1 - q``), the rank in float64 (on a
    float32 tensor ``torch.quantile`` rounds the rank to float32, off by up to ``n * 2^-24``). ``torch.quantile``
    refuses more than 2^24 elements, so each tail's neighbours are selected with ``topk`` (its ``floor(rank) + 2``
    smallest or largest values), which is exact and sorts only the tail.
    """
    flat = x.reshape(-1).float()
    n = flat.numel()
    rank = q * (n - 1)
    i = math.floor(rank)
    bounds = []
    for largest in (False, True):
        tail = flat.topk(min(i + 2, n), largest=largest).values  # sorted from the tail's end
        bounds.append(torch.lerp(tail[i], tail[min(i + 1, n - 1)], rank - i))
    return torch.stack(bounds)


class Observer:
    """Input amax per quantized Linear from the calibration calls, for calibrators other than ModelOpt's max.

    ``moving_average`` and ``range_shrink`` share one exponential moving average over the calls (the first call
    initialises it): of each call's max |x|, or of each call's signed bounds after dropping ``shrink_percent`` percent
    from each tail (Texas Instruments edgeai-tensorlab's range-shrink observer, amax = max(|lo|, |hi|)).
    """

    def __init__(self, calibrator: Calibrator, names: list[str]) -> None:
        self.calibrator = calibrator
        self.names = names
        self.call = 0
        self.max: dict[str, torch.Tensor] = {}  # max |x| over the calls, in the input's dtype (ModelOpt's max)
        self.ema: dict[str, torch.Tensor] = {}
        self.hist: dict[str, Any] = {}
        self.finite = FiniteCheck()

    @torch.no_grad()
    def observe(self, model: torch.nn.Module, calls: list[dict[str, Any]], also: Sequence[Observer] = ()) -> None:
        """Record the input of every observed Linear over ``calls``, into this observer and into ``also``'s (other
        calibrators of the same Linears: one forward for all; the inputs are checked for finiteness once)."""

        def record(name: str, x: torch.Tensor) -> None:
            self.record(name, x)
            for other in also:
                other.collect(name, x)

        with input_hooks(model, self.names, record):
            for index, call in enumerate(calls):
                self.call = index
                model(**call)
        self.finite.check()

    def record(self, name: str, x: torch.Tensor) -> None:
        self.finite.record(x, name, self.call)
        self.collect(name, x)

    def collect(self, name: str, x: torch.Tensor) -> None:
        cur_max = x.abs().amax()
        self.max[name] = cur_max if name not in self.max else torch.maximum(self.max[name], cur_max)
        method = self.calibrator.method
        if method in ("moving_average", "range_shrink"):
            cur = x.abs().amax().float() if method == "moving_average" \
                else tail_quantiles(x, self.calibrator.shrink_percent / 100)
            prev = self.ema.get(name)
            self.ema[name] = cur if prev is None else prev + self.calibrator.momentum * (cur - prev)
        elif method == "histogram":
            modelopt_imported()
            from modelopt.torch.quantization.calib import HistogramCalibrator

            if name not in self.hist:
                self.hist[name] = HistogramCalibrator(num_bits=8, axis=None, unsigned=False)
            self.hist[name].collect(x.float())

    def amax(self) -> dict[str, torch.Tensor]:
        if self.calibrator.method in ("moving_average", "range_shrink"):
            # a max |x| is its own amax; range-shrink bounds give max(|lo|, |hi|)
            return {n: v.abs().amax() for n, v in self.ema.items()}
        if self.calibrator.method == "histogram":
            return {n: c.compute_amax("percentile", percentile=self.calibrator.percentile).float()
                    for n, c in self.hist.items()}
        return {}


class ObserverPasses:
    """The observer passes of one run's builds (``release build --all``) that observe the source model as it is (no
    step transforms it first): the first such build's pass records, in one forward of the calibration calls, every
    calibrator these builds use (RTN's max, the moving averages, range shrink, the histogram), and each later build
    with the same calls and Linears takes its calibrator's observer instead of running the calls again. The values
    are those of a pass of its own: the same model (the source's tensors) on the same inputs."""

    def __init__(self, calibrators: Iterable[Calibrator] = ()) -> None:
        self.calibrators = list({c.model_dump_json(): c for c in calibrators}.values())
        self.observers: dict[str, Observer] = {}

    @staticmethod
    def _key(calibrator: Calibrator, names: list[str], calls: list[dict[str, Any]]) -> str:
        return f"{calibrator.model_dump_json()}|{len(calls)}|{','.join(names)}"

    def observer(self, model: torch.nn.Module, calibrator: Calibrator, names: list[str],
                 calls: list[dict[str, Any]]) -> Observer:
        """``calibrator``'s observer of ``names`` over ``calls``, from the pass that recorded it or from a new one."""
        key = self._key(calibrator, names, calls)
        if key not in self.observers:
            others = [Observer(c, names) for c in self.calibrators
                      if c != calibrator and self._key(c, names, calls) not in self.observers]
            observer = Observer(calibrator, names)
            with stage("quantize: observer pass"):
                observer.observe(model, calls, others)
            self.observers.update({self._key(o.calibrator, names, calls): o for o in [observer, *others]})
        return self.observers[key]


@contextmanager
def observed_layers() -> Iterator[None]:
    """ModelOpt's layer-by-layer max calibration with each decoder layer's input maxima taken by :class:`Observer`'s
    hooks during a plain forward of the layer's replayed inputs, instead of through ModelOpt's quantizers, whose
    Python code and checks per quantizer and call cost more than the layer's compute (the seed's AutoRound builds:
    106 s of ModelOpt's calibration at the Nano's size on an H200, BENCHMARKS.md). The same values: ModelOpt's
    calibration passes the inputs through unquantized and takes their max |x| in the input's dtype; the weights keep
    ModelOpt's weight calibration, and every other algorithm (GPTQ layer by layer) runs as it is. On a Cosmos3 model
    each next layer's inputs are the calibrated layer's outputs on its own inputs (:func:`_next_layer_inputs`), where
    ModelOpt runs every call through the model up to the next layer again, for each layer."""
    modelopt_imported()
    from modelopt.torch.quantization import mode, model_calib
    from modelopt.torch.quantization.utils.layerwise_calib import LayerActivationCollector

    layerwise = mode.layerwise_calibrate
    next_inputs = LayerActivationCollector.cache_outputs_for_next_layer_calib

    def patched(model: Any, forward_loop: Any, calib_func: Callable[..., Any], **kwargs: Any) -> Any:
        if calib_func is not model_calib.max_calibrate:
            return layerwise(model, forward_loop, calib_func=calib_func, **kwargs)

        def calibrate(layer: torch.nn.Module, replay: Callable[[torch.nn.Module], None], **calib: Any) -> Any:
            return calib_func(layer, lambda m: _observe_replay(m, replay), **calib)

        return layerwise(model, forward_loop, calib_func=calibrate, **kwargs)

    def cached(collector: Any, layer: torch.nn.Module, forward_loop: Any) -> list[Any]:
        if not is_cosmos3(collector.model):
            return next_inputs(collector, layer, forward_loop)
        following: Any = collector._decoder_layers[collector._layer_to_idx[layer] + 1]._layerwise_calib
        following.collected_inputs = _next_layer_inputs(layer)  # where the layer after it finds them, as ModelOpt's
        return list(following.collected_inputs)

    mode.layerwise_calibrate = patched
    LayerActivationCollector.cache_outputs_for_next_layer_calib = cached
    try:
        yield
    finally:
        mode.layerwise_calibrate = layerwise
        LayerActivationCollector.cache_outputs_for_next_layer_calib = next_inputs


@torch.no_grad()
def _next_layer_inputs(layer: torch.nn.Module) -> list[Any]:
    """The next Cosmos3 decoder layer's inputs: this layer's outputs on the inputs ModelOpt captured for it, in its
    current state (calibrated, quantizers as ModelOpt left them), with the rotary embedding passed on, as
    ``Cosmos3OmniTransformer._run_decoder_stack`` calls the layers (``und, gen = layer(und, gen, rotary)``).
    ModelOpt gets them by a forward of every calibration call through the whole model up to the next layer, once per
    layer; this runs the one layer."""
    info: Any = layer._layerwise_calib  # ModelOpt's per-layer state; the captured inputs are dropped once used
    inputs, info.collected_inputs = info.collected_inputs, []
    out = []
    for args, kwargs in inputs:
        und, gen = layer(*args, **kwargs)
        out.append(((und, gen, *args[2:]), kwargs))
    return out


@torch.no_grad()
def _observe_replay(layer: torch.nn.Module, replay: Callable[[torch.nn.Module], None]) -> None:
    """Replay a layer's inputs with its quantizers bypassed and set each static input quantizer's amax to the max |x|
    its Linear saw (ModelOpt's calibrators, which saw nothing, then leave it)."""
    modelopt_imported()
    from modelopt.torch.quantization.nn import TensorQuantizer

    names = [n for n, m in layer.named_modules() if getattr(getattr(m, "input_quantizer", None), "is_enabled", False)
             and not getattr(m.input_quantizer, "_dynamic", False)]
    active = [m for m in layer.modules() if isinstance(m, TensorQuantizer) and m.is_enabled]
    observer = Observer(Calibrator(method="max"), names)
    for quantizer in active:
        quantizer.disable()
    try:
        with input_hooks(layer, names, observer.record):
            replay(layer)
    finally:
        for quantizer in active:
            quantizer.enable()
    observer.finite.check()
    for name in names:
        module: Any = layer.get_submodule(name)
        module.input_quantizer.amax = observer.max[name]
