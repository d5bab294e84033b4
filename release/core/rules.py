"""The release's decision rules in ``builds/release.yaml``: the selection rule, the equivalence margin and the
campaign's evaluations, with the build-name rule they share with the build files (:mod:`release.core.config`)."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


class Strict(BaseModel):
    """A configuration model: unknown keys refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


def margin_value(value: Any) -> Any:
    """A plain number is an absolute margin; ``compile`` (the old default) and booleans are refused, and so is a
    mapping without exactly one of ``sigma`` and ``of_baseline`` given a value (``{}``, ``{sigma: null}``: no margin
    at all). A mapping with another key is left to the model, which names the key."""
    if isinstance(value, bool):
        raise ValueError("give the margin as {sigma: S} or {of_baseline: F}, not true or false")
    if isinstance(value, int | float):
        return {"sigma": value}  # a plain number: an absolute margin in sigma
    if value == "compile":
        raise ValueError("'compile' is no longer a margin (the eager-vs-compile yardstick stays a column of the "
                         "tables); give {of_baseline: 0.1} (10% of the baseline's error) or {sigma: S}")
    if isinstance(value, dict) and set(value) <= {"sigma", "of_baseline"}:
        if len(value) != 1:
            raise ValueError("give either 'sigma' or 'of_baseline', not both" if value else
                             "give the margin as {sigma: S} or {of_baseline: F}, not an empty mapping")
        (key, number), = value.items()
        if number is None:
            raise ValueError(f"'{key}' is null; give it a number (0 < {key} <= 10)")
    return value


class Margin(Strict):
    """The equivalence margin: an absolute ``sigma``, or ``of_baseline`` times the baseline's overall error on the
    path and split compared (the default, 10%). A Holm-level interval inside +-margin is "within the margin"."""

    sigma: float | None = Field(None, strict=True, gt=0, le=10, allow_inf_nan=False)
    of_baseline: float | None = Field(0.1, strict=True, gt=0, le=10, allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _one(cls, data: Any) -> Any:
        """``sigma`` replaces the default ``of_baseline`` (:func:`margin_value` refuses both)."""
        return {**data, "of_baseline": None} if isinstance(data, dict) and "sigma" in data else data

    def of(self, baseline_sigma: float | None) -> float | None:
        """The margin in sigma for a family whose baseline has ``baseline_sigma`` (None: no baseline there)."""
        if self.sigma is not None:
            return self.sigma
        return None if baseline_sigma is None or self.of_baseline is None else self.of_baseline * baseline_sigma


BUILD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # a build file's stem: builds/<name>.yaml
BUILD_NAME_RULE = "letters, digits, '_' and '-', at most 64 characters"


def unique_build_names(names: list[str], field: str) -> list[str]:
    for name in names:
        if not BUILD_NAME.fullmatch(name):
            raise ValueError(f"{name!r} is not a build name (the stem of a file in builds/: {BUILD_NAME_RULE})")
    repeated = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if repeated is not None:
        raise ValueError(f"{repeated!r} is listed twice in '{field}'; list each build once")
    return names


class Selection(Strict):
    """The selection rule of the release (``release select``): every candidate scored on one path and split, then
    ranked by its own gate (from its build file, as ``release tables`` computed it), the lowest overall sigma, the
    ``tie_break`` metrics in order, and last its place in ``candidates``. ``always`` builds are chosen whatever their
    scores (the reference); ``count`` more are chosen from the top of the ranking among those that pass their gate.
    A candidate may name a build that is not defined or not evaluated yet: it is listed as not evaluated and cannot
    be chosen by rank."""

    candidates: list[str] = Field(min_length=1)
    path: Literal["fakequant", "deployed", "served"] = "fakequant"
    split: Literal["calibration", "validation", "all"] = Field(
        "validation", description="the held-out labs by default; 'calibration' scores in-sample, and the cards say so")
    tie_break: list[Literal["gripper_agree", "joint_mae_deg"]] = ["gripper_agree", "joint_mae_deg"]
    always: list[str] = []
    count: int = Field(1, strict=True, ge=1, le=100, description="builds chosen by rank, besides 'always'")
    gate: Literal["point", "interval"] = Field(
        "point", description="'point': a candidate passes its gate when its figures are within the limits; "
        "'interval': only when their whole 95% interval is (a pass within noise is then a fail)")

    @field_validator("candidates", "always")
    @classmethod
    def _names(cls, v: list[str], info: ValidationInfo) -> list[str]:
        return unique_build_names(v, str(info.field_name))

    @field_validator("tie_break")
    @classmethod
    def _tie_break(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("a metric is listed twice in 'tie_break'; list each once")
        return v

    @model_validator(mode="after")
    def _always_are_candidates(self) -> Selection:
        outside = [n for n in self.always if n not in self.candidates]
        if outside:
            raise ValueError(f"'always' names {outside[0]!r}, which is not in 'candidates'; add it there (the "
                             "ranking lists every chosen build)")
        return self


CHOSEN = "chosen"  # campaign.evals' builds: the builds the release delivers, evaluated after the selection


class CampaignEval(Strict):
    """One evaluation of ``release campaign``: every build of ``builds`` on ``path`` and ``split``, as ``release
    eval`` would run it. ``builds`` is a list of names (evaluated as each is made; a build the sweep leaves out is not
    made, so not evaluated), ``chosen`` (the builds the release delivers: evaluated after the selection, before the
    cards) or absent (the whole sweep)."""

    path: Literal["fakequant", "deployed", "served"]
    split: Literal["calibration", "validation", "all"]
    builds: Literal["chosen"] | list[str] | None = None

    @field_validator("builds")
    @classmethod
    def _builds(cls, v: str | list[str] | None) -> str | list[str] | None:
        return v if v is None or isinstance(v, str) else unique_build_names(v, "builds")

    @property
    def after_selection(self) -> bool:
        return self.builds == CHOSEN


class Executor(Strict):
    """How ``release campaign --executor slurm`` asks for its jobs (``processes`` uses ``timeout_min``, ``retries``
    and ``max_jobs``): one node, one task and ``gpus_per_job`` GPUs per job, the rest as sbatch takes them."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    gpus_per_job: int = Field(1, ge=0)
    cpus_per_job: int = Field(8, ge=1)
    mem_gb: int | None = Field(None, ge=1, description="host memory per job; default: the partition's")
    timeout_min: int = Field(240, ge=1, description="a job's time limit (minutes)")
    retries: int = Field(2, ge=0, description="how often a failed or preempted job is submitted again")
    max_jobs: int | None = Field(None, ge=1, description="jobs at once; default: every build of the sweep")


class Campaign(Strict):
    """What ``release campaign`` evaluates after each build is made and verified (default: the selection's path and
    split, the least the selection needs), and the splits of its BF16 yardsticks (eager vs torch.compile, seed vs
    seed)."""

    evals: list[CampaignEval] = Field([], description="default: the selection's path and split for every build")
    yardsticks: list[Literal["calibration", "validation", "all"]] = []
