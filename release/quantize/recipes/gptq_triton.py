"""GPTQ's column loop for an FP8 E4M3 weight with a per-tensor or per-row scale, one Triton launch per block of
columns: ModelOpt's ``gptq_blockwise_update`` element for element, as ModelOpt's own fused kernel
(``gptq_fused_block_scalar``) does it for NVFP4 only.

ModelOpt's loop on a GPU is bound by its per-column launches and Python, about 0.34 ms a column (the Nano's 504
Linears: 897 s on an H200, BENCHMARKS.md). Here one program holds a tile of rows of the block in registers and walks
its columns: rows are independent in GPTQ, only the inverse Hessian's row is shared. Each element sees the operations
of ModelOpt's loop in the same order, each rounded as CUDA rounds it (``x * scale`` to E4M3 with round-to-nearest-even
and saturation, times ``1 / scale``; the error's IEEE division by the diagonal; the update as ``torch.addr``'s
``self + (-err) * h``, the product rounded before the sum), with Triton's contraction of multiply-adds off so that
nothing is fused that PyTorch rounds twice. On an H200 the update as one fused multiply-add changed up to 0.08% of
the weights, the product rounded first none (BENCHMARKS.md, "GPTQ's fused FP8 kernel"). The update of the columns
after the block stays ModelOpt's ``addmm_`` on the same error matrix.

Imported only on a CUDA machine with Triton (``release.quantize.recipes.gptq``)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS = 16  # rows per program: a 16 x 128 tile of weights, quantized weights and errors stays in registers


@triton.jit
def _block(w_ptr, q_ptr, err_ptr, scale_ptr, inv_ptr, scale_step, h_ptr, rows, cols,
           ROWS: tl.constexpr, COLS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    j = tl.arange(0, COLS)
    in_rows = r < rows
    tile = in_rows[:, None] & (j[None, :] < cols)
    offsets = r[:, None] * cols + j[None, :]
    w = tl.load(w_ptr + offsets, mask=tile, other=0.0)
    scale = tl.load(scale_ptr + r * scale_step, mask=in_rows, other=1.0)
    inv = tl.load(inv_ptr + r * scale_step, mask=in_rows, other=1.0)
    q = tl.zeros([ROWS, COLS], dtype=tl.float32)
    err = tl.zeros([ROWS, COLS], dtype=tl.float32)
    for c in range(cols):
        at = j[None, :] == c
        # column c out of the tile: -0.0 is the one addend that leaves every value, -0.0 included, as it is
        wc = tl.sum(tl.where(at, w, -0.0), axis=1)
        x = tl.minimum(tl.maximum(wc * scale, -448.0), 448.0)
        qc = x.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32) * inv
        ec = tl.math.div_rn(wc - qc, tl.load(h_ptr + c * cols + c))
        h = tl.load(h_ptr + c * cols + j, mask=j < cols, other=0.0)
        later = j[None, :] > c
        w = tl.where(later, w + (-ec[:, None]) * h[None, :], w)
        q = tl.where(at, qc[:, None], q)
        err = tl.where(at, ec[:, None], err)
    tl.store(q_ptr + offsets, q, mask=tile)
    tl.store(err_ptr + offsets, err, mask=tile)


def update(weight: torch.Tensor, h_inv: torch.Tensor, block_size: int, scale: torch.Tensor,
           inv_scale: torch.Tensor) -> None:
    """``gptq_blockwise_update(weight, h_inv, block_size, quantizer)`` in place, for the fp32 CUDA ``weight`` of an FP8
    quantizer whose ``scale`` and ``inv_scale`` (one value, or one per row) are the quantizer's own."""
    rows, cols = weight.shape
    step = 0 if scale.numel() == 1 else 1
    scale, inv_scale = scale.reshape(-1).float().contiguous(), inv_scale.reshape(-1).float().contiguous()
    for start in range(0, cols, block_size):
        end = min(start + block_size, cols)
        w = weight[:, start:end].contiguous()
        q, err = torch.empty_like(w), torch.empty_like(w)
        _block[(triton.cdiv(rows, ROWS),)](
            w, q, err, scale, inv_scale, step, h_inv[start:end, start:end].contiguous(), rows, end - start,
            ROWS=ROWS, COLS=triton.next_power_of_2(end - start), enable_fp_fusion=False)
        weight[:, start:end] = q
        weight[:, end:].addmm_(err, h_inv[start:end, end:], alpha=-1)
