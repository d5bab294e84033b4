"""Several observations' rollouts with their transformer calls packed into one (the tiny model on a CPU).

diffusers' Cosmos3 pipeline runs one sample per call, and its transformer one packed sequence: a causal text prefix
(``und_len``), then the generation tokens, whose attention spans the whole sequence. :func:`roll_out_packed` runs one
pipeline per observation, each in a thread of its own, and :class:`_Lockstep` stands in for the transformer's
forward: when every running rollout has made its next call, the calls are packed into one sequence (the text
prefixes first, then the generation tokens, every index and position remapped) and run once, with diffusers' own
attention function called once per observation on that observation's tokens (:func:`attention_per_observation`),
so each observation's attention is its unbatched one and only the Linears, norms and MLPs see all of them at once.

On a CPU every output is bit-equal to the observation's lone call (``bench/batched_calls.py``;
``tests/test_batched.py`` asserts it for the rollouts): the tiny model's calls are mostly per-operation overhead,
which packing pays once per step instead of once per observation. On a GPU cuBLAS chooses its kernels by the
number of rows, and packed bits differ, so rollouts there stay one observation per call (``release.measure.evaluate``
packs only on the CPU).
"""

from __future__ import annotations

import contextlib
import copy
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from release.core.errors import ReleaseError
from release.inputs.policy import CALLER, JointPositionPolicyPipeline, torch_threads

PER_ITEM = ("vision_tokens", "vision_token_shapes", "vision_noisy_frame_indexes", "action_tokens",
            "action_token_shapes", "action_noisy_frame_indexes", "action_domain_ids")
PER_TOKEN = ("vision_timesteps", "action_timesteps")
INDEXES = ("text_indexes", "vision_sequence_indexes", "vision_mse_loss_indexes", "action_sequence_indexes",
           "action_mse_loss_indexes")
SHARED = ("und_len", "sequence_length", "position_ids", "input_ids", "return_dict")
PACKED = frozenset(PER_ITEM + PER_TOKEN + INDEXES + SHARED)


def pack(calls: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[tuple[int, int]]]:
    """One transformer call for several observations' calls, ``[und_1 .. und_N, gen_1 .. gen_N]``, and the (text,
    generation) lengths of each observation (the attention's segments)."""
    for call in calls:
        if extra := sorted(k for k, v in call.items() if v is not None and k not in PACKED):
            raise ReleaseError(f"internal: cannot pack a transformer call with {', '.join(extra)}")
        if call.get("return_dict", True):
            raise ReleaseError("internal: cannot pack a transformer call that asks for its output as a dict")
    segments = [(c["und_len"], c["sequence_length"] - c["und_len"]) for c in calls]
    und_total = sum(u for u, _ in segments)
    out: dict[str, Any] = {k: v for k, v in calls[0].items() if v is None or k == "return_dict"}
    out.update(und_len=und_total, sequence_length=sum(u + g for u, g in segments))
    first = calls[0]["position_ids"]
    positions = torch.empty(first.shape[0], out["sequence_length"], dtype=first.dtype, device=first.device)
    remapped: dict[str, list[torch.Tensor]] = {k: [] for k in INDEXES}
    und_off, gen_off = 0, und_total
    for call, (und, gen) in zip(calls, segments, strict=True):
        def remap(idx: torch.Tensor, und: int = und, und_off: int = und_off, gen_off: int = gen_off) -> torch.Tensor:
            return torch.where(idx < und, und_off + idx, gen_off + idx - und)

        positions[:, remap(torch.arange(und + gen, device=positions.device))] = call["position_ids"]
        for k in INDEXES:
            remapped[k].append(remap(call[k]))
        und_off, gen_off = und_off + und, gen_off + gen
    out["position_ids"] = positions
    out.update({k: torch.cat(v) for k, v in remapped.items()})
    out["input_ids"] = torch.cat([c["input_ids"] for c in calls])
    out.update({k: torch.cat([c[k] for c in calls]) for k in PER_TOKEN})
    out.update({k: [item for c in calls for item in c[k]] for k in PER_ITEM})
    return out, segments


@contextlib.contextmanager
def attention_per_observation(segments: list[tuple[int, int]]) -> Iterator[None]:
    """diffusers' Cosmos3 attention processor unchanged, its attention function called once per observation: the
    causal text pass on each text prefix, the full pass of each observation's generation tokens over its own text
    and generation keys."""
    import diffusers.models.transformers.transformer_cosmos3 as cosmos3

    original = cosmos3.dispatch_attention_fn
    und_total = sum(u for u, _ in segments)

    def split(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, is_causal: bool, **kw: Any) -> torch.Tensor:
        outs, u0, g0 = [], 0, 0
        for und, gen in segments:
            if is_causal:
                sl = slice(u0, u0 + und)
                outs.append(original(q[:, sl], k[:, sl], v[:, sl], is_causal=True, **kw))
            else:
                keys = torch.cat([torch.arange(u0, u0 + und, device=k.device),
                                  torch.arange(und_total + g0, und_total + g0 + gen, device=k.device)])
                outs.append(original(q[:, g0:g0 + gen], k[:, keys], v[:, keys], is_causal=False, **kw))
            u0, g0 = u0 + und, g0 + gen
        return torch.cat(outs, dim=1)

    cosmos3.dispatch_attention_fn = split
    try:
        yield
    finally:
        cosmos3.dispatch_attention_fn = original


class _Lockstep:
    """The transformer's forward for ``n`` rollouts in threads: each call waits until every rollout still running
    has made its next one, then the last to arrive runs them packed (in the rollouts' order) and hands each its
    outputs. A rollout that ends (or fails) leaves the group, so the others do not wait for it."""

    def __init__(self, forward: Callable[..., Any], n: int) -> None:
        self.forward, self.active = forward, n
        self.pending: dict[int, dict[str, Any]] = {}
        self.done: dict[int, Any] = {}
        self.cond = threading.Condition()
        self.slot = threading.local()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if args:
            raise ReleaseError("internal: the transformer was called with positional arguments; cannot pack it")
        me = self.slot.index
        with self.cond:
            self.pending[me] = kwargs
            self._run_if_complete()
            while me not in self.done:
                self.cond.wait()
            out = self.done.pop(me)
        if isinstance(out, BaseException):
            raise out
        return out

    def leave(self) -> None:
        with self.cond:
            self.active -= 1
            self._run_if_complete()

    def _run_if_complete(self) -> None:
        if not self.pending or len(self.pending) < self.active:
            return
        order = sorted(self.pending)
        calls = [self.pending.pop(i) for i in order]
        try:
            call, segments = pack(calls)
            with attention_per_observation(segments):
                vision, sound, action = self.forward(**call)
            outs: list[Any] = [([vision[k]], sound, [action[k]]) for k in range(len(order))]
        except Exception as exc:  # every waiting rollout fails with it
            outs = [exc] * len(order)
        self.done.update(zip(order, outs, strict=True))
        self.cond.notify_all()


def _own(pipe: JointPositionPolicyPipeline) -> JointPositionPolicyPipeline:
    """A shallow copy of the pipeline for one rollout: its own scheduler and frame processor (its state of a call),
    the models shared."""
    mine = copy.copy(pipe)
    mine.scheduler = copy.deepcopy(pipe.scheduler)
    mine.video_processor = copy.copy(pipe.video_processor)
    return mine


def roll_out_packed(pipe: JointPositionPolicyPipeline, jobs: Sequence[tuple[Any, Any]],
                    rollout: Callable[..., np.ndarray], **pipe_kwargs: Any
                    ) -> list[tuple[np.ndarray, JointPositionPolicyPipeline]]:
    """``rollout(pipe, observation, settings, **pipe_kwargs)`` for every (observation, settings) of ``jobs``, their
    transformer calls packed into one per step, on one thread of torch's (the tiny model's calls are too small to
    split); the conditioning of a frame not seen before (its VAE encode) runs in the calling thread, on its torch
    threads, as a lone rollout runs it. Each rollout has a shallow
    copy of the pipeline with its own scheduler and frame processor (the transformer and the VAE are shared); each
    result is the actions with the copy that made them (what its call recorded, e.g. the steps it ran)."""
    from release.inputs.policy import conditioned

    results: list[tuple[np.ndarray, JointPositionPolicyPipeline] | BaseException | None] = [None] * len(jobs)
    packed = []
    for index, (obs, settings) in enumerate(jobs):  # a frame not seen before: rolled out alone, with its encode
        if conditioned(pipe, obs):
            packed.append(index)
        else:
            mine = _own(pipe)
            results[index] = (rollout(mine, obs, settings, **pipe_kwargs), mine)
    if len(packed) < 2:
        for index in packed:
            obs, settings = jobs[index]
            mine = _own(pipe)
            results[index] = (rollout(mine, obs, settings, **pipe_kwargs), mine)
        return [r for r in results if isinstance(r, tuple)]
    transformer = pipe.transformer
    replaced = vars(transformer).get("forward")  # a memory cap's streaming forward, kept inside the gate
    pipe.probed()  # before the copies: they share what it remembers
    gate = _Lockstep(transformer.forward, len(packed))
    caller = torch.get_num_threads()
    work: queue.Queue[tuple[Callable[[], Any], Future[Any]]] = queue.Queue()

    def on_caller(fn: Callable[[], Any]) -> Any:
        box: Future[Any] = Future()
        work.put((fn, box))
        return box.result()

    def run(slot: int, index: int, obs: Any, settings: Any) -> None:
        gate.slot.index = slot
        CALLER.run = on_caller
        try:
            mine = _own(pipe)
            results[index] = (rollout(mine, obs, settings, threads=caller, **pipe_kwargs), mine)
        except BaseException as exc:  # re-raised in the caller's thread
            results[index] = exc
        finally:
            gate.leave()

    transformer.forward = gate
    try:
        with torch_threads(1):
            threads = [threading.Thread(target=run, args=(slot, i, *jobs[i]), daemon=True)
                       for slot, i in enumerate(packed)]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):  # this thread runs what the rollouts hand it
                try:
                    fn, box = work.get(timeout=0.005)
                except queue.Empty:
                    continue
                try:
                    with torch_threads(caller):
                        box.set_result(fn())
                except BaseException as exc:
                    box.set_exception(exc)
    finally:
        if replaced is None:
            del transformer.forward
        else:
            transformer.forward = replaced
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return [r for r in results if isinstance(r, tuple)]
