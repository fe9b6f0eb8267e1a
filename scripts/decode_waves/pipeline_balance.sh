#!/bin/bash
# Which shard of pinned meshnet-2 sets the pace at concurrency 8 (issue 34, bench/results/v5/split41):
# runs the lane alone and records the CPU seconds of every thread of its two workers up to their
# exit (the engine thread is each process's busiest). Ratios within one run are what count.
#
#   scripts/decode_waves/pipeline_balance.sh OUT_DIR NAME [OUTPUT_TOKENS]
#
# The split follows the bench (its measured split; --no-calibrate-split in EXTRA for the
# weight-element one): EXTRA="--no-calibrate-split" scripts/decode_waves/pipeline_balance.sh ...
set -euo pipefail
out=$1; name=$2; tokens=${3:-256}
mkdir -p "$out"
sample() {  # the last CPU ticks seen of every worker thread, until the workers are gone
  local seen=0 last="$out/$name.threads"
  : > "$last"
  while true; do
    pids=$(pgrep -f "meshnet.* worker " || true)
    if [ -z "$pids" ]; then [ $seen = 1 ] && break; sleep 0.2; continue; fi
    seen=1
    for p in $pids; do for t in /proc/$p/task/*; do
      echo "$p $(basename "$t") $(cut -d' ' -f14,15 "$t/stat" 2>/dev/null)"; done; done > "$last.now" 2>/dev/null || true
    cat "$last.now" >> "$last"
    sleep 0.5
  done
  python3 - "$last" <<'PY'
import sys
last = {}
for line in open(sys.argv[1]):
    f = line.split()
    if len(f) == 4:
        last[(f[0], f[1])] = (int(f[2]) + int(f[3])) / 100
for pid in sorted({p for p, _ in last}, key=int):
    threads = [v for (p, _), v in last.items() if p == pid]
    print(f"worker {pid}: {sum(threads):.2f} s CPU in all, busiest thread {max(threads):.2f} s")
PY
}
sample > "$out/$name.cpu.txt" &
meshnet --data-dir .data bench --lanes meshnet-2 --concurrency 8 --sweep-lanes meshnet-2 --lane-concurrency 8 \
  --top-concurrency-lanes= --pin-workers --repetitions 1 --output-tokens "$tokens" --prompt-tokens 64 \
  --no-concurrency-sweep --contexts 128 --context-decode-tokens 1 --extra-lanes= --prefill-prompt 0 \
  --max-slots 16 ${EXTRA:-} --out "$out/$name.json" --report "$out/$name-report" > "$out/$name.log" 2>&1
wait
cat "$out/$name.cpu.txt"
