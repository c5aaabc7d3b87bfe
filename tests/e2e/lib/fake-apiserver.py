#!/usr/bin/env python3
"""A stand-in of the Kubernetes API server for the DRA suite: it answers from recorded API objects, for the
two calls vgpu-dra-plugin makes. GET .../namespaces/NS/resourceclaims/NAME returns DIR/claims/NS_NAME.json
(404 with a Status when absent); PATCH /apis/resource.k8s.io/v1/resourceslices/NAME (a server-side apply)
stores the body as DIR/slices/NAME.json and returns it. Every request is logged to DIR/requests.log as
"METHOD PATH CONTENT-TYPE". The port it listens on is written to DIR/port."""
import json, os, re, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR = sys.argv[1]
CLAIM = re.compile(r"^/apis/resource\.k8s\.io/v1/namespaces/([^/]+)/resourceclaims/([^/?]+)$")
SLICE = re.compile(r"^/apis/resource\.k8s\.io/v1/resourceslices/([^/?]+)$")


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
        m = CLAIM.match(self.path.split("?")[0])
        path = m and os.path.join(DIR, "claims", f"{m.group(1)}_{m.group(2)}.json")
        if not path or not os.path.isfile(path):
            return self.not_found()
        with open(path) as f:
            self.answer(200, json.load(f))

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
