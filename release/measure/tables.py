"""``release tables``: the seed card's fidelity, served, ranking and attribution tables from stored results."""

from __future__ import annotations

import math
import re
import zipfile
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from release.core.builds import load_build, load_release
from release.core.config import BuildConfig, Gate, ReleaseConfig
from release.core.errors import ReleaseError
from release.core.io import atomic_dir, atomic_write, build_date, parse_json, read_json, replaceable_folder, write_json
from release.measure.layout import PERF, RESULTS, YARDSTICKS, builds_date, sweep_builds
from release.measure.paired import (
    CORRECTION,
    INTERVAL_EXACT_MAX_N,
    TEST,
    Paired,
    Patterns,
    at_floor,
    holm,
    holm_levels,
    min_observations,
    min_resamples,
    non_inferior,
    paired,
    patterns,
    per_observation_mse,
    sign_flip_p,
    verdict,
    within_margin,
    without_each_group,
)
from release.measure.stats import (
    PerObservation,
    Summary,
    attribution,
    concentration,
    decimals,
    gate,
    gate_misses,
    gate_within_noise,
    observation_counts,
    overall,
    p_rounded,
    per_observation,
    ratio,
    summarize,
)

RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
RESULT_FILE = re.compile(r"^(fakequant|deployed|served)-(calibration|validation|all)\.npz$")


# what `release tables` writes into --out, which it replaces whole (a folder holding anything else is refused)
TABLES_OUTPUTS = frozenset({"fidelity.csv", "served.csv", "ranking.csv", "attribution.csv", "tables.json"})


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
            builds = [b for b in sweep_builds(dist) if (dist / b.repo / RESULTS).is_dir()]
            if not builds:
                raise ReleaseError(f"{dist}: no build has results; run 'release eval NAME' first")
        load_build(baseline)
        return cls(release, builds, dist, replaceable_folder(out or dist / "tables", "--out", TABLES_OUTPUTS), baseline,
                   resamples)


@dataclass(frozen=True)
class Result:
    build: BuildConfig
    path: str
    split: str
    per_obs: PerObservation
    file: Path
    computed: dict[str, Any]
    labs: np.ndarray | None  # the lab of each observation (first-appearance order), as release eval records it


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
WEIGHTS = ("weights_bytes", "bf16_weights_bytes")  # the loaded models' parameters and buffers, as release eval records
STEPS_COMPUTED = ("steps", "torchao")  # each step's mode (every path release eval runs), TorchAO's version (served)


def read_computed(file: Path) -> dict[str, Any]:
    """How a results file's candidate was computed, as ``release eval`` records it (device, torch and CUDA versions,
    the FP8 GEMM kernel, the GEMM shapes). A file without that record, written by an older ``release eval``, is
    refused: the tables and cards state how every row was computed, and cannot for it."""

    with np.load(file, allow_pickle=False) as data:
        raw = str(data["computed"]) if "computed" in data.files else None
    fix = "rerun 'release eval' (or 'release import-served') to rewrite it"
    if raw is None:
        raise ReleaseError(f"{file}: does not record how it was computed (device, torch and CUDA versions, FP8 GEMM "
                           f"kernel: written by an older release eval); {fix}")
    doc = parse_json(raw, f"{file}: 'computed'", fix)
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
    with np.load(file, allow_pickle=False) as data:
        labs = data["labs"] if "labs" in data.files else None
    if labs is None or labs.dtype.kind != "U" or labs.shape != po.obs_ids.shape:
        return None
    _, first = np.unique(po.obs_ids, return_index=True)
    return labs[np.sort(first)]


def load_results(folder: Path, build: BuildConfig, dims: int) -> list[Result]:
    out = []
    for file in sorted((folder / RESULTS).glob("*.npz")):
        m = RESULT_FILE.match(file.name)
        if m:
            po = read_results(file, dims)
            out.append(Result(build, m.group(1), m.group(2), po, file, read_computed(file), read_labs(file, po)))
    return out


def _yardstick(dist: Path, kind: str, split: str, dims: int) -> tuple[PerObservation, dict[str, Any]] | None:
    path = dist / YARDSTICKS / f"{kind}-{split}.npz"
    return (read_results(path, dims), read_computed(path)) if path.is_file() else None


def _mse(po: PerObservation) -> np.ndarray:
    return per_observation_mse(po.sq_err, po.obs_ids, po.steps * po.dims)


def _families(request: TablesRequest, dims: int) -> dict[tuple[str, str], list[Result]]:
    """Each (path, split)'s family of comparisons with the baseline: every build of the dist with results there (the
    baseline aside), whichever builds the command names, since Holm's correction needs all their p-values."""
    builds = {b.name: b for b in [*sweep_builds(request.dist), *request.builds]}
    families: dict[tuple[str, str], list[Result]] = {}
    for b in builds.values():
        if b.name != request.baseline and (request.dist / b.repo / RESULTS).is_dir():
            for r in load_results(request.dist / b.repo, b, dims):
                families.setdefault((r.path, r.split), []).append(r)
    # only a family on more than INTERVAL_EXACT_MAX_N observations draws random sign patterns (--resamples of them)
    sampled = [kv for kv in families.items() if kv[1][0].per_obs.observations > INTERVAL_EXACT_MAX_N]
    biggest = max(sampled, key=lambda kv: len(kv[1]), default=None)
    if biggest is not None and request.resamples < min_resamples(len(biggest[1])):
        (path, split), members = biggest
        raise ReleaseError(f"--resamples {request.resamples}: too few for the family {path}/{split} (m = "
                           f"{len(members)} comparisons), whose corrected p and interval need at least "
                           f"{min_resamples(len(members))} to reach 0.05 / {len(members)}; pass --resamples "
                           f"{min_resamples(len(members))} or more (default {RESAMPLES})")
    return families


# the test, Holm's p, and the range of the difference with one lab left out with the number of labs (or None)
Compared = tuple[Paired, float | None, tuple[tuple[float, float], int] | None]


def _compared(request: TablesRequest, baselines: dict[tuple[str, str], Result],
              families: dict[tuple[str, str], list[Result]]) -> dict[tuple[str, str, str], Compared]:
    """Each family member's paired comparison with the baseline, its Holm-adjusted p and the range of its difference
    with one lab left out, by (build, path, split)."""
    pats: dict[int, Patterns] = {}
    out: dict[tuple[str, str, str], Compared] = {}
    for (path, split), members in families.items():
        base = baselines.get((path, split))
        if base is None:
            continue
        for r in members:
            if not np.array_equal(base.per_obs.obs_ids, r.per_obs.obs_ids):
                raise ReleaseError(f"{r.file}: obs_ids differ from those of the baseline's {base.file}; a paired "
                                   "comparison needs the same observations in the same order: re-run 'release eval "
                                   f"{r.build.name} {request.baseline} --path {r.path} --split {r.split}'")
        n = base.per_obs.observations
        pats.setdefault(n, patterns(n, request.resamples, BOOTSTRAP_SEED))
        m = len(members)
        ps = [sign_flip_p(_mse(r.per_obs), _mse(base.per_obs), pats[n]) if n >= min_observations(m) else None
              for r in members]
        compared = [paired(_mse(r.per_obs), _mse(base.per_obs), pats[n], m, level)
                    for r, level in zip(members, holm_levels(ps), strict=True)]
        for r, c, adjusted in zip(members, compared, holm(ps), strict=True):
            labs = r.labs if r.labs is not None else base.labs
            lab_range = None if labs is None else without_each_group(_mse(r.per_obs), _mse(base.per_obs), labs)
            out[(r.build.name, path, split)] = (c, adjusted, None if lab_range is None or labs is None else
                                                (lab_range, int(np.unique(labs).size)))
    return out


def _comparison(found: Compared | None, margin: float | None,
                att: dict[str, Any] | None = None) -> dict[str, Any]:
    """A record's comparison with the baseline: all None for the baseline itself and the yardsticks."""
    keys = ("diff_to_baseline", "diff_ci", "diff_ci_corrected", "diff_ci_exact", "diff_p", "diff_p_corrected",
            "diff_p_exact", "diff_p_floor", "comparisons", "diff_too_few_observations", "diff_verdict",
            "within_margin", "non_inferior", "margin", "diff_without_one_lab", "labs")
    if found is None:
        return dict.fromkeys(keys) | {"attribution": att}
    c, adjusted, by_lab = found
    values = (c.diff, c.ci, c.ci_corrected, c.ci_exact, c.p, adjusted, c.p_exact, c.p_floor, c.comparisons,
              c.too_few_observations,
              verdict(c.diff, c.ci_corrected, adjusted), within_margin(c.ci_corrected, margin),
              non_inferior(c.ci_corrected, margin), margin,
              *((None, None) if by_lab is None else by_lab))
    return dict(zip(keys, values, strict=True)) | {"attribution": att}


def build_tables(request: TablesRequest) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, pd.DataFrame]]:
    """The method and families, the records of tables.json (one per build, path and split, then the yardsticks) and
    the CSV tables."""
    dims = request.release.policy.action_dims
    results = [r for b in request.builds for r in load_results(request.dist / b.repo, b, dims)]
    baseline_build = load_build(request.baseline)
    baselines = {(r.path, r.split): r
                 for r in load_results(request.dist / baseline_build.repo, baseline_build, dims)}
    families = _families(request, dims)
    compared = _compared(request, baselines, families)
    splits = sorted({r.split for r in results} | {split for _, split in families})
    yardsticks = {(kind, split): _yardstick(request.dist, kind, split, dims)
                  for kind in ("compile", "seed") for split in splits}
    counts_cache: dict[int, np.ndarray] = {}

    def counts(po: PerObservation) -> np.ndarray:
        n = po.observations
        if n not in counts_cache:
            counts_cache[n] = observation_counts(n, request.resamples, BOOTSTRAP_SEED)
        return counts_cache[n]

    def x_compile(s: Summary, split: str) -> float | None:
        compile_ys = yardsticks[("compile", split)]
        return None if compile_ys is None else ratio(s.overall_sigma, float(overall(compile_ys[0])))

    def margin(path: str, split: str) -> float | None:
        base = baselines.get((path, split))
        return request.release.equivalence_margin.of(None if base is None else float(overall(base.per_obs)))

    records: list[dict[str, Any]] = []
    attributions: list[dict[str, Any]] = []
    for r in results:
        s = summarize(r.per_obs, counts(r.per_obs))
        limits = (r.build.gate.overall_sigma, r.build.gate.gripper_change_rate)
        record: dict[str, Any] = {"build": r.build.name, "title": r.build.text("title"),
                                  "scheme": r.build.scheme, "path": r.path, "split": r.split, **asdict(s),
                                  **concentration(r.per_obs),
                                  "x_eager_vs_compile": x_compile(s, r.split),
                                  "gate": gate(s, *limits), "gate_within_noise": gate_within_noise(s, *limits),
                                  "speed": read_speed(r.file), "computed": r.computed,
                                  **_comparison(None, None)}
        found = compared.get((r.build.name, r.path, r.split))
        if found is not None:
            att = attribution(r.per_obs, baselines[(r.path, r.split)].per_obs)
            attributions.append({"build": r.build.name, "path": r.path, "split": r.split, **att})
            record.update(_comparison(found, margin(r.path, r.split), att))
        records.append(record)
    for split in splits:
        for kind, title in (("compile", "BF16 eager vs BF16 torch.compile (yardstick)"),
                            ("seed", "BF16 seed vs BF16 other seed (yardstick)")):
            found_ys = yardsticks[(kind, split)]
            if found_ys is not None:
                ys, computed = found_ys
                s = summarize(ys, counts(ys))
                records.append({"build": f"yardstick-{kind}", "title": title,
                                "scheme": None, "path": "yardstick", "split": split, **asdict(s), "gate": None,
                                "gate_within_noise": None, "x_eager_vs_compile": x_compile(s, split),
                                "computed": computed, **_comparison(None, None)})
    if not records:
        raise ReleaseError(f"{request.dist}: no result files; run 'release eval' first")
    method = {
        "test": TEST, "correction": CORRECTION, "alpha": 0.05,
        "interval": "studentized bootstrap (bootstrap-t of log mean squared error) over observations",
        "diff_interval": "Hartigan subset means, mapped to the RMS scale; diff_ci_corrected at the level Holm's "
                         "procedure tests the build",
        "gripper_interval": "percentile bootstrap over observations",
        "equivalence_margin": request.release.equivalence_margin.model_dump(),
        "families": [{"path": path, "split": split, "baseline": request.baseline, "m": len(members),
                      "builds": [r.build.name for r in members], "margin": margin(path, split),
                      "patterns": patterns(baselines[(path, split)].per_obs.observations, request.resamples,
                                           BOOTSTRAP_SEED).describe()}
                     for (path, split), members in sorted(families.items()) if (path, split) in baselines],
    }
    measured = [r for r in records if r["path"] != "yardstick"]
    gates = {r.build.name: r.build.gate for r in results}
    ranked = sorted(measured, key=lambda r: (r["path"], r["split"], r["overall_sigma"]))
    tables = {
        "fidelity": _formatted([r for r in measured if r["path"] != "served"], gates),
        "served": _formatted([r for r in measured if r["path"] == "served"], gates),
        "ranking": pd.DataFrame({
            "path": [r["path"] for r in ranked], "split": [r["split"] for r in ranked],
            "build": [r["title"] for r in ranked],
            "sigma [95% CI]": [_estimate(r["overall_sigma"], r["overall_ci"]) for r in ranked],
            "vs baseline [Holm-adjusted 95% CI]": [
                "-" if r["comparisons"] is None else _estimate(r["diff_to_baseline"], r["diff_ci_corrected"], "+")
                for r in ranked],
            "p (sign-flip, Holm-adjusted)": [_p(r) for r in ranked],
            "m": pd.array([r["comparisons"] for r in ranked], dtype="Int64"),
            "verdict": [_verdict(r) for r in ranked],
            "changes": [r["gripper_changes"] for r in ranked],
        }),
        "attribution": pd.DataFrame(attributions),
    }
    return method, records, tables


def _num(value: float | None, spec: str = ".3f") -> str:
    """A CSV cell: None (undefined) is "-", an infinity is ∞."""
    if value is None:
        return "-"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return format(value, spec)


def _estimate(value: float, ci: tuple[float, float] | None, sign: str = "") -> str:
    """A point estimate with its interval at the precision the interval needs, or with the reason there is none."""
    spec = f"{sign}.{decimals(ci)}f"
    interval = f"[{_num(ci[0], spec)}, {_num(ci[1], spec)}]" if ci is not None else f"({TOO_FEW})"
    return f"{_num(value, spec)} {interval}"


def _p(record: dict[str, Any]) -> str:
    """The Holm-adjusted p; "<= p" where the Monte Carlo p sits at its floor (the exact one is at most that)."""
    p = record["diff_p_corrected"]
    if record["comparisons"] is None:
        return "-"
    if p is None:
        return TOO_FEW
    bound = at_floor(record["diff_p"], record["diff_p_floor"])
    return ("<= " if bound else "") + np.format_float_positional(p_rounded(p, bound), trim="-")


def _verdict(record: dict[str, Any]) -> str:
    """The verdict, with "within +-margin" beside it where the Holm-level interval lies inside the margin."""
    if record["diff_verdict"] is None:
        return "-"
    margin = f"within +-{_num(record['margin'], '.4g')}" if record["within_margin"] else None
    return "; ".join(v for v in (record["diff_verdict"], margin) if v)


def _gate(record: dict[str, Any], limits: Gate) -> str:
    """``pass``, or ``fail`` with each criterion missed and its limit (``overall 0.210 > 0.13``)."""
    if record["gate"]:
        return "pass"
    why = {"overall_sigma": "overall {:.3f} > {:g}", "gripper_changes": "gripper changes {} > {:g}"}
    return f"fail: {', '.join(why[c].format(value, limit) for c, value, limit in gate_misses(record, limits))}"


def _formatted(records: list[dict[str, Any]], gates: dict[str, Gate]) -> pd.DataFrame:
    """The seed card's fidelity columns, formatted."""
    return pd.DataFrame({
        "build": [r["title"] for r in records], "path": [r["path"] for r in records],
        "split": [r["split"] for r in records],
        "overall (sigma) [95% CI]": [_estimate(r["overall_sigma"], r["overall_ci"]) for r in records],
        "x eager-vs-compile": [_num(r["x_eager_vs_compile"], ".2f") for r in records],
        "joint MAE (deg)": [_num(r["joint_mae_deg"], ".2f") for r in records],
        "SNR (dB)": [_num(r["snr_db"], ".1f") for r in records],
        "gripper agree [95% CI]": [f"{r['gripper_agree'] * 100:.2f}% " + (
            f"[{r['gripper_ci'][0] * 100:.2f}, {r['gripper_ci'][1] * 100:.2f}]" if r["gripper_ci"] else f"({TOO_FEW})")
            for r in records],
        "changes": [r["gripper_changes"] for r in records],
        "gate": [_gate(r, gates[r["build"]]) for r in records],
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
    """Compute the tables and write them as one set: staged beside ``--out``, then swapped in whole (a full disk or
    a kill leaves the old set or the new one, never CSVs of one baseline beside a tables.json of another)."""
    method, records, tables = build_tables(request)
    with atomic_dir(request.out) as staged:
        for name, frame in tables.items():
            atomic_write(staged / f"{name}.csv", frame.to_csv(index=False))
        write_json(staged / "tables.json", {"baseline": request.baseline, "resamples": request.resamples,
                                            "bootstrap_seed": BOOTSTRAP_SEED,
                                            "date": build_date(builds_date(request.dist, request.builds)),
                                            "method": _json(method), "records": _json(records)})
    return tables
