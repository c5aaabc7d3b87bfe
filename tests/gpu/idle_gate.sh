#!/usr/bin/env bash
# A launch on an idle stream, timed by events, on a real GPU (issue 41): a benchmark that prints numbers,
# not a test. Results in $OUT/idle_gate.txt.
#  1. The interval of an event pair around one short launch on an idle stream (`compute_client plain 0`,
#     the median of CLIENT_SAMPLES pairs), bare, and behind an empty host function (CLIENT_GATE=1: what
#     libvgpu's compute/gate.rs queues): what the host's submit time adds to the kernel, and whether the
#     host function's round trip outlasts it (then the gated interval is the kernel's).
#  2. A launch-bound loop of short kernels (`compute_client gap`: IDLE_KERNEL_MS kernels, IDLE_GAP_US of
#     host work after each) at a 50% share: what the library charges a launch (the ledger's charged_ns
#     over its launches) against the kernel's interval from 1, under VGPU_LIB and VGPU_LIB_BEFORE when
#     given, with its launch rate against bare (the gate's cost).
# Environment: VGPU_LIB (target/vgpu/libvgpu.so), VGPU_LIB_BEFORE, OUT, CUDA_INCLUDE (/usr/local/cuda/include),
# IDLE_SECONDS (4), IDLE_KERNEL_MS (0.003), IDLE_GAP_US (10).
set -uo pipefail
cd "$(dirname "$0")/../.."
lib=$(realpath -m "${VGPU_LIB:-target/vgpu/libvgpu.so}")
before=${VGPU_LIB_BEFORE:+$(realpath -m "$VGPU_LIB_BEFORE")}
out=$(realpath -m "${OUT:-target/gpu-results}")
secs=${IDLE_SECONDS:-4}
kms=${IDLE_KERNEL_MS:-0.003}
gap=${IDLE_GAP_US:-10}
inc=${CUDA_INCLUDE:-/usr/local/cuda/include}
mkdir -p "$out"
W=$(mktemp -d /tmp/vgpu-idle.XXXXXX)
trap 'rm -rf "$W"' EXIT
gcc -O2 -std=gnu11 -Wno-deprecated-declarations -I"$inc" tests/clients/compute_client.c -o "$W/cc" -lcuda || exit 1
res=$out/idle_gate.txt
{
    echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'); git $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1
    echo "libvgpu sha256 $(sha256sum "$lib" | cut -d' ' -f1)"
} | tee "$res"
field() { printf '%s\n' "$2" | grep -o "\b$1=[^ ]*" | tail -1 | cut -d= -f2-; }
# charged LEDGER: the compute bucket's charged_ns per launch (ledger header bytes 192..232), in us.
charged() {
    python3 -c 'import glob,struct,sys
f = glob.glob(sys.argv[1] + ".GPU-*")[0]
t = struct.unpack_from("<qQQQQ", open(f, "rb").read(), 192)
print("%.2f" % (t[2] / max(t[4], 1) / 1e3))' "$1"
}

echo "== 1. an event pair around one ${kms} ms launch on an idle stream (median of 201)" | tee -a "$res"
for gate in 0 1; do
    o=$(CLIENT_SAMPLES=201 CLIENT_GATE=$gate CLIENT_KERNEL_MS=$kms "$W/cc" plain 0 2>&1)
    echo "$([ "$gate" = 1 ] && echo "behind a host function" || echo bare): $(awk -v m="$(field unit_ms "$o")" 'BEGIN { printf "%.2f us", m * 1000 }')" | tee -a "$res"
done

echo "== 2. a launch-bound loop of ${kms} ms kernels, ${gap} us of host work after each, at 50%" | tee -a "$res"
o=$(CLIENT_KERNEL_MS=$kms "$W/cc" gap "$secs" "$gap" 2>&1)
echo "bare: $(field launched "$o") launches in $(field seconds "$o") s" | tee -a "$res"
for l in "$lib" $before; do
    c=$W/c$RANDOM
    o=$(LD_PRELOAD="$l" CUDA_DEVICE_MEMORY_SHARED_CACHE="$c" CUDA_DEVICE_SM_LIMIT=50 CLIENT_KERNEL_MS=$kms \
        "$W/cc" gap "$secs" "$gap" 2>&1)
    echo "$(basename "$(dirname "$l")")/$(basename "$l"): $(field launched "$o") launches in $(field seconds "$o") s, charged $(charged "$c") us a launch" | tee -a "$res"
done
