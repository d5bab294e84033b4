"""The README's Install commands as a user meets them: the block is extracted from README.md and its ``release``
lines run as written, in a fresh folder, with the ``release`` this environment installed; its ``pip`` lines (the
network is blocked here) are checked against the files and pins they name."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

from tests.conftest import ROOT


def install_block() -> list[str]:
    """The commands of the first ``sh`` block under '## Install', comments dropped."""
    section = (ROOT / "README.md").read_text().split("\n## Install\n", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split(" #", 1)[0].strip() for line in block.splitlines() if line.strip()]


def test_the_install_block_pins_what_the_lock_pins_and_names_real_extras() -> None:
    lines = install_block()
    lock = {m[1].lower(): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==(\S+)", (ROOT / "requirements.lock")
                                                    .read_text(), re.M)}
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    pips = [shlex.split(line) for line in lines if line.startswith("pip ")]
    [torch] = [p for p in pips if any(a.startswith("torch==") for a in p)]
    assert f"torch=={lock['torch']}" in torch and "https://download.pytorch.org/whl/cpu" in torch  # not PyPI's CUDA
    for args in pips:
        if "-c" in args:
            assert (ROOT / args[args.index("-c") + 1]).is_file()
        for arg in args:
            if arg.startswith(".["):
                assert arg[2:-1] in extras, arg


def test_the_install_blocks_release_commands_run_as_written(tmp_path: Path) -> None:
    """``release init`` then ``cd ... && release fixture ... && release build rtn --source fx/source``, through a
    shell, from an empty folder; then verify by build name alone (the build recorded its inputs). The session's
    cache: the fixture writes the same bytes every time, so the capture of the session's RTN build serves it (a
    first build from an empty cache is measured in BENCHMARKS.md, not here)."""
    commands = [line for line in install_block() if not line.startswith(("pip ", "python3 -m venv"))]
    assert commands and all("release " in c for c in commands), commands
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("RELEASE_BUILDS", None)
    script = " && ".join(["set -e", *commands, "release verify rtn"])
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    project = tmp_path / "my-release"
    [provenance] = project.glob("dist/*/provenance.json")
    assert json.loads(provenance.read_text())["build"] == "rtn"
    report = json.loads((provenance.parent / "verification" / "report.json").read_text())
    assert report["status"] == "passed", report
