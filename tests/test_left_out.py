"""Issue 33: a build that is built but not evaluated (no results in tables.json). `card`, `push` and `manifest`
without names act on the others and name it on stderr, one warning line saying how to include it; named, it is the
one-line error; delivered, it is refused whatever card its folder holds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import Result

from tests.conftest import CARD_DATA, invoke
from tests.test_push import RTN, add_card

SQ = f"{RTN}-SmoothQuant"
MAVG = f"{RTN}-RTN-MovingAvgObserver"
NAMED = ("error: tables.json has no results for build 'sq_auto'; run 'release eval sq_auto' and 'release tables' "
         "first\n")
THEN_SELECT = " and 'release select' (the release delivers it if chosen)"  # push and manifest: delivery decides


def _without_sq_auto(dist: Path) -> Path:
    """The card data's tables in ``dist`` without sq_auto's results (only RTN and the moving average evaluated), and
    the selection 'release select' makes from them; the tables' path."""
    tables = dist / "tables" / "tables.json"
    tables.parent.mkdir(parents=True, exist_ok=True)
    doc = json.loads((CARD_DATA / "tables" / "tables.json").read_text())
    doc["records"] = [r for r in doc["records"] if r["build"] != "sq_auto"]
    tables.write_text(json.dumps(doc))
    selected = invoke("select", "--dist", dist)
    assert selected.exit_code == 0, selected.output
    return tables


def _names_sq_auto(result: Result, tables: Path, then: str = "") -> None:
    line = (f"warning: sq_auto: not evaluated (no results in {tables}); left out: run 'release eval sq_auto' then "
            f"'release tables'{then}, or name it to see the error")
    assert result.stderr.splitlines().count(line) == 1, result.stderr
    assert "rtn:" not in result.stderr and "rtn_mavg:" not in result.stderr  # the evaluated ones are not named


def test_card_without_names_renders_the_evaluated_builds_and_names_the_other(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    shutil.copytree(CARD_DATA, dist)
    tables = _without_sq_auto(dist)
    result = invoke("card", "--dist", dist, "--lang", "en")
    assert result.exit_code == 0, result.output
    _names_sq_auto(result, tables)
    assert {f"card: {dist / repo / name}" for repo in (RTN, MAVG) for name in ("README.md", "LICENSE")} <= \
        set(result.stdout.splitlines())
    assert SQ not in result.stdout and sorted(p.name for p in (dist / SQ).iterdir()) == ["provenance.json",
                                                                                         "verification"]
    rtn = (dist / RTN / "README.md").read_text()
    assert "| FP8 + SmoothQuant (alpha searched per layer) | - | - | - | not evaluated on this path and split |" in rtn

    named = invoke("card", "sq_auto", "--dist", dist, "--lang", "en")
    assert named.exit_code == 2 and named.output == NAMED

    for repo in (RTN, MAVG):
        shutil.rmtree(dist / repo)
    nothing = invoke("card", "--dist", dist, "--lang", "en")
    assert nothing.exit_code == 2, nothing.output
    assert nothing.stderr.splitlines()[-1] == (f"error: {tables}: no results for any built repo (sq_auto); run "
                                               "'release eval NAME' then 'release tables'")


@pytest.fixture
def dist(recipe_builds: Path, tmp_path: Path) -> Path:
    """RTN and SmoothQuant built and verified; RTN alone evaluated, selected and carded."""
    d = tmp_path / "dist"
    for repo in (RTN, SQ):
        shutil.copytree(recipe_builds / repo, d / repo)
    _without_sq_auto(d)
    add_card(d / RTN)
    return d


def test_push_without_names_plans_the_evaluated_delivery_and_names_the_other(dist: Path, tmp_path: Path) -> None:
    target = tmp_path / "hub"
    plan = invoke("push", "--dist", dist, "--target", target, "--dry-run")
    assert plan.exit_code == 0, plan.output
    _names_sq_auto(plan, dist / "tables" / "tables.json", THEN_SELECT)
    assert f"## np-cr/{RTN} (rtn): " in plan.stdout and SQ not in plan.stdout
    assert "Summary: 1 repo (1 to create, 0 to update, 0 unchanged)" in plan.stdout
    named = invoke("push", "sq_auto", "--dist", dist, "--target", target, "--dry-run")
    assert named.exit_code == 1 and named.output.count("\n") == 1, named.output
    assert named.output.startswith("error: push refused: asked for sq_auto, but the release delivers rtn")
    assert not target.exists()


def test_manifest_without_names_records_the_evaluated_delivery_and_names_the_other(dist: Path,
                                                                                   tmp_path: Path) -> None:
    out = tmp_path / "release.lock.json"
    result = invoke("manifest", "--dist", dist, "--out", out)
    assert result.exit_code == 0, result.output
    _names_sq_auto(result, dist / "tables" / "tables.json", THEN_SELECT)
    lock = json.loads(out.read_text())
    assert [(s["build"], s["repo"]) for s in lock["siblings"]] == [("rtn", RTN)]
    assert f"{SQ}/provenance.json" in lock["sidecars"]  # the comparison still reads every built build's codes
    named = invoke("manifest", "sq_auto", "--dist", dist, "--out", tmp_path / "named.json")
    assert named.exit_code == 1 and named.output.startswith("error: manifest refused: asked for sq_auto"), \
        named.output
    assert not (tmp_path / "named.json").exists()


def test_a_delivered_build_without_results_is_refused_whatever_its_card(dist: Path, builds: Path,
                                                                        tmp_path: Path) -> None:
    """An override delivers sq_auto, which has a card from an earlier evaluation but no results now: named or not,
    push and manifest refuse the release with the one-line error, and nothing is written."""
    add_card(dist / SQ)
    release = builds / "release.yaml"
    release.write_text(release.read_text() + "override:\n  sq_auto: {deliver: true, reason: the server's results}\n")
    for args in (["push", "--target", tmp_path / "hub", "--dry-run"], ["push", "--target", tmp_path / "hub"],
                 ["push", "sq_auto", "--target", tmp_path / "hub", "--dry-run"],
                 ["manifest", "--out", tmp_path / "lock.json"]):
        result = invoke(*args, "--dist", dist)
        assert result.exit_code == 2 and result.output == NAMED, (args, result.output)
    assert not (tmp_path / "hub").exists() and not (tmp_path / "lock.json").exists()
