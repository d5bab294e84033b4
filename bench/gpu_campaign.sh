#!/usr/bin/env bash
# `release campaign` at the Nano's size on the GPU machine, followed across 10-minute commands: its wall time, the
# peak GPU memory (nvidia-smi, every second) and the peak disk use of WORK's file system (df, every second), with the
# tool's own stage profile (RELEASE_PROFILE).
#   start: the campaign in a process session of its own (it outlives the command while the machine is held);
#   wait:  follow it up to $WAIT seconds (default 540), then copy its log, profile and figures to OUT.
# Usage: bench/gpu_campaign.sh WORK OUT start|wait [release campaign options...]
#   WORK holds venv/ and the fixture fx/ (bench/gpu_scale.sh setup) and, with BUILDS_DIR, a builds folder
#   (bench/gpu_scale.sh init); RELEASE_CACHE is WORK/cache. LAUNCH replaces the command that runs the CLI (default
#   venv/bin/release), e.g. LAUNCH="venv/bin/python bench/gpu_capped.py 24" for a 24 GB card's allocator limit.
set -uo pipefail
work=$(realpath "$1") out=$(realpath -m "$2") step=$3
shift 3
mkdir -p "$out" "$work/campaign"
cd "$work"
case $step in
  start)
    cat >campaign/run.sh <<EOF
cd "$work"
export RELEASE_CACHE="$work/cache" RELEASE_PROFILE="$work/campaign/profile.json" SOURCE_DATE_EPOCH=1700000000
SECONDS=0
${LAUNCH:-venv/bin/release} ${BUILDS_DIR:+--builds "$BUILDS_DIR"} campaign --source fx/source --observations fx/observations \
  --dist dist $* >campaign/log.txt 2>&1 &
pid=\$!
gpu=0 disk=0
while kill -0 \$pid 2>/dev/null; do
  g=\$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
  d=\$(df -B1 --output=used . | tail -1)
  [ "\$g" -gt "\$gpu" ] && gpu=\$g
  [ "\$d" -gt "\$disk" ] && disk=\$d
  echo "\$SECONDS \$g \$d" >>campaign/samples.txt
  sleep 1
done
wait \$pid
echo "exit \$? seconds \$SECONDS peak_gpu_mib \$gpu peak_disk_bytes \$disk" >campaign/done
EOF
    df -B1 --output=used . | tail -1 >campaign/disk-before.txt
    setsid nohup bash campaign/run.sh >campaign/run.out 2>&1 </dev/null &
    echo "campaign started" ;;
  wait)
    SECONDS=0
    while [ ! -f campaign/done ] && [ $SECONDS -lt "${WAIT:-540}" ]; do sleep 5; done
    cp campaign/log.txt campaign/samples.txt campaign/disk-before.txt "$out/" 2>/dev/null
    cp campaign/profile.json "$out/campaign-profile.json" 2>/dev/null
    if [ -f campaign/done ]; then
      cat campaign/done | tee "$out/campaign-done.txt"
      du -sb dist/* | tee "$out/dist-sizes.txt"
      cp dist/campaign.json dist/selection.json "$out/" 2>/dev/null
      cp dist/tables/tables.json "$out/" 2>/dev/null
    else
      echo "still running after ${WAIT:-540} s"; tail -3 campaign/log.txt
    fi ;;
  *) echo "unknown step $step" >&2; exit 2 ;;
esac
