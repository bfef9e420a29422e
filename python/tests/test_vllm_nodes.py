"""vLLM's connector (kvferry.vllm) on both sides of a real transfer: a P and a D node (JVMs from
the jar), each driven by a scheduler-side and a worker-side KvferryConnector in vLLM's call order
(the stand-ins for vLLM's objects are test_vllm_adapter's), KV moved in WRITE and READ mode and
checked at D byte for byte. Host memory (shm tensors, cma) runs everywhere; GPU memory (CUDA IPC
handles and events, the nodes on --transport cuda) where CUDA is, else skipped with the reason."""

from __future__ import annotations

import os
import time

import pytest

torch = pytest.importorskip("torch", reason="the KV caches here are torch tensors (Debian: python3-torch)")

from kvferry import vllm as kv  # noqa: E402

from .cluster import Node, needs_node  # noqa: E402
from .test_vllm_adapter import (  # noqa: E402
    CachedRequestData, KVCacheBlocks, KVConnectorOutput, NewRequestData, Request, RequestStatus, SchedulerOutput,
    config)

LAYERS, BLOCKS, BLOCK_SIZE, KV_HEADS, HEAD_DIM = 3, 16, 16, 2, 8


def caches(kind: str, tag: str, layout: str = "standard") -> tuple[dict, list[str]]:
    """One KV cache tensor per layer in one of vLLM's layouts (flash-attention's [2, N, ...] or
    FlashInfer's [N, 2, ...]), in shared memory or on GPU 0."""
    shape = ((BLOCKS, 2) if layout == "blocks_first" else (2, BLOCKS)) + (BLOCK_SIZE, KV_HEADS, HEAD_DIM)
    if kind == "cuda":
        whole = torch.zeros((LAYERS, *shape), dtype=torch.float16, device="cuda:0")
        return {f"model.layers.{i}.self_attn.attn": whole[i] for i in range(LAYERS)}, []
    out, paths = {}, []
    for i in range(LAYERS):
        path = f"/dev/shm/kvferry-vllm-nodes-{os.getpid()}-{tag}-{i}-{time.monotonic_ns()}"
        paths.append(path)
        out[f"model.layers.{i}.self_attn.attn"] = kv.shm_tensor(shape, torch.float16, path)
    return out, paths


def step(sched, worker, output: SchedulerOutput, layers: dict | None = None, write=None,
         finished: set[str] = frozenset()) -> tuple[set | None, set | None]:
    """One engine step in vLLM's order: the scheduler's metadata, then the worker's calls, the
    forward writing each layer (``write``) before its save, and the worker's reports through the
    scheduler side's ``update_connector_output`` (what vLLM's scheduler then acts on)."""
    worker.bind_connector_metadata(sched.build_connector_meta(output))
    worker.start_load_kv(None)
    for name, tensor in (layers or {}).items():
        worker.wait_for_layer_load(name)
        if write is not None:
            write(name, tensor)
        worker.save_kv_layer(name, tensor, None)
    worker.wait_for_save()
    sending, recving = worker.get_finished(set(finished))
    worker.clear_connector_metadata()
    out = KVConnectorOutput(set(sending or ()), set(recving or ()))
    sched.update_connector_output(out)
    return out.finished_sending, out.finished_recving


@pytest.mark.node
@needs_node
def kv_planes(tensor):
    """A layer's cache as [2, N, block_size, heads, head_dim] whatever its layout (a view)."""
    return tensor.transpose(0, 1) if tensor.shape[1] == 2 and tensor.shape[0] != 2 else tensor


@pytest.mark.parametrize("mode,preempted,p_layout,d_layout", [
    ("write", False, "standard", "standard"), ("read", False, "standard", "standard"),
    ("write", True, "standard", "standard"),
    ("write", False, "standard", "blocks_first"),  # FlashInfer's layout on D: token ranges
    ("read", False, "blocks_first", "blocks_first"),  # on both: whole blocks
])
@pytest.mark.parametrize("kind", ["host", "cuda"])
def test_vllm_connectors_move_a_prefill_to_decode_byte_for_byte(tmp_path, kind, mode, preempted, p_layout,
                                                                d_layout):
    """``preempted``: P's chunked prefill is preempted after its first chunk (vLLM frees its blocks)
    and scheduled again from its start with other blocks; D must get those blocks' bytes."""
    if kind == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA here: GPU memory through the connector needs a GPU host")
    extra = ["--gpu", "0", "--transport", "cuda"] if kind == "cuda" else ["--transport", "cma"]
    p_node = Node(str(tmp_path), "prefill", engine_id="p0", modes=mode, extra_args=extra)
    d_node = Node(str(tmp_path), "decode", engine_id="d0", modes=mode, seed_port=p_node.port, extra_args=extra)
    p_kv, d_kv, paths = {}, {}, []
    clients = []
    try:
        p_node.wait_ready()
        d_node.wait_ready()
        p_kv, p_paths = caches(kind, "p", p_layout)
        d_kv, d_paths = caches(kind, "d", d_layout)
        paths = p_paths + d_paths

        def connector(node, role, side):
            return kv.KvferryConnector(config(node.socket, role, mode=mode), side)

        sides = (kv.KVConnectorRole.SCHEDULER, kv.KVConnectorRole.WORKER)
        p_sched, p_work = (connector(p_node, "kv_producer", side) for side in sides)
        d_sched, d_work = (connector(d_node, "kv_consumer", side) for side in sides)
        clients = [p_sched, p_work, d_sched, d_work]
        p_work.register_kv_caches(p_kv)
        d_work.register_kv_caches(d_kv)

        n = 40  # three blocks of 16, the last one partly
        prompt = list(range(100, 100 + n))
        p_blocks, d_blocks = [3, 4, 5], [9, 10, 11]
        d_params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "x1",
                    "remote_engine_id": "p0"}

        def admit_d(params, want):
            # docs/engine-port.md's walk-throughs: WRITE matches the whole prompt (vLLM's D
            # computes the last token again), READ all but the last token.
            d_req = Request("r1", prompt, params)
            count, is_async = d_sched.get_num_new_matched_tokens(d_req, 0)
            assert (count, is_async) == (want, True)
            d_sched.update_state_after_alloc(d_req, KVCacheBlocks(d_blocks), count)

        if mode == "write":  # D first: it names its blocks to P through the nodes
            admit_d(d_params, n)
        p_req = Request("r1", prompt, {"do_remote_decode": True, "do_remote_prefill": False,
                                       "transfer_id": "x1", "remote_engine_id": "d0"})
        assert p_sched.get_num_new_matched_tokens(p_req, 0) == (0, False)
        first_blocks = [12, 13]  # preempted: the first chunk's, freed by vLLM
        p_sched.update_state_after_alloc(p_req, KVCacheBlocks(first_blocks if preempted else p_blocks), 0)
        gen = torch.Generator().manual_seed(5)
        written = {name: torch.randn((2, len(p_blocks), BLOCK_SIZE, KV_HEADS, HEAD_DIM), generator=gen)
                   .to(torch.float16) for name in p_kv}

        def write(name, tensor):  # the attention layer's KV of the whole prompt into P's blocks
            kv_planes(tensor)[:, p_blocks] = written[name].to(tensor.device)

        if preempted:
            def write_first_chunk(name, tensor):  # KV that preemption throws away
                kv_planes(tensor)[:, first_blocks] = -1.0

            step(p_sched, p_work, SchedulerOutput(scheduled_new_reqs=[NewRequestData("r1", (first_blocks,), 0)],
                                                  num_scheduled_tokens={"r1": 20}), p_kv, write_first_chunk)
            # vLLM's scheduler takes it from waiting again: matched, allocated, then resumed.
            assert p_sched.get_num_new_matched_tokens(p_req, 0) == (0, False)
            p_sched.update_state_after_alloc(p_req, KVCacheBlocks(p_blocks), 0)
            resumed = CachedRequestData(["r1"], [(p_blocks,)], [0])
            resumed.resumed_req_ids = {"r1"}
            step(p_sched, p_work, SchedulerOutput(scheduled_cached_reqs=resumed, num_scheduled_tokens={"r1": n}),
                 p_kv, write)
        else:
            step(p_sched, p_work, SchedulerOutput(scheduled_new_reqs=[NewRequestData("r1", (p_blocks,), 0)],
                                                  num_scheduled_tokens={"r1": n}), p_kv, write)
        p_req.status = RequestStatus.FINISHED_LENGTH_CAPPED
        delay, p_params = p_sched.request_finished(p_req, p_blocks)
        assert delay  # P keeps its blocks until D has them
        if mode == "read":  # the router hands P's params to D
            assert p_params["remote_block_ids"] == p_blocks, p_params
            admit_d(p_params, n - 1)
        sent = received = False
        deadline = time.monotonic() + 60
        finished = {"r1"}
        while not (sent and received) and time.monotonic() < deadline:
            p_done, _ = step(p_sched, p_work, SchedulerOutput(finished_req_ids=finished), finished=finished)
            finished = set()
            _, d_done = step(d_sched, d_work, SchedulerOutput())
            sent |= "r1" in (p_done or set())
            received |= "r1" in (d_done or set())
        assert sent and received, (sent, received, p_node.tail(), d_node.tail())
        for sched in (p_sched, d_sched):  # steps built ahead: the client's mirror of the node's rules held
            client = sched.connector_scheduler.client
            assert list(sched.connector_scheduler.op_errors) == [] and client.build_ahead_off is None
            assert client.local_answer_counts.get("build_connector_meta", 0) > 0
        assert d_work.get_block_ids_with_load_errors() == set()
        if kind == "cuda":
            torch.cuda.synchronize()
        moved = n if mode == "write" else n - 1
        for name in p_kv:
            p_tokens = kv_planes(p_kv[name])[:, p_blocks].reshape(2, -1, KV_HEADS, HEAD_DIM)[:, :moved].cpu()
            d_tokens = kv_planes(d_kv[name])[:, d_blocks].reshape(2, -1, KV_HEADS, HEAD_DIM)[:, :moved].cpu()
            assert torch.equal(p_tokens.view(torch.int16), d_tokens.view(torch.int16)), name
            assert p_tokens.abs().sum() > 0  # the pattern, not two caches of zeros
    finally:
        for c in clients:
            c.shutdown()
        for node in (d_node, p_node):
            node.stop()
        for path in paths:
            os.unlink(path)
