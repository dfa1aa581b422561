#!/usr/bin/env python3
"""Lists, inspects and deletes JetStream streams over the plain NATS protocol
(no client library): what the replicated load tests need to keep a shared
cluster clean between runs.

usage: nats_streams.py URL list [REGEX]      names matching REGEX (re.match), one a line
       nats_streams.py URL info NAME         the stream's state as JSON (messages, bytes, ...)
       nats_streams.py URL delete REGEX      deletes every stream whose name matches;
                                             prints each one deleted

URL is nats://host:port (the first of a comma-separated list is used).
Exits 1 when a JetStream request fails or times out (5 s).
"""
import json
import re
import socket
import sys

TIMEOUT_S = 5.0
INBOX = "_INBOX.emqloadtest"


class Nats:
    """One connection; request() sends on a subject and reads the one reply."""

    def __init__(self, url):
        hostport = url.split(",")[0].removeprefix("nats://")
        host, port = hostport.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=TIMEOUT_S)
        self.buf = b""
        if not self.line().startswith(b"INFO "):
            raise SystemExit(f"{url}: not a NATS server")
        self.sock.sendall(b'CONNECT {"verbose":false,"pedantic":false,"headers":true,"no_responders":true}\r\n'
                          b"PING\r\n" + f"SUB {INBOX}.> 1\r\n".encode())
        while self.line() != b"PONG":
            pass
        self.seq = 0

    def line(self):
        while b"\r\n" not in self.buf:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("the NATS server closed the connection")
            self.buf += chunk
        line, self.buf = self.buf.split(b"\r\n", 1)
        return line

    def exact(self, n):
        while len(self.buf) < n + 2:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise SystemExit("the NATS server closed the connection")
            self.buf += chunk
        data, self.buf = self.buf[:n], self.buf[n + 2:]
        return data

    def request(self, subject, payload=b""):
        self.seq += 1
        reply = f"{INBOX}.{self.seq}"
        self.sock.sendall(f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n")
        while True:
            line = self.line()
            if line == b"PING":
                self.sock.sendall(b"PONG\r\n")
            elif line.startswith(b"MSG "):
                parts = line.split()
                data = self.exact(int(parts[-1]))
                if parts[1].decode() == reply:
                    return json.loads(data)
            elif line.startswith(b"HMSG "):
                parts = line.split()
                data = self.exact(int(parts[-1]))
                if parts[1].decode() == reply:
                    raise SystemExit(f"{subject}: {data[:int(parts[-2])].decode(errors='replace').strip()}")
            elif line.startswith(b"-ERR"):
                raise SystemExit(f"{subject}: {line.decode()}")


def names(nats):
    out, offset = [], 0
    while True:
        r = nats.request("$JS.API.STREAM.NAMES", json.dumps({"offset": offset}).encode())
        if "error" in r:
            raise SystemExit(f"stream names: {r['error']}")
        got = r.get("streams") or []
        out += got
        offset += len(got)
        if not got or offset >= r.get("total", 0):
            return sorted(out)


def main(argv):
    if len(argv) < 3:
        raise SystemExit(__doc__)
    nats, cmd = Nats(argv[1]), argv[2]
    if cmd == "list":
        pattern = re.compile(argv[3] if len(argv) > 3 else "")
        for n in names(nats):
            if pattern.match(n):
                print(n)
    elif cmd == "info" and len(argv) == 4:
        r = nats.request(f"$JS.API.STREAM.INFO.{argv[3]}")
        if "error" in r:
            raise SystemExit(f"stream {argv[3]}: {r['error']}")
        print(json.dumps(r["state"]))
    elif cmd == "delete" and len(argv) == 4:
        pattern = re.compile(argv[3])
        for n in names(nats):
            if pattern.match(n):
                r = nats.request(f"$JS.API.STREAM.DELETE.{n}")
                if not r.get("success"):
                    raise SystemExit(f"deleting stream {n}: {r.get('error')}")
                print(n)
    else:
        raise SystemExit(__doc__)


if __name__ == "__main__":
    main(sys.argv)
