"""``KvferryConnector``: vLLM's KV connector (KVConnectorBase_V1) on kvferry's engine port.

Load it with::

    --kv-transfer-config '{"kv_connector": "KvferryConnector",
                           "kv_connector_module_path": "kvferry.vllm",
                           "kv_role": "kv_producer" | "kv_consumer" | "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/kvferry/p.sock",
                                                         "mode": "write", "engine_id": "p0"}}'

Extra config keys: ``socket`` (required, or env ``KVFERRY_ENGINE_SOCKET``), ``role``
(``prefill``/``decode``; needed with ``kv_both``), ``mode`` (``write``/``read``), ``engine_id``,
``tp_rank`` (when vLLM's parallel state is not there to ask), ``connect_timeout_s`` (default 60),
``send_plain`` (default false: requests without kv_transfer_params never reach the node; true:
the node is told of them and checks their ops, docs/engine-port.md),
``start_node`` (default false) with ``kvferry_jar``, ``java`` and ``node_args`` (a list): start a
node beside the engine when none answers on the socket.

Memory. GPU (CUDA) KV caches, vLLM's usual case, are named to the node by CUDA IPC handles
(``cuda_ipc`` in docs/engine-port.md): the node must run on the same GPU (``--gpu N``, matched by
the GPU's UUID) with ``--transport cuda``. Each layer's save records an interprocess CUDA event on
the current stream and the node's copies wait for it on the GPU; a consumer's per-layer waits
(READ with ``kvferry.connector.reads-at-admission`` off) make its stream wait on the node's load
events instead of the CPU. ``save_marks`` in the extra config: ``layer`` (default) or
``step`` (one event after the last layer for all of the step's saves; faster where the engine and
its node share a GPU without MPS, docs/operations.md). Host KV caches must live in a
shared-memory file the node can open: allocate the cache with :func:`shm_tensor` (a file under
/dev/shm, mode 0600, mapped shared) or register a mapping you made yourself with
:func:`register_shm_region`; ``register_kv_caches`` looks every host tensor up in those regions
and refuses any other. All layers must be on one device.

One object per role, as vLLM's own connectors: ``KvferryScheduler`` on the scheduler side,
``KvferryWorker`` per TP rank; each owns one ``PortClient`` (one connection per thread).
"""

from __future__ import annotations

import atexit
import enum
import fcntl
import logging
import mmap
import os
import shlex
import subprocess
import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any

from . import cuda_port
from .port import BadArgs, NodeUnavailable, PortClient, PortError

log = logging.getLogger("kvferry.vllm")

# Request ids a worker remembers having reported (far more than run at once).
_REPORTED_KEPT = 1 << 16
_OP_ERRORS_KEPT = 1024  # ops the node refused, each also logged: the latest kept for a look

try:  # vLLM present: subclass the real base class.
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # vLLM absent (tests, tools): a stand-in with the same method names.
    HAVE_VLLM = False

    class KVConnectorRole(enum.Enum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Stand-in for vLLM's scheduler-to-worker metadata base."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]  # noqa: N801 (vLLM's name)
        """Stand-in for vLLM's base when vLLM is not installed (same names, same defaults)."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
            self._connector_metadata: Any = None
            self._vllm_config = vllm_config
            if getattr(vllm_config, "kv_transfer_config", None) is None:
                raise ValueError("kv_transfer_config must be set for KVConnectorBase_V1")
            self._kv_transfer_config = vllm_config.kv_transfer_config
            self._kv_cache_config = kv_cache_config
            self._role = role

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: Any) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def _get_connector_metadata(self) -> Any:
            assert self._connector_metadata is not None
            return self._connector_metadata

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
            return None

        def handle_preemptions(self, kv_connector_metadata: Any) -> None:
            return None

        def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
            return None, None

        def get_block_ids_with_load_errors(self) -> set[int]:
            return set()

        def shutdown(self) -> None:
            return None

        def get_kv_connector_stats(self) -> Any:
            return None

        def get_handshake_metadata(self) -> Any:
            return None

        def update_connector_output(self, connector_output: Any) -> None:
            return None

        def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
            return False, None

        def take_events(self) -> Any:
            return ()

        def has_pending_push_work(self) -> bool:
            return False

        def get_finished_count(self) -> int | None:
            return None

        @classmethod
        def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
            return None

__all__ = [
    "KvferryConnector",
    "KvferryConnectorMetadata",
    "shm_tensor",
    "register_shm_region",
    "stop_started_nodes",
    "HAVE_VLLM",
]


# ---- shared memory the node can map ----


@dataclass(frozen=True)
class ShmRegion:
    address: int
    length: int
    path: str
    file_offset: int


_regions: list[ShmRegion] = []
_regions_lock = threading.Lock()
_keepalive: list[Any] = []  # mappings shm_tensor made: they must outlive every tensor over them


def register_shm_region(address: int, length: int, path: str, file_offset: int = 0) -> None:
    """Declares that ``length`` bytes at ``address`` map ``path`` from ``file_offset`` (shared).
    Earlier regions it overlaps are dropped: a process maps one thing at an address at a time, so
    they were unmapped (a cache freed and allocated again can land where the old one was)."""
    with _regions_lock:
        _regions[:] = [r for r in _regions
                       if r.address + r.length <= address or address + length <= r.address]
        _regions.append(ShmRegion(address, length, path, file_offset))


def _find_region(address: int, length: int) -> ShmRegion | None:
    with _regions_lock:
        for r in _regions:
            if r.address <= address and address + length <= r.address + r.length:
                return r
    return None


def _create_shm_file(path: str, nbytes: int) -> None:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, nbytes)
    finally:
        os.close(fd)


def shm_tensor(shape: tuple[int, ...], dtype: Any, path: str) -> Any:
    """A zeroed host tensor over a new /dev/shm file (mode 0600, mapped shared), registered so
    ``register_kv_caches`` can name it to the node. ``dtype`` is a torch dtype (gives a torch
    tensor) or a numpy dtype (gives a numpy array). The caller removes the file when done."""
    numel = 1
    for d in shape:
        numel *= d
    try:
        import torch  # type: ignore

        if isinstance(dtype, torch.dtype):
            nbytes = numel * torch.empty((), dtype=dtype).element_size()
            _create_shm_file(path, nbytes)
            t = torch.from_file(path, shared=True, size=numel, dtype=dtype).view(*shape)
            register_shm_region(t.data_ptr(), nbytes, path, 0)
            return t
    except ImportError:
        pass
    import numpy as np  # type: ignore

    dt = np.dtype(dtype)
    nbytes = numel * dt.itemsize
    _create_shm_file(path, nbytes)
    fd = os.open(path, os.O_RDWR)
    try:
        m = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    _keepalive.append(m)
    arr = np.frombuffer(m, dtype=dt, count=numel).reshape(shape)
    register_shm_region(arr.__array_interface__["data"][0], nbytes, path, 0)
    return arr


@dataclass(frozen=True)
class _TensorInfo:
    address: int
    nbytes: int
    shape: tuple[int, ...]
    element_bytes: int
    contiguous: bool
    device: Any = None  # the torch device of a CUDA tensor; None in host memory


def _tensor_info(name: str, t: Any) -> _TensorInfo:
    if hasattr(t, "data_ptr") and hasattr(t, "element_size"):  # torch
        cuda = getattr(t, "is_cuda", False) or str(getattr(t, "device", "cpu")).startswith("cuda")
        return _TensorInfo(t.data_ptr(), t.numel() * t.element_size(), tuple(t.shape),
                           t.element_size(), bool(t.is_contiguous()), t.device if cuda else None)
    if hasattr(t, "__array_interface__"):  # numpy
        return _TensorInfo(t.__array_interface__["data"][0], int(t.nbytes), tuple(t.shape),
                           int(t.itemsize), bool(t.flags["C_CONTIGUOUS"]))
    raise TypeError(f"layer {name}: {type(t).__name__} is not a torch tensor or numpy array")


def _geometry_of(name: str, info: _TensorInfo) -> dict[str, Any]:
    s = info.shape
    if len(s) == 5 and s[0] == 2 and s[1] == 2:
        raise ValueError(f"layer {name}: shape {s} could be [2, num_blocks, ...] or [num_blocks, 2, ...]; "
                         "a cache of 2 blocks cannot say which (give the engine more blocks)")
    if len(s) == 5 and s[0] == 2:  # flash-attention's: K of every block, then V
        return {"layout": "standard", "num_blocks": s[1], "block_size": s[2], "kv_heads": s[3],
                "head_dim": s[4], "dtype_bytes": info.element_bytes}
    if len(s) == 5 and s[1] == 2:  # FlashInfer's: each block's K, then its V
        return {"layout": "blocks_first", "num_blocks": s[0], "block_size": s[2], "kv_heads": s[3],
                "head_dim": s[4], "dtype_bytes": info.element_bytes}
    if len(s) == 3:
        return {"layout": "mla", "num_blocks": s[0], "block_size": s[1], "latent": s[2],
                "dtype_bytes": info.element_bytes}
    raise ValueError(f"layer {name}: shape {s} is none of [2, num_blocks, block_size, kv_heads, head_dim] "
                     "(flash-attention), [num_blocks, 2, block_size, kv_heads, head_dim] (FlashInfer) "
                     "and MLA's [num_blocks, block_size, latent]")


def _in_scheduler_blocks(geometry: dict[str, Any], block_size: int | None) -> dict[str, Any]:
    """The geometry in the scheduler's blocks, the ones whose ids kvferry moves. An attention
    backend may page the cache in smaller kernel blocks (vLLM then gives each layer
    ``block_size // kernel_block_size`` kernel blocks per scheduler block, consecutive, so one
    scheduler block is one contiguous run in either layout); taken as they are, the ids would name
    the wrong bytes."""
    kernel = geometry["block_size"]
    if not block_size or block_size == kernel:
        return geometry
    if geometry["layout"] == "blocks_first":
        # A scheduler block would be [k, 2, kernel, ...]: its tokens' K and V interleave by kernel
        # block, which no geometry of scheduler blocks describes.
        raise ValueError(f"a [num_blocks, 2, ...] KV cache paged in kernel blocks of {kernel} tokens under "
                         f"scheduler blocks of {block_size} is not supported (its K and V interleave within a "
                         "scheduler block); use a backend whose kernel block is the scheduler's")
    if block_size % kernel or geometry["num_blocks"] % (block_size // kernel):
        raise ValueError(f"the KV cache's blocks of {kernel} tokens ({geometry['num_blocks']} of them) do not "
                         f"divide into the scheduler's blocks of {block_size} tokens")
    return {**geometry, "num_blocks": geometry["num_blocks"] // (block_size // kernel), "block_size": block_size}


def _host_layer(name: str, info: _TensorInfo) -> dict[str, Any]:
    """A host layer as the hello names it: the shared-memory file that holds it."""
    region = _find_region(info.address, info.nbytes)
    if region is None:
        raise ValueError(
            f"layer {name}: its KV cache is not in shared memory the node can map; allocate it "
            "with kvferry.vllm.shm_tensor (a /dev/shm file) or declare your mapping with "
            "kvferry.vllm.register_shm_region")
    return {"path": region.path, "offset": region.file_offset + info.address - region.address,
            "length": info.nbytes}


def _cuda_layer(info: _TensorInfo) -> dict[str, Any]:
    """A GPU layer as the hello names it: its allocation's IPC handle and its offset there."""
    handle, offset = cuda_port.ipc_mem_handle(info.address, info.device)
    return {"handle": handle, "offset": offset, "length": info.nbytes}


# ---- metadata ----


@dataclass
class KvferryConnectorMetadata(KVConnectorMetadata):  # type: ignore[misc]
    """The node's opaque bytes for one step, handed unchanged to every worker, and the requests
    vLLM preempted for this step (its workers fence their saves in ``handle_preemptions``)."""

    data: bytes = b""
    preempted: tuple[str, ...] = ()


# ---- configuration ----


def _extra(vllm_config: Any) -> dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    return dict(getattr(ktc, "kv_connector_extra_config", None) or {})


def _engine_identity(vllm_config: Any, extra: dict[str, Any]) -> dict[str, Any]:
    ktc = vllm_config.kv_transfer_config
    kv_role = getattr(ktc, "kv_role", None)
    role = extra.get("role") or {"kv_producer": "prefill", "kv_consumer": "decode"}.get(kv_role or "")
    ident: dict[str, Any] = {}
    if role:
        ident["role"] = role
    for key in ("mode", "engine_id"):
        if extra.get(key):
            ident[key] = extra[key]
    pc = getattr(vllm_config, "parallel_config", None)
    if pc is not None:
        for size in ("pipeline_parallel_size", "decode_context_parallel_size"):
            if int(getattr(pc, size, 1) or 1) > 1:
                raise ValueError(f"KvferryConnector does not support {size} > 1 (got {getattr(pc, size)}): an "
                                 "engine's workers are named by TP rank only")
        ident["tp_size"] = int(getattr(pc, "tensor_parallel_size", 1))
        ident["dp_rank"] = int(getattr(pc, "data_parallel_rank", 0) or 0)
        ident["dp_size"] = int(getattr(pc, "data_parallel_size", 1) or 1)
    return ident


def _tp_rank(extra: dict[str, Any], tp_size: int) -> int:
    if "tp_rank" in extra:
        return int(extra["tp_rank"])
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore

        return int(get_tensor_model_parallel_rank())
    except Exception as e:
        if tp_size > 1:  # every rank would claim rank 0: the node refuses all but one
            raise ValueError(f"cannot tell this worker's TP rank (vLLM's parallel state: {e}); set "
                             "kv_connector_extra_config.tp_rank") from e
        return 0


def _socket_path(extra: dict[str, Any]) -> str:
    path = extra.get("socket") or os.environ.get("KVFERRY_ENGINE_SOCKET")
    if not path:
        raise ValueError("KvferryConnector needs kv_connector_extra_config.socket (the node's "
                         "--engine-socket) or env KVFERRY_ENGINE_SOCKET")
    return str(path)


_started_nodes: list[subprocess.Popen] = []


def stop_started_nodes(timeout_s: float = 20.0) -> None:
    """Stops the nodes ``start_node`` started in this process (also run at exit)."""
    while _started_nodes:
        proc = _started_nodes.pop()
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


atexit.register(stop_started_nodes)


def ensure_node(socket_path: str, extra: dict[str, Any], identity: dict[str, Any]) -> subprocess.Popen | None:
    """With ``start_node``: starts ``java -jar kvferry_jar node --engine port`` unless a node answers
    on the socket. A lock file beside the socket makes the scheduler and the workers start one."""
    if not extra.get("start_node"):
        return None
    jar = extra.get("kvferry_jar") or os.environ.get("KVFERRY_JAR")
    if not jar or not os.path.exists(jar):
        raise ValueError(f"start_node needs kvferry_jar (the kvferry jar); got {jar!r}")
    timeout_s = float(extra.get("node_start_timeout_s", 120))
    with open(socket_path + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _answers(socket_path):
            return None
        cmd = [str(extra.get("java", "java")), "-jar", str(jar), "node", "--engine", "port",
               "--engine-socket", socket_path]
        if identity.get("role"):
            cmd += ["--role", identity["role"]]
        if identity.get("mode"):
            cmd += ["--mode", identity["mode"]]
        if identity.get("engine_id"):
            cmd += ["--engine-id", identity["engine_id"]]
        if identity.get("tp_size"):
            cmd += ["--tp-size", str(identity["tp_size"])]
        args = extra.get("node_args") or []
        cmd += shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
        log.info("starting a kvferry node: %s", " ".join(cmd))
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        _started_nodes.append(proc)
        deadline = time.monotonic() + timeout_s
        while not _answers(socket_path):
            if proc.poll() is not None:
                raise NodeUnavailable(socket_path, f"the node it started exited with {proc.returncode}")
            if time.monotonic() > deadline:
                raise NodeUnavailable(socket_path, f"the node it started did not open its socket in {timeout_s} s")
            time.sleep(0.1)
        return proc


def _answers(socket_path: str) -> bool:
    import socket as _socket

    s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        s.settimeout(1.0)
        s.connect(socket_path)
        return True
    except OSError:
        return False
    finally:
        s.close()


def _request_status(request: Any) -> str:
    status = getattr(request, "status", None)
    name = getattr(status, "name", str(status or ""))
    if name == "FINISHED_LENGTH_CAPPED":
        return "length_capped"
    if name == "FINISHED_STOPPED":
        return "stopped"
    return "aborted"  # FINISHED_ABORTED, FINISHED_IGNORED, FINISHED_ERROR, or still running


def _block_id_list(blocks: Any, num_external_tokens: int) -> list[int]:
    """vLLM's KVCacheBlocks (first KV cache group) or a plain list."""
    if blocks is None:
        return []
    if num_external_tokens > 0 and hasattr(blocks, "get_unhashed_block_ids"):
        return [int(b) for b in blocks.get_unhashed_block_ids()]
    if hasattr(blocks, "get_block_ids"):
        groups = blocks.get_block_ids()
        return [int(b) for b in (groups[0] if groups else [])]
    return [int(b) for b in blocks]


def _first_group(block_ids: Any) -> list[int] | None:
    """vLLM gives block ids per KV cache group (a tuple of lists); kvferry uses the first group."""
    if block_ids is None:
        return None
    if isinstance(block_ids, (tuple, list)) and block_ids and isinstance(block_ids[0], (list, tuple)):
        return [int(b) for b in block_ids[0]]
    return [int(b) for b in block_ids]


def _resumed(cached: Any):
    """Whether a scheduled-again request was preempted: its ``new_block_ids`` are then all its
    blocks, not blocks added. vLLM names these by id (``resumed_req_ids``) or, before, per column
    (``resumed_from_preemption``)."""
    ids = getattr(cached, "resumed_req_ids", None)
    if ids is not None:
        return lambda i, rid: rid in ids
    flags = getattr(cached, "resumed_from_preemption", None) or []
    return lambda i, rid: bool(flags[i]) if i < len(flags) else False


# ---- the two sides ----


class KvferryScheduler:
    """The scheduler side: one port connection."""

    def __init__(self, vllm_config: Any, extra: dict[str, Any]):
        self.socket_path = _socket_path(extra)
        self.identity = _engine_identity(vllm_config, extra)
        self.mode = self.identity.get("mode", "write")
        ensure_node(self.socket_path, extra, self.identity)
        self.client = PortClient(self.socket_path, "scheduler", engine=self.identity,
                                 http_url=extra.get("http_url"), send_plain=bool(extra.get("send_plain", False)))
        self.client.reconnect(wait_s=float(extra.get("connect_timeout_s", 60)))
        self.pending_sends: set[str] = set()  # finished, blocks held until reported sent
        self.awaiting_loads: set[str] = set()  # loading asynchronously until reported received
        self.ended_early: set[str] = set()  # reported sent (failed) while still running
        self.received: set[str] = set()  # loaded: every rank reported its receive ended
        self.seen: set[str] = set()  # named to the node, not finished yet
        # Requests whose kv_transfer_params the node refused: served without kvferry (the engine
        # computes them itself), so the node hears nothing more of them.
        self.refused: set[str] = set()
        self.op_errors: deque[dict[str, Any]] = deque(maxlen=_OP_ERRORS_KEPT)  # the latest, for a look

    def _ensure_connected(self) -> None:
        if not self.client.connected:
            self.client.reconnect()

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        rid = request.request_id
        if rid in self.refused:
            return 0, False
        tokens = getattr(request, "prompt_token_ids", None) or []
        self.seen.add(rid)
        try:
            count, is_async = self.client.get_num_new_matched_tokens(
                rid, len(tokens), getattr(request, "kv_transfer_params", None), num_computed_tokens)
        except BadArgs as e:
            # This request's params, not the engine: vLLM has no way to refuse a request here, and
            # an exception would stop its engine core. Serve it without a transfer instead (D
            # computes the prompt itself; a P's peer fails its transfer and recomputes).
            log.error("kvferry node refused request %s's kv_transfer_params; serving it without a KV "
                      "transfer: %s", rid, e.message)
            self.seen.discard(rid)
            self.refused.add(rid)
            return 0, False
        is_async = bool(is_async and count > 0)
        if is_async:
            self.awaiting_loads.add(rid)
        return count, is_async

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        if request.request_id in self.refused:
            return
        # With no external tokens on D the client lends no block (PortClient.update_state_after_alloc).
        self.client.update_state_after_alloc(request.request_id, _block_id_list(blocks, num_external_tokens),
                                             num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvferryConnectorMetadata:
        self._ensure_connected()  # the start of a step: say hello again after a node restart
        scheduled = getattr(scheduler_output, "num_scheduled_tokens", {}) or {}
        new_reqs = []
        for r in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            if r.req_id in self.refused:
                continue  # the node never took it
            new_reqs.append({"request_id": r.req_id, "block_ids": _first_group(r.block_ids) or [],
                             "num_computed_tokens": int(r.num_computed_tokens) + int(scheduled.get(r.req_id, 0))})
        cached_reqs = []
        cached = getattr(scheduler_output, "scheduled_cached_reqs", None)
        if cached is not None and hasattr(cached, "req_ids"):  # vLLM >= 0.10: one object of columns
            resumed = _resumed(cached)
            for i, rid in enumerate(cached.req_ids):
                cached_reqs.append({"request_id": rid, "new_block_ids": _first_group(cached.new_block_ids[i]),
                                    "num_computed_tokens": int(cached.num_computed_tokens[i]) + int(scheduled.get(rid, 0)),
                                    "resumed": resumed(i, rid)})
        elif cached is not None:  # older vLLM: a list of per-request objects
            for r in cached:
                cached_reqs.append({"request_id": r.req_id, "new_block_ids": _first_group(r.new_block_ids),
                                    "num_computed_tokens": int(r.num_computed_tokens) + int(scheduled.get(r.req_id, 0)),
                                    "resumed": bool(getattr(r, "resumed_from_preemption", False))})
        metadata = self.client.build_connector_meta(new_reqs, cached_reqs, raise_op_errors=False)
        for e in self.client.last_op_errors:  # a one-way update_state_after_alloc the node refused
            log.error("kvferry node refused %s: %s: %s", e.get("op"), e.get("code"), e.get("message"))
        self.op_errors.extend(self.client.last_op_errors)
        # vLLM frees a preempted request's blocks with no connector call and reuses them once the
        # workers' handle_preemptions returned: a save still reading them must stop first.
        preempted = tuple(sorted(getattr(scheduler_output, "preempted_req_ids", None) or ()))
        return KvferryConnectorMetadata(metadata, preempted)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        rid = request.request_id
        if rid not in self.seen and rid not in self.refused:
            # vLLM finishes a request aborted before its first scheduling without ever asking
            # get_num_new_matched_tokens; the node only knows requests named there, and
            # request_finished carries no kv_transfer_params: name it first so P is told to free.
            self.get_num_new_matched_tokens(request, 0)
        if rid in self.refused:
            self.refused.discard(rid)
            return False, None  # the node never took it: nothing to keep, nothing for a peer
        self.seen.discard(rid)
        delay, params = self.client.request_finished(request.request_id, [int(b) for b in block_ids],
                                                     _request_status(request))
        if rid in self.ended_early:
            # Its transfer already ended (failed) while it ran, and the node said so then: the
            # node copies nothing more from its blocks, and no second report comes. No params
            # either: a D told of these blocks would read them after vLLM reused them.
            self.ended_early.discard(rid)
            return False, None
        if rid in self.received:
            # D, aborted (or finished) after every rank reported its load over: nothing can land
            # in its blocks any more. The node may still ask to wait (it cannot tell that all
            # ranks are done); a rank reports each request once, so no report would end the wait.
            self.received.discard(rid)
            return False, params
        if delay and (rid in self.awaiting_loads or self.identity.get("role") == "decode"):
            self.awaiting_loads.add(rid)  # D: its blocks go with the receive's report
        elif delay:
            self.pending_sends.add(rid)
        else:
            self.awaiting_loads.discard(rid)  # vLLM frees it now: a late report must not reach it
        return delay, params

    def update_connector_output(self, connector_output: Any) -> None:
        """vLLM calls this before it acts on the step's reports, and asserts on every id there:
        one it does not expect (a failure reported while a request still runs, a receive reported
        for a request that loads in its step or was freed already) would stop its engine core. So
        only reports of requests that wait for them go on."""
        sending = getattr(connector_output, "finished_sending", None)
        if sending:
            for rid in list(sending):
                if rid in self.pending_sends:
                    self.pending_sends.discard(rid)
                    continue
                sending.discard(rid)
                if rid in self.seen:
                    self.ended_early.add(rid)  # its blocks go when it finishes
                else:
                    log.debug("kvferry: dropped a send report of %s, which vLLM does not wait for", rid)
        recving = getattr(connector_output, "finished_recving", None)
        if recving:
            for rid in list(recving):
                if rid in self.awaiting_loads:
                    self.awaiting_loads.discard(rid)
                    if rid in self.seen:  # still running: its request_finished comes later
                        self.received.add(rid)
                else:
                    recving.discard(rid)
                    log.debug("kvferry: dropped a receive report of %s, which vLLM does not wait for", rid)

    def has_pending_push_work(self) -> bool:
        # WRITE on P: a finished request's blocks wait to be written to D; keep stepping.
        return self.mode == "write" and bool(self.pending_sends)

    def shutdown(self) -> None:
        self.client.close()


class KvferryWorker:
    """One TP rank's worker side: one port connection, opened at ``register_kv_caches``."""

    def __init__(self, vllm_config: Any, extra: dict[str, Any]):
        self.socket_path = _socket_path(extra)
        self.extra = extra
        self.identity = _engine_identity(vllm_config, extra)
        self.is_producer = self.identity.get("role") == "prefill"
        self.tp_rank = _tp_rank(extra, int(self.identity.get("tp_size", 1)))
        cache_config = getattr(vllm_config, "cache_config", None)
        self.block_size = int(getattr(cache_config, "block_size", 0) or 0) or None
        self.client: PortClient | None = None
        self.save_marks = cuda_port.save_marks_setting(extra.get("save_marks"), "kv_connector_extra_config.save_marks")
        self.marks: cuda_port.SaveMarks | None = None  # GPU memory: how saved layers are marked
        self.layer_index: dict[str, int] = {}
        self.layer_address: dict[str, int] = {}
        self.loads = 0
        self.forward_began = False  # this step's layers ran (before its start_load_kv: newer vLLM)
        self.load_errors: set[int] = set()
        self.failed_layers: set[int] = set()
        # Requests this rank reported (sent or received): vLLM counts one report per rank, and a
        # second one (the node's report of an abort after the receive was reported done) would
        # complete its count while another rank's copies still land. Bounded: the oldest go.
        self.reported: OrderedDict[str, None] = OrderedDict()
        self.op_errors: deque[dict[str, Any]] = deque(maxlen=_OP_ERRORS_KEPT)  # the latest, for a look

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        layers = []
        geometry: dict[str, Any] | None = None
        device: Any = None
        shared: dict[int, str] = {}
        for name, tensor in kv_caches.items():  # vLLM's registration order = layer order
            info = _tensor_info(name, tensor)
            if info.address in shared:
                # A layer that shares another's KV (kv_sharing_target_layer_name) writes none of
                # its own: the bytes move once, with the layer that owns them.
                log.info("layer %s shares layer %s's KV cache; moved with it", name, shared[info.address])
                continue
            shared[info.address] = name
            if not info.contiguous:
                raise ValueError(f"layer {name}: the KV cache tensor is not contiguous")
            g = _in_scheduler_blocks(_geometry_of(name, info), self.block_size)
            if geometry is None:
                geometry, device = g, info.device
            elif g != geometry:
                raise ValueError(f"layer {name}: geometry {g} differs from the first layer's {geometry}")
            elif str(info.device) != str(device):
                raise ValueError(f"layer {name}: on {info.device or 'the host'}, the first layer on "
                                 f"{device or 'the host'}; a worker's layers must share one device")
            self.layer_index[name] = len(layers)
            self.layer_address[name] = info.address
            layers.append(_cuda_layer(info) if info.device is not None else _host_layer(name, info))
        if geometry is None:
            raise ValueError("register_kv_caches got no layers")
        ensure_node(self.socket_path, self.extra, self.identity)
        # A producer's worker (role prefill) asks get_finished a step ahead (PortClient
        # finished_ahead): no round trip in its steps, its blocks held one step longer.
        common = {"engine": self.identity, "tp_rank": self.tp_rank, "geometry": geometry}
        if device is None:
            self.client = PortClient(self.socket_path, "worker", memory={"kind": "host", "layers": layers},
                                     **common)
        else:
            # GPU: a ring of 2 x layers events (a step's copies never wait on the next step's
            # compute); a consumer asks for the node's load events, which the node exports in
            # READ only (its stream then waits on the GPU in wait_for_layer_load).
            events, handles = cuda_port.event_ring(2 * len(layers), device)
            worker = cuda_port.GpuWorkerClient(
                self.socket_path, "worker", events=handles, load_events=not self.is_producer,
                event_device=device, memory={"kind": "cuda_ipc", "device_uuid": cuda_port.device_uuid(device),
                                             "layers": layers}, **common)
            self.marks = cuda_port.SaveMarks(worker, events, len(layers), self.save_marks)
            self.client = worker
        self.client.reconnect(wait_s=float(self.extra.get("connect_timeout_s", 60)))

    def _client(self) -> PortClient:
        if self.client is None:
            raise RuntimeError("register_kv_caches was not called before the first step")
        return self.client

    def bind(self, metadata: Any) -> None:
        # The step's loads are known once its start_load_kv ran. A newer vLLM calls that after the
        # forward when every load is asynchronous (kvferry's are): the forward's per-layer waits
        # must not act on the step before's count, so none until then.
        self.loads = 0
        self.forward_began = False
        c = self._client()
        if not c.connected:
            c.reconnect()  # the start of a step: say hello again after a node restart
        if isinstance(metadata, KvferryConnectorMetadata):
            c.bind_connector_metadata(metadata.data)

    def start_load_kv(self) -> None:
        c = self._client()
        if self.forward_began and c.pipelined_layer_waits:
            # This vLLM starts loads after the forward: waits sent ahead now would be answered only
            # once their reads landed, and the step's next call would wait for those replies.
            log.info("kvferry: start_load_kv comes after the forward; layer waits are not sent ahead")
            c.pipelined_layer_waits = False
        self.loads = c.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        """vLLM runs the layer's attention after this returns. Host memory (what this adapter
        registers): the node answers once the layer's reads landed. A client with the node's load
        events (GPU memory) instead gets an event slot and makes the current stream wait on it
        before returning, so the layer's kernels queue behind the copies without a CPU wait."""
        self.forward_began = True
        if self.loads <= 0 or layer_name not in self.layer_index:
            return
        layer = self.layer_index[layer_name]
        if not self._client().wait_for_layer_load(layer):
            self.failed_layers.add(layer)  # its blocks come back from get_finished

    def save_kv_layer(self, layer_name: str, kv_layer: Any) -> None:
        self.forward_began = True
        if not self.is_producer or layer_name not in self.layer_index:
            return  # as the seed: only the producer saves
        if kv_layer is not None and hasattr(kv_layer, "data_ptr") and kv_layer.data_ptr() != self.layer_address[layer_name]:
            raise ValueError(f"save_kv_layer({layer_name}): not the tensor registered for this layer")
        if self.marks is not None:  # GPU: an event after the layer's writes on this stream
            self.marks.saved(self.layer_index[layer_name])
        else:
            self._client().save_kv_layer(self.layer_index[layer_name])

    def wait_for_save(self) -> None:
        if self.marks is not None:
            self.marks.step_end()
        self._client().wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        f = self._client().get_finished(sorted(finished_req_ids), raise_op_errors=False)
        for e in f["op_errors"]:
            log.error("kvferry node refused %s: %s: %s", e.get("op"), e.get("code"), e.get("message"))
        self.op_errors.extend(f["op_errors"])
        self.load_errors.update(f["block_ids_with_load_errors"])
        sending = set(f["done_sending"])
        recving = set(f["done_receiving"])
        # vLLM has no "failed" set: a failed transfer is over (its blocks may be freed) and, on D,
        # its unloaded blocks are in the load errors, which vLLM recomputes.
        for rid, why in f["failed"].items():
            log.warning("kvferry transfer of %s failed: %s", rid, why)
            (sending if self.is_producer else recving).add(rid)
        return self._first_reports(sending) or None, self._first_reports(recving) or None

    def _first_reports(self, ids: set[str]) -> set[str]:
        fresh = {rid for rid in ids if rid not in self.reported}
        for rid in fresh:
            self.reported[rid] = None
        while len(self.reported) > _REPORTED_KEPT:
            self.reported.popitem(last=False)
        return fresh

    def handle_preemptions(self, preempted: Any) -> None:
        """Before the step's forward: no copy may read a preempted request's blocks once this
        returns (vLLM reuses them). vLLM hands the step's metadata (newer) or the ids (older)."""
        if isinstance(preempted, (set, frozenset, list, tuple)):
            ids = set(preempted)
        else:
            ids = set(getattr(preempted, "preempted", ()) or ())
        if self.is_producer and ids:
            self._client().fence_saves(sorted(ids))

    def get_block_ids_with_load_errors(self) -> set[int]:
        out = set(self.load_errors)
        self.load_errors.clear()
        if self.client is not None and self.client.connected:
            out.update(self.client.get_block_ids_with_load_errors())
        return out

    def shutdown(self) -> None:
        if self.client is not None:
            try:
                self.client.shutdown()
            except (NodeUnavailable, PortError) as e:
                log.info("kvferry shutdown: %s", e)


class KvferryConnector(KVConnectorBase_V1):  # type: ignore[misc]
    """vLLM's KV connector on kvferry's engine port (see the module's docstring)."""

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None):
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # vLLM before kv_cache_config was added to the base
            super().__init__(vllm_config, role)  # type: ignore[call-arg]
        extra = _extra(vllm_config)
        groups = getattr(kv_cache_config, "kv_cache_groups", None)
        if groups is not None and len(groups) > 1:
            # Each group has its own block ids; kvferry names one list per request. vLLM keeps
            # its hybrid KV cache manager off for connectors without SupportsHMA (this one), so
            # this is a vLLM that did not: moving the first group's ids for every layer would
            # put the other groups' KV in the wrong blocks.
            raise ValueError(f"kvferry moves one KV cache group; vLLM made {len(groups)} (a hybrid model with "
                             "the hybrid KV cache manager on): run vLLM with --disable-hybrid-kv-cache-manager")
        self.connector_scheduler: KvferryScheduler | None = None
        self.connector_worker: KvferryWorker | None = None
        if getattr(role, "name", role) in ("SCHEDULER", KVConnectorRole.SCHEDULER):
            self.connector_scheduler = KvferryScheduler(vllm_config, extra)
        else:
            self.connector_worker = KvferryWorker(vllm_config, extra)

    # -- worker side --

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        assert self.connector_worker is not None
        self.connector_worker.register_kv_caches(kv_caches)

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        super().bind_connector_metadata(connector_metadata)
        if self.connector_worker is not None:
            self.connector_worker.bind(connector_metadata)

    def handle_preemptions(self, kv_connector_metadata: Any) -> None:
        if self.connector_worker is not None:
            self.connector_worker.handle_preemptions(kv_connector_metadata)

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        assert self.connector_worker is not None
        self.connector_worker.start_load_kv()

    def wait_for_layer_load(self, layer_name: str) -> None:
        assert self.connector_worker is not None
        self.connector_worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any) -> None:
        assert self.connector_worker is not None
        self.connector_worker.save_kv_layer(layer_name, kv_layer)

    def wait_for_save(self) -> None:
        assert self.connector_worker is not None
        self.connector_worker.wait_for_save()

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        assert self.connector_worker is not None
        return self.connector_worker.get_finished(finished_req_ids)

    def get_block_ids_with_load_errors(self) -> set[int]:
        assert self.connector_worker is not None
        return self.connector_worker.get_block_ids_with_load_errors()

    def get_handshake_metadata(self) -> Any:
        return None  # the nodes handshake with each other; vLLM carries nothing for kvferry

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        return True  # save_kv_layer and wait_for_layer_load run per layer: a full graph skips them

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        return "NHD"  # [2, num_blocks, block_size, kv_heads, head_dim]: the layout the node pages

    def shutdown(self) -> None:
        if self.connector_worker is not None:
            self.connector_worker.shutdown()
        if self.connector_scheduler is not None:
            self.connector_scheduler.shutdown()

    # -- scheduler side --

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[int | None, bool]:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        assert self.connector_scheduler is not None
        self.connector_scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KvferryConnectorMetadata:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self.connector_scheduler is not None
        return self.connector_scheduler.request_finished(request, block_ids)

    def update_connector_output(self, connector_output: Any) -> None:
        if self.connector_scheduler is not None:
            self.connector_scheduler.update_connector_output(connector_output)

    def has_pending_push_work(self) -> bool:
        return self.connector_scheduler is not None and self.connector_scheduler.has_pending_push_work()

    def get_finished_count(self) -> int | None:
        return None  # every TP rank reports each request: vLLM's default (the world size)
