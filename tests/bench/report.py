#!/usr/bin/env python3
"""Turns the benchmark's raw JSON lines (tests/bench/run.sh) into the markdown tables of results.md.

Per-call figures: each run reports the median over its repetitions; across the alternating rounds the best
(lowest) median counts, and every round's value is listed so the noise is visible. Throughput: the best
round counts. Verdicts compare with the targets of docs/performance.md; they inform, they never fail
the run (performance targets are numbers to read, not timed tests).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import sys
from collections import defaultdict

PAIR_TARGET_NS = 200.0
START_TARGET_RATIO = 1.5
PROCS_TARGET_RATIO = 0.90
LAUNCH_TOLERANCE = 0.05  # "unchanged": within 5% or 10 ns, whichever is larger
LAUNCH_TOLERANCE_NS = 10.0


def load(path):
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"report: {path}:{n}: not JSON ({e})")
    return rows


def rounds_of(rows, bench, config, field, **match):
    vals = [r[field] for r in rows
            if r.get("bench") == bench and r.get("config") == config and field in r
            and all(r.get(k) == v for k, v in match.items())]
    return vals


def fmt(v, unit=""):
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:.1f}{unit}"


def spread(vals, unit=""):
    return ", ".join(fmt(v, unit) for v in vals)


def verdict(ok):
    if ok is None:
        return "n/a"
    return "met" if ok else "**missed**"


def per_call_table(rows):
    out = ["| call | bare driver | with libvgpu (quota set) | added | ratio | libvgpu, no quota | target | verdict |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    for bench, label in (("pair", "cuMemAlloc_v2 + cuMemFree_v2 pair"), ("meminfo", "cuMemGetInfo_v2"),
                         ("launch", "cuLaunchKernel (empty kernel)")):
        bare = rounds_of(rows, bench, "bare", "ns_median")
        vgpu = rounds_of(rows, bench, "vgpu", "ns_median")
        nolim = rounds_of(rows, bench, "vgpu-nolimit", "ns_median")
        if not bare or not vgpu:
            continue
        b, v = min(bare), min(vgpu)
        nl = min(nolim) if nolim else None
        added, ratio = v - b, v / b if b else None
        if bench == "pair":
            target, ok = f"< {PAIR_TARGET_NS:.0f} ns added", added < PAIR_TARGET_NS
        elif bench == "launch":
            target, ok = "unchanged", abs(v - b) <= max(LAUNCH_TOLERANCE * b, LAUNCH_TOLERANCE_NS)
        else:
            target, ok = "(none)", None
        out.append(f"| {label} | {fmt(b, ' ns')} | {fmt(v, ' ns')} | {fmt(added, ' ns')} | "
                   f"{ratio:.2f}x | {fmt(nl, ' ns')} | {target} | {verdict(ok)} |")
        sm = rounds_of(rows, bench, "vgpu-sm50", "ns_median")
        sm99 = rounds_of(rows, bench, "vgpu-sm99", "ns_median")
        over = rounds_of(rows, bench, "vgpu-over", "ns_median")
        free = rounds_of(rows, bench, "vgpu-over-free", "ns_median")
        notes.append(f"- {bench}: bare rounds {spread(bare)}; with libvgpu {spread(vgpu)}"
                     + (f"; no quota {spread(nolim)}" if nolim else "")
                     + (f"; under a 50% compute share (nothing in flight: one launch in eight timed, two events) {spread(sm)}" if sm else "")
                     + (f"; under a 99% share, unmeasured launches allowed (VGPU_COMPUTE_METERED=0) {spread(sm99)}" if sm99 else "")
                     + (f"; oversubscribed, turn gate with no arbiter {spread(over)}" if over else "")
                     + (f"; oversubscribed, the arbiter's Free {spread(free)}" if free else "")
                     + " (ns, median of each run)")
    return out, notes


def start_table(rows):
    none = rounds_of(rows, "start", "none", "us_median")
    empty = rounds_of(rows, "start", "empty", "us_median")
    vgpu = rounds_of(rows, "start", "vgpu", "us_median")
    e_adds = rounds_of(rows, "start", "empty", "us_added_median")
    v_adds = rounds_of(rows, "start", "vgpu", "us_added_median")
    if not (none and empty and vgpu and e_adds and v_adds):
        return [], []
    # Spawns of the three configurations alternate, so each round's median paired difference is the
    # steadiest estimate of what a preload adds; the median over rounds is reported.
    n, e, v = statistics.median(none), statistics.median(empty), statistics.median(vgpu)
    e_add, v_add = statistics.median(e_adds), statistics.median(v_adds)
    ratio = v_add / e_add if e_add > 0 else None
    out = ["| /bin/true | median start+exit | added by the preload (median paired difference) |",
           "| --- | --- | --- |",
           f"| no preload | {fmt(n, ' µs')} | |",
           f"| LD_PRELOAD=empty.so (the loader's floor) | {fmt(e, ' µs')} | {fmt(e_add, ' µs')} |",
           f"| LD_PRELOAD=libvgpu.so | {fmt(v, ' µs')} | {fmt(v_add, ' µs')} |"]
    d_adds = rounds_of(rows, "start", "empty-deps", "us_added_median")
    d = rounds_of(rows, "start", "empty-deps", "us_median")
    if d_adds and d:
        out.append(f"| LD_PRELOAD=empty-deps.so (empty, needing libpthread.so.0 + libdl.so.2) | "
                   f"{fmt(statistics.median(d), ' µs')} | {fmt(statistics.median(d_adds), ' µs')} |")
    out += ["",
           f"libvgpu.so's cost / an empty object's cost: **{ratio:.2f}x** (target ≤ {START_TARGET_RATIO}x: "
           f"{verdict(ratio <= START_TARGET_RATIO)})" if ratio is not None else
           "libvgpu.so's cost / an empty object's cost: n/a (the empty object added nothing measurable)"]
    notes = [f"- start: rounds' medians none {spread(none)}; empty {spread(empty)}; libvgpu {spread(vgpu)} (µs)",
             f"- start: rounds' added cost empty {spread(e_adds)}; libvgpu {spread(v_adds)} (µs)"]
    return out, notes


def procs_table(rows):
    counts = sorted({r["procs"] for r in rows if r.get("bench") == "procs"})
    if not counts:
        return [], []
    out = ["| processes | bare driver (pairs/s) | with libvgpu (pairs/s) | ratio | target | verdict | "
           "bare N/1 | libvgpu N/1 |",
           "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    notes = []
    one = {}
    for p in counts:
        bare = rounds_of(rows, "procs", "bare", "pairs_per_s", procs=p)
        vgpu = rounds_of(rows, "procs", "vgpu", "pairs_per_s", procs=p)
        if not bare or not vgpu:
            continue
        b, v = max(bare), max(vgpu)
        if p == counts[0]:
            one = {"bare": b, "vgpu": v}
        ratio = v / b
        out.append(f"| {p} | {fmt(b)} | {fmt(v)} | {ratio:.2f}x | ≥ {PROCS_TARGET_RATIO:.2f}x | "
                   f"{verdict(ratio >= PROCS_TARGET_RATIO)} | {b / one['bare']:.2f} | {v / one['vgpu']:.2f} |")
        notes.append(f"- {p} processes: bare rounds {spread(bare)}; with libvgpu {spread(vgpu)} (pairs/s)")
        # Rounds alternate bare and libvgpu, so round i of each ran under the same machine state: their ratio
        # is the paired measure, and its median is robust to one slow or fast round of either.
        paired = [v / b for b, v in zip(bare, vgpu) if b]
        if len(paired) > 1:
            med = statistics.median(paired)
            notes.append(f"  paired by round: {', '.join(f'{r:.3f}' for r in paired)}; median **{med:.3f}x**")
    # Without any contention, a library adding c ns to a pair of cost b can reach at most b / (b + c) of
    # the bare throughput; where the driver is fast (the fake) that bound, not contention, sets the ratio.
    bare_pair = rounds_of(rows, "pair", "bare", "ns_median")
    vgpu_pair = rounds_of(rows, "pair", "vgpu", "ns_median")
    if bare_pair and vgpu_pair:
        bound = min(bare_pair) / min(vgpu_pair)
        notes.append(f"- per-call bound: bare pair {fmt(min(bare_pair), ' ns')} / with libvgpu "
                     f"{fmt(min(vgpu_pair), ' ns')} = {bound:.2f}x is the best ratio any process count can show "
                     "without contention; the N/1 columns show how each configuration scales with processes "
                     "(contention would make libvgpu's fall faster than the bare driver's).")
    return out, notes


def ledger_table(rows, text_path):
    led = [r for r in rows if r.get("config") == "ledger"]
    out = []
    if led:
        keys = [k for k in led[0] if k not in ("config", "round")]
        out = ["| " + " | ".join(keys) + " |", "| " + " | ".join("---" for _ in keys) + " |"]
        for r in led:
            out.append("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    elif text_path and os.path.exists(text_path) and os.path.getsize(text_path) > 0:
        with open(text_path) as f:
            out = ["```", f.read().rstrip(), "```"]
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("raw")
    ap.add_argument("markdown")
    ap.add_argument("--driver", default="fake")
    ap.add_argument("--ledger-text")
    a = ap.parse_args()
    rows = load(a.raw)
    cfg = {}
    for r in rows:
        for k in ("iters", "reps", "bytes", "runs"):
            if k in r:
                cfg.setdefault((r.get("bench"), k), r[k])
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    driver = "the project's fake driver" if a.driver == "fake" else "the installed CUDA driver"
    md = [f"# Benchmark results ({now})", "",
          f"Host: {platform.node()}, {os.cpu_count()} CPUs, {platform.machine()}; driver: {driver}.",
          "Each figure is the best of the alternating rounds; the rounds are listed under each table.", ""]
    t, n = per_call_table(rows)
    if t:
        md += ["## Cost per call", "",
               f"ns per call, median of {cfg.get(('pair', 'reps'), '?')} repetitions of "
               f"{cfg.get(('pair', 'iters'), '?')} pairs ({cfg.get(('pair', 'bytes'), '?')} bytes) / "
               f"{cfg.get(('meminfo', 'iters'), '?')} calls.", ""] + t + [""] + n + [""]
    t, n = start_table(rows)
    if t:
        md += ["## Start of a non-CUDA process", "",
               f"{cfg.get(('start', 'runs'), '?')} spawns of /bin/true per configuration and round, waited for "
               "one at a time, the configurations interleaved spawn by spawn; figures are medians over the "
               "rounds.",
               ""] + t + [""] + n + [""]
    t, n = procs_table(rows)
    if t:
        md += ["## Aggregate alloc/free throughput, several processes", "",
               "Processes forked before CUDA starts, each with its own context, all charging one quota "
               "(one CUDA_DEVICE_MEMORY_SHARED_CACHE); throughput = all pairs / (last end - first start).",
               ""] + t + [""] + n + [""]
    t = ledger_table(rows, a.ledger_text)
    if t:
        md += ["## The ledger alone (ledger/examples/bench.rs)", ""] + t + [""]
    with open(a.markdown, "w") as f:
        f.write("\n".join(md))


if __name__ == "__main__":
    main()
