#!/usr/bin/env python3
"""Summarizes a loadtest results directory: summary.md with the machine,
per scenario and target the median of the runs (throughput, p50, p99,
p99.9, max), the broker's CPU per job where recorded, the throughput ratios
emq/forwarder, emq/baseline, emq/python and emq/beanstalkd (and the CPU-per-job ratios), a table of
every emq target against each zero-logic forwarder (forwarder, forwarder-emqp, baseline,
baseline-emqp: throughput, CPU per job, p50 and p99), the cores the broker and the load generator
kept busy, and one SVG per scenario overlaying each target's median run (via `emq-bench plot`).
With replicated runs (targets emq-replicated, jetstream: loadtest/replicated.sh) a table of
jobs/s, acknowledgement latency, CPU per job of router, nats-servers and load generator, the
cores each kept busy, the load average at each run's start (loadavg.txt), and the ratios
replicated/sync, replicated/memory and replicated/jetstream.

usage: summarize.py RESULTS_DIR EMQ_BENCH_BINARY
"""
import json
import os
import re
import statistics
import subprocess
import sys


def main(out, bench):
    runs = {}  # (scenario, target) -> [(json path, result)]
    machine, loadavg = None, open("/proc/loadavg").read().split()[:3]
    for name in sorted(os.listdir(out)):
        m = re.fullmatch(r"(.+)-(\d+)\.json", name)
        if not m:
            continue
        rec = json.load(open(os.path.join(out, name)))
        machine = machine or rec["machine"]
        for r in rec["results"]:
            # <scenario>-<target>-<run>.json; targets may hold dashes (emq-memory).
            scen = m.group(1).removesuffix("-" + r["target"])
            runs.setdefault((scen, r["target"]), []).append((name[:-5], r))
    lines = ["# Load test results", ""]
    if machine:
        lines += [f"* machine: {machine['host']}, {machine['cores']} cores, {machine['cpu']}",
                  f"* date: {machine['date']}", f"* git revision: {machine['git_revision']}",
                  f"* load average after the runs: {' '.join(loadavg)} (the machine is shared)", ""]
    lines += ["Latency = client send → worker (or consumer) receives the job; throughput = measured jobs",
              "received per second. Medians over the runs (n); ranges of throughput in brackets.", "",
              "| scenario | target | n | jobs/s (median) [min–max] | p50 ms | p99 ms | p99.9 ms | max ms | lost |",
              "|---|---|---|---|---|---|---|---|---|"]
    medians, plotted, cpu = {}, set(), {}
    for (scen, target), rs in sorted(runs.items()):
        tp = [r["throughput_per_s"] for _, r in rs]
        med = lambda k: statistics.median(r["latency_ms"][k] for _, r in rs)
        medians[(scen, target)] = statistics.median(tp)
        extra = rs[0][1].get("extra")
        if extra and "broker_cpu_us_per_job" in extra:
            cpu[(scen, target)] = sorted(r["extra"]["broker_cpu_us_per_job"] for _, r in rs)
        elif extra and "broker_cpu_percent_of_one_core" in extra:
            share = sorted(r["extra"]["broker_cpu_percent_of_one_core"] or 0.0 for _, r in rs)
            lines.append(f"| {scen} | {target} | {len(rs)} | broker CPU {statistics.median(share):.1f} % of a core "
                         f"(runs: {', '.join(f'{c:.1f}' for c in share)}), {extra.get('total_workers')} workers | | | | | |")
            continue
        elif extra and "jobs_per_s" not in extra:
            lines.append(f"| {scen} | {target} | {len(rs)} | {json.dumps(extra)} | | | | | |")
            continue
        lines.append(f"| {scen} | {target} | {len(rs)} | {statistics.median(tp):.0f} [{min(tp):.0f}–{max(tp):.0f}] "
                     f"| {med('p50'):.3f} | {med('p99'):.3f} | {med('p999'):.3f} | {med('max'):.3f} "
                     f"| {sum(r['lost'] for _, r in rs)} |")
        if scen not in plotted:
            plotted.add(scen)
            plot_median(out, bench, scen, runs)
    lines += ["", "## Throughput ratios (medians)", ""]
    for scen in sorted({s for s, _ in medians}):
        emq = medians.get((scen, "emq"))
        for other in FORWARDERS + ("python", "beanstalkd", "emq-memory", "beanstalkd-b0", "beanstalkd-b50"):
            if emq and medians.get((scen, other)):
                lines.append(f"* {scen}: emq/{other} = {emq / medians[(scen, other)]:.3f}")
        if emq and medians.get((scen, "emq-curve")):
            lines.append(f"* {scen}: emq-curve/emq (CURVE against plain) = {medians[(scen, 'emq-curve')] / emq:.3f}")
        for plain, tls in (("emq", "emq-tls"), ("emq-memory", "emq-memory-tls")):
            if medians.get((scen, plain)) and medians.get((scen, tls)):
                ratio = medians[(scen, tls)] / medians[(scen, plain)]
                lines.append(f"* {scen}: {tls}/{plain} (text over TLS against plain) = {ratio:.3f}")
        memory = medians.get((scen, "emq-memory"))
        if memory and medians.get((scen, "beanstalkd")):
            lines.append(f"* {scen}: emq-memory/beanstalkd = {memory / medians[(scen, 'beanstalkd')]:.3f}")
        for mine in ("emq-shard-sync", "emq-async"):
            if memory and medians.get((scen, mine)):
                lines.append(f"* {scen}: {mine}/emq-memory = {medians[(scen, mine)] / memory:.3f}")
        for (s2, target), tp in sorted(medians.items()):
            before = medians.get((scen, target + "-before"))
            if s2 == scen and tp and before:
                lines.append(f"* {scen}: {target}/{target}-before (A/B of two builds) = {tp / before:.3f}")
    if cpu:
        lines += ["", "## Broker CPU per job (user + system, warm-up jobs included)", "",
                  "The broker's CPU time over the run divided by the jobs its consumers received: on a",
                  "small shared machine this is the cost that competes with the load generator for cores.", ""]
        for (scen, target), us in sorted(cpu.items()):
            lines.append(f"* {scen} {target}: {statistics.median(us):.1f} µs/job (runs: "
                         f"{', '.join(f'{u:.1f}' for u in us)})")
        for scen in sorted({s for s, _ in cpu}):
            emq = cpu.get((scen, "emq"))
            for other in FORWARDERS + ("beanstalkd", "emq-memory", "beanstalkd-b0"):
                if emq and cpu.get((scen, other)):
                    ratio = statistics.median(emq) / statistics.median(cpu[(scen, other)])
                    lines.append(f"* {scen}: emq/{other} CPU per job = {ratio:.3f}")
            for (s2, target), us in sorted(cpu.items()):
                before = cpu.get((scen, target + "-before"))
                if s2 == scen and before:
                    ratio = statistics.median(us) / statistics.median(before)
                    lines.append(f"* {scen}: {target}/{target}-before CPU per job (A/B of two builds) = {ratio:.3f}")
            if emq and cpu.get((scen, "emq-curve")):
                ratio = statistics.median(cpu[(scen, "emq-curve")]) / statistics.median(emq)
                lines.append(f"* {scen}: emq-curve/emq CPU per job (CURVE against plain) = {ratio:.3f}")
            for plain, tls in (("emq", "emq-tls"), ("emq-memory", "emq-memory-tls")):
                if cpu.get((scen, plain)) and cpu.get((scen, tls)):
                    ratio = statistics.median(cpu[(scen, tls)]) / statistics.median(cpu[(scen, plain)])
                    lines.append(f"* {scen}: {tls}/{plain} CPU per job (text over TLS against plain) = {ratio:.3f}")
            memory, bean = cpu.get((scen, "emq-memory")), cpu.get((scen, "beanstalkd"))
            if memory and bean:
                ratio = statistics.median(memory) / statistics.median(bean)
                lines.append(f"* {scen}: emq-memory/beanstalkd CPU per job = {ratio:.3f}")
    lines += forwarder_table(runs, medians, cpu)
    lines += replicated_table(out, runs, medians)
    lines += cores_table(runs, machine)
    acks = {k: rs for k, rs in sorted(runs.items()) if (rs[0][1].get("ack_latency_ms") or {}).get("count")}
    if acks:
        lines += ["", "## Acceptance latency (eMQP: client send → acceptance REPLY), medians over the runs", "",
                  "With durability \"sync\" the REPLY waits for the sync of the batch holding the job;",
                  "workers get the job before that, so throughput above does not wait for it.", "",
                  "| scenario | target | p50 ms | p99 ms | max ms |", "|---|---|---|---|---|"]
        for (scen, target), rs in acks.items():
            med = lambda k: statistics.median(r["ack_latency_ms"][k] for _, r in rs)
            lines.append(f"| {scen} | {target} | {med('p50'):.3f} | {med('p99'):.3f} | {med('max'):.3f} |")
    failed = os.path.join(out, "failed.txt")
    if os.path.exists(failed):
        lines += ["", "## Runs that failed", ""] + [f"* {l.strip()}" for l in open(failed) if l.strip()]
    open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


FORWARDERS = ("forwarder", "forwarder-emqp", "baseline", "baseline-emqp")


def forwarder_table(runs, medians, cpu):
    """Every emq target (emq, emq-memory, …; not the -before builds) against
    every zero-logic forwarder run in the same scenario: ratios of the
    medians of throughput, broker CPU per job, p50 and p99 latency."""
    rows = []
    for scen in sorted({s for s, _ in runs}):
        mine = sorted(t for s, t in runs if s == scen and (t == "emq" or t.startswith("emq-"))
                      and not t.endswith("-before"))
        fwds = [f for f in FORWARDERS if (scen, f) in runs]
        for t in mine:
            for f in fwds:
                lat = lambda target, k: statistics.median(r["latency_ms"][k] for _, r in runs[(scen, target)])
                ratio = lambda a, b: f"{a / b:.2f} ×" if a and b else "–"
                tp = ratio(medians.get((scen, t)), medians.get((scen, f)))
                c_t, c_f = cpu.get((scen, t)), cpu.get((scen, f))
                cpu_cell = (f"{statistics.median(c_t):.1f} / {statistics.median(c_f):.1f} µs "
                            f"({ratio(statistics.median(c_t), statistics.median(c_f))})") if c_t and c_f else "–"
                p50 = f"{lat(t, 'p50'):.3f} / {lat(f, 'p50'):.3f} ms ({ratio(lat(t, 'p50'), lat(f, 'p50'))})"
                p99 = f"{lat(t, 'p99'):.3f} / {lat(f, 'p99'):.3f} ms ({ratio(lat(t, 'p99'), lat(f, 'p99'))})"
                rows.append(f"| {scen} | {t} / {f} | {tp} | {cpu_cell} | {p50} | {p99} |")
    if not rows:
        return []
    return ["", "## emq against the zero-logic forwarders (medians)", "",
            "forwarder and baseline send one message per job (the REQUEST, forwarded unchanged, no",
            "acceptance REPLY); forwarder-emqp and baseline-emqp exchange the five of an eMQP job as",
            "emq-router does (REQUEST in, acceptance REPLY out, job out, job-result REPLY in, READY in).",
            "forwarder* run as processes of their own (CPU per job from /proc), baseline* inside the",
            "load generator. Throughput ratio emq / forwarder (higher is better for emq); CPU and",
            "latency emq / forwarder (lower is better).", "",
            "| scenario | emq / forwarder | jobs/s | broker CPU per job | p50 | p99 |",
            "|---|---|---|---|---|---|"] + rows


def cores_table(runs, machine):
    """Cores kept busy during the runs (medians): broker and load generator
    CPU seconds over the run's wall time, where recorded (`--pid`)."""
    rows = []
    for (scen, target), rs in sorted(runs.items()):
        ex = [r.get("extra") or {} for _, r in rs]
        if not all("wall_s" in e and "bench_cpu_s" in e for e in ex):
            continue
        broker = statistics.median(e["broker_cpu_s"] / e["wall_s"] for e in ex)
        bench = statistics.median(e["bench_cpu_s"] / e["wall_s"] for e in ex)
        servers = statistics.median(e.get("server_cpu_s", 0.0) / e["wall_s"] for e in ex)
        rows.append(f"| {scen} | {target} | {broker:.2f} | {bench:.2f} | {servers:.2f} | {broker + bench + servers:.2f} |")
    if not rows:
        return []
    cores = machine["cores"] if machine else "?"
    return ["", f"## Cores busy (CPU seconds / wall seconds of the run, medians; the machine has {cores})", "",
            "Broker = the target's process; load generator = emq-bench (clients and workers); servers = the",
            "processes given with --server-pids (the nats-servers of replicated runs; 0 without). A total",
            "near the machine's cores means CPU was the limit; a single-threaded broker near 1.00 is its own",
            "limit.", "",
            "| scenario | target | broker | load generator | servers | all |", "|---|---|---|---|---|---|"] + rows


def replicated_table(out, runs, medians):
    """Replicated durability (issue 27): every target of the scenarios that
    hold emq-replicated or jetstream runs, with the figures the issue asks
    for (medians over the runs), then the ratios."""
    scens = sorted({s for s, t in runs if t in ("emq-replicated", "jetstream")})
    if not scens:
        return []
    loads = {}
    path = os.path.join(out, "loadavg.txt")
    if os.path.exists(path):
        for line in open(path):
            name, *avg = line.split()
            loads[name] = float(avg[0])
    med = statistics.median

    def cell(values, fmt="{:.1f}"):
        values = [v for v in values if v is not None]
        return fmt.format(med(values)) if values else "–"

    rows = []
    for scen in scens:
        for target in sorted(t for s, t in runs if s == scen):
            rs = runs[(scen, target)]
            ex = [r.get("extra") or {} for _, r in rs]
            js = target == "jetstream"
            # jetstream: its latency columns are the PubAck latency; emq: the acceptance REPLY's.
            acks = [r["latency_ms"] if js else r.get("ack_latency_ms") for _, r in rs]
            acks = [a for a in acks if a and a.get("count")]
            ack = (f"{med(a['p50'] for a in acks):.2f} / {med(a['p99'] for a in acks):.2f}" if acks
                   else "– (no success reply)")
            client = [e.get("client_cpu_us_per_job") if js else e.get("bench_cpu_us_per_job") for e in ex]
            client_s = [(e["client_cpu_us_per_job"] * e["published"] / 1e6) if js else e.get("bench_cpu_s")
                        for e in ex]
            busy = lambda key_s: cell([(v / e["wall_s"]) if v is not None and e.get("wall_s") else None
                                       for v, e in zip(key_s, ex)], "{:.2f}")
            router_busy = "–" if js else busy([e.get("broker_cpu_s") for e in ex])
            la = [loads[n] for n, _ in rs if n in loads]
            tp = [r["throughput_per_s"] for _, r in rs]
            rows.append(f"| {scen} | {target} | {len(rs)} | {med(tp):,.0f} [{min(tp):,.0f}–{max(tp):,.0f}] | {ack} "
                        f"| {cell([None if js else e.get('broker_cpu_us_per_job') for e in ex])} "
                        f"| {cell([e.get('server_cpu_us_per_job') for e in ex])} | {cell(client)} "
                        f"| {router_busy} / {busy([e.get('server_cpu_s') for e in ex])} / {busy(client_s)} "
                        f"| {f'{min(la):.1f}–{max(la):.1f}' if la else '–'} |")
    lines = ["", "## Replicated durability (issue 27), medians over the runs", "",
             "emq-replicated: durability \"replicated\" (each shard's log a JetStream stream, R3); emq: \"sync\";",
             "emq-memory: \"memory\"; jetstream: `emq-bench jetstream`, one message per job published with its",
             "PubAck awaited (pipelined), consumed and acked, on the same cluster. Ack = client send → acceptance",
             "REPLY (eMQP; the text protocol has no success reply) or, for jetstream, publish → PubAck. CPU per",
             "job: user + system over the run (/proc) of the router, the three nats-servers together and the",
             "load generator (emq-bench; for jetstream the client, which is the whole \"broker\" there). Cores",
             "busy = CPU seconds / wall seconds. Load = the 1-minute load average at each run's start.", "",
             "| scenario | target | n | jobs/s [min–max] | ack p50 / p99 ms | router µs/job | nats-servers µs/job "
             "| client µs/job | cores busy: router / servers / client | load |",
             "|---|---|---|---|---|---|---|---|---|---|"] + rows
    js = [r["throughput_per_s"] for (s, t), rs in runs.items() if t == "jetstream" for _, r in rs]
    lines += ["", "Ratios of median jobs/s:", ""]
    for scen in scens:
        rep = medians.get((scen, "emq-replicated"))
        if not rep:
            continue
        for other, what in (("emq", "sync"), ("emq-memory", "memory")):
            if medians.get((scen, other)):
                lines.append(f"* {scen}: replicated / {what} = {rep / medians[(scen, other)]:.3f}")
        if js:
            lines.append(f"* {scen}: replicated / raw JetStream per-message baseline (median of {len(js)} jetstream "
                         f"runs, {med(js):,.0f} jobs/s) = {rep / med(js):.3f}")
    return lines


def plot_median(out, bench, scen, runs):
    files = []
    for (s, target), rs in sorted(runs.items()):
        if s != scen:
            continue
        rs = sorted(rs, key=lambda x: x[1]["throughput_per_s"])
        stem = rs[len(rs) // 2][0]
        path = os.path.join(out, f"{stem}-{target}.hgrm")
        if os.path.exists(path):
            files.append(path)
    if files:
        svg = os.path.join(out, f"{scen}.svg")
        subprocess.run([bench, "plot", *files, "-o", svg, "--title", f"{scen}: latency by percentile (median runs)"],
                       check=False, stdout=subprocess.DEVNULL)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
