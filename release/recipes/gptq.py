"""GPTQ with ModelOpt's own ``gptq`` algorithm on the scheme's FP8 quantizers (``GPTQCalibConfig``).

ModelOpt's GPTQ first max-calibrates (the weight and input amax of the unchanged weights: the same as round-to-nearest
on the same data), then collects each Linear's Hessian in a second pass and updates the weights column by column so
that the layer's output error on that data shrinks. The first pass reads the calibration calls, the second the
algorithm calls (the seed: 256 calls for the scales, 32 for the algorithm); observers record the first only. With
``layerwise`` ModelOpt calibrates decoder layer by decoder layer, each from the quantized outputs of the layers before
it, both passes on the calibration calls.

ModelOpt's column loop (``gptq_blockwise_update``) fake-quantizes the whole weight matrix for each column and keeps
that one column: a Linear costs in_features x out_features x in_features element operations. The scheme's weight
quantizers are elementwise with a calibrated amax (one per tensor or per output row), so the column quantized alone is
the same bits; :func:`columnwise` runs ModelOpt's loop unchanged with a quantizer that does only that. It is what a
CPU needs (9-26x faster per Linear). On an H200 the whole-matrix quantization is not the cost: the Nano's 504 Linears
took 897 s with ModelOpt's loop and 952 s column-wise, both bound by the loop's per-column launches and Python
(0.33 ms a column), so a GPU build keeps ModelOpt's loop as it is (BENCHMARKS.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from release.config import BuildConfig
from release.recipes.base import Step

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


@contextmanager
def columnwise() -> Iterator[None]:
    """ModelOpt's GPTQ with its column loop's quantizer replaced by :class:`Columns` (for the duration)."""
    from modelopt.torch.quantization.utils import calib_utils

    update = calib_utils.gptq_blockwise_update

    def blockwise(weight: torch.Tensor, h_inv: torch.Tensor, block_size: int, quantize_fn: Any) -> None:
        if not elementwise(quantize_fn):
            update(weight, h_inv, block_size, quantize_fn)
            return
        update(weight, h_inv, block_size, lambda w: Columns(quantize_fn, w))

    calib_utils.gptq_blockwise_update = blockwise
    try:
        yield
    finally:
        calib_utils.gptq_blockwise_update = update


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
        # On a CPU the whole matrix per column is the cost (9-26x); on an H200 it is not, the loop's per-column
        # launches and Python are, and the column-wise quantizer measured 0.9x there (BENCHMARKS.md)
        from release.policy import compute_device

        return columnwise() if compute_device() == "cpu" else contextlib.nullcontext()
