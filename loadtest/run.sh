#!/usr/bin/env bash
# Runs named load-test scenarios and writes results to
# loadtest/results/<date>-<rev>/ (JSON, .hgrm, SVG per run, summary.md).
#
#   loadtest/run.sh                 # every scenario in loadtest/scenarios
#   loadtest/run.sh emqp-64b idle-10k
#
# Builds emq-bench and emq-router (release), starts a fresh router per run
# on free loopback ports, emq-router with a fresh data directory under /tmp
# that is removed after the run (targets: emq = durability "sync" with its
# sync thread, emq-shard-sync = "sync" on the shard thread, emq-async,
# emq-memory; beanstalkd-b0 / beanstalkd-b50 = beanstalkd with a binlog,
# `-b DIR -f 0` / `-b DIR` (fsync every 50 ms, its default)) (the zero-logic forwarder as a process of its own
# (`emq-bench forwarder`) for the "forwarder" target, one message per job, and
# with `--wire emqp` for "forwarder-emqp", the five messages of an eMQP job;
# "baseline" and "baseline-emqp" are the same two forwarders in the load
# generator's process (`emq-bench baseline`, no CPU per job); the Python EventMQ router
# from .venv (override: EMQ_BENCH_VENV),
# created if missing, for the "python" target; a beanstalkd, installed with
# apt-get when missing and running as root, for the "beanstalkd" target),
# runs emq-bench, and stops everything it started by PID.
# EMQ_BENCH_TARGETS and EMQ_BENCH_RUNS replace the scenarios' target lists
# and run counts; a target with `-before` appended (emq-before,
# emq-memory-before, ...) runs the emq-router at EMQ_ROUTER_BEFORE as that
# target runs the current one, for A/B runs of two builds interleaved in
# one invocation.
# Replicated durability (issue 27; loadtest/replicated.sh starts a cluster
# and sets these): target emq-replicated runs the router with durability
# "replicated" on EMQ_NATS_URLS, under a fresh router name per run (streams
# prefixed EMQ_NATS_STREAM_PREFIX, default emqlt<pid>), whose streams are
# deleted after the run (the prefix's key-value buckets at the end); target
# jetstream runs `emq-bench jetstream $JETSTREAM_ARGS` on the same cluster;
# with EMQ_NATS_PIDS every run also reports those servers' CPU per job.
# CURVE: target emq-curve runs emq-router with --frontend-curve and
# --backend-curve on fresh ports, keys made at the start in a temporary
# directory (removed at the end): the router's pair and one pair for the
# bench's clients and workers, whose public key is the allow-list of both
# endpoints; emq-bench connects to the CURVE endpoints with
# --curve-key-file/--curve-server-key.
# Text over TLS: target emq-tls runs emq-router with --text-tls on a fresh
# port, a certificate for 127.0.0.1 from a CA made at the start with
# openssl (ECDSA P-256) and a tokens file with one token (`emq-cli token
# new`), in a temporary directory removed at the end; emq-bench's text
# mode connects to it with --tls-ca and --token-file (every connection a
# TLS 1.3 handshake, then AUTH).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
cargo build --release --quiet --bin emq-bench --bin emq-router --bin emq-cli
BENCH=${CARGO_TARGET_DIR:-$ROOT/target}/release/emq-bench
CLI=${CARGO_TARGET_DIR:-$ROOT/target}/release/emq-cli
ROUTER=${CARGO_TARGET_DIR:-$ROOT/target}/release/emq-router
VENV=${EMQ_BENCH_VENV:-$ROOT/.venv}
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${EMQ_BENCH_OUT:-$ROOT/loadtest/results/$(date -u +%Y-%m-%d-%H%M)-$REV}
mkdir -p "$OUT"
NATS_PREFIX=${EMQ_NATS_STREAM_PREFIX:-emqlt$$}
REPLICATED_NAMES=0 REPLICATED_NAME=
SERVER_PIDS=()
[ -n "${EMQ_NATS_PIDS:-}" ] && SERVER_PIDS=(--server-pids "$EMQ_NATS_PIDS")

STARTED=()
DATA_DIRS=()
KEYS_DIR=
TLS_DIR=
new_data_dir() { DATA=$(mktemp -d /tmp/emq-loadtest-XXXXXX); DATA_DIRS+=("$DATA"); }
drop_data_dirs() { local d; for d in "${DATA_DIRS[@]}"; do rm -rf "$d"; done; DATA_DIRS=(); }
stop() { # PID: stop it and forget it (so a reused PID is never killed later)
  kill "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  local keep=() p
  for p in "${STARTED[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
  STARTED=("${keep[@]}")
}
cleanup() {
  local p
  for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
  drop_data_dirs
  [ -z "$KEYS_DIR" ] || rm -rf "$KEYS_DIR"
  [ -z "$TLS_DIR" ] || rm -rf "$TLS_DIR"
  [ "$REPLICATED_NAMES" = 0 ] || drop_streams "^(KV_)?${NATS_PREFIX}_"
}
drop_streams() { # REGEX: delete the cluster's streams whose names match (a failure is reported, not fatal)
  python3 "$ROOT/loadtest/nats_streams.py" "$EMQ_NATS_URLS" delete "$1" >/dev/null \
    || echo "could not delete the streams matching $1 on $EMQ_NATS_URLS" >&2
}
trap cleanup EXIT

free_ports() { # N -> N free loopback ports, printed only once they are closed
  # (`read < <(free_ports …)` returns at the newline, maybe before python exits).
  python3 -c "import socket,sys
ss=[socket.socket() for _ in range(int(sys.argv[1]))]
[s.bind(('127.0.0.1',0)) for s in ss]
ports=[str(s.getsockname()[1]) for s in ss]
[s.close() for s in ss]
print(' '.join(ports), flush=True)" "$1"
}
wait_port() { # PORT PID: until something listens (10 s) while PID lives
  for _ in $(seq 100); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "nothing listens on $1" >&2; return 1
}

ensure_venv() {
  [ -x "$VENV/bin/emq-router" ] && return 0
  echo "creating $VENV (EventMQ 0.3.13)" >&2
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --no-deps eventmq==0.3.13
  "$VENV/bin/pip" install -q -r loadtest/requirements-py311.txt
}

ensure_beanstalkd() { # RUN-NAME: beanstalkd on PATH, or the run is reported failed
  command -v beanstalkd >/dev/null && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "installing beanstalkd (apt-get)" >&2
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq beanstalkd; } >/dev/null 2>&1 || true
    command -v beanstalkd >/dev/null && return 0
  fi
  echo "$1: beanstalkd is not installed and could not be installed here (as root: apt-get install beanstalkd)" \
    | tee -a "$OUT/failed.txt" >&2
  return 1
}

# ensure_curve_keys -> KEYS_DIR with router.key(_secret), bench.key(_secret)
# and allow/bench.key (the allow-list of both CURVE endpoints), made once per
# invocation: `emq-cli keygen` where this build has it, else pyzmq's
# zmq.auth.create_certificates (the same czmq/pyzmq certificate format,
# src/curve/mod.rs) from $VENV's python or python3.
ensure_curve_keys() {
  [ -n "$KEYS_DIR" ] && return 0
  # Not /tmp/emq-loadtest-keys-XXXXXX: ".../router.key" would be 40 characters
  # of the Z85 alphabet, which --curve-server-key reads as a key, not a file.
  KEYS_DIR=$(mktemp -d /tmp/emq-loadtest-curve-keys-XXXXXX)
  local n py=python3
  [ -x "$VENV/bin/python" ] && py=$VENV/bin/python
  for n in router bench; do
    if "$CLI" keygen --help >/dev/null 2>&1; then
      "$CLI" keygen "$n" --dir "$KEYS_DIR" >/dev/null
    else
      "$py" -c "import sys, zmq.auth; zmq.auth.create_certificates(sys.argv[1], sys.argv[2])" "$KEYS_DIR" "$n" \
        && chmod 600 "$KEYS_DIR/$n.key_secret"
    fi || { echo "could not make CURVE keys (emq-cli keygen, or python with pyzmq)" >&2; return 1; }
  done
  mkdir "$KEYS_DIR/allow"
  cp "$KEYS_DIR/bench.key" "$KEYS_DIR/allow/"
}

# ensure_tls_files -> TLS_DIR with ca.pem, server.pem, server.key (for
# 127.0.0.1), tokens (the router's file) and token (the bench's), made once
# per invocation.
ensure_tls_files() {
  [ -n "$TLS_DIR" ] && return 0
  TLS_DIR=$(mktemp -d /tmp/emq-loadtest-tls-XXXXXX)
  (
    cd "$TLS_DIR"
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
      -subj /CN=emq-loadtest-ca -keyout ca.key -out ca.pem
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -subj /CN=127.0.0.1 \
      -keyout server.key -out server.csr
    printf 'subjectAltName=IP:127.0.0.1\n' >san.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
      -extfile san.ext -out server.pem
  ) >/dev/null 2>&1 || { echo "could not make TLS certificates (openssl)" >&2; return 1; }
  local made
  made=$("$CLI" token new bench) || { echo "could not make a token (emq-cli token new)" >&2; return 1; }
  sed -n 2p <<<"$made" >"$TLS_DIR/token"
  sed -n 4p <<<"$made" >"$TLS_DIR/tokens"
}

# start_router KIND -> sets FE BE ROUTER_PID (and TEXT for emq and beanstalkd). Retries on
# fresh ports (another process may take a "free" port before the router binds).
start_router() {
  for _ in 1 2 3; do
    try_router "$1" && return 0
    stop "$ROUTER_PID"
  done
  echo "$RUN_NAME: could not start the $1 router (see its log in the results)" | tee -a "$OUT/failed.txt" >&2
  return 1
}

try_router() {
  read -r p1 p2 p3 p4 p5 p6 < <(free_ports 6)
  FE=tcp://127.0.0.1:$p1 BE=tcp://127.0.0.1:$p2 TEXT=127.0.0.1:$p4
  local listen=$p1
  case $1 in
    emq|emq-*)
      local flags=()
      local bin=$ROUTER kind=$1
      # An A/B run: `<target>-before` (emq-before, emq-memory-before, ...)
      # is <target> run from another build, EMQ_ROUTER_BEFORE=/path/to/emq-router.
      case $1 in
        *-before) bin=${EMQ_ROUTER_BEFORE:?$1 needs EMQ_ROUTER_BEFORE}; kind=${1%-before} ;;
      esac
      case $kind in
        emq-async) flags=(--durability async) ;;
        emq-memory) flags=(--durability memory) ;;
        emq-replicated)
          REPLICATED_NAMES=$((REPLICATED_NAMES + 1))
          REPLICATED_NAME=run$REPLICATED_NAMES
          flags=(--durability replicated --nats-urls "$EMQ_NATS_URLS"
            --nats-stream-prefix "$NATS_PREFIX" --router-name "$REPLICATED_NAME") ;;
        emq-shard-sync) flags=(--wal-sync-thread false) ;;
        emq-curve)
          ensure_curve_keys || return 1
          flags=(--frontend-curve "tcp://127.0.0.1:$p5" --backend-curve "tcp://127.0.0.1:$p6"
            --curve-secret-key-file "$KEYS_DIR/router.key_secret"
            --curve-clients-dir "$KEYS_DIR/allow" --curve-workers-dir "$KEYS_DIR/allow")
          listen=$p5 ;;
        emq-tls|emq-memory-tls)
          ensure_tls_files || return 1
          flags=(--text-tls "127.0.0.1:$p5" --text-tls-cert-file "$TLS_DIR/server.pem"
            --text-tls-key-file "$TLS_DIR/server.key" --text-auth-tokens-file "$TLS_DIR/tokens")
          [ "$kind" = emq-memory-tls ] && flags+=(--durability memory)
          listen=$p4 ;;
      esac
      new_data_dir
      # Every port fresh: the metrics server is off (its default port may be
      # taken by another router on this machine).
      # shellcheck disable=SC2086
      "$bin" --log warn --frontend "$FE" --backend "$BE" --admin "tcp://127.0.0.1:$p3" \
        --text "$TEXT" --metrics off --data-dir "$DATA" "${flags[@]}" $ROUTER_ARGS >>"${ROUTER_LOG:-$OUT/router-emq.log}" 2>&1 &
      # emq-curve: the load goes to the CURVE endpoints (the plain ones stay bound, idle).
      if [ "$kind" = emq-curve ]; then FE=tcp://127.0.0.1:$p5 BE=tcp://127.0.0.1:$p6; fi
      # emq-tls: the load goes to the TLS listener (the plain one stays bound, idle).
      case $kind in emq-tls|emq-memory-tls) TEXT=127.0.0.1:$p5 ;; esac
      ;;
    forwarder|forwarder-emqp)
      local wire=one
      [ "$1" = forwarder-emqp ] && wire=emqp
      "$BENCH" forwarder --wire "$wire" --frontend-addr "$FE" --backend-addr "$BE" >/dev/null 2>&1 &
      ;;
    python)
      ensure_venv
      EVENTMQ_FRONTEND_ADDR=$FE EVENTMQ_BACKEND_ADDR=$BE EVENTMQ_ADMINISTRATIVE_ADDR=tcp://127.0.0.1:$p3 \
        "$VENV/bin/emq-router" >/dev/null 2>&1 &
      ;;
    beanstalkd)
      listen=$p4
      beanstalkd -l 127.0.0.1 -p "$p4" >>"$OUT/beanstalkd.log" 2>&1 &
      ;;
    beanstalkd-b0|beanstalkd-b50)
      listen=$p4
      new_data_dir
      local fsync=()
      [ "$1" = beanstalkd-b0 ] && fsync=(-f 0)
      beanstalkd -l 127.0.0.1 -p "$p4" -b "$DATA" "${fsync[@]}" >>"$OUT/beanstalkd.log" 2>&1 &
      ;;
  esac
  ROUTER_PID=$!
  STARTED+=("$ROUTER_PID")
  wait_port "$listen" "$ROUTER_PID"
}

bench() { # NAME ARGS…: run emq-bench; a failure is noted in failed.txt, not fatal
  local name=$1
  shift
  if ! "$BENCH" "$@" --out "$OUT" --name "$name" 2>"$OUT/$name.err"; then
    echo "$name: $(tail -1 "$OUT/$name.err")" | tee -a "$OUT/failed.txt" >&2
  fi
  rm -f "$OUT/$name.err"
}

run_one() { # SCENARIO TARGET RUN
  local name=$1-$2-$3
  RUN_NAME=$name
  echo "== $name" >&2
  echo "$name $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT/loadavg.txt"
  case $2 in
    emq-replicated*|jetstream)
      if [ -z "${EMQ_NATS_URLS:-}" ]; then
        echo "$name: needs a NATS JetStream cluster (EMQ_NATS_URLS; loadtest/replicated.sh starts one)" \
          | tee -a "$OUT/failed.txt" >&2
        return 0
      fi ;;
  esac
  case $MODE:$2 in
    emqp:baseline) bench "$name" baseline $ARGS ;;
    emqp:baseline-emqp) bench "$name" baseline --wire emqp $ARGS ;;
    *:jetstream)
      # shellcheck disable=SC2086
      bench "$name" jetstream --nats-url "$EMQ_NATS_URLS" \
        --target-name jetstream --no-progress "${SERVER_PIDS[@]}" $JETSTREAM_ARGS ;;
    emqp:*)
      start_router "$2" || return 0
      local curve=()
      case $2 in
        emq-curve*) curve=(--curve-key-file "$KEYS_DIR/bench.key_secret" --curve-server-key "$KEYS_DIR/router.key") ;;
      esac
      bench "$name" emqp --frontend "$FE" --backend "$BE" --target-name "$2" --probe-timeout 10s \
        --pid "$ROUTER_PID" "${SERVER_PIDS[@]}" "${curve[@]}" $ARGS
      stop "$ROUTER_PID" ;;
    text:beanstalkd*)
      ensure_beanstalkd "$name" || return 0
      start_router "$2" || return 0
      bench "$name" beanstalk --addr "$TEXT" --target-name "$2" --pid "$ROUTER_PID" $ARGS
      stop "$ROUTER_PID" ;;
    text:*)
      start_router "$2" || return 0
      local tls=()
      case $2 in
        emq-tls*|emq-memory-tls*) tls=(--tls-ca "$TLS_DIR/ca.pem" --token-file "$TLS_DIR/token") ;;
      esac
      bench "$name" text --addr "$TEXT" --target-name "$2" --pid "$ROUTER_PID" "${SERVER_PIDS[@]}" "${tls[@]}" $ARGS
      stop "$ROUTER_PID" ;;
    idle:*)
      start_router "$2" || return 0
      local half=$((IDLE_WORKERS / 2))
      "$BENCH" idle --backend "$BE" --workers "$half" --duration "$((IDLE_SECONDS + 15))s" \
        --out "$OUT" --name "$name-unmeasured" >/dev/null &
      local other=$!
      STARTED+=("$other")
      sleep 8
      bench "$name" idle --backend "$BE" --workers "$((IDLE_WORKERS - half))" --other-workers "$half" \
        --duration "${IDLE_SECONDS}s" --pid "$ROUTER_PID"
      stop "$other"
      stop "$ROUTER_PID" ;;
  esac
  drop_data_dirs
  if [ -n "$REPLICATED_NAME" ]; then drop_streams "^${NATS_PREFIX}_${REPLICATED_NAME}_"; REPLICATED_NAME=; fi
}

SCENARIOS=("$@")
[ ${#SCENARIOS[@]} -gt 0 ] || SCENARIOS=($(ls loadtest/scenarios | sed 's/\.sh$//'))
for s in "${SCENARIOS[@]}"; do
  MODE= TARGETS= RUNS=1 ARGS= IDLE_WORKERS=10000 IDLE_SECONDS=20 ROUTER_ARGS= ROUTER_LOG=
  JETSTREAM_ARGS="--jobs 100000 --size 64 --in-flight 256"
  # shellcheck disable=SC1090
  . "loadtest/scenarios/$s.sh"
  TARGETS=${EMQ_BENCH_TARGETS:-$TARGETS}
  RUNS=${EMQ_BENCH_RUNS:-$RUNS}
  # Runs interleave the targets (a1 b1 a2 b2 …) so a shift in the shared
  # machine's load falls on every target alike.
  for i in $(seq "$RUNS"); do
    for t in $TARGETS; do run_one "$s" "$t" "$i"; done
  done
done
[ -s "$OUT/router-emq.log" ] || rm -f "$OUT/router-emq.log"
[ -s "$OUT/beanstalkd.log" ] || rm -f "$OUT/beanstalkd.log"
python3 loadtest/summarize.py "$OUT" "$BENCH"
echo "results in $OUT" >&2
