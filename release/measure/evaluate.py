"""``release eval`` and ``release import-served``: policy replays against BF16, stored per observation.

Paths: ``fakequant`` (the source with ModelOpt fake quantization at the build's scales), ``deployed`` (the exported
build through diffusers: ModelOpt's FP8 GEMM on CUDA, an emulation of its arithmetic on a CPU) and ``served``
(the exported build as NVIDIA's policy server runs it, TorchAO's static FP8 under the release's step policy; or
results imported from a policy server). Every path stores ``results/<path>-<split>.npz`` in the build folder:
``reference`` and ``candidate`` [N, chunk, 8], ``obs_ids``, ``seeds``, ``labs``, and ``computed``: how the
candidate was computed (``computation``: device, torch and CUDA versions, the FP8 GEMM kernel and the GEMM shapes).
Yardsticks (BF16 eager vs ``torch.compile``; one noise seed vs others) go to ``<dist>/yardsticks/``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from release import __version__
from release.check.written import record_written
from release.core.builds import load_build, load_release
from release.core.config import NATIVE_STEPS, BuildConfig, PolicySettings, ReleaseConfig, StepPolicy
from release.core.device import libraries_loaded
from release.core.errors import ReleaseError
from release.core.io import atomic_write, cache_dir, parse_json, replacing, write_json
from release.core.memory import resident_bytes
from release.core.output import info, progress
from release.core.profile import device_name, stage
from release.core.provenance import read_provenance
from release.inputs.observations import Observation, action_sigma, load_observations, observation_set_digest
from release.inputs.source import (
    SourceModel,
    load_transformer,
    recalled_inputs,
    resolve_source,
    source_revision,
)
from release.measure.layout import EXTERNAL, EXTERNAL_TITLE, PERF, RESULTS, YARDSTICKS, as_external, external_name
from release.quantize.load import deployed_transformer, fakequant_transformer
from release.quantize.served import ran_steps, served_kernel, served_transformer, torchao_version

Path_ = Literal["fakequant", "deployed", "served"]
Split = Literal["calibration", "validation", "all"]
HOW = ".how.json"  # beside a cached rollout: the machine, versions, FP8 GEMM kernel, GEMM shapes, CUDA graphs or not
# the compile yardstick's rollouts: regional compilation of the decoder layers (``run_yardsticks``)
COMPILED = "bf16-compile:repeated-blocks"
SEEDS_YARDSTICK = (6, 4)  # observations x seeds; 6 observations: the fewest with an interval (min_observations)
# The emulation's arithmetic: Hopper's fast accumulation (zero codes, row-wise); the deployed input times fp32(1/s)
# as ModelOpt's compiled quantizer computes it (since /6; before: the quotient), the served one divided.
EMULATION = "fp8-gemm-emulation/6"
# The served path reads the stored weight_scale / input_scale, which a GPU build writes as amax x fp32(1/448) since
# release.core.fp8.serving_scale (before: the CPU's quotient); its rollouts cached before that are not reused.
STORED_SCALES = "stored-scales/2"
# Since steps/1 fake-quant and deployed rollouts record each step's mode (NATIVE_STEPS: diffusers' step policy off);
# those cached before are not reused.
PACK = 16  # observations per packed rollout on the CPU: 1.4x a lone fake-quant rollout's speed (BENCHMARKS.md)
STEPS_RECORDED = "steps/1"


@dataclass(frozen=True)
class Subject:
    """What one rollout series is of: a build of the dist, or an external FP8 checkpoint (NVIDIA's published one),
    which takes the RTN build's configuration (NVIDIA's scheme and Linears) for its fake-quant replay."""

    build: BuildConfig
    checkpoint: Path  # the folder that is loaded
    results: Path  # where its results/ go
    revision: str | None = None  # an external checkpoint's commit or content hash (its rollouts' cache key)
    spec: str | None = None  # an external checkpoint as named on the command line


@dataclass(frozen=True)
class EvalRequest:
    release: ReleaseConfig
    subjects: list[Subject]
    path: Path_
    split: Split
    dist: Path
    source: Path
    observations: Path
    cache: Path
    yardsticks: bool
    steps: StepPolicy  # the served path's: which denoising steps run W8A16
    resident: SourceModel | None = None  # the source as release campaign holds it: fake quant needs no read of it

    @property
    def builds(self) -> list[BuildConfig]:
        return [s.build for s in self.subjects]

    @classmethod
    def create(cls, names: tuple[str, ...], path: str, split: str, dist: Path, source: str | Path | None,
               observations: Path | None, yardsticks: bool, all_builds: bool = False,
               external: str | None = None, external_title: str = EXTERNAL_TITLE,
               w8a16_steps: tuple[int | None, int | None] = (None, None), chosen: bool = False) -> EvalRequest:
        from release.core.builds import available_builds
        from release.inputs.source import resolve_checkpoint, source_identity
        from release.measure.select import delivered

        release = load_release()
        if all_builds:
            names = tuple(release.sweep or available_builds())
        names = (*names, *(delivered(release, dist, "release eval --chosen") if chosen else []))
        if not names and external is None:
            raise ReleaseError(f"name at least one build ({', '.join(available_builds())}), pass --all or --chosen, "
                               "or --external CHECKPOINT")
        subjects = []
        for b in (load_build(n) for n in dict.fromkeys(names)):
            if not (dist / b.repo).is_dir():
                raise ReleaseError(f"{dist / b.repo}: missing; run 'release build {b.name}' first")
            subjects.append(Subject(b, dist / b.repo, dist / b.repo))
        if external is not None:
            folder = resolve_checkpoint(external, "--external")
            if not (folder / "transformer" / "modelopt_state.pth").is_file():
                raise ReleaseError(f"--external {external}: {folder} has no transformer/modelopt_state.pth; it must "
                                   "be a ModelOpt FP8 checkpoint in NVIDIA's diffusers layout")
            name = external_name(external)
            subjects.append(Subject(as_external(name, external_title), folder, dist / EXTERNAL / name,
                                    source_identity(folder).revision, external))
        source, observations = recalled_inputs(dist, source, observations)
        src = resolve_source(release, source)
        obs = observations or src.parent / "observations"
        if not (obs / "index.json").is_file():
            raise ReleaseError(f"observation set {obs} not found; pass --observations DIR")
        given = dict(zip(("w8a16_first_steps", "w8a16_last_steps"), w8a16_steps, strict=True))
        steps = release.served_steps.model_copy(update={k: v for k, v in given.items() if v is not None})
        return cls(release, subjects, path, split, dist, src, obs, cache_dir(), yardsticks,  # type: ignore[arg-type]
                   steps)


def select(observations: list[Observation], release: ReleaseConfig, split: str) -> list[Observation]:
    if split == "calibration":
        chosen = [o for o in observations if o.lab in release.calibration_labs]
    elif split == "validation":
        chosen = [o for o in observations if o.lab in release.heldout_labs]
    else:
        chosen = [o for o in observations if o.lab in release.calibration_labs + release.heldout_labs]
    if not chosen:
        raise ReleaseError(f"split {split!r}: no observation from its labs; the observation set has labs "
                           f"{sorted({o.lab for o in observations})}")
    return chosen


def _key(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:20]


def _rollout_paths(request: EvalRequest, label: str, observations: list[Observation], seeds: list[int]) -> list[Path]:
    from release.core.device import compute_device
    from release.inputs.policy import settings_digest

    device = compute_device()  # CPU and GPU rollouts differ: cache them apart (CUDA graphs or not, the same bits)
    # and so may two versions of torch's kernels: a rollout is reused only under the torch and CUDA that made it
    folder = request.cache / "rollouts" / _key(label, device, source_revision(request.source),
                                               observation_set_digest(request.observations),
                                               settings_digest(request.release.policy), torch.__version__,
                                               str(torch.version.cuda))
    return [folder / f"obs-{o.obs_id:05d}-seed-{s}.npy" for o, s in zip(observations, seeds, strict=True)]


def rollouts(request: EvalRequest, label: str, make_transformer: Callable[[], torch.nn.Module | None],
             observations: list[Observation], seeds: list[int], pipe_kwargs: dict[str, Any],
             packable: bool = False) -> np.ndarray:
    """[N, chunk, dims] actions, one rollout per (observation, seed); cached per item so a run resumes. Under
    torchrun each rank rolls out its share of the missing items, then every rank reads them all. On a GPU each
    rollout's latency and peak memory are kept beside its actions (``performance`` reads them). The BF16 source, the
    fake-quant replay and a deployed build with ModelOpt's FP8 GEMM run their decoder stacks as CUDA graphs on a
    GPU (``release.inputs.graphs``), each rollout's record saying whether it did. ``packable`` (BF16 eager and the
    fake-quant replay): a tiny model on a CPU rolls out PACK observations at a time with their transformer calls
    packed into one, the same bits as one at a time (``release.inputs.batched``)."""
    from release.core.device import free_memory
    from release.core.distributed import world
    from release.inputs.batched import roll_out_packed
    from release.inputs.graphs import capturable, graph_decoder_stack
    from release.inputs.policy import load_pipeline, one_thread, rollout

    paths = _rollout_paths(request, label, observations, seeds)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    # a rollout cached without its record of how it ran (an older release eval) runs again
    missing, todo = world().unfinished(range(len(paths)),
                                       lambda i: paths[i].is_file() and paths[i].with_suffix(HOW).is_file())
    if not missing and world().main:
        info(f"rollouts: {shown(label)}: {len(paths)} cached")
    if todo:
        with progress(f"{world().tag}rollouts: {shown(label)}", len(todo)) as bar:
            with bar.part("load"), stage("eval: load the policy"):
                model = make_transformer()
                pipe = load_pipeline(request.source, request.release.policy, transformer=model)
            if model is None:
                capturable(pipe.transformer)  # the BF16 source; a deployed build's maker marks its own
            graphed = graph_decoder_stack(pipe.transformer) is not None
            gemms = getattr(pipe.transformer, "gemm_record", None)  # a deployed build's kernel and GEMM shapes
            resident = resident_bytes(pipe.transformer)  # its weight memory as loaded, on any device
            schedule = getattr(pipe.transformer, "step_schedule", None)  # a served build's W8A8 / W8A16 per step
            settings = [request.release.policy.model_copy(update={"noise_seed": s}) for s in seeds]
            pack = PACK if packable and gemms is None and schedule is None and one_thread(pipe.transformer) else 1
            for group in [todo[k:k + pack] for k in range(0, len(todo), pack)]:
                if gemms is not None:
                    gemms.shapes.clear()
                # a served build's schedule records the steps of one rollout (pack is 1 for it)
                kwargs = pipe_kwargs if schedule is None else {**pipe_kwargs, **schedule.pipe_kwargs()}
                with stage(f"eval: rollouts {label.split(':')[0]}") as measure:
                    done = roll_out_packed(pipe, [(observations[i], settings[i]) for i in group], rollout,
                                           **kwargs) if pack > 1 else [(rollout(pipe, observations[group[0]],
                                                                                settings[group[0]], **kwargs), pipe)]
                for i, (actions, ran) in zip(group, done, strict=True):
                    write_json(paths[i].with_suffix(HOW), {
                        **machine(), "kernel": None if gemms is None else gemms.kernel,
                        "gemm_shapes": [] if gemms is None else sorted(gemms.shapes), "graphs": graphed,
                        "weights_bytes": resident,
                        **ran_steps(ran, pipe_kwargs)})
                    if measure.peak_bytes is not None:  # before the actions: cached actions on a GPU have theirs
                        write_json(paths[i].with_suffix(PERF), {"seconds": measure.seconds, "peak_bytes":
                                                                measure.peak_bytes, "device": device_name(),
                                                                "graphs": graphed})
                    with replacing(paths[i]) as file:
                        np.save(file, actions)
                    bar.advance()
        del pipe
        free_memory()  # before the next path's model is placed
    world().barrier()
    return np.stack([np.load(p) for p in paths])


def shown(label: str) -> str:
    """A rollout series as the progress shows it: the path and the build (``fakequant rtn``), not its cache key."""
    parts = label.split(":")
    return " ".join(parts[:3] if len(parts) > 2 and parts[1] == EXTERNAL else parts[:2])


def machine() -> dict[str, str | None]:
    """The device models ran on (its name, or "cpu") and the torch and CUDA versions."""
    return {"device": device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}


def computation(request: EvalRequest, label: str, observations: list[Observation], seeds: list[int]
                ) -> dict[str, Any]:
    """How the rollouts of ``label`` were computed, from the records kept beside them: the device, torch and CUDA
    versions, the FP8 GEMM kernel (``release.quantize.load``: ModelOpt's, eager ``torch._scaled_mm`` or the
    emulation; None without FP8 GEMMs) and every (M, N, K) GEMM shape they ran. Rollouts cached from different
    machines or kernels are refused: a results file holds one computation."""

    paths = [p.with_suffix(HOW) for p in _rollout_paths(request, label, observations, seeds)]
    records = []
    for path in paths:
        if not path.is_file():
            raise ReleaseError(f"{path}: missing (a rollout record); delete its rollout and rerun release eval (that "
                               "rollout runs again)")
        records.append(parse_json(path.read_bytes(), str(path), "delete it and rerun release eval (that rollout runs "
                                  "again)", "a rollout record"))
    kinds = {(r.get("device"), r.get("torch"), r.get("cuda"), r.get("kernel"), str(r.get("steps"))) for r in records}
    if len(kinds) != 1:
        raise ReleaseError(f"{paths[0].parent}: the cached rollouts of {label.split(':')[0]} ran on different "
                           f"machines or kernels {sorted(map(str, kinds))}; delete that folder and rerun release eval")
    device, torch_version, cuda, kernel, _ = kinds.pop()
    shapes = sorted({tuple(s) for r in records for s in r.get("gemm_shapes", [])})
    # the served path's modes per step and TorchAO's version
    steps = {k: records[0][k] for k in ("steps", "torchao") if records[0].get(k) is not None}
    resident = {r.get("weights_bytes") for r in records}  # one load's: rollouts cached by an older eval have none
    weights = {"weights_bytes": resident.pop()} if len(resident) == 1 and None not in resident else {}
    return {"device": device, "torch": torch_version, "cuda": cuda, "kernel": kernel,
            "gemm_shapes": [list(s) for s in shapes], **steps, **weights}


def performance(request: EvalRequest, label: str, observations: list[Observation],
                seeds: list[int]) -> dict[str, Any] | None:
    """The median latency and the peak GPU memory of the rollouts of ``label``, and whether every one replayed its
    decoder stack as CUDA graphs (None unless every one of them ran on the same kind of GPU)."""
    paths = [p.with_suffix(PERF) for p in _rollout_paths(request, label, observations, seeds)]
    if not all(p.is_file() for p in paths):
        return None
    records = [_timing(p) for p in paths]
    if len({r["device"] for r in records}) != 1:
        return None
    return {"device": records[0]["device"], "rollouts": len(records),
            "seconds_median": float(np.median([r["seconds"] for r in records])),
            "peak_gib": max(r["peak_bytes"] for r in records) / 2**30,
            "graphs": all(r.get("graphs") is True for r in records)}  # a record without it: an eager rollout


def _timing(path: Path) -> dict[str, Any]:
    """One cached rollout's latency record, as ``rollouts`` wrote it; anything else names the file."""

    try:
        record = parse_json(path.read_bytes(), str(path), "")
    except ReleaseError:
        record = None
    if not isinstance(record, dict) or not isinstance(record.get("device"), str) or not all(
            type(record.get(k)) in (int, float) and record[k] >= 0 for k in ("seconds", "peak_bytes")):
        raise ReleaseError(f"{path}: not a rollout timing record (seconds, peak_bytes, device); delete it and "
                           f"{path.name.removesuffix(PERF)}.npy beside it, then rerun release eval (that rollout "
                           "runs again)")
    return record


def save_results(path: Path, reference: np.ndarray, candidate: np.ndarray, observations: list[Observation],
                 seeds: list[int], sigma: np.ndarray, computed: dict[str, Any]) -> None:
    """The action chunks with each observation's metrics (domain notes §5) and how the candidate was computed
    (``computation``, as JSON); ``release tables`` adds the intervals."""
    import io
    import json

    from release.core.distributed import world
    from release.measure.stats import JOINTS, per_observation

    if not world().main:  # under torchrun rank 0 writes
        return
    po = per_observation(reference, candidate, sigma)
    buf = io.BytesIO()
    np.savez(buf, reference=reference, candidate=candidate, obs_ids=np.array([o.obs_id for o in observations]),
             seeds=np.array(seeds), labs=np.array([o.lab for o in observations]), sigma=sigma,
             overall_sigma=np.sqrt(po.sq_err / (po.steps * po.dims)), joint_mae_deg=po.abs_joint_deg / (
                 po.steps * JOINTS), gripper_agree=po.grip_agree.astype(np.int64), max_err_sigma=po.max_err,
             computed=np.array(json.dumps(computed, sort_keys=True)))
    atomic_write(path, buf.getvalue())


def load_npz(path: Path, fix: str) -> dict[str, np.ndarray]:
    """Every array of an .npz file, read now: numpy reads members lazily, so a truncated or damaged file would
    otherwise fail later, without its name. Any failure is a one-line error naming ``path``, then ``fix``."""
    try:
        data = np.load(path, allow_pickle=False)
        if not isinstance(data, np.lib.npyio.NpzFile):
            raise ValueError("a single .npy array, not an .npz archive of named arrays")
        with data:
            return {key: data[key] for key in data.files}
    except Exception as exc:  # zipfile, zlib, EOF, header and pickle errors alike: the file cannot be read
        reason = (str(exc).splitlines() or [""])[0]
        raise ReleaseError(f"{path}: not a readable .npz file ({type(exc).__name__}: {reason}); {fix}") from exc


def describe(path: Path) -> str:
    """One line of a results file's point estimates over all its observations."""
    data = load_npz(path, "rerun the command that wrote it ('release eval' or 'release import-served')")
    steps = data["candidate"].shape[0] * data["candidate"].shape[1]
    rows, observations = len(data["obs_ids"]), len(np.unique(data["obs_ids"]))
    counted = f"{observations} observations" if rows == observations else \
        f"{rows} rollouts of {observations} observations"  # the seed yardstick: several seeds per observation
    return (f"{counted}, overall {np.sqrt(np.mean(data['overall_sigma'] ** 2)):.4f} "
            f"sigma, joint MAE {np.mean(data['joint_mae_deg']):.3f} deg, gripper {int(data['gripper_agree'].sum())}"
            f"/{steps} steps agree")


def _label(request: EvalRequest, subject: Subject) -> str:
    """The cache key of a build's rollouts, from its provenance.json: its configuration and calibration data, the
    tool version and the emulation's arithmetic (a change of any re-runs the rollouts). An external checkpoint's
    key is its revision."""
    build = subject.build
    steps = request.steps
    served = f":{STEPS_RECORDED}" if request.path != "served" else \
        f":{steps.w8a16_first_steps}-{steps.w8a16_last_steps}:torchao-{torchao_version()}:{STORED_SCALES}:" \
        f"{served_kernel()}"
    if subject.revision is not None:
        return f"{request.path}:{EXTERNAL}:{build.name}:{subject.revision}:{__version__}:{EMULATION}{served}"
    path = request.dist / build.repo / "provenance.json"
    prov = read_provenance(path, build.name)
    config, data = prov["config_sha256"], prov["calibration"]["sha256"]
    return f"{request.path}:{build.name}:{config}:{data}:{__version__}:{EMULATION}{served}"


def _series(request: EvalRequest, splits: list[str]) -> tuple[list[Observation], list[int]]:
    """The rollouts' observations and noise seeds on the union of ``splits``: each observation under noise_seeds
    seeds, rows of one observation which the statistics average and resample."""
    policy: PolicySettings = request.release.policy
    everything = load_observations(request.observations)
    chosen = list({o.obs_id: o for s in splits for o in select(everything, request.release, s)}.values())
    obs = [o for o in chosen for _ in range(policy.noise_seeds)]
    seeds = [policy.noise_seed + k for _ in chosen for k in range(policy.noise_seeds)]
    return obs, seeds


def _candidate(request: EvalRequest, subject: Subject, label: str, obs: list[Observation],
               seeds: list[int]) -> np.ndarray:
    if request.path == "fakequant":
        make = functools.partial(fakequant_transformer, request.source, subject.checkpoint, subject.build,
                                 request.resident)
    elif request.path == "served":
        make = functools.partial(served_transformer, subject.checkpoint, request.steps, request.release.policy.steps)
    else:
        make = functools.partial(deployed_transformer, subject.checkpoint)
    return rollouts(request, label, make, obs, seeds, NATIVE_STEPS, packable=request.path == "fakequant")


def roll_out(request: EvalRequest, splits: list[str]) -> None:
    """The rollouts of BF16 and of each subject on the union of ``splits``, each model loaded once, into the cache;
    ``run_eval`` of each split then reads them (``release campaign``: a build's two splits from one load)."""
    obs, seeds = _series(request, splits)
    rollouts(request, "bf16", lambda: None, obs, seeds, {}, packable=True)
    for subject in request.subjects:
        _candidate(request, subject, _label(request, subject), obs, seeds)


def run_eval(request: EvalRequest) -> list[Path]:
    """Replay the policy for BF16 and each build on the split, store the results (and yardsticks if asked).
    Under torchrun the ranks share the rollouts and rank 0 writes the results (the others return none)."""
    from release.core.distributed import world

    obs, seeds = _series(request, [request.split])  # the observation set checked first
    sigma = action_sigma(request.observations, request.release.action_stats, request.release.policy.action_dims)
    labels = {s.build.name: _label(request, s) for s in request.subjects}  # before any model runs
    libraries_loaded()  # after the inputs' checks: a bad one is refused without the libraries' import
    reference = rollouts(request, "bf16", lambda: None, obs, seeds, {}, packable=True)
    written = []
    for subject in request.subjects:
        label = labels[subject.build.name]
        candidate = _candidate(request, subject, label, obs, seeds)
        out = subject.results / RESULTS / f"{request.path}-{request.split}.npz"
        computed = computation(request, label, obs, seeds)
        bf16 = computation(request, "bf16", obs, seeds).get("weights_bytes")
        computed |= {} if bf16 is None or "weights_bytes" not in computed else {"bf16_weights_bytes": bf16}
        save_results(out, reference, candidate, obs, seeds, sigma, computed)
        speed = {"bf16": performance(request, "bf16", obs, seeds), "build": performance(request, label, obs, seeds)}
        if world().main and None not in speed.values():  # rollouts on a GPU: their latency and memory beside them
            write_json(out.with_suffix(PERF), {**speed, "computed": computed})
        elif world().main:
            out.with_suffix(PERF).unlink(missing_ok=True)  # an earlier run's figures are not these results'
        if world().main:
            record_written(subject.results, [p for p in (out, out.with_suffix(PERF)) if p.is_file()], "release eval")
        if subject.revision is not None and world().main:  # what 'release tables' needs to score it
            write_json(subject.results / "external.json", {"name": subject.build.name,
                                                           "title": subject.build.text("title"),
                                                           "checkpoint": subject.spec, "revision": subject.revision})
        written.append(out)
    if request.yardsticks:
        written += run_yardsticks(request, obs, reference, sigma)
    return written if world().main else []


def run_yardsticks(request: EvalRequest, obs: list[Observation], reference: np.ndarray,
                   sigma: np.ndarray) -> list[Path]:
    """BF16 eager vs BF16 ``torch.compile`` on the split, and one noise seed vs others on a few observations.

    The compiled model is diffusers' regional compilation (``compile_repeated_blocks``): each decoder layer compiled,
    one graph for all of them, the rest eager. Compiling the whole model traced every layer anew: 139 s of its first
    rollout at the Nano's size on an H100 (BENCHMARKS.md)."""

    policy = request.release.policy
    seeds = [policy.noise_seed] * len(obs)

    def compiled() -> torch.nn.Module:
        model = load_transformer(request.source / "transformer").eval()
        model.compile_repeated_blocks(dynamic=True)
        return model

    compiled_actions = rollouts(request, COMPILED, compiled, obs, seeds, {})
    out = request.dist / YARDSTICKS
    save_results(out / f"compile-{request.split}.npz", reference, compiled_actions, obs, seeds, sigma,
                 computation(request, COMPILED, obs, seeds))
    n_obs, n_seeds = SEEDS_YARDSTICK
    few = obs[:n_obs]
    pairs = [o for o in few for _ in range(n_seeds)]
    other = [policy.noise_seed + 1 + k for _ in few for k in range(n_seeds)]
    base = rollouts(request, "bf16", lambda: None, pairs, [policy.noise_seed] * len(pairs), {}, packable=True)
    varied = rollouts(request, "bf16", lambda: None, pairs, other, {}, packable=True)
    save_results(out / f"seed-{request.split}.npz", base, varied, pairs, other, sigma,
                 computation(request, "bf16", pairs, other))
    return [out / f"compile-{request.split}.npz", out / f"seed-{request.split}.npz"]
