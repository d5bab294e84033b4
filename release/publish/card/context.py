"""From the data the other stages wrote to a card's template context: ``provenance.json``, the verification
report, ``tables.json`` and ``selection.json``."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from babel.numbers import format_decimal
from huggingface_hub import ModelCardData

from release.check.report import INDEPENDENT, card_name
from release.core.builds import available_builds, load_build
from release.core.config import BuildConfig, ReleaseConfig
from release.core.io import read_json
from release.core.provenance import read_provenance
from release.measure.paired import min_observations
from release.measure.select import Candidate, Delivery, Elsewhere, SelectionDoc
from release.publish.card.advice import use_advice
from release.publish.card.conclusions import conclusions
from release.publish.card.deployed import checked_gpus
from release.publish.card.i18n import Formatter, _, translations
from release.publish.card.labels import (
    CHECK_LABELS,
    CHOSEN,
    GATE_CRITERIA,
    HEADERS,
    MEASURED,
    NOT_EVALUATED,
    PATH_LABELS,
    PER_CHANNEL,
    REFERENCE_ORIGINS,
    SCHEMES,
    SPLIT_LABELS,
    TIE_BREAKS,
    VERDICTS,
    agreement,
    baseline_name,
    build_label,
    build_titles,
    estimate,
    path_label,
)
from release.publish.card.rows import (
    check_statuses,
    fidelity_rows,
    reference_kind,
    speed_lines,
    use_requirements,
    verification_rows,
)
from release.publish.card.sections import (
    constraint_lines,
    decision_rows,
    fakequant_tables,
    path_tables,
    paths_rows,
    recipe_text,
    reproduction,
    scheme_rows,
    setup_rows,
)
from release.publish.card.serving import serving
from release.publish.evaluated import not_evaluated


def source_origin(prov: dict[str, Any]) -> str:
    """How the build's source revision is known (``release.inputs.source.Revision``): a Hub commit ("hub cache",
    "hf download"), a content sha256 of a plain folder ("content hash"), or the tool's fixture, random weights of the
    real architecture ("fixture", also for a provenance that does not record it)."""
    return str(prov["source"].get("origin", "fixture"))


def card_metadata(release: ReleaseConfig, prov: dict[str, Any]) -> ModelCardData:
    """The Hub's metadata: ``language`` is the model's (its instructions'), not the card's; ``datasets`` names the
    observation set's dataset when it has a Hub id (a LeRobot import from the Hub). A build of the fixture names no
    base model: it is no quantization of NVIDIA's model, and the Hub infers a relation from ``base_model`` alone."""
    dataset = prov.get("calibration", {}).get("dataset")
    fixture = source_origin(prov) == "fixture"
    return ModelCardData(
        base_model=None if fixture else release.base_model,
        base_model_relation=None if fixture else "quantized",
        license=release.license.id,
        license_name=release.license.name,
        license_link=release.license.link,
        pipeline_tag="robotics",
        library_name=release.library_name,
        tags=release.tags,
        language=release.instruction_languages,
        datasets=[dataset] if dataset else None,
    )


def comparison_context(release: ReleaseConfig, build: BuildConfig, prov: dict[str, Any], tables: dict[str, Any],
                       selection: SelectionDoc | None, have: Delivery, provenances: dict[str, dict[str, Any]],
                       langs: list[str], f: Formatter, t: Any) -> dict[str, Any] | None:
    """The seed's "algorithm comparison": every build of the sweep in tables.json, by path and family, with the
    statements the paired differences support; None when tables.json holds this build alone."""
    records = tables["records"]
    measured = [r for r in records if r["path"] in MEASURED]
    if len({r["build"] for r in measured}) < 2:
        return None
    baseline = baseline_name(tables)
    date = dt.datetime.fromisoformat(tables["date"]).date() if tables.get("date") else \
        dt.datetime.fromisoformat(prov["date"]).date()
    me = next((r for r in measured if r["build"] == build.name), None)
    paths = path_tables(records, baseline, 2, f, t)
    fakequant = fakequant_tables(records, baseline, provenances, 2 + len(paths), f, t)
    section = 1 + len(paths) + len(fakequant)
    titles = build_titles(have.builds, f.lang)
    return {
        "date": f.date(date), "title": build_label(me, t) if me else build.text("title", f.lang),
        "baseline": baseline,
        "siblings": [{"build": f"{titles.get(b, f'`{b}`')} ({t(_('delivered'))})",
                      "repo": f"{release.org}/{release.repos[b]}"} for b in have.builds],
        "conclusions": conclusions(records, baseline, f, t),
        "setup": setup_rows(records, release, build, prov, int(tables.get("resamples", 10_000)), baseline, f, t),
        "paths": paths_rows(records, t), "path_tables": paths, "fakequant_tables": fakequant,
        "decision_heading": f"{section + 1}. " + t(_("Decision and remaining work")),
        "decision": decision_rows(records, release, have.builds, baseline, selection, f, t),
        "constraints_heading": f"{section + 2}. " + t(_("Constraints")),
        "constraints": constraint_lines(records, selection, t),
        "reproduction_heading": f"{section + 3}. " + t(_("Reproduction")),
        "commands": reproduction(records, release, build, selection, langs),
        "reproduction_note": t(_("This repository's build file and the release's `release.yaml` are uploaded beside "
                                 "the checkpoint in `builds/`: with the same source revision (`{revision}`) and "
                                 "observations, `RELEASE_BUILDS=builds release build {name}` remakes it.")).format(
            revision=prov["source"]["revision"], name=build.name),
    }


def card_context(release: ReleaseConfig, build: BuildConfig, folder: Path, tables: dict[str, Any],
                 selection: SelectionDoc | None, have: Delivery, provenances: dict[str, dict[str, Any]], lang: str,
                 langs: list[str], plot: str) -> dict[str, Any]:
    t = translations(lang).gettext
    f = Formatter(lang)
    all_records = tables["records"]
    prov = read_provenance(folder / "provenance.json", build.name)
    report_path = folder / "verification" / "report.json"
    report = read_json(report_path, "verification report", f"release verify {build.name}", ("checks",))
    statuses = check_statuses(report, report_path, build.name)
    kind = reference_kind(report)
    independent = kind == INDEPENDENT  # only a checkpoint this tool did not make backs "as in NVIDIA's"
    mine = [r for r in all_records if r["build"] == build.name]
    if not mine:
        raise not_evaluated(build.name)
    baseline = [r for r in all_records if r["build"] == tables.get("baseline", "rtn") and r["build"] != build.name]
    yardsticks = [r for r in all_records if r["path"] == "yardstick"]
    date = dt.datetime.fromisoformat(prov["date"]).date()
    passed = [r for r in mine if r["gate"]]
    gate_verdict = t(_("It passes the gate on: {paths}.")).format(
        paths=", ".join(f"{path_label(r['path'], t, [r])} ({t(SPLIT_LABELS[r['split']])})" for r in passed)) \
        if passed else t(_("It does not pass the gate on any evaluated path."))
    splits = {r["split"] for r in mine}
    caveats = []
    if "calibration" in splits:
        caveats.append(t(_("Rows on the calibration labs are in-sample: the same observations calibrated the "
                           "activation scales, so their errors are optimistic.")))
    if splits & {"validation"}:
        caveats.append(t(_("Rows on the held-out labs use observations that calibration never saw.")))
    else:
        caveats.append(t(_("No held-out observations were evaluated; a ranking of builds needs them.")))
    if not build.deliverable:
        caveats.append(t(_("This build is exploratory and not deliverable: NVIDIA's policy server cannot serve its "
                           "scheme.")))
    caveats.append(t(_("The numbers come from the evaluation data named in `provenance.json` and "
                       "`results/`; a different robot setup can behave differently.")))
    sibling_titles = build_titles(have.builds, lang)
    siblings = [{"repo_id": f"{release.org}/{release.repos[b]}", "title": sibling_titles.get(b, f"`{b}`"),
                 "current": b == build.name} for b in have.builds]
    languages_line = " | ".join(
        f"[{code}]({card_name(code, code == langs[0])})" for code in langs
    ) if len(langs) > 1 else ""
    source = prov["source"]
    origin = {"hub cache": _("the Hub commit, from the local Hugging Face cache"),
              "hf download": _("the Hub commit that `hf download --local-dir` recorded"),
              "fixture": _("the tiny fixture's content hash: random weights of the real architecture, not the model"),
              "content hash": _("a content hash of the source folder, which records no Hub commit, so it was not "
                                "checked against the release's base_revision")}.get(source.get("origin", "fixture"))
    source_note = t(origin or "")
    if source.get("revision_mismatch"):
        source_note += " " + t(_("It is not the release's pinned base_revision `{base}`: built with "
                                 "`--allow-revision-mismatch`.")).format(base=source.get("base_revision", "?"))
    return {
        "release": release, "prov": prov, "repo_id": f"{release.org}/{build.repo}",
        "title": f"{release.base_model.split('/')[-1]}, {build.text('title', lang)} ({t(SCHEMES[build.scheme])})",
        "description": build.text("description", lang), "siblings": siblings, "languages_line": languages_line,
        "advice": use_advice(tables, have, release, selection, f, t),
        "delivered": build.name in have.builds,
        "deliverable": build.deliverable, "build_name": build.name,
        "per_channel": build.scheme == PER_CHANNEL, "use": use_requirements(prov, mine, f, t),
        "checked_gpus": checked_gpus(mine, t),
        "serving": serving(folder, release, mine, build.name, build.deliverable, t),
        "license_copied": bool(source.get("license")), "origin": source_origin(prov),
        "independent": independent, "recipe_text": recipe_text(build, t, independent),
        "scheme": scheme_rows(build, prov, t, independent), "source_note": source_note,
        "built_date": f.date(date), "gate_sigma": f.num(build.gate.overall_sigma, 2),
        "gate_rate": f.pct(build.gate.gripper_change_rate, 1), "gate_verdict": gate_verdict,
        "verification_reference": Path(report["reference"]).name if report.get("reference") else "",
        "verification_origin": t(REFERENCE_ORIGINS[kind]) if kind in REFERENCE_ORIGINS else "",
        "verification": verification_rows(report, statuses, report_path, build, f, t),
        "verification_skipped": ", ".join(t(CHECK_LABELS[c["name"]]) for c, status in zip(report["checks"], statuses,
                                                                                          strict=True)
                                          if status == "skipped"),
        "plot": plot, "min_obs": min_observations(),
        "fidelity_rows": fidelity_rows(mine + baseline + yardsticks, f, t), "speed": speed_lines(mine, f, t),
        "comparison": comparison_context(release, build, prov, tables, selection, have, provenances, langs, f, t),
        "caveats": caveats,
        "selection": selection_context(selection, have, build, f, t),
        "h": {k: t(v) for k, v in HEADERS.items()},
    }


def selection_context(doc: SelectionDoc | None, have: Delivery, build: BuildConfig, f: Formatter,
                      t: Any) -> dict[str, Any] | None:
    """"How it was selected" from ``selection.json``: the rule in words, the ranking, and this build's place in it;
    None without a selection (the section then states the build date and gate only)."""
    if doc is None:
        return None
    rule = doc.rule
    ranked = [c for c in doc.candidates if c.rank is not None]
    observations = sorted({c.scores.n_obs for c in doc.candidates if c.scores is not None})
    ties = t(_(", then ")).join([*(t(TIE_BREAKS[m]) for m in rule.tie_break), t(_("the order of the candidate list"))])
    text = t(_("Selected on {date} from {n} candidate builds of the same scheme, scored against the BF16 original by "
               "{path} on {obs} observations of the {split}: a candidate must pass its own gate, then the lowest "
               "overall action error wins; ties go to {ties}.")).format(
        date=f.date(doc.date.date()), n=len(rule.candidates), path=t(PATH_LABELS[rule.path]),
        split=t(SPLIT_LABELS[rule.split]), obs=", ".join(map(str, observations)) or "0", ties=ties)
    if rule.always:
        text += " " + t(_("Chosen in any case, as the reference: {builds}.")).format(
            builds=", ".join(f"`{b}`" for b in rule.always))
    chosen = [c.build for c in doc.candidates if c.chosen == "rank"]
    text += " " + t(_("Chosen by rank, up to {count} that pass their gate: {builds}.")).format(
        count=rule.count, builds=", ".join(f"`{b}`" for b in chosen) or t(_("none")))
    if rule.gate == "interval":
        text += " " + t(_("A candidate passes its gate only when the whole 95% interval of each gated figure is "
                          "within its limit."))
    elif any(c.gate is not None and c.gate.within_noise for c in doc.candidates):
        text += " " + t(_("A gate verdict marked \"within noise\" has its limit inside the 95% interval of the "
                          "figure it judges: more observations could reverse it."))
    text += "".join(" " + _other_split(e, rule.split, t) for e in doc.elsewhere)

    def place(c: Candidate) -> str:
        if c.rank is None:
            return t(NOT_EVALUATED[str(c.not_evaluated)])
        return t(_("rank {rank} of {n}")).format(rank=c.rank, n=len(ranked))

    mine = next((c for c in doc.candidates if c.build == build.name), None)
    verdict = t(_("This build is not one of the candidates.")) if mine is None else \
        t(VERDICTS[mine.chosen]).format(rank=place(mine))
    override = have.overrides.get(build.name)
    if override is not None:
        where = place(mine) if mine is not None else t(_("not a candidate"))
        verdict = t(_("Delivered although {rank} and not chosen, because: {reason}") if override.deliver else
                    _("Not delivered although chosen ({rank}), because: {reason}")).format(rank=where,
                                                                                           reason=override.reason)
    stable = doc.stability
    shares = {s.build: s.chosen_share for s in stable.candidates} if stable else {}
    stability = None
    if stable is not None:
        resamples = format_decimal(stable.resamples, locale=f.lang)
        stability = t(_("Stability of the choice: the rule was applied again, gates included, to each of {resamples} "
                        "bootstrap resamples of the {obs} observations (drawn with replacement, the same draw for "
                        "every candidate). The same set is chosen in {same} of resamples; the last column gives the "
                        "share of resamples in which each candidate is chosen.")).format(
            resamples=resamples, obs=stable.observations, same=f.pct(stable.same_choice, 1))
        if stable.same_choice < 0.5:
            stability = t(_("The choice is not stable: the same set of builds is chosen in only {same} of bootstrap "
                            "resamples of the observations.")).format(same=f.pct(stable.same_choice, 1)) + " " + \
                stability
        if build.name in shares:
            verdict += " " + t(_("The rule chooses it in {share} of {resamples} bootstrap resamples of the "
                                 "observations.")).format(share=f.pct(shares[build.name], 1), resamples=resamples)
    gate = {True: t(_("pass")), False: t(_("fail"))}
    titles = build_titles([c.build for c in doc.candidates], f.lang)
    rows = []
    for c in doc.candidates:
        row = {"rank": str(c.rank or "-"), "build": titles.get(c.build) or c.title or f"`{c.build}`", "overall": "-",
               "gripper": "-", "changes": "-", "gate": place(c), "chosen": t(CHOSEN[c.chosen]) if c.chosen else "-",
               "share": f.pct(shares[c.build], 1) if c.build in shares else "-"}
        if c.scores is not None and c.gate is not None:
            s = c.scores
            failed = ", ".join(t(GATE_CRITERIA[k]) for k in c.gate.failed)
            row.update(overall=estimate(s.overall_sigma, list(s.overall_ci) if s.overall_ci else None, f, t),
                       gripper=agreement(s.gripper_agree, list(s.gripper_ci) if s.gripper_ci else None, f, t),
                       changes=f"{s.gripper_changes} / {s.n_steps}",
                       gate=(f"{gate[c.gate.passed]} ({failed})" if failed else gate[c.gate.passed]) +
                       (t(_(", within noise")) if c.gate.within_noise else ""))
        rows.append(row)
    return {"text": text, "verdict": verdict, "rows": rows, "stability": stability}


def _other_split(e: Elsewhere, scored: str, t: Any) -> str:
    """How the same rule ranks on another split, and whether it would choose the same builds."""
    ranking = ", ".join(f"`{b}`" for b in e.ranking) or t(_("none"))
    text = t(_("On the {split} the same rule ranks {ranking} and would choose {chosen}.")).format(
        split=t(SPLIT_LABELS[e.split]), ranking=ranking, chosen=", ".join(f"`{b}`" for b in e.chosen) or t(_("none")))
    if e.agrees:
        return text + " " + t(_("That is the same choice."))
    return text + " " + t(_("The two splits disagree: the choice above is the one made on the {split}.")).format(
        split=t(SPLIT_LABELS[scored]))


def sweep_provenances(dist: Path) -> dict[str, dict[str, Any]]:
    """The provenance.json of every build in ``dist`` (the comparison compares their FP8 codes and input scales)."""
    out = {}
    for name in available_builds():
        path = dist / load_build(name).repo / "provenance.json"
        if path.is_file():
            out[name] = read_provenance(path, name)
    return out
