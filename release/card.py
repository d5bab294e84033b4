"""``release card``: bilingual model cards from Jinja templates, Babel catalogs and the data of each build.

Every number comes from a file another stage wrote: ``provenance.json`` (build), ``verification/report.json``
(verify), ``<dist>/tables/tables.json`` (tables). Strings are translated through ``locales/<lang>/LC_MESSAGES/
messages.po`` (compiled in memory), numbers and dates are formatted by Babel for the card's locale.
"""

from __future__ import annotations

import datetime as dt
import functools
import io
import json
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from babel.dates import format_date
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po
from babel.numbers import format_decimal, format_percent
from babel.support import NullTranslations, Translations
from huggingface_hub import ModelCard, ModelCardData

from release import ReleaseError
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.io import atomic_write

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "templates"
LOCALES = ROOT / "locales"
SOURCE_LANG = "en"
LICENSE_TEXT = "OpenMDW License 1.1: see {link}\n"


def _(message: str) -> str:
    """Marks a string for extraction; translated at render time through the card's catalog."""
    return message


def supported_languages() -> list[str]:
    return [SOURCE_LANG, *sorted(p.name for p in LOCALES.iterdir() if (p / "LC_MESSAGES" / "messages.po").is_file())]


@functools.cache
def translations(lang: str) -> NullTranslations:
    if lang == SOURCE_LANG:
        return NullTranslations()
    path = LOCALES / lang / "LC_MESSAGES" / "messages.po"
    with path.open("rb") as f:
        catalog = read_po(f, locale=lang)
    buf = io.BytesIO()
    write_mo(buf, catalog)
    buf.seek(0)
    return Translations(buf)


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
        release = load_release()
        wanted = list(names) or [n for n in available_builds() if (dist / load_build(n).repo).is_dir()]
        if not wanted:
            raise ReleaseError(f"{dist}: no built repos to document; run 'release build NAME' first")
        return cls(release, [load_build(n) for n in wanted], dist, langs, check)


class Formatter:
    """Babel formatting for one locale."""

    def __init__(self, lang: str) -> None:
        self.lang = lang

    def num(self, value: float, digits: int = 3, sign: bool = False) -> str:
        text = format_decimal(value, format="0." + "0" * digits if digits else "0", locale=self.lang)
        return f"+{text}" if sign and value >= 0 and not text.startswith("-") else text

    def ci(self, ci: list[float] | tuple[float, float], digits: int = 3, sign: bool = False) -> str:
        return f"[{self.num(ci[0], digits, sign)}, {self.num(ci[1], digits, sign)}]"

    def pct(self, value: float, digits: int = 2) -> str:
        return format_percent(value, format="0." + "0" * digits + "%", locale=self.lang)

    def pct_ci(self, ci: list[float] | tuple[float, float]) -> str:
        return f"[{self.num(ci[0] * 100, 2)}, {self.num(ci[1] * 100, 2)}]"

    def date(self, value: dt.date) -> str:
        return format_date(value, "long", locale=self.lang)


def _read(path: Path, what: str, command: str) -> Any:
    if not path.is_file():
        raise ReleaseError(f"{path}: missing ({what}); run '{command}' first")
    return json.loads(path.read_text())


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


# Headers with a literal "%": Jinja's trans blocks would look them up as "%%".
HEADERS = {"overall": _("overall (sigma) [95% CI]"), "gripper": _("gripper agree [95% CI]"),
           "served_sigma": _("served sigma [95% CI]"), "served_diff": _("served vs RTN [95% CI]"),
           "sigma": _("sigma [95% CI]"), "diff": _("vs RTN [95% CI]"),
           "plot": _("Overall action error per build and path with 95% CIs; the line is the gate.")}


def build_label(record: dict[str, Any], t: Any) -> str:
    delivered = t(_("delivered"))
    return f"{record['title']} ({delivered})" if record.get("delivered") else str(record["title"])


def fidelity_rows(records: list[dict[str, Any]], f: Formatter, t: Any) -> list[dict[str, str]]:
    rows = []
    for r in records:
        ratio = r.get("x_eager_vs_compile")
        rows.append({
            "label": build_label(r, t), "path": f"{t(PATH_LABELS[r['path']])}, {t(SPLIT_LABELS[r['split']])}",
            "overall": f"{f.num(r['overall_sigma'])} {f.ci(r['overall_ci'])}",
            "ratio": f.num(ratio, 2) if ratio is not None else "-",
            "mae": f.num(r["joint_mae_deg"], 2), "snr": f.num(r["snr_db"], 1),
            "gripper": f"{f.pct(r['gripper_agree'])} {f.pct_ci(r['gripper_ci'])}",
        })
    return rows


def _diff(r: dict[str, Any] | None, f: Formatter) -> str:
    if r is None or r.get("diff_to_baseline") is None:
        return "-"
    return f"{f.num(r['diff_to_baseline'], sign=True)} {f.ci(r['diff_ci'], sign=True)}"


def served_rows(records: list[dict[str, Any]], f: Formatter, t: Any, split: str = "all") -> list[dict[str, str]]:
    served = sorted((r for r in records if r["path"] == "served"), key=lambda r: r["overall_sigma"])
    fq = {r["build"]: r for r in records if r["path"] == "fakequant"}
    gate = {True: t(_("pass")), False: t(_("fail"))}
    rows = []
    for r in sorted(served, key=lambda r: (r.get("diff_to_baseline") is not None, r["overall_sigma"])):
        q = fq.get(r["build"])
        rows.append({
            "build": build_label(r, t), "sigma": f"{f.num(r['overall_sigma'])} {f.ci(r['overall_ci'])}",
            "diff": _diff(r, f), "changes": str(r["gripper_changes"]),
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
            "steps": rows[0]["n_steps"],
            "rows": [{"rank": str(i), "build": build_label(r, t),
                      "sigma": f"{f.num(r['overall_sigma'])} {f.ci(r['overall_ci'])}", "diff": _diff(r, f),
                      "changes": str(r["gripper_changes"])} for i, r in enumerate(rows, start=1)],
        })
    return tables


def conclusions(records: list[dict[str, Any]], baseline: str, t: Any) -> list[str]:
    """Statements that follow from the paired differences: who beats the baseline with an interval excluding 0."""
    out = []
    for path, split in sorted({(r["path"], r["split"]) for r in records}):
        rows = [r for r in records if (r["path"], r["split"]) == (path, split) and r.get("diff_ci")]
        if not rows:
            continue
        where = f"{t(PATH_LABELS[path])}, {t(SPLIT_LABELS[split])}"
        better = [r["title"] for r in rows if r["diff_ci"][1] < 0]
        worse = [r["title"] for r in rows if r["diff_ci"][0] > 0]
        if better:
            out.append(t(_("{where}: lower error than {baseline} with a 95% CI excluding zero: {builds}."))
                       .format(where=where, baseline=baseline, builds=", ".join(better)))
        else:
            out.append(t(_("{where}: no build has a lower error than {baseline} with a 95% CI excluding "
                           "zero.")).format(where=where, baseline=baseline))
        if worse:
            out.append(t(_("{where}: higher error than {baseline} with a 95% CI excluding zero: {builds}."))
                       .format(where=where, baseline=baseline, builds=", ".join(worse)))
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
        lo, hi = r["overall_ci"]
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
                 lang: str, langs: list[str], plot: str) -> dict[str, Any]:
    t = translations(lang).gettext
    f = Formatter(lang)
    prov = _read(folder / "provenance.json", "provenance", f"release build {build.name}")
    report = _read(folder / "verification" / "report.json", "verification report", f"release verify {build.name}")
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
                    p=build.calibrator.percentile)}[build.calibrator.method]
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
        "verification_reference": Path(report["reference"]).name if report.get("reference") else "-",
        "verification": [{"label": t(CHECK_LABELS[c["name"]]),
                          "status": t(_("skipped")) if c.get("skipped") else t(_("passed")) if c["passed"]
                          else t(_("FAILED")), "summary": c["summary"]} for c in report["checks"]],
        "plot": plot,
        "fidelity_rows": fidelity_rows(mine + baseline + yardsticks, f, t),
        "conclusions": conclusions(all_records, "RTN", t),
        "served_rows": served_rows(all_records, f, t),
        "ranking_tables": ranking_tables(all_records, f, t),
        "attribution_rows": [
            {"build": r["build"], "path": t(PATH_LABELS[r["path"]]), "diff": f.num(r["diff"], sign=True),
             "top": ", ".join(str(o) for o in r["top_observations"]), "without": f.num(r["diff_without_top"],
                                                                                          sign=True),
             "share": f.pct(r["top3_error_share"], 1)} for r in _attribution(all_records)],
        "caveats": caveats,
        "h": {k: t(v) for k, v in HEADERS.items()},
    }


def _attribution(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"build": r["title"], "path": r["path"], **r["attribution"]} for r in records if r.get("attribution")]


def render_card(release: ReleaseConfig, build: BuildConfig, folder: Path, records: list[dict[str, Any]],
                lang: str, langs: list[str]) -> str:
    context = card_context(release, build, folder, records, lang, langs, f"forest.{lang}.png")
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


def card_files(request: CardRequest, records: list[dict[str, Any]]) -> dict[Path, str | bytes]:
    """Every file the cards add to each build folder (README per language, LICENSE); plots are written apart."""
    files: dict[Path, str | bytes] = {}
    for build in request.builds:
        folder = request.dist / build.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {build.name}' first")
        for i, lang in enumerate(request.langs):
            name = "README.md" if i == 0 else f"README.{lang}.md"
            files[folder / name] = render_card(request.release, build, folder, records, lang, request.langs)
        files[folder / "LICENSE"] = LICENSE_TEXT.format(link=request.release.license.link)
    return files


def render_cards(request: CardRequest) -> list[Path]:
    records = _read(request.dist / "tables" / "tables.json", "fidelity tables", "release tables")["records"]
    files = card_files(request, records)
    if request.check:
        return sorted(files)
    for build in request.builds:
        for lang in request.langs:
            forest_plot(records, build.gate.overall_sigma, lang, request.dist / build.repo / f"forest.{lang}.png")
    for path, text in files.items():
        atomic_write(path, text)
    return sorted(files)
