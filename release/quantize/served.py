"""The served path: a build as NVIDIA's cosmos-framework policy server runs it (the seed's served rows).

The server (``cosmos_framework/utils/generator/quantization.py`` at NVIDIA/cosmos-framework@5eee9ed; README, "How
these builds are served") takes a ModelOpt FP8 checkpoint by its root ``hf_quant_config.json`` (``quant_method``
modelopt, ``quant_algo`` FP8; any other algorithm and any scale of more than one value are refused), and makes each
stored E4M3 weight a TorchAO ``PrototypeFloat8Tensor`` with the stored ``weight_scale`` and ``input_scale`` as they
are, inside a Linear that flattens the tokens before the GEMM (the tensor needs the input's rank to equal its (1, 1)
scale's). At run time TorchAO quantizes the input with the static scale and calls ``torch._scaled_mm`` with both
scales and fast accumulation. Its step policy runs step ``i`` of ``n`` W8A16 when ``i < first`` or ``i >= n - last``:
the weight dequantized in BF16 (``qdata.to(bf16) * scale.to(bf16)``) and a BF16 matmul. Here the same construction
is applied to the build loaded through diffusers, its TorchAO pinned in the ``served`` extra.

Where models run on the CPU the W8A8 GEMM is emulated (``release.core.fp8.static_forward``): the server runs on CUDA
only, and torch's CPU ``_scaled_mm`` is a reference kernel of other arithmetic, about 10 MFLOP/s. The emulation is
the eager Hopper kernel's arithmetic that TorchAO calls (the input quotient in fp32, fast accumulation, scales and
bias in one fp32 epilogue), checked against it on an H200 (``release/core/fp8_conformance.json``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from release.core import fp8
from release.core.config import StepPolicy
from release.core.conformance import TORCHAO, TORCHAO_EMULATED
from release.core.device import compute_device
from release.core.errors import ReleaseError
from release.core.io import parse_json
from release.core.output import torchao_quiet
from release.quantize.load import GemmRecord, load_build_transformer
from release.quantize.recipes import quantized_linears


class ServedLinear(torch.nn.Linear):
    """The server's FP8 Linear: the weight a ``PrototypeFloat8Tensor``; tokens flattened for TorchAO's GEMM, an
    empty input answered with an empty output; under W8A16 the weight dequantized in BF16 and a BF16 matmul; with
    ``emulate``, TorchAO's W8A8 arithmetic on Hopper emulated (module docstring)."""

    w8a16 = False
    emulate = False

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        shape = (*inputs.shape[:-1], self.out_features)
        if inputs.numel() == 0:
            return inputs.new_empty(shape)
        weight: Any = self.weight
        if self.w8a16:
            dense = weight.qdata.to(torch.bfloat16) * weight.scale.to(torch.bfloat16)
            return F.linear(inputs, dense, self.bias)
        if self.emulate:
            return fp8.static_forward(inputs, weight.qdata, weight.act_quant_scale.reshape(()),
                                      weight.scale.reshape(()), self.bias)
        return F.linear(inputs.reshape(-1, inputs.shape[-1]), weight, self.bias).reshape(shape)


@dataclass
class StepSchedule:
    """Sets every served Linear's mode for each denoising step of a rollout: the first step's before the pipeline
    runs (:meth:`pipe_kwargs`), each next step's from the pipeline's ``callback_on_step_end``. ``ran`` keeps the
    modes of the last rollout's steps as they were set."""

    policy: StepPolicy
    steps: int
    linears: list[ServedLinear]
    torchao: str
    ran: list[str] = field(default_factory=list)

    def _set(self, step: int) -> None:
        mode = self.policy.mode(step, self.steps)
        for linear in self.linears:
            linear.w8a16 = mode == "W8A16"
        self.ran.append(mode)

    def _next(self, _pipe: Any, step: int, _timestep: Any, _tensors: dict[str, Any]) -> dict[str, Any]:
        if step + 1 < self.steps:
            self._set(step + 1)
        return {}

    def pipe_kwargs(self) -> dict[str, Any]:
        self.ran = []
        self._set(0)
        return {"callback_on_step_end": self._next}


def ran_steps(pipe: Any, pipe_kwargs: dict[str, Any]) -> dict[str, Any]:
    """What each denoising step of the pipeline's last call ran, for release eval's record: a served build's modes
    from its StepSchedule, with TorchAO's version; a build rolled out with diffusers' step policy given
    (``mixed_precision_format``), from the pipeline's own record of it, where "base" (the policy off: the Linears' own
    forward, which quantizes every input of a fake-quant or deployed build) is W8A8; nothing for BF16."""
    schedule = getattr(pipe.transformer, "step_schedule", None)
    if schedule is not None:
        return {"steps": schedule.ran, "torchao": schedule.torchao}
    given = "mixed_precision_format" in pipe_kwargs
    return {"steps": [{"base": "W8A8"}.get(m, m) for m in pipe._mixed_precision_trace]} if given else {}


def torchao_version() -> str:
    """The installed TorchAO's version; a missing one is a one-line error naming the extra."""
    try:
        with torchao_quiet():
            import torchao
    except ImportError as exc:
        raise ReleaseError("--path served needs TorchAO, the policy server's FP8 kernels: pip install "
                           "'release[served]'") from exc
    return str(torchao.__version__)


def _check_served_format(folder: Path) -> None:
    """The server's own test of a checkpoint: ModelOpt FP8 per tensor, by its root ``hf_quant_config.json``."""
    path = folder / "hf_quant_config.json"
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; the policy server recognises a ModelOpt FP8 checkpoint by it "
                           "(rebuild with 'release build')")
    config = parse_json(path.read_bytes(), str(path), "rebuild with 'release build'")
    method = config.get("quant_method") if isinstance(config, dict) else None
    algo = config.get("quant_algo") if isinstance(config, dict) else None
    if method != "modelopt" or algo != "FP8":
        raise ReleaseError(f"{path}: quant_method {method!r}, quant_algo {algo!r}; the policy server serves only "
                           "ModelOpt FP8 with per-tensor scales (quant_algo 'FP8'), so this build has no served "
                           "path: evaluate it with --path deployed")


def _stored_tensors(transformer: Path, names: list[str]) -> dict[str, Path]:
    """The shard of each quantized Linear's stored ``weight``, ``weight_scale`` and ``input_scale``, which are read
    from there as the server reads them (nothing re-quantized), one Linear at a time. A missing tensor, a weight
    that is not E4M3 or a scale of more than one value is refused by name, from the shards' headers."""
    from safetensors import safe_open

    wanted = {f"{n}.{part}" for n in names for part in ("weight", "weight_scale", "input_scale")}
    found: dict[str, Path] = {}
    for shard in sorted(transformer.glob("*.safetensors")):
        with safe_open(str(shard), framework="pt", device="cpu") as f:
            for key in wanted.intersection(f.keys()):
                found[key] = shard
                stored = f.get_slice(key)
                dtype, values = stored.get_dtype(), math.prod(stored.get_shape())
                if key.endswith(".weight") and dtype != "F8_E4M3":
                    raise ReleaseError(f"{shard}: tensor {key} is {dtype}, not F8_E4M3")
                if not key.endswith(".weight") and values != 1:
                    raise ReleaseError(f"{shard}: tensor {key} has {values} values; the policy server takes one "
                                       "scale per tensor")
    missing = sorted(wanted - found.keys())
    if missing:
        raise ReleaseError(f"{transformer}: tensor {missing[0]} is missing; the policy server needs every FP8 "
                           "Linear's weight, weight_scale and input_scale (rebuild with 'release build')")
    return found


def _read(shard: Path, key: str) -> torch.Tensor:
    from safetensors import safe_open

    with safe_open(str(shard), framework="pt", device="cpu") as f:
        return f.get_tensor(key)


def served_kernel() -> str:
    """The served path's W8A8 GEMM here: TorchAO's on CUDA, its emulation elsewhere (module docstring)."""
    return TORCHAO if compute_device() == "cuda" else TORCHAO_EMULATED


def served_transformer(folder: Path, policy: StepPolicy, steps: int) -> torch.nn.Module:
    """The exported build through diffusers with its FP8 Linears made as the policy server makes them (module
    docstring). The model's ``gemm_record`` names the kernel and collects the GEMM shapes; its ``step_schedule``
    sets each step's W8A8 or W8A16 during a rollout."""
    version = torchao_version()
    with torchao_quiet():
        from torchao.float8.inference import Float8MMConfig
        from torchao.prototype.quantization.float8_static_quant.prototype_float8_tensor import PrototypeFloat8Tensor
        from torchao.quantization import PerTensor
        from torchao.quantization.quantize_.workflows import QuantizeTensorToFloat8Kwargs

    _check_served_format(folder)
    model = load_build_transformer(folder)
    names = quantized_linears(model)
    stored = _stored_tensors(folder / "transformer", names)
    mm_config = Float8MMConfig(use_fast_accum=True)
    activation = QuantizeTensorToFloat8Kwargs(float8_dtype=torch.float8_e4m3fn, granularity=PerTensor(),
                                              mm_config=mm_config)
    record = GemmRecord(served_kernel())
    linears = []
    for name in names:
        module: Any = model.get_submodule(name)
        served = ServedLinear(module.in_features, module.out_features, bias=False, device="meta")
        served.bias = module.bias
        qdata, weight_scale, input_scale = (_read(stored[f"{name}.{part}"], f"{name}.{part}")
                                            for part in ("weight", "weight_scale", "input_scale"))
        served.weight = torch.nn.Parameter(PrototypeFloat8Tensor(
            qdata, weight_scale.float().reshape(1, 1),
            act_quant_scale=input_scale.float().reshape(1, 1), block_size=list(qdata.shape),
            mm_config=mm_config, act_quant_kwargs=activation, dtype=torch.bfloat16), requires_grad=False)
        served.train(False)
        served.emulate = record.kernel == TORCHAO_EMULATED
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, served)
        record.track(served)
        linears.append(served)
    model.gemm_record = record  # type: ignore[assignment]  # read by release eval
    model.step_schedule = StepSchedule(policy, steps, linears, version)  # type: ignore[assignment]
    return model
