"""The reference engine's loop: scheduling, the forward pass over the shared-memory cache, and
the connector calls in vLLM's order, through the engine port.

Per step (as vLLM's scheduler and model runner do):
  scheduler: for each newly admitted request get_num_new_matched_tokens, allocate,
             update_state_after_alloc; then build_connector_meta for the step;
  workers:   bind_connector_metadata, start_load_kv, per layer [wait_for_layer_load], compute,
             save_kv_layer; wait_for_save; get_finished(ids finished last step);
  scheduler: sample, request_finished for requests that ended, then apply the workers'
             finished sets (a request counts once every TP rank has reported it).
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..port import NodeUnavailable, PortClient, PortError
from .cache import BlockPool, ShmKvCache
from .model import (Geometry, block_hashes, prefix_seeds, rank_slice, token_from_digest,
                    token_layer_kv)

log = logging.getLogger("kvferry.reference")


class Phase(Enum):
    WAITING = "waiting"
    WAITING_FOR_REMOTE_KV = "waiting_for_remote_kv"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Verification:
    """What D checked of the KV it received (per request)."""

    received_tokens: int = 0
    checked_bytes: int = 0
    mismatched_bytes: int = 0
    recomputed_blocks: int = 0
    first_mismatch: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"kv_verified": self.mismatched_bytes == 0, "received_tokens": self.received_tokens,
                "checked_bytes": self.checked_bytes, "mismatched_bytes": self.mismatched_bytes,
                "recomputed_blocks": self.recomputed_blocks, "first_mismatch": self.first_mismatch}


@dataclass
class Event:
    """What the engine tells the HTTP side about one request."""

    kind: str  # "token", "done", "error"
    token: int | None = None
    finish_reason: str | None = None
    kv_transfer_params: dict[str, Any] | None = None
    info: dict[str, Any] | None = None
    message: str | None = None


@dataclass(eq=False)
class Request:
    request_id: str
    prompt: list[int]
    max_tokens: int
    kv_transfer_params: dict[str, Any] | None
    events: "queue.Queue[Event]" = field(default_factory=queue.Queue)
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    phase: Phase = Phase.WAITING
    num_computed: int = 0
    prefix_hit_tokens: int = 0
    external_tokens: int = 0
    remote_ready: bool = False
    chunk: tuple[int, int] = (0, 0)
    seeds: list[bytes] = field(default_factory=list)
    digest: bytes | None = None
    hashed_blocks: int = 0
    verification: Verification | None = None
    load_error_blocks: set[int] = field(default_factory=set)
    node_knows: bool = False  # named to the node in get_num_new_matched_tokens

    @property
    def all_tokens(self) -> list[int]:
        return self.prompt + self.output


class Connector:
    """The engine's port connections: one scheduler client, one worker client per TP rank."""

    def __init__(self, socket_path: str, engine: dict[str, Any], caches: list[ShmKvCache],
                 geometry: Geometry, http_url: str | None):
        self.socket_path = socket_path
        self.workers = [
            PortClient(socket_path, "worker", engine=engine, tp_rank=c.rank,
                       geometry=geometry.port_geometry(), memory=c.port_memory())
            for c in caches
        ]
        self.scheduler = PortClient(socket_path, "scheduler", engine=engine, http_url=http_url)
        self.node_info: dict[str, Any] | None = None

    def connect(self, wait_s: float = 0.0) -> dict[str, Any]:
        # Workers first: the node answers scheduler ops only once every rank has said hello.
        for w in self.workers:
            w.reconnect(wait_s=wait_s)
        self.node_info = self.scheduler.reconnect(wait_s=wait_s)
        return self.node_info

    def close(self) -> None:
        for c in [self.scheduler, *self.workers]:
            c.close()

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                w.shutdown()
            except (NodeUnavailable, PortError):
                pass
        self.scheduler.close()


class ReferenceEngine:
    """One engine: its cache (one shm file per TP rank), its loop thread and, unless
    ``socket_path`` is None, its connector to a kvferry node."""

    def __init__(self, geometry: Geometry, *, role: str = "decode", mode: str = "write",
                 socket_path: str | None = None, engine_id: str | None = None,
                 max_num_batched_tokens: int = 256, prefix_caching: bool = True,
                 shm_dir: str = "/dev/shm", http_url: str | None = None):
        if role not in ("prefill", "decode"):
            raise ValueError(f"role must be prefill or decode, not {role!r}")
        if mode not in ("write", "read"):
            raise ValueError(f"mode must be write or read, not {mode!r}")
        self.geometry = geometry
        self.role = role
        self.mode = mode
        self.engine_id = engine_id
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pool = BlockPool(geometry.num_blocks, prefix_caching)
        tag = f"{engine_id or role}-{os.getpid()}-{id(self) & 0xffffff:x}"
        self.caches = [ShmKvCache(geometry, rank, os.path.join(shm_dir, f"kvferry-ref-{tag}-rank{rank}"))
                       for rank in range(geometry.tp_size)]
        self.connector: Connector | None = None
        if socket_path is not None:
            ident: dict[str, Any] = {"role": role, "mode": mode, "tp_size": geometry.tp_size}
            if engine_id:
                ident["engine_id"] = engine_id
            self.connector = Connector(socket_path, ident, self.caches, geometry, http_url)
        self.waiting: list[Request] = []
        self.waiting_for_remote: dict[str, Request] = {}
        self.running: list[Request] = []
        self.delayed_free: dict[str, Request] = {}
        self.by_id: dict[str, Request] = {}
        self._inbox: "queue.Queue[tuple[str, Any]]" = queue.Queue()
        self._finished_ids: list[str] = []
        self._rank_reports: dict[str, list[Any]] = {}
        self._load_error_blocks: set[int] = set()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._stats_lock = threading.Lock()
        self._counters = {"completed": 0, "aborted": 0, "failed": 0, "kv_verified": 0,
                          "kv_mismatched": 0, "op_errors": 0}
        self.node_down: str | None = None
        self._next_reconnect = 0.0
        self._stats: dict[str, Any] = {}
        self._publish_stats()

    # ---- lifecycle ----

    def connect(self, wait_s: float = 30.0) -> dict[str, Any] | None:
        if self.connector is None:
            return None
        info = self.connector.connect(wait_s=wait_s)
        self._publish_stats()  # the node's engine id, before anyone asks
        return info

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="reference-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
        if self.connector is not None:
            self.connector.shutdown()
        for c in self.caches:
            c.close()

    # ---- called from any thread ----

    def submit(self, request: Request) -> Request:
        self._inbox.put(("submit", request))
        return request

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    def stats(self) -> dict[str, Any]:
        with self._stats_lock:
            return dict(self._stats)

    # ---- the loop ----

    def _has_work(self) -> bool:
        return bool(self.waiting or self.running or self.waiting_for_remote or self.delayed_free)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._drain_inbox()
                if self.node_down is not None:
                    self._try_reconnect()
                elif self._has_work():
                    if not self.step():
                        time.sleep(0.002)  # nothing to compute: poll the node gently
            except NodeUnavailable as e:
                self._lost_node(str(e))
            except Exception:  # a bug: keep serving, but say so
                log.exception("reference engine step failed")
                time.sleep(0.1)
            self._publish_stats()

    def _drain_inbox(self) -> None:
        block = not self._has_work() and self.node_down is None
        try:
            item = self._inbox.get(timeout=0.05) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, value = item
            if kind == "submit":
                self._admit(value)
            else:
                self._abort(value)
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _admit(self, r: Request) -> None:
        if self.node_down is not None:
            r.events.put(Event("error", message=f"kvferry node unavailable: {self.node_down}"))
            return
        if r.request_id in self.by_id:
            r.events.put(Event("error", message=f"request id {r.request_id} is already in use"))
            return
        if self.geometry.blocks_for(len(r.prompt) + r.max_tokens) > self.geometry.num_blocks:
            r.events.put(Event("error", message=f"request {r.request_id} needs more blocks than the cache has"))
            return
        self.by_id[r.request_id] = r
        self.waiting.append(r)

    def _abort(self, request_id: str) -> None:
        r = self.by_id.get(request_id)
        if r is None or r.phase == Phase.FINISHED:
            return
        if r.phase == Phase.WAITING and not r.blocks:
            self.waiting.remove(r)
            if self.connector is not None:
                self._tell_node_aborted_before_scheduling(r)
            self._end(r, Event("done", finish_reason="abort", info=self._info(r)))
            self._counters["aborted"] += 1
            return
        self._finish(r, "aborted")

    # ---- one step ----

    def step(self) -> bool:
        """One engine step; true if it computed anything."""
        scheduled, new_reqs, cached_reqs = self._schedule()
        c = self.connector
        loads = [0] * self.geometry.tp_size
        finished_reports: list[dict[str, Any]] = []
        if c is not None:
            metadata = c.scheduler.build_connector_meta(new_reqs, cached_reqs, raise_op_errors=False)
            self._log_op_errors(c.scheduler.last_op_errors)
            for w in c.workers:
                w.bind_connector_metadata(metadata)
            loads = [w.start_load_kv() for w in c.workers]
        if scheduled:
            self._forward(scheduled, loads)
        if c is not None:
            for w in c.workers:
                w.wait_for_save()
            finished_ids, self._finished_ids = self._finished_ids, []
            for w in c.workers:
                finished_reports.append(w.get_finished(finished_ids, raise_op_errors=False))
        self._sample(scheduled)
        for rank, f in enumerate(finished_reports):
            self._apply_finished(f, rank)
        return bool(scheduled)

    def _schedule(self) -> tuple[list[Request], list[dict], list[dict]]:
        g = self.geometry
        budget = self.max_num_batched_tokens
        scheduled: list[Request] = []
        new_reqs: list[dict] = []
        cached_reqs: list[dict] = []
        for r in self.running:
            if budget <= 0:
                break
            total = len(r.all_tokens)
            n_new = min(total - r.num_computed, budget)
            need = g.blocks_for(r.num_computed + n_new) - len(r.blocks)
            added = self.pool.allocate(max(need, 0))
            if added is None:
                continue  # no preemption here: it waits until blocks come back
            r.blocks += added
            r.chunk = (r.num_computed, r.num_computed + n_new)
            budget -= n_new
            cached_reqs.append({"request_id": r.request_id, "new_block_ids": added or None,
                                "num_computed_tokens": r.chunk[1]})
            scheduled.append(r)
        while self.waiting and budget > 0:
            r = self.waiting[0]
            n = len(r.prompt)
            if r.remote_ready:
                # Its KV came from the peer; compute what is left of the prompt (the last token).
                n_new = min(n - r.num_computed, budget)
                need = g.blocks_for(r.num_computed + n_new) - len(r.blocks)
                added = self.pool.allocate(max(need, 0))
                if added is None:
                    break
                r.blocks += added
                if self.connector is not None:
                    # vLLM calls it a second time once the load is in, with no external tokens.
                    self.connector.scheduler.update_state_after_alloc(r.request_id, added, 0)
            else:
                hashes = block_hashes(r.prompt, g.block_size)[: (n - 1) // g.block_size]
                hit = self.pool.lookup(hashes)
                hit_tokens = len(hit) * g.block_size
                hit_free = sum(1 for b in hit if self.pool.refcount[b] == 0)
                if self.pool.free_count - hit_free < g.blocks_for(n) - len(hit):
                    break  # not enough blocks for its prompt yet
                count, is_async = 0, False
                if self.connector is not None:
                    try:
                        count, is_async = self.connector.scheduler.get_num_new_matched_tokens(
                            r.request_id, n, r.kv_transfer_params, hit_tokens)
                        r.node_knows = True
                    except PortError as e:  # this request's params, not the engine: refuse it
                        self.waiting.pop(0)
                        self._refuse(r, e)
                        continue
                self.pool.touch(hit)
                r.prefix_hit_tokens = hit_tokens
                r.num_computed = hit_tokens
                r.hashed_blocks = len(hit)
                if is_async and count > 0:
                    # Blocks for the whole prompt, as the node expects (and as vLLM allocates when
                    # the connector counts every prompt token): with READ's count of n-1-c and
                    # blocks for only c+count tokens, D is one block short whenever n-1 is a
                    # multiple of the block size, and the node maps D's blocks onto the tail of
                    # P's list (the wrong block). Reported as a port issue.
                    added = self.pool.allocate(g.blocks_for(n) - len(hit))
                    assert added is not None  # checked above
                    r.blocks = hit + added
                    r.external_tokens = count
                    self.connector.scheduler.update_state_after_alloc(r.request_id, added, count)
                    self.waiting.pop(0)
                    r.phase = Phase.WAITING_FOR_REMOTE_KV
                    self.waiting_for_remote[r.request_id] = r
                    continue
                if count > 0:
                    log.warning("request %s: the node offered %d tokens to load synchronously; "
                                "the reference engine computes them instead", r.request_id, count)
                n_new = min(n - hit_tokens, budget)
                added = self.pool.allocate(g.blocks_for(hit_tokens + n_new) - len(hit))
                assert added is not None
                r.blocks = hit + added
                if self.connector is not None:
                    self.connector.scheduler.update_state_after_alloc(r.request_id, list(r.blocks), 0)
            self.waiting.pop(0)
            r.phase = Phase.RUNNING
            r.chunk = (r.num_computed, r.num_computed + n_new)
            budget -= n_new
            new_reqs.append({"request_id": r.request_id, "block_ids": list(r.blocks),
                             "num_computed_tokens": r.chunk[1]})
            self.running.append(r)
            scheduled.append(r)
        return scheduled, new_reqs, cached_reqs

    def _forward(self, scheduled: list[Request], loads: list[int]) -> None:
        g = self.geometry
        work = []
        for r in scheduled:
            tokens = r.all_tokens
            prefix_seeds(tokens[: r.chunk[1]], r.seeds)
            work.append((r, range(r.chunk[0], r.chunk[1])))
        c = self.connector
        for layer in range(g.layers):
            kv = {(id(r), t): token_layer_kv(r.seeds[t], layer, g) for r, ts in work for t in ts}
            for rank, cache in enumerate(self.caches):
                if c is not None and loads[rank] > 0:
                    # A failed layer's blocks come back in get_finished; nothing to do here.
                    # (Host memory: answered once the layer landed. A GPU engine's client with
                    # load events would make its current stream wait on the node's event.)
                    c.workers[rank].wait_for_layer_load(layer)
                for r, ts in work:
                    for t in ts:
                        full = kv[(id(r), t)]
                        block, slot = r.blocks[t // g.block_size], t % g.block_size
                        for region in range(g.regions):
                            cache.write(layer, region, block, slot, rank_slice(full, region, rank, g))
                if c is not None:
                    c.workers[rank].save_kv_layer(layer)

    def _position_bytes(self, r: Request, t: int) -> bytes:
        """Every layer's KV of position t as held in the cache, in an order independent of TP."""
        g = self.geometry
        block, slot = r.blocks[t // g.block_size], t % g.block_size
        ranks = self.caches[:1] if g.mla else self.caches
        parts = []
        for layer in range(g.layers):
            for region in range(g.regions):
                for cache in ranks:
                    parts.append(cache.read(layer, region, block, slot))
        return b"".join(parts)

    def _sample(self, scheduled: list[Request]) -> None:
        for r in scheduled:
            if r.phase != Phase.RUNNING:
                continue  # aborted meanwhile
            r.num_computed = r.chunk[1]
            self._cache_full_blocks(r)
            if r.num_computed < len(r.all_tokens):
                continue  # a chunk of a longer prompt
            if r.digest is None:
                h = hashlib.blake2b(digest_size=32)
                for t in range(r.num_computed):
                    h.update(self._position_bytes(r, t))
                r.digest = h.digest()
            else:
                r.digest = hashlib.blake2b(r.digest + self._position_bytes(r, r.num_computed - 1),
                                           digest_size=32).digest()
            token = token_from_digest(r.digest)
            r.output.append(token)
            r.events.put(Event("token", token=token))
            if len(r.output) >= r.max_tokens:
                self._finish(r, "length_capped")

    def _cache_full_blocks(self, r: Request) -> None:
        g = self.geometry
        full = min(r.num_computed, len(r.prompt)) // g.block_size
        if full <= r.hashed_blocks:
            return
        hashes = block_hashes(r.prompt[: full * g.block_size], g.block_size)
        for i in range(r.hashed_blocks, full):
            self.pool.cache_block(r.blocks[i], hashes[i])
        r.hashed_blocks = full

    def _finish(self, r: Request, status: str) -> None:
        """request_finished, then free now or once every rank reports the transfer over."""
        delay, params = False, None
        if self.connector is not None:
            try:
                delay, params = self.connector.scheduler.request_finished(r.request_id, list(r.blocks), status)
            except PortError as e:  # the node holds nothing for it: free now
                log.warning("request_finished(%s) refused: %s", r.request_id, e)
            log.info("request_finished(%s, %d blocks, %s) in phase %s: delay_free=%s", r.request_id,
                     len(r.blocks), status, r.phase.value, delay)
        if r in self.running:
            self.running.remove(r)
        if r in self.waiting:
            self.waiting.remove(r)
        self.waiting_for_remote.pop(r.request_id, None)
        if delay:
            self.delayed_free[r.request_id] = r
        else:
            self.pool.free(r.blocks)
        self._finished_ids.append(r.request_id)
        reason = "abort" if status == "aborted" else ("length" if status == "length_capped" else "stop")
        self._counters["aborted" if status == "aborted" else "completed"] += 1
        self._end(r, Event("done", finish_reason=reason, kv_transfer_params=params, info=self._info(r)),
                  keep=delay)

    def _end(self, r: Request, event: Event, keep: bool = False) -> None:
        r.phase = Phase.FINISHED
        if not keep:
            self.by_id.pop(r.request_id, None)
        r.events.put(event)

    def _tell_node_aborted_before_scheduling(self, r: Request) -> None:
        """request_finished(r, [], "aborted") so the node tells P to free. The port's
        request_finished carries no kv_transfer_params and the node only knows requests named in
        get_num_new_matched_tokens, so a request aborted before its first scheduling is named
        there first (vLLM calls request_finished alone here; reported as a port issue)."""
        sched = self.connector.scheduler  # type: ignore[union-attr]
        try:
            if not r.node_knows:
                sched.get_num_new_matched_tokens(r.request_id, len(r.prompt), r.kv_transfer_params, 0)
                r.node_knows = True
            sched.request_finished(r.request_id, [], "aborted")
        except PortError as e:
            log.warning("request %s aborted before scheduling; the node refused: %s", r.request_id, e)

    def _refuse(self, r: Request, e: PortError) -> None:
        """The node refused a scheduler op for this request (bad params, unknown request): the
        request ends with the node's message; it holds no blocks yet."""
        log.warning("request %s refused by the node: %s", r.request_id, e)
        self._counters["failed"] += 1
        try:
            self.connector.scheduler.request_finished(r.request_id, [], "aborted")  # type: ignore[union-attr]
        except PortError:
            pass  # the node never took it
        self._end(r, Event("error", message=f"request {r.request_id}: {e}", info={"code": e.code}))

    def _fail(self, r: Request, why: str) -> None:
        """Ends a request the node reported failed: its blocks are no longer lent."""
        self.waiting_for_remote.pop(r.request_id, None)
        if r in self.running:
            self.running.remove(r)
        if r in self.waiting:
            self.waiting.remove(r)
        self.pool.free(r.blocks)
        self._counters["failed"] += 1
        if self.connector is not None and r.phase != Phase.FINISHED:
            try:
                self.connector.scheduler.request_finished(r.request_id, [], "aborted")
            except PortError as e:  # the node may have forgotten it already
                log.info("request_finished after failure of %s: %s", r.request_id, e)
        self._end(r, Event("error", message=f"request {r.request_id}: KV transfer failed: {why}"))

    def _info(self, r: Request) -> dict[str, Any]:
        info: dict[str, Any] = {"request_id": r.request_id, "prefix_hit_tokens": r.prefix_hit_tokens,
                                "prompt_tokens": len(r.prompt)}
        if r.verification is not None:
            info.update(r.verification.as_dict())
        else:
            info["kv_verified"] = None
        return info

    # ---- the workers' finished sets ----

    def _log_op_errors(self, op_errors: list[dict[str, Any]]) -> None:
        for e in op_errors:
            self._counters["op_errors"] += 1
            log.error("kvferry node refused one-way op %s: %s: %s", e.get("op"), e.get("code"), e.get("message"))

    def _apply_finished(self, f: dict[str, Any], rank: int) -> None:
        self._log_op_errors(f["op_errors"])
        self._load_error_blocks.update(f["block_ids_with_load_errors"])
        for rid in f["done_sending"]:
            self._rank_report(rid, None, rank)
        for rid, why in f["failed"].items():
            self._rank_report(rid, str(why), rank)
        for rid in f["done_receiving"]:
            self._rank_report(rid, None, rank)

    def _rank_report(self, rid: str, failure: str | None, rank: int) -> None:
        # Counted per rank: a worker may report a request twice (done, then the abort that came
        # after it), and that must not stand for another rank whose copies may still land.
        entry = self._rank_reports.setdefault(rid, [set(), None])
        entry[0].add(rank)
        if entry[1] is None:
            entry[1] = failure
        if len(entry[0]) < self.geometry.tp_size:
            return
        del self._rank_reports[rid]
        failure = entry[1]
        log.info("every rank reported %s over%s", rid, f" (failed: {failure})" if failure else "")
        r = self.delayed_free.pop(rid, None)
        if r is not None:
            self.pool.free(r.blocks)
            self.by_id.pop(rid, None)
            return
        r = self.waiting_for_remote.get(rid)
        if r is None:
            log.debug("finished report for %s, which is not waiting for anything", rid)
            return
        if failure is not None:
            self._fail(r, failure)
            return
        self.waiting_for_remote.pop(rid)
        self._received(r)

    def _received(self, r: Request) -> None:
        """D: the KV is in. Recompute blocks that failed to load, verify the rest, and queue the
        request to compute what is left of its prompt."""
        g = self.geometry
        start, end = r.prefix_hit_tokens, r.prefix_hit_tokens + r.external_tokens
        bad_blocks = {b for b in r.blocks if b in self._load_error_blocks}
        self._load_error_blocks -= bad_blocks
        v = Verification(received_tokens=r.external_tokens, recomputed_blocks=len(bad_blocks))
        seeds = prefix_seeds(r.prompt[:end], r.seeds)
        for t in range(start, end):
            block, slot = r.blocks[t // g.block_size], t % g.block_size
            recompute = block in bad_blocks
            for layer in range(g.layers):
                full = token_layer_kv(seeds[t], layer, g)
                for rank, cache in enumerate(self.caches):
                    for region in range(g.regions):
                        want = rank_slice(full, region, rank, g)
                        if recompute:
                            cache.write(layer, region, block, slot, want)
                            continue
                        got = cache.read(layer, region, block, slot)
                        v.checked_bytes += len(want)
                        if got != want:
                            bad = sum(1 for a, b in zip(bytes(got), want) if a != b)
                            v.mismatched_bytes += bad
                            if v.first_mismatch is None:
                                v.first_mismatch = (f"token {t} layer {layer} rank {rank} region {region} "
                                                    f"(block {block} slot {slot}): {bad} bytes differ")
        r.verification = v
        self._counters["kv_verified" if v.mismatched_bytes == 0 else "kv_mismatched"] += 1
        # vLLM computes at least the last prompt token itself.
        r.num_computed = min(end, len(r.prompt) - 1)
        self._cache_full_blocks(r)
        r.remote_ready = True
        r.phase = Phase.WAITING
        self.waiting.insert(0, r)

    # ---- the node ----

    def _lost_node(self, why: str) -> None:
        """The node died: every request that went through it fails; the engine frees its own
        blocks (no copy can be in flight from a dead node) and reconnects at its next steps."""
        log.error("kvferry node lost: %s", why)
        self.node_down = why
        pending = {id(r): r for r in [*self.waiting, *self.running, *self.waiting_for_remote.values(),
                                      *self.delayed_free.values()]}
        for r in pending.values():
            if r.blocks:
                self.pool.free(r.blocks)
            if r.phase != Phase.FINISHED:
                self._counters["failed"] += 1
                r.events.put(Event("error", message=f"request {r.request_id}: kvferry node unavailable: {why}"))
            r.phase = Phase.FINISHED
        self.waiting.clear()
        self.running.clear()
        self.waiting_for_remote.clear()
        self.delayed_free.clear()
        self.by_id.clear()
        self._rank_reports.clear()
        self._finished_ids.clear()
        self._load_error_blocks.clear()
        if self.connector is not None:
            self.connector.close()

    def _try_reconnect(self) -> None:
        now = time.monotonic()
        if now < self._next_reconnect or self.connector is None:
            time.sleep(0.01)
            return
        self._next_reconnect = now + 0.5
        try:
            self.connector.connect()
        except (NodeUnavailable, PortError) as e:
            log.debug("kvferry node still unavailable: %s", e)
            self.connector.close()
            return
        log.info("kvferry node is back")
        self.node_down = None

    def _publish_stats(self) -> None:
        s = {
            "num_blocks": self.pool.num_blocks,
            "free_blocks": self.pool.free_count,
            "running": len(self.running) + len(self.waiting_for_remote),
            "waiting": len(self.waiting),
            "waiting_for_remote_kv": len(self.waiting_for_remote),
            "delayed_free": len(self.delayed_free),
            "role": self.role,
            "mode": self.mode,
            "engine_id": (self.connector.node_info or {}).get("engine_id", self.engine_id)
            if self.connector is not None else self.engine_id,
            "tp_size": self.geometry.tp_size,
            "connector": self.connector is not None,
            "node_down": self.node_down,
            # Ops the scheduler's client answered itself, by op (the node checked each).
            "local_answers": dict(self.connector.scheduler.local_answer_counts)
            if self.connector is not None else {},
            **self._counters,
        }
        with self._stats_lock:
            self._stats = s
