#!/usr/bin/env bash
# Scale-out over owners (issue 31): 1, 2 and 3 emq-routers of different
# router names, each in a control group of its own limited to CPU_MAX
# (cgroup v2 `cpu.max`, or cgroup v1 `cpu.cfs_quota_us`/`cpu.cfs_period_us`
# where the cpu controller is on v1), loaded by one emq-bench spreading its
# REQUESTs over them (`--frontend "a;b;c"`, workers split over the owners).
#
#   loadtest/scaleout.sh            # as root
#
# Settings (environment):
#   ROUNDS=3                 interleaved rounds: 1,2,3 owners, 1,2,3, ...
#   OWNER_COUNTS="1 2 3"
#   CPU_MAX="2000 20000"     each owner's quota and period in µs (0.10 core:
#                            on the 2-core development VM, at 0.15 core 3
#                            replicated owners waited on the shared cluster;
#                            a 20 ms period rather than 100 ms: shorter
#                            stalls, so each owner's backlog stays bounded)
#   DURABILITIES="replicated memory"   replicated: every owner on one 3-node
#                            NATS JetStream cluster (loadtest/nats-cluster.sh,
#                            started and stopped here); memory: no log
#   BENCH_ARGS               emq-bench emqp load (default below: 6 clients with
#                            1,024 jobs in flight each, 12 workers with 128
#                            slots each, split over the owners, so even with
#                            3 owners each has 512 credits and a backlog;
#                            with fewer credits per owner an owner runs out
#                            of them within its quota slice and its CPU per
#                            job rises: 64 B jobs, 10 s measured after 1 s)
#   EMQ_NATS_SERVER          nats-server (default: .venv-nats/bin/nats-server,
#                            else $EMQ_NATS_VENV/bin/nats-server)
#   EMQ_BIN_DIR              emq-router, emq-bench, emq-cli (default: built
#                            here with cargo into ${CARGO_TARGET_DIR:-target})
#   EMQ_BENCH_OUT            results directory
#
# Each run: fresh loopback ports, fresh data directories and router names,
# the routers started inside their control groups; emq-bench runs with the
# first owner's PID (`--pid`) for its own CPU per job; around it the script
# reads each owner's CPU (/proc/<pid>/stat) and throttling (cpu.stat), the
# NATS servers' CPU each, the machine's (/proc/stat) and the disks' (busy
# time and writes, /proc/diskstats), and after it each
# owner's STATUS (accepted_jobs). Results in
# loadtest/results/<date>-<rev>-scaleout/: runs.csv, every bench JSON,
# summary.md and scaleout.svg (loadtest/scaleout_summary.py). Every process
# started is stopped by PID and every control group removed, also on
# failure or Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
[ "$(id -u)" = 0 ] || { echo "scaleout.sh needs root (control groups)" >&2; exit 1; }
ROUNDS=${ROUNDS:-3}
OWNER_COUNTS=${OWNER_COUNTS:-"1 2 3"}
CPU_MAX=${CPU_MAX:-"2000 20000"}
DURABILITIES=${DURABILITIES:-"replicated memory"}
BENCH_ARGS=${BENCH_ARGS:-"--clients 6 --workers 12 --slots 128 --in-flight 1024 --size 64 --duration 10s --warmup 1s"}
if [ -z "${EMQ_BIN_DIR:-}" ]; then
  cargo build --release --quiet --bin emq-bench --bin emq-router --bin emq-cli
  EMQ_BIN_DIR=${CARGO_TARGET_DIR:-$ROOT/target}/release
fi
BENCH=$EMQ_BIN_DIR/emq-bench ROUTER=$EMQ_BIN_DIR/emq-router CLI=$EMQ_BIN_DIR/emq-cli
REV=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
OUT=${EMQ_BENCH_OUT:-$ROOT/loadtest/results/$(date -u +%Y-%m-%d-%H%M)-$REV-scaleout}
mkdir -p "$OUT"
TMP=$(mktemp -d /tmp/emq-scaleout-XXXXXX)
PREFIX=emqso$$
read -r QUOTA PERIOD <<<"$CPU_MAX"

STARTED=()
CGROUPS=()
NATS_UP=0
cleanup() {
  local p c
  for p in "${STARTED[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${STARTED[@]}"; do wait "$p" 2>/dev/null || true; done
  STARTED=()
  if [ "$NATS_UP" = 1 ]; then
    python3 loadtest/nats_streams.py "$NATS_URLS" delete "^(KV_)?${PREFIX}_" >/dev/null 2>&1 || true
    cp "$TMP"/nats/n*.log "$OUT/" 2>/dev/null || true
    loadtest/nats-cluster.sh stop "$TMP/nats" >/dev/null 2>&1 || true
    NATS_UP=0
  fi
  # Children first; a group still holding a process cannot go (reported).
  for ((i = ${#CGROUPS[@]} - 1; i >= 0; i--)); do
    c=${CGROUPS[$i]}
    [ -d "$c" ] && { rmdir "$c" 2>/dev/null || echo "could not remove control group $c" >&2; }
  done
  CGROUPS=()
  rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Control groups: v2 when its cpu controller is there, else v1's cpu.
if grep -qw cpu /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
  CG_KIND=v2
  CG_PARENT=/sys/fs/cgroup/emq-scaleout-$$
  grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control || echo +cpu >/sys/fs/cgroup/cgroup.subtree_control
  mkdir "$CG_PARENT"; CGROUPS+=("$CG_PARENT")
  echo +cpu >"$CG_PARENT/cgroup.subtree_control"
elif [ -w /sys/fs/cgroup/cpu/cgroup.procs ]; then
  CG_KIND=v1
  CG_PARENT=/sys/fs/cgroup/cpu/emq-scaleout-$$
  mkdir "$CG_PARENT"; CGROUPS+=("$CG_PARENT")
else
  echo "no cpu controller: neither cgroup v2's (/sys/fs/cgroup/cgroup.controllers) nor v1's (/sys/fs/cgroup/cpu)" >&2
  exit 1
fi
MAX_OWNERS=$(tr ' ' '\n' <<<"$OWNER_COUNTS" | sort -n | tail -1)
for i in $(seq "$MAX_OWNERS"); do
  g=$CG_PARENT/o$i
  mkdir "$g"; CGROUPS+=("$g")
  if [ "$CG_KIND" = v2 ]; then
    echo "$QUOTA $PERIOD" >"$g/cpu.max"
  else
    echo "$PERIOD" >"$g/cpu.cfs_period_us"
    echo "$QUOTA" >"$g/cpu.cfs_quota_us"
  fi
done
throttle() { # GROUP -> "periods throttled"
  awk '$1=="nr_periods"{p=$2} $1=="nr_throttled"{t=$2} END{print p+0, t+0}' "$1/cpu.stat"
}
cpu_s() { # PID -> its CPU seconds (user + system), 0 when gone
  awk -v hz="$(getconf CLK_TCK)" '{sub(/^.*\) /, ""); print ($12 + $13) / hz}' "/proc/$1/stat" 2>/dev/null || echo 0
}
disk_stat() { # -> "io_ms writes" summed over whole disks (vd*, sd*, xvd*, nvme*n*; not partitions)
  awk '$3 ~ /^(x?vd[a-z]+|sd[a-z]+|nvme[0-9]+n[0-9]+)$/ {t += $13; w += $8} END {print t + 0, w + 0}' /proc/diskstats
}
machine_busy() { # -> "busy total" jiffies of all cores
  awk '$1=="cpu"{t=0; for(i=2;i<=NF;i++) t+=$i; print t - $5 - $6, t}' /proc/stat
}
free_ports() {
  python3 -c "import socket,sys
ss=[socket.socket() for _ in range(int(sys.argv[1]))]
[s.bind(('127.0.0.1',0)) for s in ss]
print(' '.join(str(s.getsockname()[1]) for s in ss), flush=True)
[s.close() for s in ss]" "$1"
}
wait_port() { # PORT PID SECONDS
  for _ in $(seq $(($3 * 10))); do
    kill -0 "$2" 2>/dev/null || return 1
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

NATS_URLS= NATS_PIDS=
# nats-server: EMQ_NATS_SERVER, else <project>/.venv-nats, else $EMQ_NATS_VENV
# (bash tests/nats/setup.sh installs it).
if [ -z "${EMQ_NATS_SERVER:-}" ] && [ ! -x "$ROOT/.venv-nats/bin/nats-server" ] && [ -n "${EMQ_NATS_VENV:-}" ]; then
  export EMQ_NATS_SERVER=$EMQ_NATS_VENV/bin/nats-server
fi
start_nats() {
  local out
  if ! out=$(loadtest/nats-cluster.sh start "$TMP/nats"); then
    echo "the NATS cluster did not start" >&2; return 1
  fi
  NATS_UP=1
  NATS_URLS=$(sed -n 's/^urls=//p' <<<"$out")
  NATS_PIDS=$(sed -n 's/^pids=//p' <<<"$out")
}

echo "run,durability,owners,round,jobs_per_s,sent,received,lost,duplicates,errors,wall_s,owner_cpu_s,owner_accepted,owner_throttled_pct,nats_cpu_s,bench_cpu_us_per_job,bench_cpu_s,machine_busy_cores,loadavg,nats_server_cpu_s,disk_io_ms,disk_writes" >"$OUT/runs.csv"
RUN=0
run_one() { # DURABILITY OWNERS ROUND
  local dur=$1 n=$2 round=$3 i fe=() be=() admins=() pids=() flags
  RUN=$((RUN + 1))
  local name=$dur-$n-r$round
  for i in $(seq "$n"); do
    local p1 p2 p3
    read -r p1 p2 p3 < <(free_ports 3)
    fe+=("tcp://127.0.0.1:$p1") be+=("tcp://127.0.0.1:$p2") admins+=("tcp://127.0.0.1:$p3")
    mkdir -p "$TMP/data-$RUN-$i"
    flags=(--durability memory)
    [ "$dur" = replicated ] && flags=(--durability replicated --nats-urls "$NATS_URLS"
      --nats-stream-prefix "$PREFIX" --router-name "r${RUN}o$i")
    # The router starts inside its group: the shell moves itself there, then execs.
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$CG_PARENT/o$i" \
      "$ROUTER" --log warn --frontend "tcp://127.0.0.1:$p1" --backend "tcp://127.0.0.1:$p2" \
      --admin "tcp://127.0.0.1:$p3" --text off --metrics off --data-dir "$TMP/data-$RUN-$i" "${flags[@]}" \
      >>"$OUT/router-$name-o$i.log" 2>&1 &
    pids+=($!); STARTED+=($!)
  done
  for i in $(seq "$n"); do
    if ! wait_port "${fe[$((i - 1))]##*:}" "${pids[$((i - 1))]}" 30; then
      echo "$name: owner $i did not listen (log: router-$name-o$i.log)" | tee -a "$OUT/failed.txt" >&2
      stop_run "${pids[@]}"; return 0
    fi
  done
  local frontend backend
  frontend=$(IFS=';'; echo "${fe[*]}") backend=$(IFS=';'; echo "${be[*]}")
  local cpu0=() thr0=() nats0 m0 d0
  for i in $(seq "$n"); do cpu0+=("$(cpu_s "${pids[$((i - 1))]}")"); thr0+=("$(throttle "$CG_PARENT/o$i")"); done
  nats0=$(nats_cpu) m0=$(machine_busy) d0=$(disk_stat)
  local load
  load=$(cut -d' ' -f1 /proc/loadavg)
  local ok=1
  # shellcheck disable=SC2086
  "$BENCH" emqp --frontend "$frontend" --backend "$backend" --target-name "$name" --pid "${pids[0]}" \
    --no-progress $BENCH_ARGS --out "$OUT" --name "$name" >"$OUT/$name.out" 2>"$OUT/$name.err" || ok=0
  local m1 nats1 d1
  m1=$(machine_busy) nats1=$(nats_cpu) d1=$(disk_stat)
  local cpus=() thr=() acc=()
  for i in $(seq "$n"); do
    local c1 p0 t0_ p1_ t1_
    c1=$(cpu_s "${pids[$((i - 1))]}")
    cpus+=("$(awk -v a="${cpu0[$((i - 1))]}" -v b="$c1" 'BEGIN{printf "%.3f", b - a}')")
    read -r p0 t0_ <<<"${thr0[$((i - 1))]}"
    read -r p1_ t1_ <<<"$(throttle "$CG_PARENT/o$i")"
    thr+=("$(awk -v p=$((p1_ - p0)) -v t=$((t1_ - t0_)) 'BEGIN{printf "%.0f", p ? 100 * t / p : 0}')")
    acc+=("$("$CLI" status --admin "${admins[$((i - 1))]}" 2>/dev/null | sed -n 's/.*accepted_jobs=\([0-9]*\).*/\1/p' | head -1)")
  done
  stop_run "${pids[@]}"
  if [ "$ok" = 0 ]; then
    echo "$name: emq-bench failed (see $name.err)" | tee -a "$OUT/failed.txt" >&2
    return 0
  fi
  local busy
  # Machine cores busy: the share of busy jiffies (all cores) × cores.
  busy=$(awk -v a="$m0" -v b="$m1" -v c="$(nproc)" 'BEGIN{split(a, x, " "); split(b, y, " "); t = y[2] - x[2]; printf "%.2f", t ? c * (y[1] - x[1]) / t : 0}')
  rm -f "$OUT/$name.svg"
  python3 - "$OUT/$name.json" "$RUN" "$dur" "$n" "$round" "$(IFS=' '; echo "${cpus[*]}")" \
    "$(IFS=' '; echo "${acc[*]}")" "$(IFS=' '; echo "${thr[*]}")" \
    "$nats0" "$nats1" "$busy" "$load" "$d0" "$d1" >>"$OUT/runs.csv" <<'EOF'
import json, sys
path, run, dur, n, rnd, cpus, acc, thr, nats0, nats1, busy, load, d0, d1 = sys.argv[1:]
each = [b - a for a, b in zip(map(float, nats0.split()), map(float, nats1.split()))]
nats = f"{sum(each):.3f}"
r = json.load(open(path))["results"][0]
e = r.get("extra") or {}
print(",".join(str(x) for x in [run, dur, n, rnd, round(r["throughput_per_s"]), r["sent"], r["received"], r["lost"],
      r["duplicates"], r["errors"], round(e.get("wall_s", 0), 2), cpus, acc, thr, nats,
      round(e.get("bench_cpu_us_per_job", 0), 2), round(e.get("bench_cpu_s", 0), 3), busy, load,
      " ".join(f"{x:.3f}" for x in each), *(int(b) - int(a) for a, b in zip(d0.split(), d1.split()))]))
EOF
  tail -1 "$OUT/runs.csv"
  return 0
}
nats_cpu() { # -> each NATS server's CPU seconds, space-separated ("0" without servers)
  local p out=()
  [ -n "$NATS_PIDS" ] || { echo 0; return; }
  for p in ${NATS_PIDS//,/ }; do out+=("$(cpu_s "$p")"); done
  echo "${out[*]}"
}
stop_run() { # PIDS: stop the run's routers; forget them
  local p q keep
  for p in "$@"; do kill "$p" 2>/dev/null || true; done
  for p in "$@"; do
    wait "$p" 2>/dev/null || true
    keep=()
    for q in "${STARTED[@]}"; do [ "$q" = "$p" ] || keep+=("$q"); done
    STARTED=("${keep[@]}")
  done
  rm -rf "$TMP"/data-$RUN-*
  if [ -n "$NATS_URLS" ]; then
    python3 loadtest/nats_streams.py "$NATS_URLS" delete "^${PREFIX}_r${RUN}o" >/dev/null 2>&1 || true
  fi
}

{
  echo "date: $(date -u +%FT%TZ)  rev: $REV  host: $(hostname)  cores: $(nproc)"
  echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
  echo "cgroup: $CG_KIND  cpu_max: $QUOTA $PERIOD  bench: $BENCH_ARGS"
  echo "uptime before: $(uptime)"
} >"$OUT/machine.txt"
for dur in $DURABILITIES; do
  NATS_URLS= NATS_PIDS=
  if [ "$dur" = replicated ]; then start_nats || exit 1; fi
  for round in $(seq "$ROUNDS"); do
    for n in $OWNER_COUNTS; do run_one "$dur" "$n" "$round"; done
  done
  if [ "$dur" = replicated ]; then
    python3 loadtest/nats_streams.py "$NATS_URLS" delete "^(KV_)?${PREFIX}_" >/dev/null 2>&1 || true
    cp "$TMP"/nats/n*.log "$OUT/" 2>/dev/null || true
    loadtest/nats-cluster.sh stop "$TMP/nats" >/dev/null; NATS_UP=0; NATS_URLS= NATS_PIDS=
  fi
done
echo "uptime after: $(uptime)" >>"$OUT/machine.txt"
python3 loadtest/scaleout_summary.py "$OUT" "$CPU_MAX"
echo "results in $OUT" >&2
