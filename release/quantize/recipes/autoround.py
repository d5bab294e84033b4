"""AutoRound, two ways.

``tuning: none`` (the seed's builds ``autoround`` and ``sq_auto_autoround``): the seed's quantizer ran AutoRound on
FP8 and tuned nothing (its AutoRound tunes INT, UINT and NVFP4 weights only), so its FP8 codes were byte-equal to RTN's
and SQ auto's, and its rows differed only in the activation calibration after the AutoRound step (250 and 302 of 504
input scales changed). Which calibration that was is not recorded; this step takes the reading that ModelOpt offers as
is: layer-by-layer max calibration in which each decoder layer sees the outputs of the layers before it already
quantized (``layerwise`` with ``get_qdq_activations_from_prev_layer``), where plain max calibration runs with
quantization off. The weights stay round-to-nearest.

``tuning: auto-round`` (``autoround_tuned``): the auto-round library (the ``autoround`` extra) tunes each decoder
layer's rounding and weight clipping for FP8 weights (per tensor, or per channel in that scheme) by signed gradient
descent on the layer's output error over the algorithm calls, layer after layer, each from the outputs of the tuned
layers before it; the codes move. The tuning sees the weight quantization only; the input scales are then calibrated by
the build's calibrator, as for any build, and the weight amax is AutoRound's tuned scale times 448.
"""

from __future__ import annotations

import contextlib
import io
import logging
from typing import Any

import torch

from release.core.config import BuildConfig
from release.core.errors import ReleaseError
from release.core.fp8 import FP8_MAX
from release.core.memory import execution_device, is_placed
from release.quantize.recipes import per_channel
from release.quantize.recipes.base import Context, Step, quantized_linears

EXTRA = "autoround"
# Tuned rounding moves a code by at most one step and clipping shrinks the scale by a few percent: the weights stay
# about as close to the source as round-to-nearest's (relative error about 0.03). The bound verification holds tuned
# codes to.
MAX_WEIGHT_ERROR = 0.15
ACCUMULATE = 8  # auto-round's default batch size
SCALES = "autoround_scales"  # Context.result.notes: each tuned Linear's AutoRound weight scale


class _Layer(torch.nn.Module):
    """A Cosmos3 decoder layer as auto-round expects a block: one hidden state in, one out. The layer reads two
    streams (understanding, generation) and the rotary embedding; here a sample is the two streams concatenated,
    [1, und + gen, hidden], and the split point and rotary embedding are looked up by the sample's length (the
    sequence layout, and so the positions, is a function of it; checked when the inputs are captured)."""

    def __init__(self, layer: torch.nn.Module, layouts: dict[int, tuple[int, Any]]) -> None:
        super().__init__()
        self.layer = layer
        self.layouts = layouts

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        outs = []
        for h in hidden_states:
            und_len, rotary = self.layouts[h.shape[0]]
            und, gen = self.layer(h[:und_len], h[und_len:], rotary)
            outs.append(torch.cat([und, gen]))
        return torch.stack(outs)


def _first_layer_inputs(model: Any, calls: list[dict[str, Any]], layouts: dict[int, tuple[int, Any]]
                        ) -> list[torch.Tensor]:
    samples: list[torch.Tensor] = []

    def hook(_module: torch.nn.Module, args: tuple[Any, ...]) -> None:
        und, gen, rotary = args
        n = und.shape[0] + gen.shape[0]
        if n in layouts and not (layouts[n][0] == und.shape[0] and all(
                torch.equal(a, b) for a, b in zip(layouts[n][1], rotary, strict=True))):
            raise ReleaseError(f"auto-round tuning: two calls of {n} tokens differ in their layout; the adapter keys "
                               "the layout by length, so it cannot tune on these calls")
        layouts[n] = (und.shape[0], rotary)
        samples.append(torch.cat([und, gen]).detach()[None])

    handle = model.layers[0].register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            for call in calls:
                model(**call)
    finally:
        handle.remove()
    return samples


class AutoRound(Step):
    name = "autoround"

    def tuned(self, build: BuildConfig) -> bool:
        return bool(build.section(self.name).tuning != "none")

    def changes_weights(self, build: BuildConfig) -> bool:
        return self.tuned(build)

    def max_weight_error(self, build: BuildConfig) -> float | None:
        return MAX_WEIGHT_ERROR if self.tuned(build) else None

    def algorithm(self, build: BuildConfig) -> str | dict[str, Any]:
        if self.tuned(build):
            return "max"
        return {"method": "max", "layerwise": {"enable": True, "get_qdq_activations_from_prev_layer": True}}

    def transforms(self, build: BuildConfig) -> bool:
        return self.tuned(build)

    def before(self, ctx: Context) -> None:
        """Tune every decoder layer with auto-round, in order, each on the outputs of the tuned layers before it."""
        if not self.tuned(ctx.build):
            return
        try:
            from auto_round import AutoRound as Tuner
        except ImportError as exc:
            raise ReleaseError(f"builds/{ctx.build.name}.yaml: 'autoround.tuning: auto-round' needs the auto-round "
                               f"library, the '{EXTRA}' extra: pip install 'release[{EXTRA}]'") from exc
        build, model = ctx.build, ctx.model
        if is_placed(model):
            raise ReleaseError(f"builds/{build.name}.yaml: 'autoround.tuning: auto-round' does not run under "
                               "--max-gpu-memory (auto-round refuses a model with offloaded layers); build it without "
                               "the cap, on a GPU that holds the BF16 model")
        transformer: Any = model  # a Cosmos3OmniTransformer (mypy cannot see diffusers' attributes)
        params = build.section(self.name)
        scheme = {"bits": 8, "group_size": -1 if build.scheme == per_channel.SCHEME else 0, "data_type": "fp",
                  "sym": True, "act_bits": 16}
        source = str(transformer.config.get("_name_or_path", "") or ".")
        transformer.config.name_or_path = source  # auto-round looks the model up by name; a local path keeps it offline
        device = execution_device(model)
        layouts: dict[int, tuple[int, Any]] = {}
        samples = _first_layer_inputs(model, ctx.algorithm_calls, layouts)
        scales: dict[str, torch.Tensor] = {}
        # auto-round casts the whole model to float32 where it finds no bf16 support (a CPU without AVX512-BF16 or
        # AMX); the model goes back to its own dtypes once tuned
        dtypes = {k: v.dtype for k, v in model.state_dict().items()}
        logger = logging.getLogger("autoround")
        level, logger.level = logger.level, logging.ERROR
        try:
            for i, layer in enumerate(transformer.layers):
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                    # Samples differ in length, so they cannot be stacked: batches of one, gradients accumulated
                    # over auto-round's default batch of 8 (its block runner reads the attribute).
                    tuner = Tuner(model, tokenizer="", scheme=scheme, iters=params.iters, lr=params.lr,
                                  nsamples=len(samples), batch_size=1, gradient_accumulate_steps=ACCUMULATE,
                                  device_map=device, enable_torch_compile=False, to_quant_block_names=f"layers.{i}")
                    tuner.batch_size = 1
                    outputs, _ = tuner.quantize_block(_Layer(layer, layouts), inputs=[(((s,), {}),) for s in samples],
                                                      device=device)
                samples = [o.detach() for o in outputs]
                for name, module in layer.named_modules():
                    scale: Any = getattr(module, "scale", None)
                    if isinstance(module, torch.nn.Linear) and isinstance(scale, torch.Tensor):
                        scales[f"layers.{i}.{name}"] = scale.detach().float().reshape(-1, 1) \
                            if build.scheme == per_channel.SCHEME else scale.detach().float().reshape(())
                        del module.scale
        finally:
            logger.level = level
        for key, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if key in dtypes and tensor.dtype != dtypes[key]:
                tensor.grad = None  # the tuning's, in float32
                tensor.data = tensor.data.to(dtypes[key])
        ctx.result.notes[SCALES] = scales

    def after(self, ctx: Context) -> None:
        """The weight amax of each tuned Linear: auto-round's scale times 448 (its max calibration would give the
        largest tuned weight, which clipping may have moved)."""
        scales = ctx.result.notes.pop(SCALES, {})
        for name in quantized_linears(ctx.model):
            if name in scales:
                quantizer: Any = ctx.model.get_submodule(name).weight_quantizer
                quantizer.amax = (scales[name] * FP8_MAX).to(quantizer.amax.dtype).to(quantizer.amax.device)
