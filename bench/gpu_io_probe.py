"""What the bytes of a Nano build cost on this machine, each alone: page-locked allocation, device-to-host copies
(pageable, page-locked), sha256 (one thread, several), a safetensors shard written and read back (to the CPU, to the
GPU), and the source transformer's shards read to the CPU and to the GPU. The figures that decide how an export and a
verification move their 16 GB (BENCHMARKS.md). Usage: python3 bench/gpu_io_probe.py SOURCE_TRANSFORMER_DIR WORK_DIR
"""

from __future__ import annotations

import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

GIB = 2**30


def timed(what: str, nbytes: int, fn):  # type: ignore[no-untyped-def]
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = fn()
    torch.cuda.synchronize()
    s = time.perf_counter() - start
    print(f"| {what} | {nbytes / GIB:.2f} GiB | {s:.3f} s | {nbytes / s / 1e9:.2f} GB/s |", flush=True)
    return out


def copies(work: Path) -> None:
    """The copies, hashes and a shard's write and reads (its buffers freed on return)."""
    n = 5 * GIB
    gpu = torch.randint(0, 255, (n,), dtype=torch.uint8, device="cuda")
    timed("torch.empty(pin_memory=True)", n, lambda: torch.empty(n, dtype=torch.uint8, pin_memory=True))
    pinned = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    timed("D2H to pageable (.to('cpu'))", n, lambda: gpu.to("cpu"))
    timed("D2H into page-locked (copy_, non_blocking)", n, lambda: pinned.copy_(gpu, non_blocking=True))
    timed("D2H .to('cpu', non_blocking=True), first", n, lambda: gpu.to("cpu", non_blocking=True))
    timed("D2H .to('cpu', non_blocking=True), again", n, lambda: gpu.to("cpu", non_blocking=True))
    timed("H2D from page-locked", n, lambda: gpu.copy_(pinned, non_blocking=True))
    pageable = pinned.clone()
    timed("H2D from pageable", n, lambda: gpu.copy_(pageable))
    view = pinned.numpy()
    timed("sha256, one thread", GIB, lambda: hashlib.sha256(view[:GIB]).hexdigest())
    with ThreadPoolExecutor(8) as pool:
        timed("sha256, 8 threads (8 x 1 GiB)", 8 * GIB // 2,
              lambda: list(pool.map(lambda i: hashlib.sha256(view[i * GIB // 2:(i + 1) * GIB // 2]).hexdigest(),
                                    range(8))))
    shard = work / "probe.safetensors"
    timed("save_file 5 GiB from page-locked (no fsync)", n, lambda: save_file({"x": pinned}, str(shard)))
    timed("load_file to the CPU (page cache)", n, lambda: load_file(str(shard)))
    timed("load_file to cuda (page cache)", n, lambda: load_file(str(shard), device="cuda"))
    shard.unlink()


def reads(source: Path) -> None:
    files = sorted(source.glob("*.safetensors"))
    total = sum(f.stat().st_size for f in files)

    def read(device: str) -> int:
        count = 0
        for f in files:
            with safe_open(str(f), framework="pt", device=device) as h:
                for k in h.keys():
                    count += h.get_tensor(k).numel()
        return count

    timed("source transformer: safe_open to the CPU (page cache)", total, lambda: read("cpu"))
    timed("source transformer: safe_open to cuda (page cache)", total, lambda: read("cuda"))


if __name__ == "__main__":
    Path(sys.argv[2]).mkdir(parents=True, exist_ok=True)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}\n")
    print("| what | bytes | seconds | rate |\n|---|---:|---:|---:|")
    copies(Path(sys.argv[2]))
    reads(Path(sys.argv[1]))
