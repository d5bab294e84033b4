"""Bad inputs, as a clumsy or hostile user gives them (issue 11, items 2 and 9-12): each is one line on stderr that
names the file, line, field or array, exit 2, no "internal error", and nothing written.

Observation sets and card inputs are copied to ``tmp_path`` before they are damaged: the session fixtures are shared.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import Result
from PIL import Image

from release.core.errors import ReleaseError
from tests.conftest import ROOT, invoke

RTN = "Cosmos3-Nano-Policy-DROID-FP8"
IMAGE = "images/0005_wrist_image_left.png"  # line 6 of observations.jsonl


def refused(result: Result, *names: str) -> str:
    """The one-line refusal: exit 2, "error: ..." naming each of ``names``."""
    out = result.output
    assert result.exit_code == 2, out
    assert out.startswith("error: ") and out.count("\n") == 1, out
    assert "internal error" not in out and "Traceback" not in out
    for name in names:
        assert name in out, (name, out)
    return out


# --- observation sets (items 2 and 9): refused by `release build` and `release eval` before any model runs ---


@pytest.fixture
def obs(tiny: Path, tmp_path: Path) -> Path:
    d = tmp_path / "observations"
    shutil.copytree(tiny / "observations", d)
    return d


def _lines(obs: Path) -> list[str]:
    return (obs / "observations.jsonl").read_text().splitlines()


def _write_lines(obs: Path, lines: list[str]) -> None:
    (obs / "observations.jsonl").write_text("\n".join(lines) + "\n")


def _set(obs: Path, index: int, **fields: object) -> None:
    """Set ``fields`` in the record on line ``index + 1``."""
    lines = _lines(obs)
    lines[index] = json.dumps({**json.loads(lines[index]), **fields})
    _write_lines(obs, lines)


def _replace_line(obs: Path, index: int, text: str) -> None:
    lines = _lines(obs)
    lines[index] = text
    _write_lines(obs, lines)


def _camera(obs: Path, index: int, camera: str, path: str) -> None:
    lines = _lines(obs)
    record = json.loads(lines[index])
    record["images"][camera] = path
    lines[index] = json.dumps(record)
    _write_lines(obs, lines)


def _outside(obs: Path) -> None:
    Image.new("RGB", (640, 360)).save(obs.parent / "outside.png")  # a valid image: read today
    _camera(obs, 5, "exterior_image_1_left", "../outside.png")


def _absolute(obs: Path) -> None:
    Image.new("RGB", (640, 360)).save(obs.parent / "outside.png")
    _camera(obs, 5, "exterior_image_1_left", str(obs.parent / "outside.png"))


def _link_out(obs: Path) -> None:
    Image.new("RGB", (640, 360)).save(obs.parent / "outside.png")
    (obs / IMAGE).unlink()
    (obs / IMAGE).symlink_to(obs.parent / "outside.png")


def _damaged(obs: Path) -> None:
    data = bytearray((obs / IMAGE).read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the pixel data: only a CRC or a decode finds it
    (obs / IMAGE).write_bytes(bytes(data))


def _index(obs: Path, **fields: object) -> None:
    index = obs / "index.json"
    index.write_text(json.dumps({**json.loads(index.read_text()), **fields}))


OBSERVATION_FAULTS: dict[str, tuple[Callable[[Path], object], tuple[str, ...]]] = {
    "duplicate obs_id": (lambda o: _set(o, 5, obs_id=2), ("observations.jsonl:6", "obs_id 2", "line 3")),
    "float obs_id": (lambda o: _set(o, 5, obs_id=0.7), ("observations.jsonl:6", "'obs_id'", "0.7")),
    "lab not a string": (lambda o: _set(o, 5, lab=3), ("observations.jsonl:6", "'lab'")),
    "state with NaN": (lambda o: _set(o, 5, state=[float("nan")] + [0.0] * 7), ("observations.jsonl:6", "'state'")),
    "gripper outside [0, 1]": (lambda o: _set(o, 5, state=[0.0] * 7 + [2.0]), ("observations.jsonl:6", "gripper")),
    "empty line": (lambda o: _write_lines(o, [*_lines(o)[:3], "", *_lines(o)[3:]]),
                   ("observations.jsonl:4", "empty line")),
    "image path ../": (_outside, ("observations.jsonl:6", "exterior_image_1_left", "'../outside.png'", "outside")),
    "absolute image path": (_absolute, ("observations.jsonl:6", "exterior_image_1_left", "outside")),
    "image linked out": (_link_out, ("observations.jsonl:6", "wrist_image_left", "outside")),
    "missing image": (lambda o: (o / IMAGE).unlink(), ("observations.jsonl:6", "wrist_image_left", IMAGE)),
    "truncated image": (lambda o: (o / IMAGE).write_bytes((o / IMAGE).read_bytes()[:500]),
                        ("observations.jsonl:6", IMAGE, "cannot be decoded")),
    "damaged image": (_damaged, ("observations.jsonl:6", IMAGE, "cannot be decoded")),
    "wrong image size": (lambda o: Image.new("RGB", (320, 180)).save(o / IMAGE),
                         ("observations.jsonl:6", IMAGE, "320x180", "640x360")),
    "index.json not JSON": (lambda o: (o / "index.json").write_text('{"format": "release-droid-obs/1", '),
                            ("index.json", "not valid JSON")),
    "index.json not an object": (lambda o: (o / "index.json").write_text("[]"), ("index.json", "JSON object")),
    "index.json nested 100,000 deep": (lambda o: (o / "index.json").write_text("[" * 100_000 + "]" * 100_000),
                                       ("index.json", "nested too deeply to read")),
    "a line nested 100,000 deep": (lambda o: _replace_line(o, 5, "[" * 100_000 + "]" * 100_000),
                                   ("observations.jsonl:6", "nested too deeply to read")),
    "index.json wrong count": (lambda o: _index(o, count=47), ("index.json", "'count'", "47", "48")),
    "no observations.jsonl": (lambda o: (o / "observations.jsonl").unlink(), ("observations.jsonl", "missing")),
}


@pytest.mark.parametrize("fault", OBSERVATION_FAULTS)
def test_build_refuses_a_bad_observation_set(fault: str, tiny: Path, obs: Path, tmp_path: Path) -> None:
    edit, names = OBSERVATION_FAULTS[fault]
    edit(obs)
    out = tmp_path / "dist"
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", obs, "--out", out)
    refused(result, *names)
    assert not out.exists()


@pytest.fixture
def fake_dist(tmp_path: Path) -> Path:
    """A dist whose RTN build folder exists (all `release eval` and `import-served` look for before reading)."""
    dist = tmp_path / "dist"
    (dist / RTN).mkdir(parents=True)
    return dist


def test_eval_refuses_a_bad_observation_set_before_any_rollout(tiny: Path, obs: Path, fake_dist: Path) -> None:
    _set(obs, 5, obs_id=2)
    result = invoke("eval", "rtn", "--dist", fake_dist, "--source", tiny / "source", "--observations", obs)
    refused(result, "observations.jsonl:6", "line 3")
    assert not (fake_dist / RTN / "results").exists()


@pytest.fixture(scope="module")
def cpu_eval(rtn_build: Path, tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A deployed eval of the RTN build on the CPU, with its own dist and rollout cache (no timings: no GPU)."""
    base = tmp_path_factory.mktemp("timings")
    shutil.copytree(rtn_build, base / "dist" / RTN)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELEASE_CACHE", str(base / "cache"))
        result = invoke(*_deployed_eval(base, tiny))
    assert result.exit_code == 0, result.output
    return base


class _Planted:
    """A pickle that would create a file if it were ever unpickled with code execution."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (self.marker.write_text, ("ran",))


def test_a_pickle_in_place_of_modelopt_state_is_refused_by_name_and_never_run(cpu_eval: Path, tiny: Path,
                                                                               tmp_path: Path) -> None:
    """Issue 34: a modelopt_state.pth holding other pickled objects (code) is the one-line error naming it, not an
    UnpicklingError's traceback; torch.load's weights_only refuses it, so nothing in it runs."""
    import pickle

    base = tmp_path / "run"
    shutil.copytree(cpu_eval, base)
    marker = tmp_path / "ran.txt"
    state = base / "dist" / RTN / "transformer" / "modelopt_state.pth"
    state.write_bytes(pickle.dumps(_Planted(marker)))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RELEASE_CACHE", str(base / "cache"))
        shutil.rmtree(base / "cache" / "rollouts")
        refused(invoke(*_deployed_eval(base, tiny), "-q"), str(state), "not a ModelOpt state that loads without "
                "running code", "release build")
    assert not marker.exists()


def _deployed_eval(base: Path, tiny: Path) -> list[str | Path]:
    return ["eval", "rtn", "--path", "deployed", "--split", "validation", "--dist", base / "dist", "--source",
            tiny / "source", "--observations", tiny / "observations"]


@pytest.mark.parametrize("record", ['{"seconds": 0.5, "peak_bytes"', "[1, 2]", '{"seconds": 0.5, "device": "x"}',
                                    '{"seconds": true, "peak_bytes": 1, "device": "x"}'])
def test_eval_names_a_corrupt_rollout_timing_in_its_cache(record: str, cpu_eval: Path, tiny: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Rollouts on a GPU leave their latency beside them in the cache; a damaged record is named, with the fix."""
    base = tmp_path / "run"
    shutil.copytree(cpu_eval, base)
    monkeypatch.setenv("RELEASE_CACHE", str(base / "cache"))
    cached = sorted((base / "cache" / "rollouts").rglob("*.npy"))
    valid = json.dumps({"seconds": 0.5, "peak_bytes": 2**30, "device": "NVIDIA H200"})
    for npy in cached:  # as a GPU run writes them
        npy.with_suffix(".perf.json").write_text(valid)
    bad = cached[-1].with_suffix(".perf.json")
    bad.write_text(record)
    # -q: the progress lines of the rollouts read before the damaged record are not part of the refusal
    refused(invoke(*_deployed_eval(base, tiny), "-q"), str(bad), f"delete it and {cached[-1].name}")
    bad.write_text(valid)
    result = invoke(*_deployed_eval(base, tiny))
    assert result.exit_code == 0, result.output
    speed = json.loads((base / "dist" / RTN / "results" / "deployed-validation.perf.json").read_text())
    assert speed["build"]["device"] == "NVIDIA H200" and speed["build"]["seconds_median"] == 0.5


# --- item 10: eval of a build without a usable provenance.json, import-served, --out that is a file ---


@pytest.mark.parametrize("provenance", [None, '{"config_sha256": "ab', '{"calibration": {}}'])
def test_eval_names_a_missing_or_corrupt_provenance(provenance: str | None, tiny: Path, fake_dist: Path) -> None:
    if provenance is not None:
        (fake_dist / RTN / "provenance.json").write_text(provenance)
    result = invoke("eval", "rtn", "--dist", fake_dist, "--source", tiny / "source", "--observations",
                    tiny / "observations")
    refused(result, f"{RTN}/provenance.json", "release build rtn")
    assert not (fake_dist / RTN / "results").exists()


def _served(tmp_path: Path, name: str, n: int = 4, **arrays: np.ndarray) -> Path:
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(n, 32, 8))
    path = tmp_path / f"{name}.npz"
    np.savez(path, **{"reference": reference, "candidate": reference + 0.01, "obs_ids": np.arange(32, 32 + n),
                      **arrays})
    return path


def _import(tiny: Path, dist: Path, file: Path) -> Result:
    return invoke("import-served", "rtn", file, "--dist", dist, "--source", tiny / "source", "--observations",
                  tiny / "observations")


def _truncated(tmp_path: Path) -> Path:
    path = _served(tmp_path, "truncated")
    path.write_bytes(path.read_bytes()[:-40])  # the zip's central directory cut off
    return path


SERVED_FAULTS: dict[str, tuple[Callable[[Path], Path], tuple[str, ...]]] = {
    "truncated npz": (_truncated, ("truncated.npz", "not a readable .npz")),
    "string ids": (lambda t: _served(t, "strings", obs_ids=np.array(["32", "33", "34", "35"])),
                   ("strings.npz", "'obs_ids'", "integers")),
    "float ids": (lambda t: _served(t, "floats", obs_ids=np.array([32.0, 33.0, 34.0, 0.7])),
                  ("floats.npz", "'obs_ids'", "0.7")),
    "N = 0": (lambda t: _served(t, "empty", n=0), ("empty.npz", "[0, 32, 8]")),
    "repeated ids": (lambda t: _served(t, "repeated", obs_ids=np.array([32, 33, 33, 35])),
                     ("repeated.npz", "'obs_ids'", "[33]")),
    "float seeds": (lambda t: _served(t, "seeds", seeds=np.array([0, 1, 2, 2.5])), ("seeds.npz", "'seeds'", "2.5")),
}


@pytest.mark.parametrize("fault", SERVED_FAULTS)
def test_import_served_refuses(fault: str, tiny: Path, fake_dist: Path, tmp_path: Path) -> None:
    make, names = SERVED_FAULTS[fault]
    refused(_import(tiny, fake_dist, make(tmp_path)), *names)
    assert not (fake_dist / RTN / "results").exists()


def test_import_served_takes_whole_float_ids_and_refuses_fractions(tiny: Path, fake_dist: Path,
                                                                   tmp_path: Path) -> None:
    """Ids 32.0 ... are 32 ... (no information lost); 32.7 was truncated to 32 before: now refused."""
    refused(_import(tiny, fake_dist, _served(tmp_path, "frac", obs_ids=np.array([32.7, 33.0, 34.0, 35.0]))),
            "'obs_ids'", "32.7")
    result = _import(tiny, fake_dist, _served(tmp_path, "whole", obs_ids=np.array([32.0, 33.0, 34.0, 35.0])))
    assert result.exit_code == 0, result.output
    assert list(np.load(fake_dist / RTN / "results" / "served-all.npz")["obs_ids"]) == [32, 33, 34, 35]


def test_fixture_out_is_a_file(tmp_path: Path) -> None:
    file = tmp_path / "out.txt"
    file.write_text("keep me")
    refused(invoke("fixture", "tiny", "--out", file), "--out", "out.txt", "not a folder")
    refused(invoke("fixture", "tiny", "--out", file / "sub"), "--out", "out.txt", "not a folder")
    assert file.read_text() == "keep me"


@pytest.mark.parametrize("option", ["--dist", "--out"])  # --out: build's older name of --dist
def test_build_dist_is_a_file(tiny: Path, tmp_path: Path, option: str) -> None:
    file = tmp_path / "dist"
    file.write_text("keep me")
    result = invoke("build", "rtn", "--source", tiny / "source", "--observations", tiny / "observations",
                    option, file)
    refused(result, "--dist", str(file), "not a folder")
    assert file.read_text() == "keep me"


# --- issue 34: the source, checked as a whole before any work (its other parts are copied into every build) ---

def _header_dtype(source: Path, tensor: str, dtype: str) -> None:
    """The safetensors header of ``tensor`` says ``dtype``, its bytes unchanged (the header keeps its length)."""
    index = json.loads((source / "transformer/diffusion_pytorch_model.safetensors.index.json").read_text())
    shard = source / "transformer" / index["weight_map"][tensor]
    data = bytearray(shard.read_bytes())
    size = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + size])
    header[tensor]["dtype"] = dtype
    text = json.dumps(header, separators=(",", ":")).encode()
    assert len(text) <= size
    data[8:8 + size] = text.ljust(size)
    shard.write_bytes(bytes(data))


def _config(source: Path, **fields: Any) -> None:
    path = source / "transformer/config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


SOURCE_FAULTS: dict[str, tuple[Callable[[Path, Path], object], tuple[str, ...]]] = {
    "link to a file outside": (lambda s, t: (s / "scheduler/notes.txt").symlink_to(t / "outside.txt"),
                               ("scheduler/notes.txt", "outside the source")),
    "link to a folder outside": (lambda s, t: (s / "extras").symlink_to(t), ("extras", "outside the source")),
    "link loop": (lambda s, t: (s / "loop").symlink_to("loop"), ("loop", "loops or points nowhere")),
    "pipe": (lambda s, t: os.mkfifo(s / "scheduler/fifo"), ("scheduler/fifo", "a pipe")),
    "config not JSON": (lambda s, t: (s / "transformer/config.json").write_text("{hidden_size: 64"),
                        ("transformer/config.json", "not valid JSON")),
    "hidden_size 1e9": (lambda s, t: _config(s, hidden_size=10**9), ("config.json", "expects [1000000000]")),
    "index names a shard outside": (
        lambda s, t: (s / "transformer/diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(
            {"weight_map": {"proj_out.weight": "../../outside.safetensors"}})),
        ("safetensors.index.json", "'../../outside.safetensors'", "not a file beside the index")),
    "BF16 header says F16": (lambda s, t: _header_dtype(s, "layers.0.input_layernorm.weight", "F16"),
                             ("tensor layers.0.input_layernorm.weight is F16", "has it BF16")),
}


@pytest.mark.parametrize("fault", SOURCE_FAULTS)
def test_build_refuses_a_bad_source_before_any_work(fault: str, tiny: Path, tmp_path: Path) -> None:
    source = tmp_path / "source"
    shutil.copytree(tiny / "source", source)
    shutil.copytree(tiny / "reference", tmp_path / "reference")  # where the source's fixture.json says it is
    (tmp_path / "outside.txt").write_text("not the source's")
    damage, names = SOURCE_FAULTS[fault]
    damage(source, tmp_path)
    result = invoke("build", "rtn", "--source", source, "--observations", tiny / "observations",
                    "--out", tmp_path / "dist")
    refused(result, *names)
    assert not (tmp_path / "dist").exists()


def test_a_source_in_the_hugging_face_cache_is_links_into_its_blobs(tiny: Path, tmp_path: Path) -> None:
    """A cache snapshot's files are links into ``blobs``: taken; a link out of the cache is still refused."""
    from release.inputs.source import check_architecture

    repo = tmp_path / "models--nvidia--Cosmos3-Nano-Policy-DROID"
    snapshot = repo / "snapshots" / ("0" * 40)
    for path in sorted((tiny / "source").rglob("*")):
        if path.is_file():
            blob = repo / "blobs" / hashlib.sha256(path.read_bytes()).hexdigest()
            blob.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, blob)
            link = snapshot / path.relative_to(tiny / "source")
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(blob, link.parent))
    assert check_architecture(snapshot)["hidden_size"] == 64
    (snapshot / "notes.txt").symlink_to(tiny / "source" / "model_index.json")
    with pytest.raises(ReleaseError, match=r"notes.txt: a link to .*, outside the source"):
        check_architecture(snapshot)


# --- the reference of `release verify`: a fixture's record of it, and its provenance.json ---

def _reference_gone(fixture: Path) -> tuple[str | Path, ...]:
    shutil.rmtree(fixture / "reference")
    return ()


def _fixture_record(text: str) -> Callable[[Path], tuple[str | Path, ...]]:
    def damage(fixture: Path) -> tuple[str | Path, ...]:
        (fixture / "source" / "fixture.json").write_text(text)
        return ()
    return damage


def _reference_provenance(text: str) -> Callable[[Path], tuple[str | Path, ...]]:
    def damage(fixture: Path) -> tuple[str | Path, ...]:
        (fixture / "reference" / "provenance.json").write_text(text)
        return ("--reference", fixture / "reference")
    return damage


REFERENCE_FAULTS = {
    "a fixture.json naming a removed reference": (_reference_gone, ("fixture.json", "field 'reference'",
                                                                    "holds no reference checkpoint")),
    "a fixture.json that is not JSON": (_fixture_record("{bad"), ("fixture.json", "not valid JSON")),
    "a reference provenance.json that is not JSON": (_reference_provenance('{"made_by": '),
                                                     ("provenance.json", "not valid JSON")),
    "a reference provenance.json that is a list": (_reference_provenance("[1, 2]"),
                                                   ("provenance.json", "not a JSON object")),
}


@pytest.mark.parametrize("fault", REFERENCE_FAULTS)
def test_verify_refuses_a_bad_reference(fault: str, tiny: Path, tmp_path: Path) -> None:
    """Before any check runs (the build folder here is empty): one line naming the file and what to do."""
    damage, names = REFERENCE_FAULTS[fault]
    fixture = tmp_path / "fixture"
    for part in ("source", "reference"):
        shutil.copytree(tiny / part, fixture / part)
    (tmp_path / "dist" / RTN).mkdir(parents=True)
    args = damage(fixture)
    refused(invoke("verify", "rtn", "--dist", tmp_path / "dist", "--source", fixture / "source", *args), *names)
    assert not (tmp_path / "dist" / RTN / "verification").exists()


def _results_dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(16, 32, 8))
    (dist / RTN / "results").mkdir(parents=True)
    np.savez(dist / RTN / "results" / "fakequant-validation.npz", reference=reference, candidate=reference + 0.01,
             obs_ids=np.arange(32, 48), seeds=np.zeros(16, dtype=np.int64), labs=np.array(["IPRL"] * 16),
             sigma=np.ones(8))
    return dist


def test_tables_out_holding_other_files_is_refused_and_a_failed_write_leaves_the_old_set(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--out is replaced whole, as one set: a folder with a user's file is refused before any work; a write that
    fails half-way (a full disk) leaves every file of the previous set as it was, and no staging folder."""
    import release.measure.tables as tables
    from tests.test_faults_stats import make_dist

    dist = make_dist(tmp_path)
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    refused(invoke("tables", "--dist", dist, "--out", out, "--resamples", "100"), "--out", "notes.txt")
    assert [p.name for p in out.iterdir()] == ["notes.txt"]
    done = invoke("tables", "--dist", dist, "--resamples", "100")
    assert done.exit_code == 0, done.output
    before = {p.name: p.read_bytes() for p in (dist / "tables").iterdir()}
    assert set(before) == tables.TABLES_OUTPUTS
    written: list[Path] = []
    real = tables.atomic_write

    def fails_on_the_third(path: Path, data: bytes | str) -> None:
        written.append(path)
        if len(written) == 3:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(tables, "atomic_write", fails_on_the_third)
    result = invoke("tables", "--dist", dist, "--resamples", "200")  # another set: other intervals
    assert result.exit_code != 0 and len(written) == 3
    assert {p.name: p.read_bytes() for p in (dist / "tables").iterdir()} == before
    assert not [p.name for p in dist.iterdir() if p.name.startswith(".tables.")]  # no staging folder left


def test_tables_out_is_a_file(tmp_path: Path) -> None:
    dist = _results_dist(tmp_path)
    file = tmp_path / "tables.txt"
    file.write_text("keep me")
    refused(invoke("tables", "rtn", "--dist", dist, "--out", file, "--resamples", "100"), "--out", "tables.txt")
    assert file.read_text() == "keep me" and not (dist / "tables").exists()


# --- issue 34: a read-only output folder, for each command that writes: one line, exit 2, nothing changed ---

def _read_only(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Everything under ``root`` refuses writes as a read-only file system does (EROFS): creating a folder, opening
    a file to write, renaming into it. (A chmod would not do: the tests may run as root.)"""
    def inside(path: Any) -> bool:
        return Path(os.fsdecode(path)).absolute().is_relative_to(root.absolute())

    def refuse(path: Any) -> OSError:
        return OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))

    mkdir, open_, replace, rename = os.mkdir, os.open, os.replace, os.rename

    def ro_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if inside(path):
            raise refuse(path)
        mkdir(path, *args, **kwargs)

    def ro_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT) and inside(path):
            raise refuse(path)
        return open_(path, flags, *args, **kwargs)

    def ro_move(move: Callable[..., None]) -> Callable[..., None]:
        def moved(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if inside(dst):
                raise refuse(dst)
            move(src, dst, *args, **kwargs)
        return moved

    monkeypatch.setattr(os, "mkdir", ro_mkdir)
    monkeypatch.setattr(os, "open", ro_open)
    monkeypatch.setattr(os, "replace", ro_move(replace))
    monkeypatch.setattr(os, "rename", ro_move(rename))


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("command", ["fixture", "tables", "select", "card"])
def test_a_read_only_output_is_one_line_and_changes_nothing(command: str, card_dist: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.test_faults_stats import make_dist

    results = make_dist(tmp_path / "results")
    args, root = {
        "fixture": (("-q", "fixture", "tiny", "--out", tmp_path / "ro" / "fixture"), tmp_path / "ro"),
        "tables": (("tables", "--dist", results, "--resamples", "100"), results),
        "select": (("select", "--dist", card_dist), card_dist),
        "card": (("card", "rtn", "--dist", card_dist), card_dist),
    }[command]
    root.mkdir(exist_ok=True)
    before = _snapshot(root)
    _read_only(root, monkeypatch)
    out = refused(invoke(*args), str(root), "Read-only file system", "make it writable or choose another folder")
    assert "internal error" not in out
    monkeypatch.undo()
    assert _snapshot(root) == before


# --- item 10: `release card` inputs that are not what the stage before wrote ---


@pytest.fixture
def card_dist(tmp_path: Path) -> Path:
    dist = tmp_path / "dist"
    shutil.copytree(ROOT / "tests" / "data" / "cards", dist)
    return dist


def test_a_full_disk_while_the_cards_are_written_leaves_every_old_card_file_and_plot(
        card_dist: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The READMEs, LICENSE and plots of `release card` are one set: the disk filling up at the Korean README (the
    English one staged before it) leaves every file as the English-only run wrote it: no plot or README added or
    changed, and no temporary."""
    assert invoke("card", "--dist", card_dist, "--lang", "en").exit_code == 0  # then en,ko: new files, others change
    folders = [p for p in card_dist.iterdir() if (p / "README.md").is_file()]
    before = {p: p.read_bytes() for f in folders for p in f.iterdir() if p.is_file()}
    real = os.fdopen

    def full_at_the_korean_readme(fd: int, *args: Any, **kwargs: Any) -> Any:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(f"README.ko.md.{os.getpid()}.tmp"):
            os.close(fd)
            raise OSError(28, "No space left on device")
        return real(fd, *args, **kwargs)

    monkeypatch.setattr(os, "fdopen", full_at_the_korean_readme)
    result = invoke("card", "--dist", card_dist, "--lang", "en,ko")
    monkeypatch.undo()
    assert result.exit_code == 2 and "the disk ran out of space" in result.output, result.output
    assert {p: p.read_bytes() for f in folders for p in f.iterdir() if p.is_file()} == before


CARD_FAULTS = {
    "tables.json truncated": ("tables/tables.json", lambda t: t[: len(t) // 2], ("tables.json", "release tables")),
    "tables.json a list": ("tables/tables.json", lambda t: "[]", ("tables.json", "release tables")),
    "tables.json without records": ("tables/tables.json", lambda t: "{}", ("tables.json", "'records'")),
    "report.json empty": (f"{RTN}/verification/report.json", lambda t: "",
                          ("report.json", "release verify rtn")),
    "report.json without checks": (f"{RTN}/verification/report.json", lambda t: "{}",
                                   ("report.json", "'checks'", "release verify rtn")),
    "report.json of an older verify": (f"{RTN}/verification/report.json",
                                       lambda t: json.dumps({"checks": [{"name": "layout", "passed": True}]}),
                                       ("report.json", "'checks'", "a status", "release verify rtn")),
    "provenance.json empty object": (f"{RTN}/provenance.json", lambda t: "{}",
                                     ("provenance.json", "release build rtn")),
    "provenance recipe a number": (f"{RTN}/provenance.json", lambda t: json.dumps({**json.loads(t), "recipe": 5}),
                                   ("provenance.json: field 'recipe': Input should be a valid dictionary",
                                    "release build rtn")),
    "provenance fp8 a string": (f"{RTN}/provenance.json", lambda t: json.dumps({**json.loads(t), "fp8": "x"}),
                                ("provenance.json: field 'fp8'", "release build rtn")),
    "provenance date not a date": (f"{RTN}/provenance.json",
                                   lambda t: json.dumps({**json.loads(t), "date": "yesterday"}),
                                   ("provenance.json: field 'date'", "release build rtn")),
}


@pytest.mark.parametrize("fault", CARD_FAULTS)
def test_card_names_a_corrupt_input(fault: str, card_dist: Path) -> None:
    rel, edit, names = CARD_FAULTS[fault]
    path = card_dist / rel
    path.write_text(edit(path.read_text()))
    refused(invoke("card", "rtn", "--dist", card_dist), *names)
    assert not list(card_dist.rglob("README*.md")) and not list(card_dist.rglob("forest.*.png"))


# --- item 12: a Korean card never mixes in English ---


@pytest.fixture
def locales(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import release.publish.card.i18n as card

    d = tmp_path / "locales"
    shutil.copytree(ROOT / "locales", d)
    monkeypatch.setattr(card, "LOCALES", d)
    return d / "ko" / "LC_MESSAGES" / "messages.po"


def _edit_catalog(po: Path, edit: Callable[..., None]) -> None:
    from babel.messages.pofile import read_po, write_po

    with po.open("rb") as f:
        catalog = read_po(f, locale="ko")
    edit(catalog)
    with po.open("wb") as f:
        write_po(f, catalog)


CATALOG_FAULTS: dict[str, tuple[Callable[..., None], str]] = {
    "empty msgstr": (lambda c: setattr(c["License"], "string", ""), "empty msgstr"),
    "fuzzy": (lambda c: c["License"].flags.add("fuzzy"), "fuzzy"),
    "missing": (lambda c: c.delete("License"), "missing"),
}


@pytest.mark.parametrize("fault", CATALOG_FAULTS)
@pytest.mark.parametrize("check", [True, False])
def test_card_refuses_an_incomplete_catalog(fault: str, check: bool, locales: Path, card_dist: Path) -> None:
    edit, what = CATALOG_FAULTS[fault]
    _edit_catalog(locales, edit)
    result = invoke("card", "rtn", "--dist", card_dist, "--lang", "en,ko", *(["--check"] if check else []))
    refused(result, "ko/LC_MESSAGES/messages.po", "msgid 'License'", what)
    assert not list(card_dist.rglob("README*.md"))
    assert invoke("card", "rtn", "--dist", card_dist, "--lang", "en", "--check").exit_code == 0  # English needs none


# --- item 11: build files ---


def test_duplicate_yaml_key_names_file_line_and_key(builds: Path, tmp_path: Path) -> None:
    path = builds / "rtn.yaml"
    path.write_text(path.read_text().replace("recipe: rtn\n", "recipe: rtn\nrecipe: smoothquant\n", 1))
    line = path.read_text().splitlines().index("recipe: smoothquant") + 1
    out = tmp_path / "dist"
    result = invoke("build", "rtn", "--source", tmp_path / "no-source", "--out", out)
    refused(result, f"rtn.yaml:{line}:", "duplicate key 'recipe'", f"first on line {line - 1}")
    assert not out.exists()


def test_alpha_out_of_range_says_what_alpha_may_be(builds: Path, tmp_path: Path) -> None:
    path = builds / "sq_auto.yaml"
    path.write_text(path.read_text().replace("alpha: auto", "alpha: 1.5", 1))
    result = invoke("build", "sq_auto", "--source", tmp_path / "no-source", "--out", tmp_path / "dist")
    msg = refused(result, "sq_auto.yaml:", "field 'smoothquant.alpha'", "alpha must be 'auto' or a number in 0..1")
    assert "and 1 more" not in msg


# --- names that become paths, and the pinned date ---


@pytest.mark.parametrize("name", ["../builds/rtn", "/etc/passwd", "rtn\n", ".hidden", "r" * 300])
def test_a_build_name_cannot_leave_the_builds_folder(name: str, tmp_path: Path) -> None:
    (tmp_path / "rtn.yaml").write_text((ROOT / "builds" / "rtn.yaml").read_text())  # what '../' would reach
    out = refused(invoke("build", name, "--source", tmp_path, "--out", tmp_path / "dist"), "build name")
    assert "letters, digits" in out and "at most 64 characters" in out and len(out) < 400
    assert not (tmp_path / "dist").exists()


def test_a_repos_build_name_is_validated(builds: Path) -> None:
    text = (builds / "release.yaml").read_text().replace("  rtn_mavg: ", "  ../rtn_mavg: ")
    (builds / "release.yaml").write_text(text)
    refused(invoke("push", "--dry-run", "--target", builds.parent / "hub"), "release.yaml", "repos")


def test_source_date_epoch_must_be_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    from release.core.errors import ReleaseError
    from release.core.io import build_date

    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1796004000")
    assert build_date() == "2026-11-30T02:00:00+00:00"
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "253402300799")
    assert build_date() == "9999-12-31T23:59:59+00:00"
    for bad in ("yesterday", "99999999999999999999", "253402300800", "-1", "1e9", "\u00b2"):
        monkeypatch.setenv("SOURCE_DATE_EPOCH", bad)
        with pytest.raises(ReleaseError, match=r"SOURCE_DATE_EPOCH.*up to 253402300799"):
            build_date()


def test_profile_target_that_is_a_folder_is_refused_before_any_work(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELEASE_PROFILE", str(tmp_path))
    result = invoke("build", "rtn", "--source", tmp_path / "nope", "--out", tmp_path / "dist")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"RELEASE_PROFILE={tmp_path} is a folder" in result.output
    assert not (tmp_path / "dist").exists()


def test_a_cache_under_a_file_is_one_line(rtn_build: Path, tiny: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """issue 52: RELEASE_CACHE under a regular file (a file where a folder must go) is a one-line error naming the
    path, exit 2, not an internal error; nothing is written into the dist."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("RELEASE_CACHE", str(blocker / "cache"))
    before = _snapshot(rtn_build.parent)
    result = invoke("eval", "rtn", "--dist", rtn_build.parent, "--source", tiny / "source", "--observations",
                    tiny / "observations")
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert f"error: {blocker}" in result.output and "a file stands where a folder must go" in result.output
    assert "internal error" not in result.output and _snapshot(rtn_build.parent) == before
