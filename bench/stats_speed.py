"""Statistics for 22 builds x 10,000 resamples (vectorised) vs scipy.stats.bootstrap on the same data.

Usage: .venv/bin/python bench/stats_speed.py
"""

from __future__ import annotations

import time

import numpy as np
from scipy import stats as sps

from release.measure.stats import paired_difference, per_observation, resample_counts, resample_indices, summarize

BUILDS, OBS, RESAMPLES = 22, 32, 10_000


def main() -> None:
    rng = np.random.default_rng(0)
    ref = rng.normal(size=(OBS, 32, 8))
    sigma = np.ones(8)
    cands = [ref + rng.normal(scale=0.1, size=ref.shape) for _ in range(BUILDS)]
    pos = [per_observation(ref, c, sigma) for c in cands]
    t = time.perf_counter()
    counts = resample_counts(resample_indices(OBS, RESAMPLES, 0), OBS)
    for po in pos:
        summarize(po, counts)
        paired_difference(po, pos[0], counts, comparisons=BUILDS - 1)
    ours = time.perf_counter() - t
    t = time.perf_counter()
    for po in pos:
        sps.bootstrap((po.sq_err,), lambda s, axis=-1: np.sqrt(s.mean(axis=axis) / 256), n_resamples=RESAMPLES,
                      method="percentile", random_state=np.random.default_rng(1))
    scipy_s = time.perf_counter() - t
    print(f"| ours: CI + paired difference, {BUILDS} builds x {RESAMPLES} resamples | {ours:.3f} s |")
    print(f"| scipy.stats.bootstrap (percentile, vectorised), CI only, {BUILDS} builds | {scipy_s:.3f} s |")


if __name__ == "__main__":
    main()
