"""GPTQ at the Nano's sizes on a GPU, and the per-channel family's row-wise FP8 kernel against its emulation.

1. ModelOpt's ``gptq`` on NVIDIA's per-tensor FP8 configuration (what ``builds/gptq.yaml`` runs), one Linear of each
   of the Nano's four shapes (4096->4096 q/o, 4096->1024 k/v, 4096->12288 gate/up, 12288->4096 down), random bf16
   weights, ``CALLS`` calls of ``TOKENS`` tokens: seconds for ModelOpt's max calibration and for GPTQ (its max pass,
   Hessians and column-by-column update), and the total for the 504 Linears of 36 layers x 2 towers.
2. ``release.core.fp8.rowwise_forward``: ``torch._scaled_mm`` with per-token and per-channel scales against the exact
   emulation run on the same GPU, at those shapes, on normal and outlier-channel inputs: outputs that differ.

3. ``build LAYERS``: ``release fixture nano`` with the Nano's widths but LAYERS decoder layers, then ``release build
   rtn`` (with the calibration capture) and ``release build gptq`` (capture cached), each timed end to end with its
   verification: GPTQ's cost in the real build path, to scale by 36 / LAYERS.

Usage: python3 bench/gpu_gptq.py OUT micro [TOKENS] [CALLS]   (1 and 2)
       python3 bench/gpu_gptq.py OUT rowwise                   (2 only)
       python3 bench/gpu_gptq.py OUT build LAYERS              (3)
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

SHAPES = {"q/o (4096->4096)": (4096, 4096, 4), "k/v (4096->1024)": (4096, 1024, 4),
          "gate/up (4096->12288)": (4096, 12288, 4), "down (12288->4096)": (12288, 4096, 2)}  # Linears per layer
LAYERS = 36
FP8 = {"num_bits": (4, 3), "axis": None}


def _quantize(in_f: int, out_f: int, calls: list[torch.Tensor], algorithm: Any) -> float:
    import modelopt.torch.quantization as mtq

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(in_f, out_f, bias=False)).cuda().to(torch.bfloat16)
    config = {"quant_cfg": [{"quantizer_name": "*", "enable": False},
                            {"quantizer_name": "*0.weight_quantizer", "cfg": dict(FP8)},
                            {"quantizer_name": "*0.input_quantizer", "cfg": dict(FP8)}], "algorithm": algorithm}

    @torch.no_grad()
    def forward_loop(m: torch.nn.Module) -> None:
        for x in calls:
            m(x)

    torch.cuda.synchronize()
    start = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        mtq.quantize(model, config, forward_loop=forward_loop)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def gptq_times(tokens: int, n_calls: int) -> dict[str, Any]:
    rows = {}
    total = {"max": 0.0, "gptq": 0.0}
    for label, (in_f, out_f, per_layer) in SHAPES.items():
        calls = [torch.randn(tokens, in_f, device="cuda", dtype=torch.bfloat16) for _ in range(n_calls)]
        gptq = {"method": "gptq", "perc_damp": 0.01, "block_size": 128}
        _quantize(in_f, out_f, calls[:1], "max")  # warm-up: kernels, ModelOpt's first use of each
        _quantize(in_f, out_f, calls[:1], gptq)
        times = {"max": _quantize(in_f, out_f, calls, "max"),
                 "gptq": _quantize(in_f, out_f, calls, gptq)}
        rows[label] = {**times, "linears": per_layer * LAYERS}
        for key in total:
            total[key] += times[key] * per_layer * LAYERS
        print(f"| {label} | {per_layer * LAYERS} | {times['max']:.2f} | {times['gptq']:.2f} |", flush=True)
    return {"per_linear": rows, "total_504": total, "tokens": tokens, "calls": n_calls}


def rowwise_check() -> list[dict[str, Any]]:
    from release.core.fp8 import rowwise_forward

    out = []
    for label, (in_f, out_f, _) in SHAPES.items():
        for tokens in (64, 256):
            for kind in ("normal", "outlier channels"):
                torch.manual_seed(1)
                weight = torch.randn(out_f, in_f, device="cuda")
                amax = weight.abs().amax(dim=1, keepdim=True)
                module = torch.nn.Linear(in_f, out_f, bias=True, device="cuda", dtype=torch.bfloat16)
                module.weight.data = (weight / (amax / 448)).to(torch.float8_e4m3fn)  # type: ignore[assignment]
                module.weight_quantizer = type("Q", (), {"amax": amax})()  # type: ignore[assignment]
                x = torch.randn(tokens, in_f, device="cuda")
                if kind == "outlier channels":
                    x[:, :: max(1, in_f // 16)] *= 40
                x = x.to(torch.bfloat16)
                kernel = rowwise_forward(module, x, emulate=False)
                emulated = rowwise_forward(module, x, emulate=True)
                differ = int((kernel.view(torch.int16) != emulated.view(torch.int16)).sum())
                out.append({"shape": label, "tokens": tokens, "data": kind, "outputs": kernel.numel(),
                            "differ": differ})
                print(f"| {label} | {tokens} | {kind} | {differ} of {kernel.numel()} |", flush=True)
    return out


def build_times(out: Path, layers: int) -> dict[str, Any]:
    import os
    import subprocess

    import release.inputs.fixture as fixture

    work = Path("/tmp/gptq-build")
    fixture.SIZES["nano"] = ({**fixture.NANO_TRANSFORMER, "num_hidden_layers": layers}, fixture.NANO_VAE, "5GB")
    start = time.perf_counter()
    fixture.write_fixture(work / "fx", size="nano")
    times = {"fixture": time.perf_counter() - start}
    env = {**os.environ, "RELEASE_CACHE": str(work / "cache")}
    for name in ("rtn", "gptq"):
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", "from release.cli import main; main()", "build", name,
                               "--source", str(work / "fx/source"), "--observations", str(work / "fx/observations"),
                               "--out", str(work / "dist")], env=env, capture_output=True, text=True)
        times[name] = time.perf_counter() - start
        (out / f"build-{name}.log").write_text(done.stdout[-20000:] + done.stderr[-20000:])
        print(f"| release build {name} | {times[name]:.1f} s | exit {done.returncode} |", flush=True)
    return {"layers": layers, "seconds": times}


def main(out: Path, mode: str = "micro", *args: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    if mode == "build":
        result = build_times(out, *args)
        print(json.dumps(result))
        (out / "gpu_gptq_build.json").write_text(json.dumps(result, indent=2))
        return
    if mode == "rowwise":
        print("| shape | tokens | data | outputs that differ |\n|---|---:|---|---:|")
        (out / "gpu_rowwise.json").write_text(json.dumps(rowwise_check(), indent=2))
        return
    tokens, n_calls = (list(args) + [1024, 32][len(args):])[:2]
    print("| shape | Linears in Nano | max calibration (s) | GPTQ (s) |\n|---|---:|---:|---:|")
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "gptq": gptq_times(tokens, n_calls)}
    total = result["gptq"]["total_504"]
    print(f"504 Linears: max {total['max']:.0f} s, GPTQ {total['gptq']:.0f} s")
    print("| shape | tokens | data | outputs that differ |\n|---|---:|---|---:|")
    result["rowwise"] = rowwise_check()
    (out / "gpu_gptq.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2], *(int(a) for a in sys.argv[3:]))
