"""Making checkpoints: the recipes on ModelOpt's quantizers, the export in NVIDIA's layout and its loading back, and
``release build``'s making of each build (calibration capture, quantize, export, provenance)."""
