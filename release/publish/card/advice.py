"""The card's opening advice, "Which build to use": the selection's first pick (selection.json), never the
always-chosen reference over a ranked pick without a reason from the data, with the evidence measured for it: its
held-out results on the served or deployed path, its paired difference to the baseline, and its memory; what is
missing is named with the command that measures it."""

from __future__ import annotations

from typing import Any

from release.core.config import ReleaseConfig
from release.measure.select import Delivery, SelectionDoc, first_pick
from release.measure.stats import decimals
from release.publish.card.i18n import Formatter, _
from release.publish.card.labels import MEASURED, baseline_name, estimate, verdict_label, where_label

# Where the evidence for the pick is looked for: the held-out labs through the served and the deployed path; without
# those, every lab (the held-out ones among them).
EVIDENCE = (("served", "validation"), ("deployed", "validation"))
FALLBACK = (("served", "all"), ("deployed", "all"))


def _record(tables: dict[str, Any], build: str, path: str, split: str) -> dict[str, Any] | None:
    return next((r for r in tables["records"] if (r["build"], r["path"], r["split"]) == (build, path, split)), None)


def use_advice(tables: dict[str, Any], have: Delivery, release: ReleaseConfig, selection: SelectionDoc | None,
               f: Formatter, t: Any) -> str:
    """Which delivered build to use and why (module docstring); without a selection, the lowest point estimate of
    the delivered builds on the first path and split that has them."""
    if selection is None:
        return _lowest(tables, have.builds, release, f, t)
    rule = selection.rule
    ranked = [c for c in selection.candidates if c.rank is not None]
    scored = [r for r in tables["records"] if (r["path"], r["split"]) == (rule.path, rule.split)]
    where = where_label(rule.path, rule.split, t, scored)
    picks = [c for c in ranked if c.chosen == "rank" and c.build in have.builds]
    pick = picks[0] if picks else None
    name = pick.build if pick else next((b for b in rule.always if b in have.builds), have.builds[0] if have.builds
                                        else "")
    if not name:
        return t(_("Which build to use: the release delivers no build, so the data name none."))
    record = _record(tables, name, rule.path, rule.split)
    figures = {"title": record["title"] if record else f"`{name}`", "repo": f"{release.org}/{release.repos[name]}",
               "n": len(ranked), "where": where}
    if pick is not None and pick.scores is not None:
        text = t(_("Which build to use: **{title}** (`{repo}`), the selection's first pick: rank {rank} of {n} by "
                   "overall action error on {where}, where it passes its gate ({sigma} sigma).")).format(
            rank=pick.rank, sigma=f.num(pick.scores.overall_sigma), **figures)
        top = first_pick(selection.chosen, rule)
        if top is not None and top != name and top in have.overrides:
            text += " " + t(_("`{top}` ranked above it but is not delivered, because: {reason}")).format(
                top=top, reason=have.overrides[top].reason)
    elif ranked:
        text = t(_("Which build to use: **{title}** (`{repo}`), the reference: no candidate passes its gate on "
                   "{where}, so the selection chose none by rank.")).format(**figures)
    else:
        text = t(_("Which build to use: **{title}** (`{repo}`), the reference: no candidate has results on {where}, "
                   "so the selection could rank none.")).format(**figures)
    return " ".join([text, *_evidence(tables, name, f, t)])


def _evidence(tables: dict[str, Any], name: str, f: Formatter, t: Any) -> list[str]:
    """The pick's held-out served or deployed figures, its difference to the baseline there, and its memory; or
    which of them is missing."""
    baseline = baseline_name(tables)
    found = [r for r in (_record(tables, name, *g) for g in EVIDENCE) if r is not None] or \
        [r for r in (_record(tables, name, *g) for g in FALLBACK) if r is not None]
    if not found:
        return [t(_("It has no results on the deployed path on the held-out labs, so how the exported build behaves "
                    "is not measured: `release eval {name} --path deployed --split validation` measures it."))
                .format(name=name)]
    out = []
    for r in found:
        text = t(_("On {where}: {sigma} sigma over {obs} observations.")).format(
            where=where_label(r["path"], r["split"], t, [r]), sigma=estimate(r["overall_sigma"], r["overall_ci"], f, t),
            obs=r["n_obs"])
        if r["build"] == tables.get("baseline"):
            text += " " + t(_("It is the baseline of the comparisons below."))
        elif r.get("diff_verdict") is None:
            text += " " + t(_("It has no paired test against {baseline} there.")).format(baseline=baseline)
        else:
            text += " " + t(_("Against {baseline}: {verdict} ({diff}, Holm-adjusted sign-flip p = {p}).")).format(
                baseline=baseline, verdict=verdict_label(r, f, t),
                diff=estimate(r["diff_to_baseline"], r["diff_ci_corrected"], f, t, sign=True),
                p=f.p(r["diff_p_corrected"]))
        by_lab = r.get("diff_without_one_lab")
        if by_lab is not None:
            text += " " + t(_("These observations come from {k} labs, so a claim about other labs rests on {k} "
                              "clusters: leaving one lab out at a time, the difference ranges from {lo} to {hi} "
                              "sigma.")).format(k=r["labs"], lo=f.num(by_lab[0], decimals(by_lab), sign=True),
                                                hi=f.num(by_lab[1], decimals(by_lab), sign=True))
        out.append(text)
    out.append(_memory(found, f, t))
    return out


def _memory(records: list[dict[str, Any]], f: Formatter, t: Any) -> str:
    gpu = next((r for r in records if r.get("speed")), None)
    if gpu is not None:
        return t(_("Peak GPU memory during one policy rollout: {gib} GiB on `{device}`.")).format(
            gib=f.num(gpu["speed"]["build"]["peak_gib"], 1), device=gpu["speed"]["build"]["device"])
    cpu = next((r for r in records if "weights_bytes" in r.get("computed", {})), None)
    if cpu is not None:
        return t(_("Its loaded transformer's weights and buffers take {size} (measured on a CPU by the emulation; "
                   "peak GPU memory was not measured).")).format(size=f.size(cpu["computed"]["weights_bytes"]))
    return t(_("Its memory was not measured."))


def _lowest(tables: dict[str, Any], delivered: list[str], release: ReleaseConfig, f: Formatter, t: Any) -> str:
    """Without a selection rule: the delivered build with the lowest overall error on the first group that has one
    (held-out served, deployed, then any)."""
    mine = [r for r in tables["records"] if r["build"] in delivered and r["path"] in MEASURED]
    groups = [*EVIDENCE, *FALLBACK, *sorted({(r["path"], r["split"]) for r in mine})]
    group = next((g for g in groups if any((r["path"], r["split"]) == g for r in mine)), None)
    if group is None:
        return t(_("Which build to use: no delivered build has been evaluated yet, so the data name none."))
    rows = [r for r in mine if (r["path"], r["split"]) == group]
    best = min(rows, key=lambda r: (r["overall_sigma"], delivered.index(r["build"])))
    text = t(_("Which build to use: **{title}** (`{repo}`), the lowest point estimate of overall action error of the "
               "{n} delivered builds evaluated on {where} ({sigma} sigma, {obs} observations).")).format(
        title=best["title"], repo=f"{release.org}/{release.repos[best['build']]}", n=len(rows),
        where=where_label(*group, t, rows), sigma=f.num(best["overall_sigma"]), obs=best["n_obs"])
    return " ".join([text, *_evidence(tables, best["build"], f, t)])
