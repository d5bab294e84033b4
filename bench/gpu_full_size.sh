#!/usr/bin/env bash
# The tool at the Nano's full size on a GPU machine: `release fixture nano` (15.7B parameters, random weights),
# `release build rtn` (calibration capture, ModelOpt quantization, export, verification) and
# `release eval rtn --path deployed --split validation`, each timed, with the peak GPU memory and the sizes on disk.
# Usage: bench/gpu_full_size.sh WORK OUT [STAGE ...]   stages: fixture build eval (default: all three, in order)
set -euo pipefail
work=$1 out=$2
shift 2
stages=${*:-fixture build eval}
release() { python3 -c 'from release.cli import main; main()' "$@"; }
export RELEASE_CACHE=$work/cache
common=(--source "$work/fx/source" --observations "$work/fx/observations")
mkdir -p "$work" "$out"
nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 500 >>"$out/gpu_mem.log" &
monitor=$!
trap 'kill $monitor' EXIT
for stage in $stages; do
  SECONDS=0
  case $stage in
    fixture) release fixture nano --out "$work/fx" ;;
    build) release build rtn "${common[@]}" --dist "$work/dist" ;;
    eval) release eval rtn --path deployed --split validation "${common[@]}" --dist "$work/dist" ;;
    *) echo "unknown stage $stage" >&2; exit 2 ;;
  esac
  echo "| $stage | ${SECONDS} s | $(sort -n "$out/gpu_mem.log" | tail -1) MiB |" | tee -a "$out/full_size.md"
done
du -sh "$work"/fx/source "$work"/dist/* 2>/dev/null | tee -a "$out/full_size.md"
