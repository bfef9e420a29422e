#!/usr/bin/env python3
"""Why does a gather from the KV cache cost more CPU once kvferry shares that cache?

The 2026-12-04 profiles (docs/results/gpu/2026-12-04-d-first-forward/) show ``aten::index`` on
the cache an engine shares with its node by CUDA IPC taking 10-16x the host time of the same
gather on an engine's own cache, with equal kernel time. This probe isolates the cache's state
from everything else kvferry does: two equal caches in one process, one left alone (``own``), the
other taken step by step through what the engine port does to it (``shared``):

  fresh     neither touched
  exported  cuIpcGetMemHandle on the shared one's allocation (what the engine does at register)
  opened    a second process opens that handle (what the node does)
  written   that process writes into the mapping (the node's copies)
  nosync    the shared allocation's SYNC_MEMOPS pointer attribute cleared, if it was set
  closed    the second process has closed its mapping and exited

At each step it times the host side of the engine's gather (``cache[slots]``) on both caches, with
the GPU idle and with the GPU busy (a queue of matmuls ahead of it: a gather that synchronizes
then waits for them), and prints each allocation's SYNC_MEMOPS. Usage on a GPU host:
    python3 scripts/gpu_index_probe.py [--reps 40] [--blocks 4096] [--positions 4096]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time
from pathlib import Path

# The project's own cache, slot mapping and IPC export (python/kvferry), as the engine uses them.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
from cuda_child import PROLOGUE  # noqa: E402 - scripts/, this file's folder

CHILD = PROLOGUE + r"""
ptr = ctypes.c_uint64()
ok(cuda.cuIpcOpenMemHandle_v2(ctypes.byref(ptr), handle(sys.argv[2]), 1), "cuIpcOpenMemHandle")
print("opened", flush=True)
for line in sys.stdin:
    word = line.split()
    if word and word[0] == "write":
        ok(cuda.cuMemsetD8_v2(ctypes.c_uint64(ptr.value), 0, ctypes.c_size_t(int(word[1]))), "cuMemsetD8")
        ok(cuda.cuCtxSynchronize(), "cuCtxSynchronize")
        print("written", flush=True)
    elif word and word[0] == "quit":
        break
ok(cuda.cuIpcCloseMemHandle(ctypes.c_uint64(ptr.value)), "cuIpcCloseMemHandle")
"""

SYNC_MEMOPS = 6  # CU_POINTER_ATTRIBUTE_SYNC_MEMOPS


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--blocks", type=int, default=4096)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--positions", type=int, default=4096)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()

    import torch

    from kvferry.cuda_port import ipc_mem_handle
    from kvferry.gpu_model import ModelSpec, PagedKvCache

    if not torch.cuda.is_available():
        print("SKIP: no CUDA device")
        return 0
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    cuda = ctypes.CDLL("libcuda.so.1")
    spec = ModelSpec(layers=1, kv_heads=a.kv_heads, head_dim=a.head_dim)
    own = PagedKvCache(spec, a.blocks, a.block_size, dev)
    shared = PagedKvCache(spec, a.blocks, a.block_size, dev)
    gen = torch.Generator().manual_seed(7)
    table = torch.randperm(a.blocks, generator=gen)[: -(-a.positions // a.block_size)].tolist()
    slots = own.slots(table, 0, a.positions)  # once, untimed: the probe times the GPU gather
    busy_a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    busy_b = torch.randn_like(busy_a)

    def sync_memops(c: PagedKvCache) -> int:
        v = ctypes.c_uint()
        rc = cuda.cuPointerGetAttribute(ctypes.byref(v), SYNC_MEMOPS, ctypes.c_uint64(c.kv.data_ptr()))
        return v.value if rc == 0 else -rc

    def host_us(cache: PagedKvCache, busy: bool) -> list[float]:
        out = []
        for _ in range(a.reps):
            torch.cuda.synchronize(dev)
            if busy:
                for _ in range(4):
                    torch.mm(busy_a, busy_b)
            t0 = time.perf_counter()
            y = cache.k[0][slots]
            t1 = time.perf_counter()
            del y
            out.append((t1 - t0) * 1e6)
        torch.cuda.synchronize(dev)
        return out

    def row(step: str) -> None:
        for busy in (False, True):
            for name, cache in (("own", own), ("shared", shared)):
                xs = host_us(cache, busy)
                print(f"{step:9s} {name:6s} gpu={'busy' if busy else 'idle'}  host us: median "
                      f"{statistics.median(xs):9.1f}  min {min(xs):9.1f}  max {max(xs):9.1f}  "
                      f"sync_memops={sync_memops(cache)}", flush=True)

    def profile(step: str) -> None:
        from torch.profiler import ProfilerActivity, profile as prof

        for name, cache in (("own", own), ("shared", shared)):
            torch.cuda.synchronize(dev)
            with prof(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as p:
                for _ in range(4):
                    torch.mm(busy_a, busy_b)
                for _ in range(5):
                    cache.k[0][slots]
                torch.cuda.synchronize(dev)
            print(f"--- profile {step} {name}: 4 matmuls then 5 gathers", flush=True)
            print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=10), flush=True)

    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}, cache "
          f"{own.kv.numel() * 2 / 2**20:.0f} MiB each, {a.positions} positions gathered", flush=True)
    for _ in range(3):  # warm the kernels and the allocator
        host_us(own, False)
        host_us(shared, False)
    row("fresh")
    handle, offset = ipc_mem_handle(shared.kv.data_ptr())  # as PagedKvCache.port_memory exports it
    base = shared.kv.data_ptr() - offset
    row("exported")
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(a.device), handle.hex()],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "opened", "the second process did not open the handle"
        row("opened")
        profile("opened")
        child.stdin.write(f"write {1 << 20}\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "written"
        row("written")
        if sync_memops(shared) == 1:
            zero = ctypes.c_uint(0)
            rc = cuda.cuPointerSetAttribute(ctypes.byref(zero), SYNC_MEMOPS, ctypes.c_uint64(base))
            print(f"cuPointerSetAttribute(SYNC_MEMOPS=0) on the shared allocation: CUresult {rc}", flush=True)
            row("nosync")
            profile("nosync")
        else:
            print("the shared allocation's SYNC_MEMOPS is not set: no nosync step", flush=True)
    finally:
        if child.poll() is None:
            child.stdin.write("quit\n")
            child.stdin.flush()
        child.wait(timeout=30)
    row("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
