"""Layout check (safetensors headers only) vs loading every tensor, on a checkpoint of the full Nano size.

Usage: .venv/bin/python bench/layout_check.py DIR
Writes DIR/transformer (once): the Cosmos3-Nano transformer in NVIDIA's FP8 layout (504 F8_E4M3 Linears with their
scales, the rest BF16, 5 GB shards), filled with random bytes; then times ``check_layout`` of the folder against
itself and ``safetensors.torch.load_file`` of every shard, each after dropping the page cache where allowed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

SHARD_BYTES = 5 * 1024**3


def _drop_caches() -> str:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "cold (page cache dropped)"
    except OSError:
        return "warm (page cache could not be dropped)"


def write_nano(folder: Path) -> None:
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer
    from safetensors.torch import save_file

    from release.core.config import NANO_QUANTIZED
    from release.quantize.export import TRANSFORMER_INDEX

    with init_empty_weights():
        model = Cosmos3OmniTransformer(action_gen=True, action_dim=64)
    import fnmatch

    quantized = {n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)
                 and any(fnmatch.fnmatchcase(n, p) for p in NANO_QUANTIZED)}
    specs: list[tuple[str, torch.dtype, tuple[int, ...]]] = []
    for name, t in model.state_dict().items():
        linear = name.removesuffix(".weight")
        if linear in quantized:
            specs.append((name, torch.float8_e4m3fn, tuple(t.shape)))
            specs += [(f"{linear}.{s}", torch.float32, ()) for s in ("weight_scale", "input_scale")]
            specs += [(f"{linear}.{s}", torch.bfloat16, ()) for s in ("weight_quantizer._amax",
                                                                        "weight_quantizer._scale",
                                                                        "input_quantizer._amax")]
        else:
            specs.append((name, torch.float32 if name.startswith("time_embedder") else torch.bfloat16,
                          tuple(t.shape)))
    pool = torch.from_numpy(np.random.default_rng(0).integers(0, 120, size=64 * 1024**2, dtype=np.uint8))
    tdir = folder / "transformer"
    tdir.mkdir(parents=True, exist_ok=True)
    shards: list[list[tuple[str, torch.dtype, tuple[int, ...]]]] = [[]]
    size = 0
    for spec in specs:
        nbytes = int(np.prod(spec[2] or (1,))) * torch.tensor([], dtype=spec[1]).element_size()
        if size + nbytes > SHARD_BYTES and shards[-1]:
            shards.append([])
            size = 0
        shards[-1].append(spec)
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, start=1):
        fname = f"diffusion_pytorch_model-{i:05d}-of-{len(shards):05d}.safetensors"
        tensors = {}
        for name, dtype, shape in shard:
            n = int(np.prod(shape or (1,))) * torch.tensor([], dtype=dtype).element_size()
            raw = pool.repeat(n // pool.numel() + 1)[:n] if n > pool.numel() else pool[:n]
            tensors[name] = raw.clone().view(dtype).reshape(shape)
            weight_map[name] = fname
        save_file(tensors, str(tdir / fname), metadata={"format": "pt"})
        print(f"wrote {fname}", flush=True)
    (tdir / TRANSFORMER_INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def main(folder: Path) -> None:
    from safetensors.torch import load_file

    from release.check.layout import check_layout

    if not (folder / "transformer").is_dir():
        write_nano(folder)
    shards = sorted((folder / "transformer").glob("*.safetensors"))
    total = sum(p.stat().st_size for p in shards)
    print(f"{len(shards)} shards, {total / 1e9:.1f} GB")
    state = _drop_caches()
    t = time.perf_counter()
    check = check_layout(folder, folder)
    header_s = time.perf_counter() - t
    print(f"layout check (headers, both sides) [{state}]: {header_s:.3f} s -- {check.summary}")
    state = _drop_caches()
    t = time.perf_counter()
    n = 0
    for p in shards:
        n += len(load_file(p))
    load_s = time.perf_counter() - t
    print(f"load_file of every shard [{state}]: {load_s:.1f} s for {n} tensors ({total / load_s / 1e9:.2f} GB/s)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    main(Path(sys.argv[1]))
