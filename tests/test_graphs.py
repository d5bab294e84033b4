"""CUDA graphs of the decoder stack (``release.inputs.graphs``): on a GPU, rollouts replayed from graphs equal eager
ones bit for bit, for BF16 and for a deployed build's ModelOpt FP8 GEMM; everywhere, what needs no GPU: the
signatures graphs are keyed by, the static buffers, the switch, which models are graphed, and the rollout records."""

from __future__ import annotations

import contextlib
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from release.core.builds import load_release
from release.core.config import NATIVE_STEPS
from release.core.device import compute_device
from release.core.errors import ReleaseError
from release.inputs.graphs import (
    GRAPHS_ENV,
    WARMUP,
    GraphedCalls,
    _buffer,
    _recording,
    capturable,
    enabled,
    graph_decoder_stack,
    signature,
)
from release.inputs.observations import Observation, load_observations
from release.inputs.policy import load_pipeline, map_tensors, rollout
from release.measure.evaluate import HOW, EvalRequest, _rollout_paths, rollouts, select
from tests.conftest import invoke

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device; this machine has none")


def _validation(tiny: Path, n: int) -> list[Observation]:
    """The first ``n`` held-out observations (the tiny fixture's first four have three prompt lengths)."""
    return select(load_observations(tiny / "observations"), load_release(), "validation")[:n]


def _model(path: str, tiny: Path, request: pytest.FixtureRequest, tmp_path: Path) -> torch.nn.Module | None:
    """The transformer ``release eval`` rolls out on ``path`` (None: the BF16 source's). ``fakequant-pc``: the
    per-channel family's replay (per-token input amax on the device), its build made here."""
    from release.core.builds import load_build
    from release.quantize.load import deployed_transformer, fakequant_transformer

    if path == "bf16":
        return None
    if path == "deployed":
        return deployed_transformer(request.getfixturevalue("rtn_build"))
    if path == "fakequant":
        return fakequant_transformer(tiny / "source", request.getfixturevalue("rtn_build"), load_build("rtn"))
    result = invoke("build", "pc_rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", tmp_path)
    assert result.exit_code == 0, result.output
    build = load_build("pc_rtn")
    return fakequant_transformer(tiny / "source", tmp_path / build.repo, build)


@CUDA
@pytest.mark.parametrize("path", ["bf16", "deployed", "fakequant", "fakequant-pc"])
def test_graphed_rollouts_equal_eager_ones(path: str, tiny: Path, request: pytest.FixtureRequest,
                                           tmp_path: Path) -> None:
    """The same pipeline rolled out eager, then with its decoder stack in CUDA graphs: the same action bits and the
    same recorded GEMM shapes; one graph per call signature, replayed for every transformer call. The fake-quant
    replays (per tensor and per token) are marked capturable by their maker, as a deployed build is."""
    if path == "deployed" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("ModelOpt's FP8 GEMM needs an FP8 GPU (compute capability 8.9 or newer)")
    settings = load_release().policy
    model = _model(path, tiny, request, tmp_path)
    pipe = load_pipeline(tiny / "source", settings, transformer=model)
    kwargs = {} if model is None else NATIVE_STEPS  # as release eval rolls out a build
    record = getattr(pipe.transformer, "gemm_record", None)
    observations = _validation(tiny, 4)

    def run() -> tuple[np.ndarray, list[list[tuple[int, int, int]]]]:
        actions, shapes = [], []
        for obs in observations:
            if record is not None:
                record.shapes.clear()
            actions.append(rollout(pipe, obs, settings, **kwargs))
            shapes.append(sorted(record.shapes) if record is not None else [])
        return np.stack(actions), shapes

    eager, eager_shapes = run()
    if model is None:
        capturable(pipe.transformer)  # as release eval marks the source
    calls = graph_decoder_stack(pipe.transformer)
    assert calls is not None
    graphed, graphed_shapes = run()
    differ = int(np.count_nonzero(eager.view(np.uint32) != graphed.view(np.uint32)))
    assert differ == 0, f"{differ} of {eager.size} action elements differ graphed vs eager"
    assert graphed_shapes == eager_shapes and (record is None or all(eager_shapes))
    assert calls.replays == len(observations) * settings.steps * 2  # conditional and unconditional passes
    assert 2 <= len(calls.graphs) <= len(observations)  # the 4th observation's prompt length is the 1st's


def test_rollout_records_say_whether_graphs_ran(tiny: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``release eval``'s rollouts of BF16 record ``graphs``: true on CUDA unless switched off, false on a CPU; the
    actions are the same bits either way."""
    release = load_release()
    request = EvalRequest(release, [], "deployed", "validation", tmp_path / "dist", tiny / "source",
                          tiny / "observations", tmp_path / "cache", False, release.served_steps)
    observations, seeds = _validation(tiny, 1), [release.policy.noise_seed]
    actions = {}
    for switch, label in (("1", "bf16"), ("0", "bf16-eager")):
        monkeypatch.setenv(GRAPHS_ENV, switch)
        actions[switch] = rollouts(request, label, lambda: None, observations, seeds, {})
        how = json.loads(_rollout_paths(request, label, observations, seeds)[0].with_suffix(HOW).read_text())
        assert how["graphs"] is (switch == "1" and compute_device() == "cuda")
    assert actions["1"].tobytes() == actions["0"].tobytes()


def test_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(GRAPHS_ENV, raising=False)
    assert enabled()
    monkeypatch.setenv(GRAPHS_ENV, "0")
    assert not enabled()
    monkeypatch.setenv(GRAPHS_ENV, "off")
    with pytest.raises(ReleaseError, match=f"{GRAPHS_ENV}=off: expected 1 .* or 0"):
        enabled()


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))

    def _run_decoder_stack(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


@pytest.mark.parametrize("marked,switch", [(True, "1"), (False, "1"), (True, "0")])
def test_only_marked_models_on_cuda_are_graphed(marked: bool, switch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(GRAPHS_ENV, switch)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = _Stack().to(device)
    if marked:
        capturable(model)
    calls = graph_decoder_stack(model)
    graphed = marked and switch == "1" and device == "cuda"
    assert (calls is not None) is graphed
    assert ("_run_decoder_stack" in vars(model)) is graphed  # the instance's attribute hides the class's method


def test_signature() -> None:
    """Tensors are keyed by layout and alignment, not values; other values by type and value; the tensors come out
    in the order ``map_tensors`` visits them (which rebuilds the call on the static buffers)."""
    flat = torch.zeros(256)
    flat[64:].fill_(1.0)
    a, b = flat[:24].view(4, 6), flat[128:130]

    def key(*args: Any) -> Any:
        return signature(args, [])

    assert key(a, (b, 3)) == key(flat[64:88].view(4, 6), (flat[192:194], 3))  # 256 bytes on: other values
    variants = [key(a, (b, 3)), key(a.to(torch.bfloat16), (b, 3)), key(torch.zeros(6, 4).t(), (b, 3)),
                key(a, [b, 3]), key(a, (b, 4)), key(a, (b, 3.0)), key(a, (b, True)), key(flat[2:6], b),
                key(flat[4:8], b)]  # the last two: alike but for their addresses' alignment
    assert len(set(variants)) == len(variants)
    tensors: list[torch.Tensor] = []
    args = (a, {"x": b, "y": [flat, None]})
    signature(args, tensors)
    assert [id(t) for t in tensors] == [id(a), id(b), id(flat)]
    feed = iter(tensors)
    rebuilt = map_tensors(args, lambda _: next(feed))
    assert rebuilt[0] is a and rebuilt[1]["x"] is b and rebuilt[1]["y"][0] is flat


def test_buffers_keep_layout_and_alignment() -> None:
    t = torch.arange(60.0).reshape(6, 10)[1:, 3:9]  # strided, at an offset
    buffer = _buffer(t)
    assert torch.equal(buffer, t) and buffer.stride() == t.stride()
    assert buffer.data_ptr() != t.data_ptr() and buffer.data_ptr() % 256 == t.data_ptr() % 256


def test_recording_collects_shapes_apart() -> None:
    record = types.SimpleNamespace(shapes={(1, 2, 3)})
    kept = record.shapes
    with _recording(record) as seen:  # type: ignore[arg-type]
        record.shapes.add((4, 5, 6))
    assert seen == {(4, 5, 6)} and record.shapes is kept and kept == {(1, 2, 3), (4, 5, 6)}


def _simulated_graphs(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """``torch.cuda``'s graph calls stood in for on a CPU: a replay reruns the captured function on the static
    buffers and copies its results into the static outputs, which is what a CUDA graph's replay does. Returns the
    simulation's state: ``captures`` (one item per capture) and ``replaying`` (true while a replay reruns the
    function, whose Python side effects a real replay skips). CPU allocations have no fixed alignment: the key
    ignores it here."""
    import release.inputs.graphs as graphs

    class Stream:
        def wait_stream(self, _stream: Any) -> None:
            pass

    for name, value in {"Stream": Stream, "current_stream": Stream, "stream": lambda _s: contextlib.nullcontext(),
                        "graph_pool_handle": lambda: None, "CUDAGraph": types.SimpleNamespace,
                        "graph": lambda _g, pool=None: contextlib.nullcontext()}.items():
        monkeypatch.setattr(torch.cuda, name, value)
    monkeypatch.setattr(graphs, "ALIGNMENT", 1)
    state = types.SimpleNamespace(captures=[], replaying=False)
    capture = GraphedCalls._capture

    def simulated(self: GraphedCalls, args: tuple[Any, ...], tensors: list[torch.Tensor]) -> Any:
        entry = capture(self, args, tensors)
        feed = iter(entry.inputs)
        static = map_tensors(args, lambda _: next(feed))

        def replay() -> None:
            results: list[torch.Tensor] = []
            state.replaying = True
            map_tensors(self.fn(*static), results.append)
            state.replaying = False
            outputs: list[torch.Tensor] = []
            map_tensors(entry.outputs, outputs.append)
            for output, result in zip(outputs, results, strict=True):
                output.copy_(result)

        entry.graph.replay = replay
        state.captures.append(1)
        return entry

    monkeypatch.setattr(GraphedCalls, "_capture", simulated)
    return state


def test_replays_read_each_call_s_tensors_and_return_clones(monkeypatch: pytest.MonkeyPatch) -> None:
    """One capture per signature (``WARMUP`` eager calls before it); every call's tensors copied into the static
    buffers before its replay; results cloned, so the next replay leaves them alone; the shapes a capture's hooks
    recorded added to the record again at each replay."""
    state = _simulated_graphs(monkeypatch)
    record = types.SimpleNamespace(shapes=set())
    eager_calls: list[int] = []

    def fn(x: torch.Tensor, pair: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        if not state.replaying:
            eager_calls.append(1)
            record.shapes.add((x.numel(), 1, 1))  # as a deployed Linear's forward pre-hook does
        return x * 2, pair[0] + pair[1]

    calls = GraphedCalls(fn, record)  # type: ignore[arg-type]
    x, y = torch.arange(4.0), torch.ones(2)
    with torch.no_grad():
        first = calls(x, (y, y))
        record.shapes.clear()
        second = calls(x + 1, (y, 3 * y))
        assert record.shapes == {(4, 1, 1)} and len(state.captures) == 1
        third = calls(torch.arange(3.0), (y, y))
    assert torch.equal(first[0], x * 2) and torch.equal(first[1], 2 * y)
    assert torch.equal(second[0], (x + 1) * 2) and torch.equal(second[1], 4 * y)
    assert torch.equal(third[0], torch.arange(3.0) * 2)
    assert len(state.captures) == len(calls.graphs) == 2 and calls.replays == 3
    assert len(eager_calls) == 2 * (WARMUP + 1)  # per capture: the warm-up calls and the captured one


def test_calls_that_record_gradients_run_eager() -> None:
    calls = GraphedCalls(lambda x: x * 2)
    x = torch.ones(3, requires_grad=True)
    assert torch.equal(calls(x), x * 2) and calls.graphs == {} and calls.replays == 0
