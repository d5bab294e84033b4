"""A calibration capture is keyed by its source's bytes (issue 34): a source edited in place under the same declared
revision (its fixture.json kept) captures anew; the files' digests are cached by their stat stamp."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import release.core.digest as digest
from release.core.digest import folder_digest
from release.inputs.observations import load_observations, split


def test_the_digest_follows_the_bytes_and_reuses_unchanged_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                 ) -> None:
    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "source"
    (folder / "sub").mkdir(parents=True)
    (folder / "a.bin").write_bytes(b"1234")
    (folder / "sub" / "b.json").write_text("{}")
    first = folder_digest(folder)
    hashed: list[Path] = []
    real = digest.sha256_file
    monkeypatch.setattr(digest, "sha256_file", lambda p: hashed.append(p) or real(p))
    assert folder_digest(folder) == first and not hashed  # both from the cache
    (folder / "a.bin").write_bytes(b"1235")  # same size, other bytes
    assert folder_digest(folder) != first and hashed == [folder / "a.bin"]
    (folder / "a.bin").write_bytes(b"1234")
    assert folder_digest(folder) == first
    (folder / "sub" / "b.json").rename(folder / "b.json")  # the same bytes at another path
    assert folder_digest(folder) != first
    (tmp_path / "cache" / "digests.json").write_text("[")  # a damaged cache is hashed afresh
    assert folder_digest(folder) == folder_digest(folder)


def test_a_source_edited_under_the_same_revision_captures_anew(tiny: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from release.core.builds import load_release
    from release.quantize.build import BuildRequest, capture_calibration

    monkeypatch.setenv("RELEASE_CACHE", str(tmp_path / "cache"))
    source = tmp_path / "fixture" / "source"
    shutil.copytree(tiny / "source", source)  # fixture.json (its declared revision) kept
    observations = split(load_observations(tiny / "observations"), load_release().calibration_labs)[:2]

    def captured() -> tuple[Path, str]:
        request = BuildRequest.create(("rtn",), False, source, tiny / "observations", tmp_path / "dist")
        folder, _ = capture_calibration(request, observations)
        return folder, request.identity.revision

    before, revision = captured()
    name = "layers.0.mlp.down_proj.weight"
    index = json.loads((source / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    shard = source / "transformer" / index["weight_map"][name]
    tensors = load_file(shard)
    tensors[name] = -tensors[name]
    save_file(tensors, shard, metadata={"format": "pt"})
    after, same = captured()
    assert same == revision and after != before  # the same declared revision, another capture
    calls_before = torch.load(before / f"obs-{observations[0].obs_id:05d}.pt", weights_only=True)
    calls_after = torch.load(after / f"obs-{observations[0].obs_id:05d}.pt", weights_only=True)
    assert len(calls_before) == len(calls_after)

    def same(a: object, b: object) -> bool:
        if isinstance(a, torch.Tensor):
            return isinstance(b, torch.Tensor) and torch.equal(a, b)
        if isinstance(a, list | tuple):
            return isinstance(b, list | tuple) and len(a) == len(b) and all(map(same, a, b))
        return a == b

    differ = [i for i, (a, b) in enumerate(zip(calls_before, calls_after, strict=True))
              if not all(same(v, b[k]) for k, v in a.items())]
    assert differ and differ[0] > 0  # the first call's inputs are the noise; the later ones follow the new weights
