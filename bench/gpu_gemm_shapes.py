"""The FP8 GEMM shapes (M tokens, N out, K in) of a policy's rollouts: the BF16 source's rollouts on a split of the
observation set, with ``release.quantize.load.GemmRecord`` tracking the Linears that a build quantizes (the same
hook ``release eval --path deployed`` records them with; quantization changes no shape). For the Nano's shapes at
full size without building it: ``release fixture nano`` (random weights), then this.

Usage: PYTHONPATH=. python3 bench/gpu_gemm_shapes.py SOURCE OBSERVATIONS OUT.json [SPLIT] [BUILD]
(default split validation, build rtn). OUT.json: the machine, the policy settings, and each shape with the
number of rollouts that ran it.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import torch

from release.core.builds import load_build, load_release
from release.core.io import write_json
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout
from release.measure.evaluate import select
from release.quantize.load import GemmRecord
from release.quantize.recipes import quantized_linears_of


def main(source: Path, observations: Path, out: Path, split: str, build: str) -> None:
    release = load_release()
    pipe = load_pipeline(source, release.policy)
    names = quantized_linears_of(pipe.transformer, load_build(build))
    record = GemmRecord("bf16")
    for name in names:
        record.track(pipe.transformer.get_submodule(name))
    chosen = select(load_observations(observations), release, split)
    rollouts: Counter[tuple[int, int, int]] = Counter()  # how many rollouts ran each shape
    for obs in chosen:
        record.shapes.clear()
        rollout(pipe, obs, release.policy, mixed_precision_format="none")
        rollouts.update(record.shapes)
    write_json(out, {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
                     "torch": torch.__version__, "cuda": torch.version.cuda, "source": str(source), "split": split,
                     "observations": len(chosen), "build": build, "linears": len(names),
                     "policy": release.policy.model_dump(),
                     "shapes": [{"m": m, "n": n, "k": k, "rollouts": rollouts[(m, n, k)]}
                                for m, n, k in sorted(rollouts)]})
    print(json.dumps({"shapes": sorted(rollouts), "linears": len(names), "observations": len(chosen)}))


if __name__ == "__main__":
    args = sys.argv[1:]
    main(Path(args[0]), Path(args[1]), Path(args[2]), args[3] if len(args) > 3 else "validation",
         args[4] if len(args) > 4 else "rtn")
