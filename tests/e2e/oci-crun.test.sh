#!/usr/bin/env bash
# vgpu with real crun: containers through vgpu-container-runtime (lower runtime crun), and through the hook
# alone as a hooks.d file installs it. Fake GPU driver inside the containers. See tests/e2e/lib/oci-cases.sh.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=crun
# crun 1.8 refuses hosts with cgroup v1 controllers next to cgroup v2 ("cgroups in hybrid mode not
# supported"). There, the suite runs in a private mount namespace whose /sys/fs/cgroup is the unified
# (v2) hierarchy alone; the host's mounts are untouched.
if [ -z "${VGPU_CRUN_NS:-}" ] && grep -q "^cgroup /sys/fs/cgroup/" /proc/mounts; then
    exec unshare -m --propagation private env VGPU_CRUN_NS=1 bash -c 'mount -t cgroup2 none /sys/fs/cgroup && exec bash "$0"' "$0"
fi
# Device cgroups on v2 need eBPF, which needs a memlock rlimit this sandbox may not grant; cgroups are not
# what these cases test.
RT_FLAGS=--cgroup-manager=disabled
t_init oci-crun
oci_cases
t_done
