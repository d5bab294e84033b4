"""The FP8 GEMM conformance table shipped with the tool (``fp8_conformance.json``, made on a GPU by
``bench/fp8_conformance.py``; ``BENCHMARKS.md``): the GEMM shapes (M tokens, N out, K in) at which the emulation of
``release eval --path deployed`` (``release.core.fp8``) was compared with the kernel, the machine and library
versions, and how many fp32 outputs differed. A card sorts the shapes a deployed evaluation ran by it."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("fp8_conformance.json")
# The kernels a deployed transformer's FP8 Linears run (release.quantize.load), as release eval records them: ModelOpt's
# compiled FP8 GEMM, an eager torch._scaled_mm (the per-channel family's row-wise GEMM), or the emulation; and the
# served path's (release.quantize.served): TorchAO's static FP8 tensor, as NVIDIA's policy server runs it.
MODELOPT, SCALED_MM, EMULATION = "modelopt-fp8-gemm", "torch-scaled-mm", "emulation"
TORCHAO = "torchao-float8-static"
TORCHAO_EMULATED = "torchao-float8-static-emulation"  # the served path on a CPU: TorchAO's GPU arithmetic emulated
SERVED_KERNELS = (TORCHAO, TORCHAO_EMULATED)
POLICY_SERVER = "policy-server"  # results imported from a server (release import-served): its kernel, not recorded
Shape = tuple[int, int, int]


@dataclass(frozen=True)
class Conformance:
    device: str
    torch: str
    cuda: str
    differ: dict[Shape, int]  # differing fp32 outputs, emulation vs kernel, at each shape compared

    def sort(self, shapes: Iterable[Shape]) -> tuple[list[Shape], list[Shape], list[Shape]]:
        """``shapes`` as three sorted lists: bit-exact on the GPU, differing there, and not verified on a GPU."""
        exact: list[Shape] = []
        differ: list[Shape] = []
        unverified: list[Shape] = []
        for shape in sorted(set(shapes)):
            count = self.differ.get(shape)
            (unverified if count is None else exact if count == 0 else differ).append(shape)
        return exact, differ, unverified


@functools.cache
def conformance() -> Conformance:
    doc = json.loads(TABLE.read_text(encoding="utf-8"))
    return Conformance(str(doc["device"]), str(doc["torch"]), str(doc["cuda"]),
                       {(int(r["m"]), int(r["n"]), int(r["k"])): int(r["fp32_differ"]) for r in doc["shapes"]})
