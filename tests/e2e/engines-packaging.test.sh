#!/usr/bin/env bash
# Packaging files checked from the tree (package.test.sh builds and installs the packages): the config example
# is accepted, the systemd units verify, and packaging/hooks.d is
# exactly what vgpuctl writes.
. "$(dirname "$0")/engines-lib.sh"
t_init engines-packaging
t_require "$VGPUCTL" "$SHIM" "$HOOK" "$LIBVGPU" "$CORE"

CONF=$REPO/packaging/config.toml
ok_if "the packaged config.toml (all defaults) is accepted" env VGPU_CONFIG="$CONF" \
    "$VGPUCTL" status --state-root "$WORK/none" > /dev/null
# systemd-analyze checks the units; only the binary path (not installed on this machine) may be missing.
systemd-analyze verify "$REPO"/packaging/systemd/vgpu-{gc.service,gc.timer,monitor.service} 2>&1 | grep -v "is not executable" > "$WORK/verify"
ok_if "systemd units verify" test ! -s "$WORK/verify"
# The [monitor] example of the packaged config.toml, uncommented, is a valid config.
monitor_example() {
    sed -n '/^# \[monitor\]/,$p' "$CONF" | sed 's/^# //' > "$WORK/mon.toml"
    grep -q '^kill = false' "$WORK/mon.toml" &&
        VGPU_CONFIG="$WORK/mon.toml" "$VGPUCTL" monitor --once --state-root "$WORK/none" \
            --nvml-library /nonexistent 2>/dev/null | grep -q '^vgpu_nvml_up 0'
}
ok_if "the packaged config.toml's [monitor] example, uncommented, is accepted" monitor_example
ok_if "the Grafana dashboard is JSON using the monitor's series" python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
exprs = " ".join(t["expr"] for p in d["panels"] for t in p.get("targets", []))
assert "hami_vgpu_memory_used_bytes" in exprs and "vgpu_watchdog_findings" in exprs, exprs' "$REPO/packaging/grafana/vgpu-dashboard.json"
"$VGPUCTL" runtime configure --runtime=podman --hooks-dir "$WORK/hooks.d" > /dev/null
ok_if "packaging/hooks.d is what vgpuctl writes" diff -r "$WORK/hooks.d" "$REPO/packaging/hooks.d"
((FAILED)) && cat "$WORK/verify"
t_done
