"""``release card``: model cards rendered from Jinja templates and the data of each build."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
from huggingface_hub import ModelCardData

from release import ReleaseError
from release.config import BuildConfig, ReleaseConfig, available_builds, load_build, load_release
from release.io import atomic_write

TEMPLATES = Path(__file__).resolve().parent.parent / "templates"
SUPPORTED_LANGS = ("en",)


def recipe_label(build: BuildConfig) -> str:
    """One line describing the build's recipe and observer, from its YAML."""
    if build.recipe == "smoothquant" and build.smoothquant is not None:
        sq = build.smoothquant
        alpha = f"alpha searched per layer over 0.0-1.0 in steps of {sq.alpha_step}" if sq.alpha == "auto" \
            else f"alpha = {sq.alpha}"
        fold = "into the preceding norms and into `up_proj` for `down_proj`" if sq.fold_up_down \
            else "into the preceding norms (norm-FC pairs only)"
        text = f"SmoothQuant ({alpha}), smoothing folded {fold}; data: {build.algorithm_calls} transformer calls"
    else:
        text = "Round-to-nearest (the recipe of `nvidia/Cosmos3-Nano@fp8`)"
    observer = {
        "max": "ModelOpt max calibration",
        "moving_average": f"moving-average observer of each call's maximum (momentum {build.calibrator.momentum})",
        "histogram": f"ModelOpt histogram calibrator ({build.calibrator.percentile} percentile)",
    }[build.calibrator.method]
    return f"{text}; input scales: {observer}"


@dataclass(frozen=True)
class CardRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    dist: Path
    langs: list[str]

    @classmethod
    def create(cls, names: tuple[str, ...], dist: Path, lang: str) -> CardRequest:
        langs = [code.strip() for code in lang.split(",") if code.strip()]
        for code in langs:
            if code not in SUPPORTED_LANGS:
                raise ReleaseError(f"--lang: unknown language code {code!r}; supported: {', '.join(SUPPORTED_LANGS)}")
        release = load_release()
        wanted = list(names) or [n for n in available_builds() if (dist / load_build(n).repo).is_dir()]
        if not wanted:
            raise ReleaseError(f"{dist}: no built repos to document; run 'release build NAME' first")
        return cls(release, [load_build(n) for n in wanted], dist, langs)


def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )


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


def render_card(release: ReleaseConfig, build: BuildConfig, provenance: dict[str, Any], langs: list[str]) -> str:
    siblings = []
    for s in release.siblings:
        if s.build != build.name:
            siblings.append({"repo_id": f"{release.org}/{s.repo}", "title": load_build(s.build).title})
    context = {
        "release": release,
        "build": {**build.model_dump(), "recipe_label": recipe_label(build),
                  "title_full": f"Cosmos3-Nano-Policy-DROID, {build.title}"},
        "repo_id": f"{release.org}/{build.repo}",
        "prov": provenance,
        "siblings": siblings,
    }
    try:
        body = _environment().get_template("card.md.j2").render(**context)
    except jinja2.UndefinedError as exc:
        raise ReleaseError(f"templates/card.md.j2: {exc}; the provenance or template is out of date") from exc
    return f"---\n{card_metadata(release, langs).to_yaml()}\n---\n\n{body}"


def render_cards(request: CardRequest) -> list[Path]:
    written = []
    for build in request.builds:
        folder = request.dist / build.repo
        prov_path = folder / "provenance.json"
        if not prov_path.is_file():
            raise ReleaseError(f"{prov_path}: missing; run 'release build {build.name}' first")
        text = render_card(request.release, build, json.loads(prov_path.read_text()), request.langs)
        atomic_write(folder / "README.md", text)
        written.append(folder / "README.md")
    return written
