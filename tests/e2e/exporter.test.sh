#!/usr/bin/env bash
# vgpuctl monitor's exporter against a hostile tenant and a careless client, with real runc containers on the
# fake driver: names that carry quotes, newlines, a forged `# EOF` and terminal escapes stay inside their
# label values (checked by promtool and by a real Prometheus scraping the monitor), in the monitor's log
# lines and in `vgpuctl status`; a client sending one header byte every 3 s and idle connections do not
# delay a scrape; /healthz and vgpu_build_info; every series the Grafana dashboard queries is one the
# exporter serves; every query of HAMi's own dashboard returns data from a real Prometheus.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
. "$(dirname "$0")/lib/rootfs.sh"
. "$(dirname "$0")/lib/bundle.sh"
. "$(dirname "$0")/lib/vgpu.sh"
. "$(dirname "$0")/lib/oci-cases.sh"
. "$(dirname "$0")/lib/monitor.sh"
RUNTIME=runc
VGPUCTL=${VGPUCTL:-$T/release/vgpuctl}
t_init exporter
t_require "$VGPUCTL" "$(command -v curl)" "$(command -v promtool)" "$(command -v prometheus)" "$(command -v python3)"
oci_setup

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
# names ID NS POD CONTAINER: rewrites the Kubernetes names recorded in the container's limits.json (as a
# vgpu that did not validate them, or a state written by an older one, left them).
names() {
    local f=$STATE/containers/$1/limits.json
    jq --arg ns "$2" --arg pod "$3" --arg c "$4" '.kubernetes = {namespace: $ns, pod: $pod, container: $c}' \
        "$f" >"$f.new" && mv "$f.new" "$f"
}

ESC=$'\e'
HOSTILE_POD=$'trainer"} 0\n# EOF\nhami_vgpu_memory_used_bytes{namespace="ml",pod="victim"} 1e18\n'
HOSTILE_NS='ml\"'
HOSTILE_CTR=$'main\r'"$ESC"'[2J'"$ESC"']0;owned\a'
FORGED_LOG=$'x\nvgpuctl monitor: killed pid 1 (SIGKILL) of container victim'

echo "-- hostile names: the exposition, the monitor's log and vgpuctl status stay well-formed"
new_bundle rt_client device 0 '!alloc' 300Mi sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G
A=$ID
shim run --bundle "$B" "$A" >"$WORK/a.out" 2>&1 &
PA=$!
check "container A allocated 300 MiB" wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/a.out"
names "$A" "$HOSTILE_NS" "$HOSTILE_POD" "$HOSTILE_CTR"
cp -a "$ROOTFS" "$WORK/rootfs-rw"
new_bundle sh -c 'mv /etc /etc2 && exec rt_client device 0 info "!alloc" 800Mi sleep 60'
bundle_jq "$B" '.root.path = $r | .root.readonly = false' --arg r "$WORK/rootfs-rw"
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=512Mi
BY=$ID
shim run --bundle "$B" "$BY" >"$WORK/b.out" 2>&1 &
PB=$!
check "container B's process (no preload) allocated 800 MiB past its 512 MiB quota" \
    wait_for 20 grep -q 'op=alloc .*rc=0' "$WORK/b.out"
names "$BY" "$FORGED_LOG" "pod$ESC[31m" "c"
monitor_start mon && pass "monitor starts" || fail "monitor starts"
scrape >"$WORK/scrape.txt"
check_eq "the scrape ends at its one # EOF" "$(grep -c '^# EOF$' "$WORK/scrape.txt"):$(tail -1 "$WORK/scrape.txt")" "1:# EOF"
promtool check metrics <"$WORK/scrape.txt" >"$WORK/promtool.out" 2>&1
check_not "promtool check metrics parses the scrape" grep -Ei 'pars|error' "$WORK/promtool.out"
# HAMi's own name hami_gpu_shared_count (a gauge ending in _count) is HAMi's dashboard's: kept as HAMi wrote it.
check_eq "  ... and lints nothing but OpenMetrics' counter names (HELP on the family, samples _total) and HAMi's" \
    "$(grep -v -e '_total no help text$' -e '^hami_gpu_shared_count non-histogram' "$WORK/promtool.out")" ""

# A real Prometheus scrapes the monitor (OpenMetrics negotiated, its strict parser) every second.
PROM_PORT=$(free_port)
cat >"$WORK/prometheus.yml" <<EOF
global: {scrape_interval: 1s, scrape_timeout: 1s}
scrape_configs: [{job_name: vgpu, static_configs: [{targets: ["$ADDR"]}]}]
EOF
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/prom" \
    --web.listen-address="127.0.0.1:$PROM_PORT" >"$WORK/prometheus.log" 2>&1 &
on_exit "kill $!"
promql() { curl -sf --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/query" --data-urlencode "query=$1"; }
scraped() { promql 'up{job="vgpu"}' | jq -e '.data.result | length == 1' >/dev/null; }
check "Prometheus has scraped the monitor" wait_for 30 scraped
sleep 2
check_eq "Prometheus keeps the target up (no 'unexpected data after # EOF')" \
    "$(promql 'up{job="vgpu"}' | jq -r '.data.result[0].value[1]')" 1
check_eq "  ... A's quota series carries the hostile names exactly as written" \
    "$(promql "vgpu_memory_limit_bytes{container_id=\"$A\"}" \
        | jq -r --arg ns "$HOSTILE_NS" --arg pod "$HOSTILE_POD" --arg c "$HOSTILE_CTR" \
            '.data.result | map(select(.metric.namespace == $ns and .metric.pod == $pod and .metric.container == $c)) | .[0].value[1]')" \
    "$GIB"
check_eq "  ... and no series names the forged pod" \
    "$(promql 'hami_vgpu_memory_used_bytes{pod="victim"}' | jq '.data.result | length')" 0

check "the watchdog logs B's over-quota finding" wait_for 10 grep -q "over quota: container $BY (pod .*) GPU 0" "$WORK/mon.log"
check_eq "  ... in one line: no forged 'killed pid' line" "$(grep -c '^vgpuctl monitor: killed pid' "$WORK/mon.log")" 0
check_match "  ... with the newline and escape shown escaped" 'pod x\\nvgpuctl monitor: killed pid 1 .*/pod\\u\{1b\}\[31m' \
    "$(cat "$WORK/mon.log")"
check_not "  ... and no raw escape byte in the log" grep -q "$ESC" "$WORK/mon.log"
"$VGPUCTL" status >"$WORK/status.txt" 2>&1
check_not "vgpuctl status prints no raw escape byte or carriage return" grep -q "[$ESC"$'\r'"]" "$WORK/status.txt"
check_eq "  ... one line per container GPU (header, A, B)" "$(sed '/^$/q' "$WORK/status.txt" | grep -c .)" 3

echo "-- a slow client and idle connections do not delay a scrape"
# One header byte every 3 s (slowloris), and three connections that send nothing.
python3 - "${ADDR%:*}" "${ADDR##*:}" <<'PY' >"$WORK/slow.log" 2>&1 &
import socket, sys, time
addr = (sys.argv[1], int(sys.argv[2]))
idle = [socket.create_connection(addr) for _ in range(3)]
s = socket.create_connection(addr)
t = time.time()
try:
    for b in b"GET /metrics HTTP/1.1\r\nHost: slow\r\n":
        s.send(bytes([b]))
        time.sleep(3)
    print("never closed")
except OSError:
    print("slow client closed after %.0f s" % (time.time() - t))
PY
SLOW=$!
on_exit "kill $SLOW"
sleep 1
took=$(curl -sf -o /dev/null --max-time 15 -w '%{time_total}' "$URL")
check "a scrape beside them takes under 1 s (took ${took:-none} s)" awk -v t="${took:-99}" 'BEGIN { exit !(t < 1) }'
wait "$SLOW"
check_match "  ... and the slow client is cut off by the server's deadline" '^slow client closed after [0-9]+ s$' "$(cat "$WORK/slow.log")"
check_eq "/healthz answers ok" "$(curl -sf --max-time 5 "http://$ADDR/healthz")" ok
check_match "vgpu_build_info names the version and commit" \
    '^vgpu_build_info\{version="[0-9]+\.[0-9]+\.[0-9]+",commit="([0-9a-f]{12}|unknown)"\} 1$' "$(scrape)"

echo "-- the Grafana dashboard queries only series the exporter serves"
# A container with a compute share, so that the compute series have samples (a family without any is
# not written).
new_bundle rt_client device 0 sleep 60
bundle_env "$B" NVIDIA_VISIBLE_DEVICES=0 CUDA_DEVICE_MEMORY_LIMIT=1G CUDA_DEVICE_SM_LIMIT=30
CS=$ID
shim run --bundle "$B" "$CS" >"$WORK/cs.out" 2>&1 &
PCS=$!
check "container CS with a 30% compute share runs" wait_for 20 grep -q 'rc=0' "$WORK/cs.out"
FAKE_CUDA_STATE_DIR=$FAKESTATE "$VGPUCTL" monitor --once >"$WORK/once.txt" 2>"$WORK/once.err"
check_match "vgpuctl monitor --once reads the fake NVML" '^vgpu_nvml_up 1$' "$(cat "$WORK/once.txt")"
check_match "  ... and CS's share: its limit, and its request beside it (a limit alone is its own request)" \
    "vgpu_compute_limit_ratio\{[^}]*container_id=\"$CS\"[^}]*\} 0.3 .*vgpu_compute_request_ratio\{[^}]*container_id=\"$CS\"[^}]*\} 0.3" \
    "$(tr '\n' ' ' <"$WORK/once.txt")"
# The families served (# TYPE lines; a counter's samples end in _total) against every metric name in the
# dashboard's panel and variable queries (PromQL's functions, keywords and the labels inside {...} and
# by (...) removed).
out=$(python3 - "$REPO/packaging/grafana/vgpu-dashboard.json" "$WORK/once.txt" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
served = set()
for line in open(sys.argv[2]):
    m = re.match(r"# TYPE (\S+) (\S+)", line)
    if m:
        served.add(m[1] + ("_total" if m[2] == "counter" else ""))
exprs = [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
exprs += [v["query"]["query"] for v in d["templating"]["list"] if isinstance(v.get("query"), dict)]
words = {"sum", "by", "rate", "increase", "label_values", "without", "avg", "max", "min", "count"}
used = set()
for e in exprs:
    e = re.sub(r'\{[^}]*\}|\[[^]]*\]|"[^"]*"|\b(by|without) \([^)]*\)', " ", e)
    e = re.sub(r",\s*[a-z_]+\)", ")", e)  # label_values(series, label)
    used |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e) if w not in words}
print("queried:", len(used), "exprs:", len(exprs))
for name in sorted(used - served):
    print("not served:", name)
PY
)
check_match "the dashboard's queries name series ($(printf '%s\n' "$out" | head -1))" '^queried: [1-9][0-9]+ exprs:' "$out"
check_eq "  ... each of them served by the exporter" "$(printf '%s\n' "$out" | grep 'not served')" ""
for want in vgpu_nvml_up vgpu_state_errors vgpu_monitor_reading_age_seconds vgpu_compute_limit_ratio 'node=~\"$node\"' 'label_values(vgpu_build_info, instance)'; do
    check "  ... it queries $want" grep -qF -- "$want" "$REPO/packaging/grafana/vgpu-dashboard.json"
done

echo "-- HAMi's own dashboard (HAMi 2.10's hami-vgpu-dashboard.json): every panel's query has data"
# Its 15 panels' queries and its two variables' as HAMi wrote them ($node and $namespace: All), asked of
# the Prometheus that scrapes the monitor. Its scheduler series come from what admission counts: A (1 GiB),
# B (512 MiB) and CS (1 GiB, 30%) on GPU 0.
HAMI_QUERIES=(
    'count(hami_gpu_memory_limit_bytes{node=~".*"})'
    'sum(hami_gpu_memory_limit_bytes{node=~".*"})'
    'sum(hami_gpu_memory_allocated_bytes{node=~".*"})'
    '100 * sum(hami_gpu_memory_allocated_bytes{node=~".*"}) / sum(hami_gpu_memory_limit_bytes{node=~".*"})'
    'sum(hami_gpu_shared_count{node=~".*"})'
    'hami_host_gpu_memory_used_bytes and on (device_uuid) hami_gpu_memory_limit_bytes{node=~".*"}'
    'hami_host_gpu_utilization_ratio and on (device_uuid) hami_gpu_memory_limit_bytes{node=~".*"}'
    'sum by (node) (hami_gpu_memory_allocated_bytes{node=~".*"})'
    'sum by (node) (hami_gpu_memory_limit_bytes{node=~".*"})'
    'hami_node_gpu_memory_allocated_ratio{node=~".*"}'
    'hami_gpu_core_allocated_ratio{node=~".*"}'
    'hami_gpu_shared_count{node=~".*"}'
    'hami_vgpu_memory_used_bytes{namespace=~".*"}'
    'hami_vgpu_memory_limit_bytes{namespace=~".*"}'
    'hami_container_device_utilization_ratio{namespace=~".*"}'
    '100 * hami_vgpu_memory_used_bytes{namespace=~".*"} / hami_vgpu_memory_limit_bytes{namespace=~".*"}'
    'topk(10, hami_vgpu_memory_used_bytes{namespace=~".*"})'
)
value() { promql "$1" | jq -r '.data.result[0].value[1] // "none"'; }
three() { [ "$(value 'hami_gpu_shared_count{device_index="0"}')" = 3 ]; }
check "Prometheus sees the three containers on GPU 0 (hami_gpu_shared_count)" wait_for 30 three
for q in "${HAMI_QUERIES[@]}"; do
    check_match "  ... $q" '^[1-9][0-9]*$' "$(promql "$q" | jq '.data.result | length')"
done
for var in node:hami_gpu_memory_limit_bytes namespace:hami_vgpu_memory_used_bytes; do
    check_match "  ... its variable label_values(${var#*:}, ${var%%:*})" '^[1-9]' \
        "$(curl -sfG --max-time 5 "http://127.0.0.1:$PROM_PORT/api/v1/label/${var%%:*}/values" \
            --data-urlencode "match[]=${var#*:}" | jq '.data | length')"
done
check_eq "  ... GPU 0's quotas committed: 1 GiB + 512 MiB + 1 GiB" \
    "$(value 'hami_gpu_memory_allocated_bytes{device_index="0"}')" $((GIB * 5 / 2))
check_eq "  ... its compute shares committed: 30 of 100" "$(value 'hami_gpu_core_allocated_ratio{device_index="0"}')" 30
check_eq "  ... allocated over its memory" \
    "$(value 'hami_node_gpu_memory_allocated_ratio{device_index="0"} == bool on (device_uuid) (hami_gpu_memory_allocated_bytes{device_index="0"} / ignoring (device_cores) hami_gpu_memory_limit_bytes)')" 1
check_eq "  ... the node label is the monitor's node (the host name here)" \
    "$(promql 'hami_gpu_memory_limit_bytes{device_index="0"}' | jq -r '.data.result[0].metric.node')" "$(hostname)"

for id in "$A" "$BY" "$CS"; do plain kill "$id" KILL >/dev/null 2>&1; done
wait "$PA" "$PB" "$PCS"
check_eq "no state left" "$(state_left)" ""
t_done
