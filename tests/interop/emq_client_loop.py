"""A long-running real Python EventMQ client for the take-over test through
HAProxy (tests/failover_haproxy.rs): it keeps one connection (one
``eventmq.sender.Sender``, a DEALER connected once, never rebuilt: ZeroMQ
reconnects it by itself when the connection drops) across the take-over.

Usage (with the interop venv's python):
  emq_client_loop.py --frontend tcp://127.0.0.1:P --out FILE --stop FILE
                     [--prefix P] [--interval S]

Every --interval seconds (default 0.2) it sends
``emq_interop_jobs.record(FILE, tag)`` with ``messages.defer_job``, tag
``<prefix>-<i:05d>``, on queue ``default``, until the file --stop exists;
meanwhile it reads the router's answers.  Prints, flushed, one line per
event, with ``time.time()``:

  sent <tag> <msgid> <t>
  acked <msgid> <t>              (REPLY: the router took the job)
  refused <msgid> <code> <t>     (ERROR)

Once the stop file exists it reads answers for 5 s more, prints
``total <sent>`` and exits 0.  The SNDHWM is lifted (eventmq sends with
NOBLOCK and silently drops messages past the HWM): jobs sent while no
router is reachable wait in the socket's queue and go out on the
reconnection, except those already handed to a connection that broke.
"""
import argparse
import os
import sys
import time

import zmq
from eventmq.client import messages
from eventmq.sender import Sender


def say(line):
    print('%s %.6f' % (line, time.time()), flush=True)


def text(frame):
    return frame.decode('utf-8', 'replace') if isinstance(frame, bytes) else str(frame)


def read_answers(sock, wait_ms):
    """Reads every answer arriving within wait_ms."""
    deadline = time.time() + wait_ms / 1000.0
    while True:
        left = int(max(0, deadline - time.time()) * 1000)
        if not sock.poll(left, zmq.POLLIN):
            return
        frames = sock.recv_multipart()
        command = text(frames[2]) if len(frames) > 2 else ''
        if command == 'REPLY' and len(frames) > 4:
            say('acked %s' % text(frames[4]))
        elif command == 'ERROR' and len(frames) > 5:
            say('refused %s %s' % (text(frames[4]), text(frames[5])))
        else:
            say('other %s' % '|'.join(text(f) for f in frames[2:5]))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--frontend', required=True)
    ap.add_argument('--out', required=True, help='file the jobs append to')
    ap.add_argument('--stop', required=True, help='stop sending once it exists')
    ap.add_argument('--prefix', default='loop')
    ap.add_argument('--interval', type=float, default=0.2)
    a = ap.parse_args()

    s = Sender()
    s.zsocket.setsockopt(zmq.SNDHWM, 0)
    s.zsocket.setsockopt(zmq.RCVHWM, 0)
    s.connect(a.frontend)
    i = 0
    while not os.path.exists(a.stop):
        tag = '%s-%05d' % (a.prefix, i)
        msgid = messages.defer_job(s, 'emq_interop_jobs.record', args=[a.out, tag], queue='default')
        if not msgid:
            sys.exit('defer_job returned no msgid for %s' % tag)
        say('sent %s %s' % (tag, msgid))
        i += 1
        read_answers(s.zsocket, int(a.interval * 1000))
    read_answers(s.zsocket, 5000)
    print('total %d' % i, flush=True)
    s.zsocket.close(linger=0)
    s.zcontext.term()


if __name__ == '__main__':
    main()
