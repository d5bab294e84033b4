"""Calibration of the statistics of ``release tables`` by simulation under the null (issue 31), at the seed card's
sizes: 10, 16 and 32 observations, 21 builds compared with one baseline.

The model: observation i has a common difficulty f_i ~ gamma(4, 1/4); each build's and the baseline's mean squared
error on it is f_i x e, e ~ gamma(8, 1/8) independent (true mean squared error 1 for every build). The builds and
the baseline are exchangeable within each observation: every null hypothesis is true, and the 21 comparisons share
the baseline (they are correlated, as on a card).

(a) The family-wise error of the sign-flip test with Holm's correction (a false "lower"/"higher" anywhere among the
    21) must be at most 0.05 + 2 Monte Carlo standard errors (at 0.05 with 2,000 simulations: 0.0049, so 0.0597).
    Measured: 0.029, 0.0455, 0.0305 at N = 10, 16, 32 (conservative: the builds share the baseline).
(b) The studentized interval of a build's overall error covers the true one, 1, in at least 94% - 2 Monte Carlo
    standard errors (2 x 0.0049 at 95%: 93.0%) of 2,000 light-tailed samples (gamma(4, 1/4), the "light" row of
    bench/interval_coverage.py). Measured with the seeds below (the first ones tried): 94.4%, 94.85%, 95.55% at
    N = 10, 16, 32; the benchmark's 1,000 simulations (other seeds) gave 94.4%, 93.6%, 94.0%. The method covers
    about 94%, not 95%, at these N, and a bound of 94% flat would pass or fail with the seed: hence the allowance.
    The percentile bootstrap on the same samples covers 89.0%, 91.5%, 94.0%, and is checked to fail at N = 10
    and 16.
(c) The check has power: the method it replaced (a percentile bootstrap of the RMS difference, p = 2 x the smaller
    tail, at least 2 / R, times m = 21) fails (a) on the first 500 of the same families: measured 0.296, 0.202,
    0.126 at N = 10, 16, 32 (issue 31 measured 0.19 at N = 16), each above the bound by more than 2 of its own
    Monte Carlo standard errors.

Sign patterns at N = 32 are random ones here (the Monte Carlo test a card uses beyond EXACT_MAX_N; its own N = 32 is
exact, which the simulation would need 2^16 x 2,100 subset sums a block for), 2,000 of them, and so are the bootstrap
resamples (the card uses 10,000; 2,000 is above min_resamples(21) = 838). Every draw is seeded: the test is
deterministic.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np
import pytest

from release.measure.paired import ALPHA, LISTED_MAX_N, Patterns, holm, min_resamples, paired, patterns
from release.measure.stats import observation_counts, studentized_rms_interval

BUILDS = 21
SIMS = 2000
RESAMPLES = 2000
BLOCK = 100  # simulations drawn (and bootstrap counts renewed) at once
OLD_SIMS = 500  # the first simulations, on which the replaced method is run too
SE = math.sqrt(0.05 * 0.95 / SIMS)  # Monte Carlo standard error of a rate of 0.05 (or of a coverage of 0.95)
NS = (10, 16, 32)


def _subset_sums(d: np.ndarray) -> np.ndarray:
    """[2^n, K]: the sums of every subset of the rows of ``d`` [n, K]."""
    sums = np.zeros((1, d.shape[1]))
    for row in d:
        sums = np.concatenate([sums, sums + row])
    return sums


def _sign_flip_p(d: np.ndarray, pats: Patterns) -> np.ndarray:
    """Sign-flip p of each column of ``d`` [N, K], vectorised. Flipping the subset S turns sum(d) into
    total - 2 S, and |total - 2 S| >= |total| exactly when S <= min(0, total) or S >= max(0, total). Exact (all 2^N
    subsets): the subset sums are split into two halves (2^(N/2) each) and the pairs on either side are counted by
    a binary search; Monte Carlo: the drawn subsets and their mirror images, p = (b / 2 + 1) / (R / 2 + 1)."""
    total = d.sum(axis=0)
    tol = 1e-9 * np.abs(d).sum(axis=0)
    lo, hi = np.minimum(0, total) + tol, np.maximum(0, total) - tol
    if not pats.exact:
        assert pats.flipped is not None
        sums = pats.flipped @ d
        return (((sums <= lo) | (sums >= hi)).sum(axis=0) / 2 + 1) / (pats.count // 2 + 1)
    half = d.shape[0] // 2
    first, second = _subset_sums(d[:half]), np.sort(_subset_sums(d[half:]), axis=0)
    hits = np.empty(d.shape[1])
    for k in range(d.shape[1]):
        if hi[k] <= lo[k]:  # total = 0: every pattern is as extreme
            hits[k] = pats.count
            continue
        below = np.searchsorted(second[:, k], lo[k] - first[:, k], side="right").sum()
        above = second.shape[0] * first.shape[0] - np.searchsorted(second[:, k], hi[k] - first[:, k]).sum()
        hits[k] = below + above
    return hits / pats.count


def _old_p(mse: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The replaced method, for ``mse`` [sims, N, 1 + builds] (the baseline first): the percentile bootstrap of
    sqrt(mean(build)) - sqrt(mean(baseline)) over observations, p = 2 x the smaller tail share, at least 2 / R.
    Returns [sims, builds]."""
    sims, n, cols = mse.shape
    r = counts.shape[0]
    means = (counts @ mse.transpose(1, 0, 2).reshape(n, -1)).reshape(r, sims, cols)  # [R, sims, cols]
    build, base = means[..., 1:], means[..., :1]  # the RMS difference has the sign of the difference of the means
    p = 2 * np.minimum((build <= base).sum(axis=0), (build >= base).sum(axis=0)) / r
    return np.where(p == 0, 2 / r, p)


@cache
def _family_errors(n: int) -> tuple[float, float]:
    """Share of simulated null families with a false rejection: Holm's sign-flip (SIMS families), the old method
    x m (the first OLD_SIMS of them)."""
    rng = np.random.default_rng(1000 + n)
    pats = patterns(n, RESAMPLES, 7, exact_max_n=LISTED_MAX_N)
    new = old = 0
    for block in range(SIMS // BLOCK):
        counts = observation_counts(n, RESAMPLES, 100 * n + block)
        f = rng.gamma(4, 1 / 4, size=(BLOCK, n, 1))
        mse = f * rng.gamma(8, 1 / 8, size=(BLOCK, n, BUILDS + 1))
        d = (mse[..., 1:] - mse[..., :1]).transpose(1, 0, 2).reshape(n, -1)  # [N, sims x builds]
        ps = _sign_flip_p(d, pats).reshape(BLOCK, BUILDS)
        if block == 0:  # the vectorised p is the project's
            base, builds = mse[0, :, 0], mse[0, :, 1:]
            assert ps[0].tolist() == pytest.approx([paired(b, base, pats, BUILDS).p for b in builds.T], abs=1e-12)
        for p in ps:
            adjusted = holm([float(v) for v in p])
            new += min(a for a in adjusted if a is not None) < ALPHA
        if block < OLD_SIMS // BLOCK:
            old += int((np.minimum(1.0, BUILDS * _old_p(mse, counts)) < ALPHA).any(axis=1).sum())
    return new / SIMS, old / OLD_SIMS


@pytest.mark.parametrize("n", NS)
def test_holm_sign_flip_controls_the_family_wise_error(n: int) -> None:
    assert RESAMPLES >= min_resamples(BUILDS)
    new, _ = _family_errors(n)
    assert new <= ALPHA + 2 * SE, new


@pytest.mark.parametrize("n", NS)
def test_the_replaced_method_fails_the_same_check(n: int) -> None:
    """The calibration check has power: the percentile bootstrap x m rejects a true null far too often (by more than
    2 of its own Monte Carlo standard errors)."""
    new, old = _family_errors(n)
    assert old - 2 * math.sqrt(old * (1 - old) / OLD_SIMS) > ALPHA + 2 * SE, old
    assert old > 2 * new


@cache
def _coverage(n: int) -> tuple[float, float]:
    """Coverage of sqrt(E[mse]) = 1 by the studentized interval and by the percentile bootstrap, light tails."""
    rng = np.random.default_rng(2000 + n)
    studentized = percentile = 0
    for block in range(SIMS // BLOCK):
        counts = observation_counts(n, RESAMPLES, 10_000 + 100 * n + block)
        x = rng.gamma(4, 1 / 4, size=(BLOCK, n))
        for sample in x:
            lo, hi = studentized_rms_interval(sample, counts)
            studentized += lo <= 1.0 <= hi
        lo_p, hi_p = np.percentile(np.sqrt(counts @ x.T / n), [2.5, 97.5], axis=0)
        percentile += int(((lo_p <= 1.0) & (1.0 <= hi_p)).sum())
    return studentized / SIMS, percentile / SIMS


@pytest.mark.parametrize("n", NS)
def test_studentized_interval_covers_the_true_error(n: int) -> None:
    covered, _ = _coverage(n)
    assert covered >= 0.94 - 2 * SE, covered


@pytest.mark.parametrize("n", NS[:2])
def test_the_percentile_interval_fails_the_same_check(n: int) -> None:
    _, covered = _coverage(n)
    assert covered < 0.94 - 2 * SE, covered
