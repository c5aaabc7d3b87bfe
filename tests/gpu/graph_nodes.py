"""What the compute case's CUDA graph holds, node by node (a diagnostic for the compute share's graph
charge, which sums a graph's kernels and must know the cost of every other node).

    python3 tests/gpu/graph_nodes.py [--n 8192] [--per 32]

Captures the same 32 bf16 matmuls as tests/gpu/compute_case.py (PyTorch) and lists the graph's nodes
through the driver API (ctypes on libcuda): a count by type, and each memset node's size. Prints one
`RESULT {json}` line. No library needed; run it bare.
"""
import argparse
import ctypes
import json

TYPES = {0: "kernel", 1: "memcpy", 2: "memset", 3: "host", 4: "graph", 5: "empty", 6: "wait_event",
         7: "event_record", 8: "ext_semas_signal", 9: "ext_semas_wait", 10: "mem_alloc", 11: "mem_free",
         12: "batch_mem_op", 13: "conditional"}


class MemsetParams(ctypes.Structure):
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("element_size", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--per", type=int, default=32)
    args = ap.parse_args()
    import torch

    from compute_case import capture, matmul_batch

    g = capture(torch, matmul_batch(torch, args.n, args.per), keep_graph=True)
    graph = ctypes.c_void_p(g.raw_cuda_graph())

    cu = ctypes.CDLL("libcuda.so.1")
    count = ctypes.c_size_t(0)
    assert cu.cuGraphGetNodes(graph, None, ctypes.byref(count)) == 0
    nodes = (ctypes.c_void_p * count.value)()
    assert cu.cuGraphGetNodes(graph, nodes, ctypes.byref(count)) == 0
    by_type, memsets = {}, []
    for node in nodes:
        t = ctypes.c_int(-1)
        cu.cuGraphNodeGetType(ctypes.c_void_p(node), ctypes.byref(t))
        name = TYPES.get(t.value, str(t.value))
        by_type[name] = by_type.get(name, 0) + 1
        if name == "memset":
            p = MemsetParams()
            if cu.cuGraphMemsetNodeGetParams(ctypes.c_void_p(node), ctypes.byref(p)) == 0:
                memsets.append({"bytes": p.element_size * p.width * max(p.height, 1),
                                "element_size": p.element_size, "width": p.width, "height": p.height})
    print("RESULT " + json.dumps({"nodes": count.value, "by_type": by_type, "memsets": memsets,
                                  "torch": torch.__version__}), flush=True)


if __name__ == "__main__":
    main()
