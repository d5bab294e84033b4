"""Measuring builds: policy replays against BF16 (``release eval``), their statistics, the tables and the
selection rule."""
