"""``release observations import-lerobot``: DROID frames of a local LeRobot dataset as an observation set.

Both on-disk versions of the LeRobot format are read (layouts as lerobot's own code writes them):

* ``v2.1``: ``meta/info.json``, ``meta/episodes.jsonl``, ``meta/episodes_stats.jsonl``; one parquet per episode
  (``data_path`` with ``episode_chunk`` and ``episode_index``), one mp4 per episode and camera (``video_path``); a
  frame's time in its video is its ``timestamp``.
* ``v3.0``: ``meta/info.json``, ``meta/episodes/chunk-*/file-*.parquet``, ``meta/stats.json``; parquet files of many
  episodes (``data_path`` with ``chunk_index``, ``file_index``) and mp4 files that concatenate episodes per camera
  (``video_path`` with ``video_key``); a frame's time is its episode's ``videos/<camera>/from_timestamp`` plus its
  ``timestamp``.

DROID as lerobot ports it (``examples/port_datasets/port_droid.py``; ``lerobot/droid_1.0.1``, 15 fps): the cameras
``observation.images.exterior_1_left``, ``exterior_2_left`` and ``wrist_left`` (180 x 320), ``observation.state``
(7 joint positions in rad and the gripper in [0, 1]), ``action`` (the next joint positions and gripper: what the
policy predicts), ``language_instruction`` (``_2``, ``_3``) and ``building``, the lab that recorded the episode.

Other LeRobot datasets of those cameras and state may lack DROID's two fields: the instruction then comes from LeRobot's
standard task (a per-frame ``task``, or the frame's ``task_index`` in ``meta/tasks.jsonl`` (v2.1: one
``{"task_index": i, "task": "..."}`` a line) or ``meta/tasks.parquet`` (v3.0: indexed by the task string, with a
``task_index`` column), as lerobot writes them), and ``--lab-field`` names the per-frame or per-episode column that
says which lab recorded an episode.

The dependency: pyarrow (through pandas) for the tables and PyAV for the videos, the libraries lerobot itself reads
them with. lerobot was not taken: it pins torch below 2.12 and reads only v3.0 since 0.4 (v2.1 needs 0.3.3, which
pulls in diffusers, wandb and rerun); neither was the standalone ``lerobot-dataset`` (Python 3.12+, torchvision,
torchcodec and OpenCV; v3.0 only). The formats are a few tables and a path template each.

Frames are decoded exactly: the video is sought to the last key frame before the frame's time and decoded forward to
the frame whose presentation time is nearest to it, which must lie within half a frame period; anything else is an
error, never a neighbouring frame.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from release.core.errors import ReleaseError
from release.core.io import atomic_dir, output_folder, parse_json, write_json
from release.inputs.observations import CAMERAS, FORMAT, check_instruction, check_state

VERSIONS = ("v2.1", "v3.0")
CAMERA_KEYS = {"observation.images.exterior_1_left": "exterior_image_1_left",
               "observation.images.exterior_2_left": "exterior_image_2_left",
               "observation.images.wrist_left": "wrist_image_left"}
STATE, ACTION, LAB = "observation.state", "action", "building"
INSTRUCTIONS = ("language_instruction", "language_instruction_2", "language_instruction_3")
TASK, TASK_INDEX = "task", "task_index"
TASKS = {"v2.1": "meta/tasks.jsonl", "v3.0": "meta/tasks.parquet"}
LOOKED_FOR = ("language_instruction (_2, _3), task, or task_index with meta/tasks.jsonl (v2.1) or meta/tasks.parquet "
              "(v3.0)")
EXTRA = "lerobot"


def _modules() -> tuple[Any, Any]:
    try:
        import av
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise ReleaseError(f"import-lerobot needs pyarrow and PyAV, the '{EXTRA}' extra: pip install "
                           f"'release[{EXTRA}]'") from exc
    return pq, av


@dataclass(frozen=True)
class Dataset:
    root: Path
    version: str
    info: dict[str, Any]
    episodes: Any  # pandas DataFrame, one row per episode (v3.0: with its file locations and video offsets)

    @property
    def fps(self) -> float:
        return float(self.info["fps"])


def _json(path: Path) -> Any:
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; not a LeRobot dataset (expected meta/info.json and its tables)")
    return parse_json(path.read_bytes(), str(path), "the dataset is damaged")


def _table(path: Path, columns: list[str] | None = None, schema: bool = False) -> Any:
    """A parquet file's table (or its schema); a file pyarrow cannot read is a one-line error naming it."""
    pq, _ = _modules()
    try:
        return pq.read_schema(path) if schema else pq.read_table(path, columns=columns).to_pandas()
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError, its IO errors OSErrors
        raise ReleaseError(f"{path}: not a readable parquet table ({str(exc).splitlines()[0]}); the dataset is "
                           "damaged: download it again") from exc


# The fields each path template of info.json may name, by codebase version (lerobot's own templates use no other)
PATH_FIELDS = {("v2.1", "data_path"): {"episode_chunk", "episode_index"},
               ("v2.1", "video_path"): {"episode_chunk", "episode_index", "video_key"},
               ("v3.0", "data_path"): {"chunk_index", "file_index"},
               ("v3.0", "video_path"): {"chunk_index", "file_index", "video_key"}}
_WIDTH = re.compile(r"0?[1-9]?d?")  # a zero-padded width of at most 9 digits: what lerobot writes (03d, 06d)


def _check_template(info_path: Path, version: str, key: str, template: object) -> None:
    """``template`` formats only the documented fields, plainly: no attribute or index access, no conversion, a
    width of at most 9 (a width of 10^12 would build a terabyte string)."""
    allowed = PATH_FIELDS[(version, key)]
    if not isinstance(template, str):
        raise ReleaseError(f"{info_path}: field {key!r} must be a path template (a string)")
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ReleaseError(f"{info_path}: field {key!r} is not a format string ({exc})") from exc
    for _, name, spec, conversion in parts:
        if name is None:
            continue
        if name not in allowed or conversion or not _WIDTH.fullmatch(spec or ""):
            raise ReleaseError(f"{info_path}: field {key!r} formats {{{name}{'!' + conversion if conversion else ''}"
                               f"{':' + spec if spec else ''}}}; a {version} template may name only "
                               f"{', '.join(sorted(allowed))}, each as {{name}} or {{name:0Nd}}")


def _inside(ds: Dataset, key: str, **fields: object) -> Path:
    """The dataset file that the template ``key`` names for ``fields``; one outside the dataset is refused."""
    rel = Path(ds.info[key].format(**fields))
    path = ds.root / rel
    if rel.is_absolute() or ".." in rel.parts:
        raise ReleaseError(f"{ds.root / 'meta' / 'info.json'}: field {key!r} names {rel}, outside the dataset; "
                           "the files must be inside the dataset folder")
    return path


def _jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; a LeRobot v2.1 dataset lists its episodes there")
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            rows.append(parse_json(line, f"{path}:{lineno}", "the dataset is damaged"))
    return rows


def open_dataset(root: Path) -> Dataset:
    """The dataset's metadata, checked: a known codebase version and every DROID feature the import reads."""
    import pandas as pd

    _modules()  # the extra's absence said first
    info_path = root / "meta" / "info.json"
    info = _json(info_path)
    version = info.get("codebase_version") if isinstance(info, dict) else None
    if version not in VERSIONS:
        raise ReleaseError(f"{info_path}: codebase_version {version!r} is not one this tool reads "
                           f"({', '.join(VERSIONS)}); convert the dataset with lerobot's converter")
    features = info.get("features", {})
    for key in CAMERA_KEYS:
        if key not in features:
            cameras = sorted(k for k, v in features.items() if isinstance(v, dict) and v.get("dtype") == "video")
            raise ReleaseError(f"{info_path}: camera {key!r} is missing (the dataset's cameras: "
                               f"{', '.join(cameras) or 'none'}); the policy needs DROID's three views")
        if features[key].get("dtype") != "video":
            raise ReleaseError(f"{info_path}: camera {key!r} is stored as {features[key].get('dtype')!r}; this tool "
                               "reads video cameras")
    if STATE not in features:
        raise ReleaseError(f"{info_path}: feature {STATE!r} is missing; a DROID port has it")
    if list(features[STATE].get("shape", [])) != [8]:
        raise ReleaseError(f"{info_path}: feature {STATE!r} has shape {features[STATE].get('shape')}; DROID's is [8] "
                           "(7 joint positions and the gripper)")
    for key in ("fps", "data_path", "video_path"):
        if key not in info:
            raise ReleaseError(f"{info_path}: field {key!r} is missing")
    fps = info["fps"]
    if isinstance(fps, bool) or not isinstance(fps, int | float) or not math.isfinite(fps) or fps <= 0:
        raise ReleaseError(f"{info_path}: field 'fps' is {fps!r}; it must be the frame rate, a positive number")
    for key in ("data_path", "video_path"):
        _check_template(info_path, version, key, info[key])
    if version == "v2.1":
        episodes = pd.DataFrame(_jsonl(root / "meta" / "episodes.jsonl"))
    else:
        files = sorted((root / "meta" / "episodes").glob("chunk-*/file-*.parquet"))
        if not files:
            raise ReleaseError(f"{root / 'meta' / 'episodes'}: no episode tables (chunk-*/file-*.parquet); the v3.0 "
                               "dataset is incomplete")
        episodes = pd.concat([_table(f) for f in files], ignore_index=True)
    if "episode_index" not in episodes:
        raise ReleaseError(f"{root / 'meta'}: the episode table has no 'episode_index'")
    return Dataset(root, version, info, episodes.sort_values("episode_index").reset_index(drop=True))


def _data_files(ds: Dataset) -> list[Path]:
    chunks = int(ds.info.get("chunks_size", 1000))
    if ds.version == "v2.1":
        paths = [_inside(ds, "data_path", episode_chunk=int(e) // chunks, episode_index=int(e))
                 for e in ds.episodes["episode_index"]]
    else:
        pairs = sorted({(int(c), int(f)) for c, f in zip(ds.episodes["data/chunk_index"],
                                                          ds.episodes["data/file_index"], strict=True)})
        paths = [_inside(ds, "data_path", chunk_index=c, file_index=f) for c, f in pairs]
    missing = next((p for p in paths if not p.is_file()), None)
    if missing is not None:
        raise ReleaseError(f"{missing}: missing; the episode table lists it")
    return paths


@dataclass(frozen=True)
class Frames:
    """Every frame's ``episode_index``, ``frame_index``, ``timestamp``, state, ``lab`` and ``instruction``, with the
    fields that gave the labs and instructions (``index.json`` records them)."""

    table: Any  # pandas DataFrame, sorted by episode and frame
    lab_field: str
    instruction_field: str


def _lab_level(ds: Dataset, field: str) -> str:
    """Where the lab column ``field`` is: ``frame`` (a feature of ``meta/info.json``) or ``episode`` (a column of the
    episode table); else an error that lists the string columns that could name labs instead."""
    features = ds.info.get("features", {})
    if field in features:
        return "frame"
    if field in ds.episodes.columns:
        return "episode"
    texts = (*INSTRUCTIONS, TASK)
    per_frame = [k for k, v in features.items() if isinstance(v, dict) and v.get("dtype") == "string"
                 and k not in texts]
    per_episode = [c for c in ds.episodes.columns if c not in texts
                   and ds.episodes[c].map(lambda v: isinstance(v, str)).all()]
    where = f"{ds.root / 'meta' / 'info.json'}: lab field {field!r} is neither a feature nor an episode column"
    if not per_frame and not per_episode:
        raise ReleaseError(f"{where}, and the dataset has no lab column at all (no other string column per frame or "
                           "per episode); the frames are drawn per lab: add a column that names each episode's lab "
                           "and pass it as --lab-field")
    raise ReleaseError(f"{where}; pass --lab-field with the column that names each episode's lab (string columns "
                       f"per frame: {', '.join(per_frame) or 'none'}; per episode: {', '.join(per_episode) or 'none'})")


def _tasks(ds: Dataset) -> dict[int, str]:
    """LeRobot's task table, ``task_index`` to task, from ``meta/tasks.jsonl`` (v2.1) or ``meta/tasks.parquet``
    (v3.0, which lerobot writes indexed by the task string with a ``task_index`` column)."""
    path = ds.root / TASKS[ds.version]
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; the frames' task_index refers to it")
    if ds.version == "v2.1":
        rows = _jsonl(path)
        if not all(isinstance(r, dict) and isinstance(r.get(TASK_INDEX), int) and isinstance(r.get(TASK), str)
                   for r in rows):
            raise ReleaseError(f"{path}: a line without an integer 'task_index' and a string 'task'; lerobot writes "
                               '{"task_index": i, "task": "..."} on each line')
        return {r[TASK_INDEX]: r[TASK] for r in rows}
    table = _table(path)
    texts = table[TASK] if TASK in table.columns else table.index
    if TASK_INDEX not in table.columns or not all(isinstance(t, str) for t in texts):
        raise ReleaseError(f"{path}: not a task table (lerobot indexes it by the task string, with a 'task_index' "
                           f"column; columns here: {', '.join(map(str, table.columns)) or 'none'})")
    return {int(i): str(t) for i, t in zip(table[TASK_INDEX], texts, strict=True)}


def _candidates(ds: Dataset, table: Any) -> Iterator[tuple[str, Any]]:
    """The instruction fields the frames have, in order of preference, each with every frame's text: DROID's
    ``language_instruction`` (the first non-empty of it, ``_2``, ``_3``), a per-frame ``task``, then the frame's
    ``task_index`` in the task table (read only if reached)."""
    texts = [table[c].fillna("").astype(str).str.strip() for c in INSTRUCTIONS if c in table]
    if texts:
        instruction = texts[-1]
        for text in reversed(texts[:-1]):
            instruction = text.where(text != "", instruction)
        yield INSTRUCTIONS[0], instruction
    if TASK in table:
        yield TASK, table[TASK].fillna("").astype(str).str.strip()
    if TASK_INDEX in table:
        tasks = _tasks(ds)
        unknown = table.loc[~table[TASK_INDEX].isin(list(tasks))]
        if len(unknown):
            first = unknown.iloc[0]
            raise ReleaseError(f"{ds.root / TASKS[ds.version]}: no task {int(first[TASK_INDEX])}; episode "
                               f"{int(first['episode_index'])} has frames with that task_index")
        yield f"{TASK_INDEX}: {TASKS[ds.version]}", table[TASK_INDEX].map(tasks).astype(str).str.strip()


def _instructions(ds: Dataset, table: Any, data: Path) -> tuple[Any, str]:
    """Each frame's instruction and the field that gave it: the first field of :func:`_candidates` with any text.
    One field serves the whole dataset (not a fallback frame by frame) so that ``index.json`` can name it, and a
    DROID episode whose ``language_instruction`` is empty stays without one."""
    empty = []
    for field, texts in _candidates(ds, table):
        if (texts != "").any():
            return texts, field
        empty.append(field)
    blank = f"; empty in every frame: {', '.join(empty)}" if empty else ""
    raise ReleaseError(f"{data}: no instruction field (looked for {LOOKED_FOR}{blank}); the policy needs each "
                       "frame's instruction")


def frames(ds: Dataset, lab_field: str = LAB) -> Frames:
    """Every frame's episode, index, timestamp, lab, instruction and state (only those columns are read)."""
    import pandas as pd

    level = _lab_level(ds, lab_field)
    required = ["episode_index", "frame_index", "timestamp", STATE, *([lab_field] if level == "frame" else [])]
    wanted = list(dict.fromkeys([*required, *INSTRUCTIONS, TASK, TASK_INDEX]))
    paths, parts = _data_files(ds), []
    for path in paths:
        schema = _table(path, schema=True)
        missing = [c for c in required if c not in schema.names]
        if missing:
            raise ReleaseError(f"{path}: column {missing[0]!r} is missing")
        parts.append(_table(path, columns=[c for c in wanted if c in schema.names]))
    table = pd.concat(parts, ignore_index=True)
    table["instruction"], instruction_field = _instructions(ds, table, paths[0])
    labs = table[lab_field] if level == "frame" else \
        table["episode_index"].map(dict(zip(ds.episodes["episode_index"], ds.episodes[lab_field], strict=True)))
    table["lab"] = labs.fillna("").astype(str).str.strip()
    return Frames(table.sort_values(["episode_index", "frame_index"]).reset_index(drop=True), lab_field,
                  instruction_field)


def sample(data: Frames, labs: list[str], per_lab: int, seed: int) -> Any:
    """``per_lab`` frames of each lab, drawn without replacement by a generator seeded with ``seed``, from the frames
    of episodes that have an instruction; the same inputs give the same frames."""
    table = data.table
    present = sorted(set(table["lab"]) - {""})
    rng = np.random.default_rng(seed)
    picks = []
    for lab in labs:
        if lab not in present:
            raise ReleaseError(f"lab {lab!r} is not in the dataset (its labs, field {data.lab_field!r}: "
                               f"{', '.join(present) or 'none'}); pass --labs with labs it has")
        rows = table.index[(table["lab"] == lab) & (table["instruction"] != "")].to_numpy()
        if not len(rows):
            raise ReleaseError(f"lab {lab!r} has no frames with an instruction: field {data.instruction_field!r} "
                               "is empty in all of them; pass --labs without it")
        if len(rows) < per_lab:
            raise ReleaseError(f"lab {lab!r} has {len(rows)} frames with an instruction, fewer than --per-lab "
                               f"{per_lab}; ask for fewer")
        picks += sorted(rows[rng.choice(len(rows), size=per_lab, replace=False)].tolist())
    return table.loc[picks]


def _video(ds: Dataset, episode: int, key: str) -> tuple[Path, float]:
    """The video file of ``episode`` for camera ``key`` and where the episode starts in it (seconds)."""
    chunks = int(ds.info.get("chunks_size", 1000))
    if ds.version == "v2.1":
        path = _inside(ds, "video_path", episode_chunk=episode // chunks, video_key=key, episode_index=episode)
        offset = 0.0
    else:
        row = ds.episodes.loc[ds.episodes["episode_index"] == episode].iloc[0]
        path = _inside(ds, "video_path", video_key=key, chunk_index=int(row[f"videos/{key}/chunk_index"]),
                       file_index=int(row[f"videos/{key}/file_index"]))
        offset = float(row[f"videos/{key}/from_timestamp"])
    if not path.is_file():
        raise ReleaseError(f"{path}: missing; camera {key!r} of episode {episode} is in it")
    return path, offset


def decode_frame(path: Path, time: float, fps: float) -> np.ndarray:
    """The RGB frame of ``path`` whose presentation time is nearest to ``time``, within half a frame period."""
    _, av = _modules()
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            base = float(stream.time_base)
            container.seek(max(0, math.floor(time / base)), stream=stream, backward=True, any_frame=False)
            best, best_gap = None, math.inf
            for frame in container.decode(stream):
                gap = abs(float(frame.pts) * base - time)
                if gap < best_gap:
                    best, best_gap = frame, gap
                if float(frame.pts) * base > time + 0.5 / fps:
                    break
    except (av.FFmpegError, IndexError) as exc:  # IndexError: a container without a video stream
        raise ReleaseError(f"{path}: not a readable video ({str(exc).splitlines()[0] or 'no video stream'}); the "
                           "dataset is damaged: download it again") from exc
    if best is None or best_gap >= 0.5 / fps:
        raise ReleaseError(f"{path}: no frame at {time:.4f} s (nearest {best_gap:.4f} s away); the video does not "
                           "match the episode table")
    image: np.ndarray = best.to_ndarray(format="rgb24")
    return image


def action_stats(ds: Dataset) -> tuple[list[float], str]:
    """The per-dimension std of the dataset's ``action`` from its own statistics, and where it comes from: v3.0's
    ``meta/stats.json``, or v2.1's per-episode statistics pooled (count-weighted means and second moments)."""
    if ds.version == "v3.0":
        path = ds.root / "meta" / "stats.json"
        stats = _json(path).get(ACTION, {})
        if "std" not in stats:
            raise ReleaseError(f"{path}: no '{ACTION}' std; the metrics need the dataset's action statistics")
        return [float(v) for v in stats["std"]], f"meta/stats.json: {ACTION} std"
    path = ds.root / "meta" / "episodes_stats.jsonl"
    rows = [r["stats"][ACTION] for r in _jsonl(path) if ACTION in r.get("stats", {})]
    if not rows:
        raise ReleaseError(f"{path}: no '{ACTION}' statistics; the metrics need the dataset's action statistics")
    counts = np.array([float(np.ravel(r["count"])[0]) for r in rows])
    means, stds = np.array([r["mean"] for r in rows], float), np.array([r["std"] for r in rows], float)
    mean = (counts[:, None] * means).sum(0) / counts.sum()
    second = (counts[:, None] * (stds**2 + means**2)).sum(0) / counts.sum()
    return [float(v) for v in np.sqrt(np.maximum(second - mean**2, 0))], \
        f"meta/episodes_stats.jsonl: {ACTION} std pooled over {len(rows)} episodes"


def hub_id(dataset: Path) -> str | None:
    """The dataset's Hub id where its folder says it: a Hugging Face cache snapshot
    (``datasets--ORG--NAME/snapshots/REV``) or LeRobot's own cache (``HF_LEROBOT_HOME/ORG/NAME``); else None."""
    root = dataset.resolve()
    if root.parent.name == "snapshots" and root.parent.parent.name.startswith("datasets--"):
        parts = root.parent.parent.name.split("--")
        return "/".join(parts[1:]) if len(parts) == 3 else None
    if root.parent.parent.name == "lerobot":
        return f"{root.parent.name}/{root.name}"
    return None


def import_lerobot(dataset: Path, out: Path, labs: list[str], per_lab: int, seed: int,
                   lab_field: str = LAB) -> Path:
    """Write an observation set (``release-droid-obs/1``) of ``per_lab`` frames of each of ``labs`` (values of the
    column ``lab_field``) to ``out``, with ``action_stats.json`` from the dataset's statistics; nothing is written if
    any part fails."""
    from PIL import Image

    ds = open_dataset(dataset)
    sigma, stats_source = action_stats(ds)
    if len(sigma) != 8 or not all(math.isfinite(s) and s > 0 for s in sigma):
        raise ReleaseError(f"{dataset}: the '{ACTION}' std is {sigma}; the metrics need 8 positive numbers")
    data = frames(ds, lab_field)
    chosen = sample(data, labs, per_lab, seed)
    for _, row in chosen.iterrows():  # before any frame is decoded: what load_observations would refuse later
        where = f"{dataset}: episode {int(row['episode_index'])} frame {int(row['frame_index'])}"
        check_instruction(row["instruction"], where)
        check_state([float(v) for v in np.asarray(row[STATE], dtype=float).reshape(-1)], where)
    lines, size = [], None
    with atomic_dir(output_folder(out)) as tmp:
        (tmp / "images").mkdir()
        for obs_id, (_, row) in enumerate(chosen.iterrows()):
            episode, frame_index = int(row["episode_index"]), int(row["frame_index"])
            images = {}
            for key, camera in CAMERA_KEYS.items():
                path, offset = _video(ds, episode, key)
                pixels = decode_frame(path, offset + float(row["timestamp"]), ds.fps)
                size = size or (pixels.shape[1], pixels.shape[0])
                if (pixels.shape[1], pixels.shape[0]) != size:
                    raise ReleaseError(f"{path}: frames of {pixels.shape[1]}x{pixels.shape[0]}, other cameras "
                                       f"{size[0]}x{size[1]}; the policy sets the three views side by side")
                rel = f"images/{obs_id:05d}_{camera}.png"
                Image.fromarray(pixels).save(tmp / rel, format="PNG")
                images[camera] = rel
            lines.append(json.dumps({"obs_id": obs_id, "episode_id": f"{ds.root.name}/{episode}/{frame_index}",
                                     "lab": row["lab"], "instruction": row["instruction"],
                                     "state": [float(v) for v in np.asarray(row[STATE], dtype=float)],
                                     "images": images}, sort_keys=True))
        (tmp / "observations.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
        write_json(tmp / "action_stats.json", {"sigma": sigma, "note": f"{dataset.name}, {stats_source}"})
        write_json(tmp / "index.json", {
            "format": FORMAT, "count": len(lines), "cameras": CAMERAS, "seed": seed, "image_size": list(size or ()),
            "source": {"dataset": dataset.name, "repo_id": hub_id(dataset), "codebase_version": ds.version,
                       "fps": ds.fps, "per_lab": per_lab,
                       "labs": labs, "cameras": CAMERA_KEYS, "state": STATE, "lab_field": lab_field,
                       "instruction_field": data.instruction_field,
                       "action_stats": stats_source}})
    return out
