"""The sentences under the fidelity tables, each derived from the figures it states: what the intervals and
corrected tests support, which builds share their codes, which are worse than the baseline."""

from __future__ import annotations

from typing import Any

from babel.numbers import format_decimal

from release.core.builds import load_build
from release.publish.card.i18n import Formatter, _
from release.publish.card.labels import FAMILIES, MEASURED, PER_CHANNEL, PER_TENSOR, baseline_name, where_label
from release.publish.card.rows import fakequant_for, groups_of, in_group


def _excludes_zero(ci: list[float] | None) -> int:
    """-1: the interval lies below zero, +1: above, 0: it holds zero (or there is none)."""
    if ci is None:
        return 0
    return -1 if ci[1] < 0 else 1 if ci[0] > 0 else 0


def _titles(rows: list[dict[str, Any]]) -> str:
    return ", ".join(str(r["title"]) for r in rows)


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's rank correlation (average ranks for ties), through pandas."""
    import pandas as pd

    return float(pd.Series(a).corr(pd.Series(b), method="spearman"))


def conclusions(records: list[dict[str, Any]], baseline: str, f: Formatter, t: Any) -> list[str]:
    """What the paired differences say, as statements: per family and path whether any build beats the baseline
    with a Bonferroni-corrected interval excluding zero (the builds of one path and split share their observations,
    so their m and N), whether fake quant and another path rank the builds alike, how much of each difference two
    observations carry, and where the exploratory family stands."""
    out: list[str] = []
    significant = False
    for path, split in groups_of(records, MEASURED):
        rows = [r for r in in_group(records, path, split, PER_TENSOR) if r.get("diff_to_baseline") is not None]
        if not rows:
            continue
        where = where_label(path, split, t, in_group(records, path, split))
        if any(r["diff_ci_corrected"] is None for r in rows):
            out.append(t(_("{where}: too few observations to compare the builds with {baseline}."))
                       .format(where=where, baseline=baseline))
            continue
        m = max(r["comparisons"] for r in rows)
        better = [r for r in rows if _excludes_zero(r["diff_ci_corrected"]) < 0]
        significant |= bool(better)
        text = _("{where}, {family}: lower error than {baseline} with a Bonferroni-corrected 95% CI (m = {m}) "
                 "excluding zero: {builds}.") if better else \
            _("{where}, {family}: no build has a lower error than {baseline} with a Bonferroni-corrected 95% CI "
              "(m = {m}) excluding zero.")
        out.append(t(text).format(where=where, family=t(FAMILIES[PER_TENSOR]), baseline=baseline, m=m,
                                  builds=_titles(better)))
    for path, split in groups_of(records, ("served", "deployed")):
        other = {r["build"]: r for r in in_group(records, path, split)}
        fq = fakequant_for(records, split)
        common = [b for b in other if b in fq]
        if len(common) >= 3:
            rho = spearman([fq[b]["overall_sigma"] for b in common], [other[b]["overall_sigma"] for b in common])
            text = _("Fake quant and {where} rank the {n} builds they share in opposite order (Spearman rho = "
                     "{rho}).") if rho < 0 else _("Fake quant and {where} rank the {n} builds they share alike "
                                                  "(Spearman rho = {rho}).")
            out.append(t(text).format(where=where_label(path, split, t, other.values()), n=len(common),
                                      rho=f.num(rho, 2)))
        moved = [r for r in other.values() if r.get("attribution") and r["attribution"]["diff_without_top"] is not None]
        halved = [r for r in moved if abs(r["attribution"]["diff_without_top"]) < abs(r["attribution"]["diff"]) / 2]
        if moved and 2 * len(halved) > len(moved):
            out.append(t(_("On {where}, most of each difference to {baseline} comes from two observations: without "
                           "them {k} of {n} differences shrink to less than half.")).format(
                where=where_label(path, split, t, other.values()), baseline=baseline, k=len(halved), n=len(moved)))
    observations = sorted({r["n_obs"] for r in records if r["path"] in MEASURED})
    if out and not significant and observations:
        out.append(t(_("So these observations ({n} per split) cannot rank the builds of NVIDIA's format against each "
                       "other.")).format(n=", ".join(map(str, observations))))
    for path, split in groups_of(records, ("fakequant",)):
        explore, nvidia = in_group(records, path, split, PER_CHANNEL), in_group(records, path, split, PER_TENSOR)
        if not explore or not nvidia:
            continue
        best = explore[0]
        beats = [r for r in explore if _excludes_zero(r.get("diff_ci_corrected")) < 0]
        lowest = best["overall_sigma"] < nvidia[0]["overall_sigma"]
        text = (_("The {family} family has the lowest fake-quant error ({build}, {sigma} sigma) but no difference to "
                  "{baseline} with a corrected CI excluding zero, and NVIDIA's policy server does not read its "
                  "format.") if lowest else
                _("The {family} family does not have a lower fake-quant error than NVIDIA's format (best: {build}, "
                  "{sigma} sigma), and NVIDIA's policy server does not read its format.")) if not beats else \
            _("The {family} family: lower error than {baseline} with a corrected CI excluding zero: {builds}; "
              "NVIDIA's policy server does not read its format.")
        out.append(t(text).format(family=t(FAMILIES[PER_CHANNEL]), build=best["title"],
                                  sigma=f.num(best["overall_sigma"]), baseline=baseline, builds=_titles(beats)))
        break
    return [f"- {capital(c)}" for c in out]


def capital(text: str) -> str:
    """A sentence or heading that starts with a lower-case label ("fake quant, ...") starts with a capital."""
    return text[:1].upper() + text[1:]


def notes_on_path(records: list[dict[str, Any]], path: str, split: str, baseline: str, f: Formatter,
                   t: Any) -> list[str]:
    """Observations that recur in the attribution, how concentrated the baseline's error is, and the differences
    whose interval excludes zero only before the correction."""
    rows = in_group(records, path, split)
    notes = []
    tops = [set(r["attribution"]["top_observations"]) for r in rows if r.get("attribution")]
    recurring = sorted(set.intersection(*tops)) if len(tops) > 1 else []
    if recurring:
        notes.append(t(_("Observation {ids} is among the two that move the difference most for all {n} builds."))
                     .format(ids=", ".join(map(str, recurring)), n=len(tops)))
    base = next((r for r in rows if r.get("diff_to_baseline") is None and r.get("top3_error_observations")), None)
    if base is not None and base.get("top3_error_share") is not None:
        ids = ", ".join(map(str, base["top3_error_observations"]))
        text = t(_("{baseline} on this path: its three observations with the most error ({ids}) hold {share} of its "
                   "squared error.")).format(baseline=baseline, ids=ids, share=f.pct(base["top3_error_share"], 0))
        fq = fakequant_for(records, split).get(base["build"])
        if path != "fakequant" and fq is not None and fq.get("top3_error_observations") and \
                fq["top3_error_observations"] != base["top3_error_observations"]:
            text += " " + t(_("With the same checkpoint under fake quant, they are {ids}.")).format(
                ids=", ".join(map(str, fq["top3_error_observations"])))
        notes.append(text)
    for r in rows:
        if r.get("diff_ci") is not None and _excludes_zero(r["diff_ci"]) != 0 and \
                _excludes_zero(r.get("diff_ci_corrected")) == 0 and r.get("diff_p_corrected") is not None:
            notes.append(t(_("{build}: the 95% CI of its difference to {baseline} excludes zero, the Bonferroni-"
                             "corrected one (m = {m}) does not (p = {p}).")).format(
                build=r["title"], baseline=baseline, m=r["comparisons"], p=f.p(r["diff_p_corrected"],
                                                                              r["diff_p_bound"])))
    return notes


def same_codes_notes(rows: list[dict[str, Any]], provenances: dict[str, dict[str, Any]], f: Formatter,
                      t: Any) -> list[str]:
    """Builds whose FP8 codes are byte-equal to another build's (the same sha256 of every code) differ only in their
    input scales: say so, with how many of those differ (the seed's AutoRound rows)."""
    notes = []
    titles = {r["build"]: r["title"] for r in rows}

    def steps(p: dict[str, Any]) -> set[str]:
        return set(p.get("recipe", {}).get("steps", [])) - {"rtn"}

    for build in titles:
        mine = provenances.get(build, {})
        codes = mine.get("fp8", {}).get("codes_sha256")
        # the build it extends: the same codes and calibrator, a strict subset of its steps (the most of them)
        twins = sorted((b for b, p in provenances.items() if b != build and codes
                        and p.get("fp8", {}).get("codes_sha256") == codes and steps(p) < steps(mine)
                        and p.get("recipe", {}).get("observer") == mine.get("recipe", {}).get("observer")),
                       key=lambda b: -len(steps(provenances[b])))
        for twin in twins[:1]:
            ours, theirs = mine["fp8"].get("input_amax", {}), provenances[twin]["fp8"].get("input_amax", {})
            differ = sum(ours[k] != theirs.get(k) for k in ours)
            text = _("The FP8 codes of {build} are byte-equal to those of {twin} (all {n} codes); the two differ only "
                     "in their input scales ({k} of {m} differ), so the gap between their rows is the activation "
                     "calibration's.") if ours else \
                _("{build} quantizes exactly as {twin}: byte-equal FP8 codes (all {n}) and no static input scales "
                  "(the scheme computes them per token).")
            notes.append(t(text).format(
                build=titles[build], twin=titles.get(twin) or load_build(twin).text("title", f.lang),
                n=format_decimal(mine["fp8"].get("codes", 0), locale=f.lang), k=differ, m=len(ours)))
    return notes


def worse_notes(rows: list[dict[str, Any]], baseline: str, t: Any) -> list[str]:
    notes = []
    worse = [r for r in rows if _excludes_zero(r.get("diff_ci_corrected")) > 0]
    if worse:
        notes.append(t(_("Higher error than {baseline} with a Bonferroni-corrected 95% CI (m = {m}) excluding zero: "
                         "{builds}.")).format(baseline=baseline, m=max(r["comparisons"] for r in worse),
                                              builds=_titles(worse)))
    before = [r for r in rows if r.get("diff_ci") is not None and _excludes_zero(r["diff_ci"]) > 0
              and _excludes_zero(r.get("diff_ci_corrected")) == 0]
    if before:
        notes.append(t(_("Higher error than {baseline} only before the correction (the plain 95% CI excludes zero, "
                         "the one corrected for m = {m} does not): {builds}.")).format(
            baseline=baseline, m=max(r["comparisons"] for r in before), builds=_titles(before)))
    return notes


# Where the card's opening advice looks first: results on held-out labs through the served, then the deployed path;
# then the same paths on every lab; then the selection rule's own path and split.
ADVICE_ORDER = (("served", "validation"), ("deployed", "validation"), ("served", "all"), ("deployed", "all"))


def use_advice(tables: dict[str, Any], delivered: list[str], repos: dict[str, str], org: str,
               rule: tuple[str, str] | None, f: Formatter, t: Any) -> str:
    """The card's opening: which delivered build to use and why, from the held-out served or deployed results
    where they exist (else the selection rule's path and split, else any path): the lowest overall error among the
    delivered builds there, and whether its paired difference to the baseline supports calling it lower."""
    baseline = baseline_name(tables)
    mine = [r for r in tables["records"] if r["build"] in delivered and r["path"] in MEASURED]
    groups = [*ADVICE_ORDER, *([rule] if rule else []), *sorted({(r["path"], r["split"]) for r in mine})]
    group = next((g for g in groups if any((r["path"], r["split"]) == g for r in mine)), None)
    if group is None:
        return t(_("Which build to use: no delivered build has been evaluated yet, so the data name none."))
    rows = [r for r in mine if (r["path"], r["split"]) == group]
    best = min(rows, key=lambda r: (r["overall_sigma"], delivered.index(r["build"])))
    text = t(_("Which build to use: **{title}** (`{repo}`), the lowest overall action error of the {n} delivered "
               "builds evaluated on {where} ({sigma} sigma, {obs} observations).")).format(
        title=best["title"], repo=f"{org}/{repos[best['build']]}", n=len(rows), where=where_label(*group, t, rows),
        sigma=f.num(best["overall_sigma"]), obs=best["n_obs"])
    if best["build"] == tables.get("baseline", "rtn"):
        return text + " " + t(_("It is the baseline: no delivered build has a lower error there."))
    ci = best.get("diff_ci_corrected")
    if ci is None:
        return text + " " + t(_("It has no paired difference to {baseline} there, so whether it is lower than "
                                "{baseline} is not measured.")).format(baseline=baseline)
    figures = f"{f.num(best['diff_to_baseline'], sign=True)} {f.ci(ci, sign=True)}"
    if _excludes_zero(ci) < 0:
        return text + " " + t(_("Its error is lower than that of {baseline}: the difference, {diff}, has a corrected "
                                "95% CI below zero.")).format(baseline=baseline, diff=figures)
    return text + " " + t(_("Its difference to {baseline}, {diff}, has a corrected 95% CI that does not exclude "
                            "zero: at {obs} observations the data do not show it lower than {baseline}, which serves "
                            "as well.")).format(baseline=baseline, diff=figures, obs=best["n_obs"])
