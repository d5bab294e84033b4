"""Paired comparisons of a build with the baseline at 10-48 observations: a sign-flip test (exact up to EXACT_MAX_N
observations, Monte Carlo beyond), the interval that inverts it, Holm's step-down over a family, and the verdict a
card may state.

Why these: the observation is the unit (rows of one observation, its noise seeds, are averaged first), and under
the null hypothesis "the build and the baseline are exchangeable within each observation" swapping the two in any
observation changes nothing. The overall error is an RMS, and a swap keeps the sum of both builds' mean squared
errors, so the RMS difference is a monotone function of ``sum(d)``, with ``d`` the per-observation differences of
mean squared error: the sign-flip test on ``d`` is the exact randomization test of the RMS difference. A percentile
bootstrap rejected a true null 7-14% of the time at N = 10-32 (issue 31); this test's error rate is at most its
level by construction, and ``tests/test_calibration.py`` checks it by simulation.

The interval is Hartigan's (1969): among the means of the 2^N - 1 non-empty subsets of ``d``, the k-th smallest
and largest bound the centre of a symmetric distribution with probability exactly 1 - 2k / 2^N. It is mapped to the
RMS scale at the baseline's error: ``sqrt(A + theta) - sqrt(A)``, which is 0 at theta = 0, so it excludes a zero
difference when it excludes theta = 0.

Exact means over all 2^N sign patterns: the 2^N subset sums are listed up to LISTED_MAX_N = 20 (8 MB), and past it
counted by meet-in-the-middle over two halves of the observations (``release/measure/subsets.py``: at N = 32, 2^16
sums a half instead of 2^32). The p is exact up to EXACT_MAX_N = 32 observations (a count: 4 ms at N = 32, 0.1 s
at 40), the interval up to INTERVAL_EXACT_MAX_N = 28 (the k-th of 2^N means takes counts and a listing near it:
11 ms for a build's four bounds at N = 28, 60 ms at N = 32, where 22 builds would take 1.4 s of the two seconds
``release tables`` is given). Beyond, they are Monte Carlo: R random subsets (R / 2 drawn and their mirror
images), the p (b + 1) / (R / 2 + 1), never below its floor 1 / (R / 2 + 1) (:attr:`Patterns.floor`: a p there
says only "at most that"), and the interval's coverage holds with 2^N replaced by R + 1.

Where both are exact (N <= 28) or both Monte Carlo on the same patterns (N > 32), the interval at a level excludes
zero exactly when the p is at most that level, save where a subset sum lies within the p's tie tolerance (1e-9 of
sum |d|) of 0 or of the total without being 0 or the total (the p counts such a sum as a tie, the interval by its
sign). At 28 < N <= 32 the exact p and the Monte Carlo interval can disagree where the p is near the level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from release.measure.subsets import Halves, subset_sums

ALPHA = 0.05
LISTED_MAX_N = 20  # every one of the 2^N subset sums listed up to here (2^20 of them: 8 MB)
EXACT_MAX_N = 32  # the p over all 2^N sign patterns up to here (past LISTED_MAX_N by meet-in-the-middle)
INTERVAL_EXACT_MAX_N = 28  # Hartigan's interval over all of them up to here; both over random ones beyond
TEST = "sign-flip"
CORRECTION = "holm"


def min_observations(comparisons: int = 1) -> int:
    """The fewest observations for which an interval or p-value is given, at level ALPHA / comparisons.

    The smallest p an exact sign-flip test can give N observations is 2 / 2^N (all N pointing the same way), and
    Hartigan's interval at level a needs 2^N >= 2 / a: both reach the (Bonferroni) level ALPHA / m from
    N >= 1 + log2(m / ALPHA) on: 6 observations for one comparison, 10 for the seed card's 21.
    """
    return 1 + math.ceil(math.log2(max(1, comparisons) / ALPHA))


def min_resamples(comparisons: int) -> int:
    """The fewest random sign patterns (R: R / 2 draws and their mirror images) with which a Monte Carlo p
    ((b + 1) / (R / 2 + 1)) and Hartigan's interval can reach the corrected level ALPHA / m: R / 2 + 1 >= m / ALPHA."""
    return 2 * (math.ceil(max(1, comparisons) / ALPHA) - 1)


@dataclass(frozen=True)
class Patterns:
    """Which subsets of the observations the test and the interval flip. ``exact``: the p takes every one of the
    2^N (their sums listed directly, without a matrix, or past LISTED_MAX_N counted by meet-in-the-middle), else the
    random ones of ``flipped`` [R, N] (0/1). The interval takes the random ones whenever they are drawn (past
    INTERVAL_EXACT_MAX_N), else all 2^N.

    Random patterns come in mirror pairs (a subset and its complement), as all 2^N do: flipping a subset or its
    complement gives the same |statistic|, and a subset's sum is <= 0 exactly when its complement's is >= the total.
    So the p and Hartigan's interval count the same events, and the interval at a level excludes zero exactly when
    the test rejects at it where both take the same patterns (the module's docstring says when they do not)."""

    n: int
    exact: bool
    flipped: np.ndarray | None

    @property
    def count(self) -> int:
        """How many patterns the p counts over."""
        return 2**self.n if self.exact else int(self.flipped.shape[0])  # type: ignore[union-attr]

    @property
    def interval_exact(self) -> bool:
        return self.flipped is None

    @property
    def floor(self) -> float | None:
        """The smallest p the Monte Carlo test gives, 1 / (R / 2 + 1) (a p there is at most that, no closer); None
        when exact."""
        return None if self.exact else 1 / (self.count // 2 + 1)

    def describe(self) -> str:
        sampled = "" if self.flipped is None else \
            f"Monte Carlo, {self.flipped.shape[0] // 2:,} random sign patterns and their mirror images"
        if not self.exact:
            return sampled
        counted = f"exact, all 2^{self.n} sign patterns" + ("" if self.n <= LISTED_MAX_N else
                                                          f", counted by meet-in-the-middle over two halves of "
                                                          f"{self.n // 2} and {self.n - self.n // 2} observations")
        return counted if self.flipped is None else f"p {counted}; interval {sampled}"

    @cached_property
    def sizes(self) -> np.ndarray:
        """How many observations each subset the interval lists holds."""
        return subset_sums(np.ones(self.n)) if self.flipped is None else self.flipped.sum(axis=1)

    def subset_sums(self, values: np.ndarray, interval: bool = False) -> np.ndarray | Halves:
        """The sum of ``values`` over each subset the p (or with ``interval`` the interval) takes: listed (all 2^N,
        the empty one first; or the drawn ones), or past LISTED_MAX_N as the pairs of the two halves' subsets."""
        if self.flipped is not None and (interval or not self.exact):
            return self.flipped @ values
        return subset_sums(values) if self.n <= LISTED_MAX_N else Halves(values)


def patterns(n: int, resamples: int, seed: int, exact_max_n: int = EXACT_MAX_N) -> Patterns:
    """All 2^n sign patterns for the p up to ``exact_max_n`` observations, for the interval up to
    INTERVAL_EXACT_MAX_N (or ``exact_max_n`` if lower); beyond, ``resamples`` random ones (half of them drawn, half
    their mirror images). ``exact_max_n`` below EXACT_MAX_N: the Monte Carlo test where an exact one would run (a
    simulation of many data sets checks it at N = 32 in ``tests/test_calibration.py``)."""
    if n <= min(exact_max_n, INTERVAL_EXACT_MAX_N):
        return Patterns(n, True, None)
    drawn = np.random.default_rng(seed).integers(0, 2, size=(max(1, resamples // 2), n)).astype(np.float64)
    return Patterns(n, n <= exact_max_n, np.concatenate([drawn, 1 - drawn]))


@dataclass(frozen=True)
class Paired:
    """The build's RMS error minus the baseline's, its sign-flip p and Hartigan intervals (plain, and at a corrected
    level: Holm's for the build in ``release tables``). None below :func:`min_observations` (m)."""

    diff: float
    ci: tuple[float, float] | None
    ci_corrected: tuple[float, float] | None
    p: float | None
    comparisons: int
    too_few_observations: bool
    p_exact: bool  # the p over all 2^N sign patterns, else random ones
    p_floor: float | None  # Monte Carlo: the smallest p it gives (a p there is at most that)
    ci_exact: bool  # the intervals over all 2^N sign patterns, else random ones


def per_observation_mse(sq_err: np.ndarray, obs_ids: np.ndarray, per_row: int) -> np.ndarray:
    """Mean squared error of each observation (its rows, the noise seeds, averaged), in order of first appearance."""
    _, first, inverse = np.unique(obs_ids, return_index=True, return_inverse=True)
    sums = np.bincount(inverse.reshape(-1), weights=sq_err)
    rows = np.bincount(inverse.reshape(-1))
    order = np.argsort(first, kind="stable")
    return (sums / (rows * per_row))[order]


def _sign_flip(d: np.ndarray, pats: Patterns) -> tuple[np.ndarray | Halves, float]:
    """The subset sums of ``d`` and the two-sided sign-flip p of sum(d)."""
    sums = pats.subset_sums(d)
    total = float(d.sum())
    # |sum(s * d)| = |total - 2 x (the flipped subset's sum)| >= |total| exactly when that sum is <= 0 or >= total
    # (signs swapped when total < 0); tol keeps float ties (a build equal to the baseline: d = 0) ties
    tol = 1e-9 * float(np.abs(d).sum())
    lo, hi = sorted((0.0, total))
    # the observed pattern among them when exact
    hits = sums.outside(lo + tol, hi - tol) if isinstance(sums, Halves) else \
        int(((sums <= lo + tol) | (sums >= hi - tol)).sum())
    return sums, min(1.0, hits / pats.count if pats.exact else (hits / 2 + 1) / (pats.count // 2 + 1))


def sign_flip_p(build: np.ndarray, baseline: np.ndarray, pats: Patterns) -> float:
    """The exact (or Monte Carlo: ``pats.exact`` says which) sign-flip p of a build's per-observation mean squared
    errors against the baseline's."""
    return _sign_flip(build - baseline, pats)[1]


def at_floor(p: float | None, floor: float | None) -> bool:
    """Whether a Monte Carlo p (its ``floor`` not None) sits at its floor: no random pattern reached the observed
    sum, and all that is known of the exact p is that it is at most that (a table prints "<= p")."""
    return p is not None and floor is not None and p <= floor


def paired(build: np.ndarray, baseline: np.ndarray, pats: Patterns, comparisons: int = 1,
           level: float | None = None) -> Paired:
    """``build``, ``baseline``: per-observation mean squared errors [N] of the same observations in one order.
    ``ci_corrected`` is at ``level`` (default the Bonferroni level ALPHA / comparisons; :func:`holm_levels` gives
    the level at which Holm's procedure tests each build)."""
    m = max(1, comparisons)
    a = float(baseline.mean())
    d = build - baseline
    diff = math.sqrt(max(a + float(d.mean()), 0.0)) - math.sqrt(a)
    if d.size < min_observations(m):
        return Paired(diff, None, None, None, m, True, pats.exact, pats.floor, pats.interval_exact)
    sums, p = _sign_flip(d, pats)
    if pats.exact and not pats.interval_exact:
        sums = pats.subset_sums(d, interval=True)
    plain, corrected = hartigan(sums, pats, (ALPHA, ALPHA / m if level is None else level))

    def rms(theta: float) -> float:
        return math.sqrt(max(a + theta, 0.0)) - math.sqrt(a)

    return Paired(diff, (rms(plain[0]), rms(plain[1])), (rms(corrected[0]), rms(corrected[1])), p, m, False,
                  pats.exact, pats.floor, pats.interval_exact)


def without_each_group(build: np.ndarray, baseline: np.ndarray, groups: np.ndarray) -> tuple[float, float] | None:
    """The range of the RMS difference over the data with each group's observations (a lab's) left out: how much one
    cluster moves it. None with fewer than two groups."""
    names = np.unique(groups)
    if names.size < 2:
        return None
    diffs = [math.sqrt(float(build[keep].mean())) - math.sqrt(float(baseline[keep].mean()))
             for keep in (groups != g for g in names)]
    return (min(diffs), max(diffs))


def hartigan(sums: np.ndarray | Halves, pats: Patterns, levels: tuple[float, ...]) -> list[tuple[float, float]]:
    """Hartigan's interval for the centre of the values whose subset sums are ``sums`` (``pats.subset_sums(d,
    interval=True)``), at each two-sided level: the k-th smallest and largest subset mean: k = floor(level / 2 x 2^N)
    when exact (Hartigan's), floor(level x (pairs + 1)) with random mirror pairs, as the p counts them. Past
    LISTED_MAX_N (``sums`` as two halves) each is found by counting, not listing: the same exact k-th mean."""
    pairs = 2 ** (pats.n - 1) if pats.interval_exact else pats.sizes.size // 2 + 1
    ks = [max(1, math.floor(level * pairs)) for level in levels]
    if isinstance(sums, Halves):
        negated = sums.negated()
        return [(sums.kth_smallest_mean(k), -negated.kth_smallest_mean(k)) for k in ks]
    if pats.interval_exact:  # every subset once, the empty one first
        means = sums[1:] / pats.sizes[1:]
    else:
        keep = pats.sizes > 0
        means = sums[keep] / pats.sizes[keep]
    at = sorted({i for k in ks for i in (k - 1, means.size - k)})
    ordered = dict(zip(at, np.partition(means, at)[at], strict=True))
    return [(float(ordered[k - 1]), float(ordered[means.size - k])) for k in ks]


def holm(ps: list[float | None]) -> list[float | None]:
    """Holm's step-down adjusted p-values (None stays None; the family is the p-values given)."""
    known = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out: list[float | None] = [None] * len(ps)
    running = 0.0
    for rank, (p, i) in enumerate(known):
        running = max(running, min(1.0, (len(known) - rank) * p))
        out[i] = running
    return out


def holm_levels(ps: list[float | None]) -> list[float | None]:
    """The level at which Holm's step-down procedure tests each p: ALPHA / m for the smallest, ALPHA / (m - 1) for
    the next, ... until the first p above its level; that one and every larger p keep that level. An interval at a
    build's level excludes zero exactly when Holm rejects it (where the p and the interval take the same patterns:
    not at 28 < N <= 32), so a card's "lower" never sits beside an interval that holds zero (the Bonferroni level
    ALPHA / m would be wider for all but the first)."""
    known = sorted((p, i) for i, p in enumerate(ps) if p is not None)
    out: list[float | None] = [None] * len(ps)
    stopped: float | None = None
    for rank, (p, i) in enumerate(known):
        level = stopped if stopped is not None else ALPHA / (len(known) - rank)
        if stopped is None and p > level:
            stopped = level
        out[i] = level
    return out


VERDICTS = ("lower", "higher", "not shown")


def verdict(diff: float, ci_corrected: tuple[float, float] | None, p_adjusted: float | None) -> str | None:
    """What a card may say of a build against the baseline: "lower"/"higher" when Holm's adjusted p is below ALPHA,
    else "not shown". Whether the difference is also inside the practical margin is :func:`within_margin`, stated
    beside it: a significant difference is never hidden by the margin. None: too few observations."""
    if ci_corrected is None or p_adjusted is None:
        return None
    if p_adjusted < ALPHA and diff != 0:
        return "lower" if diff < 0 else "higher"
    return "not shown"


def within_margin(ci_corrected: tuple[float, float] | None, margin: float | None) -> bool | None:
    """Whether the Holm-level interval lies inside +-``margin`` (the difference is then too small to matter, whether
    or not it is significant). None when there is no margin or no interval."""
    if ci_corrected is None or margin is None:
        return None
    return -margin < ci_corrected[0] and ci_corrected[1] < margin


def non_inferior(ci_corrected: tuple[float, float] | None, margin: float | None) -> bool | None:
    """Whether the build is shown no worse than the baseline by more than ``margin``: the upper bound of its
    Holm-level interval is below it. None when there is no margin or no interval."""
    if ci_corrected is None or margin is None:
        return None
    return ci_corrected[1] < margin
