"""release: builds, verifies, documents and publishes quantized Cosmos3 checkpoints.

The package reads as the pipeline (README, "Architecture"): ``inputs`` -> ``quantize`` -> ``check`` -> ``measure``
-> ``publish``, over the shared floor ``core``; ``pipeline`` composes stages and ``cli`` is the command line.
"""

__version__ = "0.1.0"
