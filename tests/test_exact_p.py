"""Exact sign-flip p-values and Hartigan intervals at every N the tables use (issue 46).

Up to LISTED_MAX_N observations every subset sum is listed; past it, up to EXACT_MAX_N (the p) and
INTERVAL_EXACT_MAX_N (the interval), they are counted by meet-in-the-middle (release/measure/subsets.py); beyond,
random sign patterns, and a Monte Carlo p at its floor is printed as a bound. The brute force here flips signs
one pattern at a time (a sign matrix), independent of the subset sums both exact methods build on.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest

from release.measure.paired import (
    ALPHA,
    EXACT_MAX_N,
    INTERVAL_EXACT_MAX_N,
    LISTED_MAX_N,
    at_floor,
    hartigan,
    paired,
    patterns,
    sign_flip_p,
)
from release.measure.subsets import Halves, subset_sums
from release.measure.tables import _p
from release.publish.card.i18n import Formatter
from tests.conftest import invoke
from tests.test_faults_stats import csv, make_dist


def _signs(n: int, start: int = 0, stop: int | None = None) -> np.ndarray:
    """The sign patterns start..stop of all 2^n ([P, n] of +-1; pattern i flips observation j when bit j of i is
    set)."""
    i = np.arange(start, 2**n if stop is None else stop, dtype=np.int64)[:, None]
    return 1 - 2 * ((i >> np.arange(n)) & 1).astype(np.int8)


def _brute(d: np.ndarray, levels: tuple[float, ...] = ()) -> tuple[float, list[tuple[float, float]]]:
    """The sign-flip p, |sum(s d)| >= |sum(d)| - tol over all 2^N patterns s (tol as the project's: 1e-9 x
    sum |d|), and Hartigan's bounds: the k-th smallest and largest of the flipped subsets' means, k = floor(level /
    2 x 2^N). In blocks of 2^18 patterns."""
    n, observed, tol = d.size, abs(float(d.sum())), 1e-9 * float(np.abs(d).sum())
    hits, means = 0, []
    for start in range(0, 2**n, 1 << 18):
        s = _signs(n, start, min(2**n, start + (1 << 18)))
        hits += int((np.abs(s @ d) >= observed - tol).sum())
        flipped = s < 0
        sizes = flipped.sum(axis=1)
        means.append((flipped @ d)[sizes > 0] / sizes[sizes > 0])
    ordered = np.sort(np.concatenate(means))
    ks = [math.floor(level / 2 * 2**n) for level in levels]
    return hits / 2**n, [(float(ordered[k - 1]), float(ordered[-k])) for k in ks]


def _cases(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    base = rng.gamma(4, 0.25, size=n)
    return {
        "normal": rng.normal(size=n),
        "mse differences": base * rng.gamma(8, 1 / 8, size=n) * 1.2 - base,
        "integers with ties": rng.integers(-2, 3, size=n).astype(float),
        "half zeros": np.where(np.arange(n) % 2 == 0, 0.0, rng.normal(size=n)),
        "one way": rng.uniform(0.1, 1, size=n),
        "all zero": np.zeros(n),
        "two values": np.where(np.arange(n) < n // 3, -1.0, 0.5),
    }


@pytest.mark.parametrize("n", [8, 11, 14])
def test_meet_in_the_middle_counts_as_a_brute_force_enumeration(n: int) -> None:
    """The p's count over the halves, and every k-th smallest subset mean (k = 1 ... 2^N - 1) against the subsets
    flipped one by one, with ties (integers, zeros, two values) that a count by bisection would get wrong."""
    for case, d in _cases(n).items():
        halves = Halves(d)
        total, tol = float(d.sum()), 1e-9 * float(np.abs(d).sum())
        lo, hi = sorted((0.0, total))
        p, _ = _brute(d)
        assert halves.outside(lo + tol, hi - tol) / 2**n == p, case
        sizes = (_signs(n) < 0).sum(axis=1)
        means = np.sort(((_signs(n) < 0) @ d)[sizes > 0] / sizes[sizes > 0])
        ks = range(1, 2**n) if n <= 11 else sorted({1, 2, 3, 50, 2**n // 40, 2**n // 2, 2**n - 2, 2**n - 1})
        got = np.array([halves.kth_smallest_mean(k) for k in ks])
        assert np.allclose(got, means[np.array(list(ks)) - 1], rtol=1e-12, atol=1e-15), case
        largest = -halves.negated().kth_smallest_mean(1)
        assert largest == pytest.approx(means[-1], abs=1e-15), case


def test_the_patterns_say_which_method_counts() -> None:
    """Listed up to 20 observations; past it exact by meet-in-the-middle, the interval up to 28 and the p up to 32;
    beyond, both Monte Carlo, the p with a floor of 1 / (R / 2 + 1)."""
    assert (LISTED_MAX_N, INTERVAL_EXACT_MAX_N, EXACT_MAX_N) == (20, 28, 32)
    r = 1000
    kinds = {n: (patterns(n, r, 0).exact, patterns(n, r, 0).interval_exact, patterns(n, r, 0).floor)
             for n in (20, 21, 28, 29, 32, 33)}
    assert kinds == {20: (True, True, None), 21: (True, True, None), 28: (True, True, None),
                     29: (True, False, None), 32: (True, False, None), 33: (False, False, 1 / 501)}
    assert patterns(20, r, 0).describe() == "exact, all 2^20 sign patterns"
    assert patterns(25, r, 0).describe() == ("exact, all 2^25 sign patterns, counted by meet-in-the-middle over two "
                                             "halves of 12 and 13 observations")
    assert patterns(32, r, 0).describe() == ("p exact, all 2^32 sign patterns, counted by meet-in-the-middle over "
                                             "two halves of 16 and 16 observations; interval Monte Carlo, 500 random "
                                             "sign patterns and their mirror images")
    assert patterns(33, r, 0).describe() == "Monte Carlo, 500 random sign patterns and their mirror images"


def test_paired_past_the_listed_limit_is_the_listed_computation() -> None:
    """At N = 21 (meet-in-the-middle) paired gives what listing all 2^21 subset sums gives: the same p and bounds."""
    rng = np.random.default_rng(21)
    baseline = rng.gamma(4, 0.25, size=21)
    build = baseline * rng.gamma(8, 1 / 8, size=21) * 1.15
    d = build - baseline
    pats = patterns(21, 100, 0)
    got = paired(build, baseline, pats, comparisons=5, level=0.02)
    sums = subset_sums(d)  # what paired lists up to LISTED_MAX_N
    tol, (lo, hi) = 1e-9 * float(np.abs(d).sum()), sorted((0.0, float(d.sum())))
    assert got.p == ((sums <= lo + tol) | (sums >= hi - tol)).mean()
    assert got.p_exact and got.ci_exact and got.p_floor is None
    a = float(baseline.mean())
    listed = [math.sqrt(a + theta) - math.sqrt(a) for bound in hartigan(sums, pats, (ALPHA, 0.02)) for theta in bound]
    assert np.allclose([*got.ci, *got.ci_corrected], listed, rtol=1e-12, atol=1e-15)


def test_a_monte_carlo_p_says_so_and_at_its_floor_is_a_bound(tmp_path: Path) -> None:
    """N = 36 > EXACT_MAX_N: sq_auto's error is half RTN's on every observation, so no random pattern reaches it and
    its p sits at the floor 1 / (R / 2 + 1): tables.json says Monte Carlo and the floor, the CSV prints "<= p" (the
    Holm-adjusted p, rounded up), a card "≤ p". At N = 32 the same p is exact (2 / 2^32) and printed as a number,
    the interval Monte Carlo."""
    resamples = 500
    floor = 1 / (resamples // 2 + 1)
    for n, exact in ((EXACT_MAX_N + 4, False), (EXACT_MAX_N, True)):
        dist = make_dist(tmp_path / str(n), n=n)
        result = invoke("tables", "--dist", dist, "--resamples", str(resamples))
        assert result.exit_code == 0, result.output
        doc = json.loads((dist / "tables" / "tables.json").read_text())
        sq = next(r for r in doc["records"] if r["build"] == "sq_auto")
        assert (sq["diff_p_exact"], sq["diff_ci_exact"]) == (exact, False)
        cell = csv(dist, "ranking").set_index("build").loc[sq["title"], "p (sign-flip, Holm-adjusted)"]
        if exact:
            assert sq["diff_p_floor"] is None and sq["diff_p"] == 2 / 2**n and sq["diff_p_corrected"] == 4 / 2**n
            assert cell == "0.00000000093"  # 4 / 2^32 = 9.3e-10, two significant digits, no "0"
            assert not at_floor(sq["diff_p"], sq["diff_p_floor"])
        else:
            assert sq["diff_p_floor"] == floor and sq["diff_p"] == floor and sq["diff_p_corrected"] == 2 * floor
            assert cell == "<= 0.008" and 2 * floor <= 0.008  # 2 / 251 = 0.00797..., rounded up
            assert Formatter("en").p(sq["diff_p_corrected"], at_most=True) == "≤ 0.008"
        family = next(f for f in doc["method"]["families"] if f["split"] == "validation")
        assert family["patterns"] == patterns(n, resamples, 0).describe()


def test_the_csv_cell_of_a_p() -> None:
    """A Monte Carlo p at its floor is a bound, rounded up so that it stays one; any other p is rounded."""
    record = {"comparisons": 3, "diff_p": 1 / 5001, "diff_p_floor": 1 / 5001, "diff_p_corrected": 3 / 5001}
    assert _p(record) == "<= 0.0006"
    assert _p({**record, "diff_p": 0.00144, "diff_p_floor": 0.00144, "diff_p_corrected": 0.00432}) == "<= 0.0044"
    assert _p({**record, "diff_p": 0.00144, "diff_p_floor": 0.0001, "diff_p_corrected": 0.00432}) == "0.0043"
    assert _p({**record, "diff_p": 2 / 5001, "diff_p_corrected": 6 / 5001}) == "0.0012"  # above the floor
    assert _p({**record, "diff_p_floor": None, "diff_p": 2 / 2**20, "diff_p_corrected": 6 / 2**20}) == "0.0000057"
    assert _p({**record, "diff_p_corrected": None}) == "too few observations"


@pytest.mark.slow
def test_exact_p_and_interval_at_22_against_all_sign_patterns() -> None:
    """N = 22: the meet-in-the-middle p and Hartigan bounds (plain and at 0.05 / 21) against all 2^22 sign patterns
    flipped one by one, on per-observation differences of mean squared error and on integer ones with ties."""
    rng = np.random.default_rng(22)
    for scale in (1.0, 1.3):
        baseline = rng.gamma(4, 0.25, size=22)
        for build in (baseline * rng.gamma(8, 1 / 8, size=22) * scale,
                      baseline + rng.integers(-2, 3, size=22) / 8):
            d = build - baseline
            pats = patterns(22, 100, 0)
            assert pats.exact and pats.interval_exact and pats.flipped is None
            got = paired(build, baseline, pats, comparisons=21)
            p, bounds = _brute(d, (ALPHA, ALPHA / 21))
            assert got.p == p == sign_flip_p(build, baseline, pats)
            a = float(baseline.mean())
            rms = [(math.sqrt(a + lo) - math.sqrt(a), math.sqrt(a + hi) - math.sqrt(a)) for lo, hi in bounds]
            assert np.allclose([*got.ci, *got.ci_corrected], [*rms[0], *rms[1]], rtol=1e-12, atol=1e-15)


def test_hand_count_at_n_6() -> None:
    """The brute force itself, against itertools at N = 6."""
    d = np.array([0.3, -1.0, 2.0, 0.0, -0.5, 1.5])
    flips = [abs(sum(s * x for s, x in zip(signs, d, strict=True))) for signs in itertools.product((1, -1), repeat=6)]
    assert _brute(d)[0] == sum(f >= abs(d.sum()) - 1e-9 * np.abs(d).sum() for f in flips) / 64
