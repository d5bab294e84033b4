"""Made on the GPU machine: ModelOpt's own FP8 export of the tiny model's Linears, the reference CPU builds match.

Usage (on a CUDA machine with nvidia-modelopt): python bench/gpu_reference.py TRANSFORMER_DIR OUT_DIR

Writes OUT_DIR/gpu_rtn_weights.safetensors: per quantized Linear the FP8 ``weight`` codes, ``weight_quantizer._amax``
and ``weight_quantizer._scale`` exactly as ``mtq.compress`` makes them on CUDA; then the same with every weight amax
held in fp32 (as ModelOpt 0.44 checkpoints hold it) under the prefix ``fp32amax.``: with bf16 amax CPU and CUDA
round alike, with fp32 amax CUDA rounds the scale to bf16 first and the CPU does not.
Only torch, safetensors and ModelOpt are needed (diffusers is not): the Linears are rebuilt under their names.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

SUFFIXES = ["self_attn.to_q", "self_attn.to_k", "self_attn.to_v", "self_attn.to_out", "mlp.gate_proj", "mlp.up_proj",
            "mlp.down_proj", "self_attn.add_q_proj", "self_attn.add_k_proj", "self_attn.add_v_proj",
            "self_attn.to_add_out", "mlp_moe_gen.gate_proj", "mlp_moe_gen.up_proj", "mlp_moe_gen.down_proj"]


def main(transformer: Path, out: Path) -> None:
    import modelopt
    import modelopt.torch.quantization as mtq

    weights: dict[str, torch.Tensor] = {}
    for shard in sorted(transformer.glob("*.safetensors")):
        weights.update(load_file(shard))
    names = sorted(k.removesuffix(".weight") for k in weights
                   if k.endswith(".weight") and any(k.endswith(f"{s}.weight") for s in SUFFIXES))
    root = torch.nn.Module()
    for name in names:
        cur = root
        *parents, leaf = name.split(".")
        for p in parents:
            if not hasattr(cur, p):
                cur.add_module(p, torch.nn.Module())
            cur = getattr(cur, p)
        w = weights[f"{name}.weight"]
        lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False, dtype=torch.bfloat16)
        lin.weight.data.copy_(w)
        cur.add_module(leaf, lin)
    root = root.cuda().eval()
    entries = [{"quantizer_name": "*", "enable": False}] + [
        {"quantizer_name": f"*layers.*.{s}.{q}", "cfg": {"num_bits": (4, 3), "axis": None}}
        for s in SUFFIXES for q in ("weight_quantizer", "input_quantizer")]

    def forward_loop(m: torch.nn.Module) -> None:  # input scales are not part of this reference
        for n in names:
            lin = m.get_submodule(n)
            lin(torch.ones(1, lin.in_features, device="cuda", dtype=torch.bfloat16))

    with contextlib.redirect_stdout(io.StringIO()):
        mtq.quantize(root, {"quant_cfg": entries, "algorithm": "max"}, forward_loop=forward_loop)
    fp32 = copy.deepcopy(root)
    for n in names:
        q = fp32.get_submodule(n).weight_quantizer
        q._amax = q._amax.float()
    out_tensors: dict[str, torch.Tensor] = {}
    for prefix, model in (("", root), ("fp32amax.", fp32)):
        with contextlib.redirect_stdout(io.StringIO()):
            mtq.compress(model)
        for n in names:
            mod = model.get_submodule(n)
            out_tensors[f"{prefix}{n}.weight"] = mod.weight.data.as_subclass(torch.Tensor).cpu().contiguous()
            out_tensors[f"{prefix}{n}.weight_quantizer._amax"] = mod.weight_quantizer._amax.cpu().reshape(())
            out_tensors[f"{prefix}{n}.weight_quantizer._scale"] = mod.weight_quantizer._scale.cpu().reshape(())
    meta = {"torch": torch.__version__, "modelopt": modelopt.__version__,
            "device": torch.cuda.get_device_name(), "linears": str(len(names))}
    out.mkdir(parents=True, exist_ok=True)
    save_file(out_tensors, str(out / "gpu_rtn_weights.safetensors"), metadata=meta)
    differ = {p: sum(int((out_tensors[f"{p}{n}.weight"].view(torch.uint8)
                          != (weights[f"{n}.weight"] / (out_tensors[f"{p}{n}.weight_quantizer._amax"] / 448.0))
                          .to(torch.float8_e4m3fn).view(torch.uint8)).sum()) for n in names)
              for p in ("", "fp32amax.")}
    print(json.dumps({"meta": meta, "codes differing from the CPU's own arithmetic": differ}, indent=1))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
