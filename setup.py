"""Everything else is in pyproject.toml; this file only adds the package data a wheel needs: the card templates,
the Babel catalogs and the default build files, copied from the checkout's top-level folders into
``release/_data/`` (``release.core.io.data_path`` finds them there; a checkout reads its own folders)."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

DATA = ("templates", "locales", "builds")


class BuildWithData(build_py):
    def run(self) -> None:
        super().run()
        root = Path(__file__).resolve().parent
        for name in DATA:
            target = Path(self.build_lib) / "release" / "_data" / name
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(root / name, target, ignore=shutil.ignore_patterns("*.mo", "__pycache__"))


setup(cmdclass={"build_py": BuildWithData})
