"""Smoothing recipes: SmoothQuant and AWQ, folded into the weights so that the export keeps NVIDIA's structure.

Both move activation range into the weights with a per-input-channel scale ``s`` (``x' = x / s``, ``W' = W * s``),
absorbed by the module in front of each group of Linears that read one activation: the RMSNorm before q/k/v and
before gate/up (its weight is divided by ``s``), and ``up_proj`` before ``down_proj`` (its rows are divided by
``s``). The two differ in the scale and its grid:

* SmoothQuant: ``s = max|x|^alpha / max|W|^(1 - alpha)``, alpha searched per group over 0.0 ... 1.0 or fixed;
* AWQ: ``s = mean|x|^alpha``, normalised by ``sqrt(max(s) * min(s))``, alpha over AWQ's grid 0, 1/n, ..., (n-1)/n.

Each group takes the alpha with the lowest output error of the FP8-quantized group (weights and activations in the
build's scheme) against BF16 on the algorithm calls. ModelOpt's own ``smoothquant`` is INT8-only and its
``awq_lite`` leaves a per-Linear ``pre_quant_scale`` that diffusers' W8A16 path ignores, so neither is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from release.core.config import BuildConfig
from release.core.errors import ReleaseError
from release.core.fp8 import qdq
from release.core.memory import weights_of
from release.quantize.recipes import per_channel
from release.quantize.recipes.base import (
    Context,
    FiniteCheck,
    Step,
    input_hooks,
    module_weight,
    quantized_linears_of,
    sample_rows,
)


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


@dataclass
class Statistics:
    """Per-channel activation statistics of each group's input over the algorithm calls."""

    amax: dict[str, torch.Tensor]  # max |x| per channel
    abs_sum: dict[str, torch.Tensor]  # sum of |x| per channel
    count: dict[str, int]  # rows summed
    rows: dict[str, list[torch.Tensor]]  # sampled rows for the error of each alpha

    def mean_abs(self, anchor: str) -> torch.Tensor:
        return self.abs_sum[anchor] / max(1, self.count[anchor])


def collect(model: torch.nn.Module, groups: list[Group], calls: list[dict[str, Any]]) -> Statistics:
    first = {g.linears[0]: g for g in groups}
    stats = Statistics({}, {}, {}, {g.anchor: [] for g in groups})
    current = {"call": 0}
    finite = FiniteCheck()

    def record(name: str, x: torch.Tensor) -> None:
        finite.record(x, name, current["call"])
        anchor = first[name].anchor
        x2 = x.reshape(-1, x.shape[-1]).float().abs()
        cur = x2.amax(dim=0)
        stats.amax[anchor] = cur if anchor not in stats.amax else torch.maximum(stats.amax[anchor], cur)
        stats.abs_sum[anchor] = x2.sum(dim=0) + stats.abs_sum.get(anchor, 0)
        stats.count[anchor] = stats.count.get(anchor, 0) + x2.shape[0]
        stats.rows[anchor].append(sample_rows(x))

    with input_hooks(model, list(first), record), torch.no_grad():
        for index, call in enumerate(calls):
            current["call"] = index
            model(**call)
    finite.check()
    return stats


def group_errors(x: torch.Tensor, amax_x: torch.Tensor, weights: list[torch.Tensor],
                 scales: list[torch.Tensor | None], scheme: str) -> list[float]:
    """Relative squared output error of the FP8-quantized group against BF16, smoothed by each of ``scales`` (None:
    unsmoothed), in the build's scheme: per-tensor static (the input amax is that of all algorithm calls) or
    per-channel weights with per-token inputs. The BF16 outputs are computed once for all scales, and the errors
    read from the device once (one wait for the GPU per group, not two per weight and scale)."""
    refs = [x @ w.T for w in weights]
    den = sum((float((ref**2).sum()) for ref in refs), 0.0)
    sums = []
    for s in scales:
        xs = x if s is None else x / s
        if scheme == per_channel.SCHEME:
            xq = qdq(xs, xs.abs().amax(dim=-1, keepdim=True))
        else:
            xq = qdq(xs, amax_x.max() if s is None else (amax_x / s).max())
        for w, ref in zip(weights, refs, strict=True):
            ws = w if s is None else (w * s).to(torch.bfloat16).float()
            amax_w = ws.abs().amax(dim=1, keepdim=True) if scheme == per_channel.SCHEME else ws.abs().max()
            sums.append(((xq @ qdq(ws, amax_w).T - ref) ** 2).sum())
    values = torch.stack(sums).tolist()  # summed per scale in the weights' order, as before: the same floats
    return [sum(values[i * len(weights):(i + 1) * len(weights)], 0.0) / max(den, 1e-30) for i in range(len(scales))]


def folded(anchor: torch.Tensor, linears: list[torch.Tensor], s: torch.Tensor,
           into_linear: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Smoothing ``x' = x / s`` absorbed by the anchor's weight, ``W' = W * s`` for every Linear (bf16 storage).

    An RMSNorm anchor scales its per-channel weight; an ``up_proj`` anchor scales its rows, which produce
    ``down_proj``'s input channels.
    """
    return _divided(anchor, s, into_linear), [_multiplied(w, s) for w in linears]


def _divided(anchor: torch.Tensor, s: torch.Tensor, into_linear: bool) -> torch.Tensor:
    return (anchor.float() / (s[:, None] if into_linear else s)).to(anchor.dtype)


def _multiplied(weight: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return (weight.float() * s[None, :]).to(weight.dtype)


def smoothed_weight(weight: torch.Tensor, name: str, table: list[dict[str, Any]],
                    scales: dict[str, torch.Tensor]) -> torch.Tensor:
    """Linear ``name``'s ``weight`` with every fold of ``table`` (the alpha table, in the order folded) that touches
    it: the same operations :func:`folded` applied to the model, on ``weight``'s device, one Linear at a time (an
    ``up_proj`` is a Linear of its norm's group and the anchor of ``down_proj``'s)."""
    for row in table:
        s = scales[row["group"]].to(weight.device)
        if row["group"] == name:
            weight = _divided(weight, s, True)
        if name in row["linears"]:
            weight = _multiplied(weight, s)
    return weight


def _fold(model: torch.nn.Module, group: Group, s: torch.Tensor) -> None:
    anchor = module_weight(model, group.anchor)
    linears = [module_weight(model, name) for name in group.linears]
    new_anchor, new_linears = folded(anchor.data, [w.data for w in linears], s, group.folds_into_linear)
    anchor.data = new_anchor
    for w, new in zip(linears, new_linears, strict=True):
        w.data = new


class Smoothing(Step):
    """The shared search: statistics, the alpha grid, the error of each alpha, the fold."""

    def grid(self, build: BuildConfig) -> list[float]:
        raise NotImplementedError

    def scales(self, stats: Statistics, group: Group, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
        raise NotImplementedError

    def transforms(self, build: BuildConfig) -> bool:
        return True

    def before(self, ctx: Context) -> None:
        build, model = ctx.build, ctx.model
        quantized = set(quantized_linears_of(model, build))
        num_layers = 1 + max(int(name.split(".")[1]) for name in quantized)
        groups = smoothing_groups(num_layers, quantized, build.section(self.name).fold_up_down)
        if not groups:
            raise ReleaseError(f"builds/{build.name}.yaml: no norm -> Linear group among the quantized Linears")
        stats = collect(model, groups, ctx.algorithm_calls)
        grid = self.grid(build)
        with torch.no_grad():
            for g in groups:
                with weights_of(g.anchor, model, writeback=True):
                    self._smooth(ctx, stats, g, grid)

    def _smooth(self, ctx: Context, stats: Statistics, g: Group, grid: list[float]) -> None:
        """Choose group ``g``'s alpha by its error and fold its scales into the weights."""
        build, model = ctx.build, ctx.model
        x = torch.cat(stats.rows[g.anchor])
        weights = [module_weight(model, n).float() for n in g.linears]
        amax = stats.amax[g.anchor]
        before, *each = group_errors(x, amax, weights, [None] + [self.scales(stats, g, weights, a) for a in grid],
                                     build.scheme)
        errors = dict(zip(grid, each, strict=True))
        alpha = min(grid, key=lambda a: (errors[a], a))
        s = self.scales(stats, g, weights, alpha)
        _fold(model, g, s)
        ctx.result.alpha_table.append({"group": g.anchor, "linears": list(g.linears), "alpha": alpha,
                                       "error_before": before, "error_after": errors[alpha]})
        ctx.result.smoothing_scales[g.anchor] = s

class SmoothQuant(Smoothing):
    name = "smoothquant"

    def grid(self, build: BuildConfig) -> list[float]:
        sq = build.section(self.name)
        if sq.alpha != "auto":
            return [float(sq.alpha)]
        n = round(1.0 / sq.alpha_step)
        return [round(i * sq.alpha_step, 6) for i in range(n + 1)]

    def scales(self, stats: Statistics, group: Group, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
        w = torch.stack([wt.abs().amax(dim=0) for wt in weights]).amax(dim=0).clamp_min(1e-5)
        a = stats.amax[group.anchor].clamp_min(1e-5)
        return (a.pow(alpha) / w.pow(1.0 - alpha)).clamp_min(1e-5)


class Awq(Smoothing):
    name = "awq"

    def grid(self, build: BuildConfig) -> list[float]:
        n = build.section(self.name).n_grid
        return [round(i / n, 6) for i in range(n)]

    def scales(self, stats: Statistics, group: Group, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
        s = stats.mean_abs(group.anchor).pow(alpha).clamp_min(1e-4)
        return s / (s.max() * s.min()).sqrt()
