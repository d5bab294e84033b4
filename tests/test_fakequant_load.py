"""The fake-quant replay's model (``release.quantize.load.fakequant_transformer``) is made from the build's files and
the source's architecture alone, on the device where it runs: every parameter and buffer equals, in dtype and bits,
the model of its definition (the source as diffusers loads it, each tensor replaced by the build's, FP8 weights
dequantized; then ModelOpt's fake quantization at the build's scales, weights folded). On a GPU the model is made
there (the weights folded by ModelOpt's CUDA kernel) and must equal the definition's made on the CPU."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from release.core import fp8
from release.core.builds import load_build
from release.core.device import compute_device
from release.inputs.source import SourceModel, load_transformer
from release.quantize.load import fakequant_transformer


def _defined(source: Path, folder: Path) -> torch.nn.Module:
    """The replay's model as the seed defined it, made on the CPU: the source loaded by diffusers, its tensors
    replaced by the build's (FP8 weights as codes x scale), before ModelOpt's quantizers are inserted."""
    model = load_transformer(source / "transformer").eval()
    built: dict[str, torch.Tensor] = {}
    for shard in sorted((folder / "transformer").glob("*.safetensors")):
        built.update(load_file(shard))
    state = model.state_dict()
    for key in state:
        value = built[key]
        if value.dtype == torch.float8_e4m3fn:
            value = fp8.dequantize(value, built[f"{key.removesuffix('.weight')}.weight_quantizer._scale"])
        state[key] = value.to(state[key].dtype)
    model.load_state_dict(state)
    return model


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**dict(model.named_parameters()), **dict(model.named_buffers())}


def _differing(made: dict[str, torch.Tensor], defined: dict[str, torch.Tensor]) -> list[str]:
    assert made.keys() == defined.keys()
    return [k for k in made if made[k].dtype != defined[k].dtype or made[k].shape != defined[k].shape
            or not torch.equal(_bits(made[k]), _bits(defined[k]))]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


@pytest.mark.parametrize("held", [False, True], ids=["read", "resident"])
def test_the_replay_is_its_definition_bit_for_bit(held: bool, tiny: Path, rtn_build: Path) -> None:
    """The model ``release eval`` rolls out (``held``: from the source ``release campaign`` holds in memory) equals
    the definition with ModelOpt's fake quantization applied the same way, tensor for tensor, after the fold."""
    import modelopt.torch.quantization as mtq

    from release.quantize.recipes import quant_config, quantized_linears

    build = load_build("rtn")
    resident = SourceModel(tiny / "source") if held else None
    made = fakequant_transformer(tiny / "source", rtn_build, build, resident)
    assert next(made.parameters()).device.type == compute_device()
    defined = _defined(tiny / "source", rtn_build)
    built = {k: v for shard in sorted((rtn_build / "transformer").glob("*.safetensors"))
             for k, v in load_file(shard).items()}
    mtq.quantize(defined, quant_config(build), forward_loop=None)
    for name in quantized_linears(defined):
        module = defined.get_submodule(name)
        module.weight_quantizer.amax = built[f"{name}.weight_quantizer._amax"]
        module.input_quantizer.amax = built[f"{name}.input_quantizer._amax"]
    mtq.fold_weight(defined, keep_attrs=True)
    assert _differing(_tensors(made), _tensors(defined)) == []
    assert sum(getattr(m, "input_quantizer", None) is not None and m.input_quantizer.is_enabled
               for m in made.modules()) > 0  # the inputs are still fake-quantized


def test_before_quantization_the_source_s_buffers_and_dtypes_are_kept(tiny: Path, rtn_build: Path) -> None:
    """What the source gives the replay besides its architecture: the non-persistent buffers (the rotary
    frequencies) and each tensor's dtype (the time embedder in fp32), as diffusers' load has them."""
    resident = SourceModel(tiny / "source")
    defined = _tensors(_defined(tiny / "source", rtn_build))
    weights = {k: defined[k].detach() for k in resident.state}
    made = _tensors(resident.instantiate("cpu", weights, bounded=False, share=True))
    assert _differing(made, defined) == []
    assert any(v.dtype == torch.float32 for v in made.values()) and any("inv_freq" in k for k in made)


@pytest.mark.parametrize("name", ["rtn", "sq_auto", "pc_rtn"])
def test_the_lean_calls_give_modelopt_s_bits(name: str, tiny: Path, rtn_build: Path, tmp_path: Path) -> None:
    """Each folded Linear's call as its arithmetic (release.quantize.load._lean) against ModelOpt's own forward on
    the same model: the same actions bit for bit, on a static per-tensor build, a smoothed one (its smoothing folded
    into the stored norms and weights) and the per-channel family's (per-token input amax); every quantized Linear
    is lean, and every module kept in BF16 plain."""
    from release.core.builds import load_release
    from release.core.config import NATIVE_STEPS
    from release.inputs.observations import load_observations
    from release.inputs.policy import load_pipeline, rollout
    from release.measure.evaluate import select
    from tests.conftest import invoke

    build = load_build(name)
    folder = rtn_build
    if name != "rtn":
        result = invoke("build", name, "--source", tiny / "source", "--observations", tiny / "observations",
                        "--out", tmp_path)
        assert result.exit_code == 0, result.output
        folder = tmp_path / build.repo
    model = fakequant_transformer(tiny / "source", folder, build)
    linears = [m for m in model.modules() if getattr(getattr(m, "input_quantizer", None), "is_enabled", False)]
    assert linears and all("forward" in vars(m) for m in linears)
    # the modules kept in BF16 (every quantizer off), called as the torch modules they replaced
    plain = [m for m in model.modules() if hasattr(m, "original_cls") and m not in linears]
    assert plain and all("forward" in vars(m) for m in plain)
    settings = load_release().policy
    pipe = load_pipeline(tiny / "source", settings, transformer=model)
    observations = select(load_observations(tiny / "observations"), load_release(), "validation")[:3]

    def actions() -> list[np.ndarray]:
        with torch.inference_mode():
            return [rollout(pipe, o, settings, **NATIVE_STEPS) for o in observations]

    lean = actions()
    for m in linears + plain:
        del m.forward  # ModelOpt's QuantLinear and QuantEmbedding forward again
    eager = actions()
    assert [a.tobytes() for a in lean] == [a.tobytes() for a in eager]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_lookup_table_is_modelopts_quantize_on_every_16_bit_value(dtype: torch.dtype) -> None:
    """``load.Table``: a CPU input's FP8 quantize-dequantize at a per-tensor amax, looked up, equals ModelOpt's
    ``quantize_op`` on every one of the 65,536 inputs (NaNs as NaNs), and follows a changed amax."""
    from modelopt.torch.quantization import tensor_quant

    from release.quantize.load import Table

    def quantize(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
        return tensor_quant.quantize_op(x, amax, num_bits=8, exponent_bits=4, unsigned=False, narrow_range=False)

    table = Table(quantize)
    every = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype).reshape(256, 256)
    every = every[torch.randperm(256, generator=torch.Generator().manual_seed(0))]  # any order, any shape
    for amax in (torch.tensor(3.0), torch.tensor(0.01), torch.tensor(3.0)):
        assert Table.applies(every, amax)
        got, want = table(every, amax), quantize(every, amax)
        nan = want.isnan()
        assert torch.equal(got.isnan(), nan) and torch.equal(got[~nan].view(torch.int16), want[~nan].view(torch.int16))
    assert not Table.applies(every.float(), amax) and not Table.applies(every, torch.ones(256, 1))
