"""Send jobs to an eMQP broker with the real Python EventMQ client
(``eventmq.sender.Sender`` + ``eventmq.client.messages.defer_job``).

Usage (with the interop venv's python):
  emq_send_jobs.py --frontend tcp://127.0.0.1:P --out FILE --count N
                   --queues default,email,reports [--prefix P] [--sleep S]

Job i goes to queue ``queues[i % len(queues)]`` with tag
``<prefix>-<i:05d>-<queue>``.  Without --sleep the job is
``emq_interop_jobs.record(FILE, tag)``; with it,
``emq_interop_jobs.slow(FILE, tag, S)``.  Prints one line per job sent,
``sent <tag> <queue> <msgid>``, then ``total <N>``, and exits 0 only if
every defer_job returned a msgid and the socket flushed within 30 s.

The client's SNDHWM is lifted first: eventmq sends with NOBLOCK and silently
drops messages past the HWM (1000 by default).
"""
import argparse
import sys

import zmq
from eventmq.client import messages
from eventmq.sender import Sender


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--frontend', required=True)
    ap.add_argument('--out', required=True, help='file the jobs append to')
    ap.add_argument('--count', type=int, required=True)
    ap.add_argument('--queues', default='default')
    ap.add_argument('--prefix', default='job')
    ap.add_argument('--sleep', type=float, default=None)
    a = ap.parse_args()
    queues = a.queues.split(',')

    s = Sender()
    s.zsocket.setsockopt(zmq.SNDHWM, 0)
    s.zsocket.setsockopt(zmq.RCVHWM, 0)
    s.connect(a.frontend)
    for i in range(a.count):
        q = queues[i % len(queues)]
        tag = '%s-%05d-%s' % (a.prefix, i, q)
        if a.sleep is None:
            func, args = 'emq_interop_jobs.record', [a.out, tag]
        else:
            func, args = 'emq_interop_jobs.slow', [a.out, tag, a.sleep]
        msgid = messages.defer_job(s, func, args=args, queue=q)
        if not msgid:
            sys.exit('defer_job returned no msgid for %s' % tag)
        print('sent %s %s %s' % (tag, q, msgid))
    print('total %d' % a.count, flush=True)
    # linger bounds how long term() waits for unsent messages
    s.zsocket.close(linger=30000)
    s.zcontext.term()


if __name__ == '__main__':
    main()
