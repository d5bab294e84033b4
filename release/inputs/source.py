"""Finding the BF16 source checkpoint and checking it against the architecture."""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from release.core.config import SOURCE_ENV, ReleaseConfig
from release.core.errors import ReleaseError
from release.core.files import plain_files
from release.core.io import read_json, write_json
from release.inputs.fixture import content_revision

if TYPE_CHECKING:
    import torch

HUB_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def from_cache(repo_id: str, revision: str | None, what: str) -> Path:
    """The snapshot folder of ``repo_id`` at ``revision`` (a commit, branch or tag; default ``main``) in the local
    Hugging Face cache (huggingface_hub's own lookup, ``local_files_only``: nothing is downloaded)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True))
    except HFValidationError as exc:
        raise ReleaseError(f"{what} {repo_id!r}: not a Hub repo id ({str(exc).splitlines()[0]})") from exc
    except (LocalEntryNotFoundError, OSError) as exc:
        at = f"@{revision[:12]}" if revision else ""
        option = "--source" if what == "base model" else what
        raise ReleaseError(
            f"{what} {repo_id}{at} is not in the local Hugging Face cache (HF_HOME); download it first, e.g. "
            f"'hf download {repo_id}{f' --revision {revision}' if revision else ''}', or pass {option} DIR"
        ) from exc


def resolve_checkpoint(spec: str | Path, what: str, default_revision: str | None = None) -> Path:
    """A checkpoint named on the command line: an existing folder, or ``org/name[@revision]`` in the local Hugging
    Face cache."""
    path = Path(spec)
    if path.is_dir():
        return path
    match = HUB_ID.match(str(spec))
    if match is None:
        raise ReleaseError(f"{what} {spec}: no such folder, and not a Hub id (org/name[@revision]); pass a "
                           "checkpoint folder or the id of a checkpoint in the local Hugging Face cache")
    return from_cache(match["repo"], match["revision"] or default_revision, what)


def resolve_source(release: ReleaseConfig, source: Path | str | None) -> Path:
    """``--source``, else ``$RELEASE_SOURCE``, else the local Hugging Face cache at the pinned revision.

    ``--source`` is a folder or a Hub id (``org/name[@revision]``; without a revision, the release's base revision
    for its base model, ``main`` for another repo) looked up in the cache. Nothing is downloaded: a checkpoint
    missing from the cache is an error that says how to provide it.
    """
    if source is None and os.environ.get(SOURCE_ENV):
        source = os.environ[SOURCE_ENV]
    if source is None:
        folder = from_cache(release.base_model, release.base_revision, "base model")
    else:
        match = HUB_ID.match(str(source))
        default = release.base_revision if match and match["repo"] == release.base_model else None
        if not Path(source).is_dir() and match is None:
            raise ReleaseError(
                f"source directory {source} does not exist; pass --source DIR (or set {SOURCE_ENV}) to a checkpoint "
                "folder, e.g. one written by 'release fixture tiny --out DIR', or a Hub id in the local cache"
            )
        folder = resolve_checkpoint(source, "--source", default)
    if not (folder / "model_index.json").is_file():
        raise ReleaseError(f"{folder}: no model_index.json; --source must be a diffusers pipeline folder")
    return folder


INPUTS = ".release-inputs.json"  # in DIST: where its builds' source and observations are on this machine
OBSERVATIONS_ENV = "RELEASE_OBSERVATIONS"


def remember_inputs(dist: Path, source: Path, observations: Path) -> None:
    """Record in ``dist`` the source folder and observation set its builds are made from, so that verify, eval and
    campaign on that dist find them without the options again. Local paths: the file is in no repo folder, so it
    is never pushed."""
    write_json(dist / INPUTS, {"source": str(source.resolve()), "observations": str(observations.resolve())})


def recalled_inputs(dist: Path, source: str | Path | None, observations: Path | None
                    ) -> tuple[str | Path | None, Path | None]:
    """``--source`` and ``--observations`` as given, else their environment variables, else what the builds of
    ``dist`` were made from (:func:`remember_inputs`), else None (the caller's default). A recorded folder that is
    gone is passed over."""
    recorded = read_json(dist / INPUTS, "inputs", "release build") if (dist / INPUTS).is_file() else {}
    folders = {key: Path(value) for key, value in recorded.items() if isinstance(value, str) and value
               and Path(value).is_dir()}
    if source is None and not os.environ.get(SOURCE_ENV) and "source" in folders:
        source = folders["source"]
    if observations is None and os.environ.get(OBSERVATIONS_ENV):
        observations = Path(os.environ[OBSERVATIONS_ENV])
    if observations is None and "observations" in folders:
        observations = folders["observations"]
    return source, observations


@dataclass(frozen=True)
class Revision:
    """Which source a build was made from: ``origin`` says how ``revision`` is known."""

    revision: str
    origin: Literal["fixture", "hub cache", "hf download", "content hash"]
    repo: str | None = None  # the Hub repo, where the origin names it

    @property
    def is_commit(self) -> bool:
        """A Hub commit, which can be held against the release's ``base_revision``."""
        return self.origin in ("hub cache", "hf download")


def _download_commit(folder: Path) -> str | None:
    """The commit recorded by ``hf download --local-dir`` in ``.cache/huggingface/download/*.metadata`` (first line
    of each file). Read directly: huggingface_hub's ``read_download_metadata`` takes a lock file in the folder and
    deletes metadata it cannot parse, and a source folder is only read."""
    metadata = sorted((folder / ".cache" / "huggingface" / "download").rglob("*.metadata"))
    commits = {}
    for path in metadata:
        try:
            commits[path] = path.read_text(encoding="utf-8").splitlines()[0].strip()
        except (OSError, UnicodeDecodeError, IndexError) as exc:
            raise ReleaseError(f"{path}: unreadable download metadata ({exc}); download the checkpoint again") from exc
    found = sorted(set(commits.values()))
    if len(found) > 1:
        raise ReleaseError(f"{folder}: files of {len(found)} different commits ({', '.join(c[:12] for c in found)}, "
                           ".cache/huggingface/download); download the checkpoint again at one revision")
    if found and not re.fullmatch(r"[0-9a-f]{40}", found[0]):
        raise ReleaseError(f"{metadata[0]}: {found[0]!r} is not a commit hash; download the checkpoint again")
    return found[0] if found else None


def source_revision(source: Path) -> str:
    return source_identity(source).revision


def source_identity(source: Path) -> Revision:
    """The cache snapshot's commit, the fixture's recorded revision, the commit ``hf download --local-dir``
    recorded, or else a content hash of the folder. A snapshot's commit comes first: a ``fixture.json`` inside a
    Hub snapshot is a file of that repo, not a record of this tool's fixture."""
    if source.parent.name == "snapshots" and source.parent.parent.name.startswith("models--"):
        repo = source.parent.parent.name.removeprefix("models--").replace("--", "/")
        return Revision(source.name, "hub cache", repo)
    fixture = source / "fixture.json"
    if fixture.is_file():
        doc = read_json(fixture, "the tiny fixture's record", f"release fixture tiny --out {source.parent}",
                        ("revision",))
        return Revision(str(doc["revision"]), "fixture")
    commit = _download_commit(source)
    if commit is not None:
        return Revision(commit, "hf download")
    return Revision(content_revision(source), "content hash")


def check_revision(release: ReleaseConfig, identity: Revision, allow: bool) -> bool:
    """Whether the source's commit differs from the release's ``base_revision``; an error unless ``allow``. Sources
    without a Hub commit (the fixture, a plain folder) are not compared."""
    mismatch = identity.is_commit and identity.revision != release.base_revision
    if mismatch and not allow:
        raise ReleaseError(
            f"the source is {identity.repo or release.base_model} at commit {identity.revision[:12]} "
            f"({identity.origin}), builds/release.yaml pins base_revision {release.base_revision[:12]}; use that "
            "revision, change base_revision, or pass --allow-revision-mismatch (the cards then say so)")
    return mismatch


def read_headers(folder: Path, index_name: str) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{tensor: (dtype, shape, file)}`` of a sharded safetensors folder, read from the headers only."""
    from safetensors import safe_open

    index_path = folder / index_name
    if index_path.is_file():
        weight_map = read_json(index_path, "safetensors index", "hf download", ("weight_map",))["weight_map"]
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ReleaseError(f"{index_path}: 'weight_map' must map tensor names to shard file names; re-download "
                               "the checkpoint")
        files = sorted(set(weight_map.values()))
        outside = [name for name in files if name in ("", ".", "..") or Path(name).name != name]
        if outside:
            raise ReleaseError(f"{index_path}: names shard {outside[0]!r}, which is not a file beside the index; "
                               "an index names its shards by file name only: re-download the checkpoint")
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


def source_license(source: Path) -> dict[str, str] | None:
    """The source's ``LICENSE`` (beside ``model_index.json``) as its exact text and sha256, for the cards to copy
    verbatim; None when the source has none. A link or a file that is not UTF-8 text is a one-line error."""
    path = source / "LICENSE"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise ReleaseError(f"{path}: not a regular file; put the license text itself there")
    if not path.exists():
        return None
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{path}: not UTF-8 text; save the license as UTF-8") from exc
    return {"file": "LICENSE", "sha256": hashlib.sha256(data).hexdigest(), "text": text}


def check_architecture(source: Path) -> dict[str, object]:
    """Check the source as a whole: its files are regular files (links only into a Hugging Face cache's blobs; they
    are copied into every build), and the transformer's tensors have the shapes and dtypes of
    ``Cosmos3OmniTransformer`` built from its config. Return the config."""
    from accelerate import init_empty_weights
    from diffusers import Cosmos3OmniTransformer

    blobs = source.parent.parent / "blobs" if source.parent.name == "snapshots" else None
    plain_files(source, "the source", links_into=blobs)
    cfg_path = source / "transformer" / "config.json"
    if not cfg_path.is_file():
        raise ReleaseError(f"{cfg_path}: missing; the source is not a Cosmos3 diffusers checkpoint")
    config = read_json(cfg_path, "transformer config", "hf download")
    try:  # nothing allocated, buffers included: a config's sizes are only compared with the files' below
        with init_empty_weights(include_buffers=True):
            model = Cosmos3OmniTransformer.from_config(config)
    except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
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
    fp32 = model._keep_in_fp32_modules or []
    for key in sorted(expected):  # what diffusers loads in bfloat16 keeps its fp32 modules in fp32
        dtype = "F32" if any(m in key.split(".") for m in fp32) else "BF16"
        if found[key][0] != dtype:
            raise ReleaseError(f"{source}/transformer/{found[key][2]}: tensor {key} is {found[key][0]}, the BF16 "
                               f"checkpoint has it {dtype}; re-download the source")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise ReleaseError(f"{source}/transformer/{found[extra[0]][2]}: tensor {extra[0]} is not in the architecture")
    return config


def load_transformer(folder: Path | str) -> Any:
    """The ``Cosmos3OmniTransformer`` in ``folder`` (a source's or a build's ``transformer``), bfloat16, with torch's
    default dtype as it was even when the load raises."""
    import torch
    from diffusers import Cosmos3OmniTransformer

    from release.core.device import default_dtype_kept

    with default_dtype_kept():
        return Cosmos3OmniTransformer.from_pretrained(str(folder), dtype=torch.bfloat16)


def check_finite(model: torch.nn.Module, source: Path) -> None:
    """A corrupt source fails here, naming the tensor, before a rollout or calibration turns NaN into noise."""
    import torch

    from release.core.memory import state_dict

    weights = state_dict(model)  # offloaded layers (a GPU memory cap) from their CPU copies
    for name, _ in model.named_parameters():
        if not torch.isfinite(weights[name]).all():
            raise ReleaseError(f"{source}/transformer: tensor {name} holds NaN or Inf; the source is corrupt")


RESIDENT = 3  # the source stays on the GPU when its free memory holds this many times the source (see SourceModel)
_DTYPES = {"BF16": "bfloat16", "F32": "float32", "F16": "float16", "F8_E4M3": "float8_e4m3fn"}


def _file_dtypes(folder: Path, state: dict[str, Any]) -> bool:
    """Whether every tensor of ``state`` has the dtype and shape the source's files give it."""
    headers = read_headers(folder / "transformer", "diffusion_pytorch_model.safetensors.index.json")
    return headers.keys() == state.keys() and all(
        str(state[k].dtype).removeprefix("torch.") == _DTYPES.get(d) and tuple(state[k].shape) == shape
        for k, (d, shape, _) in headers.items())


class SourceModel:
    """The BF16 source transformer, read from disk once and instantiated afresh for each build, so that ``release
    build --all`` loads the source one time however many builds it makes.

    On a GPU with room for it (``device`` cuda, no memory cap, free memory at least ``RESIDENT`` times the source:
    the source, a build's model and its working memory) the source's tensors stay on the GPU, where each build's copy
    is a device copy and verification reads them (:class:`release.check.verify.Verifier`); otherwise they stay in CPU
    memory (mapped from the files), copied to the GPU for each build: 30 GB from the page cache, about 5 s a build at
    the Nano's size (BENCHMARKS.md).

    ``loaded``: the source transformer as the calibration capture loaded it (on the GPU), taken as it is where the
    source stays on the GPU and each of its tensors has the file's dtype (a byte copy of the file, as reading it
    again would give): 30 GB not read a second time."""

    def __init__(self, folder: Path, device: str = "cpu", loaded: Any = None) -> None:
        import torch

        from release.core.memory import cap, is_placed

        self.folder = folder
        if loaded is not None and (is_placed(loaded) or not _file_dtypes(folder, loaded.state_dict())):
            loaded = None
        size = sum(p.stat().st_size for p in (folder / "transformer").glob("*.safetensors"))
        held = size if loaded is not None else 0  # what the loaded transformer already takes of the GPU
        self.resident = device == "cuda" and cap() is None and torch.cuda.mem_get_info()[0] + held >= RESIDENT * size
        model = loaded if loaded is not None and self.resident else \
            load_transformer(folder / "transformer")
        # the weights' finiteness: the capture checked the policy's; else where the first build places them
        self.checked = model is loaded
        self.config = dict(model.config)
        self.state = {k: v.detach() for k, v in model.state_dict().items()}  # time_embedder stays fp32
        if self.resident:
            self.state = {k: v.to(device) for k, v in self.state.items()}

    def instantiate(self, device: str, weights: dict[str, Any] | None = None, bounded: bool = True,
                    share: bool = False) -> Any:
        """A new ``Cosmos3OmniTransformer`` on ``device`` with its own copy of the source weights, or of ``weights``
        (a state dict holding at least the source's tensors; ``share``: its tensors themselves where they already
        are on ``device``, no copy). ``bounded``: within the GPU memory cap (:func:`release.core.memory.place`)."""
        from accelerate import init_empty_weights
        from diffusers import Cosmos3OmniTransformer

        from release.core.memory import cap, place

        state = self.state if weights is None else {k: weights[k] for k in self.state}
        home = "cpu" if bounded and cap() is not None else device  # under a cap, ``place`` moves what fits
        with init_empty_weights():
            model = Cosmos3OmniTransformer.from_config(self.config)
        copy = weights is None or not share
        model.load_state_dict({k: v.to(home, copy=copy) for k, v in state.items()}, strict=True, assign=True)
        model = (place(model, device) if bounded else model.to(device)).eval()
        if weights is None and not self.checked:
            check_finite(model, self.folder)
            self.checked = True
        return model
