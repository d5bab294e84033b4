"""DROID observations on disk.

Format ``release-droid-obs/1`` (a folder; real DROID frames can be written in it too)::

    index.json            {"format": "release-droid-obs/1", "count": N, "cameras": [...], "seed": ...}
    observations.jsonl    one JSON object per line:
        obs_id       int, unique
        episode_id   str, DROID episode identifier
        lab          str, the DROID lab that recorded it (decides calibration vs held-out split)
        instruction  str, the language instruction
        state        8 floats: 7 joint positions (rad) + gripper position in [0, 1] (1 = closed)
        images       {camera: path of an RGB PNG of index.json's image_size (default 640x360), relative to the
                      folder and inside it}
    images/<obs_id>_<camera>.png
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.core.config import builds_dir
from release.core.errors import ReleaseError
from release.core.io import atomic_write, parse_json, sha256_file, write_json

FORMAT = "release-droid-obs/1"
CAMERAS = ["exterior_image_1_left", "exterior_image_2_left", "wrist_image_left"]
WIDTH, HEIGHT = 640, 360
CALIBRATION_LABS = ["TRI", "CLVR", "IRIS", "ILIAD", "RAD"]
HELDOUT_LABS = ["AUTOLab", "IPRL", "PennPAL", "RPL"]
LABS = CALIBRATION_LABS + HELDOUT_LABS
_VERBS = ["put", "move", "pick up", "place", "push", "open", "close", "wipe"]
_OBJECTS = ["the marker", "the cup", "the sponge", "the lid", "the block", "the towel", "the spoon", "the drawer"]
_PLACES = ["in the bowl", "on the plate", "to the left", "into the drawer", "next to the mug", "off the table"]
# Franka joint ranges (rad), used to draw plausible joint states.
_Q_LOW = np.array([-2.8, -1.7, -2.8, -3.0, -2.8, 0.0, -2.8])
_Q_HIGH = np.array([2.8, 1.7, 2.8, -0.1, 2.8, 3.7, 2.8])


@dataclass(frozen=True)
class Observation:
    obs_id: int
    episode_id: str
    lab: str
    instruction: str
    state: tuple[float, ...]
    images: dict[str, Path]

    def concat_view(self) -> np.ndarray:
        """The three cameras side by side (uint8 [360, 1920, 3]), as the policy sees them."""
        from PIL import Image

        return np.concatenate([np.asarray(Image.open(self.images[c]).convert("RGB")) for c in CAMERAS], axis=1)

    def frame(self) -> Any:
        """:meth:`concat_view` as the PIL image a rollout hands the pipeline, decoded once per process while its
        PNG files are unchanged: a campaign rolls every observation out once per build, and the three PNG decodes
        were 6 ms of a tiny rollout's 90 ms."""
        stats = tuple((str(self.images[c]), *_stamp(self.images[c])) for c in CAMERAS)
        return _frame(stats)


def _stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@functools.lru_cache(maxsize=256)  # a campaign's observation set: 48 at the shipped sizes (2 MB a frame)
def _frame(stats: tuple[tuple[str, int, int], ...]) -> Any:
    from PIL import Image

    return Image.fromarray(np.concatenate([np.asarray(Image.open(path).convert("RGB")) for path, _, _ in stats],
                                          axis=1))


def instructions(rng: np.random.Generator, n: int) -> list[str]:
    return [f"{_VERBS[rng.integers(len(_VERBS))]} {_OBJECTS[rng.integers(len(_OBJECTS))]} "
            f"{_PLACES[rng.integers(len(_PLACES))]}" for _ in range(n)]


def _image(rng: np.random.Generator) -> np.ndarray:
    """A smooth synthetic camera frame: low-resolution noise upsampled, plus a bright 'object'."""
    coarse = rng.uniform(0, 255, size=(9, 16, 3))
    img = np.kron(coarse, np.ones((HEIGHT // 9, WIDTH // 16, 1)))
    y, x = rng.integers(40, HEIGHT - 40), rng.integers(40, WIDTH - 40)
    img[y - 20 : y + 20, x - 20 : x + 20] = rng.uniform(200, 255, size=3)
    return img.astype(np.uint8)


def write_observations(out: Path, n: int, seed: int, labs: list[str], heldout: int = 16) -> None:
    """Write ``n`` observations from the calibration labs plus ``heldout`` from the held-out labs."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    cal = [lab for lab in labs if lab in CALIBRATION_LABS]
    held = [lab for lab in labs if lab in HELDOUT_LABS]
    lab_of = [cal[i % len(cal)] for i in range(n)] + [held[i % len(held)] for i in range(heldout)]
    lines = []
    for i, (lab, text) in enumerate(zip(lab_of, instructions(rng, len(lab_of)), strict=True)):
        q = rng.uniform(_Q_LOW, _Q_HIGH)
        state = [round(float(v), 6) for v in q] + [float(rng.integers(0, 2))]
        images = {}
        for cam in CAMERAS:
            rel = f"images/{i:04d}_{cam}.png"
            Image.fromarray(_image(rng)).save(out / rel, format="PNG")
            images[cam] = rel
        episode = f"{lab}+{rng.integers(10**7):07d}+2023-0{1 + i % 9}-{10 + i % 18:02d}"
        lines.append(json.dumps({"obs_id": i, "episode_id": episode, "lab": lab, "instruction": text,
                                 "state": state, "images": images}, sort_keys=True))
    atomic_write(out / "observations.jsonl", "\n".join(lines) + "\n")
    states = np.array([json.loads(line)["state"] for line in lines])
    write_json(out / "action_stats.json", {
        "sigma": [round(float(s), 6) for s in states.std(axis=0)],
        "note": "per-dimension std of the synthetic joint positions and gripper states of this observation set",
    })
    write_json(out / "index.json", {"format": FORMAT, "count": len(lines), "cameras": CAMERAS, "seed": seed})


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _read_index(folder: Path) -> dict[str, Any]:
    index = folder / "index.json"
    if not index.is_file():
        raise ReleaseError(f"{folder}: not an observation set (no index.json); create one with 'release fixture tiny'")
    meta = parse_json(index.read_bytes(), str(index),
                      f'rewrite it as {{"format": "{FORMAT}", "count": N, "cameras": [...]}}')
    if not isinstance(meta, dict):
        raise ReleaseError(f"{index}: expected a JSON object with 'format' and 'count', got {type(meta).__name__}")
    if meta.get("format") != FORMAT:
        raise ReleaseError(f"{index}: field 'format' is {meta.get('format')!r}; expected {FORMAT!r}")
    count = meta.get("count")
    if type(count) is not int or count < 0:
        raise ReleaseError(f"{index}: field 'count' must be the number of observations (lines of observations.jsonl), "
                           f"got {_short(count)}")
    size = meta.get("image_size", [WIDTH, HEIGHT])
    if not (isinstance(size, list) and len(size) == 2 and all(type(v) is int and v > 0 for v in size)):
        raise ReleaseError(f"{index}: field 'image_size' must be [width, height] in pixels, got {_short(size)}")
    return meta


def _check_image(path: Path, where: str, camera: str, size: tuple[int, int]) -> None:
    """A PNG of the set's size (640x360 unless index.json says otherwise) whose every chunk is intact, checked
    without inflating its pixels: PNG's chunk CRCs cover all of a file's data, so PIL's ``verify`` finds a truncated
    or damaged file here and not mid-rollout. Every PNG mode converts to RGB, so the format and the size are all that
    is left to check."""
    from PIL import Image

    fix = f"replace it with a {size[0]}x{size[1]} RGB PNG"
    if not path.is_file():
        raise ReleaseError(f"{where}: camera '{camera}': image {path} is missing or not a file; {fix} or correct "
                           "the path")
    try:
        with Image.open(path) as img:
            fmt, found = img.format, img.size
            img.verify()
    except Exception as exc:  # any failure of the decoder on this file: it cannot be read
        reason = (str(exc).splitlines() or [""])[0]
        raise ReleaseError(f"{where}: camera '{camera}': image {path} cannot be decoded ({type(exc).__name__}: "
                           f"{reason}); {fix}") from exc
    if fmt != "PNG":
        raise ReleaseError(f"{where}: camera '{camera}': image {path} is {fmt}, not PNG; {fix}")
    if found != size:
        raise ReleaseError(f"{where}: camera '{camera}': image {path} is {found[0]}x{found[1]}; {fix}")


MAX_OBS_ID = 2**31 - 1  # an id seeds the observation's noise (with the policy's seed) and names its cache files
# A DROID instruction is a sentence (the longest about 300 characters); a 10 MB one ran a build for 18 minutes.
MAX_INSTRUCTION = 2_000


def check_instruction(text: str, where: str) -> None:
    """An instruction the tokenizer is meant for: at most ``MAX_INSTRUCTION`` characters."""
    if len(text) > MAX_INSTRUCTION:
        raise ReleaseError(f"{where}: field 'instruction' is {len(text):,} characters long; an instruction is a task "
                           f"description of at most {MAX_INSTRUCTION:,}")


def check_state(state: Any, where: str) -> None:
    """A robot state: 8 finite numbers, 7 joint positions in rad and the gripper in [0, 1]."""
    if not isinstance(state, list) or len(state) != 8 or not all(type(v) in (int, float) for v in state):
        raise ReleaseError(f"{where}: field 'state' must be 8 numbers (7 joint positions in rad + gripper in "
                           f"[0, 1]), got {_short(state)}")
    if not all(math.isfinite(v) for v in state):
        raise ReleaseError(f"{where}: field 'state' holds NaN or Infinity; give 8 finite numbers")
    if not 0 <= state[7] <= 1:
        raise ReleaseError(f"{where}: field 'state': the gripper (last value) is {state[7]}; it must be in [0, 1]")


def _record(rec: Any, where: str, folder: Path, root: Path, size: tuple[int, int]) -> Observation:
    """One line of observations.jsonl, every field checked; image paths must stay inside the set's folder."""
    if not isinstance(rec, dict):
        raise ReleaseError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    for key in ("obs_id", "episode_id", "lab", "instruction", "state", "images"):
        if key not in rec:
            raise ReleaseError(f"{where}: field '{key}' is missing; every line needs obs_id, episode_id, lab, "
                               "instruction, state and images")
    if type(rec["obs_id"]) is not int or not 0 <= rec["obs_id"] <= MAX_OBS_ID:
        raise ReleaseError(f"{where}: field 'obs_id' must be an integer from 0 to {MAX_OBS_ID}, got "
                           f"{_short(rec['obs_id'])}")
    for key in ("episode_id", "lab", "instruction"):
        if not isinstance(rec[key], str):
            raise ReleaseError(f"{where}: field '{key}' must be a string, got {_short(rec[key])}")
    check_instruction(rec["instruction"], where)
    state = rec["state"]
    check_state(state, where)
    cameras = rec["images"]
    if not isinstance(cameras, dict):
        raise ReleaseError(f"{where}: field 'images' must map {', '.join(CAMERAS)} to PNG paths")
    images = {}
    for cam in CAMERAS:
        rel = cameras.get(cam)
        if not isinstance(rel, str) or not rel:
            raise ReleaseError(f"{where}: camera '{cam}': no image path in field 'images'; add it (relative to "
                               f"{folder})")
        path = (folder / rel).resolve()
        if not path.is_relative_to(root):
            raise ReleaseError(f"{where}: camera '{cam}': image path {rel!r} leads outside the observation set "
                               f"{folder}; use a path inside it, relative to it")
        _check_image(path, where, cam, size)
        images[cam] = path
    return Observation(rec["obs_id"], rec["episode_id"], rec["lab"], rec["instruction"],
                       tuple(float(v) for v in state), images)


def load_observations(folder: Path) -> list[Observation]:
    """Every observation of the set, validated before any model runs: the index, each line's fields, unique ids,
    and each image (inside the folder, a readable PNG of the set's size). Any fault is a one-line error naming the
    file and line."""
    meta = _read_index(folder)
    size = tuple(meta.get("image_size", [WIDTH, HEIGHT]))
    path = folder / "observations.jsonl"
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; an observation set holds one JSON object per observation in it")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ReleaseError(f"{path}: not UTF-8 text ({exc}); write one JSON object per line") from exc
    root = folder.resolve()
    obs: list[Observation] = []
    line_of: dict[int, int] = {}
    for lineno, line in enumerate(lines, start=1):
        where = f"{path}:{lineno}"
        if not line.strip():
            raise ReleaseError(f"{where}: empty line; remove it (one JSON object per line)")
        rec = parse_json(line, where, "one JSON object per line")
        o = _record(rec, where, folder, root, size)
        if o.obs_id in line_of:
            raise ReleaseError(f"{where}: obs_id {o.obs_id} is also on line {line_of[o.obs_id]}; every obs_id must "
                               "be unique")
        line_of[o.obs_id] = lineno
        obs.append(o)
    if meta["count"] != len(obs):
        raise ReleaseError(f"{folder / 'index.json'}: field 'count' is {meta['count']} but {path} holds {len(obs)} "
                           "observations; make them equal")
    return obs


def action_sigma(folder: Path, name: str, dims: int) -> np.ndarray:
    """The per-dimension action std the metrics normalise by (``action_stats`` in builds/release.yaml)."""
    path = folder / name
    if not path.resolve().is_relative_to(folder.resolve()):
        raise ReleaseError(f"{builds_dir() / 'release.yaml'}: field 'action_stats' ({name!r}) leads outside the "
                           f"observation set {folder}; name a file inside it")
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; the metrics need the per-dimension action sigma (field 'sigma')")
    doc = parse_json(path.read_bytes(), str(path), f"write {{\"sigma\": [{dims} numbers]}}")
    try:
        sigma = np.array(doc["sigma"], dtype=np.float64)
    except (KeyError, ValueError, TypeError) as exc:
        raise ReleaseError(f"{path}: field 'sigma' must be a list of {dims} numbers") from exc
    if sigma.shape != (dims,) or not (np.isfinite(sigma) & (sigma > 0)).all():
        raise ReleaseError(f"{path}: field 'sigma' must be {dims} positive numbers, got {sigma.tolist()}")
    return sigma


def dataset_id(folder: Path) -> str | None:
    """The Hub id of the dataset an observation set was imported from (``source.repo_id`` of its index, written by
    ``release observations import-lerobot``), or None (generated, or a dataset the import could not name)."""
    source = _read_index(folder).get("source")
    repo_id = source.get("repo_id") if isinstance(source, dict) else None
    return repo_id if isinstance(repo_id, str) else None


def observation_set_digest(folder: Path) -> str:
    """The set's identity in cache keys: the sha256 over every file's path and content."""
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(sha256_file(p).encode())
    return h.hexdigest()


def split(obs: list[Observation], labs: list[str]) -> list[Observation]:
    return [o for o in obs if o.lab in labs]
