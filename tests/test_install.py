"""From a checkout to a user's machine: the wheel carries templates, catalogs and build files; build files are found
from --builds, RELEASE_BUILDS, ./builds, then the shipped defaults; 'release init'; every variable in --help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT, invoke


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w",
                    str(out), str(ROOT)], check=True, capture_output=True, env={**os.environ, "PIP_NO_INDEX": "1"})
    [found] = out.glob("release-*.whl")
    return found


def test_the_wheel_carries_what_the_commands_read(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for rel in ("templates/card.md.j2", "templates/partials/comparison.md.j2", "locales/ko/LC_MESSAGES/messages.po",
                "builds/release.yaml", "builds/rtn.yaml", "builds/pc_rtn.yaml", "builds/autoround_tuned.yaml"):
        assert f"release/_data/{rel}" in names, rel
    assert "release/quantize/recipes/gptq.py" in names and "release/__main__.py" in names
    assert "release/core/fp8_conformance.json" in names  # the GPU conformance table of the deployed path's bound
    assert not [n for n in names if n.endswith(".mo")]  # catalogs compile in memory on first use
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()
    assert zipfile.ZipFile(wheel).read("release/_data/commit").decode().strip() == head  # provenance names it


def test_a_wheel_in_a_fresh_environment_outside_the_checkout(wheel: Path, tiny: Path, tmp_path: Path) -> None:
    """A new virtual environment (its dependencies taken from this one's site-packages, so nothing is downloaded)
    with only the wheel installed, used from a folder outside the checkout: init, fixture, build, eval, tables,
    card --check."""
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # no .pth of it is processed
    run = {**os.environ, "PIP_NO_INDEX": "1", "RELEASE_BUILDS": "", "HF_HUB_OFFLINE": "1"}
    run.pop("RELEASE_BUILDS")
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", str(wheel)], check=True, env=run,
                   capture_output=True)
    work = tmp_path / "elsewhere"
    work.mkdir()

    def release(*args: str | Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(env_dir / "bin" / "release"), *map(str, args)], cwd=work, env=run,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    where = subprocess.run([str(python), "-c", "import release; print(release.__file__)"], cwd=work, env=run,
                           capture_output=True, text=True, check=True).stdout
    assert str(env_dir) in where  # the wheel's package, not this checkout's
    defaults = release("select", "--help")  # a command that reads build files: it says which
    assert "build files:" not in defaults.stderr  # --help reads none
    release("init", ".")
    assert (work / "builds" / "release.yaml").is_file() and (work / "builds" / "gptq.yaml").is_file()
    common = ["--source", tiny / "source", "--observations", tiny / "observations"]
    built = release("build", "rtn", *common, "--dist", "dist")
    assert "build files: builds (./builds)" in built.stderr
    provenance = json.loads(next((work / "dist").glob("*/provenance.json")).read_text())
    assert provenance["tool"]["commit"] == zipfile.ZipFile(wheel).read("release/_data/commit").decode().strip()
    release("eval", "rtn", "--path", "deployed", "--split", "validation", "--dist", "dist", *common)
    release("tables", "--dist", "dist")
    checked = release("card", "--dist", "dist", "--check", "--lang", "en,ko")
    assert "checked:" in checked.stdout and "README.ko.md" in checked.stdout


def test_build_files_are_found_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--builds DIR, then $RELEASE_BUILDS, then ./builds, then the shipped defaults; the command says which."""
    import shutil

    from release.core.config import BUILDS_OPTION, builds_source

    for name in ("option", "env", "cwd/builds"):
        shutil.copytree(ROOT / "builds", tmp_path / name)
    monkeypatch.chdir(tmp_path / "cwd")
    assert builds_source() == (Path("builds"), "./builds")
    monkeypatch.setenv("RELEASE_BUILDS", str(tmp_path / "env"))
    assert builds_source() == (tmp_path / "env", "RELEASE_BUILDS")
    release_yaml = tmp_path / "option" / "release.yaml"  # without a selection rule: 'select' names the file it read
    text = release_yaml.read_text()
    release_yaml.write_text(text[: text.index("selection:")])
    result = invoke("--builds", tmp_path / "option", "select", "--dist", tmp_path / "dist")
    assert result.exit_code == 2 and f"{release_yaml}: no 'selection' section" in result.output
    assert invoke("select", "--dist", tmp_path / "dist").output.find(str(release_yaml)) == -1  # --builds is per run
    assert not BUILDS_OPTION
    monkeypatch.delenv("RELEASE_BUILDS")
    monkeypatch.chdir(tmp_path)  # no ./builds here
    where, why = builds_source()
    assert where == ROOT / "builds" and why.startswith("the defaults shipped with release")
    result = invoke("--builds", tmp_path / "nowhere", "select")
    assert result.exit_code == 2 and "--builds" in result.output and "no release.yaml there" in result.output
    # after the command's name too, as hf and pip take their global options; given twice, the later one counts
    result = invoke("select", "--dist", tmp_path / "dist", "--builds", tmp_path / "option")
    assert result.exit_code == 2 and f"{release_yaml}: no 'selection' section" in result.output
    result = invoke("--builds", tmp_path / "env", "select", "--builds", tmp_path / "option")
    assert result.exit_code == 2 and f"{release_yaml}: no 'selection' section" in result.output
    result = invoke("select", "--builds", tmp_path / "nowhere")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: --builds {tmp_path / 'nowhere'}: no release.yaml there; ")


def test_a_builds_variable_without_build_files_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASE_BUILDS", str(tmp_path / "nonexistent"))
    result = invoke("select", "--dist", tmp_path / "dist")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: RELEASE_BUILDS={tmp_path / 'nonexistent'}: no release.yaml there; ")
    assert "or unset it" in result.output


@pytest.mark.parametrize("args", [["-h"], ["tables", "-h"], ["push", "-h"]])
def test_dash_h_is_help_as_in_hf_and_pip(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 0 and result.output.startswith("Usage: "), result.output


def test_the_command_list_gives_each_first_sentence_whole() -> None:
    """click cuts a command's short help at the terminal's width with '...'; the list wraps it instead."""
    from release.cli import main

    listing = " ".join(invoke("-h").output.split("Commands:")[1].split("Environment:")[0].split())
    assert "..." not in listing
    for name, command in main.commands.items():
        first = " ".join(command.help.split(".")[0].split())  # type: ignore[union-attr]
        assert f"{name} {first}." in listing, (name, listing)


def test_fixture_counts_and_build_dist_are_named_as_elsewhere(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``fixture --calibration N --heldout N`` are counts (``--observations`` is a folder everywhere else); the
    release folder is ``--dist`` for every command, ``build`` included (``--out``: its older name)."""
    import release.inputs.fixture

    asked: dict[str, object] = {}

    def write_fixture(out: Path, **kwargs: object) -> dict[str, object]:
        asked.update(kwargs)
        return {"source": out / "source", "observations": out / "observations", "revision": "0" * 40}

    monkeypatch.setattr(release.inputs.fixture, "write_fixture", write_fixture)
    result = invoke("fixture", "tiny", "--out", tmp_path / "fx", "--calibration", "3", "--heldout", "2")
    assert result.exit_code == 0 and asked == {"size": "tiny", "seed": 0, "n_obs": 3, "heldout": 2}, result.output
    assert invoke("fixture", "tiny", "--out", tmp_path / "fx", "--observations", "3").exit_code == 2
    assert "--dist" in invoke("build", "-h").output


def test_init_writes_a_starter_and_keeps_an_existing_one(tmp_path: Path) -> None:
    result = invoke("init", tmp_path / "project")
    assert result.exit_code == 0, result.output
    builds = len([p for p in (ROOT / "builds").glob("*.yaml") if p.name != "release.yaml"])
    assert result.output.startswith(f"wrote {builds} build files, release.yaml and RELEASES.md to "), result.output
    written = sorted(p.name for p in (tmp_path / "project" / "builds").iterdir())
    assert written == sorted([*(p.name for p in (ROOT / "builds").glob("*.yaml")), "RELEASES.md"])
    again = invoke("init", tmp_path / "project")
    assert again.exit_code == 2 and "exists; edit it" in again.output
    (tmp_path / "file").write_text("x")
    assert invoke("init", tmp_path / "file").exit_code == 2


def test_every_environment_variable_is_in_the_help() -> None:
    """Every variable the package reads (os.environ, and the *_ENV names it defines) appears in 'release --help'."""
    code = "\n".join(p.read_text() for p in (ROOT / "release").rglob("*.py"))
    names = set(re.findall(r'os\.environ(?:\.get)?\(?\[?"([A-Z][A-Z0-9_]+)"', code))
    names |= set(re.findall(r'_ENV = "([A-Z][A-Z0-9_]+)"', code))
    assert {"RELEASE_BUILDS", "RELEASE_CACHE", "RELEASE_DEVICE", "HF_TOKEN", "SOURCE_DATE_EPOCH"} <= names
    shown = invoke("--help").output
    assert not [n for n in names if n not in shown]
