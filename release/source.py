"""Finding the BF16 source checkpoint and checking it against the architecture."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from release import ReleaseError
from release.config import SOURCE_ENV, ReleaseConfig
from release.fixture import content_revision


def resolve_source(release: ReleaseConfig, source: Path | None) -> Path:
    """``--source``, else ``$RELEASE_SOURCE``, else the local Hugging Face cache at the pinned revision.

    Nothing is downloaded: a checkpoint missing from the cache is an error that says how to provide it.
    """
    if source is None and os.environ.get(SOURCE_ENV):
        source = Path(os.environ[SOURCE_ENV])
    if source is not None:
        if not source.is_dir():
            raise ReleaseError(
                f"source directory {source} does not exist; pass --source DIR (or set {SOURCE_ENV}) to a checkpoint "
                "folder, e.g. one written by 'release fixture tiny --out DIR'"
            )
        if not (source / "model_index.json").is_file():
            raise ReleaseError(f"{source}: no model_index.json; --source must be a diffusers pipeline folder")
        return source
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(release.base_model, revision=release.base_revision, local_files_only=True))
    except (LocalEntryNotFoundError, OSError) as exc:
        raise ReleaseError(
            f"{release.base_model}@{release.base_revision[:12]} is not in the local Hugging Face cache; pass "
            f"--source DIR or set {SOURCE_ENV} (run 'release fixture tiny --out DIR' for the tiny stand-in)"
        ) from exc


def source_revision(source: Path) -> str:
    """The fixture's recorded revision, the cache snapshot's commit, or a content hash of the folder."""
    fixture = source / "fixture.json"
    if fixture.is_file():
        return str(json.loads(fixture.read_text())["revision"])
    if source.parent.name == "snapshots":
        return source.name
    return content_revision(source)


def read_headers(folder: Path, index_name: str) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{tensor: (dtype, shape, file)}`` of a sharded safetensors folder, read from the headers only."""
    from safetensors import safe_open

    index_path = folder / index_name
    if index_path.is_file():
        files = sorted(set(json.loads(index_path.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise ReleaseError(f"{folder}: no safetensors files")
    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for name in files:
        path = folder / name
        if not path.is_file():
            raise ReleaseError(f"{index_path}: lists shard {name}, which is missing; re-download or rewrite the index")
        try:
            with safe_open(str(path), framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    out[key] = (sl.get_dtype(), tuple(sl.get_shape()), name)
        except Exception as exc:  # safetensors raises its own error types for corrupt headers
            raise ReleaseError(f"{path}: unreadable safetensors header ({exc}); the file is corrupt") from exc
    return out


def check_architecture(source: Path) -> dict[str, object]:
    """Compare the transformer's tensors with ``Cosmos3OmniTransformer`` built from its config; return the config."""
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    cfg_path = source / "transformer" / "config.json"
    if not cfg_path.is_file():
        raise ReleaseError(f"{cfg_path}: missing; the source is not a Cosmos3 diffusers checkpoint")
    config = json.loads(cfg_path.read_text())
    try:
        with init_empty_weights():
            model = Cosmos3OmniTransformer.from_config(config)
    except (TypeError, ValueError) as exc:
        raise ReleaseError(f"{cfg_path}: not a valid Cosmos3OmniTransformer config: {exc}") from exc
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = read_headers(source / "transformer", "diffusion_pytorch_model.safetensors.index.json")
    for key in sorted(expected):
        if key not in found:
            raise ReleaseError(
                f"{source}/transformer: tensor {key} is missing; the checkpoint does not match {cfg_path}"
            )
        if found[key][1] != expected[key]:
            raise ReleaseError(
                f"{source}/transformer/{found[key][2]}: tensor {key} has shape {list(found[key][1])}, the "
                f"architecture in {cfg_path} expects {list(expected[key])}"
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ReleaseError(f"{source}/transformer/{found[extra[0]][2]}: tensor {extra[0]} is not in the architecture")
    return config


class SourceModel:
    """The BF16 source transformer, read from disk once (into CPU memory) and instantiated afresh for each build, so
    that ``release build --all`` loads the source one time however many builds it makes."""

    def __init__(self, folder: Path) -> None:
        import torch
        from diffusers import Cosmos3OmniTransformer

        from release.recipes.base import check_finite

        model = Cosmos3OmniTransformer.from_pretrained(str(folder / "transformer"), dtype=torch.bfloat16)
        check_finite(model, folder)
        self.folder = folder
        self.config = dict(model.config)
        self.state = {k: v.detach() for k, v in model.state_dict().items()}  # time_embedder stays fp32

    def instantiate(self, device: str) -> Any:
        """A new ``Cosmos3OmniTransformer`` on ``device`` with its own copy of the source weights."""
        from accelerate import init_empty_weights
        from diffusers import Cosmos3OmniTransformer

        with init_empty_weights():
            model = Cosmos3OmniTransformer.from_config(self.config)
        model.load_state_dict({k: v.to(device, copy=True) for k, v in self.state.items()}, strict=True, assign=True)
        return model.to(device).eval()
