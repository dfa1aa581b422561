#!/usr/bin/env python3
"""A user-space TCP relay with an adjustable delay (the kernel here has no netem).

    proxy.py --listen 127.0.0.1:PORT=HOST:PORT [--listen ...] --delay-file FILE

Each --listen forwards every accepted connection to its upstream. Every
chunk read in either direction is written out DELAY ms after it was read
(order kept), where DELAY is the number in --delay-file (read every 0.2 s;
missing or empty: 0). An upstream that does not answer within 2 s, or
refuses, closes the accepted connection. Runs until SIGTERM/SIGKILL.
Stdlib only (asyncio).
"""
import argparse
import asyncio
import os
import signal
import time

DELAY = {"ms": 0.0}
CHUNK = 65536
CONNECT_TIMEOUT = 2.0


async def watch_delay(path):
    while True:
        try:
            with open(path) as f:
                text = f.read().strip()
            DELAY["ms"] = float(text) if text else 0.0
        except (OSError, ValueError):
            DELAY["ms"] = 0.0
        await asyncio.sleep(0.2)


async def pump(reader, writer):
    """Copies reader to writer, each chunk held DELAY ms; closes writer at EOF or error."""
    q = asyncio.Queue(maxsize=256)

    async def read_side():
        try:
            while True:
                data = await reader.read(CHUNK)
                if not data:
                    break
                await q.put((time.monotonic() + DELAY["ms"] / 1000.0, data))
        except (OSError, asyncio.CancelledError):
            pass
        await q.put((0.0, None))

    async def write_side():
        try:
            while True:
                due, data = await q.get()
                if data is None:
                    break
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()
        except (OSError, asyncio.CancelledError):
            pass
        try:
            writer.close()
        except OSError:
            pass

    r = asyncio.ensure_future(read_side())
    await write_side()
    r.cancel()


def handler(up_host, up_port):
    async def handle(creader, cwriter):
        try:
            ureader, uwriter = await asyncio.wait_for(asyncio.open_connection(up_host, up_port), CONNECT_TIMEOUT)
        except (OSError, asyncio.TimeoutError):
            cwriter.close()
            return
        await asyncio.gather(pump(creader, uwriter), pump(ureader, cwriter), return_exceptions=True)

    return handle


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--listen", action="append", required=True, help="LHOST:LPORT=UHOST:UPORT")
    ap.add_argument("--delay-file", required=True)
    a = ap.parse_args()
    servers = []
    for spec in a.listen:
        left, right = spec.split("=")
        lh, lp = left.rsplit(":", 1)
        uh, up = right.rsplit(":", 1)
        servers.append(await asyncio.start_server(handler(uh, int(up)), lh, int(lp), reuse_address=True))
    asyncio.ensure_future(watch_delay(a.delay_file))
    print(f"proxy {os.getpid()} up: {' '.join(a.listen)}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()


if __name__ == "__main__":
    asyncio.run(main())
