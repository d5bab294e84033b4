"""Everything else is in pyproject.toml; this file only adds the package data a wheel needs: the card templates,
the Babel catalogs and the default build files, copied from the checkout's top-level folders into
``release/_data/`` (``release.core.io.data_path`` finds them there; a checkout reads its own folders), and the commit
the wheel is built from, ``release/_data/commit`` (``release.core.io.tool_commit``: provenance names it)."""

import shutil
import subprocess
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = ("templates", "locales", "builds")


def checkout_commit(root: Path) -> str | None:
    """HEAD of the git checkout at ``root`` (its own top level, not a repository around it), else None."""
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"], capture_output=True,
                             text=True, check=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return out[1] if len(out) == 2 and Path(out[0]).resolve() == root else None


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        data = Path(self.build_lib) / "release" / "_data"
        for name in DATA:
            shutil.rmtree(data / name, ignore_errors=True)
            shutil.copytree(root / name, data / name, ignore=shutil.ignore_patterns("*.mo", "__pycache__"))
        commit = checkout_commit(root)
        (data / "commit").unlink(missing_ok=True)
        if commit is not None:
            (data / "commit").write_text(commit + "\n", encoding="utf-8")


setup(cmdclass={"build_py": BuildWithData})
