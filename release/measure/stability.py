"""How stable the choice of ``release select`` is: the selection rule applied again to bootstrap resamples of the
observations (issue 31).

The candidates are scored on the same observations in the same order, so one resample of the observations (drawn
with replacement, each draw taking all the rows of its observation: the noise seeds of the seed yardstick) serves
every candidate. In each resample every evaluated candidate's overall sigma, gripper agreement and joint MAE are
recomputed from per-observation sums (one matrix product each), its gate is judged again with its own build file's
limits, and the rule ranks and chooses as ``release select`` does: lowest overall among those that pass their gate,
ties to the rule's ``tie_break`` metrics and then the candidate order; ``always`` builds chosen whatever.

It is computed from the results files that ``release tables`` read (``<dist>/<repo>/results/<path>-<split>.npz``);
a results file that no longer gives the figures of ``tables.json`` is refused (the tables are older than it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict

from release.core.errors import ReleaseError
from release.core.rules import Selection
from release.measure.layout import RESULTS
from release.measure.paired import min_observations
from release.measure.results import read_results
from release.measure.stats import JOINTS, PerObservation, by_observation, observation_counts

RESAMPLES = 1_000
SEED = 0
TIE_BREAK_SIGN = {"gripper_agree": -1, "joint_mae_deg": 1}  # 1: the lower value ranks first, -1: the higher
Skipped = Literal["no_evaluated_candidates", "no_results_file", "too_few_observations"]
SKIPPED = {"no_evaluated_candidates": "no candidate was evaluated on the rule's path and split",
           "no_results_file": "a candidate's results file is missing",
           "too_few_observations": f"fewer than {min_observations()} observations"}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Share(_Doc):
    """One evaluated candidate across the resamples: the share of them in which it passes its gate, ranks first
    (the ``rank`` of ``selection.json``: those that pass their gate first) and is chosen (``always`` builds: 1)."""

    build: str
    passed_share: float
    first_share: float
    chosen_share: float


class Stability(_Doc):
    """The rule applied to ``resamples`` bootstrap resamples of the ``observations`` (seeded: the same file each
    run); ``same_choice``: the share of resamples whose chosen set is the set selected. ``candidates``: the evaluated
    ones, in the order of ``selection.json``'s candidates."""

    resamples: int
    seed: int
    observations: int
    same_choice: float
    candidates: list[Share]


@dataclass(frozen=True)
class Entry:
    """An evaluated candidate as ``release select`` ranked it: its place in the candidate list, the figures of its
    tables.json record (checked against its results file) and its build file's gate."""

    build: str
    repo: str
    position: int
    overall_sigma: float
    gripper_changes: int
    n_obs: int
    n_steps: int
    limit_sigma: float
    change_rate: float


@dataclass(frozen=True)
class Sums:
    """Per-observation sums of one candidate, in the order of first appearance of the observations."""

    sq_err: np.ndarray
    steps: np.ndarray  # rows x steps per observation
    agree: np.ndarray  # steps whose binarized gripper agrees
    abs_joint_deg: np.ndarray
    per_step: int  # dims: sq_err is summed over steps x dims

    @classmethod
    def of(cls, po: PerObservation) -> Sums:
        return cls(sq_err=by_observation(po, po.sq_err), steps=by_observation(po, np.full(po.n, float(po.steps))),
                   agree=by_observation(po, po.grip_agree), abs_joint_deg=by_observation(po, po.abs_joint_deg),
                   per_step=po.dims)


def read_sums(rule: Selection, dist: Path, dims: int, entries: list[Entry],
              tables: Path) -> list[Sums] | Skipped:
    """Each entry's per-observation sums from its results file, or why there are none: a missing file, or fewer
    observations than :func:`~release.measure.paired.min_observations`. A file whose figures are not those of
    tables.json, or whose observations differ from the first candidate's, is a one-line error."""
    if not entries:
        return "no_evaluated_candidates"
    files = [dist / e.repo / RESULTS / f"{rule.path}-{rule.split}.npz" for e in entries]
    if not all(f.is_file() for f in files):
        return "no_results_file"
    pos = [read_results(f, dims) for f in files]
    for e, po, file in zip(entries, pos, files, strict=True):
        steps = po.n * po.steps
        changes = steps - int(po.grip_agree.sum())
        overall = math.sqrt(float(po.sq_err.sum()) / (steps * po.dims))
        if (po.observations, steps, changes) != (e.n_obs, e.n_steps, e.gripper_changes) or \
                not math.isclose(overall, e.overall_sigma, rel_tol=1e-9, abs_tol=1e-15):
            raise ReleaseError(f"{file}: gives overall {overall:.6g}, {changes} gripper changes in {steps} steps on "
                               f"{po.observations} observations, but {tables} records {e.overall_sigma:.6g}, "
                               f"{e.gripper_changes} in {e.n_steps} on {e.n_obs}: the tables are older than the "
                               "results; rerun 'release tables'")
        if not np.array_equal(po.obs_ids, pos[0].obs_ids):
            raise ReleaseError(f"{file}: obs_ids differ from those of {files[0]}; the candidates must be scored on "
                               f"the same observations in the same order: rerun 'release eval {e.build} "
                               f"{entries[0].build} --path {rule.path} --split {rule.split}'")
    if pos[0].observations < min_observations():
        return "too_few_observations"
    return [Sums.of(po) for po in pos]


def bootstrap(rule: Selection, entries: list[Entry], sums: list[Sums], chosen: list[str],
              resamples: int = RESAMPLES, seed: int = SEED) -> Stability:
    """The rule applied to each of ``resamples`` resamples of the observations (``entries`` and ``sums`` in the same
    order; ``chosen``: the builds selected on all the observations)."""
    n_obs = sums[0].sq_err.size
    counts = observation_counts(n_obs, resamples, seed)  # [R, observations]: the same draw for every candidate

    def column(values: list[np.ndarray]) -> np.ndarray:  # [R, C]: each candidate's resampled sum
        return counts @ np.stack(values, axis=1)

    steps = column([s.steps for s in sums])
    overall = np.sqrt(column([s.sq_err for s in sums]) / (steps * np.array([s.per_step for s in sums])))
    agree = column([s.agree for s in sums])
    metrics = {"gripper_agree": agree / steps, "joint_mae_deg": column([s.abs_joint_deg for s in sums]) / (
        steps * JOINTS)}
    limit_sigma = np.array([e.limit_sigma for e in entries])
    change_rate = np.array([e.change_rate for e in entries])
    passed = (overall <= limit_sigma) & (steps - agree <= change_rate * steps)
    position = np.broadcast_to(np.array([e.position for e in entries], dtype=np.float64), overall.shape)
    # lexsort: the last key is the first criterion
    keys = [position, *(TIE_BREAK_SIGN[m] * metrics[m] for m in reversed(rule.tie_break)), overall, ~passed]
    order = np.lexsort(np.stack([np.asarray(k, dtype=np.float64) for k in keys]), axis=-1)  # [R, C] ranking
    always = np.array([e.build in rule.always for e in entries])
    eligible = np.take_along_axis(passed & ~always, order, axis=1)
    picked = eligible & (np.cumsum(eligible, axis=1) <= rule.count)
    chosen_mask = np.zeros_like(passed)
    np.put_along_axis(chosen_mask, order, picked, axis=1)
    chosen_mask |= always
    selected = np.array([e.build in chosen for e in entries])
    first = order[:, 0]
    shares = [Share(build=e.build, passed_share=float(passed[:, i].mean()), first_share=float((first == i).mean()),
                    chosen_share=float(chosen_mask[:, i].mean())) for i, e in enumerate(entries)]
    return Stability(resamples=resamples, seed=seed, observations=n_obs,
                     same_choice=float((chosen_mask == selected).all(axis=1).mean()), candidates=shares)
