"""Wall time of one tiny policy rollout on the CPU, and where it goes (issue 33).

Loads each policy once (the BF16 source; with ``--build DIR`` also that build's fake-quant replay and its deployed
path under the CPU emulation, with the pipeline arguments ``release eval`` gives them), rolls out N observations, and
reports per policy the first rollout of each observation in the process (``first``: for BF16 the frame's resize and
VAE encode run) and the median of the later ones (``later``: as in ``release campaign``, where every build replays
the same observations in one process), wall and CPU time, then with ``--profile`` a cProfile table of one more pass:
seconds per rollout of its parts (the frame, the pipeline, the tokenizer, the conditioning and its VAE encode, the
packing, the transformer, the scheduler).

Usage: .venv/bin/python bench/tiny_rollout.py [--fixture DIR] [--build DIR ...] [-n 8] [--repeat 3]
                                              [--profile cpu|wall] [--top N] [--save A.npz] [--compare A.npz]

Without ``--fixture`` a tiny fixture is written into a temporary folder. ``--save`` keeps every policy's actions,
``--compare`` checks them bit for bit against an earlier ``--save`` (e.g. of the main branch: run that one with
``PYTHONPATH`` on its checkout; the first line says which ``release`` ran).
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import release
from release.core.builds import load_build, load_release
from release.inputs.observations import load_observations
from release.inputs.policy import load_pipeline, rollout


def parts() -> list[tuple[str, object]]:
    """The parts of a rollout, each a function whose cumulative time cProfile reports (its outermost calls)."""
    import copy

    from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer, UniPCMultistepScheduler
    from diffusers.video_processor import VideoProcessor
    from modelopt.torch.quantization.nn import TensorQuantizer
    from PIL import Image

    import release.core.fp8 as fp8
    import release.inputs.policy as policy
    from release.inputs.observations import Observation
    from release.inputs.policy import JointPositionPolicyPipeline

    pipe = JointPositionPolicyPipeline  # its own methods where it has them, else diffusers'
    return [
        ("rollout (release.inputs.policy.rollout)", rollout),
        ("  frame: Observation.concat_view (3 PNGs read)", Observation.concat_view),
        ("  frame: Image.fromarray", Image.fromarray),
        ("  pipeline __call__ (diffusers)", pipe.__call__),
        ("    check_inputs", pipe.check_inputs),
        ("    VideoProcessor.preprocess_video (all calls)", VideoProcessor.preprocess_video),
        ("    tokenize_prompt (chat template, tokenizer)", pipe.tokenize_prompt),
        ("    prepare_latents", pipe.prepare_latents),
        ("      action video conditioning (resize, pad, encode)", pipe._prepare_action_video_conditioning),
        ("        frame hash (the memo's key)", getattr(policy, "_clip_digest", None)),
        ("        VAE encode, memoised (_encode_video)", pipe._encode_video),
        ("          of which the VAE itself", AutoencoderKLWan.encode),
        ("    packing: _prepare_text_segment", pipe._prepare_text_segment),
        ("    packing: _prepare_vision_segment", pipe._prepare_vision_segment),
        ("    packing: _prepare_action_segment", pipe._prepare_action_segment),
        ("    scheduler.set_timesteps", UniPCMultistepScheduler.set_timesteps),
        ("    copy.deepcopy (the action scheduler)", copy.deepcopy),
        ("    transformer forward (8 calls)", Cosmos3OmniTransformer.forward),
        ("      of which the FP8 GEMM emulation (per tensor)", fp8.per_tensor_forward),
        ("      of which the FP8 GEMM emulation (row-wise)", fp8.rowwise_forward),
        ("      of which ModelOpt's quantizers", TensorQuantizer.forward),
        ("    _mask_velocity_predictions", pipe._mask_velocity_predictions),
        ("    scheduler.step (UniPC, vision and action)", UniPCMultistepScheduler.step),
    ]


def profile_table(stats: pstats.Stats, rollouts: int) -> list[tuple[str, float]]:
    """Seconds per rollout of each part: the cumulative time of its function (cProfile counts a recursive or
    re-entered function once)."""
    import inspect

    raw: dict = stats.stats  # type: ignore[attr-defined]
    rows = []
    for label, fn in parts():
        if fn is None:  # not in this version of the code
            continue
        code = inspect.unwrap(fn).__code__  # type: ignore[arg-type, attr-defined]
        key = (code.co_filename, code.co_firstlineno, code.co_name)
        rows.append((label, raw[key][3] / rollouts if key in raw else 0.0))
    return rows


def measure(label: str, make: Callable[[], torch.nn.Module | None], kwargs: dict[str, Any], fixture: Path, n: int,
            repeat: int, profile: str | None) -> dict:
    release_cfg = load_release()
    observations = load_observations(fixture / "observations")[:n]
    t0 = time.perf_counter()
    pipe = load_pipeline(fixture / "source", release_cfg.policy, transformer=make())
    load_s = time.perf_counter() - t0
    cold, cold_cpu, actions = [], [], []
    for obs in observations:
        t0, c0 = time.perf_counter(), time.process_time()
        actions.append(rollout(pipe, obs, release_cfg.policy, **kwargs))
        cold.append(time.perf_counter() - t0)
        cold_cpu.append(time.process_time() - c0)
    warm, cpu = [], []
    for _ in range(repeat):
        for i, obs in enumerate(observations):
            t0, c0 = time.perf_counter(), time.process_time()
            again = rollout(pipe, obs, release_cfg.policy, **kwargs)
            warm.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            if not np.array_equal(again.view(np.uint32), actions[i].view(np.uint32)):
                raise SystemExit(f"{label}: observation {obs.obs_id}: a warm rollout differs from the first one")
    stats = None
    if profile:
        profiler = cProfile.Profile(time.process_time if profile == "cpu" else time.perf_counter)
        profiler.enable()
        for obs in observations:
            rollout(pipe, obs, release_cfg.policy, **kwargs)
        profiler.disable()
        stats = pstats.Stats(profiler)
    return {"label": label, "load_s": load_s, "cold": cold, "cold_cpu": cold_cpu, "warm": warm, "cpu": cpu,
            "actions": np.stack(actions), "stats": stats, "n": len(observations), "clock": profile}


def report(result: dict, top: int) -> None:
    line = (f"\n## {result['label']}: load {result['load_s']:.2f} s; per rollout: first of each observation "
            f"median {statistics.median(result['cold']):.3f} s wall, {statistics.median(result['cold_cpu']):.3f} s CPU")
    if result["warm"]:
        line += (f"; later ones median {statistics.median(result['warm']):.3f} s wall, "
                 f"{statistics.median(result['cpu']):.3f} s CPU ({len(result['warm'])} rollouts)")
    print(line)
    if result["stats"] is None:
        return
    print(f"\n| part (cProfile, {result['clock']} time, later rollouts) | s per rollout |\n|---|---:|")
    for label, s in profile_table(result["stats"], result["n"]):
        print(f"| {label} | {s:.4f} |")
    if top:
        print()
        result["stats"].sort_stats("cumulative").print_stats(top)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--fixture", type=Path, help="a 'release fixture tiny' folder (default: a new one)")
    parser.add_argument("--build", type=Path, action="append", default=[],
                        help="a build folder: also its fakequant and deployed paths (repeatable)")
    parser.add_argument("-n", type=int, default=8, help="observations (default 8)")
    parser.add_argument("--repeat", type=int, default=3, help="later passes over the observations (default 3)")
    parser.add_argument("--profile", choices=["cpu", "wall"],
                        help="a cProfile pass over the observations after them, timed by the process's CPU time "
                             "(all threads; steadier on a shared machine) or by the wall clock")
    parser.add_argument("--top", type=int, default=0, help="also print cProfile's top N cumulative functions")
    parser.add_argument("--save", type=Path, help="save every policy's actions (.npz)")
    parser.add_argument("--compare", type=Path, help="compare the actions bit for bit with an earlier --save")
    parser.add_argument("--only", action="append", help="only these policies (bf16, fakequant:NAME, deployed:NAME)")
    parser.add_argument("--no-fold", action="store_true",
                        help="the fake-quant replay without ModelOpt's fold_weight (its weights quantized on every "
                             "call, as before issue 33): with --save/--compare, the fold's cost and bits")
    args = parser.parse_args()
    if args.no_fold:
        import modelopt.torch.quantization as mtq

        mtq.fold_weight = lambda model, keep_attrs=False: None
    print(f"release from {Path(release.__file__).parent}; torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; {torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU'}"
          f"{'; fake quant without fold_weight' if args.no_fold else ''}")
    with tempfile.TemporaryDirectory() as tmp:
        fixture = args.fixture
        if fixture is None:
            from release.inputs.fixture import write_fixture

            fixture = Path(tmp) / "fixture"
            write_fixture(fixture)
        # each policy's transformer and pipeline arguments, as release eval rolls it out
        makers: dict[str, tuple[Callable[[], torch.nn.Module | None], dict[str, Any]]] = {"bf16": (lambda: None, {})}
        for folder in args.build:
            from release.core.io import read_json
            from release.quantize.load import deployed_transformer, fakequant_transformer

            name = read_json(folder / "provenance.json", "provenance", "release build")["build"]
            build = load_build(name)
            makers[f"fakequant:{name}"] = (functools.partial(fakequant_transformer, fixture / "source", folder, build),
                                           {})
            makers[f"deployed:{name}"] = (functools.partial(deployed_transformer, folder, emulate=True),
                                          {"mixed_precision_format": "none"})
        results = {}
        for label, (make, kwargs) in makers.items():
            if args.only and label not in args.only:
                continue
            results[label] = measure(label, make, kwargs, fixture, args.n, args.repeat, args.profile)
            report(results[label], args.top)
        if args.save:
            np.savez(args.save, **{k: r["actions"] for k, r in results.items()})
        if args.compare:
            earlier = np.load(args.compare)
            for k, r in results.items():
                a, b = earlier[k], r["actions"]
                m = min(len(a), len(b))
                same = np.array_equal(a[:m].view(np.uint32), b[:m].view(np.uint32))
                print(f"{k}: actions of {m} observations {'bit-identical to' if same else 'DIFFER from'} "
                      f"{args.compare}")
                if not same:
                    raise SystemExit(1)


if __name__ == "__main__":
    main()
