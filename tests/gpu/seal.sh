#!/usr/bin/env bash
# The compute share against a tenant that adapts to it, on a real GPU (issue 41): a benchmark that prints
# numbers, not a test. Results in $OUT/seal.txt.
#  1. NVML's per-process SM utilisation against a workload whose GPU time is known (`nvml_truth.py`: how the
#     driver's samples come, and how close the floor's integration is): a launch-bound loop (1 ms kernels,
#     1.5 ms of host work after each: ~40% busy) and a saturating one.
#  2. The late-fixed-work attack (`seal_probe.c`): kernels that run short when the host saw its launch call
#     slow (timed) and long otherwise; bare, then at a 10% share under VGPU_LIB (and VGPU_LIB_BEFORE when
#     given). The issue's GPU probe of the library before the floor: 94.3% under 10%.
#  3. A capture begun on the stream of an open group (`compute_client capgroup`, 0.2 ms kernels so that groups
#     form): the library before: 23.6% under 10%.
#  4. A paced frame loop (`compute_client frames`): what each launch is charged against its kernel's 0.2 ms
#     (the fake: 245-252 us before stale groups were charged their least times, 200.4-201 after).
#  5. The attack on that rule: later launches of each frame 10x their least time, at 10%.
# Environment: VGPU_LIB (target/vgpu/libvgpu.so), VGPU_LIB_BEFORE, OUT, CUDA_INCLUDE (/usr/local/cuda/include),
# SEAL_SECONDS (6).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${SEAL_SECONDS:-6}
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-seal.XXXXXX)
trap 'rm -rf "$W"' EXIT
flags=(-O2 -std=gnu11 -Wno-deprecated-declarations -I"$inc")
gcc "${flags[@]}" tests/clients/compute_client.c -o "$W/cc" -lcuda || exit 1
gcc "${flags[@]}" tests/gpu/seal_probe.c -o "$W/seal" -lcuda || exit 1
res=$out/seal.txt
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
    echo "libvgpu sha256 $(sha256sum "$lib" | cut -d' ' -f1)"
} | tee "$res"
capped() { local l=$1 c=$2; shift 2; LD_PRELOAD="$l" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$c" CUDA_DEVICE_SM_LIMIT=10 LIBCUDA_LOG_LEVEL=2 "$@" 2>>"$W/log"; }
field() { printf '%s\n' "$2" | grep -o "\b$1=[^ ]*" | tail -1 | cut -d= -f2-; }

echo "== 1. NVML's per-process utilisation against known GPU time" | tee -a "$res"
CLIENT_KERNEL_MS=1 python3 tests/gpu/nvml_truth.py -- "$W/cc" gap "$secs" 1500 2>&1 | tee -a "$res"
python3 tests/gpu/nvml_truth.py -- "$W/cc" plain "$secs" 2>&1 | tail -2 | tee -a "$res"

echo "== 2. kernels whose work is fixed after the launch call (seal_probe)" | tee -a "$res"
echo "bare:   $("$W/seal" "$secs" 2>&1)" | tee -a "$res"
echo "10%:    $(capped "$lib" s_after "$W/seal" "$secs")" | tee -a "$res"
[ -n "$before" ] && echo "10% (before): $(capped "$before" s_before "$W/seal" "$secs")" | tee -a "$res"

echo "== 3. a capture begun on the stream of an open group (compute_client capgroup, 0.2 ms kernels)" | tee -a "$res"
share() { awk -v l="$(field launched "$1")" -v s="$(field seconds "$1")" 'BEGIN { if (s > 0) printf "%.1f", l * 0.2 / 10 / s; else print "-" }'; }
b=$(CLIENT_KERNEL_MS=0.2 "$W/cc" capgroup "$secs" 2>&1)
echo "bare:   $(share "$b")% of the GPU ($b)" | tee -a "$res"
c=$(CLIENT_KERNEL_MS=0.2 capped "$lib" g_after "$W/cc" capgroup "$secs")
echo "10%:    $(share "$c")% ($c)" | tee -a "$res"
if [ -n "$before" ]; then
    c=$(CLIENT_KERNEL_MS=0.2 capped "$before" g_before "$W/cc" capgroup "$secs")
    echo "10% (before): $(share "$c")% ($c)" | tee -a "$res"
fi

echo "== 4. a paced frame loop: 8 launches of 0.2 ms every 10 ms, no query, no synchronisation" | tee -a "$res"
# charged LEDGER: the bucket's charge per launch, us (header bytes 192..232 of the ledger).
charged() { python3 -c 'import glob,struct,sys
f = glob.glob(sys.argv[1] + ".GPU-*")[0]
t = struct.unpack_from("<qQQQQ", open(f, "rb").read(), 192)
print("%.1f us a launch over %d" % (t[2] / max(1, t[4]) / 1e3, t[4]))' "$W/$1"; }
frames() { local l=$1 c=$2 sm=$3; shift 3; LD_PRELOAD="$l" CUDA_DEVICE_MEMORY_SHARED_CACHE="$W/$c" CUDA_DEVICE_SM_LIMIT=$sm LIBCUDA_LOG_LEVEL=2 CLIENT_KERNEL_MS=0.2 "$W/cc" frames "$secs" "$@" 2>>"$W/log"; }
o=$(frames "$lib" f_after 40 10000:8)
echo "40%:    charged $(charged f_after) for 200 us kernels ($o)" | tee -a "$res"
if [ -n "$before" ]; then
    o=$(frames "$before" f_before 40 10000:8)
    echo "40% (before): charged $(charged f_before) ($o)" | tee -a "$res"
fi
echo "== 5. the same, each frame's later 7 launches 10x as long (the same kernel and grid), at 10%" | tee -a "$res"
o=$(frames "$lib" x_after 10 20000:8:10)
echo "10%:    $(awk -v l="$(field launched "$o")" -v s="$(field seconds "$o")" 'BEGIN { if (s > 0) printf "%.1f", l / 8 * 14.2 / (s * 10); else print "-" }')% of the GPU ($o)" | tee -a "$res"
grep -v '^$' "$W/log" | sort | uniq -c | sort -rn | head -20 >"$out/seal-lib-lines.txt"
