"""``--max-gpu-memory``: every stage within a GPU memory cap, on a GPU smaller than the model.

A transformer that does not fit is *placed*: its decoder layers stay on the GPU in order while they fit the cap's
weight budget, the others stay in CPU memory and are copied in for each forward by accelerate's ``AlignDevicesHook``
(the hooks ``dispatch_model`` attaches for a ``device_map`` with CPU offload). The arithmetic is unchanged: every
layer still runs on the GPU, on the same bytes, so a bounded run computes what an unbounded one does. ModelOpt's
calibration, GPTQ and weight access honour these hooks (``enable_weight_access_and_writeback``); the tool's own
weight accesses go through :func:`weights_of`.

On CUDA the cap is also enforced: ``torch.cuda.set_per_process_memory_fraction`` makes the allocator refuse what
lies beyond it, so a stage that would need more fails instead of silently using it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from release.core.device import modelopt_imported
from release.core.errors import ReleaseError

CAP_ENV = "RELEASE_MAX_GPU_MEMORY"
# The part of the cap left to activations, the calibration calls, ModelOpt's statistics and the allocator's slack;
# the rest holds resident weights. At the Nano's size a BF16 rollout needs ~2 GiB above its weights (BENCHMARKS.md).
RESERVE = 0.3
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*")
_CAP: list[int | None] = [None]
PLACEMENT = "_release_placement"
WHOLE = "_release_whole"  # set by keep_whole


def keep_whole(model: torch.nn.Module) -> torch.nn.Module:
    """Mark ``model`` to be placed whole or refused: a deployed FP8 build runs the kernel a server runs on weights
    resident on the GPU (Nano's fits in 16 GiB), and its ModelOpt-restored FP8 Linears are not streamed."""
    setattr(model, WHOLE, True)
    return model


@dataclass(frozen=True)
class Placement:
    """What :func:`place` did to a model: its execution device, its offloaded blocks and their CPU copies."""

    device: str
    offloaded: list[str]
    copies: Any  # accelerate's OffloadedWeightsLoader


def parse_size(text: str, where: str) -> int:
    """``22GiB``, ``24GB``, ``512MiB`` or a number of bytes."""
    m = _SIZE.fullmatch(text)
    if m is None or m.group(2).lower() not in _UNITS or float(m.group(1)) <= 0:
        raise ReleaseError(f"{where}={text!r}: expected a positive size such as 22GiB, 24GB or 512MiB")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def set_cap(option: str | None) -> int | None:
    """The cap of this process: ``--max-gpu-memory`` if given, else ``RELEASE_MAX_GPU_MEMORY``, else none."""
    if option is not None:
        _CAP[0] = parse_size(option, "--max-gpu-memory")
    elif os.environ.get(CAP_ENV):
        _CAP[0] = parse_size(os.environ[CAP_ENV], CAP_ENV)
    else:
        _CAP[0] = None
    if _CAP[0] is not None and torch.cuda.is_available():
        # The current device: under torchrun, release.core.distributed.join (run by the CLI group before any command)
        # has made it the rank's LOCAL_RANK GPU, so each rank caps its own.
        total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, _CAP[0] / total))
    return _CAP[0]


def cap() -> int | None:
    return _CAP[0]


def out_of_memory() -> str:
    """What to do when a stage ran out of GPU memory."""
    if _CAP[0] is None:
        return ("out of GPU memory; pass --max-gpu-memory SIZE (or set RELEASE_MAX_GPU_MEMORY) a little below the "
                "GPU's free memory, and the layers that do not fit are streamed from CPU memory")
    return (f"out of GPU memory within the cap of {_CAP[0] / 2**30:.1f} GiB (--max-gpu-memory or {CAP_ENV}): "
            "this stage needs more beside the resident layers than the cap leaves; raise the cap where the GPU has "
            "room, or free the GPU of other processes")


def _bytes(module: torch.nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in module.state_dict().values())


def _blocks(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The units placed whole: each decoder layer, and every other top-level child."""
    out: list[tuple[str, torch.nn.Module]] = []
    for name, child in model.named_children():
        if isinstance(child, torch.nn.ModuleList):
            out += [(f"{name}.{i}", layer) for i, layer in enumerate(child)]
        else:
            out.append((name, child))
    return out


def plan(model: torch.nn.Module, limit: int) -> dict[str, bool]:
    """Block name -> offloaded. The small top-level parts are resident first (they run on every call), then the
    decoder layers in order while they fit ``(1 - RESERVE) * limit``."""
    budget = int(limit * (1 - RESERVE)) - sum(p.numel() * p.element_size() for p in model.parameters(recurse=False))
    blocks = _blocks(model)
    offloaded: dict[str, bool] = {}
    for name, module in sorted(blocks, key=lambda b: "." in b[0]):  # non-layer parts first, stable otherwise
        size = _bytes(module)
        offloaded[name] = size > budget
        if not offloaded[name]:
            budget -= size
    return {name: offloaded[name] for name, _ in blocks}


def place(model: torch.nn.Module, device: str) -> torch.nn.Module:
    """``model`` on ``device``, within the cap: what does not fit stays in CPU memory and is streamed in for each
    forward. Without a cap, or when the whole model fits, this is ``model.to(device)``."""
    from accelerate.hooks import attach_align_device_hook_on_blocks
    from accelerate.utils import OffloadedWeightsLoader

    limit = cap()
    if limit is not None and getattr(model, WHOLE, False) and _bytes(model) > limit:
        raise ReleaseError(f"the FP8 build's transformer needs {_bytes(model) / 2**30:.2f} GiB of GPU memory, more "
                           f"than the cap of {limit / 2**30:.2f} GiB (--max-gpu-memory or {CAP_ENV}); the deployed "
                           "path runs it whole, as a server does: raise the cap")
    if limit is None or getattr(model, WHOLE, False) or _bytes(model) <= limit * (1 - RESERVE):
        return model.to(device)
    offload = plan(model, limit)
    pin = device == "cuda"  # page-locked copies: the streaming runs at the link's speed, not a staging copy's
    state = {f"{name}.{k}": v.detach().cpu().pin_memory() if pin else v.detach().cpu()
             for name, m in _blocks(model) if offload[name] for k, v in m.state_dict().items()}
    execution = {name: torch.device(device) for name in offload}
    execution[""] = torch.device(device)
    copies = OffloadedWeightsLoader(state_dict=state)
    attach_align_device_hook_on_blocks(model, execution_device=execution, offload=offload, weights_map=copies)
    setattr(model, PLACEMENT, Placement(device, sorted(n for n, off in offload.items() if off), copies))
    return model


@contextmanager
def placed(model: torch.nn.Module, device: str) -> Iterator[torch.nn.Module]:
    """``model``, held in CPU memory, placed on ``device`` within the cap for the duration, then whole in CPU memory
    again."""
    place(model, device)
    try:
        yield model
    finally:
        unplace(model)


def unplace(model: torch.nn.Module) -> None:
    """A placed ``model`` whole in CPU memory, its hooks removed: its offloaded tensors restored from their copies,
    its resident ones moved back (the GPU memory they held is free again)."""
    from accelerate.hooks import remove_hook_from_module
    from accelerate.utils import set_module_tensor_to_device

    full = state_dict(model)
    remove_hook_from_module(model, recurse=True)
    for key, value in full.items():
        set_module_tensor_to_device(model, key, "cpu", value=value)
    delattr(model, PLACEMENT)


def is_placed(model: torch.nn.Module) -> bool:
    return hasattr(model, PLACEMENT)


def execution_device(model: torch.nn.Module) -> str:
    """Where ``model`` computes: ``cpu`` or ``cuda`` (an offloaded parameter sits on ``meta``)."""
    placement: Placement | None = getattr(model, PLACEMENT, None)
    return placement.device if placement else next(model.parameters()).device.type


@contextmanager
def weights_of(name: str, model: torch.nn.Module, writeback: bool = False) -> Iterator[None]:
    """The weights of the placed block holding module ``name`` materialised on the execution device, for code
    outside a forward; with ``writeback``, changed weights are written back to the offloaded copy (ModelOpt's context
    for accelerate's hooks). Without a placement, nothing to do."""
    modelopt_imported()
    from modelopt.torch.quantization.utils import enable_weight_access_and_writeback

    if not is_placed(model):
        yield
        return
    block = next(b for b, _ in _blocks(model) if name == b or name.startswith(b + "."))
    with enable_weight_access_and_writeback(model.get_submodule(block), model, writeback=writeback):
        yield


def state_dict(model: torch.nn.Module) -> dict[str, Any]:
    """``model.state_dict()`` with offloaded tensors read from their CPU copies instead of the meta placeholders
    (ModelOpt's writeback keeps those copies current)."""
    state = model.state_dict()
    placement: Placement | None = getattr(model, PLACEMENT, None)
    if placement is None:
        return state
    return {k: placement.copies[k] if v.device.type == "meta" else v for k, v in state.items()}


def resident_bytes(model: torch.nn.Module) -> int:
    """The bytes of a loaded model's parameters and buffers (each tensor once; tied ones are one): its weight memory
    as loaded, counted by shape and dtype so that the figure is the same wherever the layers are placed (a capped
    GPU's offloaded layers, a CPU) and for tensor subclasses (TorchAO's FP8 tensors)."""
    tensors = [*(p for _, p in model.named_parameters()), *(b for _, b in model.named_buffers())]
    return sum(t.numel() * t.element_size() for t in tensors)
