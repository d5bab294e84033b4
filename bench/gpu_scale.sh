#!/usr/bin/env bash
# Where a Nano-size build's time and GPU memory go, against the I/O floor of the same bytes, and the rollout
# latency and memory of BF16 vs the deployed FP8 build, all in one run on one GPU machine.
#   1. the wheels into a venv (as bench/gpu_install.sh), `release fixture nano` (random weights at the real shapes);
#   2. I/O floor: the source transformer read with O_DIRECT (cold: no page cache), 16 GB written with fdatasync;
#   3. `release build $BUILDS` (default rtn) with RELEASE_PROFILE (stage breakdown: load, capture, quantize,
#      export, each check);
#   4. `release eval rtn --path deployed --split validation` with RELEASE_PROFILE (rollout latency and memory,
#      also kept in results/deployed-validation.perf.json);
#   5. one BF16 and one deployed rollout under torch.profiler (bench/gpu_rollout_profile.py): where the time goes;
#   5b. graphs: BF16 and deployed FP8 rollouts eager vs with the decoder stack in CUDA graphs (bench/gpu_graphs.py:
#      latency, peak memory, differing action elements), then tests/test_graphs.py on the tiny fixture when pytest
#      is there (-o addopts="": the machine lacks pytest-socket);
#   6. capped-build, capped-eval: the same build, and the evals of it (deployed, fakequant), with --max-gpu-memory
#      $CAP (default 22GiB) on a GPU limited to $GPU_GIB (default 24) GiB by bench/gpu_capped.py, with their own
#      cache (capture and rollouts anew), compared byte for byte with the uncapped run's (after build, and eval;
#      capped-eval evaluates the capped build, so capped-build comes first);
#   7. gptq: ModelOpt's GPTQ column loop against the column-wise one at the Nano's shapes (bench/gptq_columns.py);
#   8. probe: what the bytes cost alone (bench/gpu_io_probe.py: page-locked copies, sha256, shard writes and reads);
#   8b. extensions: ModelOpt's CUDA extensions built once for the machine (before a sweep, to time it without them);
#   8c. fold: the fake-quant replay's rollouts without and with ModelOpt's fold_weight (bench/tiny_rollout.py; its
#      latency and whether the actions are the same bits), $FOLD_ROLLOUTS observations (default 6);
#   9. init: `release init WORK/proj` with $CALLS calibration calls (default 64) and $ALGO_CALLS algorithm calls
#      (default 8) in every build file, and the sweep narrowed to $SWEEP when set (pass BUILDS_DIR=WORK/proj/builds);
#   9b. served-gemm: TorchAO's static FP8 GEMM (the policy server's) against ModelOpt's at the Nano's Linear shapes
#      (bench/gpu_served_gemm.py); served-start, served-wait: the five served builds built, then evaluated on the
#      deployed and the served paths (bench/gpu_served.sh), followed across commands as the sweep is;
#   9d. first-call: where the served and deployed paths of the RTN build (dist/, from build or served-start) part:
#      every FP8 Linear of one rollout's first transformer call on both paths, and the deployed outputs against an
#      eager torch._scaled_mm on the same inputs (bench/gpu_served_first_call.py);
#   9e. yardstick: the eval's BF16 eager vs torch.compile rollouts of the held-out split, no build
#      (bench/gpu_compile_yardstick.py);
#   9c. batched: the packed-vs-lone transformer calls of $BATCH observations (default 4) on the served helper's RTN build
#      (bench/batched_calls.py: bits and time per model), the helper stopped first if it still runs;
#   10. sweep-start, sweep-wait: `release build --all` (bench/gpu_sweep.sh), started in the background and waited for
#      up to $WAIT seconds (default 540) per command, then stopped with SIGTERM if $STOP is set; its reports, log and
#      profile into OUT once it is done.
# Usage: bench/gpu_scale.sh WHEELS WORK OUT [STEP ...]
#   WORK outside the checkout (e.g. /root/w) or ignored by git: the device tool replaces a checkout's untracked files
#   at each call, and a sweep that spans calls loses its source and builds with them
#   steps: setup floor build eval profile graphs fold capped-build capped-eval gptq probe extensions init sweep-start
#   sweep-wait served-gemm served-start served-wait batched first-call yardstick
#   (default: the first five)
#   env: BUILDS (default rtn), BUILDS_DIR (a builds folder, e.g. from init), FIXTURE_ARGS, CAP, GPU_GIB, WAIT, STOP,
#   CALLS, ALGO_CALLS, SWEEP, GRAPH_ROLLOUTS (default 16)
set -euo pipefail
wheels=$(realpath "$1") work=$(realpath -m "$2") out=$(realpath -m "$3")
shift 3
steps=${*:-setup floor build eval profile}
here=$(dirname "$(realpath "$0")")
mkdir -p "$work" "$out"
cd "$work"
export RELEASE_CACHE=$work/cache SOURCE_DATE_EPOCH=1700000000
r="$work/venv/bin/release${BUILDS_DIR:+ --builds $BUILDS_DIR}"
common=(--source fx/source --observations fx/observations)
capped=(venv/bin/python "$here/gpu_capped.py" "${GPU_GIB:-24}" ${BUILDS_DIR:+--builds "$BUILDS_DIR"})
cap=(--max-gpu-memory "${CAP:-22GiB}")
# every file of two dists equal (the per-rollout timings apart), as a line of times.md
same() {
  (cd "$1" && find . -type f ! -name '*.perf.json' | sort | xargs sha256sum) >"$out/$1.sha256"
  (cd "$2" && find . -type f ! -name '*.perf.json' | sort | xargs sha256sum) >"$out/$2.sha256"
  if diff "$out/$1.sha256" "$out/$2.sha256" >"$out/$2-diff.txt"; then
    echo "| $2 vs $1: every file equal ($(wc -l <"$out/$2.sha256") files) |" | tee -a "$out/times.md"
  else
    echo "| $2 vs $1: files differ ($2-diff.txt) |" | tee -a "$out/times.md"
  fi
}
# A helper (bench/gpu_sweep.sh, bench/gpu_served.sh) started in a process session of its own, which outlives this
# command while the GPU machine is held, and followed across commands (one is limited to 10 minutes) until it writes
# WORK/NAME/done; a copy runs (bash reads a script as it runs, and the checkout may be replaced meanwhile).
started() {
  cp "$here/$2" "$work/$2"
  setsid nohup env BUILDS_DIR="${BUILDS_DIR:-}" bash "$work/$2" "$work" >"$work/$1.out" 2>&1 </dev/null &
  echo "| $1 started |" | tee -a "$out/times.md"
}
waited() {
  SECONDS=0
  while [ ! -f "$1/done" ] && [ $SECONDS -lt "${WAIT:-540}" ]; do sleep 5; done
}
timed() { local name=$1; shift; SECONDS=0; "$@" >>"$out/log.txt" 2>&1; echo "| $name | ${SECONDS} s |" | tee -a "$out/times.md"; }
for step in $steps; do
  case $step in
    setup)
      python3 -m venv venv
      python3 -c 'import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))' \
        >"$(venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/machine-torch.pth"
      venv/bin/pip install --quiet --no-index --find-links "$wheels" "$wheels"/release-*.whl
      # the served path's TorchAO (release[served]), when the wheels hold it
      if ls "$wheels"/torchao-*.whl >/dev/null 2>&1; then
        venv/bin/pip install --quiet --no-index --no-deps "$wheels"/torchao-*.whl
      fi
      timed "release fixture nano" $r fixture nano --out fx ${FIXTURE_ARGS:-} ;;
    floor)
      # O_DIRECT bypasses the page cache the fixture just filled: what a cold read of these shards costs
      timed "read the source transformer (O_DIRECT)" bash -c \
        'for f in fx/source/transformer/*.safetensors; do dd if="$f" of=/dev/null bs=64M iflag=direct status=none; done'
      du -sb fx/source/transformer | tee -a "$out/times.md"
      timed "write 16 GiB with fdatasync" dd if=/dev/zero of=floor.bin bs=64M count=256 conv=fdatasync status=none
      rm -f floor.bin ;;
    build)
      timed "release build ${BUILDS:-rtn}" env RELEASE_PROFILE="$out/build-profile.json" $r build ${BUILDS:-rtn} \
        "${common[@]}" --dist dist
      du -sb dist/* | tee -a "$out/times.md" ;;
    eval)
      timed "release eval rtn --path deployed --split validation" \
        env RELEASE_PROFILE="$out/eval-profile.json" $r eval rtn --path deployed --split validation "${common[@]}" --dist dist
      cp dist/*/results/*.perf.json "$out/" ;;
    profile)
      timed "rollout profile" bash -c "venv/bin/python '$here/gpu_rollout_profile.py' fx/source fx/observations \
        dist/Cosmos3-Nano-Policy-DROID-FP8 >'$out/rollout_profile.txt'" ;;
    graphs)
      timed "rollouts eager vs CUDA graphs" bash -c "venv/bin/python '$here/gpu_graphs.py' fx/source fx/observations \
        dist/Cosmos3-Nano-Policy-DROID-FP8 '$out/graphs.json' ${GRAPH_ROLLOUTS:-16} >'$out/graphs.md'"
      if venv/bin/python -c 'import pytest' 2>/dev/null; then
        timed "tests/test_graphs.py (tiny fixture)" bash -c "cd '$here/..' && '$work/venv/bin/python' -m pytest -q \
          -o addopts='' tests/test_graphs.py >'$out/test_graphs.txt' 2>&1"
      fi ;;
    fold)
      # the fake-quant replay (release eval --path fakequant) with and without ModelOpt's fold_weight: latency, bits
      for variant in no-fold fold; do
        timed "fake-quant rollouts, $variant" bash -c "venv/bin/python '$here/tiny_rollout.py' --fixture fx \
          --build dist/Cosmos3-Nano-Policy-DROID-FP8 --only fakequant:rtn -n ${FOLD_ROLLOUTS:-6} --repeat 1 \
          $([[ $variant == fold ]] && echo "--compare '$out/no-fold.npz'" || echo "--no-fold --save '$out/no-fold.npz'") \
          >'$out/fold-$variant.txt' 2>&1"
      done ;;
    capped-build)
      # the disk holds the source and two builds (64 GiB on the GPU machine): the uncapped capture goes, the
      # capped run captures anew into its own cache anyway
      rm -rf cache/calibration
      timed "capped: release build ${BUILDS:-rtn}" env RELEASE_CACHE="$work/cache-capped" \
        RELEASE_PROFILE="$out/capped-build-profile.json" "${capped[@]}" build ${BUILDS:-rtn} "${common[@]}" \
        --dist dist-capped "${cap[@]}"
      df -B1 --output=used,avail . | tail -1 | sed 's/^/| disk used, free (bytes): /; s/$/ |/' | tee -a "$out/times.md"
      same dist dist-capped ;;
    capped-eval)
      timed "release eval rtn --path fakequant --split validation" \
        env RELEASE_PROFILE="$out/eval-fakequant-profile.json" $r eval rtn --path fakequant --split validation \
        "${common[@]}" --dist dist
      rm -rf dist-capped/*/results  # the capped build (the same bytes as dist's, by capped-build), evaluated anew
      for path in deployed fakequant; do
        timed "capped: release eval rtn --path $path --split validation" env RELEASE_CACHE="$work/cache-capped" \
          RELEASE_PROFILE="$out/capped-eval-$path-profile.json" "${capped[@]}" eval rtn --path $path \
          --split validation "${common[@]}" --dist dist-capped "${cap[@]}"
      done
      for f in dist-capped/*/results/*.perf.json; do cp "$f" "$out/capped-$(basename "$f")"; done
      same dist dist-capped ;;
    sweep-start)
      started sweep gpu_sweep.sh ;;
    sweep-wait)
      waited sweep
      if [ ! -f sweep/done ] && [ -n "${STOP:-}" ]; then
        # SIGTERM, which the tool handles as Ctrl-C: the build in progress is left out, the profile keeps what ran
        # (SIGINT would not do: a command started in the background by a script ignores it)
        pkill -TERM -f 'release( --builds [^ ]+)? build --all' || true
        for _ in $(seq 60); do [ -f sweep/done ] && break; sleep 1; done
      fi
      cp sweep/reports.txt "$out/sweep-reports.txt" 2>/dev/null || true
      tail -c 200000 sweep/log.txt >"$out/sweep-log.txt" 2>/dev/null || true
      cp sweep/profile.json "$out/sweep-profile.json" 2>/dev/null || true  # rewritten as each outer stage ends
      if [ -f sweep/done ]; then tar -C sweep -czf "$out/sweep-kept.tgz" kept; fi ;;
    first-call)
      timed "served vs deployed, the first transformer call's FP8 Linears (bench/gpu_served_first_call.py)" env \
        ${BUILDS_DIR:+RELEASE_BUILDS=$BUILDS_DIR} bash -c "venv/bin/python '$here/gpu_served_first_call.py' fx/source \
        fx/observations dist/Cosmos3-Nano-Policy-DROID-FP8 '$out/first_call.json' >'$out/first_call.txt' 2>&1" ;;
    yardstick)
      timed "BF16 eager vs torch.compile rollouts (bench/gpu_compile_yardstick.py)" env \
        ${BUILDS_DIR:+RELEASE_BUILDS=$BUILDS_DIR} bash -c "venv/bin/python '$here/gpu_compile_yardstick.py' fx/source \
        fx/observations '$out/yardstick' >'$out/yardstick.txt' 2>&1" ;;
    served-gemm)
      timed "TorchAO's static FP8 GEMM vs ModelOpt's (bench/gpu_served_gemm.py)" bash -c \
        "venv/bin/python '$here/gpu_served_gemm.py' '$out/served_gemm.json' >'$out/served_gemm.txt' 2>&1" ;;
    served-start)
      started served gpu_served.sh ;;
    served-wait)
      waited served
      cp served/times.md "$out/served-times.md" 2>/dev/null || true
      tail -c 100000 served/log.txt >"$out/served-log.txt" 2>/dev/null || true
      (cd served && tar -czf "$out/served.tgz" --exclude=log.txt --exclude=times.md .) ;;
    extensions)
      # ModelOpt builds its CUDA extensions (FP8 fake quantization among them) with the compiler the first time they
      # are used on a machine and caches them: once per machine, as a user's first build pays it (run D of
      # BENCHMARKS.md: likely the 58 s more of the sweep's first GPTQ build)
      timed "ModelOpt's CUDA extensions built (modelopt.torch.quantization.extensions.precompile)" \
        venv/bin/python -c 'from modelopt.torch.quantization.extensions import precompile; precompile()' ;;
    probe)
      timed "I/O probe" bash -c "venv/bin/python '$here/gpu_io_probe.py' fx/source/transformer '$work/probe' \
        >'$out/io_probe.md'" ;;
    init)
      rm -rf proj
      venv/bin/release init proj >>"$out/log.txt"
      sed -i "s/^calibration_calls: .*/calibration_calls: ${CALLS:-64}/; s/^algorithm_calls: .*/algorithm_calls: ${ALGO_CALLS:-8}/" \
        proj/builds/*.yaml
      if [ -n "${SWEEP:-}" ]; then
        python3 - proj/builds/release.yaml "$SWEEP" <<'PY'
import re, sys
path, names = sys.argv[1], sys.argv[2].split()
text = open(path).read()
text = re.sub(r"^sweep: \[[^\]]*\]", "sweep: [" + ", ".join(names) + "]", text, flags=re.M)
open(path, "w").write(text)
PY
      fi
      grep -h "^sweep\|^calibration_calls\|^algorithm_calls" proj/builds/release.yaml proj/builds/rtn.yaml \
        | tee -a "$out/times.md" ;;
    batched)
      # after served-wait: the served helper stopped if it still runs (it would share the GPU), its RTN build kept
      pkill -f "$work/gpu_served.sh" || true
      pkill -f "$work/venv/bin/release" || true
      sleep 2
      timed "packed vs lone transformer calls (bench/batched_calls.py, -n ${BATCH:-4})" bash -c \
        "venv/bin/python '$here/batched_calls.py' --fixture fx --build dist/Cosmos3-Nano-Policy-DROID-FP8 \
         -n ${BATCH:-4} --json '$out/batched.json' >'$out/batched.txt' 2>&1" ;;
    gptq)
      timed "GPTQ column loop, ModelOpt's vs column-wise" bash -c \
        "venv/bin/python '$here/gptq_columns.py' 1 cuda >'$out/gptq_columns.txt'" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
