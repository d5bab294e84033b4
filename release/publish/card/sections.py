"""The campaign's sections of a card: setup, paths, decision, constraints, reproduction, the recipe and its
scheme."""

from __future__ import annotations

import math
from typing import Any

from babel.numbers import format_decimal

from release.core.config import BuildConfig, ReleaseConfig
from release.measure.select import SelectionDoc
from release.publish.card.conclusions import capital, notes_on_path, same_codes_notes, worse_notes
from release.publish.card.deployed import deployed_how, kernels
from release.publish.card.i18n import Formatter, _
from release.publish.card.labels import (
    FAMILIES,
    MEASURED,
    NOT_DELIVERABLE,
    PATH_HEADERS,
    PATH_HOW,
    PATH_LABELS,
    PATH_REFERENCE,
    PER_CHANNEL,
    SPLIT_LABELS,
    scheme_of,
    served_computations,
    served_how,
    served_imported,
    test_label,
    verdict_label,
    where_label,
)
from release.publish.card.rows import attribution_rows, diff_headers, groups_of, in_group, path_rows, ranking_rows


def _sweep_order(release: ReleaseConfig, names: set[str]) -> list[str]:
    ordered = [n for n in release.sweep if n in names]
    return ordered + sorted(names - set(ordered))


def setup_rows(records: list[dict[str, Any]], release: ReleaseConfig, build: BuildConfig, prov: dict[str, Any],
               resamples: int, baseline: str, f: Formatter, t: Any) -> list[dict[str, str]]:
    """The seed's "experiment setup" from the data: what was quantized, how, on which data, and how it was scored."""
    measured = [r for r in records if r["path"] in MEASURED]
    layers = prov["source"].get("architecture", {}).get("num_hidden_layers", "?")
    calibration, policy = prov["calibration"], release.policy
    passes = 2 if policy.guidance > 1 else 1
    calls = t(_("{calls} transformer calls of the BF16 policy ({obs} observations x {steps} denoising steps x {cfg} "
                "CFG passes)")).format(calls=calibration["calls"], obs=calibration["observations"], steps=policy.steps,
                                       cfg=passes) \
        if calibration["calls"] == calibration["observations"] * policy.steps * passes else \
        t(_("{calls} transformer calls of the BF16 policy on {obs} observations")).format(
            calls=calibration["calls"], obs=calibration["observations"])
    schemes = {scheme_of(r) for r in measured}
    scheme = t(_("FP8 E4M3 W8A8, weights per tensor, activations per tensor and static (as `nvidia/Cosmos3-Nano@fp8`)"))
    if PER_CHANNEL in schemes:
        scheme += "; " + t(_("the exploratory family: weights per output channel, activations per token (dynamic)"))
    splits = [(s, n) for s in SPLIT_LABELS for n in sorted({r["n_obs"] for r in measured if r["split"] == s})]
    steps = [r["n_steps"] for r in measured]
    limit = math.floor(build.gate.gripper_change_rate * steps[0] + 1e-9) if steps else 0
    compile_ys = next((r for r in records if r["build"] == "yardstick-compile"), None)
    seed_ys = next((r for r in records if r["build"] == "yardstick-seed"), None)
    rows = [
        (_("Quantized"), t(_("{n} Linear layers of the transformer: both towers x {layers} layers x `q/k/v/o` and "
                            "`gate/up/down`; what is not quantized is in the Scheme table")).format(
            n=prov["quantized_linears"], layers=layers)),
        (_("Scheme"), scheme),
        (_("Export"), t(_("ModelOpt {version} in NVIDIA's diffusers layout")).format(
            version=prov["versions"]["modelopt"])),
        (_("Algorithm data"), t(_("{n} transformer calls, one per observation")).format(n=build.algorithm_calls)),
        (_("Activation calibration"), calls),
        (_("Algorithm parameters"), t(_("ModelOpt's defaults unless the build says otherwise: every build's "
                                        "parameters are in its build file, uploaded beside its checkpoint"))),
        (_("Evaluation observations"), "; ".join(t(_("DROID, {n} observations: {split}")).format(
            n=n, split=t(SPLIT_LABELS[s])) for s, n in splits)),
        (_("Error metrics"), t(_("overall: normalised action RMS in units of DROID's per-dimension action sigma; "
                                 "changes: steps whose binarized gripper (open / closed) differs from BF16"))),
        (_("Baseline"), baseline),
        (_("Statistics"), t(_("studentized bootstrap over observations, {r} resamples; the differences to {baseline} "
                              "tested on paired observations ({test}), Holm-adjusted over the builds of a path and "
                              "split"))
         .format(r=format_decimal(resamples, locale=f.lang), baseline=baseline, test=test_label(measured, t))),
        (_("Gate"), t(_("overall <= {sigma} sigma, gripper changes <= {rate} (<= {k} / {steps})")).format(
            sigma=f.num(build.gate.overall_sigma, 2), rate=f.pct(build.gate.gripper_change_rate, 1), k=limit,
            steps=steps[0] if steps else 0)),
    ]
    if compile_ys or seed_ys:
        sizes = []
        if compile_ys:
            sizes.append(t(_("BF16 eager vs torch.compile {x} sigma")).format(x=f.num(compile_ys["overall_sigma"])))
        if seed_ys:
            sizes.append(t(_("BF16 with only the noise seed changed {x} sigma")).format(
                x=f.num(seed_ys["overall_sigma"])))
        rows.append((_("Yardsticks"), ", ".join(sizes)))
    return [{"item": t(item), "value": value} for item, value in rows]


def paths_rows(records: list[dict[str, Any]], t: Any) -> list[dict[str, str]]:
    measured = [r for r in records if r["path"] in MEASURED]
    total = len({r["build"] for r in measured})
    rows = []
    for path in MEASURED:
        n = len({r["build"] for r in measured if r["path"] == path})
        if n:
            count = t(_("all {n}")).format(n=n) if n == total else t(_("{n} of {total}")).format(n=n, total=total)
            how = deployed_how(measured, t) if path == "deployed" else served_how(measured, t) \
                if path == "served" else t(PATH_HOW[path])
            computed = path == "served" and not served_imported(measured)  # the same pipeline as the deployed path
            rows.append({"path": t(PATH_LABELS[path]), "how": how,
                         "reference": t(PATH_REFERENCE["deployed" if computed else path]), "builds": count})
    return rows


def decision_rows(records: list[dict[str, Any]], release: ReleaseConfig, delivered_builds: list[str], baseline: str,
                  selection: SelectionDoc | None, f: Formatter, t: Any) -> list[dict[str, str]]:
    """The release's decision as the data stand: the delivered builds and their gates, the builds evaluated on more
    than one path and why they are not delivered, and what would settle the ranking."""
    measured = [r for r in records if r["path"] in MEASURED]
    by_build: dict[str, list[dict[str, Any]]] = {}
    for r in measured:
        by_build.setdefault(r["build"], []).append(r)
    delivered = [b for b in delivered_builds if b in by_build]
    titles = {b: rs[0]["title"] for b, rs in by_build.items()}

    def paths(rows: list[dict[str, Any]]) -> str:
        return ", ".join(where_label(r["path"], r["split"], t, [r]) for r in rows)

    passing = [b for b in delivered if all(r["gate"] for r in by_build[b])]
    content = t(_("{builds}; passing the gate on every evaluated path: {passing}.")).format(
        builds=", ".join(titles[b] for b in delivered) or "-",
        passing=", ".join(titles[b] for b in passing) or t(_("none")))
    if baseline in (titles[b] for b in delivered):
        content += " " + t(_("{baseline} is delivered as the reference that the others are compared with.")).format(
            baseline=baseline)
    out = [{"item": t(_("Delivered")), "content": content}]
    for b, rows in by_build.items():
        if b in delivered or len({r["path"] for r in rows}) < 2:
            continue
        failed = [r for r in rows if not r["gate"]]
        if failed:
            text = t(_("fails the gate on {paths}")).format(paths=paths(failed))
        else:
            other = next(r for r in rows if r["path"] != "fakequant")
            rivals = [r for d in delivered for r in by_build[d] if (r["path"], r["split"]) == (other["path"],
                                                                                             other["split"])]
            best = min(rivals, key=lambda r: r["overall_sigma"], default=None)
            if best is not None and other["overall_sigma"] >= best["overall_sigma"]:
                text = t(_("passes the gate on every evaluated path ({paths}), but its point estimate of error is not "
                           "below that of {best} ({a} vs {b} sigma, {where}), so it is not added")).format(
                    paths=paths(rows), best=best["title"], a=f.num(other["overall_sigma"]),
                    b=f.num(best["overall_sigma"]), where=where_label(other["path"], other["split"], t, [other]))
            else:
                text = t(_("passes the gate on every evaluated path ({paths}) and its point estimate of error is below "
                           "that of every delivered build on {where}; it is tested against {baseline} alone there "
                           "(verdict: {verdict}), not against each delivered build; not delivered")).format(
                    paths=paths(rows), where=where_label(other["path"], other["split"], t, [other]),
                    baseline=baseline, verdict=verdict_label(other, f, t))
        out.append({"item": str(titles[b]), "content": text})
    out.append({"item": t(_("To settle the ranking")), "content": _settle(measured, release, selection, f, t)})
    return out


def _settle(measured: list[dict[str, Any]], release: ReleaseConfig, selection: SelectionDoc | None, f: Formatter,
            t: Any) -> str:
    """What the data leave open about the ranking: where the selection scored, whether another split disagrees, and
    how often the choice recurs in bootstrap resamples."""
    labs = ", ".join(release.heldout_labs)
    if not any(r["split"] == "validation" for r in measured):
        return t(_("Evaluate again on observations from labs that calibration did not use ({labs}): `release eval "
                   "NAME... --split validation`.")).format(labs=labs)
    if selection is None:
        return t(_("The builds were evaluated on held-out labs ({labs}); no selection was made from them: run "
                   "`release select`.")).format(labs=labs)
    if selection.rule.split != "validation":
        return t(_("The selection scored the {split}; results on the held-out labs ({labs}) exist: select on them "
                   "(`selection.split: validation` in `builds/release.yaml`).")).format(
            split=t(SPLIT_LABELS[selection.rule.split]), labs=labs)
    text = t(_("The selection scored the held-out labs ({labs}), which calibration never saw.")).format(labs=labs)
    if any(not e.agrees for e in selection.elsewhere):
        text += " " + t(_("The same rule on the other splits chooses otherwise (How it was selected)."))
    stable = selection.stability
    if stable is not None and stable.same_choice < 0.5:
        text += " " + t(_("The choice is not stable: it recurs in only {same} of bootstrap resamples; more held-out "
                          "observations would settle it.")).format(same=f.pct(stable.same_choice, 1))
    elif stable is not None:
        text += " " + t(_("The same choice recurs in {same} of bootstrap resamples.")).format(
            same=f.pct(stable.same_choice, 1))
    return text


def constraint_lines(records: list[dict[str, Any]], selection: SelectionDoc | None, t: Any) -> list[str]:
    measured = [r for r in records if r["path"] in MEASURED]
    out = []
    if any(r["split"] == "calibration" for r in measured) or (selection and selection.rule.split == "calibration"):
        out.append(t(_("The evaluation on the calibration labs is in-sample: the calibration calls, the algorithm "
                       "data and the selection come from those observations.")))
    if any(scheme_of(r) == PER_CHANNEL for r in measured):
        out.append(t(_("The per-channel builds are exploratory: they are not deliverable in the current format "
                       "(see their fake-quant tables).")))
    if not any(r["path"] == "served" for r in measured) and any(r["path"] == "deployed" for r in measured):
        out.append(t(_("No policy-server results were imported: the deployed rows are diffusers with {kernels}, not "
                       "NVIDIA's policy server.")).format(kernels=kernels(measured, t)))
    return [f"- {c}" for c in out]


def reproduction(records: list[dict[str, Any]], release: ReleaseConfig, build: BuildConfig,
                 selection: SelectionDoc | None, langs: list[str]) -> list[str]:
    """The commands that made these tables, from the records: build, each eval's builds, path and split, import of
    served results, tables, select, card."""
    measured = [r for r in records if r["path"] in MEASURED]
    names = _sweep_order(release, {r["build"] for r in measured})
    data = "--source SOURCE --observations OBSERVATIONS"
    lines = [f"release build --all {data}" if release.sweep and set(names) >= set(release.sweep)
             else f"release build {' '.join(names)} {data}"]
    yardstick_splits = {r["split"] for r in records if r["path"] == "yardstick"}
    chosen = set(selection.chosen) if selection else set()
    after: list[str] = []  # the evaluations of the chosen builds, after the selection (as the campaign runs them)
    for path, split in groups_of(records, ("fakequant", "deployed", "served")):
        group = _sweep_order(release, {r["build"] for r in in_group(records, path, split)
                                       if path != "served" or served_computations([r])})
        if not group:  # served results that were imported, not computed: their import lines follow
            continue
        extra = " --yardsticks" if split in yardstick_splits else ""
        yardstick_splits.discard(split)
        if path != "fakequant" and set(group) == chosen:
            after.append(f"release eval --chosen --path {path} --split {split} {data}{extra}")
            continue
        which = "--all" if release.sweep and group == list(release.sweep) else " ".join(group)
        lines.append(f"release eval {which} --path {path} --split {split} {data}{extra}")
    lines += [f"release import-served {b} {b}-served.npz" for b in
              _sweep_order(release, {r["build"] for r in measured if served_imported([r])})]
    select = ["release tables", *(["release select"] if selection else [])]
    lines += [*(select + after if after else []), *select, f"release card --lang {','.join(langs)}"]
    return lines


def path_tables(records: list[dict[str, Any]], baseline: str, first: int, f: Formatter, t: Any
                ) -> list[dict[str, Any]]:
    """The seed's section 2 for each served or deployed path and split (numbered from ``first``): the results, where
    the differences come from, and what recurs."""
    tables = []
    for section, (path, split) in enumerate(groups_of(records, ("served", "deployed")), start=first):
        group = in_group(records, path, split)
        tables.append({
            "heading": f"{section}. {capital(where_label(path, split, t, group))}",
            "headers": {k: t(v) for k, v in PATH_HEADERS[path].items() if k != "diff_m"} | diff_headers(group, t, path),
            "rows": path_rows(records, path, split, f, t),
            "attribution": attribution_rows(group, f, t),
            "attribution_intro": t(_("Where the differences to {baseline} come from on {where}, observation by "
                                     "observation:")).format(baseline=baseline,
                                                             where=where_label(path, split, t, group)),
            "notes": notes_on_path(records, path, split, baseline, f, t)})
    return tables


def fakequant_tables(records: list[dict[str, Any]], baseline: str, provenances: dict[str, dict[str, Any]],
                     first: int, f: Formatter, t: Any) -> list[dict[str, Any]]:
    """The seed's section 3 for each fake-quant split (numbered from ``first``): a ranking per family of the sweep,
    NVIDIA's format first, with what the differences and the builds' codes say."""
    tables = []
    for section, (path, split) in enumerate(groups_of(records, ("fakequant",)), start=first):
        families = []
        for i, scheme in enumerate(s for s in FAMILIES if in_group(records, path, split, s)):
            rows = in_group(records, path, split, scheme)
            families.append({
                "heading": f"{section}.{i + 1} {t(FAMILIES[scheme])}: " + t(_("{n} builds")).format(n=len(rows)),
                "steps": rows[0]["n_steps"], "headers": diff_headers(rows, t), "rows": ranking_rows(rows, f, t),
                "vs": t(_("The differences are to {baseline} in NVIDIA's format (per tensor).")).format(
                    baseline=baseline) if scheme == PER_CHANNEL else "",
                "notes": same_codes_notes(rows, provenances, f, t) + worse_notes(rows, baseline, t),
                "reasons": [t(r) for r in NOT_DELIVERABLE] if scheme == PER_CHANNEL else []})
        tables.append({"heading": f"{section}. {capital(where_label(path, split, t))}", "families": families})
    return tables


def recipe_text(build: BuildConfig, t: Any, independent: bool) -> str:
    """The Scheme table's "Algorithm": each recipe step in words, then the input scales' calibrator. ``independent``:
    whether the build was verified against a checkpoint this tool did not make (NVIDIA's); only then is RTN said to
    be that checkpoint's recipe."""
    parts = []
    calls = build.algorithm_calls
    for step in build.recipe:
        if step == "rtn":
            parts.append(t(_("Round-to-nearest (the recipe of `nvidia/Cosmos3-Nano@fp8`)")) if independent
                         else t(_("Round-to-nearest")))
        elif step in ("smoothquant", "awq"):
            section = build.section(step)
            updown = t(_(" and into `up_proj` for `down_proj`")) if section.fold_up_down else ""
            if step == "smoothquant":
                alpha = t(_("alpha searched per layer over 0.0-1.0 in steps of {step}")).format(
                    step=section.alpha_step) if section.alpha == "auto" else t(_("alpha = {alpha}")).format(
                    alpha=section.alpha)
                parts.append(t(_("SmoothQuant ({alpha}), folded into the preceding norms{updown}; data: {calls} "
                                 "transformer calls")).format(alpha=alpha, calls=calls, updown=updown))
            else:
                parts.append(t(_("AWQ (s = mean|x|^alpha, normalised; alpha per layer on a {n}-point grid, by the FP8 "
                                 "output error), folded into the preceding norms{updown}; data: {calls} transformer "
                                 "calls")).format(n=section.n_grid, calls=calls, updown=updown))
        elif step == "gptq":
            g = build.section(step)
            parts.append(t(_("ModelOpt's GPTQ (damping {damp}, blocks of {block} columns{layerwise}): the weights "
                             "updated column by column from each Linear's Hessian on {calls} transformer calls, the "
                             "scales max-calibrated as round-to-nearest's")).format(
                damp=g.perc_damp, block=g.block_size, calls=calls,
                layerwise=t(_(", decoder layer by decoder layer")) if g.layerwise else ""))
        elif build.section(step).tuning == "none":
            parts.append(t(_("AutoRound as in the seed: its FP8 codes stay round-to-nearest, because the seed's "
                             "AutoRound tunes INT, UINT and NVFP4 weights only; what differs is the activation "
                             "calibration after it, ModelOpt's layer-by-layer max calibration in which each decoder "
                             "layer sees the already-quantized outputs of the layers before it")))
        else:
            parts.append(t(_("AutoRound tuned by the auto-round library ({iters} steps per decoder layer on {calls} "
                             "transformer calls): the rounding and the clipping of the FP8 weights")).format(
                iters=build.section(step).iters, calls=calls))
    observer = {"max": t(_("ModelOpt max calibration")),
                "moving_average": t(_("moving-average observer (momentum {m})")).format(m=build.calibrator.momentum),
                "histogram": t(_("ModelOpt histogram calibrator ({p} percentile)")).format(
                    p=build.calibrator.percentile),
                "range_shrink": t(_("range-shrink observer ({p} percent of each tail dropped per call, moving "
                                    "average {m})")).format(p=build.calibrator.shrink_percent,
                                                            m=build.calibrator.momentum)}[build.calibrator.method]
    if build.scheme == PER_CHANNEL:
        observer = t(_("none, activations are quantized per token at run time"))
    return t(_("{recipe}; input scales: {observer}")).format(recipe=" + ".join(parts), observer=observer)


def _kept(build: BuildConfig, prov: dict[str, Any], t: Any) -> str:
    """The Scheme table's "Not quantized": the build file's ``kept_bf16`` modules grouped by the dtypes the build's
    transformer stores them in, as ``provenance.json`` records them (``kept_dtypes``); a module stored in none is said
    to be absent. A provenance written before that record: the bare names."""
    recorded = prov.get("kept_dtypes")
    if not isinstance(recorded, dict):
        return ", ".join(f"`{k}`" for k in build.kept_bf16)
    groups: dict[str, list[str]] = {}
    for k in build.kept_bf16:
        groups.setdefault("/".join(recorded.get(k) or []), []).append(f"`{k}`")
    absent = groups.pop("", [])
    parts = [f"{dtype}: {', '.join(names)}" for dtype, names in groups.items()]
    if absent:
        parts.append(t(_("not in the transformer: {modules}")).format(modules=", ".join(absent)))
    return "; ".join(parts)


def scheme_rows(build: BuildConfig, prov: dict[str, Any], t: Any, independent: bool) -> dict[str, str]:
    """The Scheme table; ``independent`` as for :func:`recipe_text` (otherwise the format is not said to be as in
    NVIDIA's checkpoint, only written in its layout)."""
    calibration = prov["calibration"]
    version = prov["versions"]["modelopt"]
    kept = _kept(build, prov, t)
    if build.scheme == PER_CHANNEL:
        return {"kept": kept, "weights": t(_("FP8 E4M3, one scale per output channel")),
                "activations": t(_("FP8 E4M3, one scale per token, computed at run time (no calibration)")),
                "format": t(_("ModelOpt {version} `FP8_PER_CHANNEL_PER_TOKEN` (weights `strategy: channel`); "
                              "exploratory: NVIDIA's policy server cannot serve per-channel weight scales or per-token "
                              "activation scales")).format(version=version)}
    return {"kept": kept, "weights": t(_("FP8 E4M3, one scale per tensor")),
            "activations": t(_("FP8 E4M3, one static scale per tensor, calibrated on {calls} transformer calls of the "
                               "BF16 policy on {observations} observations")).format(
                calls=calibration["calls"], observations=calibration["observations"]),
            "format": (t(_("ModelOpt {version} `FP8` in NVIDIA's layout (`quantization_config`, quantizer buffers and "
                           "`modelopt_state.pth` as in `nvidia/Cosmos3-Nano@fp8`)")) if independent else
                       t(_("ModelOpt {version} `FP8`, written in the layout of NVIDIA's FP8 checkpoints "
                           "(`quantization_config`, quantizer buffers and `modelopt_state.pth`); not compared with "
                           "`nvidia/Cosmos3-Nano@fp8`"))).format(version=version)}
