"""``release select``: the release's selection rule (``selection`` in ``builds/release.yaml``) applied to the
fidelity tables of ``release tables``; writes ``<dist>/selection.json``, which ``release card`` tells in "How it was
selected".

The rule, as the seed card states it: the candidates are scored on one path and split; each must pass its own gate
(its build file's, as ``release tables`` computed it), then the lowest overall sigma wins, ties going to the rule's
``tie_break`` metrics in order and last to the order of the candidate list. ``always`` builds (RTN, the reference)
are chosen whatever their scores, and ``count`` more from the top of the ranking among those that pass their gate.
A candidate without results on the rule's path and split, or without a build file, is listed as not evaluated and
cannot be chosen by rank. How often the rule makes the same choice on bootstrap resamples of the observations is
``stability`` (:mod:`release.measure.stability`).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from release.core.builds import load_build, load_release
from release.core.config import Override, ReleaseConfig, builds_dir
from release.core.errors import GateError, ReleaseError
from release.core.io import build_date, output_folder, read_json, sha256_file, write_json
from release.core.rules import Selection
from release.measure.stability import SKIPPED, TIE_BREAK_SIGN, Entry, Skipped, Stability, bootstrap, read_sums
from release.measure.stats import gate_failures

FORMAT = "release-selection/1"
TABLES = Path("tables") / "tables.json"
SELECTION = "selection.json"
NOT_EVALUATED = {"no_build_file": "no build file", "no_results": "no results on the rule's path and split"}


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# the ranges a record's figures can have: an error (RMS, MAE) is finite and not negative, an agreement a fraction
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]


class Scores(_Doc):
    """A candidate's figures on the rule's path and split (from its tables.json record)."""

    overall_sigma: NonNegative
    overall_ci: tuple[NonNegative, NonNegative] | None  # None: too few observations for an interval
    gripper_agree: Fraction
    gripper_ci: tuple[Fraction, Fraction] | None  # None: too few observations
    gripper_changes: Annotated[int, Field(ge=0)]
    joint_mae_deg: NonNegative
    n_obs: Annotated[int, Field(ge=1)]
    n_steps: Annotated[int, Field(ge=1)]


class GateResult(_Doc):
    """The candidate's own gate: the verdict of ``release tables`` and the criteria it fails, with its build file's
    limits (the gripper limit in changes: the rate times the steps)."""

    passed: bool  # by the rule's gate: 'point' (the figures within the limits) or 'interval' (their 95% intervals)
    failed: list[Literal["overall_sigma", "gripper_changes", "within_noise"]]  # within_noise: 'interval' only
    overall_sigma_limit: float
    gripper_changes_limit: float
    # a limit lies inside the 95% interval of its figure, so the verdict could go either way (None: no intervals)
    within_noise: bool | None = None


class Candidate(_Doc):
    build: str
    position: int  # 1-based place in the rule's candidate list (the last tie-break)
    title: str | None  # None: no build file
    rank: int | None  # None: not evaluated on the rule's path and split
    chosen: Literal["always", "rank"] | None
    scores: Scores | None
    gate: GateResult | None
    not_evaluated: Literal["no_build_file", "no_results"] | None
    evaluated_on: list[str]  # every "path/split" of its results

    @model_validator(mode="after")
    def _evaluated_or_why_not(self) -> Candidate:
        evaluated = (self.rank, self.scores, self.gate)
        if self.not_evaluated is None and None in evaluated:
            raise ValueError("an evaluated candidate needs 'rank', 'scores' and 'gate'")
        if self.not_evaluated is not None and evaluated != (None, None, None):
            raise ValueError("a candidate that was not evaluated has no 'rank', 'scores' or 'gate'")
        return self


class Elsewhere(_Doc):
    """The rule applied to another split of its path: the evaluated candidates in ranking order, the builds it would
    choose, and whether that choice (the set, and the first pick by rank) is the selection's."""

    split: Literal["calibration", "validation", "all"]
    ranking: list[str]
    chosen: list[str]
    agrees: bool


class SelectionDoc(_Doc):
    """``selection.json``: the candidates in ranking order (the evaluated ones by the rule, then the others in list
    order), the rule, the date, the tables it was made from, and the chosen builds (``always`` first, then by
    rank)."""

    format: Literal["release-selection/1"]
    date: datetime
    rule: Selection
    tables_sha256: str
    candidates: list[Candidate]
    chosen: list[str]
    # the rule on bootstrap resamples of the observations; None (with why) when it could not be computed, and in a
    # file written before it was recorded (neither field: such a file still reads, and the card omits the figures)
    stability: Stability | None = None
    stability_skipped: Skipped | None = None
    # the same rule on the other splits of its path, beside the choice (the card says when they disagree)
    elsewhere: list[Elsewhere] = []

    @model_validator(mode="after")
    def _stability_or_why_not(self) -> SelectionDoc:
        if self.stability is not None and self.stability_skipped is not None:
            raise ValueError("'stability' and 'stability_skipped' exclude each other")
        return self


def read_tables_doc(path: Path) -> dict[str, Any]:
    """``tables.json`` (``release tables``): its records, baseline, resamples and date. A missing or damaged file is
    a one-line error naming it and the command that rewrites it."""
    doc = read_json(path, "fidelity tables", "release tables", ("records",))
    records = doc["records"]
    if not isinstance(records, list) or not all(isinstance(r, dict) and {"build", "path", "split"} <= r.keys()
                                                for r in records):
        raise ReleaseError(f"{path}: field 'records' must be a list of records with 'build', 'path' and 'split'; "
                           "run 'release tables' to rewrite it")
    return doc


def read_tables(path: Path) -> list[dict[str, Any]]:
    """The records of ``tables.json``."""
    records: list[dict[str, Any]] = read_tables_doc(path)["records"]
    return records


def read_selection(dist: Path) -> SelectionDoc | None:
    """``<dist>/selection.json``, or None when there is none; a damaged one, or one made from other tables than
    ``<dist>/tables/tables.json``, is a one-line error naming it and 'release select'."""
    path = dist / SELECTION
    if not path.exists():
        return None
    raw = read_json(path, "selection", "release select")
    try:
        doc = SelectionDoc.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ReleaseError(f"{path}: field '{field}': {err['msg']}; run 'release select' to rewrite it") from exc
    tables = dist / TABLES
    if not tables.is_file() or sha256_file(tables) != doc.tables_sha256:
        raise ReleaseError(f"{path}: made from other tables than {tables}; run 'release select' to select from the "
                           "current ones")
    return doc


def _record_error(path: Path, record: dict[str, Any], field: str, why: str) -> ReleaseError:
    return ReleaseError(f"{path}: the record of build {record['build']!r} ({record['path']}, {record['split']}): "
                        f"field '{field}' is {record.get(field)!r}: {why}; run 'release tables' to rewrite it")


def _scores(path: Path, record: dict[str, Any]) -> Scores:
    try:
        return Scores.model_validate({k: record.get(k) for k in Scores.model_fields})
    except ValidationError as exc:
        err = exc.errors()[0]
        raise _record_error(path, record, str(err["loc"][0]), err["msg"]) from exc


def _gate(path: Path, record: dict[str, Any], scores: Scores, rule: Selection) -> GateResult:
    """The candidate's gate: the verdict of ``release tables`` and why, against its build file's limits; under
    ``gate: interval`` a pass within noise (or without an interval) fails as ``within_noise``."""
    name = record["build"]
    file = builds_dir() / f"{name}.yaml"
    if not file.is_file():
        raise ReleaseError(f"{path}: has results for build {name!r} but {file} is missing; restore the build file or "
                           "rerun 'release tables'")
    for field in ("gate", "gate_within_noise"):
        if not isinstance(record.get(field), bool) and not (field == "gate_within_noise" and record.get(field) is None):
            raise _record_error(path, record, field, "must be true or false" + (" or null" if "noise" in field else ""))
    limits = load_build(name).gate
    failed: list[Any] = gate_failures(scores.overall_sigma, scores.gripper_changes, scores.n_steps,
                                      limits.overall_sigma, limits.gripper_change_rate)
    if record["gate"] != (not failed):
        raise ReleaseError(f"{path}: the gate of build {name!r} ({'pass' if record['gate'] else 'fail'}) disagrees "
                           f"with the limits in {file} (overall <= {limits.overall_sigma:g}, gripper changes <= "
                           f"{limits.gripper_change_rate * scores.n_steps:g}); the tables are older than the build "
                           "file: rerun 'release tables'")
    noise = record.get("gate_within_noise")
    if rule.gate == "interval" and not failed and noise is not False:
        failed.append("within_noise")
    return GateResult(passed=not failed, failed=failed, overall_sigma_limit=limits.overall_sigma,
                      gripper_changes_limit=limits.gripper_change_rate * scores.n_steps, within_noise=noise)


def rank(rule: Selection, records: list[dict[str, Any]], path: Path) -> tuple[list[Candidate], list[str]]:
    """Every candidate, in ranking order (the evaluated ones by the rule, then the others in list order), and the
    chosen builds (``always`` first, then by rank); ``path`` names tables.json in errors."""
    here = {r["build"]: r for r in records if (r["path"], r["split"]) == (rule.path, rule.split)}
    elsewhere: dict[str, list[str]] = {}
    for r in records:
        elsewhere.setdefault(r["build"], []).append(f"{r['path']}/{r['split']}")
    scored: list[tuple[str, int, Scores, GateResult]] = []
    others: list[tuple[str, int]] = []
    for position, name in enumerate(rule.candidates, start=1):
        record = here.get(name)
        if record is None:
            others.append((name, position))
        else:
            scores = _scores(path, record)
            scored.append((name, position, scores, _gate(path, record, scores, rule)))

    def key(item: tuple[str, int, Scores, GateResult]) -> tuple[Any, ...]:
        _, position, s, g = item
        return (not g.passed, s.overall_sigma, *(TIE_BREAK_SIGN[m] * getattr(s, m) for m in rule.tie_break),
                position)

    scored.sort(key=key)
    by_rank = [name for name, _, _, g in scored if g.passed and name not in rule.always][:rule.count]

    def chosen(name: str) -> Literal["always", "rank"] | None:
        return "always" if name in rule.always else "rank" if name in by_rank else None

    candidates = [Candidate(build=name, position=position, title=here[name].get("title"), rank=i, chosen=chosen(name),
                            scores=s, gate=g, not_evaluated=None, evaluated_on=sorted(elsewhere.get(name, [])))
                  for i, (name, position, s, g) in enumerate(scored, start=1)]
    for name, position in others:
        defined = (builds_dir() / f"{name}.yaml").is_file()
        title = load_build(name).text("title") if defined else None
        candidates.append(Candidate(build=name, position=position, title=title, rank=None, chosen=chosen(name),
                                    scores=None, gate=None,
                                    not_evaluated="no_results" if defined else "no_build_file",
                                    evaluated_on=sorted(elsewhere.get(name, []))))
    return candidates, [*rule.always, *by_rank]


@dataclass(frozen=True)
class SelectRequest:
    release: ReleaseConfig
    rule: Selection
    tables: Path
    out: Path
    dist: Path

    @classmethod
    def create(cls, dist: Path) -> SelectRequest:
        release = load_release()
        if release.selection is None:
            raise ReleaseError(f"{builds_dir() / 'release.yaml'}: no 'selection' section; add one (candidates, path, "
                               "split, tie_break, always, count: see the README) to use 'release select'")
        output_folder(dist, "--dist")
        return cls(release, release.selection, dist / TABLES, dist / SELECTION, dist)


def run_select(request: SelectRequest) -> SelectionDoc:
    """Rank the candidates and write ``selection.json`` (atomically); the date is pinned by ``SOURCE_DATE_EPOCH``."""

    tables = read_tables_doc(request.tables)
    records: list[dict[str, Any]] = tables["records"]
    candidates, chosen = rank(request.rule, records, request.tables)
    stability = selection_stability(request, candidates, chosen)
    made = tables.get("date") if isinstance(tables.get("date"), str) else None
    try:
        date = datetime.fromisoformat(build_date(made))
    except ValueError as exc:
        raise ReleaseError(f"{request.tables}: field 'date' is {made!r}, not an ISO date; run 'release tables' to "
                           "rewrite it") from exc
    doc = SelectionDoc(format=FORMAT, date=date, rule=request.rule,
                       tables_sha256=sha256_file(request.tables), candidates=candidates, chosen=chosen,
                       stability=stability if isinstance(stability, Stability) else None,
                       stability_skipped=None if isinstance(stability, Stability) else stability,
                       elsewhere=other_splits(request.rule, records, request.tables, chosen))
    write_json(request.out, doc.model_dump(mode="json"))
    return doc


def first_pick(chosen: list[str], rule: Selection) -> str | None:
    """The rule's first pick: its best-ranked build chosen by rank (the ``always`` builds are chosen whatever their
    scores), None when no candidate passes its gate."""
    return next((n for n in chosen if n not in rule.always), None)


def other_splits(rule: Selection, records: list[dict[str, Any]], path: Path, chosen: list[str]) -> list[Elsewhere]:
    """The rule on each other split of its path that has results, and whether it agrees with ``chosen``."""
    out = []
    for split in ("calibration", "validation", "all"):
        if split == rule.split or not any((r["path"], r["split"]) == (rule.path, split) for r in records):
            continue
        there = rule.model_copy(update={"split": split})
        candidates, picked = rank(there, records, path)
        agrees = set(picked) == set(chosen) and first_pick(picked, rule) == first_pick(chosen, rule)
        out.append(Elsewhere(split=split, ranking=[c.build for c in candidates if c.rank is not None], chosen=picked,
                             agrees=agrees))
    return out


def selection_stability(request: SelectRequest, candidates: list[Candidate], chosen: list[str]) -> Stability | Skipped:
    """The rule on bootstrap resamples of the observations, for the evaluated candidates (from their results files),
    or why it could not be computed."""
    entries = []
    for c in candidates:
        if c.scores is not None and c.gate is not None:
            build = load_build(c.build)
            entries.append(Entry(build=c.build, repo=build.repo, position=c.position,
                                 overall_sigma=c.scores.overall_sigma, gripper_changes=c.scores.gripper_changes,
                                 n_obs=c.scores.n_obs, n_steps=c.scores.n_steps, limit_sigma=build.gate.overall_sigma,
                                 change_rate=build.gate.gripper_change_rate))
    sums = read_sums(request.rule, request.dist, request.release.policy.action_dims, entries, request.tables)
    return sums if isinstance(sums, str) else bootstrap(request.rule, entries, sums, chosen)


@dataclass(frozen=True)
class Delivery:
    """What the release delivers: the builds its selection chose, less those an ``override`` withholds, plus those
    an override delivers; each with why (``chosen`` by the rule, or the override's reason). Without ``selection.json``
    only the rule's ``always`` builds are known to be chosen."""

    builds: list[str]
    overrides: dict[str, Override]
    selected: bool  # False: no selection.json yet, so only the rule's 'always' builds count as chosen


def delivery(release: ReleaseConfig, doc: SelectionDoc | None) -> Delivery:
    """The delivered builds of ``release`` given its selection (``doc``); an override that changes nothing (it
    delivers a chosen build, or withholds one that was not chosen) is a configuration error (exit 2), since the
    cards would print a reason for nothing."""
    rule = release.selection
    if rule is None:  # no rule: the release delivers every build it names a repo for
        chosen = list(release.repos)
    else:
        chosen = list(doc.chosen) if doc is not None else list(rule.always)
    for name, o in release.override.items():
        known = doc is not None or rule is None  # else a build not chosen yet may still be chosen by rank
        if (o.deliver and name in chosen) or (known and not o.deliver and name not in chosen):
            state = "chose" if o.deliver else "did not choose"
            raise ReleaseError(f"{builds_dir() / 'release.yaml'}: field 'override.{name}' has deliver: "
                               f"{str(o.deliver).lower()}, but the selection {state} {name!r} (chosen: "
                               f"{', '.join(chosen) or 'none'}), so it changes nothing; remove the override")
    withheld = {n for n, o in release.override.items() if not o.deliver}
    builds = [n for n in chosen if n not in withheld]
    builds += [n for n, o in release.override.items() if o.deliver and n not in builds]
    unmapped = next((n for n in builds if n not in release.repos), None)
    if unmapped is not None:
        raise ReleaseError(f"{builds_dir() / 'release.yaml'}: the selection chose {unmapped!r}, which has no repo in "
                           f"'repos'; add '{unmapped}: REPO' there (its build file's repo)")
    return Delivery(builds, dict(release.override), doc is not None or rule is None)


def delivered(release: ReleaseConfig, dist: Path, command: str) -> list[str]:
    """The builds the release delivers by ``dist``'s selection.json, which ``command`` needs (a one-line error
    without it)."""
    doc = read_selection(dist)
    if doc is None:
        raise ReleaseError(f"{dist / SELECTION}: missing; run 'release tables' and 'release select' before '{command}'")
    return delivery(release, doc).builds


def check_delivered(wanted: list[str], have: Delivery, command: str) -> None:
    """``wanted`` (what ``command`` was asked to publish) must be delivered builds: exit 1, naming both sets."""
    outside = [n for n in wanted if n not in have.builds]
    if outside:
        why = "" if have.selected else " (no selection.json yet: run 'release select' for the builds it chooses)"
        raise GateError(f"{command} refused: asked for {', '.join(outside)}, but the release delivers "
                        f"{', '.join(have.builds) or 'nothing'}{why}; publish the selection's choice, or add "
                        f"'override: {{{outside[0]}: {{deliver: true, reason: ...}}}}' to "
                        f"{builds_dir() / 'release.yaml'}")


def ranking_table(doc: SelectionDoc) -> Any:
    """A rich table of the ranking, for the terminal."""
    from rich.table import Table

    rule = doc.rule
    by_rank = sum(c.chosen == "rank" for c in doc.candidates)
    short = f"only {by_rank} of {rule.count} to choose by rank pass their gate" if by_rank < rule.count else None
    stable = doc.stability
    shares = {s.build: s for s in stable.candidates} if stable else {}
    if stable is not None:
        same = (f"the same set is chosen in {stable.same_choice:.1%} of {stable.resamples:,} bootstrap resamples of "
                f"the {stable.observations} observations")
    else:
        same = f"no bootstrap of the choice: {SKIPPED[doc.stability_skipped or 'no_results_file']}"
    caption = "; ".join(c for c in (short, same) if c)
    table = Table(title=f"selection: {rule.path}, {rule.split} (chosen: {', '.join(doc.chosen)})",
                  title_justify="left", caption=caption, caption_justify="left")
    columns = ["rank", "build", "overall sigma", "gripper agree", "changes", "gate", "chosen"]
    for column in columns + (["chosen in resamples"] if stable else []):
        table.add_column(column)
    for c in doc.candidates:
        if c.scores is None or c.gate is None:
            where = f" (has {', '.join(c.evaluated_on)})" if c.evaluated_on else ""
            table.add_row("-", c.build, "-", "-", "-", f"not evaluated: {NOT_EVALUATED[str(c.not_evaluated)]}{where}",
                          c.chosen or "", *(["-"] if stable else []))
            continue
        s = c.scores
        verdict = "[green]pass[/]" if c.gate.passed else f"[red]fail[/] ({', '.join(c.gate.failed)})"
        verdict += ", within noise" if c.gate.within_noise else ""
        table.add_row(str(c.rank), c.build, f"{s.overall_sigma:.4f}", f"{s.gripper_agree:.2%}",
                      f"{s.gripper_changes}/{s.n_steps}", verdict, c.chosen or "",
                      *([f"{shares[c.build].chosen_share:.1%}"] if stable else []))
    return table
