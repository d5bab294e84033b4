"""``release build``: calibration capture, ModelOpt FP8 quantization, export in NVIDIA's layout, provenance."""

from __future__ import annotations

import hashlib
import pickle
import platform
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from release import __version__
from release.core.builds import available_builds, load_build, load_release
from release.core.config import BuildConfig, PolicySettings, ReleaseConfig, builds_dir
from release.core.device import modelopt_imported
from release.core.errors import ReleaseError
from release.core.io import (
    atomic_dir,
    build_date,
    cache_dir,
    output_folder,
    replacing,
    sha256_file,
    tool_commit,
    write_json,
)
from release.core.output import info, progress, warning
from release.core.profile import stage
from release.core.provenance import Provenance
from release.inputs.observations import Observation, dataset_id, load_observations, observation_set_digest, split
from release.inputs.source import (
    OBSERVATIONS_ENV,
    Revision,
    SourceModel,
    check_architecture,
    check_revision,
    recalled_inputs,
    resolve_source,
    source_identity,
    source_license,
)
from release.quantize.extensions import ExtensionBuild

if TYPE_CHECKING:
    from release.quantize.recipes import ObserverPasses


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
        source, observations = recalled_inputs(out, source, observations)
        src = resolve_source(release, source)
        identity = source_identity(src)
        check_revision(release, identity, allow_revision_mismatch)  # before any work
        if observations is None:
            observations = src.parent / "observations"
        if not (observations / "index.json").is_file():
            raise ReleaseError(
                f"observation set {observations} not found; pass --observations DIR or set {OBSERVATIONS_ENV}"
            )
        cache = cache_dir()
        return cls(release, builds, src, observations, output_folder(out, "--dist"), cache, identity)


def capture_folder(cache: Path, source: Path, observations: Path, policy: PolicySettings) -> Path:
    """Where the calibration capture of ``source`` on ``observations`` under ``policy`` is kept in ``cache``."""
    from release.core.device import compute_device
    from release.core.digest import folder_digest
    from release.inputs.policy import settings_digest

    key = hashlib.sha256(  # CPU and GPU rollouts differ in bf16: their captures are kept apart
        f"{folder_digest(source)}|{observation_set_digest(observations)}|{settings_digest(policy)}|"
        f"{compute_device()}".encode()
    ).hexdigest()[:20]
    return cache / "calibration" / key


def capture_calibration(request: BuildRequest, observations: list[Observation]) -> tuple[Path, torch.nn.Module | None]:
    """Roll the BF16 policy out on the calibration observations and store every transformer call.

    One file per observation under a folder keyed by the source's content (:func:`release.core.digest.folder_digest`:
    not its declared revision, which an edited source may keep), observation set, policy settings and device,
    so an interrupted capture resumes where it stopped and a changed input captures anew. Returns the folder and,
    when this process captured on a GPU without a memory cap, the policy's BF16 transformer (the source's, on the GPU:
    the builds may take it instead of reading the source again, :class:`release.inputs.source.SourceModel`).
    """
    from release.core.device import compute_device, free_memory
    from release.core.distributed import world
    from release.inputs.policy import capture_calls, load_pipeline, rollout

    folder = capture_folder(request.cache, request.source, request.observations, request.release.policy)
    folder.mkdir(parents=True, exist_ok=True)
    _, todo = world().unfinished(observations, lambda o: (folder / f"obs-{o.obs_id:05d}.pt").is_file())
    transformer = None
    if todo:
        from release.inputs.source import check_finite

        with progress(f"{world().tag}capturing calibration calls", len(todo)) as bar:
            with bar.part("load"), stage("capture: load the BF16 policy"):
                pipe = load_pipeline(request.source, request.release.policy)
                check_finite(pipe.transformer, request.source)
            for obs in todo:
                calls: list[dict[str, Any]] = []
                with stage("capture: rollouts"), capture_calls(pipe.transformer, calls.append):
                    rollout(pipe, obs, request.release.policy)
                path = folder / f"obs-{obs.obs_id:05d}.pt"
                with replacing(path) as file:
                    torch.save(calls, file)
                bar.advance()
        from release.core.memory import cap

        if compute_device() == "cuda" and cap() is None:
            transformer = pipe.transformer
        del pipe
        free_memory()  # the pipeline (but a transformer kept), before the builds place their models
    world().barrier()  # every rank's share is on disk
    return folder, transformer


def calls_per_rollout(policy: PolicySettings) -> int:
    """Transformer calls of one rollout: per denoising step a conditional pass and, under classifier-free guidance
    (diffusers' rule: a guidance scale other than 1), an unconditional one."""
    return policy.steps * (2 if policy.guidance != 1.0 else 1)


def check_data(build: BuildConfig, observations: int, calls: int) -> None:
    """Whether ``observations`` calibration observations giving ``calls`` transformer calls are enough for the build's
    calibration calls and algorithm calls (one per observation); else a one-line error naming the build file."""
    if calls < build.calibration_calls:
        raise ReleaseError(
            f"{builds_dir() / build.name}.yaml: field 'calibration_calls' asks for {build.calibration_calls} calls, "
            f"the {observations} calibration observations give {calls}; add observations from the calibration labs "
            "or lower calibration_calls"
        )
    if build.needs_algorithm_data and observations < build.algorithm_calls:
        raise ReleaseError(
            f"{builds_dir() / build.name}.yaml: field 'algorithm_calls' asks for {build.algorithm_calls} calls (one "
            f"per observation), only {observations} calibration observations exist; add observations or lower it"
        )


@dataclass(frozen=True)
class CalibrationData:
    """The captured transformer calls, per observation, and their hash."""

    per_observation: list[list[dict[str, Any]]]
    sha256: str

    @classmethod
    def load(cls, folder: Path, observations: list[Observation]) -> CalibrationData | None:
        """The capture in ``folder``; None when one of its files is damaged (cut short, not torch's format): that
        file is named and removed, for the caller to capture it again."""
        paths = [folder / f"obs-{o.obs_id:05d}.pt" for o in observations]
        per_observation = []
        for p in paths:
            try:
                per_observation.append(torch.load(p, weights_only=True))
            except (RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as exc:
                warning(f"{p}: a damaged calibration capture ({str(exc).splitlines()[0]}); removed, captured again")
                p.unlink()
                return None
        h = hashlib.sha256()
        for p in paths:
            h.update(sha256_file(p).encode())
        return cls(per_observation, h.hexdigest())

    def calibration_calls(self, build: BuildConfig) -> list[dict[str, Any]]:
        calls = [c for per_obs in self.per_observation for c in per_obs]
        check_data(build, len(self.per_observation), len(calls))
        return calls[: build.calibration_calls]

    def algorithm_calls(self, build: BuildConfig) -> list[dict[str, Any]]:
        """One call per observation, cycling through the rollout's steps and CFG passes (obs i -> call i mod 8)."""
        calls = [per_obs[i % len(per_obs)] for i, per_obs in enumerate(self.per_observation) if per_obs]
        check_data(build, len(calls), sum(len(per_obs) for per_obs in self.per_observation))
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


def _device_name() -> str:
    """Where the build ran, first word ``cpu`` or ``cuda``: verification recomputes the codes in its arithmetic."""
    from release.core.device import compute_device

    if compute_device() == "cuda":
        return f"cuda ({torch.cuda.get_device_name()})"
    return f"cpu ({platform.machine()})"


def _build_files(build: BuildConfig) -> dict[str, bytes]:
    """The build file and release.yaml as read, uploaded beside the checkpoint so that the card's reproduction
    section names the exact configuration."""
    return {name: (builds_dir() / name).read_bytes() for name in (f"{build.name}.yaml", "release.yaml")}


class Builder:
    """Makes builds from one load of the source and one calibration capture (:meth:`prepare`), each into its folder
    under ``request.out`` with its provenance (:meth:`make`)."""

    def __init__(self, request: BuildRequest, config: dict[str, Any], calibration: list[Observation],
                 data: CalibrationData, source: SourceModel, device: str, extensions: ExtensionBuild) -> None:
        self.request, self.config, self.calibration, self.data = request, config, calibration, data
        self.source, self.device, self.extensions = source, device, extensions

    @classmethod
    def prepare(cls, request: BuildRequest) -> Builder:
        """Check the source, capture (or find) the calibration calls, check every build's data before the first one
        is made, and load the source where the builds run."""
        from release.core.device import compute_device, free_memory
        from release.quantize.export import reserve_staging

        config = check_architecture(request.source)
        everything = load_observations(request.observations)
        calibration = split(everything, request.release.calibration_labs)
        if not calibration:
            raise ReleaseError(f"{request.observations}: no observation from the calibration labs "
                               f"({', '.join(request.release.calibration_labs)})")
        for build in request.builds:  # before the capture: its length is known from the policy settings
            check_data(build, len(calibration), len(calibration) * calls_per_rollout(request.release.policy))
        device = compute_device()
        reserve_staging(request.source, device)
        extensions = ExtensionBuild(device)  # compiled while the capture runs
        folder, policy_transformer = capture_calibration(request, calibration)
        with stage("load the calibration capture"):
            data = CalibrationData.load(folder, calibration)
        if data is None:  # a damaged file, removed: its observation is captured again, once
            folder, policy_transformer = capture_calibration(request, calibration)
            data = CalibrationData.load(folder, calibration)
            if data is None:
                raise ReleaseError(f"{folder}: a calibration capture was damaged right after it was written; check "
                                   f"the disk of {request.cache} (RELEASE_CACHE)")
        for build in request.builds:  # every build's data is checked before the first one is made
            data.calibration_calls(build), data.algorithm_calls(build)
        identity, release = request.identity, request.release  # said once the inputs and the capture are checked
        info(f"source: {request.source} ({identity.repo + ' at ' if identity.repo else ''}{identity.origin} "
             f"{identity.revision[:12]})")
        if identity.is_commit and identity.revision != release.base_revision:  # allowed, or create had refused
            warning(f"the source is not base_revision {release.base_revision[:12]} of release.yaml "
                    "(--allow-revision-mismatch): provenance and cards say so")
        with stage("load the source"):
            source = SourceModel(request.source, device, policy_transformer)
            if policy_transformer is not None:
                del policy_transformer  # what the source did not take of it is collected before the builds start
                free_memory()
        return cls(request, config, calibration, data, source, device, extensions)

    def make(self, build: BuildConfig, observed: ObserverPasses, check: Callable[[Path], bool] | None = None
             ) -> bool | None:
        """Quantize, export and record the provenance of one build, atomically into its folder. ``check`` (its
        verification) runs on the finished folder before it is put in place, so that a kill during it leaves the old
        build whole; its answer is returned (None without one)."""
        import diffusers
        modelopt_imported()
        import modelopt

        from release.inputs.policy import map_tensors
        from release.quantize.export import export_build, kept_dtypes
        from release.quantize.recipes import changes_weights, max_weight_error, quantize, steps

        request, data, source, device = self.request, self.data, self.source, self.device
        self.extensions.wait()
        revision = request.identity.revision
        calls, algorithm = data.calibration_calls(build), data.algorithm_calls(build)
        final = request.out / build.repo
        info(f"build {build.name} ({'+'.join(build.recipe)}, {build.scheme}, {build.calibrator.method}) -> {final}")
        with atomic_dir(final) as tmp:
            with progress(f"build {build.name}") as bar, stage(f"build {build.name}"):
                with bar.part("instantiate"), stage("instantiate the BF16 transformer"):
                    on_device = [[map_tensors(c, lambda t: t.to(device)) for c in cs] for cs in (calls, algorithm)]
                    model = source.instantiate(device)
                with bar.part("quantize"), stage("quantize (recipe, calibration)"):
                    quantized = quantize(model, build, on_device[0], on_device[1], observed, source.state)
                with bar.part("export"):
                    exported = export_build(quantized, build, source, on_device[0][0], tmp, _build_files(build))
                uses_data = build.needs_algorithm_data
                provenance = {
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
                               "architecture": {k: self.config[k] for k in ("hidden_size", "num_hidden_layers")},
                               "license": source_license(request.source)},
                    "tool": {"name": "release", "version": __version__, "commit": tool_commit()},
                    "versions": {"modelopt": modelopt.__version__, "torch": torch.__version__,
                                 "diffusers": diffusers.__version__, "python": platform.python_version()},
                    "device": _device_name(),
                    "seeds": {"noise_seed": request.release.policy.noise_seed},
                    "policy": request.release.policy.model_dump(),
                    "calibration": {"observations": len(self.calibration), "calls": len(calls),
                                    "sha256": CalibrationData.digest(calls), "capture_sha256": data.sha256,
                                    "labs": sorted({o.lab for o in self.calibration}),
                                    "dataset": dataset_id(request.observations)},
                    "algorithm_data": {"calls": len(algorithm) if uses_data else 0,
                                       "sha256": CalibrationData.digest(algorithm) if uses_data else None},
                    "quantized_linears": exported["quantized_linears"],
                    "fp8": {k: exported[k] for k in ("codes_sha256", "codes", "input_amax")},
                    "kept_dtypes": kept_dtypes(build, tmp / "transformer"),
                    "config_sha256": build.digest(),
                    "date": build_date(),
                }
                Provenance.model_validate(provenance)  # what every reader relies on (a failure here is this tool's bug)
                write_json(tmp / "provenance.json", provenance)
                del quantized, on_device, model
                bar.result = f"{exported['quantized_linears']} FP8 Linears written"
            passed = None if check is None else check(tmp)
        return passed
