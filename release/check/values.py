"""The checks of a build's tensors: its FP8 codes and scales recomputed from the source as its recipe makes them,
and the consistency of its shard indexes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from release.check.layout import SHARD_INDEXES, read_checkpoint_json, tensor_headers
from release.check.report import Check, status_of


def read_tensors(folder: Path, problems: list[str]) -> dict[str, torch.Tensor]:
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

    from release.quantize.recipes import folded

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
    from release.quantize.recipes import per_channel

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
    from release.core.device import compute_device
    from release.core.fp8 import dequantize, grid_step, nan_codes, weight_codes
    from release.quantize.recipes import per_channel

    problems: list[str] = []
    provenance = read_checkpoint_json(folder, "provenance.json", problems)
    built = read_tensors(folder / "transformer", problems)
    src = source_tensors if source_tensors is not None else read_tensors(source / "transformer", problems)
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
    fp8 = [k for k, v in built.items() if v.dtype == torch.float8_e4m3fn]
    recorded = provenance.get("quantized_linears")
    if not fp8 or (isinstance(recorded, int) and len(fp8) != recorded):  # a check that saw nothing must not pass
        problems.append(f"transformer/: {len(fp8)} FP8 weights, provenance.json records {recorded} quantized "
                        "Linears; rebuild it with 'release build NAME'")
    if recipe.get("alpha_table") and not (folder / "smoothing_scales.safetensors").is_file():
        problems.append("smoothing_scales.safetensors: missing, and provenance.json records a smoothing; rebuild it "
                        "with 'release build NAME'")
    if problems:
        return Check("values", "failed", problems[0], {"problems": problems})
    expected = expected_weights(src, folder, provenance, device)
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
               f"{f' except {folded} norms with folded smoothing' if folded else ''}")
    return Check("values", status_of(not problems), summary if not problems else problems[0], details)


def check_consistency(folder: Path) -> Check:
    problems: list[str] = []
    for component, index_name in SHARD_INDEXES.items():
        index = read_checkpoint_json(folder, f"{component}/{index_name}" if component else index_name, problems)
        if not index:
            continue
        listed = set(index.get("weight_map", {}).values())
        present = {p.name if component else f"transformer/{p.name}"
                   for p in (folder / "transformer").glob("*.safetensors")}
        problems += [f"{index_name}: lists {f}, which is missing" for f in sorted(listed - present)]
        problems += [f"{f}: orphan shard, not in {index_name}" for f in sorted(present - listed)]
    duplicates: list[str] = []
    tensor_headers(folder / "transformer", duplicates)
    problems += [d for d in duplicates if "also in" in d]
    summary = "both indexes list exactly the shards present; no tensor twice; no orphan file"
    return Check("consistency", status_of(not problems), summary if not problems else problems[0],
                 {"problems": problems})
