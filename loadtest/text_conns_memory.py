#!/usr/bin/env python3
"""Broker memory with N concurrent text connections, each doing SCHED/ASK/ACK
and staying open. Starts emq-router (release build) on free ports, prints
VmRSS and VmHWM of the router before, with the connections open, and after.
Usage: loadtest/text_conns_memory.py [N=1000]"""
import os, socket, subprocess, sys, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p

def mem(pid):
    out = {}
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(("VmRSS", "VmHWM", "Threads")):
            k, v = line.split(":", 1); out[k] = v.strip()
    return out

fe, be, ad, tx = (free_port() for _ in range(4))
router = subprocess.Popen([f"{root}/target/release/emq-router", "--frontend-addr", f"tcp://127.0.0.1:{fe}",
    "--backend-addr", f"tcp://127.0.0.1:{be}", "--admin-addr", f"tcp://127.0.0.1:{ad}",
    "--text-addr", f"127.0.0.1:{tx}", "--log", "warn"])
try:
    time.sleep(0.5)
    print("idle:", mem(router.pid))
    conns = []
    for i in range(N):
        c = socket.create_connection(("127.0.0.1", tx), timeout=10)
        c.sendall(f"SCHED job-{i}@q{i % 10}\nASK q{i % 10}\n".encode())
        conns.append(c)
    got = set()
    for c in conns:
        f = c.makefile("rb")
        line = f.readline()
        assert line.startswith(b"WANT? job-"), line
        got.add(line)
        c.sendall(b"ACK\n")
    assert len(got) == N, len(got)
    time.sleep(0.5)
    print(f"{N} connections open, {len(got)} distinct tasks taken once each:", mem(router.pid))
    for c in conns:
        c.sendall(b"END\n"); c.close()
    time.sleep(1)
    print("after closing:", mem(router.pid))
finally:
    router.terminate(); router.wait(timeout=20)
