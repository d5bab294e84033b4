"""release observations import-lerobot: tiny LeRobot datasets of DROID's shape in both on-disk versions (parquet
tables written with pandas, mp4 videos encoded with PyAV), imported, checked frame by frame, and built on."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from release.core.errors import ReleaseError
from release.inputs.lerobot import CAMERA_KEYS, import_lerobot
from release.inputs.observations import load_observations
from tests.conftest import invoke

av = pytest.importorskip("av")
pd = pytest.importorskip("pandas")
FPS = 15
WIDTH, HEIGHT = 64, 36
# (lab, frames, instruction): TRI is a calibration lab of builds/release.yaml, AUTOLab a held-out one; the empty
# instruction is an episode the import must skip.
EPISODES = [("TRI", 12, "put the marker in the cup"), ("AUTOLab", 10, "open the drawer"),
            ("TRI", 9, "wipe the table"), ("AUTOLab", 11, ""), ("AUTOLab", 8, "pick up the spoon")]


def pixel(episode: int, frame: int, camera: int) -> tuple[int, int, int]:
    """A flat colour that names its frame: red counts frames, green episodes, blue cameras (far apart: the codec is
    lossy)."""
    return 16 + 14 * frame, 30 + 40 * episode, 40 + 60 * camera


def state(episode: int, frame: int) -> list[float]:
    return [round(0.1 * episode + 0.01 * frame + 0.001 * j, 6) for j in range(7)] + [float(frame % 2)]


def action(episode: int, frame: int) -> list[float]:
    return [round(0.2 * episode - 0.03 * frame + 0.002 * j, 6) for j in range(7)] + [float((frame + 1) % 2)]


def _encode(path: Path, frames: list[tuple[int, int, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=FPS)
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        stream.options = {"crf": "12", "g": "4"}  # a key frame every 4 frames: most frames need decoding forward
        for rgb in frames:
            image = np.empty((HEIGHT, WIDTH, 3), np.uint8)
            image[:] = rgb
            for packet in stream.encode(av.VideoFrame.from_ndarray(image, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)


@dataclass(frozen=True)
class Shape:
    """Which fields a test dataset has: DROID's (the default) or only LeRobot's standard ones."""

    droid_text: bool = True  # language_instruction, _2 (else the instruction is only the task)
    tasks: bool = True  # task_index and meta/tasks (as lerobot writes them: the episode's instruction)
    lab: str | None = "building"  # the lab column, or none
    lab_per_episode: bool = False  # the lab in the episode table rather than in every frame


DROID = Shape()
TASKS = list(dict.fromkeys(text for _, _, text in EPISODES))


def _features(shape: Shape) -> dict[str, Any]:
    cameras = {key: {"dtype": "video", "shape": [HEIGHT, WIDTH, 3], "names": ["height", "width", "channels"]}
               for key in CAMERA_KEYS}
    text = {"dtype": "string", "shape": [1]}
    return {**cameras, "observation.state": {"dtype": "float32", "shape": [8]},
            "action": {"dtype": "float32", "shape": [8]},
            **({shape.lab: text} if shape.lab and not shape.lab_per_episode else {}),
            **({"language_instruction": text, "language_instruction_2": text} if shape.droid_text else {})}


def _frames(episode: int, lab: str, n: int, text: str, start: int, shape: Shape) -> Any:
    table = pd.DataFrame({
        "index": range(start, start + n), "episode_index": episode, "frame_index": range(n),
        "timestamp": np.arange(n, dtype=np.float32) / FPS, "task_index": TASKS.index(text),
        "observation.state": [state(episode, f) for f in range(n)], "action": [action(episode, f) for f in range(n)],
        "language_instruction": text, "language_instruction_2": ""})
    if shape.lab and not shape.lab_per_episode:
        table[shape.lab] = lab
    dropped = [] if shape.droid_text else ["language_instruction", "language_instruction_2"]
    return table.drop(columns=dropped + ([] if shape.tasks else ["task_index"]))


def _stats(values: np.ndarray) -> dict[str, Any]:
    return {"mean": values.mean(0).tolist(), "std": values.std(0).tolist(), "min": values.min(0).tolist(),
            "max": values.max(0).tolist(), "count": [len(values)]}


def write_dataset(root: Path, version: str, shape: Shape = DROID) -> Path:
    """A LeRobot dataset of DROID's features (or of ``shape``), laid out as lerobot writes ``version``."""
    info: dict[str, Any] = {"codebase_version": version, "robot_type": "Franka", "fps": FPS, "chunks_size": 1000,
                            "total_episodes": len(EPISODES), "features": _features(shape)}
    tables, start = [], 0
    for e, (lab, n, text) in enumerate(EPISODES):
        tables.append(_frames(e, lab, n, text, start, shape))
        start += n
    cams = list(CAMERA_KEYS)
    if version == "v2.1":
        info["data_path"] = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
        info["video_path"] = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"
        episodes, stats = [], []
        for e, (table, (lab, n, text)) in enumerate(zip(tables, EPISODES, strict=True)):
            path = root / info["data_path"].format(episode_chunk=0, episode_index=e)
            path.parent.mkdir(parents=True, exist_ok=True)
            table.to_parquet(path)
            for c, key in enumerate(cams):
                _encode(root / info["video_path"].format(episode_chunk=0, video_key=key, episode_index=e),
                        [pixel(e, f, c) for f in range(n)])
            episodes.append({"episode_index": e, "tasks": [text], "length": n,
                             **({shape.lab: lab} if shape.lab and shape.lab_per_episode else {})})
            stats.append({"episode_index": e, "stats": {"action": _stats(np.array(table["action"].tolist()))}})
        (root / "meta").mkdir(parents=True, exist_ok=True)
        (root / "meta/episodes.jsonl").write_text("".join(json.dumps(x) + "\n" for x in episodes))
        (root / "meta/episodes_stats.jsonl").write_text("".join(json.dumps(x) + "\n" for x in stats))
        if shape.tasks:
            (root / "meta/tasks.jsonl").write_text("".join(json.dumps({"task_index": i, "task": t}) + "\n"
                                                           for i, t in enumerate(TASKS)))
    else:
        info["data_path"] = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
        info["video_path"] = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
        data = pd.concat(tables, ignore_index=True)
        path = root / info["data_path"].format(chunk_index=0, file_index=0)
        path.parent.mkdir(parents=True, exist_ok=True)
        data.to_parquet(path)
        for c, key in enumerate(cams):  # one file per camera, the episodes one after another
            _encode(root / info["video_path"].format(video_key=key, chunk_index=0, file_index=0),
                    [pixel(e, f, c) for e, (_, n, _) in enumerate(EPISODES) for f in range(n)])
        rows, begin = [], 0
        for e, (lab, n, text) in enumerate(EPISODES):
            row: dict[str, Any] = {"episode_index": e, "tasks": [text], "length": n, "data/chunk_index": 0,
                                   "data/file_index": 0, "dataset_from_index": begin, "dataset_to_index": begin + n,
                                   **({shape.lab: lab} if shape.lab and shape.lab_per_episode else {})}
            for key in cams:
                row |= {f"videos/{key}/chunk_index": 0, f"videos/{key}/file_index": 0,
                        f"videos/{key}/from_timestamp": begin / FPS, f"videos/{key}/to_timestamp": (begin + n) / FPS}
            rows.append(row)
            begin += n
        (root / "meta/episodes/chunk-000").mkdir(parents=True)
        pd.DataFrame(rows).to_parquet(root / "meta/episodes/chunk-000/file-000.parquet")
        if shape.tasks:  # as lerobot's LeRobotDatasetMetadata.save_episode_tasks: indexed by the task string
            pd.DataFrame({"task_index": range(len(TASKS))}, index=TASKS).to_parquet(root / "meta/tasks.parquet")
        (root / "meta/stats.json").write_text(json.dumps({"action": _stats(np.array(data["action"].tolist()))}))
    (root / "meta").mkdir(parents=True, exist_ok=True)
    (root / "meta/info.json").write_text(json.dumps(info, indent=2))
    return root


@pytest.fixture(scope="module", params=["v2.1", "v3.0"])
def dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp(f"lerobot-{request.param}") / "droid_tiny", request.param)


def _identify(image: np.ndarray) -> tuple[int, int, int]:
    """(episode, frame, camera) of a decoded image from its colour."""
    r, g, b = image.reshape(-1, 3).mean(0)
    return round((g - 30) / 40), round((r - 16) / 14), round((b - 40) / 60)


def test_import_gives_exact_frames_states_and_stats(dataset: Path, tmp_path: Path) -> None:
    from PIL import Image

    out = import_lerobot(dataset, tmp_path / "obs", ["TRI", "AUTOLab"], per_lab=4, seed=3)
    obs = load_observations(out)
    assert [o.lab for o in obs] == ["TRI"] * 4 + ["AUTOLab"] * 4
    index = json.loads((out / "index.json").read_text())
    version = json.loads((dataset / "meta/info.json").read_text())["codebase_version"]
    assert index["image_size"] == [WIDTH, HEIGHT] and index["source"]["codebase_version"] == version
    assert index["source"]["instruction_field"] == "language_instruction" and index["source"]["lab_field"] == "building"
    for o in obs:
        name, episode, frame = o.episode_id.split("/")
        e, f = int(episode), int(frame)
        assert name == "droid_tiny" and EPISODES[e][0] == o.lab and o.instruction == EPISODES[e][2] != ""
        assert list(o.state) == pytest.approx(state(e, f), abs=1e-6)
        for c, camera in enumerate(CAMERA_KEYS.values()):
            assert _identify(np.asarray(Image.open(o.images[camera]))) == (e, f, c), (o.obs_id, camera)
    everything = np.array([action(e, f) for e, (_, n, _) in enumerate(EPISODES) for f in range(n)])
    sigma = json.loads((out / "action_stats.json").read_text())["sigma"]
    assert sigma == pytest.approx(everything.std(0).tolist(), rel=1e-5)  # v2.1: pooled from the episodes' stats
    assert "action std" in index["source"]["action_stats"]


def test_the_draw_is_deterministic_and_skips_episodes_without_an_instruction(dataset: Path, tmp_path: Path) -> None:
    first = import_lerobot(dataset, tmp_path / "a", ["AUTOLab"], per_lab=18, seed=7)
    again = import_lerobot(dataset, tmp_path / "b", ["AUTOLab"], per_lab=18, seed=7)
    assert (first / "observations.jsonl").read_bytes() == (again / "observations.jsonl").read_bytes()
    for png in sorted((first / "images").iterdir()):
        assert png.read_bytes() == (again / "images" / png.name).read_bytes()
    picked = [o.episode_id.split("/")[1] for o in load_observations(first)]
    assert sorted(set(picked)) == ["1", "4"] and len(picked) == 18  # every AUTOLab frame but episode 3's (no text)
    other = import_lerobot(dataset, tmp_path / "c", ["AUTOLab"], per_lab=5, seed=8)
    assert [o.episode_id for o in load_observations(other)] != [o.episode_id for o in load_observations(first)][:5]


def _info(**fields: Any) -> Callable[[Path, dict[str, Any]], None]:
    return lambda root, info: info.update(fields)


def _templates(data: str, video: str) -> Callable[[Path, dict[str, Any]], None]:
    """info.json's data and video templates with ``{d}`` and ``{v}`` standing for the version's own."""
    def edit(root: Path, info: dict[str, Any]) -> None:
        info["data_path"] = data.format(d=info["data_path"])
        info["video_path"] = video.format(v=info["video_path"])
    return edit


def _damaged(pattern: str, data: bytes | None) -> Callable[[Path, dict[str, Any]], None]:
    """Every file matching ``pattern`` cut to half its size (``data`` None) or replaced by ``data``."""
    def edit(root: Path, info: dict[str, Any]) -> None:
        for path in root.glob(pattern):
            path.write_bytes(path.read_bytes()[:path.stat().st_size // 2] if data is None else data)
    return edit


BAD_DATASETS: dict[str, tuple[Callable[[Path, dict[str, Any]], None], str]] = {
    "version": (_info(codebase_version="v2.0"), "codebase_version 'v2.0' is not one this tool reads (v2.1, v3.0)"),
    "camera": (lambda root, info: info["features"].pop("observation.images.wrist_left"),
               "camera 'observation.images.wrist_left' is missing"),
    "fps a string": (_info(fps="15"), "field 'fps' is '15'; it must be the frame rate, a positive number"),
    "fps 0": (_info(fps=0), "field 'fps' is 0; it must be the frame rate"),
    "template reads an attribute": (_templates("{{episode_chunk.__class__.__name__}}{d}", "{v}"),
                                    "field 'data_path' formats {episode_chunk.__class__.__name__}"),
    "template indexes": (_templates("{d}", "{{video_key[0]}}{v}"), "field 'video_path' formats {video_key[0]}"),
    "template pads to 10^12": (_templates("{{file_index:01000000000000d}}{d}", "{v}"), "formats {file_index:01000000"),
    "template names another field": (_templates("{{root}}{d}", "{v}"), "field 'data_path' formats {root}"),
    "template escapes the dataset": (_templates("../../{d}", "{v}"), "outside the dataset"),
    "truncated parquet": (_damaged("data/*/*.parquet", None), "not a readable parquet table"),
    "garbage mp4": (_damaged("videos/**/*.mp4", b"\x00\x00\x00\x18ftypmp42" + bytes(200)), "not a readable video"),
    "truncated mp4": (_damaged("videos/**/*.mp4", None), "not a readable video"),
}


@pytest.mark.parametrize("fault", BAD_DATASETS)
def test_bad_datasets_are_one_line_errors(dataset: Path, tmp_path: Path, fault: str) -> None:
    """Issue 34: what info.json says is checked before it is used (a path template formats only its documented
    fields and stays inside the dataset), and a damaged table or video is named."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    info = json.loads((copy / "meta/info.json").read_text())
    edit, message = BAD_DATASETS[fault]
    if fault.startswith("template") and "{file_index" in message and info["codebase_version"] == "v2.1":
        edit, message = _templates("{{episode_index:01000000000000d}}{d}", "{v}"), "formats {episode_index:01000000"
    edit(copy, info)
    (copy / "meta/info.json").write_text(json.dumps(info))
    result = invoke("observations", "import-lerobot", copy, "--out", tmp_path / "obs", "--labs", "TRI")
    assert result.exit_code == 2 and result.output.count("\n") == 1 and message in result.output, result.output
    assert "internal error" not in result.output
    assert not (tmp_path / "obs").exists()


@pytest.mark.parametrize(("column", "value", "message"), [
    ("observation.state", [float("nan")] + [0.0] * 7, "field 'state' holds NaN or Infinity"),
    ("observation.state", [0.0] * 7 + [1.5], "the gripper (last value) is 1.5"),
    ("language_instruction", "pick" * 750, "field 'instruction' is 3,000 characters long"),
])
def test_frames_the_observation_set_would_refuse_are_refused_at_import(dataset: Path, tmp_path: Path, column: str,
                                                                       value: Any, message: str) -> None:
    """A NaN or out-of-range state, or an instruction far longer than a task description, is named at import with
    its episode and frame (it was written, and refused only by the build)."""
    copy = tmp_path / "copy"
    shutil.copytree(dataset, copy)
    for data in (copy / "data").rglob("*.parquet"):
        table = pd.read_parquet(data)
        table[column] = [value] * len(table)
        table.to_parquet(data)
    result = invoke("observations", "import-lerobot", copy, "--out", tmp_path / "obs", "--labs", "TRI")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert result.output.startswith(f"error: {copy}: episode ") and " frame " in result.output
    assert message in result.output, result.output
    assert not (tmp_path / "obs").exists()


def test_labs_and_frame_counts_are_checked(dataset: Path, tmp_path: Path) -> None:
    with pytest.raises(ReleaseError, match=r"lab 'IPRL' is not in the dataset \(its labs, field 'building': "
                                           r"AUTOLab, TRI\)"):
        import_lerobot(dataset, tmp_path / "obs", ["TRI", "IPRL"], per_lab=1, seed=0)
    with pytest.raises(ReleaseError, match=r"lab 'TRI' has 21 frames with an instruction, fewer than --per-lab 22"):
        import_lerobot(dataset, tmp_path / "obs", ["TRI"], per_lab=22, seed=0)
    assert not (tmp_path / "obs").exists()


def test_a_build_runs_on_imported_frames(dataset: Path, tiny: Path, tmp_path: Path, builds: Path) -> None:
    """The lab names are the dataset's, so calibration_labs and heldout_labs of release.yaml split the set as they
    are; a build with two calibration observations' worth of calls verifies on it."""
    if dataset.parent.name.endswith("v2.1"):
        pytest.skip("one build on imported frames is enough (v3.0)")
    result = invoke("observations", "import-lerobot", dataset, "--out", tmp_path / "obs", "--per-lab", "3",
                    "--labs", "TRI,AUTOLab")
    assert result.exit_code == 0, result.output
    path = builds / "rtn.yaml"
    path.write_text(path.read_text().replace("calibration_calls: 256", "calibration_calls: 16"))
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tmp_path / "obs", "--out",
                    tmp_path / "dist")
    assert result.exit_code == 0, result.output
    prov = json.loads((tmp_path / "dist/Cosmos3-Nano-Policy-DROID-FP8/provenance.json").read_text())
    assert prov["calibration"]["labs"] == ["TRI"] and prov["calibration"]["observations"] == 3
