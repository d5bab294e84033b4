"""``release build``: calibration capture, ModelOpt FP8 quantization, export in NVIDIA's layout, provenance."""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from release import ReleaseError, __version__
from release.config import BuildConfig, ReleaseConfig, available_builds, builds_dir, load_build, load_release
from release.io import atomic_dir, build_date, output_folder, sha256_file, write_json
from release.observations import Observation, load_observations, split
from release.profile import stage
from release.source import (
    Revision,
    SourceModel,
    check_architecture,
    check_revision,
    resolve_source,
    source_identity,
)

OBSERVATIONS_ENV = "RELEASE_OBSERVATIONS"
CACHE_ENV = "RELEASE_CACHE"
console = Console(stderr=True)


@dataclass(frozen=True)
class BuildRequest:
    release: ReleaseConfig
    builds: list[BuildConfig]
    source: Path
    observations: Path
    out: Path
    cache: Path
    identity: Revision

    @classmethod
    def create(cls, names: tuple[str, ...], all_builds: bool, source: str | Path | None,
               observations: Path | None, out: Path, allow_revision_mismatch: bool = False) -> BuildRequest:
        release = load_release()
        if all_builds:
            names = tuple(release.sweep or available_builds())
        if not names:
            raise ReleaseError(f"name at least one build ({', '.join(available_builds())}) or pass --all")
        builds = [load_build(n) for n in dict.fromkeys(names)]
        src = resolve_source(release, source)
        identity = source_identity(src)
        check_revision(release, identity, allow_revision_mismatch)  # before any work
        if observations is None:
            observations = Path(os.environ[OBSERVATIONS_ENV]) if os.environ.get(OBSERVATIONS_ENV) else None
        if observations is None:
            observations = src.parent / "observations"
        if not (observations / "index.json").is_file():
            raise ReleaseError(
                f"observation set {observations} not found; pass --observations DIR or set {OBSERVATIONS_ENV}"
            )
        cache = Path(os.environ.get(CACHE_ENV, ".cache/release"))
        return cls(release, builds, src, observations, output_folder(out), cache, identity)


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=False)


def observation_set_digest(folder: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file():
            h.update(p.relative_to(folder).as_posix().encode())
            h.update(sha256_file(p).encode())
    return h.hexdigest()


def capture_calibration(request: BuildRequest, observations: list[Observation],
                        revision: str) -> tuple[Path, torch.nn.Module | None]:
    """Roll the BF16 policy out on the calibration observations and store every transformer call.

    One file per observation under a folder keyed by source revision, observation set, policy settings and device,
    so an interrupted capture resumes where it stopped and a changed input captures anew. Returns the folder and,
    when this process captured on a GPU without a memory cap, the policy's BF16 transformer (the source's, on the GPU:
    the builds may take it instead of reading the source again, :class:`release.source.SourceModel`).
    """
    from release.distributed import world
    from release.policy import capture_calls, compute_device, free_memory, load_pipeline, rollout, settings_digest

    key = hashlib.sha256(  # CPU and GPU rollouts differ in bf16: their captures are kept apart
        f"{revision}|{observation_set_digest(request.observations)}|{settings_digest(request.release.policy)}|"
        f"{compute_device()}".encode()
    ).hexdigest()[:20]
    folder = request.cache / "calibration" / key
    folder.mkdir(parents=True, exist_ok=True)
    todo = world().share([o for o in observations if not (folder / f"obs-{o.obs_id:05d}.pt").is_file()])
    transformer = None
    if todo:
        from release.recipes.base import check_finite

        with stage("capture: load the BF16 policy"):
            pipe = load_pipeline(request.source, request.release.policy)
            check_finite(pipe.transformer, request.source)
        with _progress() as progress:
            task = progress.add_task(f"{world().tag}capturing calibration calls", total=len(todo))
            for obs in todo:
                calls: list[dict[str, Any]] = []
                with stage("capture: rollouts"), capture_calls(pipe.transformer, calls.append):
                    rollout(pipe, obs, request.release.policy)
                path = folder / f"obs-{obs.obs_id:05d}.pt"
                torch.save(calls, path.with_suffix(".tmp"))
                os.replace(path.with_suffix(".tmp"), path)
                progress.advance(task)
        from release.memory import cap

        if compute_device() == "cuda" and cap() is None:
            transformer = pipe.transformer
        del pipe
        free_memory()  # the pipeline (but a transformer kept), before the builds place their models
    world().barrier()  # every rank's share is on disk
    return folder, transformer


@dataclass(frozen=True)
class CalibrationData:
    """The captured transformer calls, per observation, and their hash."""

    per_observation: list[list[dict[str, Any]]]
    sha256: str

    @classmethod
    def load(cls, folder: Path, observations: list[Observation]) -> CalibrationData:
        paths = [folder / f"obs-{o.obs_id:05d}.pt" for o in observations]
        h = hashlib.sha256()
        for p in paths:
            h.update(sha256_file(p).encode())
        return cls([torch.load(p, weights_only=True) for p in paths], h.hexdigest())

    def calibration_calls(self, build: BuildConfig) -> list[dict[str, Any]]:
        calls = [c for per_obs in self.per_observation for c in per_obs]
        if len(calls) < build.calibration_calls:
            raise ReleaseError(
                f"builds/{build.name}.yaml: field 'calibration_calls' asks for {build.calibration_calls} calls, the "
                f"{len(self.per_observation)} calibration observations give {len(calls)}; add observations from the "
                "calibration labs or lower calibration_calls"
            )
        return calls[: build.calibration_calls]

    def algorithm_calls(self, build: BuildConfig) -> list[dict[str, Any]]:
        """One call per observation, cycling through the rollout's steps and CFG passes (obs i -> call i mod 8)."""
        calls = [per_obs[i % len(per_obs)] for i, per_obs in enumerate(self.per_observation) if per_obs]
        if build.needs_algorithm_data and len(calls) < build.algorithm_calls:
            raise ReleaseError(
                f"builds/{build.name}.yaml: field 'algorithm_calls' asks for {build.algorithm_calls} calls (one per "
                f"observation), only {len(calls)} calibration observations exist; add observations or lower it"
            )
        return calls[: build.algorithm_calls]

    @staticmethod
    def digest(calls: list[dict[str, Any]]) -> str:
        h = hashlib.sha256()
        for call in calls:
            for key in sorted(call):
                value = call[key]
                tensors = value if isinstance(value, list) else [value]
                for t in tensors:
                    if isinstance(t, torch.Tensor):
                        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
                    else:
                        h.update(repr(t).encode())
        return h.hexdigest()


def _git_commit() -> str:
    root = Path(__file__).resolve().parent.parent
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                             check=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip()


def _device_name() -> str:
    """Where the build ran, first word ``cpu`` or ``cuda``: verification recomputes the codes in its arithmetic."""
    from release.policy import compute_device

    if compute_device() == "cuda":
        return f"cuda ({torch.cuda.get_device_name()})"
    return f"cpu ({platform.machine()})"


def _build_files(build: BuildConfig) -> dict[str, bytes]:
    """The build file and release.yaml as read, uploaded beside the checkpoint so that the card's reproduction
    section names the exact configuration."""
    return {name: (builds_dir() / name).read_bytes() for name in (f"{build.name}.yaml", "release.yaml")}


def run_builds(request: BuildRequest) -> bool:
    """Build every requested build from one load of the source and one calibration capture, then verify each
    against the RTN build; True when all checks passed. Under torchrun each rank makes and verifies its share."""
    import diffusers
    import modelopt

    from release.distributed import world
    from release.export import export_build, reserve_staging
    from release.policy import compute_device, free_memory, map_tensors
    from release.recipes import ObserverPasses, changes_weights, max_weight_error, observes_source, quantize, steps
    from release.verify import REFERENCE_BUILD, Verifier, VerifyRequest

    config = check_architecture(request.source)
    revision = request.identity.revision
    everything = load_observations(request.observations)
    calibration = split(everything, request.release.calibration_labs)
    if not calibration:
        raise ReleaseError(f"{request.observations}: no observation from the calibration labs "
                           f"({', '.join(request.release.calibration_labs)})")
    device = compute_device()
    reserve_staging(request.source, device)
    folder, policy_transformer = capture_calibration(request, calibration, revision)
    with stage("load the calibration capture"):
        data = CalibrationData.load(folder, calibration)
    for build in request.builds:  # every build's data is checked before the first one is made
        data.calibration_calls(build), data.algorithm_calls(build)
    with stage("load the source"):
        source = SourceModel(request.source, device, policy_transformer)
        if policy_transformer is not None:
            del policy_transformer  # what the source did not take of it is collected before the builds start
            free_memory()
    # the reference first: in one process every other build is then verified against it as soon as it is made (a
    # sweep's builds need not all be on disk at once); under torchrun a rank that does not make the reference
    # verifies its builds once every rank is done
    builds = sorted(request.builds, key=lambda b: b.name != REFERENCE_BUILD)
    reference_ready = REFERENCE_BUILD not in {b.name for b in builds}
    verifier, ok, later = Verifier(source), True, []

    def verification(build: BuildConfig) -> VerifyRequest:
        return VerifyRequest.create(build.name, request.out, None, request.source, request.observations,
                                    require_reference=False)

    mine = world().share(builds)
    observed = ObserverPasses(b.calibrator for b in mine if observes_source(b))
    with _progress() as progress:
        task = progress.add_task(f"{world().tag}builds", total=len(mine))
        for build in mine:
            calls, algorithm = data.calibration_calls(build), data.algorithm_calls(build)
            final = request.out / build.repo
            progress.console.print(f"[bold]build {build.name}[/] ({'+'.join(build.recipe)}, {build.scheme}, "
                                   f"{build.calibrator.method}) -> {final}")
            with atomic_dir(final) as tmp, stage(f"build {build.name}"):
                with stage("instantiate the BF16 transformer"):
                    on_device = [[map_tensors(c, lambda t: t.to(device)) for c in cs] for cs in (calls, algorithm)]
                    model = source.instantiate(device)
                with stage("quantize (recipe, calibration)"):
                    quantized = quantize(model, build, on_device[0], on_device[1], observed, source.state)
                exported = export_build(quantized, build, source, on_device[0][0], tmp, _build_files(build))
                uses_data = build.needs_algorithm_data
                write_json(tmp / "provenance.json", {
                    "build": build.name,
                    "repo": build.repo,
                    "recipe": {
                        "name": "+".join(build.recipe),
                        "steps": build.recipe,
                        "parameters": {step.name: step.describe(build) for step in steps(build)},
                        "scheme": build.scheme,
                        "layerwise_calibration": build.layerwise,
                        "alpha_table": quantized.alpha_table,
                        "observer": build.calibrator.model_dump(),
                        "arithmetic": build.arithmetic,
                        "changes_weights": changes_weights(build),
                        "max_weight_error": max_weight_error(build),
                        "reconstruction": quantized.reconstruction,
                    },
                    "source": {"repo": request.identity.repo or request.release.base_model, "revision": revision,
                               "origin": request.identity.origin, "base_revision": request.release.base_revision,
                               "revision_mismatch": request.identity.is_commit
                               and revision != request.release.base_revision,
                               "architecture": {k: config[k] for k in ("hidden_size", "num_hidden_layers")}},
                    "tool": {"name": "release", "version": __version__, "commit": _git_commit()},
                    "versions": {"modelopt": modelopt.__version__, "torch": torch.__version__,
                                 "diffusers": diffusers.__version__, "python": platform.python_version()},
                    "device": _device_name(),
                    "seeds": {"noise_seed": request.release.policy.noise_seed},
                    "policy": request.release.policy.model_dump(),
                    "calibration": {"observations": len(calibration), "calls": len(calls),
                                    "sha256": CalibrationData.digest(calls), "capture_sha256": data.sha256,
                                    "labs": sorted({o.lab for o in calibration})},
                    "algorithm_data": {"calls": len(algorithm) if uses_data else 0,
                                       "sha256": CalibrationData.digest(algorithm) if uses_data else None},
                    "quantized_linears": exported["quantized_linears"],
                    "fp8": {k: exported[k] for k in ("codes_sha256", "codes", "input_amax")},
                    "config_sha256": build.digest(),
                    "date": build_date(),
                })
                del quantized, on_device, model
            progress.console.print(f"  {exported['quantized_linears']} FP8 Linears written")
            reference_ready |= build.name == REFERENCE_BUILD
            if reference_ready:
                ok &= verifier(verification(build))
            else:
                later.append(build)
            progress.advance(task)
    world().barrier()  # the RTN build, the others' reference, is in place
    for build in later:
        ok &= verifier(verification(build))
    return world().all_true(ok)
