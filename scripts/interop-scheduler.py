"""Manual interop check: Python emq-router + Python emq-jobmanager + Rust emq-scheduler + Python client.

Run from the repository root with the venv of shared/interop/INSTALL.md:
    cargo build --bin emq-scheduler
    INTEROP_DIR=/path/to/shared/interop .venv/bin/python scripts/interop-scheduler.py
Checks: INFORM/ACK with the Python router, interval and cron jobs scheduled with
eventmq.client.messages.schedule run on a Python jobmanager, a malformed SCHEDULE gets
ERROR and breaks nothing, UNSCHEDULE stops REQUESTs, SIGTERM sends KBYE. Every process
it starts is stopped by PID. Exit status 0 when all checks hold.
"""
import json, os, shutil, signal, socket, subprocess, sys, tempfile, time, uuid
import zmq
from eventmq.sender import Sender
from eventmq.client import messages

VENV = os.environ.get('EMQ_VENV_BIN', os.path.abspath('.venv/bin'))
BIN = os.environ.get('EMQ_SCHEDULER_BIN', os.path.abspath('target/debug/emq-scheduler'))
def port():
    s = socket.socket(); s.bind(('127.0.0.1', 0)); p = s.getsockname()[1]; s.close(); return p
fe, be, ad, sad = ['tcp://127.0.0.1:%d' % port() for _ in range(4)]
tmp = tempfile.mkdtemp()
env = dict(os.environ, EVENTMQ_FRONTEND_ADDR=fe, EVENTMQ_BACKEND_ADDR=be, EVENTMQ_ADMINISTRATIVE_ADDR=ad,
           EVENTMQ_WORKER_ADDR=be, PYTHONPATH=os.environ.get('INTEROP_DIR', '../shared/interop'))
procs = []
def start(name, cmd, e=env):
    p = subprocess.Popen(cmd, env=e, stdout=open(os.path.join(tmp, name + '.log'), 'w'), stderr=subprocess.STDOUT)
    procs.append(p); return p
def log(name): return open(os.path.join(tmp, name + '.log')).read()
def admin(addr, cmd):
    s = zmq.Context.instance().socket(zmq.DEALER); s.setsockopt(zmq.LINGER, 0); s.setsockopt(zmq.IDENTITY, str(uuid.uuid4()).encode()); s.connect(addr)
    s.send_multipart([b'', b'eMQP/1.0', cmd.encode(), ('admin:' + str(uuid.uuid4())).encode()])
    if not s.poll(3000): return None
    r = s.recv_multipart(); s.close(); return json.loads(r[4])
def runs(tag):
    try: return sum(1 for l in open(out) if l.split()[0] == tag)
    except FileNotFoundError: return 0
def wait(cond, secs):
    end = time.time() + secs
    while time.time() < end:
        if cond(): return True
        time.sleep(0.1)
    return False
out = os.path.join(tmp, 'runs.txt')
ok = True
try:
    start('router', [VENV + '/python', VENV + '/emq-router'])
    time.sleep(1.0)
    start('jobmanager', [VENV + '/python', VENV + '/emq-jobmanager', '-J', '1'])
    sched = start('scheduler', [BIN, '--router-addr', fe, '--admin-addr', sad, '--data-dir', os.path.join(tmp, 'data')],
                  dict(env, RUST_LOG='info,emq::scheduler::peer=debug', NO_COLOR='1'))
    assert wait(lambda: 'registered with the router' in log('scheduler'), 10), 'no ACK from python router'
    print('scheduler registered; python router sees', admin(ad, 'ROUTER_SHOW_SCHEDULERS'))
    client = Sender(); client.connect(fe)
    messages.schedule(client, 'emq_interop_jobs.append_line', interval_secs=1, args=[out, 'tagI'])
    messages.schedule(client, 'emq_interop_jobs.append_line', cron='0 0 1 1 *', args=[out, 'tagC'], queue='default')
    assert wait(lambda: runs('tagI') >= 3 and runs('tagC') >= 1, 20), 'jobs did not run: %d %d' % (runs('tagI'), runs('tagC'))
    print('interval job ran', runs('tagI'), 'times; cron haste run', runs('tagC'))
    print('scheduler SCHEDULES:', admin(sad, 'SCHEDULES'))
    # malformed SCHEDULE through the python router: scheduler answers ERROR, keeps running
    client.send_multipart(['SCHEDULE', str(uuid.uuid4()), 'default', 'guarantee', '0', json.dumps(['run', {}]), ''], 'eMQP/1.0')
    time.sleep(1.5)
    n = runs('tagI')
    assert wait(lambda: runs('tagI') > n, 5), 'interval job stopped after malformed SCHEDULE'
    assert sched.poll() is None
    print('after malformed SCHEDULE: scheduler alive, python router alive:', procs[0].poll() is None)
    messages.schedule(client, 'emq_interop_jobs.append_line', unschedule=True, args=[out, 'tagI'])
    messages.schedule(client, 'emq_interop_jobs.append_line', unschedule=True, args=[out, 'tagC'])
    def stable():
        a = runs('tagI'); time.sleep(3.5); return runs('tagI') == a
    assert wait(stable, 30), 'runs never stopped'
    after = runs('tagI')
    slog = log('scheduler')
    cut = slog.index('UNSCHEDULE')
    reqs_after = [l for l in slog[cut:].splitlines() if 'REQUEST' in l]
    assert not reqs_after, 'REQUESTs after UNSCHEDULE: %s' % reqs_after
    print('REQUESTs emitted before UNSCHEDULE:', slog[:cut].count(' REQUEST '), '; after: 0; runs landed', after)
    print('UNSCHEDULE stopped it at', after, 'runs; SCHEDULES now', admin(sad, 'SCHEDULES'))
    sched.send_signal(signal.SIGTERM); sched.wait(5)
    time.sleep(0.5)
    print('after SIGTERM: exit', sched.returncode, '; python router sees', admin(ad, 'ROUTER_SHOW_SCHEDULERS'))
except AssertionError as e:
    ok = False; print('FAIL', e)
finally:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try: p.wait(3)
            except subprocess.TimeoutExpired: p.kill(); p.wait()
    print('--- router log tail ---'); print(log('router')[-1500:])
    print('--- scheduler log tail ---'); print(log('scheduler')[-2500:])
    shutil.rmtree(tmp, ignore_errors=True)
sys.exit(0 if ok else 1)
