#!/usr/bin/env bash
# A user's install on a GPU machine: the release wheel (built with `pip wheel --no-deps -w .whl .`) into a fresh
# virtual environment that sees the machine's CUDA torch, from a folder of wheels only (no index), then the tool
# run from an empty folder: shipped build files, `release init`, one build end to end, its card in en and ko.
# Each step is timed. Usage: bench/gpu_install.sh WHEELS WORK OUT
set -euo pipefail
wheels=$(realpath "$1") work=$2 out=$(realpath -m "$3")
mkdir -p "$work" "$out"
cd "$work"
step() { local name=$1; shift; SECONDS=0; "$@" >>"$out/install.log" 2>&1; echo "| $name | ${SECONDS} s |" | tee -a "$out/install.md"; }
# The machine's torch lives outside the interpreter's site-packages (so --system-site-packages misses it): a .pth
# file puts its folder on the venv's path, where pip sees it as installed.
step "venv (+ .pth to the machine's torch)" python3 -m venv venv
python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
  >"$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/machine-torch.pth"
step "pip install release wheel, --no-index" venv/bin/pip install --no-index --find-links "$wheels" \
  "$wheels"/release-*.whl
venv/bin/python -c 'import sys, torch, release; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())' \
  | tee -a "$out/install.md"
r=venv/bin/release
common=(--source fx/source --observations fx/observations)
step "release init proj" $r init proj
step "release fixture tiny" $r fixture tiny --out fx
step "release --builds proj/builds build rtn sq_auto" $r --builds proj/builds build rtn sq_auto "${common[@]}" --dist dist
step "release eval (deployed, validation, yardsticks)" $r --builds proj/builds eval rtn sq_auto --path deployed \
  --split validation "${common[@]}" --dist dist --yardsticks
step "release tables + select" bash -c "$r --builds proj/builds tables --dist dist && $r --builds proj/builds select --dist dist"
step "release card --lang en,ko" $r --builds proj/builds card --dist dist --lang en,ko
step "release push --dry-run" $r --builds proj/builds push --dist dist --target hub --dry-run
ls dist/*/README*.md dist/*/*.png 2>/dev/null | tee -a "$out/install.md"
