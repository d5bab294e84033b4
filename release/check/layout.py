"""The checks against the reference that read no tensor data: files, tensor names, dtypes and shapes from the
safetensors headers, the quantization configs, and ModelOpt's state files."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from release.check.report import (
    INDEPENDENT,
    MODELOPT_EXPORT,
    REPORT_DIR,
    SELF_REFERENCE,
    Check,
    may_follow_verification,
    status_of,
)
from release.core.device import modelopt_imported
from release.core.errors import ReleaseError
from release.core.io import parse_json
from release.inputs.reference import (
    DEFAULT_LIST,
    DIFFUSERS_FIELDS,
    MADE_BY,
    NO_BUFFERS,
    NO_DIFFUSERS_FIELDS,
    QUANTIZER_BUFFERS,
    WILDCARD_IGNORE,
)

TOOL_SIDECARS = ("provenance.json", "smoothing_scales.safetensors", "results/", "builds/")  # results: `release eval`
DOCUMENTATION = ("README", "LICENSE", ".gitattributes", "forest.png")
BASE_MODEL_BRANCHES = ("sound_tokenizer/", "audio_")
SHARD_INDEXES = {"transformer": "diffusion_pytorch_model.safetensors.index.json", "": "model.safetensors.index.json"}


@dataclass(frozen=True)
class ReferenceOrigin:
    """What the reference is, recorded in the details of each check against it (``details["reference"]``)."""

    kind: str
    what: str

    def record(self) -> dict[str, str]:
        return {"kind": self.kind, "what": self.what}

    def label(self, summary: str) -> str:
        """A check's summary, saying first when the reference is not independent."""
        return summary if self.kind == INDEPENDENT else f"{self.kind} ({self.what}): {summary}"


def reference_origin(folder: Path, reference: Path) -> ReferenceOrigin:
    """The reference's origin from its ``provenance.json``: this tool writes one in every build (``tool``), the tiny
    fixture in its ModelOpt export (``made_by``); NVIDIA's checkpoint has none. A provenance.json that is not a JSON
    object is a one-line error."""
    if folder.resolve() == reference.resolve():
        return ReferenceOrigin(SELF_REFERENCE, "the build itself")
    path = reference / "provenance.json"
    if not path.is_file():
        return ReferenceOrigin(INDEPENDENT, "a checkpoint this tool did not make")
    prov = parse_json(path.read_bytes(), str(path), "pass another --reference or rerun what wrote it",
                      "the reference's provenance")
    if not isinstance(prov, dict):
        raise ReleaseError(f"{path}: the reference's provenance is not a JSON object; pass another --reference")
    if prov.get("made_by") == MADE_BY:
        version = prov.get("versions", {}).get("modelopt", "?") if isinstance(prov.get("versions"), dict) else "?"
        return ReferenceOrigin(MODELOPT_EXPORT, f"ModelOpt's own export, {MADE_BY} of ModelOpt {version}")
    tool = prov.get("tool")
    if isinstance(tool, dict) and tool.get("name") == "release":
        return ReferenceOrigin(SELF_REFERENCE, f"build '{prov.get('build', '?')}' of this tool")
    return ReferenceOrigin(INDEPENDENT, "a checkpoint this tool did not make")


def _files(root: Path, languages: list[str]) -> list[str]:
    """Files of a checkpoint folder, without this check's own report and what card and eval write after it for a
    release in ``languages`` (:func:`release.check.report.may_follow_verification`): re-verifying a carded build
    sees what its first verification saw."""
    return sorted(rel for p in root.rglob("*") if p.is_file()
                  and not (rel := p.relative_to(root).as_posix()).startswith(f"{REPORT_DIR}/")
                  and not may_follow_verification(rel, languages))


def _classify(path: str) -> str:
    if path.startswith(TOOL_SIDECARS):
        return "tool sidecar"
    if path.split("/")[-1].startswith(DOCUMENTATION) or path.endswith(".md"):
        return "documentation"
    if path.startswith(BASE_MODEL_BRANCHES) or "/audio" in path:
        return "base-model branch"
    return "unexpected"


def tensor_headers(root: Path, problems: list[str]) -> dict[str, tuple[str, tuple[int, ...], str]]:
    """``{component/tensor: (dtype, shape, file)}`` of every checkpoint shard under ``root`` (headers only)."""
    from safetensors import safe_open

    out: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for rel in _files(root, []):
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


def check_layout(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static",
                 origin: ReferenceOrigin | None = None, languages: list[str] | None = None) -> Check:
    """Tensor names, dtypes and shapes against the reference's, as the build's scheme lays them out (a per-channel
    build: the reference's per-tensor scales as (out, 1) weight scales, no static input scales). Against ModelOpt's
    own export the quantizer buffers it does not write are build-only by construction: counted apart, not failed."""
    from release.quantize.recipes import per_channel

    origin = origin or reference_origin(folder, reference)
    problems: list[str] = []
    ours, theirs = tensor_headers(folder, problems), tensor_headers(reference, problems)
    if scheme == per_channel.SCHEME:
        theirs = per_channel.expected_headers(theirs)
    common = sorted(set(ours) & set(theirs))
    differ = [f"{ours[k][2]}: tensor {k.split('/')[-1]} is {ours[k][0]}{list(ours[k][1])}, reference "
              f"{theirs[k][0]}{list(theirs[k][1])}" for k in common if ours[k][:2] != theirs[k][:2]]
    only_ours = sorted(set(ours) - set(theirs))
    only_theirs = sorted(set(theirs) - set(ours))
    tolerated: dict[str, Any] = {}
    if origin.kind == MODELOPT_EXPORT:
        buffers = [k for k in only_ours if k.endswith(QUANTIZER_BUFFERS)]
        only_ours = [k for k in only_ours if k not in set(buffers)]
        tolerated = {"quantizer_buffers": len(buffers), "why": NO_BUFFERS}
    files_ours, files_theirs = set(_files(folder, languages or [])), set(_files(reference, languages or []))
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
    if tolerated:
        summary += f"; {tolerated['quantizer_buffers']} ModelOpt quantizer buffers in the build only, which " \
                   "ModelOpt's export does not write"
    if failures:
        summary += f"; first problem: {failures[0]}"
    return Check("layout", status_of(not failures), origin.label(summary), {
        "common_tensors": len(common), "dtype_or_shape_differences": differ, "problems": failures,
        "files_one_side": one_side, "reference": origin.record(), **({"tolerated": tolerated} if tolerated else {}),
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


def read_checkpoint_json(root: Path, rel: str, problems: list[str]) -> dict[str, Any]:
    try:
        data = parse_json((root / rel).read_bytes(), rel, "the checkpoint is damaged")
        if isinstance(data, dict):
            return data
        problems.append(f"{rel}: not a JSON object")
    except FileNotFoundError:
        problems.append(f"{rel}: missing")
    except ReleaseError as exc:
        problems.append(str(exc))
    return {}


def in_scheme(config: dict[str, Any], scheme: str) -> dict[str, Any]:
    """A per-tensor reference's quantization config as the build's scheme writes it: for the per-channel scheme its
    ``quant_algo`` and ``config_groups`` as ModelOpt names the scheme, and in ``modelopt_config`` every per-tensor FP8
    weight and input quantizer replaced by the scheme's; anything else stays the reference's."""
    from release.quantize.recipes import per_channel

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


def check_quant_configs(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static",
                        origin: ReferenceOrigin | None = None) -> Check:
    """Both quantization configs against the reference's; against ModelOpt's own export the fields only diffusers
    reads (``DIFFUSERS_FIELDS``, which that export does not write) are left out of the comparison and listed."""
    origin = origin or reference_origin(folder, reference)
    problems: list[str] = []
    diffs: list[str] = []
    build_only: list[str] = []
    ignore: list[str] = []  # files whose ignore lists differ in writing only
    for rel, key in (("transformer/config.json", "quantization_config"), ("hf_quant_config.json", None)):
        ours, theirs = read_checkpoint_json(folder, rel, problems), read_checkpoint_json(reference, rel, problems)
        if key is not None:
            if ours and key not in ours:
                problems.append(f"{rel}: no '{key}' field")
            ours, theirs = ours.get(key, {}), theirs.get(key, {})
        if origin.kind == MODELOPT_EXPORT:
            build_only += [f"{rel}: {k}" for k in DIFFUSERS_FIELDS if k in ours and k not in theirs]
            ours = {k: v for k, v in ours.items() if k in theirs or k not in DIFFUSERS_FIELDS}
            if ours.get("ignore") != theirs.get("ignore") and _same_modules(folder, ours, theirs, problems):
                ignore.append(rel)
                ours = {**ours, "ignore": theirs["ignore"]}
        diffs += [f"{rel}: {d}" for d in _diff(ours, in_scheme(theirs, scheme))]
    failures = problems + diffs
    same = "identical to the reference's" if scheme == "fp8_w8a8_per_tensor_static" else \
        "identical to the reference's in the per-channel scheme (quant_algo FP8_PER_CHANNEL_PER_TOKEN)"
    if build_only:
        same += f" in every field it has; in the build only: {', '.join(build_only)} (diffusers' fields)"
    if ignore:
        same += "; ignore written with ModelOpt's wildcards there, covering the same modules"
    summary = same if not failures else f"{len(failures)} differences: {failures[0]}"
    details: dict[str, Any] = {"differences": failures, "reference": origin.record()}
    if build_only or ignore:
        details["tolerated"] = {"build_only_fields": build_only, "ignore_written_differently": ignore,
                                "why": [NO_DIFFUSERS_FIELDS, WILDCARD_IGNORE]}
    return Check("quantization_config", status_of(not failures), origin.label(summary), details)


def _same_modules(folder: Path, ours: dict[str, Any], theirs: dict[str, Any], problems: list[str]) -> bool:
    """Whether two ``ignore`` lists leave out the same modules of the build's transformer: an entry covers a module
    it names, its children, or what it matches as a wildcard pattern (ModelOpt's ``time_embedder*``)."""
    modules = {name.split("/", 1)[1].rsplit(".", 1)[0] for name in tensor_headers(folder, problems)
               if name.startswith("transformer/")}

    def covered(entries: Any) -> set[str]:
        patterns = [str(e) for e in entries] if isinstance(entries, list) else []
        return {m for m in modules if any(m == p or m.startswith(f"{p}.") or fnmatch.fnmatchcase(m, p)
                                          for p in patterns)}

    return isinstance(ours.get("ignore"), list) and covered(ours["ignore"]) == covered(theirs.get("ignore"))


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


QUANTIZER_STATE = ".metadata.quantizer_state."


def _disabled(flat: dict[str, Any]) -> set[str]:
    """The quantizers a flattened ModelOpt state records as disabled."""
    return {k.split(QUANTIZER_STATE, 1)[1].removesuffix("._disabled") for k, v in flat.items()
            if QUANTIZER_STATE in k and k.endswith("._disabled") and v is True}


def _of_quantizer(key: str, quantizers: set[str]) -> bool:
    """Whether a flattened state entry belongs to one of ``quantizers``: by its name in the quantizers' metadata, or,
    for a weight quantizer, by its module's name in the real-quantization metadata."""
    return any(f"{QUANTIZER_STATE}{q}." in key or f".real_quantizer_state.{q.removesuffix('.weight_quantizer')}." in key
               for q in quantizers)


def check_modelopt_states(folder: Path, reference: Path, scheme: str = "fp8_w8a8_per_tensor_static",
                          origin: ReferenceOrigin | None = None) -> Check:
    """Both state files against the reference's: the same configurations and entries; in the per-channel scheme the
    entries that scheme sets differently (``per_channel.STATE_DIFFERENCES``) are counted apart, anything else that
    differs fails. Against ModelOpt's own export the configurations' quantizer lists are written differently
    (``FP8_DEFAULT_CFG``'s, the build's own): they are left out, and so are the entries of quantizers disabled on
    both sides (``FP8_DEFAULT_CFG`` sets the FP8 format on quantizers it then disables); every other entry is
    compared."""
    modelopt_imported()
    import modelopt.torch.quantization  # noqa: F401  (registers ModelOpt's classes for weights_only loading)

    from release.quantize.recipes import per_channel

    origin = origin or reference_origin(folder, reference)
    allowed = per_channel.STATE_DIFFERENCES if scheme == per_channel.SCHEME else ()
    own_lists = allowed or origin.kind == MODELOPT_EXPORT  # the quant_cfg lists are not compared

    def by_scheme(key: str) -> bool:
        return any(fnmatch.fnmatchcase(key, p) for p in allowed)

    counts, failures, tolerated = {}, [], 0
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
        if origin.kind == MODELOPT_EXPORT:  # the lists, and what FP8_DEFAULT_CFG set on quantizers it disabled
            off = _disabled(ours) & _disabled(theirs)
            listed = [k for k in differ if k.endswith(".config.quant_cfg") or _of_quantizer(k, off)]
            tolerated += len(listed)
            differ = [k for k in differ if k not in set(listed)]
        configs = [[(m, {k: v for k, v in (c.get("config") or {}).items() if not (own_lists and k == "quant_cfg")})
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
    if origin.kind == MODELOPT_EXPORT:
        parts.append(f"{tolerated} entries left out: the quantizer list and the format of the quantizers disabled on "
                     "both sides, which FP8_DEFAULT_CFG writes differently")
    summary = "; ".join(parts) if not failures else f"{failures[0]}"
    details: dict[str, Any] = {"counts": counts, "problems": failures, "reference": origin.record()}
    if origin.kind == MODELOPT_EXPORT:
        details["tolerated"] = {"entries": tolerated, "why": DEFAULT_LIST}
    return Check("modelopt_state", status_of(not failures), origin.label(summary), details)
