"""Validated configuration: ``builds/release.yaml`` and one YAML file per build.

Every error names the file, the line where the YAML parser or the node position knows it, and the
field path, so that a user can fix the file without reading a traceback.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from release import ReleaseError

SOURCE_ENV = "RELEASE_SOURCE"
BUILDS_ENV = "RELEASE_BUILDS"

# The 14 Linears per decoder layer that the Cosmos3-Nano@fp8 layout quantizes (both towers).
NANO_QUANTIZED = [
    "layers.*.self_attn.to_q",
    "layers.*.self_attn.to_k",
    "layers.*.self_attn.to_v",
    "layers.*.self_attn.to_out",
    "layers.*.mlp.gate_proj",
    "layers.*.mlp.up_proj",
    "layers.*.mlp.down_proj",
    "layers.*.self_attn.add_q_proj",
    "layers.*.self_attn.add_k_proj",
    "layers.*.self_attn.add_v_proj",
    "layers.*.self_attn.to_add_out",
    "layers.*.mlp_moe_gen.gate_proj",
    "layers.*.mlp_moe_gen.up_proj",
    "layers.*.mlp_moe_gen.down_proj",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class License(_Strict):
    id: str = "other"
    name: str
    link: str


class Sibling(_Strict):
    build: str
    repo: str


class PolicySettings(_Strict):
    """How the joint-position DROID policy is rolled out (domain notes §4)."""

    steps: int = Field(4, ge=1, le=100)
    shift: float = Field(5.0, gt=0)
    guidance: float = Field(3.0, ge=1.0)
    chunk: int = Field(32, ge=1, description="action steps per observation (plus the state row)")
    action_dims: int = Field(8, ge=1, description="7 joint positions + gripper")
    domain: str = "droid_lerobot"
    resolution_tier: int = 256
    noise_seed: int = 0


class ReleaseConfig(_Strict):
    base_model: str
    base_revision: str
    license: License
    org: str
    languages: list[str] = Field(min_length=1)
    library_name: str = "diffusers"
    tags: list[str] = []
    siblings: list[Sibling] = Field(min_length=1)
    policy: PolicySettings = PolicySettings()
    calibration_labs: list[str] = []
    heldout_labs: list[str] = []
    action_stats: str = Field("action_stats.json", description="per-dimension action sigma, in the observation set")


class Gate(_Strict):
    overall_sigma: float = Field(0.13, gt=0)
    gripper_change_rate: float = Field(0.005, ge=0, le=1)


class SmoothQuant(_Strict):
    """SmoothQuant folded into the preceding norms (and into ``up_proj`` for ``down_proj``)."""

    alpha: Literal["auto"] | Annotated[float, Field(ge=0.0, le=1.0)] = "auto"
    alpha_step: float = Field(0.1, gt=0, le=1, description="grid step of the per-layer alpha search")
    fold_up_down: bool = True


class Calibrator(_Strict):
    """How the static input scales are calibrated from the calibration calls."""

    method: Literal["max", "moving_average", "histogram"] = "max"
    momentum: float = Field(0.01, gt=0, le=1, description="moving_average: weight of each new call's max")
    percentile: float = Field(99.99, gt=0, le=100, description="histogram: percentile of |x| (ModelOpt)")


class BuildConfig(_Strict):
    name: str
    title: str
    repo: str
    recipe: Literal["rtn", "smoothquant"]
    scheme: Literal["fp8_w8a8_per_tensor_static"] = "fp8_w8a8_per_tensor_static"
    smoothquant: SmoothQuant | None = None
    calibrator: Calibrator = Calibrator()
    arithmetic: Literal["native", "cpu", "cuda"] = Field(
        "native", description="FP8 rounding of the export: the building device's, or CPU's / CUDA's emulated"
    )
    quantized: list[str] = Field(default_factory=lambda: list(NANO_QUANTIZED), min_length=1)
    kept_bf16: list[str] = Field(min_length=1)
    calibration_calls: int = Field(256, ge=1)
    algorithm_calls: int = Field(32, ge=0)
    gate: Gate = Gate()
    description: str = ""
    delivered: bool = False

    @field_validator("quantized")
    @classmethod
    def _patterns_are_linears(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p.startswith("layers."):
                raise ValueError(f"{p!r} is not a decoder-layer Linear pattern (expected 'layers.*.<module>')")
        return v

    @model_validator(mode="after")
    def _recipe_parameters(self) -> BuildConfig:
        if self.recipe == "smoothquant":
            if self.smoothquant is None:
                raise ValueError("recipe 'smoothquant' needs a 'smoothquant' section (alpha: auto or 0..1)")
            if self.algorithm_calls < 1:
                raise ValueError("recipe 'smoothquant' needs algorithm_calls >= 1")
        elif self.smoothquant is not None:
            raise ValueError(f"'smoothquant' section given for recipe {self.recipe!r}; remove it")
        return self

    def digest(self) -> str:
        """Stable hash of the validated build configuration (recorded in provenance)."""
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()


def _line_of(node: yaml.Node | None, path: tuple[Any, ...]) -> int | None:
    """1-based line of the YAML node at ``path``, or of its deepest existing parent."""
    line = None
    for key in path:
        if node is None:
            break
        line = node.start_mark.line + 1
        if isinstance(node, yaml.MappingNode):
            node = next((v for k, v in node.value if k.value == str(key)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(key, int) and key < len(node.value):
            node = node.value[key]
        else:
            node = None
    if node is not None:
        line = node.start_mark.line + 1
    return line


def _load_yaml(path: Path) -> tuple[dict[str, Any], yaml.Node | None]:
    if not path.is_file():
        raise ReleaseError(f"{path}: file not found")
    text = path.read_text(encoding="utf-8")
    try:
        data = yaml.safe_load(text)
        node = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ReleaseError(f"{path}{where}: YAML syntax error: {problem}; fix the YAML syntax") from exc
    if not isinstance(data, dict):
        raise ReleaseError(f"{path}: expected a mapping of fields at the top level")
    return data, node


def _validate(model: type[BaseModel], path: Path) -> Any:
    data, node = _load_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = tuple(err["loc"])
        field = ".".join(str(p) for p in loc) or "(top level)"
        line = _line_of(node, loc)
        where = f":{line}" if line else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _fields_at(model, loc[:-1])
            msg = f"unknown field; valid fields here: {', '.join(allowed)}"
        elif err["type"] == "missing":
            msg = "required field is missing; add it"
        more = f" (and {len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
        raise ReleaseError(f"{path}{where}: field '{field}': {msg}{more}") from exc


def _fields_at(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    cur: Any = model
    for key in loc:
        info = getattr(cur, "model_fields", {}).get(key)
        if info is None:
            return []
        cur = info.annotation
    return sorted(getattr(cur, "model_fields", {}))


def builds_dir() -> Path:
    return Path(os.environ.get(BUILDS_ENV, "builds"))


def load_release(directory: Path | None = None) -> ReleaseConfig:
    cfg: ReleaseConfig = _validate(ReleaseConfig, (directory or builds_dir()) / "release.yaml")
    return cfg


def available_builds(directory: Path | None = None) -> list[str]:
    d = directory or builds_dir()
    return sorted(p.stem for p in d.glob("*.yaml") if p.stem != "release")


def load_build(name: str, directory: Path | None = None) -> BuildConfig:
    d = directory or builds_dir()
    path = d / f"{name}.yaml"
    if name == "release" or not path.is_file():
        names = ", ".join(available_builds(d)) or "none"
        raise ReleaseError(f"unknown build {name!r}: no {path}; available builds: {names}")
    cfg: BuildConfig = _validate(BuildConfig, path)
    if cfg.name != name:
        raise ReleaseError(f"{path}: field 'name': is {cfg.name!r} but the file is {name}.yaml; make them equal")
    return cfg
