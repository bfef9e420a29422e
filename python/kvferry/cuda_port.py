"""GPU memory and events through the engine port (docs/engine-port.md, ``cuda_ipc``): what an
engine on a GPU names to its node, shared by the reference engine (kvferry.gpu_model) and vLLM's
connector (kvferry.vllm). PyTorch is imported when a function needs it, so the connector still
imports on a host without it."""

from __future__ import annotations

import time
from typing import Any

from .port import PortClient

SAVE_MARKS = ("layer", "step")


def ipc_mem_handle(pointer: int, device: Any = None) -> tuple[bytes, int]:
    """The 64-byte cudaIpcMemHandle_t of the allocation holding ``pointer`` and the pointer's
    offset in it (cuMemGetAddressRange, cuIpcGetMemHandle) with ``device``'s context current
    (None: the caller's)."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    handle = (ctypes.c_char * 64)()
    with _device_context(device):
        rc = cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
        if rc != 0:
            raise RuntimeError(f"cuMemGetAddressRange failed: CUresult {rc}")
        rc = cuda.cuIpcGetMemHandle(handle, ctypes.c_uint64(base.value))
        if rc != 0:
            raise RuntimeError(f"cuIpcGetMemHandle failed: CUresult {rc}")
    return bytes(handle.raw), pointer - base.value


def _device_context(device: Any) -> Any:
    """``torch.cuda.device(device)``, or nothing to enter when ``device`` is None."""
    if device is None:
        import contextlib

        return contextlib.nullcontext()
    import torch

    return torch.cuda.device(device)


def device_uuid(device: Any) -> str:
    """The GPU's UUID as nvidia-smi prints it: device ids differ between processes, UUIDs do not."""
    import torch

    u = str(torch.cuda.get_device_properties(device).uuid)
    u = u[4:] if u.upper().startswith("GPU-") else u
    return "GPU-" + u


def event_ring(size: int, device: Any = None) -> tuple[list[Any], list[bytes]]:
    """``size`` interprocess CUDA events on ``device`` (default: the current one) and their
    handles for the hello."""
    import torch

    with _device_context(device):
        events = [torch.cuda.Event(interprocess=True) for _ in range(size)]
        return events, [bytes(e.ipc_handle()) for e in events]


def save_marks_setting(value: str | None, source: str) -> str:
    """``layer`` (the default) or ``step``; anything else is refused by ``source``'s name."""
    marks = value or "layer"
    if marks not in SAVE_MARKS:
        raise ValueError(f"{source} must be layer or step, not {marks!r}")
    return marks


class GpuWorkerClient(PortClient):
    """A worker connection whose hello also shares a ring of interprocess CUDA events, and whose
    ``save_kv_layer`` names the slot recorded after the layer's writes (docs/engine-port.md)."""

    def __init__(self, *args: Any, events: list[bytes] | None = None, **kw: Any):
        super().__init__(*args, **kw)
        self.events = list(events or [])

    def _hello_args(self) -> dict[str, Any]:
        args = super()._hello_args()
        if self.events:
            args["events"] = self.events
        return args

    def record(self, event: Any) -> None:
        """Records ``event`` on the current stream, timed with the ops (``event_record``): in a
        real prefill each record cost tens of microseconds of host time (docs/gpu.md)."""
        began = time.perf_counter()
        event.record()
        self._timed("event_record", began)

    def save_kv_layer_after(self, layer: int, event_slot: int, hold: bool = False) -> None:
        """``hold``: kept for the next send or ``flush`` (several layers in one frame)."""
        self._one_way("save_kv_layer", {"layer": layer, "event_slot": event_slot}, hold=hold)


class SaveMarks:
    """How a step's saved layers are marked for the node: ``layer``, an event recorded after each
    layer's writes and its ``save_kv_layer`` sent at once, so the node's copies overlap the next
    layers' compute; ``step``, one event after the last layer and every layer's save naming it in
    one frame (one stream operation and one frame per step; the copies start after the step).
    Without MPS on a GPU it shares with its node, ``step`` took the reference engine's added
    prefill time from 1.15-1.39 ms to below zero at 1,024 tokens (docs/gpu.md, "One mark per step
    without MPS")."""

    def __init__(self, worker: GpuWorkerClient, events: list[Any], layers: int, marks: str = "layer"):
        if not events:
            raise ValueError("SaveMarks needs the worker's ring of events")
        self.worker = worker
        self.events = events
        self.layers = layers
        self.marks = save_marks_setting(marks, "save marks")
        self._slot = 0
        self._pending: list[int] = []  # step marks: the step's saved layers not yet sent

    def saved(self, layer: int) -> None:
        """Layer ``layer``'s KV is written on the current stream (layers come in order). A step
        that writes nothing sends no event and no frame."""
        if not self.worker.step_saves:
            return
        if self.marks == "layer":
            self.worker.save_kv_layer_after(layer, self._record())
            return
        self._pending.append(layer)
        if layer == self.layers - 1:
            self.step_end()

    def step_end(self) -> None:
        """The step's forward is over (before ``wait_for_save``): step marks send what is still
        held, so a step whose last layer saved nothing still names the layers it did save."""
        if not self._pending:
            return
        slot = self._record()
        for layer in self._pending:
            self.worker.save_kv_layer_after(layer, slot, hold=True)
        self._pending.clear()
        self.worker.flush()

    def _record(self) -> int:
        slot = self._slot
        self._slot = (slot + 1) % len(self.events)  # recording a slot again is safe at any time
        self.worker.record(self.events[slot])
        return slot
