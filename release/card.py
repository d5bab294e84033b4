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
import re
import traceback
from collections.abc import Iterable
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

from release import ReleaseError, data_path
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.io import atomic_write, read_json
from release.particles import Text, particle
from release.select import TABLES, Candidate, SelectionDoc, read_selection, read_tables_doc
from release.stats import min_observations

# what the card reads from provenance.json ('release build')
PROVENANCE_FIELDS = ("source", "tool", "versions", "device", "calibration", "config_sha256", "quantized_linears",
                     "date")
TEMPLATES = data_path("templates")
LOCALES = data_path("locales")
ROOT = TEMPLATES.parent  # template names in errors are relative to it
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


class _Messages(Translations):
    """A compiled catalog whose messages choose their Korean particles once formatted (``particles.Text``): by
    ``str.format`` on the Python side, by ``%`` in Jinja's ``trans`` blocks."""

    def gettext(self, message: str) -> str:
        return Text(super().gettext(message))

    def ngettext(self, msgid1: str, msgid2: str, n: int) -> str:
        return Text(super().ngettext(msgid1, msgid2, n))

    ugettext, ungettext = gettext, ngettext  # what Jinja's install_gettext_translations prefers


@functools.cache
def _compiled(path: Path, lang: str) -> Translations:
    buf = io.BytesIO()
    write_mo(buf, _catalog(path, lang))
    buf.seek(0)
    return _Messages(buf)


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
    env.filters["particle"] = particle
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
FILE_KINDS = {"tool sidecar": _("tool sidecar files ({n})"), "documentation": _("documentation files ({n})"),
              "base-model branch": _("files of the base model's other branches ({n})"),
              "unexpected": _("unexpected files ({n})")}


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
    if name == "layout":
        kinds: dict[str, int] = {}
        for kind in d["files_one_side"].values():
            kinds[kind] = kinds.get(kind, 0) + 1
        rest = ", ".join(t(FILE_KINDS[k]).format(n=n) for k, n in sorted(kinds.items())) or t(_("none"))
        text = _("{common} tensors in common, {differ} dtype or shape differences; on one side only: {rest}")
        return t(text).format(common=d["common_tensors"], differ=len(d["dtype_or_shape_differences"]), rest=rest)
    if name == "quantization_config":
        return t(_("identical to the reference's in the per-channel scheme (`quant_algo` "
                   "`FP8_PER_CHANNEL_PER_TOKEN`)")) if per_channel else t(_("identical to the reference's"))
    if name == "modelopt_state":
        text = _("`{file}`: {common} entries in common, {build} in the build only, {reference} in the reference only, "
                 "{differ} differ, {scheme} set by the per-channel scheme") if per_channel else \
            _("`{file}`: {common} entries in common, {build} in the build only, {reference} in the reference only, "
              "{differ} differ")
        return "; ".join(t(text).format(file=file, common=c["common"], build=c["build_only"],
                                        reference=c["reference_only"], differ=c["differ"],
                                        **({"scheme": c["scheme"]} if per_channel else {}))
                         for file, c in d["counts"].items())
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
        parts.append(t(_("other tensors equal the source except {k} norms and `up_proj` with folded smoothing"))
                     .format(k=d["folded"]) if d["folded"] else t(_("other tensors equal the source")))
        return "; ".join(parts)
    if name == "consistency":
        return t(_("both indexes list exactly the shards present; no tensor twice; no orphan file"))
    return t(_("loads in diffusers with ModelOpt's restore; one policy rollout, W8A8 on every step through a row-wise "
               "FP8 GEMM, gives finite actions")) if per_channel else \
        t(_("loads in diffusers with ModelOpt's restore; one policy rollout gives finite actions"))


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


# Headers with a literal "%": Jinja's trans blocks would look them up as "%%". The difference columns say "the
# baseline": the comparison names it (tables.json's "baseline"), so that a header fits its column.
HEADERS = {"overall": _("overall (sigma) [95% CI]"), "gripper": _("gripper agree [95% CI]"),
           "sigma": _("sigma [95% CI]"), "diff": _("vs baseline [95% CI]"),
           "plot": _("Overall action error of every build per path and split with 95% CIs, this build highlighted, "
                     "on the gate's scale (left) and as the difference to the baseline (right).")}
CORRECTED = {"diff": _("vs baseline, Bonferroni-corrected 95% CI (m = {m})"),
             "p": _("p, Bonferroni-corrected (m = {m})")}
# The columns of a results table on a path that is not fake quant (the seed's "served results").
PATH_HEADERS = {
    "served": {"sigma": _("served sigma [95% CI]"), "diff": _("served vs baseline [95% CI]"),
               "diff_m": _("served vs baseline, Bonferroni-corrected 95% CI (m = {m})"),
               "changes": _("served changes"), "gate": _("gate (fake quant / served)")},
    "deployed": {"sigma": _("deployed sigma [95% CI]"), "diff": _("deployed vs baseline [95% CI]"),
                 "diff_m": _("deployed vs baseline, Bonferroni-corrected 95% CI (m = {m})"),
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


def _estimate(value: float, ci: list[float] | None, f: Formatter, t: Any, sign: bool = False) -> str:
    """A figure with its 95% interval, or with the reason it has none (too few observations for a bootstrap)."""
    return f"{f.num(value, sign=sign)} {f.ci(ci, sign=sign) if ci is not None else f'({t(TOO_FEW)})'}"


def _where(path: str, split: str, t: Any) -> str:
    return f"{t(PATH_LABELS[path])}, {t(SPLIT_LABELS[split])}"


def speed_lines(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[str]:
    """The rollout latency and peak GPU memory of this build beside BF16's, for each path measured on a GPU."""
    lines = []
    for r in records:
        s = r.get("speed")
        if s:
            lines.append(t(_("Speed and memory ({where}, `{device}`): {seconds} s vs {bf16_seconds} s per rollout for "
                             "BF16 (median of {n} rollouts each), peak GPU memory {gib} vs {bf16_gib} GiB.")).format(
                where=_where(r["path"], r["split"], t), device=s["build"]["device"],
                seconds=f.num(s["build"]["seconds"], 2), bf16_seconds=f.num(s["bf16"]["seconds"], 2),
                n=s["build"]["rollouts"], gib=f.num(s["build"]["peak_gib"], 1),
                bf16_gib=f.num(s["bf16"]["peak_gib"], 1)))
    return lines


def scheme_of(record: dict[str, Any]) -> str:
    return str(record.get("scheme") or PER_TENSOR)


def _group(records: list[dict[str, Any]], path: str, split: str, scheme: str | None = None) -> list[dict[str, Any]]:
    """The records of one path and split (and scheme), lowest overall first."""
    return sorted((r for r in records if (r["path"], r["split"]) == (path, split)
                   and (scheme is None or scheme_of(r) == scheme)), key=lambda r: r["overall_sigma"])


def _groups(records: list[dict[str, Any]], paths: tuple[str, ...]) -> list[tuple[str, str]]:
    order = {p: i for i, p in enumerate(MEASURED)}
    return sorted({(r["path"], r["split"]) for r in records if r["path"] in paths},
                  key=lambda g: (order[g[0]], list(SPLIT_LABELS).index(g[1])))


def fidelity_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    return [{
        "label": build_label(r, t), "path": _where(r["path"], r["split"], t),
        "overall": _estimate(r["overall_sigma"], r["overall_ci"], f, t),
        "ratio": f.num(r["x_eager_vs_compile"], 2), "mae": f.num(r["joint_mae_deg"], 2), "snr": f.num(r["snr_db"], 1),
        "gripper": f"{f.pct(r['gripper_agree'])} {f.pct_ci(r['gripper_ci'])}",
    } for r in records]


def diff_headers(records: list[dict[str, Any]], t: Any, path: str = "fakequant") -> dict[str, str]:
    """Headers of the difference and p columns: the intervals and p-values shown are Bonferroni-corrected over the
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
    return _estimate(r["diff_to_baseline"], r["diff_ci_corrected"], f, t, sign=True)


def _p(r: dict[str, Any], f: Formatter, t: Any) -> str:
    if r.get("diff_too_few_observations"):
        return t(TOO_FEW)
    if r.get("diff_p_corrected") is None:  # the baseline, or figures without a p (the seed card's)
        return "-"
    return f.p(r["diff_p_corrected"], r["diff_p_bound"])


def _fakequant_for(records: list[dict[str, Any]], split: str) -> dict[str, dict[str, Any]]:
    """Each build's fake-quant record to show beside another path's on ``split``: the same split, else the
    calibration labs (the seed: served on all 32 observations beside fake quant on the same 32)."""
    splits = {r["split"] for r in records if r["path"] == "fakequant"}
    chosen = split if split in splits else "calibration" if "calibration" in splits else next(iter(sorted(splits)), "")
    return {r["build"]: r for r in records if r["path"] == "fakequant" and r["split"] == chosen}


def path_rows(records: list[dict[str, Any]], path: str, split: str, f: Formatter, t: Any) -> list[dict[str, str]]:
    """The seed's "served results" for one path and split: each build with its difference to the baseline, its
    gripper changes, its fake-quant figures and both gates; the baseline first."""
    fq = _fakequant_for(records, split)
    gate = {True: t(_("pass")), False: t(_("fail"))}
    rows = []
    for r in sorted(_group(records, path, split), key=lambda r: r.get("diff_to_baseline") is not None):
        q = fq.get(r["build"])
        rows.append({
            "build": build_label(r, t), "sigma": _estimate(r["overall_sigma"], r["overall_ci"], f, t),
            "diff": _diff(r, f, t), "p": _p(r, f, t), "changes": str(r["gripper_changes"]),
            "fq_sigma": f.num(q["overall_sigma"]) if q else "-", "fq_changes": str(q["gripper_changes"]) if q else "-",
            "gates": f"{gate[q['gate']] if q else '-'} / {gate[r['gate']]}",
        })
    return rows


def ranking_rows(rows: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    return [{"rank": str(i), "build": build_label(r, t), "sigma": _estimate(r["overall_sigma"], r["overall_ci"], f, t),
             "diff": _diff(r, f, t), "p": _p(r, f, t), "changes": str(r["gripper_changes"])}
            for i, r in enumerate(rows, start=1)]


def attribution_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    """Where each difference to the baseline comes from, delivered builds first, then by overall error; the rows of
    one path and split (the table's introduction names them)."""
    shown = sorted((r for r in records if r.get("attribution")), key=lambda r: (not r.get("delivered"),
                                                                               r["overall_sigma"]))
    return [{"build": build_label(r, t), "diff": f.num(r["attribution"]["diff"], sign=True),
             "top": ", ".join(str(o) for o in r["attribution"]["top_observations"]),
             "without": f.num(r["attribution"]["diff_without_top"], sign=True),
             "share": f.pct(r["attribution"]["top3_error_share"], 1) if r["attribution"].get("top3_error_share")
             is not None else "-"} for r in shown]


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
    for path, split in _groups(records, MEASURED):
        rows = [r for r in _group(records, path, split, PER_TENSOR) if r.get("diff_to_baseline") is not None]
        if not rows:
            continue
        where = _where(path, split, t)
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
    for path, split in _groups(records, ("served", "deployed")):
        other = {r["build"]: r for r in _group(records, path, split)}
        fq = _fakequant_for(records, split)
        common = [b for b in other if b in fq]
        if len(common) >= 3:
            rho = spearman([fq[b]["overall_sigma"] for b in common], [other[b]["overall_sigma"] for b in common])
            text = _("Fake quant and {where} rank the {n} builds they share in opposite order (Spearman rho = "
                     "{rho}).") if rho < 0 else _("Fake quant and {where} rank the {n} builds they share alike "
                                                  "(Spearman rho = {rho}).")
            out.append(t(text).format(where=_where(path, split, t), n=len(common), rho=f.num(rho, 2)))
        moved = [r for r in other.values() if r.get("attribution") and r["attribution"]["diff_without_top"] is not None]
        halved = [r for r in moved if abs(r["attribution"]["diff_without_top"]) < abs(r["attribution"]["diff"]) / 2]
        if moved and 2 * len(halved) > len(moved):
            out.append(t(_("On {where}, most of each difference to {baseline} comes from two observations: without "
                           "them {k} of {n} differences shrink to less than half.")).format(
                where=_where(path, split, t), baseline=baseline, k=len(halved), n=len(moved)))
    observations = sorted({r["n_obs"] for r in records if r["path"] in MEASURED})
    if out and not significant and observations:
        out.append(t(_("So these observations ({n} per split) cannot rank the builds of NVIDIA's format against each "
                       "other.")).format(n=", ".join(map(str, observations))))
    for path, split in _groups(records, ("fakequant",)):
        explore, nvidia = _group(records, path, split, PER_CHANNEL), _group(records, path, split, PER_TENSOR)
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
    return [f"- {_capital(c)}" for c in out]


def _capital(text: str) -> str:
    """A sentence or heading that starts with a lower-case label ("fake quant, ...") starts with a capital."""
    return text[:1].upper() + text[1:]


def _notes_on_path(records: list[dict[str, Any]], path: str, split: str, baseline: str, f: Formatter,
                   t: Any) -> list[str]:
    """Observations that recur in the attribution, how concentrated the baseline's error is, and the differences
    whose interval excludes zero only before the correction."""
    rows = _group(records, path, split)
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
        fq = _fakequant_for(records, split).get(base["build"])
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


def _same_codes_notes(rows: list[dict[str, Any]], provenances: dict[str, dict[str, Any]], f: Formatter,
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


def _worse_notes(rows: list[dict[str, Any]], baseline: str, t: Any) -> list[str]:
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


PATH_HOW = {
    "fakequant": _("the FP8 codes dequantized as the weights, each input quantize-dequantized at its scale (ModelOpt "
                   "fake quantization), BF16 elsewhere"),
    "deployed": _("the exported build through diffusers: ModelOpt's FP8 GEMM on a GPU (`torch._scaled_mm` with fast "
                  "accumulation), its emulation on a CPU (bit-exact to the eager kernel on an H200 at the shapes "
                  "measured, except GEMMs with K from {lo} to {hi}, where cuBLAS sums in another order; ModelOpt's "
                  "compiled GEMM differed from the eager one on up to 0.25 percent of bf16 outputs with outlier "
                  "channels); per-channel builds a row-wise FP8 GEMM"),
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
                            "`gate/up/down`; what stays BF16 is in the Scheme table")).format(
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
        (_("Statistics"), t(_("bootstrap over observations, {r} resamples; the differences to {baseline} are paired "
                              "(the same resamples) and Bonferroni-corrected over the builds of a path and split"))
         .format(r=format_decimal(resamples, locale=f.lang), baseline=baseline)),
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
    from release.fp8 import UNMODELLED_K  # here, not at the top: release.fp8 imports torch

    lo, hi = UNMODELLED_K
    measured = [r for r in records if r["path"] in MEASURED]
    total = len({r["build"] for r in measured})
    rows = []
    for path in MEASURED:
        n = len({r["build"] for r in measured if r["path"] == path})
        if n:
            count = t(_("all {n}")).format(n=n) if n == total else t(_("{n} of {total}")).format(n=n, total=total)
            rows.append({"path": t(PATH_LABELS[path]), "how": t(PATH_HOW[path]).format(lo=f"{lo:,}", hi=f"{hi:,}"),
                         "reference": t(PATH_REFERENCE[path]), "builds": count})
    return rows


def decision_rows(records: list[dict[str, Any]], release: ReleaseConfig, baseline: str, f: Formatter,
                  t: Any) -> list[dict[str, str]]:
    """The release's decision as the data stand: the delivered builds and their gates, the builds evaluated on more
    than one path and why they are not delivered, and what would settle the ranking."""
    measured = [r for r in records if r["path"] in MEASURED]
    by_build: dict[str, list[dict[str, Any]]] = {}
    for r in measured:
        by_build.setdefault(r["build"], []).append(r)
    delivered = [s.build for s in release.siblings if s.build in by_build]
    titles = {b: rs[0]["title"] for b, rs in by_build.items()}

    def paths(rows: list[dict[str, Any]]) -> str:
        return ", ".join(_where(r["path"], r["split"], t) for r in rows)

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
                text = t(_("passes the gate on every evaluated path ({paths}), but its error is not lower than that of "
                           "{best} ({a} vs {b} sigma, {where}), so it is not added")).format(
                    paths=paths(rows), best=best["title"], a=f.num(other["overall_sigma"]),
                    b=f.num(best["overall_sigma"]), where=_where(other["path"], other["split"], t))
            else:
                text = t(_("passes the gate on every evaluated path ({paths}) and has a lower error than every "
                           "delivered build on {where}; not delivered")).format(
                    paths=paths(rows), where=_where(other["path"], other["split"], t))
        out.append({"item": str(titles[b]), "content": text})
    heldout = [r for r in measured if r["split"] == "validation"]
    labs = ", ".join(release.heldout_labs)
    settle = t(_("The builds were evaluated on held-out labs ({labs}): see those tables.")).format(labs=labs) \
        if heldout else t(_("Evaluate again on observations from labs that calibration did not use ({labs}): "
                            "`release eval NAME... --split validation`.")).format(labs=labs)
    out.append({"item": t(_("To settle the ranking")), "content": settle})
    return out


def constraint_lines(records: list[dict[str, Any]], selection: SelectionDoc | None, t: Any) -> list[str]:
    measured = [r for r in records if r["path"] in MEASURED]
    out = []
    if any(r["split"] == "calibration" for r in measured) or (selection and selection.rule.split == "calibration"):
        out.append(t(_("The evaluation on the calibration labs is in-sample: the calibration calls, the algorithm "
                       "data and the selection come from those observations.")))
    if any(scheme_of(r) == PER_CHANNEL for r in measured):
        out.append(t(_("The per-channel builds are exploratory: they are not deliverable in the current format "
                       "(see their fake-quant tables).")))
    if not any(r["path"] == "served" for r in measured):
        out.append(t(_("No policy-server results were imported: the deployed rows are diffusers with ModelOpt's FP8 "
                       "GEMM (or its emulation on a CPU), not NVIDIA's policy server.")))
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
    for path, split in _groups(records, ("fakequant", "deployed")):
        group = _sweep_order(release, {r["build"] for r in _group(records, path, split)})
        extra = " --yardsticks" if split in yardstick_splits else ""
        yardstick_splits.discard(split)
        which = "--all" if release.sweep and group == list(release.sweep) else " ".join(group)
        lines.append(f"release eval {which} --path {path} --split {split} {data}{extra}")
    lines += [f"release import-served {b} {b}-served.npz" for b in
              _sweep_order(release, {r["build"] for r in measured if r["path"] == "served"})]
    lines += ["release tables", *(["release select"] if selection else []), f"release card --lang {','.join(langs)}"]
    return lines


def path_tables(records: list[dict[str, Any]], baseline: str, first: int, f: Formatter, t: Any
                ) -> list[dict[str, Any]]:
    """The seed's section 2 for each served or deployed path and split (numbered from ``first``): the results, where
    the differences come from, and what recurs."""
    tables = []
    for section, (path, split) in enumerate(_groups(records, ("served", "deployed")), start=first):
        group = _group(records, path, split)
        tables.append({
            "heading": f"{section}. {_capital(_where(path, split, t))}",
            "headers": {k: t(v) for k, v in PATH_HEADERS[path].items() if k != "diff_m"} | diff_headers(group, t, path),
            "rows": path_rows(records, path, split, f, t),
            "attribution": attribution_rows(group, f, t),
            "attribution_intro": t(_("Where the differences to {baseline} come from on {where}, observation by "
                                     "observation:")).format(baseline=baseline, where=_where(path, split, t)),
            "notes": _notes_on_path(records, path, split, baseline, f, t)})
    return tables


def fakequant_tables(records: list[dict[str, Any]], baseline: str, provenances: dict[str, dict[str, Any]],
                     first: int, f: Formatter, t: Any) -> list[dict[str, Any]]:
    """The seed's section 3 for each fake-quant split (numbered from ``first``): a ranking per family of the sweep,
    NVIDIA's format first, with what the differences and the builds' codes say."""
    tables = []
    for section, (path, split) in enumerate(_groups(records, ("fakequant",)), start=first):
        families = []
        for i, scheme in enumerate(s for s in FAMILIES if _group(records, path, split, s)):
            rows = _group(records, path, split, scheme)
            families.append({
                "heading": f"{section}.{i + 1} {t(FAMILIES[scheme])}: " + t(_("{n} builds")).format(n=len(rows)),
                "steps": rows[0]["n_steps"], "headers": diff_headers(rows, t), "rows": ranking_rows(rows, f, t),
                "vs": t(_("The differences are to {baseline} in NVIDIA's format (per tensor).")).format(
                    baseline=baseline) if scheme == PER_CHANNEL else "",
                "notes": _same_codes_notes(rows, provenances, f, t) + _worse_notes(rows, baseline, t),
                "reasons": [t(r) for r in NOT_DELIVERABLE] if scheme == PER_CHANNEL else []})
        tables.append({"heading": f"{section}. {_capital(_where(path, split, t))}", "families": families})
    return tables


def comparison_context(release: ReleaseConfig, build: BuildConfig, prov: dict[str, Any], tables: dict[str, Any],
                       selection: SelectionDoc | None, provenances: dict[str, dict[str, Any]], langs: list[str],
                       f: Formatter, t: Any) -> dict[str, Any] | None:
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
    titles = build_titles([s.build for s in release.siblings], f.lang)
    return {
        "date": f.date(date), "title": build_label(me, t) if me else build.text("title", f.lang),
        "baseline": baseline,
        "siblings": [{"build": f"{titles[s.build]} ({t(_('delivered'))})", "repo": f"{release.org}/{s.repo}"}
                     for s in release.siblings],
        "conclusions": conclusions(records, baseline, f, t),
        "setup": setup_rows(records, release, build, prov, int(tables.get("resamples", 10_000)), baseline, f, t),
        "paths": paths_rows(records, t), "path_tables": paths, "fakequant_tables": fakequant,
        "decision_heading": f"{section + 1}. " + t(_("Decision and remaining work")),
        "decision": decision_rows(records, release, baseline, f, t),
        "constraints_heading": f"{section + 2}. " + t(_("Constraints")),
        "constraints": constraint_lines(records, selection, t),
        "reproduction_heading": f"{section + 3}. " + t(_("Reproduction")),
        "commands": reproduction(records, release, build, selection, langs),
        "reproduction_note": t(_("This repository's build file and the release's `release.yaml` are uploaded beside "
                                 "the checkpoint in `builds/`: with the same source revision (`{revision}`) and "
                                 "observations, `RELEASE_BUILDS=builds release build {name}` remakes it.")).format(
            revision=prov["source"]["revision"], name=build.name),
    }


def _use_hangul_font() -> None:
    """Register the NanumGothic files koreanize-matplotlib ships and make it the font family.

    Importing ``koreanize_matplotlib`` does the same but imports ``distutils``, which Python 3.12 removed,
    so only its font folder is used.
    """
    from importlib.util import find_spec

    from matplotlib import font_manager, rcParams

    spec = find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise ReleaseError("the card's plot needs the NanumGothic font of koreanize-matplotlib: "
                           "pip install 'koreanize-matplotlib>=0.1.1,<0.2'")
    fonts = Path(next(iter(spec.submodule_search_locations))) / "fonts"
    for ttf in sorted(fonts.glob("*.ttf")):
        font_manager.fontManager.addfont(str(ttf))
    rcParams["font.family"] = "NanumGothic"
    rcParams["axes.unicode_minus"] = False


PATH_COLOURS = {"fakequant": "tab:blue", "deployed": "tab:orange", "served": "tab:green", "yardstick": "tab:gray"}
SPLIT_MARKERS = {"calibration": "o", "validation": "s", "all": "D"}
HIGHLIGHT = "#fdeeb0"


def forest_rows(records: list[dict[str, Any]], t: Any) -> list[tuple[str, str]]:
    """The plot's rows top down as (build, label): the builds by their error on the first path and split of the
    comparison (the others after them), then the yardsticks; labels are the (titled) records' titles."""
    groups = _groups(records, MEASURED)
    first = {r["build"]: r["overall_sigma"] for r in _group(records, *groups[0])} if groups else {}
    labels = {r["build"]: build_label(r, t).replace("`", "") for r in records}
    builds = sorted({r["build"] for r in records if r["path"] in MEASURED}, key=lambda b: (first.get(b, math.inf), b))
    yardsticks = sorted({r["build"] for r in records if r["path"] == "yardstick"})
    return [(b, labels[b]) for b in [*builds, *yardsticks]]


def forest_plot(tables: dict[str, Any], build: BuildConfig, lang: str, out: Path) -> None:
    """This build's plot, labelled in ``lang``: every build's overall error with its 95% interval for each path and
    split (one colour per path, one marker per split), this build's row highlighted, the yardsticks below. The left
    panel is on the gate's scale (a log axis that holds the gate, the builds and the yardsticks); the right one is
    each build's difference to the baseline with the Bonferroni-corrected interval of tables.json, on a scale where
    those intervals are visible. Everything drawn is sorted, so the PNG is byte-stable for the same input."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter, NullFormatter

    _use_hangul_font()

    t = translations(lang).gettext
    f = Formatter(lang)
    records = tables["records"]
    rows = forest_rows(records, t)
    y = {b: i for i, (b, _) in enumerate(rows)}
    measured = _groups(records, MEASURED)
    yardstick = sorted({("yardstick", r["split"]) for r in records if r["path"] == "yardstick"},
                       key=lambda g: list(SPLIT_LABELS).index(g[1]))
    offsets = {g: (k - (len(gs) - 1) / 2) * min(0.2, 0.7 / len(gs)) for gs in (measured, yardstick)
               for k, g in enumerate(gs)}
    handles: list[Any] = [Line2D([], [], color=PATH_COLOURS[path], marker=SPLIT_MARKERS[split], linestyle="",
                                 label=_where(path, split, t)) for path, split in [*measured, *yardstick]]
    legend_rows = math.ceil((len(handles) + 2) / 2)
    height = 0.3 * len(rows) + 1.4 + 0.22 * legend_rows
    fig, (gate_ax, diff_ax) = plt.subplots(1, 2, sharey=True, figsize=(13, height), dpi=100,
                                           gridspec_kw={"width_ratios": [3, 2]})
    for ax in (gate_ax, diff_ax):
        if build.name in y:
            ax.axhspan(y[build.name] - 0.5, y[build.name] + 0.5, color=HIGHLIGHT, zorder=0)
        ax.grid(axis="x", color="0.9", zorder=0)
    lows, highs, spans = [build.gate.overall_sigma], [build.gate.overall_sigma], [0.0]
    for r in records:
        at = y[r["build"]] + offsets[(r["path"], r["split"])]
        style = {"fmt": SPLIT_MARKERS[r["split"]], "color": PATH_COLOURS[r["path"]], "capsize": 2, "markersize": 4,
                 "elinewidth": 1, "zorder": 3}
        x = r["overall_sigma"]
        lo, hi = r["overall_ci"] or (x, x)  # no interval: too few observations
        gate_ax.errorbar(x, at, xerr=[[x - lo], [hi - x]], **style)
        lows.append(lo)
        highs.append(hi)
        if r.get("diff_to_baseline") is not None:
            d = r["diff_to_baseline"]
            dlo, dhi = r.get("diff_ci_corrected") or (d, d)
            diff_ax.errorbar(d, at, xerr=[[d - dlo], [dhi - d]], **style)
            spans += [abs(dlo), abs(dhi)]
    positive = [v for v in lows if v > 0] or [build.gate.overall_sigma]
    gate_ax.set_xscale("log", nonpositive="clip")
    gate_ax.set_xlim(min(positive) / 1.5, max(highs) * 1.5)
    gate_ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_decimal(v, locale=lang)))  # 0.01, not 10^-2
    gate_ax.xaxis.set_minor_formatter(NullFormatter())
    gate_ax.axvline(build.gate.overall_sigma, color="tab:red", linestyle="--", linewidth=1.2, zorder=2)
    diff_ax.axvline(0, color="0.3", linewidth=0.8, zorder=2)
    diff_ax.set_xlim(-max(spans) * 1.15 or -1, max(spans) * 1.15 or 1)
    gate_ax.set_yticks(range(len(rows)))
    gate_ax.set_yticklabels([label for _, label in rows], fontsize=8.5)
    for i, tick in enumerate(gate_ax.get_yticklabels()):
        if rows[i][0] == build.name:
            tick.set_fontweight("bold")
    gate_ax.invert_yaxis()
    gate_ax.set_xlabel(t(_("overall action error (sigma, log scale) with 95% CI")), fontsize=9)
    diff_ax.set_xlabel(t(_("difference to {baseline} (sigma)\nwith its Bonferroni-corrected 95% CI")).format(
        baseline=baseline_name(tables).replace("`", "")), fontsize=9)
    handles += [Line2D([], [], color="tab:red", linestyle="--",
                       label=t(_("gate: overall <= {sigma} sigma")).format(sigma=f.num(build.gate.overall_sigma, 2))),
                Patch(color=HIGHLIGHT, label=t(_("this build")))]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    fig.tight_layout(rect=(0, (0.22 * legend_rows + 0.15) / height, 1, 1))
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    atomic_write(out, buf.getvalue())


def recipe_text(build: BuildConfig, t: Any) -> str:
    """The Scheme table's "Algorithm": each recipe step in words, then the input scales' calibrator."""
    parts = []
    calls = build.algorithm_calls
    for step in build.recipe:
        if step == "rtn":
            parts.append(t(_("Round-to-nearest (the recipe of `nvidia/Cosmos3-Nano@fp8`)")))
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


def scheme_rows(build: BuildConfig, prov: dict[str, Any], t: Any) -> dict[str, str]:
    calibration = prov["calibration"]
    version = prov["versions"]["modelopt"]
    if build.scheme == PER_CHANNEL:
        return {"weights": t(_("FP8 E4M3, one scale per output channel")),
                "activations": t(_("FP8 E4M3, one scale per token, computed at run time (no calibration)")),
                "format": t(_("ModelOpt {version} `FP8_PER_CHANNEL_PER_TOKEN` (weights `strategy: channel`), in "
                              "NVIDIA's layout otherwise; exploratory: NVIDIA's policy server cannot serve it")).format(
                    version=version)}
    return {"weights": t(_("FP8 E4M3, one scale per tensor")),
            "activations": t(_("FP8 E4M3, one static scale per tensor, calibrated on {calls} transformer calls of the "
                               "BF16 policy on {observations} observations")).format(
                calls=calibration["calls"], observations=calibration["observations"]),
            "format": t(_("ModelOpt {version} `FP8` in NVIDIA's layout (`quantization_config`, quantizer buffers and "
                          "`modelopt_state.pth` as in `nvidia/Cosmos3-Nano@fp8`)")).format(version=version)}


def card_context(release: ReleaseConfig, build: BuildConfig, folder: Path, tables: dict[str, Any],
                 selection: SelectionDoc | None, provenances: dict[str, dict[str, Any]], lang: str, langs: list[str],
                 plot: str) -> dict[str, Any]:
    t = translations(lang).gettext
    f = Formatter(lang)
    all_records = tables["records"]
    prov = read_json(folder / "provenance.json", "provenance", f"release build {build.name}", PROVENANCE_FIELDS)
    report_path = folder / "verification" / "report.json"
    report = read_json(report_path, "verification report", f"release verify {build.name}", ("checks",))
    statuses = check_statuses(report, report_path, build.name)
    mine = [r for r in all_records if r["build"] == build.name]
    if not mine:
        raise ReleaseError(f"tables.json has no results for build {build.name!r}; run 'release eval {build.name}' "
                           "and 'release tables' first")
    baseline = [r for r in all_records if r["build"] == tables.get("baseline", "rtn") and r["build"] != build.name]
    yardsticks = [r for r in all_records if r["path"] == "yardstick"]
    date = dt.datetime.fromisoformat(prov["date"]).date()
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
    if not build.deliverable:
        caveats.append(t(_("This build is exploratory and not deliverable: NVIDIA's policy server cannot serve its "
                           "scheme.")))
    caveats.append(t(_("The numbers come from the evaluation data named in `provenance.json` and "
                       "`results/`; a different robot setup can behave differently.")))
    sibling_titles = build_titles([s.build for s in release.siblings], lang)
    siblings = [{"repo_id": f"{release.org}/{s.repo}", "title": sibling_titles[s.build],
                 "current": s.build == build.name} for s in release.siblings]
    languages_line = " | ".join(
        f"[{code}]({'README.md' if code == langs[0] else f'README.{code}.md'})" for code in langs
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
        "deliverable": build.deliverable,
        "recipe_text": recipe_text(build, t), "scheme": scheme_rows(build, prov, t), "source_note": source_note,
        "kept": ", ".join(f"`{k}`" for k in build.kept_bf16),
        "built_date": f.date(date), "gate_sigma": f.num(build.gate.overall_sigma, 2),
        "gate_rate": f.pct(build.gate.gripper_change_rate, 1), "gate_verdict": gate_verdict,
        "verification_reference": Path(report["reference"]).name if report.get("reference") else "",
        "verification": verification_rows(report, statuses, report_path, build, f, t),
        "verification_skipped": ", ".join(t(CHECK_LABELS[c["name"]]) for c, status in zip(report["checks"], statuses,
                                                                                          strict=True)
                                          if status == "skipped"),
        "plot": plot, "min_obs": min_observations(),
        "fidelity_rows": fidelity_rows(mine + baseline + yardsticks, f, t), "speed": speed_lines(mine, f, t),
        "comparison": comparison_context(release, build, prov, tables, selection, provenances, langs, f, t),
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
    titles = build_titles([c.build for c in doc.candidates], f.lang)
    rows = []
    for c in doc.candidates:
        row = {"rank": str(c.rank or "-"), "build": titles.get(c.build) or c.title or f"`{c.build}`", "overall": "-",
               "gripper": "-", "changes": "-", "gate": place(c), "chosen": t(CHOSEN[c.chosen]) if c.chosen else "-"}
        if c.scores is not None and c.gate is not None:
            s = c.scores
            failed = ", ".join(t(GATE_CRITERIA[k]) for k in c.gate.failed)
            row.update(overall=_estimate(s.overall_sigma, list(s.overall_ci) if s.overall_ci else None, f, t),
                       gripper=f"{f.pct(s.gripper_agree)} {f.pct_ci(s.gripper_ci)}",
                       changes=f"{s.gripper_changes} / {s.n_steps}",
                       gate=f"{gate[c.gate.passed]} ({failed})" if failed else gate[c.gate.passed])
        rows.append(row)
    return {"text": text, "verdict": verdict, "rows": rows}


def render_card(release: ReleaseConfig, build: BuildConfig, folder: Path, tables: dict[str, Any],
                selection: SelectionDoc | None, provenances: dict[str, dict[str, Any]], lang: str,
                langs: list[str]) -> str:
    context = card_context(release, build, folder, tables, selection, provenances, lang, langs, f"forest.{lang}.png")
    env = _environment(translations(lang))
    try:
        body = env.get_template("card.md.j2").render(**context)
    except jinja2.UndefinedError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")]
        where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno}" if frames else "templates"
        raise ReleaseError(f"{where}: {exc} (an undefined template variable); fix the template or the data") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise ReleaseError(f"{exc.filename}:{exc.lineno}: template syntax error: {exc.message}") from exc
    body = re.sub(r"\n{3,}", "\n\n", body)  # the sections' optional parts leave runs of blank lines
    text = f"---\n{card_metadata(release, langs).to_yaml()}\n---\n\n{body}"
    ModelCard(text)  # parses the front matter; raises on invalid YAML
    return text


def sweep_provenances(dist: Path) -> dict[str, dict[str, Any]]:
    """The provenance.json of every build in ``dist`` (the comparison compares their FP8 codes and input scales)."""
    out = {}
    for name in available_builds():
        path = dist / load_build(name).repo / "provenance.json"
        if path.is_file():
            out[name] = read_json(path, "provenance", f"release build {name}")
    return out


def card_files(request: CardRequest, localized: dict[str, dict[str, Any]],
               selection: SelectionDoc | None) -> dict[Path, str | bytes]:
    """Every file the cards add to each build folder (README per language, LICENSE); plots are written apart.
    ``localized``: tables.json per card language, its records titled in that language."""
    files: dict[Path, str | bytes] = {}
    provenances = sweep_provenances(request.dist)
    for build in request.builds:
        folder = request.dist / build.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {build.name}' first")
        for i, lang in enumerate(request.langs):
            name = "README.md" if i == 0 else f"README.{lang}.md"
            files[folder / name] = render_card(request.release, build, folder, localized[lang], selection, provenances,
                                               lang, request.langs)
        files[folder / "LICENSE"] = LICENSE_TEXT.format(link=request.release.license.link)
    return files


def render_cards(request: CardRequest) -> list[Path]:
    tables = read_tables_doc(request.dist / TABLES)
    localized = {lang: {**tables, "records": titled(tables["records"], lang, translations(lang).gettext)}
                 for lang in request.langs}
    files = card_files(request, localized, read_selection(request.dist))
    if request.check:
        return sorted(files)
    for build in request.builds:
        for lang in request.langs:
            forest_plot(localized[lang], build, lang, request.dist / build.repo / f"forest.{lang}.png")
    for path, text in files.items():
        atomic_write(path, text)
    return sorted(files)
