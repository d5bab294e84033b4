"""Fidelity statistics of the seed card (domain notes §5), vectorised over bootstrap resamples.

Every statistic is a function of per-observation sums, so one matrix of resample counts serves every build: a
bootstrap of 22 builds x 10,000 resamples is a handful of matrix products.

Undefined values are ``None`` (a ratio or share of 0 / 0); a quotient of something over 0 is ``math.inf``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054  # two-sided 95% normal quantile (Wilson)
ALPHA = 0.05  # two-sided level of every interval and test
JOINTS = 7
GRIPPER = 7  # index of the gripper dimension
GRIPPER_THRESHOLD = 0.5


def min_observations(comparisons: int = 1) -> int:
    """The fewest observations for which a bootstrap interval or p-value is given, at level ALPHA / comparisons.

    With N observations a percentile bootstrap has at most C(2N - 1, N) distinct resamples (1 at N = 1, 3 at N = 2),
    so its interval collapses to a point and a paired difference gets p = 0 however small N is. The floor is where
    the data could back a verdict at all: the most extreme evidence N paired observations can give, all N pointing
    the same way, has an exact two-sided sign-test p of 2 * 0.5**N, and that must reach the (Bonferroni-corrected)
    level. So N >= 1 + log2(comparisons / ALPHA): 6 observations for one interval or comparison (p >= 1/32), 7 for
    two or three comparisons, 8 for four to six, 10 for the seed card's 21.
    """
    return 1 + math.ceil(math.log2(max(1, comparisons) / ALPHA))


@dataclass(frozen=True)
class PerObservation:
    """Per-row sums of one comparison (candidate vs reference); a row is one rollout of observation ``obs_ids[i]``.

    The bootstrap resamples observations: rows that share an observation id (the seed yardstick's rollouts of one
    observation under several noise seeds) are drawn together.
    """

    sq_err: np.ndarray  # [N] sum over steps x dims of ((cand - ref) / sigma)^2
    sq_sig: np.ndarray  # [N] sum of (ref / sigma)^2
    abs_joint_deg: np.ndarray  # [N] sum over steps x joints of |dq| in degrees
    grip_agree: np.ndarray  # [N] steps whose binarized gripper agrees
    steps: int  # steps per observation
    dims: int
    max_err: np.ndarray  # [N] max |e| / sigma per observation
    elem_err: np.ndarray  # [N, steps * dims] |e| / sigma
    obs_ids: np.ndarray  # [N] the observation of each row

    @property
    def n(self) -> int:
        """Rows."""
        return int(self.sq_err.shape[0])

    @property
    def observations(self) -> int:
        """Distinct observations: the unit of the bootstrap."""
        return int(np.unique(self.obs_ids).size)


def per_observation(reference: np.ndarray, candidate: np.ndarray, sigma: np.ndarray,
                    obs_ids: np.ndarray | None = None) -> PerObservation:
    """``reference``/``candidate``: [N, steps, dims] absolute joint positions (rad) + gripper; ``sigma``: [dims];
    ``obs_ids``: [N] (default: every row its own observation)."""
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
        obs_ids=np.arange(n) if obs_ids is None else np.asarray(obs_ids),
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


def cluster_counts(obs_ids: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """[resamples, rows] weights of a bootstrap over observations: the distinct ids (in order of first appearance)
    are drawn with replacement and each draw takes every row of that observation. With one row per observation this
    is :func:`resample_counts` of the rows."""
    _, first, inverse = np.unique(obs_ids, return_index=True, return_inverse=True)
    rank = np.empty(first.size, dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(first.size)
    k = first.size
    return resample_counts(resample_indices(k, resamples, seed), k)[:, rank[inverse.reshape(-1)]]


def overall(po: PerObservation, weights: np.ndarray | None = None) -> np.ndarray | float:
    """RMS normalised error; with ``weights`` [R, N] (resample counts) one value per resample."""
    per = po.steps * po.dims
    if weights is None:
        return float(math.sqrt(po.sq_err.sum() / (po.n * per)))
    return np.sqrt((weights @ po.sq_err) / (weights.sum(axis=1) * per))


def ratio(value: float, yardstick: float) -> float | None:
    """``value`` in units of ``yardstick``: inf over a zero yardstick, undefined (None) for 0 / 0."""
    if yardstick == 0:
        return None if value == 0 else math.inf
    return value / yardstick


def snr_db(signal: float, error: float) -> float | None:
    """10 log10(signal / error): +inf for an error of 0 (candidate equals reference), None for 0 / 0."""
    r = ratio(signal, error)
    if r is None:
        return None
    return 10 * math.log10(r) if r > 0 else -math.inf


@dataclass(frozen=True)
class Summary:
    overall_sigma: float
    overall_ci: tuple[float, float] | None  # None: fewer than min_observations() observations
    joint_mae_deg: float
    snr_db: float | None
    gripper_agree: float
    gripper_ci: tuple[float, float]
    gripper_changes: int
    element_err_p95: float
    obs_max_err_p95: float
    n_obs: int  # distinct observations
    n_steps: int  # steps over all rows
    too_few_observations: bool


def summarize(po: PerObservation, counts: np.ndarray) -> Summary:
    """Point estimates and intervals; ``counts`` [R, rows] from :func:`cluster_counts` of ``po.obs_ids``."""
    steps = po.n * po.steps
    agree = int(po.grip_agree.sum())
    too_few = po.observations < min_observations()
    boots = np.asarray(overall(po, counts))
    return Summary(
        overall_sigma=float(overall(po)),
        overall_ci=None if too_few else (float(np.percentile(boots, 100 * ALPHA / 2)),
                                         float(np.percentile(boots, 100 - 100 * ALPHA / 2))),
        joint_mae_deg=float(po.abs_joint_deg.sum() / (steps * JOINTS)),
        snr_db=snr_db(float(po.sq_sig.sum()), float(po.sq_err.sum())),
        gripper_agree=agree / steps,
        gripper_ci=wilson(agree, steps),
        gripper_changes=steps - agree,
        element_err_p95=float(np.percentile(po.elem_err, 95)),
        obs_max_err_p95=float(np.percentile(po.max_err, 95)),
        n_obs=po.observations,
        n_steps=steps,
        too_few_observations=too_few,
    )


@dataclass(frozen=True)
class Difference:
    """overall(build) - overall(baseline), paired on the same resamples, Bonferroni-corrected over ``comparisons``.

    Below :func:`min_observations` (``comparisons``) the intervals and p-values are None. A p with no resample on
    the other side of 0 is its resolution, 2 / resamples, with ``p_bound`` set: the true p is below it."""

    diff: float
    ci: tuple[float, float] | None
    ci_corrected: tuple[float, float] | None
    p: float | None
    p_corrected: float | None
    p_bound: bool
    comparisons: int
    too_few_observations: bool


def paired_difference(build: PerObservation, baseline: PerObservation, counts: np.ndarray,
                      comparisons: int = 1) -> Difference:
    """``build`` and ``baseline`` hold the same observations in the same order; ``counts`` [R, rows]."""
    m = max(1, comparisons)
    point = float(overall(build)) - float(overall(baseline))
    if build.observations < min_observations(m):
        return Difference(point, None, None, None, None, False, m, True)
    diff = np.asarray(overall(build, counts)) - np.asarray(overall(baseline, counts))
    alpha = ALPHA / m
    p_two = 2 * min(float((diff <= 0).mean()), float((diff >= 0).mean()))
    bound = p_two == 0
    p = 2 / diff.size if bound else min(1.0, p_two)
    return Difference(
        diff=point,
        ci=(float(np.percentile(diff, 50 * ALPHA)), float(np.percentile(diff, 100 - 50 * ALPHA))),
        ci_corrected=(float(np.percentile(diff, 50 * alpha)), float(np.percentile(diff, 100 - 50 * alpha))),
        p=p,
        p_corrected=min(1.0, p * m),
        p_bound=bound,
        comparisons=m,
        too_few_observations=False,
    )


def attribution(build: PerObservation, baseline: PerObservation) -> dict[str, object]:
    """The two observations that move the difference to the baseline most, the difference without them (None when
    nothing is left), and the share of the build's squared error held by its top three observations (None when the
    build has no error at all)."""
    full = float(overall(build)) - float(overall(baseline))
    keep = np.ones(build.n, dtype=bool)

    def diff_without(mask: np.ndarray) -> float | None:
        if not mask.any():
            return None
        per = build.steps * build.dims * mask.sum()
        return math.sqrt(build.sq_err[mask].sum() / per) - math.sqrt(baseline.sq_err[mask].sum() / per)

    influence = []
    for i in range(build.n):
        keep[i] = False
        influence.append(full - (diff_without(keep) or 0.0))
        keep[i] = True
    sign = 1.0 if full >= 0 else -1.0
    top2 = np.argsort(-sign * np.asarray(influence), kind="stable")[:2]
    keep[top2] = False
    return {
        "diff": full,
        "top_observations": [int(build.obs_ids[i]) for i in top2],
        "diff_without_top": diff_without(keep),
        **concentration(build),
    }


def concentration(po: PerObservation) -> dict[str, object]:
    """The three observations that hold the most squared error, and their share of it (None without any error)."""
    top3 = np.argsort(-po.sq_err, kind="stable")[:3]
    total = float(po.sq_err.sum())
    return {"top3_error_observations": [int(po.obs_ids[i]) for i in top3],
            "top3_error_share": float(po.sq_err[top3].sum()) / total if total else None}


def gate_failures(overall_sigma: float, gripper_changes: int, n_steps: int, limit_sigma: float,
                  change_rate: float) -> list[str]:
    """The criteria of a build's gate that a result fails (empty: it passes): overall <= ``limit_sigma`` and gripper
    changes <= ``change_rate`` x steps, both limits inclusive."""
    failed = []
    if not overall_sigma <= limit_sigma:
        failed.append("overall_sigma")
    if not gripper_changes <= change_rate * n_steps:
        failed.append("gripper_changes")
    return failed


def gate(summary: Summary, overall_sigma: float, change_rate: float) -> bool:
    return not gate_failures(summary.overall_sigma, summary.gripper_changes, summary.n_steps, overall_sigma,
                             change_rate)
