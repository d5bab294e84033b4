"""Issue 35: is the policy server's FP8 GEMM (TorchAO's static-scale ``PrototypeFloat8Tensor``, as NVIDIA
cosmos-framework's loader builds it) the deployed path's (ModelOpt's ``fp8_per_tensor_gemm``), bit for bit, on
Hopper, with the same scales? And how far is the server's W8A16 step from it?

ModelOpt's two functions (``_to_fp8``, ``_fp8_gemm_impl``) are taken verbatim from the installed ModelOpt's
``torch/quantization/backends/fp8_per_tensor_gemm.py`` (the module's own imports pull in all of ModelOpt, which this
probe does not need); the TorchAO tensor is built as ``cosmos_framework/utils/generator/quantization.py`` builds it
(``Float8MMConfig(use_fast_accum=True)``, per-tensor activation kwargs, (1, 1) scales). The scales are ModelOpt's run
time ones (``amax.float() / 448.0`` on the GPU), which a build exported on the GPU stores as ``weight_scale`` and
``input_scale``. The GEMM shapes are the Nano's Linears (hidden 4096, 32 query and 8 KV heads of 128, MLP 12288) at
several token counts.

Usage: python3 bench/gpu_served_gemm.py OUT.json   (ModelOpt and TorchAO importable; a CUDA GPU of compute 9.0)
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F


def modelopt_gemm(compiled: bool = True, name: str = "_fp8_gemm_impl") -> Any:
    """ModelOpt's ``_fp8_gemm_impl`` (or ``name``: ``_to_fp8``) as installed, and without its ``torch.compile``
    decorators when not ``compiled`` (the same arithmetic run eagerly); each call gives a new function, compiled
    anew on first use."""
    spec = importlib.util.find_spec("modelopt")
    assert spec is not None and spec.submodule_search_locations
    path = Path(spec.submodule_search_locations[0]) / "torch/quantization/backends/fp8_per_tensor_gemm.py"
    tree = ast.parse(path.read_text())
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in ("_to_fp8", "_fp8_gemm_impl")]
    assert len(keep) == 2, "ModelOpt's fp8_per_tensor_gemm no longer has _to_fp8 and _fp8_gemm_impl"
    if not compiled:
        for node in keep:
            node.decorator_list = []
    names: dict[str, Any] = {"torch": torch, "FP8_MIN": torch.finfo(torch.float8_e4m3fn).min,
                             "FP8_MAX": torch.finfo(torch.float8_e4m3fn).max}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(path), "exec"), names)
    return names[name]


def torchao_weight(qdata: torch.Tensor, weight_scale: torch.Tensor, input_scale: torch.Tensor) -> Any:
    from torchao.float8.inference import Float8MMConfig
    from torchao.prototype.quantization.float8_static_quant.prototype_float8_tensor import PrototypeFloat8Tensor
    from torchao.quantization import PerTensor
    from torchao.quantization.quantize_.workflows import QuantizeTensorToFloat8Kwargs

    mm = Float8MMConfig(use_fast_accum=True)
    kwargs = QuantizeTensorToFloat8Kwargs(float8_dtype=torch.float8_e4m3fn, granularity=PerTensor(), mm_config=mm)
    return PrototypeFloat8Tensor(qdata, weight_scale.reshape(1, 1), act_quant_scale=input_scale.reshape(1, 1),
                                 block_size=list(qdata.shape), mm_config=mm, act_quant_kwargs=kwargs,
                                 dtype=torch.bfloat16)


def main(out: Path) -> None:
    import torchao

    gemm = modelopt_gemm()
    g = torch.Generator("cuda").manual_seed(0)
    rows = []
    for n, k in ((4096, 4096), (1024, 4096), (12288, 4096), (4096, 12288)):
        w = torch.randn(n, k, device="cuda", generator=g) * 0.02
        w_amax = w.abs().amax()
        scale_b = w_amax.float() / 448.0  # ModelOpt's: a CUDA division by a Python number
        qdata = (w / scale_b).clamp(-448, 448).to(torch.float8_e4m3fn)
        bias = (torch.randn(n, device="cuda", generator=g) * 0.01).to(torch.bfloat16)
        for m in (3, 17, 64, 256, 1024, 4160):
            x = (torch.randn(m, k, device="cuda", generator=g) * 2).to(torch.bfloat16)
            scale_a = x.abs().amax().float() / 448.0  # a calibrated amax: this input's own
            deployed = gemm(x, qdata, scale_a=scale_a, scale_b=scale_b, bias=bias)
            served = F.linear(x, torchao_weight(qdata, scale_b, scale_a), bias)
            w8a16 = F.linear(x, qdata.to(torch.bfloat16) * scale_b.to(torch.bfloat16), bias)  # the server's W8A16
            diff = (served.float() - deployed.float()).abs()
            rows.append({"m": m, "n": n, "k": k, "bit_equal": bool(torch.equal(served, deployed)),
                         "outputs_differing": int((served != deployed).sum()), "outputs": served.numel(),
                         "max_abs_diff": float(diff.max()),
                         "w8a16_vs_w8a8_rms": float((w8a16.float() - deployed.float()).pow(2).mean().sqrt()),
                         "w8a8_rms": float(deployed.float().pow(2).mean().sqrt())})
            print(json.dumps(rows[-1]), flush=True)
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda,
              "torchao": torchao.__version__, "rows": rows,
              "all_bit_equal": all(r["bit_equal"] for r in rows)}
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("all bit-equal:", result["all_bit_equal"])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
