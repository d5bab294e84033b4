"""Would batching rollouts across observations keep what is measured? (issues 32 and 33; CPU or GPU)

diffusers' Cosmos3 pipeline runs one sample per call ("Lists are collapsed to the first entry"), and its transformer
packs one sample's sequence: a causal text prefix (``und_len``) then the generation tokens, whose attention spans
the whole sequence. So observations cannot simply be stacked; a batched rollout would pack several observations'
calls of the same denoising step into one sequence, with the attention kept to each observation's own tokens.

This bench measures that at the level of the transformer call, on the calls the policy really makes:
  1. the BF16 pipeline rolls out N observations with ``release.inputs.policy.capture_calls`` recording every
     transformer call (``steps`` x 2 per rollout: the conditional and the CFG pass);
  2. for each model (BF16, the build's fake-quant replay, its deployed path) each call is run alone (as today), and
     the N observations' calls of the same step and pass are packed into one call: the text prefixes first, then
     the generation tokens, every index and position remapped, and diffusers' own attention processor run with its
     attention function split per observation (each observation's attention is the unbatched one on the same
     shapes; the Linears, norms and MLPs see all N observations' tokens at once);
  3. it reports per model whether each observation's outputs of the packed call are bit-equal to its lone call,
     the largest difference, and the wall time of the N lone calls against the packed one (one thread, as release
     runs the tiny model); with ``--compile`` the BF16 model's lone calls under ``torch.compile`` too, the
     eager-vs-compile yardstick at the same level.

Usage: .venv/bin/python bench/batched_calls.py --fixture FX --build DIST/REPO [-n 8] [--compile] [--json OUT]
(FX from ``release fixture tiny``, the build from ``release build rtn``).
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from release.core.builds import load_build, load_release
from release.inputs.batched import attention_per_observation, pack
from release.inputs.observations import load_observations
from release.inputs.policy import capture_calls, load_pipeline, rollout


def outputs(result: Any) -> list[list[torch.Tensor]]:
    """Per item: its vision and action predictions."""
    vision, _, action = result
    return [[v, a] for v, a in zip(vision, action, strict=True)]


def lone(model: Callable[..., Any], calls: list[dict[str, Any]]) -> list[list[torch.Tensor]]:
    """Each call alone, as a rollout makes it today."""
    return [outputs(model(**c))[0] for c in calls]


def packed(model: Callable[..., Any], calls: list[dict[str, Any]]) -> list[list[torch.Tensor]]:
    """The calls packed into one."""
    call, segments = pack(calls)
    with attention_per_observation(segments):
        return outputs(model(**call))


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def compare(groups: list[list[dict[str, Any]]], first: Callable[[list[dict[str, Any]]], list[list[torch.Tensor]]],
            second: Callable[[list[dict[str, Any]]], list[list[torch.Tensor]]]) -> dict[str, Any]:
    """Two ways of running every group of calls: their outputs compared item by item, and their wall times."""
    times = [0.0, 0.0]
    equal, total, worst, elements, differing = 0, 0, 0.0, 0, 0
    with torch.no_grad():
        for calls in groups:
            results = []
            for i, way in enumerate((first, second)):
                sync()
                t = time.perf_counter()
                results.append(way(calls))
                sync()
                times[i] += time.perf_counter() - t
            for a, b in zip(*results, strict=True):
                for x, y in zip(a, b, strict=True):
                    total += 1
                    equal += bool(torch.equal(x, y))
                    worst = max(worst, (x.float() - y.float()).abs().max().item())
                    elements += x.numel()
                    differing += int((x != y).sum())
    return {"calls": sum(len(c) for c in groups), "outputs_equal": f"{equal}/{total}",
            "elements_differing": f"{differing}/{elements}", "max_abs_diff": worst,
            "first_s": round(times[0], 3), "second_s": round(times[1], 3), "ratio": round(times[0] / times[1], 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fixture", type=Path, required=True)
    ap.add_argument("--build", type=Path, required=True, help="an exported build folder (the rtn build)")
    ap.add_argument("-n", type=int, default=8, help="observations per packed call")
    ap.add_argument("--compile", action="store_true", help="the eager-vs-compile yardstick at the call level")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from release.core.device import compute_device
    from release.quantize.load import deployed_transformer, fakequant_transformer

    torch.set_num_threads(1)
    policy = load_release().policy
    pipe = load_pipeline(args.fixture / "source", policy)
    calls: list[dict[str, Any]] = []
    observations = load_observations(args.fixture / "observations")[: args.n]
    with capture_calls(pipe.transformer, calls.append):
        for obs in observations:
            rollout(pipe, obs, policy)
    per = len(calls) // len(observations)
    device = compute_device()
    moved = [{k: (v.to(device) if isinstance(v, torch.Tensor) else
                  [t.to(device) if isinstance(t, torch.Tensor) else t for t in v] if isinstance(v, list) else v)
              for k, v in c.items()} for c in calls]
    groups = [[moved[j * per + i] for j in range(len(observations))] for i in range(per)]
    build = load_build("rtn")
    makers: dict[str, Callable[[], torch.nn.Module]] = {
        "bf16": lambda: pipe.transformer,
        "fakequant": functools.partial(fakequant_transformer, args.fixture / "source", args.build, build),
        "deployed": functools.partial(deployed_transformer, args.build),
    }
    report: dict[str, Any] = {"device": device, "observations": len(observations), "calls_per_rollout": per,
                              "torch": torch.__version__}
    for name, make in makers.items():
        model = make().to(device).eval()
        model(**groups[0][0])  # a first call apart (lazy set-up), as in a rollout series
        report[name] = compare(groups, functools.partial(lone, model), functools.partial(packed, model))
        print(f"{name}: lone (first) vs packed (second):", json.dumps(report[name]), flush=True)
        if name == "bf16" and args.compile:
            compiled = torch.compile(model, dynamic=True)
            report["bf16_eager_vs_compile"] = compare(groups, functools.partial(lone, model),
                                                      functools.partial(lone, compiled))
            print("bf16: eager (first) vs torch.compile (second), lone calls:",
                  json.dumps(report["bf16_eager_vs_compile"]), flush=True)
        del model  # before the next model is placed (at the Nano's size two do not fit beside the source's)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
