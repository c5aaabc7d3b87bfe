# The monitor suites' helpers (monitor, watchdog, exporter, monitor-share): a `vgpuctl monitor` on a free
# port against the suite's fake GPU, and reading its scrape. Needs common.sh, oci-cases.sh (`plain`,
# `$FAKESTATE`) and `$VGPUCTL`.

# monitor_start NAME ARGS...: a monitor on a free port, its log in $WORK/NAME.log; sets $URL, $ADDR
# (host:port) and NAME_PID.
monitor_start() {
    local name=$1; shift
    FAKE_CUDA_STATE_DIR=$FAKESTATE "$VGPUCTL" monitor --listen 127.0.0.1:0 --interval 1 "$@" \
        >"$WORK/$name.log" 2>&1 &
    local pid=$!
    on_exit "kill $pid"
    eval "${name}_PID=$pid"
    wait_for 10 grep -q 'serving http://' "$WORK/$name.log" || { cat "$WORK/$name.log"; return 1; }
    URL=$(grep -o 'http://[^ ]*/metrics' "$WORK/$name.log" | head -1)
    ADDR=${URL#http://}
    ADDR=${ADDR%/metrics}
}
URL=""
# scrape: the last monitor's exposition.
scrape() { curl -sf --max-time 10 "$URL"; }
# series NAME LABEL-REGEX: the value of the first sample of NAME whose labels match.
series() { scrape | grep -E "^$1\{[^}]*$2" | head -1 | awk '{print $NF}'; }
# running ID: the container's process runs (runc state).
running() { plain state "$1" 2>/dev/null | jq -e '.status == "running"' >/dev/null; }
