"""``verification/written.json``: the files this tool wrote into a build folder after its verification (the cards,
plots and license of ``release card``, the results of ``release eval`` and ``import-served``), each with its sha256,
size and command. A push publishes an after-verification file only while it is recorded here with the same bytes
and has the content its name promises: a file dropped in by hand (``README.evil.md``, 12 bytes of text hard-linked as
``results/hl.npz``) matches a pattern but not a record. The record itself stays local: it is not published."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from release.check.report import WRITTEN, FileEntry, after_verification, matches, may_follow_verification
from release.core.errors import GateError, ReleaseError
from release.core.files import plain_files
from release.core.io import parse_json, write_json

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class WrittenFile(FileEntry):
    by: str = Field(description="the command that wrote it")


class Written(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: Literal["release-written/1"] = "release-written/1"
    files: dict[str, WrittenFile] = {}


def publishable(folder: Path) -> list[str]:
    """The files of ``folder`` a push publishes: all but the record (:func:`release.core.files.plain_files`)."""
    return [rel for rel in plain_files(folder) if rel != WRITTEN]


def load_written(folder: Path) -> Written:
    """The record of ``folder`` (empty when there is none); a damaged one is a one-line error."""
    path = folder / WRITTEN
    if not path.is_file():
        return Written()
    fix = "delete it and rerun 'release card' and 'release eval' for this build"
    try:
        return Written.model_validate(parse_json(path.read_bytes(), str(path), fix))
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ReleaseError(f"{path}: field '{field}': {err['msg']}; {fix}") from None


def record_written(folder: Path, files: list[Path], by: str) -> None:
    """Add ``files`` (under ``folder``, just written by the command ``by``) to the record, with their bytes' hashes;
    records of files that are gone are dropped."""
    written = load_written(folder)
    for path in files:
        data = path.read_bytes()
        rel = path.relative_to(folder).as_posix()
        written.files[rel] = WrittenFile(sha256=hashlib.sha256(data).hexdigest(), size=len(data), by=by)
    written.files = {rel: f for rel, f in sorted(written.files.items()) if (folder / rel).is_file()}
    write_json(folder / WRITTEN, written.model_dump(mode="json"))


def _content_problem(path: Path, rel: str) -> str | None:
    """What is wrong with the content of an after-verification file for its name, or None."""
    if matches(rel, ("forest.*.png",)):
        with path.open("rb") as f:
            return None if f.read(8) == PNG_MAGIC else "not a PNG image"
    if rel.endswith(".npz"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except (zipfile.BadZipFile, OSError):
            return "not an npz archive"
        return None if names and all(n.endswith(".npy") for n in names) else "not an npz archive of arrays"
    if rel.endswith(".json"):
        try:
            doc = parse_json(path.read_bytes(), rel, "")
        except ReleaseError:
            return "not JSON"
        return None if isinstance(doc, dict) else "not a JSON object"
    try:  # the cards and the license: text
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return "not UTF-8 text"
    return "not text (it holds NUL bytes)" if "\0" in text else None


def check_written(folder: Path, local: dict[str, dict[str, Any]], rerun: str, languages: list[str]) -> None:
    """Every after-verification file of ``local`` (relative path to its hashes) is one this tool writes for a
    release in ``languages`` (:func:`release.check.report.may_follow_verification`), recorded in ``folder``'s
    ``written.json`` with these bytes, and has the content its name promises; else a refusal naming it."""
    written = load_written(folder).files
    for rel, entry in sorted(local.items()):
        if not after_verification(rel) or rel == WRITTEN:
            continue
        if not may_follow_verification(rel, languages):
            raise GateError(f"{folder / rel}: no file this release writes (its languages: {', '.join(languages)}; "
                            f"builds/release.yaml 'languages'); remove it, or {rerun}")
        record = written.get(rel)
        if record is None or (record.sha256, record.size) != (entry["sha256"], entry["size"]):
            how = "not written by this tool" if record is None else f"changed since '{record.by}' wrote it"
            raise GateError(f"{folder / rel}: {how} (not in {WRITTEN} with these bytes); remove it, or {rerun}")
        problem = _content_problem(folder / rel, rel)
        if problem is not None:
            raise GateError(f"{folder / rel}: {problem}; remove it, or {rerun}")
