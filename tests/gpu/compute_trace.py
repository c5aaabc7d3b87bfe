#!/usr/bin/env python3
"""Takes a capped pair of tests/gpu/compute_matrix.sh apart (a diagnostic, run on this machine or the GPU's).

    compute_trace.py LOGS CELL [--bin-ms 100] [--timeline]

It also prints each tenant's `lib_us` (the library's CPU time per launch, its own part of the hook: naps and
the driver's launch left out), how many launches went untimed, and the event calls a launch cost (records,
queries and how many said not ready, elapsed-time reads).

LOGS is the matrix's `matrix-logs/` (MATRIX_TRACE=1), CELL e.g. `2048-eager`: reads `c30-CELL.{out,err}` and
`c70-CELL.{out,err}` (the library's `compute trace` lines, the workload's ticks) and `alone-CELL.out` (the
throughput alone). For the measured seconds it prints, per tenant, its GPU time as the library measured and
charged it (per wall second), how long it was held back, what the driver said about sharers, the bucket's
level where the measurement starts and ends (what it drew down is charged beyond the share); then how the
time divides between both running, one alone and neither, and in each case each tenant's throughput
(against the loop alone) and charge per elapsed time. `--timeline` prints every bin.
"""
import argparse
import json
import re
import sys
from collections import Counter

TRACE = re.compile(r"compute trace dev \d+ t_ms (\d+) span_us (\d+) launches (\d+) elapsed_us (\d+) charged_us (\d+) "
                   r"held_us (\d+) beside (\d+) sharers ([\d.]+) read_as ([\d.]+) tokens_us (-?\d+) gate (\w+)"
                   r"(?: lib_us (\d+) nvml_us (\d+) untimed (\d+))?"
                   r"(?: records (\d+) queries (\d+) not_ready (\d+) reads (\d+))?")


def result(path):
    for line in reversed(open(path).read().splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    return None


def traces(path):
    rows = []
    for line in open(path, errors="replace"):
        m = TRACE.search(line)
        if m:
            g = m.groups()
            rows.append(dict(t=int(g[0]), span=int(g[1]) / 1000, launches=int(g[2]), elapsed=int(g[3]) / 1000,
                             charged=int(g[4]) / 1000, held=int(g[5]) / 1000, beside=int(g[6]),
                             sharers=round(float(g[7]), 1), read_as=round(float(g[8]), 1), tokens=int(g[9]) / 1000, gate=g[10],
                             lib=int(g[11] or 0) / 1000, nvml=int(g[12] or 0) / 1000, untimed=int(g[13] or 0),
                             records=int(g[14] or 0), queries=int(g[15] or 0), not_ready=int(g[16] or 0),
                             reads=int(g[17] or 0)))
    return rows


def binned(rows, res, lo, hi, w):
    """Per bin: elapsed, charged, held (ms), launches, matmuls done."""
    n = int((hi - lo) // w)
    bins = [dict(elapsed=0.0, charged=0.0, held=0.0, launches=0, sharers=Counter(), done=0.0) for _ in range(n)]
    for r in rows:
        i = int((r["t"] - lo) // w)
        if 0 <= i < n:
            b = bins[i]
            b["elapsed"] += r["elapsed"]
            b["charged"] += r["charged"]
            b["held"] += r["held"]
            b["launches"] += r["launches"]
            b["sharers"][r["sharers"]] += r["launches"]
    ticks = res["ticks"]
    for (t0, d0), (t1, d1) in zip(ticks, ticks[1:]):
        if t1 <= t0:
            continue
        rate = (d1 - d0) / (t1 - t0)
        for i in range(max(0, int((t0 - lo) // w)), min(n, int((t1 - lo) // w) + 1)):
            a, b = lo + i * w, lo + (i + 1) * w
            ov = min(b, t1) - max(a, t0)
            if ov > 0:
                bins[i]["done"] += rate * ov
    return bins


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("logs")
    ap.add_argument("cell")
    ap.add_argument("--bin-ms", type=float, default=100)
    ap.add_argument("--timeline", action="store_true")
    a = ap.parse_args()
    # A repeated pair's cell is named CELL-rK (compute_matrix.sh, MATRIX_REPEAT); its loop alone ran once.
    alone = result(f"{a.logs}/alone-{re.sub(r'-r[0-9]+$', '', a.cell)}.out")
    alone_per_ms = alone["per_s"] / 1000
    ten = {}
    for s in ("30", "70"):
        res = result(f"{a.logs}/c{s}-{a.cell}.out")
        if res is None:
            sys.exit(f"c{s}-{a.cell}: no RESULT")
        ten[s] = (res, traces(f"{a.logs}/c{s}-{a.cell}.err"))
    # The measured seconds: the last `seconds` of both tenants' ticks.
    hi = min(r["ticks"][-1][0] for r, _ in ten.values())
    lo = hi - min(r["seconds"] for r, _ in ten.values()) * 1000
    w = a.bin_ms
    bins = {s: binned(rows, res, lo, hi, w) for s, (res, rows) in ten.items()}
    print(f"{a.cell}: alone {alone['per_s']:.0f} matmuls/s; measured {hi - lo:.0f} ms in {len(bins['30'])} bins of {w:.0f} ms")
    for s, (res, rows) in ten.items():
        rs = [r for r in rows if lo <= r["t"] < hi]
        el, ch, he = (sum(r[k] for r in rs) for k in ("elapsed", "charged", "held"))
        sh = Counter()
        ra = Counter()
        for r in rs:
            sh[r["sharers"]] += r["launches"]
            ra[r["read_as"]] += r["launches"]
        span = hi - lo
        print(f"  {s}%: {100 * res['per_s'] / alone['per_s']:.1f}% of alone; per wall second: elapsed {el / span:.3f}, "
              f"charged {ch / span:.3f}, held {he / span:.3f}; charged/elapsed {ch / max(el, 1e-9):.3f}; "
              f"launches {sum(r['launches'] for r in rs)}; sharers {dict(sorted(sh.items()))}; read as {dict(sorted(ra.items()))}")
        n_l = max(sum(r["launches"] for r in rs), 1)
        lib, nvml, unt = (sum(r.get(k, 0) for r in rs) for k in ("lib", "nvml", "untimed"))
        # The bucket's level where the measurement starts and ends: with a pacing window, what it drew
        # down in between is charged on top of the share's refill (a phase effect of a short measurement).
        if rs:
            t_a, t_b = rs[0]["tokens"], rs[-1]["tokens"]
            print(f"       bucket {t_a:.0f} ms at the start, {t_b:.0f} ms at the end: {(t_a - t_b) / span:+.3f} s per wall "
                  f"second charged beyond the refill")
        rec, qu, nr, rd = (sum(r.get(k, 0) for r in rs) for k in ("records", "queries", "not_ready", "reads"))
        print(f"       the library's CPU time: {1e3 * lib / n_l:.2f} us a launch ({lib / span:.3f} s per wall second), "
              f"NVML's refresh {nvml:.1f} ms in all; untimed {100 * unt / n_l:.0f}% of launches; a launch's event "
              f"calls: {rec / n_l:.2f} records, {qu / n_l:.2f} queries ({nr / n_l:.2f} not ready), {rd / n_l:.2f} reads")
    # A tenant runs in a bin when it was held back less than half of it.
    kinds = Counter()
    sums = {}
    for i in range(len(bins["30"])):
        run = {s: bins[s][i]["held"] < w / 2 and bins[s][i]["launches"] > 0 for s in ten}
        k = "both" if run["30"] and run["70"] else "30 only" if run["30"] else "70 only" if run["70"] else "neither"
        kinds[k] += 1
        for s in ten:
            b = bins[s][i]
            acc = sums.setdefault((k, s), [0.0, 0.0, 0.0])
            acc[0] += b["done"]
            acc[1] += b["elapsed"]
            acc[2] += b["charged"]
        if a.timeline:
            cells = []
            for s in ten:
                b = bins[s][i]
                cells.append(f"{s}: {'RUN ' if run[s] else 'held'} {100 * b['done'] / (alone_per_ms * w):5.1f}% "
                             f"el {b['elapsed']:6.1f} ch {b['charged']:6.1f} held {b['held']:5.1f} "
                             f"sh {dict(b['sharers'])}")
            print(f"  +{i * w / 1000:5.2f}s " + " | ".join(cells))
    n = len(bins["30"])
    for k in ("both", "30 only", "70 only", "neither"):
        if not kinds[k]:
            continue
        parts = []
        for s in ten:
            done, el, ch = sums[(k, s)]
            parts.append(f"{s}%: {100 * done / (alone_per_ms * w * kinds[k]):5.1f}% of alone, charged/elapsed "
                         f"{ch / max(el, 1e-9):.2f}, charged per wall {ch / (w * kinds[k]):.2f}")
        print(f"  {k:8s} {100 * kinds[k] / n:5.1f}% of the time: " + "; ".join(parts))


if __name__ == "__main__":
    main()
