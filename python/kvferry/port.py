"""The engine port's client: one connection to a kvferry node's Unix socket.

Protocol version 2, or 1 with a node that speaks only that (docs/engine-port.md). A frame is a
4-byte big-endian length and one msgpack map. A request carries an ``id`` and gets one reply
with the same id; one-way requests carry no id and get no reply: this client sends
``update_state_after_alloc``, ``bind_connector_metadata``, ``save_kv_layer``, ``wait_for_save``
and (when the bound metadata says nothing loads) ``start_load_kv`` one-way. Their errors come back in the next ``build_connector_meta``
(scheduler) or ``get_finished`` (worker) reply and are raised there.

Load events (GPU memory, READ mode on D): a worker created with ``load_events=True`` asks the
node for its ring of interprocess CUDA events at hello; the node exports one when the worker's
memory is ``cuda_ipc`` and its transport is ``cuda`` (else the reply's ``load_events`` is empty).
Then ``wait_for_layer_load`` may come back before the layer's copies have landed, naming the slot
the node recorded behind them; the client opens the events once (torch, on first use) and makes
the current CUDA stream wait on that event, so no CPU waits for the copies.

Thread-safety: a ``PortClient`` is one connection and is NOT thread-safe. The protocol is
synchronous per connection (send a request, read its reply, then the next), so give each thread
(the scheduler, each TP rank's worker) a client of its own.
"""

from __future__ import annotations

import errno
import os
from collections import OrderedDict, deque
import socket
import struct
import time
from typing import Any

import msgpack

# The newest version this client speaks; a node that refuses it is asked again with version 1.
PROTOCOL_VERSION = 2
# Version 2 added the batch op: held one-way ops go to the node as one frame.
BATCH_VERSION = 2
MAX_FRAME_BYTES = 64 * 1024 * 1024
# Held one-way ops (PortClient._one_way) are sent once this many are held.
HELD_OPS_LIMIT = 512
_KEPT_FOR_READERS = 65536  # as the node's kvferry.connector.terminal-id-capacity
IPC_HANDLE_BYTES = 64  # cudaIpcEventHandle_t
_LENGTH = struct.Struct(">I")

__all__ = [
    "PROTOCOL_VERSION",
    "MAX_FRAME_BYTES",
    "PortClient",
    "PortError",
    "NodeUnavailable",
    "ProtocolViolation",
    "encode_frame",
    "FrameReader",
    "error_for",
    "parse_load_events",
    "parse_layer_load",
]


# ---- errors ----


class PortError(Exception):
    """An error reply from the node: ``code`` is one of the spec's codes, ``message`` its text."""

    code: str = "port_error"
    fatal: bool = False

    def __init__(self, code: str, message: str, op: str | None = None):
        self.code = code
        self.message = message
        self.op = op
        where = f" ({op})" if op else ""
        super().__init__(f"kvferry node answered {code}{where}: {message}")


class BadFrame(PortError):
    fatal = True


class Unauthorized(PortError):
    fatal = True


class BadVersion(PortError):
    fatal = True


class HelloRequired(PortError):
    pass


class AlreadyHello(PortError):
    pass


class UnknownOp(PortError):
    pass


class WrongSide(PortError):
    pass


class BadArgs(PortError):
    pass


class IdentityMismatch(PortError):
    pass


class EngineBusy(PortError):
    pass


class BadMemory(PortError):
    pass


class UnknownRequest(PortError):
    pass


class UnknownMetadata(PortError):
    pass


class WorkersMissing(PortError):
    pass


class NodeStopping(PortError):
    pass


class InternalError(PortError):
    pass


ERROR_CLASSES: dict[str, type[PortError]] = {
    "bad_frame": BadFrame,
    "unauthorized": Unauthorized,
    "bad_version": BadVersion,
    "hello_required": HelloRequired,
    "already_hello": AlreadyHello,
    "unknown_op": UnknownOp,
    "wrong_side": WrongSide,
    "bad_args": BadArgs,
    "identity_mismatch": IdentityMismatch,
    "engine_busy": EngineBusy,
    "bad_memory": BadMemory,
    "unknown_request": UnknownRequest,
    "unknown_metadata": UnknownMetadata,
    "workers_missing": WorkersMissing,
    "node_stopping": NodeStopping,
    "internal": InternalError,
}


def error_for(code: str, message: str, op: str | None = None) -> PortError:
    """The typed error for a code; an unknown code (a newer node) is a plain ``PortError``."""
    cls = ERROR_CLASSES.get(code, PortError)
    return cls(code, message, op)


class NodeUnavailable(Exception):
    """The node's socket is missing, refused the connection, or closed it.

    Raised on the call in progress and on every later call until ``reconnect()`` succeeds.
    """

    def __init__(self, socket_path: str, why: str):
        self.socket_path = socket_path
        self.why = why
        super().__init__(
            f"kvferry node at {socket_path} is unavailable: {why}; start the node "
            f"(kvferry node --engine port --engine-socket {socket_path}) and reconnect"
        )


class ProtocolViolation(Exception):
    """The node sent something the protocol does not allow (a bug on one side)."""


# ---- frames ----


def encode_frame(message: dict[str, Any], packer: Any = None) -> bytes:
    """One frame holding ``message``; ``packer``: a ``msgpack.Packer`` to reuse (not shared
    between threads)."""
    body = packer.pack(message) if packer is not None else msgpack.packb(message, use_bin_type=True)
    if not 1 <= len(body) <= MAX_FRAME_BYTES:
        raise ValueError(f"frame of {len(body)} bytes is outside 1..{MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(body)) + body


class FrameReader:
    """Reads whole frames from a blocking socket. With ``spin_s`` it first polls for a frame's
    first bytes without sleeping, for up to that long: a reply that comes within it is read with
    no wake-up of this thread (on a virtual machine's idle CPU a wake-up costs 50-200 us)."""

    def __init__(self, sock: socket.socket, spin_s: float = 0.0):
        self._sock = sock
        self.spin_s = spin_s

    def _spin_recv(self, n: int) -> bytes | None:
        """Up to ``n`` bytes polled for up to ``spin_s``; None when none came in that time."""
        # A socket with a timeout waits in poll() before each recv (MSG_DONTWAIT included), so
        # the polling runs with none and the timeout comes back after.
        timeout = self._sock.gettimeout()
        deadline = time.perf_counter() + self.spin_s
        self._sock.settimeout(0.0)
        try:
            while True:
                try:
                    return self._sock.recv(n)
                except (BlockingIOError, InterruptedError):
                    if time.perf_counter() >= deadline:
                        return None
        finally:
            self._sock.settimeout(timeout)

    def _read_exact(self, n: int) -> bytes:
        chunks = []
        remaining = n
        spin = self.spin_s > 0
        while remaining:
            chunk = self._spin_recv(min(remaining, 1 << 20)) if spin else None
            spin = False  # the rest of a frame follows its first bytes at once
            if chunk is None:
                chunk = self._sock.recv(min(remaining, 1 << 20))
            if not chunk:
                raise EOFError("connection closed")
            chunks.append(chunk)
            remaining -= len(chunk)
        return b"".join(chunks)

    def read(self) -> dict[str, Any]:
        (length,) = _LENGTH.unpack(self._read_exact(4))
        if not 1 <= length <= MAX_FRAME_BYTES:
            raise ProtocolViolation(f"frame length {length} outside 1..{MAX_FRAME_BYTES}")
        body = self._read_exact(length)
        try:
            message = msgpack.unpackb(body, raw=False)
        except Exception as e:  # msgpack raises several types
            raise ProtocolViolation(f"frame is not msgpack: {e}") from e
        if not isinstance(message, dict):
            raise ProtocolViolation(f"frame is a {type(message).__name__}, not a map")
        return message


def _counts_in(metadata: bytes) -> tuple[int | None, int | None]:
    """The ``loads`` and ``saves`` counts the node puts in its metadata (a msgpack map); None for
    one that is not there (an older node), so the client then sends as if it were not zero."""
    try:
        m = msgpack.unpackb(metadata, raw=False)
    except Exception:
        return None, None
    if not isinstance(m, dict):
        return None, None

    def count(key: str) -> int | None:
        v = m.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None
    return count("loads"), count("saves")


def parse_load_events(hello_reply: dict[str, Any]) -> list[bytes]:
    """The node's exported load events (64-byte IPC handles) in a hello reply; empty when the
    node exported none (host memory, another transport, not asked, or an older node)."""
    raw = hello_reply.get("load_events")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ProtocolViolation(f"hello's load_events is a {type(raw).__name__}, not a list")
    handles = []
    for i, h in enumerate(raw):
        if not isinstance(h, (bytes, bytearray)) or len(h) != IPC_HANDLE_BYTES:
            raise ProtocolViolation(f"hello's load_events[{i}] is not a {IPC_HANDLE_BYTES}-byte handle")
        handles.append(bytes(h))
    return handles


def parse_layer_load(reply: dict[str, Any], ring_size: int) -> tuple[bool, int | None]:
    """``(ok, event_slot)`` of a ``wait_for_layer_load`` reply; the slot must be in the ring."""
    ok = bool(reply["ok"])
    slot = reply.get("event_slot")
    if slot is None:
        return ok, None
    if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < ring_size:
        raise ProtocolViolation(f"wait_for_layer_load's event_slot {slot!r} is not a slot of the "
                                f"{ring_size} load events this connection got")
    return ok, slot


# ---- client ----


# The keys of kv_transfer_params (KvTransferParams on the node) and those it reads as ints, with
# their ranges; _vouched accepts only what the node's checks accept.
_PARAM_INTS = {"remote_dp_rank": (0, 2**31 - 1), "remote_port": (0, 65535), "tp_size": (1, 2**31 - 1)}
_PARAM_LISTS = {"remote_block_ids": (0, 2**31 - 1), "remote_worker_uids": (-(2**31), 2**31 - 1)}
_PARAM_KEYS = frozenset(("do_remote_decode", "do_remote_prefill", "transfer_id", "remote_engine_id",
                         "remote_host", *_PARAM_INTS, *_PARAM_LISTS))


def _is_int_in(v: Any, bounds: tuple[int, int]) -> bool:
    return type(v) is int and bounds[0] <= v <= bounds[1]


def _vouched(params: Any) -> str | None:
    """Which request ``params`` name, when they are well formed by the node's own rules: "decode"
    for P's (do_remote_decode; no block lists, as a router gives P), "prefill" for D's
    (do_remote_prefill, as P's request_finished returns them); None for anything else, which only
    the node can judge. Both need a non-blank transfer_id and remote_engine_id, ints in range, no
    unknown key."""
    if not isinstance(params, dict) or not set(params) <= _PARAM_KEYS:
        return None
    decode, prefill = params.get("do_remote_decode"), params.get("do_remote_prefill")
    if decode not in (None, False, True) or prefill not in (None, False, True) or (decode is True) == (prefill is True):
        return None  # not bools, both set, or neither
    side = "decode" if decode is True else "prefill"
    for k in ("transfer_id", "remote_engine_id"):
        v = params.get(k)
        if not isinstance(v, str) or not v.strip():
            return None
    if params.get("remote_host") is not None and not isinstance(params["remote_host"], str):
        return None
    if any(params.get(k) is not None and not _is_int_in(params[k], b) for k, b in _PARAM_INTS.items()):
        return None
    for k, bounds in _PARAM_LISTS.items():
        v = params.get(k)
        if v is None:
            continue
        if side == "decode" or not isinstance(v, list) or not all(_is_int_in(e, bounds) for e in v):
            return None
    return side


def _env_switch(name: str) -> bool:
    """A switch from the environment: "1" (or unset, or empty) on, "0" off, anything else an error."""
    raw = os.environ.get(name, "") or "1"
    if raw not in ("0", "1"):
        raise ValueError(f"{name} must be 0 or 1, not {raw!r}")
    return raw == "1"


class _ReplyLater:
    """A request sent ahead whose reply is read later: its id while the reply is on the wire, then
    the reply once read (another call's reply comes after it on the connection, so that call reads
    it first and keeps it here)."""

    __slots__ = ("client", "op", "request_id", "reply")

    def __init__(self, client: "PortClient", op: str):
        self.client = client
        self.op = op
        self.request_id: int | None = None
        self.reply: tuple[int, dict[str, Any]] | None = None

    def sent(self, request_id: int) -> None:
        """The request went out; the last one's reply was taken (one is out at a time)."""
        assert self.request_id is None and self.reply is None, f"an earlier {self.op} is not taken"
        self.request_id = request_id

    def read(self) -> None:
        """Reads the reply off the connection if it is still there, and keeps it."""
        if self.request_id is not None:
            request_id, self.request_id = self.request_id, None
            self.reply = (request_id, self.client._read_reply(self.op))

    def take(self) -> tuple[int, dict[str, Any]] | None:
        """The reply (read now if need be), or None when nothing was sent ahead; forgets it."""
        self.read()
        reply, self.reply = self.reply, None
        return reply

    def clear(self) -> None:
        self.request_id = None
        self.reply = None


class PortClient:
    """One connection to a node: the scheduler side or one TP rank's worker.

    ``side`` is ``"scheduler"`` or ``"worker"``. ``engine`` holds the identity fields to check
    against the node (role, engine_id, dp_rank, dp_size, tp_size, mode); workers also give
    ``tp_rank``, ``geometry`` and ``memory``; the scheduler may give ``http_url``.
    Not thread-safe: one client per thread.
    """

    def __init__(
        self,
        socket_path: str,
        side: str,
        *,
        engine: dict[str, Any] | None = None,
        tp_rank: int | None = None,
        geometry: dict[str, Any] | None = None,
        memory: dict[str, Any] | None = None,
        http_url: str | None = None,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        load_events: bool = False,
        event_device: Any = None,
        send_plain: bool = False,
        reply_spin_us: float | None = None,
        finished_ahead: bool | None = None,
        local_answers: bool | None = None,
        build_ahead: bool | None = None,
    ):
        """``load_events`` (a worker on GPU memory): ask for the node's load-event ring; then
        ``wait_for_layer_load`` makes the current stream of ``event_device`` (a torch device or
        index, default the current CUDA device) wait on the slot the node names.

        ``send_plain`` (scheduler): also tell the node about requests named without
        kv_transfer_params, which kvferry does not move, so that it checks their ops (held and
        sent in batches). Off (the default), the client gives their fixed answers itself and
        leaves them out of ``build_connector_meta``: the node never hears of them.

        ``reply_spin_us``: how long a call polls for its reply before it sleeps on the socket
        (default ``KVFERRY_PORT_SPIN_US``, else 0: it sleeps at once). The node answers most calls
        within tens of microseconds; a thread that sleeps pays a wake-up on top (measured in
        docs/engine-port.md), while one that polls holds a CPU (and the GIL) meanwhile.

        ``local_answers`` (a scheduler; default ``KVFERRY_PORT_LOCAL_ANSWERS``, else on): answer
        the admission and finish ops whose answers the node's rules fix from what this client
        has seen (``get_num_new_matched_tokens``, ``request_finished``), sending the op one-way
        with the answer for the node to check; off, every such op is a round trip (a diagnostic,
        and the baseline of the A/Bs in docs/engine-port.md).

        ``build_ahead`` (a scheduler; default ``KVFERRY_PORT_BUILD_AHEAD``, else on; only with
        ``local_answers`` and without ``send_plain``, against a node whose hello offers
        ``client_steps``): ``build_connector_meta`` names the step itself, makes the handle the
        node would (the step's load and save counts follow the node's rules from what this client
        has seen) and returns it without waiting for the reply, which is read at the next call:
        errors of earlier one-way ops, and of the build itself, come one step later. Where the
        client cannot know the counts (params it cannot vouch for, an entry without
        ``num_computed_tokens``, D reading at the step rather than at admission), it asks.

        ``finished_ahead`` (a worker; by default when ``engine`` says role ``prefill``):
        ``get_finished`` sends this step's ask and answers with the reply to the last step's, which
        came while the engine computed: no round trip in the step. What it reports (sends done,
        failures, one-way ops' errors) comes one step later, so P holds finished requests' blocks
        one step longer. Not for a decode engine: D would start a received request's first token a
        step late."""
        if side not in ("scheduler", "worker"):
            raise ValueError(f"side must be 'scheduler' or 'worker', not {side!r}")
        if side == "worker" and (tp_rank is None or geometry is None or memory is None):
            raise ValueError("a worker's hello needs tp_rank, geometry and memory")
        self.socket_path = socket_path
        self.side = side
        self.engine = dict(engine or {})
        self.tp_rank = tp_rank
        self.geometry = geometry
        self.memory = memory
        self.http_url = http_url
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.node_info: dict[str, Any] | None = None
        self._sock: socket.socket | None = None
        self._reader: FrameReader | None = None
        self._next_id = 1
        self._broken: str | None = "not connected"
        self._expected_loads: int | None = None
        self._expected_saves: int | None = None
        # Scheduler: requests whose cached-step entries the node reads (docs/engine-port.md,
        # build_connector_meta): those named with do_remote_decode, until request_finished.
        self._cached_wanted: set[str] = set()
        # Requests named without kv_transfer_params: the node frees them at once when they finish.
        self._plain: set[str] = set()
        # Decode scheduler: requests whose matched tokens this client answers, by id: [the prompt
        # length first named, whether update_state_after_alloc took the transfer].
        self._receiving: dict[str, list[Any]] = {}
        # Prefill scheduler: by id, the transfer id of P's params as the node first heard them
        # for the request (None: params only the node can judge), until request_finished.
        self._sending: dict[str, str | None] = {}
        # Prefill scheduler: what the node's request_finished puts in D's params besides the
        # transfer id and the blocks (its engine, DP rank, TP size, workers), learnt from its
        # first answer on this connection: fixed while the connection lasts (any worker's
        # connection ending ends the engine, and this one with it).
        self._finish_template: dict[str, Any] | None = None
        # Prefill scheduler: the request each transfer id had its blocks kept for a reader under
        # (bounded, oldest out). The node hands no reader the blocks of an id used again for
        # another request (its worker refuses the id and frees them): such a finish is asked.
        self._kept_for_readers: OrderedDict[str, str] = OrderedDict()
        self.send_plain = send_plain
        self.local_answers = _env_switch("KVFERRY_PORT_LOCAL_ANSWERS") if local_answers is None else local_answers
        self.build_ahead = _env_switch("KVFERRY_PORT_BUILD_AHEAD") if build_ahead is None else build_ahead
        # Scheduler, steps built ahead: the last step this connection built (the node's engine
        # incarnation and the step's number, from the node's handle or this client's); the id of
        # a build sent ahead whose reply is not read yet, and that reply once read early.
        self._last_step: tuple[int, int] | None = None
        self._build_later = _ReplyLater(self, "build_connector_meta")
        # Why this connection stopped building ahead (an ahead build was refused), if it did.
        self.build_ahead_off: str | None = None
        # What the node's build_connector_meta does with each request, mirrored to know a step's
        # counts: by id, which params first named it ("decode": P's, saved; "prefill": D's,
        # loaded; "unsure": only the node can judge) and its prompt length as first named; the
        # requests update_state_after_alloc named since the last build (the node's reqsNeedSave
        # and reqsNeedRecv); P's requests whose last chunk is still to come, with their prompt
        # length; and requests whose place there this client lost track of.
        self._kv_kinds: dict[str, tuple[str, int]] = {}
        self._alloc_since_build: dict[str, None] = {}
        self._pending_save: dict[str, int] = {}
        self._unsure_pending: set[str] = set()
        # Per op, the calls this client answered itself (the op went one-way with the answer).
        self.local_answer_counts: dict[str, int] = {}
        if reply_spin_us is None:
            raw = os.environ.get("KVFERRY_PORT_SPIN_US", "") or "0"
            try:
                reply_spin_us = float(raw)
            except ValueError:
                raise ValueError(f"KVFERRY_PORT_SPIN_US must be microseconds (a number), not {raw!r}") from None
        if not 0 <= reply_spin_us < float("inf"):
            raise ValueError(f"reply_spin_us must be >= 0 and finite, not {reply_spin_us}")
        self.reply_spin_s = min(reply_spin_us / 1e6, timeout_s)  # never past the call's timeout
        self.last_op_errors: list[dict[str, Any]] = []
        self.load_events = load_events
        self.event_device = event_device
        # The node's exported events for READ loads (IPC handles, by slot), from the hello reply;
        # opened lazily with torch, dropped with the connection (the node destroys them then).
        self.load_event_handles: list[bytes] = []
        self._opened_load_events: dict[int, Any] = {}
        # wait_for_layer_load answers by path: "event" (the stream waited on a node's event),
        # "no_event" (answered once landed, or nothing was in flight): which path a run took.
        self.load_waits: dict[str, int] = {"event": 0, "no_event": 0}
        # A step that loads asks for every layer's wait_for_layer_load at once (start_load_kv);
        # replies are read in order as the engine asks for each layer (docs/engine-port.md).
        self.pipelined_layer_waits = True
        self._waits_in_flight: deque[tuple[int, int]] = deque()
        self._layer_replies: dict[int, tuple[int, dict[str, Any]]] = {}
        if finished_ahead and side != "worker":
            raise ValueError("finished_ahead is for a worker (get_finished is a worker's op)")
        if finished_ahead is None:
            finished_ahead = side == "worker" and self.engine.get("role") == "prefill"
        self.finished_ahead = finished_ahead
        # The get_finished asked ahead, its reply read at the next step's.
        self._finished_later = _ReplyLater(self, "get_finished")
        # Scheduler: one-way ops of requests kvferry does not move, held as [op, args] until the
        # connection's next send (at the latest the step's build_connector_meta), then sent as one
        # batch frame (version 1: a frame each, written together): one system call, one wake-up
        # and one frame for the node for a step's hundreds of them (docs/engine-port.md).
        self._held: list[list[Any]] = []
        # The version this connection's hello settled on (the node's reply says), and the one
        # the hello being sent asks for.
        self.version = PROTOCOL_VERSION
        self._hello_version = PROTOCOL_VERSION
        self._packer = msgpack.Packer(use_bin_type=True)
        # Per op: [calls, total seconds, longest seconds] of this client's side of each op (a
        # round trip for a call, the send for a one-way op): where an engine's step time goes.
        self.op_seconds: dict[str, list[float]] = {}

    # -- connection --

    @property
    def connected(self) -> bool:
        return self._broken is None

    def connect(self, version: int = PROTOCOL_VERSION) -> dict[str, Any]:
        """Connects and says hello (``version``, else 1 if the node refuses it); returns the
        node's hello reply."""
        self._close_socket()
        self.build_ahead_off = None  # a refusal ends building ahead for its connection only
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.connect_timeout_s)
        try:
            sock.connect(self.socket_path)
        except (FileNotFoundError, ConnectionRefusedError) as e:
            sock.close()
            raise NodeUnavailable(self.socket_path, f"cannot connect ({e.strerror})") from e
        except OSError as e:
            sock.close()
            raise NodeUnavailable(self.socket_path, f"cannot connect ({e})") from e
        sock.settimeout(self.timeout_s)
        self._sock = sock
        self._reader = FrameReader(sock, self.reply_spin_s)
        self._broken = None
        self._next_id = 1
        try:
            self._hello_version = version
            self.node_info = self._call("hello", self._hello_args(), request_id=0)
        except BadVersion:
            self._close_socket()
            self._broken = "hello refused"
            if version > 1:  # a node from before version 2: it closed the connection; ask again
                return self.connect(version=1)
            raise
        except PortError:
            self._close_socket()
            self._broken = "hello refused"
            raise
        self.version = int(self.node_info.get("version", version))
        self.load_event_handles = parse_load_events(self.node_info)
        return self.node_info

    def hello(self) -> dict[str, Any]:
        """Connects if needed (saying hello); returns what the node settled on."""
        if self.connected and self.node_info is not None:
            return self.node_info
        return self.connect()

    def reconnect(self, wait_s: float = 0.0, poll_s: float = 0.1) -> dict[str, Any]:
        """Drops the connection and says hello again; retries for up to ``wait_s`` seconds."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                return self.connect()
            except NodeUnavailable:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(poll_s)

    def close(self) -> None:
        self._close_socket()
        self._broken = "closed"

    def __enter__(self) -> "PortClient":
        self.hello()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _close_socket(self) -> None:
        # The node destroys its exported events when the connection ends: never wait on them again.
        self._opened_load_events = {}
        self._waits_in_flight.clear()
        self._layer_replies.clear()
        # A get_finished asked ahead on a lost connection is lost with it: the node answers what
        # it still holds to the next connection's asks.
        self._finished_later.clear()
        # Held ops belong to this connection: a reconnected one starts with its hello.
        self._held.clear()
        # What this client knew of the node's requests: a node that comes back knows none of them.
        self._receiving.clear()
        self._sending.clear()
        self._finish_template = None
        self._kept_for_readers.clear()
        self._last_step = None
        self._build_later.clear()
        self._kv_kinds.clear()
        self._alloc_since_build.clear()
        self._pending_save.clear()
        self._unsure_pending.clear()
        if self._sock is not None:
            try:
                self._sock.close()
            except OSError:
                pass
        self._sock = None
        self._reader = None

    def _hello_args(self) -> dict[str, Any]:
        """The hello's args (subclasses add theirs); the version is the one ``connect`` asks."""
        args: dict[str, Any] = {"version": self._hello_version, "side": self.side}
        if self.engine:
            args["engine"] = self.engine
        if self.side == "worker":
            args["tp_rank"] = self.tp_rank
            args["geometry"] = self.geometry
            args["memory"] = self.memory
            if self.load_events:
                args["load_events"] = True
        elif self.http_url is not None:
            args["http_url"] = self.http_url
        return args

    # -- transport --

    def _lost(self, why: str) -> NodeUnavailable:
        self._close_socket()
        self._broken = why
        return NodeUnavailable(self.socket_path, why)

    def _send(self, message: dict[str, Any]) -> None:
        self._send_frames(encode_frame(message, self._packer))

    def _send_frames(self, frames: bytes) -> None:
        """Writes whole encoded frames (one or several) in one call, after any held ones."""
        if self._broken is not None or self._sock is None:
            raise NodeUnavailable(self.socket_path, self._broken or "not connected")
        if self._held:
            frames = self._encode_held() + frames
        try:
            self._sock.sendall(frames)
        except socket.timeout as e:
            raise self._lost(f"send timed out after {self.timeout_s} s") from e
        except OSError as e:
            refusal = self._pending_refusal()
            if refusal is not None:
                raise refusal from e
            raise self._lost(f"connection lost while sending ({os.strerror(e.errno or errno.EPIPE)})") from e

    def _encode_held(self) -> bytes:
        """The held ops as one batch frame (version 1: a frame each), in the order they were held."""
        held, self._held = self._held, []
        if self.version >= BATCH_VERSION:
            return encode_frame({"op": "batch", "args": {"ops": held}}, self._packer)
        return b"".join(encode_frame({"op": op, "args": args}, self._packer) for op, args in held)

    def _pending_refusal(self) -> PortError | None:
        """After a failed send: the error frame the node sent before closing (bad_frame,
        unauthorized), if one is waiting to be read; it says more than the broken pipe."""
        if self._sock is None or self._reader is None:
            return None
        try:
            self._sock.settimeout(0.2)
            reply = self._reader.read()
        except (OSError, EOFError, ProtocolViolation):
            return None
        if reply.get("id") is not None or "error" not in reply:
            return None
        err = reply["error"] or {}
        self._close_socket()
        self._broken = f"refused: {err.get('code')}"
        return error_for(str(err.get("code", "internal")), str(err.get("message", "")))

    def _timed(self, op: str, began: float) -> None:
        took = time.perf_counter() - began
        s = self.op_seconds.get(op)
        if s is None:
            self.op_seconds[op] = [1, took, took]
        else:
            s[0] += 1
            s[1] += took
            if took > s[2]:
                s[2] = took

    def reset_op_seconds(self) -> dict[str, list[float]]:
        """Returns the per-op times gathered so far and starts again."""
        out, self.op_seconds = self.op_seconds, {}
        return out

    def _call(self, op: str, args: dict[str, Any] | None = None, request_id: int | None = None) -> Any:
        began = time.perf_counter()
        try:
            return self._round_trip(op, args, request_id)
        finally:
            self._timed(op, began)

    def _round_trip(self, op: str, args: dict[str, Any] | None, request_id: int | None) -> Any:
        self._read_replies_due()
        request_id = self._send_request(op, args, request_id)
        return self._answer(op, request_id, self._read_reply(op))

    def _send_request(self, op: str, args: dict[str, Any] | None, request_id: int | None = None) -> int:
        if request_id is None:
            request_id = self._next_id
            self._next_id += 1
        message: dict[str, Any] = {"id": request_id, "op": op}
        if args:
            message["args"] = args
        self._send(message)
        return request_id

    def _read_reply(self, op: str) -> dict[str, Any]:
        """The next frame from the node (the reply to the oldest request not yet answered)."""
        assert self._reader is not None
        try:
            reply = self._reader.read()
        except EOFError as e:
            raise self._lost(f"the node closed the connection during {op}") from e
        except socket.timeout as e:
            raise self._lost(f"no reply to {op} within {self.timeout_s} s") from e
        except OSError as e:
            raise self._lost(f"connection lost during {op} ({e})") from e
        except ProtocolViolation:
            self._close_socket()
            self._broken = "protocol violation"
            raise
        if reply.get("id") is None and "error" in reply:
            # bad_frame or unauthorized: the node could not tie it to a request and closes.
            err = reply["error"] or {}
            self._close_socket()
            self._broken = f"refused: {err.get('code')}"
            raise error_for(str(err.get("code", "internal")), str(err.get("message", "")), op)
        return reply

    def _answer(self, op: str, request_id: int, reply: dict[str, Any]) -> Any:
        """The ``ok`` of ``reply`` to request ``request_id``; raises its error."""
        if reply.get("id") != request_id:
            self._close_socket()
            self._broken = "protocol violation"
            raise ProtocolViolation(f"reply to {op} carries id {reply.get('id')!r}, expected {request_id}")
        if "error" in reply:
            err = reply["error"] or {}
            e = error_for(str(err.get("code", "internal")), str(err.get("message", "")), op)
            if e.fatal:
                # The node closes the connection after a fatal error.
                self._close_socket()
                self._broken = f"fatal error {e.code}"
            raise e
        if "ok" not in reply:
            raise ProtocolViolation(f"reply to {op} has neither ok nor error")
        return reply["ok"]

    def _read_replies_due(self) -> None:
        """Reads the replies to requests sent ahead (pipelined layer waits, a get_finished asked
        ahead, a build sent ahead) and keeps them: they come before any later request's reply on
        the connection."""
        self._drain_layer_waits()
        self._finished_later.read()
        self._build_later.read()

    # -- get_finished asked ahead --

    def _finished_ahead(self, args: dict[str, Any] | None) -> dict[str, Any]:
        """The last ask's answer (empty sets the first time); this step's ask goes out now."""
        self._read_replies_due()
        early = self._finished_later.take()
        self._finished_later.sent(self._send_request("get_finished", args))
        if early is None:
            return {}
        return self._answer("get_finished", early[0], early[1])

    # -- pipelined layer waits --

    def _layer_count(self) -> int:
        layers = (self.memory or {}).get("layers")
        return len(layers) if isinstance(layers, list) else 0

    def _pipeline_layer_waits(self) -> None:
        """A step that loads: ask for every layer's wait at once, replies read as the engine
        reaches each layer. The node answers in order, each once its layer's reads are queued
        (or landed), so the engine's per-layer calls no longer each pay a round trip."""
        layers = self._layer_count()
        if not self.pipelined_layer_waits or layers == 0:
            return
        # Called right after start_load_kv's round trip, which read every reply due before it: each
        # wait's reply is then the next one on the connection in turn.
        frames = []
        for layer in range(layers):
            request_id = self._next_id
            self._next_id += 1
            frames.append(encode_frame({"id": request_id, "op": "wait_for_layer_load", "args": {"layer": layer}}))
            self._waits_in_flight.append((request_id, layer))
        began = time.perf_counter()
        try:
            self._send_frames(b"".join(frames))
        finally:
            self._timed("wait_for_layer_load (sent ahead)", began)

    def _read_layer_wait(self) -> None:
        """Reads the reply to the oldest pipelined wait and keeps it for its layer."""
        request_id, layer = self._waits_in_flight.popleft()
        reply = self._read_reply("wait_for_layer_load")
        if reply.get("id") != request_id:
            self._answer("wait_for_layer_load", request_id, reply)  # raises: out of order
        self._layer_replies[layer] = (request_id, reply)

    def _drain_layer_waits(self) -> None:
        while self._waits_in_flight:
            self._read_layer_wait()

    def _forget_layer_waits(self) -> None:
        """A new step: replies the engine did not ask for are read and dropped (a slot in them is
        the node's again from this step on)."""
        self._drain_layer_waits()
        self._layer_replies.clear()

    def _one_way(self, op: str, args: dict[str, Any], hold: bool = False) -> None:
        """Sends ``op`` without an id. ``hold``: keep it for the connection's next send (ops keep
        their order); nothing waits on it, so only ops whose timing the node does not act on are
        held."""
        began = time.perf_counter()
        try:
            if hold and self._broken is None:
                self._held.append([op, args])
                if len(self._held) >= HELD_OPS_LIMIT:
                    self.flush()
            else:
                self._send({"op": op, "args": args})
        finally:
            self._timed(op, began)

    def flush(self) -> None:
        """Sends the held one-way ops now (any other send sends them first anyway)."""
        if self._held:
            self._send_frames(b"")

    def call(self, op: str, args: dict[str, Any] | None = None) -> Any:
        """Any op by name (for ops this client has no method for)."""
        return self._call(op, args)

    # -- ops for any side --

    def ping(self) -> dict[str, Any]:
        return self._call("ping")

    # -- scheduler ops --

    def get_num_new_matched_tokens(
        self,
        request_id: str,
        num_prompt_tokens: int,
        kv_transfer_params: dict[str, Any] | None,
        num_computed_tokens: int,
    ) -> tuple[int, bool]:
        """``(count, async)``. A request without kv_transfer_params matches nothing on any node
        (docs/engine-port.md), so for it ``(0, False)`` comes back at once: nothing is sent, or
        with ``send_plain`` the op is held and goes one-way. Requests with params ask: a node that
        refuses them says so here. On a prefill engine's scheduler, params of the form a router
        gives P (``do_remote_decode``, a transfer id and D's engine id, nothing malformed) go
        one-way, answered ``(0, False)`` at once: a prefill node never loads, and the round trip
        sat before the prefill's first kernel (0.19-0.25 ms on the GPU host, docs/gpu.md), once per
        new request. On a decode engine's scheduler (its mode known, ``send_plain`` off), params
        as P's ``request_finished`` returns them are answered the same way, with the node's rule:
        the prompt (as first named) minus the tokens D has, minus the last one in READ, async;
        ``(0, False)`` once ``update_state_after_alloc`` took the transfer. The op then carries
        the answer, and a node that would have answered otherwise refuses it, which comes back
        with the next ``build_connector_meta``. Anything else still asks, so the node's refusal
        comes here."""
        args = {"request_id": request_id, "num_prompt_tokens": num_prompt_tokens,
                "kv_transfer_params": kv_transfer_params, "num_computed_tokens": num_computed_tokens}
        # Which request the params name, judged once (None: only the node can, or no answering here).
        vouched = _vouched(kv_transfer_params) if self._answers_here() else None
        answer = self._matched_locally(request_id, num_prompt_tokens, vouched, num_computed_tokens)
        # (On a worker connection the node refuses the op: asked, so the refusal comes now.)
        if answer is not None:
            # Held: nothing acts on it before the next op (D's update_state_after_alloc, which is
            # sent at once, or the step's build_connector_meta), which sends it first.
            count, is_async = answer
            self._count_local("get_num_new_matched_tokens")
            self._one_way("get_num_new_matched_tokens",
                          {**args, "answered": {"count": count, "async": is_async}}, hold=True)
            result = answer
        elif self.side != "scheduler" or kv_transfer_params is not None:
            ok = self._call("get_num_new_matched_tokens", args)
            result = int(ok["count"]), bool(ok["async"])
        else:
            if self.send_plain:
                self._one_way("get_num_new_matched_tokens", args, hold=True)
            result = 0, False
        if kv_transfer_params and kv_transfer_params.get("do_remote_decode"):
            self._cached_wanted.add(request_id)
        if (kv_transfer_params is not None and self._answers_here() and not self.send_plain
                and self.engine.get("role") == "prefill" and request_id not in self._sending):
            # The node keeps the params of the first call that names any (with send_plain that
            # may have been a call without: only the node can say then).
            self._sending[request_id] = str(kv_transfer_params["transfer_id"]) if vouched == "decode" else None
        if kv_transfer_params is None:
            self._plain.add(request_id)
        else:
            self._plain.discard(request_id)
            if self.side == "scheduler" and request_id not in self._kv_kinds:
                # The node keeps the params of the first call that names any.
                self._kv_kinds[request_id] = (vouched or "unsure", num_prompt_tokens)
        return result

    def _answers_here(self) -> bool:
        """Whether this client gives the node's fixed answers itself (a scheduler, local_answers on)."""
        return self.side == "scheduler" and self.local_answers

    def _matched_locally(self, request_id: str, num_prompt_tokens: int, vouched: str | None,
                         num_computed_tokens: int) -> tuple[int, bool] | None:
        """The node's answer to get_num_new_matched_tokens where this client can know it (see
        there), else None: ask. ``vouched``: ``_vouched`` of the call's params."""
        role, mode = self.engine.get("role"), self.engine.get("mode")
        if not self._answers_here():
            return None
        if role == "prefill":
            return (0, False) if vouched == "decode" else None
        # With send_plain the node may have stored a request named plain first (no params), and
        # answers from that: only it can say.
        if role != "decode" or mode not in ("write", "read") or self.send_plain:
            return None
        known = self._receiving.get(request_id)
        if known is None:
            if vouched != "prefill":
                return None
            # The node keeps the prompt length of the first call, as this does.
            known = self._receiving[request_id] = [num_prompt_tokens, False]
        prompt, taken = known
        if taken:
            return 0, False
        return max(0, prompt - (1 if mode == "read" else 0) - num_computed_tokens), True

    def update_state_after_alloc(self, request_id: str, block_ids: list[int], num_external_tokens: int) -> None:
        """One-way: its error, if any, comes back in the next ``build_connector_meta``. Sent at
        once for a request a decode engine receives (its node then tells P where to write, or
        starts reading); held until the step's next call on a prefill engine, whose node acts on
        it only when the step's metadata is built; for a request named without kv_transfer_params
        nothing is sent, or with ``send_plain`` it is held."""
        plain = request_id in self._plain and self.side == "scheduler"
        if plain and not self.send_plain:
            return
        if request_id in self._receiving:
            self._receiving[request_id][1] = True  # the node's one transfer per request is taken
        if self.side == "scheduler" and not plain:
            self._alloc_since_build[request_id] = None
            # Allocated again (preempted, scheduled again): the node drops its pending save.
            self._pending_save.pop(request_id, None)
        if num_external_tokens == 0 and self.side == "scheduler" and self.engine.get("role") == "decode":
            # Nothing to load (D's prefix cache holds every token before the last, or the load is
            # in): no block may be lent to a transfer. Engines hand all the request's blocks here
            # (vLLM does, cached ones other requests share among them), and the node lends what
            # it is given.
            block_ids = []
        self._one_way(
            "update_state_after_alloc",
            {"request_id": request_id, "block_ids": list(block_ids), "num_external_tokens": num_external_tokens},
            hold=plain or (self.side == "scheduler" and self.engine.get("role") == "prefill"),
        )

    def build_connector_meta(
        self,
        scheduled_new_reqs: list[dict[str, Any]],
        scheduled_cached_reqs: list[dict[str, Any]],
        raise_op_errors: bool = True,
    ) -> bytes:
        """The step's metadata. Errors of this connection's earlier one-way ops come back here:
        the first is raised (the metadata attached as ``metadata``, all of them as ``op_errors``)
        unless ``raise_op_errors`` is false; ``last_op_errors`` holds them either way.

        Of ``scheduled_cached_reqs`` only the entries the node reads are sent: those of requests
        named with ``do_remote_decode`` (P's chunked prefill) and not finished yet. At hundreds of
        running requests the rest cost most of the step's port time and change nothing. Of
        ``scheduled_new_reqs`` those of requests named without kv_transfer_params are left out
        unless ``send_plain`` is set: the node never heard of them.

        With ``build_ahead`` (the default, see the constructor) a step whose counts this client
        knows is not waited for: the handle is this client's, the op goes out with it, and its
        reply (the op errors, or a refusal of the build itself as an op error of
        ``build_connector_meta``) is raised by the next step's call."""
        wanted = self._cached_wanted
        if not self.send_plain and self._plain:
            plain = self._plain
            scheduled_new_reqs = [r for r in scheduled_new_reqs if r["request_id"] not in plain]
        cached = [c for c in scheduled_cached_reqs if c["request_id"] in wanted]
        args: dict[str, Any] = {"scheduled_new_reqs": scheduled_new_reqs, "scheduled_cached_reqs": cached}
        # The last build sent ahead: its reply (errors of the ops before it, or its own) counts
        # as this step's news, and an error there means this step asks.
        op_errors = self._settle_build_ahead()
        counts = self._step_counts(scheduled_new_reqs, cached)
        last = self._last_step
        if counts is not None and last is not None and self._builds_ahead():
            engine, step = last[0], last[1] + 1
            loads, saves = counts
            began = time.perf_counter()
            try:
                self._build_later.sent(self._send_request(
                    "build_connector_meta", {**args, "step": step, "answered": {"loads": loads, "saves": saves}}))
            finally:
                self._timed("build_connector_meta", began)
            self._last_step = (engine, step)
            self._count_local("build_connector_meta")
            metadata = self._packer.pack({"engine": engine, "step": step, "loads": loads, "saves": saves})
        else:
            ok = self._call("build_connector_meta", args)
            metadata = bytes(ok["metadata"])
            self._learn_step(metadata)
            op_errors += list(ok.get("op_errors") or [])
        self.last_op_errors = op_errors
        if any(e.get("op") == "request_finished" for e in self.last_op_errors):
            self._finish_template = None  # the node disagreed with an answer: ask from now on
        if raise_op_errors and self.last_op_errors:
            e = self._op_error(self.last_op_errors)
            e.metadata = metadata  # type: ignore[attr-defined]
            raise e
        return metadata

    # -- steps built ahead --

    def _builds_ahead(self) -> bool:
        info = self.node_info or {}
        return (self.side == "scheduler" and self.build_ahead and self.local_answers and not self.send_plain
                and self.build_ahead_off is None and bool(info.get("client_steps")))

    def _learn_step(self, metadata: bytes) -> None:
        """Keeps the engine and step a node's handle names: this client's next step follows it."""
        try:
            m = msgpack.unpackb(metadata, raw=False)
        except Exception:  # msgpack raises several types; a foreign handle: never build ahead
            m = None
        if isinstance(m, dict) and isinstance(m.get("engine"), int) and isinstance(m.get("step"), int):
            self._last_step = (m["engine"], m["step"])
        else:
            self._last_step = None

    def _settle_build_ahead(self) -> list[dict[str, Any]]:
        """The op errors the last build sent ahead brought back; a refusal of that build itself
        comes as one of them, and this connection asks for its steps from then on."""
        early = self._build_later.take()
        if early is None:
            return []
        try:
            ok = self._answer("build_connector_meta", early[0], early[1])
        except PortError as e:
            if e.fatal:
                raise
            self.build_ahead_off = e.message
            self._last_step = None  # learnt again from the next handle the node makes
            return [{"op": "build_connector_meta", "code": e.code, "message": e.message}]
        return list(ok.get("op_errors") or [])

    def _step_counts(self, new_reqs: list[dict[str, Any]], cached: list[dict[str, Any]]) -> tuple[int, int] | None:
        """The ``(loads, saves)`` the node's metadata for this step will carry, by its rules
        (ConnectorScheduler.buildConnectorMeta), or None where this client cannot know them.
        Called for every step, asked or not, so that what it mirrors stays in step with the node."""
        info = self.node_info or {}
        role, mode = info.get("role"), info.get("mode")
        known = role in ("prefill", "decode") and mode in ("read", "write")
        saves = 0
        if role == "prefill" and mode == "write":
            # A chunked prefill's request is saved in the step that computes its last tokens; one
            # scheduled as new again (preempted, not allocated again) is at its next chunk too.
            for c in (*cached, *new_reqs):
                rid = c["request_id"]
                if rid in self._unsure_pending:
                    known = False
                    continue
                prompt = self._pending_save.get(rid)
                if prompt is None:
                    continue
                computed = c.get("num_computed_tokens")
                if computed is None:  # the node falls back to its block count
                    known = False
                    del self._pending_save[rid]
                    self._unsure_pending.add(rid)
                elif computed >= prompt:
                    saves += 1
                    del self._pending_save[rid]
        computed_after: dict[str, Any] = {}
        if self._alloc_since_build:
            computed_after = {r["request_id"]: r.get("num_computed_tokens") for r in new_reqs}
            for c in cached:  # a request preempted and scheduled again shows as cached
                computed_after.setdefault(c["request_id"], c.get("num_computed_tokens"))
        for rid in self._alloc_since_build:
            kind, prompt = self._kv_kinds.get(rid, ("unsure", 0))
            if kind == "prefill":
                # D's reads: at admission (none in the step's metadata) or, in WRITE, P's writes.
                if mode == "read" and not info.get("reads_at_admission"):
                    known = False
                continue
            if kind != "decode":
                known = False
                if rid in self._kv_kinds:
                    self._unsure_pending.add(rid)
                continue
            computed = computed_after.get(rid)
            if computed is None:
                known = False
                self._pending_save.pop(rid, None)
                self._unsure_pending.add(rid)
            elif computed >= prompt:
                saves += mode == "write"
            else:
                self._pending_save[rid] = prompt
                self._unsure_pending.discard(rid)
        self._alloc_since_build.clear()
        return (0, saves) if known else None

    @staticmethod
    def _op_error(op_errors: list[dict[str, Any]]) -> PortError:
        first = op_errors[0]
        e = error_for(str(first.get("code")), str(first.get("message")), str(first.get("op")))
        e.op_errors = op_errors  # type: ignore[attr-defined]
        e.others = op_errors[1:]  # type: ignore[attr-defined]
        return e

    def request_finished(self, request_id: str, block_ids: list[int], status: str) -> tuple[bool, dict[str, Any] | None]:
        """``(delay_free, kv_transfer_params)``. For a request this client named without
        kv_transfer_params the node frees at once and returns nothing (docs/engine-port.md), so
        ``(False, None)`` comes back at once: nothing is sent, or with ``send_plain`` the op is
        held and goes one-way (an error in it comes back with the next ``build_connector_meta``).

        On a prefill engine's scheduler (``send_plain`` off), a request named with params of the
        form a router gives P that finished ``length_capped`` is answered here by the node's
        rule: its blocks kept while any exist, and D's params as the node gave them for this
        connection's first such request, with this request's transfer id and blocks. The op goes
        one-way at once (the node must know P's blocks wait for D before D can ask for them)
        carrying the answer; a node that would have answered otherwise refuses it in the next
        ``build_connector_meta``, and this client asks from then on. Stopped and aborted requests
        always ask: the node's answer depends on whether their blocks were lent to a transfer."""
        if status not in ("length_capped", "stopped", "aborted"):
            raise ValueError(f"status must be length_capped, stopped or aborted, not {status!r}")
        args: dict[str, Any] = {"request_id": request_id, "block_ids": list(block_ids), "status": status}
        self._cached_wanted.discard(request_id)
        self._receiving.pop(request_id, None)
        transfer_id = self._sending.pop(request_id, None)
        self._kv_kinds.pop(request_id, None)
        self._pending_save.pop(request_id, None)  # the node drops it from its pending saves
        self._unsure_pending.discard(request_id)
        if request_id in self._plain and self.side == "scheduler":
            self._plain.discard(request_id)
            if self.send_plain:
                self._one_way("request_finished", args, hold=True)
            return False, None
        kept_for = self._kept_for_readers.get(transfer_id) if transfer_id is not None else None
        answer = None if kept_for not in (None, request_id) else self._finished_locally(
            transfer_id, args["block_ids"], status)
        if answer is not None:
            delay, params = answer
            self._count_local("request_finished")
            self._one_way("request_finished", {**args, "answered": {"delay_free": delay, "kv_transfer_params": params}})
        else:
            ok = self._call("request_finished", args)
            delay, params = bool(ok["delay_free"]), ok.get("kv_transfer_params")
            if transfer_id is not None and status == "length_capped" and self._finish_template is None:
                self._learn_finish_template(transfer_id, args["block_ids"], params)
        if transfer_id is not None and delay and params is not None:
            self._kept_for_readers[transfer_id] = request_id
            while len(self._kept_for_readers) > _KEPT_FOR_READERS:
                self._kept_for_readers.popitem(last=False)
        return delay, params

    def _count_local(self, op: str) -> None:
        self.local_answer_counts[op] = self.local_answer_counts.get(op, 0) + 1

    def _finished_locally(self, transfer_id: str | None, block_ids: list[int],
                          status: str) -> tuple[bool, dict[str, Any] | None] | None:
        """The node's answer to request_finished where this client can know it (see there);
        ``transfer_id`` is the request's in ``_sending``, which holds only requests it can answer."""
        if transfer_id is None or status != "length_capped" or self._finish_template is None:
            return None
        # Lists copied: the engine owns what it is given, and may change it.
        params = {k: list(v) if isinstance(v, list) else v for k, v in self._finish_template.items()}
        return len(block_ids) > 0, {**params, "transfer_id": transfer_id, "remote_block_ids": list(block_ids)}

    def _learn_finish_template(self, transfer_id: str, block_ids: list[int], params: Any) -> None:
        """Keeps the node's params for D less what differs per request, when they are of the form
        ``_finished_locally`` rebuilds (D's params for this very transfer and these blocks)."""
        if (isinstance(params, dict) and params.get("do_remote_prefill") is True
                and params.get("do_remote_decode") is False and params.get("transfer_id") == transfer_id
                and params.get("remote_block_ids") == block_ids):
            self._finish_template = {k: v for k, v in params.items() if k not in ("transfer_id", "remote_block_ids")}

    # -- worker ops --

    def bind_connector_metadata(self, metadata: bytes) -> None:
        """One-way: its error, if any, comes back in the next ``get_finished``. Reads the
        metadata's ``loads`` so ``start_load_kv`` can skip its round trip when nothing loads, and
        its ``saves`` so the step's save frames are left out when nothing is saved."""
        self._expected_loads, self._expected_saves = _counts_in(metadata)
        self._one_way("bind_connector_metadata", {"metadata": bytes(metadata)})

    def start_load_kv(self) -> int:
        """Requests this step loads; one-way (0) when the bound metadata says none."""
        expected, self._expected_loads = self._expected_loads, None
        self._forget_layer_waits()
        if expected == 0:
            self._one_way("start_load_kv", {})
            return 0
        loads = int(self._call("start_load_kv")["loads"])
        if loads > 0:
            self._pipeline_layer_waits()
        return loads

    def wait_for_layer_load(self, layer: int) -> bool:
        """False if a load of this layer failed (its blocks come back from ``get_finished``).
        When the node answers with an ``event_slot`` (load events, GPU), the current CUDA stream
        is made to wait on that event before this returns: work queued after it sees the bytes."""
        ok, slot = self.wait_for_layer_load_event(layer)
        if slot is not None:
            self._stream_wait(slot)
        return ok

    def wait_for_layer_load_event(self, layer: int) -> tuple[bool, int | None]:
        """``wait_for_layer_load`` without the stream wait: ``(ok, event_slot)``. With a slot,
        the caller must make its stream wait on ``load_event(slot)`` before it sends any other op
        (the node may record the slot again from the worker's next ``start_load_kv``)."""
        began = time.perf_counter()
        while layer not in self._layer_replies and any(w == layer for _, w in self._waits_in_flight):
            self._read_layer_wait()
        kept = self._layer_replies.pop(layer, None)
        if kept is not None:
            try:
                reply = self._answer("wait_for_layer_load", kept[0], kept[1])
            finally:
                self._timed("wait_for_layer_load", began)
        else:  # not asked ahead (a step without loads, or a layer asked again): a round trip
            reply = self._call("wait_for_layer_load", {"layer": layer})
        ok, slot = parse_layer_load(reply, len(self.load_event_handles))
        self.load_waits["event" if slot is not None else "no_event"] += 1
        return ok, slot

    def load_event(self, slot: int) -> Any:
        """The node's event of ``slot`` as a ``torch.cuda.Event``, opened once per connection."""
        ev = self._opened_load_events.get(slot)
        if ev is None:
            import torch

            ev = torch.cuda.Event.from_ipc_handle(self._cuda_device(), self.load_event_handles[slot])
            self._opened_load_events[slot] = ev
        return ev

    def _cuda_device(self) -> Any:
        import torch

        d = self.event_device
        dev = None if d is None else torch.device("cuda", d) if isinstance(d, int) else torch.device(d)
        if dev is None or dev.index is None:  # "cuda" alone: the current device, by its index
            dev = torch.device("cuda", torch.cuda.current_device())
        return dev

    def _stream_wait(self, slot: int) -> None:
        import torch

        ev = self.load_event(slot)
        torch.cuda.current_stream(self._cuda_device()).wait_event(ev)

    @property
    def step_saves(self) -> bool:
        """False when the bound metadata says this step saves nothing (``save_kv_layer`` and
        ``wait_for_save`` are then not sent: the node would ignore them); True otherwise."""
        return self._expected_saves != 0

    def save_kv_layer(self, layer: int) -> None:
        """One-way: send it after the layer's KV is in memory (not sent when the step saves
        nothing)."""
        if self.step_saves:
            self._one_way("save_kv_layer", {"layer": layer})

    def wait_for_save(self) -> None:
        """One-way: the saves go on in the node; their outcome comes with ``get_finished``.
        Not sent when the step saves nothing."""
        if self.step_saves:
            self._one_way("wait_for_save", {})

    def get_finished(self, finished_req_ids: list[str] | None = None, raise_op_errors: bool = True) -> dict[str, Any]:
        """The node's finished sets. One-way ops' errors come back here; they are raised (the
        first one, the rest attached as ``others``) unless ``raise_op_errors`` is false."""
        args = {"finished_req_ids": list(finished_req_ids)} if finished_req_ids else None
        if self.finished_ahead:
            began = time.perf_counter()
            try:
                ok = self._finished_ahead(args)
            finally:
                self._timed("get_finished", began)
        else:
            ok = self._call("get_finished", args)
        result = {
            "done_sending": list(ok.get("done_sending") or []),
            "done_receiving": list(ok.get("done_receiving") or []),
            "failed": dict(ok.get("failed") or {}),
            "block_ids_with_load_errors": list(ok.get("block_ids_with_load_errors") or []),
            "op_errors": list(ok.get("op_errors") or []),
        }
        if raise_op_errors and result["op_errors"]:
            e = self._op_error(result["op_errors"])
            e.finished = result  # type: ignore[attr-defined]
            raise e
        return result

    def get_block_ids_with_load_errors(self) -> list[int]:
        return list(self._call("get_block_ids_with_load_errors")["block_ids"])

    def fence_saves(self, request_ids: list[str]) -> None:
        """vLLM's ``handle_preemptions``: returns once no copy reads these (preempted) requests'
        blocks any more; a transfer that saved any of their layers fails (D recomputes). Raises
        if the node cannot say so in time: the engine must not reuse the blocks then."""
        if request_ids:
            self._call("fence_saves", {"request_ids": list(request_ids)})

    def shutdown(self) -> None:
        try:
            self._call("shutdown")
        finally:
            self.close()
