"""What a card says about the deployed path, from the data alone: the kernels that ran its rows (tables.json's
"computed", recorded by ``release eval``), and the emulation's bound: the GEMM shapes it ran, sorted by the GPU
conformance table shipped with the tool (``release.core.conformance``)."""

from __future__ import annotations

from typing import Any

from release.core.conformance import EMULATION, Shape, conformance
from release.publish.card.i18n import _
from release.publish.card.labels import KERNELS, PATH_HOW, computations, device_word

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


def bound(records: list[dict[str, Any]], t: Any) -> str | None:
    """How many of the GEMM shapes the emulation ran (in the deployed ``records``) the conformance table covers,
    bit-exact there; the ones where it differs, and the rest as not verified on a GPU. None when no deployed row
    ran the emulation."""
    emulated = [c for c in computations(records) if c["kernel"] == EMULATION]
    if not emulated:
        return None
    table = conformance()
    shapes = {(int(m), int(n), int(k)) for c in emulated for m, n, k in c["gemm_shapes"]}
    exact, differ, unverified = table.sort(shapes)
    text = _("{exact} of the {n} GEMM shapes (tokens x out x in) that the emulation ran are in the conformance table "
             "recorded on {device} (torch {torch}, CUDA {cuda}), bit-exact to the eager kernel there")
    parts = [t(text).format(
        exact=len(exact), n=len(exact) + len(differ) + len(unverified), device=device_word(table.device, t),
        torch=table.torch, cuda=table.cuda)]
    if differ:
        parts.append(t(_("outputs differ from the kernel there at {shapes}")).format(shapes=_shapes(differ, t)))
    if unverified:
        parts.append(t(_("not verified on a GPU: {shapes}")).format(shapes=_shapes(unverified, t)))
    return "; ".join(parts) + "."


def deployed_how(records: list[dict[str, Any]], t: Any) -> str:
    """The paths table's "how" of the deployed path: the kernels with their versions, then the emulation's bound."""
    how = t(PATH_HOW["deployed"]).format(kernels=kernels(records, t, versions=True))
    limit = bound(records, t)
    return how if limit is None else f"{how}. {limit}"
