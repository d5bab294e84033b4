"""Issue 35: why ModelOpt's deployed FP8 GEMM and an eager ``torch._scaled_mm`` (TorchAO's, the served path's) of
the same input, weight codes, scales and bias give other bits in a few outputs (``gpu_served_first_call.py``: 13
of the first transformer call's 504 Linears on an H100, all ``down_proj`` or ``to_out``).

ModelOpt's ``_fp8_gemm_impl`` is ``torch.compile(dynamic=True)``: Inductor may lower ``_scaled_mm`` to cuBLAS
(``aten._scaled_mm``) or to its own Triton FP8 templates (on an H100 it ran cuBLAS, the eager kernel: BENCHMARKS.md,
"Where the served and deployed paths part"), and it compiles the input's division too. Each variant below runs
ModelOpt's function (verbatim, ``gpu_served_gemm.modelopt_gemm``) on the same inputs:
- ``compiled``: as ModelOpt ships it;
- ``compiled_aten``: compiled with Inductor's GEMM backends limited to ATen (cuBLAS only);
- ``eager``: the same function without ``torch.compile``: PyTorch divides the bf16 input by the fp32 0-dim scale
  in bf16 (a 0-dim tensor does not promote), Inductor in fp32, so the codes differ;
- ``eager_fp32``: the input divided in fp32, then the eager ``_scaled_mm`` (TorchAO's arithmetic, the served path's);
- ``compiled_div_rn``: compiled with Inductor's ``eager_numerics.division_rounding`` (where this torch has it).
Each is compared with ``compiled`` (outputs differing), and the CUDA kernels of one call are listed by the profiler.
Then the input quantization alone: Inductor's Triton code divides with ``/``, which Triton lowers to the approximate
``div.full.f32`` unless ``TORCHINDUCTOR_EMULATE_DIVISION_ROUNDING=1``. Per case, the compiled quotient x / s against
the IEEE quotient, against x times the IEEE reciprocal fp32(1 / s), and against x times the compiled reciprocal;
the codes of ModelOpt's compiled ``_to_fp8`` against the IEEE quotient's; and over 65,536 scales, the compiled
reciprocal against the IEEE one; and ModelOpt's codes with ``division_rounding`` on, and against the IEEE quotient
cast to FP8 through fp16 (a double rounding).
The inputs are SwiGLU-like (silu(a) * b) with a few outlier channels, at the Nano's Linear shapes and the token
counts of a rollout's transformer calls (84, 164, 165, 213).

Usage: python3 bench/gpu_compiled_gemm.py OUT.json   (ModelOpt importable; a CUDA GPU of compute 9.0)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from gpu_served_gemm import modelopt_gemm

SHAPES = ((4096, 12288), (4096, 4096), (1024, 4096), (12288, 4096))  # (N, K): down_proj, o/q, k/v, up/gate
TOKENS = (84, 164, 165, 213)


def eager_fp32(input: torch.Tensor, weight_fp8: torch.Tensor, scale_a: torch.Tensor, scale_b: torch.Tensor,
               bias: torch.Tensor | None = None) -> torch.Tensor:
    codes = (input.float() / scale_a).clamp(-448, 448).to(torch.float8_e4m3fn)
    return torch._scaled_mm(codes, weight_fp8.t(), scale_a=scale_a, scale_b=scale_b, bias=bias,
                            out_dtype=input.dtype, use_fast_accum=True)


def kernels(fn: Any, *args: Any, **kwargs: Any) -> list[str]:
    """The CUDA kernels one call of ``fn`` launches, by name."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn(*args, **kwargs)
        torch.cuda.synchronize()
    return sorted({e.key for e in prof.key_averages() if e.device_type.name == "CUDA"})


def inputs(g: torch.Generator) -> list[dict[str, Any]]:
    cases = []
    for n, k in SHAPES:
        w = torch.randn(n, k, device="cuda", generator=g) * 0.02
        scale_b = w.abs().amax().float() / 448.0
        qdata = (w / scale_b).clamp(-448, 448).to(torch.float8_e4m3fn)
        bias = (torch.randn(n, device="cuda", generator=g) * 0.01).to(torch.bfloat16)
        for m in TOKENS:
            a, b = (torch.randn(m, k, device="cuda", generator=g) for _ in range(2))
            x = F.silu(a) * b
            x[:, torch.randint(0, k, (8,), device="cuda", generator=g)] *= 40  # outlier channels
            x = x.to(torch.bfloat16)
            cases.append({"m": m, "n": n, "k": k, "x": x, "w": qdata, "scale_a": x.abs().amax().float() / 448.0,
                          "scale_b": scale_b, "bias": bias})
    return cases


def fp8_codes(quotient: torch.Tensor) -> torch.Tensor:
    return quotient.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)


def division(cases: list[dict[str, Any]]) -> dict[str, Any]:
    """Which fp32 arithmetic the compiled quotient x / s is (module docstring), counted over the cases' inputs."""
    torch._dynamo.reset()
    quotient = torch.compile(lambda x, s: x.float() / s, dynamic=True)
    to_fp8 = modelopt_gemm(name="_to_fp8")  # ModelOpt's, compiled as it ships
    to_fp8_rn = modelopt_gemm(name="_to_fp8")
    rows = []
    for c in cases:
        x, s = c["x"], c["scale_a"]
        ieee, compiled = x.float() / s, quotient(x, s)
        r_ieee, r_compiled = 1.0 / s, quotient(torch.ones_like(s), s)
        codes, codes_compiled = fp8_codes(ieee), fp8_codes(compiled)
        codes_modelopt = to_fp8(x, s).view(torch.uint8)
        with torch._inductor.config.patch({"eager_numerics.division_rounding": True}):
            codes_rn = to_fp8_rn(x, s).view(torch.uint8)
        codes_via_fp16 = fp8_codes(ieee.clamp(-448, 448).half())
        rows.append({"m": c["m"], "k": c["k"], "elements": x.numel(),
                     "vs_ieee_quotient": int((compiled != ieee).sum()),
                     "vs_x_times_ieee_reciprocal": int((compiled != x.float() * r_ieee).sum()),
                     "vs_x_times_compiled_reciprocal": int((compiled != x.float() * r_compiled).sum()),
                     "reciprocal_equal": bool(torch.equal(r_ieee, r_compiled)),
                     "modelopt_codes_vs_ieee": int((codes_modelopt != codes).sum()),
                     "modelopt_codes_vs_compiled_quotient": int((codes_modelopt != codes_compiled).sum()),
                     "modelopt_codes_div_rn_vs_ieee": int((codes_rn != codes).sum()),
                     "modelopt_codes_vs_ieee_via_fp16": int((codes_modelopt != codes_via_fp16).sum())})
        print(json.dumps(rows[-1]), flush=True)
    g = torch.Generator("cuda").manual_seed(1)
    scales = torch.exp(torch.empty(65536, device="cuda").uniform_(-12, 2, generator=g)).float()
    reciprocal = torch.compile(lambda s: torch.ones_like(s) / s, dynamic=True)(scales)
    return {"cases": rows, "scales": scales.numel(),
            "compiled_reciprocal_differing": int((reciprocal != 1.0 / scales).sum())}


def main(out: Path) -> None:
    g = torch.Generator("cuda").manual_seed(0)
    cases = inputs(g)
    outputs: dict[str, list[torch.Tensor]] = {}
    kernel_names: dict[str, dict[str, list[str]]] = {}
    variants = {"compiled": (modelopt_gemm(), None),
                "compiled_aten": (modelopt_gemm(), {"max_autotune_gemm_backends": "ATEN"}),
                "eager": (modelopt_gemm(compiled=False), None), "eager_fp32": (eager_fp32, None)}
    if hasattr(torch._inductor.config, "eager_numerics"):  # Inductor's division as eager's (div_rn), where it has it
        variants["compiled_div_rn"] = (modelopt_gemm(), {"eager_numerics.division_rounding": True})
    for name, (gemm, patch) in variants.items():
        torch._dynamo.reset()
        with torch._inductor.config.patch(patch or {}):
            def call(c: dict[str, Any], gemm: Any = gemm) -> torch.Tensor:
                return gemm(c["x"], c["w"], scale_a=c["scale_a"], scale_b=c["scale_b"], bias=c["bias"])
            outputs[name] = [call(c) for c in cases]
            kernel_names[name] = {f"{c['m']}x{c['n']}x{c['k']}": kernels(call, c) for c in cases if c["m"] == 164}
    rows = []
    for i, c in enumerate(cases):
        ref = outputs["compiled"][i]
        row = {"m": c["m"], "n": c["n"], "k": c["k"], "outputs": ref.numel()}
        for name in [v for v in variants if v != "compiled"]:
            row[f"{name}_differing"] = int((outputs[name][i] != ref).sum())
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "rows": rows, "kernels_at_164_tokens": kernel_names, "division": division(cases)}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({v: {s: [k for k in ks if "gemm" in k or "nvjet" in k or "mm" in k] for s, ks in shapes.items()}
                      for v, shapes in kernel_names.items()}, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
