"""The shared floor beneath the stages: errors, configuration, files, FP8 arithmetic, devices and GPU memory,
profiling and processes. It imports nothing of the stages above it."""
