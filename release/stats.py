"""Fidelity statistics of the seed card (domain notes §5), vectorised over bootstrap resamples.

Every statistic is a function of per-observation sums, so one matrix of resampled observation indices serves every
build: a bootstrap of 22 builds x 10,000 resamples is a handful of matrix products.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile (Wilson)
JOINTS = 7
GRIPPER = 7  # index of the gripper dimension
GRIPPER_THRESHOLD = 0.5


@dataclass(frozen=True)
class PerObservation:
    """Per-observation sums of one comparison (candidate vs reference), the unit the bootstrap resamples."""

    sq_err: np.ndarray  # [N] sum over steps x dims of ((cand - ref) / sigma)^2
    sq_sig: np.ndarray  # [N] sum of (ref / sigma)^2
    abs_joint_deg: np.ndarray  # [N] sum over steps x joints of |dq| in degrees
    grip_agree: np.ndarray  # [N] steps whose binarized gripper agrees
    steps: int  # steps per observation
    dims: int
    max_err: np.ndarray  # [N] max |e| / sigma per observation
    elem_err: np.ndarray  # [N, steps * dims] |e| / sigma

    @property
    def n(self) -> int:
        return int(self.sq_err.shape[0])


def per_observation(reference: np.ndarray, candidate: np.ndarray, sigma: np.ndarray) -> PerObservation:
    """``reference``/``candidate``: [N, steps, dims] absolute joint positions (rad) + gripper; ``sigma``: [dims]."""
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    e = (cand - ref) / sigma
    n, steps, dims = ref.shape
    grip = (cand[..., GRIPPER] >= GRIPPER_THRESHOLD) == (ref[..., GRIPPER] >= GRIPPER_THRESHOLD)
    return PerObservation(
        sq_err=(e**2).sum(axis=(1, 2)),
        sq_sig=((ref / sigma) ** 2).sum(axis=(1, 2)),
        abs_joint_deg=np.degrees(np.abs(cand[..., :JOINTS] - ref[..., :JOINTS])).sum(axis=(1, 2)),
        grip_agree=grip.sum(axis=1).astype(np.float64),
        steps=steps,
        dims=dims,
        max_err=np.abs(e).reshape(n, -1).max(axis=1),
        elem_err=np.abs(e).reshape(n, -1),
    )


def wilson(successes: int, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion."""
    if total == 0:
        return (math.nan, math.nan)
    p = successes / total
    denom = 1 + z * z / total
    centre = (p + z * z / (2 * total)) / denom
    half = z * math.sqrt(p * (1 - p) / total + z * z / (4 * total * total)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def resample_indices(n: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, n] observation indices drawn with replacement (seeded)."""
    return np.random.default_rng(seed).integers(0, n, size=(resamples, n))


def resample_counts(idx: np.ndarray, n: int) -> np.ndarray:
    """[resamples, n] how often each observation is drawn: resampled sums become one matrix product."""
    counts = np.zeros((idx.shape[0], n))
    np.add.at(counts, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    return counts


def overall(po: PerObservation, weights: np.ndarray | None = None) -> np.ndarray | float:
    """RMS normalised error; with ``weights`` [R, N] (resample counts) one value per resample."""
    per = po.steps * po.dims
    if weights is None:
        return float(math.sqrt(po.sq_err.sum() / (po.n * per)))
    return np.sqrt((weights @ po.sq_err) / (weights.sum(axis=1) * per))


@dataclass(frozen=True)
class Summary:
    overall_sigma: float
    overall_ci: tuple[float, float]
    joint_mae_deg: float
    snr_db: float
    gripper_agree: float
    gripper_ci: tuple[float, float]
    gripper_changes: int
    element_err_p95: float
    obs_max_err_p95: float
    n_obs: int
    n_steps: int


def summarize(po: PerObservation, counts: np.ndarray) -> Summary:
    boots = np.asarray(overall(po, counts))
    steps = po.n * po.steps
    agree = int(po.grip_agree.sum())
    return Summary(
        overall_sigma=float(overall(po)),
        overall_ci=(float(np.percentile(boots, 2.5)), float(np.percentile(boots, 97.5))),
        joint_mae_deg=float(po.abs_joint_deg.sum() / (steps * JOINTS)),
        snr_db=float(10 * math.log10(po.sq_sig.sum() / max(po.sq_err.sum(), 1e-300))),
        gripper_agree=agree / steps,
        gripper_ci=wilson(agree, steps),
        gripper_changes=steps - agree,
        element_err_p95=float(np.percentile(po.elem_err, 95)),
        obs_max_err_p95=float(np.percentile(po.max_err, 95)),
        n_obs=po.n,
        n_steps=steps,
    )


def paired_difference(build: PerObservation, baseline: PerObservation, counts: np.ndarray,
                      comparisons: int = 1) -> dict[str, float | tuple[float, float]]:
    """overall(build) - overall(baseline) on the same resamples; Bonferroni over ``comparisons`` builds."""
    diff = np.asarray(overall(build, counts)) - np.asarray(overall(baseline, counts))
    alpha = 0.05 / max(1, comparisons)
    p_two = 2 * min(float((diff <= 0).mean()), float((diff >= 0).mean()))
    return {
        "diff": float(overall(build)) - float(overall(baseline)),
        "ci": (float(np.percentile(diff, 2.5)), float(np.percentile(diff, 97.5))),
        "ci_corrected": (float(np.percentile(diff, 50 * alpha)), float(np.percentile(diff, 100 - 50 * alpha))),
        "p": min(1.0, p_two),
        "p_corrected": min(1.0, p_two * max(1, comparisons)),
    }


def attribution(build: PerObservation, baseline: PerObservation, obs_ids: np.ndarray) -> dict[str, object]:
    """The two observations that move the difference to the baseline most, the difference without them, and the
    share of the build's squared error held by its top three observations."""
    full = float(overall(build)) - float(overall(baseline))
    keep = np.ones(build.n, dtype=bool)

    def diff_without(mask: np.ndarray) -> float:
        per = build.steps * build.dims * mask.sum()
        return math.sqrt(build.sq_err[mask].sum() / per) - math.sqrt(baseline.sq_err[mask].sum() / per)

    influence = []
    for i in range(build.n):
        keep[i] = False
        influence.append(full - diff_without(keep))
        keep[i] = True
    sign = 1.0 if full >= 0 else -1.0
    top2 = np.argsort(-sign * np.asarray(influence), kind="stable")[:2]
    keep[top2] = False
    top3 = np.argsort(-build.sq_err, kind="stable")[:3]
    return {
        "diff": full,
        "top_observations": [int(obs_ids[i]) for i in top2],
        "diff_without_top": diff_without(keep),
        "top3_error_observations": [int(obs_ids[i]) for i in top3],
        "top3_error_share": float(build.sq_err[top3].sum() / build.sq_err.sum()) if build.sq_err.sum() else 0.0,
    }


def gate(summary: Summary, overall_sigma: float, change_rate: float) -> bool:
    return summary.overall_sigma <= overall_sigma and summary.gripper_changes <= change_rate * summary.n_steps
