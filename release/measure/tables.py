"""``release tables``: the seed card's fidelity, served, ranking and attribution tables from stored results."""

from __future__ import annotations

import math
import re
import zipfile
import zlib
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from release.core.builds import available_builds, load_build, load_release
from release.core.config import BuildConfig, ReleaseConfig
from release.core.errors import ReleaseError
from release.core.io import atomic_write, build_date, output_folder, read_json, write_json
from release.measure.evaluate import PERF, RESULTS, YARDSTICKS, external_builds
from release.measure.stats import (
    Difference,
    PerObservation,
    Summary,
    attribution,
    cluster_counts,
    concentration,
    gate,
    overall,
    paired_difference,
    per_observation,
    ratio,
    summarize,
)

RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
RESULT_FILE = re.compile(r"^(fakequant|deployed|served)-(calibration|validation|all)\.npz$")


@dataclass(frozen=True)
class TablesRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    dist: Path
    out: Path
    baseline: str
    resamples: int

    @classmethod
    def create(cls, names: tuple[str, ...], dist: Path, out: Path | None, baseline: str,
               resamples: int) -> TablesRequest:
        release = load_release()
        if names:
            builds = [load_build(n) for n in names]
            for b in builds:
                if not (dist / b.repo / RESULTS).is_dir():
                    raise ReleaseError(f"build {b.name!r} has no results in {dist / b.repo / RESULTS}; "
                                       f"run 'release eval {b.name}' first")
        else:
            builds = [b for b in [*map(load_build, available_builds()), *external_builds(dist)]
                      if (dist / b.repo / RESULTS).is_dir()]
            if not builds:
                raise ReleaseError(f"{dist}: no build has results; run 'release eval NAME' first")
        load_build(baseline)
        return cls(release, builds, dist, output_folder(out or dist / "tables"), baseline, resamples)


@dataclass(frozen=True)
class Result:
    build: BuildConfig
    path: str
    split: str
    per_obs: PerObservation
    file: Path
    computed: dict[str, Any]


RESULT_ARRAYS = ("reference", "candidate", "obs_ids", "sigma")
TOO_FEW = "too few observations"


def read_results(file: Path, dims: int) -> PerObservation:
    """A results file of ``release eval`` or ``import-served`` (reference, candidate [N, chunk, dims], obs_ids [N],
    sigma [dims]), checked before any statistic: a damaged or inconsistent file is a one-line error naming it and
    the observation or dimension at fault, never NaN figures or a crash later in ``release card``."""
    fix = "re-run 'release eval' (or 'release import-served') to rewrite it"
    try:
        with np.load(file, allow_pickle=False) as data:
            missing = [k for k in RESULT_ARRAYS if k not in data.files]
            if missing:
                raise ReleaseError(f"{file}: array '{missing[0]}' is missing (a results file holds "
                                   f"{', '.join(RESULT_ARRAYS)}); {fix}")
            ref, cand, ids, sigma = (data[k] for k in RESULT_ARRAYS)
    except (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OSError) as exc:
        reason = next(iter(str(exc).splitlines()), "") or type(exc).__name__
        raise ReleaseError(f"{file}: not a readable results file ({reason}); {fix}") from exc
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


def read_computed(file: Path) -> dict[str, Any]:
    """How a results file's candidate was computed, as ``release eval`` records it (device, torch and CUDA versions,
    the FP8 GEMM kernel, the GEMM shapes). A file without that record, written by an older ``release eval``, is
    refused: the tables and cards state how every row was computed, and cannot for it."""
    import json

    with np.load(file, allow_pickle=False) as data:
        raw = str(data["computed"]) if "computed" in data.files else None
    fix = "rerun 'release eval' (or 'release import-served') to rewrite it"
    if raw is None:
        raise ReleaseError(f"{file}: does not record how it was computed (device, torch and CUDA versions, FP8 GEMM "
                           f"kernel: written by an older release eval); {fix}")
    try:
        doc = json.loads(raw)
        shapes = [[int(v) for v in s] for s in doc["gemm_shapes"]]
        if not all(k in doc for k in COMPUTED) or not all(len(s) == 3 for s in shapes):
            raise ValueError("a field is missing")
    except (ValueError, TypeError, KeyError) as exc:
        raise ReleaseError(f"{file}: 'computed' is not the record release eval writes ({', '.join(COMPUTED)}); "
                           f"{fix}") from exc
    return {k: doc[k] for k in COMPUTED} | {"gemm_shapes": shapes}


def read_speed(file: Path) -> dict[str, Any] | None:
    """The rollout latency and peak GPU memory that ``release eval`` on a GPU wrote beside the results ``file``,
    BF16's and the build's (None when the rollouts ran on a CPU)."""
    path = file.with_suffix(PERF)
    if not path.is_file():
        return None
    doc = read_json(path, "rollout latency and memory", "release eval", ("bf16", "build"))
    try:
        sides: dict[str, dict[str, Any]] = {
            side: {"device": str(doc[side]["device"]), "rollouts": int(doc[side]["rollouts"]),
                   "seconds": float(doc[side]["seconds_median"]), "peak_gib": float(doc[side]["peak_gib"])}
            for side in ("bf16", "build")}
    except (KeyError, TypeError, ValueError) as exc:
        raise ReleaseError(f"{path}: field {exc} is missing or not a number (each of 'bf16' and 'build' holds "
                           "device, rollouts, seconds_median, peak_gib); re-run 'release eval' to rewrite it") from None
    if not all(math.isfinite(v) and v > 0 for s in sides.values() for v in (s["seconds"], s["peak_gib"])):
        raise ReleaseError(f"{path}: seconds_median and peak_gib must be positive numbers; re-run 'release eval'")
    if sides["bf16"]["device"] != sides["build"]["device"]:
        raise ReleaseError(f"{path}: BF16 ran on {sides['bf16']['device']}, the build on {sides['build']['device']}; "
                           "re-run 'release eval' on one machine")
    return sides


def load_results(folder: Path, build: BuildConfig, dims: int) -> list[Result]:
    out = []
    for file in sorted((folder / RESULTS).glob("*.npz")):
        m = RESULT_FILE.match(file.name)
        if m:
            out.append(Result(build, m.group(1), m.group(2), read_results(file, dims), file, read_computed(file)))
    return out


def _yardstick(dist: Path, kind: str, split: str, dims: int) -> tuple[PerObservation, dict[str, Any]] | None:
    path = dist / YARDSTICKS / f"{kind}-{split}.npz"
    return (read_results(path, dims), read_computed(path)) if path.is_file() else None


def comparison_families(request: TablesRequest) -> Counter[tuple[str, str]]:
    """Bonferroni's m of each (path, split): every build of the dist with results there, the baseline aside, whichever
    builds the command names."""
    builds = {b.name: b for b in [*map(load_build, available_builds()), *external_builds(request.dist),
                                  *request.builds]}
    families: Counter[tuple[str, str]] = Counter()
    for b in builds.values():
        if b.name != request.baseline:
            matches = (RESULT_FILE.match(f.name) for f in (request.dist / b.repo / RESULTS).glob("*.npz"))
            families.update((m.group(1), m.group(2)) for m in matches if m)
    return families


def _comparison(d: Difference | None, att: dict[str, Any] | None = None) -> dict[str, Any]:
    """A record's comparison with the baseline: all None for the baseline itself and the yardsticks."""
    fields = {"diff_to_baseline": "diff", "diff_ci": "ci", "diff_ci_corrected": "ci_corrected", "diff_p": "p",
              "diff_p_corrected": "p_corrected", "diff_p_bound": "p_bound", "comparisons": "comparisons",
              "diff_too_few_observations": "too_few_observations"}
    return {key: None if d is None else getattr(d, name) for key, name in fields.items()} | {"attribution": att}


def build_tables(request: TablesRequest) -> tuple[list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """The records of tables.json (one per build, path and split, then the yardsticks) and the CSV tables."""
    dims = request.release.policy.action_dims
    results = [r for b in request.builds for r in load_results(request.dist / b.repo, b, dims)]
    baseline_build = load_build(request.baseline)
    baselines = {(r.path, r.split): r
                 for r in load_results(request.dist / baseline_build.repo, baseline_build, dims)}
    families = comparison_families(request)
    splits = sorted({r.split for r in results})
    yardsticks = {(kind, split): _yardstick(request.dist, kind, split, dims)
                  for kind in ("compile", "seed") for split in splits}
    counts_cache: dict[tuple[int, ...], np.ndarray] = {}

    def counts(po: PerObservation) -> np.ndarray:
        key = tuple(po.obs_ids.tolist())
        if key not in counts_cache:
            counts_cache[key] = cluster_counts(po.obs_ids, request.resamples, BOOTSTRAP_SEED)
        return counts_cache[key]

    def x_compile(s: Summary, split: str) -> float | None:
        compile_ys = yardsticks[("compile", split)]
        return None if compile_ys is None else ratio(s.overall_sigma, float(overall(compile_ys[0])))

    records: list[dict[str, Any]] = []
    attributions: list[dict[str, Any]] = []
    for r in results:
        s = summarize(r.per_obs, counts(r.per_obs))
        record: dict[str, Any] = {"build": r.build.name, "title": r.build.text("title"),
                                  "scheme": r.build.scheme, "path": r.path, "split": r.split, **asdict(s),
                                  **concentration(r.per_obs),
                                  "x_eager_vs_compile": x_compile(s, r.split),
                                  "gate": gate(s, r.build.gate.overall_sigma, r.build.gate.gripper_change_rate),
                                  "speed": read_speed(r.file), "computed": r.computed, **_comparison(None)}
        base = baselines.get((r.path, r.split))
        if base is not None and r.build.name != request.baseline:
            if not np.array_equal(base.per_obs.obs_ids, r.per_obs.obs_ids):
                raise ReleaseError(f"{r.file}: obs_ids differ from those of the baseline's {base.file}; a paired "
                                   "comparison needs the same observations in the same order: re-run 'release eval "
                                   f"{r.build.name} {request.baseline} --path {r.path} --split {r.split}'")
            d = paired_difference(r.per_obs, base.per_obs, counts(r.per_obs), families[(r.path, r.split)])
            att = attribution(r.per_obs, base.per_obs)
            attributions.append({"build": r.build.name, "path": r.path, "split": r.split, **att})
            record.update(_comparison(d, att))
        records.append(record)
    for split in splits:
        for kind, title in (("compile", "BF16 eager vs BF16 torch.compile (yardstick)"),
                            ("seed", "BF16 seed vs BF16 other seed (yardstick)")):
            found = yardsticks[(kind, split)]
            if found is not None:
                ys, computed = found
                s = summarize(ys, counts(ys))
                records.append({"build": f"yardstick-{kind}", "title": title,
                                "scheme": None, "path": "yardstick", "split": split, **asdict(s), "gate": None,
                                "x_eager_vs_compile": x_compile(s, split), "computed": computed,
                                **_comparison(None)})
    if not records:
        raise ReleaseError(f"{request.dist}: no result files; run 'release eval' first")
    measured = [r for r in records if r["path"] != "yardstick"]
    ranked = sorted(measured, key=lambda r: (r["path"], r["split"], r["overall_sigma"]))
    tables = {
        "fidelity": _formatted([r for r in measured if r["path"] != "served"]),
        "served": _formatted([r for r in measured if r["path"] == "served"]),
        "ranking": pd.DataFrame({
            "path": [r["path"] for r in ranked], "split": [r["split"] for r in ranked],
            "build": [r["title"] for r in ranked],
            "sigma [95% CI]": [_estimate(r["overall_sigma"], r["overall_ci"]) for r in ranked],
            "vs baseline [Bonferroni-corrected 95% CI]": [
                "-" if r["comparisons"] is None else _estimate(r["diff_to_baseline"], r["diff_ci_corrected"], "+.3f")
                for r in ranked],
            "p (Bonferroni-corrected)": [_p(r) for r in ranked],
            "m": pd.array([r["comparisons"] for r in ranked], dtype="Int64"),
            "changes": [r["gripper_changes"] for r in ranked],
        }),
        "attribution": pd.DataFrame(attributions),
    }
    return records, tables


def _num(value: float | None, spec: str = ".3f") -> str:
    """A CSV cell: None (undefined) is "-", an infinity is ∞."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return format(value, spec)


def _estimate(value: float, ci: tuple[float, float] | None, spec: str = ".3f") -> str:
    """A point estimate with its interval, or with the reason there is none."""
    interval = f"[{_num(ci[0], spec)}, {_num(ci[1], spec)}]" if ci is not None else f"({TOO_FEW})"
    return f"{_num(value, spec)} {interval}"


def _p(record: dict[str, Any]) -> str:
    p = record["diff_p_corrected"]
    if record["comparisons"] is None:
        return "-"
    if p is None:
        return TOO_FEW
    text = np.format_float_positional(p, precision=6, trim="-")  # 2 / resamples needs 6 decimals at 10^6
    return f"< {text}" if record["diff_p_bound"] else text


def _formatted(records: list[dict[str, Any]]) -> pd.DataFrame:
    """The seed card's fidelity columns, formatted."""
    return pd.DataFrame({
        "build": [r["title"] for r in records], "path": [r["path"] for r in records],
        "split": [r["split"] for r in records],
        "overall (sigma) [95% CI]": [_estimate(r["overall_sigma"], r["overall_ci"]) for r in records],
        "x eager-vs-compile": [_num(r["x_eager_vs_compile"], ".2f") for r in records],
        "joint MAE (deg)": [_num(r["joint_mae_deg"], ".2f") for r in records],
        "SNR (dB)": [_num(r["snr_db"], ".1f") for r in records],
        "gripper agree [95% CI]": [f"{r['gripper_agree'] * 100:.2f}% [{r['gripper_ci'][0] * 100:.2f}, "
                                   f"{r['gripper_ci'][1] * 100:.2f}]" for r in records],
        "changes": [r["gripper_changes"] for r in records],
        "gate": ["pass" if r["gate"] else "fail" for r in records],
    })


def _json(value: Any) -> Any:
    """Plain JSON: tuples as lists and an infinity as the string "inf" or "-inf" (JSON has none; ``release card``
    reads it back with float()). Undefined values are already None (null)."""
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value


def run_tables(request: TablesRequest) -> dict[str, pd.DataFrame]:
    records, tables = build_tables(request)
    request.out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        atomic_write(request.out / f"{name}.csv", frame.to_csv(index=False))
    write_json(request.out / "tables.json", {"baseline": request.baseline, "resamples": request.resamples,
                                              "bootstrap_seed": BOOTSTRAP_SEED, "date": build_date(),
                                              "records": _json(records)})
    return tables
