#!/usr/bin/env python3
"""emq-router with a large dead set: how long `emq-cli dead delete --all`
(or `retry --all`) takes, and how long the shard keeps other traffic
waiting meanwhile (README "Retries and the dead set").

Starts emq-router (release build, one shard, max_retries 0, the default
durability "sync") on free loopback ports with its data directory in a
temporary directory; buries N jobs (N text SCHEDs, then N connections that
each ASK and close holding the offer: a setback each, straight to the dead
set); then one text connection sends `ASK elsewhere` round trips (answered
NOPE by the same shard) while emq-cli runs the operation, and prints the
operation's time and the longest round trip during it. Stops the router by
PID.

usage: loadtest/dead_set_steps.py [N=10000] [delete|retry]"""
import json, os, shutil, socket, subprocess, sys, tempfile, threading, time

N = int(sys.argv[1]) if len(sys.argv) > 1 else 10000
OP = sys.argv[2] if len(sys.argv) > 2 else "delete"
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
router_bin = os.path.join(root, "target", "release", "emq-router")
cli_bin = os.path.join(root, "target", "release", "emq-cli")


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


ports = [free_port() for _ in range(4)]
fe, be, ad = (f"tcp://127.0.0.1:{p}" for p in ports[:3])
text = ("127.0.0.1", ports[3])
tmp = tempfile.mkdtemp(prefix="emq-dead-steps-")
log = open(os.path.join(tmp, "router.log"), "w")
router = subprocess.Popen([router_bin, "--frontend", fe, "--backend", be, "--admin", ad,
                           "--text", f"{text[0]}:{text[1]}", "--metrics", "off", "--shards", "1",
                           "--max-retries", "0", "--dead-max-jobs", str(max(N, 10000)),
                           "--data-dir", os.path.join(tmp, "router")], stdout=log, stderr=log)
try:
    for _ in range(100):
        try:
            socket.create_connection(text).close(); break
        except OSError:
            time.sleep(0.1)
    s = socket.create_connection(text)
    s.sendall(b"".join(b"SCHED task %d@burst\n" % i for i in range(N)) + b"END\n")
    s.settimeout(120)
    while s.recv(65536):
        pass
    s.close()
    for _ in range(N):
        c = socket.create_connection(text); c.sendall(b"ASK burst\n"); c.recv(100); c.close()

    def dead():
        out = subprocess.run([cli_bin, "--admin", ad, "--json", "status"], capture_output=True).stdout
        return json.loads(out).get("dead_messages_by_queue", {}).get("burst", 0)

    for _ in range(200):
        if dead() == N:
            break
        time.sleep(0.1)
    print(f"dead jobs: {dead()}")
    rounds, stop = [], threading.Event()

    def probe():
        p = socket.create_connection(text); f = p.makefile("rb")
        while not stop.is_set():
            t = time.perf_counter(); p.sendall(b"ASK elsewhere\n"); f.readline()
            rounds.append((t, time.perf_counter() - t))

    th = threading.Thread(target=probe); th.start(); time.sleep(0.5)
    t0 = time.perf_counter()
    r = subprocess.run([cli_bin, "--admin", ad, "--timeout", "60s", "dead", OP, "--all"], capture_output=True, text=True)
    t1 = time.perf_counter()
    time.sleep(0.3); stop.set(); th.join()
    during = [d for (t, d) in rounds if t0 <= t <= t1]
    print(f"emq-cli: {r.stdout.strip()}{r.stderr.strip()}")
    print(f"dead {OP} --all of {N}: {1000 * (t1 - t0):.1f} ms (emq-cli's whole run)")
    print(f"ASK round trips during it: {len(during)}, longest {1000 * max(during, default=0):.2f} ms; "
          f"longest before and after: {1000 * max((d for (t, d) in rounds if not t0 <= t <= t1), default=0):.2f} ms")
finally:
    router.terminate(); router.wait(); log.close()
    shutil.rmtree(tmp, ignore_errors=True)
