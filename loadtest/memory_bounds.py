#!/usr/bin/env python3
"""The router's memory and descriptor bounds (issue 10), measured on a fresh
emq-router (release build) per figure, each on free loopback ports with a
temporary data directory, stopped by PID:

1. Reclaimed queue names: N one-job names over text (`SCHED x@qI`, `ASK qI`,
   `ACK`), resident memory (VmRSS) before, right after and once STATUS
   shows every name reclaimed (`--queue-idle-grace 1s`, `--text-ask-grace
   1s`, durability "memory": names, not the log).
2. Peak resident memory (VmHWM) against the job bytes admitted, with
   `--max-memory-bytes LIMIT` and a producer that offers 1.5 x LIMIT
   (`emq-bench fill --refusals-ok`: the rest is refused with QUEUE_FULL):
   64 KiB jobs queued over eMQP, the same held in flight by a worker that
   READYs 10,000 times and never reads, 64 KiB jobs over text, and 8 MiB
   eMQP jobs. Default durability ("sync").
3. Descriptors per text connection: 1,000 connections held open.

usage: loadtest/memory_bounds.py [NAMES=100000] [LIMIT_MIB=256]
Prints a report; loadtest/results/memory-bounds-<rev>.txt keeps it."""
import json, os, resource, shutil, socket, subprocess, sys, tempfile, threading, time

NAMES = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
LIMIT = (int(sys.argv[2]) if len(sys.argv) > 2 else 256) * 1024 * 1024
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = f"{ROOT}/target/release"
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def status_kb(pid, key):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {key} in /proc/{pid}/status")


def fds(pid):
    return len(os.listdir(f"/proc/{pid}/fd"))


class Router:
    """An emq-router on fresh ports and a fresh data directory."""

    def __init__(self, *args):
        self.data = tempfile.mkdtemp(prefix="emq-memory-bounds-")
        self.fe, self.be, self.ad, self.tx = (free_port() for _ in range(4))
        self.text = f"127.0.0.1:{self.tx}"
        self.admin = f"tcp://127.0.0.1:{self.ad}"
        self.proc = subprocess.Popen([
            f"{BIN}/emq-router", "--frontend", f"tcp://127.0.0.1:{self.fe}", "--backend",
            f"tcp://127.0.0.1:{self.be}", "--admin", self.admin, "--text", self.text,
            "--metrics", "off", "--data-dir", self.data, "--log", "warn", *args])
        self.pid = self.proc.pid
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", self.tx), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)

    def status(self):
        out = subprocess.run([f"{BIN}/emq-cli", "--admin", self.admin, "status", "--json"],
                             capture_output=True, check=True, timeout=30).stdout
        return json.loads(out)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=60)
        shutil.rmtree(self.data, ignore_errors=True)


def one_job_per_name(r, prefix, n):
    """SCHED / ASK / ACK for n names over one pipelined connection."""
    c = socket.create_connection(("127.0.0.1", r.tx), timeout=60)

    def send():
        buf = []
        for i in range(n):
            buf.append(f"SCHED x@{prefix}{i}\nASK {prefix}{i}\nACK\n")
            if len(buf) >= 2000:
                c.sendall("".join(buf).encode()); buf = []
        c.sendall("".join(buf).encode())

    t = threading.Thread(target=send); t.start()
    f = c.makefile("rb")
    for i in range(n):
        line = f.readline()
        assert line == b"WANT? x\n", (i, line)
    t.join(); c.sendall(b"END\n"); c.close()


def wait_reclaimed(r):
    time.sleep(1.6)  # the grace (1 s) and a sweep (0.5 s)
    for _ in range(120):
        if r.status()["emq"]["queues"] == 0:
            return
        time.sleep(0.5)
    raise RuntimeError("names not reclaimed within 60 s")


def names():
    r = Router("--durability", "memory", "--queue-idle-grace", "1s", "--text-ask-grace", "1s")
    try:
        one_job_per_name(r, "warm", 2000)
        wait_reclaimed(r)
        before = status_kb(r.pid, "VmRSS")
        t0 = time.time()
        one_job_per_name(r, "q", NAMES)
        took = time.time() - t0
        held = status_kb(r.pid, "VmRSS")
        wait_reclaimed(r)
        time.sleep(2)  # the heap is trimmed after a large sweep
        after = status_kb(r.pid, "VmRSS")
        return (f"reclaimed names: {NAMES} one-job names in {took:.1f} s; VmRSS {before} KiB before, "
                f"{held} KiB with them ({(held - before) * 1024 / NAMES:.0f} B per name), {after} KiB once "
                f"reclaimed ({(after - before) / 1024:+.1f} MiB, {(after - before) * 1024 / NAMES:+.1f} B per name)")
    finally:
        r.stop()


def peak(label, size, proto, hold=False):
    r = Router("--max-memory-bytes", str(LIMIT))
    try:
        jobs = (LIMIT * 3 // 2) // size
        args = [f"{BIN}/emq-bench", "fill", "--pid", str(r.pid), "--size", str(size), "--jobs", str(jobs),
                "--refusals-ok", "--queue", "fill"]
        args += ["--text", r.text] if proto == "text" else ["--frontend", f"tcp://127.0.0.1:{r.fe}"]
        if hold:
            args += ["--backend", f"tcp://127.0.0.1:{r.be}", "--hold", "10000"]
        out = subprocess.run(args, capture_output=True, check=True, timeout=600).stdout
        f = json.loads(out)
        base = f["rss_before_bytes"]
        over = (f["peak_rss_bytes"] - base) / max(f["admitted_bytes"], 1)
        return (f"{label}: offered {jobs} x {size} B, admitted {f['jobs']} ({f['admitted_bytes'] / 2**20:.0f} MiB), "
                f"refused {f['refused']}; VmRSS {base / 2**20:.1f} MiB before, peak VmHWM "
                f"{f['peak_rss_bytes'] / 2**20:.1f} MiB: (peak - before) / admitted = {over:.2f}")
    finally:
        r.stop()


def descriptors(n=1000):
    r = Router("--durability", "memory")
    try:
        before = fds(r.pid)
        conns = [socket.create_connection(("127.0.0.1", r.tx), timeout=30) for _ in range(n)]
        for c in conns:
            c.sendall(b"ASK nothing\n")
        for c in conns:
            assert c.makefile("rb").readline() == b"NOPE\n"
        held = fds(r.pid)
        for c in conns:
            c.close()
        return f"descriptors: {before} before, {held} with {n} text connections: {(held - before) / n:.3f} per connection"
    finally:
        r.stop()


def main():
    rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                         text=True).stdout.strip() or "unknown"
    lines = [f"# emq-router memory and descriptor bounds, rev {rev}, {time.strftime('%Y-%m-%d %H:%M')}, "
             f"load average {os.getloadavg()[0]:.2f}, max_memory_bytes {LIMIT // 2**20} MiB"]
    print(lines[0], flush=True)
    for fig in (names,
                lambda: peak("eMQP 64 KiB jobs queued", 65536, "emqp"),
                lambda: peak("eMQP 64 KiB jobs in flight to a worker that never reads", 65536, "emqp", hold=True),
                lambda: peak("text 64 KiB jobs queued", 65536, "text"),
                lambda: peak("eMQP 8 MiB jobs queued", 8 * 2**20, "emqp"),
                descriptors):
        line = fig()
        print(line, flush=True)
        lines.append(line)
    out = f"{ROOT}/loadtest/results/memory-bounds-{rev}.txt"
    with open(out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"written to {out}")


if __name__ == "__main__":
    main()
