"""What a card says about the deployed path, from the data alone: the kernels that ran its rows (tables.json's
"computed", recorded by ``release eval``), and the emulation's bound: the GEMM shapes it ran, sorted by the GPU
conformance table shipped with the tool (``release.core.conformance``), how it quantized the inputs, and what it does
not reproduce of a GPU deployment."""

from __future__ import annotations

from typing import Any

from release.core.conformance import EMULATION, Shape, conformance
from release.publish.card.i18n import _
from release.publish.card.labels import (
    KERNELS,
    PATH_HOW,
    PER_CHANNEL,
    PER_TENSOR,
    computations,
    device_word,
    scheme_of,
)

LISTED = 12  # shapes named in a sentence; the rest are counted


def kernels(records: list[dict[str, Any]], t: Any, versions: bool = False) -> str:
    """The kernels that computed the deployed ``records``, each with its device (and torch and CUDA versions)."""
    out = []
    for c in computations(records):
        text = t(KERNELS[c["kernel"]]).format(device=device_word(c["device"], t))
        if versions:
            text += f" (torch {c['torch']}" + (f", CUDA {c['cuda']})" if c.get("cuda") else ")")
        out.append(text)
    return "; ".join(out)


def _shapes(shapes: list[Shape], t: Any) -> str:
    named = ", ".join(f"{m:,} x {n:,} x {k:,}" for m, n, k in shapes[:LISTED])
    rest = len(shapes) - LISTED
    return named if rest <= 0 else named + " " + t(_("and {n} more")).format(n=rest)


# How the emulation quantized each FP8 Linear's input, by scheme (release.core.fp8: ``per_tensor_forward``,
# ``rowwise_forward``), and what a GPU's kernel does differently there.
EMULATED_INPUTS = {
    PER_TENSOR: _("Each input was quantized as x times fp32(1 / s), the reciprocal of its scale that ModelOpt's "
                  "compiled quantizer uses for most scales; on a GPU that quantizer's Triton reciprocal differs from "
                  "it for some scales, and there some inputs get other FP8 codes."),
    PER_CHANNEL: _("Each input was quantized per token by an IEEE division, as the row-wise GEMM does it on a GPU."),
}


def bound(records: list[dict[str, Any]], t: Any) -> str | None:
    """What the emulation that ran the deployed ``records`` covers, as sentences: the FP8 GEMM alone (how many of
    the GEMM shapes it ran the conformance table holds, bit-exact there; those where it differs; the rest not
    verified on a GPU), how it quantized the inputs (by the records' schemes), where the other layers ran, and that
    such rows estimate FP8's error rather than measure a GPU deployment. None when no deployed row ran it."""
    emulated = [c for c in computations(records) if c["kernel"] == EMULATION]
    if not emulated:
        return None
    table = conformance()
    shapes = {(int(m), int(n), int(k)) for c in emulated for m, n, k in c["gemm_shapes"]}
    exact, differ, unverified = table.sort(shapes)
    text = _("The conformance table checks the emulation's FP8 GEMM alone: {exact} of the {n} GEMM shapes (tokens x "
             "out x in) it ran are in the table recorded on {device} (torch {torch}, CUDA {cuda}), bit-exact to the "
             "eager kernel there.")
    parts = [t(text).format(
        exact=len(exact), n=len(exact) + len(differ) + len(unverified), device=device_word(table.device, t),
        torch=table.torch, cuda=table.cuda)]
    if differ:
        parts.append(t(_("Its outputs differ from the kernel there at {shapes}.")).format(shapes=_shapes(differ, t)))
    if unverified:
        parts.append(t(_("Not verified on a GPU: {shapes}.")).format(shapes=_shapes(unverified, t)))
    schemes = {scheme_of(r) for r in records if r["path"] == "deployed" and r["computed"]["kernel"] == EMULATION}
    parts += [t(EMULATED_INPUTS[s]) for s in sorted(schemes)]
    devices = ", ".join(dict.fromkeys(device_word(c["device"], t) for c in emulated))
    parts.append(t(_("Attention, norms and the other BF16 layers ran on {device}; so these rows estimate the error of "
                     "FP8 rather than measure a deployment on a GPU.")).format(device=devices))
    return " ".join(parts)


def deployed_how(records: list[dict[str, Any]], t: Any) -> str:
    """The paths table's "how" of the deployed path: the kernels with their versions, then the emulation's bound."""
    how = t(PATH_HOW["deployed"]).format(kernels=kernels(records, t, versions=True))
    limit = bound(records, t)
    return how if limit is None else f"{how}. {limit}"


def checked_gpus(records: list[dict[str, Any]], t: Any) -> str:
    """The GPUs this build's FP8 arithmetic was checked on: the conformance table's, where the emulation was held to
    the kernel, and each GPU that ran a deployed or served row of ``records``."""
    ran = [(r.get("computed") or {}).get("device") for r in records if r["path"] in ("deployed", "served")]
    gpus = [conformance().device, *sorted({str(d) for d in ran if d not in (None, "cpu")})]
    return ", ".join(dict.fromkeys(device_word(d, t) for d in gpus))
