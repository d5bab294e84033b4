"""The eval's eager-vs-compile yardstick alone, with no build: BF16 rollouts of the split eager and under
``torch.compile`` (``release.measure.evaluate.run_yardsticks``), to set a difference between two FP8 stacks (the
served and deployed paths) against the difference between two BF16 stacks at the same size on the same GPU.
Usage: python bench/gpu_compile_yardstick.py SOURCE OBSERVATIONS DIST [SPLIT]   (writes DIST/yardsticks/)"""

import sys
from pathlib import Path

from release.core.builds import load_release
from release.core.io import cache_dir
from release.measure.evaluate import EvalRequest, run_eval


def main() -> None:
    source, observations, dist = (Path(a) for a in sys.argv[1:4])
    split = sys.argv[4] if len(sys.argv) > 4 else "validation"
    release = load_release()
    request = EvalRequest(release, [], "deployed", split, dist, source, observations,  # type: ignore[arg-type]
                          cache_dir(), True, release.served_steps)
    for out in run_eval(request):
        print(out)


if __name__ == "__main__":
    main()
