"""Progress on stderr (issue 33): outside a terminal (a log file, CI; CliRunner's stderr is not one) a counted unit
of work says when it starts and how far it is, and every unit leaves a closing line with its count, result and
times; ``-q`` silences them all, errors stay."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from release.core import output
from tests.conftest import invoke

SECONDS = r"\d+\.\d s"


def _matching(pattern: str, text: str) -> list[str]:
    return [line for line in text.splitlines() if re.fullmatch(pattern, line)]


def test_a_unit_says_its_count_result_and_parts(capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "LOG_EVERY", 0.0)  # a line at every step (30 s apart in a real log)
    with output.progress("rollouts: fakequant rtn", 2) as bar:
        with bar.part("load"):
            pass
        bar.advance()
        bar.advance()
    with output.progress("build rtn") as bar:
        with bar.part("quantize"):
            pass
        bar.result = "28 FP8 Linears written"
    with output.progress("fixture tiny"):
        pass
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "rollouts: fakequant rtn: 0/2"
    assert [re.sub(SECONDS, "T", line) for line in lines[1:]] == [
        "rollouts: fakequant rtn: 1/2 (T)", "rollouts: fakequant rtn: 2/2 in T (load T)",
        "build rtn: 28 FP8 Linears written in T (quantize T)",
        "fixture tiny: done in T"]


def test_a_failed_unit_leaves_no_closing_line_and_quiet_leaves_none(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(RuntimeError), output.progress("verify rtn"):
        raise RuntimeError("the error says why")
    output.set_quiet(True)
    try:
        with output.progress("rollouts: bf16", 1) as bar:
            bar.advance()
        output.info("build files: builds (./builds)")
        output.warning("still said")
    finally:
        output.set_quiet(False)
    assert capsys.readouterr().err.splitlines() == ["warning: still said"]


@pytest.fixture
def dist(rtn_build: Path, tmp_path: Path) -> Path:
    """A copy of the session's RTN build: the commands below write its results and report."""
    shutil.copytree(rtn_build, tmp_path / "dist" / rtn_build.name)
    return tmp_path / "dist"


def test_eval_says_each_series_count_and_time(dist: Path, tiny: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The done-when of issue 33: a log of an eval has a line per build with its count and time (on an observation
    set of 2 held-out observations: rollouts on the CPU are slow)."""
    from release.inputs.observations import LABS, write_observations

    write_observations(tmp_path / "observations", n=1, seed=0, labs=LABS, heldout=2)
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))  # the rollouts run here, not from the session's
    args = ["eval", "rtn", "--split", "validation", "--dist", dist, "--source", tiny / "source", "--observations",
            tmp_path / "observations"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    for series in ("bf16", "fakequant rtn"):
        assert f"rollouts: {series}: 0/2" in result.stderr.splitlines()
        assert len(_matching(rf"rollouts: {series}: 2/2 in {SECONDS} \(load {SECONDS}\)", result.stderr)) == 1
    assert result.stdout.startswith("results: ")  # the result stays on stdout
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert {"rollouts: bf16: 2 cached", "rollouts: fakequant rtn: 2 cached"} <= set(again.stderr.splitlines())
    quiet = invoke("-q", *args)
    assert quiet.exit_code == 0 and quiet.stderr == "" and quiet.stdout == again.stdout


def test_verify_says_each_build_checks_and_time(dist: Path, tiny: Path) -> None:
    args = ["verify", "rtn", "--dist", dist, "--source", tiny / "source", "--observations", tiny / "observations"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert len(_matching(rf"verify rtn: 6 checks passed in {SECONDS} \(read the source {SECONDS}\)",
                         result.stderr)) == 1
    assert "verification: Cosmos3-Nano-Policy-DROID-FP8" in result.stdout  # the table is the result
    quiet = invoke(*args, "-q")
    assert quiet.exit_code == 0 and quiet.stderr == "" and "verification:" in quiet.stdout
