"""Issue 35: where the served and deployed paths of one build part, on one GPU.

One held-out observation is rolled out on the deployed path (ModelOpt's FP8 GEMM, eager: CUDA graphs replay the same
bits) and on the served path (TorchAO, as ``release eval`` builds both), and every FP8 Linear's input and output of
the first transformer call is kept, in call order. Then:
- the first Linear whose output differs between the paths, and whether its input was the same;
- for every Linear of the deployed call, its output against an eager ``torch._scaled_mm`` of the same codes, scales
  and bias (the kernel TorchAO calls) on the same input: how many Linears, and outputs, ModelOpt's compiled GEMM
  computes otherwise on the rollout's own inputs; and the same with the input quantized as x times fp32(1 / s), and as
  x times Inductor's reciprocal of s (which ModelOpt's compiled ``_to_fp8`` computes, ``gpu_compiled_gemm.py``);
- how many Linears' run-time scales differ from the stored ``input_scale`` / ``weight_scale``.

Usage: python bench/gpu_served_first_call.py SOURCE OBSERVATIONS BUILD_DIR OUT.json
(``RELEASE_BUILDS`` or ./builds name the release; the build is read from BUILD_DIR as exported.)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from release.core.builds import load_release
from release.core.fp8 import FP8_MAX
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.quantize.load import deployed_transformer
from release.quantize.recipes import quantized_linears
from release.quantize.served import served_transformer

Record = list[tuple[str, torch.Tensor, torch.Tensor]]


def first_call(model: torch.nn.Module, names: list[str], source: Path, observation: Any,
               kwargs: dict[str, Any]) -> Record:
    """Each FP8 Linear's (name, input, output) of ``model``'s first transformer call in one rollout, on the CPU."""
    policy = load_release().policy
    calls = [0]
    seen: Record = []

    def count(*_: Any) -> None:
        calls[0] += 1

    handles = [model.register_forward_pre_hook(count)]
    for name in names:
        def keep(_module: torch.nn.Module, args: tuple[Any, ...], output: torch.Tensor, name: str = name) -> None:
            if calls[0] == 1:
                seen.append((name, args[0].detach().cpu(), output.detach().cpu()))
        handles.append(model.get_submodule(name).register_forward_hook(keep))
    rollout(load_pipeline(source, policy, transformer=model), observation, policy, mixed_precision_format="none",
            **kwargs)
    for handle in handles:
        handle.remove()
    return seen


def stored(build: Path, names: list[str]) -> dict[str, torch.Tensor]:
    wanted = {f"{n}.{p}" for n in names for p in ("weight", "weight_scale", "input_scale", "bias")}
    out = {}
    for shard in sorted((build / "transformer").glob("*.safetensors")):
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            out.update({k: f.get_tensor(k) for k in wanted.intersection(f.keys())})
    return out


def compiled_reciprocal() -> Any:
    """1 / s as Inductor's Triton code computes it (``/`` is the approximate ``div.full.f32``): ModelOpt's compiled
    ``_to_fp8`` divides by the scale as x times this (``bench/gpu_compiled_gemm.py``)."""
    return torch.compile(lambda s: torch.ones_like(s) / s, dynamic=True)


def eager_gemm(x: torch.Tensor, tensors: dict[str, torch.Tensor], name: str, device: str,
               rule: str = "ieee_division", reciprocal: Any = None) -> torch.Tensor:
    """The stored W8A8 Linear as an eager ``_scaled_mm`` (TorchAO's GEMM), its input quantized at the stored scale
    by ``rule``: ``ieee_division`` (x / s, TorchAO's), ``ieee_reciprocal`` (x times fp32(1 / s)) or
    ``compiled_reciprocal`` (x times ``reciprocal(s)``)."""
    scale_a, scale_b = (tensors[f"{name}.{k}"].float().reshape(1, 1).to(device)
                        for k in ("input_scale", "weight_scale"))
    flat = x.reshape(-1, x.shape[-1]).to(device).float()
    quotient = {"ieee_division": lambda: flat / scale_a, "ieee_reciprocal": lambda: flat * (1.0 / scale_a),
                "compiled_reciprocal": lambda: flat * reciprocal(scale_a)}[rule]()
    codes = quotient.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    bias = tensors.get(f"{name}.bias")
    out = torch._scaled_mm(codes, tensors[f"{name}.weight"].to(device).t(), scale_a=scale_a, scale_b=scale_b,
                           bias=None if bias is None else bias.to(device, x.dtype), out_dtype=x.dtype,
                           use_fast_accum=True)
    return out.reshape(*x.shape[:-1], out.shape[-1]).cpu()


def runtime_scales(model: torch.nn.Module, names: list[str]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """The input and weight scales ModelOpt's FP8 GEMM cached at its first call (``_scale_a``, ``_scale_b``: amax /
    448 on the device), by Linear; none on the CPU, where the deployed path is emulated."""
    out = {}
    for name in names:
        module = model.get_submodule(name)
        if hasattr(module, "_scale_a") and hasattr(module, "_scale_b"):
            out[name] = (module._scale_a.detach().cpu(), module._scale_b.detach().cpu())
    return out


def main(source: Path, observations: Path, build: Path, out: Path) -> None:
    release = load_release()
    observation = next(o for o in load_observations(observations) if o.lab in release.heldout_labs)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = deployed_transformer(build)
    names = quantized_linears(model)  # the served model's Linears replace these, at the same paths
    deployed = first_call(model, names, source, observation, {})
    runtime = runtime_scales(model, names)
    del model
    torch.cuda.empty_cache()
    model = served_transformer(build, release.served_steps, release.policy.steps)
    served = first_call(model, names, source, observation, model.step_schedule.pipe_kwargs())  # type: ignore[operator]
    del model
    assert [n for n, _, _ in deployed] == [n for n, _, _ in served], "the two paths ran other Linears"
    first = next((i for i, (d, s) in enumerate(zip(deployed, served, strict=True)) if not torch.equal(d[2], s[2])),
                 None)
    tensors = stored(build, [n for n, _, _ in deployed])
    departures = []
    reciprocal = compiled_reciprocal() if device == "cuda" else lambda s: 1.0 / s
    rules: dict[str, dict[str, int]] = {r: {"linears_differing": 0, "outputs_differing": 0}
                                        for r in ("ieee_division", "ieee_reciprocal", "compiled_reciprocal")}
    approximate = 0  # Linears whose input scale's compiled reciprocal is not fp32(1 / s)
    for name, x, y in deployed:
        for rule, counts in rules.items():
            eager = eager_gemm(x, tensors, name, device, rule, reciprocal)
            counts["linears_differing"] += not torch.equal(eager, y)
            counts["outputs_differing"] += int((eager != y).sum())
            if rule == "ieee_division" and not torch.equal(eager, y):
                departures.append({"linear": name, "outputs_differing": int((eager != y).sum()), "outputs": y.numel(),
                                   "max_abs_diff": float((eager.float() - y.float()).abs().max())})
        scale = tensors[f"{name}.input_scale"].float().reshape(1, 1).to(device)
        approximate += not torch.equal(reciprocal(scale), 1.0 / scale)
    scale_pairs = [(runtime[n], (tensors[f"{n}.input_scale"], tensors[f"{n}.weight_scale"])) for n in runtime]
    result = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
        "observation": observation.obs_id, "linears_in_first_call": len(deployed),
        "first_differing_linear": None if first is None else {
            "index": first, "linear": deployed[first][0],
            "same_input": bool(torch.equal(deployed[first][1], served[first][1])),
            "outputs_differing": int((deployed[first][2] != served[first][2]).sum()),
            "outputs": deployed[first][2].numel()},
        "linears_differing": sum(not torch.equal(d[2], s[2]) for d, s in zip(deployed, served, strict=True)),
        "runtime_scales_vs_stored": {
            "linears": len(scale_pairs),
            "input_scale_differs": sum(not torch.equal(r[0].float().flatten(), s[0].float().flatten())
                                       for r, s in scale_pairs),
            "weight_scale_differs": sum(not torch.equal(r[1].float().flatten(), s[1].float().flatten())
                                        for r, s in scale_pairs)},
        "input_scales_whose_compiled_reciprocal_is_not_ieee": approximate,
        "deployed_vs_eager_scaled_mm_by_quantization_rule": rules,
        "deployed_vs_eager_scaled_mm": {"linears_differing": len(departures), "linears": departures},
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "deployed_vs_eager_scaled_mm"}, indent=2))
    print("deployed vs eager _scaled_mm, Linears differing:", len(departures))


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:5]))
