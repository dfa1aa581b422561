#!/usr/bin/env python3
"""The nemesis producer: eMQP REQUESTs at a steady rate, every send and answer logged.

    producer.py --router r1=tcp://127.0.0.1:P1 --router r2=tcp://127.0.0.1:P2 \
                --rate 100 --queue nemesis --log FILE --tag TAG --stop-file FILE

One DEALER per router address, all with one routing identity (so a
REQUEST re-sent to the router that took over is a duplicate by the
router's rule, docs/failover.md "Duplicates"), each with ZMQ_IMMEDIATE
(a send goes only to a connected router) and ZMTP heartbeats 1 s / 3 s
(emq's client settings). A REQUEST goes to the first connected socket,
starting with the router that answered last; one unanswered for 1 s, or
refused (ERROR), is sent again with the same msgid, starting with the
other router. The body is the msgid.

History (JSONL, one line per event, flushed at once; times are Unix
seconds): {"e": "start", "id", "t"}; {"e": "send"|"resend", "m", "t",
"r"}; {"e": "ack", "m", "t", "r"}; {"e": "err", "m", "t", "r", "code"};
{"e": "end", "t", "pending"}. "r" names the router (r1/r2) by the socket.

When --stop-file exists it creates no more REQUESTs, keeps re-sending the
unanswered ones up to --drain-s, then writes "end" and exits.
"""
import argparse
import json
import os
import signal
import sys
import time
import uuid

import zmq

RESEND_S = 1.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--router", action="append", required=True, help="NAME=ADDR")
    ap.add_argument("--rate", type=float, default=100.0)
    ap.add_argument("--queue", default="nemesis")
    ap.add_argument("--log", required=True)
    ap.add_argument("--tag", required=True)
    ap.add_argument("--stop-file", required=True)
    ap.add_argument("--drain-s", type=float, default=40.0)
    a = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    log = open(a.log, "a", buffering=1)

    def ev(**kw):
        log.write(json.dumps(kw, separators=(",", ":")) + "\n")

    ctx = zmq.Context()
    ident = f"nemesis-{a.tag}-{uuid.uuid4().hex[:8]}".encode()
    socks = []
    for spec in a.router:
        name, addr = spec.split("=", 1)
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.IDENTITY, ident)
        s.setsockopt(zmq.IMMEDIATE, 1)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.HEARTBEAT_IVL, 1000)
        s.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3000)
        s.setsockopt(zmq.HEARTBEAT_TTL, 3000)
        s.setsockopt(zmq.RECONNECT_IVL, 100)
        s.connect(addr)
        socks.append((name, s))
    poller = zmq.Poller()
    for _, s in socks:
        poller.register(s, zmq.POLLIN)
    ev(e="start", id=ident.decode(), t=time.time(), pid=os.getpid())

    pref = 0
    pending = {}  # msgid -> {"last": mono or None, "sent_to": idx or None, "first": bool}
    seq = 0
    interval = 1.0 / a.rate
    next_tick = time.monotonic()
    stopping_at = None

    def send(mid, resend):
        nonlocal pref
        p = pending[mid]
        start = pref
        if resend and p["sent_to"] is not None and len(socks) > 1:
            start = (p["sent_to"] + 1) % len(socks)
        for k in range(len(socks)):
            i = (start + k) % len(socks)
            name, s = socks[i]
            try:
                s.send_multipart([b"", b"eMQP/1.0", b"REQUEST", mid, a.queue.encode(), b"", mid], zmq.NOBLOCK)
            except zmq.Again:
                continue
            ev(e="resend" if p["sent"] else "send", m=mid.decode(), t=time.time(), r=name)
            p["sent"] = True
            p["last"] = time.monotonic()
            p["sent_to"] = i
            return True
        return False

    while True:
        now = time.monotonic()
        if stopping_at is None and os.path.exists(a.stop_file):
            stopping_at = now
        if stopping_at is not None and (not pending or now - stopping_at > a.drain_s):
            break
        if stopping_at is None and now >= next_tick:
            seq += 1
            mid = f"{a.tag}-{seq}".encode()
            pending[mid] = {"last": None, "sent_to": None, "sent": False}
            send(mid, False)
            next_tick += interval
            if next_tick < now - 1.0:
                next_tick = now + interval
        # never sent (no router connected) or unanswered for RESEND_S: again
        for mid, p in list(pending.items())[:2000]:
            if p["last"] is None:
                if not send(mid, False):
                    break
            elif now - p["last"] >= RESEND_S:
                send(mid, True)
        timeout = max(1, int(min(max(next_tick - time.monotonic(), 0.0), 0.01) * 1000))
        for s, _ in poller.poll(timeout):
            name = next(n for n, x in socks if x is s)
            while True:
                try:
                    fr = s.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                if len(fr) < 5:
                    continue
                mid = fr[4]
                t = time.time()
                if fr[2] == b"REPLY":
                    ev(e="ack", m=mid.decode(errors="replace"), t=t, r=name)
                    if mid in pending:
                        del pending[mid]
                        pref = [n for n, _ in socks].index(name)
                elif fr[2] == b"ERROR":
                    code = fr[5].decode(errors="replace") if len(fr) > 5 else "?"
                    ev(e="err", m=mid.decode(errors="replace"), t=t, r=name, code=code)
                    p = pending.get(mid)
                    if p is not None:
                        p["last"] = time.monotonic()  # sent again after RESEND_S
    ev(e="end", t=time.time(), pending=len(pending))
    log.close()
    for _, s in socks:
        s.close()
    ctx.term()


if __name__ == "__main__":
    main()
