"""Shared fixtures: one tiny checkpoint and one RTN build per test session (the network stays blocked)."""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner, Result

from tests.hub_server import FakeHub

ROOT = Path(__file__).resolve().parent.parent
HUB_TOKEN = "hf_test_token"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", help="rewrite golden files instead of comparing")


# The end-to-end items (marked ``slow``; ``make test-fast`` leaves them out, ``make test`` runs them): those that use
# a fixture that builds or rolls out many builds, and those that make their own builds a different way to compare.
END_TO_END_FIXTURES = {"campaign", "uninterrupted", "evaluated", "runs"}
END_TO_END = {
    "test_the_install_blocks_release_commands_run_as_written",
    "test_an_edited_policy_redoes_what_depends_on_it_and_keeps_the_delivered_weights",
    "test_a_killed_campaign_resumes_to_the_same_bytes",
    "test_sq_build_is_byte_identical_when_repeated",
    "test_same_inputs_give_byte_identical_builds",
    "test_a_22_sibling_manifest_makes_a_comment_under_githubs_limit",
    "test_a_wheel_in_a_fresh_environment_outside_the_checkout",
    "test_layer_by_layer_inputs_are_modelopts_on_a_deeper_model",
    "test_a_build_holds_one_copy_of_the_model_at_a_time",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        name = getattr(item, "originalname", item.name)
        if name in END_TO_END or END_TO_END_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session", autouse=True)
def _isolated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Run from the repo root with the Hub offline, a private HF cache and a private calibration cache."""
    mp = pytest.MonkeyPatch()
    mp.chdir(ROOT)
    mp.setenv("HF_HUB_OFFLINE", "1")
    mp.setenv("HF_HOME", str(tmp_path_factory.getbasetemp() / "hf_home"))
    mp.setenv("RELEASE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))
    for var in ("RELEASE_SOURCE", "RELEASE_OBSERVATIONS", "RELEASE_BUILDS", "RELEASE_DEBUG", "SOURCE_DATE_EPOCH"):
        mp.delenv(var, raising=False)
    yield
    mp.undo()


@pytest.fixture(autouse=True)
def _torch_state_kept(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test leaves torch's process-wide defaults as it found them: a default dtype or thread count left changed
    (diffusers' ``from_pretrained`` sets the dtype and puts it back only when loading succeeds) changes the bytes
    of every later test's outputs, and the failure would surface far from its cause."""
    before = (torch.get_default_dtype(), torch.get_num_threads())
    yield
    after = (torch.get_default_dtype(), torch.get_num_threads())
    torch.set_default_dtype(before[0])
    torch.set_num_threads(before[1])
    assert after == before, f"{request.node.nodeid} left torch's (default dtype, threads) at {after}, not {before}"


def edited_source(tiny: Path, out: Path, tensor: str, edit: Callable[[torch.Tensor], torch.Tensor]) -> Path:
    """A copy of the tiny source at ``out`` whose transformer tensor ``tensor`` is replaced by ``edit(tensor)``, with
    the fixture's reference checkpoint beside it where its ``fixture.json`` records one (as ``release fixture``
    lays them out)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    shutil.copytree(tiny / "source", out)
    if (tiny / "reference").is_dir() and not (out.parent / "reference").exists():
        shutil.copytree(tiny / "reference", out.parent / "reference")
    index = json.loads((out / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shard = out / "transformer" / index["weight_map"][tensor]
    tensors = load_file(shard)
    tensors[tensor] = edit(tensors[tensor]).contiguous()
    with safe_open(str(shard), "pt") as f:
        metadata = f.metadata()
    save_file(tensors, str(shard), metadata=metadata)
    return out


def write_card(folder: Path, rel: str, data: str | bytes) -> None:
    """A card file written into a build folder and recorded as ``release card`` records what it writes
    (``verification/written.json``): what a push publishes after verification."""
    from release.check.written import record_written

    path = folder / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    record_written(folder, [path], "release card")


def invoke(*args: str | os.PathLike[str]) -> Result:
    from release.cli import main

    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture
def builds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of builds/ that the commands read (``RELEASE_BUILDS``): a test may edit it."""
    d = tmp_path / "builds"
    shutil.copytree(ROOT / "builds", d)
    monkeypatch.setenv("RELEASE_BUILDS", str(d))
    return d


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``release fixture tiny`` output: ``source/`` and ``observations/``."""
    from release.inputs.fixture import write_fixture

    out = tmp_path_factory.mktemp("tiny") / "fixture"
    write_fixture(out)
    return out


@pytest.fixture(scope="session")
def rtn_build(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The RTN build of the tiny checkpoint, made through the CLI."""
    dist = tmp_path_factory.mktemp("dist")
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", dist)
    assert result.exit_code == 0, result.output
    return dist / "Cosmos3-Nano-Policy-DROID-FP8"


@pytest.fixture(scope="session")
def cuda_rtn_build(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The RTN build of the tiny checkpoint in CUDA's arithmetic (``arithmetic: cuda``: what a GPU build stores), made
    on the CPU through the CLI; with the builds folder that names it (its ``rtn.yaml`` edited)."""
    root = tmp_path_factory.mktemp("cuda_rtn")
    builds = root / "builds"
    shutil.copytree(ROOT / "builds", builds)
    text = (builds / "rtn.yaml").read_text()
    (builds / "rtn.yaml").write_text(text.replace("recipe: rtn\n", "recipe: rtn\narithmetic: cuda\n"))
    result = invoke("--builds", builds, "build", "rtn", "--source", tiny / "source", "--observations",
                    tiny / "observations", "--out", root / "dist")
    assert result.exit_code == 0, result.output
    return root / "dist" / "Cosmos3-Nano-Policy-DROID-FP8", builds


@pytest.fixture(scope="session")
def recipe_builds(rtn_build: Path, tiny: Path) -> Path:
    """sq_auto and rtn_mavg, built beside the RTN build (same calibration capture)."""
    dist = rtn_build.parent
    result = invoke("build", "sq_auto", "rtn_mavg", "--source", tiny / "source", "--observations",
                    tiny / "observations", "--out", dist)
    assert result.exit_code == 0, result.output
    assert "capturing" not in result.output  # the RTN build's capture is reused
    return dist


def _serve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xet: bool) -> Iterator[FakeHub]:
    """The Hub's test double, with huggingface_hub online against it; uploads and downloads of LFS files through
    hf_xet and a local Xet store with ``xet``, through LFS's HTTP transfers without."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "0" if xet else "1")
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet_cache"))  # hf_xet's logs and caches
    monkeypatch.setenv("HF_TOKEN", HUB_TOKEN)
    from huggingface_hub import constants

    # constants are read at import time (and conftest.py makes the session offline): patch them too.
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", not xet)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    server = FakeHub(xet_cas=tmp_path / "xet_cas" if xet else None).start()
    server.expected_token = HUB_TOKEN
    yield server
    server.stop()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    yield from _serve(tmp_path, monkeypatch, xet=False)


@pytest.fixture
def xet_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
    """The double with a local Xet store: huggingface_hub routes every LFS file through hf_xet, as with the Hub."""
    yield from _serve(tmp_path, monkeypatch, xet=True)


@pytest.fixture(scope="session")
def campaign(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``release build --all``: the seed's 22 builds from one capture and one load of the source, all verified."""
    dist = tmp_path_factory.mktemp("campaign")
    result = invoke("build", "--all", "--source", tiny / "source", "--observations", tiny / "observations",
                    "--out", dist)
    assert result.exit_code == 0, result.output
    return dist


CARD_DATA = ROOT / "tests" / "data" / "cards"  # the seed card's figures: tables.json and selection.json


def choose(dist: Path, chosen: list[str]) -> None:
    """A crafted ``selection.json`` in ``dist`` that chose ``chosen`` (RTN as the rule's 'always' build), made from
    the tables in ``dist`` (the committed card data's when it has none)."""
    if not (dist / "tables").is_dir():
        shutil.copytree(CARD_DATA / "tables", dist / "tables")
    doc = json.loads((CARD_DATA / "selection.json").read_text())
    for c in doc["candidates"]:
        c["chosen"] = "always" if c["build"] == "rtn" else "rank" if c["build"] in chosen else None
    doc["chosen"] = chosen
    (dist / "selection.json").write_text(json.dumps(doc, indent=2))


def relax_gate(builds: Path, dist: Path, build: str = "rtn_mavg", rate: float = 0.01) -> None:
    """``build``'s gate at ``rate`` of steps in the private ``builds`` copy, and the gates of ``dist``'s tables as
    'release tables' recomputes them under it (at 1%, the card data's moving-average build passes on every path)."""
    path = builds / f"{build}.yaml"
    path.write_text(path.read_text().replace("gripper_change_rate: 0.005", f"gripper_change_rate: {rate}"))
    tables = dist / "tables" / "tables.json"
    doc = json.loads(tables.read_text())
    for r in doc["records"]:
        if r["build"] == build:
            r["gate"] = r["overall_sigma"] <= 0.13 and r["gripper_changes"] <= rate * r["n_steps"]
    tables.write_text(json.dumps(doc))


@pytest.fixture(scope="session")
def carded(rtn_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dist as a real release leaves it for 'release manifest': the RTN build, the seed's tables and selection,
    and the cards rendered from them."""
    dist = tmp_path_factory.mktemp("carded") / "dist"
    shutil.copytree(rtn_build, dist / rtn_build.name)
    shutil.copytree(CARD_DATA / "tables", dist / "tables")
    shutil.copy(CARD_DATA / "selection.json", dist / "selection.json")
    result = invoke("card", "rtn", "--dist", dist)
    assert result.exit_code == 0, result.output
    return dist


@pytest.fixture(scope="session")
def release_lock(carded: Path) -> Path:
    """``release manifest`` of ``carded``."""
    out = carded.parent / "release.lock.json"
    result = invoke("manifest", "--dist", carded, "--out", out)
    assert result.exit_code == 0, result.output
    return out


# The narrowed campaign (tests/test_campaign_command.py, tests/test_idempotence.py): three builds, finished once.
EPOCH = "1767225600"
RTN, MAVG, MAVG005 = ("Cosmos3-Nano-Policy-DROID-FP8", "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvgObserver",
                      "Cosmos3-Nano-Policy-DROID-FP8-RTN-MovingAvg005")


def _narrow(builds: Path) -> None:
    """Three builds (RTN and two moving-average observers: one capture pass), both fake-quant splits, the deployed
    path of the chosen builds, no yardsticks (a fixed margin instead: torch.compile on the CPU is slow), 64
    calibration calls; RTN 'always', one more by rank, and a gate that only rtn_mavg005 (not one of the seed's five
    served builds) passes, so that a dropped build is chosen and gets its deployed results before the cards."""
    path = builds / "release.yaml"
    text = re.sub(r"\nsweep: \[.*?\]\n", "\nsweep: [rtn, rtn_mavg, rtn_mavg005]\n", path.read_text(), flags=re.S)
    text = re.sub(r"candidates: \[.*?\]", "candidates: [rtn, rtn_mavg, rtn_mavg005]", text)
    text = text.replace("count: 2", "count: 1").replace("equivalence_margin: {of_baseline: 0.1}",
                                                        "equivalence_margin: {sigma: 0.01}")
    text = re.sub(r"    - \{path: deployed.*builds: \[.*\n", "", text).replace("yardsticks: [calibration, validation]",
                                                                      "yardsticks: []")
    path.write_text(text)
    fewer_calls(builds, "rtn", "rtn_mavg", "rtn_mavg005")
    file = builds / "rtn_mavg005.yaml"
    file.write_text(file.read_text().replace("gripper_change_rate: 0.005", "gripper_change_rate: 0.05"))


def fewer_calls(builds: Path, *names: str) -> None:
    """``names`` in the builds folder ``builds`` with 64 calibration calls and 8 algorithm calls (the shipped 256 and
    32 make a tiny capture of 32 rollouts): for tests that compare two ways of making the same builds, not the
    shipped bytes."""
    for name in names:
        file = builds / f"{name}.yaml"
        text = file.read_text()
        assert "calibration_calls: 256" in text and "algorithm_calls: 32" in text, file
        file.write_text(text.replace("calibration_calls: 256", "calibration_calls: 64")
                        .replace("algorithm_calls: 32", "algorithm_calls: 8"))


def dist_files(dist: Path) -> dict[str, bytes]:
    return {str(p.relative_to(dist)): p.read_bytes() for p in sorted(dist.rglob("*")) if p.is_file()}


def campaign_args(small: Path, dist: Path) -> list[str]:
    return ["campaign", "--source", str(small / "source"), "--observations", str(small / "observations"),
            "--dist", str(dist)]


@pytest.fixture(scope="session")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny fixture of 10 calibration-lab and 10 held-out observations (the statistics' minimum N)."""
    from release.inputs.fixture import write_fixture

    out = tmp_path_factory.mktemp("campaign-fixture") / "fixture"
    write_fixture(out, n_obs=10, heldout=10)
    return out


@pytest.fixture(scope="session")
def narrowed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    builds = tmp_path_factory.mktemp("campaign-builds") / "builds"
    shutil.copytree(ROOT / "builds", builds)
    _narrow(builds)
    return builds


@pytest.fixture(scope="session")
def uninterrupted(small: Path, narrowed: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One campaign from start to end, in process, with its own caches."""
    dist = tmp_path_factory.mktemp("campaign-whole") / "dist"
    mp = pytest.MonkeyPatch()
    mp.setenv("RELEASE_BUILDS", str(narrowed))
    mp.setenv("RELEASE_CACHE", str(dist.parent / "cache"))
    mp.setenv("SOURCE_DATE_EPOCH", EPOCH)
    try:
        result = invoke(*campaign_args(small, dist))
    finally:
        mp.undo()
    assert result.exit_code == 0, result.output
    return dist, result.output


def add_card(folder: Path, text: str = "---\nlicense: other\n---\n# card\n") -> None:
    """The files `release card` writes after verification (a push needs README.md and LICENSE), and the tables it
    makes them from when the dist has none (the card data's, with results for rtn, sq_auto and rtn_mavg: a push
    publishes evaluated builds only)."""
    write_card(folder, "README.md", text)
    write_card(folder, "LICENSE", "OpenMDW License 1.1\n")
    if not (folder.parent / "tables").exists():
        shutil.copytree(CARD_DATA / "tables", folder.parent / "tables")


@pytest.fixture
def dist(rtn_build: Path, tmp_path: Path) -> Path:
    """The RTN build with a card, in a dist of its own (a module may define its own ``dist``)."""
    d = tmp_path / "dist"
    shutil.copytree(rtn_build, d / rtn_build.name)
    add_card(d / rtn_build.name)
    return d
