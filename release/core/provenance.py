"""``provenance.json``, what ``release build`` records of each build, as its readers rely on it: every field they
read, with its type. The build checks what it writes against it, and every reader (eval, the cards, the campaign,
``push --from-manifest`` through the cards) reads it through :func:`read_provenance`, so that a hand-edited or damaged
file (``"recipe": 5``) is a one-line error naming the field, never an internal error."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from release.core.errors import ReleaseError
from release.core.io import read_json
from release.core.rules import BUILD_NAME


class _Record(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)  # fields no reader needs may come and go


class Recipe(_Record):
    name: str
    steps: list[str]
    scheme: str
    observer: dict[str, Any]
    parameters: dict[str, Any] = {}


class SourceRecord(_Record):
    repo: str | None = None
    revision: str
    architecture: dict[str, int] = {}
    license: dict[str, str] | None = None


class Calibration(_Record):
    observations: int
    calls: int
    sha256: str
    labs: list[str]
    dataset: str | None = None


class Fp8(_Record):
    codes: int
    codes_sha256: str
    input_amax: dict[str, float]


class Provenance(_Record):
    build: str
    repo: str
    recipe: Recipe
    source: SourceRecord
    tool: dict[str, str]
    versions: dict[str, str]
    device: str
    calibration: Calibration
    quantized_linears: int
    fp8: Fp8
    config_sha256: str
    date: str

    @field_validator("versions")
    @classmethod
    def _modelopt(cls, v: dict[str, str]) -> dict[str, str]:
        if "modelopt" not in v:
            raise ValueError("the ModelOpt version is missing")
        return v

    @field_validator("date")
    @classmethod
    def _date(cls, v: str) -> str:
        dt.datetime.fromisoformat(v)  # a ValueError names the field
        return v


def check_provenance(doc: dict[str, Any], where: str, command: str) -> dict[str, Any]:
    """``doc`` as it is, once every field its readers use has its type; else a one-line error naming ``where``, the
    first wrong field, and the ``command`` that rewrites it."""
    try:
        Provenance.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = "required field is missing" if err["type"] == "missing" else err["msg"].removeprefix("Value error, ")
        raise ReleaseError(f"{where}: field '{field}': {msg}; run '{command}' to rewrite it") from None
    return doc


def read_provenance(path: Path, build: str | None) -> dict[str, Any]:
    """The provenance ``release build BUILD`` wrote at ``path``, checked (:func:`check_provenance`); ``build``
    None: the name the file records, where it is one."""
    command = f"release build {build or 'BUILD'}"
    doc = read_json(path, "provenance", command)
    named = doc.get("build")
    if build is None and isinstance(named, str) and BUILD_NAME.fullmatch(named):
        command = f"release build {named}"
    return check_provenance(doc, str(path), command)
