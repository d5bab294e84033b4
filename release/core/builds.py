"""The build files on disk: ``release.yaml``, one YAML file per build and ``RELEASES.md`` beside them, read and
validated (:mod:`release.core.config` holds their models and where the folder is).

Every error names the file, the line where the YAML parser or the node position knows it, and the
field path, so that a user can fix the file without reading a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Hashable
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from release.core.config import BuildConfig, ReleaseConfig, builds_dir
from release.core.errors import ReleaseError
from release.core.rules import BUILD_NAME, BUILD_NAME_RULE

RELEASE_NOTES = "RELEASES.md"  # beside release.yaml: one section of release notes per release version


def _line_of(node: yaml.Node | None, path: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``path``, or of its deepest existing parent."""
    line = None
    for key in path:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


class _DuplicateKey(yaml.constructor.ConstructorError):
    pass


# libyaml's parser where PyYAML was built with it (its wheels are): the same documents, several times faster to read
# (the 25 build files are read on every command)
_SafeLoader: Any = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader


class _UniqueKeyLoader(_SafeLoader):
    """PyYAML's safe loader, except that a key given twice in one mapping is an error (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:  # before merge keys ('<<') are flattened: explicit keys may override those
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node)
                if key in first:
                    raise _DuplicateKey(None, None, f"duplicate key {key!r} (first on line {first[key]}); keep one "
                                        "of them", key_node.start_mark)
                first[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep)


MAX_YAML_CHARS = 1_000_000  # a build file or release.yaml is a few kB
MAX_YAML_NODES = 100_000  # values once aliases are expanded (an alias bomb expands to billions)
MAX_YAML_DEPTH = 64


def _bounded(node: yaml.Node | None, path: Path) -> None:
    """A one-line error for a document whose values, aliases expanded, exceed ``MAX_YAML_NODES`` or nest deeper
    than ``MAX_YAML_DEPTH`` (checked on the parsed nodes, before anything is built from them)."""
    stack = [] if node is None else [(node, 1)]
    seen = 0
    while stack:
        current, depth = stack.pop()
        seen += 1
        if seen > MAX_YAML_NODES:
            raise ReleaseError(f"{path}: more than {MAX_YAML_NODES:,} values once its aliases are expanded; write the "
                               "values out instead of nesting aliases")
        if depth > MAX_YAML_DEPTH:
            raise ReleaseError(f"{path}:{current.start_mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(current, yaml.MappingNode):
            stack.extend((child, depth + 1) for pair in current.value for child in pair)
        elif isinstance(current, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in current.value)


def load_yaml(path: Path) -> tuple[dict[str, Any], str]:
    """A build file (or another YAML mapping) and its text, read with the bounds above; else a one-line error."""
    if not path.is_file():
        raise ReleaseError(f"{path}: file not found")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{path}: not UTF-8 text ({exc}); save it as UTF-8") from exc
    if len(text) > MAX_YAML_CHARS:
        raise ReleaseError(f"{path}: {len(text):,} characters; a build file holds at most {MAX_YAML_CHARS:,}")
    try:
        loader = _UniqueKeyLoader(text)
        try:
            node = loader.get_single_node()
            _bounded(node, path)
            data = None if node is None else loader.construct_document(node)
        finally:
            loader.dispose()
    except RecursionError as exc:
        raise ReleaseError(f"{path}: nested too deeply to read; a build file is a few levels of fields") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if isinstance(exc, _DuplicateKey):
            raise ReleaseError(f"{path}{where}: {problem}") from exc
        raise ReleaseError(f"{path}{where}: YAML syntax error: {problem}; fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: expected a mapping of fields at the top level")
    return data, text


def _validate(model: type[BaseModel], path: Path) -> Any:
    data, text = load_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(yaml.compose(text, Loader=_SafeLoader), loc)  # the nodes' lines, for the message only
        where = f":{line}" if line else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            msg = f"unknown field; valid fields here: {', '.join(allowed)}"
        elif err["type"] == "missing":
            msg = "required field is missing; add it"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ReleaseError(f"{path}{where}: field '{field}': {msg}{more}") from exc


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """The field names valid at ``loc``, through optional sections (``X | None``) and lists (``list[X]``)."""
    cur: Any = model
    for key in loc:
        if isinstance(key, int):  # a list item: ``cur`` is already the item's model
            continue
        info = getattr(cur, "model_fields", {}).get(key)
        if info is None:
            return []
        cur = next((a for a in (info.annotation, *get_args(info.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return sorted(getattr(cur, "model_fields", {}))


def init_builds(folder: Path) -> list[Path]:
    """Copy the shipped build files into ``folder/builds`` (written aside, then put in place: never half a folder);
    an existing ``folder/builds`` is left alone."""
    import shutil

    from release.core.io import atomic_dir, data_path, output_folder

    target = output_folder(folder) / "builds"
    if target.exists():
        raise ReleaseError(f"{target}: exists; edit it, or choose another folder for 'release init'")
    source = data_path("builds")
    names = sorted(p.name for p in [*source.glob("*.yaml"), source / RELEASE_NOTES] if p.is_file())
    with atomic_dir(target) as tmp:
        for name in names:
            shutil.copy2(source / name, tmp / name)
    return [target / name for name in names]


def load_release(directory: Path | None = None) -> ReleaseConfig:
    """``release.yaml``, validated; each build it maps to a repo that has a build file must name the same repo there
    (the build folder and the Hub repo are one name)."""
    d = directory or builds_dir()
    cfg: ReleaseConfig = _validate(ReleaseConfig, d / "release.yaml")
    for name, repo in cfg.repos.items():
        if (d / f"{name}.yaml").is_file() and (found := load_build(name, d).repo) != repo:
            raise ReleaseError(f"{d / 'release.yaml'}: field 'repos.{name}' is {repo!r}, but {d / f'{name}.yaml'} "
                               f"says repo {found!r}; make them the same")
    return cfg


def available_builds(directory: Path | None = None) -> list[str]:
    d = directory or builds_dir()
    return sorted(p.stem for p in d.glob("*.yaml") if p.stem != "release")


def load_build(name: str, directory: Path | None = None) -> BuildConfig:
    d = directory or builds_dir()
    if not BUILD_NAME.fullmatch(name):  # a name becomes a path: builds/<name>.yaml, nothing outside builds/
        raise ReleaseError(f"build name {name[:80]!r}{'...' if len(name) > 80 else ''}: use {BUILD_NAME_RULE} (the "
                           f"stem of a file in {d})")
    path = d / f"{name}.yaml"
    if name == "release" or not path.is_file():
        names = ", ".join(available_builds(d)) or "none"
        raise ReleaseError(f"unknown build {name!r}: no {path}; available builds: {names}")
    cfg: BuildConfig = _validate(BuildConfig, path)
    if cfg.name != name:
        raise ReleaseError(f"{path}: field 'name': is {cfg.name!r} but the file is {name}.yaml; make them equal")
    return cfg


NOTES_HEADING = re.compile(r"##\s+\[?([^\]\s]+)\]?(\s+-\s+.*)?")  # '## [1.0.0] - 2026-01-31' (Keep a Changelog)


def release_notes(version: str, directory: Path | None = None) -> str:
    """The text of the section of ``RELEASES.md`` (beside release.yaml) headed by ``version``: the description of
    every push commit of that release. A missing file, section or an empty section is a one-line error."""
    path = (directory or builds_dir()) / RELEASE_NOTES
    add = f"add a section '## [{version}]' with the release notes to {path}"
    if not path.is_file():
        raise ReleaseError(f"{path}: missing (the release notes; release.yaml has version {version}); {add}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{path}: not UTF-8 text ({exc}); save it as UTF-8") from exc
    start = next((i for i, line in enumerate(lines)
                  if (m := NOTES_HEADING.fullmatch(line.strip())) and m[1] == version), None)
    if start is None:
        raise ReleaseError(f"{path}: no section for release {version} (the version in release.yaml); {add}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    text = "\n".join(lines[start + 1 : end]).strip()
    if not text:
        raise ReleaseError(f"{path}: the section of release {version} is empty; write its release notes under it")
    return text
