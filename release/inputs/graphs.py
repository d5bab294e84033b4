"""CUDA graphs for the policy's decoder stack: each transformer call's kernels launched by one graph replay instead of
one Python call each, the arithmetic unchanged.

At the Nano's size a rollout is bound by the CPU, not the GPU (BENCHMARKS.md, "Rollout latency and memory"): the GPU
is busy for a fraction of each rollout, and a deployed build's FP8 Linears cost ~478 us of CPU per call in ModelOpt's
compiled wrapper. A captured graph replays the kernels that an eager call launched, with the same arguments on the
same weights: the same bits (``tests/test_graphs.py`` checks rollouts against eager ones on a GPU), without the
Python, TorchDynamo guards and launches between them.

What is captured is ``Cosmos3OmniTransformer._run_decoder_stack`` (every decoder layer: the quantized Linears and
the attention), not the whole forward: diffusers' forward checks the action domain ids on the host
(``DomainAwareLinear``: ``if torch.any(...)``), a wait for the device that a capture cannot hold. The embedding and
decoding around the stack stay eager.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import torch

from release.core.errors import ReleaseError
from release.core.memory import is_placed
from release.inputs.policy import map_tensors

GRAPHS_ENV = "RELEASE_CUDA_GRAPHS"
CAPTURABLE = "_release_capturable"  # set by capturable()
WARMUP = 2  # eager calls before a capture: TorchDynamo compiles (ModelOpt's FP8 GEMM), Triton and cuBLAS choose
ALIGNMENT = 256  # bytes: the largest address alignment torch's cuBLASLt calls pass on to the algorithm choice

M = TypeVar("M", bound=torch.nn.Module)


class ShapeRecord(Protocol):
    """What a deployed transformer's forward pre-hooks fill (``release.quantize.load.GemmRecord``): hooks do not run
    in a replay, so the shapes a capture's calls recorded are added again at each replay of it."""

    shapes: set[tuple[int, int, int]]


def enabled() -> bool:
    """``RELEASE_CUDA_GRAPHS``: 1 (the default: CUDA graphs where they apply) or 0 (every call eager)."""
    value = os.environ.get(GRAPHS_ENV, "1")
    if value not in ("0", "1"):
        raise ReleaseError(f"{GRAPHS_ENV}={value}: expected 1 (CUDA graphs where models run on CUDA) or 0 (eager)")
    return value == "1"


def capturable(model: M) -> M:
    """Mark ``model``'s decoder stack as safe to capture once warmed up: no wait for the device and no copy from the
    host in its calls (the BF16 transformer; ModelOpt's FP8 GEMM once its scales are cached; the fake-quant replay,
    its weights folded). Unmarked models (a ``torch.compile`` yardstick, the row-wise FP8 Linear) run eager."""
    setattr(model, CAPTURABLE, True)
    return model


def signature(value: Any, tensors: list[torch.Tensor]) -> Hashable:
    """What a capture depends on in a call's (nested) arguments: each tensor's shape, strides, dtype, device and
    address alignment, and every other value itself (it must be hashable). Appends the tensors to ``tensors``, in
    the order ``map_tensors`` visits them."""
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return (torch.Tensor, tuple(value.shape), value.stride(), value.dtype, value.device,
                value.data_ptr() % ALIGNMENT)
    if isinstance(value, list | tuple):
        return (type(value), tuple(signature(v, tensors) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, signature(v, tensors)) for k, v in value.items()))
    return (type(value), value)


def _buffer(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` with its shape, strides and address alignment (modulo ``ALIGNMENT``): a kernel choice that
    looks at the layout or the address sees what it would see for ``t``."""
    extent = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride(), strict=True)) if t.numel() else 0
    base = torch.empty(extent + ALIGNMENT // t.element_size(), dtype=t.dtype, device=t.device)
    offset = (t.data_ptr() - base.data_ptr()) % ALIGNMENT // t.element_size()
    return base.as_strided(t.shape, t.stride(), offset).copy_(t)


@contextmanager
def _recording(record: ShapeRecord | None) -> Iterator[set[tuple[int, int, int]]]:
    """The shapes ``record``'s hooks add meanwhile, collected apart, then added to it."""
    seen: set[tuple[int, int, int]] = set()
    if record is None:
        yield seen
        return
    kept, record.shapes = record.shapes, seen
    try:
        yield seen
    finally:
        record.shapes = kept
        kept |= seen


@dataclass
class _Graph:
    graph: torch.cuda.CUDAGraph
    inputs: list[torch.Tensor]  # the static buffers each call's tensors are copied into
    outputs: Any  # the static outputs, overwritten by each replay
    shapes: set[tuple[int, int, int]]  # the GEMM shapes the captured calls recorded


class GraphedCalls:
    """``fn`` (positional tensor arguments on CUDA, under ``torch.no_grad``) run as CUDA graphs. The first call of
    each ``signature``: ``WARMUP`` eager calls on a side stream, then one capture into static buffers. Every call:
    its tensors copied into the buffers, a replay, clones of the outputs (the pipeline keeps the conditional pass's
    output while the unconditional pass replays the same graph). ``fn`` must not depend on its arguments aliasing
    each other, nor hand results back through them. All graphs share one memory pool: they replay one at a time,
    on one stream, and each output is cloned before the next replay."""

    def __init__(self, fn: Callable[..., Any], record: ShapeRecord | None = None) -> None:
        self.fn = fn
        self.record = record
        self.graphs: dict[Hashable, _Graph] = {}
        self.replays = 0
        self._pool: Any = None

    def __call__(self, *args: Any) -> Any:
        if torch.is_grad_enabled():  # a replay records nothing for autograd
            return self.fn(*args)
        tensors: list[torch.Tensor] = []
        key = signature(args, tensors)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(args, tensors)
        for buffer, value in zip(entry.inputs, tensors, strict=True):
            buffer.copy_(value)
        entry.graph.replay()
        self.replays += 1
        if self.record is not None:
            self.record.shapes |= entry.shapes
        return map_tensors(entry.outputs, torch.Tensor.clone)

    def _capture(self, args: tuple[Any, ...], tensors: list[torch.Tensor]) -> _Graph:
        inputs = [_buffer(t) for t in tensors]
        feed = iter(inputs)
        static = map_tensors(args, lambda _: next(feed))
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with _recording(self.record) as shapes:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    for _ in range(WARMUP):
                        self.fn(*static)
                torch.cuda.current_stream().wait_stream(side)
                with torch.cuda.graph(graph, pool=self._pool):
                    outputs = self.fn(*static)
        except torch.OutOfMemoryError:
            raise
        except RuntimeError as exc:  # e.g. a wait for the device inside fn, which a capture cannot hold
            raise ReleaseError(f"the CUDA graph capture of the decoder stack failed ({str(exc).splitlines()[0]}); "
                               f"set {GRAPHS_ENV}=0 to run it eagerly") from exc
        return _Graph(graph, inputs, outputs, shapes)


def graph_decoder_stack(transformer: torch.nn.Module) -> GraphedCalls | None:
    """From now on, run ``transformer``'s decoder stack as CUDA graphs where that applies: ``RELEASE_CUDA_GRAPHS``
    is not 0, the model is marked ``capturable`` and resident on CUDA (a model placed under ``--max-gpu-memory``
    copies its offloaded layers in from the host during each forward: it runs eager). Returns the graphed calls
    (their graphs and replays), or None where the stack stays eager."""
    if not enabled() or not getattr(transformer, CAPTURABLE, False) or is_placed(transformer) \
            or next(transformer.parameters()).device.type != "cuda":
        return None
    stack: Callable[..., Any] = transformer._run_decoder_stack  # type: ignore[assignment]
    calls = GraphedCalls(stack, getattr(transformer, "gemm_record", None))
    transformer._run_decoder_stack = calls  # type: ignore[assignment]  # the instance's, before the class's method
    return calls
