"""What every recipe step shares: the step interface, the state a build is made in, and the model plumbing (which
Linears a build quantizes, hooks on their inputs, ModelOpt's quantizer configuration for the build's scheme)."""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

import release.inputs.policy  # noqa: F401  (sets diffusers up without progress bars)
from release.core.config import BuildConfig
from release.core.device import modelopt_imported
from release.core.errors import ReleaseError
from release.quantize.recipes import per_channel

FP8_E4M3 = {"num_bits": (4, 3), "axis": None}  # FP8_DEFAULT_CFG's per-tensor weight and input quantizers
ROWS_PER_CALL = 64  # activation rows kept per algorithm call (evenly spaced, deterministic)


def quant_config(build: BuildConfig, algorithm: str | dict[str, Any] = "max") -> dict[str, Any]:
    """ModelOpt 0.47 list-form config: every quantizer off, then the build's Linears on with the scheme's weight and
    input quantizers (per-tensor static: NVIDIA's W8A8; per-channel weights with per-token dynamic inputs: ModelOpt's
    ``FP8_PER_CHANNEL_PER_TOKEN_CFG``), and the calibration ``algorithm`` (the export always records ``max``)."""
    weight_cfg: dict[str, Any] = per_channel.WEIGHT_CFG if build.scheme == per_channel.SCHEME else FP8_E4M3
    input_cfg: dict[str, Any] = per_channel.INPUT_CFG if build.scheme == per_channel.SCHEME else FP8_E4M3
    entries: list[dict[str, Any]] = [{"quantizer_name": "*", "enable": False}]
    for pattern in build.quantized:
        entries.append({"quantizer_name": f"*{pattern}.weight_quantizer", "cfg": dict(weight_cfg)})
        entries.append({"quantizer_name": f"*{pattern}.input_quantizer", "cfg": dict(input_cfg)})
    return {"quant_cfg": entries, "algorithm": algorithm}


def quantized_linears(model: torch.nn.Module) -> list[str]:
    """Linears whose ModelOpt weight quantizer is enabled."""
    return [name for name, module in model.named_modules()
            if getattr(getattr(module, "weight_quantizer", None), "is_enabled", False)]


def quantized_linears_of(model: torch.nn.Module, build: BuildConfig) -> list[str]:
    """Linears of the (not yet quantized) model that the build's patterns select."""
    return [name for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear) and any(fnmatch.fnmatchcase(name, p) for p in build.quantized)]


def module_weight(model: torch.nn.Module, name: str) -> torch.Tensor:
    weight: torch.Tensor = model.get_submodule(name).weight  # type: ignore[assignment]
    return weight


class FiniteCheck:
    """Whether every recorded activation was finite, answered once at the end: asking per Linear and call would wait
    for the GPU each time (129,024 waits for the Nano's 504 Linears over 256 calls) and keep it from running ahead."""

    BATCH = 4096  # flags stacked into one tensor every this many, so that few small tensors stay alive

    def __init__(self) -> None:
        self.stacked: list[torch.Tensor] = []
        self.pending: list[torch.Tensor] = []
        self.where: list[tuple[str, int]] = []

    def record(self, x: torch.Tensor, name: str, call: int) -> None:
        self.pending.append(torch.isfinite(x).all())
        self.where.append((name, call))
        if len(self.pending) == self.BATCH:
            self.stacked.append(torch.stack(self.pending))
            self.pending = []

    def check(self) -> None:
        """The first non-finite input in the order recorded, as a one-line error."""
        flags = self.stacked + ([torch.stack(self.pending)] if self.pending else [])
        if not flags:
            return
        ok = torch.cat(flags)
        if not bool(ok.all()):
            name, call = self.where[int((~ok).nonzero()[0])]
            raise ReleaseError(f"non-finite activation (NaN or Inf) at the input of {name} in transformer call {call}; "
                               "check the source weights and the observations")


@contextmanager
def input_hooks(model: torch.nn.Module, names: list[str],
                record: Callable[[str, torch.Tensor], None]) -> Iterator[None]:
    """Call ``record(name, input)`` on every forward of the named Linears."""

    def make(name: str) -> Callable[..., None]:
        def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
            record(name, args[0].detach())
        return hook

    handles = [model.get_submodule(n).register_forward_pre_hook(make(n)) for n in names]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class StopForward(Exception):
    """Raised by a hook to end a transformer call early, where the rest of the call computes nothing the pass needs
    (GPTQ's Hessians of the Linears before it, :mod:`release.quantize.recipes.gptq`); :func:`stoppable` ends the
    call quietly."""


@contextmanager
def stoppable() -> Iterator[None]:
    try:
        yield
    except StopForward:
        pass


def register_decoder_layers() -> None:
    """Tell ModelOpt's layer-by-layer calibration where the Cosmos3 decoder layers are (it finds those of Hugging
    Face language models only, and fails with "Could not find transformer layers" on a diffusers model)."""
    modelopt_imported()
    from modelopt.torch.quantization.utils.layerwise_calib import LayerActivationCollector

    LayerActivationCollector.register_decoder_layer_support(is_cosmos3, _decoder_layers)


def is_cosmos3(model: torch.nn.Module) -> bool:
    from diffusers import Cosmos3OmniTransformer

    return isinstance(model, Cosmos3OmniTransformer)


def _decoder_layers(model: torch.nn.Module) -> Any:
    return model.layers


def sample_rows(x: torch.Tensor, rows: int = ROWS_PER_CALL) -> torch.Tensor:
    """``rows`` evenly spaced rows of an activation, flattened to [tokens, channels], as a new fp32 tensor of their own.

    The rows are taken before the conversion and copied: a slice of the converted activation would keep all of it
    alive (the smoothing statistics keep a sample per group and call: at the Nano's size 2.5 GB a call, which filled
    an 80 GB GPU in the sq_auto_gptq build, BENCHMARKS.md)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2[:: max(1, x2.shape[0] // rows)][:rows].to(torch.float32, copy=True)


@dataclass
class Quantized:
    """A fake-quantized, calibrated transformer and what the recipe decided on the way (into provenance.json)."""

    model: torch.nn.Module
    alpha_table: list[dict[str, Any]] = field(default_factory=list)
    smoothing_scales: dict[str, torch.Tensor] = field(default_factory=dict)
    reconstruction: list[dict[str, Any]] = field(default_factory=list)
    notes: dict[str, Any] = field(default_factory=dict)


@dataclass
class Context:
    """A build in the making: the model (BF16, then fake-quantized), its data and what the steps record."""

    build: BuildConfig
    result: Quantized
    calls: list[dict[str, Any]]  # calibration calls (static input scales)
    algorithm_calls: list[dict[str, Any]]  # one per observation: smoothing statistics, Hessians, tuning

    @property
    def model(self) -> torch.nn.Module:
        return self.result.model


class Step:
    """One recipe step (``recipe:`` in a build file), registered by name in ``release.quantize.recipes.RECIPES``.

    ``before`` transforms the BF16 model ahead of ModelOpt's quantization (smoothing folds into the norms),
    ``algorithm`` is the ModelOpt calibration algorithm it runs (``max``, GPTQ, layer-by-layer max), ``after`` works
    on the calibrated model (tuned AutoRound). A step that ``changes_weights`` makes FP8 codes of its own, not a
    round-to-nearest of the (smoothed) source: verification checks them against ``max_weight_error`` (the relative
    Frobenius error of the dequantized weight against the weight the step started from) instead of recomputing
    them, and the build records each Linear's reconstruction error on calibration data.
    """

    name: ClassVar[str] = "rtn"

    def changes_weights(self, build: BuildConfig) -> bool:
        return False

    def max_weight_error(self, build: BuildConfig) -> float | None:
        """The bound verification holds a weight-changing step's FP8 weights to (None: codes are recomputed)."""
        return None

    def transforms(self, build: BuildConfig) -> bool:
        """Whether ``before`` changes the BF16 model that the calibration then runs (default: no)."""
        return False

    def before(self, ctx: Context) -> None:
        """Transform the BF16 model before quantization (default: nothing)."""

    def algorithm(self, build: BuildConfig) -> str | dict[str, Any]:
        """ModelOpt's calibration algorithm for this step (default: max calibration)."""
        return "max"

    def calibrating(self, build: BuildConfig) -> Any:
        """A context that ModelOpt's quantization of the build runs in (default: none)."""
        return contextlib.nullcontext()

    def after(self, ctx: Context) -> None:
        """Work on the calibrated, fake-quantized model (default: nothing)."""

    def describe(self, build: BuildConfig) -> dict[str, Any]:
        """What provenance.json records of this step: its parameters."""
        section = getattr(build, self.name, None)
        return section.model_dump() if section is not None else {}
