"""ModelOpt's CUDA extensions: the kernels of its fake quantization, which torch compiles on a machine's first use
(about a minute on the H200, BENCHMARKS.md "The 22-build sweep in one process"; then cached under
``~/.cache/torch_extensions``). A build on CUDA compiles them in a thread while the calibration capture runs; the
first quantization waits for that thread, and says so while it waits."""

from __future__ import annotations

import threading

from release.core.device import modelopt_imported
from release.core.output import info


def _compile() -> None:
    modelopt_imported()
    from modelopt.torch.quantization import extensions

    extensions.get_cuda_ext()  # each caches its module: later calls, ModelOpt's own included, return it at once
    extensions.get_cuda_ext_fp8()


class ExtensionBuild:
    """The extensions compiled (or loaded from torch's cache) in the background, on CUDA only."""

    def __init__(self, device: str) -> None:
        self.thread = threading.Thread(target=_compile, name="modelopt-extensions", daemon=True) \
            if device == "cuda" else None
        if self.thread is not None:
            self.thread.start()

    def wait(self) -> None:
        if self.thread is None:
            return
        if self.thread.is_alive():
            info("waiting for ModelOpt's CUDA extensions to finish compiling (once per machine; torch caches them "
                 "in ~/.cache/torch_extensions)")
        self.thread.join()
        self.thread = None
