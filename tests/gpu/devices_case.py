"""Device mapping on a real GPU, through ctypes (no framework): prints one line `RESULT {json}`.

`nvml-only`: NVML memory info under CUDA_DEVICE_MEMORY_LIMIT_0 must not initialise CUDA (cuDeviceGetCount
afterwards still answers CUDA_ERROR_NOT_INITIALIZED, 3). `per-index`: CUDA_DEVICE_MEMORY_LIMIT_<i> follows
NVML GPU i whatever CUDA_VISIBLE_DEVICES says: prints each CUDA ordinal's total and UUID.
"""
import ctypes
import json
import sys


class Mem(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


def nvml_only():
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    cuda = ctypes.CDLL("libcuda.so.1")
    h = ctypes.c_void_p()
    m = Mem()
    rcs = [nvml.nvmlInit_v2(), nvml.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(h)),
           nvml.nvmlDeviceGetMemoryInfo(h, ctypes.byref(m))]
    n = ctypes.c_int(-1)
    count_rc = cuda.cuDeviceGetCount(ctypes.byref(n))
    return {"nvml_rcs": rcs, "nvml_total": m.total, "cuda_count_rc_before_init": count_rc}


def per_index():
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0
    n = ctypes.c_int(0)
    cuda.cuDeviceGetCount(ctypes.byref(n))
    out = []
    for d in range(n.value):
        t = ctypes.c_size_t(0)
        u = (ctypes.c_ubyte * 16)()
        rc = cuda.cuDeviceTotalMem_v2(ctypes.byref(t), d)
        cuda.cuDeviceGetUuid_v2(u, d)
        out.append({"ordinal": d, "rc": rc, "total": t.value, "uuid": bytes(u).hex()})
    return {"devices": out}


if __name__ == "__main__":
    r = nvml_only() if sys.argv[1] == "nvml-only" else per_index()
    print("RESULT " + json.dumps(r), flush=True)
