#!/usr/bin/env python3
"""Writes libvgpu/abi/surface.tsv and docs/driver-surface.md: every driver entry point the CUDA headers
declare (every versioned and per-thread-stream name, as cuGetProcAddress can return it) and every name
the real driver exports (libvgpu/abi/libcuda-exports.txt), each with its class from libvgpu/abi/classes.txt.

usage: surface.py INCLUDE_DIR   (the CUDA 13 headers: cuda.h, cudaTypedefs.h and the interop headers)

Names come from the C preprocessor, run over each header three ways (the default names, the
per-thread-default-stream names, and NVIDIA's internal view that declares every older version), so the
header's own #defines decide them. The cuGetProcAddress version of each name comes from the
PFN_<name>_v<version>[_ptds|_ptsz] typedefs: the i-th newest version of a name is its i-th newest entry
point (name, name_v2, ...), a _ptds/_ptsz typedef the newest entry point at that version plus the suffix.
Only names and classes are written: NVIDIA's headers are never committed."""
import os, re, subprocess, sys
from collections import Counter, OrderedDict

HERE = os.path.dirname(os.path.abspath(__file__))
ABI = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(ABI))
inc = sys.argv[1]

HEADERS = ["cuda.h", "cudaGL.h", "cudaEGL.h", "cudaVDPAU.h"]
TYPEDEFS = ["cudaTypedefs.h", "cudaGLTypedefs.h", "cudaEGLTypedefs.h", "cudaVDPAUTypedefs.h",
            "cudaProfilerTypedefs.h"]
MODES = [[], ["-DCUDA_API_PER_THREAD_DEFAULT_STREAM"], ["-D__CUDA_API_VERSION_INTERNAL"]]
# Entry points renamed rather than versioned (cuGetProcAddress's answer per version).
OVERRIDES = {
    "cuGraphInstantiate": [(10000, "cuGraphInstantiate"), (11000, "cuGraphInstantiate_v2"),
                           (12000, "cuGraphInstantiateWithFlags")],
}
CLASSES = ["charge", "hold", "launch", "sync", "refuse", "query", "pass"]
HOOKED = ["charge", "hold", "launch", "sync", "refuse"]


def declared():
    names = set()
    for h in HEADERS:
        if not os.path.exists(os.path.join(inc, h)):
            sys.exit(f"surface.py: {inc}/{h} missing")
        for m in MODES:
            out = subprocess.run(["gcc", "-E", "-P", "-I", inc, *m, os.path.join(inc, h)],
                                 capture_output=True, text=True)
            if out.returncode:
                sys.exit(f"surface.py: gcc -E {h}: {out.stderr.strip()[:400]}")
            text = " ".join(out.stdout.split())
            for d in re.finditer(r"(static inline )?CUresult (?:CUDAAPI )?(cu[A-Za-z0-9_]+) ?\(", text):
                if not d.group(1):  # a static inline wrapper is no entry point
                    names.add(d.group(2))
    return names


def typedef_versions():
    vers, ptds = {}, {}
    for t in TYPEDEFS:
        p = os.path.join(inc, t)
        if not os.path.exists(p):
            sys.exit(f"surface.py: {p} missing")
        for m in re.finditer(r"PFN_(cu\w+?)_v(\d{4,5})(_ptds|_ptsz)?\)", open(p).read()):
            base, v, suf = m.group(1), int(m.group(2)), m.group(3)
            (ptds if suf else vers).setdefault(base, set()).add((v, suf))
    return vers, ptds


def split(s):
    """(base, version number, per-thread suffix) of an entry point name."""
    suf = ""
    m = re.match(r"(.*)(_ptds|_ptsz)$", s)
    if m:
        s, suf = m.group(1), m.group(2)
    m = re.match(r"(.*)_v(\d)$", s)
    return (m.group(1), int(m.group(2)), suf) if m else (s, 1, suf)


def since_map(names):
    """entry point -> first CUDA versions at which cuGetProcAddress returns it."""
    vers, ptds = typedef_versions()
    plain = {}
    for s in names:
        b, n, suf = split(s)
        if not suf:
            plain.setdefault(b, []).append((n, s))
    since = {}
    for base in sorted(set(plain) | set(OVERRIDES)):
        if base in OVERRIDES:
            vl = [(v, s) for v, s in OVERRIDES[base] if s in names]
        else:
            vs = sorted(v for v, _ in vers.get(base, ()))
            cs = [s for _, s in sorted(plain[base])]
            vl = list(zip(reversed(vs), reversed(cs)))[::-1]
        for v, s in vl:
            since.setdefault(s, []).append(v)
        for v, suf in sorted(ptds.get(base, ())):
            latest = [s for vv, s in vl if vv <= v] or [vl[-1][1]] if vl else []
            if latest and latest[-1] + suf in names:
                since.setdefault(latest[-1] + suf, []).append(v)
    return since


def rules():
    """classes.txt: ordered (class, pattern) rules and {entry point: gap note}."""
    order, gaps = [], OrderedDict()
    for n, line in enumerate(open(os.path.join(ABI, "classes.txt")), 1):
        line = line.split("#", 1)[0].split()
        if not line:
            continue
        if line[0] == "gap":
            for name in line[2:]:
                gaps[name] = line[1]
        elif line[0] in CLASSES:
            order += [(line[0], p) for p in line[1:]]
        else:
            sys.exit(f"classes.txt:{n}: unknown class {line[0]!r}")
    return order, gaps


def classify(base, order):
    for cls, pat in order:
        if re.fullmatch(re.escape(pat).replace(r"\*", ".*"), base):
            return cls
    return "unclassified"


def main():
    names = declared()
    exports = [l.strip() for l in open(os.path.join(ABI, "libcuda-exports.txt")) if l.strip()]
    since = since_map(names)
    order, gaps = rules()
    rows = []
    for s in sorted(names | {e for e in exports if e.startswith("cu")}):
        base = split(s)[0]
        src = "header" if s in names else "export"
        if s in exports and src == "header":
            src = "both"
        v = ",".join(str(x) for x in sorted(since.get(s, []))) or "-"
        rows.append((s, base, v, src, classify(base, order), gaps.get(s, "-")))
    with open(os.path.join(ABI, "surface.tsv"), "w") as f:
        f.write("# Generated by libvgpu/abi/gen/surface.py from the CUDA 13.0 headers, the real driver's exports\n"
                "# (libcuda-exports.txt) and classes.txt: do not edit. Columns: entry point, base name,\n"
                "# cuGetProcAddress versions that return it (- none), where it is known (header, export,\n"
                "# both), class, known gap (issue.item) or -.\n")
        for r in rows:
            f.write("\t".join(r) + "\n")
    render(rows)


def render(rows):
    count = Counter(r[4] for r in rows)
    bases = OrderedDict()
    for r in rows:
        bases.setdefault((r[4], r[1]), []).append(r)
    out = ["# The driver surface, classified",
           "",
           "Generated by `libvgpu/abi/gen/surface.py` (`make surface`) from the CUDA 13.0 headers (`cuda.h`,",
           "`cudaTypedefs.h` and the GL, EGL, VDPAU and profiler headers), the export list of the real driver 580.159.04",
           "(`libvgpu/abi/libcuda-exports.txt`) and the rules in `libvgpu/abi/classes.txt`; do not edit. Every",
           "entry point the headers declare — each version and per-thread-stream variant `cuGetProcAddress` can",
           "return — and every name the driver exports has one class:",
           "",
           "| class | meaning | hooked |",
           "| --- | --- | --- |",
           "| charge | allocates, frees or moves device memory: the ledger must move with it | every name |",
           "| hold | takes or drops a reference that keeps CUDA device memory alive past its handle's release (a retain, an export, a sparse array's tile, a multicast binding, another process's memory opened here): the charge must stay while one may live | every name |",
           "| launch | launches work on the GPU: kernels, graphs, memsets, copies, decompression (the compute share; the stack the driver grows) | every name |",
           "| sync | waits for the GPU: where freed stream-ordered memory is reconciled | every name |",
           "| refuse | refused under a limit (what it does cannot be charged) | every name |",
           "| query | reads state, changes nothing on the device (`cuMemGetInfo` and `cuDeviceTotalMem` are hooked to show the quota) | no |",
           "| pass | passes through: no device memory of the process's own changes, and no reference keeps any alive (copies, streams, events, host memory, memory another API allocated) | no |",
           "",
           "`cargo test -p libvgpu surface` fails when an entry is unclassified, when a charge, hold, launch, sync",
           "or refuse entry is not hooked (`libvgpu/abi/symbols.rs`, which builds the `dlsym` and `cuGetProcAddress`",
           "routing) under every one of its names, unless `classes.txt` lists it as a known gap with its issue",
           "item, and when a listed gap is hooked (the marker must go). The gaps are printed by name.",
           "",
           "Counts (entry points): " + ", ".join(f"{c} {count.get(c, 0)}" for c in CLASSES)
           + f", total {len(rows)}.",
           ""]
    gap_rows = [r for r in rows if r[5] != "-"]
    out += ["## Known gaps", "",
            "Entry points of a hooked class that are not hooked yet, with the issue item that owns them:", ""]
    out += [f"- `{r[0]}` ({r[4]}) → {r[5]}" for r in gap_rows] or ["- none"]
    out += [""]
    for c in CLASSES:
        out += [f"## {c} ({count.get(c, 0)})", "", "| base name | entry points (first cuGetProcAddress version) |",
                "| --- | --- |"]
        for (cls, base), rs in bases.items():
            if cls != c:
                continue
            eps = ", ".join(f"`{r[0]}`" + (f" ({r[2]})" if r[2] != "-" else "")
                            + ("" if r[3] == "both" else f" [{r[3]} only]")
                            + (f" **gap {r[5]}**" if r[5] != "-" else "") for r in rs)
            out.append(f"| `{base}` | {eps} |")
        out.append("")
    with open(os.path.join(ROOT, "docs", "driver-surface.md"), "w") as f:
        f.write("\n".join(out))
    unc = [r[0] for r in rows if r[4] == "unclassified"]
    if unc:
        print(f"surface.py: {len(unc)} unclassified: {' '.join(unc)}", file=sys.stderr)


main()
