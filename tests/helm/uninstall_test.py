"""`helm install` then `helm uninstall` of the chart by a real Helm (Helm v4's library through
helm-python-sdk) against an in-memory API server with stand-in controllers (fake_cluster.py): the DaemonSet
controller and kubelets record what each node's init container ran, the Job controller runs the hook Job's
own command, vgpu-daemonset-wait of this build, against that server. Checked: Helm runs the pre-delete hooks
in order, deletes the release only once every node ran `install.sh uninstall`, and leaves nothing of the
release or its hooks; with a node whose uninstall fails, `helm uninstall` fails and keeps the release, and
the next one (the node fixed) finishes; the two-step way (`mode=uninstall`) still works.
Prints one line per check and `N passed, N failed`; run by tests/e2e/uninstall-hook.test.sh.
Usage: python3 uninstall_test.py CHART VGPU_DAEMONSET_WAIT"""

import sys

import helm_python as helm

import fake_cluster
from checks import check, done

CHART, WAIT = sys.argv[1], sys.argv[2]
NS = "kube-system"



def new_cluster():
    c = fake_cluster.Cluster(jobs={"/usr/local/bin/vgpu-daemonset-wait": WAIT}).start()
    return c, helm.Config(kubeconfig_path=c.kubeconfig.name, namespace=NS, storage_driver="memory")


def when(c, verb, kind, name):
    """The time of the first event verb kind name, or None."""
    return next((t for t, v, k, n in c.events if (v, k, n) == (verb, kind, name)), None)


def ran(c, action):
    """{node: time} of the nodes that ran action (e.g. "vgpu-uninstall-hook: uninstall")."""
    return {node: t for t, node, a in c.ran if a == action}


def left(c):
    return sorted(f"{c.kind_of(p)} {n}" for (p, _, n) in c.objects)


def one_step():
    c, cfg = new_cluster()
    cfg.install(CHART, "vgpu", {}, namespace=NS, timeout=30)
    c.wait_until(lambda: len(ran(c, "vgpu-node: install")) == 2)
    check("helm install: the node DaemonSet installs on both nodes",
          sorted(ran(c, "vgpu-node: install")) == fake_cluster.NODES, c.ran)
    check("  ... and no hook is created at install (pre-delete only)",
          not c.named("Job", "vgpu-uninstall-wait") and not c.named("DaemonSet", "vgpu-uninstall-hook"), left(c))
    start = len(c.events)
    try:
        cfg.uninstall("vgpu", timeout=60)
        check("helm uninstall succeeds", True)
    except helm.HelmError as e:
        check("helm uninstall succeeds", False, e)
    hooks = [(v, k, n) for _, v, k, n in c.events[start:] if v == "apply"]
    check("  ... Helm created the hooks in weight order: RBAC, the uninstall DaemonSet, then the Job",
          hooks == [("apply", "ServiceAccount", f"{NS}/vgpu-uninstall-hook"), ("apply", "Role", f"{NS}/vgpu-uninstall-hook"),
                    ("apply", "RoleBinding", f"{NS}/vgpu-uninstall-hook"), ("apply", "DaemonSet", f"{NS}/vgpu-uninstall-hook"),
                    ("apply", "Job", f"{NS}/vgpu-uninstall-wait")], hooks)
    done = ran(c, "vgpu-uninstall-hook: uninstall")
    check("  ... every node ran install.sh uninstall", sorted(done) == fake_cluster.NODES, c.ran)
    gone = when(c, "delete", "DaemonSet", f"{NS}/vgpu-node")
    check("  ... each before Helm deleted the node DaemonSet (the Job held the release back until then)",
          gone is not None and done and max(done.values()) < gone, (done, gone))
    completed = when(c, "job complete", "Job", f"{NS}/vgpu-uninstall-wait")
    check("  ... the Job (vgpu-daemonset-wait) completed after the last node was done",
          completed is not None and done and max(done.values()) <= completed, (done, completed))
    check("  ... and nothing is left: no object of the release, none of its hooks", left(c) == [], left(c))
    c.close()

def failing_node():
    c, cfg = new_cluster()
    cfg.install(CHART, "vgpu", {"uninstallHook": {"timeoutSeconds": 10}}, namespace=NS, timeout=30)
    c.failing.add("gpu-b")
    try:
        cfg.uninstall("vgpu", timeout=60)
        check("helm uninstall fails", False, "it succeeded")
    except helm.HelmError as e:
        check("helm uninstall fails, naming the hook Job", "vgpu-uninstall-wait" in str(e), e)
    job = c.named("Job", "vgpu-uninstall-wait")
    out = job[0]["metadata"]["annotations"].get("fake/output", "") if job else ""
    check("  ... the Job's line names the node, its init container and why", out.endswith(
        "ready on 1 of 2 nodes after 10 s; not ready: gpu-b: init container uninstall: CrashLoopBackOff, last exit status 1"), out)
    check("  ... the release stays (its node DaemonSet still there, the release still listed)",
          c.named("DaemonSet", "vgpu-node") and [r["name"] for r in cfg.list()] == ["vgpu"], left(c))
    c.failing.clear()
    try:
        cfg.uninstall("vgpu", timeout=60)
        check("the node fixed, helm uninstall again succeeds", True)
    except helm.HelmError as e:
        check("the node fixed, helm uninstall again succeeds", False, e)
    check("  ... gpu-b ran install.sh uninstall", "gpu-b" in ran(c, "vgpu-uninstall-hook: uninstall"), c.ran)
    check("  ... and nothing is left", left(c) == [], left(c))
    c.close()

def two_steps():
    c, cfg = new_cluster()
    cfg.install(CHART, "vgpu", {}, namespace=NS, timeout=30)
    cfg.upgrade(CHART, "vgpu", {"mode": "uninstall"}, namespace=NS, timeout=30)
    c.wait_until(lambda: len(ran(c, "vgpu-uninstall: uninstall")) == 2)
    check("the uninstall DaemonSet runs install.sh uninstall on both nodes",
          sorted(ran(c, "vgpu-uninstall: uninstall")) == fake_cluster.NODES, c.ran)
    check("  ... in place of the node DaemonSet", not c.named("DaemonSet", "vgpu-node"), left(c))
    start = len(c.events)
    cfg.uninstall("vgpu", timeout=60)
    check("helm uninstall then runs no hook", not [e for e in c.events[start:] if e[1] == "apply"], c.events[start:])
    check("  ... and leaves nothing", left(c) == [], left(c))
    c.close()

for title, section in [("helm uninstall: one step", one_step), ("a node whose uninstall fails", failing_node),
                       ("the two-step way: helm upgrade --set mode=uninstall, then helm uninstall", two_steps)]:
    print(f"-- {title}")
    try:
        section()
    except Exception as e:  # a Helm call that fails where it should not, or this chart's values refused
        check(f"{title}: ran to its end", False, f"{type(e).__name__}: {e}")

done("uninstall-hook (helm)")
