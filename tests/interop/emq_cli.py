"""Run the real ``emq-cli`` (EventMQ 0.3.13) against an admin address and
print what it answered as JSON, one line per command.

Usage (with the interop venv's python, emq-cli is taken from the same bin):
  emq_cli.py --admin tcp://127.0.0.1:P status show_workers ...

This is ``printf 'status\\nshow_workers\\n' | emq-cli -a ADDR``: emq-cli
prints ``Connecting to ADDR...`` and then, per command, a ``> `` prompt
followed by the broker's JSON reply as a pprint'ed Python dict (or
``None`` after its 1 s wait).  Each answer is parsed with
``ast.literal_eval`` and printed as ``{"command": C, "answer": <JSON>}``.
Exits 1 (printing the raw output) when emq-cli fails, times out (20 s) or
prints something that is not a Python literal.
"""
import argparse
import ast
import json
import os
import subprocess
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--admin', required=True)
    ap.add_argument('commands', nargs='+')
    a = ap.parse_args()
    cli = os.path.join(os.path.dirname(sys.executable), 'emq-cli')
    stdin = ''.join(c + '\n' for c in a.commands).encode()
    p = subprocess.run([sys.executable, cli, '-a', a.admin], input=stdin,
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                       timeout=20, start_new_session=True)
    out = p.stdout.decode('utf-8', 'replace')
    # everything after the first prompt, split at each prompt
    parts = out.split('> ')[1:]
    answers = [x.strip() for x in parts if x.strip()]
    if p.returncode != 0 or len(answers) != len(a.commands):
        sys.stderr.write('emq-cli rc=%d, %d answers for %d commands\n'
                         'stdout:\n%s\nstderr:\n%s\n'
                         % (p.returncode, len(answers), len(a.commands), out,
                            p.stderr.decode('utf-8', 'replace')))
        sys.exit(1)
    for cmd, text in zip(a.commands, answers):
        try:
            value = ast.literal_eval(text)
        except (ValueError, SyntaxError) as e:
            sys.exit('emq-cli printed no Python literal for %r (%s): %r'
                     % (cmd, e, text))
        print(json.dumps({'command': cmd, 'answer': value}))


if __name__ == '__main__':
    main()
