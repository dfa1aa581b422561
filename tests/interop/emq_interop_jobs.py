"""Job functions run by a real Python EventMQ jobmanager in emq's interop
tests.  The jobmanager's worker processes import this module by its dotted
path (``emq_interop_jobs.record``), so this directory must be on the
jobmanager's PYTHONPATH (tests/common/python.rs sets it).

Every job appends lines to the file given as its first argument; a line is

    <event> <tag> <pid> <jobmanager label> <unix time>

with event ``run`` (a quick job), or ``start`` and ``done`` around a slow
job, so a checker can tell which jobs ran, how often, on which jobmanager
(label = $INTEROP_JM inherited by the worker processes, ``-`` if unset),
and which were in flight (``start`` without ``done``) when a jobmanager was
killed.  O_APPEND writes of one short line are atomic on Linux, so several
worker processes and jobmanagers may share one file.
"""
import os
import time


def _append(path, event, tag):
    line = '{} {} {} {} {:.6f}\n'.format(event, tag, os.getpid(),
                                         os.environ.get('INTEROP_JM', '-'),
                                         time.time())
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode('utf-8'))
    finally:
        os.close(fd)


def record(path, tag):
    """Quick job: append one ``run`` line for ``tag``."""
    _append(path, 'run', tag)
    return tag


def slow(path, tag, secs):
    """Slow job: ``start`` line, sleep ``secs`` seconds, ``done`` line."""
    _append(path, 'start', tag)
    time.sleep(float(secs))
    _append(path, 'done', tag)
    return tag
