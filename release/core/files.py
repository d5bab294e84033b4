"""The files of a folder as the Hub would store them: regular files with UTF-8 names, walked without following
anything (a build folder before it is hashed and published, a source before its parts are copied into a build)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from release.core.errors import ReleaseError


def plain_files(folder: Path, what: str = "the build folder", links_into: Path | None = None) -> list[str]:
    """Every file of ``folder`` (``what``: a build folder, a source), relative and sorted, without following anything.

    A link is refused by name (the Hub stores files, and a link can be re-pointed after its target was hashed), so is
    a link loop and anything that is neither a regular file nor a folder (a pipe would block the reader).
    ``links_into``: the one folder whose regular files links may point to (a Hugging Face cache snapshot's files are
    links into its repo's ``blobs``).
    """
    out: list[str] = []
    stack = [folder]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise ReleaseError(f"{directory}: cannot be listed ({exc.strerror}); fix its permissions") from exc
        for entry in entries:
            path = Path(entry.path)
            _check_name(path)
            if entry.is_symlink():
                if links_into is not None and _file_in(path, links_into):
                    out.append(path.relative_to(folder).as_posix())
                    continue
                raise ReleaseError(_link_refusal(path, folder, what))
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)
            elif entry.is_file(follow_symlinks=False):
                out.append(path.relative_to(folder).as_posix())
            else:
                kind = "pipe" if stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode) else "device or socket"
                raise ReleaseError(f"{path}: a {kind}, not a regular file; remove it from {what}")
    return sorted(out)


def _file_in(link: Path, folder: Path) -> bool:
    try:
        target = link.resolve(strict=True)
    except (OSError, RuntimeError):  # a loop (RuntimeError on Python 3.11) or a dangling link
        return False
    return target.parent == folder.resolve() and target.is_file()


def _check_name(path: Path) -> None:
    """A name the Hub stores and a plan table shows as it is: valid UTF-8, no control characters (a newline would
    break the plan's table and the manifest's lines)."""
    try:
        path.name.encode("utf-8")
    except UnicodeEncodeError:
        raise ReleaseError(f"{str(path)!a}: its name is not valid UTF-8 (the Hub stores UTF-8 names); rename "
                           "or remove it") from None
    if any(ord(c) < 32 or ord(c) == 127 for c in path.name):
        raise ReleaseError(f"{str(path)!a}: its name holds a control character (a newline or a tab); rename or "
                           "remove it")


def _link_refusal(path: Path, folder: Path, what: str) -> str:
    target = os.readlink(path)
    try:
        outside = not path.resolve(strict=True).is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop (RuntimeError on Python 3.11) or a dangling link
        return f"{path}: a link ({target}) that loops or points nowhere; remove it from {what}"
    where = f", outside {what}" if outside else ""
    return f"{path}: a link to {target}{where}; the Hub stores files, not links: replace it with the file or remove it"
