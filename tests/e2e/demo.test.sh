#!/usr/bin/env bash
# `make demo`, the README's main job, run as a suite (fake-driver mode here): it must finish with its OK line.
# Regression: once the state root kept its marker file, the demo's "state left" check (grep finding nothing)
# ended the script under `set -e` right after `runc delete`, with no message and exit 1.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
t_init demo
out=$(VGPU_DEMO_MODE=fake timeout 300 bash "$(dirname "$0")/../demo.sh" 2>&1)
st=$?
check "make demo exits 0 (exit $st)" test $st = 0
check_match "  ... and says the quota held and nothing was left" 'demo: OK' "$out"
check_match "  ... after the poststop hook left no state" 'state left under .*: \(none\)' "$out"
t_done
