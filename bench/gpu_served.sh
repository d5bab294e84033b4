#!/usr/bin/env bash
# The seed's served table at the Nano's size (issue 35): for each build of $SERVED_BUILDS (default the five that the
# seed's policy server served), `release build`, then `release eval` on the held-out split through the deployed path
# (diffusers, ModelOpt's FP8 GEMM, CUDA graphs) and the served path (TorchAO, as NVIDIA's policy server, eager), each
# timed; then the build folder is removed, all but RTN's (the others' verification reference: the GPU machine's
# 64 GiB disk holds the source and two builds). A bench helper, not the tool.
# Usage: bench/gpu_served.sh WORK   (WORK holds venv/ and fx/ from bench/gpu_scale.sh setup; env BUILDS_DIR)
# Writes WORK/served/: times.md (a line per step), log.txt, BUILD/ (its results, perf records and report), done.
set -uo pipefail
work=$(realpath "$1")
cd "$work"
mkdir -p served
r=(venv/bin/release ${BUILDS_DIR:+--builds "$BUILDS_DIR"})
common=(--source fx/source --observations fx/observations --dist dist)
step() {
  local name=$1
  shift
  SECONDS=0
  if "$@" >>served/log.txt 2>&1; then echo "| $name | $SECONDS s |"; else echo "| $name | failed after $SECONDS s |"; fi \
    | tee -a served/times.md
}
for build in ${SERVED_BUILDS:-rtn sq_auto rtn_mavg sq_auto_gptq sq_auto_autoround}; do
  [ -d "served/$build" ] && continue  # done in an earlier command
  repo=$(env ${BUILDS_DIR:+RELEASE_BUILDS=$BUILDS_DIR} venv/bin/python -c \
    'import sys; from release.core.builds import load_build; print(load_build(sys.argv[1]).repo)' "$build")
  [ -f "dist/$repo/verification/report.json" ] || step "release build $build" "${r[@]}" build "$build" "${common[@]}"
  for path in deployed served; do
    step "release eval $build --path $path --split validation" env \
      RELEASE_PROFILE="$work/served/$build-$path-profile.json" "${r[@]}" eval "$build" --path $path \
      --split validation "${common[@]}"
  done
  mkdir -p "served/$build"
  cp dist/"$repo"/results/* dist/"$repo"/verification/report.json "served/$build/"
  [ "$build" = rtn ] || rm -rf "dist/$repo"
done
touch served/done
