"""The start of a probe's second process (scripts/gpu_*_probe.py): plain ctypes on libcuda, no
PyTorch, the device's primary context made current, ``ok`` to stop on any error, and ``Handle``
for a 64-byte CUDA IPC handle. The probe appends what its child does and runs the whole with
``python3 -c``; the device index is the child's first argument."""

PROLOGUE = r"""
import ctypes, sys
cuda = ctypes.CDLL("libcuda.so.1")
def ok(rc, what):
    if rc != 0:
        sys.exit(f"{what} failed: CUresult {rc}")
ok(cuda.cuInit(0), "cuInit")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok(cuda.cuDeviceGet(ctypes.byref(dev), int(sys.argv[1])), "cuDeviceGet")
ok(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
ok(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
def handle(hexed):
    h = Handle()
    ctypes.memmove(ctypes.byref(h), bytes.fromhex(hexed), 64)
    return h
"""
