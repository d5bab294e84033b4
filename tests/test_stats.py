"""Statistics against independent computations (scipy, the closed-form Wilson interval, hand enumerations of sign
patterns and subsets, explicit resampling loops) and the seed card."""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
from scipy import stats as sps

from release.measure.paired import (
    ALPHA,
    EXACT_MAX_N,
    hartigan,
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
)
from release.measure.stats import (
    PerObservation,
    Summary,
    attribution,
    by_observation,
    gate,
    gate_within_noise,
    gripper_interval,
    observation_counts,
    overall,
    per_observation,
    ratio,
    resample_counts,
    resample_indices,
    studentized_rms_interval,
    summarize,
    wilson,
)


@pytest.mark.parametrize("agree, total, expected", [
    (1020, 1024, (99.61, 99.00, 99.85)),  # the seed card's SQ auto-alpha row
    (1012, 1024, (98.83, 97.96, 99.33)),  # the seed card's served RTN row
])
def test_wilson_reproduces_the_seed(agree: int, total: int, expected: tuple[float, float, float]) -> None:
    lo, hi = wilson(agree, total)
    assert (round(agree / total * 100, 2), round(lo * 100, 2), round(hi * 100, 2)) == expected


def test_wilson_against_the_quadratic_it_solves() -> None:
    # independent closed form: solve p from |p_hat - p| = z sqrt(p (1 - p) / n)
    for k, n in [(0, 50), (7, 50), (50, 50), (300, 1024)]:
        z = sps.norm.ppf(0.975)
        a, b, c = 1 + z * z / n, -(2 * k / n + z * z / n), (k / n) ** 2
        roots = sorted(np.roots([a, b, c]).real)
        lo, hi = wilson(k, n)
        assert lo == pytest.approx(max(0.0, roots[0]), abs=1e-9) and hi == pytest.approx(min(1.0, roots[1]), abs=1e-9)


def _data(seed: int, n: int = 32, scale: float = 0.05) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=(n, 32, 8))
    ref[..., 7] = rng.uniform(0, 1, size=(n, 32))
    cand = ref + rng.normal(scale=scale, size=ref.shape) * rng.uniform(0.5, 2, size=(n, 1, 1))
    return ref, cand, np.abs(rng.normal(size=8)) + 0.5


def _mse(po: PerObservation) -> np.ndarray:
    return per_observation_mse(po.sq_err, po.obs_ids, po.steps * po.dims)


def test_metrics_by_definition() -> None:
    ref, cand, sigma = _data(1)
    po = per_observation(ref, cand, sigma)
    s = summarize(po, observation_counts(po.observations, 1000, 0))
    e = (cand - ref) / sigma
    assert s.overall_sigma == pytest.approx(math.sqrt((e**2).mean()))
    assert s.joint_mae_deg == pytest.approx(np.degrees(np.abs(cand - ref)[..., :7]).mean())
    assert s.snr_db == pytest.approx(10 * math.log10(((ref / sigma) ** 2).sum() / (e**2).sum()))
    agree = ((cand[..., 7] >= 0.5) == (ref[..., 7] >= 0.5)).sum()
    assert s.gripper_changes == 32 * 32 - agree and s.gripper_agree == pytest.approx(agree / 1024)
    assert s.element_err_p95 == pytest.approx(np.percentile(np.abs(e), 95))
    assert s.obs_max_err_p95 == pytest.approx(np.percentile(np.abs(e).reshape(32, -1).max(axis=1), 95))
    assert gate(s, 1.0, 1.0) and not gate(s, s.overall_sigma / 2, 1.0)
    assert s.overall_ci is not None and s.overall_ci[0] < s.overall_sigma < s.overall_ci[1]


def _bootstrap_t_by_loop(x: np.ndarray, idx: np.ndarray) -> tuple[float, float]:
    """The studentized bootstrap of log(mean(x)), one explicit resample at a time, mapped to sqrt(mean)."""
    n = x.size
    se = x.std(ddof=1) / math.sqrt(n) / x.mean()
    ts = []
    for draw in idx:
        xs = x[draw]
        ts.append((math.log(xs.mean()) - math.log(x.mean())) / (xs.std(ddof=1) / math.sqrt(n) / xs.mean()))
    lo_q, hi_q = np.percentile(ts, [2.5, 97.5])
    return math.sqrt(x.mean() * math.exp(-hi_q * se)), math.sqrt(x.mean() * math.exp(-lo_q * se))


def test_studentized_interval_against_explicit_resampling() -> None:
    """summarize's overall interval is the bootstrap-t of log(mean squared error) over observations: the same draws
    resampled one at a time give the same bounds."""
    ref, cand, sigma = _data(2)
    po = per_observation(ref, cand, sigma)
    counts = observation_counts(32, 2000, 0)
    ours = summarize(po, counts).overall_ci
    theirs = _bootstrap_t_by_loop(_mse(po), resample_indices(32, 2000, 0))
    assert ours == pytest.approx(theirs, rel=1e-9)
    assert ours == studentized_rms_interval(_mse(po), counts)


def test_studentized_interval_is_scale_equivariant_and_asymptotically_normal() -> None:
    rng = np.random.default_rng(3)
    x = rng.gamma(4, 1 / 4, size=16)
    counts = observation_counts(16, 4000, 1)
    lo, hi = studentized_rms_interval(x, counts)
    assert lo < math.sqrt(x.mean()) < hi
    assert studentized_rms_interval(9 * x, counts) == pytest.approx((3 * lo, 3 * hi))
    # many observations: the delta-method normal interval of log(mean), mapped to sqrt(mean)
    big = rng.gamma(4, 1 / 4, size=4000)
    se = big.std(ddof=1) / math.sqrt(big.size) / big.mean()
    normal = [math.sqrt(big.mean() * math.exp(z * se)) for z in sps.norm.ppf([0.025, 0.975])]
    assert studentized_rms_interval(big, observation_counts(4000, 2000, 2)) == pytest.approx(normal, rel=2e-3)
    # no spread: the interval is the point
    assert studentized_rms_interval(np.full(8, 0.25), observation_counts(8, 100, 0)) == (0.5, 0.5)


def test_resample_counts_equal_explicit_resampling() -> None:
    ref, cand, sigma = _data(3)
    po = per_observation(ref, cand, sigma)
    idx = resample_indices(po.n, 50, 7)
    vectorised = overall(po, resample_counts(idx, po.n))
    e2 = (((cand - ref) / sigma) ** 2)
    explicit = [math.sqrt(e2[i].mean()) for i in idx]
    assert np.allclose(vectorised, explicit)
    assert np.array_equal(observation_counts(po.n, 50, 7), resample_counts(idx, po.n))


def test_observation_bootstrap_draws_observations_with_all_their_seeds() -> None:
    """The seed yardstick: 4 observations x 4 seeds. A resample draws 4 observations and takes each one's 4 rows:
    counts over observations times per-observation sums (:func:`by_observation`) equal explicit row resampling."""
    rng = np.random.default_rng(9)
    ids = np.tile([30, 10, 40, 20], 4)  # rows of one observation need not be adjacent
    ref = rng.normal(size=(16, 32, 8))
    cand = ref + rng.normal(scale=0.3, size=ref.shape)
    po = per_observation(ref, cand, np.ones(8), ids)
    counts = observation_counts(po.observations, 200, 3)
    assert po.observations == 4 and counts.shape == (200, 4) and (counts.sum(axis=1) == 4).all()
    clusters = [np.flatnonzero(ids == obs) for obs in (30, 10, 40, 20)]  # in order of first appearance
    e2 = (cand - ref) ** 2
    assert np.allclose(by_observation(po, po.sq_err), [e2[c].sum() for c in clusters])
    assert np.allclose(_mse(po), [e2[c].mean() for c in clusters])
    rows = by_observation(po, np.ones(po.n))
    assert rows.tolist() == [4, 4, 4, 4]
    explicit = [math.sqrt(e2[np.concatenate([clusters[j] for j in draw])].mean())
                for draw in resample_indices(4, 200, 3)]
    per = 32 * 8
    assert np.allclose(np.sqrt((counts @ by_observation(po, po.sq_err)) / (counts @ rows * per)), explicit)


def test_summary_averages_the_rows_of_an_observation_first() -> None:
    """8 observations x 3 seeds: the overall interval is that of the 8 per-observation mean squared errors, the
    gripper interval resamples the observations with all their steps."""
    rng = np.random.default_rng(4)
    ids = np.repeat(np.arange(8), 3)
    ref = rng.normal(size=(24, 32, 8))
    ref[..., 7] = rng.uniform(0, 1, size=(24, 32))
    cand = ref + rng.normal(scale=0.2, size=ref.shape) * rng.uniform(0.5, 2, size=(24, 1, 1))
    po = per_observation(ref, cand, np.ones(8), ids)
    counts = observation_counts(8, 2000, 5)
    s = summarize(po, counts)
    assert s.n_obs == 8 and s.n_steps == 24 * 32 and not s.too_few_observations
    assert s.overall_ci == studentized_rms_interval(_mse(po), counts)
    agree = np.array([po.grip_agree[ids == i].sum() for i in range(8)])
    share = (counts @ agree) / (counts @ np.full(8, 3 * 32.0))
    assert 0 < s.gripper_changes and s.gripper_ci == pytest.approx(tuple(np.percentile(share, [2.5, 97.5])))


def _hand_p(d: np.ndarray, tol: float = 0.0) -> float:
    """The exact sign-flip p by enumeration: the share of the 2^N sign patterns s with |sum(s d)| >= |sum(d)|."""
    observed = abs(sum(d))
    flips = [abs(sum(s * x for s, x in zip(signs, d, strict=True)))
             for signs in itertools.product((1, -1), repeat=d.size)]
    return sum(f >= observed - tol for f in flips) / len(flips)


@pytest.mark.parametrize("case", ["normal", "skewed", "integers with ties", "half zeros", "all zero", "one way"])
def test_exact_sign_flip_p_against_a_hand_enumeration(case: str) -> None:
    """N = 6: the 64 sign patterns of the per-observation differences d of mean squared error, one by one. Integer
    d are exact in floating point, so their ties (zeros, equal values) are ties in both computations."""
    rng = np.random.default_rng(len(case))
    baseline = rng.integers(1, 9, size=6).astype(float) * 8
    d = {"normal": rng.normal(size=6), "skewed": rng.lognormal(0, 1, size=6) - 1.5,
         "integers with ties": np.array([2.0, -1, 0, 2, -3, 0]), "half zeros": np.array([0.0, 0, 0, 1, 2, -1]),
         "all zero": np.zeros(6), "one way": rng.uniform(0.1, 1, size=6)}[case]
    build = baseline + d
    d = build - baseline  # what paired sees
    exact_ints = bool((d == np.round(d)).all())
    expected = _hand_p(d, 0.0 if exact_ints else 1e-9 * float(np.abs(d).sum()))
    got = paired(build, baseline, patterns(6, 100, 0))
    assert got.p == pytest.approx(expected, abs=1e-15)
    assert paired(baseline, build, patterns(6, 100, 0)).p == got.p  # two-sided: symmetric
    if case == "all zero":
        assert got.p == 1 and got.diff == 0 and got.ci == (0.0, 0.0)
    if case == "one way":
        assert got.p == 2 / 64 and got.ci is not None and got.ci[0] > 0
    if case == "half zeros":  # the zeros do not matter; of the 8 signs of (1, 2, -1), 6 reach |2|: 0 twice
        assert got.p == 0.75


def _brute_hartigan(d: np.ndarray, level: float) -> tuple[float, float]:
    """All 2^N - 1 non-empty subset means, sorted: the k-th smallest and largest, k = floor(level / 2 x 2^N)."""
    means = sorted(float(np.mean(c)) for r in range(1, d.size + 1) for c in itertools.combinations(d, r))
    k = math.floor(level / 2 * 2**d.size)
    return means[k - 1], means[-k]


@pytest.mark.parametrize("n, levels", [(6, (0.05, 0.2, 0.5)), (10, (0.05, 0.05 / 21, 0.5))])
def test_hartigan_interval_against_brute_force(n: int, levels: tuple[float, ...]) -> None:
    rng = np.random.default_rng(n)
    for d in (rng.normal(0.3, 1, size=n), rng.lognormal(0, 1, size=n) - 1, rng.integers(-2, 3, size=n) * 1.0):
        pats = patterns(n, 100, 0)
        got = hartigan(pats.subset_sums(d), pats, levels)
        expected = [_brute_hartigan(d, level) for level in levels]
        assert np.allclose(got, expected, rtol=1e-12, atol=1e-12), (d, got, expected)


def test_paired_maps_hartigan_to_the_rms_scale() -> None:
    """paired's intervals are Hartigan's on the mean of d at ALPHA and ALPHA / m, mapped by
    theta -> sqrt(A + theta) - sqrt(A), A the baseline's mean squared error."""
    rng = np.random.default_rng(11)
    baseline = rng.gamma(4, 1 / 4, size=10)
    build = baseline * rng.gamma(8, 1 / 8, size=10) * 1.2
    d, a = build - baseline, float(baseline.mean())
    got = paired(build, baseline, patterns(10, 100, 0), comparisons=21)
    assert got.diff == pytest.approx(math.sqrt(build.mean()) - math.sqrt(a))

    def rms(theta: float) -> float:
        return math.sqrt(a + theta) - math.sqrt(a)

    plain, corrected = _brute_hartigan(d, ALPHA), _brute_hartigan(d, ALPHA / 21)
    assert got.ci == pytest.approx((rms(plain[0]), rms(plain[1])), rel=1e-9)
    assert got.ci_corrected == pytest.approx((rms(corrected[0]), rms(corrected[1])), rel=1e-9)
    assert got.ci_corrected is not None and got.ci is not None
    assert got.ci_corrected[0] <= got.ci[0] < got.diff < got.ci[1] <= got.ci_corrected[1]
    assert got.comparisons == 21 and not got.too_few_observations


def test_monte_carlo_sign_flip_beyond_the_exact_limit() -> None:
    """N = 36 > EXACT_MAX_N: R / 2 random sign patterns and their mirror images, p = (b / 2 + 1) / (R / 2 + 1) with b
    the patterns whose |sum(s d)| reaches |sum(d)| (a pattern and its mirror image reach it together); Hartigan's
    interval from the same subsets with k = floor(level x (R / 2 + 1))."""
    n, r = EXACT_MAX_N + 4, 5000
    assert patterns(EXACT_MAX_N, r, 0).exact and not patterns(EXACT_MAX_N + 1, r, 0).exact
    pats = patterns(n, r, 3)
    assert pats.flipped is not None and pats.count == r
    assert pats.describe() == "Monte Carlo, 2,500 random sign patterns and their mirror images"
    assert np.array_equal(pats.flipped[: r // 2], 1 - pats.flipped[r // 2:])
    again = patterns(n, r, 3).flipped
    assert again is not None and np.array_equal(pats.flipped, again)  # seeded
    rng = np.random.default_rng(12)
    signs = 1 - 2 * pats.flipped
    for shift in (0.0, 0.15, 0.4, 2.0):
        baseline = rng.gamma(4, 1 / 4, size=n)
        build = baseline * rng.gamma(8, 1 / 8, size=n) + shift
        d = build - baseline
        stat = np.abs(signs @ d)
        b = int((stat >= abs(d.sum()) * (1 - 1e-9)).sum())
        got = paired(build, baseline, pats)
        assert b % 2 == 0 and got.p == (b / 2 + 1) / (r / 2 + 1), shift
        sizes = pats.flipped.sum(axis=1)
        means = np.sort((pats.flipped @ d)[sizes > 0] / sizes[sizes > 0])
        k = math.floor(ALPHA * (r / 2 + 1))
        a = float(baseline.mean())
        assert got.ci == pytest.approx((math.sqrt(a + means[k - 1]) - math.sqrt(a),
                                        math.sqrt(a + means[-k]) - math.sqrt(a)), rel=1e-9)
    assert got.p == 1 / (r / 2 + 1)  # the largest shift: no drawn pattern reaches it


def test_holm_against_a_hand_computation() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.02, 0.03, 0.06, 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # None is kept and is no member of the family (m = 4, not 6)
    assert holm([None, 0.01, 0.04, None, 0.03, 0.005]) == pytest.approx([None, 0.03, 0.06, None, 0.06, 0.02])
    assert holm([0.5, 0.6, 0.01]) == [1.0, 1.0, 0.03]  # capped at 1, never below a smaller p's
    assert holm([]) == [] and holm([None]) == [None] and holm([0.2]) == [0.2]
    ps = list(np.random.default_rng(0).uniform(0, 0.1, size=21))
    adjusted = holm(ps)
    assert all(a is not None and p <= a <= min(1.0, 21 * p) for p, a in zip(ps, adjusted, strict=True))


@pytest.mark.parametrize("diff, ci, p, margin, expected, inside", [
    (-0.01, (-0.02, -0.005), 0.001, 0.03, "lower", True),  # significant and within the margin: both are said
    (0.002, (-0.02, 0.025), 0.6, 0.03, "not shown", True),
    (-0.01, (-0.02, -0.005), 0.001, None, "lower", None),  # no margin: nothing said of it
    (-0.05, (-0.08, -0.02), 0.001, 0.03, "lower", False),
    (0.05, (0.02, 0.08), 0.01, 0.03, "higher", False),
    (0.01, (0.005, 0.02), 0.004, 0.03, "higher", True),  # the margin never hides a Holm-significant difference
    (-0.05, (-0.08, 0.01), 0.2, 0.03, "not shown", False),
    (-0.01, (-0.03, 0.01), 0.2, 0.03, "not shown", False),  # touching the margin is not within it
    (0.0, (0.0, 0.0), 0.04, None, "not shown", None),
    (-0.05, None, None, 0.03, None, None),  # too few observations
    (-0.05, (-0.08, -0.02), None, 0.03, None, False),
])
def test_verdict(diff: float, ci: tuple[float, float] | None, p: float | None, margin: float | None,
                 expected: str | None, inside: bool | None) -> None:
    assert verdict(diff, ci, p) == expected
    assert within_margin(ci, margin) is inside


def test_non_inferior() -> None:
    assert non_inferior((-0.05, 0.02), 0.03) is True
    assert non_inferior((-0.05, 0.03), 0.03) is False  # the bound must be below the margin
    assert non_inferior((0.01, 0.04), 0.03) is False
    assert non_inferior(None, 0.03) is None and non_inferior((-0.05, 0.02), None) is None


def _gripper(bad: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """32 observations x 16 steps, one row each: ``bad`` maps an observation to its gripper changes."""
    agree = np.full(32, 16.0)
    for obs, changes in bad.items():
        agree[obs] -= changes
    return agree, np.full(32, 16.0)


def test_gripper_interval_resamples_observations() -> None:
    """The two cases of issue 31, 10 changes in 512 steps either way. Wilson over steps gives both the same interval;
    resampling observations tells them apart. The number of bad observations drawn is binomial: (a) B(32, 1/32),
    10 changes each; (b) B(32, 10/32), 1 change each; the 95% interval is 1 - (changes at its 97.5% and 2.5%
    quantiles) / 512: (a) [94.14, 100]%, (b) [97.07, 99.02]% (issue 31 quotes [97.3, 98.8]%, the 5%-95% interval:
    1 - 14 / 512 and 1 - 6 / 512)."""
    counts = observation_counts(32, 10_000, 0)
    one = gripper_interval(*_gripper({5: 10}), counts)
    spread = gripper_interval(*_gripper(dict.fromkeys(range(10), 1)), counts)
    assert 100 * np.array(one) == pytest.approx([94.14, 100.0], abs=0.2)
    assert 100 * np.array(spread) == pytest.approx([97.07, 99.02], abs=0.2)
    for (lo, hi), (p, changes) in zip((one, spread), ((1 / 32, 10), (10 / 32, 1)), strict=True):
        high, low = sps.binom(32, p).ppf([0.975, 0.025])
        assert (lo, hi) == pytest.approx((1 - changes * high / 512, 1 - changes * low / 512), abs=0.002)
    assert one[0] < spread[0] - 0.02 and one[1] > spread[1]
    assert wilson(502, 512) == pytest.approx((0.9644, 0.9894), abs=1e-4)  # the old interval, the same for both
    # no change at all: every resample gives 100%, so the Wilson interval over steps stands in
    assert gripper_interval(*_gripper({}), counts) == wilson(512, 512)


def test_gate_within_noise() -> None:
    ref, cand, sigma = _data(1)
    po = per_observation(ref, cand, sigma)
    s = summarize(po, observation_counts(32, 1000, 0))
    assert s.overall_ci is not None and s.gripper_ci is not None
    inside = (s.overall_ci[0] + s.overall_ci[1]) / 2
    assert gate_within_noise(s, inside, 0.0) is True
    assert gate_within_noise(s, s.overall_ci[1] * 2, 0.0) is False  # far from both intervals
    assert gate_within_noise(s, s.overall_ci[1] * 2, s.gripper_changes / s.n_steps) is True
    assert gate_within_noise(_at(s, overall_ci=None), inside, 0.0) is None


def test_attribution_finds_the_observations_that_drive_the_difference() -> None:
    ref, cand, sigma = _data(5, scale=0.01)
    worse = cand.copy()
    worse[[3, 17]] += 0.5  # two observations carry the whole difference
    ids = np.arange(100, 132)
    att = attribution(per_observation(ref, worse, sigma, ids), per_observation(ref, cand, sigma, ids))
    assert sorted(att["top_observations"]) == [103, 117]  # type: ignore[call-overload]
    assert abs(att["diff_without_top"]) < abs(att["diff"]) / 10  # type: ignore[arg-type]
    assert att["top3_error_share"] > 0.9  # type: ignore[operator]


def test_minimum_observations_is_where_a_sign_flip_test_can_reach_the_level() -> None:
    """N observations all pointing one way give an exact two-sided sign-flip p of 2 / 2^N, and Hartigan's interval
    at level a needs floor(a / 2 x 2^N) >= 1: the minimum is the smallest N where both reach 0.05 / m."""
    for m in (1, 2, 3, 4, 7, 21, 100):
        n = min_observations(m)
        assert 2 * 0.5**n <= 0.05 / m < 2 * 0.5 ** (n - 1), m
        assert math.floor(0.05 / m / 2 * 2**n) >= 1 > math.floor(0.05 / m / 2 * 2 ** (n - 1)), m
    assert [min_observations(m) for m in (1, 2, 21)] == [6, 7, 10]
    assert min_observations() == min_observations(0) == 6


def test_minimum_resamples_is_where_a_monte_carlo_p_can_reach_the_level() -> None:
    """With R random patterns (R / 2 and their mirror images) the smallest p is 1 / (R / 2 + 1) and Hartigan's k is
    floor(level x (R / 2 + 1)): R / 2 + 1 >= m / 0.05."""
    for m in (1, 2, 3, 7, 21, 22, 100):
        r = min_resamples(m)
        assert r % 2 == 0 and math.floor(0.05 / m * (r / 2 + 1)) >= 1 > math.floor(0.05 / m * (r / 2)), m
        assert m / (r / 2 + 1) <= 0.05 + 1e-12  # Holm's first step can reject
    assert [min_resamples(m) for m in (1, 21)] == [38, 838]


@pytest.mark.parametrize("n", [1, 2, 5])
def test_no_interval_or_p_below_the_minimum(n: int) -> None:
    ref, cand, sigma = _data(6, n=n)
    po, worse = per_observation(ref, cand, sigma), per_observation(ref, ref + (cand - ref) * 2, sigma)
    s = summarize(po, observation_counts(n, 1000, 0))
    assert s.overall_ci is None and s.gripper_ci is None and s.too_few_observations and s.n_obs == n
    assert s.overall_sigma > 0
    d = paired(_mse(worse), _mse(po), patterns(n, 1000, 0))
    assert d.too_few_observations and d.diff > 0
    assert (d.ci, d.ci_corrected, d.p) == (None, None, None)
    assert verdict(d.diff, d.ci_corrected, holm([d.p])[0]) is None


def test_minimum_depends_on_the_comparisons() -> None:
    ref, cand, sigma = _data(6, n=6)
    po, worse = per_observation(ref, cand, sigma), per_observation(ref, ref + (cand - ref) * 2, sigma)
    s = summarize(po, observation_counts(6, 1000, 0))
    assert not s.too_few_observations and s.overall_ci is not None and s.overall_ci[0] < s.overall_ci[1]
    pats = patterns(6, 1000, 0)
    one = paired(_mse(worse), _mse(po), pats)
    assert one.p == 2 / 64 and not one.too_few_observations  # every observation worse: the smallest p at N = 6
    assert paired(_mse(worse), _mse(po), pats, comparisons=2).too_few_observations  # 7 needed for m = 2


def test_identical_candidate_has_infinite_snr_and_undefined_share() -> None:
    ref, cand, sigma = _data(7)
    same = per_observation(ref, ref.copy(), sigma)
    s = summarize(same, observation_counts(same.observations, 500, 0))
    assert s.overall_sigma == 0 and s.snr_db == math.inf and s.overall_ci == (0.0, 0.0)
    assert s.gripper_ci == wilson(1024, 1024)
    att = attribution(same, per_observation(ref, cand, sigma))
    assert att["top3_error_share"] is None and att["diff"] < 0  # type: ignore[operator]
    assert ratio(0.0, 0.0) is None and ratio(0.1, 0.0) == math.inf and ratio(0.3, 0.1) == pytest.approx(3)


def test_attribution_with_too_few_observations_left() -> None:
    ref, cand, sigma = _data(8, n=2)
    att = attribution(per_observation(ref, ref + (cand - ref) * 2, sigma), per_observation(ref, cand, sigma))
    assert att["diff_without_top"] is None and len(att["top_observations"]) == 2  # type: ignore[arg-type]


def _at(s: Summary, **fields: object) -> Summary:
    return dataclasses.replace(s, **fields)  # type: ignore[arg-type]


def test_gate_boundaries_and_gripper() -> None:
    """The gate is overall <= limit AND changes <= rate x steps: both limits are inclusive, both are checked."""
    ref, cand, sigma = _data(1)
    po = per_observation(ref, cand, sigma)
    s = summarize(po, observation_counts(po.observations, 100, 0))
    exact = _at(s, overall_sigma=0.13, gripper_changes=5, n_steps=1000)
    assert gate(exact, 0.13, 0.005)  # 0.13 <= 0.13 and 5 <= 0.005 x 1000
    assert not gate(_at(exact, overall_sigma=0.1300001), 0.13, 0.005)
    assert not gate(_at(exact, gripper_changes=6), 0.13, 0.005)
    assert not gate(_at(exact, overall_sigma=0.01, gripper_changes=50), 0.13, 0.005)


def test_gripper_binarized_at_exactly_one_half() -> None:
    """A gripper at exactly 0.5 is closed (>= 0.5), on either side of the comparison."""
    ref = np.zeros((4, 1, 8))  # four observations of one step each
    cand = ref.copy()
    ref[:, 0, 7] = [0.7, 0.5, 0.5, 0.2]
    cand[:, 0, 7] = [0.5, 0.9, 0.2, 0.5]
    # 0.5 vs 0.7 agree (both closed), 0.9 vs 0.5 agree, 0.2 vs 0.5 differ, 0.5 vs 0.2 differ
    assert per_observation(ref, cand, np.ones(8)).grip_agree.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_holm_levels_step_down_and_stop() -> None:
    """0.05 / 4 for the smallest p, 0.05 / 3 for the next, ...; the first p above its level and every larger p keep
    that level."""
    assert holm_levels([0.01, 0.04, 0.012, 0.005, None]) == pytest.approx([0.05 / 3, 0.05, 0.05 / 2, 0.05 / 4, None])
    assert holm_levels([0.3, 0.001, 0.2]) == pytest.approx([0.05 / 2, 0.05 / 3, 0.05 / 2])


def test_the_holm_level_interval_excludes_zero_exactly_when_holm_rejects() -> None:
    """What a card prints beside a verdict agrees with it: over random families of 8 builds at N = 12 (exact,
    listed), N = 24 (exact, meet-in-the-middle) and N = 36 (Monte Carlo), a build's interval at its Holm level excludes
    zero iff its Holm-adjusted p < 0.05."""
    rng = np.random.default_rng(5)
    checked = rejected = 0
    for n in (12, 24, 36):
        pats = patterns(n, 4000, 0)
        for _ in range(30):
            base = rng.gamma(4, 0.25, size=n)
            builds = [base * rng.gamma(8, 1 / 8, size=n) * shift for shift in rng.uniform(0.7, 1.3, size=8)]
            ps = [sign_flip_p(b, base, pats) for b in builds]
            for b, level, adjusted in zip(builds, holm_levels(ps), holm(ps), strict=True):
                assert level is not None and adjusted is not None
                lo, hi = paired(b, base, pats, 8, level).ci_corrected or (0.0, 0.0)
                excludes = hi < 0 or lo > 0
                if abs(adjusted - 0.05) > 1e-9:  # exactly at the level the two may differ by the tie rule
                    assert excludes == (adjusted < 0.05), (n, adjusted, lo, hi)
                checked += 1
                rejected += adjusted < 0.05
    assert checked == 720 and 20 < rejected < 700  # both outcomes occur


def test_the_tables_say_which_gate_criterion_failed_and_its_limit() -> None:
    from release.core.config import Gate
    from release.measure.tables import _gate

    limits = Gate(overall_sigma=0.13, gripper_change_rate=0.005)
    record = {"gate": False, "overall_sigma": 0.2104, "gripper_changes": 12, "n_steps": 1024}
    assert _gate(record, limits) == "fail: overall 0.210 > 0.13, gripper changes 12 > 5.12"
    assert _gate({**record, "overall_sigma": 0.1}, limits) == "fail: gripper changes 12 > 5.12"
    assert _gate({**record, "gate": True, "overall_sigma": 0.1, "gripper_changes": 1}, limits) == "pass"
