"""The forest plot of a card: every build's overall error with its interval, per path and split, and the results
that fail their gate."""

from __future__ import annotations

import functools
import io
import math
from pathlib import Path
from typing import Any

from babel.numbers import format_decimal

from release.core.config import BuildConfig, Gate, builds_dir
from release.core.errors import ReleaseError
from release.measure.stats import gate_misses
from release.publish.card.i18n import Formatter, _, translations
from release.publish.card.labels import (
    GATE_CRITERIA,
    MEASURED,
    PATH_SHORT,
    SPLIT_LABELS,
    SPLIT_SHORT,
    baseline_name,
    build_label,
    where_label,
)
from release.publish.card.rows import groups_of, in_group


@functools.cache
def _register_hangul_font() -> None:
    """Register the NanumGothic files koreanize-matplotlib ships, once per process (each registration parses them).

    Importing ``koreanize_matplotlib`` does the same but imports ``distutils``, which Python 3.12 removed,
    so only its font folder is used.
    """
    from importlib.util import find_spec

    from matplotlib import font_manager

    spec = find_spec("koreanize_matplotlib")
    if spec is None or not spec.submodule_search_locations:
        raise ReleaseError("the card's plot needs the NanumGothic font of koreanize-matplotlib: "
                           "pip install 'koreanize-matplotlib>=0.1.1,<0.2'")
    fonts = Path(next(iter(spec.submodule_search_locations))) / "fonts"
    for ttf in sorted(fonts.glob("*.ttf")):
        font_manager.fontManager.addfont(str(ttf))


def _use_hangul_font() -> None:
    """NanumGothic as the font family (it has Latin letters too)."""
    from matplotlib import rcParams

    _register_hangul_font()
    rcParams["font.family"] = "NanumGothic"
    rcParams["axes.unicode_minus"] = False


PATH_COLOURS = {"fakequant": "tab:blue", "deployed": "tab:orange", "served": "tab:green", "yardstick": "tab:gray"}
SPLIT_MARKERS = {"calibration": "o", "validation": "s", "all": "D"}
HIGHLIGHT = "#fdeeb0"
FAILED = "tab:red"  # the notes on the right of the results that fail their gate
# a result that fails its gate: an open marker, edged in its path's colour
FAILED_MARKER: dict[str, Any] = {"markerfacecolor": "white", "markeredgewidth": 1.5, "markersize": 5}
NOTE_SIZE = 7.5  # points; a row is tall enough for a line per failing result


def forest_rows(records: list[dict[str, Any]], t: Any) -> list[tuple[str, str]]:
    """The plot's rows top down as (build, label): the builds by their error on the first path and split of the
    comparison (the others after them), then the yardsticks; labels are the (titled) records' titles."""
    groups = groups_of(records, MEASURED)
    first = {r["build"]: r["overall_sigma"] for r in in_group(records, *groups[0])} if groups else {}
    labels = {r["build"]: build_label(r, t).replace("`", "") for r in records}
    builds = sorted({r["build"] for r in records if r["path"] in MEASURED}, key=lambda b: (first.get(b, math.inf), b))
    yardsticks = sorted({r["build"] for r in records if r["path"] == "yardstick"})
    return [(b, labels[b]) for b in [*builds, *yardsticks]]


def gate_notes(records: list[dict[str, Any]], gates: dict[str, Gate], f: Formatter, t: Any) -> dict[str, list[str]]:
    """What the plot writes right of each build that fails its gate: a line per failing result (tables.json's
    ``gate`` false, on any criterion), top down as the row draws them, with its path and split and each criterion
    it misses, with the figure and the limit (``fake quant, calibration labs: gripper changes 9 > 5.12``).
    ``gates``: each build's limits (its build file's; an external checkpoint's, RTN's). A failing result whose
    limits miss nothing (its build file changed or went away since ``release tables``) is a one-line error."""
    order = groups_of(records, MEASURED)
    notes: dict[str, list[str]] = {}
    for r in sorted((r for r in records if r.get("gate") is False),
                    key=lambda r: (r["build"], order.index((r["path"], r["split"])))):
        limits = gates.get(r["build"])
        misses = gate_misses(r, limits) if limits is not None else []
        if not misses:
            raise ReleaseError(f"tables.json: the result of build {r['build']!r} on {r['path']}/{r['split']} fails "
                               f"its gate, but the limits of {builds_dir() / (r['build'] + '.yaml')} say of no "
                               "criterion that it fails (the tables are older than the build file); rerun "
                               "'release tables'")
        criteria = ", ".join(f"{t(GATE_CRITERIA[c])} {f.num(value, 3 if c == 'overall_sigma' else 0)} > "
                             f"{format_decimal(limit, locale=f.lang)}" for c, value, limit in misses)
        notes.setdefault(r["build"], []).append(f"{t(PATH_SHORT[r['path']])}, {t(SPLIT_SHORT[r['split']])}: "
                                                f"{criteria}")
    return notes


def forest_plot(tables: dict[str, Any], build: BuildConfig, lang: str, gates: dict[str, Gate]) -> bytes:
    """:func:`forest_figure` as a PNG; everything drawn is sorted, so it is byte-stable for the same input."""
    import matplotlib.pyplot as plt

    fig = forest_figure(tables, build, lang, gates)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def forest_figure(tables: dict[str, Any], build: BuildConfig, lang: str, gates: dict[str, Gate]) -> Any:
    """This build's plot, labelled in ``lang``: every build's overall error with its 95% interval for each path and
    split (one colour per path, one marker per split), this build's row highlighted, the yardsticks below. The left
    panel is on the gate's scale (a log axis that holds the gate, the builds and the yardsticks); the right one is
    each build's difference to the baseline with the Holm-adjusted interval of tables.json, on a scale where
    those intervals are visible. A result that fails its gate (``gates``: each build's limits), on either
    criterion, is an open marker in both panels, and :func:`gate_notes` are written in red right of its row."""
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
    notes = gate_notes(records, gates, f, t)
    y = {b: i for i, (b, _) in enumerate(rows)}
    measured = groups_of(records, MEASURED)
    yardstick = sorted({("yardstick", r["split"]) for r in records if r["path"] == "yardstick"},
                       key=lambda g: list(SPLIT_LABELS).index(g[1]))
    offsets = {g: (k - (len(gs) - 1) / 2) * min(0.2, 0.7 / len(gs)) for gs in (measured, yardstick)
               for k, g in enumerate(gs)}
    handles: list[Any] = [Line2D([], [], color=PATH_COLOURS[path], marker=SPLIT_MARKERS[split], linestyle="",
                                 label=where_label(path, split, t, in_group(records, path, split)))
                       for path, split in [*measured, *yardstick]]
    legend_rows = math.ceil((len(handles) + 3) / 2)
    row = max(0.3, NOTE_SIZE * 1.2 / 72 * max(map(len, notes.values()), default=1) + 0.05)  # inches
    height = row * len(rows) + 1.4 + 0.22 * legend_rows
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
                 "elinewidth": 1, "zorder": 3, **(FAILED_MARKER if r.get("gate") is False else {})}
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
    note_ax = diff_ax.secondary_yaxis("right")
    note_ax.set_yticks(range(len(rows)), ["\n".join(notes.get(b, [])) for b, _ in rows], fontsize=NOTE_SIZE,
                       color=FAILED)
    note_ax.tick_params(axis="y", length=0)
    labels = [(gate_ax, t(_("overall action error (sigma, log scale) with 95% CI"))),
              (diff_ax, t(_("difference to {baseline}\n(sigma) with its Holm-adjusted 95% CI")).format(
                  baseline=baseline_name(tables).replace("`", "")))]
    for ax, label in labels:
        ax.set_xlabel(label, fontsize=9)
    handles += [Line2D([], [], color="tab:red", linestyle="--",
                       label=t(_("gate: overall <= {sigma} sigma")).format(sigma=f.num(build.gate.overall_sigma, 2))),
                Line2D([], [], color="0.4", marker="o", linestyle="", **FAILED_MARKER,
                       label=t(_("open: fails its gate (overall or gripper changes), the criterion missed in red "
                                 "on the right"))),
                Patch(color=HIGHLIGHT, label=t(_("this build")))]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=8.5, frameon=False)
    rect = (0, (0.22 * legend_rows + 0.15) / height, 1, 1)
    fig.tight_layout(rect=rect)
    wrapped = [_fit_xlabel(fig, ax, label) for ax, label in labels]
    if any(wrapped):
        fig.tight_layout(rect=rect)
    return fig


def _fit_xlabel(fig: Any, ax: Any, label: str) -> bool:
    """Wrap ``ax``'s x label, as laid out, until it is no wider than the axes, so that it cannot run into the next
    panel's (a long baseline title, a narrow panel); whether it had to."""
    import textwrap

    renderer = fig.canvas.get_renderer()
    width = ax.get_window_extent(renderer).width
    longest = chars = max(map(len, label.splitlines()))
    while ax.xaxis.label.get_window_extent(renderer).width > width and chars > 12:
        chars -= 1
        ax.set_xlabel("\n".join(textwrap.fill(line, chars) for line in label.splitlines()), fontsize=9)
    return chars < longest
