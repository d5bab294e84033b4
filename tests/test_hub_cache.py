"""Real checkpoints: the source and the reference by Hub id from the local Hugging Face cache (huggingface_hub's own
layout, nothing downloaded), the commit of an 'hf download --local-dir' folder, the base_revision check, and an
external FP8 checkpoint (NVIDIA's published one) evaluated beside the builds."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from release.core.builds import load_release
from release.core.errors import ReleaseError
from release.inputs.source import resolve_checkpoint, source_identity
from tests.conftest import ROOT, invoke

BASE = load_release(ROOT / "builds")
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def fake_cache(cache: Path, repo_id: str, commit: str, folder: Path, refs: tuple[str, ...] = ("main",)) -> Path:
    """``folder`` as huggingface_hub's cache holds a snapshot: models--org--name/snapshots/<commit>/... and
    refs/<branch> holding the commit (blobs and links left out: the lookup reads refs and snapshots only)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot, ignore=shutil.ignore_patterns("fixture.json", "verification", "results"))
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from huggingface_hub import constants

    folder = tmp_path / "hf_cache"
    folder.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(folder))
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    return folder


def test_a_hub_id_resolves_in_the_cache_with_its_commit(cache: Path, tiny: Path) -> None:
    snapshot = fake_cache(cache, BASE.base_model, BASE.base_revision, tiny / "source")
    assert resolve_checkpoint(f"{BASE.base_model}@{BASE.base_revision}", "--source") == snapshot
    assert resolve_checkpoint(BASE.base_model, "--source") == snapshot  # refs/main
    identity = source_identity(snapshot)
    assert (identity.revision, identity.origin, identity.repo) == (BASE.base_revision, "hub cache", BASE.base_model)
    with pytest.raises(ReleaseError, match=r"--source nvidia/other is not in the local Hugging Face cache"):
        resolve_checkpoint("nvidia/other", "--source")
    with pytest.raises(ReleaseError, match=r"no such folder, and not a Hub id"):
        resolve_checkpoint("not/a/repo/path", "--source")


def test_build_from_the_cache_records_the_hub_commit(cache: Path, tiny: Path, tmp_path: Path) -> None:
    fake_cache(cache, BASE.base_model, BASE.base_revision, tiny / "source")
    result = invoke("build", "rtn", "--source", BASE.base_model, "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    assert result.exit_code == 0, result.output
    prov = json.loads((tmp_path / "dist" / "Cosmos3-Nano-Policy-DROID-FP8" / "provenance.json").read_text())
    assert prov["source"]["revision"] == BASE.base_revision and prov["source"]["origin"] == "hub cache"
    assert prov["source"]["repo"] == BASE.base_model and prov["source"]["revision_mismatch"] is False


def test_another_commit_needs_the_flag_and_the_card_says_so(cache: Path, tiny: Path, tmp_path: Path) -> None:
    fake_cache(cache, BASE.base_model, COMMIT, tiny / "source", refs=("main", "newer"))
    spec = f"{BASE.base_model}@newer"
    result = invoke("build", "rtn", "--source", spec, "--observations", tiny / "observations", "--out",
                    tmp_path / "dist")
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert f"at commit {COMMIT[:12]} (hub cache), builds/release.yaml pins base_revision " in result.output
    assert "--allow-revision-mismatch" in result.output and not (tmp_path / "dist").exists()


def test_a_snapshot_commit_wins_over_a_fixture_record_inside_it(cache: Path, tiny: Path) -> None:
    """A ``fixture.json`` in a Hub snapshot is a file of that repo: the snapshot's commit is the source's revision.
    Outside a snapshot, a record without its revision is a one-line error naming the file and the field."""
    snapshot = fake_cache(cache, BASE.base_model, COMMIT, tiny / "source")
    (snapshot / "fixture.json").write_text(json.dumps({"revision": "f" * 40}))
    assert (source_identity(snapshot).revision, source_identity(snapshot).origin) == (COMMIT, "hub cache")
    folder = snapshot.parent.parent.parent / "plain"
    shutil.copytree(snapshot, folder)
    (folder / "fixture.json").write_text(json.dumps({"seed": 0}))
    with pytest.raises(ReleaseError, match=r"fixture.json: field 'revision' is missing \(the tiny fixture's record\); "
                                           r"run 'release fixture tiny --out .*' to rewrite it"):
        source_identity(folder)


def test_an_hf_download_folder_carries_its_commit(tiny: Path, tmp_path: Path) -> None:
    folder = tmp_path / "local"
    shutil.copytree(tiny / "source", folder, ignore=shutil.ignore_patterns("fixture.json"))
    meta = folder / ".cache" / "huggingface" / "download"
    for rel in ("model_index.json", "transformer/config.json"):
        (meta / rel).parent.mkdir(parents=True, exist_ok=True)
        (meta / f"{rel}.metadata").write_text(f"{COMMIT}\nabc\n1712656091.123\n")
    identity = source_identity(folder)
    assert (identity.revision, identity.origin) == (COMMIT, "hf download")
    assert sorted(p.name for p in meta.rglob("*")) == ["config.json.metadata", "model_index.json.metadata",
                                                       "transformer"]  # read only: no lock file left
    (meta / "transformer" / "config.json.metadata").write_text("f" * 40 + "\nabc\n1\n")
    with pytest.raises(ReleaseError, match=r"files of 2 different commits"):
        source_identity(folder)
    shutil.rmtree(folder / ".cache")
    assert source_identity(folder).origin == "content hash"


def test_mismatch_allowed_is_recorded_and_told(cache: Path, tiny: Path, tmp_path: Path) -> None:
    """--allow-revision-mismatch builds, provenance records it, the card's provenance says so."""
    fake_cache(cache, BASE.base_model, COMMIT, tiny / "source")
    result = invoke("build", "rtn", "--source", f"{BASE.base_model}@{COMMIT}", "--observations",
                    tiny / "observations", "--out", tmp_path / "dist", "--allow-revision-mismatch")
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # the terminal's line breaks apart
    assert f"({BASE.base_model} at hub cache {COMMIT[:12]})" in output
    assert f"warning: the source is not base_revision {BASE.base_revision[:12]} of release.yaml" in output
    folder = tmp_path / "dist" / "Cosmos3-Nano-Policy-DROID-FP8"
    prov = json.loads((folder / "provenance.json").read_text())
    assert prov["source"]["revision_mismatch"] is True and prov["source"]["revision"] == COMMIT
    quiet = invoke("-q", "build", "rtn", "--source", f"{BASE.base_model}@{COMMIT}", "--observations",
                   tiny / "observations", "--out", tmp_path / "quiet", "--allow-revision-mismatch")
    assert quiet.exit_code == 0, quiet.output
    said = " ".join(quiet.stderr.split())  # -q: the warning, but no source line, progress or build files line
    assert said.startswith(f"warning: the source is not base_revision {BASE.base_revision[:12]} of release.yaml")
    assert "source: " not in said and "build rtn" not in said and "build files: " not in said
    dist = tmp_path / "dist"
    assert invoke("eval", "rtn", "--path", "fakequant", "--split", "validation", "--dist", dist, "--source",
                  f"{BASE.base_model}@{COMMIT}", "--observations", tiny / "observations").exit_code == 0
    assert invoke("tables", "--dist", dist).exit_code == 0
    assert invoke("card", "rtn", "--dist", dist, "--lang", "en,ko").exit_code == 0
    en = (folder / "README.md").read_text()
    assert f"`{BASE.base_model}@{COMMIT}` (BF16): the Hub commit, from the local Hugging Face cache" in en
    assert f"It is not the release's pinned base_revision `{BASE.base_revision}`: built with " in en
    assert "`--allow-revision-mismatch`" in (folder / "README.ko.md").read_text()


def test_reference_and_external_checkpoint_by_hub_id(cache: Path, rtn_build: Path, tiny: Path,
                                                    tmp_path: Path) -> None:
    """NVIDIA's published FP8 checkpoint named as nvidia/Cosmos3-Nano@fp8 (here: a copy of the RTN build in the
    cache at branch fp8): the reference of 'release verify', and a row of its own beside the builds."""
    fake_cache(cache, "nvidia/Cosmos3-Nano", COMMIT, rtn_build, refs=("fp8",))
    dist = tmp_path / "dist"
    shutil.copytree(rtn_build, dist / rtn_build.name)
    rtn_build = dist / rtn_build.name
    result = invoke("verify", "rtn", "--dist", dist, "--reference", "nvidia/Cosmos3-Nano@fp8", "--source",
                    tiny / "source", "--observations", tiny / "observations")
    assert result.exit_code == 0, result.output
    report = json.loads((rtn_build / "verification" / "report.json").read_text())
    assert report["reference"] == COMMIT and report["status"] == "passed"
    result = invoke("eval", "rtn", "--external", "nvidia/Cosmos3-Nano@fp8", "--path", "deployed", "--split",
                    "validation",
                    "--dist", dist, "--source", tiny / "source", "--observations", tiny / "observations")
    assert result.exit_code == 0, result.output
    assert (dist / "external" / "nvidia-Cosmos3-Nano-fp8" / "results" / "deployed-validation.npz").is_file()
    assert invoke("tables", "--dist", dist).exit_code == 0
    records = json.loads((dist / "tables" / "tables.json").read_text())["records"]
    published = next(r for r in records if r["build"] == "nvidia-Cosmos3-Nano-fp8")
    rtn = next(r for r in records if r["build"] == "rtn" and r["path"] == "deployed" and r["split"] == "validation")
    assert published["title"] == "published NVIDIA FP8" and published["comparisons"] >= 1
    assert published["overall_sigma"] == rtn["overall_sigma"]  # the same bytes: the same rollouts
