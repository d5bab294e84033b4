"""Exact counts over the 2^N subsets of N values without listing them: meet in the middle.

The sign-flip p and Hartigan's interval (``release/measure/paired.py``) count subsets of the per-observation
differences d: the p those whose sum is at most one bound or at least another, the interval the k-th smallest
subset mean. Listing all 2^N sums stops at N = 20 (8 MB); past it the values are split in two halves, the 2^(N/2)
subset sums of each are listed, and a subset of all N is a pair (one subset of each half). The pairs whose sum
a + b is at most x are counted by sorting one half and searching x - a in it: 2^(N/2) binary searches instead of
2^N sums (at N = 32, 65,536 sums a half: about 2 ms a count on one core).

A subset's mean is at most theta exactly when the sum of d - theta over it is at most 0, so the subsets with a mean
<= theta are such a count on d - theta. The k-th smallest mean: a theta near it is estimated (the means of random
subsets, then counts over every STRIDE-th subset of the first half), the subsets with a mean <= theta are counted
exactly, and the k-th mean is read off the subsets listed next to theta (the pairs whose shifted sum lies in a
window of the sorted half: a subset's shifted sum is its size times its mean's distance to theta, so the window
holds every subset with a mean between theta and the one read off). Where that would list more than LIST_MAX,
theta moves closer (Newton's step on the exact counts, halving a bracket where that stalls) and is counted again.
The result is the exact k-th smallest subset mean, up to the float rounding of one subset's sum and division, as
listing every subset would compute it; the estimates only decide how much work that takes.
"""

from __future__ import annotations

import math
from functools import cache, cached_property
from typing import NamedTuple

import numpy as np

LIST_MAX = 1 << 18  # the most subsets listed at once when the k-th mean is read off
STRIDE = 8  # every STRIDE-th subset of the first half estimates a count
SAMPLE = 1 << 14  # random subsets whose means give a first bracket of the k-th


def subset_sums(values: np.ndarray) -> np.ndarray:
    """The sum of ``values`` over each of their 2^len subsets, the empty one first (bit i of a subset's index: value
    i)."""
    sums = np.zeros(1)
    for v in values:
        sums = np.concatenate([sums, sums + v])
    return sums


@cache
def _sizes(n: int) -> np.ndarray:
    """How many of n values each of their subsets holds (in the order of :func:`subset_sums`)."""
    return subset_sums(np.ones(n))


def _at_most(first: np.ndarray, second: np.ndarray, x: float, strict: bool = False) -> int:
    """How many pairs (a, b) of ``first`` x ``second`` (sorted) have b <= x - a (b < x - a when ``strict``). The
    searches are made in increasing order, which keeps numpy's binary search in cache."""
    return int(np.searchsorted(second, np.sort(x - first), side="left" if strict else "right").sum())


class _Pairs(NamedTuple):
    """The subsets at a theta, as pairs: how many non-empty ones have a mean <= theta, and what lists those near
    that bound (each half's subset sums and sizes in an order: the second half's by their shifted sums, sorted
    ``shifted``; the first half's in ``queries``, their shifted sums negated; ``ends``: for each query how many
    second-half shifted sums are at most it)."""

    counted: int
    shifted: np.ndarray
    queries: np.ndarray
    ends: np.ndarray
    sums: tuple[np.ndarray, np.ndarray]
    sizes: tuple[np.ndarray, np.ndarray]


class Halves:
    """The 2^N subsets of N values as the pairs of a subset of the first N // 2 values and one of the rest."""

    def __init__(self, values: np.ndarray) -> None:
        half = values.size // 2
        self.values = values
        self.sums = (subset_sums(values[:half]), subset_sums(values[half:]))
        self.sizes = (_sizes(half), _sizes(values.size - half))
        self.scale = float(np.abs(values).sum())  # bounds any subset sum: the rounding margins are relative to it

    @property
    def count(self) -> int:
        return 2**self.values.size

    def negated(self) -> Halves:
        """The same subsets of -values (their k-th smallest mean is minus the k-th largest of these)."""
        out = Halves.__new__(Halves)
        out.values, out.sums, out.sizes, out.scale = -self.values, (-self.sums[0], -self.sums[1]), self.sizes, \
            self.scale
        return out

    def outside(self, at_most: float, at_least: float) -> int:
        """How many subsets have a sum <= ``at_most`` or >= ``at_least`` (each counted once where the two meet)."""
        first, second = self.sums[0], np.sort(self.sums[1])
        low = _at_most(first, second, at_most)
        below = _at_most(first, second, at_least, strict=True)
        return low + (self.count - below) - max(0, low - below)

    def kth_smallest_mean(self, k: int) -> float:
        """The k-th smallest of the means of the 2^N - 1 non-empty subsets (1 <= k < 2^N)."""
        span = float(np.ptp(self.values))
        if span == 0:
            return float(self.values[0])
        # (lo, hi]: the k-th mean's bracket, with how many means are <= each end (none below the smallest value)
        lo, below = float(self.values.min()) - span, 0
        hi, upto = float(self.values.max()) + span, self.count - 1
        theta, slope, rows = self._near(k, span)
        last: tuple[float, int] | None = None
        while True:
            at = self._pairs(theta, rows)
            lo, below, hi, upto = (theta, at.counted, hi, upto) if at.counted < k else (lo, below, theta, at.counted)
            value = self._read_off(at, theta, k, slope)
            if value is not None:
                return value
            if hi - lo <= 1e-12 * self.scale:  # a pile of equal means (up to rounding): any one of them is the k-th
                return 0.0 if lo < 0 <= hi else hi
            if last is not None:  # the slope between the last two counts, smaller where they are equal
                slope = abs(at.counted - last[1]) / abs(theta - last[0]) if at.counted != last[1] else slope / 4
            last = theta, at.counted
            step = theta + ((k - at.counted) if at.counted < k else (k - 1 - at.counted)) / slope  # Newton
            theta = step if lo < step < hi else (lo + hi) / 2

    def _read_off(self, at: _Pairs, theta: float, k: int, slope: float) -> float | None:
        """The k-th mean from the means listed next to theta: the need-th above it (the count at theta short of k)
        or the need-th largest at or below it; None when that takes more than LIST_MAX subsets."""
        above = at.counted < k
        need = k - at.counted if above else at.counted - k + 1
        window = 1.25 * need / slope * self.values.size  # a quarter further than the need-th mean is expected
        while True:
            far = np.searchsorted(at.shifted, at.queries + (window if above else -window), side="right")
            first, last = (at.ends, far) if above else (far, at.ends)
            counts = np.maximum(last - first, 0)
            if int(counts.sum()) > LIST_MAX:
                return None
            # the pairs (query q, second-half position p) with first[q] <= p < last[q], the empty subset left out
            p = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - first, counts)
            sizes = np.repeat(at.sizes[0], counts) + at.sizes[1][p]
            means = (np.repeat(at.sums[0], counts) + at.sums[1][p])[sizes > 0] / sizes[sizes > 0]
            if means.size >= need:
                index = need - 1 if above else means.size - need
                value = float(np.partition(means, index)[index])
                # a subset's shifted sum is its size times (its mean - theta): every subset with a mean between
                # theta and value is in the window (with a margin for rounding), so value is the need-th of them all
                if abs(value - theta) * self.values.size < window - 1e-9 * self.scale:
                    return value
            window *= 2

    @cached_property
    def _sample(self) -> np.ndarray:
        """The sorted means of SAMPLE random non-empty subsets. Seeded, so the work is repeatable; no k-th mean
        depends on it."""
        rng = np.random.default_rng(0)
        i, j = rng.integers(0, self.sums[0].size, SAMPLE), rng.integers(0, self.sums[1].size, SAMPLE)
        sizes = self.sizes[0][i] + self.sizes[1][j]
        return np.sort((self.sums[0][i] + self.sums[1][j])[sizes > 0] / sizes[sizes > 0])

    def _near(self, k: int, span: float) -> tuple[float, float, np.ndarray]:
        """A theta with close to k means <= it, how fast that count grows there, and the first half's subsets in the
        order of their shifted sums there, from estimates: the means of random subsets, then the count over every
        STRIDE-th subset of the first half in that order (neighbours count alike) times STRIDE."""
        sample = self._sample
        rank = k / (self.count - 1) * (sample.size - 1)
        reach = 2 * math.sqrt(rank + 1) + 1
        points = {float(sample[min(sample.size - 1, max(0, round(r)))]) for r in (rank - reach, rank + reach)}
        order = np.argsort(self.sums[0] - min(points) * self.sizes[0])
        rows = order[STRIDE // 2::STRIDE]
        sums, sizes = self.sums[0][rows], self.sizes[0][rows]

        def estimate(theta: float) -> float:
            return STRIDE * _at_most(sums - theta * sizes, np.sort(self.sums[1] - theta * self.sizes[1]), 0.0) - 1.0

        seen = {t: estimate(t) for t in points}
        while len(seen) < 4:
            (t1, c1), (t2, c2) = sorted(seen.items(), key=lambda tc: abs(tc[1] - k))[:2] if len(seen) > 1 else \
                (*seen.items(), (float(self.values.max()), self.count - 1.0))
            if c1 == c2 or abs(c1 - k) <= LIST_MAX // 8:
                break
            theta = t1 + (k - c1) * (t2 - t1) / (c2 - c1)
            if theta in seen:
                break
            seen[theta] = estimate(theta)
        (t1, c1), *rest = sorted(seen.items(), key=lambda tc: abs(tc[1] - k))
        slopes = [abs((c - c1) / (t - t1)) for t, c in rest if t != t1 and c != c1]
        return t1, slopes[0] if slopes else (self.count - 1) / span, order[::-1]

    def _pairs(self, theta: float, rows: np.ndarray) -> _Pairs:
        """The pairs with a + b <= 0 on the subset sums of ``values - theta`` (exactly b <= -a in floating point: a
        rounded sum has the sign of the exact one), counted, with what lists the pairs near that bound; ``rows``:
        the first half's subsets in an order that keeps the searches near-sorted (any order counts the same)."""
        first, second = self._shifted(theta)
        order = np.argsort(second)
        shifted, queries = second[order], -first[rows]
        ends = np.searchsorted(shifted, queries, side="right")
        return _Pairs(int(ends.sum()) - 1, shifted, queries, ends, (self.sums[0][rows], self.sums[1][order]),
                      (self.sizes[0][rows], self.sizes[1][order]))

    def _shifted(self, theta: float) -> tuple[np.ndarray, np.ndarray]:
        """Each half's subset sums of ``values - theta``."""
        return self.sums[0] - theta * self.sizes[0], self.sums[1] - theta * self.sizes[1]
