"""The statistics of ``release tables`` for 22 builds x 10,000 resamples: each build's studentized interval and
gripper interval, its exact (N <= 20) or Monte Carlo (N > 20) sign-flip test and Hartigan intervals, Holm over the
family; and scipy.stats.bootstrap (percentile) on the same data for scale.

Usage: .venv/bin/python bench/stats_speed.py
"""

from __future__ import annotations

import time

import numpy as np
from scipy import stats as sps

from release.measure.paired import holm, paired, patterns, per_observation_mse
from release.measure.stats import observation_counts, per_observation, summarize

BUILDS, RESAMPLES = 22, 10_000


def main() -> None:
    rng = np.random.default_rng(0)
    for obs in (16, 20, 32):
        ref = rng.normal(size=(obs, 32, 8))
        sigma = np.ones(8)
        pos = [per_observation(ref, ref + rng.normal(scale=0.1, size=ref.shape), sigma) for _ in range(BUILDS)]
        t = time.perf_counter()
        counts = observation_counts(obs, RESAMPLES, 0)
        pats = patterns(obs, RESAMPLES, 0)
        mses = [per_observation_mse(po.sq_err, po.obs_ids, 256) for po in pos]
        for po in pos:
            summarize(po, counts)
        holm([paired(m, mses[0], pats, BUILDS - 1).p for m in mses[1:]])
        ours = time.perf_counter() - t
        print(f"| N = {obs} ({pats.describe()}): intervals, sign-flip tests, Holm, {BUILDS} builds x {RESAMPLES:,} "
              f"resamples | {ours:.3f} s |")
    t = time.perf_counter()
    for po in pos:
        sps.bootstrap((po.sq_err,), lambda s, axis=-1: np.sqrt(s.mean(axis=axis) / 256), n_resamples=RESAMPLES,
                      method="percentile", random_state=np.random.default_rng(1))
    print(f"| scipy.stats.bootstrap (percentile, vectorised), interval only, {BUILDS} builds, N = 32 | "
          f"{time.perf_counter() - t:.3f} s |")


if __name__ == "__main__":
    main()
