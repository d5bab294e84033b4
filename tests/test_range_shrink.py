"""The range-shrink observer (TI edgeai-tensorlab, algorithms.md "Range shrink"): quantiles, EMA, a real tiny build."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from release.core.builds import load_build
from release.core.config import Calibrator
from release.core.errors import ReleaseError
from release.quantize.recipes import Observer, tail_quantiles
from tests.conftest import invoke


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for shard in sorted(folder.glob("*.safetensors")):
        out.update(load_file(shard))
    return out


@pytest.mark.parametrize("n", [1, 2, 7, 10_001, 54_321])
@pytest.mark.parametrize("q", [1e-4, 0.013, 0.25])
def test_tail_quantiles_equal_torch_quantile_linear(n: int, q: float) -> None:
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 3 + 0.5
    # 'linear' interpolation (the default), on float64 so that torch.quantile's rank is float64 too, as ours is
    expected = torch.quantile(x.double(), torch.tensor([q, 1 - q], dtype=torch.float64)).float()
    torch.testing.assert_close(tail_quantiles(x.reshape(-1, 1), q), expected, rtol=1e-6, atol=1e-6)


def _calls() -> list[torch.Tensor]:
    """Five calls of skewed activations, each with a few outliers far out in one tail."""
    g = torch.Generator().manual_seed(0)
    calls = []
    for i in range(5):
        x = torch.randn(3, 211, 48, generator=g) * (1 + i) + 0.3 * i
        x.view(-1)[:: 4001] = 40.0 + 10 * i if i % 2 else -50.0 - 5 * i
        calls.append(x)
    return calls


def _hand_amax(calls: list[torch.Tensor], percent: float, momentum: float) -> float:
    """numpy's linear quantiles per call, then an explicit EMA of the bounds (first call initialises it)."""
    ema: list[float] = []
    for x in calls:
        v = x.double().numpy().ravel()
        bounds = [float(np.quantile(v, percent / 100)), float(np.quantile(v, 1 - percent / 100))]
        ema = bounds if not ema else [e + momentum * (b - e) for e, b in zip(ema, bounds, strict=True)]
    return max(abs(ema[0]), abs(ema[1]))


@pytest.mark.parametrize(("percent", "momentum"), [(0.01, 0.01), (1.5, 0.3)])
def test_range_shrink_amax_equals_hand_computation(percent: float, momentum: float) -> None:
    calls = _calls()
    observer = Observer(Calibrator(method="range_shrink", shrink_percent=percent, momentum=momentum), ["a"])
    plain = Observer(Calibrator(method="moving_average", momentum=1.0), ["a"])  # momentum 1: the last call's max
    for index, x in enumerate(calls):
        observer.call = plain.call = index
        observer.record("a", x)
        plain.record("a", x)
    amax = float(observer.amax()["a"])
    assert amax == pytest.approx(_hand_amax(calls, percent, momentum), rel=1e-5)
    max_observer = max(float(x.abs().amax()) for x in calls)  # ModelOpt's max calibration over all calls
    assert amax < max_observer
    assert amax < float(plain.amax()["a"])  # shrinking the tails stays under each call's max


@pytest.mark.parametrize("value", ["0", "50", "-1"])
def test_shrink_percent_out_of_range_is_a_field_error(builds: Path, value: str) -> None:
    path = builds / "rtn_range_shrink.yaml"
    path.write_text(path.read_text().replace("shrink_percent: 0.01", f"shrink_percent: {value}"))
    with pytest.raises(ReleaseError, match=r"rtn_range_shrink\.yaml:9: field 'calibrator\.shrink_percent'"):
        load_build("rtn_range_shrink")


def test_range_shrink_build_keeps_rtn_codes_and_shrinks_input_scales(rtn_build: Path, tiny: Path) -> None:
    dist = rtn_build.parent
    result = invoke("build", "rtn_range_shrink", "--source", tiny / "source", "--observations",
                    tiny / "observations", "--out", dist)
    assert result.exit_code == 0, result.output
    assert "capturing" not in result.output  # the RTN build's calibration capture is reused
    folder = dist / "Cosmos3-Nano-Policy-DROID-FP8-RTN-RangeShrink"
    report = json.loads((folder / "verification" / "report.json").read_text())
    assert report["status"] == "passed", report
    provenance = json.loads((folder / "provenance.json").read_text())
    assert json.dumps(provenance).count('"range_shrink"') >= 1
    rtn, shrunk = _tensors(rtn_build / "transformer"), _tensors(folder / "transformer")
    assert rtn.keys() == shrunk.keys()
    inputs = [k for k in rtn if k.endswith(("input_scale", "input_quantizer._amax"))]
    assert len([k for k in inputs if k.endswith("input_scale")]) == 28
    for key in rtn:
        if key not in inputs:  # weight codes, weight scales, everything kept in BF16
            assert torch.equal(rtn[key].reshape(-1).view(torch.uint8), shrunk[key].reshape(-1).view(torch.uint8)), key
    assert all(torch.all(shrunk[k] <= rtn[k]) for k in inputs)
    changed = [k for k in inputs if k.endswith("input_scale") and not torch.equal(rtn[k], shrunk[k])]
    assert len(changed) == 28
