#!/usr/bin/env python3
"""What does P's engine pay on the host to tell its node that a layer's KV is written?

In the 2026-12-04 TTFT runs P's wall time in connector calls during a 1,024-token prefill
(``p_port_ms``, 0.78-0.89 ms) was about twice the sum of its timed ops: the rest sits in
``ModelEngine._saver`` (now ``kvferry.cuda_port.SaveMarks``), which records one interprocess
CUDA event per layer. This probe times the
host side of each way of marking "layer done" on the engine's stream, one process, the GPU idle
and busy (matmuls queued ahead, as in a prefill):

  plain       torch.cuda.Event(disable_timing) .record()
  ipc         torch.cuda.Event(interprocess=True) .record()  (what the engine does today)
  ipc-waited  the same ring, with a second process that opened each handle waiting on every
              record with cuStreamWaitEvent (what the node does)
  memop       cuStreamWriteValue32 of the layer's number into a device word (a stream memop)

Usage on a GPU host: python3 scripts/gpu_record_probe.py [--reps 400] [--ring 16]
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import sys
import time

from cuda_child import PROLOGUE  # scripts/, this file's folder

CHILD = PROLOGUE + r"""
stream = ctypes.c_void_p()
ok(cuda.cuStreamCreate(ctypes.byref(stream), 1), "cuStreamCreate")
events = []
for hexed in sys.argv[2:]:
    ev = ctypes.c_void_p()
    ok(cuda.cuIpcOpenEventHandle(ctypes.byref(ev), handle(hexed)), "cuIpcOpenEventHandle")
    events.append(ev)
print("opened", flush=True)
for line in sys.stdin:
    word = line.split()
    if word[0] == "wait":
        ok(cuda.cuStreamWaitEvent(stream, events[int(word[1])], 0), "cuStreamWaitEvent")
    elif word[0] == "sync":
        ok(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        print("synced", flush=True)
    elif word[0] == "quit":
        break
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=400)
    ap.add_argument("--ring", type=int, default=16)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args()

    import torch

    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    cuda = ctypes.CDLL("libcuda.so.1")
    x = torch.randn(2048, 2048, device=dev, dtype=torch.bfloat16)
    word = torch.zeros(1, dtype=torch.int32, device=dev)
    plain = [torch.cuda.Event() for _ in range(a.ring)]
    ipc = [torch.cuda.Event(interprocess=True) for _ in range(a.ring)]
    handles = [bytes(e.ipc_handle()).hex() for e in ipc]
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(a.device), *handles],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "opened"

    def memop(i: int) -> None:
        stream = torch.cuda.current_stream(dev).cuda_stream
        rc = cuda.cuStreamWriteValue32_v2(ctypes.c_void_p(stream), ctypes.c_uint64(word.data_ptr()),
                                          ctypes.c_uint32(i + 1), 0)
        if rc != 0:
            raise RuntimeError(f"cuStreamWriteValue32 failed: CUresult {rc}")

    def timed(name: str, mark, busy: bool, waited: bool) -> None:
        samples = []
        for i in range(a.reps):
            if busy:
                for _ in range(4):
                    x @ x
            t0 = time.perf_counter()
            mark(i)
            samples.append((time.perf_counter() - t0) * 1e6)
            if waited:
                child.stdin.write(f"wait {i % a.ring}\n")
                child.stdin.flush()
            if i % a.ring == a.ring - 1:
                torch.cuda.synchronize(dev)
                if waited:
                    child.stdin.write("sync\n")
                    child.stdin.flush()
                    assert child.stdout.readline().strip() == "synced"
        s = sorted(samples)
        print(f"{name:<11} {'busy' if busy else 'idle'}: host us per mark median {statistics.median(s):.1f}"
              f" p90 {s[int(0.9 * len(s))]:.1f} max {s[-1]:.1f} (n={len(s)})", flush=True)

    for busy in (False, True):
        for _ in range(2):  # the first pass warms each path; both are printed
            timed("plain", lambda i: plain[i % a.ring].record(), busy, False)
            timed("ipc", lambda i: ipc[i % a.ring].record(), busy, False)
            timed("ipc-waited", lambda i: ipc[i % a.ring].record(), busy, True)
            timed("memop", memop, busy, False)
    torch.cuda.synchronize(dev)
    child.stdin.write("quit\n")
    child.stdin.flush()
    child.wait(timeout=30)


if __name__ == "__main__":
    main()
