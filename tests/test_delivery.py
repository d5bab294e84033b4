"""Selection decides delivery: the cards, the manifest and push take the delivered builds from selection.json (plus
release.yaml's `override`), and refuse any other set with one line naming both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import CARD_DATA, choose, invoke, relax_gate
from tests.test_push import add_card

RTN = "Cosmos3-Nano-Policy-DROID-FP8"


def _override(builds: Path, text: str) -> None:
    release = builds / "release.yaml"
    release.write_text(release.read_text() + f"override:\n{text}")


def _refused(result: object, *parts: str, code: int = 1) -> str:
    out: str = result.output  # type: ignore[attr-defined]
    assert result.exit_code == code, out  # type: ignore[attr-defined]
    assert out.startswith("error: ") and out.count("\n") == 1 and "internal error" not in out, out
    for part in parts:
        assert part in out, (part, out)
    return out


@pytest.fixture
def builds(builds: Path) -> Path:
    """The private copy of builds/ with its rule scored in-sample: the card data has no held-out fake quant."""
    path = builds / "release.yaml"
    text = path.read_text()
    assert "\n  split: validation\n" in text
    path.write_text(text.replace("\n  split: validation\n", "\n  split: calibration\n"))
    return builds


@pytest.fixture
def card_data(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    shutil.copytree(CARD_DATA, dist)
    return dist


def _siblings(card: str) -> str:
    return card.split("Sibling repositories of this release:")[1].split("\n## ")[0]


def test_the_cards_name_the_builds_the_selection_chose(card_data: Path) -> None:
    """A selection that chooses builds outside the old fixed siblings: every card lists exactly those as the
    release's repos, and the card of a build that was not chosen says so."""
    choose(card_data, ["rtn", "sq_auto_gptq", "rtn_mavg005"])
    assert invoke("card", "rtn", "sq_auto", "--dist", card_data, "--lang", "en").exit_code == 0
    rtn = (card_data / RTN / "README.md").read_text()
    siblings = _siblings(rtn)
    for repo in (RTN, f"{RTN}-SQ-GPTQ", f"{RTN}-RTN-MovingAvg005"):
        assert f"[np-cr/{repo}](https://huggingface.co/np-cr/{repo})" in siblings
    assert f"np-cr/{RTN}-SmoothQuant" not in siblings and f"np-cr/{RTN}-RTN-MovingAvgObserver" not in siblings
    sq = (card_data / f"{RTN}-SmoothQuant" / "README.md").read_text()
    assert "This build was not chosen: rank 3 of 3." in sq and "(this repository)" not in _siblings(sq)
    # the card opens with which build to use, from the delivered builds' results (RTN alone has results here)
    assert "Which build to use: **FP8 (RTN, NVIDIA-identical recipe)" in rtn.split("## ")[0]


def test_select_prints_what_the_release_delivers(card_data: Path, builds: Path) -> None:
    result = invoke("select", "--dist", card_data)
    assert result.exit_code == 0 and "delivered: rtn\n" in result.output, result.output  # none other passes its gate
    relax_gate(builds, card_data)
    result = invoke("select", "--dist", card_data)
    assert result.exit_code == 0 and "delivered: rtn, rtn_mavg\n" in result.output, result.output
    _override(builds, "  rtn_mavg: {deliver: false, reason: kept back}\n  sq_auto: {deliver: true, reason: x}\n")
    result = invoke("select", "--dist", card_data)
    assert result.exit_code == 0 and "delivered: rtn, sq_auto\n" in result.output, result.output


def test_the_opening_advice_is_the_first_pick_with_its_evidence(card_data: Path, builds: Path) -> None:
    """With RTN and RTN + moving average chosen (its gate relaxed) and no held-out results, the advice names the
    selection's first pick, the moving-average build, with its deployed figures on every lab, even where RTN's point
    estimate there is lower: the reference is never recommended over a ranked pick."""
    relax_gate(builds, card_data)
    assert invoke("select", "--dist", card_data).exit_code == 0
    assert invoke("card", "rtn", "--dist", card_data, "--lang", "en").exit_code == 0
    opening = (card_data / RTN / "README.md").read_text().split("Sibling repositories")[0]
    tables = json.loads((card_data / "tables" / "tables.json").read_text())
    deployed = {r["build"]: r for r in tables["records"] if r["path"] == "deployed"}
    assert deployed["rtn"]["overall_sigma"] < deployed["rtn_mavg"]["overall_sigma"]
    assert f"Which build to use: **{deployed['rtn_mavg']['title']}**" in opening
    assert "the selection's first pick: rank 1 of 3" in opening
    assert f"On deployed, CPU emulation, all labs: {deployed['rtn_mavg']['overall_sigma']:.5f}" in opening


def test_an_override_delivers_another_build_and_the_cards_say_why(card_data: Path, builds: Path) -> None:
    _override(builds, "  sq_auto: {deliver: true, reason: the policy server's results favour it}\n")
    assert invoke("card", "rtn", "sq_auto", "--dist", card_data, "--lang", "en,ko").exit_code == 0
    sq = (card_data / f"{RTN}-SmoothQuant" / "README.md").read_text()
    assert "Delivered although rank 3 of 3 and not chosen, because: the policy server's results favour it" in sq
    assert f"np-cr/{RTN}-SmoothQuant" in _siblings((card_data / RTN / "README.md").read_text())


def test_an_override_that_changes_nothing_is_refused(card_data: Path, builds: Path) -> None:
    relax_gate(builds, card_data)
    assert invoke("select", "--dist", card_data).exit_code == 0
    _override(builds, "  rtn_mavg: {deliver: true, reason: it is good}\n")  # the selection chose it already
    _refused(invoke("card", "rtn", "--dist", card_data), "override.rtn_mavg", "chose 'rtn_mavg'",
             "chosen: rtn, rtn_mavg", "remove the override", code=2)  # a configuration error, not a refused push


def test_an_override_needs_a_repo_and_a_reason(builds: Path, card_data: Path) -> None:
    _override(builds, "  gptq: {deliver: true, reason: x}\n")
    result = invoke("card", "rtn", "--dist", card_data)
    assert result.exit_code == 2 and "'override.gptq' names 'gptq', which has no repo in 'repos'" in result.output
    (builds / "release.yaml").write_text((builds / "release.yaml").read_text().replace("gptq: {deliver: true, "
                                                                                       "reason: x}",
                                                                                       "sq_auto: {deliver: true}"))
    result = invoke("card", "rtn", "--dist", card_data)
    assert result.exit_code == 2 and "override.sq_auto.reason" in result.output, result.output


def test_a_repo_that_disagrees_with_its_build_file_is_refused(builds: Path, card_data: Path) -> None:
    text = (builds / "release.yaml").read_text().replace(f"  sq_auto: {RTN}-SmoothQuant", f"  sq_auto: {RTN}-SQ")
    (builds / "release.yaml").write_text(text)
    result = invoke("card", "rtn", "--dist", card_data)
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "field 'repos.sq_auto' is 'Cosmos3-Nano-Policy-DROID-FP8-SQ'" in result.output
    assert "sq_auto.yaml says repo 'Cosmos3-Nano-Policy-DROID-FP8-SmoothQuant'" in result.output


def test_push_publishes_what_the_selection_chose_and_refuses_the_rest(recipe_builds: Path, tmp_path: Path) -> None:
    """Three builds on disk; the selection chose RTN and SmoothQuant: a push without names publishes exactly those
    two, and a push that names the third is refused before anything is read or written."""
    dist = tmp_path / "dist"
    for repo in (RTN, f"{RTN}-SmoothQuant", f"{RTN}-RTN-MovingAvgObserver"):
        shutil.copytree(recipe_builds / repo, dist / repo)
        add_card(dist / repo)
    choose(dist, ["rtn", "sq_auto"])
    target = tmp_path / "hub"
    result = invoke("push", "--dist", dist, "--target", target)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (target / "np-cr").iterdir()) == [RTN, f"{RTN}-SmoothQuant"]
    _refused(invoke("push", "rtn_mavg", "--dist", dist, "--target", tmp_path / "other", "--dry-run"),
             "push refused: asked for rtn_mavg, but the release delivers rtn, sq_auto", "override")
    assert not (tmp_path / "other").exists()
    _refused(invoke("manifest", "rtn", "rtn_mavg", "--dist", dist, "--out", tmp_path / "lock.json"),
             "manifest refused: asked for rtn_mavg")
    assert not (tmp_path / "lock.json").exists()


def test_without_a_selection_only_the_rules_always_builds_are_delivered(recipe_builds: Path,
                                                                       tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    for repo in (RTN, f"{RTN}-SmoothQuant"):
        shutil.copytree(recipe_builds / repo, dist / repo)
        add_card(dist / repo)
    _refused(invoke("push", "sq_auto", "--dist", dist, "--target", tmp_path / "hub", "--dry-run"),
             "the release delivers rtn (no selection.json yet: run 'release select'")
    plan = invoke("push", "--dist", dist, "--target", tmp_path / "hub", "--dry-run")
    assert plan.exit_code == 0 and RTN in plan.output and f"{RTN}-SmoothQuant" not in plan.output, plan.output


def test_the_license_is_the_sources_verbatim_and_the_metadata_the_models(card_data: Path) -> None:
    """The card copies the LICENSE text the build recorded from its source, byte for byte; without one, a pointer
    that the card owns up to. ``language`` is the model's (English instructions) for the Korean card too, and
    ``datasets`` names the observations' Hub dataset when they were imported from one."""
    from huggingface_hub import ModelCard

    assert invoke("card", "rtn", "--dist", card_data, "--lang", "en,ko").exit_code == 0
    folder = card_data / RTN
    assert (folder / "LICENSE").read_text() == \
        "OpenMDW-1.1: see https://huggingface.co/nvidia/Cosmos3-Nano-Policy-DROID/blob/main/LICENSE\n"
    assert "has no `LICENSE` file, so this repository's `LICENSE` is a one-line pointer" in \
        (folder / "README.md").read_text()
    text = "OpenMDW License Agreement, version 1.1\n\n  Preamble: ...\u00a0with odd spacing\n"
    prov = json.loads((folder / "provenance.json").read_text())
    prov["source"]["license"] = {"file": "LICENSE", "sha256": "0" * 64, "text": text}
    prov["calibration"]["dataset"] = "lerobot/droid_1.0.1"
    (folder / "provenance.json").write_text(json.dumps(prov))
    assert invoke("card", "rtn", "--dist", card_data, "--lang", "en,ko").exit_code == 0
    assert (folder / "LICENSE").read_bytes() == text.encode()
    for name in ("README.md", "README.ko.md"):
        card = (folder / name).read_text()
        assert "one-line pointer" not in card and "`LICENSE`는" not in card
        data = ModelCard(card).data
        assert data.language == ["en"] and data.datasets == ["lerobot/droid_1.0.1"]


def test_the_source_license_is_read_as_text_and_the_dataset_id_from_its_folder(tmp_path: Path) -> None:
    from release.core.errors import ReleaseError
    from release.inputs.lerobot import hub_id
    from release.inputs.source import source_license

    assert source_license(tmp_path) is None
    (tmp_path / "LICENSE").write_bytes(b"\xff\xfe not text")
    with pytest.raises(ReleaseError, match="LICENSE: not UTF-8 text"):
        source_license(tmp_path)
    (tmp_path / "LICENSE").unlink()
    (tmp_path / "elsewhere").write_text("x")
    (tmp_path / "LICENSE").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ReleaseError, match="LICENSE: not a regular file"):
        source_license(tmp_path)
    snapshot = tmp_path / "hub" / "datasets--lerobot--droid_1.0.1" / "snapshots" / "abc"
    home = tmp_path / "lerobot" / "cadene" / "droid"
    for d in (snapshot, home):
        d.mkdir(parents=True)
    assert hub_id(snapshot) == "lerobot/droid_1.0.1" and hub_id(home) == "cadene/droid"
    assert hub_id(tmp_path / "hub") is None


def test_a_chosen_build_without_a_repo_is_refused(card_data: Path, builds: Path) -> None:
    text = (builds / "release.yaml").read_text().replace(f"  sq_a05: {RTN}-SQ-a05\n", "")
    (builds / "release.yaml").write_text(text)
    choose(card_data, ["rtn", "sq_a05"])
    result = invoke("card", "rtn", "--dist", card_data, "--lang", "en")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "the selection chose 'sq_a05', which has no repo in 'repos'; add 'sq_a05: REPO'" in result.output
