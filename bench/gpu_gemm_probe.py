"""Made on the GPU machine: ModelOpt's real FP8 GEMM against the CPU emulation in ``release.evaluate``.

Usage (on a CUDA machine with nvidia-modelopt): python3 bench/gpu_gemm_probe.py

ModelOpt 0.47 never imports ``backends/fp8_per_tensor_gemm.py`` (``backends/__init__.py`` imports only the
registry and the NVFP4 GEMM), so its ``gemm_registry`` holds no FP8 entry and a compressed ``RealQuantLinear``
warns "No real-quant GEMM found" and runs the fake-quant fallback. Importing that module registers
``Fp8PerTensorLinear`` (it is ModelOpt's own registration, done at import time); it must happen before the
first forward of the compressed module, which caches the registry's answer in ``_real_quant_gemm_impl``.

For bf16 Linears of a few shapes (random weights, fixed seeds), quantized FP8 per tensor (max calibration on
random bf16 inputs) and compressed by ModelOpt on CUDA, this compares the FP8 input codes of ModelOpt's
``_to_fp8`` with the emulation's, and ModelOpt's real GEMM output (module forward) with the emulation run on
the CPU and on the GPU, and ``torch._scaled_mm`` with ``use_fast_accum=False``. Prints one JSON report.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import time
import traceback
import warnings

import torch

SHAPES = [(64, 64), (64, 128), (128, 64), (4096, 4096), (4096, 12288), (12288, 4096)]  # (in, out)
TOKENS = 64
DEVICE = os.environ.get("PROBE_DEVICE", "cuda")


def emulate(inp: torch.Tensor, w_fp8: torch.Tensor, amax_in: torch.Tensor, amax_w: torch.Tensor):
    """``release.evaluate._emulated_fp8_forward`` on whatever device the tensors are on: (codes, output)."""
    reciprocal = torch.tensor(1.0 / 448.0, dtype=torch.float32, device=inp.device)
    scale_a = amax_in.float() * reciprocal
    scale_b = amax_w.float() * reciprocal
    x = (inp.float() / scale_a.to(inp.dtype).float()).to(inp.dtype).clamp(-448, 448).to(torch.float8_e4m3fn)
    out = ((x.float() @ w_fp8.float().T) * (scale_a * scale_b)).to(inp.dtype)
    return x, out


def emulate_from_codes(x: torch.Tensor, w_fp8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
                       dtype: torch.dtype) -> torch.Tensor:
    """The emulation's GEMM half (fp32 matmul, times scale_a*scale_b, round) from given input codes, on the CPU."""
    return ((x.cpu().float() @ w_fp8.cpu().float().T) * (scale_a.cpu() * scale_b.cpu())).to(dtype)


def code_diff(a: torch.Tensor, b: torch.Tensor) -> int:
    return int((a.cpu().view(torch.uint8) != b.cpu().view(torch.uint8)).sum())


def out_diff(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.cpu(), b.cpu()
    ne = a != b
    d = (a.float() - b.float()).abs()
    rel = d / b.float().abs().clamp_min(torch.finfo(torch.float32).tiny)
    # bf16 ulp distance: map the bit patterns to a monotone integer line
    ia, ib = a.view(torch.int16).int(), b.view(torch.int16).int()
    ia = torch.where(ia < 0, -32768 - ia, ia)
    ib = torch.where(ib < 0, -32768 - ib, ib)
    big = b.float().abs() >= 0.01 * b.float().abs().max()  # relative error where the reference is not ~0
    return {"differ": int(ne.sum()), "of": a.numel(), "max_abs": float(d.max()),
            "max_abs_over_max_ref": float(d.max() / b.float().abs().max()),
            "max_rel": float(rel[ne].max()) if ne.any() else 0.0,
            "max_rel_ref_ge_1pct": float(rel[ne & big].max()) if (ne & big).any() else 0.0,
            "max_bf16_ulps_ref_ge_1pct": int((ia - ib).abs()[big].max())}


def main() -> None:
    import modelopt
    import modelopt.torch.quantization as mtq
    from modelopt.torch.quantization.backends.gemm_registry import gemm_registry as reg

    report: dict = {"torch": torch.__version__, "modelopt": modelopt.__version__,
                    "device": torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
                    "capability": list(torch.cuda.get_device_capability()) if DEVICE == "cuda" else None}
    report["registry_before_import"] = [getattr(e["gemm_func"], "__qualname__", str(e["gemm_func"]))
                                        for e in reg._registry]
    # The fix: ModelOpt's own FP8 GEMM module registers itself in gemm_registry when imported.
    from modelopt.torch.quantization.backends import fp8_per_tensor_gemm as fp8g
    from modelopt.torch.quantization.backends.utils import fp8_compatible
    report["registry_after_import"] = [getattr(e["gemm_func"], "__qualname__", str(e["gemm_func"]))
                                       for e in reg._registry]
    report["fp8_compatible"] = fp8_compatible()

    root = torch.nn.Module()
    names = []
    for i, (k, n) in enumerate(SHAPES):
        torch.manual_seed(1000 + i)
        blk = torch.nn.Module()
        lin = torch.nn.Linear(k, n, bias=False, dtype=torch.bfloat16)
        lin.weight.data.copy_((torch.randn(n, k) / k ** 0.5).to(torch.bfloat16))
        blk.add_module("proj", lin)
        root.add_module(f"l{i}", blk)
        names.append(f"l{i}.proj")
    root = root.to(DEVICE).eval()
    entries = [{"quantizer_name": "*", "enable": False}] + [
        {"quantizer_name": f"*{nm}.{q}", "cfg": {"num_bits": (4, 3), "axis": None}}
        for nm in names for q in ("weight_quantizer", "input_quantizer")]

    def forward_loop(m: torch.nn.Module) -> None:
        g = torch.Generator().manual_seed(7)
        for nm in names:
            lin = m.get_submodule(nm)
            for _ in range(4):
                lin(torch.randn(64, lin.in_features, generator=g).to(DEVICE, torch.bfloat16))

    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        mtq.quantize(root, {"quant_cfg": entries, "algorithm": "max"}, forward_loop=forward_loop)
        mtq.compress(root)
    report["quantize_compress_s"] = round(time.time() - t0, 1)

    results = {}
    for i, nm in enumerate(names):
        mod = root.get_submodule(nm)
        k, n = SHAPES[i]
        r: dict = {}
        try:
            w = mod.weight.data.as_subclass(torch.Tensor)
            amax_in, amax_w = mod.input_quantizer.amax, mod.weight_quantizer.amax
            r["amax_dtype"] = [str(amax_in.dtype), str(amax_w.dtype)]
            r["use_real_quant_gemm"] = bool(getattr(mod, "_use_real_quant_gemm", False))
            r["availability_check"] = bool(fp8g._fp8_availability_check(mod, None, (), {}))
            g = torch.Generator().manual_seed(2000 + i)
            inputs = {"randn": torch.randn(TOKENS, k, generator=g),
                      "randn_x3_clamps": 3 * torch.randn(TOKENS, k, generator=g)}
            for tag, xin in inputs.items():
                x = xin.to(torch.bfloat16).to(DEVICE)
                rr: dict = {}
                with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    a = mod(x)  # real GEMM if registered (first call also caches _scale_a/_scale_b)
                rr["gemm_warnings"] = [str(c.message)[:60] for c in caught if "GEMM" in str(c.message)]
                impl = getattr(mod, "_real_quant_gemm_impl", None)
                rr["real_gemm_impl"] = getattr(impl, "__qualname__", str(impl))
                with torch.no_grad():
                    a_direct = fp8g.fp8_per_tensor_gemm(mod, x)
                    sa, sb = mod._scale_a, mod._scale_b
                    codes_mo = fp8g._to_fp8(x, sa)
                    x_emu_cpu, b = emulate(x.cpu(), w.cpu(), amax_in.cpu(), amax_w.cpu())
                    x_emu_gpu, c = emulate(x, w, amax_in, amax_w)
                    recip = torch.tensor(1.0 / 448.0, dtype=torch.float32)
                    rr["scale_a_equal"] = bool((sa.cpu() == amax_in.cpu().float() * recip).all())
                    rr["scale_b_equal"] = bool((sb.cpu() == amax_w.cpu().float() * recip).all())
                    # code variants, to name what ModelOpt's compiled _to_fp8 does
                    eager_mo = (x / sa).clamp(fp8g.FP8_MIN, fp8g.FP8_MAX).to(torch.float8_e4m3fn)
                    f32_bf16scale = (x.float() / sa.to(x.dtype).float()).clamp(-448, 448).to(torch.float8_e4m3fn)
                    f32_f32scale = (x.float() / sa).clamp(-448, 448).to(torch.float8_e4m3fn)
                    emu_expr_mo_scale = (x.float() / sa.to(x.dtype).float()).to(x.dtype).clamp(-448, 448).to(
                        torch.float8_e4m3fn)
                    rr["codes_differ_vs_modelopt_to_fp8"] = {
                        "emulation_expr_with_modelopt_scale_a": code_diff(emu_expr_mo_scale, codes_mo),
                        "emulation_cpu": code_diff(x_emu_cpu, codes_mo),
                        "emulation_gpu": code_diff(x_emu_gpu, codes_mo),
                        "eager_same_expr_gpu": code_diff(eager_mo, codes_mo),
                        "fp32_quotient_bf16_scale_no_bf16_round": code_diff(f32_bf16scale, codes_mo),
                        "fp32_quotient_fp32_scale": code_diff(f32_f32scale, codes_mo),
                        "of": codes_mo.numel()}
                    rr["codes_emulation_cpu_vs_gpu_differ"] = code_diff(x_emu_cpu, x_emu_gpu)
                    wt = w.reshape(-1, w.shape[-1]).t()
                    slow = torch._scaled_mm(codes_mo, wt, scale_a=sa, scale_b=sb, out_dtype=x.dtype,
                                            use_fast_accum=False)
                    fast_eager = torch._scaled_mm(codes_mo, wt, scale_a=sa, scale_b=sb, out_dtype=x.dtype,
                                                  use_fast_accum=True)
                    e = emulate_from_codes(codes_mo, w, sa, sb, x.dtype)
                    ref64 = ((codes_mo.cpu().double() @ w.cpu().double().T) * (sa.cpu() * sb.cpu()).double()
                             ).to(x.dtype)
                    # the accumulator alone: unit scales, fp32 output, against the exact (fp64) sum rounded to fp32
                    one = torch.ones((), device=x.device, dtype=torch.float32)
                    exact = (codes_mo.cpu().double() @ w.cpu().double().T).float()
                    acc = {}
                    for fast in (True, False):
                        if x.device.type != "cuda":
                            break
                        s32 = torch._scaled_mm(codes_mo, wt, scale_a=one, scale_b=one, out_dtype=torch.float32,
                                               use_fast_accum=fast).cpu()
                        rel = (s32.double() - exact.double()).abs() / exact.double().abs().clamp_min(1e-30)
                        acc[f"fast_accum={fast}"] = {"differ_from_exact_fp32": int((s32 != exact).sum()),
                                                     "max_rel": float(rel.max()),
                                                     "median_rel_where_differ": float(rel[s32 != exact].median())
                                                     if (s32 != exact).any() else 0.0}
                    rr["accumulator_fp32_vs_exact"] = acc
                rr["forward_vs_direct_gemm_equal"] = bool(torch.equal(a, a_direct))
                rr["out"] = {
                    "gemm_fast_vs_emu_cpu": out_diff(a, b),
                    "gemm_fast_vs_emu_gpu": out_diff(a, c),
                    "emu_gpu_vs_emu_cpu": out_diff(c, b),
                    "gemm_fast_vs_emu_cpu_from_modelopt_codes": out_diff(a, e),
                    "scaled_mm_fast_eager_vs_gemm": out_diff(fast_eager, a),
                    "scaled_mm_slow_vs_emu_cpu": out_diff(slow, b),
                    "scaled_mm_slow_vs_emu_cpu_from_modelopt_codes": out_diff(slow, e),
                    "scaled_mm_slow_vs_fp64_ref": out_diff(slow, ref64),
                    "gemm_fast_vs_fp64_ref": out_diff(a, ref64),
                    "emu_cpu_from_codes_vs_fp64_ref": out_diff(e, ref64)}
                r[tag] = rr
        except Exception:  # keep the other shapes' results
            r["error"] = traceback.format_exc()[-1500:]
        results[f"{k}->{n}"] = r
    report["shapes"] = results
    text = json.dumps(report, indent=1)
    print(json.dumps(report, separators=(",", ":")))
    out = os.environ.get("OUT")
    if out:
        with open(os.path.join(out, "gemm_probe.json"), "w") as f:
            f.write(text)


if __name__ == "__main__":
    sys.exit(main())
