"""Statistics against independent computations (scipy, the closed-form Wilson interval) and the seed card."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from release.stats import (
    attribution,
    gate,
    overall,
    paired_difference,
    per_observation,
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
    many = paired_difference(po_better, po_base, counts, comparisons=20)
    assert one["diff"] < 0 and one["ci"][1] < 0 and one["p"] < 0.001  # type: ignore[index,operator]
    assert many["ci_corrected"][0] <= one["ci"][0] and many["ci_corrected"][1] >= one["ci"][1]  # type: ignore[index]
    same = paired_difference(po_base, po_base, counts)
    assert same["diff"] == 0 and same["ci"] == (0.0, 0.0)


def test_attribution_finds_the_observations_that_drive_the_difference() -> None:
    ref, cand, sigma = _data(5, scale=0.01)
    worse = cand.copy()
    worse[[3, 17]] += 0.5  # two observations carry the whole difference
    att = attribution(per_observation(ref, worse, sigma), per_observation(ref, cand, sigma), np.arange(100, 132))
    assert sorted(att["top_observations"]) == [103, 117]  # type: ignore[arg-type]
    assert abs(att["diff_without_top"]) < abs(att["diff"]) / 10  # type: ignore[arg-type]
    assert att["top3_error_share"] > 0.9  # type: ignore[operator]
