"""The results files that ``release tables`` reads (``<repo>/results/<path>-<split>.npz`` and the yardsticks), as
``release eval`` and ``release import-served`` write them: the arrays, how the candidate was computed, the labs, and
the rollout speed beside them, each checked on read so that a damaged file is one line naming it and the array or
field at fault, never an internal error or NaN figures later in ``release card``."""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from release.core.errors import ReleaseError
from release.core.io import parse_json, read_json
from release.measure.layout import PERF
from release.measure.stats import PerObservation, per_observation

UNREADABLE = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError)  # what numpy raises on damaged files


def _reason(exc: BaseException) -> str:
    return next(iter(str(exc).splitlines()), "") or type(exc).__name__


def read_arrays(file: Path, names: tuple[str, ...], fix: str) -> dict[str, np.ndarray]:
    """The arrays ``names`` that the npz ``file`` holds (one it lacks is left out), read now and never through a
    pickle: an archive that does not open, or an array that cannot be read (damaged, or Python objects, which only a
    pickle could load), is a one-line error naming the file and the array, then ``fix``."""
    try:
        data = np.load(file, allow_pickle=False)
    except UNREADABLE as exc:
        raise ReleaseError(f"{file}: not a readable results file ({_reason(exc)}); {fix}") from exc
    if not isinstance(data, np.lib.npyio.NpzFile):
        raise ReleaseError(f"{file}: not a readable results file (a single .npy array, not an .npz archive of named "
                           f"arrays); {fix}")
    out = {}
    with data:
        for name in names:
            if name in data.files:
                try:
                    out[name] = data[name]
                except UNREADABLE as exc:  # "Object arrays cannot be loaded when allow_pickle=False", a bad CRC
                    raise ReleaseError(f"{file}: array '{name}' is not readable ({_reason(exc)}); a results file "
                                       f"holds numbers and text; {fix}") from exc
    return out


RESULT_ARRAYS = ("reference", "candidate", "obs_ids", "sigma")


def read_results(file: Path, dims: int) -> PerObservation:
    """A results file of ``release eval`` or ``import-served`` (reference, candidate [N, chunk, dims], obs_ids [N],
    sigma [dims]), checked before any statistic: a damaged or inconsistent file is a one-line error naming it and
    the observation or dimension at fault, never NaN figures or a crash later in ``release card``."""
    fix = "re-run 'release eval' (or 'release import-served') to rewrite it"
    arrays = read_arrays(file, RESULT_ARRAYS, fix)
    missing = [k for k in RESULT_ARRAYS if k not in arrays]
    if missing:
        raise ReleaseError(f"{file}: array '{missing[0]}' is missing (a results file holds "
                           f"{', '.join(RESULT_ARRAYS)}); {fix}")
    ref, cand, ids, sigma = (arrays[k] for k in RESULT_ARRAYS)
    for name, array in (("reference", ref), ("candidate", cand), ("sigma", sigma)):
        if array.dtype.kind not in "fiu":
            raise ReleaseError(f"{file}: array '{name}' holds {array.dtype}, not numbers; {fix}")
    if ids.dtype.kind not in "iu":
        raise ReleaseError(f"{file}: 'obs_ids' holds {ids.dtype}, not integer observation ids; {fix}")
    if ref.ndim != 3 or 0 in ref.shape or ref.shape[2] != dims or cand.shape != ref.shape:
        raise ReleaseError(f"{file}: 'reference' {list(ref.shape)} and 'candidate' {list(cand.shape)} must both be "
                           f"[N, chunk, {dims}] with N and chunk >= 1; {fix}")
    if ids.shape != (ref.shape[0],) or sigma.shape != (dims,):
        raise ReleaseError(f"{file}: 'obs_ids' {list(ids.shape)} and 'sigma' {list(sigma.shape)} must be "
                           f"[{ref.shape[0]}] and [{dims}]; {fix}")
    bad_sigma = ~(np.isfinite(sigma) & (sigma > 0))
    if bad_sigma.any():
        d = int(np.argmax(bad_sigma))
        raise ReleaseError(f"{file}: sigma[{d}] is {sigma[d]}; every dimension's sigma must be a positive finite "
                           f"number (the action_stats named in builds/release.yaml); {fix}")
    for name, array in (("reference", ref), ("candidate", cand)):
        bad_rows = ~np.isfinite(array).reshape(len(array), -1).all(axis=1)
        if bad_rows.any():
            i = int(np.argmax(bad_rows))
            raise ReleaseError(f"{file}: '{name}' of observation {int(ids[i])} (row {i}) holds NaN or Inf; {fix}")
    with np.errstate(over="ignore", invalid="ignore"):
        po = per_observation(ref, cand, sigma, ids)
    too_large = ~(np.isfinite(po.sq_err) & np.isfinite(po.sq_sig))
    if too_large.any():
        i = int(np.argmax(too_large))
        raise ReleaseError(f"{file}: the actions of observation {int(ids[i])} (row {i}) are too large to square in "
                           f"sigma units; {fix}")
    return po


COMPUTED = ("device", "torch", "cuda", "kernel", "gemm_shapes")
WEIGHTS = ("weights_bytes", "bf16_weights_bytes")  # the loaded models' parameters and buffers, as release eval records
STEPS_COMPUTED = ("steps", "torchao")  # each step's mode (every path release eval runs), TorchAO's version (served)


def read_computed(file: Path) -> dict[str, Any]:
    """How a results file's candidate was computed, as ``release eval`` records it (device, torch and CUDA versions,
    the FP8 GEMM kernel, the GEMM shapes). A file without that record, written by an older ``release eval``, is
    refused: the tables and cards state how every row was computed, and cannot for it."""
    fix = "rerun 'release eval' (or 'release import-served') to rewrite it"
    recorded = read_arrays(file, ("computed",), fix).get("computed")
    if recorded is None:
        raise ReleaseError(f"{file}: does not record how it was computed (device, torch and CUDA versions, FP8 GEMM "
                           f"kernel: written by an older release eval); {fix}")
    doc = parse_json(str(recorded), f"{file}: 'computed'", fix)
    try:
        shapes = [[int(v) for v in s] for s in doc["gemm_shapes"]]
        if not all(k in doc for k in COMPUTED) or not all(len(s) == 3 for s in shapes):
            raise ValueError("a field is missing")
        served = {k: doc[k] for k in STEPS_COMPUTED if k in doc}
        if "steps" in served and not (isinstance(served["steps"], list) and served["steps"]
                                      and all(m in ("W8A8", "W8A16") for m in served["steps"])):
            raise ValueError("the steps are not W8A8 or W8A16")
        if "torchao" in served and not isinstance(served["torchao"], str):
            raise ValueError("the TorchAO version is not text")
    except (ValueError, TypeError, KeyError) as exc:
        raise ReleaseError(f"{file}: 'computed' is not the record release eval writes ({', '.join(COMPUTED)}); "
                           f"{fix}") from exc
    weights = {k: doc[k] for k in WEIGHTS if type(doc.get(k)) is int and doc[k] > 0}  # absent: not recorded
    return {k: doc[k] for k in COMPUTED} | {"gemm_shapes": shapes} | served | weights


SPEED_RANGE = (1e-6, 1e5)  # a rollout's seconds and GiB: what a machine can measure (NaN and 1e308 are damage)


def read_speed(file: Path) -> dict[str, Any] | None:
    """The rollout latency and peak GPU memory that ``release eval`` on a GPU wrote beside the results ``file``,
    BF16's and the build's, and whether each ran as CUDA graphs (None when the rollouts ran on a CPU)."""
    path = file.with_suffix(PERF)
    if not path.is_file():
        return None
    doc = read_json(path, "rollout latency and memory", "release eval", ("bf16", "build"))
    try:
        sides: dict[str, dict[str, Any]] = {
            side: {"device": str(doc[side]["device"]), "rollouts": int(doc[side]["rollouts"]),
                   "seconds": float(doc[side]["seconds_median"]), "peak_gib": float(doc[side]["peak_gib"]),
                   "graphs": doc[side].get("graphs") is True}
            for side in ("bf16", "build")}
    except (KeyError, TypeError, ValueError) as exc:
        raise ReleaseError(f"{path}: field {exc} is missing or not a number (each of 'bf16' and 'build' holds "
                           "device, rollouts, seconds_median, peak_gib); re-run 'release eval' to rewrite it") from None
    if not all(SPEED_RANGE[0] <= v <= SPEED_RANGE[1] for s in sides.values() for v in (s["seconds"], s["peak_gib"])) \
            or not all(s["rollouts"] >= 1 for s in sides.values()):
        raise ReleaseError(f"{path}: seconds_median and peak_gib must be positive numbers from {SPEED_RANGE[0]:g} to "
                           f"{SPEED_RANGE[1]:g} and rollouts at least 1; re-run 'release eval'")
    if sides["bf16"]["device"] != sides["build"]["device"]:
        raise ReleaseError(f"{path}: BF16 ran on {sides['bf16']['device']}, the build on {sides['build']['device']}; "
                           "re-run 'release eval' on one machine")
    return sides


def read_labs(file: Path, po: PerObservation) -> np.ndarray | None:
    """The lab of each observation of a results file (release eval records one per row), None when the file has
    none (a server's results) or they are not text."""
    labs = read_arrays(file, ("labs",), "re-run 'release eval' to rewrite it").get("labs")
    if labs is None or labs.dtype.kind != "U" or labs.shape != po.obs_ids.shape:
        return None
    _, first = np.unique(po.obs_ids, return_index=True)
    return labs[np.sort(first)]
