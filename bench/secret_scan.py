"""Cost of the secret scan of ``release push``, in seconds per GB, next to the hashing it shares a read with.

Usage: .venv/bin/python bench/secret_scan.py [DIR] [GIB]   (default /tmp, 1 GiB per file)
Writes two files of GIB GiB into DIR: random bytes (no token anywhere, so every byte is searched), and a realistic
safetensors shard (FP8 E4M3 weights with per-tensor scales, as the builds export them, and bf16 tensors). Each is
read once before timing, so the figures are CPU cost (page cache), not disk speed. Timed per file: the decoding scan
(ASCII, UTF-16, UTF-32, base64) and the ASCII scan alone over 16 MiB chunks, hashing alone (sha256 + git blob sha1
skipped above 10 MB, as the push does), and both in one read as ``HashCache`` does them (the decoding scan for every
file but a safetensors file's data, which is searched as ASCII); one thread each.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from release.publish.hashing import HashCache
from release.publish.scan import CHUNK, Scanner


def random_file(path: Path, size: int) -> None:
    with path.open("wb") as f:
        for _ in range(size // CHUNK):
            f.write(os.urandom(CHUNK))


def safetensors_file(path: Path, size: int) -> None:
    """Linears of 4096 x 4096 as the export writes them: F8_E4M3 codes of a normal weight, scales; a bf16 third."""
    g = torch.Generator().manual_seed(0)
    tensors: dict[str, torch.Tensor] = {}
    n, total = 0, 0
    while total < size:
        w = torch.randn(4096, 4096, generator=g) * 0.02
        if n % 3 == 2:
            tensors[f"layers.{n}.norm_mlp.weight"] = w.to(torch.bfloat16)
            total += w.numel() * 2
        else:
            scale = w.abs().max() / 448
            tensors[f"layers.{n}.proj.weight"] = (w / scale).to(torch.float8_e4m3fn)
            tensors[f"layers.{n}.proj.weight_scale"] = scale.reshape(())
            total += w.numel()
        n += 1
    save_file(tensors, str(path), metadata={"format": "pt"})


def scan_only(path: Path, decode: bool = True) -> None:
    scanner = Scanner(decode)
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            scanner.feed(chunk)
    assert scanner.found is None, scanner.found


def timed(fn: Callable[[Path], object], path: Path) -> float:
    t = time.perf_counter()
    fn(path)
    return time.perf_counter() - t


def main(folder: Path, gib: float) -> None:
    size = int(gib * (1 << 30)) // CHUNK * CHUNK
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        files = {"random bytes": Path(tmp) / "random.bin",
                 "safetensors shard, FP8 + bf16": Path(tmp) / "shard.safetensors"}
        random_file(files["random bytes"], size)
        safetensors_file(files["safetensors shard, FP8 + bf16"], size)
        print("| file | GB | decoding scan (s/GB) | ASCII scan (s/GB) | hash only (s/GB) | hash + scan as a push "
              "does it, one read (s/GB) |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, path in files.items():
            gb = path.stat().st_size / 1e9
            scan_only(path, decode=False)  # warm the page cache
            decoding = timed(scan_only, path)
            ascii_only = timed(lambda p: scan_only(p, decode=False), path)
            hashing = timed(lambda p: HashCache(Path(tmp) / "none.json")._hash(p, scan=False), path)
            both = timed(lambda p: HashCache(Path(tmp) / "none.json")._hash(p, scan=True), path)
            print(f"| {label} | {gb:.2f} | {decoding / gb:.2f} | {ascii_only / gb:.2f} | {hashing / gb:.2f} | "
                  f"{both / gb:.2f} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("/tmp"), float(sys.argv[2]) if len(sys.argv) > 2 else 1.0)
