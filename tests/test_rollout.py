"""A tiny rollout's shortcuts (issue 33) give the bits of the plain computation: the memoised conditioning of a frame
(its resize and VAE encode) and one thread for a small model's rollout on the CPU."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniPipeline
from diffusers.video_processor import VideoProcessor

import release.inputs.policy as policy
from release.core.config import PolicySettings
from release.core.errors import ReleaseError
from release.inputs.observations import load_observations


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32)


def _counted_encodes(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """From now on, every clip diffusers' own VAE encode is given (it must not run for a memoised frame)."""
    calls: list[torch.Tensor] = []
    encode = Cosmos3OmniPipeline._encode_video

    def counted(self: Cosmos3OmniPipeline, x: torch.Tensor) -> torch.Tensor:
        calls.append(x)
        return encode(self, x)

    monkeypatch.setattr(Cosmos3OmniPipeline, "_encode_video", counted)
    return calls


def test_a_memoised_conditioning_gives_the_bits_of_a_computed_one(tiny: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    monkeypatch.setattr(policy, "_CONDITIONED", {})
    settings = PolicySettings()
    pipe = policy.load_pipeline(tiny / "source", settings)
    obs = load_observations(tiny / "observations")[0]
    computed = policy.rollout(pipe, obs, settings)
    assert len(policy._CONDITIONED) == 1
    (entry,) = policy._CONDITIONED.values()
    calls = _counted_encodes(monkeypatch)
    memoised = policy.rollout(pipe, obs, settings)
    assert not calls
    assert np.array_equal(_bits(memoised), _bits(computed))
    # a second pipeline (a build's, with the source's VAE) uses the same entry
    again = policy.rollout(policy.load_pipeline(tiny / "source", settings), obs, settings)
    assert not calls and list(policy._CONDITIONED.values()) == [entry]
    assert np.array_equal(_bits(again), _bits(computed))


def test_a_seen_frame_is_probed_by_its_digest_and_decoded_once(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """The pipeline's probe of a frame seen before (diffusers preprocesses the whole clip for its height and width)
    is a meta tensor of the remembered shape, with the bits of the rollout that preprocessed it; the frame's PNGs
    are decoded once while they are unchanged."""
    monkeypatch.setattr(policy, "_CONDITIONED", {})
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path))  # no conditioning kept by other tests
    settings = PolicySettings()
    obs = load_observations(tiny / "observations")[1]
    assert obs.frame() is obs.frame() and np.array_equal(np.asarray(obs.frame()), obs.concat_view())
    pipe = policy.load_pipeline(tiny / "source", settings)
    calls: list[torch.Tensor] = []
    preprocess = VideoProcessor.preprocess_video

    def counted(self: VideoProcessor, *args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(preprocess(self, *args, **kwargs))
        return calls[-1]

    monkeypatch.setattr(VideoProcessor, "preprocess_video", counted)
    first = policy.rollout(pipe, obs, settings)  # the probe and the conditioning, each preprocessing the clip
    assert [t.is_meta for t in calls] == [False, False]
    again = policy.rollout(pipe, obs, settings)
    assert isinstance(pipe.video_processor, policy._ProbedShapes) and len(calls) == 2  # the probe: a shape
    assert np.array_equal(_bits(again), _bits(first))
    before, png = obs.frame(), obs.images["wrist_image_left"]
    os.utime(png, ns=(png.stat().st_atime_ns, png.stat().st_mtime_ns + 1))  # a changed file is decoded again
    assert obs.frame() is not before and np.array_equal(np.asarray(obs.frame()), np.asarray(before))


def test_a_copy_of_the_source_elsewhere_uses_the_same_conditioning(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """The memo's key is the VAE's weights and config, not the folder it was loaded from: the same source copied
    elsewhere (a project folder, the Hub cache's snapshot) encodes no frame again and gives the same bits."""
    import shutil

    monkeypatch.setattr(policy, "_CONDITIONED", {})
    settings = PolicySettings()
    obs = load_observations(tiny / "observations")[0]
    computed = policy.rollout(policy.load_pipeline(tiny / "source", settings), obs, settings)
    copy = shutil.copytree(tiny / "source", tmp_path / "elsewhere" / "source")
    calls = _counted_encodes(monkeypatch)
    pipe = policy.load_pipeline(copy, settings)
    assert pipe.vae.config["_name_or_path"] != str(tiny / "source" / "vae")  # loaded from the copy
    again = policy.rollout(pipe, obs, settings)
    assert not calls and len(policy._CONDITIONED) == 1
    assert np.array_equal(_bits(again), _bits(computed))


def _entry(path: Path) -> tuple[dict[str, str], dict[str, bytes]]:
    """A safetensors file's metadata and tensors' bytes (its header's key order is not fixed)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        return f.metadata(), {k: f.get_tensor(k).contiguous().view(torch.uint8).numpy().tobytes() for k in f.keys()}


def test_the_conditioning_kept_on_disk_serves_a_later_process_with_the_same_bits(
        tiny: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A frame's conditioning is kept in RELEASE_CACHE/conditioning: a new process (an empty memo) reads it instead
    of encoding the clip again; a damaged entry is encoded again and rewritten."""
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(policy, "_CONDITIONED", {})
    settings = PolicySettings()
    pipe = policy.load_pipeline(tiny / "source", settings)
    obs = load_observations(tiny / "observations")[0]
    computed = policy.rollout(pipe, obs, settings)
    [kept] = (tmp_path / "cache" / "conditioning").iterdir()
    calls = _counted_encodes(monkeypatch)
    monkeypatch.setattr(policy, "_CONDITIONED", {})  # as a new process
    again = policy.rollout(policy.load_pipeline(tiny / "source", settings), obs, settings)
    assert not calls and np.array_equal(_bits(again), _bits(computed))
    good, entry = kept.read_bytes(), _entry(kept)
    for damage in (good[:100], b"", good.replace(b'"height"', b'"hEight"')):
        kept.write_bytes(damage)
        monkeypatch.setattr(policy, "_CONDITIONED", {})
        redone = policy.rollout(pipe, obs, settings)
        assert len(calls) == 1 and np.array_equal(_bits(redone), _bits(computed))
        assert _entry(kept) == entry  # encoded again, the entry rewritten whole
        calls.clear()
    assert [p.name for p in kept.parent.iterdir()] == [kept.name]  # no temporary left
    # a link where this process writes its temporary: never followed (the entry is simply not kept)
    outside = tmp_path / "outside.txt"
    outside.write_text("a user's file")
    kept.unlink()
    (kept.parent / f".{kept.name}.{os.getpid()}.tmp").symlink_to(outside)
    monkeypatch.setattr(policy, "_CONDITIONED", {})
    linked = policy.rollout(pipe, obs, settings)
    assert np.array_equal(_bits(linked), _bits(computed)) and outside.read_text() == "a user's file"
    assert not kept.exists()


def test_the_stand_in_clip_serves_its_encode_alone(tiny: Path) -> None:
    pipe = policy.load_pipeline(tiny / "source", PolicySettings())
    with pytest.raises(ReleaseError, match="stood in"):
        pipe._encode_video(torch.empty(1, 3, 33, 64, 320, device="meta"))


def test_one_thread_gives_the_bits_of_the_callers_threads(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    settings = PolicySettings()
    pipe = policy.load_pipeline(tiny / "source", settings)
    observations = load_observations(tiny / "observations")[:2]
    monkeypatch.setattr(policy, "_CONDITIONED", {})
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "one"))  # no conditioning kept by other tests
    before = torch.get_num_threads()
    seen: list[int] = []
    hook = pipe.transformer.register_forward_pre_hook(lambda *_: seen.append(torch.get_num_threads()))
    one = [policy.rollout(pipe, o, settings) for o in observations]
    assert set(seen) == {1} and torch.get_num_threads() == before
    seen.clear()
    monkeypatch.setattr(policy, "ONE_THREAD_BELOW", 0)  # the caller's threads throughout
    monkeypatch.setattr(policy, "_CONDITIONED", {})  # the conditioning computed again, on them
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "callers"))
    callers = [policy.rollout(pipe, o, settings) for o in observations]
    hook.remove()
    assert set(seen) == {before}
    for a, b in zip(one, callers, strict=True):
        assert np.array_equal(_bits(a), _bits(b))


def test_the_fakequant_replay_with_folded_weights_gives_the_bits_of_quantizing_them_on_every_call(
        tiny: Path, rtn_build: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fakequant_transformer folds the fixed weights' fake quantization once (ModelOpt's fold_weight) instead of
    quantizing them on every call: the actions of two observations are bit for bit those without the fold."""
    import modelopt.torch.quantization as mtq

    from release.core.builds import load_build
    from release.quantize.load import fakequant_transformer

    settings = PolicySettings()
    observations = load_observations(tiny / "observations")[:2]
    build = load_build("rtn")

    def actions() -> list[np.ndarray]:
        model = fakequant_transformer(tiny / "source", rtn_build, build)
        pipe = policy.load_pipeline(tiny / "source", settings, transformer=model)
        return [policy.rollout(pipe, o, settings) for o in observations]

    folded = actions()
    calls: list[object] = []
    monkeypatch.setattr(mtq, "fold_weight", lambda model, keep_attrs=False: calls.append(model))
    unfolded = actions()
    assert len(calls) == 1
    for a, b in zip(folded, unfolded, strict=True):
        assert np.array_equal(_bits(a), _bits(b))


def test_the_cpu_encode_is_diffusers_vae_on_other_kernels(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``cpu_encode``: the VAE's float32 CPU encode on oneDNN's 3-D convolution and a summed RMS norm, within float
    rounding of diffusers' own (torch's im2col convolution and ``linalg.vector_norm``), and part of the memo's key."""
    from diffusers import AutoencoderKLWan
    from torch.profiler import ProfilerActivity, profile

    plain = AutoencoderKLWan.from_pretrained(tiny / "source" / "vae").eval()
    fast = AutoencoderKLWan.from_pretrained(tiny / "source" / "vae").eval()
    policy.cpu_encode(fast)
    x = torch.rand(1, 3, 9, 64, 96, generator=torch.Generator().manual_seed(0)) * 2 - 1
    with torch.no_grad():
        want = plain._encode(x)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            got = fast._encode(x)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::mkldnn_convolution" in ops and not ops & {"aten::slow_conv3d_forward", "aten::linalg_vector_norm"}
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    y = torch.rand(1, 12, 5, 16, 16, generator=torch.Generator().manual_seed(1))
    with torch.enable_grad():  # a call that records gradients keeps torch's own kernels
        assert torch.equal(fast.encoder.conv_in(y), plain.encoder.conv_in(y))
    key = policy.load_pipeline(tiny / "source", PolicySettings())._vae_key()
    monkeypatch.setattr(policy, "CPU_ENCODE", "other kernels")
    assert policy.load_pipeline(tiny / "source", PolicySettings())._vae_key() != key  # other kernels, other encodes
