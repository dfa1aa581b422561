#!/usr/bin/env python3
"""emq-router with N open, idle text connections: the router's threads,
descriptors and RSS per connection, and its CPU while they sit idle.

Starts emq-router (release build) on free loopback ports; records VmRSS,
threads and open descriptors before; opens N connections, each doing one
SCHED / ASK / ACK round trip (so every connection has used its buffers) and
staying open; records them again; measures the router's CPU time
(/proc/<pid>/stat utime + stime) over SECONDS of idleness; closes every
connection and records once more. Stops the router by PID.

usage: loadtest/text_conns_idle.py [N=10000] [SECONDS=30]"""
import os, resource, shutil, socket, subprocess, sys, tempfile, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
SECONDS = float(sys.argv[2]) if len(sys.argv) > 2 else 30.0
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
HZ = os.sysconf("SC_CLK_TCK")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def figures(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        k, v = line.split(":", 1)
        if k in ("VmRSS", "VmHWM", "Threads"):
            out[k] = int(v.split()[0])
    out["fds"] = len(os.listdir(f"/proc/{pid}/fd"))
    return out


def cpu_s(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / HZ


fe, be, ad, tx = (free_port() for _ in range(4))
data = tempfile.mkdtemp(prefix="emq-text-conns-idle-")
router = subprocess.Popen([f"{root}/target/release/emq-router", "--frontend-addr", f"tcp://127.0.0.1:{fe}",
                           "--backend-addr", f"tcp://127.0.0.1:{be}", "--admin-addr", f"tcp://127.0.0.1:{ad}",
                           "--text-addr", f"127.0.0.1:{tx}", "--text-max-connections", str(N), "--log", "warn",
                           "--data-dir", data, "--metrics", ""])
try:
    time.sleep(0.5)
    before = figures(router.pid)
    conns = []
    for i in range(N):
        c = socket.create_connection(("127.0.0.1", tx), timeout=30)
        c.sendall(f"SCHED job-{i}@q{i % 10}\nASK q{i % 10}\n".encode())
        conns.append(c)
    for c in conns:
        line = c.makefile("rb").readline()
        assert line.startswith(b"WANT? job-"), line
        c.sendall(b"ACK\n")
    time.sleep(2)
    held = figures(router.pid)
    c0 = cpu_s(router.pid)
    time.sleep(SECONDS)
    idle_cpu = cpu_s(router.pid) - c0
    for c in conns:
        c.sendall(b"END\n"); c.close()
    time.sleep(2)
    after = figures(router.pid)
    per_conn_kb = (held["VmRSS"] - before["VmRSS"]) / N
    per_conn_fds = (held["fds"] - before["fds"]) / N
    print(f"before: {before}")
    print(f"{N} open: {held}")
    print(f"after closing: {after}")
    print(f"RSS per open connection: {per_conn_kb:.2f} KB; descriptors per connection: {per_conn_fds:.3f}; "
          f"threads: {held['Threads']}; idle CPU over {SECONDS:.0f} s: {idle_cpu:.2f} s "
          f"= {100 * idle_cpu / SECONDS:.3f}% of one core")
finally:
    router.terminate(); router.wait(timeout=60)
    shutil.rmtree(data, ignore_errors=True)
