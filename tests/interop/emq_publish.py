"""Publish messages with the real Python EventMQ client
(``eventmq.client.messages.send_publish_request``): sends
``PUBLISH <topic> <json.dumps(message)>`` to a pub device's incoming ROUTER.

Usage (with the interop venv's python):
  emq_publish.py --addr tcp://127.0.0.1:P --topic T --message JSON [--count N]

Prints ``msgid <id>`` per message and exits 0 when all were handed to the
socket and flushed within 10 s.
"""
import argparse
import json
import sys

from eventmq.client import messages
from eventmq.sender import Sender


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--addr', required=True)
    ap.add_argument('--topic', required=True)
    ap.add_argument('--message', required=True, help='JSON value')
    ap.add_argument('--count', type=int, default=1)
    a = ap.parse_args()
    message = json.loads(a.message)

    s = Sender()
    s.connect(a.addr)
    for _ in range(a.count):
        msgid = messages.send_publish_request(s, a.topic, message)
        if not msgid:
            sys.exit('send_publish_request returned no msgid')
        print('msgid %s' % msgid)
    sys.stdout.flush()
    s.zsocket.close(linger=10000)
    s.zcontext.term()


if __name__ == '__main__':
    main()
