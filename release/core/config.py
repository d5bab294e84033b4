"""Validated configuration: the models of ``builds/release.yaml`` and of one YAML file per build, and where the
folder of build files is (``--builds``, ``RELEASE_BUILDS``, ``./builds``, the shipped defaults); reading and
validating the files is :mod:`release.core.builds`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from release.core.errors import ReleaseError
from release.core.rules import (
    Campaign,
    Executor,
    Margin,
    Selection,
    Strict,
    margin_value,
    unique_build_names,
)

SOURCE_ENV = "RELEASE_SOURCE"
BUILDS_ENV = "RELEASE_BUILDS"
# MAJOR.MINOR.PATCH with an optional pre-release: the Hub tag is v<version>, a valid git ref name
RELEASE_VERSION = re.compile(r"(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)(-[0-9A-Za-z]+(\.[0-9A-Za-z]+)*)?")

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


class License(Strict):
    id: str = "other"
    name: str
    link: str


def hub_name(value: str, kind: Literal["org", "repo"]) -> str:
    """``value`` if huggingface_hub's own validator accepts it as an organisation or a repo name (it becomes a Hub
    repo id and, with ``release push --target``, a folder: no ``/``, ``..`` or leading ``.``), else ValueError."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(f"{value}/repo" if kind == "org" else f"org/{value}")
    except HFValidationError as exc:
        raise ValueError(f"{value!r} is not a valid Hub {kind} name: letters, digits, '-', '_' and '.', no '/', "
                         "'..' or '--', not starting or ending with '-' or '.', at most 96 characters") from exc
    return value


class Collection(Strict):
    """The Hub collection ``release push`` keeps of the delivered repos (the Hub's limits: a title of at most 60
    characters, a description of at most 150)."""

    title: str = Field(min_length=1, max_length=60)
    description: str | None = Field(None, max_length=150)


class Override(Strict):
    """A release that delivers otherwise than its selection chose: ``deliver: true`` publishes a build the rule did
    not choose, ``deliver: false`` withholds one it chose; the reason is printed on the cards."""

    deliver: bool
    reason: str = Field(min_length=1)

    @field_validator("reason")
    @classmethod
    def _one_line(cls, v: str) -> str:
        if not v.strip() or "\n" in v.strip():
            raise ValueError("give the reason as one non-empty line (the cards print it)")
        return v.strip()


class PolicySettings(Strict):
    """How the joint-position DROID policy is rolled out (domain notes §4)."""

    steps: int = Field(4, ge=1, le=100)
    shift: float = Field(5.0, gt=0)
    guidance: float = Field(3.0, ge=1.0)
    chunk: int = Field(32, ge=1, description="action steps per observation (plus the state row)")
    action_dims: int = Field(8, ge=1, description="7 joint positions + gripper")
    domain: str = "droid_lerobot"
    resolution_tier: int = 256
    noise_seed: int = 0
    noise_seeds: int = Field(1, ge=1, le=64, description="rollouts per observation, under noise seeds noise_seed, "
                             "noise_seed + 1, ...: the statistics average them within the observation, so results "
                             "hold beyond one noise draw (K times the rollouts)")


# diffusers' step policy off: a candidate runs W8A8 on every step (served: its StepSchedule's), the card's diffusers
# setting; here, not in release.measure.evaluate, so that a card does not import the evaluation's torch and diffusers.
NATIVE_STEPS = {"mixed_precision_format": "none"}


class StepPolicy(Strict):
    """The policy server's step policy, as ``release eval --path served`` runs it: step ``i`` of ``n`` runs W8A16
    (the weight dequantized to BF16, a BF16 matmul) when ``i < w8a16_first_steps`` or ``i >= n -
    w8a16_last_steps`` (cosmos-framework's ``mixed_precision_first_steps`` and ``mixed_precision_last_steps``), every
    other step W8A8. The seed served 0 and 0: W8A8 on every step."""

    w8a16_first_steps: int = Field(0, ge=0, le=100)
    w8a16_last_steps: int = Field(0, ge=0, le=100)

    def mode(self, step: int, steps: int) -> str:
        w8a16 = step < self.w8a16_first_steps or step >= steps - self.w8a16_last_steps
        return "W8A16" if w8a16 else "W8A8"


class ReleaseConfig(Strict):
    version: str = Field(description="the version of this release of the checkpoints (not of the tool): tag "
                         "v<version>, release notes in RELEASES.md")
    base_model: str
    base_revision: str
    license: License
    org: str
    languages: list[str] = Field(min_length=1)
    instruction_languages: list[str] = Field(["en"], min_length=1, description="the languages of the model's "
                                             "inputs (DROID's instructions are English): the Hub's 'language' "
                                             "metadata; 'languages' are the cards' own")
    library_name: str = Field("cosmos", description="the Hub's library tag: 'cosmos' as the seed card, since the "
                              "Hub's 'diffusers' snippet would skip ModelOpt's restore (builds/release.yaml)")
    tags: list[str] = Field(default_factory=list)
    repos: dict[str, str] = Field(min_length=1, description="build -> Hub repo name, for every build that may be "
                                  "delivered; which are delivered is the selection's choice (selection.json)")
    override: dict[str, Override] = Field({}, description="build -> deliver: true|false and a reason: a release "
                                          "that delivers otherwise than its selection chose")
    policy: PolicySettings = PolicySettings()
    served_steps: StepPolicy = Field(StepPolicy(), description="the policy server's step policy that 'release eval "
                                     "--path served' runs (W8A16 on the first and last steps, W8A8 between)")
    calibration_labs: list[str] = Field(default_factory=list)
    heldout_labs: list[str] = Field(default_factory=list)
    action_stats: str = Field("action_stats.json", description="per-dimension action sigma, in the observation set")
    selection: Selection | None = None
    equivalence_margin: Annotated[Margin, BeforeValidator(margin_value)] = Field(
        Margin(), description="the practical floor of a difference to the baseline: {sigma: S} or {of_baseline: F} "
        "(F times the baseline's overall error on the same path and split; default 0.1). 'within +-margin' is stated "
        "beside a verdict, never instead of it")
    sweep: list[str] = Field([], description="the builds 'release build --all' makes, in the campaign's order "
                             "(default: every build file)")
    campaign: Campaign = Campaign()
    executor: Executor = Executor()
    collection: Collection | None = Field(None, description="the Hub collection of the delivered repos that "
                                          "'release push' creates or updates (none without it)")

    @field_validator("sweep")
    @classmethod
    def _sweep(cls, v: list[str]) -> list[str]:
        return unique_build_names(v, "sweep")

    @field_validator("served_steps")
    @classmethod
    def _served_steps(cls, v: StepPolicy, info: ValidationInfo) -> StepPolicy:
        """Neither count is more than the policy's steps (``policy``, validated before it, is absent when invalid)."""
        policy = info.data.get("policy")
        for field in ("w8a16_first_steps", "w8a16_last_steps"):
            if policy is not None and getattr(v, field) > policy.steps:
                raise ValueError(f"{field} is {getattr(v, field)}, more than the policy's {policy.steps} steps "
                                 f"(policy.steps); give 0 to {policy.steps}")
        return v

    @field_validator("repos")
    @classmethod
    def _repos(cls, v: dict[str, str]) -> dict[str, str]:
        unique_build_names(list(v), "repos")
        for repo in v.values():
            hub_name(repo, "repo")
        twice = next((r for i, r in enumerate(v.values()) if r in list(v.values())[:i]), None)
        if twice is not None:
            raise ValueError(f"repo {twice!r} is named for two builds; give each build its own repo")
        return v

    @model_validator(mode="after")
    def _deliverable_names(self) -> ReleaseConfig:
        """Every override has a repo to be delivered to (a chosen build without one is refused when delivered: the
        rule may name builds not defined yet)."""
        name = next((n for n in self.override if n not in self.repos), None)
        if name is not None:
            raise ValueError(f"'override.{name}' names {name!r}, which has no repo in 'repos'; add '{name}: REPO' "
                             "there (a build that may be delivered needs its repo)")
        return self

    @field_validator("version")
    @classmethod
    def _version(cls, v: str) -> str:
        if not RELEASE_VERSION.fullmatch(v):
            raise ValueError(f"{v!r} is not a release version: MAJOR.MINOR.PATCH (e.g. 1.0.0, or 1.1.0-rc.1)")
        return v

    @field_validator("org")
    @classmethod
    def _org(cls, v: str) -> str:
        return hub_name(v, "org")


MAX_ALPHAS = 1000  # SmoothQuant's alpha search tries at most this many alphas per group (as AWQ's n_grid)


class SmoothQuant(Strict):
    """SmoothQuant folded into the preceding norms (and into ``up_proj`` for ``down_proj``)."""

    alpha: Literal["auto"] | Annotated[float, Field(ge=0.0, le=1.0)] = "auto"
    alpha_step: float = Field(0.1, gt=0, le=1, description="grid step of the per-layer alpha search: 0, step, ..., 1, "
                              f"at most {MAX_ALPHAS} alphas")
    fold_up_down: bool = True

    @field_validator("alpha_step")
    @classmethod
    def _grid_size(cls, v: float) -> float:
        """A step of 1e-9 would search 10^9 alphas per group: the grid is ``round(1 / step) + 1`` alphas."""
        if 1 / v >= MAX_ALPHAS - 0.5:
            raise ValueError(f"alpha_step {v:g} searches more than {MAX_ALPHAS:,} alphas (0, step, ..., 1); give a "
                             f"step of {1 / (MAX_ALPHAS - 1):.4g} or more")
        return v

    @field_validator("alpha", mode="before")
    @classmethod
    def _alpha(cls, v: Any) -> Any:
        """One message for both members of the union (pydantic would report each member's error apart)."""
        if v == "auto" or (type(v) in (int, float) and 0 <= v <= 1):
            return v
        raise ValueError(f"alpha must be 'auto' or a number in 0..1, got {v!r}")


class Awq(Strict):
    """AWQ's activation-aware scales (s = mean|x|^alpha, normalised), alpha on a grid, folded like SmoothQuant."""

    n_grid: int = Field(20, ge=1, le=1000, description="alpha grid: 0, 1/n, ..., (n - 1)/n (AWQ's default 20)")
    fold_up_down: bool = True


class Gptq(Strict):
    """ModelOpt's GPTQ (``algorithm: {method: gptq}``) on the scheme's FP8 quantizers."""

    perc_damp: float = Field(0.01, ge=1e-6, le=1, description="damping, a share of the mean Hessian diagonal (below "
                             "1e-6 it is lost in the float32 diagonal: no damping)")
    block_size: int = Field(128, ge=1, description="columns per GPTQ block")
    layerwise: bool = Field(False, description="ModelOpt's layer-by-layer calibration: each decoder layer's Hessian "
                            "from the outputs of the layers before it, already quantized")


class AutoRound(Strict):
    """AutoRound. ``tuning: none`` reproduces the seed's FP8 builds: its quantizer tuned only INT, UINT and NVFP4
    weights, so the FP8 codes stay round-to-nearest, and the step's effect is the activation calibration that
    follows (here: ModelOpt's layer-by-layer max calibration, each layer seeing the quantized outputs of the layers
    before it). ``tuning: auto-round`` runs the auto-round library's sign-gradient tuning of the rounding and the
    clipping (the ``autoround`` extra)."""

    tuning: Literal["none", "auto-round"] = "none"
    iters: int = Field(200, ge=1, le=100_000, description="auto-round: optimisation steps per decoder layer (its "
                       "default 200; 1000 for its best accuracy)")
    lr: float | None = Field(None, gt=0, le=1, description="auto-round: learning rate (default 1 / iters; the tuned "
                             "rounding offsets lie within +-0.5)")


RecipeStep = Literal["rtn", "smoothquant", "awq", "gptq", "autoround"]
SMOOTHING_STEPS = ("smoothquant", "awq")
WEIGHT_STEPS = ("gptq", "autoround")
SECTIONS = {"smoothquant": SmoothQuant, "awq": Awq, "gptq": Gptq, "autoround": AutoRound}
Scheme = Literal["fp8_w8a8_per_tensor_static", "fp8_per_channel_per_token"]


class Gate(Strict):
    overall_sigma: float = Field(0.13, gt=0)
    gripper_change_rate: float = Field(0.005, ge=0, le=1)


class Calibrator(Strict):
    """How the static input scales are calibrated from the calibration calls."""

    method: Literal["max", "moving_average", "histogram", "range_shrink"] = "max"
    momentum: float = Field(0.01, gt=0, le=1, description="moving_average, range_shrink: weight of each new call's "
                            "statistic in the exponential moving average (range_shrink's averaging_constant)")
    shrink_percent: float = Field(0.01, gt=0, lt=50, description="range_shrink: percent of the signed values "
                                  "dropped from each tail of every call (TI edgeai-tensorlab range_shrink_percentile)")
    percentile: float = Field(99.99, gt=0, le=100, description="histogram: percentile of |x| (ModelOpt)")


LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z0-9]+)*")  # en, ko, pt-BR, zh_Hant


def _localized(value: Any) -> Any:
    """A text shown on the cards: one string for every language, or ``{en: ..., ko: ...}`` with ``en`` (the tool's
    language) required and each language's text a non-empty string. One message for every shape that is neither
    (pydantic would report each member of the union apart)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "en" in value and all(
            isinstance(k, str) and LANGUAGE_CODE.fullmatch(k) and isinstance(v, str) and v.strip()
            for k, v in value.items()):
        return value
    raise ValueError("give one text, or a text per language such as {en: 'FP8 GPTQ', ko: 'FP8 GPTQ 빌드'}: 'en' is "
                     f"required, keys are language codes, texts are not empty; got {value!r}")


Localized = Annotated[str | dict[str, str], BeforeValidator(_localized)]


class BuildConfig(Strict):
    name: str
    title: Localized
    repo: str
    recipe: list[RecipeStep] = Field(min_length=1, description="steps in order: at most one smoothing step "
                                     "(smoothquant, awq), then at most one weight step (gptq, autoround); rtn alone "
                                     "is ModelOpt's round-to-nearest")
    scheme: Scheme = "fp8_w8a8_per_tensor_static"
    smoothquant: SmoothQuant | None = None
    awq: Awq | None = None
    gptq: Gptq | None = None
    autoround: AutoRound | None = None
    calibrator: Calibrator = Calibrator()
    arithmetic: Literal["native", "cpu", "cuda"] = Field(
        "native", description="FP8 rounding of the export: the building device's, or CPU's / CUDA's emulated"
    )
    quantized: list[str] = Field(default_factory=lambda: list(NANO_QUANTIZED), min_length=1)
    kept_bf16: list[str] = Field(min_length=1)
    calibration_calls: int = Field(256, ge=1)
    algorithm_calls: int = Field(32, ge=0)
    gate: Gate = Gate()
    description: Localized = ""
    deliverable: bool = Field(True, description="false: a build that NVIDIA's policy server cannot serve; "
                              "'release push' refuses it")

    @model_validator(mode="before")
    @classmethod
    def _no_delivered(cls, v: Any) -> Any:
        if isinstance(v, dict) and "delivered" in v:
            raise ValueError("field 'delivered' is gone: the delivered builds are the ones 'release select' chooses "
                             "(selection.json), or an 'override' in release.yaml; remove the field")
        return v

    @field_validator("recipe", mode="before")
    @classmethod
    def _one_step(cls, v: Any) -> Any:
        return [v] if isinstance(v, str) else v

    @field_validator("repo")
    @classmethod
    def _repo(cls, v: str) -> str:
        return hub_name(v, "repo")

    @field_validator("quantized")
    @classmethod
    def _patterns_are_linears(cls, v: list[str]) -> list[str]:
        for p in v:
            if not p.startswith("layers."):
                raise ValueError(f"{p!r} is not a decoder-layer Linear pattern (expected 'layers.*.<module>')")
        return v

    @model_validator(mode="after")
    def _recipe_parameters(self) -> BuildConfig:
        steps = self.recipe
        if len(set(steps)) != len(steps):
            raise ValueError("a recipe step is listed twice in 'recipe'; list each once")
        if "rtn" in steps and len(steps) > 1:
            raise ValueError("'rtn' is the recipe without steps; remove it or the other steps")
        smoothing = [s for s in steps if s in SMOOTHING_STEPS]
        weights = [s for s in steps if s in WEIGHT_STEPS]
        if len(smoothing) > 1 or len(weights) > 1:
            raise ValueError("a recipe takes at most one smoothing step (smoothquant, awq) and one weight step "
                             "(gptq, autoround)")
        if smoothing and weights and steps.index(smoothing[0]) > steps.index(weights[0]):
            raise ValueError(f"'{smoothing[0]}' must come before '{weights[0]}' in 'recipe' (smoothing is folded "
                             "into the weights the weight step quantizes)")
        for section in SECTIONS:
            if getattr(self, section) is not None and section not in steps:
                raise ValueError(f"'{section}' section given, but 'recipe' has no step {section!r}; remove it")
        if self.needs_algorithm_data and self.algorithm_calls < 1:
            raise ValueError(f"recipe {'+'.join(steps)!r} needs algorithm_calls >= 1")
        if self.layerwise and self.calibrator.method != "max":
            raise ValueError(f"calibrator '{self.calibrator.method}' cannot follow layer-by-layer calibration "
                             f"({'+'.join(steps)}); use method 'max'")
        if self.scheme == "fp8_per_channel_per_token" and self.calibrator.method != "max":
            raise ValueError("scheme 'fp8_per_channel_per_token' quantizes activations per token at run time: "
                             "there are no static input scales to calibrate; use calibrator method 'max'")
        return self

    def text(self, field: Literal["title", "description"], lang: str = "en") -> str:
        """The field in ``lang``: its one text, or its text for ``lang``; a per-language field without that language
        is refused (the card would show English there), as ``check_catalog`` refuses a catalog gap."""
        value: str | dict[str, str] = getattr(self, field)
        if isinstance(value, str):
            return value
        if lang not in value:
            raise ReleaseError(f"{builds_dir() / self.name}.yaml: field '{field}' has no {lang!r} text; the {lang} "
                               f"card would show English there: add '{lang}: ...' under '{field}'")
        return value[lang]

    def section(self, step: str) -> Any:
        """The parameters of recipe step ``step``: its section, or the section's defaults."""
        return getattr(self, step) or SECTIONS[step]()

    @property
    def needs_algorithm_data(self) -> bool:
        """Whether a step reads the algorithm calls (smoothing statistics, GPTQ's Hessians, AutoRound's tuning)."""
        return any(s in ("smoothquant", "awq", "gptq") for s in self.recipe) or (
            "autoround" in self.recipe and self.section("autoround").tuning != "none")

    @property
    def layerwise(self) -> bool:
        """Whether ModelOpt calibrates layer by layer (GPTQ's option; the seed-faithful AutoRound's calibration)."""
        return ("gptq" in self.recipe and self.section("gptq").layerwise) or (
            "autoround" in self.recipe and self.section("autoround").tuning == "none")

    def digest(self) -> str:
        """Stable hash of the validated build configuration (recorded in provenance)."""
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()


BUILDS_OPTION: list[Path] = []  # set by ``release --builds DIR`` for the process


def builds_source() -> tuple[Path, str]:
    """The folder of build files in use and why: ``--builds DIR``, then ``$RELEASE_BUILDS``, then ``./builds`` (a
    folder with a release.yaml in the current directory), then the defaults that ship with the tool."""
    from release.core.io import data_path

    if BUILDS_OPTION:
        if not (BUILDS_OPTION[-1] / "release.yaml").is_file():
            raise ReleaseError(f"--builds {BUILDS_OPTION[-1]}: no release.yaml there; pass the folder that holds the "
                               "build files (after 'release init DIR' that is DIR/builds)")
        return BUILDS_OPTION[-1], "--builds"
    if os.environ.get(BUILDS_ENV):
        folder = Path(os.environ[BUILDS_ENV])
        if not (folder / "release.yaml").is_file():
            raise ReleaseError(f"{BUILDS_ENV}={folder}: no release.yaml there; set it to the folder that holds the "
                               "build files (after 'release init DIR' that is DIR/builds), or unset it")
        return folder, BUILDS_ENV
    if (Path("builds") / "release.yaml").is_file():
        return Path("builds"), "./builds"
    return data_path("builds"), ("the defaults shipped with release; 'release init DIR' copies them to DIR/builds "
                                 "to edit")


def builds_dir() -> Path:
    return builds_source()[0]


