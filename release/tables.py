"""``release tables``: the seed card's fidelity, served, ranking and attribution tables from stored results."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from release import ReleaseError
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.evaluate import RESULTS, YARDSTICKS
from release.io import atomic_write, write_json
from release.stats import (
    PerObservation,
    attribution,
    gate,
    overall,
    paired_difference,
    per_observation,
    resample_counts,
    resample_indices,
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
            builds = [b for b in map(load_build, available_builds()) if (dist / b.repo / RESULTS).is_dir()]
            if not builds:
                raise ReleaseError(f"{dist}: no build has results; run 'release eval NAME' first")
        load_build(baseline)
        return cls(release, builds, dist, out or dist / "tables", baseline, resamples)


@dataclass(frozen=True)
class Result:
    build: BuildConfig
    path: str
    split: str
    per_obs: PerObservation
    obs_ids: np.ndarray


def load_results(folder: Path, build: BuildConfig) -> list[Result]:
    out = []
    for file in sorted((folder / RESULTS).glob("*.npz")):
        m = RESULT_FILE.match(file.name)
        if not m:
            continue
        data = np.load(file)
        po = per_observation(data["reference"], data["candidate"], data["sigma"])
        out.append(Result(build, m.group(1), m.group(2), po, data["obs_ids"]))
    return out


def _yardstick(dist: Path, kind: str, split: str) -> PerObservation | None:
    path = dist / YARDSTICKS / f"{kind}-{split}.npz"
    if not path.is_file():
        return None
    data = np.load(path)
    return per_observation(data["reference"], data["candidate"], data["sigma"])


def _fmt_ci(ci: tuple[float, float], sign: bool = False) -> str:
    f = "{:+.3f}" if sign else "{:.3f}"
    return f"[{f.format(ci[0])}, {f.format(ci[1])}]"


def build_tables(request: TablesRequest) -> dict[str, pd.DataFrame]:
    results = [r for b in request.builds for r in load_results(request.dist / b.repo, b)]
    baseline_build = load_build(request.baseline)
    baselines = {(r.path, r.split): r for r in load_results(request.dist / baseline_build.repo, baseline_build)}
    records: list[dict[str, Any]] = []
    attributions: list[dict[str, Any]] = []
    counts_cache: dict[int, np.ndarray] = {}
    for r in results:
        n = r.per_obs.n
        if n not in counts_cache:
            counts_cache[n] = resample_counts(resample_indices(n, request.resamples, BOOTSTRAP_SEED), n)
        counts = counts_cache[n]
        s = summarize(r.per_obs, counts)
        compile_ys = _yardstick(request.dist, "compile", r.split)
        ratio = s.overall_sigma / float(overall(compile_ys)) \
            if compile_ys is not None and compile_ys.sq_err.sum() > 0 else None
        record: dict[str, Any] = {"build": r.build.name, "title": r.build.title, "delivered": r.build.delivered,
                                  "path": r.path, "split": r.split, **asdict(s), "x_eager_vs_compile": ratio,
                                  "gate": gate(s, r.build.gate.overall_sigma, r.build.gate.gripper_change_rate)}
        base = baselines.get((r.path, r.split))
        if base is not None and r.build.name != request.baseline and np.array_equal(base.obs_ids, r.obs_ids):
            peers = {x.build.name for x in results if (x.path, x.split) == (r.path, r.split)} - {request.baseline}
            paired = paired_difference(r.per_obs, base.per_obs, counts, comparisons=len(peers))
            record.update({"diff_to_baseline": paired["diff"], "diff_ci": paired["ci"],
                           "diff_ci_corrected": paired["ci_corrected"], "diff_p": paired["p"],
                           "diff_p_corrected": paired["p_corrected"], "comparisons": len(peers)})
            att = attribution(r.per_obs, base.per_obs, r.obs_ids)
            attributions.append({"build": r.build.name, "path": r.path, "split": r.split, **att})
            record["attribution"] = att
        records.append(record)
    for split in sorted({r.split for r in results}):
        for kind, title in (("compile", "BF16 eager vs BF16 torch.compile (yardstick)"),
                            ("seed", "BF16 seed vs BF16 other seed (yardstick)")):
            ys, compile_ys = _yardstick(request.dist, kind, split), _yardstick(request.dist, "compile", split)
            if ys is not None and compile_ys is not None:
                counts = resample_counts(resample_indices(ys.n, request.resamples, BOOTSTRAP_SEED), ys.n)
                s = summarize(ys, counts)
                records.append({"build": f"yardstick-{kind}", "title": title, "delivered": False,
                                "path": "yardstick", "split": split, **asdict(s), "gate": None,
                                "x_eager_vs_compile": s.overall_sigma / float(overall(compile_ys))})
    if not records:
        raise ReleaseError(f"{request.dist}: no result files; run 'release eval' first")
    frame = pd.DataFrame.from_records(records)
    tables = {"records": frame}
    tables["fidelity"] = _formatted(frame[(frame.path != "served") & (frame.path != "yardstick")])
    tables["served"] = _formatted(frame[frame.path == "served"])
    ranked = frame[frame.path != "yardstick"].sort_values(["path", "split", "overall_sigma"], kind="stable")
    tables["ranking"] = pd.DataFrame({
        "path": ranked.path, "split": ranked.split, "build": ranked.title,
        "sigma [95% CI]": [f"{o:.3f} {_fmt_ci(c)}" for o, c in zip(ranked.overall_sigma, ranked.overall_ci,
                                                                    strict=True)],
        "vs baseline [95% CI]": [
            "-" if not isinstance(c, tuple | list) else f"{d:+.3f} {_fmt_ci(tuple(c), sign=True)}"
            for d, c in zip(ranked.get("diff_to_baseline", pd.Series([np.nan] * len(ranked))),
                            ranked.get("diff_ci", pd.Series([None] * len(ranked))), strict=True)],
        "changes": ranked.gripper_changes,
    })
    tables["attribution"] = pd.DataFrame(attributions)
    return tables


def _formatted(fid: pd.DataFrame) -> pd.DataFrame:
    """The seed card's fidelity columns, formatted."""
    return pd.DataFrame({
        "build": fid.title, "path": fid.path, "split": fid.split,
        "overall (sigma) [95% CI]": [f"{o:.3f} {_fmt_ci(c)}" for o, c in zip(fid.overall_sigma, fid.overall_ci,
                                                                              strict=True)],
        "x eager-vs-compile": ["-" if x is None or x != x else f"{x:.2f}" for x in fid.x_eager_vs_compile],
        "joint MAE (deg)": [f"{v:.2f}" for v in fid.joint_mae_deg],
        "SNR (dB)": [f"{v:.1f}" for v in fid.snr_db],
        "gripper agree [95% CI]": [f"{a * 100:.2f}% [{c[0] * 100:.2f}, {c[1] * 100:.2f}]"
                                   for a, c in zip(fid.gripper_agree, fid.gripper_ci, strict=True)],
        "changes": list(fid.gripper_changes),
        "gate": ["pass" if g else "fail" for g in fid.gate],
    })


def run_tables(request: TablesRequest) -> dict[str, pd.DataFrame]:
    tables = build_tables(request)
    request.out.mkdir(parents=True, exist_ok=True)
    for name, frame in tables.items():
        if name != "records":
            atomic_write(request.out / f"{name}.csv", frame.to_csv(index=False))
    records = json.loads(tables["records"].to_json(orient="records"))
    write_json(request.out / "tables.json", {"baseline": request.baseline, "resamples": request.resamples,
                                              "bootstrap_seed": BOOTSTRAP_SEED, "records": records})
    return tables
