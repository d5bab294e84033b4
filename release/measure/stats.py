"""Fidelity statistics of the seed card (domain notes §5), vectorised over bootstrap resamples.

Every statistic is a function of per-observation sums, so one matrix of resample counts serves every build: a
bootstrap of 22 builds x 10,000 resamples is a handful of matrix products.

Undefined values are ``None`` (a ratio or share of 0 / 0); a quotient of something over 0 is ``math.inf``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from release.core.config import Gate
from release.measure.paired import ALPHA, min_observations, per_observation_mse

Z95 = 1.959963984540054  # two-sided 95% normal quantile (Wilson)
JOINTS = 7
GRIPPER = 7  # index of the gripper dimension
GRIPPER_THRESHOLD = 0.5


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


def overall(po: PerObservation, weights: np.ndarray | None = None) -> np.ndarray | float:
    """RMS normalised error; with ``weights`` [R, N] (resample counts) one value per resample."""
    per = po.steps * po.dims
    if weights is None:
        return float(math.sqrt(po.sq_err.sum() / (po.n * per)))
    return np.sqrt((weights @ po.sq_err) / (weights.sum(axis=1) * per))


def decimals(ci: tuple[float, float] | list[float] | None, least: int = 3) -> int:
    """The decimals an estimate needs for its interval to show two significant digits of its width (at least
    ``least``, at most 6): effects of 10^-3 sigma print as -0.0012 [-0.0031, -0.0004], not -0.000 [-0.003, -0.000]."""
    if ci is None or not all(map(math.isfinite, ci)) or ci[1] <= ci[0]:
        return least
    return min(6, max(least, 1 - math.floor(math.log10(ci[1] - ci[0]))))


def p_decimals(p: float) -> int:
    """The decimals that show a p-value to two significant digits (0.68, 0.0042, 0.000031), at most 11 (an exact p
    at N = 32 is a multiple of 2^-31, 4.7e-10), and more where rounding would put it on the other side of ALPHA
    (0.0496 is 0.0496, not 0.05); trailing zeros are dropped where it is printed."""
    digits = 2 if p <= 0 or p >= 0.1 else min(11, 1 - math.floor(math.log10(p)))
    while digits < 11 and (round(p, digits) < ALPHA) != (p < ALPHA):
        digits += 1
    return digits


def p_rounded(p: float, at_most: bool = False) -> float:
    """``p`` at :func:`p_decimals`; rounded up when it is printed as a bound ("<= p": a Monte Carlo p at its floor),
    so that the bound stays true."""
    digits = p_decimals(p)
    return math.ceil(p * 10**digits) / 10**digits if at_most else round(p, digits)


RHO_MIN = 0.5  # |Spearman rho| below this is no rank agreement (or opposition) whatever its p
EXACT_RANKS = 8  # up to 8! = 40,320 orderings, Spearman's p is exact; beyond, 9,999 random ones


@dataclass(frozen=True)
class RankAgreement:
    rho: float  # NaN when one side gives every build the same value
    n: int
    p: float | None  # two-sided permutation p; None with rho NaN
    exact: bool

    @property
    def verdict(self) -> str:
        """"alike", "opposite" or "not shown" (|rho| < RHO_MIN, p >= ALPHA, or rho undefined)."""
        if self.p is None or self.p >= ALPHA or abs(self.rho) < RHO_MIN:
            return "not shown"
        return "alike" if self.rho > 0 else "opposite"


def rank_agreement(a: list[float], b: list[float]) -> RankAgreement:
    """Spearman's rho (average ranks for ties) of two rankings of the same builds, with a two-sided permutation p:
    over all n! orderings up to EXACT_RANKS builds, over 9,999 seeded random ones beyond ((b + 1) / (R + 1))."""
    from scipy.stats import rankdata

    n = len(a)
    ra, rb = rankdata(a) - (n + 1) / 2, rankdata(b) - (n + 1) / 2
    norm = math.sqrt(float(ra @ ra) * float(rb @ rb))
    if n < 3 or norm == 0:
        return RankAgreement(math.nan, n, None, False)
    rho = float(ra @ rb) / norm
    exact = n <= EXACT_RANKS
    orders = np.array(list(itertools.permutations(range(n)))) if exact else \
        np.argsort(np.random.default_rng(0).random((9_999, n)), axis=1)
    hits = int((np.abs(rb[orders] @ ra / norm) >= abs(rho) - 1e-12).sum())
    return RankAgreement(rho, n, hits / len(orders) if exact else (hits + 1) / (len(orders) + 1), exact)


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
    gripper_ci: tuple[float, float] | None  # None: too few observations
    gripper_changes: int
    element_err_p95: float
    obs_max_err_p95: float
    n_obs: int  # distinct observations
    n_steps: int  # steps over all rows
    too_few_observations: bool


def by_observation(po: PerObservation, values: np.ndarray) -> np.ndarray:
    """Per-row ``values`` summed per observation, in order of first appearance (the order of :func:`observation
    counts <observation_counts>` and of :func:`~release.measure.paired.per_observation_mse`)."""
    _, first, inverse = np.unique(po.obs_ids, return_index=True, return_inverse=True)
    return np.bincount(inverse.reshape(-1), weights=values)[np.argsort(first, kind="stable")]


def observation_ids(po: PerObservation) -> np.ndarray:
    """The distinct observation ids in order of first appearance."""
    _, first = np.unique(po.obs_ids, return_index=True)
    return po.obs_ids[np.sort(first)]


def observation_counts(observations: int, resamples: int, seed: int) -> np.ndarray:
    """[resamples, observations] weights of a bootstrap over observations (each draw takes all its rows)."""
    return resample_counts(resample_indices(observations, resamples, seed), observations)


def studentized_rms_interval(mse: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """95% interval of sqrt(mean(mse)) by the studentized (bootstrap-t) bootstrap of log(mean), over observations.

    Chosen by coverage simulation (bench/interval_coverage.py, BENCHMARKS.md): at N = 10-32 it covers 93.6-94.4%
    with light tails where the percentile bootstrap covered 89.2-92.5%, and 88.6-92.8% with lognormal errors (the
    percentile 75.6-86.3%; no method reaches 95% there at these N). The bootstrap-t of the mean itself covers as
    much, but its lower bound can fall below zero; on the log scale the bounds stay positive."""
    n = mse.size
    mean = float(mse.mean())
    se0 = float(mse.std(ddof=1)) / math.sqrt(n) / mean if mean > 0 else 0.0
    if se0 == 0:
        return (math.sqrt(mean), math.sqrt(mean))
    with np.errstate(divide="ignore", invalid="ignore"):
        m = (counts @ mse) / n
        s2 = ((counts @ mse**2) / n - m**2) * n / (n - 1)
        t = (np.log(m) - math.log(mean)) / (np.sqrt(np.maximum(s2, 0) / n) / m)
    hi_q, lo_q = np.percentile(t[np.isfinite(t)], [100 - 50 * ALPHA, 50 * ALPHA])
    return (math.sqrt(mean * math.exp(-hi_q * se0)), math.sqrt(mean * math.exp(-lo_q * se0)))


def gripper_interval(agree: np.ndarray, steps: np.ndarray, counts: np.ndarray) -> tuple[float, float]:
    """95% interval of the gripper agreement, resampling observations (the steps of one observation are correlated:
    10 changes in one observation are not 1 in each of 10). With no change at all (or no agreement), every resample
    gives the same share, so the Wilson interval over steps stands in: it assumes independent steps."""
    total, agreed = int(steps.sum()), int(agree.sum())
    if agreed in (0, total):
        return wilson(agreed, total)
    share = (counts @ agree) / (counts @ steps)
    lo, hi = np.percentile(share, [50 * ALPHA, 100 - 50 * ALPHA])
    return (float(lo), float(hi))


def summarize(po: PerObservation, counts: np.ndarray) -> Summary:
    """Point estimates and intervals; ``counts`` [R, observations] from :func:`observation_counts`."""
    steps = po.n * po.steps
    agree = int(po.grip_agree.sum())
    too_few = po.observations < min_observations()
    mse = per_observation_mse(po.sq_err, po.obs_ids, po.steps * po.dims)
    grip = by_observation(po, po.grip_agree), by_observation(po, np.full(po.n, float(po.steps)))
    return Summary(
        overall_sigma=float(overall(po)),
        overall_ci=None if too_few else studentized_rms_interval(mse, counts),
        joint_mae_deg=float(po.abs_joint_deg.sum() / (steps * JOINTS)),
        snr_db=snr_db(float(po.sq_sig.sum()), float(po.sq_err.sum())),
        gripper_agree=agree / steps,
        gripper_ci=None if too_few else gripper_interval(*grip, counts),
        gripper_changes=steps - agree,
        element_err_p95=float(np.percentile(po.elem_err, 95)),
        obs_max_err_p95=float(np.percentile(po.max_err, 95)),
        n_obs=po.observations,
        n_steps=steps,
        too_few_observations=too_few,
    )


def attribution(build: PerObservation, baseline: PerObservation) -> dict[str, object]:
    """The two observations that move the difference to the baseline most, the difference without them (None when
    nothing is left), and the share of the build's squared error held by its top three observations (None when the
    build has no error at all). An observation's rows (its noise seeds) are left out together."""
    full = float(overall(build)) - float(overall(baseline))
    ones = np.ones(build.n)
    rows, b_sq, a_sq = by_observation(build, ones), by_observation(build, build.sq_err), \
        by_observation(baseline, baseline.sq_err)
    ids = observation_ids(build)
    per = build.steps * build.dims
    keep = np.ones(rows.size, dtype=bool)

    def diff_without(mask: np.ndarray) -> float | None:
        if not mask.any():
            return None
        n = rows[mask].sum() * per
        return math.sqrt(b_sq[mask].sum() / n) - math.sqrt(a_sq[mask].sum() / n)

    influence = []
    for i in range(rows.size):
        keep[i] = False
        influence.append(full - (diff_without(keep) or 0.0))
        keep[i] = True
    sign = 1.0 if full >= 0 else -1.0
    top2 = np.argsort(-sign * np.asarray(influence), kind="stable")[:2]
    keep[top2] = False
    return {
        "diff": full,
        "top_observations": [int(ids[i]) for i in top2],
        "diff_without_top": diff_without(keep),
        **concentration(build),
    }


def concentration(po: PerObservation) -> dict[str, object]:
    """The three observations that hold the most squared error, and their share of it (None without any error)."""
    sq, ids = by_observation(po, po.sq_err), observation_ids(po)
    top3 = np.argsort(-sq, kind="stable")[:3]
    total = float(sq.sum())
    return {"top3_error_observations": [int(ids[i]) for i in top3],
            "top3_error_share": float(sq[top3].sum()) / total if total else None}


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


def gate_misses(record: Mapping[str, Any], limits: Gate) -> list[tuple[str, float, float]]:
    """The criteria of its gate (``limits``, its build file's) that a tables.json record fails, each with the figure
    and the limit it exceeds: ``("gripper_changes", 12, 5.12)`` (the gripper limit in changes: the rate times the
    steps)."""
    figures = {"overall_sigma": (record["overall_sigma"], limits.overall_sigma),
               "gripper_changes": (record["gripper_changes"], limits.gripper_change_rate * record["n_steps"])}
    return [(c, *figures[c]) for c in gate_failures(record["overall_sigma"], record["gripper_changes"],
                                                     record["n_steps"], limits.overall_sigma,
                                                     limits.gripper_change_rate)]


def gate(summary: Summary, overall_sigma: float, change_rate: float) -> bool:
    return not gate_failures(summary.overall_sigma, summary.gripper_changes, summary.n_steps, overall_sigma,
                             change_rate)


def gate_within_noise(summary: Summary, overall_sigma: float, change_rate: float) -> bool | None:
    """Whether a limit of the gate lies inside the interval of the figure it judges: the verdict (pass or fail) is
    then within noise ("fails, but within noise"). None without intervals (too few observations)."""
    if summary.overall_ci is None or summary.gripper_ci is None:
        return None
    changes_lo = summary.n_steps * (1 - summary.gripper_ci[1])
    changes_hi = summary.n_steps * (1 - summary.gripper_ci[0])
    limit = change_rate * summary.n_steps
    return summary.overall_ci[0] <= overall_sigma <= summary.overall_ci[1] or changes_lo <= limit <= changes_hi
