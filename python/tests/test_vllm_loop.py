"""vLLM's connector under a scheduler that keeps vLLM's rules: requests through a P and a D node
(JVMs from the jar), chunked prefill, some aborted on P mid-prefill, some on D while their KV is
on its way and some after it came, WRITE and READ. ``MiniVllm`` is vLLM v1's scheduler as far as
a connector sees it: its block pool, the order of the connector's calls in a step, and the
assertions vLLM makes on what the connector reports (every reported id is a request it holds; a
received one waits for its KV or is finished). At the end every block of both engines is free,
and D's KV of every request that came through equals what P computed, token by token."""

from __future__ import annotations

import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch", reason="the KV caches here are torch tensors (Debian: python3-torch)")

from kvferry import vllm as kv  # noqa: E402

from .cluster import Node, get, needs_node  # noqa: E402
from .test_vllm_adapter import (  # noqa: E402
    CachedRequestData, KVCacheBlocks, KVConnectorOutput, NewRequestData, Request, RequestStatus, SchedulerOutput,
    config)

LAYERS, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 2, 96, 16, 2, 8
CHUNK = 32  # prompt tokens a request computes per step (chunked prefill)
WAITING, RUNNING = RequestStatus.WAITING, RequestStatus.RUNNING
REMOTE = RequestStatus.WAITING_FOR_REMOTE_KVS


def kv_value(index: int, layer: int, position: int) -> float:
    """What an engine's attention writes for one token: small integers, exact in float16."""
    return float((index * 37 + layer * 11 + position) % 1000)


@dataclass
class Req:
    index: int
    req: Request
    max_tokens: int
    blocks: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV is in the cache
    outputs: int = 0
    asked: bool = False
    external: int = 0  # tokens the connector loads
    load_failed: bool = False
    loaded: bool = False  # D: its KV came through kvferry


class MiniVllm:
    """One engine: vLLM's scheduler and one worker, both sides of a KvferryConnector."""

    def __init__(self, node: Node, kv_role: str, mode: str, tag: str, layout: str = "standard"):
        self.caches, self.paths = {}, []
        self.blocks_first = layout == "blocks_first"  # FlashInfer's [N, 2, ...], not [2, N, ...]
        shape = ((BLOCKS, 2) if self.blocks_first else (2, BLOCKS)) + (BLOCK_SIZE, KV_HEADS, HEAD_DIM)
        for i in range(LAYERS):
            path = f"/dev/shm/kvferry-vllm-loop-{os.getpid()}-{tag}-{i}-{time.monotonic_ns()}"
            self.paths.append(path)
            self.caches[f"model.layers.{i}.self_attn.attn"] = kv.shm_tensor(shape, torch.float16, path)
        self.sched = kv.KvferryConnector(config(node.socket, kv_role, mode=mode), kv.KVConnectorRole.SCHEDULER)
        self.worker = kv.KvferryConnector(config(node.socket, kv_role, mode=mode), kv.KVConnectorRole.WORKER)
        self.worker.register_kv_caches(self.caches)
        self.free = list(range(BLOCKS))
        self.requests: dict[str, Req] = {}
        self.waiting: list[Req] = []
        self.running: list[Req] = []
        self.recv_done: set[str] = set()  # vLLM's finished_recving_kv_req_ids
        self.finished_last_step: set[str] = set()
        self.invalid: set[int] = set()
        self.params: dict[str, dict | None] = {}  # request_finished's params, for the router
        self.preempted: set[str] = set()  # preempted since the last step: its scheduler output says so
        self.held: set[str] = set()  # preempted requests not scheduled again yet (memory pressure)
        self.failed_loads: set[str] = set()  # requests whose load failed: vLLM recomputed them
        self.prompt_passes: dict[str, int] = {}  # times a request's prompt was computed to its end
        self.ended: dict[str, RequestStatus] = {}  # how each request finished

    def close(self) -> None:
        for c in (self.worker, self.sched):
            c.shutdown()
        for p in self.paths:
            os.unlink(p)

    def slot(self, tensor, region: int, block: int, slot: int):
        """One token's K (region 0) or V (region 1) heads in a layer's cache."""
        return tensor[block, region, slot] if self.blocks_first else tensor[region, block, slot]

    def add(self, r: Req) -> None:
        self.requests[r.req.request_id] = r
        self.waiting.append(r)

    def _alloc(self, r: Req, tokens: int) -> list[int]:
        need = -(-tokens // BLOCK_SIZE) - len(r.blocks)
        assert need <= len(self.free), "out of blocks: a test of more requests than the pool holds"
        added, self.free = self.free[:max(0, need)], self.free[max(0, need):]
        r.blocks += added
        return added

    def _free_request(self, r: Req) -> None:
        """vLLM's _free_request: the connector may keep the blocks until it reports them."""
        rid = r.req.request_id
        self.ended[rid] = r.req.status
        self.finished_last_step.add(rid)
        delay, params = self.sched.request_finished(r.req, list(r.blocks))
        self.params[rid] = params
        if not delay:
            self._free_blocks(r)

    def _free_blocks(self, r: Req) -> None:
        self.free += r.blocks
        r.blocks = []
        del self.requests[r.req.request_id]

    def abort(self, rid: str) -> None:
        r = self.requests.get(rid)
        if r is None or r.req.status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_LENGTH_CAPPED):
            return
        for queue in (self.waiting, self.running):
            if r in queue:
                queue.remove(r)
        r.req.status = RequestStatus.FINISHED_ABORTED
        self._free_request(r)

    def preempt(self, rid: str) -> list[int]:
        """vLLM's _preempt_request: the blocks go back to the pool at once (no connector call),
        and the request waits to be computed again from its first token. Returns its old blocks."""
        r = self.requests[rid]
        self.running.remove(r)
        old, r.blocks = r.blocks, []
        self.free += old
        r.computed, r.asked = 0, False
        r.req.status = RequestStatus.PREEMPTED
        self.waiting.insert(0, r)
        self.preempted.add(rid)
        self.held.add(rid)
        return old

    def step(self, on_ready=None, on_fenced=None) -> None:
        new, cached, scheduled = [], CachedRequestData(), {}
        for r in self.running:  # the next chunk, or one decode token
            prompt = len(r.req.prompt_token_ids)
            tokens = min(CHUNK, prompt - r.computed) if r.computed < prompt else 1
            added = self._alloc(r, r.computed + tokens)
            cached.req_ids.append(r.req.request_id)
            cached.new_block_ids.append((added,) if added else None)
            cached.num_computed_tokens.append(r.computed)
            scheduled[r.req.request_id] = tokens
        for r in list(self.waiting):
            rid, prompt = r.req.request_id, len(r.req.prompt_token_ids)
            if rid in self.held:
                continue
            if r.req.status == REMOTE:
                if rid not in self.recv_done:
                    continue
                self.recv_done.discard(rid)
                if r.load_failed:
                    r.computed = 0  # vLLM recomputes what did not load
                    self.failed_loads.add(rid)
                else:
                    r.computed, r.loaded = min(r.external, prompt - 1), True
                    if on_ready is not None:
                        on_ready(r, self)
                r.req.status = WAITING
            if not r.asked:
                r.asked = True
                count, is_async = self.sched.get_num_new_matched_tokens(r.req, 0)
                if is_async:
                    self._alloc(r, count)
                    self.sched.update_state_after_alloc(r.req, KVCacheBlocks(list(r.blocks)), count)
                    r.external, r.req.status = count, REMOTE
                    continue
            tokens = min(CHUNK, prompt - r.computed)
            self._alloc(r, r.computed + tokens)
            self.sched.update_state_after_alloc(r.req, KVCacheBlocks(list(r.blocks)), 0)
            new.append(NewRequestData(rid, (list(r.blocks),), r.computed))
            scheduled[rid] = tokens
            self.waiting.remove(r)
            self.running.append(r)
            r.req.status = RUNNING
        finished = self.finished_last_step
        self.finished_last_step = set()
        preempted, self.preempted = self.preempted, set()
        meta = self.sched.build_connector_meta(SchedulerOutput(new, cached, scheduled, finished, preempted))

        # The worker (vLLM's pre_forward): bind, let saves of preempted requests stop reading
        # their blocks, start loads; then the forward writes each layer's KV and saves it.
        w = self.worker
        w.bind_connector_metadata(meta)
        w.handle_preemptions(meta)
        if on_fenced is not None:
            on_fenced(self)  # from here vLLM may write anything into the preempted blocks
        w.start_load_kv(None)
        for layer, (name, tensor) in enumerate(self.caches.items()):
            w.wait_for_layer_load(name)
            for rid, tokens in scheduled.items():
                r = self.requests[rid]
                for pos in range(r.computed, r.computed + tokens):
                    value = kv_value(r.index, layer, pos)
                    block, slot = r.blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
                    self.slot(tensor, 0, block, slot).fill_(value)
                    self.slot(tensor, 1, block, slot).fill_(-value)
            w.save_kv_layer(name, tensor, None)
        w.wait_for_save()
        sending, recving = w.get_finished(finished)
        self.invalid |= w.get_block_ids_with_load_errors()
        w.clear_connector_metadata()

        # vLLM's update_from_output: tokens computed, requests finished, then the KV reports.
        for rid, tokens in scheduled.items():
            r = self.requests[rid]
            prompt = len(r.req.prompt_token_ids)
            r.computed += tokens
            if r.computed >= prompt:
                if r.computed - tokens < prompt:
                    self.prompt_passes[rid] = self.prompt_passes.get(rid, 0) + 1
                r.outputs += 1
                if r.outputs >= r.max_tokens:
                    self.running.remove(r)
                    r.req.status = RequestStatus.FINISHED_LENGTH_CAPPED
                    self._free_request(r)
        for r in self.requests.values():  # loads that failed: their blocks are computed again
            if r.req.status == REMOTE and self.invalid & set(r.blocks):
                r.load_failed = True
        self.invalid.clear()
        out = KVConnectorOutput(set(sending or ()), set(recving or ()))
        self.sched.update_connector_output(out)
        for rid in out.finished_recving or ():
            assert rid in self.requests, f"finished_recving of {rid}, which vLLM no longer holds"
            r = self.requests[rid]
            if r.req.status == REMOTE:
                self.recv_done.add(rid)
            else:
                assert r.req.status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_LENGTH_CAPPED), \
                    f"finished_recving of {rid} in {r.req.status}"
                self._free_blocks(r)
        for rid in out.finished_sending or ():
            assert rid in self.requests, f"finished_sending of {rid}, which vLLM no longer holds"
            r = self.requests[rid]
            assert r.req.status in (RequestStatus.FINISHED_ABORTED, RequestStatus.FINISHED_LENGTH_CAPPED), \
                f"finished_sending of {rid} in {r.req.status}"  # vLLM's _free_blocks asserts it finished
            self._free_blocks(r)


@contextmanager
def vllm_pair(tmp_path, mode: str, p_layout: str = "standard", d_layout: str = "standard"):
    """A P and a D node (cma) and a MiniVllm on each; on a clean exit every block of both is free
    and neither connector saw the node refuse an op."""
    # Timers of ten minutes: whatever frees a block within a test's deadline is kvferry acting on
    # aborts and preemptions, not a timeout (P held an aborted request's blocks for its defer or
    # read-abort timeout when D ended the receive before P was listed on D).
    timers = {f"kvferry.connector.{t}": "10m" for t in ("defer-timeout", "transfer-timeout", "read-abort-timeout")}
    p_node = Node(str(tmp_path), "prefill", engine_id="p0", modes=mode, config=timers,
                  extra_args=["--transport", "cma"])
    d_node = Node(str(tmp_path), "decode", engine_id="d0", modes=mode, seed_port=p_node.port, config=timers,
                  extra_args=["--transport", "cma"])
    p = d = None
    try:
        p_node.wait_ready()
        d_node.wait_ready()
        p = MiniVllm(p_node, "kv_producer", mode, "p", p_layout)
        d = MiniVllm(d_node, "kv_consumer", mode, "d", d_layout)
        yield p_node, d_node, p, d
        assert sorted(p.free) == list(range(BLOCKS)) and sorted(d.free) == list(range(BLOCKS))
        for engine in (p, d):
            assert list(engine.sched.connector_scheduler.op_errors) == []
            assert list(engine.worker.connector_worker.op_errors) == []
    finally:
        for engine in (d, p):
            if engine is not None:
                engine.close()
        for node in (d_node, p_node):
            node.stop()


@pytest.mark.node
@needs_node
@pytest.mark.parametrize("mode,p_layout,d_layout", [
    ("write", "standard", "standard"),
    ("read", "standard", "standard"),
    ("write", "standard", "blocks_first"),  # FlashInfer's layout on D only: token ranges map them
    ("read", "blocks_first", "blocks_first"),  # on both: whole blocks
])
def test_vllms_rules_hold_through_chunked_prefill_aborts_and_both_modes(tmp_path, mode, p_layout, d_layout):
    with vllm_pair(tmp_path, mode, p_layout, d_layout) as (p_node, d_node, p, d):
        n_requests = 12
        prompts = {f"r{i}": [100 + i] * (40 + 23 * i % 90) for i in range(n_requests)}
        abort_on_p = {"r3": 1, "r8": 1}  # after that many P steps with the request in it
        abort_on_d_loading = {"r5"}  # while its KV is on its way
        abort_on_d_after = {"r10"}  # once its KV came
        checked: dict[str, int] = {}

        def check_kv(r: Req, engine: MiniVllm) -> None:
            """D's cache at the moment vLLM would run over it: P's KV, token by token."""
            moved = min(r.external, len(r.req.prompt_token_ids) - 1)
            for layer, tensor in enumerate(engine.caches.values()):
                for pos in range(moved):
                    block, slot = r.blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
                    want = kv_value(r.index, layer, pos)
                    assert engine.slot(tensor, 0, block, slot).eq(want).all() \
                        and engine.slot(tensor, 1, block, slot).eq(-want).all(), \
                        (r.req.request_id, layer, pos)
            checked[r.req.request_id] = moved

        def p_params(rid):
            return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": f"x-{rid}",
                    "remote_engine_id": "d0"}

        def d_params(rid):
            return {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": f"x-{rid}",
                    "remote_engine_id": "p0"}

        def admit_d(i, rid, params):
            d.add(Req(i, Request(rid, prompts[rid], params), max_tokens=3))

        for i, rid in enumerate(prompts):
            if mode == "write":  # the router: D first, it names its blocks to P
                admit_d(i, rid, d_params(rid))
            p.add(Req(i, Request(rid, prompts[rid], p_params(rid)), max_tokens=1))
        handed: set[str] = set()
        p_steps: dict[str, int] = {}
        deadline = time.monotonic() + 60
        while (p.requests or d.requests or len(handed) < n_requests) and time.monotonic() < deadline:
            for rid in list(abort_on_p):
                if rid in p.requests and p.requests[rid].req.status == RUNNING:
                    p_steps[rid] = p_steps.get(rid, 0) + 1
                    if p_steps[rid] > abort_on_p[rid]:
                        p.abort(rid)
                        del abort_on_p[rid]
            p.step()
            for rid, params in p.params.items():  # READ: the router hands P's params to D
                if rid not in handed:
                    handed.add(rid)
                    if mode == "read" and params:
                        admit_d(int(rid[1:]), rid, params)
            for rid in abort_on_d_loading:
                r = d.requests.get(rid)
                if r is not None and r.req.status == REMOTE:
                    d.abort(rid)
            for rid in abort_on_d_after:
                r = d.requests.get(rid)
                if r is not None and r.loaded:
                    d.abort(rid)
            d.step(on_ready=check_kv)
        assert not p.requests and not d.requests, (
            {k: (v.req.status, v.computed) for k, v in p.requests.items()},
            {k: (v.req.status, v.computed) for k, v in d.requests.items()},
            get(p_node.management_url, "/kvferry/transfers"), get(d_node.management_url, "/kvferry/transfers"))
        # Every request neither side aborted came through kvferry, its KV checked at D.
        came = set(prompts) - {"r3", "r8", "r5", "r10"}
        assert came <= set(checked), (sorted(came - set(checked)), p_node.tail(), d_node.tail())


@pytest.mark.node
@needs_node
def test_a_request_preempted_after_its_save_copies_nothing_from_its_reused_blocks(tmp_path):
    """P saved a request's last chunk and its node waits for D's blocks (D admits it late); vLLM
    then preempts it on P, frees its blocks at once and writes other KV into them. P's node must
    not copy those bytes to D as the request's KV: D's load fails and D computes the prompt."""
    with vllm_pair(tmp_path, "write") as (p_node, d_node, p, d):
        prompt = [7] * 70  # three chunks
        tid = {"transfer_id": "x-r0"}
        p.add(Req(0, Request("r0", prompt, {"do_remote_decode": True, "do_remote_prefill": False,
                                            "remote_engine_id": "d0", **tid}), max_tokens=2))
        while p.requests["r0"].computed < len(prompt):
            p.step()  # its last chunk is saved: P's node holds it for D's blocks
        old = p.preempt("r0")

        def reuse(engine: MiniVllm) -> None:
            for tensor in engine.caches.values():
                for b in old:
                    tensor[:, b].fill_(-4321.0)  # another request's KV

        p.step(on_fenced=reuse)
        checked: list[str] = []

        def check_kv(r: Req, engine: MiniVllm) -> None:
            for layer, tensor in enumerate(engine.caches.values()):
                for pos in range(min(r.external, len(prompt) - 1)):
                    block, slot = r.blocks[pos // BLOCK_SIZE], pos % BLOCK_SIZE
                    want = kv_value(r.index, layer, pos)
                    assert engine.slot(tensor, 0, block, slot).eq(want).all(), \
                        f"D loaded bytes P's engine had reused (layer {layer}, token {pos})"
            checked.append(r.req.request_id)

        d.add(Req(0, Request("r0", prompt, {"do_remote_prefill": True, "do_remote_decode": False,
                                            "remote_engine_id": "p0", **tid}), max_tokens=3))
        deadline = time.monotonic() + 60
        while (p.requests or d.requests) and time.monotonic() < deadline:
            if "r0" in d.requests and d.requests["r0"].req.status != REMOTE:
                p.held.discard("r0")  # memory again: P computes it anew
            p.step()
            d.step(on_ready=check_kv)
        assert not p.requests and not d.requests, (
            get(p_node.management_url, "/kvferry/transfers"), get(d_node.management_url, "/kvferry/transfers"))
        assert checked == [] and d.failed_loads == {"r0"}, (checked, d.failed_loads)
        # P computed the prompt again once resumed, and the request finished as any other.
        assert p.prompt_passes["r0"] == 2 and p.ended["r0"] == RequestStatus.FINISHED_LENGTH_CAPPED, \
            (p.prompt_passes, p.ended)
