"""An in-memory Kubernetes API server for running a real Helm's install and uninstall (helm-python-sdk)
against, with stand-ins for the controllers the chart's uninstall hook depends on. Objects are kept as
sent, in a dict; the API is what Helm's client uses: /version, discovery (/api, /apis and each
group-version's resource list), create (POST), get and list (label selectors k=v), watch (list then
events, as JSON lines), server-side apply and merge patches (PATCH), replace (PUT) and delete. Every
write is recorded in order in `events` (verb, kind, namespace/name) for the test to read.

The stand-ins:
- the DaemonSet controller and kubelets: NODES run every DaemonSet (no selector is matched: they are all
  GPU nodes). For each DaemonSet a pod per node is made, owned by it, and "run" after RUN_S: the node's
  `install.sh` action (its init container's args) is recorded in `ran`, then the pod is Ready, unless the
  node is in `failing`, where the init container crash-loops (exit 1). The DaemonSet's status counts them.
- the Job controller: a Job's container command is run as a local process (`jobs` maps the image's path
  to this build's), with KUBECONFIG naming this server; its exit status completes or fails the Job.
"""

import copy
import json
import os
import re
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

import yaml

# (group, version, plural, kind, namespaced)
RESOURCES = [
    ("", "v1", "namespaces", "Namespace", False),
    ("", "v1", "configmaps", "ConfigMap", True),
    ("", "v1", "secrets", "Secret", True),
    ("", "v1", "serviceaccounts", "ServiceAccount", True),
    ("", "v1", "services", "Service", True),
    ("", "v1", "pods", "Pod", True),
    ("apps", "v1", "daemonsets", "DaemonSet", True),
    ("apps", "v1", "deployments", "Deployment", True),
    ("batch", "v1", "jobs", "Job", True),
    ("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    ("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    ("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    ("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
]
PATH = re.compile(r"^/(?:api/(?P<cv>v1)|apis/(?P<g>[^/]+)/(?P<v>[^/]+))(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$")
NODES = ["gpu-a", "gpu-b"]
RUN_S = 1.0


def status(code, reason, message):
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure", "message": message,
            "reason": reason, "code": code}


def merge(into, patch):
    """JSON merge patch (RFC 7386); good enough for Helm's patches of the objects here."""
    for k, v in patch.items():
        if v is None:
            into.pop(k, None)
        elif isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)
    return into


class Cluster:
    def __init__(self, jobs=None):
        self.lock = threading.Condition()
        self.objects = {}  # (plural, namespace, name) -> object
        self.rv = 1
        self.log = []  # (rv, type, plural, object)
        self.events = []  # (time, verb, kind, "ns/name")
        self.ran = []  # (time, node, action)
        self.failing = set()
        self.jobs = jobs or {}
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.kubeconfig = tempfile.NamedTemporaryFile("w", suffix=".kubeconfig", delete=False)
        self.kubeconfig.write(self.kubeconfig_text())
        self.kubeconfig.close()

    def kubeconfig_text(self):
        return (f"apiVersion: v1\nkind: Config\nclusters: [{{name: fake, cluster: {{server: \"http://127.0.0.1:{self.port}\"}}}}]\n"
                "users: [{name: fake, user: {}}]\ncontexts: [{name: fake, context: {cluster: fake, user: fake}}]\n"
                "current-context: fake\n")

    def close(self):
        self.server.shutdown()
        os.unlink(self.kubeconfig.name)

    # --- the store -------------------------------------------------------------------------------
    def kind_of(self, plural):
        return next(r[3] for r in RESOURCES if r[2] == plural)

    def record(self, verb, plural, obj):
        m = obj["metadata"]
        self.events.append((time.monotonic(), verb, self.kind_of(plural), f"{m.get('namespace', '')}/{m['name']}"))

    def put(self, plural, obj, verb):
        """Stores obj (create or update), under the lock."""
        m = obj.setdefault("metadata", {})
        key = (plural, m.get("namespace", ""), m["name"])
        old = self.objects.get(key)
        m.setdefault("uid", old["metadata"]["uid"] if old else str(uuid.uuid4()))
        m.setdefault("creationTimestamp", "2026-11-29T00:00:00Z")
        gen = old["metadata"].get("generation", 1) if old else 1
        if old and old.get("spec") != obj.get("spec"):
            gen += 1
        m["generation"] = gen
        self.rv += 1
        m["resourceVersion"] = str(self.rv)
        self.objects[key] = obj
        self.log.append((self.rv, "MODIFIED" if old else "ADDED", plural, copy.deepcopy(obj)))
        if verb:
            self.record(verb, plural, obj)
        self.lock.notify_all()
        return obj

    def remove(self, plural, ns, name):
        obj = self.objects.pop((plural, ns, name), None)
        if obj is None:
            return None
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.log.append((self.rv, "DELETED", plural, copy.deepcopy(obj)))
        self.record("delete", plural, obj)
        # Garbage collection: what it owned goes with it.
        uid = obj["metadata"]["uid"]
        for (p, n, nm), o in list(self.objects.items()):
            if any(r.get("uid") == uid for r in o["metadata"].get("ownerReferences", [])):
                self.remove(p, n, nm)
        self.lock.notify_all()
        return obj

    def listed(self, plural, ns, selector):
        want = dict(t.partition("=")[::2] for t in filter(None, selector.split(",")))
        return [copy.deepcopy(o) for (p, n, _), o in sorted(self.objects.items())
                if p == plural and (ns is None or n == ns)
                and all(o["metadata"].get("labels", {}).get(k) == v for k, v in want.items())]

    def named(self, kind, name):
        return [o for (p, _, n), o in self.objects.items() if self.kind_of(p) == kind and n == name]

    # --- the stand-in controllers ----------------------------------------------------------------
    def tick(self):
        """One pass of the DaemonSet controller and kubelets and the Job controller, under the lock."""
        now = time.monotonic()
        for (plural, ns, name), ds in list(self.objects.items()):
            if plural != "daemonsets":
                continue
            uid = ds["metadata"]["uid"]
            labels = ds["spec"]["template"]["metadata"].get("labels", {})
            ready = 0
            for node in NODES:
                pname = f"{name}-{node}"
                pod = self.objects.get(("pods", ns, pname))
                if pod is None:
                    pod = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": pname, "namespace": ns, "labels": dict(labels),
                                        "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name, "uid": uid}]},
                           "spec": {"nodeName": node, "containers": ds["spec"]["template"]["spec"]["containers"]},
                           "status": {"phase": "Pending"}}
                    pod["metadata"]["annotations"] = {"fake/started": str(now)}
                    self.put("pods", pod, None)
                    continue
                if pod["status"].get("phase") == "Running":
                    ready += 1
                    continue
                if now - float(pod["metadata"]["annotations"]["fake/started"]) < RUN_S:
                    continue
                inits = ds["spec"]["template"]["spec"].get("initContainers", [])
                if node in self.failing and inits:
                    st = {"phase": "Pending", "conditions": [{"type": "Ready", "status": "False"}],
                          "initContainerStatuses": [{"name": inits[0]["name"], "ready": False, "restartCount": 1, "image": "i", "imageID": "",
                                                     "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                                                     "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}]}
                    if pod["status"] != st:
                        pod = copy.deepcopy(pod)
                        pod["status"] = st
                        self.put("pods", pod, None)
                    continue
                for c in inits:
                    self.ran.append((now, node, f"{name}: {' '.join(c.get('args', []))}"))
                pod = copy.deepcopy(pod)
                pod["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
                self.put("pods", pod, None)
                ready += 1
            st = {"observedGeneration": ds["metadata"]["generation"], "desiredNumberScheduled": len(NODES),
                  "currentNumberScheduled": len(NODES), "numberMisscheduled": 0, "numberReady": ready,
                  "updatedNumberScheduled": len(NODES)}
            if ds.get("status") != st:
                ds = copy.deepcopy(ds)
                ds["status"] = st
                self.put("daemonsets", ds, None)
        for (plural, ns, name), job in list(self.objects.items()):
            if plural == "jobs" and "fake/proc" not in job["metadata"].get("annotations", {}):
                self.start_job(ns, name, job)

    def start_job(self, ns, name, job):
        c = job["spec"]["template"]["spec"]["containers"][0]
        cmd = [self.jobs.get(c["command"][0], c["command"][0])] + c.get("args", [])
        job = copy.deepcopy(job)
        job["metadata"].setdefault("annotations", {})["fake/proc"] = "started"
        job["status"] = {"active": 1}
        self.put("jobs", job, None)
        uid = job["metadata"]["uid"]

        def run():
            r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "KUBECONFIG": self.kubeconfig.name})
            with self.lock:
                cur = self.objects.get(("jobs", ns, name))
                if cur is None or cur["metadata"]["uid"] != uid:
                    return
                cur = copy.deepcopy(cur)
                done = "Complete" if r.returncode == 0 else "Failed"
                cur["status"] = {"succeeded" if r.returncode == 0 else "failed": 1,
                                 "conditions": [{"type": done, "status": "True", "reason": "BackoffLimitExceeded" if r.returncode else ""}]}
                cur["metadata"]["annotations"]["fake/output"] = (r.stdout + r.stderr).strip()
                self.put("jobs", cur, None)
                self.record(f"job {done.lower()}", "jobs", cur)

        threading.Thread(target=run, daemon=True).start()

    def controllers(self):
        while True:
            with self.lock:
                self.tick()
            time.sleep(0.1)

    def wait_until(self, cond, timeout=10):
        """Waits (at most timeout seconds) until cond() holds, checked as the controllers change things."""
        deadline = time.monotonic() + timeout
        with self.lock:
            while not cond() and time.monotonic() < deadline:
                self.lock.wait(0.2)
        return cond()

    def start(self):
        threading.Thread(target=self.controllers, daemon=True).start()
        return self

    # --- HTTP ------------------------------------------------------------------------------------
    def handler(self):
        cluster = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def send(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def body(self):
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                return yaml.safe_load(raw) if raw else {}

            def discovery(self, path):
                if path == "/version":
                    return {"major": "1", "minor": "34", "gitVersion": "v1.34.0", "platform": "linux/amd64"}
                if path == "/api":
                    return {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
                groups = sorted({(g, v) for g, v, *_ in RESOURCES if g})
                if path == "/apis":
                    return {"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                        {"name": g, "versions": [{"groupVersion": f"{g}/{v}", "version": v}],
                         "preferredVersion": {"groupVersion": f"{g}/{v}", "version": v}} for g, v in groups]}
                for g, v in [("", "v1")] + groups:
                    gv = f"{g}/{v}" if g else v
                    if path == (f"/apis/{gv}" if g else "/api/v1"):
                        return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
                            {"name": p, "singularName": k.lower(), "namespaced": nsd, "kind": k,
                             "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
                            for gg, vv, p, k, nsd in RESOURCES if (gg, vv) == (g, v)]}
                # OpenAPI v3, only what a client reads to learn that the server validates fields itself
                # (each kind's PATCH takes fieldValidation), so Helm leaves validation to it.
                gvs = {(f"apis/{g}/{v}" if g else "api/v1"): (g, v) for g, v, *_ in RESOURCES}
                if path == "/openapi/v3":
                    return {"paths": {k: {"serverRelativeURL": f"/openapi/v3/{k}?hash=1"} for k in gvs}}
                if path.startswith("/openapi/v3/") and path[len("/openapi/v3/"):] in gvs:
                    g, v = gvs[path[len("/openapi/v3/"):]]
                    paths = {}
                    for gg, vv, p, k, nsd in RESOURCES:
                        if (gg, vv) != (g, v):
                            continue
                        prefix = f"/apis/{g}/{v}" if g else "/api/v1"
                        paths[f"{prefix}/{'namespaces/{namespace}/' if nsd else ''}{p}/{{name}}"] = {"patch": {
                            "x-kubernetes-group-version-kind": {"group": g, "version": v, "kind": k},
                            "parameters": [{"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}],
                            "responses": {"200": {"description": "OK"}}}}
                    return {"openapi": "3.0.0", "info": {"title": "fake", "version": "v1.34.0"}, "paths": paths}
                return None

            def route(self):
                url = urlsplit(self.path)
                q = {k: v[0] for k, v in parse_qs(url.query).items()}
                m = PATH.match(url.path)
                if not m or not any(r[2] == m["res"] for r in RESOURCES):
                    return url, q, None
                return url, q, m

            def do_GET(self):
                url, q, m = self.route()
                d = self.discovery(url.path)
                if d is not None:
                    return self.send(200, d)
                if m is None:
                    return self.send(404, status(404, "NotFound", f"{url.path} not found"))
                plural, ns, name = m["res"], m["ns"], m["name"]
                with cluster.lock:
                    if name:
                        obj = cluster.objects.get((plural, ns or "", name))
                        if obj is None:
                            return self.send(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                        return self.send(200, obj)
                    if q.get("watch") in ("1", "true"):
                        return self.watch(plural, ns, q)
                    items = cluster.listed(plural, ns, q.get("labelSelector", ""))
                    g = m["g"]
                    return self.send(200, {"kind": cluster.kind_of(plural) + "List", "apiVersion": f"{g}/{m['v']}" if g else "v1",
                                           "metadata": {"resourceVersion": str(cluster.rv)}, "items": items})

            def watch(self, plural, ns, q):
                """Events after resourceVersion (every object as ADDED without one), as JSON lines, chunked."""
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                since = int(q.get("resourceVersion") or 0)
                sel = dict(t.partition("=")[::2] for t in filter(None, q.get("labelSelector", "").split(",")))
                fname = q.get("fieldSelector", "").partition("metadata.name=")[2].split(",")[0]
                deadline = time.monotonic() + min(int(q.get("timeoutSeconds") or 30), 30)
                initial = q.get("sendInitialEvents") == "true"
                pending = [("ADDED", o) for o in cluster.listed(plural, ns, "")] if initial or not since else []
                seen = cluster.rv if initial or not since else since
                if initial:  # a streaming list: the initial objects, then a bookmark saying they are all
                    g = next(r[0] for r in RESOURCES if r[2] == plural)
                    pending.append(("BOOKMARK", {"kind": cluster.kind_of(plural), "apiVersion": f"{g}/v1" if g else "v1",
                                                 "metadata": {"resourceVersion": str(seen),
                                                              "annotations": {"k8s.io/initial-events-end": "true"}}}))
                try:
                    while time.monotonic() < deadline:
                        pending += [(t, o) for rv, t, p, o in cluster.log if rv > seen and p == plural]
                        seen = cluster.rv
                        for t, o in pending:
                            md = o["metadata"]
                            if t == "BOOKMARK":
                                pass
                            elif ns and md.get("namespace") != ns:
                                continue
                            elif fname and md["name"] != fname:
                                continue
                            elif any(md.get("labels", {}).get(k) != v for k, v in sel.items()):
                                continue
                            line = json.dumps({"type": t, "object": o}).encode() + b"\n"
                            self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                            self.wfile.flush()
                        pending = []
                        cluster.lock.wait(0.5)
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def write(self, verb):
                url, q, m = self.route()
                if m is None:
                    return self.send(404, status(404, "NotFound", f"{url.path} not found"))
                plural, ns, name = m["res"], m["ns"] or "", m["name"]
                body = self.body()
                ctype = self.headers.get("Content-Type", "")
                with cluster.lock:
                    key = (plural, ns, name)
                    if verb == "POST":
                        name = body["metadata"].get("name")
                        if (plural, ns, name) in cluster.objects:
                            return self.send(409, status(409, "AlreadyExists", f'{plural} "{name}" already exists'))
                        body["metadata"]["namespace"] = ns or None
                        if not ns:
                            body["metadata"].pop("namespace")
                        return self.send(201, cluster.put(plural, body, "create"))
                    if verb == "DELETE":
                        obj = cluster.remove(plural, ns, name)
                        if obj is None:
                            return self.send(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                        return self.send(200, obj)
                    old = cluster.objects.get(key)
                    if verb == "PUT":
                        if old is None:
                            return self.send(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                        return self.send(200, cluster.put(plural, body, "update"))
                    # PATCH: server-side apply creates; merge patches need the object.
                    if old is None and "apply-patch" not in ctype:
                        return self.send(404, status(404, "NotFound", f'{plural} "{name}" not found'))
                    if "apply-patch" in ctype:
                        obj = body
                        obj["metadata"]["name"] = name
                        if ns:
                            obj["metadata"]["namespace"] = ns
                        if old is not None:
                            obj["metadata"]["uid"] = old["metadata"]["uid"]
                            if "status" in old:
                                obj["status"] = old["status"]
                    else:
                        obj = merge(copy.deepcopy(old), body)
                    return self.send(200 if old else 201, cluster.put(plural, obj, "apply" if old is None else "patch"))

            def do_POST(self):
                self.write("POST")

            def do_PUT(self):
                self.write("PUT")

            def do_PATCH(self):
                self.write("PATCH")

            def do_DELETE(self):
                self.write("DELETE")

        return Handler
