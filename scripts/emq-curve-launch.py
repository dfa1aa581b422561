#!/usr/bin/env python3
"""Run an unchanged Python EventMQ 0.3.13 program over CURVE.

EventMQ has no security code: its sockets come from
``zmq.Context.instance()``. pyzmq applies a context's default socket options
to every socket the context makes afterwards, so setting the CURVE client
options on that context before EventMQ's code runs makes every EventMQ
socket a CURVE client of the emq-router's ``frontend_curve`` /
``backend_curve`` endpoint. Nothing in EventMQ is changed.

Usage (from the environment where EventMQ is installed):

    python emq-curve-launch.py --key-file worker.key_secret \\
        --server-key router.key -- emq-jobmanager --broker-addr tcp://10.0.0.5:47390

    EMQ_CURVE_KEY_FILE=client.key_secret EMQ_CURVE_SERVER_KEY=router.key \\
        python emq-curve-launch.py -- my_client.py

* ``--key-file`` (``EMQ_CURVE_KEY_FILE``): this peer's ``NAME.key_secret``
  (czmq/pyzmq certificate format, as ``emq-cli keygen`` writes it); its
  public half must be in the router's allow-list directory for that socket.
  Refused when group- or world-readable.
* ``--server-key`` (``EMQ_CURVE_SERVER_KEY``): the router's public key, a
  ``.key`` file or its 40 Z85 characters.
* After ``--``: the program, a path or a name found on ``PATH`` (the
  ``emq-jobmanager`` console script), and its arguments. It runs in this
  interpreter (``runpy``), so it must be a Python script.

Caveats: every socket of ``zmq.Context.instance()`` becomes a CURVE client,
EventMQ's optional ZeroMQ log handler included; programs that pass their own
``context=`` are not covered. Needs a pyzmq whose libzmq has CURVE
(``zmq.has("curve")``; pyzmq 26.4's wheels do).
"""
import argparse
import os
import runpy
import shutil
import stat
import sys

import zmq
import zmq.auth
import zmq.utils.z85


def fail(message):
    sys.stderr.write("emq-curve-launch: %s\n" % message)
    sys.exit(2)


def load_secret(path):
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        fail("key file %s: %s" % (path, e.strerror))
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        fail("key file %s is readable by others (mode %o): chmod 600 it" % (path, stat.S_IMODE(mode)))
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as e:
        fail("key file %s: %s" % (path, e))
    if not public or not secret:
        fail("key file %s has no public-key and secret-key lines (make one with emq-cli keygen)" % path)
    return public, secret


def load_server_key(value):
    if len(value) == 40 and not os.path.exists(value):
        key = value.encode("ascii", "replace")
    else:
        try:
            key, _ = zmq.auth.load_certificate(value)
        except (OSError, ValueError) as e:
            fail("server key %s: %s" % (value, e))
    if not key or len(key) != 40:
        fail("server key %s: not 40 Z85 characters or a .key file with a public-key line" % value)
    try:
        zmq.utils.z85.decode(key)
    except (ValueError, KeyError, TypeError):
        fail("server key %s: not valid Z85" % value)
    return key


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        fail("usage: emq-curve-launch.py [--key-file F] [--server-key K] -- PROGRAM [ARGS...]")
    split = argv.index("--")
    parser = argparse.ArgumentParser(prog="emq-curve-launch.py")
    parser.add_argument("--key-file", default=os.environ.get("EMQ_CURVE_KEY_FILE"))
    parser.add_argument("--server-key", default=os.environ.get("EMQ_CURVE_SERVER_KEY"))
    opts = parser.parse_args(argv[:split])
    program = argv[split + 1:]
    if not program:
        fail("no program after --")
    if not opts.key_file or not opts.server_key:
        fail("needs --key-file (EMQ_CURVE_KEY_FILE) and --server-key (EMQ_CURVE_SERVER_KEY)")
    if not zmq.has("curve"):
        fail("this pyzmq's libzmq has no CURVE (zmq.has('curve') is False)")
    public, secret = load_secret(opts.key_file)
    server = load_server_key(opts.server_key)

    path = program[0]
    if not os.path.exists(path):
        found = shutil.which(path)
        if not found:
            fail("program %s: not a file and not on PATH" % path)
        path = found

    context = zmq.Context.instance()
    context.setsockopt(zmq.CURVE_SERVERKEY, server)
    context.setsockopt(zmq.CURVE_PUBLICKEY, public)
    context.setsockopt(zmq.CURVE_SECRETKEY, secret)

    sys.argv = [path] + program[1:]
    runpy.run_path(path, run_name="__main__")


if __name__ == "__main__":
    main()
