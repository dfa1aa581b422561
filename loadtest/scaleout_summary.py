#!/usr/bin/env python3
"""summary.md and scaleout.svg of a loadtest/scaleout.sh results directory.

usage: scaleout_summary.py DIR "QUOTA PERIOD"

Reads DIR/runs.csv (one line per run: jobs/s, each owner's CPU seconds,
STATUS accepted_jobs and share of throttled periods, the NATS servers' CPU,
emq-bench's CPU, the machine's busy cores, the load average) and each
run's emq-bench JSON (producer CPU per job), and writes per durability:
the median jobs/s per owner count with its runs, the ratios of the
medians to one owner, each owner's CPU against its quota, the NATS
servers' and emq-bench's CPU, the machine's, and what saturated.
The SVG plots jobs/s against owners: every run a dot, the medians joined,
and the linear line from one owner's median.
"""
import csv
import json
import os
import statistics
import sys

out_dir, cpu_max = sys.argv[1], sys.argv[2]
quota_us, period_us = (int(x) for x in cpu_max.split())
QUOTA = quota_us / period_us  # cores per owner


def r_has(rows, key):
    return all(r.get(key) for r in rows)


def floats(text):
    return [float(x) for x in text.split()] if text.strip() else []


rows = list(csv.DictReader(open(os.path.join(out_dir, "runs.csv"))))
for r in rows:
    name = f"{r['durability']}-{r['owners']}-r{r['round']}"
    try:
        extra = json.load(open(os.path.join(out_dir, name + ".json")))["results"][0].get("extra") or {}
    except (OSError, ValueError, KeyError, IndexError):
        extra = {}
    r["producer_us"] = extra.get("producer_cpu_us_per_job")
    r["name"] = name
cores = os.cpu_count() or 1
machine = open(os.path.join(out_dir, "machine.txt")).read().strip() if os.path.exists(os.path.join(out_dir, "machine.txt")) else ""
failed = open(os.path.join(out_dir, "failed.txt")).read().strip() if os.path.exists(os.path.join(out_dir, "failed.txt")) else ""

med = statistics.median
lines = ["# Scale-out over owners (loadtest/scaleout.sh)", "", "```", machine, "```", ""]
lines += [
    f"Each owner (an emq-router of its own router name) runs in a control group of its own limited to "
    f"{quota_us} µs of CPU every {period_us} µs ({QUOTA:.2f} core). One emq-bench spreads its REQUESTs "
    f"round-robin over the owners (one DEALER per owner in each client) and splits its workers over them. "
    f"Runs interleaved (1, 2, 3 owners, then again), medians; [min–max] of the runs in brackets.",
    "",
]
if failed:
    lines += ["**Failed runs:**", "", "```", failed, "```", ""]

series = {}
for dur in dict.fromkeys(r["durability"] for r in rows):
    rs = [r for r in rows if r["durability"] == dur]
    counts = sorted({int(r["owners"]) for r in rs})
    lines += [f"## durability `{dur}`", ""]
    lines += [
        "| owners | jobs/s (median) | runs | ÷ 1 owner | owner CPU, cores (quota " + f"{QUOTA:.2f})"
        + " | periods throttled | owner CPU per job | jobs per owner (STATUS) | NATS cores | NATS CPU per job"
        + " | busiest NATS server, cores | disk busy | disk writes/s"
        + " | emq-bench cores | emq-bench CPU per job | producer CPU per job | machine busy cores | load avg |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    base = None
    meds = {}
    verdicts = []
    for n in counts:
        g = [r for r in rs if int(r["owners"]) == n]
        jps = [float(r["jobs_per_s"]) for r in g]
        m = med(jps)
        meds[n] = (m, jps)
        if n == 1:
            base = m
        walls = [float(r["wall_s"]) for r in g]
        owner_cores = [c / w for r, w in zip(g, walls) for c in floats(r["owner_cpu_s"])]
        throttled = [t for r in g for t in floats(r["owner_throttled_pct"])]
        acc = [floats(r["owner_accepted"]) for r in g]
        owner_us = [sum(floats(r["owner_cpu_s"])) / max(sum(a), 1) * 1e6 for r, a in zip(g, acc)]
        nats_cores = [float(r["nats_cpu_s"]) / w for r, w in zip(g, walls)]
        nats_us = [float(r["nats_cpu_s"]) / max(sum(a), 1) * 1e6 for r, a in zip(g, acc)]
        bench_cores = [float(r["bench_cpu_s"]) / w for r, w in zip(g, walls)]
        bench_us = [float(r["bench_cpu_us_per_job"]) for r in g]
        prod_us = [float(r["producer_us"]) for r in g if r["producer_us"] is not None]
        busy = [float(r["machine_busy_cores"]) for r in g]
        loads = [float(r["loadavg"]) for r in g]
        spread = max((max(a) - min(a)) / (sum(a) / len(a)) for a in acc if a and sum(a) > 0) if any(acc) else 0
        per_owner = f"{med([sum(a) / len(a) for a in acc if a]):,.0f} (spread ≤ {100 * spread:.2f} %)"
        nats_max = [max(floats(r.get("nats_server_cpu_s") or "0")) / w for r, w in zip(g, walls)]
        disk = [float(r["disk_io_ms"]) / (w * 1000) for r, w in zip(g, walls) if r.get("disk_io_ms")]
        writes = [float(r["disk_writes"]) / w for r, w in zip(g, walls) if r.get("disk_writes")]
        nmax = f"{med(nats_max):.2f}" if dur == "replicated" and r_has(g, "nats_server_cpu_s") else "–"
        dbusy = f"{100 * med(disk):.0f} %" if disk else "–"
        dw = f"{med(writes):,.0f}" if writes else "–"
        ratio = f"{m / base:.2f} ×" if base else "–"
        nats = f"{med(nats_cores):.2f}" if dur == "replicated" else "–"
        nats_pj = f"{med(nats_us):.1f} µs" if dur == "replicated" else "–"
        prod = f"{med(prod_us):.2f} µs" if prod_us else "–"
        lines.append(
            f"| {n} | **{m:,.0f}** | {', '.join(f'{x:,.0f}' for x in jps)} | {ratio} | "
            f"{med(owner_cores):.3f} [{min(owner_cores):.3f}–{max(owner_cores):.3f}] | {med(throttled):.0f} % | "
            f"{med(owner_us):.1f} µs | {per_owner} | {nats} | {nats_pj} | {nmax} | {dbusy} | {dw} | {med(bench_cores):.2f} | "
            f"{med(bench_us):.1f} µs | {prod} | {med(busy):.2f} of {cores} | {min(loads):.1f}–{max(loads):.1f} |"
        )
        ours = med(owner_cores) * n + med(bench_cores) + (med(nats_cores) if dur == "replicated" else 0)
        at_quota = med(owner_cores) >= 0.9 * QUOTA
        machine_full = med(busy) >= 0.95 * cores
        if at_quota:
            what = f"the owners: each at {med(owner_cores) / QUOTA:.0%} of its quota"
        elif machine_full:
            what = "the machine's CPU (the owners below their quota)"
        else:
            what = "neither the owners' quota nor the machine's CPU"
        verdicts.append(
            f"* {n} owner{'s' if n > 1 else ''}: saturated: **{what}**; this load's own processes "
            f"(owners{', NATS' if dur == 'replicated' else ''}, emq-bench) kept {ours:.2f} of the {cores} cores busy, "
            f"the machine {med(busy):.2f}"
            + (" (the rest: other processes on the shared machine)" if med(busy) - ours > 0.1 else "")
            + "."
        )
    series[dur] = meds
    lines.append("")
    if base:
        parts = [f"{n} owners ÷ 1 = **{meds[n][0] / base:.2f} ×**" for n in counts if n != 1]
        lines += ["Ratios of the medians: " + ", ".join(parts) + " (targets: 2 ≥ 1.8 ×, 3 ≥ 2.5 ×).", ""]
    lines += verdicts + [""]
    prod_by_n = {}
    for n in counts:
        p = [float(r["producer_us"]) for r in rs if int(r["owners"]) == n and r["producer_us"] is not None]
        if p:
            prod_by_n[n] = med(p)
    if 1 in prod_by_n and len(prod_by_n) > 1:
        lines += [
            "Client-side cost of spreading: emq-bench's producer threads (its eMQP clients, each with one DEALER "
            "per owner; thread CPU time over the run, per job) spent "
            + ", ".join(f"{prod_by_n[n]:.2f} µs per job with {n} owner{'s' if n > 1 else ''}" for n in sorted(prod_by_n))
            + " ("
            + ", ".join(f"{n}/1 = {prod_by_n[n] / prod_by_n[1]:.2f} ×" for n in sorted(prod_by_n) if n != 1)
            + "). emq-bench's whole CPU per job (producers and its in-process workers) is in the table.",
            "",
        ]
lines += [
    "Columns: owner CPU from `/proc/<pid>/stat` over the bench's run (setup and drain included), per owner; "
    "periods throttled from the group's `cpu.stat`; owner and NATS CPU per job over the jobs the owners' STATUS "
    "counted (`accepted_jobs`, warm-up included; jobs per owner: the runs' median of the owners' mean, and the largest "
    "difference between two owners of one run over their mean); disk busy: the disks' I/O time over the run's wall time "
    "(`/proc/diskstats`, all processes); emq-bench's CPU from its own `/proc` (`--pid`), its producer "
    "CPU from its client threads' CPU clocks; machine busy cores from `/proc/stat`.",
    "",
    "![jobs/s against owners](scaleout.svg)",
    "",
]
open(os.path.join(out_dir, "summary.md"), "w").write("\n".join(lines))

# The plot: jobs/s against owners.
W, H, L, R, T, B = 720, 460, 80, 200, 50, 60
all_n = sorted({n for s in series.values() for n in s})
ymax = max([x for s in series.values() for _, (_, js) in s.items() for x in js] + [1])
lin = [series[d][1][0] * n for d in series if 1 in series[d] for n in all_n]
ymax = max([ymax] + lin) * 1.1
xmin, xmax = min(all_n) - 0.3, max(all_n) + 0.3


def px(n):
    return L + (n - xmin) / (xmax - xmin) * (W - L - R)


def py(v):
    return H - B - v / ymax * (H - T - B)


colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
svg = [
    f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">',
    f'<rect width="{W}" height="{H}" fill="white"/>',
    f'<text x="{(W - R + L) / 2}" y="25" text-anchor="middle" font-size="16">jobs/s against owners '
    f"(each owner {QUOTA:.2f} core)</text>",
    f'<line x1="{L}" y1="{H - B}" x2="{W - R}" y2="{H - B}" stroke="black"/>',
    f'<line x1="{L}" y1="{T}" x2="{L}" y2="{H - B}" stroke="black"/>',
    f'<text x="{(W - R + L) / 2}" y="{H - 15}" text-anchor="middle">owners (router names)</text>',
    f'<text x="18" y="{(H - B + T) / 2}" text-anchor="middle" transform="rotate(-90 18 {(H - B + T) / 2})">jobs/s</text>',
]
for n in all_n:
    svg.append(f'<text x="{px(n):.1f}" y="{H - B + 18}" text-anchor="middle">{n}</text>')
step = 10 ** max(len(str(int(ymax))) - 2, 0)
while ymax / step > 8:
    step *= 2
v = 0
while v <= ymax:
    svg.append(f'<line x1="{L - 4}" y1="{py(v):.1f}" x2="{W - R}" y2="{py(v):.1f}" stroke="#ddd"/>')
    svg.append(f'<text x="{L - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    v += step
ly = T + 10
for i, (dur, s) in enumerate(series.items()):
    c = colors[i % len(colors)]
    ns = sorted(s)
    svg.append(
        '<polyline fill="none" stroke-width="2" stroke="' + c + '" points="'
        + " ".join(f"{px(n):.1f},{py(s[n][0]):.1f}" for n in ns) + '"/>'
    )
    for n in ns:
        for x in s[n][1]:
            svg.append(f'<circle cx="{px(n):.1f}" cy="{py(x):.1f}" r="3" fill="{c}" fill-opacity="0.6"/>')
    if 1 in s:
        svg.append(
            '<polyline fill="none" stroke-dasharray="5,4" stroke="' + c + '" points="'
            + " ".join(f"{px(n):.1f},{py(s[1][0] * n):.1f}" for n in ns) + '"/>'
        )
    svg.append(f'<line x1="{W - R + 15}" y1="{ly}" x2="{W - R + 40}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
    svg.append(f'<text x="{W - R + 45}" y="{ly + 4}">{dur}: medians</text>')
    svg.append(f'<line x1="{W - R + 15}" y1="{ly + 18}" x2="{W - R + 40}" y2="{ly + 18}" stroke="{c}" stroke-dasharray="5,4"/>')
    svg.append(f'<text x="{W - R + 45}" y="{ly + 22}">{dur}: linear</text>')
    ly += 44
svg.append(f'<text x="{W - R + 15}" y="{ly + 4}">dots: single runs</text>')
svg.append("</svg>")
open(os.path.join(out_dir, "scaleout.svg"), "w").write("\n".join(svg) + "\n")
print(open(os.path.join(out_dir, "summary.md")).read())
