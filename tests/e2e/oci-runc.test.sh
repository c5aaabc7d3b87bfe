#!/usr/bin/env bash
# vgpu with real runc: containers through vgpu-container-runtime (lower runtime runc), and through the hook
# alone as a hooks.d file installs it. Fake GPU driver inside the containers. See tests/e2e/lib/oci-cases.sh.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
RUNTIME=runc
t_init oci-runc
oci_cases
t_done
