#!/usr/bin/env python3
"""A stand-in of the Kubernetes API server for the DRA suite: it answers from recorded API objects, for the
calls vgpu-dra-plugin makes. GET .../namespaces/NS/resourceclaims/NAME returns DIR/claims/NS_NAME.json and
GET /api/v1/nodes/NAME DIR/nodes/NAME.json (404 with a Status when absent); GET
/apis/resource.k8s.io/v1/resourceslices lists DIR/slices/*.json, filtered by a fieldSelector on
spec.nodeName and spec.driver as the real server does; PATCH .../resourceslices/NAME (a server-side apply)
stores the body as DIR/slices/NAME.json and returns it; DELETE .../resourceslices/NAME removes it. For the
chart's uninstall hook (vgpu-daemonset-wait): GET /apis/apps/v1/namespaces/NS/daemonsets/NAME returns
DIR/daemonsets/NS_NAME.json, GET /api/v1/namespaces/NS/pods lists DIR/pods/NS_*.json filtered by a
labelSelector of k=v terms. Every
request is logged to DIR/requests.log as "METHOD PATH CONTENT-TYPE". The port it listens on is written to
DIR/port."""
import glob, json, os, re, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

DIR = sys.argv[1]
CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)$")
SLICE = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/?]+)$")
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NODE = re.compile(r"^/api/v1/nodes/([^/?]+)$")
DAEMONSET = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/daemonsets/([^/?]+)$")
PODS = re.compile(r"^/api/v1/namespaces/([^/]+)/pods$")
# The fields a ResourceSlice may be selected by, as paths into the object.
FIELDS = {"spec.nodeName": ("spec", "nodeName"), "spec.driver": ("spec", "driver")}


class Handler(BaseHTTPRequestHandler):
    def log(self):
        with open(os.path.join(DIR, "requests.log"), "a") as f:
            f.write(f"{self.command} {self.path} {self.headers.get('Content-Type', '-')}\n")

    def answer(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def not_found(self):
        self.answer(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "message": f"{self.path} not found", "reason": "NotFound", "code": 404})

    def do_GET(self):
        self.log()
        url = urlsplit(self.path)
        if url.path == SLICES:
            return self.list_slices(parse_qs(url.query).get("fieldSelector", [""])[0])
        p = PODS.match(url.path)
        if p:
            return self.list_pods(p.group(1), parse_qs(url.query).get("labelSelector", [""])[0])
        m = CLAIM.match(url.path)
        n = NODE.match(url.path)
        d = DAEMONSET.match(url.path)
        path = (m and os.path.join(DIR, "claims", f"{m.group(1)}_{m.group(2)}.json")) or (
            n and os.path.join(DIR, "nodes", f"{n.group(1)}.json")) or (
            d and os.path.join(DIR, "daemonsets", f"{d.group(1)}_{d.group(2)}.json"))
        if not path or not os.path.isfile(path):
            return self.not_found()
        with open(path) as f:
            self.answer(200, json.load(f))

    def list_slices(self, selector):
        want = {}
        for term in filter(None, selector.split(",")):
            key, _, value = term.partition("=")
            if key not in FIELDS:
                return self.answer(400, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                         "message": f"field label not supported: {key}", "reason": "BadRequest", "code": 400})
            want[FIELDS[key]] = value
        items = []
        for p in sorted(glob.glob(os.path.join(DIR, "slices", "*.json"))):
            with open(p) as f:
                obj = json.load(f)
            if all(obj.get(a, {}).get(b) == v for (a, b), v in want.items()):
                items.append(obj)
        self.answer(200, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                          "metadata": {"resourceVersion": "1"}, "items": items})

    def list_pods(self, namespace, selector):
        want = dict(term.partition("=")[::2] for term in filter(None, selector.split(",")))
        items = []
        for p in sorted(glob.glob(os.path.join(DIR, "pods", f"{namespace}_*.json"))):
            with open(p) as f:
                obj = json.load(f)
            if all(obj["metadata"].get("labels", {}).get(k) == v for k, v in want.items()):
                items.append(obj)
        self.answer(200, {"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": items})

    def do_DELETE(self):
        self.log()
        m = SLICE.match(urlsplit(self.path).path)
        path = m and os.path.join(DIR, "slices", f"{m.group(1)}.json")
        if not path or not os.path.isfile(path):
            return self.not_found()
        with open(path) as f:
            obj = json.load(f)
        os.remove(path)
        self.answer(200, obj)

    def do_PATCH(self):
        self.log()
        m = SLICE.match(self.path.split("?")[0])
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not m:
            return self.not_found()
        os.makedirs(os.path.join(DIR, "slices"), exist_ok=True)
        obj = json.loads(body)
        with open(os.path.join(DIR, "slices", f"{m.group(1)}.json"), "w") as f:
            json.dump(obj, f, indent=1)
        self.answer(200, obj)

    def log_message(self, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
with open(os.path.join(DIR, "port.tmp"), "w") as f:
    f.write(str(server.server_address[1]))
os.rename(os.path.join(DIR, "port.tmp"), os.path.join(DIR, "port"))
server.serve_forever()
