#!/usr/bin/env bash
# The Kubernetes installer for real, short of a cluster: the installer image is built offline
# (packaging/installer/build.sh, docker import into a private dockerd) and its entrypoint run as the
# DaemonSet runs it, with a folder standing in for the node's root (busybox and glibc, containerd's config).
# Checked: what install writes (files, config.toml, lower_runtime, containerd's vgpu handler), that a second
# install changes nothing, that the monitor container's entrypoint serves the node's metrics, that uninstall restores containerd's config byte for byte and removes exactly what
# install wrote, the Helm chart rendered and linted by a real Helm (helm-python-sdk) with several values and
# validated against the Kubernetes API schemas (offline), and the gc and monitor containers' entrypoints
# working with only the capabilities and node paths the chart gives them (no node root, no chroot).
set -uo pipefail
. "$(dirname "$0")/engines-lib.sh"
t_init installer
t_require "$T/vgpu/libvgpu.so" "$T/vgpu/libvgpu_core.so" "$T/vgpu/libvgpu-single.so"
command -v kubernetes-validate >/dev/null || { echo "installer: kubernetes-validate missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }

echo "-- the Helm chart (rendered and linted by a real Helm: helm-python-sdk; validated offline)"
python3 -c 'import helm_python' 2>/dev/null || { echo "installer: helm-python-sdk missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
CHART=$REPO/packaging/helm/vgpu
RENDER=(python3 "$REPO/tests/helm/template.py")
render() { "${RENDER[@]}" "$CHART" "$@" > "$WORK/chart.yaml" 2> "$WORK/chart.err" && kubernetes-validate --strict --quiet "$WORK/chart.yaml"; }
kinds() { python3 -c 'import sys, yaml; print(" ".join(sorted(d["kind"] for d in yaml.safe_load_all(open(sys.argv[1])) if d)))' "$WORK/chart.yaml"; }
check "the defaults render, lint (helm lint --strict) and validate (kubernetes-validate --strict)" render
check_eq "  ... the node DaemonSet, the uninstall hooks (a DaemonSet, a Job and its RBAC), the node policy (a ConfigMap), its service account, kube-rbac-proxy's RBAC and the RuntimeClass" "$(kinds)" \
    "ClusterRole ClusterRole ClusterRoleBinding ConfigMap DaemonSet DaemonSet Job Role RoleBinding RuntimeClass ServiceAccount ServiceAccount"
# field PATH: one value of the rendered documents, by kind (the last of a kind) and a Python expression on
# it; `a` holds every document.
cfield() { python3 -c 'import sys, yaml
a = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
d = {x["kind"]: x for x in a}
print(eval(sys.argv[2], {"d": d, "a": a}))' "$WORK/chart.yaml" "$1"; }
POD='d["DaemonSet"]["spec"]["template"]["spec"]'
ctr() { echo "[c for c in $POD['containers'] if c['name'] == '$1'][0]"; }
check_eq "  ... the image is the chart's appVersion, which is the workspace's version" \
    "$(cfield "$POD[\"initContainers\"][0][\"image\"]")" \
    "vgpu/installer:$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)"
check_eq "  ... the chart's version is the workspace's" "$(sed -n 's/^version: //p' "$CHART/Chart.yaml")" \
    "$(sed -n 's/^version = "\(.*\)"/\1/p' "$REPO/Cargo.toml" | head -1)"
# Issue 44: gc and the monitor had the node's / mounted read-write (gc, with its capabilities, appended a
# line to a root-owned 0644 file). Now only the install init container has the node's root.
check_eq "  ... gc runs with all capabilities dropped but SYS_PTRACE, its own filesystem read-only" \
    "$(cfield "$(ctr gc)['securityContext']")" \
    "{'allowPrivilegeEscalation': False, 'readOnlyRootFilesystem': True, 'capabilities': {'drop': ['ALL'], 'add': ['SYS_PTRACE']}}"
check_eq "  ... gc mounts the state root and /etc/vgpu (read-only), not the node's /" \
    "$(cfield "[(m['name'], m['mountPath'], m.get('readOnly', False)) for m in $(ctr gc)['volumeMounts']]")" \
    "[('state-root', '/run/vgpu', False), ('vgpu-config', '/etc/vgpu', True)]"
check_eq "  ... the monitor mounts the state root, /etc/vgpu and the driver root (both read-only), not the node's /" \
    "$(cfield "[(m['name'], m['mountPath'], m.get('readOnly', False)) for m in $(ctr monitor)['volumeMounts']]")" \
    "[('state-root', '/run/vgpu', False), ('vgpu-config', '/etc/vgpu', True), ('driver-root', '/driver-root', True)]"
check_eq "  ... only the install init container mounts the node's /" \
    "$(cfield "[c['name'] for c in $POD['initContainers'] + $POD['containers'] for m in c.get('volumeMounts', []) if m['name'] == 'host-root']")" \
    "['install']"
check_eq "  ... the node's volumes: its /, the state root, /etc/vgpu and the driver root; and the chart's node policy" \
    "$(cfield "[(v['name'], v['hostPath']['path']) for v in $POD['volumes'] if 'hostPath' in v] + [(v['name'], v['configMap']['name']) for v in $POD['volumes'] if 'configMap' in v]")" \
    "[('host-root', '/'), ('state-root', '/run/vgpu'), ('vgpu-config', '/etc/vgpu'), ('driver-root', '/'), ('node-config', 'vgpu-node-config')]"
# Issue 44: the monitor listened on 0.0.0.0 on the host network, where a NetworkPolicy does not apply: any
# pod reaching the node read every tenant's names and usage.
check_eq "  ... the monitor listens on 127.0.0.1 only" "$(cfield "$(ctr monitor)['args']")" \
    "['monitor', '--listen', '127.0.0.1:9394']"
check_eq "  ... kube-rbac-proxy serves the node's port with TLS and passes only /metrics on to it" \
    "$(cfield "($(ctr kube-rbac-proxy)['args'], $(ctr kube-rbac-proxy)['ports'], $(ctr kube-rbac-proxy)['env'][0]['valueFrom'])")" \
    "(['--secure-listen-address=[\$(IP)]:9394', '--upstream=http://127.0.0.1:9394/', '--allow-paths=/metrics', '--tls-min-version=VersionTLS12'], [{'name': 'metrics', 'containerPort': 9394, 'protocol': 'TCP'}], {'fieldRef': {'fieldPath': 'status.podIP'}})"
check_eq "  ... as a non-root user with no capability, read-only" "$(cfield "$(ctr kube-rbac-proxy)['securityContext']")" \
    "{'allowPrivilegeEscalation': False, 'readOnlyRootFilesystem': True, 'runAsNonRoot': True, 'runAsUser': 65532, 'runAsGroup': 65532, 'capabilities': {'drop': ['ALL']}}"
check_eq "  ... the pod runs as the chart's service account" "$(cfield "$POD['serviceAccountName']")" vgpu-node
check_eq "  ... which may create TokenReviews and SubjectAccessReviews, nothing else" \
    "$(cfield "([x['rules'] for x in a if x['kind'] == 'ClusterRole' and x['metadata']['name'] == 'vgpu-rbac-proxy'], [(x['roleRef']['name'], x['subjects']) for x in a if x['kind'] == 'ClusterRoleBinding'])")" \
    "([[{'apiGroups': ['authentication.k8s.io'], 'resources': ['tokenreviews'], 'verbs': ['create']}, {'apiGroups': ['authorization.k8s.io'], 'resources': ['subjectaccessreviews'], 'verbs': ['create']}]], [('vgpu-rbac-proxy', [{'kind': 'ServiceAccount', 'name': 'vgpu-node', 'namespace': 'kube-system'}])])"
check_eq "  ... and scrapers get GET on /metrics from vgpu-metrics-reader" \
    "$(cfield "[x['rules'] for x in a if x['kind'] == 'ClusterRole' and x['metadata']['name'] == 'vgpu-metrics-reader']")" \
    "[[{'nonResourceURLs': ['/metrics'], 'verbs': ['get']}]]"
# Issue 44: the monitor had no liveness probe; a stuck collector was never restarted.
check_eq "  ... the monitor is restarted when /healthz fails (a stuck collector), probed on 127.0.0.1" \
    "$(cfield "$(ctr monitor)['livenessProbe']['httpGet']")" "{'host': '127.0.0.1', 'path': '/healthz', 'port': 9394}"
check_eq "  ... scrape annotations on the node's port, over https" \
    "$(cfield "[d['DaemonSet']['spec']['template']['metadata']['annotations'][k] for k in ('prometheus.io/port', 'prometheus.io/scheme')]")" \
    "['9394', 'https']"
check "monitor.rbacProxy.scrapers binds a Prometheus to vgpu-metrics-reader" \
    render -f <(printf 'monitor:\n  rbacProxy:\n    scrapers: [{kind: ServiceAccount, name: prometheus-k8s, namespace: monitoring}]\n')
check_eq "  ... by a ClusterRoleBinding" \
    "$(cfield "[x['subjects'] for x in a if x['kind'] == 'ClusterRoleBinding' and x['roleRef']['name'] == 'vgpu-metrics-reader']")" \
    "[[{'kind': 'ServiceAccount', 'name': 'prometheus-k8s', 'namespace': 'monitoring'}]]"
check "monitor.rbacProxy.enabled=false, stateRoot=/var/run/vgpu-op, monitor.driverRoot=/run/nvidia/driver" \
    render --set monitor.rbacProxy.enabled=false --set stateRoot=/var/run/vgpu-op --set monitor.driverRoot=/run/nvidia/driver
check_eq "  ... the monitor serves the node's port itself, no proxy, no proxy RBAC" \
    "$(cfield "($(ctr monitor)['args'], [c['name'] for c in $POD['containers']], $(ctr monitor)['ports'][0]['containerPort'])") $(kinds)" \
    "(['monitor', '--listen', '0.0.0.0:9394'], ['gc', 'monitor'], 9394) ConfigMap DaemonSet DaemonSet Job Role RoleBinding RuntimeClass ServiceAccount ServiceAccount"
check_eq "  ... the state root and the driver root are the values'" \
    "$(cfield "([(v['name'], v['hostPath']['path']) for v in $POD['volumes'] if 'hostPath' in v][1:], [m['mountPath'] for m in $(ctr gc)['volumeMounts']][0], {e['name']: e['value'] for e in $(ctr monitor)['env'] if 'value' in e})")" \
    "([('state-root', '/var/run/vgpu-op'), ('vgpu-config', '/etc/vgpu'), ('driver-root', '/run/nvidia/driver')], '/var/run/vgpu-op', {'VGPU_STATE_ROOT': '/var/run/vgpu-op', 'VGPU_DRIVER_ROOT': '/driver-root'})"
check "values: crio, set-as-default, a required 4Gi default quota, port 9500, a ServiceMonitor" \
    render --set engine=crio --set setAsDefault=true --set quota.default=4Gi --set quota.required=true \
        --set monitor.port=9500 --set monitor.serviceMonitor.enabled=true --set monitor.scrapeAnnotations=false
check_eq "  ... reach the installer's environment" \
    "$(cfield "{e['name']: e['value'] for e in $POD['initContainers'][0]['env']}")" \
    "{'VGPU_ENGINE': 'crio', 'VGPU_ENGINE_CONFIG': '', 'VGPU_SET_AS_DEFAULT': 'true', 'VGPU_RESTART': 'systemd', 'VGPU_NVIDIA_RUNTIME': '', 'VGPU_DEFAULT_MEMORY_LIMIT': '4Gi', 'VGPU_REQUIRE_MEMORY_LIMIT': 'true', 'VGPU_CHART_CONFIG': '/etc/vgpu-chart/config.toml'}"
check_eq "  ... a Service and a ServiceMonitor on port 9500, no scrape annotations" \
    "$(kinds) $(cfield "d['ServiceMonitor']['spec']['endpoints'][0]['port']") $(cfield "d['Service']['spec']['ports'][0]['port']") $(cfield "'annotations' in d['DaemonSet']['spec']['template']['metadata']")" \
    "ClusterRole ClusterRole ClusterRoleBinding ConfigMap DaemonSet DaemonSet Job Role RoleBinding RuntimeClass Service ServiceAccount ServiceAccount ServiceMonitor metrics 9500 False"
check_eq "  ... the ServiceMonitor scrapes kube-rbac-proxy with TLS and Prometheus's token" \
    "$(cfield "{k: v for k, v in d['ServiceMonitor']['spec']['endpoints'][0].items() if k in ('scheme', 'bearerTokenFile', 'tlsConfig')}") $(cfield "$(ctr kube-rbac-proxy)['args'][0]")" \
    "{'scheme': 'https', 'bearerTokenFile': '/var/run/secrets/kubernetes.io/serviceaccount/token', 'tlsConfig': {'insecureSkipVerify': True}} --secure-listen-address=[\$(IP)]:9500"
check "monitor disabled, a custom node selector and no tolerations" \
    render --set monitor.enabled=false --set nodeSelector.pool=gpu -f <(printf 'tolerations: []\nnodeSelector: {pool: gpu}\n')
check_eq "  ... gc alone, on the pool, no proxy RBAC" "$(cfield "[c['name'] for c in $POD['containers']]") $(cfield "$POD['nodeSelector']") $(kinds)" \
    "['gc'] {'nvidia.com/gpu.present': 'true', 'pool': 'gpu'} ConfigMap DaemonSet DaemonSet Job Role RoleBinding RuntimeClass ServiceAccount ServiceAccount"
check "mode=uninstall renders and validates" render --set mode=uninstall
check_eq "  ... the uninstall DaemonSet alone, running install.sh uninstall" \
    "$(kinds) $(cfield "d['DaemonSet']['metadata']['name']") $(cfield "$POD['initContainers'][0]['args']")" \
    "DaemonSet vgpu-uninstall ['uninstall']"
check_match "an unknown function in a template is refused in one line" '^template.py: .*function "nosuchfunc" not defined' \
    "$(mkdir -p "$WORK/bad" && cp -r "$CHART/." "$WORK/bad/" && echo '{{ .Values.engine | nosuchfunc }}' > "$WORK/bad/templates/zz.yaml" && "${RENDER[@]}" "$WORK/bad" 2>&1)"
check "the example pod (docs/examples) validates" kubernetes-validate --strict --quiet "$REPO/docs/examples/pod-with-quota.yaml"
# DRA needs resource.k8s.io/v1 with consumable capacity: Kubernetes 1.34, the oldest schema it is checked against.
render_dra() { "${RENDER[@]}" "$CHART" --set dra.enabled=true > "$WORK/chart.yaml" 2> "$WORK/chart.err" &&
    kubernetes-validate --strict --quiet -k 1.34.0 "$WORK/chart.yaml" && kubernetes-validate --strict --quiet "$WORK/chart.yaml"; }
check "dra.enabled=true renders and validates against Kubernetes 1.34 and the newest schema" render_dra
check_eq "  ... the DeviceClass, the driver's RBAC, its node policy and its DaemonSet beside the node's" "$(kinds)" \
    "ClusterRole ClusterRole ClusterRole ClusterRoleBinding ClusterRoleBinding ConfigMap DaemonSet DaemonSet DaemonSet DeviceClass Job Role RoleBinding RuntimeClass ServiceAccount ServiceAccount ServiceAccount ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding"
# Issue 44: the ClusterRole let the driver create, update and delete every ResourceSlice in the cluster.
check_eq "  ... a policy holds the driver's service account to its own node's ResourceSlices (issue 44)" \
    "$(cfield "(d['ValidatingAdmissionPolicy']['spec']['matchConstraints']['resourceRules'][0]['resources'], d['ValidatingAdmissionPolicy']['spec']['matchConditions'][0]['expression'].strip(), [v['expression'] for v in d['ValidatingAdmissionPolicy']['spec']['validations']], d['ValidatingAdmissionPolicyBinding']['spec'])")" \
    "(['resourceslices'], 'request.userInfo.username == \"system:serviceaccount:kube-system:vgpu-dra\"', [\"variables.userNode != ''\", 'variables.userNode == variables.objectNode'], {'policyName': 'vgpu-dra-own-node-slices', 'validationActions': ['Deny']})"
check_eq "  ... the driver may read its Node, manage ResourceSlices and read ResourceClaims, nothing else" \
    "$(cfield "[(r['resources'], r['verbs']) for x in a if x['kind'] == 'ClusterRole' and x['metadata']['name'] == 'vgpu-dra' for r in x['rules']]")" \
    "[(['nodes'], ['get']), (['resourceslices'], ['get', 'list', 'create', 'update', 'patch', 'delete']), (['resourceclaims'], ['get'])]"
# The DRA DaemonSet's pod (the second DaemonSet: the chart renders it first).
DRAPOD='[x for x in __import__("yaml").safe_load_all(open("'$WORK/chart.yaml'")) if x and x["kind"] == "DaemonSet" and x["metadata"]["name"].endswith("-dra")][0]["spec"]["template"]["spec"]'
check_eq "  ... the plugin runs from the image with the node's driver root (/) read-only at /driver-root, named to it" \
    "$(cfield "($DRAPOD['containers'][0]['command'], [v['hostPath'] for v in $DRAPOD['volumes'] if v['name'] == 'driver-root'], [(m['mountPath'], m.get('readOnly')) for m in $DRAPOD['containers'][0]['volumeMounts'] if m['name'] == 'driver-root'], {e['name']: e.get('value') for e in $DRAPOD['containers'][0]['env']}['VGPU_DRIVER_ROOT'])")" \
    "(['/usr/local/bin/vgpu-dra-plugin'], [{'path': '/', 'type': 'Directory'}], [('/driver-root', True)], '/driver-root')"
check_eq "  ... privileged for the GPUs' device nodes, its own filesystem read-only, no host namespaces" \
    "$(cfield "($DRAPOD['containers'][0]['securityContext'], [k for k in ('hostNetwork', 'hostPID', 'hostIPC') if $DRAPOD.get(k)])")" \
    "({'privileged': True, 'readOnlyRootFilesystem': True}, [])"
"${RENDER[@]}" "$CHART" --set dra.enabled=true --set dra.driverRoot=/run/nvidia/driver > "$WORK/chart.yaml" 2> "$WORK/chart.err"
check_eq "  ... dra.driverRoot=/run/nvidia/driver (NVIDIA's GPU Operator): that folder is the driver root" \
    "$(cfield "[v['hostPath']['path'] for v in $DRAPOD['volumes'] if v['name'] == 'driver-root']")" "['/run/nvidia/driver']"
check_eq "  ... the DeviceClass selects the driver's devices" \
    "$(cfield "d['DeviceClass']['spec']['selectors'][0]['cel']['expression']")" 'device.driver == "gpu.vgpu.io"'
render_ex() { "${RENDER[@]}" "$CHART" --set dra.enabled=true --set dra.examples.namespace=team-a --set dra.examples.quotaDevices=2 \
    > "$WORK/chart.yaml" 2> "$WORK/chart.err" && kubernetes-validate --strict --quiet -k 1.34.0 "$WORK/chart.yaml"; }
check "dra.examples.namespace=team-a renders the example claims and quota, valid for 1.34" render_ex
check_eq "  ... 8 GiB and 30% of a GPU, and the namespace capped at 2 vgpu devices" \
    "$(python3 -c 'import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
t = [d for d in docs if d["kind"] == "ResourceClaimTemplate"][0]
q = [d for d in docs if d["kind"] == "ResourceQuota"][0]
print(t["metadata"]["namespace"], t["spec"]["spec"]["devices"]["requests"][0]["exactly"]["capacity"]["requests"], q["spec"]["hard"])' "$WORK/chart.yaml")" \
    "team-a {'memory': '8Gi', 'compute': '30'} {'vgpu.io.deviceclass.resource.k8s.io/devices': '2'}"
check "the DRA examples (ResourceClaimTemplates, ResourceQuota, pod) validate against Kubernetes 1.34" \
    kubernetes-validate --strict --quiet -k 1.34.0 "$REPO/docs/examples/dra-claims.yaml"

echo "-- the image"
bash "$REPO/packaging/build.sh" > /dev/null 2> "$WORK/package.err" || { tail -20 "$WORK/package.err"; }
dockerd_start "$WORK/docker" || { echo "0 passed, 1 failed"; exit 1; }
IMG=vgpu-e2e/installer:test
check "the image builds with docker import (nothing pulled)" bash "$REPO/packaging/installer/build.sh" "$IMG"
check_eq "its entrypoint is install.sh install" \
    "$(docker image inspect -f '{{json .Config.Entrypoint}} {{json .Config.Cmd}}' "$IMG" 2>&1)" '["/vgpu/install.sh"] ["install"]'

echo "-- the uninstall hook's Job in the image, as the chart runs it (its waiter against an API server: uninstall-hook.test.sh)"
JOB_RUN=(docker run --rm --user 65534 --read-only --cap-drop ALL --security-opt no-new-privileges --entrypoint /usr/local/bin/vgpu-daemonset-wait "$IMG")
check_match "the image carries /usr/local/bin/vgpu-daemonset-wait, which runs there as the Job's user 65534" '^vgpu-daemonset-wait ' \
    "$("${JOB_RUN[@]}" --version 2>&1)"
out=$("${JOB_RUN[@]}" vgpu-uninstall-hook --namespace=kube-system --timeout-seconds=10 2>&1); rc=$?
check_match "  ... and, with no API server to reach, says so in one line, exit status 1" \
    "^1 1 vgpu-daemonset-wait: cannot reach the API server \\(KUBECONFIG or the pod's service account\\): .+" \
    "$rc $(printf '%s\n' "$out" | wc -l) $out"

echo "-- the DRA plugin in the image, as the chart's vgpu-dra DaemonSet runs it"
check_match "the image carries /usr/local/bin/vgpu-dra-plugin, which runs in the image (with its glibc)" '^vgpu-dra-plugin ' \
    "$(docker run --rm --entrypoint /usr/local/bin/vgpu-dra-plugin "$IMG" --version 2>&1)"
# The GPU Operator's layout: its driver container's root (/run/nvidia/driver on the node), NVML under
# usr/lib/x86_64-linux-gnu; mounted read-only at /driver-root as the chart does, the pod's own root read-only.
DR=$WORK/driver-root; mkdir -p "$DR/usr/lib/x86_64-linux-gnu" && cp "$FAKE_DIR/libnvidia-ml.so.1" "$DR/usr/lib/x86_64-linux-gnu/"
out=$(docker run --rm --read-only --tmpfs /tmp --entrypoint /usr/local/bin/vgpu-dra-plugin -e VGPU_DRIVER_ROOT=/driver-root \
    -e FAKE_CUDA_DEVICES=16Gi,80Gi -v "$DR:/driver-root:ro" "$IMG" --node-name node-a --print-slice 2>&1)
check_eq "  ... loads NVML from the driver root and prints the node's slice (two GPUs, 16 and 80 GiB)" \
    "$(jq -c '[.spec.devices[] | [.name, .capacity.memory.value]]' <<< "$out" 2>&1)" '[["gpu-0","16Gi"],["gpu-1","80Gi"]]'
out=$(docker run --rm --entrypoint /usr/local/bin/vgpu-dra-plugin -e VGPU_DRIVER_ROOT=/vgpu "$IMG" --node-name node-a --print-slice 2>&1)
check_match "  ... a driver root without NVML is one line naming where it looked" 'no libnvidia-ml.so.1 under the driver root /vgpu \(looked in usr/lib64' "$out"

# node DIR: a node's root filesystem: busybox, /usr/lib and /usr/local/bin as every distribution has them, the glibc the vgpu binaries need, containerd's config.
BIN=$T/glibc-2.28/x86_64-unknown-linux-gnu/release
node() {
    rootfs_busybox "$1" && rootfs_add_libs "$1" "$BIN/vgpuctl" "$BIN/vgpu-hook" "$BIN/vgpu-container-runtime" &&
        mkdir -p "$1/etc/containerd" "$1/usr/lib" "$1/usr/local/bin" "$1/usr/bin" &&
        printf 'version = 2\n\n# the operator'"'"'s comment\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  default_runtime_name = "runc"\n' \
            > "$1/etc/containerd/config.toml"
}
installer() { local root=$1; shift; docker run --rm -e VGPU_RESTART=none "$@" -v "$root:/host" "$IMG" "${INSTALLER_ARGS[@]}"; }

echo "-- install on a node without NVIDIA's runtime"
N=$WORK/node1; node "$N"
find "$N" | sort > "$WORK/node1.before"
before=$(fingerprint "$N/etc/containerd/config.toml")
INSTALLER_ARGS=(install)
check "install succeeds" installer "$N"
for f in usr/local/bin/vgpuctl usr/local/bin/vgpu-hook usr/local/bin/vgpu-container-runtime usr/lib/vgpu/libvgpu.so usr/lib/vgpu/libvgpu_core.so usr/lib/vgpu/libvgpu-single.so; do
    check "installed: /$f" test -s "$N/$f"
done
check "libvgpu-single.so (for HAMi's device plugin) is the one make libvgpu built (cmp)" \
    cmp "$N/usr/lib/vgpu/libvgpu-single.so" "$T/vgpu/libvgpu-single.so"
check "the binaries are the image's (cmp)" cmp "$N/usr/local/bin/vgpuctl" "$BIN/vgpuctl"
check_match "config.toml: lower_runtime = runc, the installed hook and library" \
    '^hook_path = "/usr/local/bin/vgpu-hook"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
check_match "  ... lower_runtime" '^lower_runtime = "runc"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
check_match "containerd's config gains the vgpu handler calling /usr/local/bin/vgpu-container-runtime" \
    'runtimes\.vgpu' "$(cat "$N/etc/containerd/config.toml")"
check "  ... with the installed path" grep -q '/usr/local/bin/vgpu-container-runtime' "$N/etc/containerd/config.toml"
check "  ... and the operator's comment kept" grep -q "the operator's comment" "$N/etc/containerd/config.toml"
check_match "the installed vgpuctl runs on the node's own glibc (chroot)" '^vgpuctl ' \
    "$(chroot "$N" /usr/local/bin/vgpuctl --version 2>&1)"
after1=$(fingerprint "$N/etc/containerd/config.toml"); manifest1=$(cat "$N/etc/vgpu/installed-by-daemonset")
check "a second install (a pod restart) succeeds" installer "$N"
check_eq "  ... and changes nothing" "$(fingerprint "$N/etc/containerd/config.toml") $(cat "$N/etc/vgpu/installed-by-daemonset")" "$after1 $manifest1"

echo "-- the monitor container (install.sh monitor) as the chart runs it: the image's vgpuctl, the node's paths mounted"
# chart_run NODE ARGS...: the image with the chart's gc and monitor mounts instead of the node's root: the
# state root at its path, /etc/vgpu read-only, the image's own filesystem read-only.
chart_run() { local n=$1; shift; mkdir -p "$n/run/vgpu"; docker run --rm --read-only -v "$n/run/vgpu:/run/vgpu" -v "$n/etc/vgpu:/etc/vgpu:ro" "$@"; }
out=$(chart_run "$N" -v "$N:/driver-root:ro" "$IMG" monitor --once 2>"$WORK/monitor.err")
check_match "  ... prints one scrape of the node's state root" '^vgpu_state_errors [0-9]+$' "$out"
check_match "  ... with no NVML under the driver root: vgpu_nvml_up 0" '^vgpu_nvml_up 0$' "$out"
check_match "  ... in OpenMetrics text" '^# EOF$' "$out"
check_match "  ... and one line saying where it looked" 'no libnvidia-ml.so.1 under the driver root /driver-root' "$(cat "$WORK/monitor.err")"
# (The fake NVML keeps its device state under /tmp, a tmpfs here; the real one needs none.)
out=$(chart_run "$N" -v "$DR:/driver-root:ro" --tmpfs /tmp -e FAKE_CUDA_DEVICES=16Gi "$IMG" monitor --once 2>"$WORK/monitor.err")
check_match "  ... NVML from the driver root (the GPU Operator's layout): vgpu_nvml_up 1" '^vgpu_nvml_up 1$' "$out"
check_match "  ... the node's GPU (16 GiB)" '^vgpu_host_gpu_memory_total_bytes\{.*\} 17179869184$' "$out"
rmdir "$N/run/vgpu"  # made for the mount (the chart's hostPath makes it on a node): not install's

echo "-- uninstall"
INSTALLER_ARGS=(uninstall)
check "uninstall succeeds" installer "$N"
check_eq "containerd's config is byte for byte as before install" "$(fingerprint "$N/etc/containerd/config.toml")" "$before"
check_eq "the node holds exactly the files it had before" "$(find "$N" | sort | diff "$WORK/node1.before" -)" ""

echo "-- a node with NVIDIA's runtime and an operator's config.toml"
N=$WORK/node2; node "$N"
printf '#!/bin/sh\nexec runc "$@"\n' > "$N/usr/bin/nvidia-container-runtime"
chmod 755 "$N/usr/bin/nvidia-container-runtime"
INSTALLER_ARGS=(install)
check "install succeeds" installer "$N"
check_match "lower_runtime = NVIDIA's runtime, by its path on the node (NVIDIA's injection still happens)" \
    '^lower_runtime = "/usr/bin/nvidia-container-runtime"$' "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
INSTALLER_ARGS=(uninstall); installer "$N" 2>/dev/null
mv "$N/usr/bin/nvidia-container-runtime" "$WORK/ncr"
mkdir -p "$N/usr/local/nvidia/toolkit" && cp "$WORK/ncr" "$N/usr/local/nvidia/toolkit/nvidia-container-runtime"
INSTALLER_ARGS=(install)
check "the GPU Operator's runtime (/usr/local/nvidia/toolkit): install succeeds" installer "$N"
check_match "  ... and finds it" '^lower_runtime = "/usr/local/nvidia/toolkit/nvidia-container-runtime"$' \
    "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
INSTALLER_ARGS=(uninstall); installer "$N" 2>/dev/null
rm -r "$N/usr/local/nvidia"; mkdir -p "$N/opt/nvidia/bin" && cp "$WORK/ncr" "$N/opt/nvidia/bin/nvidia-container-runtime"
printf 'export PATH=/opt/nvidia/bin:$PATH\n' > "$N/etc/profile"
INSTALLER_ARGS=(install)
check "on the node's PATH only: install succeeds" installer "$N"
check_match "  ... and finds it there" '^lower_runtime = "/opt/nvidia/bin/nvidia-container-runtime"$' \
    "$(cat "$N/etc/vgpu/config.toml" 2>&1)"
INSTALLER_ARGS=(uninstall); installer "$N" 2>/dev/null; rm -f "$N/etc/profile"
INSTALLER_ARGS=(install)
check "VGPU_NVIDIA_RUNTIME names it, with the chart's node policy and set-as-default" installer "$N" \
    -e VGPU_NVIDIA_RUNTIME=/opt/nvidia/bin/nvidia-container-runtime -e VGPU_DEFAULT_MEMORY_LIMIT=4Gi \
    -e VGPU_REQUIRE_MEMORY_LIMIT=true -e VGPU_SET_AS_DEFAULT=true
check_eq "  ... config.toml carries the runtime and the policy" \
    "$(grep -E '^(lower_runtime|default_memory_limit|require_memory_limit)' "$N/etc/vgpu/config.toml" 2>&1 | tr '\n' ' ')" \
    'lower_runtime = "/opt/nvidia/bin/nvidia-container-runtime" default_memory_limit = "4Gi" require_memory_limit = true '
check "  ... which vgpuctl reads" env VGPU_CONFIG="$N/etc/vgpu/config.toml" "$T/release/vgpuctl" status --state-root "$WORK/none" 
# Issue 46: `helm upgrade --set quota.default=8Gi` changed nothing on a node that had a config. The chart's
# ConfigMap as the chart renders it, mounted where the DaemonSet mounts it: the installer's own config is
# rewritten from it (the node's lower_runtime kept), an operator's is not (below).
mkdir -p "$WORK/chart-config"
"${RENDER[@]}" "$CHART" --set quota.default=8Gi | python3 -c 'import sys, yaml
print([d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "ConfigMap"][0]["data"]["config.toml"], end="")' \
    > "$WORK/chart-config/config.toml"
check "an upgrade's install with the chart's new node policy (8Gi, not required) succeeds" installer "$N" \
    -e VGPU_NVIDIA_RUNTIME=/opt/nvidia/bin/nvidia-container-runtime -e VGPU_SET_AS_DEFAULT=true \
    -e VGPU_CHART_CONFIG=/etc/vgpu-chart/config.toml -v "$WORK/chart-config:/etc/vgpu-chart:ro"
check_eq "  ... and reconciles config.toml to it" \
    "$(grep -E '^(lower_runtime|default_memory_limit|require_memory_limit)' "$N/etc/vgpu/config.toml" 2>&1 | tr '\n' ' ')" \
    'lower_runtime = "/opt/nvidia/bin/nvidia-container-runtime" default_memory_limit = "8Gi" '
check_match "  ... once: again, it is up to date" 'config.toml is up to date' "$(installer "$N" \
    -e VGPU_NVIDIA_RUNTIME=/opt/nvidia/bin/nvidia-container-runtime -e VGPU_SET_AS_DEFAULT=true \
    -e VGPU_CHART_CONFIG=/etc/vgpu-chart/config.toml -v "$WORK/chart-config:/etc/vgpu-chart:ro" 2>&1)"
check_match "  ... and vgpu is containerd's default runtime" 'default_runtime_name = "vgpu"' "$(cat "$N/etc/containerd/config.toml")"
# The chart with HAMi's folders for the monitor: its node policy ends with a [monitor] table, and the
# node's lower_runtime must stay a top-level key (it was appended into [monitor] before).
"${RENDER[@]}" "$CHART" --set quota.default=8Gi --set monitor.hami.containersDir=/usr/local/vgpu/containers | python3 -c 'import sys, yaml
print([d for d in yaml.safe_load_all(sys.stdin) if d and d["kind"] == "ConfigMap"][0]["data"]["config.toml"], end="")' \
    > "$WORK/chart-config/config.toml"
check "an install with monitor.hami.containersDir's node policy succeeds" installer "$N" \
    -e VGPU_NVIDIA_RUNTIME=/opt/nvidia/bin/nvidia-container-runtime -e VGPU_SET_AS_DEFAULT=true \
    -e VGPU_CHART_CONFIG=/etc/vgpu-chart/config.toml -v "$WORK/chart-config:/etc/vgpu-chart:ro"
check_eq "  ... lower_runtime top-level, [monitor] with HAMi's folder and containerd's task folder" \
    "$(python3 -c 'import sys, tomllib; c = tomllib.load(open(sys.argv[1], "rb"))
print(c["lower_runtime"], c["monitor"]["hami_containers_dir"], c["monitor"]["hami_task_dir"])' "$N/etc/vgpu/config.toml" 2>&1)" \
    "/opt/nvidia/bin/nvidia-container-runtime /usr/local/vgpu/containers /run/containerd/io.containerd.runtime.v2.task"
check "  ... which vgpuctl reads" env VGPU_CONFIG="$N/etc/vgpu/config.toml" "$T/release/vgpuctl" status --state-root "$WORK/none"
echo "-- the gc container with only the chart's capabilities and mounts (the state root, /etc/vgpu read-only)"
mkdir -p "$N/run/vgpu"
docker run -d --name vgpu-e2e-gc -e VGPU_GC_INTERVAL=3600 --cap-drop ALL --cap-add SYS_PTRACE \
    --security-opt no-new-privileges --read-only -v "$N/run/vgpu:/run/vgpu" -v "$N/etc/vgpu:/etc/vgpu:ro" "$IMG" gc-loop > /dev/null
gc_ran() { docker logs vgpu-e2e-gc 2>&1 | grep -q 'removed'; }
wait_for 20 gc_ran
out=$(docker logs vgpu-e2e-gc 2>&1)
docker rm -f vgpu-e2e-gc > /dev/null 2>&1
check_match "  ... runs the image's vgpuctl gc on the mounted state root" '^0 removed, 0 kept' "$out"
check_eq "  ... without a permission error" "$(printf '%s\n' "$out" | grep -ciE 'error|not permitted|denied')" 0
INSTALLER_ARGS=(uninstall)
check "  ... uninstall succeeds" installer "$N"
check_eq "  ... and restores containerd's default runtime" "$(grep default_runtime_name "$N/etc/containerd/config.toml")" '  default_runtime_name = "runc"'
out=$(installer "$N" -e VGPU_DEFAULT_MEMORY_LIMIT='4Gi"; x' 2>&1)
check_eq "a quantity that is not one is one line naming it" "$out" 'vgpu-installer: VGPU_DEFAULT_MEMORY_LIMIT=4Gi"; x: not a quantity (e.g. 4Gi)'
N=$WORK/node3; node "$N"; mkdir -p "$N/etc/vgpu"; echo 'state_root = "/var/run/vgpu-op"' > "$N/etc/vgpu/config.toml"
INSTALLER_ARGS=(install)
check_match "an operator's config.toml is left as it is" "not the installer's: left as it is" "$(installer "$N" 2>&1)"
INSTALLER_ARGS=(uninstall)
check "  ... uninstall succeeds" installer "$N"
check_eq "  ... and keeps it" "$(cat "$N/etc/vgpu/config.toml")" 'state_root = "/var/run/vgpu-op"'

echo "-- bad input"
N=$WORK/node4; node "$N"; find "$N" | sort > "$WORK/node4.before"
INSTALLER_ARGS=(install)
out=$(installer "$N" -e VGPU_ENGINE=kata 2>&1)
check_eq "an unknown engine is one line naming it" "$out" "vgpu-installer: VGPU_ENGINE=kata: not containerd, docker, crio or podman"
check_eq "  ... and nothing is written" "$(find "$N" | sort | diff "$WORK/node4.before" -)" ""
INSTALLER_ARGS=(install)
check_match "no node root mounted: one line" 'holds no node root' "$(docker run --rm "$IMG" install 2>&1)"
t_done
