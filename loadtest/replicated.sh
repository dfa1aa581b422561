#!/usr/bin/env bash
# Replicated durability against sync, memory and the raw JetStream
# per-message baseline in one invocation (issue 27, point 8): starts a local
# 3-node JetStream cluster (loadtest/nats-cluster.sh, in a temporary
# directory), runs the scenarios through loadtest/run.sh with the cluster's
# URLs and server PIDs (EMQ_NATS_URLS, EMQ_NATS_PIDS: every run reports the
# three servers' CPU per job, and target emq-replicated gets a fresh router
# name per run, its streams deleted after it), then stops the cluster by
# its PID files and removes its directory.
#
#   loadtest/replicated.sh                  # replicated-emqp-saturation replicated-text-16x16
#                                           # replicated-emqp-10k
#   loadtest/replicated.sh replicated-text-16x16
#
# Results: loadtest/results/<date>-<rev>-replicated/ (EMQ_BENCH_OUT
# overrides), summary.md as for run.sh, with the replicated table and
# ratios; the cluster's logs are copied there (nats-n<i>.log).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=(replicated-emqp-saturation replicated-text-16x16 replicated-emqp-10k)
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
export EMQ_BENCH_OUT=${EMQ_BENCH_OUT:-$ROOT/loadtest/results/$(date -u +%Y-%m-%d-%H%M)-$REV-replicated}
mkdir -p "$EMQ_BENCH_OUT"

NATS_DIR=$(mktemp -d /tmp/emq-nats-XXXXXX)
cleanup() {
  loadtest/nats-cluster.sh stop "$NATS_DIR" || true
  local n
  for n in 1 2 3; do [ -f "$NATS_DIR/n$n.log" ] && cp "$NATS_DIR/n$n.log" "$EMQ_BENCH_OUT/nats-n$n.log"; done
  rm -rf "$NATS_DIR"
}
trap cleanup EXIT
started=$(loadtest/nats-cluster.sh start "$NATS_DIR")
EMQ_NATS_URLS=$(sed -n 's/^urls=//p' <<<"$started")
EMQ_NATS_PIDS=$(sed -n 's/^pids=//p' <<<"$started")
export EMQ_NATS_URLS EMQ_NATS_PIDS
echo "cluster: $(tr '\n' ' ' <<<"$started")" | tee "$EMQ_BENCH_OUT/cluster.txt" >&2
"${EMQ_NATS_SERVER:-$ROOT/.venv-nats/bin/nats-server}" --version >>"$EMQ_BENCH_OUT/cluster.txt" 2>&1 || true
loadtest/run.sh "${SCENARIOS[@]}"
