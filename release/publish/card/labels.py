"""The fixed words of the cards, marked for translation: path, split, check and scheme labels, table headers,
the decision's vocabulary; and the titles of builds in a language."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from release.core.builds import available_builds, load_build
from release.core.conformance import (
    EMULATION,
    MODELOPT,
    POLICY_SERVER,
    SCALED_MM,
    SERVED_KERNELS,
    TORCHAO,
    TORCHAO_EMULATED,
)
from release.core.errors import ReleaseError
from release.measure.paired import EXACT_MAX_N, LISTED_MAX_N
from release.measure.stats import decimals
from release.publish.card.i18n import Formatter, _

PATH_LABELS = {"fakequant": _("fake quant, offline replay"), "deployed": _("deployed FP8 build (diffusers)"),
               "served": _("policy server, FP8 GEMM"), "yardstick": _("BF16 yardstick")}
# The yardsticks' rows (tables.json records them under these build names, with English titles).
YARDSTICK_TITLES = {"yardstick-compile": _("BF16 eager vs BF16 torch.compile (yardstick)"),
                    "yardstick-seed": _("BF16 seed vs BF16 other seed (yardstick)")}
SPLIT_LABELS = {"calibration": _("calibration labs (in-sample)"), "validation": _("held-out labs"),
                "all": _("all labs")}
CHECK_LABELS = {"layout": _("Files, tensor names, dtypes and shapes"),
                "quantization_config": _("`quantization_config`, root `hf_quant_config.json`"),
                "modelopt_state": _("`modelopt_state.pth`, transformer and root"),
                "values": _("Values"), "consistency": _("Indexes and shards"), "loadable": _("Loads and runs")}
CHECK_STATUS = {"passed": _("passed"), "failed": _("FAILED"), "skipped": _("skipped")}
# What the verification's reference is (release.check.report's kinds), said under its first line; nothing for an
# independent checkpoint (NVIDIA's).
REFERENCE_ORIGINS = {
    "self-reference": _("That reference is a build of this tool (a self-reference): the checks of files, "
                        "configurations and ModelOpt state compare this tool's output with itself and are no "
                        "independent evidence that the build is laid out as `nvidia/Cosmos3-Nano@fp8`."),
    "modelopt-export": _("That reference is ModelOpt's own Hugging Face export (`export_hf_checkpoint`) of the same "
                         "source, made by `release fixture`, not by this tool's export and not NVIDIA's checkpoint. "
                         "What that export writes differently by construction is left out of the comparison and "
                         "listed in each check's result and in the report."),
}
FILE_KINDS = {"tool sidecar": _("tool sidecar files ({n})"), "documentation": _("documentation files ({n})"),
              "base-model branch": _("files of the base model's other branches ({n})"),
              "unexpected": _("unexpected files ({n})")}
# Headers with a literal "%": Jinja's trans blocks would look them up as "%%". The difference columns say "the
# baseline": the comparison names it (tables.json's "baseline"), so that a header fits its column.
HEADERS = {"overall": _("overall (sigma) [95% CI]"), "gripper": _("gripper agree [95% CI]"),
           "sigma": _("sigma [95% CI]"), "diff": _("vs baseline [95% CI]"),
           "plot": _("Overall action error of every build per path and split with 95% CIs, this build highlighted, "
                     "on the gate's scale (left) and as the difference to the baseline (right); a result that fails "
                     "its gate is an open marker, the criterion it misses written in red on the right.")}
CORRECTED = {"diff": _("vs baseline, Holm-adjusted 95% CI (m = {m})"),
             "p": _("p, sign-flip, Holm-adjusted (m = {m})")}
# What a card may say of a build against the baseline (tables.json's "diff_verdict", release/measure/paired.py).
VERDICT_LABELS = {"lower": _("lower"), "higher": _("higher"), "not shown": _("no difference shown")}
# The columns of a results table on a path that is not fake quant (the seed's "served results").
PATH_HEADERS = {
    "served": {"sigma": _("served sigma [95% CI]"), "diff": _("served vs baseline [95% CI]"),
               "diff_m": _("served vs baseline, Holm-adjusted 95% CI (m = {m})"),
               "changes": _("served changes"), "gate": _("gate (fake quant / served)")},
    "deployed": {"sigma": _("deployed sigma [95% CI]"), "diff": _("deployed vs baseline [95% CI]"),
                 "diff_m": _("deployed vs baseline, Holm-adjusted 95% CI (m = {m})"),
                 "changes": _("deployed changes"), "gate": _("gate (fake quant / deployed)")},
}
TOO_FEW = _("too few observations")
PER_TENSOR = "fp8_w8a8_per_tensor_static"
PER_CHANNEL = "fp8_per_channel_per_token"
FAMILIES = {PER_TENSOR: _("NVIDIA's format (W8A8 FP8, per-tensor static)"),
            PER_CHANNEL: _("per-channel weight / per-token activation (exploratory)")}
SCHEMES = {PER_TENSOR: _("ModelOpt W8A8, per-tensor static"),
           PER_CHANNEL: _("ModelOpt W8A8, per-channel weights, per-token activations")}
MEASURED = ("fakequant", "deployed", "served")


def build_titles(names: Iterable[str], lang: str) -> dict[str, str]:
    """The title in ``lang`` of each build of ``names`` that has a build file."""
    files = set(available_builds())
    return {n: load_build(n).text("title", lang) for n in names if n in files}


def titled(records: list[dict[str, Any]], lang: str, t: Any) -> list[dict[str, Any]]:
    """tables.json's records with each title in the card's language: a build's from its build file, a yardstick's
    from the catalog; any other (an external checkpoint) keeps the title it was evaluated under."""
    titles = build_titles({r["build"] for r in records}, lang) | {k: t(v) for k, v in YARDSTICK_TITLES.items()}
    return [{**r, "title": titles.get(r["build"], r["title"])} for r in records]


def baseline_name(tables: dict[str, Any]) -> str:
    """The build the differences are to (tables.json's "baseline"), by its title in the (titled) records."""
    name = str(tables.get("baseline", "rtn"))
    return next((str(r["title"]) for r in tables["records"] if r["build"] == name), f"`{name}`")


def build_label(record: dict[str, Any], t: Any) -> str:
    delivered = t(_("delivered"))
    return f"{record['title']} ({delivered})" if record.get("delivered") else str(record["title"])


def agreement(share: float, ci: list[float] | None, f: Formatter, t: Any) -> str:
    """A gripper agreement with its 95% interval, or with the reason it has none."""
    return f"{f.pct(share)} {f.pct_ci(ci) if ci is not None else f'({t(TOO_FEW)})'}"


def estimate(value: float, ci: list[float] | None, f: Formatter, t: Any, sign: bool = False) -> str:
    """A figure with its 95% interval at the precision the interval needs, or with the reason it has none (too few
    observations)."""
    digits = decimals(ci)
    interval = f.ci(ci, digits, sign=sign) if ci is not None else f"({t(TOO_FEW)})"
    return f"{f.num(value, digits, sign=sign)} {interval}"


def verdict_label(record: dict[str, Any], f: Formatter, t: Any) -> str:
    """The verdict of a build against the baseline, with "within +-margin" beside it where its Holm-level interval
    lies inside the margin (a significant difference is never hidden by it); "-" for the baseline and figures
    without one."""
    if record.get("diff_too_few_observations"):
        return t(TOO_FEW)
    v = record.get("diff_verdict")
    if v is None:
        return "-"
    label = t(VERDICT_LABELS[v])
    if record.get("within_margin"):
        return t(_("{verdict}, within +-{margin} sigma")).format(verdict=label, margin=f.num(record["margin"]))
    if v == "not shown" and record.get("non_inferior"):
        return t(_("no difference shown; non-inferior (at most +{margin} sigma)")).format(
            margin=f.num(record["margin"]))
    return label


# A deployed row's label says how it was computed (tables.json's "computed", from release eval): the device and kernel.
DEPLOYED_LABELS = {"cpu": _("deployed, CPU emulation"), EMULATION: _("deployed, {device}, FP8 GEMM emulation"),
                   MODELOPT: _("deployed, {device}, ModelOpt FP8 GEMM"),
                   SCALED_MM: _("deployed, {device}, eager `torch._scaled_mm`")}
KERNELS = {EMULATION: _("the emulation of Hopper's FP8 GEMM on {device}"),
           MODELOPT: _("ModelOpt's FP8 GEMM on {device}"),
           SCALED_MM: _("an eager row-wise `torch._scaled_mm` on {device}")}


def test_label(records: Iterable[dict[str, Any]], t: Any) -> str:
    """The test behind the p-values of ``records``, named as what it was: "exact sign-flip test" only when every p
    is exact (tables.json's "diff_p_exact"; a tables.json written before that field enumerated up to LISTED_MAX_N
    observations and sampled beyond), "Monte Carlo sign-flip test" when none is, else both named."""
    kinds = {r["diff_p_exact"] if "diff_p_exact" in r else r["n_obs"] <= LISTED_MAX_N
             for r in records if r.get("diff_p") is not None}
    if kinds == {False}:
        return t(_("Monte Carlo sign-flip test"))
    if False in kinds:
        return t(_("sign-flip test, exact up to {n} observations and Monte Carlo beyond")).format(n=EXACT_MAX_N)
    return t(_("exact sign-flip test"))


def computations(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """How the deployed ``records`` were computed, each distinct computation once with the GEMM shapes of all its
    records. A deployed record without that record (tables.json from an older ``release tables``) is refused: the
    card would have to guess its kernel."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r["path"] != "deployed":
            continue
        c = r.get("computed")
        if not isinstance(c, dict) or c.get("kernel") not in KERNELS:
            raise ReleaseError(f"tables.json: the deployed results of {r['build']!r} ({r['split']}) do not record how "
                               f"they were computed (device, kernel); rerun 'release eval {r['build']} --path deployed "
                               f"--split {r['split']}' and 'release tables'")
        same = out.setdefault(f"{c['device']}|{c['kernel']}|{c.get('torch')}|{c.get('cuda')}", {**c, "gemm_shapes": []})
        same["gemm_shapes"] = sorted({*map(tuple, same["gemm_shapes"]), *map(tuple, c.get("gemm_shapes") or [])})
    return [out[k] for k in sorted(out)]


def device_word(device: str | None, t: Any) -> str:
    return t(_("the CPU")) if device in (None, "cpu") else str(device).removeprefix("NVIDIA ")


# A served row's label: imported from a policy server, or computed as the server computes (release eval --path served).
SERVED_LABELS = {TORCHAO: _("served, {device}, TorchAO static FP8, {steps}"),
                 TORCHAO_EMULATED: _("served, {device}, TorchAO static FP8 emulated, {steps}")}
SERVED_HOW = _("the exported build through diffusers, each FP8 Linear made as NVIDIA's policy server makes it: "
               "TorchAO {torchao}'s static FP8 tensor at the stored `weight_scale` and `input_scale`, {gemm} "
               "(torch {torch}); {steps}")
SERVED_GEMMS = {TORCHAO: _("`torch._scaled_mm` with fast accumulation on {device}"),
                TORCHAO_EMULATED: _("the eager `torch._scaled_mm` with fast accumulation that TorchAO calls on "
                                    "Hopper, emulated on {device}")}


def steps_text(modes: list[str], t: Any) -> str:
    """What each denoising step ran on the served path: ``W8A8 on all 4 steps``, or which steps ran W8A16."""
    if len(set(modes)) == 1:
        return str(t(_("{mode} on all {n} steps"))).format(mode=modes[0], n=len(modes))
    numbers = {m: ", ".join(str(i + 1) for i, x in enumerate(modes) if x == m) for m in ("W8A16", "W8A8")}
    return str(t(_("W8A16 on steps {w8a16}, W8A8 on steps {w8a8}"))).format(w8a16=numbers["W8A16"],
                                                                           w8a8=numbers["W8A8"])


def served_computations(records: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct computations of the served ``records`` that this tool ran (TorchAO, as the policy server); the
    imported ones (``release import-served``) record none."""
    out = {}
    for r in records:
        c = r.get("computed")
        if r["path"] == "served" and isinstance(c, dict) and c.get("kernel") in SERVED_KERNELS:
            key = f"{c['device']}|{c['kernel']}|{c.get('torch')}|{c.get('torchao')}|{c.get('steps')}"
            out[key] = c
    return [out[k] for k in sorted(out)]


def served_imported(records: Iterable[dict[str, Any]]) -> bool:
    """Whether any served record came from a policy server's results (``release import-served``)."""
    return any(r["path"] == "served" and (r.get("computed") or {}).get("kernel", POLICY_SERVER) not in SERVED_KERNELS
               for r in records)


def served_how(records: list[dict[str, Any]], t: Any) -> str:
    """The paths table's "how" of the served path: each computation of it, and the import if results were."""
    hows = [t(SERVED_HOW).format(torchao=c.get("torchao"), torch=c.get("torch"),
                                 gemm=t(SERVED_GEMMS[c["kernel"]]).format(device=device_word(c["device"], t)),
                                 steps=steps_text(list(c.get("steps") or []), t))
            for c in served_computations(records)]
    return "; ".join(hows + ([t(PATH_HOW["served"])] if served_imported(records) or not hows else []))


def path_label(path: str, t: Any, records: Iterable[dict[str, Any]] = ()) -> str:
    """A path's label; a deployed or served one says how ``records`` (those it labels) were computed."""
    records = list(records)
    if path == "served":
        labels = [t(SERVED_LABELS[c["kernel"]]).format(device=device_word(c["device"], t),
                                                      steps=steps_text(list(c["steps"]), t))
                  for c in served_computations(records)]
        return " / ".join(labels + ([t(PATH_LABELS[path])] if served_imported(records) or not labels else []))
    hows = computations(records) if path == "deployed" else []
    if not hows:
        return str(t(PATH_LABELS[path]))
    return " / ".join(t(DEPLOYED_LABELS["cpu" if c["kernel"] == EMULATION and c["device"] in (None, "cpu")
                                        else c["kernel"]]).format(device=device_word(c["device"], t)) for c in hows)


def where_label(path: str, split: str, t: Any, records: Iterable[dict[str, Any]] = ()) -> str:
    return f"{path_label(path, t, records)}, {t(SPLIT_LABELS[split])}"


def scheme_of(record: dict[str, Any]) -> str:
    return str(record.get("scheme") or PER_TENSOR)


PATH_HOW = {
    "fakequant": _("the FP8 codes dequantized as the weights, each input quantize-dequantized at its scale (ModelOpt "
                   "fake quantization), BF16 elsewhere"),
    "deployed": _("the exported build through diffusers, its FP8 Linears run by {kernels}"),
    "served": _("a policy server's results, imported with `release import-served`"),
}
PATH_REFERENCE = {"fakequant": _("the BF16 output of the same replay"),
                  "deployed": _("the BF16 output of the same pipeline and seeds"),
                  "served": _("the same server's BF16 output")}
NOT_DELIVERABLE = [
    _("NVIDIA's policy server reads ModelOpt checkpoints with `apply_modelopt_fp8_checkpoint_inplace`, which takes "
      "both scales as (1, 1) and installs a per-tensor kernel (`PerTensor()`) only."),
    _("The scheme exists only in the framework's run-time FP8 (`quantization.method=fp8`, "
      "`fp8_granularity=per_row`), which quantizes the BF16 weights round-to-nearest when it loads them, so it cannot "
      "carry a recipe's weights."),
]
TIE_BREAKS = {"gripper_agree": _("the higher gripper agreement"), "joint_mae_deg": _("the lower joint MAE")}
GATE_CRITERIA = {"overall_sigma": _("overall"), "gripper_changes": _("gripper changes"),
                 "within_noise": _("not shown within its 95% interval")}
# The plot's note beside a result that fails its gate names the result's path and split briefly.
PATH_SHORT = {"fakequant": _("fake quant"), "deployed": _("deployed"), "served": _("served")}
SPLIT_SHORT = {"calibration": _("calibration labs"), "validation": _("held-out labs"), "all": _("all labs")}
NOT_EVALUATED = {"no_build_file": _("not evaluated: no build file"),
                 "no_results": _("not evaluated on this path and split")}
VERDICTS = {"always": _("This build is chosen in any case, as the reference: {rank}."),
            "rank": _("This build was chosen: {rank}."), None: _("This build was not chosen: {rank}.")}
CHOSEN = {"always": _("yes, as the reference"), "rank": _("yes"), None: "-"}
