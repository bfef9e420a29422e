"""A scripted stand-in for a kvferry node's engine port, for tests that need no JVM.

It speaks the protocol's framing and hello rules (hello first, once; the versions in
``versions``, 1 and 2 unless a test narrows them; the side's ops only; version 2's ``batch``) and
records every op it receives (a batch's ops one by one; ``frames`` counts the frames). Replies to scheduler and worker ops come
from overridable handlers; ``finished`` holds per TP rank the next ``get_finished`` results.
"""

from __future__ import annotations

import collections
import os
import socket
import struct
import threading
import time
from typing import Any, Callable

import msgpack

SCHEDULER_OPS = {"get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                 "request_finished"}
WORKER_OPS = {"bind_connector_metadata", "start_load_kv", "wait_for_layer_load", "save_kv_layer",
              "wait_for_save", "fence_saves", "get_finished", "get_block_ids_with_load_errors", "shutdown"}


class Refuse(Exception):
    def __init__(self, code: str, message: str, fatal: bool = False):
        super().__init__(message)
        self.code, self.message, self.fatal = code, message, fatal


class FakeNode:
    def __init__(self, path: str):
        self.path = path
        self.log: list[tuple[str, int | None, str, dict]] = []  # (side, tp_rank, op, args)
        self.hellos: list[dict] = []
        self.versions: tuple[int, ...] = (1, 2)
        self.frames = 0
        self.lock = threading.Lock()
        self.finished: dict[int, collections.deque] = collections.defaultdict(collections.deque)
        self.metadata: set[bytes] = set()
        self.steps = 0
        self.matched: Callable[[dict], dict] = lambda a: {"count": 0, "async": False}
        self.finish: Callable[[dict], dict] = lambda a: {"delay_free": False, "kv_transfer_params": None}
        self.loads = 0
        # The metadata's saves count; None leaves the key out (a node from before it).
        self.saves: int | None = 0
        # Offer client_steps in the scheduler's hello (a node that lets the client name its steps
        # and build them ahead); handles then also name the engine, as a real node's do.
        self.client_steps = False
        self.mode = "write"  # the mode the hello reply names
        self.reads_at_admission = True
        # Worker hellos that ask for load_events get these handles back (a node on GPU memory).
        self.load_event_handles: list[bytes] = []
        self.layer_load: Callable[[dict], dict] = lambda a: {"ok": True}
        self.reply_before_close: bytes | None = None
        self._conns: list[socket.socket] = []
        if os.path.exists(path):
            os.unlink(path)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        os.chmod(path, 0o600)
        self.server.listen(16)
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    # -- control --

    def ops(self, side: str | None = None, rank: int | None = None) -> list[str]:
        with self.lock:
            return [op for s, r, op, _ in self.log if (side is None or s == side) and (rank is None or r == rank)]

    def calls(self, op: str) -> list[dict]:
        with self.lock:
            return [a for _, _, o, a in self.log if o == op]

    def await_ops(self, n: int, side: str | None = None, rank: int | None = None, timeout_s: float = 5.0) -> list[str]:
        """``ops(side, rank)`` once it holds ``n`` ops, or at ``timeout_s``: one-way frames are logged
        when this node's thread reads them, which may be after the client's call returned."""
        deadline = time.monotonic() + timeout_s
        while len(self.ops(side, rank)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.ops(side, rank)

    def await_calls(self, op: str, n: int, timeout_s: float = 5.0) -> list[dict]:
        """``calls(op)`` once it holds ``n`` calls, or at ``timeout_s`` (a build sent ahead is
        logged when this node's thread reads it)."""
        deadline = time.monotonic() + timeout_s
        while len(self.calls(op)) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.calls(op)

    def drop_connections(self) -> None:
        for c in list(self._conns):
            try:
                c.shutdown(socket.SHUT_RDWR)
                c.close()
            except OSError:
                pass

    def close(self) -> None:
        self.server.close()
        self.drop_connections()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    # -- serving --

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    @staticmethod
    def _read_exact(conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    @staticmethod
    def _send(conn: socket.socket, msg: dict) -> None:
        body = msgpack.packb(msg, use_bin_type=True)
        conn.sendall(struct.pack(">I", len(body)) + body)

    def _serve(self, conn: socket.socket) -> None:
        state: dict[str, Any] = {"side": None, "rank": None}
        try:
            while True:
                (n,) = struct.unpack(">I", self._read_exact(conn, 4))
                if n == 0 or n > 64 * 1024 * 1024:
                    self._send(conn, {"id": None, "error": {"code": "bad_frame", "message": f"length {n}"}})
                    return
                try:
                    msg = msgpack.unpackb(self._read_exact(conn, n), raw=False)
                except Exception as e:
                    self._send(conn, {"id": None, "error": {"code": "bad_frame", "message": str(e)}})
                    return
                if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
                    self._send(conn, {"id": None, "error": {"code": "bad_frame", "message": "not a request"}})
                    return
                rid, op, args = msg.get("id"), msg["op"], msg.get("args") or {}
                with self.lock:
                    self.frames += 1
                if op == "batch" and state.get("version", 0) >= 2:
                    for batched_op, batched_args in args.get("ops", []):
                        if not self._run(conn, state, None, batched_op, batched_args or {}):
                            return
                    if rid is not None:
                        self._send(conn, {"id": rid, "ok": {}})
                elif not self._run(conn, state, rid, op, args):
                    return
        except (EOFError, OSError):
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def _run(self, conn: socket.socket, state: dict, rid: int | None, op: str, args: dict) -> bool:
        """One op: replied to when it has an id, else its error kept; False: the connection ends."""
        try:
            with self.lock:
                entry = (state["side"] or args.get("side", "?"), state["rank"] if state["side"]
                         else args.get("tp_rank"), op, args)
                self.log.append(entry)
            result = self._handle(state, op, args)
            if rid is not None:
                if self.reply_before_close is not None and op == self.reply_before_close.decode():
                    conn.close()  # dies mid-call, as a killed node would
                    return False
                self._send(conn, {"id": rid, "ok": result})
        except Refuse as e:
            if rid is not None:
                self._send(conn, {"id": rid, "error": {"code": e.code, "message": e.message}})
            else:
                state.setdefault("op_errors", []).append({"op": op, "code": e.code, "message": e.message})
            if e.fatal:
                return False
        return True

    def _handle(self, state: dict, op: str, a: dict) -> Any:
        if op == "hello":
            if state["side"] is not None:
                raise Refuse("already_hello", "second hello")
            if a.get("version") not in self.versions:
                raise Refuse("bad_version", f"supported: {list(self.versions)}", fatal=True)
            if a.get("side") not in ("scheduler", "worker"):
                raise Refuse("bad_args", "side")
            state["side"] = a["side"]
            state["rank"] = a.get("tp_rank")
            state["version"] = a["version"]
            with self.lock:
                self.hellos.append(a)
            reply = {"version": a["version"], "node": "fake", "engine_id": (a.get("engine") or {}).get("engine_id", "fake-0"),
                     "role": (a.get("engine") or {}).get("role", "prefill"), "mode": self.mode, "dp_rank": 0,
                     "tp_size": 1, "transport": "none"}
            if a.get("load_events"):
                reply["load_events"] = list(self.load_event_handles)
            if self.client_steps and a["side"] == "scheduler":
                reply["client_steps"] = True
                reply["reads_at_admission"] = self.reads_at_admission
            return reply
        if state["side"] is None:
            raise Refuse("hello_required", "say hello first")
        if op == "ping":
            return {"node": "fake"}
        if op not in SCHEDULER_OPS | WORKER_OPS:
            raise Refuse("unknown_op", op)
        if (op in SCHEDULER_OPS) != (state["side"] == "scheduler"):
            raise Refuse("wrong_side", f"{op} on a {state['side']} connection")
        rank = state["rank"] or 0
        if op == "get_num_new_matched_tokens":
            return self.matched(a)
        if op == "update_state_after_alloc":
            return {}
        if op == "build_connector_meta":
            if "step" in a and a["step"] != self.steps + 1:
                raise Refuse("bad_args", f"step {a['step']}: the next step is {self.steps + 1}")
            self.steps += 1
            counts = {"loads": self.loads} if self.saves is None else {"loads": self.loads, "saves": self.saves}
            told = a.get("answered") or {}
            if "step" in a and told != counts:  # the client's handle names other counts: it binds nothing
                raise Refuse("bad_args", f"the client answered {told}, the node's are {counts}")
            head = {"engine": 7} if self.client_steps else {}
            meta = msgpack.packb({**head, "step": self.steps, **counts}, use_bin_type=True)
            self.metadata.add(meta)
            return {"metadata": meta, "op_errors": state.pop("op_errors", [])}
        if op == "request_finished":
            return self.finish(a)
        if op == "bind_connector_metadata":
            if a.get("metadata") not in self.metadata:
                raise Refuse("unknown_metadata", "not built here")
            return None
        if op == "start_load_kv":
            return {"loads": self.loads}
        if op == "wait_for_layer_load":
            return self.layer_load(a)
        if op in ("save_kv_layer",):
            return None
        if op == "wait_for_save":
            return {}
        if op == "fence_saves":
            return {}
        if op == "get_finished":
            base = {"done_sending": [], "done_receiving": [], "failed": {}, "block_ids_with_load_errors": [],
                    "op_errors": []}
            q = self.finished[rank]
            if q:
                base.update(q.popleft())
            base["op_errors"] = state.pop("op_errors", [])
            return base
        if op == "get_block_ids_with_load_errors":
            return {"block_ids": []}
        if op == "shutdown":
            return {}
        raise Refuse("internal", op)
