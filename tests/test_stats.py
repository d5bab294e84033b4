"""Statistics against independent computations (scipy, the closed-form Wilson interval) and the seed card."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scipy import stats as sps

from release.measure.stats import (
    PerObservation,
    Summary,
    attribution,
    cluster_counts,
    gate,
    min_observations,
    overall,
    paired_difference,
    per_observation,
    ratio,
    resample_counts,
    resample_indices,
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


def test_metrics_by_definition() -> None:
    ref, cand, sigma = _data(1)
    po = per_observation(ref, cand, sigma)
    s = summarize(po, resample_counts(resample_indices(po.n, 1000, 0), po.n))
    e = (cand - ref) / sigma
    assert s.overall_sigma == pytest.approx(math.sqrt((e**2).mean()))
    assert s.joint_mae_deg == pytest.approx(np.degrees(np.abs(cand - ref)[..., :7]).mean())
    assert s.snr_db == pytest.approx(10 * math.log10(((ref / sigma) ** 2).sum() / (e**2).sum()))
    agree = ((cand[..., 7] >= 0.5) == (ref[..., 7] >= 0.5)).sum()
    assert s.gripper_changes == 32 * 32 - agree and s.gripper_agree == pytest.approx(agree / 1024)
    assert s.element_err_p95 == pytest.approx(np.percentile(np.abs(e), 95))
    assert s.obs_max_err_p95 == pytest.approx(np.percentile(np.abs(e).reshape(32, -1).max(axis=1), 95))
    assert gate(s, 1.0, 1.0) and not gate(s, s.overall_sigma / 2, 1.0)


def test_bootstrap_matches_scipy() -> None:
    """Our vectorised percentile bootstrap vs scipy.stats.bootstrap on the same statistic (different draws)."""
    ref, cand, sigma = _data(2)
    po = per_observation(ref, cand, sigma)
    ours = summarize(po, resample_counts(resample_indices(po.n, 10_000, 0), po.n)).overall_ci
    per = 32 * 8

    def stat(sq: np.ndarray, axis: int = -1) -> np.ndarray:
        return np.sqrt(sq.mean(axis=axis) / per)

    theirs = sps.bootstrap((po.sq_err,), stat, n_resamples=10_000, method="percentile",
                           random_state=np.random.default_rng(1)).confidence_interval
    assert ours is not None
    assert ours[0] == pytest.approx(theirs.low, rel=0.02) and ours[1] == pytest.approx(theirs.high, rel=0.02)


def test_resample_counts_equal_explicit_resampling() -> None:
    ref, cand, sigma = _data(3)
    po = per_observation(ref, cand, sigma)
    idx = resample_indices(po.n, 50, 7)
    vectorised = overall(po, resample_counts(idx, po.n))
    e2 = (((cand - ref) / sigma) ** 2)
    explicit = [math.sqrt(e2[i].mean()) for i in idx]
    assert np.allclose(vectorised, explicit)


def test_paired_difference_and_bonferroni() -> None:
    ref, cand, sigma = _data(4)
    better = ref + (cand - ref) * 0.5
    po_base, po_better = per_observation(ref, cand, sigma), per_observation(ref, better, sigma)
    counts = resample_counts(resample_indices(32, 10_000, 0), 32)
    one = paired_difference(po_better, po_base, counts)
    assert one.diff < 0 and one.ci is not None and one.ci[1] < 0
    # no resample on the other side of 0: p is the resolution 2 / R, flagged as a bound, and times m when corrected
    assert one.p_bound and one.p == 2 / 10_000 and one.p_corrected == one.p
    many = paired_difference(po_better, po_base, counts, comparisons=20)
    assert many.p_bound and many.p_corrected == pytest.approx(20 * 2 / 10_000)
    same = paired_difference(po_base, po_base, counts)
    assert same.diff == 0 and same.ci == (0.0, 0.0) and same.p == 1 and not same.p_bound


def _borderline(seed: int = 8) -> tuple[PerObservation, PerObservation, np.ndarray]:
    """Two builds whose paired difference has a p near 0.07 (not 0, not 1): the multiplications by m show."""
    ref, cand, sigma = _data(seed)
    other = ref + (cand - ref) * np.random.default_rng(seed).normal(1.03, 0.1, size=(32, 1, 1))
    a, b = per_observation(ref, cand, sigma), per_observation(ref, other, sigma)
    return a, b, cluster_counts(a.obs_ids, 10_000, 0)


def test_corrected_interval_uses_m() -> None:
    a, b, counts = _borderline()
    diff = np.asarray(overall(a, counts)) - np.asarray(overall(b, counts))
    one = paired_difference(a, b, counts)
    three = paired_difference(a, b, counts, comparisons=3)
    assert one.ci == one.ci_corrected == pytest.approx(tuple(np.percentile(diff, [2.5, 97.5])))
    assert three.ci == one.ci
    assert three.ci_corrected == pytest.approx(tuple(np.percentile(diff, [2.5 / 3, 100 - 2.5 / 3])))
    assert three.ci_corrected is not None and one.ci is not None
    assert three.ci_corrected[0] < one.ci[0] and three.ci_corrected[1] > one.ci[1]


def test_p_is_two_sided_and_corrected_p_is_m_times_p() -> None:
    a, b, counts = _borderline()
    diff = np.asarray(overall(a, counts)) - np.asarray(overall(b, counts))
    two_sided = 2 * min((diff <= 0).mean(), (diff >= 0).mean())
    one = paired_difference(a, b, counts)
    assert one.p == pytest.approx(two_sided) and 0.01 < two_sided < 0.3
    assert paired_difference(b, a, counts).p == one.p  # symmetric, as a two-sided p is
    three = paired_difference(a, b, counts, comparisons=3)
    assert one.p is not None and three.p == one.p and three.p_corrected == pytest.approx(3 * one.p)
    assert paired_difference(a, b, counts, comparisons=20).p_corrected == 1.0


def test_attribution_finds_the_observations_that_drive_the_difference() -> None:
    ref, cand, sigma = _data(5, scale=0.01)
    worse = cand.copy()
    worse[[3, 17]] += 0.5  # two observations carry the whole difference
    ids = np.arange(100, 132)
    att = attribution(per_observation(ref, worse, sigma, ids), per_observation(ref, cand, sigma, ids))
    assert sorted(att["top_observations"]) == [103, 117]  # type: ignore[call-overload]
    assert abs(att["diff_without_top"]) < abs(att["diff"]) / 10  # type: ignore[arg-type]
    assert att["top3_error_share"] > 0.9  # type: ignore[operator]


def test_minimum_observations_is_where_a_sign_test_can_reach_the_level() -> None:
    """N observations all pointing one way give an exact two-sided sign-test p of 2 * 0.5**N: the minimum is the
    smallest N where that reaches 0.05 / m."""
    for m in (1, 2, 3, 4, 7, 21):
        n = min_observations(m)
        assert 2 * 0.5**n <= 0.05 / m < 2 * 0.5 ** (n - 1), m
    assert [min_observations(m) for m in (1, 2, 21)] == [6, 7, 10]


@pytest.mark.parametrize("n", [1, 2, 5])
def test_no_interval_or_p_below_the_minimum(n: int) -> None:
    ref, cand, sigma = _data(6, n=n)
    po, worse = per_observation(ref, cand, sigma), per_observation(ref, ref + (cand - ref) * 2, sigma)
    counts = cluster_counts(po.obs_ids, 1000, 0)
    s = summarize(po, counts)
    assert s.overall_ci is None and s.too_few_observations and s.n_obs == n and s.overall_sigma > 0
    d = paired_difference(worse, po, counts)
    assert d.too_few_observations and d.diff > 0
    assert (d.ci, d.ci_corrected, d.p, d.p_corrected) == (None, None, None, None)


def test_minimum_depends_on_the_comparisons() -> None:
    ref, cand, sigma = _data(6, n=6)
    po, worse = per_observation(ref, cand, sigma), per_observation(ref, ref + (cand - ref) * 2, sigma)
    counts = cluster_counts(po.obs_ids, 1000, 0)
    s = summarize(po, counts)
    assert not s.too_few_observations and s.overall_ci is not None and s.overall_ci[0] < s.overall_ci[1]
    assert paired_difference(worse, po, counts).p is not None
    assert paired_difference(worse, po, counts, comparisons=2).too_few_observations  # 7 needed for m = 2


def test_identical_candidate_has_infinite_snr_and_undefined_share() -> None:
    ref, cand, sigma = _data(7)
    same = per_observation(ref, ref.copy(), sigma)
    s = summarize(same, cluster_counts(same.obs_ids, 500, 0))
    assert s.overall_sigma == 0 and s.snr_db == math.inf and s.overall_ci == (0.0, 0.0)
    att = attribution(same, per_observation(ref, cand, sigma))
    assert att["top3_error_share"] is None and att["diff"] < 0  # type: ignore[operator]
    assert ratio(0.0, 0.0) is None and ratio(0.1, 0.0) == math.inf and ratio(0.3, 0.1) == pytest.approx(3)


def test_attribution_with_too_few_observations_left() -> None:
    ref, cand, sigma = _data(8, n=2)
    att = attribution(per_observation(ref, ref + (cand - ref) * 2, sigma), per_observation(ref, cand, sigma))
    assert att["diff_without_top"] is None and len(att["top_observations"]) == 2  # type: ignore[arg-type]


def test_cluster_bootstrap_draws_observations_with_all_their_seeds() -> None:
    """The seed yardstick: 4 observations x 4 seeds. A resample draws 4 observations and takes each one's 4 rows."""
    rng = np.random.default_rng(9)
    ids = np.tile([30, 10, 40, 20], 4)  # rows of one observation need not be adjacent
    ref = rng.normal(size=(16, 32, 8))
    cand = ref + rng.normal(scale=0.3, size=ref.shape)
    po = per_observation(ref, cand, np.ones(8), ids)
    counts = cluster_counts(ids, 200, 3)
    assert po.observations == 4 and (counts.sum(axis=1) == 16).all()
    for obs in (10, 20, 30, 40):
        rows = np.flatnonzero(ids == obs)
        assert (counts[:, rows] == counts[:, rows[:1]]).all()
    clusters = [np.flatnonzero(ids == obs) for obs in (30, 10, 40, 20)]  # in order of first appearance
    e2 = (cand - ref) ** 2
    explicit = [math.sqrt(e2[np.concatenate([clusters[j] for j in draw])].mean())
                for draw in resample_indices(4, 200, 3)]
    assert np.allclose(overall(po, counts), explicit)
    # one row per observation: the plain bootstrap of the rows
    assert np.array_equal(cluster_counts(np.arange(100, 132), 50, 7), resample_counts(resample_indices(32, 50, 7), 32))


def _at(s: Summary, **fields: float) -> Summary:
    return dataclasses.replace(s, **fields)  # type: ignore[arg-type]


def test_gate_boundaries_and_gripper() -> None:
    """The gate is overall <= limit AND changes <= rate x steps: both limits are inclusive, both are checked."""
    ref, cand, sigma = _data(1)
    po = per_observation(ref, cand, sigma)
    s = summarize(po, cluster_counts(po.obs_ids, 100, 0))
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
