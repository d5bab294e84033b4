"""The recipes ModelOpt lacks for FP8 (domain notes §6), built on ModelOpt's quantizers.

* SmoothQuant with a per-layer alpha search: smoothing scales are folded into the RMSNorm before each norm -> Linear
  group and into ``up_proj`` for ``down_proj``, so the exported checkpoint keeps the RTN build's structure.
* Activation observers: a moving average of each call's maximum, the range-shrink observer (a moving average of each
  call's signed bounds with 0.01 % of each tail dropped), and ModelOpt's histogram calibrator; their amax values are
  loaded into ModelOpt's input quantizers after its max calibration.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from release import ReleaseError
from release.config import BuildConfig, Calibrator
from release.export import FP8_MAX, module_weight, quantized_linears_of

ROWS_PER_CALL = 64  # activation rows kept per algorithm call for the alpha search (evenly spaced, deterministic)


@dataclass(frozen=True)
class Group:
    """Linears that read one activation, and the module whose weight absorbs the smoothing (``anchor``)."""

    anchor: str  # an RMSNorm (weight scaled per channel) or an up_proj (rows scaled)
    linears: tuple[str, ...]

    @property
    def folds_into_linear(self) -> bool:
        return self.anchor.endswith("up_proj")


def smoothing_groups(num_layers: int, quantized: set[str], fold_up_down: bool) -> list[Group]:
    groups = []
    for i in range(num_layers):
        p = f"layers.{i}"
        candidates = [
            Group(f"{p}.input_layernorm", tuple(f"{p}.self_attn.to_{x}" for x in "qkv")),
            Group(f"{p}.input_layernorm_moe_gen", tuple(f"{p}.self_attn.add_{x}_proj" for x in "qkv")),
            Group(f"{p}.post_attention_layernorm", (f"{p}.mlp.gate_proj", f"{p}.mlp.up_proj")),
            Group(f"{p}.post_attention_layernorm_moe_gen", (f"{p}.mlp_moe_gen.gate_proj", f"{p}.mlp_moe_gen.up_proj")),
        ]
        if fold_up_down:
            candidates += [Group(f"{p}.mlp.up_proj", (f"{p}.mlp.down_proj",)),
                           Group(f"{p}.mlp_moe_gen.up_proj", (f"{p}.mlp_moe_gen.down_proj",))]
        groups += [g for g in candidates if set(g.linears) <= quantized]
    return groups


def _finite(x: torch.Tensor, where: str, call: int) -> None:
    if not torch.isfinite(x).all():
        raise ReleaseError(f"non-finite activation (NaN or Inf) at the input of {where} in transformer call {call}; "
                           "check the source weights and the observations")


@contextmanager
def input_hooks(model: torch.nn.Module, names: list[str],
                record: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Call ``record(name, input)`` on every forward of the named Linears."""

    def make(name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            record(name, args[0].detach())
        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(make(n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def fp8_qdq(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Per-tensor FP8 E4M3 quantize-dequantize in fp32 (ModelOpt's fake-quant arithmetic)."""
    scale = amax.clamp_min(1e-12) / FP8_MAX
    return (t / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def _group_error(x: torch.Tensor, amax_x: torch.Tensor, weights: list[torch.Tensor],
                 s: torch.Tensor | None) -> float:
    """Relative squared output error of the FP8-quantized group (smoothed by ``s``) against BF16."""
    num = den = 0.0
    xs, ax = (x, amax_x.max()) if s is None else (x / s, (amax_x / s).max())
    xq = fp8_qdq(xs, ax)
    for w in weights:
        ref = x @ w.T
        ws = w if s is None else (w * s).to(torch.bfloat16).float()
        out = xq @ fp8_qdq(ws, ws.abs().max()).T
        num += float(((out - ref) ** 2).sum())
        den += float((ref**2).sum())
    return num / max(den, 1e-30)


def _scales(amax_x: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    w = torch.stack([wt.abs().amax(dim=0) for wt in weights]).amax(dim=0).clamp_min(1e-5)
    a = amax_x.clamp_min(1e-5)
    return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp_min(1e-5)


def smooth(model: torch.nn.Module, build: BuildConfig, calls: list[dict[str, Any]],
           progress: Callable[[int], None] | None = None) -> tuple[list[dict[str, Any]], dict[str, torch.Tensor]]:
    """Search alpha per group on ``calls``, fold the smoothing into ``model`` in place.

    Returns the alpha table (group, alpha, error before and after) and the smoothing scales per anchor.
    """
    assert build.smoothquant is not None
    quantized = set(quantized_linears_of(model, build))
    num_layers = 1 + max(int(name.split(".")[1]) for name in quantized)
    groups = smoothing_groups(num_layers, quantized, build.smoothquant.fold_up_down)
    if not groups:
        raise ReleaseError(f"builds/{build.name}.yaml: no norm -> Linear group among the quantized Linears")
    first = {g.linears[0]: g for g in groups}
    amax: dict[str, torch.Tensor] = {}
    rows: dict[str, list[torch.Tensor]] = {g.anchor: [] for g in groups}
    current = {"call": 0}

    def record(name: str, x: torch.Tensor) -> None:
        _finite(x, name, current["call"])
        x2 = x.reshape(-1, x.shape[-1]).float()
        g = first[name]
        cur = x2.abs().amax(dim=0)
        amax[g.anchor] = cur if g.anchor not in amax else torch.maximum(amax[g.anchor], cur)
        step = max(1, x2.shape[0] // ROWS_PER_CALL)
        rows[g.anchor].append(x2[::step][:ROWS_PER_CALL])

    with input_hooks(model, list(first), record), torch.no_grad():
        for index, call in enumerate(calls):
            current["call"] = index
            model(**call)
    if build.smoothquant.alpha == "auto":
        n = round(1.0 / build.smoothquant.alpha_step)
        grid = [round(i * build.smoothquant.alpha_step, 6) for i in range(n + 1)]
    else:
        grid = [float(build.smoothquant.alpha)]
    table, scales = [], {}
    with torch.no_grad():
        for g in groups:
            x = torch.cat(rows[g.anchor])
            weights = [module_weight(model, n).float() for n in g.linears]
            before = _group_error(x, amax[g.anchor], weights, None)
            errors = {a: _group_error(x, amax[g.anchor], weights, _scales(amax[g.anchor], weights, a)) for a in grid}
            alpha = min(grid, key=lambda a: (errors[a], a))
            s = _scales(amax[g.anchor], weights, alpha)
            _fold(model, g, s)
            table.append({"group": g.anchor, "linears": list(g.linears), "alpha": alpha,
                          "error_before": before, "error_after": errors[alpha]})
            scales[g.anchor] = s
            if progress:
                progress(1)
    return table, scales


def folded(anchor: torch.Tensor, linears: list[torch.Tensor], s: torch.Tensor,
           into_linear: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Smoothing ``x' = x / s`` absorbed by the anchor's weight, ``W' = W * s`` for every Linear (bf16 storage).

    An RMSNorm anchor scales its per-channel weight; an ``up_proj`` anchor scales its rows, which produce
    ``down_proj``'s input channels.
    """
    new_anchor = anchor.float() / (s[:, None] if into_linear else s)
    return new_anchor.to(anchor.dtype), [(w.float() * s[None, :]).to(w.dtype) for w in linears]


def _fold(model: torch.nn.Module, group: Group, s: torch.Tensor) -> None:
    anchor = module_weight(model, group.anchor)
    linears = [module_weight(model, name) for name in group.linears]
    new_anchor, new_linears = folded(anchor.data, [w.data for w in linears], s, group.folds_into_linear)
    anchor.data = new_anchor
    for w, new in zip(linears, new_linears, strict=True):
        w.data = new


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
        self.ema: dict[str, torch.Tensor] = {}
        self.hist: dict[str, Any] = {}

    def record(self, name: str, x: torch.Tensor) -> None:
        _finite(x, name, self.call)
        method = self.calibrator.method
        if method in ("moving_average", "range_shrink"):
            cur = x.abs().amax().float() if method == "moving_average" \
                else tail_quantiles(x, self.calibrator.shrink_percent / 100)
            prev = self.ema.get(name)
            self.ema[name] = cur if prev is None else prev + self.calibrator.momentum * (cur - prev)
        elif method == "histogram":
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
