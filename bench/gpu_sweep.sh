#!/usr/bin/env bash
# The campaign's sweep, `release build --all`, on a disk too small for its 22 build folders (the GPU machine's
# 64 GiB hold the Nano's source and two builds of 16.5 GB). The tool verifies each build as soon as it is made; this
# script logs, one line per build, when its verification report appeared (seconds since the command started) and its
# status, keeps a copy of its provenance.json and report.json, and removes every verified build folder but the RTN
# build's (the others' reference). A bench helper, not the tool: a user with the disk keeps every build.
# Usage: bench/gpu_sweep.sh WORK [release build options...]   (run from WORK's parent; writes WORK/sweep/)
#   WORK holds venv/ and the fixture (bench/gpu_scale.sh setup); env BUILDS_DIR: a builds folder
set -uo pipefail
work=$(realpath "$1")
shift
cd "$work"
mkdir -p sweep/kept
r=(venv/bin/release ${BUILDS_DIR:+--builds "$BUILDS_DIR"})
SECONDS=0
RELEASE_PROFILE="$work/sweep/profile.json" "${r[@]}" build --all --source fx/source --observations fx/observations \
  --dist dist "$@" >sweep/log.txt 2>&1 &
pid=$!
collect() {
  for report in dist/*/verification/report.json; do
    [ -f "$report" ] || continue
    folder=${report%/verification/report.json}
    repo=${folder#dist/}
    grep -q "^[0-9]* $repo " sweep/reports.txt 2>/dev/null && continue
    build=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["build"])' "$folder/provenance.json")
    status=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["status"])' "$report")
    echo "$SECONDS $repo $build $status" | tee -a sweep/reports.txt
    mkdir -p "sweep/kept/$repo"
    cp "$folder/provenance.json" "$report" "sweep/kept/$repo/"
    [ "$build" = rtn ] || rm -rf "$folder"
  done
}
while kill -0 "$pid" 2>/dev/null; do
  collect
  sleep 1
done
wait "$pid"
rc=$?
collect
echo "$SECONDS exit $rc" | tee -a sweep/reports.txt
df -B1 --output=used,avail . | tail -1 >>sweep/reports.txt
touch sweep/done
