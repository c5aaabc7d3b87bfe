#!/usr/bin/env bash
# The chart's tenant-quota ValidatingAdmissionPolicy (quotaPolicy.enabled): its CEL evaluated against sample
# pods and namespace ConfigMaps with cel-python (lib/vap-eval.py, as the API server evaluates a policy), from
# the chart as rendered by a real Helm (tests/helm/template.py) and validated offline (kubernetes-validate). What no cluster here
# can show: the API server itself running it.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
t_init quota-policy
RENDER=(python3 "$REPO/tests/helm/template.py") CHART=$REPO/packaging/helm/vgpu
python3 -c 'import celpy' 2>/dev/null || { echo "quota-policy: cel-python is not installed (tests/setup/deps.sh)"; echo "0 passed, 1 failed"; exit 1; }
"${RENDER[@]}" "$CHART" > "$WORK/default.yaml"
check_not "off by default" grep -q 'tenant-quota' "$WORK/default.yaml"
"${RENDER[@]}" "$CHART" --set quotaPolicy.enabled=true > "$WORK/chart.yaml"
check "quotaPolicy.enabled=true renders and validates (kubernetes-validate --strict)" kubernetes-validate --strict --quiet "$WORK/chart.yaml"

# pod ANNOTATIONS-JSON [RUNTIMECLASS] [LIMITS-JSON]: a pod file; verdict POD PARAMS: the policy's answer.
pod() {
    local f=$WORK/pod$RANDOM.json
    jq -n --argjson a "$1" --arg rc "${2-vgpu}" --argjson l "${3:-{\}}" '{apiVersion: "v1", kind: "Pod",
        metadata: ({name: "p", namespace: "team-a"} + (if $a == null then {} else {annotations: $a} end)),
        spec: ((if $rc == "" then {} else {runtimeClassName: $rc} end)
               + {containers: [{name: "main", image: "i", resources: {limits: $l}}]})}' > "$f"
    echo "$f"
}
params() { local f=$WORK/cm$RANDOM.json; jq -n --argjson d "$1" '{apiVersion: "v1", kind: "ConfigMap", metadata: {name: "vgpu-quota-maxima"}, data: $d}' > "$f"; echo "$f"; }
verdict() { python3 "$REPO/tests/e2e/lib/vap-eval.py" "$WORK/chart.yaml" vgpu-tenant-quota "$1" "$2"; }
MAX=$(params '{"memory-max": "8Gi", "compute-max": "50"}')
MEMONLY=$(params '{"memory-max": "8Gi"}')

check_eq "a pod without quota annotations is not matched" "$(verdict "$(pod null)" none)" "not matched"
check_eq "within the maxima, under vgpu's RuntimeClass: admitted" \
    "$(verdict "$(pod '{"vgpu.io/memory-limit": "4Gi", "vgpu.io/compute-limit": "30"}')" "$MAX")" admitted
check_eq "exactly the maxima in other units (8192Mi, 8G = GiB as vgpu reads it, 50): admitted" \
    "$(verdict "$(pod '{"vgpu.io/memory-limit": "8192Mi", "vgpu.io/memory-limit.trainer": "8G", "vgpu.io/compute-limit.0": "50"}')" "$MAX")" admitted
check_eq "a per-container key over the maximum: denied, naming it" \
    "$(verdict "$(pod '{"vgpu.io/memory-limit": "4Gi", "vgpu.io/memory-limit.trainer.1": "9Gi"}')" "$MAX")" \
    "denied: a vgpu.io/memory-limit annotation asks more than this namespace allows (memory-max 8Gi in ConfigMap vgpu-quota-maxima)"
check_eq "1.5Ti: denied" "$(verdict "$(pod '{"vgpu.io/memory-limit": "1.5Ti"}')" "$MAX" | cut -c1-60)" \
    "denied: a vgpu.io/memory-limit annotation asks more than thi"
check_eq "compute over the maximum: denied" "$(verdict "$(pod '{"vgpu.io/compute-limit": "60"}')" "$MAX")" \
    "denied: a vgpu.io/compute-limit annotation asks more than this namespace allows (compute-max 50 in ConfigMap vgpu-quota-maxima)"
check_eq "compute where the namespace sets no compute-max: denied" "$(verdict "$(pod '{"vgpu.io/compute-limit": "10"}')" "$MEMONLY")" \
    "denied: a vgpu.io/compute-limit annotation asks more than this namespace allows (compute-max unset in ConfigMap vgpu-quota-maxima)"
check_eq "memory alone where only memory-max is set: admitted" "$(verdict "$(pod '{"vgpu.io/memory-limit": "2Gi"}')" "$MEMONLY")" admitted
check_eq "a namespace without the ConfigMap: denied" "$(verdict "$(pod '{"vgpu.io/memory-limit": "1Gi"}')" none)" \
    "denied: no params (parameterNotFoundAction Deny)"
check_eq "without vgpu's RuntimeClass: denied" "$(verdict "$(pod '{"vgpu.io/memory-limit": "1Gi"}' runc)" "$MAX")" \
    "denied: a pod with a vgpu.io quota annotation must set runtimeClassName vgpu (vgpu's runtime enforces it)"
check_eq "  ... or none at all: denied" "$(verdict "$(pod '{"vgpu.io/memory-limit": "1Gi"}' "")" "$MAX" | cut -c1-47)" \
    "denied: a pod with a vgpu.io quota annotation m"
check_eq "a unit vgpu does not read (4GB): denied" "$(verdict "$(pod '{"vgpu.io/memory-limit": "4GB"}')" "$MAX")" \
    "denied: a vgpu.io/memory-limit annotation is not a quantity vgpu reads (a number and a binary unit, e.g. 8Gi)"
check_eq "a share that is no whole percent (30%): denied" "$(verdict "$(pod '{"vgpu.io/compute-limit": "30%"}')" "$MAX")" \
    "denied: a vgpu.io/compute-limit annotation is not a whole percent"
check_eq "a pod asking the device plugin's vgpu.io/memory may not add its own annotation" \
    "$(verdict "$(pod '{"vgpu.io/memory-limit.main": "2Gi"}' vgpu '{"vgpu.io/memory": "4"}')" "$MAX")" \
    "denied: a pod that asks vgpu.io/memory or vgpu.io/compute gets its quota from vgpu's device plugin and may not set vgpu.io quota annotations"

echo "-- compute requests (issue 42): within compute-max, bounded by a limit below 100; no request through the env"
MAX100=$(params '{"memory-max": "8Gi", "compute-max": "100"}')
check_eq "a request and a limit within compute-max: admitted" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20", "vgpu.io/compute-limit": "50"}')" "$MAX")" admitted
check_eq "a request over compute-max: denied, naming it" \
    "$(verdict "$(pod '{"vgpu.io/compute-request.main": "60", "vgpu.io/compute-limit": "50"}')" "$MAX")" \
    "denied: a vgpu.io/compute-request annotation asks more than this namespace allows (compute-max 50 in ConfigMap vgpu-quota-maxima)"
check_eq "a request where the namespace sets no compute-max: denied" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "10"}')" "$MEMONLY")" \
    "denied: a vgpu.io/compute-request annotation asks more than this namespace allows (compute-max unset in ConfigMap vgpu-quota-maxima)"
BOUND="denied: a pod with a vgpu.io/compute-request annotation must bound it below the compute-max of this namespace (50): set vgpu.io/compute-limit, and vgpu.io/compute-limit.<container> for each container a per-GPU limit key names (a request alone may use the whole GPU)"
check_eq "a request alone below a compute-max of 50 (its limit would be the whole GPU): denied" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20"}')" "$MAX")" "$BOUND"
check_eq "  ... a container's per-GPU limit without its limit for every GPU leaves its other GPUs unbounded: denied" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20", "vgpu.io/compute-limit": "50", "vgpu.io/compute-limit.trainer.1": "40"}')" "$MAX")" "$BOUND"
check_eq "  ... with it: admitted" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20", "vgpu.io/compute-limit": "50", "vgpu.io/compute-limit.trainer.1": "40", "vgpu.io/compute-limit.trainer": "50"}')" "$MAX")" admitted
check_eq "  ... a request alone where compute-max is 100: admitted" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20"}')" "$MAX100")" admitted
check_eq "a request that is no whole percent (20%): denied" \
    "$(verdict "$(pod '{"vgpu.io/compute-request": "20%", "vgpu.io/compute-limit": "50"}')" "$MAX")" \
    "denied: a vgpu.io/compute-request annotation is not a whole percent"
envpod=$WORK/envpod.json
jq '.spec.containers[0].env = [{name: "CUDA_DEVICE_SM_REQUEST_0", value: "100"}] | del(.metadata.annotations)' "$(pod null)" > "$envpod"
ENVDENY="denied: a container may not set a quota variable in its env (CUDA_DEVICE_SM_*, CUDA_DEVICE_MEMORY_*, CUDA_DISABLE_CONTROL, GPU_CORE_UTILIZATION_POLICY, CUDA_OVERSUBSCRIBE, VGPU_MEMORY_*, VGPU_COMPUTE_*, VGPU_LIMITS_FILE; vgpu's hook and HAMi's library read them as its quota or their switches); ask a quota with the vgpu.io annotations, within this namespace's maxima"
check_eq "a container's own CUDA_DEVICE_SM_REQUEST env (no annotation): matched and denied" "$(verdict "$envpod" "$MAX100")" "$ENVDENY"
jq '.spec.initContainers = [{name: "init", image: "i", env: [{name: "CUDA_DEVICE_SM_REQUEST", value: "50"}]}] | del(.metadata.annotations)' "$(pod null)" > "$envpod"
check_eq "  ... an init container's too" "$(verdict "$envpod" "$MAX100")" "$ENVDENY"
# Under HAMi's device plugin a pod's own value comes after the plugin's in the spec and wins (the quota
# HAMi's scheduler counted, or HAMi-core's switch off): every quota variable is refused, with or without
# vgpu's annotations; a pod's other variables are not looked at.
for v in CUDA_DEVICE_MEMORY_LIMIT_0=65536m CUDA_DEVICE_SM_LIMIT=100 CUDA_DISABLE_CONTROL=true \
    GPU_CORE_UTILIZATION_POLICY=disable CUDA_DEVICE_MEMORY_SHARED_CACHE=/tmp/x VGPU_LIMITS_FILE=/tmp/l.json; do
    jq --arg n "${v%%=*}" --arg v "${v#*=}" '.spec.containers[0].env = [{name: "PATH", value: "/bin"}, {name: $n, value: $v}] | del(.metadata.annotations) | del(.spec.runtimeClassName) | .spec.containers[0].resources.limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1024"}' "$(pod null)" > "$envpod"
    check_eq "a HAMi pod (nvidia.com/gpumem) that sets ${v%%=*} in its env: denied" "$(verdict "$envpod" "$MAX100")" "$ENVDENY"
done
jq '.spec.containers[0].env = [{name: "PATH", value: "/bin"}, {name: "CUDA_VISIBLE_DEVICES", value: "0"}] | del(.metadata.annotations)' "$(pod null)" > "$envpod"
check_eq "  ... a pod whose env holds no quota variable is not matched" "$(verdict "$envpod" "$MAX100")" "not matched"
# vgpu's own pods (the installer, the device plugin: VGPU_ENGINE, VGPU_CONFIG, VGPU_DRIVER_ROOT) are none of
# them: the chart's own DaemonSets are admitted with the policy on.
jq '.spec.containers[0].env = [{name: "VGPU_ENGINE", value: "containerd"}, {name: "VGPU_CONFIG", value: "/host/etc/vgpu/config.toml"}, {name: "VGPU_DRIVER_ROOT", value: "/"}] | del(.metadata.annotations)' "$(pod null)" > "$envpod"
check_eq "  ... nor one whose env holds vgpu's own settings (VGPU_ENGINE, VGPU_CONFIG, VGPU_DRIVER_ROOT)" "$(verdict "$envpod" "$MAX100")" "not matched"
t_done
