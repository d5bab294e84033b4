"""The sentences under the fidelity tables, each derived from the figures it states: what the intervals and
corrected tests support, which builds share their codes, which are worse than the baseline."""

from __future__ import annotations

import math
from typing import Any

from babel.numbers import format_decimal

from release.core.builds import load_build
from release.measure.paired import ALPHA
from release.measure.stats import decimals, rank_agreement
from release.publish.card.i18n import Formatter, _
from release.publish.card.labels import (
    FAMILIES,
    MEASURED,
    PER_CHANNEL,
    PER_TENSOR,
    VERDICT_LABELS,
    test_label,
    where_label,
)
from release.publish.card.rows import fakequant_for, groups_of, in_group


def _excludes_zero(ci: list[float] | None) -> int:
    """-1: the interval lies below zero, +1: above, 0: it holds zero (or there is none)."""
    if ci is None:
        return 0
    return -1 if ci[1] < 0 else 1 if ci[0] > 0 else 0


def _holm_unsupported(row: dict[str, Any]) -> bool:
    """Holm's correction does not support the difference (its adjusted p is 0.05 or more)."""
    return row.get("diff_p_corrected") is not None and row["diff_p_corrected"] >= 0.05


def _titles(rows: list[dict[str, Any]]) -> str:
    return ", ".join(str(r["title"]) for r in rows)


def _with(rows: list[dict[str, Any]], verdict: str) -> list[dict[str, Any]]:
    return [r for r in rows if r.get("diff_verdict") == verdict]


def margin_text(margin: float | None, f: Formatter) -> str:
    """A margin to two significant digits (0.0021, not 0.002)."""
    return f.num(margin, decimals(None if margin is None else (0.0, margin)))


def _margin(rows: list[dict[str, Any]], f: Formatter) -> str:
    return margin_text(next((r["margin"] for r in rows if r.get("margin") is not None), None), f)


def _within(rows: list[dict[str, Any]], f: Formatter, t: Any) -> str:
    """The builds inside the margin, each significant one with its verdict and Holm p beside it."""
    def one(r: dict[str, Any]) -> str:
        if r["diff_verdict"] not in ("lower", "higher"):
            return str(r["title"])
        return t(_("{build} ({verdict}, Holm-adjusted p = {p})")).format(
            build=r["title"], verdict=t(VERDICT_LABELS[r["diff_verdict"]]), p=f.p(r["diff_p_corrected"]))
    return ", ".join(one(r) for r in rows)


def _family_statements(rows: list[dict[str, Any]], where: str, family: str, baseline: str, f: Formatter,
                       t: Any) -> list[str]:
    """What the tests of one path, split and family support: exactly the builds that are lower, higher (Holm-adjusted
    p < 0.05) and within the margin (Holm-level interval inside it, significant or not)."""
    m = max(r["comparisons"] for r in rows)
    lower, higher = _with(rows, "lower"), _with(rows, "higher")
    same = [r for r in rows if r.get("within_margin")]
    out = [t(_("{where}, {family}: lower error than {baseline} (sign-flip test, Holm-adjusted p < 0.05 over m = "
               "{m}): {builds}.") if lower else
             _("{where}, {family}: no build has a lower error than {baseline} (sign-flip test, Holm-adjusted p < "
               "0.05 over m = {m}).")).format(where=where, family=family, baseline=baseline, m=m,
                                               builds=_titles(lower))]
    if higher:
        out.append(t(_("{where}, {family}: higher error than {baseline} (Holm-adjusted p < 0.05 over m = {m}): "
                       "{builds}.")).format(where=where, family=family, baseline=baseline, m=m, builds=_titles(higher)))
    if same:
        out.append(t(_("{where}, {family}: within +-{margin} sigma of {baseline} (the Holm-adjusted 95% CI lies "
                       "inside the margin, the practical floor of `builds/release.yaml`): {builds}.")).format(
            where=where, family=family, baseline=baseline, margin=_margin(same, f), builds=_within(same, f, t)))
    return out


def _rank_statement(fq: dict[str, dict[str, Any]], other: dict[str, dict[str, Any]], where: str, f: Formatter,
                    t: Any) -> str | None:
    common = [b for b in other if b in fq]
    if len(common) < 3:
        return None
    ra = rank_agreement([fq[b]["overall_sigma"] for b in common], [other[b]["overall_sigma"] for b in common])
    if ra.p is None:
        return t(_("Fake quant and {where} cannot be compared by rank: one of them gives the {n} builds they share "
                   "the same error (Spearman rho undefined).")).format(where=where, n=ra.n)
    figures = t(_("Spearman rho = {rho}, n = {n}, {kind} permutation p = {p}")).format(
        rho=f.num(ra.rho, 2), n=ra.n, kind=t(_("exact")) if ra.exact else t(_("Monte Carlo")), p=f.p(ra.p))
    # The smallest exact p of n builds: 2 / n! for rho = +-1 (the order and its reverse), 2n / n! for the next |rho|
    # (those two and the n - 1 swaps of neighbours, either way); ties only raise them.
    perfect, next_best = 2 / math.factorial(ra.n), 2 * ra.n / math.factorial(ra.n)
    if perfect >= ALPHA:
        return t(_("Fake quant and {where}: too few builds for a rank test ({figures}; with {n} builds even a perfect "
                   "agreement has p = {p}).")).format(where=where, figures=figures, n=ra.n, p=f.p(perfect))
    if next_best >= ALPHA and ra.verdict == "not shown":
        return t(_("Fake quant and {where}: too few builds for a rank test short of a perfect agreement ({figures}; "
                   "with {n} builds only rho = +-1 reaches p < 0.05).")).format(where=where, figures=figures, n=ra.n)
    text = {"alike": _("Fake quant and {where} rank the {n} builds they share alike ({figures})."),
            "opposite": _("Fake quant and {where} rank the {n} builds they share in opposite order ({figures})."),
            "not shown": _("Fake quant and {where}: no rank agreement shown for the {n} builds they share "
                           "({figures}; agreement is stated from |rho| >= 0.5 with p < 0.05).")}[ra.verdict]
    return t(text).format(where=where, n=ra.n, figures=figures)


def conclusions(records: list[dict[str, Any]], baseline: str, f: Formatter, t: Any) -> list[str]:
    """What the paired tests say, as statements naming their path and split: per family which builds are lower,
    higher or within the margin of the baseline (release/measure/paired.py: sign-flip tests, Holm over the builds
    of a path and split, the equivalence margin), whether fake quant and another path rank the builds alike (a
    Spearman rho with its permutation p), how much of each difference two observations carry, and where the
    exploratory family stands on each split."""
    out: list[str] = []
    shown = False
    for path, split in groups_of(records, MEASURED):
        rows = [r for r in in_group(records, path, split, PER_TENSOR) if r.get("diff_to_baseline") is not None]
        if not rows:
            continue
        where = where_label(path, split, t, in_group(records, path, split))
        if any(r.get("diff_verdict") is None for r in rows):
            out.append(t(_("{where}: too few observations to compare the builds with {baseline}."))
                       .format(where=where, baseline=baseline))
            continue
        shown |= any(r["diff_verdict"] in ("lower", "higher") or r.get("within_margin") for r in rows)
        out += _family_statements(rows, where, t(FAMILIES[PER_TENSOR]), baseline, f, t)
    for path, split in groups_of(records, ("served", "deployed")):
        other = {r["build"]: r for r in in_group(records, path, split)}
        where = where_label(path, split, t, other.values())
        rank = _rank_statement(fakequant_for(records, split), other, where, f, t)
        out += [rank] if rank else []
        moved = [r for r in other.values() if r.get("attribution") and r["attribution"]["diff"]
                 and r["attribution"]["diff_without_top"] is not None]
        halved = [r for r in moved if abs(r["attribution"]["diff_without_top"]) < abs(r["attribution"]["diff"]) / 2]
        if moved and 2 * len(halved) > len(moved):
            out.append(t(_("On {where}, most of each difference to {baseline} comes from two observations: without "
                           "them {k} of {n} differences shrink to less than half.")).format(
                where=where, baseline=baseline, k=len(halved), n=len(moved)))
    observations = sorted({r["n_obs"] for r in records if r["path"] in MEASURED})
    if out and not shown and observations:
        out.append(t(_("So these observations ({n} per split) cannot rank the builds of NVIDIA's format against each "
                       "other.")).format(n=", ".join(map(str, observations))))
    out += _exploratory(records, baseline, f, t)
    return [f"- {capital(c)}" for c in out]


def _exploratory(records: list[dict[str, Any]], baseline: str, f: Formatter, t: Any) -> list[str]:
    """Where the per-channel family stands on each fake-quant split, by its tests against the baseline."""
    out = []
    for path, split in groups_of(records, ("fakequant",)):
        explore, nvidia = in_group(records, path, split, PER_CHANNEL), in_group(records, path, split, PER_TENSOR)
        if not explore or not nvidia:
            continue
        best = explore[0]
        beats = _with(explore, "lower")
        lowest = best["overall_sigma"] < nvidia[0]["overall_sigma"]
        text = (_("{where}: the {family} family has the lowest error ({build}, {sigma} sigma) but no build of it is "
                  "shown lower than {baseline} (Holm-adjusted sign-flip test), and NVIDIA's policy server does not "
                  "read its format.") if lowest else
                _("{where}: the {family} family does not have a lower error than NVIDIA's format (best: {build}, "
                  "{sigma} sigma), and NVIDIA's policy server does not read its format.")) if not beats else \
            _("{where}: the {family} family has builds with a lower error than {baseline} (Holm-adjusted sign-flip "
              "test): {builds}; NVIDIA's policy server does not read its format.")
        out.append(t(text).format(where=where_label(path, split, t, explore), family=t(FAMILIES[PER_CHANNEL]),
                                  build=best["title"], sigma=f.num(best["overall_sigma"]), baseline=baseline,
                                  builds=_titles(beats)))
    return out


def capital(text: str) -> str:
    """A sentence or heading that starts with a lower-case label ("fake quant, ...") starts with a capital."""
    return text[:1].upper() + text[1:]


def notes_on_path(records: list[dict[str, Any]], path: str, split: str, baseline: str, f: Formatter,
                   t: Any) -> list[str]:
    """Observations that recur in the attribution, how concentrated the baseline's error is, and the differences
    whose interval excludes zero only before the correction."""
    rows = in_group(records, path, split)
    notes = []
    tops = [set(r["attribution"]["top_observations"]) for r in rows if r.get("attribution")
            and r["attribution"]["diff"]]
    recurring = sorted(set.intersection(*tops)) if len(tops) > 1 else []
    if len(recurring) == 1:
        notes.append(t(_("Observation {ids} is among the two that move the difference most for all {n} builds."))
                     .format(ids=recurring[0], n=len(tops)))
    elif recurring:
        notes.append(t(_("Observations {ids} are the two that move the difference most for all {n} builds."))
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
        if _excludes_zero(r.get("diff_ci")) != 0 and r.get("diff_verdict") == "not shown" and \
                _holm_unsupported(r):
            notes.append(t(_("{build}: the plain 95% CI of its difference to {baseline} excludes zero; Holm's "
                             "correction over m = {m} does not support a difference (adjusted p = {p}).")).format(
                build=r["title"], baseline=baseline, m=r["comparisons"], p=f.p(r["diff_p_corrected"])))
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
    worse = _with(rows, "higher")
    if worse:
        notes.append(t(_("Higher error than {baseline} ({test}, Holm-adjusted p < 0.05 over m = {m}): "
                         "{builds}.")).format(baseline=baseline, m=max(r["comparisons"] for r in worse),
                                              builds=_titles(worse), test=test_label(rows, t)))
    before = [r for r in rows if _excludes_zero(r.get("diff_ci")) > 0 and r.get("diff_verdict") != "higher"
              and _holm_unsupported(r)]
    if before:
        notes.append(t(_("Higher error than {baseline} only before the correction (the plain 95% CI excludes zero, "
                         "Holm's correction over m = {m} does not support it): {builds}.")).format(
            baseline=baseline, m=max(r["comparisons"] for r in before), builds=_titles(before)))
    return notes
