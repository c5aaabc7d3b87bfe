#!/usr/bin/env bash
# `helm uninstall`'s pre-delete hooks (issue 46): the uninstall DaemonSet and the Job that holds the
# release's deletion back until that DaemonSet's pod is Ready (its `install.sh uninstall` done) on every node.
# 1. A real Helm (Helm v4's library, helm-python-sdk) installs and uninstalls the chart against an in-memory
#    API server whose stand-in controllers run the hook Job's command, this build's vgpu-daemonset-wait
#    (tests/helm/uninstall_test.py, tests/helm/fake_cluster.py): the order, every node done before the
#    release goes, nothing left; a failing node; the two-step mode=uninstall.
# 2. The Job's command line as rendered (10 s) against lib/fake-apiserver.py serving the rendered DaemonSet
#    with chosen statuses and pods: waiting, done, a failing node named, no node, no DaemonSet, no server.
# (The node side, install.sh uninstall, is checked in installer.test.sh; the rendered hooks' annotations,
# weights and RBAC in helm.test.sh.)
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
t_init uninstall-hook
t_require "$T/release/vgpu-daemonset-wait"
python3 -c 'import helm_python, yaml' 2>/dev/null || { echo "uninstall-hook: helm-python-sdk or PyYAML missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
echo "-- 1. helm install and helm uninstall by a real Helm against an API server stand-in"
out=$(cd "$REPO/tests/helm" && python3 uninstall_test.py "$REPO/packaging/helm/vgpu" "$T/release/vgpu-daemonset-wait" 2> "$WORK/helm.err")
printf '%s\n' "$out" | grep -v '^uninstall-hook (helm): '
read -r p f < <(printf '%s\n' "$out" | sed -n 's/^uninstall-hook (helm): \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p')
if [ -n "${p:-}" ]; then PASSED=$((PASSED + p)); FAILED=$((FAILED + f)); else fail "the Helm run ended early" "$(tail -20 "$WORK/helm.err")"; fi

echo "-- 2. the Job's command line, as rendered, against chosen states"
API=$WORK/api NS=kube-system DS=vgpu-uninstall-hook UID_DS=3f2e9c1a-5b7d-4c8e-9a10-223344556677
mkdir -p "$API/daemonsets" "$API/pods"

python3 "$REPO/tests/helm/template.py" "$REPO/packaging/helm/vgpu" --set uninstallHook.timeoutSeconds=10 > "$WORK/chart.yaml" \
    || { echo "uninstall-hook: the chart did not render"; echo "0 passed, 1 failed"; exit 1; }
# The rendered Job's command line, one word a line, with the binary from this build.
python3 - "$WORK/chart.yaml" "$T/release" > "$WORK/job.args" << 'PY'
import sys, yaml
job = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "Job")
c = job["spec"]["template"]["spec"]["containers"][0]
print("\n".join([c["command"][0].replace("/usr/local/bin", sys.argv[2])] + c["args"]))
PY
mapfile -t JOB < "$WORK/job.args"
check_eq "the rendered Job waits for the rendered DaemonSet, 10 s" "${JOB[*]:1}" "$DS --namespace=$NS --timeout-seconds=10"

# ds_status JSON: the rendered DaemonSet as the API server returns it (uid, generation 1) with that status
# (or none: "null"); pod NAME NODE OWNER_UID STATUS_JSON: one of its pods, with the template's labels.
ds_status() {
    python3 - "$WORK/chart.yaml" "$UID_DS" "$1" > "$API/daemonsets/$NS.tmp" << 'PY'
import json, sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-uninstall-hook"))
ds["metadata"].update(uid=sys.argv[2], generation=1)
status = json.loads(sys.argv[3])
if status is not None:
    ds["status"] = status
print(json.dumps(ds))
PY
    mv "$API/daemonsets/$NS.tmp" "$API/daemonsets/${NS}_$DS.json"
}
counts() { echo "{\"observedGeneration\": $1, \"desiredNumberScheduled\": $2, \"numberReady\": $3, \"updatedNumberScheduled\": $2, \"currentNumberScheduled\": $2, \"numberMisscheduled\": 0}"; }
pod() {
    python3 - "$WORK/chart.yaml" "$@" > "$API/pods/${NS}_$1.json" << 'PY'
import json, sys, yaml
ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-uninstall-hook"))
name, node, owner, status = sys.argv[2:6]
print(json.dumps({"apiVersion": "v1", "kind": "Pod",
    "metadata": {"name": name, "namespace": "kube-system", "labels": ds["spec"]["template"]["metadata"]["labels"],
                 "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "x", "uid": owner}]},
    "spec": {"nodeName": node, "containers": [{"name": "done", "image": "i"}]}, "status": json.loads(status)}))
PY
}
READY='{"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}'
CRASH='{"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}], "initContainerStatuses": [{"name": "uninstall", "ready": false, "restartCount": 3, "image": "i", "imageID": "", "state": {"waiting": {"reason": "CrashLoopBackOff"}}, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}'

python3 "$REPO/tests/e2e/lib/fake-apiserver.py" "$API" & APIPID=$!
on_exit "kill $APIPID"
wait_for 10 test -s "$API/port" || { echo "uninstall-hook: the API server stand-in did not start"; exit 1; }
kubeconfig() { printf 'apiVersion: v1\nkind: Config\nclusters: [{name: fake, cluster: {server: "http://127.0.0.1:%s"}}]\nusers: [{name: fake, user: {}}]\ncontexts: [{name: fake, context: {cluster: fake, user: fake}}]\ncurrent-context: fake\n' "$1"; }
kubeconfig "$(cat "$API/port")" > "$WORK/kubeconfig"
export KUBECONFIG=$WORK/kubeconfig
start_wait() { "${JOB[@]}" > "$WORK/wait.out" 2> "$WORK/wait.err" & WAITPID=$!; }
on_exit 'kill $WAITPID'
running() { kill -0 "$WAITPID" 2>/dev/null; }
exited() { ! running; }

echo "-- ... the uninstall runs on two nodes"
ds_status null
start_wait
sleep 3
check "just created (no status from the controller yet): still waiting after 3 s" running
ds_status "$(counts 1 2 1)"
sleep 3
check "one node of two done: still waiting" running
check_match "  ... and says so" "^daemonset $NS/$DS: ready on 1 of 2 nodes$" "$(cat "$WORK/wait.err")"
ds_status "$(counts 1 2 2)"
wait_for 6 exited
check "both done: it ends" exited
wait "$WAITPID"; rc=$?
check_eq "  ... with exit status 0 (Helm then deletes the hooks and the release)" "$rc" 0
check_eq "  ... and one line" "$(cat "$WORK/wait.out")" "daemonset $NS/$DS: ready on 2 of 2 nodes"
check_eq "it only read: GETs of that DaemonSet" "$(cut -d' ' -f1,2 "$API/requests.log" | sort -u)" \
    "GET /apis/apps/v1/namespaces/$NS/daemonsets/$DS"

echo "-- ... a node whose uninstall fails"
ds_status "$(counts 1 2 1)"
pod hook-a gpu-a "$UID_DS" "$READY"
pod hook-b gpu-b "$UID_DS" "$CRASH"
pod other-c gpu-c 00000000-0000-4000-8000-000000000000 "$CRASH"  # the same labels, another owner
: > "$API/requests.log"
start_wait
wait_for 20 exited
check "it gives up after the rendered 10 s" exited
wait "$WAITPID"; rc=$?
check_eq "  ... with exit status 1 (the Job fails, so does helm uninstall; the release stays)" "$rc" 1
check_eq "  ... in one line naming the node, its container and why (not the pod of another owner)" "$(cat "$WORK/wait.err")" \
    "daemonset $NS/$DS: ready on 1 of 2 nodes
vgpu-daemonset-wait: daemonset $NS/$DS: ready on 1 of 2 nodes after 10 s; not ready: gpu-b: init container uninstall: CrashLoopBackOff, last exit status 1"
sel=$(python3 -c 'import sys, yaml; ds = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "DaemonSet" and d["metadata"]["name"].endswith("-uninstall-hook")); print(",".join(f"{k}={v}" for k, v in sorted(ds["spec"]["selector"]["matchLabels"].items())))' "$WORK/chart.yaml")
check_match "  ... its pods listed by the DaemonSet's selector" "^GET /api/v1/namespaces/$NS/pods\\?&?labelSelector=" "$(grep pods "$API/requests.log")"
check_eq "  ... exactly that selector" "$(python3 -c 'import sys; from urllib.parse import urlsplit, parse_qs; print(",".join(sorted(parse_qs(urlsplit(sys.argv[1]).query)["labelSelector"][0].split(","))))' "$(grep -o '/api/v1/[^ ]*' "$API/requests.log")")" "$sel"

echo "-- ... no node to run on; no DaemonSet; no API server"
ds_status "$(counts 1 0 0)"
start_wait; wait_for 5 exited
wait "$WAITPID"; rc=$?
check_eq "no node to run on: done at once, exit status 0" "$rc $(cat "$WORK/wait.out")" "0 daemonset $NS/$DS: ready on 0 of 0 nodes"
rm "$API/daemonsets/${NS}_$DS.json"
start_wait; wait_for 5 exited
wait "$WAITPID"; rc=$?
check_eq "no such DaemonSet: one line at once, exit status 1" "$rc $(cat "$WORK/wait.err")" \
    "1 vgpu-daemonset-wait: daemonset $NS/$DS: not found"
kubeconfig 1 > "$WORK/kubeconfig"
start_wait; wait_for 20 exited
wait "$WAITPID"; rc=$?
check_match "no API server: retried for the 10 s, then one line with the last error" "^vgpu-daemonset-wait: daemonset $NS/$DS: not read in 10 s: .+" \
    "$(cat "$WORK/wait.err")"
check_eq "  ... exit status 1, one line" "$rc $(wc -l < "$WORK/wait.err")" "1 1"
out=$("${JOB[0]}" "$DS" --namespace "$NS" --timeout-seconds 0 2>&1); rc=$?
check_match "a zero timeout is refused, naming the flag" "timeout-seconds" "$rc $out"
t_done
