"""``release card``: bilingual model cards from Jinja templates, Babel catalogs and the data of each build.

Every number comes from a file another stage wrote: ``provenance.json`` (build), ``verification/report.json``
(verify), ``<dist>/tables/tables.json`` (tables) and, when present, ``<dist>/selection.json`` (select). Strings are
translated through ``locales/<lang>/LC_MESSAGES/messages.po`` (compiled in memory), numbers and dates are formatted
by Babel for the card's locale.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import math
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from babel.dates import format_date
from babel.messages.catalog import Catalog
from babel.messages.extract import DEFAULT_KEYWORDS, extract_from_dir, extract_from_file
from babel.messages.mofile import write_mo
from babel.messages.pofile import PoFileError, read_po
from babel.numbers import format_decimal, format_percent
from babel.support import NullTranslations, Translations
from huggingface_hub import ModelCard, ModelCardData

from release import ReleaseError
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.io import atomic_write, read_json
from release.select import TABLES, Candidate, SelectionDoc, read_selection, read_tables
from release.stats import min_observations

ROOT = Path(__file__).resolve().parent.parent
# what the card reads from provenance.json ('release build')
PROVENANCE_FIELDS = ("source", "tool", "versions", "device", "calibration", "config_sha256", "quantized_linears",
                     "date")
TEMPLATES = ROOT / "templates"
LOCALES = ROOT / "locales"
SOURCE_LANG = "en"
LICENSE_TEXT = "OpenMDW License 1.1: see {link}\n"


def _(message: str) -> str:
    """Marks a string for extraction; translated at render time through the card's catalog."""
    return message


def supported_languages() -> list[str]:
    return [SOURCE_LANG, *sorted(p.name for p in LOCALES.iterdir() if (p / "LC_MESSAGES" / "messages.po").is_file())]


def _po(lang: str) -> Path:
    return LOCALES / lang / "LC_MESSAGES" / "messages.po"


@functools.cache
def _catalog(path: Path, lang: str) -> Catalog:
    try:
        with path.open("rb") as f:
            return read_po(f, locale=lang, abort_invalid=True)
    except (PoFileError, ValueError) as exc:  # ValueError: not in the catalog's charset
        raise ReleaseError(f"{path}: not a valid catalog ({exc}); fix it, then run 'make i18n'") from exc


@functools.cache
def _compiled(path: Path, lang: str) -> Translations:
    buf = io.BytesIO()
    write_mo(buf, _catalog(path, lang))
    buf.seek(0)
    return Translations(buf)


def translations(lang: str) -> NullTranslations:
    """The language's catalog, compiled in memory (fuzzy entries are left out: ``check_catalog`` refuses them)."""
    return NullTranslations() if lang == SOURCE_LANG else _compiled(_po(lang), lang)


@functools.cache
def card_messages(templates: Path) -> tuple[str, ...]:
    """Every msgid the cards use, in source order: Babel's extraction as ``make i18n`` runs it (babel.cfg: the
    templates with Jinja's i18n extension, ``_()`` in this module)."""
    keywords = {**DEFAULT_KEYWORDS, "_": None}
    found = [m[2] for m in extract_from_dir(str(templates), [("**.j2", "jinja2")],
                                            {"**.j2": {"extensions": "jinja2.ext.i18n"}}, keywords=keywords)]
    found += [m[1] for m in extract_from_file("python", __file__, keywords=keywords)]
    return tuple(dict.fromkeys(m[0] if isinstance(m, tuple) else m for m in found))


def check_catalog(lang: str) -> None:
    """Refuse a catalog that would leave English in a translated card: every msgid the cards use needs a
    translation that is neither empty nor fuzzy (a fuzzy one is left out of the compiled catalog, so it would fall
    back to English too)."""
    if lang == SOURCE_LANG:
        return
    catalog = _catalog(_po(lang), lang)
    gaps = []
    for msgid in card_messages(TEMPLATES):
        entry = catalog.get(msgid)
        if entry is None:
            gaps.append(f"msgid {msgid!r} is missing")
        elif entry.fuzzy:
            gaps.append(f"msgid {msgid!r} is fuzzy")
        elif not all(entry.string if isinstance(entry.string, tuple) else (entry.string,)):  # plurals: a tuple
            gaps.append(f"msgid {msgid!r} has an empty msgstr")
    if gaps:
        more = f" (and {len(gaps) - 1} more)" if len(gaps) > 1 else ""
        raise ReleaseError(f"{_po(lang)}: {gaps[0]}{more}; the {lang} card would show English there: run "
                           "'make i18n', translate it and remove any fuzzy flag")


@dataclass(frozen=True)
class CardRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    dist: Path
    langs: list[str]
    check: bool

    @classmethod
    def create(cls, names: tuple[str, ...], dist: Path, lang: str, check: bool = False) -> CardRequest:
        langs = [code.strip() for code in lang.split(",") if code.strip()]
        known = supported_languages()
        for code in langs:
            if code not in known:
                raise ReleaseError(f"--lang: unknown language code {code!r}; supported: {', '.join(known)}")
        if not langs:
            raise ReleaseError(f"--lang: name at least one language ({', '.join(known)})")
        for code in langs:
            check_catalog(code)
        release = load_release()
        wanted = list(names) or [n for n in available_builds() if (dist / load_build(n).repo).is_dir()]
        if not wanted:
            raise ReleaseError(f"{dist}: no built repos to document; run 'release build NAME' first")
        return cls(release, [load_build(n) for n in wanted], dist, langs, check)


class Formatter:
    """Babel formatting for one locale."""

    def __init__(self, lang: str) -> None:
        self.lang = lang

    def num(self, value: float | str | None, digits: int = 3, sign: bool = False) -> str:
        """None (undefined: 0 / 0) is "-"; an infinity (in tables.json the string "inf" or "-inf") is ∞."""
        if value is None:
            return "-"
        value = float(value)
        if math.isinf(value):
            return "-∞" if value < 0 else "+∞" if sign else "∞"
        text = format_decimal(value, format="0." + "0" * digits if digits else "0", locale=self.lang)
        return f"+{text}" if sign and value >= 0 and not text.startswith("-") else text

    def ci(self, ci: list[float] | tuple[float, float], digits: int = 3, sign: bool = False) -> str:
        return f"[{self.num(ci[0], digits, sign)}, {self.num(ci[1], digits, sign)}]"

    def pct(self, value: float | None, digits: int = 2) -> str:
        if value is None:
            return "-"
        return format_percent(value, format="0." + "0" * digits + "%", locale=self.lang)

    def p(self, value: float, bound: bool) -> str:
        """A p-value to the bootstrap's resolution (2 / resamples: 6 decimals at the most resamples ``release tables``
        takes); ``bound``: no resample fell on the other side of 0, the p is below it."""
        text = format_decimal(value, format="0.######", locale=self.lang)
        return f"< {text}" if bound else text

    def pct_ci(self, ci: list[float] | tuple[float, float]) -> str:
        return f"[{self.num(ci[0] * 100, 2)}, {self.num(ci[1] * 100, 2)}]"

    def date(self, value: dt.date) -> str:
        return format_date(value, "long", locale=self.lang)


def _environment(tr: NullTranslations) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        extensions=["jinja2.ext.i18n"],
    )
    env.install_gettext_translations(tr, newstyle=True)  # type: ignore[attr-defined]
    return env


def card_metadata(release: ReleaseConfig, langs: list[str]) -> ModelCardData:
    return ModelCardData(
        base_model=release.base_model,
        base_model_relation="quantized",
        license=release.license.id,
        license_name=release.license.name,
        license_link=release.license.link,
        pipeline_tag="robotics",
        library_name=release.library_name,
        tags=release.tags,
        language=langs,
    )


PATH_LABELS = {"fakequant": _("fake quant, offline replay"), "deployed": _("deployed FP8 build (diffusers)"),
               "served": _("policy server, FP8 GEMM"), "yardstick": _("BF16 yardstick")}
SPLIT_LABELS = {"calibration": _("calibration labs (in-sample)"), "validation": _("held-out labs"),
                "all": _("all labs")}
CHECK_LABELS = {"layout": _("Files, tensor names, dtypes and shapes"),
                "quantization_config": _("`quantization_config`, root `hf_quant_config.json`"),
                "modelopt_state": _("`modelopt_state.pth`, transformer and root"),
                "values": _("Values"), "consistency": _("Indexes and shards"), "loadable": _("Loads and runs")}
CHECK_STATUS = {"passed": _("passed"), "failed": _("FAILED"), "skipped": _("skipped")}


def check_statuses(report: dict[str, Any], path: Path, build: str) -> list[str]:
    """Each check's status in ``report.json``; a report without them (an older 'release verify') is refused, as
    ``release push`` refuses it."""
    checks = report["checks"]
    if not isinstance(checks, list) or not all(isinstance(c, dict) and c.get("status") in CHECK_STATUS
                                               and c.get("name") in CHECK_LABELS for c in checks):
        raise ReleaseError(f"{path}: 'checks' is not a list of checks with a name and a status (passed, failed, "
                           f"skipped); rerun 'release verify {build}'")
    return [c["status"] for c in checks]


# Headers with a literal "%": Jinja's trans blocks would look them up as "%%".
HEADERS = {"overall": _("overall (sigma) [95% CI]"), "gripper": _("gripper agree [95% CI]"),
           "served_sigma": _("served sigma [95% CI]"), "served_diff": _("served vs RTN [95% CI]"),
           "sigma": _("sigma [95% CI]"), "diff": _("vs RTN [95% CI]"),
           "plot": _("Overall action error per build and path with 95% CIs; the line is the gate.")}
CORRECTED = {"diff": _("vs RTN, Bonferroni-corrected 95% CI (m = {m})"),
             "served_diff": _("served vs RTN, Bonferroni-corrected 95% CI (m = {m})"),
             "p": _("p, Bonferroni-corrected (m = {m})")}
TOO_FEW = _("too few observations")


def build_label(record: dict[str, Any], t: Any) -> str:
    delivered = t(_("delivered"))
    return f"{record['title']} ({delivered})" if record.get("delivered") else str(record["title"])


def _estimate(value: float, ci: list[float] | None, f: Formatter, t: Any, sign: bool = False) -> str:
    """A figure with its 95% interval, or with the reason it has none (too few observations for a bootstrap)."""
    return f"{f.num(value, sign=sign)} {f.ci(ci, sign=sign) if ci is not None else f'({t(TOO_FEW)})'}"


def fidelity_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    return [{
        "label": build_label(r, t), "path": f"{t(PATH_LABELS[r['path']])}, {t(SPLIT_LABELS[r['split']])}",
        "overall": _estimate(r["overall_sigma"], r["overall_ci"], f, t),
        "ratio": f.num(r["x_eager_vs_compile"], 2), "mae": f.num(r["joint_mae_deg"], 2), "snr": f.num(r["snr_db"], 1),
        "gripper": f"{f.pct(r['gripper_agree'])} {f.pct_ci(r['gripper_ci'])}",
    } for r in records]


def diff_headers(records: list[dict[str, Any]], t: Any, served: bool = False) -> dict[str, str]:
    """Headers of the difference and p columns: the intervals and p-values shown are Bonferroni-corrected over the
    m builds compared with RTN on the same path and split; with m = 1 that is the plain 95% interval."""
    ms = sorted({r["comparisons"] for r in records if r.get("comparisons")})
    key = "served_diff" if served else "diff"
    if ms in ([], [1]):
        return {"diff": t(HEADERS[key]), "p": "p"}
    m = ", ".join(map(str, ms))
    return {"diff": t(CORRECTED[key]).format(m=m), "p": t(CORRECTED["p"]).format(m=m)}


def _diff(r: dict[str, Any], f: Formatter, t: Any) -> str:
    if r.get("diff_to_baseline") is None:
        return "-"
    return _estimate(r["diff_to_baseline"], r["diff_ci_corrected"], f, t, sign=True)


def _p(r: dict[str, Any], f: Formatter, t: Any) -> str:
    if r.get("diff_too_few_observations"):
        return t(TOO_FEW)
    if r.get("diff_p_corrected") is None:  # the baseline, or figures without a p (the seed card's)
        return "-"
    return f.p(r["diff_p_corrected"], r["diff_p_bound"])


def served_rows(records: list[dict[str, Any]], f: Formatter, t: Any, split: str = "all") -> list[dict[str, str]]:
    served = sorted((r for r in records if r["path"] == "served"), key=lambda r: r["overall_sigma"])
    fq = {r["build"]: r for r in records if r["path"] == "fakequant"}
    gate = {True: t(_("pass")), False: t(_("fail"))}
    rows = []
    for r in sorted(served, key=lambda r: (r.get("diff_to_baseline") is not None, r["overall_sigma"])):
        q = fq.get(r["build"])
        rows.append({
            "build": build_label(r, t), "sigma": _estimate(r["overall_sigma"], r["overall_ci"], f, t),
            "diff": _diff(r, f, t), "p": _p(r, f, t), "changes": str(r["gripper_changes"]),
            "fq_sigma": f.num(q["overall_sigma"]) if q else "-", "fq_changes": str(q["gripper_changes"]) if q else "-",
            "gates": f"{gate[q['gate']] if q else '-'} / {gate[r['gate']]}",
        })
    return rows


def ranking_tables(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, Any]]:
    tables = []
    for path, split in sorted({(r["path"], r["split"]) for r in records if r["path"] in ("fakequant", "deployed")}):
        rows = sorted((r for r in records if (r["path"], r["split"]) == (path, split)),
                      key=lambda r: r["overall_sigma"])
        tables.append({
            "heading": f"{t(PATH_LABELS[path])}, {t(SPLIT_LABELS[split])}",
            "steps": rows[0]["n_steps"], "headers": diff_headers(rows, t),
            "rows": [{"rank": str(i), "build": build_label(r, t),
                      "sigma": _estimate(r["overall_sigma"], r["overall_ci"], f, t), "diff": _diff(r, f, t),
                      "p": _p(r, f, t), "changes": str(r["gripper_changes"])} for i, r in enumerate(rows, start=1)],
        })
    return tables


def conclusions(records: list[dict[str, Any]], baseline: str, t: Any) -> list[str]:
    """Statements that follow from the paired differences: who beats the baseline with a Bonferroni-corrected
    interval excluding 0 (the builds of one path and split share their observations, so their m and N)."""
    out = []
    for path, split in sorted({(r["path"], r["split"]) for r in records}):
        rows = [r for r in records
                if (r["path"], r["split"]) == (path, split) and r.get("diff_to_baseline") is not None]
        if not rows:
            continue
        where = f"{t(PATH_LABELS[path])}, {t(SPLIT_LABELS[split])}"
        if any(r["diff_ci_corrected"] is None for r in rows):
            out.append(t(_("{where}: too few observations to compare the builds with {baseline}."))
                       .format(where=where, baseline=baseline))
            continue
        m = max(r["comparisons"] for r in rows)
        better = [r["title"] for r in rows if r["diff_ci_corrected"][1] < 0]
        worse = [r["title"] for r in rows if r["diff_ci_corrected"][0] > 0]
        if better:
            out.append(t(_("{where}: lower error than {baseline} with a Bonferroni-corrected 95% CI (m = {m}) "
                           "excluding zero: {builds}.")).format(where=where, baseline=baseline, m=m,
                                                                builds=", ".join(better)))
        else:
            out.append(t(_("{where}: no build has a lower error than {baseline} with a Bonferroni-corrected 95% CI "
                           "(m = {m}) excluding zero.")).format(where=where, baseline=baseline, m=m))
        if worse:
            out.append(t(_("{where}: higher error than {baseline} with a Bonferroni-corrected 95% CI (m = {m}) "
                           "excluding zero: {builds}.")).format(where=where, baseline=baseline, m=m,
                                                                builds=", ".join(worse)))
    return [f"- {c}" for c in out]


def forest_plot(records: list[dict[str, Any]], gate_sigma: float, lang: str, out: Path) -> None:
    """Overall sigma with 95% interval per build and path, the gate as a line, labelled in ``lang``."""
    import matplotlib

    matplotlib.use("Agg")
    import koreanize_matplotlib  # noqa: F401  (NanumGothic for Hangul labels)
    import matplotlib.pyplot as plt

    t = translations(lang).gettext
    rows = [r for r in records if r["path"] != "yardstick"]
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5), dpi=100)
    for i, r in enumerate(rows):
        lo, hi = r["overall_ci"] or (r["overall_sigma"], r["overall_sigma"])  # no interval: too few observations
        ax.errorbar(r["overall_sigma"], i, xerr=[[r["overall_sigma"] - lo], [hi - r["overall_sigma"]]], fmt="o",
                    color="tab:blue" if r["path"] == "fakequant" else "tab:orange", capsize=3)
    ax.axvline(gate_sigma, color="tab:red", linestyle="--", label=t(_("gate")))
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([f"{r['build']} / {t(PATH_LABELS[r['path']])} / {t(SPLIT_LABELS[r['split']])}"
                        for r in rows], fontsize=7)
    ax.set_xlabel(t(_("overall action error (sigma) with 95% CI")))
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write(out, buf.getvalue())


def card_context(release: ReleaseConfig, build: BuildConfig, folder: Path, all_records: list[dict[str, Any]],
                 selection: SelectionDoc | None, lang: str, langs: list[str], plot: str) -> dict[str, Any]:
    t = translations(lang).gettext
    f = Formatter(lang)
    prov = read_json(folder / "provenance.json", "provenance", f"release build {build.name}", PROVENANCE_FIELDS)
    report_path = folder / "verification" / "report.json"
    report = read_json(report_path, "verification report", f"release verify {build.name}", ("checks",))
    statuses = check_statuses(report, report_path, build.name)
    mine = [r for r in all_records if r["build"] == build.name]
    if not mine:
        raise ReleaseError(f"tables.json has no results for build {build.name!r}; run 'release eval {build.name}' "
                           "and 'release tables' first")
    baseline = [r for r in all_records if r["build"] == "rtn" and build.name != "rtn"]
    yardsticks = [r for r in all_records if r["path"] == "yardstick"]
    date = dt.datetime.fromisoformat(prov["date"]).date()
    sq = build.smoothquant
    if sq is not None:
        alpha = t(_("alpha searched per layer over 0.0-1.0 in steps of {step}")).format(step=sq.alpha_step) \
            if sq.alpha == "auto" else t(_("alpha = {alpha}")).format(alpha=sq.alpha)
        recipe = t(_("SmoothQuant ({alpha}), folded into the preceding norms{updown}; data: {calls} transformer "
                     "calls")).format(alpha=alpha, calls=build.algorithm_calls,
                                      updown=t(_(" and into `up_proj` for `down_proj`")) if sq.fold_up_down else "")
    else:
        recipe = t(_("Round-to-nearest (the recipe of `nvidia/Cosmos3-Nano@fp8`)"))
    observer = {"max": t(_("ModelOpt max calibration")),
                "moving_average": t(_("moving-average observer (momentum {m})")).format(m=build.calibrator.momentum),
                "histogram": t(_("ModelOpt histogram calibrator ({p} percentile)")).format(
                    p=build.calibrator.percentile),
                "range_shrink": t(_("range-shrink observer ({p} percent of each tail dropped per call, moving "
                                    "average {m})")).format(p=build.calibrator.shrink_percent,
                                                            m=build.calibrator.momentum)}[build.calibrator.method]
    passed = [r for r in mine if r["gate"]]
    gate_verdict = t(_("It passes the gate on: {paths}.")).format(
        paths=", ".join(f"{t(PATH_LABELS[r['path']])} ({t(SPLIT_LABELS[r['split']])})" for r in passed)) \
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
    caveats.append(t(_("The numbers come from the evaluation data named in `provenance.json` and "
                       "`results/`; a different robot setup can behave differently.")))
    siblings = [{"repo_id": f"{release.org}/{s.repo}", "title": load_build(s.build).title,
                 "current": s.build == build.name} for s in release.siblings]
    languages_line = " | ".join(
        f"[{code}]({'README.md' if code == langs[0] else f'README.{code}.md'})" for code in langs
    ) if len(langs) > 1 else ""
    return {
        "release": release, "prov": prov, "repo_id": f"{release.org}/{build.repo}",
        "title": f"Cosmos3-Nano-Policy-DROID, {build.title} (ModelOpt W8A8, per-tensor static)",
        "description": build.description, "siblings": siblings, "languages_line": languages_line,
        "recipe_text": t(_("{recipe}; input scales: {observer}")).format(recipe=recipe, observer=observer),
        "kept": ", ".join(f"`{k}`" for k in build.kept_bf16),
        "built_date": f.date(date), "gate_sigma": f.num(build.gate.overall_sigma, 2),
        "gate_rate": f.pct(build.gate.gripper_change_rate, 1), "gate_verdict": gate_verdict,
        "verification_reference": Path(report["reference"]).name if report.get("reference") else "",
        "verification": [{"label": t(CHECK_LABELS[c["name"]]), "status": t(CHECK_STATUS[status]),
                          "summary": c.get("summary", "")} for c, status in zip(report["checks"], statuses,
                                                                                strict=True)],
        "verification_skipped": ", ".join(t(CHECK_LABELS[c["name"]]) for c, status in zip(report["checks"], statuses,
                                                                                          strict=True)
                                          if status == "skipped"),
        "plot": plot, "min_obs": min_observations(),
        "fidelity_rows": fidelity_rows(mine + baseline + yardsticks, f, t),
        "conclusions": conclusions(all_records, "RTN", t),
        "served_rows": served_rows(all_records, f, t),
        "served_headers": diff_headers([r for r in all_records if r["path"] == "served"], t, served=True),
        "ranking_tables": ranking_tables(all_records, f, t),
        "attribution_rows": [
            {"build": r["build"], "path": t(PATH_LABELS[r["path"]]), "diff": f.num(r["diff"], sign=True),
             "top": ", ".join(str(o) for o in r["top_observations"]), "without": f.num(r["diff_without_top"],
                                                                                          sign=True),
             "share": f.pct(r["top3_error_share"], 1)} for r in _attribution(all_records)],
        "caveats": caveats,
        "selection": selection_context(selection, build, f, t),
        "h": {k: t(v) for k, v in HEADERS.items()},
    }


TIE_BREAKS = {"gripper_agree": _("the higher gripper agreement"), "joint_mae_deg": _("the lower joint MAE")}
GATE_CRITERIA = {"overall_sigma": _("overall"), "gripper_changes": _("gripper changes")}
NOT_EVALUATED = {"no_build_file": _("not evaluated: no build file"),
                 "no_results": _("not evaluated on this path and split")}
VERDICTS = {"always": _("This build is chosen in any case, as the reference: {rank}."),
            "rank": _("This build was chosen: {rank}."), None: _("This build was not chosen: {rank}.")}
CHOSEN = {"always": _("yes, as the reference"), "rank": _("yes"), None: "-"}


def selection_context(doc: SelectionDoc | None, build: BuildConfig, f: Formatter, t: Any) -> dict[str, Any] | None:
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

    def place(c: Candidate) -> str:
        if c.rank is None:
            return t(NOT_EVALUATED[str(c.not_evaluated)])
        return t(_("rank {rank} of {n}")).format(rank=c.rank, n=len(ranked))

    mine = next((c for c in doc.candidates if c.build == build.name), None)
    verdict = t(_("This build is not one of the candidates.")) if mine is None else \
        t(VERDICTS[mine.chosen]).format(rank=place(mine))
    gate = {True: t(_("pass")), False: t(_("fail"))}
    rows = []
    for c in doc.candidates:
        row = {"rank": str(c.rank or "-"), "build": c.title or f"`{c.build}`", "overall": "-", "gripper": "-",
               "changes": "-", "gate": place(c), "chosen": t(CHOSEN[c.chosen]) if c.chosen else "-"}
        if c.scores is not None and c.gate is not None:
            s = c.scores
            failed = ", ".join(t(GATE_CRITERIA[k]) for k in c.gate.failed)
            row.update(overall=_estimate(s.overall_sigma, list(s.overall_ci) if s.overall_ci else None, f, t),
                       gripper=f"{f.pct(s.gripper_agree)} {f.pct_ci(s.gripper_ci)}",
                       changes=f"{s.gripper_changes} / {s.n_steps}",
                       gate=f"{gate[c.gate.passed]} ({failed})" if failed else gate[c.gate.passed])
        rows.append(row)
    return {"text": text, "verdict": verdict, "rows": rows}


def _attribution(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"build": r["title"], "path": r["path"], **r["attribution"]} for r in records if r.get("attribution")]


def render_card(release: ReleaseConfig, build: BuildConfig, folder: Path, records: list[dict[str, Any]],
                selection: SelectionDoc | None, lang: str, langs: list[str]) -> str:
    context = card_context(release, build, folder, records, selection, lang, langs, f"forest.{lang}.png")
    env = _environment(translations(lang))
    try:
        body = env.get_template("card.md.j2").render(**context)
    except jinja2.UndefinedError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")]
        where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno}" if frames else "templates"
        raise ReleaseError(f"{where}: {exc} (an undefined template variable); fix the template or the data") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise ReleaseError(f"{exc.filename}:{exc.lineno}: template syntax error: {exc.message}") from exc
    text = f"---\n{card_metadata(release, langs).to_yaml()}\n---\n\n{body}"
    ModelCard(text)  # parses the front matter; raises on invalid YAML
    return text


def card_files(request: CardRequest, records: list[dict[str, Any]],
               selection: SelectionDoc | None) -> dict[Path, str | bytes]:
    """Every file the cards add to each build folder (README per language, LICENSE); plots are written apart."""
    files: dict[Path, str | bytes] = {}
    for build in request.builds:
        folder = request.dist / build.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {build.name}' first")
        for i, lang in enumerate(request.langs):
            name = "README.md" if i == 0 else f"README.{lang}.md"
            files[folder / name] = render_card(request.release, build, folder, records, selection, lang,
                                               request.langs)
        files[folder / "LICENSE"] = LICENSE_TEXT.format(link=request.release.license.link)
    return files


def render_cards(request: CardRequest) -> list[Path]:
    records = read_tables(request.dist / TABLES)
    files = card_files(request, records, read_selection(request.dist))
    if request.check:
        return sorted(files)
    for build in request.builds:
        for lang in request.langs:
            forest_plot(records, build.gate.overall_sigma, lang, request.dist / build.repo / f"forest.{lang}.png")
    for path, text in files.items():
        atomic_write(path, text)
    return sorted(files)
