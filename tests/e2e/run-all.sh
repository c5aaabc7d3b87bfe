#!/usr/bin/env bash
# Runs every end-to-end suite (tests/e2e/*.test.sh), each in its own bash, and prints one closing line.
set -uo pipefail
cd "$(dirname "$0")/../.."
pass=0; fail=0; failed=()
for t in tests/e2e/*.test.sh; do
    [ -e "$t" ] || continue
    echo "=== $t"
    if bash "$t"; then pass=$((pass + 1)); else fail=$((fail + 1)); failed+=("$t"); fi
done
((fail)) && printf 'FAILED: %s\n' "${failed[@]}"
echo "e2e: $pass passed, $fail failed"
((fail == 0))
