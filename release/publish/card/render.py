"""``release card``: the request, and each build's README per language, its LICENSE and its forest plots,
rendered and written atomically (or only checked)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import ModelCard

from release.check.report import CARD_FILES, card_name, dropped_by_campaign, matches
from release.check.written import load_written, record_written
from release.core.builds import available_builds, load_build, load_release
from release.core.config import BuildConfig, ReleaseConfig, builds_dir
from release.core.errors import ReleaseError
from release.core.io import write_set
from release.core.provenance import read_provenance
from release.measure.layout import sweep_builds
from release.measure.select import TABLES, Delivery, SelectionDoc, delivery, read_selection, read_tables_doc
from release.publish.card.context import card_context, card_metadata, sweep_provenances
from release.publish.card.i18n import check_catalog, render_template, supported_languages, translations
from release.publish.card.labels import titled
from release.publish.card.plot import forest_plot
from release.publish.evaluated import leave_out

LICENSE_TEXT = "{name}: see {link}\n"  # only when the source has no LICENSE file


@dataclass(frozen=True)
class CardRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    dist: Path
    langs: list[str]
    check: bool
    tables: dict[str, Any]  # tables.json: every card is made from it

    @classmethod
    def create(cls, names: tuple[str, ...], dist: Path, lang: str | None, check: bool = False) -> CardRequest:
        release = load_release()
        langs = release.languages if lang is None else [code.strip() for code in lang.split(",") if code.strip()]
        twice = next((code for i, code in enumerate(langs) if code in langs[:i]), None)
        if twice is not None:
            raise ReleaseError(f"--lang: {twice!r} is named twice; name each language once (e.g. --lang en,ko)")
        known = supported_languages()
        for code in langs:
            if code not in known:
                raise ReleaseError(f"--lang: unknown language code {code!r}; supported: {', '.join(known)}")
        if not langs:
            raise ReleaseError(f"--lang: name at least one language ({', '.join(known)})")
        other = next((code for code in langs if code not in release.languages), None)
        if other is not None:  # a card of another language would be no file of this release: push refuses it
            raise ReleaseError(f"--lang: {other!r} is not one of the release's languages "
                               f"({', '.join(release.languages)}); add it to 'languages' in "
                               f"{builds_dir() / 'release.yaml'}, or leave it out")
        for code in langs:
            check_catalog(code)
        # without names: every built repo but those whose weights a campaign dropped (never published: no card)
        dropped = dropped_by_campaign(dist)
        built = [] if names else [n for n in available_builds() if (dist / load_build(n).repo).is_dir()
                                  and n not in dropped]
        if not names and not built:
            raise ReleaseError(f"{dist}: no built repos to document; run 'release build NAME' first")
        tables = _card_tables(dist)
        wanted = list(names) or leave_out(built, tables, dist / TABLES)  # a named one without results: an error
        if not wanted:
            raise ReleaseError(f"{dist / TABLES}: no results for any built repo ({', '.join(built)}); run 'release "
                               "eval NAME' then 'release tables'")
        return cls(release, [load_build(n) for n in wanted], dist, langs, check, tables)


def _card_tables(dist: Path) -> dict[str, Any]:
    """``tables.json`` of ``dist``, made by a 'release tables' that records the method of its comparisons."""
    tables = read_tables_doc(dist / TABLES)
    if "method" not in tables:  # its comparisons carry no verdict: the cards would have nothing they may state
        raise ReleaseError(f"{dist / TABLES}: made by an older 'release tables' (no 'method': its paired "
                           "differences carry no sign-flip test or verdict); run 'release tables' again")
    return tables


def render_card(release: ReleaseConfig, build: BuildConfig, folder: Path, tables: dict[str, Any],
                selection: SelectionDoc | None, have: Delivery, provenances: dict[str, dict[str, Any]], lang: str,
                langs: list[str]) -> str:
    context = card_context(release, build, folder, tables, selection, have, provenances, lang, langs,
                           f"forest.{lang}.png")
    body = render_template("card.md.j2", context, lang)
    body = re.sub(r"\n{3,}", "\n\n", body)  # the sections' optional parts leave runs of blank lines
    text = f"---\n{card_metadata(release, context['prov']).to_yaml()}\n---\n\n{body}"
    ModelCard(text)  # parses the front matter; raises on invalid YAML
    return text


def marked(records: list[dict[str, Any]], have: Delivery) -> list[dict[str, Any]]:
    """The records with ``delivered`` set from the release's delivery (tables.json, made before the selection, does
    not know it): the tables and the plot mark those builds."""
    return [{**r, "delivered": r["build"] in have.builds} for r in records]


def license_text(release: ReleaseConfig, folder: Path, build: BuildConfig) -> str:
    """The source's LICENSE as the build recorded it (``provenance.json``), verbatim; a one-line pointer to the
    release's license link only when the source had none (the card says so)."""
    prov = read_provenance(folder / "provenance.json", build.name)
    recorded = prov["source"].get("license")
    return str(recorded["text"]) if recorded else LICENSE_TEXT.format(name=release.license.name,
                                                                      link=release.license.link)


def card_files(request: CardRequest, localized: dict[str, dict[str, Any]], selection: SelectionDoc | None,
               have: Delivery) -> dict[Path, str | bytes]:
    """Every file the cards add to each build folder (README per language, LICENSE); plots are written apart.
    ``localized``: tables.json per card language, its records titled in that language."""
    files: dict[Path, str | bytes] = {}
    provenances = sweep_provenances(request.dist)
    for build in request.builds:
        folder = request.dist / build.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {build.name}' first")
        for i, lang in enumerate(request.langs):
            name = card_name(lang, i == 0)
            files[folder / name] = render_card(request.release, build, folder, localized[lang], selection, have,
                                               provenances, lang, request.langs)
        files[folder / "LICENSE"] = license_text(request.release, folder, build)
    return files


def render_cards(request: CardRequest) -> list[Path]:
    """The card files of each build (with --check: rendered, not written) and, written, its forest plots."""
    tables = request.tables
    selection = read_selection(request.dist)
    have = delivery(request.release, selection)  # refuses an override that contradicts nothing
    localized = {lang: {**tables, "records": marked(titled(tables["records"], lang, translations(lang).gettext), have)}
                 for lang in request.langs}
    files = card_files(request, localized, selection, have)
    if request.check:
        return sorted(files)
    plots = [(build, lang, request.dist / build.repo / f"forest.{lang}.png") for build in request.builds
             for lang in request.langs]
    gates = {b.name: b.gate for b in sweep_builds(request.dist)}
    outputs: dict[Path, str | bytes] = {**files, **{path: forest_plot(localized[lang], build, lang, gates)
                                                   for build, lang, path in plots}}
    write_set(outputs)  # one set: a failure (a full disk) leaves every old card file and plot
    for build in request.builds:
        folder = request.dist / build.repo
        ours = [path for path in outputs if path.parent == folder]
        for stale in set(load_written(folder).files) - {p.name for p in ours}:  # a language not rendered now
            if matches(stale, CARD_FILES):
                (folder / stale).unlink(missing_ok=True)
        record_written(folder, ours, "release card")  # a kill before this: push refuses the unrecorded new files
    return sorted(outputs)
