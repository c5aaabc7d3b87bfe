#!/usr/bin/env bash
# The Helm chart under a real Helm (issue 46): Helm v4's library through the PyPI package helm-python-sdk
# (`make deps`), offline: `helm lint --strict`, values.schema.json refusing unknown keys and bad values,
# `helm template`'s objects validated against the Kubernetes API schemas (kubernetes-validate), and the
# rendered diff of a `helm upgrade` that changes the node policy (tests/helm/chart_test.py). No cluster
# and no image: rendering only.
set -uo pipefail
. "$(dirname "$0")/lib/common.sh"
t_init helm
for m in helm_python kubernetes_validate yaml; do
    python3 -c "import $m" 2>/dev/null || { echo "helm: python module $m missing (make deps)"; echo "0 passed, 1 failed"; exit 1; }
done
python3 "$REPO/tests/helm/chart_test.py" "$REPO/packaging/helm/vgpu" "$WORK"
