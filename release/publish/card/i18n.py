"""The cards' languages: Babel catalogs compiled in memory (their gaps refused), the marker ``_`` that
extraction finds, Babel's formatting of numbers and dates for a locale, and the Jinja environment."""

from __future__ import annotations

import datetime as dt
import functools
import io
import math
import traceback
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

from release.core.errors import ReleaseError
from release.core.io import data_path
from release.measure.stats import p_decimals, p_rounded
from release.publish.card.particles import Text, particle

TEMPLATES = data_path("templates")
LOCALES = data_path("locales")
ROOT = TEMPLATES.parent  # template names in errors are relative to it
SOURCE_LANG = "en"


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
        raise ReleaseError(f"{path}: not a valid catalog ({exc}); fix it (in a checkout of release, 'make i18n' "
                           "checks it), or reinstall release") from exc


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


_SOURCE = NullTranslations()  # one object, so that the source language's environment is cached too


def translations(lang: str) -> NullTranslations:
    """The language's catalog, compiled in memory (fuzzy entries are left out: ``check_catalog`` refuses them)."""
    return _SOURCE if lang == SOURCE_LANG else _compiled(_po(lang), lang)


@functools.cache
def card_messages(templates: Path) -> tuple[str, ...]:
    """Every msgid the cards use, in source order: Babel's extraction as ``make i18n`` runs it (babel.cfg: the
    templates with Jinja's i18n extension, ``_()`` in the modules of this package)."""
    keywords = {**DEFAULT_KEYWORDS, "_": None}
    found = [m[2] for m in extract_from_dir(str(templates), [("**.j2", "jinja2")],
                                            {"**.j2": {"extensions": "jinja2.ext.i18n"}}, keywords=keywords)]
    for module in sorted(Path(__file__).parent.glob("*.py")):
        found += [m[1] for m in extract_from_file("python", str(module), keywords=keywords)]
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
        raise ReleaseError(f"{_po(lang)}: {gaps[0]}{more}; the {lang} card would show English there: in a "
                           "checkout of release run 'make i18n', translate it and remove any fuzzy flag")


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

    def size(self, nbytes: int) -> str:
        """A memory size in MiB below 1 GiB, else in GiB, to three significant digits."""
        value, unit = (nbytes / 2**30, "GiB") if nbytes >= 2**30 else (nbytes / 2**20, "MiB")
        return f"{self.num(value, max(0, 2 - math.floor(math.log10(value))) if value > 0 else 0)} {unit}"

    def pct(self, value: float | None, digits: int = 2) -> str:
        if value is None:
            return "-"
        return format_percent(value, format="0." + "0" * digits + "%", locale=self.lang)

    def p(self, value: float, at_most: bool = False) -> str:
        """A p-value to two significant digits (:func:`~release.measure.stats.p_decimals`); ``at_most``: as a bound,
        "≤ p" rounded up (a Monte Carlo p at its floor)."""
        shown = format_decimal(p_rounded(value, at_most), format="0." + "#" * p_decimals(value), locale=self.lang)
        return f"≤ {shown}" if at_most else shown

    def pct_ci(self, ci: list[float] | tuple[float, float]) -> str:
        return f"[{self.num(ci[0] * 100, 2)}, {self.num(ci[1] * 100, 2)}]"

    def date(self, value: dt.date) -> str:
        return format_date(value, "long", locale=self.lang)


@functools.cache
def environment(tr: NullTranslations, templates: Path) -> jinja2.Environment:
    """The cards' Jinja environment for a catalog and a templates folder, one per process, so that a template is
    compiled once, not once per card (the loader still reloads a template whose file changed)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(templates),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
        extensions=["jinja2.ext.i18n"],
    )
    env.install_gettext_translations(tr, newstyle=True)  # type: ignore[attr-defined]
    env.filters["particle"] = particle
    return env


def render_template(name: str, context: dict[str, Any], lang: str) -> str:
    """A template rendered in ``lang``; an undefined variable or a syntax error is one line naming the template
    file and line."""
    env = environment(translations(lang), TEMPLATES)
    try:
        return env.get_template(name).render(**context)
    except jinja2.UndefinedError as exc:
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename.endswith(".j2")]
        where = f"{Path(frames[-1].filename).relative_to(ROOT)}:{frames[-1].lineno}" if frames else "templates"
        raise ReleaseError(f"{where}: {exc} (an undefined template variable); fix the template or the data") from exc
    except jinja2.TemplateSyntaxError as exc:
        raise ReleaseError(f"{exc.filename}:{exc.lineno}: template syntax error: {exc.message}") from exc
