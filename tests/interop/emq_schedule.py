"""SCHEDULE or UNSCHEDULE a job with the real Python EventMQ client
(``eventmq.client.messages.schedule``; UNSCHEDULE is the same call with
``unschedule=True`` because ``eventmq.client.jobs.unschedule`` is broken in
0.3.13: it always raises).

Usage (with the interop venv's python):
  emq_schedule.py --frontend ADDR --out FILE --tag TAG (--interval SECS | --cron EXPR | --unschedule)

The scheduled job is ``emq_interop_jobs.record(FILE, TAG)``.  Prints
``msgid <id>`` and exits 0 when the message was handed to the socket and
flushed within 10 s.
"""
import argparse
import sys

from eventmq.client import messages
from eventmq.sender import Sender


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--frontend', required=True)
    ap.add_argument('--out', required=True)
    ap.add_argument('--tag', required=True)
    ap.add_argument('--queue', default='default')
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument('--interval', type=int)
    g.add_argument('--cron')
    g.add_argument('--unschedule', action='store_true')
    a = ap.parse_args()

    s = Sender()
    s.connect(a.frontend)
    kw = dict(args=[a.out, a.tag], queue=a.queue)
    if a.unschedule:
        msgid = messages.schedule(s, 'emq_interop_jobs.record',
                                  unschedule=True, **kw)
    elif a.cron:
        msgid = messages.schedule(s, 'emq_interop_jobs.record', cron=a.cron,
                                  **kw)
    else:
        msgid = messages.schedule(s, 'emq_interop_jobs.record',
                                  interval_secs=a.interval, **kw)
    if not msgid:
        sys.exit('schedule returned no msgid')
    print('msgid %s' % msgid, flush=True)
    s.zsocket.close(linger=10000)
    s.zcontext.term()


if __name__ == '__main__':
    main()
