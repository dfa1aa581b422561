#!/usr/bin/env bash
# The nemesis (issue 30): a replicated router pair, a 3-node NATS cluster, a
# producer and a worker, each in its own network namespace on a bridge, under
# a seeded schedule of faults; then a checker proves that no acknowledged job
# was lost and no fenced router acknowledged anything. docs/nemesis.md.
#
#   loadtest/nemesis.sh [--seed N] [--schedule short|long] [--duration 30m]
#                       [--rate 100] [--lease 5s] [--out DIR]
#
# short: every fault kind once (about 2-3 minutes; what tests/nemesis.rs
# runs). long: kinds shuffled in rounds until --duration is over (30 min
# gives every kind at least three times). The seed and the schedule are
# printed and written to DIR/run.json; the same seed replays the schedule.
#
# Needs root (ip netns, iptables: apt-get install iptables), the release
# binaries in ${EMQ_BIN_DIR:-${CARGO_TARGET_DIR:-<repo>/target}/release}
# (emq-router, emq-worker), nats-server ($EMQ_NATS_SERVER or
# <repo>/.venv-nats, tests/nats/setup.sh) and a python with pyzmq
# ($EMQ_BENCH_PYTHON, else <repo>/.venv, tests/interop/setup-venv.sh).
#
# Results: --out, else loadtest/results/<date>-<rev>-nemesis/: summary.md,
# verdict.json, nemesis.svg and the histories and logs. Exit status: 0 PASS,
# 1 the checker's verdict FAIL, 2 the run failed, 3 something was left behind.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BIN=${EMQ_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
OUT=
ARGS=()
while (($#)); do
  case "$1" in
    --out) OUT=$2; shift 2 ;;
    --out=*) OUT=${1#--out=}; shift ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "nemesis: needs root (network namespaces, iptables)" >&2; exit 2; }
command -v iptables >/dev/null || { echo "nemesis: no iptables (apt-get install iptables)" >&2; exit 2; }
PY=${EMQ_BENCH_PYTHON:-}
if [ -z "$PY" ]; then
  for p in "$ROOT/.venv/bin/python" /work/main/.venv/bin/python python3; do
    if "$p" -c 'import zmq' 2>/dev/null; then PY=$p; break; fi
  done
fi
[ -n "$PY" ] || { echo "nemesis: no python with pyzmq (set EMQ_BENCH_PYTHON)" >&2; exit 2; }
NATS=${EMQ_NATS_SERVER:-$ROOT/.venv-nats/bin/nats-server}
[ -x "$NATS" ] || NATS=/work/main/.venv-nats/bin/nats-server
[ -x "$NATS" ] || { echo "nemesis: no nats-server (bash tests/nats/setup.sh or EMQ_NATS_SERVER)" >&2; exit 2; }
for b in emq-router emq-worker; do
  [ -x "$BIN/$b" ] || { echo "nemesis: no $BIN/$b: cargo build --release --bins first" >&2; exit 2; }
done
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${OUT:-$ROOT/loadtest/results/$(date -u +%Y-%m-%d-%H%M)-$REV-nemesis}
mkdir -p "$OUT"
ID=nm$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
HARNESS=
cleanup() {
  trap - EXIT INT TERM
  if [ -n "$HARNESS" ] && kill -0 "$HARNESS" 2>/dev/null; then
    kill -TERM "$HARNESS" 2>/dev/null || true
    for _ in $(seq 300); do kill -0 "$HARNESS" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$HARNESS" 2>/dev/null || true
    wait "$HARNESS" 2>/dev/null || true
  fi
  # whatever the harness could not remove (it was killed): by the run id
  "$PY" loadtest/nemesis/harness.py cleanup --id "$ID" || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM
echo "nemesis: run $ID, results $OUT" >&2
set +e
"$PY" loadtest/nemesis/harness.py run --id "$ID" --bin "$BIN" --nats-server "$NATS" --out "$OUT" "${ARGS[@]}" &
HARNESS=$!
wait "$HARNESS"
rc=$?
HARNESS=
"$PY" loadtest/nemesis/harness.py cleanup --id "$ID" || rc=3
if [ -f "$OUT/run.json" ] && [ -f "$OUT/faults.jsonl" ]; then
  "$PY" loadtest/nemesis/check.py "$OUT"
  crc=$?
  [ "$rc" = 0 ] && rc=$crc
fi
set -e
echo "nemesis: results in $OUT (exit $rc)" >&2
exit "$rc"
