"""The rows of the cards' measured tables: verification, fidelity per path and split, differences against the
baseline, ranking, attribution, speed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from release.check.report import MODELOPT_EXPORT, SELF_REFERENCE
from release.core.config import BuildConfig
from release.core.errors import ReleaseError
from release.measure.paired import at_floor
from release.publish.card.i18n import Formatter, _
from release.publish.card.labels import (
    CHECK_LABELS,
    CHECK_STATUS,
    CORRECTED,
    FILE_KINDS,
    HEADERS,
    MEASURED,
    PATH_HEADERS,
    PER_CHANNEL,
    SPLIT_LABELS,
    TOO_FEW,
    agreement,
    build_label,
    estimate,
    scheme_of,
    verdict_label,
    where_label,
)


def _check_detail(check: dict[str, Any], status: str, per_channel: bool, f: Formatter, t: Any) -> str:
    """A check's result in the card's language, worded from the figures ``release verify`` recorded in its
    ``details`` (its English ``summary`` is the report's and the command line's). A failed check shows its first
    problem as recorded, in a code span: a diagnostic names files and tensors."""
    if status == "skipped":
        return t(_("not run: no reference checkpoint"))
    if status == "failed":
        return t(_("first problem: {problem}")).format(problem=f"`{check.get('summary', '')}`")
    d = check["details"]
    name = check["name"]
    if name in ("layout", "quantization_config", "modelopt_state"):
        return _against_reference(d, _reference_detail(name, d, per_channel, t), t)
    if name == "values":
        source = t(_("the smoothed source weight")) if d["folded"] else t(_("the source weight"))
        weights = _("{n} FP8 weights with per-channel weight scales and no static input scale") if per_channel \
            else _("{n} FP8 weights with positive finite scales")
        parts = [t(weights).format(n=d["fp8_weights"])]
        if d.get("own_codes"):  # absent from reports made before recipes could make their own codes
            parts.append(t(_("the recipe's own codes, valid FP8, within {error} relative error of {source} (bound "
                             "{bound})")).format(error=f.num(d["worst_weight_error"]), source=source,
                                                 bound=f.num(d["max_weight_error"], 2)))
            if d.get("reconstruction_ratio_median") is not None:
                parts.append(t(_("reconstruction error on calibration data {ratio} times round-to-nearest's (median "
                                 "over the Linears)")).format(ratio=f.num(d["reconstruction_ratio_median"], 2)))
        else:
            parts.append(t(_("codes equal a recomputation from the source, within {steps} FP8 steps of {source}"))
                         .format(steps=f.num(d["worst_fp8_steps"], 2), source=source))
        # the tensors that differ from the source outside the FP8 Linears are the norms that smoothing folded into
        # (an up_proj it folds into is an FP8 weight, held to the smoothed source weight above)
        parts.append(t(_("other tensors equal the source except {k} norms with folded smoothing"))
                     .format(k=d["folded"]) if d["folded"] else t(_("other tensors equal the source")))
        return "; ".join(parts)
    if name == "consistency":
        return t(_("both indexes list exactly the shards present; no tensor twice; no orphan file"))
    return t(_("loads in diffusers with ModelOpt's restore; one policy rollout, W8A8 on every step through a row-wise "
               "FP8 GEMM, gives finite actions")) if per_channel else \
        t(_("loads in diffusers with ModelOpt's restore; one policy rollout gives finite actions"))


def _reference_detail(name: str, d: dict[str, Any], per_channel: bool, t: Any) -> str:
    """A passed check against the reference: what matched, and what ModelOpt's own export lacks by construction."""
    tolerated = d.get("tolerated", {})
    if name == "layout":
        kinds: dict[str, int] = {}
        for kind in d["files_one_side"].values():
            kinds[kind] = kinds.get(kind, 0) + 1
        rest = ", ".join(t(FILE_KINDS[k]).format(n=n) for k, n in sorted(kinds.items())) or t(_("none"))
        text = t(_("{common} tensors in common, {differ} dtype or shape differences; on one side only: {rest}")).format(
            common=d["common_tensors"], differ=len(d["dtype_or_shape_differences"]), rest=rest)
        if tolerated:
            text += t(_("; {n} ModelOpt quantizer buffers in the build only, which ModelOpt's export does not "
                        "write")).format(n=tolerated["quantizer_buffers"])
        return text
    if name == "quantization_config":
        text = t(_("identical to the reference's in the per-channel scheme (`quant_algo` "
                   "`FP8_PER_CHANNEL_PER_TOKEN`)")) if per_channel else t(_("identical to the reference's"))
        if tolerated.get("build_only_fields"):
            fields = dict.fromkeys(f.split(": ")[-1] for f in tolerated["build_only_fields"])
            text += t(_(" in every field it has; in the build only: {fields} (the fields diffusers reads, which "
                        "ModelOpt's export does not write)")).format(fields=", ".join(f"`{f}`" for f in fields))
        if tolerated.get("ignore_written_differently"):
            text += t(_("; `ignore` written with ModelOpt's wildcards in the reference, covering the same modules"))
        return text
    text = _("`{file}`: {common} entries in common, {build} in the build only, {reference} in the reference only, "
             "{differ} differ, {scheme} set by the per-channel scheme") if per_channel else \
        _("`{file}`: {common} entries in common, {build} in the build only, {reference} in the reference only, "
          "{differ} differ")
    parts = [t(text).format(file=file, common=c["common"], build=c["build_only"], reference=c["reference_only"],
                            differ=c["differ"], **({"scheme": c["scheme"]} if per_channel else {}))
             for file, c in d["counts"].items()]
    if tolerated:
        left_out = _("{n} entries left out: the quantizer list and the format of the quantizers disabled on both "
                     "sides, which ModelOpt's `FP8_DEFAULT_CFG` writes differently")
        parts.append(t(left_out).format(n=tolerated["entries"]))
    return "; ".join(parts)


def reference_kind(report: dict[str, Any]) -> str | None:
    """What the report's reference is, as its checks against it recorded (``release.check.layout.reference_origin``:
    a self-reference, ModelOpt's own export, an independent checkpoint); None without a reference, or from a report
    older than that record."""
    kinds = {c.get("details", {}).get("reference", {}).get("kind") for c in report["checks"]
             if c["name"] in ("layout", "quantization_config", "modelopt_state")}
    return kinds.pop() if len(kinds) == 1 else None


def _against_reference(d: dict[str, Any], text: str, t: Any) -> str:
    """A check's result, said to be against a self-reference or ModelOpt's own export where it was."""
    kind = d.get("reference", {}).get("kind")
    if kind == SELF_REFERENCE:
        return t(_("self-reference, no independent evidence: {result}")).format(result=text)
    if kind == MODELOPT_EXPORT:
        return t(_("against ModelOpt's own export: {result}")).format(result=text)
    return text


def verification_rows(report: dict[str, Any], statuses: list[str], path: Path, build: BuildConfig, f: Formatter,
                      t: Any) -> list[dict[str, str]]:
    """The card's verification table; a check whose details lack a figure the card words is refused."""
    rows = []
    for c, status in zip(report["checks"], statuses, strict=True):
        try:
            summary = _check_detail(c, status, build.scheme == PER_CHANNEL, f, t)
        except (KeyError, TypeError, AttributeError) as exc:  # a field missing, or of another type
            raise ReleaseError(f"{path}: check {c['name']!r} does not hold what 'release verify' records "
                               f"({type(exc).__name__}: {exc}); rerun 'release verify {build.name}'") from exc
        rows.append({"label": t(CHECK_LABELS[c["name"]]), "status": t(CHECK_STATUS[status]), "summary": summary})
    return rows


def check_statuses(report: dict[str, Any], path: Path, build: str) -> list[str]:
    """Each check's status in ``report.json``; a report without them (an older 'release verify') is refused, as
    ``release push`` refuses it."""
    checks = report["checks"]
    if not isinstance(checks, list) or not all(isinstance(c, dict) and c.get("status") in CHECK_STATUS
                                               and c.get("name") in CHECK_LABELS for c in checks):
        raise ReleaseError(f"{path}: 'checks' is not a list of checks with a name and a status (passed, failed, "
                           f"skipped); rerun 'release verify {build}'")
    return [c["status"] for c in checks]


def speed_lines(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[str]:
    """The rollout latency and peak GPU memory of this build beside BF16's, for each path measured on a GPU, and
    how both ran: with the decoder stack as CUDA graphs (``release.inputs.graphs``: the same kernels), eager, or
    one each way (then the sentence says the two do not compare like with like)."""
    lines = []
    for r in records:
        s = r.get("speed")
        if not s:
            continue
        figures = {"where": where_label(r["path"], r["split"], t, [r]), "device": s["build"]["device"],
                   "seconds": f.num(s["build"]["seconds"], 2), "bf16_seconds": f.num(s["bf16"]["seconds"], 2),
                   "n": s["build"]["rollouts"], "gib": f.num(s["build"]["peak_gib"], 1),
                   "bf16_gib": f.num(s["bf16"]["peak_gib"], 1)}
        graphs = {s[side].get("graphs", False) for side in ("bf16", "build")}
        if graphs == {True}:
            lines.append(t(_("Speed and memory ({where}, `{device}`, both with the decoder stack replayed as CUDA "
                             "graphs): {seconds} s vs {bf16_seconds} s per rollout for BF16 (median of {n} rollouts "
                             "each), peak GPU memory {gib} vs {bf16_gib} GiB.")).format(**figures))
            continue
        lines.append(t(_("Speed and memory ({where}, `{device}`): {seconds} s vs {bf16_seconds} s per rollout for "
                         "BF16 (median of {n} rollouts each), peak GPU memory {gib} vs {bf16_gib} GiB.")).format(
            **figures))
        if len(graphs) == 2:
            lines.append(t(_("One of the two ran with CUDA graphs and the other eagerly: these latencies do not "
                             "compare like with like; rerun both with the same RELEASE_CUDA_GRAPHS.")))
    return lines


PINNED = (("nvidia-modelopt", "modelopt"), ("torch", "torch"), ("diffusers", "diffusers"))  # pip name, provenance


def use_requirements(prov: dict[str, Any], records: list[dict[str, Any]], f: Formatter, t: Any) -> dict[str, str]:
    """The Use section's requirements: the peak GPU memory of this build's deployed rollouts (from the
    ``results/deployed-<split>.perf.json`` that ``release tables`` read), or why it was not measured; and pip pins of
    the versions it was made with (a local label such as ``+cpu`` dropped: ``torch==2.13.0`` takes any build)."""
    deployed = [r for r in records if r["path"] == "deployed"]
    measured = [r for r in deployed if r.get("speed")]
    if measured:
        peak = max(measured, key=lambda r: r["speed"]["build"]["peak_gib"])
        memory = t(_("GPU memory: {gib} GiB at peak during one policy rollout, measured on `{device}` by the deployed "
                     "evaluation (`results/deployed-{split}.perf.json`);")).format(
            gib=f.num(peak["speed"]["build"]["peak_gib"], 1), device=peak["speed"]["build"]["device"],
            split=peak["split"])
    elif any("weights_bytes" in r["computed"] for r in deployed):
        r = next(r for r in deployed if "weights_bytes" in r["computed"])
        bf16 = r["computed"].get("bf16_weights_bytes")
        memory = t(_("memory, measured by the deployed evaluation on a CPU (the emulation; peak GPU memory was not "
                     "measured): the loaded transformer's weights and buffers take {size}{bf16} "
                     "(`results/deployed-{split}.npz`);")).format(
            size=f.size(r["computed"]["weights_bytes"]), split=r["split"],
            bf16="" if bf16 is None else t(_(", against {size} for BF16")).format(size=f.size(bf16)))
    elif deployed:
        memory = t(_("GPU memory: not measured, the deployed evaluation ran on a CPU;"))
    else:
        memory = t(_("GPU memory: not measured, the deployed path was not evaluated;"))
    versions = prov["versions"]
    pins = " ".join(f"{name}=={str(versions[key]).split('+')[0]}" for name, key in PINNED)
    return {"memory": memory, "pins": pins}


def in_group(records: list[dict[str, Any]], path: str, split: str, scheme: str | None = None) -> list[dict[str, Any]]:
    """The records of one path and split (and scheme), lowest overall first."""
    return sorted((r for r in records if (r["path"], r["split"]) == (path, split)
                   and (scheme is None or scheme_of(r) == scheme)), key=lambda r: r["overall_sigma"])


def groups_of(records: list[dict[str, Any]], paths: tuple[str, ...]) -> list[tuple[str, str]]:
    order = {p: i for i, p in enumerate(MEASURED)}
    return sorted({(r["path"], r["split"]) for r in records if r["path"] in paths},
                  key=lambda g: (order[g[0]], list(SPLIT_LABELS).index(g[1])))


def fidelity_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    return [{
        "label": build_label(r, t), "path": where_label(r["path"], r["split"], t, [r]),
        "overall": estimate(r["overall_sigma"], r["overall_ci"], f, t),
        "ratio": f.num(r["x_eager_vs_compile"], 2), "mae": f.num(r["joint_mae_deg"], 2), "snr": f.num(r["snr_db"], 1),
        "gripper": agreement(r["gripper_agree"], r["gripper_ci"], f, t),
    } for r in records]


def diff_headers(records: list[dict[str, Any]], t: Any, path: str = "fakequant") -> dict[str, str]:
    """Headers of the difference and p columns: the intervals and p-values shown are Holm-adjusted over the
    m builds compared with the baseline on the same path and split; with m = 1 that is the plain 95% interval."""
    ms = sorted({r["comparisons"] for r in records if r.get("comparisons")})
    plain, corrected = (HEADERS["diff"], CORRECTED["diff"]) if path == "fakequant" else \
        (PATH_HEADERS[path]["diff"], PATH_HEADERS[path]["diff_m"])
    if ms in ([], [1]):
        return {"diff": t(plain), "p": "p"}
    m = ", ".join(map(str, ms))
    return {"diff": t(corrected).format(m=m), "p": t(CORRECTED["p"]).format(m=m)}


def _diff(r: dict[str, Any], f: Formatter, t: Any) -> str:
    if r.get("diff_to_baseline") is None:
        return "-"
    return estimate(r["diff_to_baseline"], r["diff_ci_corrected"], f, t, sign=True)


def _p(r: dict[str, Any], f: Formatter, t: Any) -> str:
    if r.get("diff_too_few_observations"):
        return t(TOO_FEW)
    if r.get("diff_p_corrected") is None:  # the baseline, or figures without a p (the seed card's)
        return "-"
    return f.p(r["diff_p_corrected"], at_most=at_floor(r["diff_p"], r.get("diff_p_floor")))


def _gate(record: dict[str, Any] | None, t: Any) -> str:
    """pass / fail, "within noise" when a limit lies inside the interval of the figure it judges."""
    if record is None or record.get("gate") is None:
        return "-"
    word = t(_("pass")) if record["gate"] else t(_("fail"))
    return t(_("{verdict}, within noise")).format(verdict=word) if record.get("gate_within_noise") else word


def fakequant_for(records: list[dict[str, Any]], split: str) -> dict[str, dict[str, Any]]:
    """Each build's fake-quant record to show beside another path's on ``split``: the same split, else the
    calibration labs (the seed: served on all 32 observations beside fake quant on the same 32)."""
    splits = {r["split"] for r in records if r["path"] == "fakequant"}
    chosen = split if split in splits else "calibration" if "calibration" in splits else next(iter(sorted(splits)), "")
    return {r["build"]: r for r in records if r["path"] == "fakequant" and r["split"] == chosen}


def path_rows(records: list[dict[str, Any]], path: str, split: str, f: Formatter, t: Any) -> list[dict[str, str]]:
    """The seed's "served results" for one path and split: each build with its difference to the baseline, its
    gripper changes, its fake-quant figures and both gates; the baseline first."""
    fq = fakequant_for(records, split)
    rows = []
    for r in sorted(in_group(records, path, split), key=lambda r: r.get("diff_to_baseline") is not None):
        q = fq.get(r["build"])
        rows.append({
            "build": build_label(r, t), "sigma": estimate(r["overall_sigma"], r["overall_ci"], f, t),
            "diff": _diff(r, f, t), "p": _p(r, f, t), "verdict": verdict_label(r, f, t),
            "changes": str(r["gripper_changes"]),
            "fq_sigma": f.num(q["overall_sigma"]) if q else "-", "fq_changes": str(q["gripper_changes"]) if q else "-",
            "gates": f"{_gate(q, t)} / {_gate(r, t)}",
        })
    return rows


def ranking_rows(rows: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    return [{"rank": str(i), "build": build_label(r, t), "sigma": estimate(r["overall_sigma"], r["overall_ci"], f, t),
             "diff": _diff(r, f, t), "p": _p(r, f, t), "verdict": verdict_label(r, f, t),
             "changes": str(r["gripper_changes"])}
            for i, r in enumerate(rows, start=1)]


def attribution_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    """Where each difference to the baseline comes from, delivered builds first, then by overall error; the rows of
    one path and split (the table's introduction names them)."""
    shown = sorted((r for r in records if r.get("attribution")), key=lambda r: (not r.get("delivered"),
                                                                               r["overall_sigma"]))
    return [{"build": build_label(r, t), "diff": f.num(r["attribution"]["diff"], sign=True),
             "top": ", ".join(str(o) for o in r["attribution"]["top_observations"]) if r["attribution"]["diff"]
             else t(_("no difference")),
             "without": f.num(r["attribution"]["diff_without_top"], sign=True) if r["attribution"]["diff"] else "-",
             "share": f.pct(r["attribution"]["top3_error_share"], 1) if r["attribution"].get("top3_error_share")
             is not None else "-"} for r in shown]
