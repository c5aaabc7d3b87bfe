"""Sums a process's compute-share trace (`LIBCUDA_LOG_LEVEL=3`, `compute trace dev ...` lines on stderr)
past its first SKIP_MS (the warm-up): launches, what they were measured and charged, what was held back, the
library's own CPU time a launch (`lib_us`), how many went untimed (unmeasured or drawn), and the event calls a
launch. Usage: python3 trace_sum.py LOG [SKIP_MS]."""
import re
import sys

log = sys.argv[1]
skip = float(sys.argv[2]) if len(sys.argv) > 2 else 2500
keys = ["launches", "elapsed_us", "charged_us", "held_us", "lib_us", "nvml_us", "untimed", "records", "queries", "not_ready", "reads"]
tot = dict.fromkeys(keys, 0.0)
first = None
lines = 0
for line in open(log, errors="replace"):
    if "compute trace dev" not in line:
        continue
    f = line.split("compute trace dev", 1)[1].split()
    kv = {f[i]: f[i + 1] for i in range(1, len(f) - 1, 2)}
    t = float(kv.get("t_ms", 0))
    first = t if first is None else first
    if t - first < skip:
        continue
    lines += 1
    for k in keys:
        try:
            tot[k] += float(re.sub(r"[^0-9.]", "", kv.get(k, "0")) or 0)
        except ValueError:
            pass
n = tot["launches"] or 1
print(f"trace lines {lines} launches {tot['launches']:.0f} measured_us/launch {tot['elapsed_us'] / n:.2f} "
      f"charged_us/launch {tot['charged_us'] / n:.2f} held_ms {tot['held_us'] / 1000:.1f} lib_us/launch {tot['lib_us'] / n:.3f} "
      f"nvml_ms {tot['nvml_us'] / 1000:.1f} untimed {tot['untimed'] / n:.3f} records/launch {tot['records'] / n:.3f} "
      f"queries/launch {tot['queries'] / n:.3f} reads/launch {tot['reads'] / n:.3f}")
