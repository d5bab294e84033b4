"""``release import-served``: an external policy server's results checked and stored as a build's ``served`` path,
in the results format ``release eval`` writes."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np

from release.check.written import record_written
from release.core.builds import load_build, load_release
from release.core.conformance import POLICY_SERVER
from release.core.errors import ReleaseError
from release.inputs.observations import action_sigma, load_observations
from release.inputs.source import resolve_source
from release.measure.evaluate import load_npz, save_results
from release.measure.layout import RESULTS


def _integers(file: Path, key: str, values: np.ndarray) -> list[int]:
    """An id array as ints: integer dtypes, and floats that are whole numbers (3.0 is 3). Anything else (0.7,
    strings, booleans) is refused, never truncated."""
    if values.dtype.kind in "iu" or (values.dtype.kind == "f" and np.isfinite(values).all()
                                     and (values == np.round(values)).all()):
        return [int(v) for v in values]
    bad = next((v for v in values.tolist() if not (isinstance(v, float) and v.is_integer())), values.tolist()[0])
    raise ReleaseError(f"{file}: array '{key}' must hold integers, got {values.dtype} values such as {bad!r}")


def import_served(name: str, file: Path, dist: Path, observations: Path | None, source: Path | None) -> Path:
    """Check an external server's results (npz: reference, candidate [N, chunk, 8], obs_ids, seeds?, sigma?) and
    store them as the build's ``served`` path."""
    release = load_release()
    build = load_build(name)
    folder = dist / build.repo
    if not folder.is_dir():
        raise ReleaseError(f"{folder}: missing; run 'release build {name}' first")
    data = load_npz(file, "export it again from the policy server")
    for key in ("reference", "candidate", "obs_ids"):
        if key not in data:
            raise ReleaseError(f"{file}: array '{key}' is missing; expected reference, candidate [N, chunk, 8], "
                               "obs_ids [N], optional seeds [N] and sigma [8]")
    for key in ("reference", "candidate", "sigma"):
        if key in data and data[key].dtype.kind not in "fiu":
            raise ReleaseError(f"{file}: array '{key}' must hold numbers, got {data[key].dtype}")
    ref, cand = data["reference"], data["candidate"]
    dims = release.policy.action_dims
    if ref.ndim != 3 or ref.shape[2] != dims or ref.shape != cand.shape:
        raise ReleaseError(f"{file}: 'reference' {list(ref.shape)} and 'candidate' {list(cand.shape)} must both be "
                           f"[N, chunk, {dims}]")
    if 0 in ref.shape:
        raise ReleaseError(f"{file}: 'reference' and 'candidate' are {list(ref.shape)}: no observation or no action "
                           "step; export at least one observation's chunk")
    n = ref.shape[0]
    for key in ("obs_ids", "seeds"):
        if key in data and data[key].shape != (n,):
            raise ReleaseError(f"{file}: '{key}' has shape {list(data[key].shape)}, expected [{n}]")
    for key in ("reference", "candidate"):
        if not np.isfinite(data[key]).all():
            raise ReleaseError(f"{file}: array '{key}' holds NaN or Inf")
    if "sigma" in data and (data["sigma"].shape != (dims,) or not (np.isfinite(data["sigma"])
                                                                   & (data["sigma"] > 0)).all()):
        raise ReleaseError(f"{file}: 'sigma' must be {dims} positive numbers")
    ids = _integers(file, "obs_ids", data["obs_ids"])
    repeated = sorted(i for i, count in Counter(ids).items() if count > 1)
    if repeated:
        raise ReleaseError(f"{file}: 'obs_ids' repeats {repeated[:5]}; each observation may appear once")
    seeds = _integers(file, "seeds", data["seeds"]) if "seeds" in data else [release.policy.noise_seed] * n
    obs_folder = observations or resolve_source(release, source).parent / "observations"
    known = {o.obs_id: o for o in load_observations(obs_folder)}
    unknown = [i for i in ids if i not in known]
    if unknown:
        raise ReleaseError(f"{file}: unknown observation ids {unknown[:5]}; they must be obs_id values of the "
                           "observation set")
    sigma = data["sigma"] if "sigma" in data else action_sigma(obs_folder, release.action_stats, dims)
    out = folder / RESULTS / "served-all.npz"
    save_results(out, ref, cand, [known[i] for i in ids], seeds, sigma,  # computed by the server: its kernel alone
                 {"device": None, "torch": None, "cuda": None, "kernel": POLICY_SERVER, "gemm_shapes": []})
    record_written(folder, [out], "release import-served")
    return out
