#!/usr/bin/env bash
# The soak's short pass (issue 47; the full one is `make soak`, docs/soak.md): tests/soak/run.sh with
# SOAK_E2E_RUNS runs (75: 15 per mode, 4 at a time) of tests/soak/soak.c's seeded mix under libvgpu.so on the
# fake driver, in the quota, share, spill, oversubscribe and tight modes. Per mode: no crash, no hang, no CUDA
# error, no charge a process kept with nothing held, nothing left in the ledger once every process exited, no
# failure of a process reading NVML's figures (the ledger) meanwhile. A failing run's seed is printed with the
# command that replays it.
. "$(dirname "$0")/lib/common.sh"
t_init soak
t_require "$LIBVGPU" "$T/vgpu/libvgpu_core.so" "$FAKE_DIR/libcuda.so.1" "$FAKE_DIR/libnvidia-ml.so.1"

out=$(SOAK_RUNS=${SOAK_E2E_RUNS:-75} OUT=$WORK/results bash "$REPO/tests/soak/run.sh" 2>&1)
rc=$?
# the table, the failures (seed, signal, stderr, backtrace) and the closing line
printf '%s\n' "$out" | grep -v '^  ledger \|^== ' | sed 's/^/  | /'
sum=$WORK/results/summary.tsv
check "the soak ran and wrote its summary" test -s "$sum"
while IFS=$'\t' read -r mode runs passed failed crashes hangs errors leaks left _ _ _ _ _ watched; do
    [ "$mode" = mode ] && continue
    check_eq "$mode: $runs runs, none crashed (signal or core)" "$crashes" 0
    check_eq "$mode: none hung" "$hangs" 0
    check_eq "$mode: no unexpected CUDA error" "$errors" 0
    check_eq "$mode: no process kept a charge with nothing held" "$leaks" 0
    check_eq "$mode: nothing left in the ledger after every process exited" "$left" 0
    check_match "$mode: NVML's figures read through the library by a new process every 20 ms meanwhile, none failed ($watched)" \
        '^[0-9]+/0$' "$watched"
done <"$sum"
check_match "closing line: every run passed" '^soak: [0-9]+ passed, 0 failed$' "$(printf '%s\n' "$out" | tail -1)"
check_eq "run.sh exit status" "$rc" 0
t_done
