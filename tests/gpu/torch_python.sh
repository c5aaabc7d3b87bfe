# Sourced by the GPU scripts: torch_python prints the Python that has PyTorch ($GPU_TORCH_PYTHON, the
# GPU machine's /opt/torch venv, or python3), or $GPU_TORCH_PYTHON unchanged when none has it.
torch_python() {
    local c
    for c in "${GPU_TORCH_PYTHON:-}" /opt/torch/.venv/bin/python3 python3; do
        if [ -n "$c" ] && "$c" -c 'import torch' 2>/dev/null; then echo "$c"; return; fi
    done
    echo "${GPU_TORCH_PYTHON:-}"
}
