"""The joint-position DROID policy, rolled out with diffusers' own Cosmos3 pipeline pieces.

diffusers' ``"policy"`` action mode predicts DROID's 10-D end-effector actions with no state input. The released
policy is joint-position: 8-D actions (7 joints + gripper), ``chunk + 1`` action tokens whose row 0 is the clean
current state and rows 1..chunk are denoised. :class:`JointPositionPolicyPipeline` reuses the pipeline's prompt
tokenization, latent preparation, sequence packing and denoise loop, and only changes the action latents: the state
row is written into row 0 and marked as a clean conditioning frame, and the action width is the state's.

A *transformer call* (every keyword argument of one ``transformer.forward``) is the unit of calibration data;
:func:`capture_calls` records them with a forward pre-hook while the real pipeline runs.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
from diffusers.utils import logging as diffusers_logging

from release.core.config import PolicySettings
from release.core.device import compute_device
from release.core.errors import ReleaseError
from release.inputs.observations import _OBJECTS, _PLACES, _VERBS, Observation

diffusers_logging.disable_progress_bar()  # the tool shows its own (rich) progress
diffusers_logging.set_verbosity_error()


_ENCODED: dict[tuple[str, str, tuple[int, ...], str], torch.Tensor] = {}
_ENCODED_MAX = 512


class JointPositionPolicyPipeline(Cosmos3OmniPipeline):
    """Cosmos3 pipeline in ``"policy"`` mode with the joint state as a clean first action token.

    Pass the state as ``action.raw_actions`` of shape ``[1, dims]`` in policy mode.
    """

    def _encode_video(self, x: torch.Tensor) -> torch.Tensor:
        """The VAE encode of the conditioning clip, memoised: every build replays the same observations, and the
        encode dominates a tiny rollout's time. Keyed by the VAE's weights and the clip's bytes."""
        if not hasattr(self, "_vae_digest"):
            h = hashlib.sha256()
            for t in self.vae.state_dict().values():
                h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self._vae_digest = h.hexdigest()
        key = (self._vae_digest, str(x.dtype), tuple(x.shape),
               hashlib.sha256(x.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes()).hexdigest())
        if key not in _ENCODED:
            if len(_ENCODED) >= _ENCODED_MAX:
                _ENCODED.pop(next(iter(_ENCODED)))
            _ENCODED[key] = super()._encode_video(x)
        return _ENCODED[key].clone()

    def prepare_latents(self, *args: Any, **kwargs: Any) -> Any:
        out = list(super().prepare_latents(*args, **kwargs))
        action: CosmosActionCondition | None = kwargs.get("action")
        if action is None or action.mode != "policy" or action.raw_actions is None:
            return tuple(out)
        action_latents, action_condition_mask = out[2], out[7]
        state = action.raw_actions.reshape(-1).to(device=action_latents.device, dtype=action_latents.dtype)
        dims = state.numel()
        action_latents[:, dims:] = 0
        action_latents[0] = 0
        action_latents[0, :dims] = state
        action_condition_mask[0, 0] = 1.0
        out[10] = dims  # raw_action_dim: output width and the zeroed padding
        out[11] = [0]  # action_condition_frame_indexes: row 0 is clean
        return tuple(out)


def instruction_corpus() -> list[str]:
    """Text the fixture's tokenizer is trained on: DROID-like instructions inside the action JSON captions."""
    words = [f"{v} {o} {p}" for v in _VERBS for o in _OBJECTS for p in _PLACES]
    caption = JointPositionPolicyPipeline._build_action_json_prompt
    return [caption(w, view_point="concat_view", num_frames=33, fps=24.0, height=192, width=320) for w in words]


def load_pipeline(
    source: Path, settings: PolicySettings, transformer: torch.nn.Module | None = None
) -> JointPositionPolicyPipeline:
    """The policy pipeline of ``source``; ``transformer`` replaces the source's (e.g. a quantized build's)."""
    kwargs = {} if transformer is None else {"transformer": transformer}
    try:
        pipe = JointPositionPolicyPipeline.from_pretrained(
            str(source),
            **kwargs,
            dtype={"transformer": torch.bfloat16, "default": torch.float32},
            enable_safety_checker=False,
        )
    except (OSError, ValueError, KeyError) as exc:
        raise ReleaseError(f"{source}: cannot load the Cosmos3 pipeline: {str(exc).splitlines()[0]}") from exc
    pipe.scheduler = UniPCMultistepScheduler.from_config(pipe.scheduler.config, flow_shift=settings.shift)
    pipe.set_progress_bar_config(disable=True)
    from release.core.memory import cap, place

    device = compute_device()
    if cap() is None:
        return pipe.to(device)
    for name, component in pipe.components.items():  # the transformer within the cap, the small parts whole
        if isinstance(component, torch.nn.Module) and name != "transformer":
            component.to(device)
    place(pipe.transformer, device)
    return pipe


def observation_seed(settings: PolicySettings, obs: Observation) -> int:
    """Noise seed of one observation: the same for the BF16 source and every build."""
    return settings.noise_seed * 1_000_003 + obs.obs_id


@torch.no_grad()
def rollout(pipe: JointPositionPolicyPipeline, obs: Observation, settings: PolicySettings,
            **pipe_kwargs: Any) -> np.ndarray:
    """One policy call: the ``[chunk, dims]`` action chunk for one observation (``pipe_kwargs`` go to the pipeline,
    e.g. its mixed-precision schedule)."""
    from PIL import Image

    action = CosmosActionCondition(
        mode="policy",
        chunk_size=settings.chunk + 1,
        domain_name=settings.domain,
        resolution_tier=settings.resolution_tier,
        raw_actions=torch.tensor([obs.state[: settings.action_dims]], dtype=torch.float32),
        image=Image.fromarray(obs.concat_view()),
        view_point="concat_view",
    )
    generator = torch.Generator("cpu").manual_seed(observation_seed(settings, obs))
    out = pipe(
        prompt=obs.instruction,
        action=action,
        num_inference_steps=settings.steps,
        guidance_scale=settings.guidance,
        generator=generator,
        output_type="latent",
        enable_safety_check=False,
        **pipe_kwargs,
    )
    chunk = out.action[0][1:].float().cpu().numpy()
    if not np.isfinite(chunk).all():
        raise ReleaseError(f"observation {obs.obs_id}: the policy produced non-finite actions")
    return chunk


@contextmanager
def capture_calls(transformer: torch.nn.Module, sink: Callable[[dict[str, Any]], None]) -> Iterator[None]:
    """Hand every ``transformer.forward`` call's keyword arguments (detached copies) to ``sink``."""

    def hook(_module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if args:
            raise ReleaseError("the transformer was called with positional arguments; cannot record the call")
        sink(map_tensors(kwargs, lambda t: t.detach().to("cpu", copy=True)))  # stored device-independent

    handle = transformer.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def map_tensors(value: Any, fn: Callable[[torch.Tensor], torch.Tensor]) -> Any:
    """``fn`` applied to every tensor of a transformer call's (nested) keyword arguments."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, dict):
        return {k: map_tensors(v, fn) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(map_tensors(v, fn) for v in value)
    return value


def settings_digest(settings: PolicySettings) -> str:
    return hashlib.sha256(json.dumps(settings.model_dump(), sort_keys=True).encode()).hexdigest()[:16]
