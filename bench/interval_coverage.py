"""Coverage of 95% intervals at 10-32 observations: the simulation that chose the interval methods of issue 31.

A build's overall error is sqrt(mean of its per-observation mean squared errors); the candidates for its interval:
the percentile bootstrap, BCa, the studentized bootstrap (bootstrap-t) of the mean, and the studentized bootstrap of
log(mean) (the chosen one: ``release.measure.stats.studentized_rms_interval``). Each covers sqrt(E[mse]).

The paired difference of two builds' overall errors, under the null (build and baseline exchangeable within each
observation: an observation-level factor times independent gamma(8, 1/8) noise for each): the percentile bootstrap,
BCa, the bootstrap-t with a delta-method standard error, and Hartigan's subset-means interval (the chosen one:
``release.measure.paired.paired``, exact for N <= 20, random sign patterns beyond). Each covers 0.

Per-observation mean squared errors (and the observation factor of the null pairs) are drawn from: light,
gamma(4, 1/4); heavy, lognormal(0, 1.2); Pareto, numpy's pareto(2.5) (Lomax) + 0.1.

Usage: .venv/bin/python bench/interval_coverage.py [--sims 1000] [--resamples 2000] [--seed 1]
Prints a markdown table of coverage (%), and the seconds each row took. With 1,000 simulations the Monte Carlo
standard error of a coverage near 95% is 0.7 points.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import numpy as np
from scipy import stats as sps

from release.measure.paired import ALPHA, Patterns, paired, patterns
from release.measure.stats import observation_counts, studentized_rms_interval

NS = (10, 16, 32)
Q = (50 * ALPHA, 100 - 50 * ALPHA)  # percentiles of a 95% interval
Z = sps.norm.ppf([ALPHA / 2, 1 - ALPHA / 2])

KINDS: dict[str, tuple[Callable[[np.random.Generator, int], np.ndarray], float]] = {
    # name: (draw per-observation mean squared errors, their true mean)
    "light (gamma(4, 1/4))": (lambda rng, n: rng.gamma(4, 1 / 4, size=n), 1.0),
    "heavy (lognormal, sigma 1.2)": (lambda rng, n: rng.lognormal(0, 1.2, size=n), math.exp(1.2**2 / 2)),
    "Pareto(2.5) + 0.1": (lambda rng, n: rng.pareto(2.5, size=n) + 0.1, 1 / 1.5 + 0.1),
}
OVERALL = ("percentile", "BCa", "bootstrap-t of mean", "studentized log-mean (chosen)")
DIFF = ("percentile", "BCa", "bootstrap-t (delta SE)", "Hartigan (chosen)")


def _bca(boots: np.ndarray, est: float, jack: np.ndarray) -> tuple[float, float]:
    """BCa percentiles of ``boots`` with bias from the share below ``est`` and acceleration from the jackknife."""
    share = float((boots < est).mean() + 0.5 * (boots == est).mean())
    z0 = sps.norm.ppf(min(max(share, 1 / boots.size), 1 - 1 / boots.size))
    d = jack.mean() - jack
    s2 = float((d**2).sum())
    acc = float((d**3).sum()) / (6 * s2**1.5) if s2 > 0 else 0.0
    adj = sps.norm.cdf(z0 + (z0 + Z) / (1 - acc * (z0 + Z)))
    lo, hi = np.percentile(boots, 100 * np.clip(adj, 0, 1))
    return float(lo), float(hi)


def overall_intervals(x: np.ndarray, counts: np.ndarray) -> list[tuple[float, float]]:
    """The four intervals of sqrt(mean(x)), in the order of OVERALL."""
    n = x.size
    mean = float(x.mean())
    m = (counts @ x) / n
    boots = np.sqrt(m)
    pct = np.percentile(boots, Q)
    bca = _bca(boots, math.sqrt(mean), np.sqrt((x.sum() - x) / (n - 1)))
    with np.errstate(divide="ignore", invalid="ignore"):
        se = np.sqrt(np.maximum(((counts @ x**2) / n - m**2) * n / (n - 1), 0) / n)
        t = (m - mean) / se
    hi_q, lo_q = np.percentile(t[np.isfinite(t)], [Q[1], Q[0]])
    se0 = float(x.std(ddof=1)) / math.sqrt(n)
    boot_t = (math.sqrt(max(mean - hi_q * se0, 0.0)), math.sqrt(max(mean - lo_q * se0, 0.0)))
    return [(float(pct[0]), float(pct[1])), bca, boot_t, studentized_rms_interval(x, counts)]


def diff_intervals(build: np.ndarray, base: np.ndarray, counts: np.ndarray,
                   pats: Patterns) -> list[tuple[float, float]]:
    """The four intervals of sqrt(mean(build)) - sqrt(mean(base)), in the order of DIFF."""
    n = build.size
    a, b = float(base.mean()), float(build.mean())
    est = math.sqrt(b) - math.sqrt(a)
    ma, mb = (counts @ base) / n, (counts @ build) / n
    boots = np.sqrt(mb) - np.sqrt(ma)
    pct = np.percentile(boots, Q)
    jack = np.sqrt((build.sum() - build) / (n - 1)) - np.sqrt((base.sum() - base) / (n - 1))
    bca = _bca(boots, est, jack)
    # bootstrap-t, standard error of the influence values u = build / (2 sqrt(B)) - base / (2 sqrt(A)) (delta method)
    al, be = 1 / (2 * np.sqrt(ma)), 1 / (2 * np.sqrt(mb))
    saa, sbb, sab = (counts @ base**2) / n, (counts @ build**2) / n, (counts @ (base * build)) / n
    mu = be * mb - al * ma
    var = (be**2 * sbb - 2 * al * be * sab + al**2 * saa - mu**2) * n / (n - 1)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (boots - est) / np.sqrt(np.maximum(var, 0) / n)
    hi_q, lo_q = np.percentile(t[np.isfinite(t)], [Q[1], Q[0]])
    u0 = build / (2 * math.sqrt(b)) - base / (2 * math.sqrt(a))
    se0 = float(u0.std(ddof=1)) / math.sqrt(n)
    hart = paired(build, base, pats).ci
    assert hart is not None
    return [(float(pct[0]), float(pct[1])), bca, (est - hi_q * se0, est - lo_q * se0), hart]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sims", type=int, default=1000)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    print(f"Coverage (%) of 95% intervals, {args.sims:,} simulations x {args.resamples:,} resamples "
          f"(Monte Carlo SE about {100 * math.sqrt(0.95 * 0.05 / args.sims):.1f} points at 95%)\n")
    print("| data | N | " + " | ".join(f"overall: {k}" for k in OVERALL) + " | "
          + " | ".join(f"difference: {k}" for k in DIFF) + " | s |")
    print("|---|---:|" + "---:|" * (len(OVERALL) + len(DIFF) + 1))
    for kind, (draw, true_mean) in KINDS.items():
        for n in NS:
            t0 = time.perf_counter()
            pats = patterns(n, args.resamples, args.seed)
            hits_o = np.zeros(len(OVERALL))
            hits_d = np.zeros(len(DIFF))
            for sim in range(args.sims):
                counts = observation_counts(n, args.resamples, 1_000_003 * args.seed + sim)
                x = draw(rng, n)
                hits_o += [lo <= math.sqrt(true_mean) <= hi for lo, hi in overall_intervals(x, counts)]
                f = draw(rng, n)
                base, build = f * rng.gamma(8, 1 / 8, size=n), f * rng.gamma(8, 1 / 8, size=n)
                hits_d += [lo <= 0 <= hi for lo, hi in diff_intervals(build, base, counts, pats)]
            cells = [f"{100 * h / args.sims:.1f}" for h in (*hits_o, *hits_d)]
            print(f"| {kind} | {n} | " + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |", flush=True)


if __name__ == "__main__":
    main()
