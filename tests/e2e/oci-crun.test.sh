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
t_init oci-crun
oci_cases
t_done
