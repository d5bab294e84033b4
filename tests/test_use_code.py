"""The card's Use code as a user runs it: pushed to the local Hub server, extracted from the rendered README.md and
run verbatim in a fresh interpreter with an empty Hugging Face cache; it must restore ModelOpt's quantized Linears,
whose FP8 weights a policy rollout then uses."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import ROOT, invoke
from tests.hub_server import FakeHub

RTN = "Cosmos3-Nano-Policy-DROID-FP8"
pytestmark = pytest.mark.filterwarnings("ignore:Use 'content=<...>':DeprecationWarning")  # huggingface_hub

# What the test runs after the card's code, in the same interpreter: ``transformer`` is the card's, ``path`` the
# snapshot it downloaded (the pipeline's other parts are loaded from there).
CHECKS = """
import numpy as _np
import torch as _torch
from pathlib import Path as _Path
from modelopt.torch.quantization.nn import QuantModule as _QuantModule
from release.core.builds import load_release as _load_release
from release.core.io import read_json as _read_json
from release.inputs.observations import load_observations as _load_observations
from release.inputs.policy import load_pipeline as _load_pipeline, rollout as _rollout

_fp8 = [(n, m) for n, m in transformer.named_modules() if isinstance(m, _torch.nn.Linear)
        and m.weight.dtype == _torch.float8_e4m3fn]
_plain = [n for n, m in _fp8 if not isinstance(m, _QuantModule)]
assert not _plain, f"plain torch.nn.Linear holding FP8 weights: {len(_plain)}, the first {_plain[0]}"
assert all(m.weight_quantizer.is_enabled and m.input_quantizer.is_enabled for _, m in _fp8)
_expected = _read_json(_Path(path) / "provenance.json", "provenance", "release build")["quantized_linears"]
assert len(_fp8) == _expected, (len(_fp8), _expected)
_name, _module = _fp8[0]
_seen = []
_module.register_forward_hook(lambda m, args, out: _seen.append((args[0], out)))
_settings = _load_release().policy
_pipe = _load_pipeline(_Path(path), _settings, transformer=transformer)
_actions = _rollout(_pipe, _load_observations(_Path(OBSERVATIONS))[0], _settings)
assert _seen, f"{_name} did not run in the rollout"
for _x, _y in _seen:  # the FP8 codes times the weight scale (W8A16: the tiny policy's 4 steps are all first/last)
    _scale = _module.weight_quantizer._scale.to(_x.dtype)
    _dense = _torch.nn.functional.linear(_x, _module.weight.to(_x.dtype) * _scale, _module.bias)
    assert _torch.equal(_y, _dense), f"{_name}: its output is not the product with its FP8 weights"
assert _np.isfinite(_actions).all(), "non-finite actions"
print("USE-CODE-OK", type(_module).__name__, list(_actions.shape))
"""


def use_code(readme: str) -> str:
    """The one ```python block of the card's Use section."""
    section = readme.split("\n## Use\n", 1)[1].split("\n## ", 1)[0]
    [code] = re.findall(r"^```python\n(.*?)^```$", section, re.S | re.M)
    return str(code)


def run_as_a_user(code: str, hub: FakeHub, tiny: Path, home: Path,
                  checks: str = CHECKS) -> subprocess.CompletedProcess[str]:
    """``code`` then ``checks``, in a new interpreter: an empty HF_HOME, the Hub at the local server, no token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING_FACE_", "RELEASE_"))}
    env.update(HF_HOME=str(home), HF_ENDPOINT=hub.url, HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
               PYTHONPATH=str(ROOT), RELEASE_CACHE=str(home.parent / "release-cache"))
    script = code + f"\nOBSERVATIONS = {str(tiny / 'observations')!r}\n" + textwrap.dedent(checks)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True,
                          check=False, timeout=600)


def test_the_cards_use_code_loads_the_published_repo(hub: FakeHub, carded: Path, tiny: Path,
                                                     tmp_path: Path) -> None:
    pushed = invoke("push", "rtn", "--dist", carded, "--endpoint", hub.url)
    assert pushed.exit_code == 0, pushed.output
    readme = hub.files(f"np-cr/{RTN}")["README.md"].decode()  # the card as the Hub serves it
    code = use_code(readme)
    assert f'"np-cr/{RTN}"' in code
    home = tmp_path / "hf_home"
    done = run_as_a_user(code, hub, tiny, home)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-6000:]
    assert "USE-CODE-OK" in done.stdout
    assert any(home.rglob("modelopt_state.pth"))  # downloaded into the empty cache
