#!/usr/bin/env python3
"""The nemesis checker: reads a run's history, proves the invariants, writes the summary and the plot.

    check.py OUT        # OUT: the results directory harness.py wrote

Reads OUT/run.json, faults.jsonl, events.jsonl, roles.jsonl,
producer-*.jsonl, executions.log, r1-*.log, r2-*.log, leftovers.json.
Writes OUT/summary.md (tables), OUT/verdict.json and OUT/nemesis.svg
(acks and executions per second, acknowledgement latency per second,
faults shaded). Exit status 0 when the verdict is PASS, 1 when not.

The invariants (the verdict fails on any of them):
* lost: an acknowledged msgid that the worker never executed;
* phantom: an executed msgid that no producer ever sent;
* fenced acks: an acknowledgement by a router instance received more than
  GRACE_S after that instance logged that it is fenced;
* unexplained duplicates: a msgid executed more than once whose second
  execution is outside every fault's window (start - 1 s .. recovery +
  DUP_WINDOW_S): duplicates are allowed only for jobs in flight at a fault
  (each is counted for the fault, among those, nearest its first execution);
* a fault after which no acknowledgement came within the harness's limit;
* anything of the run left behind after the teardown.
Counted and reported, not failing: acknowledgements of a router after the
other router took the name (a PubAck the fence lets through is for a
message the new owner replayed: docs/replicated.md "The fence"), time with
both routers reporting role owner, msgids sent and never acknowledged
(unknown outcome, the producer gave up or was killed), duplicate acks.
"""
import bisect
import glob
import json
import os
import re
import statistics
import sys
from collections import Counter, defaultdict
from datetime import datetime, timezone

GRACE_S = 1.0
DUP_WINDOW_S = 35.0


def jsonl(path):
    out = []
    try:
        with open(path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a kill -9
    except OSError:
        pass
    return out


def log_time(line):
    m = re.match(r"\s*(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?)Z?", re.sub(r"\x1b\[[0-9;]*m", "", line))
    if not m:
        return None
    s = m.group(1)
    if "." in s:
        head, frac = s.split(".")
        s = head + "." + frac[:6]
    return datetime.fromisoformat(s).replace(tzinfo=timezone.utc).timestamp()


def first_line(path, needles):
    try:
        with open(path, errors="replace") as f:
            for line in f:
                if any(n in line for n in needles):
                    return log_time(line)
    except OSError:
        pass
    return None


def pct(xs, q):
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))]


def fmt(x, d=1):
    return "-" if x is None else f"{x:.{d}f}"


def main(out):
    run = json.load(open(os.path.join(out, "run.json")))
    faults = jsonl(os.path.join(out, "faults.jsonl"))
    events = jsonl(os.path.join(out, "events.jsonl"))
    roles = jsonl(os.path.join(out, "roles.jsonl"))
    try:
        left = json.load(open(os.path.join(out, "leftovers.json")))
    except (OSError, ValueError):
        left = ["leftovers.json missing: the teardown did not finish"]

    first_send, acks, ack_events, errs = {}, {}, [], Counter()
    for path in sorted(glob.glob(os.path.join(out, "producer-*.jsonl"))):
        for e in jsonl(path):
            k, m = e.get("e"), e.get("m")
            if k in ("send", "resend") and m is not None:
                first_send[m] = min(first_send.get(m, e["t"]), e["t"])
            elif k == "ack":
                ack_events.append((e["t"], m, e.get("r")))
                acks.setdefault(m, []).append((e["t"], e.get("r")))
            elif k == "err":
                errs[e.get("code", "?")] += 1
    ack_events.sort()
    execs = defaultdict(list)
    try:
        with open(os.path.join(out, "executions.log")) as f:
            for line in f:
                p = line.split()
                if len(p) == 2:
                    try:
                        execs[p[0]].append(float(p[1]))
                    except ValueError:
                        pass
    except OSError:
        pass
    for v in execs.values():
        v.sort()

    acked = set(acks)
    lost = sorted(acked - set(execs))
    phantom = sorted(set(execs) - set(first_send))
    unacked = set(first_send) - acked
    unacked_ran = len([m for m in unacked if m in execs])
    dup_acks = sum(len(v) - 1 for v in acks.values())
    both_routers = len([m for m, v in acks.items() if len({r for _, r in v}) > 1])

    # router instances: start time, log, took-the-name time, fenced time
    inst = defaultdict(list)
    for e in events:
        if e.get("e") == "start" and e.get("proc") in ("r1", "r2"):
            log = os.path.join(out, e["log"])
            inst[e["proc"]].append({
                "start": e["t"], "log": e["log"], "pid": e.get("pid"),
                "took": first_line(log, ["took the router name"]),
                "fenced": first_line(log, ["fenced: another router took", "this router is fenced"]),
            })
    takes = sorted((i["took"], r) for r, l in inst.items() for i in l if i["took"])

    def instance(r, t):
        lst = inst.get(r, [])
        k = bisect.bisect_right([i["start"] for i in lst], t) - 1
        return lst[k] if k >= 0 else None

    fenced_acks, superseded_acks, fenced_examples = 0, 0, []
    for t, m, r in ack_events:
        i = instance(r, t)
        if i is None:
            continue
        if i["fenced"] is not None and t > i["fenced"] + GRACE_S:
            fenced_acks += 1
            if len(fenced_examples) < 10:
                fenced_examples.append({"msgid": m, "t": t, "router": r, "fenced_at": i["fenced"], "log": i["log"]})
        if i["took"] is not None and any(tt > i["took"] and rr != r and t > tt + GRACE_S for tt, rr in takes):
            superseded_acks += 1

    # both routers reporting owner (from the 0.5 s STATUS samples)
    cur, both_owner_s, since = {}, 0.0, None
    for e in sorted(roles, key=lambda x: x["t"]):
        cur[e["router"]] = e["role"]
        both = sum(1 for v in cur.values() if v == "owner") > 1
        if both and since is None:
            since = e["t"]
        elif not both and since is not None:
            both_owner_s += e["t"] - since
            since = None

    # duplicates: executions past the first, attributed to the fault whose window holds the re-run
    def window(f):
        end = (f.get("recovered") or f["heal"]) + DUP_WINDOW_S
        return f["start"] - 1.0, end

    per_fault_dups = Counter()
    unexplained = []
    dup_total = 0
    for m, ts in execs.items():
        for t in ts[1:]:
            dup_total += 1
            cands = [f for f in faults if window(f)[0] <= t <= window(f)[1]]
            if cands:
                # the fault nearest the first execution: the job was in flight then
                t1 = ts[0]

                def dist(f, t1=t1):
                    return max(0.0, f["start"] - t1) + max(0.0, t1 - (f.get("recovered") or f["heal"]))
                per_fault_dups[min(cands, key=lambda f: (dist(f), -f["start"]))["i"]] += 1
            else:
                unexplained.append({"msgid": m, "executions": ts})

    # per fault: acks during, longest ack gap, recovery
    ack_ts = [t for t, _, _ in ack_events]
    rows = []
    for f in faults:
        a = bisect.bisect_left(ack_ts, f["start"])
        b = bisect.bisect_right(ack_ts, f["heal"])
        end = f.get("recovered") or f["heal"]
        seg = [f["start"]] + ack_ts[a:bisect.bisect_right(ack_ts, end)] + [end]
        gap = max((y - x for x, y in zip(seg, seg[1:])), default=0.0)
        rows.append({**f, "acks_during": b - a, "longest_gap_s": gap,
                     "recover_s": None if f.get("recovered") is None else f["recovered"] - f["heal"],
                     "dups": per_fault_dups.get(f["i"], 0)})
    unrecovered = [r["i"] for r in rows if r["recover_s"] is None]

    lat = [(v[0][0], v[0][0] - first_send[m]) for m, v in acks.items() if m in first_send]
    verdict = {
        "pass": not lost and not phantom and fenced_acks == 0 and not unexplained and not unrecovered and not left,
        "sent": len(first_send), "acked": len(acked), "executed_distinct": len(execs),
        "executions": sum(len(v) for v in execs.values()), "lost": len(lost), "lost_msgids": lost[:50],
        "phantom": len(phantom), "phantom_msgids": phantom[:50], "fenced_acks": fenced_acks,
        "fenced_ack_examples": fenced_examples, "acks_after_other_took_name": superseded_acks,
        "both_report_owner_s": round(both_owner_s, 2), "duplicates": dup_total,
        "duplicates_by_fault": {str(k): v for k, v in per_fault_dups.items()},
        "unexplained_duplicates": len(unexplained), "unexplained_examples": unexplained[:10],
        "unacked_sent": len(unacked), "unacked_but_ran": unacked_ran, "duplicate_acks": dup_acks,
        "acked_by_both_routers": both_routers, "refusals": dict(errs), "unrecovered_faults": unrecovered,
        "leftovers": left, "faults": len(faults), "fault_kinds": dict(Counter(f["kind"] for f in faults)),
        "ack_latency_ms": {k: fmt(None if q is None else q * 1000) for k, q in (
            ("p50", pct([x for _, x in lat], 50)), ("p99", pct([x for _, x in lat], 99)),
            ("max", max((x for _, x in lat), default=None)))},
    }
    with open(os.path.join(out, "verdict.json"), "w") as f:
        json.dump(verdict, f, indent=1)
    write_summary(out, run, verdict, rows)
    write_svg(out, run, ack_events, execs, lat, rows)
    print(f"nemesis check: {'PASS' if verdict['pass'] else 'FAIL'}: sent {verdict['sent']}, acked "
          f"{verdict['acked']}, lost {verdict['lost']}, phantom {verdict['phantom']}, fenced acks {fenced_acks}, "
          f"duplicates {dup_total} (unexplained {len(unexplained)}), faults {len(faults)} "
          f"(unrecovered {len(unrecovered)}), left behind {len(left)}", file=sys.stderr)
    return 0 if verdict["pass"] else 1


def write_summary(out, run, v, rows):
    t0 = run["started"]
    L = [f"# Nemesis run {run['id']}: {'PASS' if v['pass'] else 'FAIL'}", "",
         f"Seed **{run['seed']}**, schedule `{run['schedule_kind']}`"
         + (f" ({run['duration_s'] / 60:.0f} min)" if run["schedule_kind"] == "long" else "")
         + f", {run.get('faults_run', len(rows))} faults, {run['rate']:.0f} REQUESTs/s, `nats_lease` {run['lease']}, "
         f"subnet {run['subnet']}. Replay: `{run['replay']}`.", "",
         "| invariant | value |", "|---|---|",
         f"| acknowledged jobs lost (acked, never executed) | **{v['lost']}** |",
         f"| executed, never sent | **{v['phantom']}** |",
         f"| acks by a fenced router after its fence (+{GRACE_S:.0f} s) | **{v['fenced_acks']}** |",
         f"| duplicates (executions past the first) | {v['duplicates']} |",
         f"| duplicates outside every fault's window | **{v['unexplained_duplicates']}** |",
         f"| faults without an ack within the limit after the heal | **{len(v['unrecovered_faults'])}** |",
         f"| left behind after teardown | **{len(v['leftovers'])}** {', '.join(v['leftovers'])} |", "",
         "| counted | value |", "|---|---|",
         f"| REQUESTs sent (distinct msgids) | {v['sent']} |", f"| acknowledged | {v['acked']} |",
         f"| executed (distinct / all) | {v['executed_distinct']} / {v['executions']} |",
         f"| sent, never acknowledged (outcome unknown) / of them executed | {v['unacked_sent']} / "
         f"{v['unacked_but_ran']} |",
         f"| duplicate acks (a re-send answered again) / msgids acked by both routers | {v['duplicate_acks']} / "
         f"{v['acked_by_both_routers']} |",
         f"| acks after the other router took the name (+{GRACE_S:.0f} s) | {v['acks_after_other_took_name']} |",
         f"| time both routers' STATUS said owner | {v['both_report_owner_s']} s |",
         f"| refusals (ERROR codes) | {v['refusals'] or 0} |",
         f"| ack latency (first send -> first ack) p50 / p99 / max | {v['ack_latency_ms']['p50']} / "
         f"{v['ack_latency_ms']['p99']} / {v['ack_latency_ms']['max']} ms |", "",
         "A duplicate is explained by a fault whose window (start - 1 s to recovery + "
         f"{DUP_WINDOW_S:.0f} s) holds the second execution, and counted for the one of them nearest the first "
         "execution (the job was in flight then). Executions are attributed to a router by time "
         "only (the worker does not log its router); acks by the socket that received them.", "",
         "Per fault kind (recovery: from the heal to the first acknowledgement after it):", "",
         "| fault kind | times | lasted (s) | longest ack gap p50 / max (s) | recovered after heal p50 / max (s) "
         "| duplicates |", "|---|---|---|---|---|---|"]
    kinds = defaultdict(list)
    for r in rows:
        kinds[r["kind"]].append(r)
    for k in sorted(kinds):
        rs = kinds[k]
        rec = [r["recover_s"] for r in rs if r["recover_s"] is not None]
        gaps = [r["longest_gap_s"] for r in rs]
        L.append(f"| {k} | {len(rs)} | {min(r['heal'] - r['start'] for r in rs):.1f}-"
                 f"{max(r['heal'] - r['start'] for r in rs):.1f} | {fmt(pct(gaps, 50))} / {fmt(max(gaps))} | "
                 f"{fmt(pct(rec, 50), 2)} / {fmt(max(rec, default=None), 2)} | {sum(r['dups'] for r in rs)} |")
    L += ["", "Every fault:", "",
         "| # | at (s) | fault | target | lasted (s) | acks during | longest ack gap (s) | recovered after heal (s) "
         "| dups | expectation |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['i']} | {r['start'] - t0:.0f} | {r['kind']} | {r.get('resolved') or r.get('target')} | "
                 f"{r['heal'] - r['start']:.1f} | {r['acks_during']} | {r['longest_gap_s']:.1f} | "
                 f"{fmt(r['recover_s'], 2)} | {r['dups']} | {r['expect']} |")
    if v["lost_msgids"]:
        L += ["", "Lost msgids (first 50): " + ", ".join(v["lost_msgids"])]
    if v["fenced_ack_examples"]:
        L += ["", "Fenced acks (first 10): " + json.dumps(v["fenced_ack_examples"])]
    if v["unexplained_examples"]:
        L += ["", "Unexplained duplicates (first 10): " + json.dumps(v["unexplained_examples"])]
    L += ["", "![throughput and latency](nemesis.svg)", ""]
    with open(os.path.join(out, "summary.md"), "w") as f:
        f.write("\n".join(L))


def write_svg(out, run, ack_events, execs, lat, rows):
    t0 = run["started"]
    t1 = max([t for t, _, _ in ack_events] + [r["heal"] for r in rows] + [t0 + 1])
    W, H, ml, mr = 1100, 520, 60, 20
    top1, h1, top2, h2 = 40, 190, 290, 190
    span = max(t1 - t0, 1.0)
    x = lambda t: ml + (t - t0) / span * (W - ml - mr)  # noqa: E731
    first_acks = {}
    for t, m, _ in ack_events:
        first_acks.setdefault(m, t)
    acks_s, exec_s = Counter(int(t - t0) for t in first_acks.values()), Counter()
    for ts in execs.values():
        for t in ts:
            exec_s[int(t - t0)] += 1
    secs = range(int(span) + 1)
    ymax = max([1] + list(acks_s.values()) + list(exec_s.values())) * 1.1
    y1 = lambda v: top1 + h1 - v / ymax * h1  # noqa: E731
    by_sec = defaultdict(list)
    for t, l in lat:
        by_sec[int(t - t0)].append(max(l, 0.0005))
    import math
    lo, hi = math.log10(0.001), math.log10(max([1.0] + [l for _, l in lat]) * 1.5)
    y2 = lambda v: top2 + h2 - (math.log10(max(v, 0.001)) - lo) / (hi - lo) * h2  # noqa: E731
    S = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">',
         f'<rect width="{W}" height="{H}" fill="white"/>',
         f'<text x="{ml}" y="16" font-size="13">nemesis run {run["id"]}, seed {run["seed"]}, schedule '
         f'{run["schedule_kind"]}: jobs acknowledged/s (blue, first ack of each), executions/s (green)</text>',
         f'<text x="{ml}" y="{top2 - 8}" font-size="13">ack latency (first send to first ack) per second: p50 '
         f'(black), max (red), log scale. Faults shaded orange (fault) and yellow (heal to first ack)</text>']
    for r in rows:
        xa, xb = x(r["start"]), x(r["heal"])
        xr = x(r["recovered"]) if r.get("recovered") else xb
        for top, h in ((top1, h1), (top2, h2)):
            S.append(f'<rect x="{xa:.1f}" y="{top}" width="{max(xb - xa, 1):.1f}" height="{h}" fill="#f4b183" '
                     f'fill-opacity="0.45"/>')
            S.append(f'<rect x="{xb:.1f}" y="{top}" width="{max(xr - xb, 0):.1f}" height="{h}" fill="#ffe699" '
                     f'fill-opacity="0.45"/>')
        label = f'{r["i"]}:{r["kind"]}' if len(rows) <= 30 else str(r["i"])
        S.append(f'<text x="{xa + 2:.1f}" y="{top1 + 10 + (r["i"] % 4) * 11}" font-size="9">{label}</text>')
    for top, h in ((top1, h1), (top2, h2)):
        S.append(f'<rect x="{ml}" y="{top}" width="{W - ml - mr}" height="{h}" fill="none" stroke="#888"/>')
    for v in (0, ymax / 1.1 / 2, ymax / 1.1):
        S.append(f'<text x="{ml - 4}" y="{y1(v) + 4:.1f}" text-anchor="end">{v:.0f}</text>')
    for e in range(int(math.floor(lo)), int(math.ceil(hi)) + 1):
        v = 10 ** e
        if lo <= e <= hi:
            lab = f"{v * 1000:.0f} ms" if v < 1 else f"{v:.0f} s"
            S.append(f'<text x="{ml - 4}" y="{y2(v) + 4:.1f}" text-anchor="end">{lab}</text>')
            S.append(f'<line x1="{ml}" x2="{W - mr}" y1="{y2(v):.1f}" y2="{y2(v):.1f}" stroke="#ddd"/>')
    step = max(10, int(span / 10 // 10 * 10) or 10)
    for s in range(0, int(span) + 1, step):
        S.append(f'<text x="{x(t0 + s):.1f}" y="{top2 + h2 + 14}" text-anchor="middle">{s} s</text>')
    for series, color in ((acks_s, "#1f4e9c"), (exec_s, "#2e8b57")):
        pts = " ".join(f"{x(t0 + s + 0.5):.1f},{y1(series.get(s, 0)):.1f}" for s in secs)
        S.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1"/>')
    runs, cur = [], []
    for s in sorted(by_sec):
        if cur and s != cur[-1] + 1:
            runs.append(cur)
            cur = []
        cur.append(s)
    if cur:
        runs.append(cur)
    for fn, color in ((lambda l: statistics.median(l), "black"), (max, "#c00000")):
        for run_ in runs:
            pts = " ".join(f"{x(t0 + s + 0.5):.1f},{y2(fn(by_sec[s])):.1f}" for s in run_)
            if len(run_) == 1:
                S.append(f'<circle cx="{x(t0 + run_[0] + 0.5):.1f}" cy="{y2(fn(by_sec[run_[0]])):.1f}" r="1.5" '
                         f'fill="{color}"/>')
            else:
                S.append(f'<polyline points="{pts}" fill="none" stroke="{color}" stroke-width="1"/>')
    S.append("</svg>")
    with open(os.path.join(out, "nemesis.svg"), "w") as f:
        f.write("\n".join(S))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: check.py OUT")
    sys.exit(main(sys.argv[1]))
