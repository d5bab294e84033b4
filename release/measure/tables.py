"""``release tables``: the seed card's fidelity, served, ranking and attribution tables from stored results."""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from release.core.builds import load_build, load_release
from release.core.config import BuildConfig, Gate, ReleaseConfig
from release.core.errors import ReleaseError
from release.core.io import atomic_dir, atomic_write, build_date, replaceable_folder, write_json
from release.measure.layout import RESULTS, YARDSTICKS, builds_date, sweep_builds
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
from release.measure.results import read_computed, read_labs, read_results, read_speed
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


TOO_FEW = "too few observations"


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
