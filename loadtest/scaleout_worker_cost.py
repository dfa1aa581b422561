#!/usr/bin/env python3
"""Worker-side cost of spreading over owners (issue 31): CPU per job of ONE
emq-worker serving 1, 2 or 3 owners (router names) at once.

    .venv/bin/python loadtest/scaleout_worker_cost.py      # pyzmq needed

Settings (environment):
    ROUNDS=5                interleaved rounds: 1,2,3 owners, 1,2,3, ...
    OWNER_COUNTS="1 2 3"
    JOBS=4000               jobs per run, spread evenly over the served owners
    IN_FLIGHT=256           unacknowledged REQUESTs per owner (producer window)
    CONCURRENCY=8           emq-worker -J
    IDLE_S=2                idle seconds measured before the load (heartbeats only)
    EMQ_BIN_DIR             emq-router, emq-worker (default: target/release;
                            built with cargo there when missing)
    EMQ_BENCH_OUT           results directory

Each run starts max(OWNER_COUNTS) plain emq-routers (`--durability memory`,
fresh loopback ports, each its own --data-dir in a temporary directory,
`--text off --metrics off`) and ONE `emq-worker -J 8 -Q default
--stats-interval 0s -- /bin/true` whose `-B` lists the first N routers'
backends, `;`-separated (N = the run's owner count; the others stay idle, so
every run has the same processes). Once the worker is registered with every
owner it is served, the script reads the worker process's own CPU (utime +
stime of /proc/<pid>/stat; its children, the /bin/true commands, are not in
it) over IDLE_S idle seconds, then over the load: JOBS REQUESTs (64-byte
bodies, queue `default`), sent round-robin over one pyzmq DEALER per served
owner with at most IN_FLIGHT unacknowledged per owner, until every owner's
STATUS counts them all completed (counters.completed_jobs). CPU µs per job
= worker CPU over the load / JOBS. Also recorded: the wall time, the
routers' CPU, the machine's busy cores (/proc/stat), the load average and
the worker's exit line (ready_sent, replies_sent, peak_busy, slots_moved).
Results in loadtest/results/<date>-<rev>-worker-spread/: runs.csv,
summary.md (medians, ratios to 1 owner, paired per-round ratios),
machine.txt, worker logs (and router logs of a failed run).
`--summarize DIR` rewrites DIR/summary.md from its runs.csv (and notes.md);
`--pool DIR...` prints one table over several sets. Every
process started is stopped by PID and the temporary directory removed,
also on failure or Ctrl-C.
"""
import csv
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid

import zmq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROUNDS = int(os.environ.get("ROUNDS", "5"))
OWNER_COUNTS = [int(x) for x in os.environ.get("OWNER_COUNTS", "1 2 3").split()]
JOBS = int(os.environ.get("JOBS", "4000"))
IN_FLIGHT = int(os.environ.get("IN_FLIGHT", "256"))
CONCURRENCY = int(os.environ.get("CONCURRENCY", "8"))
IDLE_S = float(os.environ.get("IDLE_S", "2"))
HZ = os.sysconf("SC_CLK_TCK")

STARTED = []  # Popen objects still to stop


def sh(*args):
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True).stdout.strip()


def bin_dir():
    d = os.environ.get("EMQ_BIN_DIR")
    if d:
        return d
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    d = os.path.join(target, "release")
    if not all(os.path.exists(os.path.join(d, b)) for b in ("emq-router", "emq-worker")):
        subprocess.run(["cargo", "build", "--release", "--bin", "emq-router", "--bin", "emq-worker"],
                       cwd=ROOT, check=True)
    return d


def free_ports(n):
    ss = [socket.socket() for _ in range(n)]
    for s in ss:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in ss]
    for s in ss:
        s.close()
    return ports


def cpu_s(pid):
    """A process's own user + system CPU seconds (not its children's); None when gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            rest = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(rest[11]) + int(rest[12])) / HZ


def machine_busy():
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    total = sum(v)
    return total - v[3] - v[4], total


def stop(p, timeout=10):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    if p in STARTED:
        STARTED.remove(p)


def cleanup():
    for p in list(STARTED):
        try:
            stop(p)
        except Exception as e:  # keep stopping the others
            print(f"could not stop {p.pid}: {e}", file=sys.stderr)


def status(ctx, admin, timeout_ms=2000):
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(admin)
    try:
        s.send_multipart([b"", b"eMQP/1.0", b"STATUS", b"admin:" + uuid.uuid4().hex.encode()])
        if not s.poll(timeout_ms):
            return None
        fr = s.recv_multipart()
        if len(fr) > 4 and fr[2] == b"REPLY":
            return json.loads(fr[4])
        return None
    finally:
        s.close()


def counter(st, name):
    return ((st or {}).get("emq") or {}).get("counters", {}).get(name, 0)


def wait_until(pred, seconds, what):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise RuntimeError(f"timed out waiting for {what}")


def produce(ctx, frontends, jobs, tag):
    """Sends `jobs` REQUESTs round-robin over one DEALER per frontend, at most
    IN_FLIGHT unacknowledged per frontend; returns (accepted, refused)."""
    socks = []
    for f in frontends:
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f)
        socks.append(s)
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    body = b"x" * 64
    per = [jobs // len(socks) + (1 if i < jobs % len(socks) else 0) for i in range(len(socks))]
    sent = [0] * len(socks)
    open_ = [0] * len(socks)
    accepted = refused = 0
    deadline = time.monotonic() + 120
    try:
        while accepted + refused < jobs:
            if time.monotonic() > deadline:
                raise RuntimeError(f"producer: {accepted + refused} of {jobs} answered in 120 s")
            for i, s in enumerate(socks):
                while sent[i] < per[i] and open_[i] < IN_FLIGHT:
                    mid = f"{tag}-{i}-{sent[i]}".encode()
                    s.send_multipart([b"", b"eMQP/1.0", b"REQUEST", mid, b"default", b"", body])
                    sent[i] += 1
                    open_[i] += 1
            for s, _ in poller.poll(1000):
                i = socks.index(s)
                while True:
                    try:
                        fr = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    if len(fr) > 2 and fr[2] == b"REPLY":
                        accepted += 1
                        open_[i] -= 1
                    elif len(fr) > 2 and fr[2] == b"ERROR":
                        refused += 1
                        open_[i] -= 1
    finally:
        for s in socks:
            s.close()
    return accepted, refused


def run_one(ctx, bins, tmp, out, run, n, rnd, max_owners):
    name = f"o{n}-r{rnd}"
    routers = []
    # All of a run's ports from one call: ports taken in separate calls may
    # repeat (each closed before its router binds it).
    ports = free_ports(3 * max_owners)
    for i in range(max_owners):
        p_fe, p_be, p_ad = ports[3 * i:3 * i + 3]
        data = os.path.join(tmp, f"data-{run}-{i}")
        os.makedirs(data)
        log = open(os.path.join(tmp, f"router-{run}-{i}.log"), "w")
        p = subprocess.Popen([os.path.join(bins, "emq-router"), "--log", "warn",
                              "--frontend", f"tcp://127.0.0.1:{p_fe}", "--backend", f"tcp://127.0.0.1:{p_be}",
                              "--admin", f"tcp://127.0.0.1:{p_ad}", "--text", "off", "--metrics", "off",
                              "--durability", "memory", "--data-dir", data],
                             stdout=log, stderr=subprocess.STDOUT)
        log.close()
        STARTED.append(p)
        routers.append({"p": p, "fe": f"tcp://127.0.0.1:{p_fe}", "be": f"tcp://127.0.0.1:{p_be}",
                        "admin": f"tcp://127.0.0.1:{p_ad}", "log": log.name})
    worker = None
    ok = False

    def alive(where):
        # A router that could not bind a port exits; another process may answer on that port.
        for i, r in enumerate(routers):
            if r["p"].poll() is not None:
                raise RuntimeError(f"router {i} exited {where} (log copied: router-{name}-{i}.log)")
    try:
        for r in routers:
            wait_until(lambda r=r: r["p"].poll() is None and status(ctx, r["admin"], 500) is not None, 30,
                       "a router's STATUS")
        time.sleep(0.3)
        alive("at start")
        served = routers[:n]
        wlog_path = os.path.join(out, f"worker-{name}.log")
        wlog = open(wlog_path, "w")
        worker = subprocess.Popen([os.path.join(bins, "emq-worker"), "-B", ";".join(r["be"] for r in served),
                                   "-J", str(CONCURRENCY), "-Q", "default", "--stats-interval", "0s",
                                   "--log", "warn", "--", "/bin/true"], stdout=wlog, stderr=subprocess.STDOUT)
        STARTED.append(worker)
        wait_until(lambda: all(((status(ctx, r["admin"]) or {}).get("emq") or {}).get("workers", 0) >= 1
                               for r in served), 30, "the worker registered with every owner")
        time.sleep(0.5)
        c_idle0 = cpu_s(worker.pid)
        time.sleep(IDLE_S)
        c0 = cpu_s(worker.pid)
        done0 = [counter(status(ctx, r["admin"]), "completed_jobs") for r in served]
        r0 = [cpu_s(r["p"].pid) for r in served]
        m0 = machine_busy()
        load = open("/proc/loadavg").read().split()[0]
        t0 = time.monotonic()
        accepted, refused = produce(ctx, [r["fe"] for r in served], JOBS, f"{name}-{uuid.uuid4().hex[:6]}")
        if refused:
            raise RuntimeError(f"{refused} REQUESTs refused")

        def all_done():
            return sum(counter(status(ctx, r["admin"]), "completed_jobs") for r in served) - sum(done0) >= JOBS
        wait_until(all_done, 120, f"{JOBS} jobs completed")
        alive("during the load")
        wall = time.monotonic() - t0
        c1 = cpu_s(worker.pid)
        r1 = [cpu_s(r["p"].pid) for r in served]
        m1 = machine_busy()
        per_owner = [counter(status(ctx, r["admin"]), "completed_jobs") - d for r, d in zip(served, done0)]
        stop(worker)
        wlog.close()
        exit_line = ""
        with open(wlog_path) as f:
            for line in f:
                if "jobs ok=" in line:
                    exit_line = line.strip().split("emq-worker: ", 1)[-1]
        worker = None
        busy = (m1[0] - m0[0]) / (m1[1] - m0[1]) * os.cpu_count() if m1[1] > m0[1] else 0
        row = {"run": run, "owners": n, "round": rnd, "jobs": JOBS, "accepted": accepted,
               "completed_per_owner": " ".join(map(str, per_owner)), "wall_s": round(wall, 3),
               "jobs_per_s": round(JOBS / wall), "worker_cpu_s": round(c1 - c0, 3),
               "worker_cpu_us_per_job": round((c1 - c0) / JOBS * 1e6, 1),
               "worker_idle_cpu_pct": round((c0 - c_idle0) / IDLE_S * 100, 2),
               "routers_cpu_s": round(sum(b - a for a, b in zip(r0, r1)), 3),
               "machine_busy_cores": round(busy, 2), "loadavg": load, "worker_exit": exit_line}
        ok = True
        return row
    finally:
        if worker is not None:
            stop(worker)
        for i, r in enumerate(routers):
            stop(r["p"])
            if not ok:
                shutil.copy(r["log"], os.path.join(out, f"router-{name}-{i}.log"))


def summarize(out, rows, meta):
    by = {}
    for r in rows:
        by.setdefault(r["owners"], []).append(r)
    med = {n: statistics.median(r["worker_cpu_us_per_job"] for r in rs) for n, rs in by.items()}
    base = med.get(1)
    lines = ["# Worker-side CPU per job: one emq-worker over 1, 2, 3 owners (issue 31)", "",
             *meta, "",
             "| owners | runs | worker CPU µs/job median (min–max) | ratio to 1 owner | idle CPU % of a core "
             "(median) | jobs/s median | routers CPU µs/job median | machine busy cores median |",
             "|---|---|---|---|---|---|---|---|"]
    for n in sorted(by):
        rs = by[n]
        v = [r["worker_cpu_us_per_job"] for r in rs]
        ratio = f"{med[n] / base:.2f}" if base else "-"
        lines.append(f"| {n} | {len(rs)} | {med[n]:.1f} ({min(v):.1f}–{max(v):.1f}) | {ratio} | "
                     f"{statistics.median(r['worker_idle_cpu_pct'] for r in rs):.2f} | "
                     f"{statistics.median(r['jobs_per_s'] for r in rs):.0f} | "
                     f"{statistics.median(r['routers_cpu_s'] / r['jobs'] * 1e6 for r in rs):.1f} | "
                     f"{statistics.median(r['machine_busy_cores'] for r in rs):.2f} |")
    # Paired: each round's N-owner run over the same round's 1-owner run (the
    # machine's load drifts between rounds more than within one).
    one = {r["round"]: r["worker_cpu_us_per_job"] for r in by.get(1, [])}
    lines += ["", "Paired ratios (each round's N-owner µs/job over the same round's 1-owner run):", ""]
    for n in sorted(by):
        if n == 1 or not one:
            continue
        pr = [r["worker_cpu_us_per_job"] / one[r["round"]] for r in by[n] if one.get(r["round"])]
        if pr:
            lines.append(f"* {n} owners: median {statistics.median(pr):.3f} (min {min(pr):.3f}, "
                         f"max {max(pr):.3f}; {len(pr)} rounds)")
    lines += ["", "Per run (runs.csv):", "",
              "| run | owners | round | µs/job | jobs/s | wall s | load | busy cores | worker exit line |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['run']} | {r['owners']} | {r['round']} | {r['worker_cpu_us_per_job']} | "
                     f"{r['jobs_per_s']} | {r['wall_s']} | {r['loadavg']} | {r['machine_busy_cores']} | "
                     f"{r['worker_exit']} |")
    busy = statistics.median(r["machine_busy_cores"] for r in rows)
    cores = os.cpu_count() or 1
    lines += ["", f"Saturated: {'the machine CPU' if busy >= 0.95 * cores else 'nothing (machine CPU below 95 %)'}"
              f" (median busy cores {busy:.2f} of {cores}: the /bin/true commands, the worker, the routers"
              " and this script's producer together); the worker's -J slots were all busy (peak_busy in"
              " its exit line)."]
    notes = os.path.join(out, "notes.md")
    if os.path.exists(notes):
        with open(notes) as f:
            lines += ["", f.read().rstrip("\n")]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return med


def resummarize(out):
    """`scaleout_worker_cost.py --summarize DIR`: summary.md again from DIR's runs.csv."""
    num = {"run", "owners", "round", "jobs", "accepted", "jobs_per_s"}
    flt = {"wall_s", "worker_cpu_s", "worker_cpu_us_per_job", "worker_idle_cpu_pct", "routers_cpu_s",
           "machine_busy_cores"}
    with open(os.path.join(out, "runs.csv")) as f:
        rows = [{k: int(v) if k in num else float(v) if k in flt else v for k, v in r.items()}
                for r in csv.DictReader(f)]
    with open(os.path.join(out, "machine.txt")) as f:
        meta = [ln.rstrip("\n") for ln in f if not ln.startswith("cpu:")]
    print(json.dumps({"median_worker_cpu_us_per_job": summarize(out, rows, meta)}))
    return 0


def pool(dirs):
    """`scaleout_worker_cost.py --pool DIR...`: one markdown table over several sets' runs.csv
    (medians of all runs; paired ratios within each set's rounds)."""
    rows = []
    for d in dirs:
        with open(os.path.join(d, "runs.csv")) as f:
            for r in csv.DictReader(f):
                rows.append((d, int(r["round"]), int(r["owners"]), float(r["worker_cpu_us_per_job"]),
                             float(r["routers_cpu_s"]) / int(r["jobs"]) * 1e6))
    by = {}
    for d, rnd, n, v, rc in rows:
        by.setdefault(n, []).append(v)
    one = {(d, rnd): v for d, rnd, n, v, rc in rows if n == 1}
    if 1 not in by:
        print("no 1-owner runs", file=sys.stderr)
        return 1
    med1 = statistics.median(by[1])
    print("| owners | runs | worker CPU µs/job median | ratio of medians | paired ratio median (min–max) "
          "| served routers' CPU µs/job median |")
    print("|---|---|---|---|---|---|")
    for n in sorted(by):
        pr = [v / one[(d, rnd)] for d, rnd, m, v, rc in rows if m == n and (d, rnd) in one]
        rcs = [rc for d, rnd, m, v, rc in rows if m == n]
        print(f"| {n} | {len(by[n])} | {statistics.median(by[n]):.1f} | {statistics.median(by[n]) / med1:.2f} | "
              f"{statistics.median(pr):.3f} ({min(pr):.2f}–{max(pr):.2f}) | {statistics.median(rcs):.1f} |")
    return 0


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--summarize":
        return resummarize(sys.argv[2])
    if len(sys.argv) >= 3 and sys.argv[1] == "--pool":
        return pool(sys.argv[2:])
    bins = bin_dir()
    rev = sh("git", "rev-parse", "--short", "HEAD") or "unknown"
    out = os.environ.get("EMQ_BENCH_OUT") or os.path.join(
        ROOT, "loadtest", "results", time.strftime("%Y-%m-%d-%H%M", time.gmtime()) + f"-{rev}-worker-spread")
    os.makedirs(out, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="emq-wcost-")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ctx = zmq.Context.instance()
    rows = []
    max_owners = max(OWNER_COUNTS)
    meta = [f"date: {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}  rev: {rev}  host: {socket.gethostname()}"
            f"  cores: {os.cpu_count()}",
            f"settings: JOBS={JOBS} ROUNDS={ROUNDS} OWNER_COUNTS={' '.join(map(str, OWNER_COUNTS))} "
            f"IN_FLIGHT={IN_FLIGHT} (per owner) CONCURRENCY={CONCURRENCY} IDLE_S={IDLE_S}; "
            f"{max_owners} routers (--durability memory) up in every run",
            f"uptime before: {sh('uptime')}"]
    try:
        run = 0
        for rnd in range(1, ROUNDS + 1):
            for n in OWNER_COUNTS:
                run += 1
                try:
                    row = run_one(ctx, bins, tmp, out, run, n, rnd, max_owners)
                except RuntimeError as e:
                    print(f"run {run} ({n} owners, round {rnd}) failed: {e}", file=sys.stderr)
                    with open(os.path.join(out, "failed.txt"), "a") as f:
                        f.write(f"run {run} owners {n} round {rnd}: {e}\n")
                    continue
                rows.append(row)
                print(json.dumps(row), flush=True)
        meta.append(f"uptime after: {sh('uptime')}")
        if rows:
            with open(os.path.join(out, "runs.csv"), "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=list(rows[0]))
                w.writeheader()
                w.writerows(rows)
            with open(os.path.join(out, "machine.txt"), "w") as f:
                f.write("\n".join(meta) + "\n")
                cpu = sh("sh", "-c", "sed -n 's/^model name\\s*: //p' /proc/cpuinfo | head -1")
                f.write(f"cpu: {cpu}\n")
            med = summarize(out, rows, meta)
            print(json.dumps({"median_worker_cpu_us_per_job": med}), flush=True)
        print(f"results in {out}", file=sys.stderr)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        cleanup()
        subprocess.run(["rm", "-rf", tmp])
        ctx.term()
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
