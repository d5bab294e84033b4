"""Run the release CLI as on a smaller GPU: ``python bench/gpu_capped.py GIB release-args...`` limits torch's
allocator to GIB GiB of this GPU (``torch.cuda.set_per_process_memory_fraction``) before the tool starts, so that
an allocation past it fails as it would on a card of that size (the CUDA context itself is outside the limit)."""

import sys

import torch

from release.cli import main

if __name__ == "__main__":
    gib = float(sys.argv[1])
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(gib * 2**30 / total)
    print(f"allocator limited to {gib} GiB of {total / 2**30:.1f} GiB", file=sys.stderr)
    sys.argv = ["release", *sys.argv[2:]]
    main()
