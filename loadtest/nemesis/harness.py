#!/usr/bin/env python3
"""The nemesis harness (issue 30): hosts in network namespaces, a load, a seeded schedule of faults.

    harness.py run --id ID --bin DIR --nats-server BIN --out DIR [--seed N]
                   [--schedule short|long] [--duration 30m] [--rate 100] [--lease 5s]
    harness.py cleanup --id ID      # remove what a run with this id left (after a SIGKILL)

Run by loadtest/nemesis.sh (docs/nemesis.md). Needs root (namespaces,
iptables) and a python with pyzmq (this one).

Topology: a bridge `<id>-br` in the root namespace holding 10.77.S.1 (the
control address: this harness reaches every host from it, and no fault
drops its packets, as Jepsen keeps its control node's ssh), and one
namespace per host `<id>-<host>`, each with one veth on the bridge and its
address 10.77.S.<n>: n1 n2 n3 (.11-.13, nats-server, one JetStream
cluster, R3 streams, `sync_interval: always`), r1 r2 (.21 .22, two
emq-routers of ONE router name, durability replicated; both started
`--standby`, r1 first, so r1 owns and r2 waits), cl (.31, the producer,
producer.py), wk (.32, emq-worker running a bash job that appends
`msgid time` to a file). The producer and the worker reach the routers
through a delay proxy (proxy.py) on their own host's loopback, so a
"delay" fault can slow their traffic (netem is not in this kernel). S is
random per run, names carry the run id: runs do not clash.

Every process is started with `ip netns exec <ns>`; its PID is kept and it
is killed by PID. Teardown (also on an exception, SIGINT or SIGTERM):
every process SIGCONT + SIGKILL, whatever is left in a namespace
(`ip netns pids`) SIGKILL, namespaces deleted (their veths and iptables
rules go with them), the bridge deleted, the temporary directory removed;
then it checks that no namespace, link or process of the run is left and
fails if one is.

Writes into OUT: run.json (seed, schedule, settings), faults.jsonl (each
fault: kind, target, start, heal, recovered, expectation), events.jsonl
(every process start/kill/pause/exit, every iptables change),
roles.jsonl (each router's STATUS role every 0.5 s), producer-*.jsonl
(the producers' histories), executions.log (the worker's: `msgid time`),
the routers', workers' and servers' logs. Then check.py writes the verdict.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid

import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
HOSTS = {"n1": 11, "n2": 12, "n3": 13, "r1": 21, "r2": 22, "cl": 31, "wk": 32}
NATS = ["n1", "n2", "n3"]
ROUTERS = ["r1", "r2"]
FRONTEND, BACKEND, ADMIN = 47291, 47290, 47292
# proxy ports on the client hosts' loopback: router -> local port
PROXY_FRONT = {"r1": 17291, "r2": 17292}
PROXY_BACK = {"r1": 17290, "r2": 17289}
ROUTER_NAME = "nemesis"
QUEUE = "nemesis"

# fault kind -> what is expected (docs/nemesis.md has the same table)
EXPECT = {
    "kill-owner": "kill -9 of the owning router, restarted as standby: the standby takes the name after the lease; "
                  "unanswered REQUESTs re-sent (deduplicated); jobs in flight may run twice; 0 acked lost",
    "kill-standby": "kill -9 of the standby, restarted: no effect on acknowledgements",
    "kill-nats": "kill -9 of one nats-server, restarted: R3 goes on with 2 of 3; acks may stall for an election",
    "kill-worker": "kill -9 of emq-worker, restarted: jobs running at the kill are run again (duplicates); none lost",
    "kill-producer": "kill -9 of the producer, a new one started: its unanswered REQUESTs stay unacknowledged "
                     "(not counted as lost); the new one goes on",
    "pause-owner": "SIGSTOP/SIGCONT of the owner: past the lease the standby takes over and the woken owner is "
                   "fenced (0 acks after its fence; restarted as standby); shorter, acks stall and resume",
    "pause-nats": "SIGSTOP/SIGCONT of one nats-server: like its loss, then it catches up",
    "pause-worker": "SIGSTOP/SIGCONT of emq-worker: past its heartbeat its jobs are requeued (duplicates); none lost",
    "partition-host": "one host cut off from every other (DROP both ways): as its death without FIN (heartbeats, "
                      "3 s); the owner cut off loses the name after the lease and is fenced after the heal",
    "owner-from-nats": "the owner and one nats-server cut off from the two other servers (clients still reach "
                       "the owner): it stores and acks nothing; the standby takes over after the lease; "
                       "the old owner is fenced at the heal",
    "client-from-owner": "the producer host cut off from the owner only: no acks until the heal (the standby "
                         "does not listen); nothing lost",
    "asymmetric": "packets from one host to another dropped, the other way open: stalls at most, nothing lost",
    "loss": "5 % of one host's packets dropped both ways (iptables statistic): slower, nothing lost",
    "delay": "the producer's or the worker's traffic to the routers delayed 100-400 ms by the proxy: "
             "slower, nothing lost",
}
KINDS = list(EXPECT)


def now():
    return time.time()


def sh(*cmd, check=True):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({r.returncode}): {r.stdout.strip()}")
    return r.stdout


def parse_period(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)?", s.strip())
    if not m:
        raise argparse.ArgumentTypeError(f"{s!r}: a period like 30s, 30m, 1h")
    v = float(m.group(1))
    return v * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, None: 1}[m.group(2)]


class Journal:
    """An append-only JSONL file, thread-safe."""

    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def write(self, **kw):
        kw.setdefault("t", now())
        with self.lock:
            self.f.write(json.dumps(kw, separators=(",", ":")) + "\n")


class Net:
    def __init__(self, run_id, subnet):
        self.id = run_id
        self.sub = subnet
        self.bridge = f"{run_id}-br"
        self.made_ns = []
        self.ruled = set()

    def ip(self, h):
        return f"10.77.{self.sub}.{HOSTS[h]}"

    @property
    def ctrl(self):
        return f"10.77.{self.sub}.1"

    def ns(self, h):
        return f"{self.id}-{h}"

    def create(self):
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.ctrl}/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        for h in HOSTS:
            ns = self.ns(h)
            sh("ip", "netns", "add", ns)
            self.made_ns.append(ns)
            outer, inner = f"{self.id}-{h}", f"{self.id}-{h}i"
            sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
            sh("ip", "link", "set", inner, "netns", ns)
            sh("ip", "link", "set", outer, "master", self.bridge, "up")
            sh("ip", "-n", ns, "link", "set", inner, "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{self.ip(h)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")

    def ipt(self, h, *rule):
        sh("ip", "netns", "exec", self.ns(h), "iptables", *rule)
        self.ruled.add(h)

    def heal(self):
        for h in sorted(self.ruled):
            sh("ip", "netns", "exec", self.ns(h), "iptables", "-F", "INPUT", check=False)
            sh("ip", "netns", "exec", self.ns(h), "iptables", "-F", "OUTPUT", check=False)
        self.ruled.clear()

    def isolate(self, h):
        """DROP everything in and out of h but loopback and the control address."""
        self.ipt(h, "-A", "INPUT", "!", "-i", "lo", "!", "-s", self.ctrl, "-j", "DROP")
        self.ipt(h, "-A", "OUTPUT", "!", "-o", "lo", "!", "-d", self.ctrl, "-j", "DROP")

    def cut(self, a, b):
        """No packet between a and b, either way (rules in a's namespace)."""
        self.ipt(a, "-A", "INPUT", "-s", self.ip(b), "-j", "DROP")
        self.ipt(a, "-A", "OUTPUT", "-d", self.ip(b), "-j", "DROP")

    def one_way(self, src, dst):
        """Packets from src to dst dropped (at dst); dst to src pass."""
        self.ipt(dst, "-A", "INPUT", "-s", self.ip(src), "-j", "DROP")

    def loss(self, h, p):
        for chain, iface in (("INPUT", "-i"), ("OUTPUT", "-o")):
            self.ipt(h, "-A", chain, "!", iface, "lo", "-m", "statistic", "--mode", "random", "--probability", str(p),
                     "-j", "DROP")


def free_subnet():
    """A random S in 2..251 whose 10.77.S.0/24 no route of the root namespace uses."""
    routes = sh("ip", "-4", "route", "show", check=False)
    for _ in range(100):
        s = int.from_bytes(os.urandom(1), "big") % 250 + 2
        if f"10.77.{s}." not in routes:
            return s
    raise RuntimeError("no free 10.77.S.0/24 subnet found")


def cleanup_id(run_id, extra_pids=()):
    """Kills whatever runs in the run's namespaces, deletes them, its links. Returns what was left after."""
    for pid in extra_pids:
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except OSError:
                pass
    names = [n.split()[0] for n in sh("ip", "netns", "list", check=False).splitlines() if n.startswith(run_id + "-")]
    for ns in names:
        for p in sh("ip", "netns", "pids", ns, check=False).split():
            if p.isdigit():
                for sig in (signal.SIGCONT, signal.SIGKILL):
                    try:
                        os.kill(int(p), sig)
                    except OSError:
                        pass
    time.sleep(0.2)
    for ns in names:
        sh("ip", "netns", "del", ns, check=False)
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        m = re.match(r"\d+: ([^:@]+)", line)
        if m and m.group(1).startswith(run_id + "-"):
            sh("ip", "link", "del", m.group(1), check=False)
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"emq-nemesis-{run_id}-*")):
        shutil.rmtree(d, ignore_errors=True)
    return leftovers(run_id, extra_pids)


def leftovers(run_id, pids=()):
    left = []
    for n in sh("ip", "netns", "list", check=False).splitlines():
        if n.startswith(run_id + "-"):
            left.append(f"namespace {n.split()[0]}")
    for line in sh("ip", "-o", "link", "show", check=False).splitlines():
        m = re.match(r"\d+: ([^:@]+)", line)
        if m and m.group(1).startswith(run_id + "-"):
            left.append(f"link {m.group(1)}")
    for d in glob.glob(os.path.join(tempfile.gettempdir(), f"emq-nemesis-{run_id}-*")):
        left.append(f"directory {d}")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            if state != "Z":
                left.append(f"process {pid}")
        except OSError:
            pass
    return left


class Proc:
    def __init__(self, h, name, cmd, env=None):
        self.h, self.name, self.cmd, self.env = h, name, cmd, env
        self.p = None
        self.starts = 0
        self.logs = []
        self.paused = False

    def alive(self):
        return self.p is not None and self.p.poll() is None


class Harness:
    def __init__(self, a):
        self.a = a
        self.out = a.out
        os.makedirs(self.out, exist_ok=True)
        self.work = tempfile.mkdtemp(prefix=f"emq-nemesis-{a.id}-")
        self.rng = random.Random(a.seed)
        self.net = Net(a.id, free_subnet())
        self.events = Journal(os.path.join(self.out, "events.jsonl"))
        self.faults = Journal(os.path.join(self.out, "faults.jsonl"))
        self.roles_j = Journal(os.path.join(self.out, "roles.jsonl"))
        self.procs = {}
        self.all_pids = []
        self.roles = {}
        self.stop_monitor = threading.Event()
        self.producer_n = 0
        self.ack_seen = {}  # producer log path -> (offset, last ack time)
        self.zctx = zmq.Context()

    # --- processes -------------------------------------------------------
    def start(self, pr, note=""):
        pr.starts += 1
        log = os.path.join(self.work, f"{pr.name}-{pr.starts}.log")
        pr.logs.append(log)
        env = dict(os.environ, NO_COLOR="1", **(pr.env or {}))
        pr.p = subprocess.Popen(["ip", "netns", "exec", self.net.ns(pr.h)] + pr.cmd(), stdout=open(log, "w"),
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        pr.paused = False
        if pr.name in ROUTERS:
            self.roles[pr.name] = "starting"
        self.all_pids.append(pr.p.pid)
        self.events.write(e="start", proc=pr.name, host=pr.h, pid=pr.p.pid, log=os.path.basename(log), note=note)

    def signal(self, pr, sig, why):
        if pr.p is None:
            return
        try:
            os.kill(pr.p.pid, sig)
        except OSError:
            pass
        if sig == signal.SIGSTOP:
            pr.paused = True
        if sig == signal.SIGCONT:
            pr.paused = False
        self.events.write(e=signal.Signals(sig).name, proc=pr.name, pid=pr.p.pid, why=why)
        if sig == signal.SIGKILL:
            try:
                pr.p.wait(10)
            except subprocess.TimeoutExpired:
                pass

    def kill9(self, pr, why):
        self.signal(pr, signal.SIGCONT, why)
        self.signal(pr, signal.SIGKILL, why)

    # --- cluster ----------------------------------------------------------
    def nats_conf(self, h):
        ip = self.net.ip
        store = os.path.join(self.work, f"nats-{h}")
        os.makedirs(store, exist_ok=True)
        routes = ", ".join(f"nats-route://{ip(n)}:6222" for n in NATS)
        conf = os.path.join(self.work, f"{h}.conf")
        with open(conf, "w") as f:
            f.write(f"""server_name: {h}
listen: {ip(h)}:4222
http: {ip(h)}:8222
jetstream {{
  store_dir: "{store}"
  max_memory_store: 256MB
  max_file_store: 4GB
  sync_interval: always
}}
cluster {{
  name: nemesis
  listen: {ip(h)}:6222
  routes: [ {routes} ]
}}
""")
        return conf

    def router_cmd(self, h):
        ip = self.net.ip
        data = os.path.join(self.work, f"data-{h}")

        def cmd():
            shutil.rmtree(data, ignore_errors=True)
            os.makedirs(data)
            return [os.path.join(self.a.bin, "emq-router"), "--durability", "replicated",
                    "--nats-urls", ",".join(f"nats://{ip(n)}:4222" for n in NATS),
                    "--nats-stream-prefix", f"nm{self.a.id.replace('-', '')}", "--router-name", ROUTER_NAME,
                    "--nats-lease", self.a.lease, "--frontend", f"tcp://{ip(h)}:{FRONTEND}",
                    "--backend", f"tcp://{ip(h)}:{BACKEND}", "--admin", f"tcp://{ip(h)}:{ADMIN}",
                    "--text", "off", "--metrics", "off", "--allow-insecure-remote", "--latency-interval", "0s",
                    "--data-dir", data, "--log", "info", "--standby"]
        return cmd

    def producer_cmd(self):
        def cmd():
            self.producer_n += 1
            log = os.path.join(self.out, f"producer-{self.producer_n}.jsonl")
            self.ack_seen[log] = (0, 0.0)
            return [sys.executable, os.path.join(HERE, "producer.py"), "--rate", str(self.a.rate), "--queue", QUEUE,
                    "--log", log, "--tag", f"p{self.producer_n}", "--stop-file", os.path.join(self.work, "stop")] + \
                [f"--router={r}=tcp://127.0.0.1:{PROXY_FRONT[r]}" for r in ROUTERS]
        return cmd

    def build(self):
        ip = self.net.ip
        P = self.procs
        for n in NATS:
            conf = self.nats_conf(n)
            P[n] = Proc(n, n, lambda conf=conf: [self.a.nats_server, "-c", conf])
        for r in ROUTERS:
            P[r] = Proc(r, r, self.router_cmd(r))
        for h, ports in (("cl", PROXY_FRONT), ("wk", PROXY_BACK)):
            up = FRONTEND if h == "cl" else BACKEND
            specs = [f"--listen=127.0.0.1:{ports[r]}={ip(r)}:{up}" for r in ROUTERS]
            dfile = os.path.join(self.work, f"delay-{h}")
            P[f"proxy-{h}"] = Proc(h, f"proxy-{h}", lambda specs=specs, dfile=dfile: [
                sys.executable, os.path.join(HERE, "proxy.py"), "--delay-file", dfile] + specs)
        execlog = os.path.join(self.out, "executions.log")
        job = 'printf "%s %s\\n" "$EMQ_MSGID" "$EPOCHREALTIME" >> "$NEMESIS_EXEC_LOG"'
        P["worker"] = Proc("wk", "worker", lambda: [
            os.path.join(self.a.bin, "emq-worker"), "-B", ",".join(f"tcp://127.0.0.1:{PROXY_BACK[r]}" for r in ROUTERS),
            # QUEUE only: a REQUEST reaching a new owner before the worker registered there keeps
            # its queue (queue_learn_grace, docs/emqp.md "Unknown queues"); it went to `default` before
            "-Q", QUEUE, "-J", "8", "--timeout", "30s", "--stats-interval", "10s", "--", "/bin/bash", "-c", job],
            env={"NEMESIS_EXEC_LOG": execlog, "LC_ALL": "C"})
        P["producer"] = Proc("cl", "producer", self.producer_cmd())

    def http(self, h, path):
        try:
            with urllib.request.urlopen(f"http://{self.net.ip(h)}:8222{path}", timeout=2) as r:
                return r.read()
        except OSError:
            return None

    def nats_ready(self):
        leaders = set()
        for n in NATS:
            if self.http(n, "/healthz") is None:
                return False
            body = self.http(n, "/jsz")
            try:
                leaders.add(json.loads(body or b"{}").get("meta_cluster", {}).get("leader", ""))
            except ValueError:
                return False
        return len(leaders) == 1 and "" not in leaders

    def wait(self, pred, secs, what):
        end = time.monotonic() + secs
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.2)
        raise RuntimeError(f"timed out after {secs} s waiting for {what}")

    def status(self, r, timeout_ms=400):
        s = self.zctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(f"tcp://{self.net.ip(r)}:{ADMIN}")
        try:
            s.send_multipart([b"", b"eMQP/1.0", b"STATUS", b"admin:" + uuid.uuid4().hex.encode()], zmq.NOBLOCK)
            if not s.poll(timeout_ms):
                return None
            fr = s.recv_multipart()
            if len(fr) > 4 and fr[2] == b"REPLY":
                return json.loads(fr[4])
            return None
        except (zmq.ZMQError, ValueError):
            return None
        finally:
            s.close()

    @staticmethod
    def role_of(st):
        if not st:
            return None
        emq = st.get("emq", {})
        own = emq.get("wal", {}).get("nats", {}).get("ownership", {})
        return own.get("role") or emq.get("wal", {}).get("nats", {}).get("role") or emq.get("role")

    def monitor(self):
        while not self.stop_monitor.is_set():
            for r in ROUTERS:
                pr = self.procs[r]
                pid = pr.p.pid if pr.p else None
                if pr.paused or not pr.alive():
                    role, epoch = ("paused" if pr.paused else "down"), None
                else:
                    st = self.status(r)
                    role = self.role_of(st) or "unanswered"
                    epoch = (st or {}).get("emq", {}).get("wal", {}).get("nats", {}).get("ownership", {}).get("epoch")
                if pid != (pr.p.pid if pr.p else None):
                    continue  # restarted meanwhile: the answer was the old process's
                if self.roles.get(r) != role:
                    self.roles_j.write(router=r, role=role, epoch=epoch, pid=pr.p.pid if pr.p else None)
                self.roles[r] = role
            self.stop_monitor.wait(0.5)

    def settled(self):
        roles = [self.roles.get(r) for r in ROUTERS]
        return roles.count("owner") == 1 and "fenced" not in roles and "starting" not in roles

    def dump_status(self, tag):
        for r in ROUTERS:
            st = self.status(r, 2000) if self.procs[r].alive() else None
            with open(os.path.join(self.out, f"status-{tag}-{r}.json"), "w") as f:
                json.dump(st, f, indent=1)

    def owner(self):
        owners = [r for r in ROUTERS if self.roles.get(r) == "owner"]
        return owners[0] if owners else None

    def standby(self):
        o = self.owner()
        return [r for r in ROUTERS if r != o][0] if o else "r2"

    def last_ack(self):
        """Time of the newest acknowledgement in any producer history (read incrementally)."""
        best = 0.0
        for path, (off, last) in list(self.ack_seen.items()):
            try:
                with open(path) as f:
                    f.seek(off)
                    while True:
                        line = f.readline()
                        if not line.endswith("\n"):
                            break
                        off += len(line)
                        if '"e":"ack"' in line:
                            try:
                                last = max(last, json.loads(line)["t"])
                            except (ValueError, KeyError):
                                pass
            except OSError:
                pass
            self.ack_seen[path] = (off, last)
            best = max(best, last)
        return best

    def start_all(self):
        P = self.procs
        for n in NATS:
            self.start(P[n])
        self.wait(self.nats_ready, 60, "the NATS cluster (healthy, one meta leader)")
        self.start(P["r1"])
        self.wait(lambda: self.role_of(self.status("r1", 1000)) == "owner", 60, "r1 to own the router name")
        self.start(P["r2"])
        self.wait(lambda: self.role_of(self.status("r2", 1000)) == "standby", 60, "r2 to be the standby")
        threading.Thread(target=self.monitor, daemon=True).start()
        for k in ("proxy-cl", "proxy-wk", "worker", "producer"):
            self.start(P[k])
        t0 = now()
        self.wait(lambda: self.last_ack() > t0, 60, "the first acknowledgement")

    def ensure_up(self):
        """Restarts what died on its own, and a fenced router (as standby)."""
        for name, pr in self.procs.items():
            if pr.paused:
                self.signal(pr, signal.SIGCONT, "ensure_up")
            if not pr.alive():
                rc = pr.p.returncode if pr.p else None
                self.events.write(e="exited", proc=name, rc=rc)
                self.start(pr, note="found dead")
        for r in ROUTERS:
            if self.roles.get(r) == "fenced":
                self.kill9(self.procs[r], "fenced: restart as standby")
                self.start(self.procs[r], note="was fenced")

    # --- the nemesis ------------------------------------------------------
    def schedule(self):
        rng = self.rng
        short = self.a.schedule == "short"
        kinds = []
        if short:
            kinds = KINDS[:]
            rng.shuffle(kinds)
        else:
            # every kind at least three times, shuffled in rounds, until the duration is filled
            while len(kinds) < 20 * len(KINDS):
                r = KINDS[:]
                rng.shuffle(r)
                kinds += r
        sched = []
        for k in kinds:
            d = round(rng.uniform(4, 8) if short else rng.uniform(5, 20), 1)
            f = {"kind": k, "dur": d}
            if k == "kill-nats" or k == "pause-nats":
                f["target"] = rng.choice(NATS)
            elif k == "partition-host":
                f["target"] = rng.choice(["owner", "standby", "cl", "wk"] + NATS)
            elif k == "owner-from-nats":
                # with one server (a minority: the standby may be on it too and then cannot take
                # over) or none (cut from all three); the short schedule always cuts from all
                f["target"] = "owner"
                f["with"] = None if short else rng.choice(NATS + [None])
                f["dur"] = round(rng.uniform(9, 14) if short else rng.uniform(10, 25), 1)
            elif k == "asymmetric":
                a, b = rng.sample(["owner", "cl", "wk"] + NATS, 2)
                f["target"], f["to"] = a, b
            elif k == "loss":
                f["target"] = rng.choice(["owner", "cl", "wk"] + NATS)
                f["p"] = 0.05
            elif k == "delay":
                f["target"] = rng.choice(["cl", "wk"])
                f["ms"] = rng.choice([100, 200, 300, 400])
            elif k == "pause-owner":
                f["target"] = "owner"
                f["dur"] = round(rng.choice([rng.uniform(1, 3), rng.uniform(8, 12)]) if short else rng.uniform(1, 20), 1)
            elif k.startswith("kill-"):
                f["target"] = k[5:]
                f["dur"] = round(rng.uniform(1, 4), 1)
            elif k == "pause-worker":
                f["target"] = "worker"
            sched.append(f)
        return sched

    def host_of(self, sym):
        if sym == "owner":
            return self.owner() or "r1"
        if sym == "standby":
            return self.standby()
        return sym

    def apply(self, f):
        """Applies fault f; returns the heal function."""
        k = f["kind"]
        P = self.procs
        if k.startswith("kill-"):
            name = {"owner": self.owner() or "r1", "standby": self.standby(), "nats": f.get("target"),
                    "worker": "worker", "producer": "producer"}[k[5:]]
            if k == "kill-nats":
                name = f["target"]
            f["resolved"] = name
            self.kill9(P[name], k)
            return lambda: self.start(P[name], note=k)
        if k.startswith("pause-"):
            name = self.host_of(f["target"])
            f["resolved"] = name
            self.signal(P[name], signal.SIGSTOP, k)
            return lambda: self.signal(P[name], signal.SIGCONT, k)
        if k == "partition-host":
            h = self.host_of(f["target"])
            f["resolved"] = h
            self.net.isolate(h)
        elif k == "owner-from-nats":
            o = self.host_of("owner")
            others = [n for n in NATS if n != f["with"]]
            f["resolved"] = f"{o}{'+' + f['with'] if f['with'] else ''} | {'+'.join(others)}"
            for n in others:
                self.net.cut(o, n)
                if f["with"]:
                    self.net.cut(f["with"], n)
        elif k == "client-from-owner":
            o = self.host_of("owner")
            f["resolved"] = f"cl | {o}"
            self.net.cut("cl", o)
        elif k == "asymmetric":
            a, b = self.host_of(f["target"]), self.host_of(f["to"])
            f["resolved"] = f"{a} -> {b} dropped"
            self.net.one_way(a, b)
        elif k == "loss":
            h = self.host_of(f["target"])
            f["resolved"] = h
            self.net.loss(h, f["p"])
        elif k == "delay":
            f["resolved"] = f"proxy-{f['target']} {f['ms']} ms"
            with open(os.path.join(self.work, f"delay-{f['target']}"), "w") as fh:
                fh.write(str(f["ms"]))
            return lambda: open(os.path.join(self.work, f"delay-{f['target']}"), "w").close()
        self.events.write(e="iptables", fault=k, rules=f.get("resolved"))
        return self.net.heal

    def run_fault(self, i, f):
        start = now()
        heal = self.apply(f)
        self.events.write(e="fault", i=i, kind=f["kind"], resolved=f.get("resolved"))
        print(f"nemesis: [{i}] {f['kind']} {f.get('resolved', '')} for {f['dur']} s", file=sys.stderr, flush=True)
        time.sleep(f["dur"])
        heal()
        healed = now()
        self.events.write(e="heal", i=i, kind=f["kind"])
        # recovery: a fenced router restarted, everything running, an acknowledgement after the heal
        recovered = None
        end = time.monotonic() + self.a.recover_timeout
        while time.monotonic() < end:
            self.ensure_up()
            if recovered is None and self.last_ack() > healed:
                recovered = now()
            # recovered, and the routers settled: one owner, none fenced (restarted as standby, as an
            # operator would; a fenced router unbinds its eMQP ports itself: docs/nemesis.md)
            if recovered is not None and self.settled():
                break
            time.sleep(0.25)
        self.faults.write(i=i, kind=f["kind"], target=f.get("target"), resolved=f.get("resolved"), start=start,
                          heal=healed, recovered=recovered, dur=f["dur"],
                          params={k: v for k, v in f.items() if k in ("p", "ms", "with", "to")},
                          expect=EXPECT[f["kind"]])
        time.sleep(self.a.gap)

    def drain(self):
        """Stops the producer creating jobs; waits until every acknowledged job has run (bounded)."""
        open(os.path.join(self.work, "stop"), "w").close()
        pr = self.procs["producer"]
        try:
            pr.p.wait(60)
        except subprocess.TimeoutExpired:
            self.events.write(e="note", what="producer did not finish its drain in 60 s")
        acked = set()
        for path in self.ack_seen:
            try:
                for line in open(path):
                    if '"e":"ack"' in line:
                        acked.add(json.loads(line)["m"])
            except (OSError, ValueError):
                pass
        execlog = os.path.join(self.out, "executions.log")
        end = time.monotonic() + self.a.drain_timeout
        missing = acked
        while time.monotonic() < end:
            self.ensure_up()
            try:
                done = {ln.split()[0] for ln in open(execlog) if ln.strip()}
            except OSError:
                done = set()
            missing = acked - done
            if not missing:
                break
            time.sleep(1)
        self.events.write(e="drained", acked=len(acked), missing=len(missing))
        self.dump_status("end")

    def teardown(self):
        self.stop_monitor.set()
        for name, pr in self.procs.items():
            if pr.alive():
                self.signal(pr, signal.SIGCONT, "teardown")
                pr.p.send_signal(signal.SIGKILL)
                try:
                    pr.p.wait(10)
                except subprocess.TimeoutExpired:
                    pass
        for ls in self.procs.values():
            for log in ls.logs:
                try:
                    shutil.copy(log, self.out)
                except OSError:
                    pass
        shutil.rmtree(self.work, ignore_errors=True)
        left = cleanup_id(self.a.id, self.all_pids)
        self.zctx.term()
        return left

    def main(self):
        sched = self.schedule()
        t_end = time.monotonic() + self.a.duration if self.a.schedule == "long" else None
        run = {"id": self.a.id, "seed": self.a.seed, "schedule_kind": self.a.schedule, "duration_s": self.a.duration,
               "rate": self.a.rate, "lease": self.a.lease, "subnet": f"10.77.{self.net.sub}.0/24",
               "started": now(), "schedule": sched if t_end is None else sched[:200],
               "replay": f"loadtest/nemesis.sh --seed {self.a.seed} --schedule {self.a.schedule}"
                         + (f" --duration {int(self.a.duration)}s" if t_end else "")}
        print(f"nemesis: seed {self.a.seed}, schedule {self.a.schedule}, run id {self.a.id}, "
              f"subnet {run['subnet']}", file=sys.stderr, flush=True)
        with open(os.path.join(self.out, "run.json"), "w") as f:
            json.dump(run, f, indent=1)
        self.net.create()
        self.events.write(e="net", subnet=run["subnet"], hosts={h: self.net.ip(h) for h in HOSTS})
        self.build()
        self.start_all()
        time.sleep(self.a.gap)
        n = 0
        for i, f in enumerate(sched):
            if t_end is not None and time.monotonic() >= t_end:
                break
            self.run_fault(i, f)
            n += 1
        self.events.write(e="faults_done", n=n)
        self.drain()
        run["faults_run"] = n
        run["ended"] = now()
        with open(os.path.join(self.out, "run.json"), "w") as f:
            json.dump(run, f, indent=1)


def main():
    ap = argparse.ArgumentParser(prog="harness.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--id", required=True)
    r.add_argument("--bin", required=True)
    r.add_argument("--nats-server", required=True)
    r.add_argument("--out", required=True)
    r.add_argument("--seed", type=int, default=None)
    r.add_argument("--schedule", choices=["short", "long"], default="short")
    r.add_argument("--duration", type=parse_period, default=parse_period("30m"))
    r.add_argument("--rate", type=float, default=100.0)
    r.add_argument("--lease", default="5s")
    r.add_argument("--gap", type=float, default=2.0)
    r.add_argument("--recover-timeout", type=float, default=45.0)
    r.add_argument("--drain-timeout", type=float, default=90.0)
    c = sub.add_parser("cleanup")
    c.add_argument("--id", required=True)
    a = ap.parse_args()
    if a.cmd == "cleanup":
        left = cleanup_id(a.id)
        if left:
            print("nemesis: left behind: " + ", ".join(left), file=sys.stderr)
            sys.exit(1)
        return
    if a.seed is None:
        a.seed = int.from_bytes(os.urandom(4), "big")
    if not re.fullmatch(r"[a-z0-9]{2,8}", a.id):
        sys.exit("--id: 2 to 8 lowercase letters or digits (it prefixes interface names)")

    def stop(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    h = Harness(a)
    rc = 0
    try:
        h.main()
    except BaseException as e:  # noqa: BLE001 - any failure or signal: tear down, report
        print(f"nemesis: run failed: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
        h.events.write(e="run_failed", error=f"{type(e).__name__}: {e}")
        rc = 2
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        left = h.teardown()
        with open(os.path.join(a.out, "leftovers.json"), "w") as f:
            json.dump(left, f)
        if left:
            print("nemesis: LEFT BEHIND after teardown: " + ", ".join(left), file=sys.stderr, flush=True)
            rc = 3
        else:
            print("nemesis: teardown clean (no namespace, link, process or directory of the run left)",
                  file=sys.stderr, flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
