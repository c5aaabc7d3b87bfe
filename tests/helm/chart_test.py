"""The Helm chart (packaging/helm/vgpu) under a real Helm: Helm v4's own library through helm-python-sdk
(PyPI; no helm binary, no cluster). Lint, the values schema's refusals, the rendered objects
(`helm template`), and what `helm upgrade` changes between two renderings (its rendered diff).
Prints one line per check and `N passed, N failed`; run by tests/e2e/helm.test.sh.
Usage: python3 chart_test.py CHART WORK"""

import difflib
import subprocess
import sys

import helm_python as helm
import yaml

from checks import check, done

CHART, WORK = sys.argv[1], sys.argv[2]



def render(values=None, **opts):
    """The chart's objects as `helm template vgpu -n kube-system` renders them: {template: [docs]}."""
    chart = helm.Chart.load(CHART)
    out = chart.render(values or {}, name="vgpu", namespace="kube-system", **opts)
    return {k.split("/")[-1]: [d for d in yaml.safe_load_all(v) if d] for k, v in out.items()}


def objects(rendered):
    return [d for docs in rendered.values() for d in docs]


def one(rendered, kind, name):
    found = [d for d in objects(rendered) if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind} {name}: {len(found)}"
    return found[0]


def validate(rendered, path, *extra):
    with open(path, "w") as f:
        yaml.safe_dump_all(objects(rendered), f)
    r = subprocess.run(["kubernetes-validate", "--strict", "--quiet", *extra, path], capture_output=True, text=True)
    return r.returncode == 0, r.stdout + r.stderr


def sets(*assignments):
    values = {}
    for a in assignments:
        for k, v in helm.parse_set_string(a).items():
            node = values
            while isinstance(v, dict) and k in node and isinstance(node[k], dict):
                (k2, v2), = v.items()
                node, k, v = node[k], k2, v2
            node[k] = v
    return values


print("-- helm lint --strict (Helm", helm.helm_sdk_version() + ")")
for label, values, kube in [
    ("the defaults, Kubernetes 1.25", {}, "v1.25.0"),
    ("DRA on, Kubernetes 1.34", sets("dra.enabled=true"), "v1.34.0"),
]:
    r = helm.lint(CHART, values, strict=True, kube_version=kube)
    bad = [m for m in r["messages"] if m["severity"] >= 2] + r["errors"]
    check(f"lint: {label}", not bad, bad)
meta = helm.Chart.load(CHART).metadata
check("Chart.yaml: kubeVersion >=1.25 (docs/compatibility.md)", meta.get("kubeVersion") == ">=1.25.0-0", meta)

print("-- values.schema.json: unknown keys and bad values are refused, with the key named")
for assignment, named in [
    ("engin=crio", "additional properties 'engin' not allowed"),
    ("engine=cri-o", "/engine"),
    ("quota.default=8GB", "/quota/default"),
    ("quota.defualt=8Gi", "additional properties 'defualt' not allowed"),
    ("monitor.port=70000", "/monitor/port"),
    ("restart=sometimes", "/restart"),
    ("mode=delete", "/mode"),
    ("dra.nodeSelector=gpu", "/dra/nodeSelector"),
    ("gc.intervalSeconds=0", "/gc/intervalSeconds"),
    ("uninstallHook.timeoutSeconds=5", "/uninstallHook/timeoutSeconds"),
    ("uninstallHook.wait=true", "additional properties 'wait' not allowed"),
    ("monitor.hami.containersDir=usr/local/vgpu/containers", "/monitor/hami/containersDir"),
    ("monitor.hami.taskdir=/run", "additional properties 'taskdir' not allowed"),
]:
    try:
        render(helm.parse_set_string(assignment), is_install=True)
        check(f"--set {assignment} is refused", False, "rendered")
    except helm.HelmValuesError as e:
        check(f"--set {assignment} is refused, naming {named}", named in str(e), e)
for assignment in ["engine=crio", "quota.default=8Gi", "quota.default=512Mi", "monitor.port=9500", "mode=uninstall"]:
    try:
        render(helm.parse_set_string(assignment), is_install=True)
        check(f"--set {assignment} renders", True)
    except helm.HelmError as e:
        check(f"--set {assignment} renders", False, e)

print("-- helm template: the objects")
d = render(is_install=True)
ok, out = validate(d, f"{WORK}/defaults.yaml")
check("the defaults validate (kubernetes-validate --strict)", ok, out)
check("  ... kube-rbac-proxy's RBAC and service account, a ConfigMap, the node DaemonSet, its uninstall hooks and the RuntimeClass",
      sorted((o["kind"], o["metadata"]["name"]) for o in objects(d))
      == [("ClusterRole", "vgpu-metrics-reader"), ("ClusterRole", "vgpu-rbac-proxy"),
          ("ClusterRoleBinding", "vgpu-rbac-proxy"), ("ConfigMap", "vgpu-node-config"), ("DaemonSet", "vgpu-node"),
          ("DaemonSet", "vgpu-uninstall-hook"), ("Job", "vgpu-uninstall-wait"), ("Role", "vgpu-uninstall-hook"),
          ("RoleBinding", "vgpu-uninstall-hook"), ("RuntimeClass", "vgpu"), ("ServiceAccount", "vgpu-node"),
          ("ServiceAccount", "vgpu-uninstall-hook")],
      [(o["kind"], o["metadata"]["name"]) for o in objects(d)])
node = one(d, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
monitor = next(c for c in node["containers"] if c["name"] == "monitor")
check("  ... the monitor gets NODE_NAME from the downward API (spec.nodeName)",
      {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in monitor.get("env", []),
      monitor.get("env"))
install = node["initContainers"][0]
check("  ... the installer reads the node policy from the ConfigMap",
      {"name": "node-config", "mountPath": "/etc/vgpu-chart", "readOnly": True} in install["volumeMounts"]
      and {"name": "node-config", "configMap": {"name": "vgpu-node-config"}} in node["volumes"]
      and {"name": "VGPU_CHART_CONFIG", "value": "/etc/vgpu-chart/config.toml"} in install["env"], install)
print("-- helm uninstall in one step: the pre-delete hooks")
# Issue 46: the hook was a DaemonSet alone, kept by Helm after the release (before-hook-creation only), and
# nothing held the release's deletion back until the nodes were done (Helm waits for hook Jobs and Pods only).
hooks = [o for o in objects(d) if "helm.sh/hook" in o["metadata"].get("annotations", {})]
ann = {(o["kind"], o["metadata"]["name"]): o["metadata"]["annotations"] for o in hooks}
check("  ... the hooks: the waiter's service account, Role and RoleBinding, the uninstall DaemonSet, the Job",
      sorted(ann) == [("DaemonSet", "vgpu-uninstall-hook"), ("Job", "vgpu-uninstall-wait"), ("Role", "vgpu-uninstall-hook"),
                      ("RoleBinding", "vgpu-uninstall-hook"), ("ServiceAccount", "vgpu-uninstall-hook")], sorted(ann))
check("  ... all pre-delete, none outliving the release: each deleted once all succeed (hook-succeeded), "
      "a failed run's replaced by the next (before-hook-creation)",
      all(a.get("helm.sh/hook") == "pre-delete"
          and set(a.get("helm.sh/hook-delete-policy", "").split(",")) == {"before-hook-creation", "hook-succeeded"}
          for a in ann.values()), ann)
weight = {k: int(a.get("helm.sh/hook-weight", "0")) for k, a in ann.items()}
check("  ... in order (Helm runs a weight's hooks before the next's): RBAC, then the DaemonSet, then the Job last",
      max(w for (k, _), w in weight.items() if k in ("ServiceAccount", "Role", "RoleBinding"))
      < weight[("DaemonSet", "vgpu-uninstall-hook")] < weight[("Job", "vgpu-uninstall-wait")], weight)
hook = one(d, "DaemonSet", "vgpu-uninstall-hook")
hpod = hook["spec"]["template"]["spec"]
check("  ... the DaemonSet runs install.sh uninstall, privileged with the node's /, on the node DaemonSet's nodes",
      hpod["initContainers"][0]["args"] == ["uninstall"] and hpod["initContainers"][0]["securityContext"] == {"privileged": True}
      and {"name": "host-root", "hostPath": {"path": "/", "type": "Directory"}} in hpod["volumes"]
      and (hpod["nodeSelector"], hpod["tolerations"]) == (node["nodeSelector"], node["tolerations"]), hpod)
check("  ... with the install container's engine settings (it unconfigures what install configured)",
      hpod["initContainers"][0]["env"] == [e for e in install["env"] if e["name"] != "VGPU_CHART_CONFIG"],
      (hpod["initContainers"][0]["env"], install["env"]))
sel = hook["spec"]["selector"]["matchLabels"]
labels = hook["spec"]["template"]["metadata"]["labels"]
nsel = one(d, "DaemonSet", "vgpu-node")["spec"]["selector"]["matchLabels"]
check("  ... its selector is its own: its pods' labels, not the node DaemonSet's pods'",
      sel.items() <= labels.items() and sel.get("vgpu.io/role") == "uninstall-hook"
      and not sel.items() <= one(d, "DaemonSet", "vgpu-node")["spec"]["template"]["metadata"]["labels"].items()
      and sel != nsel, (sel, nsel))
job = one(d, "Job", "vgpu-uninstall-wait")
jpod = job["spec"]["template"]["spec"]
wait = jpod["containers"][0]
check("  ... the Job runs vgpu-daemonset-wait on that DaemonSet, in its namespace, 240 s",
      wait["command"] == ["/usr/local/bin/vgpu-daemonset-wait"]
      and wait["args"] == ["vgpu-uninstall-hook", "--namespace=kube-system", "--timeout-seconds=240"], wait)
check("  ... once (backoffLimit 0), within Helm's default 300 s for the hook, its log printed by Helm on failure",
      job["spec"]["backoffLimit"] == 0 and 240 < job["spec"]["activeDeadlineSeconds"] <= 300
      and jpod["restartPolicy"] == "Never"
      and ann[("Job", "vgpu-uninstall-wait")].get("helm.sh/hook-output-log-policy") == "hook-failed", job["spec"])
check("  ... unprivileged: not root, no capabilities, its filesystem read-only",
      wait["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "runAsNonRoot": True,
                                  "runAsUser": 65534, "capabilities": {"drop": ["ALL"]}}, wait["securityContext"])
role, binding = one(d, "Role", "vgpu-uninstall-hook"), one(d, "RoleBinding", "vgpu-uninstall-hook")
check("  ... its service account may get that DaemonSet and list pods in the namespace, nothing else",
      jpod["serviceAccountName"] == "vgpu-uninstall-hook"
      and binding["subjects"] == [{"kind": "ServiceAccount", "name": "vgpu-uninstall-hook", "namespace": "kube-system"}]
      and binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "vgpu-uninstall-hook"}
      and role["rules"] == [{"apiGroups": ["apps"], "resources": ["daemonsets"], "resourceNames": ["vgpu-uninstall-hook"], "verbs": ["get"]},
                            {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}], (role, binding))
longer = render(sets("uninstallHook.timeoutSeconds=900"), is_install=True)
lj = one(longer, "Job", "vgpu-uninstall-wait")
check("  ... uninstallHook.timeoutSeconds=900: the wait and the Job's deadline follow",
      lj["spec"]["template"]["spec"]["containers"][0]["args"][-1] == "--timeout-seconds=900"
      and lj["spec"]["activeDeadlineSeconds"] == 930, lj["spec"])
nohook = render(sets("uninstallHook.enabled=false"), is_install=True)
check("  ... uninstallHook.enabled=false: no hook",
      [o["metadata"]["name"] for o in objects(nohook) if "helm.sh/hook" in o["metadata"].get("annotations", {})] == [])
print("-- the rest")
dra = render(sets("dra.enabled=true"), is_install=True)
ok, out = validate(dra, f"{WORK}/dra.yaml", "-k", "1.34.0")
check("dra.enabled=true validates against Kubernetes 1.34", ok, out)
plugin = one(dra, "DaemonSet", "vgpu-dra")["spec"]["template"]["spec"]
check("  ... the DRA DaemonSet has its own node selector (vgpu.io/dra), not NVIDIA's",
      plugin["nodeSelector"] == {"vgpu.io/dra": "true"} and plugin["tolerations"] == node["tolerations"],
      plugin["nodeSelector"])
pool = render(sets("dra.enabled=true", "dra.nodeSelector.pool=vgpu-dra"), is_install=True)
check("  ... and takes dra.nodeSelector",
      one(pool, "DaemonSet", "vgpu-dra")["spec"]["template"]["spec"]["nodeSelector"]
      == {"vgpu.io/dra": "true", "pool": "vgpu-dra"})
check("  ... by default the monitor mounts none of HAMi's folders, the node policy says nothing of them",
      not any(v["name"].startswith("hami-") for v in node["volumes"])
      and "hami" not in one(d, "ConfigMap", "vgpu-node-config")["data"]["config.toml"])
hd = "/usr/local/vgpu/containers"
td = "/run/containerd/io.containerd.runtime.v2.task"
hami = render(sets(f"monitor.hami.containersDir={hd}"), is_install=True)
ok, out = validate(hami, f"{WORK}/hami.yaml")
check("monitor.hami.containersDir set: validates", ok, out)
hnode = one(hami, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
hmon = next(c for c in hnode["containers"] if c["name"] == "monitor")
check("  ... the monitor mounts HAMi's folder read-only at the node's path",
      {"name": "hami-containers", "mountPath": hd, "readOnly": True} in hmon["volumeMounts"]
      and {"name": "hami-containers", "hostPath": {"path": hd, "type": "DirectoryOrCreate"}} in hnode["volumes"],
      hmon["volumeMounts"])
check("  ... and containerd's task folder read-only, HostToContainer (rootfs mounts the node unmounts go)",
      {"name": "hami-tasks", "mountPath": td, "readOnly": True, "mountPropagation": "HostToContainer"}
      in hmon["volumeMounts"]
      and {"name": "hami-tasks", "hostPath": {"path": td, "type": "DirectoryOrCreate"}} in hnode["volumes"],
      hmon["volumeMounts"])
check("  ... the other containers mount neither",
      all(not any(m["name"].startswith("hami-") for m in c.get("volumeMounts", []))
          for c in hnode["containers"] + hnode["initContainers"] if c["name"] != "monitor"))
hconf = one(hami, "ConfigMap", "vgpu-node-config")["data"]["config.toml"]
check("  ... the node policy's [monitor] names both",
      f'[monitor]\nhami_containers_dir = "{hd}"\nhami_task_dir = "{td}"' in hconf, hconf)
ronly = render(sets(f"monitor.hami.containersDir={hd}", "monitor.hami.taskDir="), is_install=True)
rnode = one(ronly, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
check("  ... taskDir \"\": the task folder not mounted, hami_task_dir = false (report only)",
      not any(v["name"] == "hami-tasks" for v in rnode["volumes"])
      and "hami_task_dir = false" in one(ronly, "ConfigMap", "vgpu-node-config")["data"]["config.toml"])
un = render(sets("mode=uninstall"), is_install=True)
check("mode=uninstall: the uninstall DaemonSet alone",
      [(o["kind"], o["metadata"]["name"]) for o in objects(un)] == [("DaemonSet", "vgpu-uninstall")],
      [(o["kind"], o["metadata"]["name"]) for o in objects(un)])

print("-- helm upgrade --set quota.default=8Gi --set quota.required=true: the rendered diff")
before = render(is_install=True, revision=1)
after = render(sets("quota.default=8Gi", "quota.required=true"), is_upgrade=True, revision=2)
changed = {}
for t in sorted(set(before) | set(after)):
    a = yaml.safe_dump_all(before.get(t, []), sort_keys=True).splitlines()
    b = yaml.safe_dump_all(after.get(t, []), sort_keys=True).splitlines()
    diff = [l for l in difflib.unified_diff(a, b, t, t, lineterm="", n=0) if l[:1] in "+-" and l[:3] not in ("+++", "---")]
    if diff:
        changed[t] = diff
for t, diff in changed.items():
    print(f"     {t}:")
    for line in diff:
        print(f"       {line}")
check("  ... changes the ConfigMap, the node DaemonSet and the stored uninstall hook's environment only",
      sorted(changed) == ["cleanup-hook.yaml", "daemonset.yaml", "node-config.yaml"], sorted(changed))
config = one(after, "ConfigMap", "vgpu-node-config")["data"]["config.toml"]
check("  ... the node policy in the ConfigMap is the new one",
      'default_memory_limit = "8Gi"\n' in config and "require_memory_limit = true\n" in config, config)
check("  ... and the node DaemonSet's pod template changes, so its pods roll and the installer rewrites "
      "each node's config from it",
      any(l.strip().startswith("+") and "8Gi" in l for l in changed.get("daemonset.yaml", [])),
      changed.get("daemonset.yaml"))

done("helm")
