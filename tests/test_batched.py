"""Rollouts packed across observations (``release.inputs.batched``): the bits of lone rollouts, one transformer call
per step for the group, a frame not seen before rolled out alone, and a failing rollout that fails the group
without a hang."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from release.core.builds import load_build
from release.core.config import PolicySettings
from release.core.errors import ReleaseError
from release.inputs.batched import pack, roll_out_packed
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.quantize.load import fakequant_transformer


def _bits(actions: list[np.ndarray]) -> list[bytes]:
    return [a.tobytes() for a in actions]


def _counted(pipe: Any, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """From now on, the observations in each call of the transformer's own forward."""
    calls: list[int] = []
    forward = type(pipe.transformer).forward

    def counted(self: Any, **kw: Any) -> Any:
        calls.append(len(kw["vision_tokens"]))
        return forward(self, **kw)

    monkeypatch.setattr(type(pipe.transformer), "forward", counted)
    return calls


@pytest.mark.parametrize("path", ["bf16", "fakequant"])
def test_packed_rollouts_are_the_lone_ones_bit_for_bit(path: str, tiny: Path, rtn_build: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    settings = PolicySettings()
    model = None if path == "bf16" else fakequant_transformer(tiny / "source", rtn_build, load_build("rtn"))
    pipe = load_pipeline(tiny / "source", settings, transformer=model)
    observations = load_observations(tiny / "observations")[:5]
    seeds = [settings.model_copy(update={"noise_seed": k % 2}) for k in range(5)]
    lone = [rollout(pipe, o, s) for o, s in zip(observations, seeds, strict=True)]
    calls = _counted(pipe, monkeypatch)
    threads = torch.get_num_threads()
    packed = roll_out_packed(pipe, list(zip(observations, seeds, strict=True)), rollout)
    assert _bits([a for a, _ in packed]) == _bits(lone)
    assert calls == [5] * 2 * settings.steps  # one call per step and pass, for all five
    assert torch.get_num_threads() == threads and "forward" not in vars(pipe.transformer)
    assert len({id(p) for _, p in packed}) == 5 and all(p.transformer is pipe.transformer for _, p in packed)


def test_a_failing_rollout_fails_the_group_and_the_others_finish(tiny: Path) -> None:
    settings = PolicySettings()
    pipe = load_pipeline(tiny / "source", settings)
    observations = load_observations(tiny / "observations")[:3]
    for obs in observations:  # their frames' conditioning held: packed
        rollout(pipe, obs, settings)
    finished: list[int] = []

    def flaky(p: Any, obs: Any, s: PolicySettings, **kw: Any) -> np.ndarray:
        if obs.obs_id == observations[1].obs_id:
            raise ReleaseError(f"observation {obs.obs_id}: broken")
        out = rollout(p, obs, s, **kw)
        finished.append(obs.obs_id)
        return out

    with pytest.raises(ReleaseError, match="broken"):
        roll_out_packed(pipe, [(o, settings) for o in observations], flaky)
    assert sorted(finished) == sorted(o.obs_id for o in observations if o is not observations[1])
    assert "forward" not in vars(pipe.transformer)


def test_a_failing_packed_call_fails_every_rollout_of_it(tiny: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings = PolicySettings()
    pipe = load_pipeline(tiny / "source", settings)
    observations = load_observations(tiny / "observations")[:2]
    for obs in observations:
        rollout(pipe, obs, settings)

    def broken(self: Any, **_: Any) -> Any:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(type(pipe.transformer), "forward", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        roll_out_packed(pipe, [(o, settings) for o in observations], rollout)


def test_a_call_with_what_packing_does_not_know_is_refused() -> None:
    call = {"und_len": 2, "sequence_length": 4, "return_dict": False, "sound_tokens": [torch.zeros(1)]}
    with pytest.raises(ReleaseError, match="cannot pack a transformer call with sound_tokens"):
        pack([call])


def test_a_frame_not_seen_before_is_rolled_out_alone_with_its_encode(tiny: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    import release.inputs.policy as policy

    settings = PolicySettings()
    pipe = load_pipeline(tiny / "source", settings)
    observations = load_observations(tiny / "observations")[:4]
    want = [rollout(pipe, o, settings) for o in observations]
    monkeypatch.setattr(policy, "_CONDITIONED", {k: v for k, v in policy._CONDITIONED.items()
                                                 if k[1] != policy._clip_digest(observations[0].frame())})
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path))  # nor kept on disk
    assert not policy.conditioned(pipe, observations[0]) and policy.conditioned(pipe, observations[1])
    calls = _counted(pipe, monkeypatch)
    got = roll_out_packed(pipe, [(o, settings) for o in observations], rollout)
    assert _bits([a for a, _ in got]) == _bits(want)
    assert calls == [1] * 2 * settings.steps + [3] * 2 * settings.steps  # the new frame alone, then the others
    assert policy.conditioned(pipe, observations[0])
