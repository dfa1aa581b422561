#!/usr/bin/env python3
"""Failover under a probe client (issue 28 part 6); run by loadtest/failover.sh.

Starts router A (owner) and router B (`--standby`) under one fresh router
name on a running NATS cluster, queues JOBS jobs on queue `fill` (text
SCHEDs through `emq-bench fill --text`, then STATUS until they all wait),
and runs ROUNDS take-overs: `kill -9` of the current owner, the standby
takes over, the killed router is restarted as `--standby` and waits; roles
alternate. Meanwhile one probe client sends an eMQP REQUEST (queue
`default`) every 20 ms over one DEALER connected to both routers'
frontends (ZMQ_IMMEDIATE=1: a send goes only to a connected router; with
none it waits, as emq's client does), re-sends a request unanswered for
1 s with the same msgid, and logs every send, re-send, blocked send
(no router connected), acceptance REPLY and ERROR refusal with its time.

Per round: kill -> the standby's frontend accepting TCP connections;
kill -> the first acceptance the probe received from the new owner (any
acceptance received later than 100 ms after the kill: the old owner is
dead by then); the decomposition from the new owner's log and STATUS
(the old owner's lease age at the kill, kill -> "took the router name",
-> "serving", replay.took_ms); the probe's gap (last acceptance before the
kill -> first after); re-sends, blocked sends, refusals, duplicate
acceptances; the acknowledgement latency (creation -> first acceptance)
of the probe requests created in the round; CPU of the new owner and the
NATS servers from the kill to the first acceptance; the load average.
Checks after every take-over: queue `fill` still holds JOBS jobs and
`default` at least as many jobs as the probe got acceptances (an
acknowledged probe request lost would show as fewer).

Writes OUT/rounds.csv, OUT/rounds.json, OUT/probe-events.csv, OUT/run.json.
Every process it starts has its PID in WORK/pids/ (failover.sh's trap
stops them too) and is stopped by PID at the end.
"""
import argparse
import csv
import datetime as dt
import json
import os
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid

import zmq

mono = time.monotonic


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def listening(port):
    s = socket.socket()
    s.settimeout(0.2)
    try:
        s.connect(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


def cpu_s(pids):
    t = 0
    for p in pids:
        try:
            f = open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()
            t += int(f[11]) + int(f[12])
        except OSError:
            pass
    return t / os.sysconf("SC_CLK_TCK")


def loadavg():
    return " ".join(open("/proc/loadavg").read().split()[:3])


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


class Router:
    def __init__(self, label, args, work):
        self.label = label
        self.args = args
        self.work = work
        self.fp, self.bp, self.ap, self.tp = (free_port() for _ in range(4))
        self.data = os.path.join(work, f"data-{label}")
        self.proc = None
        self.starts = 0
        self.log_path = None

    @property
    def frontend(self):
        return f"tcp://127.0.0.1:{self.fp}"

    @property
    def admin(self):
        return f"tcp://127.0.0.1:{self.ap}"

    def start(self, standby):
        self.starts += 1
        if os.path.isdir(self.data):
            subprocess.run(["rm", "-rf", self.data], check=True)
        os.makedirs(self.data)
        self.log_path = os.path.join(self.work, f"router-{self.label}-{self.starts}.log")
        a = self.args
        cmd = [os.path.join(a.bin, "emq-router"), "--durability", "replicated", "--nats-urls", a.nats_urls,
               "--nats-stream-prefix", a.prefix, "--router-name", a.name,
               "--frontend", self.frontend, "--backend", f"tcp://127.0.0.1:{self.bp}",
               "--admin", self.admin, "--text", f"127.0.0.1:{self.tp}", "--metrics", "off",
               "--latency-interval", "0s", "--max-queue-len", "1000000", "--data-dir", self.data,
               "--log", "info"]
        if standby:
            cmd.append("--standby")
        self.proc = subprocess.Popen(cmd, stdout=open(self.log_path, "w"), stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        with open(os.path.join(self.work, "pids", f"router-{self.label}.pid"), "w") as f:
            f.write(str(self.proc.pid))
        return self.proc.pid

    def kill9(self):
        self.proc.send_signal(signal.SIGKILL)

    def reap(self):
        self.proc.wait()
        try:
            os.remove(os.path.join(self.work, "pids", f"router-{self.label}.pid"))
        except OSError:
            pass

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc:
            self.reap()

    def status(self, timeout_ms=3000):
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(self.admin)
        try:
            mid = b"admin:" + uuid.uuid4().hex.encode()
            s.send_multipart([b"", b"eMQP/1.0", b"STATUS", mid])
            if not s.poll(timeout_ms):
                return None
            fr = s.recv_multipart()
            if len(fr) > 4 and fr[2] == b"REPLY":
                return json.loads(fr[4])
            return None
        finally:
            s.close()

    def role(self):
        st = self.status(1000)
        if not st:
            return None
        return st.get("emq", {}).get("wal", {}).get("nats", {}).get("ownership", {}).get("role")

    def log_text(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""


def waiting(st, queue):
    w = st.get("waiting_messages_by_queue")
    if w is None:
        w = st.get("emq", {}).get("waiting_messages_by_queue", {})
    return w.get(queue, 0)


class Probe(threading.Thread):
    """One DEALER to both frontends, a REQUEST every INTERVAL, re-sent after RESEND unanswered."""

    def __init__(self, frontends, t0, interval=0.02, resend=1.0):
        super().__init__(daemon=True)
        self.frontends = frontends
        self.t0 = t0
        self.interval = interval
        self.resend = resend
        self.events = []  # (t, kind, seq, detail)
        self.reqs = {}  # seq -> {created, first_sent, last_sent, sends, accepted, refused}
        self.stop_creating = threading.Event()
        self.stopped = threading.Event()

    def ev(self, t, kind, seq, detail=""):
        self.events.append((t, kind, seq, detail))

    def run(self):
        ctx = zmq.Context.instance()
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.LINGER, 0)
        for f in self.frontends:
            s.connect(f)
        by_mid = {}
        pending = {}  # seq -> msgid, unanswered (sent or not)
        seq = 0
        next_tick = mono()
        tag = uuid.uuid4().hex[:8]

        def send(q, kind):
            r = self.reqs[q]
            body = json.dumps({"probe": q}).encode()
            try:
                s.send_multipart([b"", b"eMQP/1.0", b"REQUEST", r["msgid"], b"default", b"", body], zmq.NOBLOCK)
            except zmq.Again:
                if not r["blocked"]:
                    r["blocked"] = True
                    self.ev(mono(), "blocked", q)
                return
            t = mono()
            if r["first_sent"] is None:
                r["first_sent"] = t
                self.ev(t, "send", q)
            else:
                r["resends"] += 1
                self.ev(t, kind if kind == "resend" else "send-late", q)
            r["last_sent"] = t

        while not self.stopped.is_set():
            t = mono()
            if t >= next_tick:
                if not self.stop_creating.is_set():
                    seq += 1
                    mid = f"probe-{tag}-{seq}".encode()
                    self.reqs[seq] = {"msgid": mid, "created": next_tick, "first_sent": None, "last_sent": None,
                                      "resends": 0, "blocked": False, "accepted": None, "accepts": 0,
                                      "refused": None}
                    by_mid[mid] = seq
                    pending[seq] = mid
                    send(seq, "send")
                # requests never sent (no router connected): try again every tick
                for q in [q for q in pending if self.reqs[q]["first_sent"] is None and q != seq]:
                    send(q, "send")
                next_tick += self.interval
                if next_tick < t:
                    next_tick = t + self.interval
            for q in list(pending):
                r = self.reqs[q]
                if r["last_sent"] is not None and t - r["last_sent"] >= self.resend:
                    send(q, "resend")
            if s.poll(max(1, int(min(next_tick - mono(), 0.005) * 1000))):
                while True:
                    try:
                        fr = s.recv_multipart(zmq.NOBLOCK)
                    except zmq.Again:
                        break
                    t = mono()
                    if len(fr) < 5:
                        continue
                    q = by_mid.get(fr[4])
                    if q is None:
                        continue
                    r = self.reqs[q]
                    if fr[2] == b"REPLY":
                        r["accepts"] += 1
                        if r["accepted"] is None:
                            r["accepted"] = t
                            self.ev(t, "accept", q, f"{(t - r['created']) * 1000:.1f}")
                        else:
                            self.ev(t, "accept-dup", q)
                        pending.pop(q, None)
                    elif fr[2] == b"ERROR":
                        code = fr[5].decode(errors="replace") if len(fr) > 5 else "?"
                        if r["refused"] is None:
                            r["refused"] = code
                        self.ev(t, "refuse", q, code)
                        pending.pop(q, None)
            if self.stop_creating.is_set() and not pending:
                break
        s.close()

    def accepts_total(self):
        return sum(r["accepts"] for r in list(self.reqs.values()))


def drain(router, expected, probe, rounds, rel):
    """A worker for `default` on the final owner takes every queued probe job (never answers): which
    acknowledged msgids came out, which twice, which not at all."""
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(f"tcp://127.0.0.1:{router.bp}")
    s.send_multipart([b"", b"eMQP/1.0", b"INFORM", b"drain-inform", b'[[1, "default"]]', b"worker"])
    got = {}
    acked = False
    end = mono() + 30
    idle_until = None
    while mono() < end:
        if not s.poll(200):
            if acked and idle_until and mono() > idle_until:
                break
            continue
        fr = s.recv_multipart()
        if fr[2] == b"ACK" and not acked:
            acked = True
            for _ in range(expected + 100):
                s.send_multipart([b"", b"eMQP/1.0", b"READY", b"drain-ready"])
            idle_until = mono() + 3
        elif fr[2] == b"REQUEST":
            got[fr[3]] = got.get(fr[3], 0) + 1
            idle_until = mono() + 3
    s.close()
    acked_mids = {r["msgid"]: q for q, r in probe.reqs.items() if r["accepted"] is not None}
    kills = [(r["round"], r["_t_kill"]) for r in rounds]

    def near_kill(q):
        r = probe.reqs[q]
        t = r["first_sent"]
        if t is None:
            return None
        rd, k = min(kills, key=lambda x: abs(x[1] - t))
        return {"request": q, "round": rd, "first_sent_minus_kill_ms": round((t - k) * 1000, 1),
                "resends": r["resends"], "acceptance_minus_kill_ms": round((r["accepted"] - k) * 1000, 1)}

    dups = [near_kill(acked_mids[m]) for m, n in got.items() if n > 1 and m in acked_mids]
    return {"jobs_delivered": sum(got.values()), "distinct_msgids": len(got),
            "missing": sorted(q for m, q in acked_mids.items() if m not in got),
            "foreign": len([m for m in got if m not in acked_mids]),
            "twice": dups}


def parse_log_time(line):
    m = re.match(r"\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z?", re.sub(r"\x1b\[[0-9;]*m", "", line))
    if not m:
        return None
    s = m.group(1)
    if "." in s:
        head, frac = s.split(".")
        s = head + "." + frac[:6]
    return dt.datetime.fromisoformat(s).replace(tzinfo=dt.timezone.utc).timestamp()


def log_line_time(text, needle):
    for line in text.splitlines():
        if needle in line:
            return parse_log_time(line), line
    return None, None


def wait_until(pred, secs, step=0.05):
    end = mono() + secs
    while mono() < end:
        if pred():
            return True
        time.sleep(step)
    return False


def run_main(argv):
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ap = argparse.ArgumentParser(prog="failover_probe.py run")
    ap.add_argument("--bin", required=True)
    ap.add_argument("--nats-urls", required=True)
    ap.add_argument("--nats-pids", default="")
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--jobs", type=int, default=100000)
    ap.add_argument("--lease-s", type=float, default=10.0)
    ap.add_argument("--prefix", default=f"emqfo{os.getpid()}")
    ap.add_argument("--name", default=f"fo{os.getpid()}")
    args = ap.parse_args(argv)
    os.makedirs(os.path.join(args.work, "pids"), exist_ok=True)
    os.makedirs(args.out, exist_ok=True)
    nats_pids = [p for p in args.nats_pids.split(",") if p]
    t0 = mono()
    wall0 = time.time()
    rel = lambda t: t - t0  # noqa: E731
    a, b = Router("A", args, args.work), Router("B", args, args.work)
    run = {"started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "jobs": args.jobs,
           "lease_s": args.lease_s, "router_name": args.name, "prefix": args.prefix, "load_start": loadavg(),
           "bugs": []}
    rounds = []
    probe = None
    try:
        a.start(standby=False)
        if not wait_until(lambda: listening(a.fp) and listening(a.tp), 60):
            raise SystemExit("router A did not listen in 60 s:\n" + a.log_text()[-3000:])
        b.start(standby=True)
        if not wait_until(lambda: b.role() == "standby", 30, 0.2):
            raise SystemExit("router B's STATUS never said standby:\n" + b.log_text()[-3000:])
        print(f"A owner (pid {a.proc.pid}), B standby (pid {b.proc.pid}); filling {args.jobs} jobs", file=sys.stderr)
        tf = mono()
        fill = subprocess.run([os.path.join(args.bin, "emq-bench"), "fill", "--text", f"127.0.0.1:{a.tp}",
                               "--queue", "fill", "--jobs", str(args.jobs), "--pid", str(a.proc.pid)],
                              capture_output=True, text=True, timeout=600)
        if fill.returncode != 0:
            raise SystemExit(f"emq-bench fill failed: {fill.stdout}\n{fill.stderr}")
        if not wait_until(lambda: waiting(a.status() or {}, "fill") >= args.jobs, 120, 0.2):
            raise SystemExit(f"queue fill never reached {args.jobs} waiting")
        run["fill"] = {"seconds": round(mono() - tf, 2), "emq_bench": json.loads(fill.stdout or "{}")}
        print(f"filled in {run['fill']['seconds']} s; probe starts", file=sys.stderr)

        probe = Probe([a.frontend, b.frontend], t0)
        probe.start()
        time.sleep(3)
        owner, standby = a, b
        for i in range(1, args.rounds + 1):
            round_start = mono()
            # kill at a random phase of the lease renewal (every lease/3)
            time.sleep(1 + random.uniform(0, args.lease_s / 3))
            st_sb = standby.status() or {}
            own_sb = st_sb.get("emq", {}).get("wal", {}).get("nats", {}).get("ownership", {})
            t_st = mono()
            cpu_sb0, cpu_n0 = cpu_s([standby.proc.pid]), cpu_s(nats_pids)
            load_kill = loadavg()
            t_kill = mono()
            wall_kill = time.time()
            owner.kill9()
            t_kill_done = mono()
            lease_age_at_kill = None
            if own_sb.get("lease_age_ms") is not None:
                lease_age_at_kill = own_sb["lease_age_ms"] + (t_kill - t_st) * 1000
            owner.reap()
            t_listen = None
            end = t_kill + 60
            while mono() < end:
                if listening(standby.fp):
                    t_listen = mono()
                    break
                time.sleep(0.005)
            if t_listen is None:
                run["bugs"].append(f"round {i}: the standby {standby.label} did not listen within 60 s of the kill")
                raise SystemExit(f"round {i}: standby did not take over in 60 s\n" + standby.log_text()[-4000:])
            # first acceptance from the new owner
            def first_after():
                acc = [e[0] for e in probe.events if e[1] == "accept" and e[0] > t_kill + 0.1]
                return min(acc) if acc else None
            wait_until(lambda: first_after() is not None, 20, 0.01)
            t_first = first_after()
            cpu_sb1, cpu_n1 = cpu_s([standby.proc.pid]), cpu_s(nats_pids)
            before = [e[0] for e in probe.events if e[1] == "accept" and e[0] <= t_kill]
            t_last_before = max(before) if before else None
            st_new = None
            wait_until(lambda: (standby.status() or {}).get("emq", {}).get("wal", {}).get("nats", {})
                       .get("ownership", {}).get("role") == "owner", 10, 0.1)
            st_new = standby.status() or {}
            own_new = st_new.get("emq", {}).get("wal", {}).get("nats", {}).get("ownership", {})
            log = standby.log_text()
            took_t, _ = log_line_time(log, "took the router name")
            serving_t, serving_line = log_line_time(log, "serving: this router owns its name")
            # restart the killed one as standby
            time.sleep(0.5)
            acc_now = probe.accepts_total()
            w_fill, w_def = waiting(st_new, "fill"), waiting(st_new, "default")
            if w_fill != args.jobs:
                run["bugs"].append(f"round {i}: queue fill holds {w_fill} jobs after the take-over, not {args.jobs}")
            owner.start(standby=True)
            ok_sb = wait_until(lambda: owner.role() == "standby", 30, 0.1)
            t_end = mono()
            if not ok_sb:
                run["bugs"].append(f"round {i}: the restarted {owner.label} never said standby")
            acc_at_status = acc_now
            r = {
                "round": i, "killed": owner.label, "new_owner": standby.label,
                "t_kill_s": round(rel(t_kill), 4), "t_kill_done_s": round(rel(t_kill_done), 4), "kill_utc": dt.datetime.fromtimestamp(wall_kill, dt.timezone.utc)
                .isoformat(timespec="milliseconds"),
                "lease_age_at_kill_ms": None if lease_age_at_kill is None else round(lease_age_at_kill),
                "kill_to_took_name_ms": None if took_t is None else round((took_t - wall_kill) * 1000),
                "kill_to_serving_log_ms": None if serving_t is None else round((serving_t - wall_kill) * 1000),
                "kill_to_listening_ms": round((t_listen - t_kill) * 1000),
                "kill_to_first_accept_ms": None if t_first is None else round((t_first - t_kill) * 1000),
                "replay_took_ms": (own_new.get("replay") or {}).get("took_ms"),
                "replay_messages_read": (own_new.get("replay") or {}).get("messages_read"),
                "epoch": own_new.get("epoch"),
                "probe_gap_ms": None if (t_first is None or t_last_before is None)
                else round((t_first - t_last_before) * 1000),
                "new_owner_cpu_ms_kill_to_first_accept": round((cpu_sb1 - cpu_sb0) * 1000),
                "nats_cpu_ms_kill_to_first_accept": round((cpu_n1 - cpu_n0) * 1000),
                "waiting_fill_after": w_fill, "waiting_default_after": w_def,
                "probe_acceptances_so_far": acc_at_status,
                "load_at_kill": load_kill,
                "_t_start": round_start, "_t_kill": t_kill, "_t_end": t_end,
            }
            if w_def < acc_at_status - 0:
                # acceptances received after the STATUS snapshot may be counted here; recheck precisely below
                pass
            rounds.append(r)
            print(f"round {i}: killed {owner.label}, kill->listening {r['kill_to_listening_ms']} ms, "
                  f"kill->first accept {r['kill_to_first_accept_ms']} ms, replay {r['replay_took_ms']} ms, "
                  f"lease age at kill {r['lease_age_at_kill_ms']} ms, took name {r['kill_to_took_name_ms']} ms, "
                  f"load {load_kill}", file=sys.stderr)
            owner, standby = standby, owner
        time.sleep(2)
        probe.stop_creating.set()
        probe.join(15)
        probe.stopped.set()
        # final check: every acknowledged probe request is queued
        st = owner.status() or {}
        run["final"] = {"waiting_fill": waiting(st, "fill"), "waiting_default": waiting(st, "default"),
                        "probe_acceptances": probe.accepts_total(),
                        "probe_requests": len(probe.reqs),
                        "unanswered": sum(1 for r in probe.reqs.values() if r["accepted"] is None and not r["refused"])}
        run["drain"] = drain(owner, run["final"]["waiting_default"], probe, rounds, rel)
        if run["drain"]["missing"]:
            run["bugs"].append(f"acknowledged probe requests not delivered to a worker: {run['drain']['missing']}")
        if run["final"]["waiting_default"] < run["final"]["probe_acceptances"]:
            run["bugs"].append(f"queue default holds {run['final']['waiting_default']} jobs but the probe got "
                               f"{run['final']['probe_acceptances']} acceptances: acknowledged requests lost")
        if run["final"]["waiting_fill"] != args.jobs:
            run["bugs"].append(f"queue fill holds {run['final']['waiting_fill']} jobs at the end, not {args.jobs}")
        if run["final"]["unanswered"]:
            run["bugs"].append(f"{run['final']['unanswered']} probe requests never answered")
    finally:
        if probe is not None:
            probe.stop_creating.set()
            probe.stopped.set()
        for rt in (a, b):
            try:
                rt.stop()
            except Exception as e:  # noqa: BLE001
                print(f"stopping {rt.label}: {e}", file=sys.stderr)
        for rt in (a, b):
            for n in range(1, rt.starts + 1):
                src = os.path.join(args.work, f"router-{rt.label}-{n}.log")
                if os.path.exists(src):
                    subprocess.run(["cp", src, args.out], check=False)
    # per-round client figures
    ev = sorted(probe.events)
    for r in rounds:
        lo, k, hi = r.pop("_t_start"), r.pop("_t_kill"), r.pop("_t_end")
        reqs = [x for x in probe.reqs.values() if lo <= x["created"] < hi]
        lat = [(x["accepted"] - x["created"]) * 1000 for x in reqs if x["accepted"] is not None]
        r["probe_requests"] = len(reqs)
        r["probe_accepted"] = len(lat)
        r["probe_resends"] = sum(1 for e in ev if lo <= e[0] < hi and e[1] == "resend")
        r["probe_blocked"] = sum(1 for e in ev if lo <= e[0] < hi and e[1] == "blocked")
        r["probe_refusals"] = sum(1 for e in ev if lo <= e[0] < hi and e[1] == "refuse")
        r["probe_refusal_codes"] = sorted({e[3] for e in ev if lo <= e[0] < hi and e[1] == "refuse"})
        r["probe_duplicate_accepts"] = sum(1 for e in ev if lo <= e[0] < hi and e[1] == "accept-dup")
        r["probe_late_old_owner_accepts"] = sum(1 for e in ev if k < e[0] <= k + 0.1 and e[1] == "accept")
        r["probe_delayed_over_1s"] = sum(1 for x in lat if x > 1000)
        r["probe_lat_p50_ms"] = round(pct(lat, 50), 1) if lat else None
        r["probe_lat_p99_ms"] = round(pct(lat, 99), 1) if lat else None
        r["probe_lat_max_ms"] = round(max(lat), 1) if lat else None
        steady = [(x["accepted"] - x["created"]) * 1000 for x in reqs
                  if x["accepted"] is not None and x["created"] < k - 0.5]
        r["probe_lat_p50_before_kill_ms"] = round(pct(steady, 50), 1) if steady else None
    run["load_end"] = loadavg()
    run["uptime_end"] = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    run["rounds"] = len(rounds)
    with open(os.path.join(args.out, "rounds.json"), "w") as f:
        json.dump(rounds, f, indent=1)
    if rounds:
        with open(os.path.join(args.out, "rounds.csv"), "w", newline="") as f:
            keys = [k for k in rounds[0] if k != "probe_refusal_codes"]
            w = csv.writer(f)
            w.writerow(keys)
            for r in rounds:
                w.writerow([r[k] for k in keys])
    with open(os.path.join(args.out, "probe-events.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["t_s", "event", "request", "detail"])
        for e in ev:
            w.writerow([f"{rel(e[0]):.4f}", e[1], e[2], e[3]])
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump(run, f, indent=1)
    for bug in run["bugs"]:
        print("BUG: " + bug, file=sys.stderr)
    _ = wall0
    return 1 if run["bugs"] else 0


def p50max(xs):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None, None
    return statistics.median(xs), max(xs)


def fmt(x, nd=0):
    if x is None:
        return "–"
    if isinstance(x, float) and nd:
        return f"{x:,.{nd}f}"
    return f"{round(x):,}"


def svg_plot(rounds, lease_ms, path):
    goal = lease_ms + 2000
    w, h, ml, mr, mt, mb = 760, 360, 60, 20, 40, 50
    pw, ph = w - ml - mr, h - mt - mb
    vals = [r["kill_to_first_accept_ms"] or 0 for r in rounds] + [r["kill_to_listening_ms"] for r in rounds]
    top = max(max(vals), goal) * 1.1
    y = lambda v: mt + ph - v / top * ph  # noqa: E731
    n = len(rounds)
    gw = pw / max(n, 1)
    bw = gw * 0.32
    o = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
         f'<rect width="{w}" height="{h}" fill="white"/>',
         f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">kill -9 of the owner → standby listening / '
         f'first acceptance (lease {lease_ms / 1000:g} s)</text>']
    step = 2000
    v = 0
    while v <= top:
        o.append(f'<line x1="{ml}" x2="{w - mr}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#eee"/>')
        o.append(f'<text x="{ml - 5}" y="{y(v) + 4:.1f}" text-anchor="end">{v / 1000:g}</text>')
        v += step
    o.append(f'<text x="14" y="{mt + ph / 2}" transform="rotate(-90 14 {mt + ph / 2})" text-anchor="middle">'
             f'seconds after the kill</text>')
    for i, r in enumerate(rounds):
        x0 = ml + i * gw + gw * 0.16
        lv, fv = r["kill_to_listening_ms"], r["kill_to_first_accept_ms"] or 0
        o.append(f'<rect x="{x0:.1f}" y="{y(lv):.1f}" width="{bw:.1f}" height="{y(0) - y(lv):.1f}" fill="#4c78a8">'
                 f'<title>round {r["round"]}: kill → listening {lv} ms</title></rect>')
        o.append(f'<rect x="{x0 + bw:.1f}" y="{y(fv):.1f}" width="{bw:.1f}" height="{y(0) - y(fv):.1f}" '
                 f'fill="#f58518"><title>round {r["round"]}: kill → first acceptance {fv} ms</title></rect>')
        if r.get("kill_to_took_name_ms") is not None:
            tv = r["kill_to_took_name_ms"]
            o.append(f'<line x1="{x0 - 2:.1f}" x2="{x0 + 2 * bw + 2:.1f}" y1="{y(tv):.1f}" y2="{y(tv):.1f}" '
                     f'stroke="black" stroke-width="2"><title>kill → took the name {tv} ms</title></line>')
        o.append(f'<text x="{x0 + bw:.1f}" y="{y(0) + 14:.1f}" text-anchor="middle">{r["round"]}</text>')
    o.append(f'<text x="{ml + pw / 2}" y="{h - 22}" text-anchor="middle">round (killed router alternates)</text>')
    for v, c, lab in ((goal, "#d62728", f"goal: lease + 2 s = {goal / 1000:g} s"), (lease_ms, "#999", "lease")):
        o.append(f'<line x1="{ml}" x2="{w - mr}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="{c}" '
                 f'stroke-dasharray="6 4"/>')
        o.append(f'<text x="{w - mr - 4}" y="{y(v) - 4:.1f}" text-anchor="end" fill="{c}">{lab}</text>')
    lx = ml + 10
    for j, (c, lab) in enumerate((("#4c78a8", "kill → standby's frontend listening"),
                                  ("#f58518", "kill → first acceptance (probe)"))):
        o.append(f'<rect x="{lx + j * 260}" y="{h - 14}" width="10" height="10" fill="{c}"/>')
        o.append(f'<text x="{lx + j * 260 + 14}" y="{h - 5}">{lab}</text>')
    o.append(f'<line x1="{lx + 520}" x2="{lx + 534}" y1="{h - 9}" y2="{h - 9}" stroke="black" stroke-width="2"/>')
    o.append(f'<text x="{lx + 538}" y="{h - 5}">took the name (log)</text>')
    o.append("</svg>")
    open(path, "w").write("\n".join(o) + "\n")


def report_main(argv):
    ap = argparse.ArgumentParser(prog="failover_probe.py report")
    ap.add_argument("--out", required=True)
    ap.add_argument("--rev", default="unknown")
    ap.add_argument("--cores", default="?")
    ap.add_argument("--cpu", default="?")
    a = ap.parse_args(argv)
    rounds = json.load(open(os.path.join(a.out, "rounds.json")))
    run = json.load(open(os.path.join(a.out, "run.json")))
    rd = lambda n: open(os.path.join(a.out, n)).read().strip() if os.path.exists(os.path.join(a.out, n)) else "?"  # noqa: E731
    lease_ms = run["lease_s"] * 1000
    goal = lease_ms + 2000
    svg_plot(rounds, lease_ms, os.path.join(a.out, "failover.svg"))
    for r in rounds:
        k, s = r.get("kill_to_took_name_ms"), r.get("kill_to_serving_log_ms")
        r["took_to_serving_ms"] = None if k is None or s is None else s - k
        r["expiry_to_took_ms"] = None if k is None or r.get("lease_age_at_kill_ms") is None \
            else k - (lease_ms - r["lease_age_at_kill_ms"])
    rows = [
        ("kill → standby's frontend listening, ms", "kill_to_listening_ms"),
        ("**kill → first acceptance by the new owner (probe), ms**", "kill_to_first_accept_ms"),
        ("the old owner's lease age at the kill, ms (renewed every lease/3)", "lease_age_at_kill_ms"),
        ("kill → \"took the router name\" (new owner's log), ms", "kill_to_took_name_ms"),
        ("  of which the lease's expiry → took the name (the standby's poll and NATS' expiry), ms", "expiry_to_took_ms"),
        ("took the name → \"serving\" (fence, replay, bind; log), ms", "took_to_serving_ms"),
        ("replay took_ms (new owner's STATUS)", "replay_took_ms"),
        ("messages replayed", "replay_messages_read"),
        ("probe gap: last acceptance before the kill → first after, ms", "probe_gap_ms"),
        ("probe requests created in the round", "probe_requests"),
        ("probe re-sends (same msgid, unanswered 1 s)", "probe_resends"),
        ("probe sends blocked (no router connected)", "probe_blocked"),
        ("probe refusals (ERROR)", "probe_refusals"),
        ("probe duplicate acceptances", "probe_duplicate_accepts"),
        ("probe requests acknowledged > 1 s after creation", "probe_delayed_over_1s"),
        ("probe ack latency p50 in the round, ms", "probe_lat_p50_ms"),
        ("probe ack latency p99 in the round, ms", "probe_lat_p99_ms"),
        ("probe ack latency max in the round, ms", "probe_lat_max_ms"),
        ("probe ack latency p50 before the kill, ms", "probe_lat_p50_before_kill_ms"),
        ("new owner's CPU, kill → first acceptance, ms", "new_owner_cpu_ms_kill_to_first_accept"),
        ("3 nats-servers' CPU, kill → first acceptance, ms", "nats_cpu_ms_kill_to_first_accept"),
    ]
    fa = [r["kill_to_first_accept_ms"] for r in rounds if r["kill_to_first_accept_ms"] is not None]
    li = [r["kill_to_listening_ms"] for r in rounds]
    over = [r["round"] for r in rounds if (r["kill_to_first_accept_ms"] or 10 ** 9) > goal]
    L = []
    L.append(f"# Failover: kill -9 of the owner → first acceptance by the standby ({run['started_utc']}, rev {a.rev})")
    L.append("")
    L.append(f"`loadtest/failover.sh {len(rounds)}` (JOBS={run['jobs']}): {a.cores} cores ({a.cpu}), shared with "
             f"other work. Local 3-node NATS JetStream cluster (R3, `sync_interval: always`, "
             f"{rd('cluster.txt').splitlines()[1] if len(rd('cluster.txt').splitlines()) > 1 else '?'}), "
             f"`nats_lease` {run['lease_s']:g} s (renewed every {run['lease_s'] / 3:.2f} s; a standby reads the key every 250 ms), {run['jobs']:,} 64-byte jobs queued on queue `fill` (no worker) before the first kill; "
             f"a probe client sends an eMQP REQUEST every 20 ms to both routers (one DEALER, ZMQ_IMMEDIATE), "
             f"re-sending after 1 s unanswered. The kill comes 1 s + a uniform random 0-{run['lease_s'] / 3:.1f} s "
             f"into each round (a random phase of the lease renewal).")
    L.append("")
    L.append(f"* Machine load: start `{rd('uptime-start.txt')}`; end `{rd('uptime-end.txt')}`; the 1-minute "
             f"load average at each kill: {', '.join(r['load_at_kill'].split()[0] for r in rounds)}.")
    L.append(f"* Fill: {run.get('fill', {}).get('seconds', '?')} s for {run['jobs']:,} jobs (text SCHEDs over one "
             f"connection, until STATUS showed them all waiting).")
    p50f, maxf = p50max(fa)
    p50l, maxl = p50max(li)
    L.append(f"* **Goal ≤ lease + 2 s = {goal / 1000:g} s: kill → first acceptance p50 {fmt(p50f)} ms, max "
             f"{fmt(maxf)} ms over {len(fa)} take-overs; {'met in every round' if not over else f'missed in rounds {over}'}**"
             f" (kill → listening p50 {fmt(p50l)}, max {fmt(maxl)} ms).")
    bugs = run.get("bugs", [])
    fin = run.get("final", {})
    L.append(f"* Checks: after every take-over queue `fill` held {sorted({r['waiting_fill_after'] for r in rounds})} "
             f"jobs; at the end `default` held {fin.get('waiting_default', '?')} jobs against "
             f"{fin.get('probe_acceptances', '?')} acceptances the probe received "
             f"({fin.get('probe_requests', '?')} requests, {fin.get('unanswered', '?')} never answered). "
             + ("**Problems: " + "; ".join(bugs) + "**" if bugs else "No acknowledged probe request lost, none unanswered."))
    share = [r["kill_to_took_name_ms"] / r["kill_to_first_accept_ms"] for r in rounds
             if r.get("kill_to_took_name_ms") and r.get("kill_to_first_accept_ms")]
    oc = [r["new_owner_cpu_ms_kill_to_first_accept"] for r in rounds]
    nc = [r["nats_cpu_ms_kill_to_first_accept"] for r in rounds]
    if share:
        L.append(f"* What bounds it: the wait for the old owner's lease to expire, {min(share) * 100:.0f}-"
                 f"{max(share) * 100:.0f} % of kill → first acceptance (kill → \"took the router name\"), not a "
                 f"resource: between the kill and the first acceptance the new owner used {min(oc)}-{max(oc)} ms of "
                 f"CPU and the three nats-servers {min(nc)}-{max(nc)} ms together. kill → took the name ≈ lease − "
                 f"the lease's age at the kill + the key's expiry at the server and the standby's next read of it; "
                 f"then the fence, the replay and binding the ports. The lease age is the standby's STATUS read just "
                 f"before the kill (the key's time as the standby last read it): when the owner renewed between "
                 f"that read and the kill (an age near or over lease/3 = {lease_ms / 3:.0f} ms), the row's age is "
                 f"too old and its \"expiry → took\" too long by up to lease/3.")
    over_third = [r["round"] for r in rounds if (r.get("lease_age_at_kill_ms") or 0) > lease_ms / 3]
    if over_third:
        L.append(f"  Rounds with an age over lease/3 (a renewal was due or just landed): {over_third}.")
    dr = run.get("drain")
    if dr:
        L.append(f"* Drain at the end (a worker for `default` on the last owner): {dr['jobs_delivered']} jobs, "
                 f"{dr['distinct_msgids']} distinct msgids; acknowledged msgids missing: {dr['missing'] or 'none'}; "
                 f"delivered twice: {len(dr['twice'])}"
                 + ("".join(f"; request {d['request']} (round {d['round']}: first sent "
                            f"{d['first_sent_minus_kill_ms']:+} ms from the kill, re-sent {d['resends']}×, accepted "
                            f"{d['acceptance_minus_kill_ms']:+} ms)" for d in dr["twice"])) + ".")
    dup = fin.get("waiting_default", 0) - fin.get("probe_acceptances", 0)
    rs = sum(r["probe_resends"] for r in rounds)
    L.append(f"* What the client saw: while no router listened its sends waited in its socket (ZMQ_IMMEDIATE: "
             f"\"blocked\" below; {sum(r['probe_refusals'] for r in rounds)} refusals in all), then went to the new owner as soon as it connected; requests sent "
             f"to the owner just before the kill went unanswered and were re-sent after 1 s ({rs} re-sends in all). "
             + (f"Queue `default` held {dup} more jobs than the probe had acceptances: a re-sent request the killed "
                f"owner had stored but not answered is stored again (msgids are not deduplicated: at-least-once)."
                if dup > 0 else f"Queue `default` held exactly as many jobs as the probe had acceptances "
                f"(a re-sent request the dying owner had stored would be stored twice: at-least-once)."))
    L.append("")
    L.append("| figure (over the rounds) | p50 | max | min |")
    L.append("|---|---|---|---|")
    for lab, key in rows:
        xs = [r.get(key) for r in rounds if r.get(key) is not None]
        if not xs:
            L.append(f"| {lab} | – | – | – |")
            continue
        L.append(f"| {lab} | {fmt(statistics.median(xs))} | {fmt(max(xs))} | {fmt(min(xs))} |")
    L.append("")
    L.append("Per round (ms unless said):")
    L.append("")
    cols = [("round", "round"), ("killed", "killed"), ("lease age at kill", "lease_age_at_kill_ms"),
            ("→ took name", "kill_to_took_name_ms"), ("→ listening", "kill_to_listening_ms"),
            ("→ first accept", "kill_to_first_accept_ms"), ("replay", "replay_took_ms"),
            ("probe gap", "probe_gap_ms"), ("re-sends", "probe_resends"), ("blocked", "probe_blocked"),
            ("refusals", "probe_refusals"), ("lat p50/p99/max", None), ("owner CPU", "new_owner_cpu_ms_kill_to_first_accept"),
            ("nats CPU", "nats_cpu_ms_kill_to_first_accept"), ("load", "load_at_kill")]
    L.append("| " + " | ".join(c for c, _ in cols) + " |")
    L.append("|" + "---|" * len(cols))
    for r in rounds:
        cells = []
        for _, k in cols:
            if k is None:
                cells.append(f"{fmt(r['probe_lat_p50_ms'])} / {fmt(r['probe_lat_p99_ms'])} / {fmt(r['probe_lat_max_ms'])}")
            elif k == "load_at_kill":
                cells.append(r[k].split()[0])
            elif isinstance(r.get(k), str):
                cells.append(r[k])
            else:
                cells.append(fmt(r.get(k)))
        L.append("| " + " | ".join(cells) + " |")
    L.append("")
    L.append("![failover](failover.svg)")
    L.append("")
    L.append("Files: `rounds.csv`/`rounds.json` (every figure per round), `probe-events.csv` (every probe send, "
             "re-send, blocked send, acceptance with its latency, refusal; seconds since the run's start), "
             "`run.json`, `router-<A|B>-<start>.log`, `nats-n<i>.log`, `cluster.txt`.")
    open(os.path.join(a.out, "summary.md"), "w").write("\n".join(L) + "\n")
    print("\n".join(L))
    return 0


def main():
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "report"):
        print("usage: failover_probe.py run|report ... (see loadtest/failover.sh)", file=sys.stderr)
        return 2
    return run_main(sys.argv[2:]) if sys.argv[1] == "run" else report_main(sys.argv[2:])


if __name__ == "__main__":
    sys.exit(main())
