"""All FP8 E4M3 arithmetic of the tool: rounding as ModelOpt's compress does it on a CPU or CUDA, fake quantization,
the grid, and the deployed GEMMs (Hopper's fast accumulation, per-tensor and row-wise scales) with an exact emulation
that runs anywhere.

Scales broadcast: a per-tensor scale is a 0-dim tensor, a per-channel weight scale has shape ``(out, 1)`` and a
per-token input scale ``(tokens, 1)``.
"""

from __future__ import annotations

from typing import Any

import torch

FP8_MAX = 448.0
NAN_CODES = (0x7F, 0xFF)  # E4M3FN has no infinities; these two codes are NaN


def qdq(t: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Quantize-dequantize in fp32 (ModelOpt's fake-quant arithmetic): one rounding of ``t / (amax / 448)``."""
    scale = amax.float().clamp_min(1e-12) / FP8_MAX
    return (t.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def weight_codes(weight: torch.Tensor, amax: torch.Tensor, arithmetic: str,
                 device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 codes and scale of one weight, as ModelOpt's compress (``w / (amax / 448)``) makes them on a CPU or CUDA;
    ``amax`` is a 0-dim tensor (per tensor) or ``(out, 1)`` (per output channel). ``device`` only carries the
    operations out: each is one IEEE-rounded multiplication, division or conversion per element, the same bits on
    any device, so a CUDA machine recomputes the CPU's codes on its GPU and the reverse.

    Measured on an H200 (``bench/gpu_rounding_probe.py``): CUDA divides by a Python scalar as a multiplication by
    fp32(1/448), and casts the scale to the weight's dtype before the division; the CPU keeps the scale in the amax
    dtype. With a bf16 amax (ModelOpt 0.47 on a bf16 model) both give the same codes; with an fp32 amax (as ModelOpt
    0.44 keeps it) about 3% of the codes differ.
    """
    weight, amax = weight.to(device), amax.to(device)
    if arithmetic == "cuda":
        scale = (amax.float() * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=device)).to(amax.dtype)
        codes = (weight.float() / scale.to(weight.dtype).float()).to(weight.dtype).to(torch.float8_e4m3fn)
    else:
        scale = amax / FP8_MAX
        codes = (weight / scale).to(torch.float8_e4m3fn)
    return codes, scale


def serving_scale(amax: torch.Tensor, arithmetic: str) -> torch.Tensor:
    """``weight_scale`` / ``input_scale`` (amax / 448 in fp32, on the CPU) as ModelOpt's export computes them where
    the build ran (``export.quant_utils.get_scaling_factor``: ``amax.float() / maxbound`` on the amax's device). CUDA
    divides by a Python scalar as a multiplication by fp32(1/448) (``weight_codes``), which is also how ModelOpt's FP8
    GEMM forms its scales at run time, so a GPU build's stored scales are the ones its deployed path uses, and a
    server reading them (the policy server, vLLM) quantizes with the same scales."""
    amax = amax.float().cpu()
    if arithmetic == "cuda":
        return amax * torch.tensor(1.0 / FP8_MAX, dtype=torch.float32)
    return amax / FP8_MAX


def dequantize(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``codes * scale`` in fp32 (exact: 4 significant bits times a bf16 or fp32 scale)."""
    return codes.float() * scale.float()


def nan_codes(codes: torch.Tensor) -> int:
    """How many of ``codes`` are E4M3FN's NaN encodings (never a valid weight)."""
    bits = codes.view(torch.uint8)
    return int(sum(int((bits == c).sum()) for c in NAN_CODES))


def grid_step(value: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Spacing of the FP8 E4M3 grid at ``value`` (3 mantissa bits, subnormals below 2^-6), in weight units."""
    code = (value.float() / scale.float()).abs().clamp_min(2.0**-9)
    exponent = (torch.frexp(code).exponent - 1).clamp_min(-6)  # floor(log2), exact (log2 may round up below 2^k)
    return scale.float() * torch.pow(2.0, exponent.float() - 3)


def _code_exponents(codes: torch.Tensor) -> torch.Tensor:
    """The E4M3 exponent each code's significand is aligned with (subnormals: -6), as int32. Zero (+0 and -0) gets
    -64, so that a product with a zero operand never sets a step's alignment exponent (its sum stays below -56; the
    smallest nonzero product's is -12): fitted on an H200 (``bench/gpu_subnormal_record.py``, ``BENCHMARKS.md``),
    where counting a zero as -6 truncated the other products of its step whenever a large code multiplied it."""
    bits = codes.view(torch.uint8).to(torch.int32)
    exponent = ((bits >> 3) & 0xF).clamp(min=1) - 7
    return torch.where((bits & 0x7F) == 0, torch.full_like(exponent, -64), exponent)


def _exponent(x: torch.Tensor) -> torch.Tensor:
    """floor(log2 |x|) of normal fp32 values from their bits (zero: -127)."""
    return ((x.view(torch.int32) >> 23) & 0xFF) - 127


def _pow2(n: torch.Tensor) -> torch.Tensor:
    """2 ** n as fp32, built from its bits so that it is exact on every device (n in [-126, 127])."""
    return ((n + 127) << 23).view(torch.float32)


# (M, N, K) -> the K parts cuBLAS used on an H200 (torch 2.11, CUDA 13) for the shapes recorded with
# bench/gpu_subnormal_record.py and bench/fp8_conformance.py (M = 3 and 17 tokens at the Nano's down_proj width;
# M = 48 and 128 there, and every shape of the Nano's rollouts, are unsplit); K <= 4096 never split there. Other
# shapes are modelled unsplit: release/core/fp8_conformance.json says which shapes were verified on a GPU.
SPLIT_K = {(64, 256, 8192): 3, (64, 256, 12288): 4, (32, 256, 12288): 4, (64, 128, 12288): 4, (16, 128, 16384): 6,
           (3, 4096, 12288): 2, (17, 4096, 12288): 2}


def hopper_accumulate(a: torch.Tensor, b: torch.Tensor, max_elements: int = 1 << 22,
                      split: int | None = None) -> torch.Tensor:
    """``a @ b.T`` for FP8 E4M3 codes a [M, K] and b [N, K] as an H100/H200 FP8 tensor core with fast accumulation
    computes it (what ``torch._scaled_mm(..., use_fast_accum=True)`` returns at unit scales), as fp32.

    Model, fitted to and checked against the H200 bit for bit (``bench/gpu_accum_record.py``,
    ``bench/gpu_subnormal_record.py``, ``BENCHMARKS.md``): K is taken 32 at a time (one ``wgmma`` k-step) in order.
    Each step aligns its 32 exact products and the running accumulator to the largest of the exponent sums of its
    products with two nonzero codes (subnormal codes count as exponent -6) and the accumulator's exponent, truncates
    every term toward zero at 13 bits below that exponent, adds them exactly, and truncates the sum toward zero to
    13 bits after its leading bit. Every operation here is exact in fp32, so a CPU and a GPU give the same bits.

    ``split``: cuBLAS splits a long K across thread blocks for some shapes (its heuristic; recorded ones in
    ``SPLIT_K``, looked up when ``split`` is None): K cut into ``split`` parts of ceil(K / split / 256) * 256
    columns (the last takes the rest), each accumulated from zero, the fp32 partial results added in K order.
    """
    parts = SPLIT_K.get((a.shape[0], b.shape[0], a.shape[1]), 1) if split is None else split
    if parts > 1:
        width = -(-a.shape[1] // (parts * 256)) * 256
        total = None
        for k0 in range(0, a.shape[1], width):
            part = hopper_accumulate(a[:, k0:k0 + width], b[:, k0:k0 + width], max_elements, split=1)
            total = part if total is None else total + part
        assert total is not None
        return total
    m, k = a.shape
    out = torch.zeros(m, b.shape[0], dtype=torch.float32, device=a.device)
    af, bf = a.float(), b.float()
    ea, eb = _code_exponents(a), _code_exponents(b)
    chunk = max(1, max_elements // (32 * b.shape[0]))  # rows per pass: bounds the [rows, N, 32] products in memory
    for r0 in range(0, m, chunk):
        rows = slice(r0, r0 + chunk)
        acc = out[rows]
        for k0 in range(0, k, 32):
            cols = slice(k0, k0 + 32)
            products = af[rows, None, cols] * bf[None, :, cols]  # exact: 4-bit x 4-bit significands
            top = torch.maximum((ea[rows, None, cols] + eb[None, :, cols]).amax(-1), _exponent(acc))
            top = top.clamp(min=-100)  # only zeros so far: the step adds nothing, and 2^(13 - top) stays finite
            unit = _pow2(13 - top)  # terms in units of 2^(top - 13), then truncated: exact integers below 2^21
            total = (products * unit[..., None]).trunc().sum(-1) + (acc * unit).trunc()
            lead = torch.where(total == 0, 0, _exponent(total))
            total = (total * _pow2(13 - lead)).trunc() * _pow2(lead - 13)
            acc = total * _pow2(top - 13)
        out[rows] = acc
    return out


def emulated_gemm(codes: torch.Tensor, weight: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                  bias: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor:
    """``torch._scaled_mm(codes, weight.T, scale_a, scale_b, bias, out_dtype=dtype, use_fast_accum=True)`` on an
    H100/H200: the codes accumulated as its tensor cores do, then the epilogue in fp32, rounded once to ``dtype``.
    Per-tensor scales (0-dim; cuBLAS): ``acc * (scale_a * scale_b) + bias``. Row-wise scales (``scale_a`` [M, 1],
    ``scale_b`` [1, N]; PyTorch's CUTLASS kernel): ``(acc * scale_b) * scale_a + bias``, each step rounded to fp32;
    measured on an H200 (``bench/gpu_rowwise_probe.py``): the other orders, or a fused multiply-add of the bias,
    differ in a few outputs per million."""
    acc = hopper_accumulate(codes, weight)
    out = acc * (scale_a * scale_b) if scale_a.dim() == 0 and scale_b.dim() == 0 else acc * scale_b * scale_a
    if bias is not None:
        out = out + bias.float()
    return out.to(dtype)


def _reciprocal(device: torch.device) -> torch.Tensor:
    return torch.tensor(1.0 / FP8_MAX, dtype=torch.float32, device=device)


def per_tensor_forward(self: Any, input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """ModelOpt's FP8 per-tensor GEMM (``fp8_per_tensor_gemm``) in exact arithmetic that runs anywhere.

    scale_a = amax_in / 448 and scale_b = amax_w / 448 in fp32; the input is multiplied by fp32(1 / scale_a) in fp32
    (ModelOpt's ``torch.compile``d ``_to_fp8`` neither rounds the quotient to bf16 nor divides exactly:
    ``static_forward``), clamped and cast to FP8, then multiplied as ``torch._scaled_mm`` with fast accumulation
    does on Hopper (``emulated_gemm``).
    """
    reciprocal = _reciprocal(input.device)
    return static_forward(input, self.weight.data, self.input_quantizer.amax.float() * reciprocal,
                          self.weight_quantizer.amax.float() * reciprocal, self.bias, reciprocal=True)


def static_forward(input: torch.Tensor, weight: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                   bias: torch.Tensor | None, *, reciprocal: bool = False) -> torch.Tensor:
    """An FP8 Linear at static per-tensor fp32 scales, as ``torch._scaled_mm`` with fast accumulation computes it on
    Hopper: the input divided by ``scale_a`` in fp32 (TorchAO's ``_quantize_affine_float8``, an eager IEEE division),
    or with ``reciprocal`` multiplied by fp32(1 / ``scale_a``), clamped and cast to E4M3, then ``emulated_gemm`` with
    ``weight``'s codes [N, K].

    ``reciprocal`` is ModelOpt's compiled ``_to_fp8``: Inductor's Triton ``/`` is the approximate ``div.full.f32``,
    x times an approximate reciprocal of the scale, which is fp32(1 / s) for most scales (458 of a Nano build's 504
    input scales on an H100) and one the CPU cannot know for the others (``bench/gpu_compiled_gemm.py``). The two
    rules give other codes for a few inputs per Linear; the GEMM that follows is the same cuBLAS kernel."""
    quotient = input.float() * (1.0 / scale_a) if reciprocal else input.float() / scale_a
    codes = quotient.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    out = emulated_gemm(codes.reshape(-1, codes.shape[-1]), weight, scale_a, scale_b, bias, input.dtype)
    return out.reshape(*input.shape[:-1], out.shape[-1])


def per_token_codes(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dynamic per-token quantization of ``x`` [tokens, K]: each row's amax in fp32, scale = amax / 448 (a zero row
    gets scale 1), codes = the fp32 quotient clamped and cast to FP8. Returns codes and the [tokens, 1] fp32 scales."""
    amax = x.float().abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax * _reciprocal(x.device), torch.ones_like(amax))
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn), scale


def rowwise_forward(self: Any, input: torch.Tensor, *args: Any, emulate: bool = True, **kwargs: Any) -> torch.Tensor:
    """The per-channel-weight, per-token-activation FP8 Linear as a server runs it: the input quantized per token
    (``per_token_codes``), the weight's FP8 codes with their (out, 1) scales, one row-wise scaled GEMM with fast
    accumulation (``torch._scaled_mm`` with [M, 1] and [1, N] fp32 scales on CUDA, ``emulated_gemm`` elsewhere or
    when ``emulate``), bf16 out. The weight scales are amax_w / 448 in fp32, as the per-tensor GEMM forms them (and
    as the exported ``weight_scale`` that vLLM reads holds them)."""
    x = input.reshape(-1, input.shape[-1])
    codes, scale_a = per_token_codes(x)
    weight = self.weight.data
    scale_b = (self.weight_quantizer.amax.float() * _reciprocal(input.device)).reshape(1, -1)
    if emulate:
        out = emulated_gemm(codes, weight, scale_a, scale_b, self.bias, input.dtype)
    else:
        bias = None if self.bias is None else self.bias.to(input.dtype)
        out = torch._scaled_mm(codes, weight.t(), scale_a=scale_a, scale_b=scale_b, bias=bias,
                               out_dtype=input.dtype, use_fast_accum=True)
    return out.reshape(*input.shape[:-1], out.shape[-1])
