"""``release verify``: a build against a reference checkpoint and its source, as a report and a gate.

Six checks, as in the seed card's "Verification" table: layout (safetensors headers only), quantization configs,
ModelOpt state files, values (recomputed from the source), index consistency, and loadability in diffusers.
Every problem is reported by file and tensor; nothing here raises on a damaged checkpoint. The report also holds a
manifest, the sha256 and size of every file the checks saw, hashed before they ran: ``release push`` publishes a
build only while its files are exactly those bytes (plus the cards and results, written after verification).
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import os
import stat
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from release import ReleaseError
from release.config import BuildConfig, ReleaseConfig, load_build, load_release
from release.io import atomic_write, sha256_file, write_json
from release.profile import stage
from release.source import SourceModel, resolve_checkpoint, resolve_source

REPORT_DIR = "verification"
REPORT_JSON = f"{REPORT_DIR}/report.json"
REPORT_MD = f"{REPORT_DIR}/report.md"
REPORT_FORMAT = "release-verification/2"
# Written after verification, by ``release card`` (the card files) and ``release eval`` / ``import-served`` (the
# results): not in the manifest, pushed as they are (and scanned for secrets). ``*`` does not cross a ``/``.
CARD_FILES = ("README.md", "README.*.md", "LICENSE", "forest.*.png")  # what 'release card' writes
AFTER_VERIFICATION = (*CARD_FILES, "results/*.npz", "results/*.perf.json")
TOOL_SIDECARS = ("provenance.json", "smoothing_scales.safetensors", "results/", "builds/")  # results: `release eval`
DOCUMENTATION = ("README", "LICENSE", ".gitattributes", "forest.png")
BASE_MODEL_BRANCHES = ("sound_tokenizer/", "audio_")
SHARD_INDEXES = {"transformer": "diffusion_pytorch_model.safetensors.index.json", "": "model.safetensors.index.json"}
Status = Literal["passed", "failed", "skipped"]


@dataclass
class Check:
    name: str
    status: Status
    summary: str
    details: dict[str, Any] = field(default_factory=dict)


def _status(ok: bool) -> Status:
    return "passed" if ok else "failed"


class FileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    size: int = Field(ge=0)


class Report(BaseModel):
    """``verification/report.json``. ``status`` is ``incomplete`` when no check failed but some were skipped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["release-verification/2"]
    build: str
    repo: str
    reference: str | None
    status: Literal["passed", "failed", "incomplete"]
    checks: list[Check]
    manifest: dict[str, FileEntry] = Field(description="every file the checks saw (and report.md), by path")
    after_verification: list[str] = Field(description="patterns of the files card and eval add afterwards")


REFERENCE_BUILD = "rtn"  # NVIDIA's recipe: the reference of the layout checks when no --reference is given


@dataclass(frozen=True)
class VerifyRequest:
    release: ReleaseConfig
    build: BuildConfig
    folder: Path
    reference: Path | None
    source: Path
    observations: Path | None

    @classmethod
    def create(cls, name: str, dist: Path, reference: str | Path | None, source: str | Path | None,
               observations: Path | None, require_reference: bool = True) -> VerifyRequest:
        """``require_reference=False`` (after a build): without the RTN build the reference checks are skipped."""
        release = load_release()
        build = load_build(name)
        folder = dist / build.repo
        if not folder.is_dir():
            raise ReleaseError(f"{folder}: missing; run 'release build {name}' first")
        ref: Path | None
        if reference is None:
            rtn = next((s for s in release.siblings if s.build == REFERENCE_BUILD), None)
            ref = dist / rtn.repo if rtn is not None else None
            if not require_reference and ref is not None and not ref.is_dir():
                ref = None
            if ref is not None and not ref.is_dir():
                raise ReleaseError(f"reference {ref} does not exist; pass --reference DIR (NVIDIA's "
                                   "Cosmos3-Nano@fp8, or the RTN build)")
        else:
            ref = resolve_checkpoint(reference, "--reference")
        src = resolve_source(release, source)
        if observations is None and (src.parent / "observations").is_dir():
            observations = src.parent / "observations"
        return cls(release, build, folder, ref, src, observations)


def _files(root: Path) -> list[str]:
    """Files of a checkpoint folder, without this check's own report."""
    return sorted(rel for p in root.rglob("*") if p.is_file()
                  and not (rel := p.relative_to(root).as_posix()).startswith(f"{REPORT_DIR}/"))


def _classify(path: str) -> str:
    if path.startswith(TOOL_SIDECARS):
        return "tool sidecar"
    if path.split("/")[-1].startswith(DOCUMENTATION) or path.endswith(".md"):
        return "documentation"
    if path.startswith(BASE_MODEL_BRANCHES) or "/audio" in path:
        return "base-model branch"
    return "unexpected"


def _headers(root: Path, problems: list[str]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{component/tensor: (dtype, shape, file)}`` of every checkpoint shard under ``root`` (headers only)."""
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for rel in _files(root):
        if not rel.endswith(".safetensors") or _classify(rel) != "unexpected":
            continue
        component = rel.rsplit("/", 1)[0] if "/" in rel else ""
        try:
            with safe_open(str(root / rel), framework="pt") as f:
                for key in f.keys():
                    sl = f.get_slice(key)
                    name = f"{component}/{key}" if component else key
                    if name in out:
                        problems.append(f"{rel}: tensor {key} also in {out[name][2]}")
                    out[name] = (sl.get_dtype(), tuple(sl.get_shape()), rel)
        except Exception as exc:  # safetensors' own error type: truncated file, corrupt header
            problems.append(f"{rel}: unreadable ({str(exc).splitlines()[0]})")
    return out


def check_layout(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static") -> Check:
    """Tensor names, dtypes and shapes against the reference's, as the build's scheme lays them out (a per-channel
    build: the reference's per-tensor scales as (out, 1) weight scales, no static input scales)."""
    from release.recipes import per_channel

    problems: list[str] = []
    ours, theirs = _headers(folder, problems), _headers(reference, problems)
    if scheme == per_channel.SCHEME:
        theirs = per_channel.expected_headers(theirs)
    common = sorted(set(ours) & set(theirs))
    differ = [f"{ours[k][2]}: tensor {k.split('/')[-1]} is {ours[k][0]}{list(ours[k][1])}, reference "
              f"{theirs[k][0]}{list(theirs[k][1])}" for k in common if ours[k][:2] != theirs[k][:2]]
    only_ours = sorted(set(ours) - set(theirs))
    only_theirs = sorted(set(theirs) - set(ours))
    files_ours, files_theirs = set(_files(folder)), set(_files(reference))
    one_side = {f: _classify(f) for f in sorted(files_ours ^ files_theirs)}
    unexpected = [f"{f} ({'build' if f in files_ours else 'reference'} only)" for f, c in one_side.items()
                  if c == "unexpected"]
    tensors_one_side = [f"{ours[k][2]}: tensor {k.split('/')[-1]} (build only)" for k in only_ours] + \
        [f"{theirs[k][2]}: tensor {k.split('/')[-1]} (reference only)" for k in only_theirs]
    tensors_one_side = [t for t in tensors_one_side if _classify(t.split(":")[0]) == "unexpected"]
    failures = problems + differ + tensors_one_side + unexpected
    kinds: dict[str, int] = {}
    for c in one_side.values():
        kinds[c] = kinds.get(c, 0) + 1
    rest = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "nothing else"
    summary = f"{len(common)} common tensors, {len(differ)} dtype or shape differences; on one side only: {rest}"
    if failures:
        summary += f"; first problem: {failures[0]}"
    return Check("layout", _status(not failures), summary, {
        "common_tensors": len(common), "dtype_or_shape_differences": differ, "problems": failures,
        "files_one_side": one_side,
    })


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            p = f"{path}.{k}" if path else str(k)
            if k not in a or k not in b:
                out.append(f"{p}: {'missing in build' if k not in a else 'not in reference'}")
            else:
                out += _diff(a[k], b[k], p)
        return out
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def _read_json(root: Path, rel: str, problems: list[str]) -> dict[str, Any]:
    try:
        data: dict[str, Any] = json.loads((root / rel).read_text())
        return data
    except FileNotFoundError:
        problems.append(f"{rel}: missing")
    except json.JSONDecodeError as exc:
        problems.append(f"{rel}: invalid JSON ({exc.msg} at line {exc.lineno})")
    return {}


def in_scheme(config: dict[str, Any], scheme: str) -> dict[str, Any]:
    """A per-tensor reference's quantization config as the build's scheme writes it: for the per-channel scheme its
    ``quant_algo`` and ``config_groups`` as ModelOpt names the scheme, and in ``modelopt_config`` every per-tensor FP8
    weight and input quantizer replaced by the scheme's; anything else stays the reference's."""
    from release.recipes import per_channel

    if scheme != per_channel.SCHEME or not config:
        return config
    out = json.loads(json.dumps(config))
    out["quant_algo"] = per_channel.QUANT_ALGO
    out["config_groups"] = json.loads(json.dumps(per_channel.config_groups()))
    for entry in out.get("modelopt_config", {}).get("quant_cfg", []):
        name = str(entry.get("quantizer_name", ""))
        if "cfg" in entry and name.endswith("weight_quantizer"):
            entry["cfg"] = json.loads(json.dumps(per_channel.WEIGHT_CFG))
        elif "cfg" in entry and name.endswith("input_quantizer"):
            entry["cfg"] = json.loads(json.dumps(per_channel.INPUT_CFG))
    return out


def check_quant_configs(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static") -> Check:
    problems: list[str] = []
    diffs: list[str] = []
    for rel, key in (("transformer/config.json", "quantization_config"), ("hf_quant_config.json", None)):
        ours, theirs = _read_json(folder, rel, problems), _read_json(reference, rel, problems)
        if key is not None:
            if ours and key not in ours:
                problems.append(f"{rel}: no '{key}' field")
            ours, theirs = ours.get(key, {}), theirs.get(key, {})
        diffs += [f"{rel}: {d}" for d in _diff(ours, in_scheme(theirs, scheme))]
    failures = problems + diffs
    same = "identical to the reference's" if scheme == "fp8_w8a8_per_tensor_static" else \
        "identical to the reference's in the per-channel scheme (quant_algo FP8_PER_CHANNEL_PER_TOKEN)"
    summary = same if not failures else f"{len(failures)} differences: {failures[0]}"
    return Check("quantization_config", _status(not failures), summary, {"differences": failures})


def _flatten(value: Any, path: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(v, f"{path}.{k}", out)
    elif isinstance(value, list | tuple) and value and all(isinstance(v, list | tuple) and len(v) == 2
                                                           and isinstance(v[0], str) for v in value):
        for k, v in value:  # ModelOpt's [(mode, {...}), ...]
            _flatten(v, f"{path}.{k}", out)
    else:
        out[path] = value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.shape == b.shape \
            and a.dtype == b.dtype and bool(torch.equal(a, b))
    return bool(a == b)


_STATES: dict[Path, tuple[tuple[int, int, int], Any]] = {}  # the reference's state files, read once for all its builds


def _load_state(path: Path, cache: bool) -> Any:
    """A ModelOpt state file; with ``cache``, kept for the next build verified against the same file (read again
    when it was replaced or changed: another inode, size or modification time)."""
    if not cache:
        return torch.load(path, weights_only=True, map_location="cpu")
    st = path.stat()
    key, stamp = path.resolve(), (st.st_ino, st.st_mtime_ns, st.st_size)
    if key not in _STATES or _STATES[key][0] != stamp:
        _STATES[key] = (stamp, torch.load(path, weights_only=True, map_location="cpu"))
    return _STATES[key][1]


def check_modelopt_states(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static") -> Check:
    """Both state files against the reference's: the same configurations and entries; in the per-channel scheme the
    entries that scheme sets differently (``per_channel.STATE_DIFFERENCES``) are counted apart, anything else that
    differs fails."""
    import modelopt.torch.quantization  # noqa: F401  (registers ModelOpt's classes for weights_only loading)

    from release.recipes import per_channel

    allowed = per_channel.STATE_DIFFERENCES if scheme == per_channel.SCHEME else ()

    def by_scheme(key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in allowed)

    counts, failures = {}, []
    for rel in ("transformer/modelopt_state.pth", "modelopt_state.pth"):
        states = []
        for root in (folder, reference):
            try:
                states.append(_load_state(root / rel, cache=root == reference))
            except FileNotFoundError:
                failures.append(f"{root / rel}: missing")
            except Exception as exc:  # a truncated or foreign pickle
                failures.append(f"{root / rel}: unreadable ({str(exc).splitlines()[0][:120]})")
        if len(states) < 2:
            continue
        ours, theirs = {}, {}  # type: dict[str, Any], dict[str, Any]
        _flatten(states[0], "", ours)
        _flatten(states[1], "", theirs)
        common = set(ours) & set(theirs)
        differ = sorted(k for k in common if not _same(ours[k], theirs[k]))
        one_side = sorted(set(ours) ^ set(theirs))
        configs = [[(m, {k: v for k, v in (c.get("config") or {}).items() if not (allowed and k == "quant_cfg")})
                    for m, c in state["modelopt_state_dict"]] for state in states]
        if configs[0] != configs[1]:
            failures.append(f"{rel}: ModelOpt configurations differ from the reference's")
        failures += [f"{rel}: entry {k} differs" for k in differ if not by_scheme(k)]
        failures += [f"{rel}: entry {k} on one side only" for k in one_side if allowed and not by_scheme(k)]
        counts[rel] = {"common": len(common), "build_only": len(set(ours) - common),
                       "reference_only": len(set(theirs) - common),
                       "differ": len([k for k in differ if not by_scheme(k)]),
                       "scheme": len([k for k in differ + one_side if by_scheme(k)])}
    scheme_part = " ({c[scheme]} set by the per-channel scheme)" if allowed else ""
    parts = [f"{c['common']}/{c['build_only']}/{c['reference_only']} common/build-only/reference-only entries, "
             f"{c['differ']} differ{scheme_part.format(c=c)} ({rel})" for rel, c in counts.items()]
    summary = "; ".join(parts) if not failures else f"{failures[0]}"
    return Check("modelopt_state", _status(not failures), summary, {"counts": counts, "problems": failures})


def _tensors(folder: Path, problems: list[str]) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        try:
            out.update(load_file(shard))
        except Exception as exc:
            problems.append(f"{shard.name}: unreadable ({str(exc).splitlines()[0]})")
    return out


def expected_weights(source: dict[str, torch.Tensor], folder: Path, provenance: dict[str, Any],
                     device: str = "cpu") -> dict[str, Any]:
    """The source's transformer tensors with the build's recorded smoothing folded in (exactly as the build did: the
    same IEEE operations, on ``device``, where the folded tensors are left; on the CPU they were most of a smoothed
    build's verification at the Nano's size, BENCHMARKS.md)."""
    from safetensors.torch import load_file

    from release.recipes import folded

    expected = dict(source)
    table = provenance.get("recipe", {}).get("alpha_table") or []
    if table:
        scales = load_file(folder / "smoothing_scales.safetensors", device=device)
        for row in table:
            anchor, linears = row["group"], row["linears"]
            new_anchor, new_linears = folded(expected[f"{anchor}.weight"].to(device),
                                             [expected[f"{n}.weight"].to(device) for n in linears],
                                             scales[anchor], anchor.endswith("up_proj"))
            expected[f"{anchor}.weight"] = new_anchor
            for n, w in zip(linears, new_linears, strict=True):
                expected[f"{n}.weight"] = w
    return expected


SCALES = ("weight_scale", "input_scale", "weight_quantizer._scale", "weight_quantizer._amax", "input_quantizer._amax")


def _scale_problems(built: dict[str, torch.Tensor], linear: str, out_features: int, per_channel_scheme: bool
                    ) -> list[str]:
    """Missing, misshapen or non-positive scales of one FP8 Linear, in the build's scheme (per tensor: five 0-dim
    scales; per channel: three (out, 1) weight scales and no input scale, which is computed per token)."""
    from release.recipes import per_channel

    wanted = per_channel.ROW_SCALED if per_channel_scheme else SCALES
    shape = (out_features, 1) if per_channel_scheme else ()
    problems = []
    for suffix in wanted:
        value = built.get(f"{linear}.{suffix}")
        if value is None:
            problems.append(f"tensor {linear}.{suffix} is missing")
        elif tuple(value.shape) != shape:
            problems.append(f"tensor {linear}.{suffix} has shape {list(value.shape)}, the scheme needs {list(shape)}")
        elif not bool((torch.isfinite(value.float()) & (value.float() > 0)).all()):
            bad = value.float().reshape(-1)[~(torch.isfinite(value.float()) & (value.float() > 0)).reshape(-1)][0]
            problems.append(f"tensor {linear}.{suffix} holds {bad.item()}: not a positive finite scale")
    if per_channel_scheme:
        problems += [f"tensor {linear}.{s}: a static input scale in a per-token build" for s in per_channel.ABSENT
                     if f"{linear}.{s}" in built]
    return problems


def check_values(folder: Path, source: Path, source_tensors: dict[str, torch.Tensor] | None = None) -> Check:
    """Every FP8 weight's scales and codes, every other tensor against the source.

    Round-to-nearest recipes (RTN, the observers, SmoothQuant, AWQ, the seed-faithful AutoRound): the codes must equal
    a recomputation from the (smoothed) source in the build's arithmetic, within half an FP8 step. Recipes that make
    their own codes (GPTQ, tuned AutoRound, as ``provenance.json`` records): the codes must be valid FP8 values on the
    grid of their scale, and the dequantized weight within the recipe's stated relative error of the (smoothed)
    source; the reconstruction error on calibration data that the build measured is reported beside it.
    """
    from release.fp8 import dequantize, grid_step, nan_codes, weight_codes
    from release.policy import compute_device
    from release.recipes import per_channel

    problems: list[str] = []
    provenance = _read_json(folder, "provenance.json", problems)
    built = _tensors(folder / "transformer", problems)
    src = source_tensors if source_tensors is not None else _tensors(source / "transformer", problems)
    if problems:
        return Check("values", "failed", problems[0], {"problems": problems})
    recipe = provenance.get("recipe", {})
    arithmetic = recipe.get("arithmetic", "native")
    if arithmetic == "native":
        arithmetic = str(provenance.get("device", "cpu")).split()[0]
    own_codes = bool(recipe.get("changes_weights"))
    bound = recipe.get("max_weight_error")
    if own_codes and not isinstance(bound, int | float):
        problems.append("provenance.json: field 'recipe.max_weight_error' is missing for a recipe that makes its own "
                        "codes; rebuild")
        bound = 0.0
    per_channel_scheme = recipe.get("scheme") == per_channel.SCHEME
    device = compute_device()
    expected = expected_weights(src, folder, provenance, device)
    fp8 = [k for k, v in built.items() if v.dtype == torch.float8_e4m3fn]
    worst = worst_error = 0.0
    for key in fp8:
        linear = key.removesuffix(".weight")
        scale_problems = _scale_problems(built, linear, built[key].shape[0], per_channel_scheme)
        if scale_problems:
            problems += scale_problems
            continue
        w = expected.get(key)
        if w is None:
            problems.append(f"tensor {key}: not in the source")
            continue
        w, codes = w.to(device), built[key].to(device)  # on the GPU where there is one: ~8 element-wise passes
        if own_codes:
            scale = built[f"{linear}.weight_quantizer._scale"].to(device)
            bad = nan_codes(codes)
            if bad:
                problems.append(f"tensor {key}: {bad} FP8 codes are NaN")
            deq = dequantize(codes, scale)
            error = float((deq - w.float()).norm() / w.float().norm().clamp_min(1e-30))
            worst_error = max(worst_error, error)
            if error > bound:
                problems.append(f"tensor {key}: dequantizes {error:.3f} (relative) from the source weight, more than "
                                f"the recipe's {bound}")
            continue
        recomputed, scale = weight_codes(w, built[f"{linear}.weight_quantizer._amax"], arithmetic, device)
        if not torch.equal(recomputed.view(torch.uint8), codes.view(torch.uint8)):
            n = int((recomputed.view(torch.uint8) != codes.view(torch.uint8)).sum())
            problems.append(f"tensor {key}: {n} FP8 codes differ from a recomputation from the source")
        deq = dequantize(codes, scale)
        ratio = ((deq - w.float()).abs() / grid_step(w, scale)).max().item()
        worst = max(worst, ratio)
        if ratio > 0.5 * (1 + 2**-4):  # half a step, plus the bf16 rounding of the quotient before the FP8 cast
            problems.append(f"tensor {key}: dequantizes {ratio:.2f} FP8 steps from the source weight")
    folded = 0
    for key, value in built.items():
        if key in fp8 or key.endswith(("_scale", "_amax")):
            continue
        if key not in expected:
            problems.append(f"tensor {key}: not in the source")
        elif not torch.equal(value.to(expected[key].device), expected[key]):
            problems.append(f"tensor {key}: differs from the source")
        elif not torch.equal(value.to(src[key].device), src[key]):
            folded += 1
    smoothed = "smoothed " if folded else ""
    scheme = "per-channel weight scales, no static input scale" if per_channel_scheme else "positive finite scales"
    details: dict[str, Any] = {"fp8_weights": len(fp8), "folded": folded, "problems": problems,
                               "own_codes": own_codes}
    if own_codes:
        rows = recipe.get("reconstruction") or []
        ratios = sorted(r["error"] / r["rtn_error"] for r in rows if r.get("rtn_error"))
        median = ratios[len(ratios) // 2] if ratios else None
        details.update(worst_weight_error=worst_error, max_weight_error=bound, reconstruction_ratio_median=median)
        codes_text = (f"the recipe's own codes, valid FP8, within {worst_error:.3f} relative error of the {smoothed}"
                      f"source weight (bound {bound})")
        if median is not None:
            codes_text += (f"; reconstruction error on calibration data {median:.2f}x round-to-nearest's (median over "
                           f"{len(ratios)} Linears)")
    else:
        details["worst_fp8_steps"] = worst
        codes_text = f"codes equal a recomputation from the source, within {worst:.2f} FP8 steps of the {smoothed}" \
            "source weight"
    summary = (f"{len(fp8)} FP8 weights with {scheme}, {codes_text}; other tensors equal the source"
               f"{f' except {folded} norms / up_proj with folded smoothing' if folded else ''}")
    return Check("values", _status(not problems), summary if not problems else problems[0], details)


def check_consistency(folder: Path) -> Check:
    problems: list[str] = []
    for component, index_name in SHARD_INDEXES.items():
        index = _read_json(folder, f"{component}/{index_name}" if component else index_name, problems)
        if not index:
            continue
        listed = set(index.get("weight_map", {}).values())
        present = {p.name if component else f"transformer/{p.name}"
                   for p in (folder / "transformer").glob("*.safetensors")}
        problems += [f"{index_name}: lists {f}, which is missing" for f in sorted(listed - present)]
        problems += [f"{f}: orphan shard, not in {index_name}" for f in sorted(present - listed)]
    duplicates: list[str] = []
    _headers(folder / "transformer", duplicates)
    problems += [d for d in duplicates if "also in" in d]
    summary = "both indexes list exactly the shards present; no tensor twice; no orphan file"
    return Check("consistency", _status(not problems), summary if not problems else problems[0], {"problems": problems})


def check_loadable(request: VerifyRequest) -> Check:
    """The build loads in diffusers with ModelOpt's restore and one policy rollout gives finite actions, with
    diffusers' default step policy (W8A16 on the first and last steps). A per-channel build cannot run either way:
    that policy refuses its scales ("requires one tensorwise ModelOpt FP8 weight scale") and ModelOpt has no kernel
    for a restored per-channel weight with per-token inputs ("self._dequantize is True and self.fake_quant is False");
    it is rolled out W8A8 on every step through the row-wise FP8 kernel of ``release eval --path deployed``."""
    from release.evaluate import deployed_transformer
    from release.export import load_build_transformer
    from release.observations import load_observations, split
    from release.policy import free_memory, load_pipeline, rollout
    from release.recipes import per_channel

    if request.observations is None:
        return Check("loadable", "failed", "no observation set to roll out on; pass --observations DIR")
    every_step = request.build.scheme == per_channel.SCHEME
    observations = request.observations

    def roll_out() -> Any:  # the pipeline is dropped on return, and collected in ``finally``
        transformer = deployed_transformer(request.folder) if every_step else load_build_transformer(request.folder)
        obs = split(load_observations(observations), request.release.calibration_labs)[0]
        pipe = load_pipeline(request.folder, request.release.policy, transformer=transformer)
        return rollout(pipe, obs, request.release.policy, **({"mixed_precision_format": "none"} if every_step
                                                             else {}))

    try:
        actions = roll_out()
    except ReleaseError as exc:
        return Check("loadable", "failed", str(exc))
    except Exception as exc:  # diffusers / ModelOpt refusing a damaged checkpoint
        return Check("loadable", "failed", f"diffusers could not load or run the build: {str(exc).splitlines()[0]}")
    finally:
        free_memory()
    how = " (W8A8 on every step, row-wise FP8 kernel)" if every_step else ""
    return Check("loadable", "passed", f"loads in diffusers with ModelOpt's restore; one policy rollout{how} gives "
                                   f"finite actions {list(actions.shape)}")


def build_files(folder: Path) -> list[str]:
    """Every file of a build folder, relative and sorted, without following anything.

    A link is refused by name (the Hub stores files, and a link can be re-pointed after its target was hashed), so is
    a link loop and anything that is neither a regular file nor a folder (a pipe would block the reader).
    """
    out: list[str] = []
    stack = [folder]
    while stack:
        directory = stack.pop()
        try:
            entries = list(os.scandir(directory))
        except OSError as exc:
            raise ReleaseError(f"{directory}: cannot be listed ({exc.strerror}); fix its permissions") from exc
        for entry in entries:
            path = Path(entry.path)
            if entry.is_symlink():
                raise ReleaseError(_link_refusal(path, folder))
            if entry.is_dir(follow_symlinks=False):
                stack.append(path)
            elif entry.is_file(follow_symlinks=False):
                out.append(path.relative_to(folder).as_posix())
            else:
                kind = "pipe" if stat.S_ISFIFO(entry.stat(follow_symlinks=False).st_mode) else "device or socket"
                raise ReleaseError(f"{path}: a {kind}, not a regular file; remove it from the build folder")
    return sorted(out)


def _link_refusal(path: Path, folder: Path) -> str:
    target = os.readlink(path)
    try:
        outside = not path.resolve(strict=True).is_relative_to(folder.resolve())
    except (OSError, RuntimeError):  # a loop (RuntimeError on Python 3.11) or a dangling link
        return f"{path}: a link ({target}) that loops or points nowhere; remove it from the build folder"
    where = ", outside the build folder" if outside else ""
    return f"{path}: a link to {target}{where}; the Hub stores files, not links: replace it with the file or remove it"


def matches(rel: str, patterns: tuple[str, ...]) -> bool:
    """Whether the relative path matches one of the patterns (``*`` does not cross a ``/``)."""
    return any(rel.count("/") == p.count("/") and fnmatch.fnmatchcase(rel, p) for p in patterns)


def after_verification(rel: str) -> bool:
    return matches(rel, AFTER_VERIFICATION)


def manifest_files(folder: Path) -> list[str]:
    """The files a manifest covers: every file of the build but ``verification/`` and what is added later (links
    and other non-files refused, :func:`build_files`)."""
    return [rel for rel in build_files(folder) if not rel.startswith(f"{REPORT_DIR}/") and not after_verification(rel)]


def file_manifest(folder: Path, files: list[str]) -> dict[str, FileEntry]:
    """sha256 and size of ``files`` of the build (:func:`manifest_files`), hashed afresh."""
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        sizes = [(folder / rel).stat().st_size for rel in files]
        digests = list(pool.map(lambda rel: sha256_file(folder / rel), files))
    return {rel: FileEntry(sha256=d, size=n) for rel, d, n in zip(files, digests, sizes, strict=True)}


def _run_checks(request: VerifyRequest, source_tensors: dict[str, torch.Tensor] | None) -> list[Check]:
    checks: list[Check] = []
    runners: list[tuple[str, Callable[[], Check]]] = []
    if request.reference is not None:
        ref = request.reference
        scheme = request.build.scheme
        runners += [("layout", lambda: check_layout(request.folder, ref, scheme)),
                    ("quantization_config", lambda: check_quant_configs(request.folder, ref, scheme)),
                    ("modelopt_state", lambda: check_modelopt_states(request.folder, ref, scheme))]
    else:
        checks += [Check(name, "skipped", "skipped: no reference (build 'rtn' into the same folder, or run "
                                          "'release verify --reference DIR')")
                   for name in ("layout", "quantization_config", "modelopt_state")]
    runners += [("values", lambda: check_values(request.folder, request.source, source_tensors)),
                ("consistency", lambda: check_consistency(request.folder)),
                ("loadable", lambda: check_loadable(request))]
    for name, run in runners:
        with stage(f"verify: {name}"):
            checks.append(run())
    return checks


def verify(request: VerifyRequest, source_tensors: dict[str, torch.Tensor] | None = None) -> list[Check]:
    """Run every check, write ``verification/report.{json,md}`` into the build folder, return the checks
    (``source_tensors``: the source's transformer tensors, when several builds of one source are verified)."""
    # The files are hashed while the checks run (sha256 takes one core per file: 5 s of a Nano build's 16 GB). Either
    # way a file that differs from the manifest when the build is pushed, changed at any time after it was listed,
    # fails the push.
    files = manifest_files(request.folder)  # a link or a pipe is refused before any check runs
    with ThreadPoolExecutor(1) as hashing:
        hashed = hashing.submit(file_manifest, request.folder, files)
        checks = _run_checks(request, source_tensors)
        with stage("verify: hash the files (what the checks left)"):
            manifest = hashed.result()
    markdown = render_markdown(request, checks).encode()
    manifest[REPORT_MD] = FileEntry(sha256=hashlib.sha256(markdown).hexdigest(), size=len(markdown))
    statuses = {c.status for c in checks}
    report = Report(format=REPORT_FORMAT, build=request.build.name, repo=request.build.repo,
                    reference=request.reference.name if request.reference else None,  # no local path in it
                    status="failed" if "failed" in statuses else "incomplete" if "skipped" in statuses else "passed",
                    checks=checks, manifest=manifest,
                    after_verification=list(AFTER_VERIFICATION))
    atomic_write(request.folder / REPORT_MD, markdown)
    write_json(request.folder / REPORT_JSON, report.model_dump(mode="json"))  # last: the gate reads this one
    return checks


def render_markdown(request: VerifyRequest, checks: list[Check]) -> str:
    ref = request.reference.name if request.reference else "none"
    lines = [f"# Verification of {request.build.repo}", "", f"Reference: `{ref}`", "", "| Check | Passed | Result |",
             "|---|---|---|"]
    shown = {"passed": "yes", "failed": "NO", "skipped": "skipped"}
    lines += [f"| {c.name} | {shown[c.status]} | {c.summary} |" for c in checks]
    return "\n".join(lines) + "\n"


def summary_table(request: VerifyRequest, checks: list[Check]) -> Any:
    """A rich table of the checks, for the terminal."""
    from rich.table import Table

    table = Table(title=f"verification: {request.build.repo}", title_justify="left", show_lines=False)
    table.add_column("check")
    table.add_column("result")
    table.add_column("details", overflow="fold")
    shown = {"passed": "[green]pass[/]", "failed": "[red]FAIL[/]", "skipped": "[yellow]skipped[/]"}
    for c in checks:
        table.add_row(c.name, shown[c.status], c.summary)
    return table


def load_report(folder: Path, build: str) -> tuple[Report, str] | None:
    """The build's verification report and the sha256 of the bytes read, or None when it has none."""
    path = folder / REPORT_JSON
    if not path.is_file():
        return None
    return parse_report(path.read_bytes(), str(path), build, folder.name)


def parse_report(data: bytes, where: str, build: str, repo: str) -> tuple[Report, str]:
    """The report in ``data`` (read from ``where``, named in errors) of the build ``build`` in repo ``repo``, and
    the sha256 of ``data``."""
    rerun = f"rerun 'release verify {build}'"
    try:
        raw = json.loads(data)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        why = f"{exc.msg} at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else "not UTF-8 text"
        raise ReleaseError(f"{where}: not valid JSON ({why}); {rerun}") from exc
    if isinstance(raw, dict) and "format" not in raw and "checks" in raw:
        raise ReleaseError(f"{where}: written by an older 'release verify' (no file manifest); {rerun}")
    try:
        report = Report.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field_name = ".".join(str(p) for p in err["loc"]) or "(top level)"
        raise ReleaseError(f"{where}: field '{field_name}': {err['msg']}; not a report of 'release verify', "
                           f"{rerun}") from exc
    if report.repo != repo:
        raise ReleaseError(f"{where}: the report of {report.repo}, not of {repo}; {rerun}")
    return report, hashlib.sha256(data).hexdigest()


def gate(folder: Path, report: Report | None) -> str | None:
    """Why ``release push`` must refuse the build in ``folder`` (``--force`` overrides), or None when it passed."""
    if report is None:
        return f"{folder.name} has no verification report; run 'release verify' on it"
    failed = [c for c in report.checks if c.status == "failed"]
    if failed:
        return f"{folder.name} failed verification ({failed[0].name}: {failed[0].summary})"
    skipped = [c for c in report.checks if c.status == "skipped"]
    if skipped:
        return (f"{folder.name} was not fully verified ({', '.join(c.name for c in skipped)} "
                f"{skipped[0].summary})")
    return None


class Verifier:
    """Verifies builds and prints each summary, reading each source's transformer once however many builds of it
    it verifies. ``source``: the build's source model; where its tensors stay on the GPU
    (:class:`release.source.SourceModel`) and equal the files' byte for byte, the checks read them there instead of
    copying the files' tensors to the GPU for every build. The comparison starts at once, in a thread, so that it
    runs while the first build is made (5 s of a Nano build on an H200, BENCHMARKS.md)."""

    def __init__(self, source: SourceModel | None = None) -> None:
        from rich.console import Console

        self.console = Console(width=160)
        self.sources: dict[Path, dict[str, torch.Tensor]] = {}
        self.resident = source if source is not None and source.resident else None
        self.compared: Future[bool] | None = None
        if self.resident is not None:
            comparing = ThreadPoolExecutor(1)
            self.compared = comparing.submit(_files_hold, self.resident.folder / "transformer", self.resident.state)
            comparing.shutdown(wait=False)  # the comparison runs on; its result is awaited by the first verification

    def _resident_state(self, source: Path) -> dict[str, torch.Tensor] | None:
        if self.resident is None or self.compared is None or self.resident.folder != source:
            return None
        return self.resident.state if self.compared.result() else None

    def __call__(self, request: VerifyRequest) -> bool:
        """Verify one build; True when no check failed (skipped ones are shown)."""
        if request.source not in self.sources:
            self.sources.clear()
            problems: list[str] = []
            with stage("verify: read the source"):
                tensors = self._resident_state(request.source)
                if tensors is None:
                    tensors = _tensors(request.source / "transformer", problems)
            if not problems:
                self.sources[request.source] = tensors
        with stage(f"verify {request.build.name}"):
            checks = verify(request, self.sources.get(request.source))
        self.console.print(summary_table(request, checks))
        return all(c.status != "failed" for c in checks)


def _files_hold(folder: Path, resident: dict[str, torch.Tensor]) -> bool:
    """Whether the shards of ``folder`` hold exactly ``resident``'s tensors (names, dtypes, shapes, bytes), read one
    tensor at a time; False on any shard it cannot read (the checks then read the files and name the problem)."""
    from safetensors import safe_open

    seen: set[str] = set()
    try:
        for shard in sorted(folder.glob("*.safetensors")):
            with safe_open(shard, framework="pt") as f:
                for key in f.keys():
                    kept, read = resident.get(key), f.get_tensor(key)
                    if kept is None or key in seen or read.dtype != kept.dtype or read.shape != kept.shape \
                            or not torch.equal(read.to(kept.device), kept):
                        return False
                    seen.add(key)
    except Exception:  # an unreadable shard: the checks that read the files name it
        return False
    return seen == resident.keys()


def verify_builds(requests: list[VerifyRequest]) -> bool:
    """Verify each build; True when no check of any build failed. Under torchrun each rank verifies its share and
    all get the same answer."""
    from release.distributed import world

    verifier = Verifier()
    ok = True
    for request in world().share(requests):
        ok &= verifier(request)
    return world().all_true(ok)
