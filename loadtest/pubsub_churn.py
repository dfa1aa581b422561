#!/usr/bin/env python3
"""emq-pubsub under subscriber churn: its RSS after each round of N
subscribers connecting, receiving and leaving, and again after it has sat
idle past its heap trim (limits::HEAP_TRIM_EVERY, 60 s).

Starts emq-pubsub (release build) on free loopback ports; per round opens
N SUB sockets (each subscribed to its own topic), publishes 50 messages,
closes them all; prints VmRSS per round; then waits IDLE seconds and
prints VmRSS once more. Stops the device by PID. Needs pyzmq (the
interop virtualenv has it).

usage: loadtest/pubsub_churn.py [ROUNDS=40] [N=500] [IDLE=65]"""
import os, socket, subprocess, sys, time

import zmq

ROUNDS = int(sys.argv[1]) if len(sys.argv) > 1 else 40
N = int(sys.argv[2]) if len(sys.argv) > 2 else 500
IDLE = float(sys.argv[3]) if len(sys.argv) > 3 else 65.0
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p


def rss_kb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


subprocess.run(["cargo", "build", "--release", "--quiet", "--bin", "emq-pubsub"], cwd=root, check=True)
pin, pout = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
device = subprocess.Popen([os.path.join(root, "target/release/emq-pubsub"), "--pubsub-in", pin,
                           "--pubsub-out", pout, "--log", "warn"])
ctx = zmq.Context()
try:
    time.sleep(0.5)
    print(f"start: {rss_kb(device.pid)} kB", flush=True)
    pub = ctx.socket(zmq.DEALER); pub.setsockopt(zmq.LINGER, 0); pub.connect(pin)
    for r in range(ROUNDS):
        subs = []
        for i in range(N):
            s = ctx.socket(zmq.SUB); s.setsockopt(zmq.LINGER, 0)
            s.setsockopt(zmq.SUBSCRIBE, b"t%d" % i); s.connect(pout); subs.append(s)
        time.sleep(0.5)
        for i in range(50):
            pub.send_multipart([b"", b"eMQP/1.0", b"PUBLISH", b"m%d" % i, b"t%d" % i, b"hello"])
        time.sleep(0.3)
        for s in subs:
            s.close()
        time.sleep(0.5)
        print(f"round {r + 1}: {rss_kb(device.pid)} kB", flush=True)
    pub.close()
    time.sleep(IDLE)
    print(f"after {IDLE:.0f} s idle: {rss_kb(device.pid)} kB", flush=True)
finally:
    device.terminate()
    device.wait(timeout=10)
    ctx.term()
