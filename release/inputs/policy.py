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

import contextlib
import functools
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from release.core.config import PolicySettings
from release.core.device import compute_device, default_dtype_kept
from release.core.errors import ReleaseError
from release.core.io import cache_dir, json_digest, keep_cached
from release.core.output import torchao_quiet
from release.inputs.observations import _OBJECTS, _PLACES, _VERBS, Observation

with torchao_quiet():  # diffusers imports TorchAO's quantizer where TorchAO is installed (the 'served' extra)
    from diffusers import Cosmos3OmniPipeline, UniPCMultistepScheduler
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import CosmosActionCondition
    from diffusers.utils import logging as diffusers_logging
    from diffusers.video_processor import VideoProcessor

diffusers_logging.disable_progress_bar()  # the tool shows its own (rich) progress
diffusers_logging.set_verbosity_error()


@dataclass
class _Conditioned:
    """What ``_prepare_action_video_conditioning`` returned for a clip (of the clip, its shape) and its encode."""

    shape: tuple[int, ...]
    image_size: torch.Tensor
    height: int
    width: int
    latents: torch.Tensor | None = None


# The conditioning of each observation's frame (its clip resized and padded, then the VAE encode), memoised: every
# build replays the same observations, and the 33-frame resize and the encode dominate a tiny rollout otherwise.
_CONDITIONED: dict[tuple[Any, ...], _Conditioned] = {}
_CONDITIONED_MAX = 512
# Below this many transformer parameters a rollout on the CPU runs its denoising loop on one thread: the model's
# operations are too small to gain from a second one, and on a shared machine waiting for it cost 4 to 30 times the
# work (BENCHMARKS.md, "Where a tiny rollout's time goes"). A new frame's conditioning (the resize of its clip and the
# VAE's 3-D convolutions, large at the real frame size) keeps the caller's threads. The bits are those of two
# threads: checked on 8 observations of the tiny fixture, BF16, fake quant and deployed, per-tensor and per-channel
# (bench/tiny_rollout.py --compare; tests/test_rollout.py on two). The tiny fixture has 0.57M parameters, the Nano
# 15.7B.
ONE_THREAD_BELOW = 10_000_000


def _remember(key: tuple[Any, ...], entry: _Conditioned) -> None:
    if len(_CONDITIONED) >= _CONDITIONED_MAX:
        _CONDITIONED.pop(next(iter(_CONDITIONED)))
    _CONDITIONED[key] = entry


def _stored(key: tuple[Any, ...]) -> Path:
    """Where the conditioning of ``key`` is kept between processes: ``RELEASE_CACHE/conditioning/`` (a later
    ``release eval`` or a campaign's resumption skips the VAE encodes of frames it has seen, about 0.3 s each on two
    cores)."""
    return cache_dir() / "conditioning" / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:32]}.safetensors"


def _load_stored(key: tuple[Any, ...]) -> _Conditioned | None:
    """The kept conditioning of ``key``, on its device; None when there is none or it cannot be read (a damaged
    file is only a cache entry: the clip is encoded again and the file rewritten)."""
    from safetensors import safe_open

    path = _stored(key)
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), framework="pt", device=key[4]) as f:
            meta = f.metadata() or {}
            if json.loads(meta.get("key", "null")) != list(key):
                return None
            return _Conditioned(tuple(json.loads(meta["shape"])), f.get_tensor("image_size"), int(meta["height"]),
                                int(meta["width"]), f.get_tensor("latents"))
    except Exception:  # any unreadable entry is a miss
        return None


def _keep(key: tuple[Any, ...], entry: _Conditioned) -> None:
    """Write ``entry`` for later processes, whole or not at all (a temporary of this process, then a rename)."""
    from safetensors.torch import save

    assert entry.latents is not None
    path = _stored(key)
    data = save({"latents": entry.latents.detach().cpu().contiguous(),
                 "image_size": entry.image_size.detach().cpu().contiguous()},
                {"key": json.dumps(list(key)), "shape": json.dumps(list(entry.shape)), "height": str(entry.height),
                 "width": str(entry.width)})
    keep_cached(path, data)


def _clip_digest(clip: Any) -> str | None:
    """A content hash of a conditioning clip given as PIL images or arrays; None for anything else (not memoised)."""
    from PIL import Image

    frames = clip if isinstance(clip, list) else [clip]
    if len(frames) == 1 and isinstance(known := getattr(frames[0], "_release_digest", None), str):
        return known  # an observation's frame (Observation.frame: decoded once, never changed), hashed before
    h = hashlib.sha256()
    for frame in frames:
        if isinstance(frame, Image.Image):
            h.update(f"PIL {frame.mode} {frame.size}".encode())
            h.update(frame.tobytes())
        elif isinstance(frame, np.ndarray):
            h.update(f"ndarray {frame.dtype} {frame.shape}".encode())
            h.update(np.ascontiguousarray(frame).tobytes())
        else:
            return None
    digest = h.hexdigest()
    if len(frames) == 1 and isinstance(frames[0], Image.Image):
        frames[0]._release_digest = digest  # type: ignore[attr-defined]
    return digest


def conditioned(pipe: JointPositionPolicyPipeline, obs: Observation) -> bool:
    """Whether this process holds the conditioning of ``obs``'s frame for ``pipe``'s VAE (its rollout then skips
    the encode)."""
    digest, vae = _clip_digest(obs.frame()), pipe._vae_key()
    return any(key[0] == vae and key[1] == digest for key in _CONDITIONED)


class _ProbedShapes(VideoProcessor):
    """diffusers' video processor, except for the pipeline's probe: ``__call__`` preprocesses the whole conditioning
    clip only to read its height and width (12 ms of a tiny rollout's 90 ms), and the conditioning preprocesses it
    again. Here a clip's processed shape is remembered by its content digest, and the probe (any call outside
    :meth:`processing`) of a clip seen before gets a meta tensor of that shape: reading its values fails loudly."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._shapes: dict[str, torch.Size] = {}
        self._processing = False
        self._last: tuple[Any, str | None] | None = None  # (clip's first frame, digest): one hash per rollout

    def digest(self, clip: Any) -> str | None:
        frames = clip if isinstance(clip, list) else [clip]
        if len(frames) == 1 and self._last is not None and self._last[0] is frames[0]:
            return self._last[1]
        digest = _clip_digest(clip)
        if len(frames) == 1:
            self._last = (frames[0], digest)
        return digest

    @contextmanager
    def processing(self) -> Iterator[None]:
        self._processing = True
        try:
            yield
        finally:
            self._processing = False

    def preprocess_video(self, video: Any, height: int | None = None, width: int | None = None,
                         **kwargs: Any) -> torch.Tensor:
        if self._processing or height is not None or width is not None or kwargs:
            return super().preprocess_video(video, height, width, **kwargs)
        digest = self.digest(video)
        if digest is not None and (shape := self._shapes.get(digest)) is not None:
            return torch.empty(shape, device="meta")
        out = super().preprocess_video(video)
        if digest is not None:
            self._shapes[digest] = out.shape
        return out


def _processing(pipe: Cosmos3OmniPipeline) -> Any:
    processor = pipe.video_processor
    return processor.processing() if isinstance(processor, _ProbedShapes) else contextlib.nullcontext()


# How this thread runs a frame's conditioning on the caller's torch threads: rollouts in threads of their own
# (``release.inputs.batched``) hand it to the thread that started them (``.run``), whose thread count is the caller's.
CALLER = threading.local()


def on_caller_threads(pipe: Cosmos3OmniPipeline, work: Callable[[], Any]) -> Any:
    run = getattr(CALLER, "run", None)
    if run is not None:
        return run(work)
    with torch_threads(getattr(pipe, "_caller_threads", torch.get_num_threads())):
        return work()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` inside, the caller's restored after."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# How the VAE's encode runs on a float32 CPU input (part of the conditioning memo's key): two of its operations, at the
# tiny fixture's widths, take torch kernels that cost 0.86 s of a 1.0 s encode of one frame's clip on two cores.
# - Its 3-D convolutions: for a single sample torch takes its im2col kernel (``slow_conv3d``) where fewer than 20,480
#   elements span the batch, channel, time and height dimensions (``ConvParams::use_mkldnn``), as in the Wan VAE's
#   causal chunks; oneDNN's kernel computes the same convolution (0.62 s there, 0.08 s here).
# - Its RMS norms (``WanRMS_norm``: ``F.normalize`` over the channels of a 5-D tensor): the root of the channels' sum
#   of squares, summed by ``sum`` rather than ``linalg.vector_norm``'s strided reduction (0.24 s there, 0.01 s here).
# Both are the same operations in another summation order: the latents differ by about 4e-7. A GPU's encode is
# diffusers' as it is.
CPU_ENCODE = "conv3d:onednn,rms:sum"


def cpu_encode(vae: torch.nn.Module) -> None:
    """``vae``'s float32 CPU calls of its zero-padded 3-D convolutions and channel-first RMS norms as
    :data:`CPU_ENCODE` says; any other call (a GPU, another dtype, a build of torch without oneDNN) as before."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanRMS_norm

    for module in vae.modules():
        if (isinstance(module, torch.nn.Conv3d) and module.padding_mode == "zeros" and isinstance(module.padding, tuple)
                and torch.backends.mkldnn.is_available()):
            module._conv_forward = functools.partial(_conv3d, module, module._conv_forward)  # type: ignore[method-assign]
        elif isinstance(module, WanRMS_norm) and module.channel_first:
            module.forward = functools.partial(_rms_norm, module, module.forward)


def _cpu_float(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32 and not torch.is_grad_enabled()


def _conv3d(module: torch.nn.Conv3d, original: Callable[..., torch.Tensor], x: torch.Tensor, weight: torch.Tensor,
            bias: torch.Tensor | None) -> torch.Tensor:
    if _cpu_float(x) and weight.dtype == torch.float32:
        return torch.ops.aten.mkldnn_convolution(x, weight, bias, module.padding, module.stride, module.dilation,
                                                 module.groups)
    return original(x, weight, bias)


def _rms_norm(module: Any, original: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    if _cpu_float(x):  # F.normalize's x / max(||x||, 1e-12) over the channels
        norm = x.square().sum(1, keepdim=True).sqrt().clamp_min(1e-12)
        return x / norm * module.scale * module.gamma + module.bias
    return original(x)


class JointPositionPolicyPipeline(Cosmos3OmniPipeline):
    """Cosmos3 pipeline in ``"policy"`` mode with the joint state as a clean first action token.

    Pass the state as ``action.raw_actions`` of shape ``[1, dims]`` in policy mode.
    """

    video_processor: VideoProcessor

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.probed()
        return super().__call__(*args, **kwargs)

    def probed(self) -> _ProbedShapes:
        """The frame processor that remembers the probe's shapes, in place of diffusers' own (its __init__'s)."""
        if not isinstance(self.video_processor, _ProbedShapes):
            self.video_processor = _ProbedShapes(vae_scale_factor=self.vae_scale_factor_spatial, resample="bilinear")
        return self.video_processor

    def _vae_key(self) -> str:
        """A hash of the VAE's weights and config (the conditioning's memo key), computed once per pipeline. The folder
        it was loaded from (the config's ``_name_or_path``) is left out: a copy of the same source elsewhere (another
        project folder, the Hub cache's snapshot) encodes a frame to the same bits."""
        if not hasattr(self, "_vae_digest"):
            config = {k: v for k, v in dict(self.vae.config).items() if k != "_name_or_path"}
            config["_cpu_encode"] = CPU_ENCODE  # a CPU encode of other kernels is not this one
            h = hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode())
            for t in self.vae.state_dict().values():
                h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
            self._vae_digest = h.hexdigest()
        return self._vae_digest

    def _prepare_action_video_conditioning(self, conditioning_clip: Any, resolution_tier: int, num_frames: int,
                                           device: torch.device | str, dtype: torch.dtype) -> Any:
        """diffusers' conditioning clip (resized, padded), its VAE encode memoised by the VAE and the frame's bytes.
        For a frame seen before, a meta tensor of the clip's shape stands for the clip: ``prepare_latents`` hands it
        to ``_encode_video`` alone, which returns the memoised encode (any other use of it fails)."""
        self._pending: tuple[torch.Tensor, tuple[Any, ...], _Conditioned] | None = None
        digest = (self.video_processor.digest(conditioning_clip) if isinstance(self.video_processor, _ProbedShapes)
                  else _clip_digest(conditioning_clip))
        key = None if digest is None else (self._vae_key(), digest, int(resolution_tier), int(num_frames),
                                           str(torch.device(device)), str(dtype))
        if key is not None and key not in _CONDITIONED and (kept := _load_stored(key)) is not None:
            _remember(key, kept)
        if key is not None and (hit := _CONDITIONED.get(key)) is not None:
            stand_in = torch.empty(hit.shape, dtype=dtype, device="meta")
            self._pending = (stand_in, key, hit)
            return stand_in, hit.image_size.clone(), hit.height, hit.width
        prepare = super()._prepare_action_video_conditioning

        def conditioning() -> Any:
            with _processing(self):
                return prepare(conditioning_clip, resolution_tier, num_frames, device, dtype)

        frames, image_size, height, width = on_caller_threads(self, conditioning)
        if key is not None:
            self._pending = (frames, key, _Conditioned(tuple(frames.shape), image_size.clone(), height, width))
        return frames, image_size, height, width

    def _encode_video(self, x: torch.Tensor) -> torch.Tensor:
        """The VAE encode; of a clip of ``_prepare_action_video_conditioning``, memoised."""
        pending, self._pending = getattr(self, "_pending", None), None
        if pending is None or x is not pending[0]:
            if x.is_meta:
                raise ReleaseError("internal: a memoised conditioning clip stood in for something else than its "
                                   "VAE encode")
            return super()._encode_video(x)
        _, key, entry = pending
        if entry.latents is None:  # computed just now: encode it (on the caller's threads) and keep the encode
            encode = super()._encode_video
            entry.latents = on_caller_threads(self, lambda: encode(x))
            _remember(key, entry)
            _keep(key, entry)
        return entry.latents.clone()

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
        with default_dtype_kept():
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
    cpu_encode(pipe.vae)
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


def one_thread(transformer: torch.nn.Module) -> bool:
    """Whether rollouts of ``transformer`` run on one torch thread: a model this small on a CPU, whose operations are
    too small to split (and whose bits do not depend on the thread count, tests/test_rollout.py)."""
    return compute_device() == "cpu" and sum(p.numel() for p in transformer.parameters()) < ONE_THREAD_BELOW


@torch.no_grad()
def rollout(pipe: JointPositionPolicyPipeline, obs: Observation, settings: PolicySettings, *,
            threads: int | None = None, **pipe_kwargs: Any) -> np.ndarray:
    """One policy call: the ``[chunk, dims]`` action chunk for one observation (``pipe_kwargs`` go to the pipeline,
    e.g. its mixed-precision schedule). ``threads``: the caller's torch threads, which a frame's VAE encode runs on
    (default: the current count; ``release.inputs.batched`` passes its caller's from its rollouts' threads)."""
    action = CosmosActionCondition(
        mode="policy",
        chunk_size=settings.chunk + 1,
        domain_name=settings.domain,
        resolution_tier=settings.resolution_tier,
        raw_actions=torch.tensor([obs.state[: settings.action_dims]], dtype=torch.float32),
        image=obs.frame(),
        view_point="concat_view",
    )
    generator = torch.Generator("cpu").manual_seed(observation_seed(settings, obs))
    small = one_thread(pipe.transformer)
    pipe._caller_threads = threads or torch.get_num_threads()
    with torch_threads(1 if small else pipe._caller_threads):
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
    return json_digest(settings.model_dump())
