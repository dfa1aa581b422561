#!/usr/bin/env bash
# Idle cost of emq-router: N connected workers (emq-worker), no jobs, CPU
# time used by the router over a window, from /proc/<pid>/stat (utime+stime).
# Usage: loadtest/idle_cpu.sh [workers=10] [seconds=30]
set -euo pipefail
N="${1:-10}"; SECS="${2:-30}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="$ROOT/target/release"
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
FE=$(port); BE=$(port); AD=$(port)
PIDS=()
DATA=$(mktemp -d /tmp/emq-idle-cpu-XXXXXX)
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$DATA"; }
trap cleanup EXIT
"$BIN/emq-router" --frontend "tcp://127.0.0.1:$FE" --backend "tcp://127.0.0.1:$BE" \
  --admin "tcp://127.0.0.1:$AD" --text off --metrics "" --data-dir "$DATA" --log warn & RPID=$!; PIDS+=("$RPID")
sleep 0.5
for _ in $(seq "$N"); do
  "$BIN/emq-worker" -B "tcp://127.0.0.1:$BE" -Q default -J 1 -- cat >/dev/null 2>&1 & PIDS+=("$!")
done
sleep 3
ticks() { awk '{print $14+$15}' "/proc/$RPID/stat"; }
HZ=$(getconf CLK_TCK)
T0=$(ticks); sleep "$SECS"; T1=$(ticks)
python3 - "$T0" "$T1" "$HZ" "$SECS" "$N" <<'PY'
import sys
t0, t1, hz, secs, n = map(float, sys.argv[1:])
cpu = (t1 - t0) / hz
print(f"emq-router idle with {int(n)} workers: {cpu:.3f} s CPU in {secs:.0f} s = {100*cpu/secs:.3f}% of one core")
PY
