#!/usr/bin/env python3
"""`helm template` with a real Helm, for tests/e2e/installer.test.sh: the chart rendered by Helm's own Go
engine (PyPI's helm-python-sdk binds Helm v4's SDK through its C library; no `helm` binary, no cluster),
then linted (`helm lint --strict`). Prints the rendered documents, each `---`-separated and in template
path order, on stdout; a failure is one line on stderr and exit status 1.

    template.py CHART [--name vgpu] [--namespace kube-system] [-f VALUES.yaml]... [--set a.b=c]...
"""

import argparse
import sys

import yaml


def merge(into, over):
    """Helm's coalescing of values: maps merged key by key, anything else replaced."""
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            merge(into[k], v)
        else:
            into[k] = v
    return into


def main():
    p = argparse.ArgumentParser(description="helm template, with Helm's SDK")
    p.add_argument("chart")
    p.add_argument("--name", default="vgpu")
    p.add_argument("--namespace", default="kube-system")
    p.add_argument("-f", "--values", action="append", default=[])
    p.add_argument("--set", action="append", default=[])
    a = p.parse_args()
    try:
        import helm_python as helm
    except ImportError:
        sys.exit("template.py: helm-python-sdk is missing (make deps: pip install helm-python-sdk)")
    values = {}
    for f in a.values:
        with open(f) as fh:
            merge(values, yaml.safe_load(fh) or {})
    for s in a.set:
        merge(values, helm.parse_set_string(s))
    try:
        report = helm.lint(a.chart, values, strict=True, namespace=a.namespace, quiet=True)
        errors = [m["error"] for m in report.get("messages", []) if m.get("severity", 0) >= 2]
        errors += report.get("errors") or []
        if errors:
            sys.exit(f"template.py: helm lint --strict: {'; '.join(dict.fromkeys(errors))}")
        out = helm.Chart.load(a.chart).render(values, name=a.name, namespace=a.namespace, is_install=True)
    except helm.HelmError as e:
        sys.exit(f"template.py: {' '.join(str(e).split())}")
    for path in sorted(out):
        text = out[path].strip()
        if not path.endswith(".yaml") or not any(
            line.strip() and not line.lstrip().startswith("#") for line in text.splitlines()
        ):
            continue
        print(f"---\n# Source: {path}\n{text}")


if __name__ == "__main__":
    main()
