"""DROID observations on disk.

Format ``release-droid-obs/1`` (a folder; real DROID frames can be written in it too)::

    index.json            {"format": "release-droid-obs/1", "count": N, "cameras": [...], "seed": ...}
    observations.jsonl    one JSON object per line:
        obs_id       int, unique
        episode_id   str, DROID episode identifier
        lab          str, the DROID lab that recorded it (decides calibration vs held-out split)
        instruction  str, the language instruction
        state        8 floats: 7 joint positions (rad) + gripper position in [0, 1] (1 = closed)
        images       {camera: relative path of a 640x360 RGB PNG}
    images/<obs_id>_<camera>.png
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from release import ReleaseError
from release.io import atomic_write, write_json

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


def load_observations(folder: Path) -> list[Observation]:
    index = folder / "index.json"
    if not index.is_file():
        raise ReleaseError(f"{folder}: not an observation set (no index.json); create one with 'release fixture tiny'")
    meta = json.loads(index.read_text())
    if meta.get("format") != FORMAT:
        raise ReleaseError(f"{index}: field 'format' is {meta.get('format')!r}; expected {FORMAT!r}")
    obs = []
    path = folder / "observations.jsonl"
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            rec = json.loads(line)
            state = tuple(float(v) for v in rec["state"])
            if len(state) != 8:
                raise ValueError(f"'state' has {len(state)} values; expected 8 (7 joints + gripper)")
            images = {c: folder / rec["images"][c] for c in CAMERAS}
            obs.append(Observation(int(rec["obs_id"]), str(rec["episode_id"]), str(rec["lab"]),
                                   str(rec["instruction"]), state, images))
        except (KeyError, ValueError, TypeError) as exc:
            raise ReleaseError(f"{path}:{lineno}: bad observation record: {exc}") from exc
    return obs


def action_sigma(folder: Path, name: str, dims: int) -> np.ndarray:
    """The per-dimension action std the metrics normalise by (``action_stats`` in builds/release.yaml)."""
    path = folder / name
    try:
        sigma = np.array(json.loads(path.read_text())["sigma"], dtype=np.float64)
    except FileNotFoundError as exc:
        raise ReleaseError(f"{path}: missing; the metrics need the per-dimension action sigma (field 'sigma')") from exc
    except (KeyError, ValueError, TypeError) as exc:
        raise ReleaseError(f"{path}: field 'sigma' must be a list of {dims} numbers") from exc
    if sigma.shape != (dims,) or not (sigma > 0).all():
        raise ReleaseError(f"{path}: field 'sigma' must be {dims} positive numbers, got {sigma.tolist()}")
    return sigma


def split(obs: list[Observation], labs: list[str]) -> list[Observation]:
    return [o for o in obs if o.lab in labs]
