"""KvferryConnector driven the way vLLM's scheduler and model runner drive a KV connector, with
small stand-ins for vLLM's Request, KVCacheBlocks, SchedulerOutput and config objects."""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field

import pytest

np = pytest.importorskip("numpy")

from kvferry import vllm as kv  # noqa: E402
from kvferry.port import NodeUnavailable  # noqa: E402

from .fakenode import FakeNode, Refuse  # noqa: E402


# ---- stand-ins for vLLM's objects (only the fields the connector reads) ----


class RequestStatus(enum.Enum):
    WAITING = 0
    WAITING_FOR_REMOTE_KVS = 1
    RUNNING = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    PREEMPTED = 6


@dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]
    kv_transfer_params: dict | None = None
    status: RequestStatus = RequestStatus.WAITING


@dataclass
class KVCacheBlocks:
    ids: list[int]
    hashed: int = 0

    def get_block_ids(self):
        return (list(self.ids),)

    def get_unhashed_block_ids(self):
        return list(self.ids[self.hashed:])


@dataclass
class NewRequestData:
    req_id: str
    block_ids: tuple
    num_computed_tokens: int


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    new_block_ids: list = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = field(default_factory=dict)
    finished_req_ids: set[str] = field(default_factory=set)
    preempted_req_ids: set[str] = field(default_factory=set)


@dataclass
class KVConnectorOutput:
    finished_sending: set[str] | None = None
    finished_recving: set[str] | None = None


@dataclass
class KVTransferConfig:
    kv_connector: str
    kv_role: str
    kv_connector_extra_config: dict
    kv_connector_module_path: str = "kvferry.vllm"


@dataclass
class ParallelConfig:
    tensor_parallel_size: int = 1
    data_parallel_rank: int = 0
    data_parallel_size: int = 1
    pipeline_parallel_size: int = 1


@dataclass
class CacheConfig:
    block_size: int = 16


@dataclass
class VllmConfig:
    kv_transfer_config: KVTransferConfig
    parallel_config: ParallelConfig = field(default_factory=ParallelConfig)
    cache_config: CacheConfig | None = None


def config(socket: str, kv_role: str = "kv_producer", **extra) -> VllmConfig:
    return VllmConfig(KVTransferConfig("KvferryConnector", kv_role, {"socket": socket, **extra}))


@pytest.fixture
def node(tmp_path):
    n = FakeNode(str(tmp_path / "node.sock"))
    yield n
    n.close()


@pytest.fixture
def shm(tmp_path):
    made = []

    def make(shape, dtype=np.float16):
        path = f"/dev/shm/kvferry-test-{os.getpid()}-{len(made)}-{tmp_path.name}"
        made.append(path)
        return kv.shm_tensor(shape, dtype, path), path

    yield make
    for p in made:
        os.unlink(p)


def kv_caches(shm, layers=3, shape=(2, 8, 16, 2, 4)):
    out, paths = {}, []
    for i in range(layers):
        t, p = shm(shape)
        out[f"model.layers.{i}.self_attn.attn"] = t
        paths.append(p)
    return out, paths


# ---- tests ----


def test_imports_without_vllm_and_has_vllms_method_names():
    assert not kv.HAVE_VLLM
    for name in ["register_kv_caches", "start_load_kv", "wait_for_layer_load", "save_kv_layer", "wait_for_save",
                 "get_finished", "get_block_ids_with_load_errors", "get_handshake_metadata", "shutdown",
                 "bind_connector_metadata", "clear_connector_metadata", "get_num_new_matched_tokens",
                 "update_state_after_alloc", "build_connector_meta", "request_finished",
                 "update_connector_output", "has_pending_push_work", "get_finished_count"]:
        assert callable(getattr(kv.KvferryConnector, name)), name
    assert issubclass(kv.KvferryConnector, kv.KVConnectorBase_V1)


def test_scheduler_side_on_prefill_follows_a_chunked_prefill_and_finish(node):
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": {"do_remote_prefill": True,
                                                                        "remote_block_ids": a["block_ids"]}}
    c = kv.KvferryConnector(config(node.path, mode="write", engine_id="p0"), kv.KVConnectorRole.SCHEDULER)
    assert node.hellos[0]["engine"] == {"role": "prefill", "mode": "write", "engine_id": "p0", "tp_size": 1,
                                        "dp_rank": 0, "dp_size": 1}
    req = Request("r1", list(range(40)), {"do_remote_decode": True, "transfer_id": "t1", "remote_engine_id": "d0"})
    # schedule(): a waiting request
    assert c.get_num_new_matched_tokens(req, 0) == (0, False)
    c.update_state_after_alloc(req, KVCacheBlocks([5, 9]), 0)
    meta1 = c.build_connector_meta(SchedulerOutput(
        scheduled_new_reqs=[NewRequestData("r1", ([5, 9],), 0)], num_scheduled_tokens={"r1": 32}))
    # next step: the last chunk, one more block
    meta2 = c.build_connector_meta(SchedulerOutput(
        scheduled_cached_reqs=CachedRequestData(["r1"], [([11],)], [32]), num_scheduled_tokens={"r1": 8}))
    # next step: a decode step that added no block
    c.build_connector_meta(SchedulerOutput(
        scheduled_cached_reqs=CachedRequestData(["r1"], [None], [40]), num_scheduled_tokens={"r1": 1}))
    assert isinstance(meta1, kv.KvferryConnectorMetadata) and meta1.data != meta2.data
    req.status = RequestStatus.FINISHED_LENGTH_CAPPED
    delay, params = c.request_finished(req, [5, 9, 11])
    assert delay and params["remote_block_ids"] == [5, 9, 11]
    assert c.has_pending_push_work()
    c.update_connector_output(KVConnectorOutput(finished_sending={"r1"}))
    assert not c.has_pending_push_work()
    assert c.get_finished_count() is None
    metas = node.calls("build_connector_meta")
    assert metas[0] == {"scheduled_new_reqs": [{"request_id": "r1", "block_ids": [5, 9], "num_computed_tokens": 32}],
                        "scheduled_cached_reqs": []}
    assert metas[1]["scheduled_cached_reqs"] == [{"request_id": "r1", "new_block_ids": [11], "num_computed_tokens": 40,
                                                  "resumed": False}]
    assert metas[2]["scheduled_cached_reqs"] == [{"request_id": "r1", "new_block_ids": None, "num_computed_tokens": 41,
                                                  "resumed": False}]
    assert node.calls("get_num_new_matched_tokens")[0]["kv_transfer_params"]["transfer_id"] == "t1"
    assert node.calls("request_finished") == [{"request_id": "r1", "block_ids": [5, 9, 11], "status": "length_capped"}]
    assert node.ops("scheduler") == ["hello", "get_num_new_matched_tokens", "update_state_after_alloc",
                                     "build_connector_meta", "build_connector_meta", "build_connector_meta",
                                     "request_finished"]


def test_scheduler_side_on_decode_names_only_the_blocks_it_must_receive(node):
    node.matched = lambda a: {"count": a["num_prompt_tokens"] - 1 - a["num_computed_tokens"], "async": True}
    c = kv.KvferryConnector(config(node.path, "kv_consumer", mode="read"), kv.KVConnectorRole.SCHEDULER)
    req = Request("r2", list(range(50)), {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3, 4]})
    count, is_async = c.get_num_new_matched_tokens(req, 16)  # one block from D's own prefix cache
    assert (count, is_async) == (33, True)
    c.update_state_after_alloc(req, KVCacheBlocks([7, 8, 9], hashed=1), count)
    c.connector_scheduler.client.ping()  # a round trip: the one-way op before it has been read
    assert node.calls("update_state_after_alloc") == [{"request_id": "r2", "block_ids": [8, 9], "num_external_tokens": 33}]
    for status, want in [(RequestStatus.FINISHED_ABORTED, "aborted"), (RequestStatus.FINISHED_STOPPED, "stopped")]:
        req.status = status
        c.request_finished(req, [])
        assert node.calls("request_finished")[-1]["status"] == want
    assert not c.has_pending_push_work()


@pytest.mark.parametrize("mode", ["read", "write"])
def test_scheduler_side_on_decode_lends_no_block_when_its_prefix_cache_holds_every_token_before_the_last(node, mode):
    # 33 tokens, blocks of 16: D's own cache holds the first 32, so nothing is loaded. vLLM still
    # hands every block of the request (two shared, cached ones and the new one): none may be
    # read or written into.
    node.matched = lambda a: {"count": a["num_prompt_tokens"] - 1 - a["num_computed_tokens"], "async": True}
    c = kv.KvferryConnector(config(node.path, "kv_consumer", mode=mode), kv.KVConnectorRole.SCHEDULER)
    req = Request("r3", list(range(33)), {"do_remote_prefill": True, "remote_block_ids": [1, 2, 3]})
    assert c.get_num_new_matched_tokens(req, 32) == (0, False)
    c.update_state_after_alloc(req, KVCacheBlocks([3, 4, 9], hashed=2), 0)
    c.connector_scheduler.client.ping()
    assert node.calls("update_state_after_alloc") == [{"request_id": "r3", "block_ids": [], "num_external_tokens": 0}]


def test_a_request_preempted_and_scheduled_again_is_named_resumed(node):
    c = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    for rid in "abc":  # P's chunked prefills: the node reads their cached entries
        c.get_num_new_matched_tokens(Request(rid, list(range(64)), {"do_remote_decode": True, "transfer_id": rid,
                                                                    "remote_engine_id": "d0"}), 0)
    columns = CachedRequestData(["a", "b"], [([4, 5],), ([6],)], [0, 16])
    columns.resumed_req_ids = {"a"}  # vLLM's newer form: by id
    c.build_connector_meta(SchedulerOutput(scheduled_cached_reqs=columns, num_scheduled_tokens={"a": 16, "b": 8}))
    older = CachedRequestData(["c"], [([7, 8],)], [0])
    older.resumed_from_preemption = [True]  # the form before: a flag per column
    c.build_connector_meta(SchedulerOutput(scheduled_cached_reqs=older, num_scheduled_tokens={"c": 16}))
    metas = node.calls("build_connector_meta")
    assert [(r["request_id"], r["resumed"]) for r in metas[0]["scheduled_cached_reqs"]] == [("a", True), ("b", False)]
    assert metas[1]["scheduled_cached_reqs"][0]["resumed"] is True


def from_p(rid: str) -> Request:
    """A request D is to receive from P."""
    return Request(rid, list(range(20)), {"do_remote_prefill": True, "remote_block_ids": [1, 2], "transfer_id": rid,
                                          "remote_engine_id": "p0"})


def test_reports_vllm_does_not_wait_for_never_reach_it(node):
    # vLLM asserts on every id it is told of: a send failure reported while P's request still
    # runs, or a receive of a request that loads in its step, would stop its engine core.
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": None}
    p = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    running = Request("p1", list(range(20)), {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d0"})
    p.get_num_new_matched_tokens(running, 0)
    out = KVConnectorOutput(finished_sending={"p1", "gone"})
    p.update_connector_output(out)
    assert out.finished_sending == set()
    running.status = RequestStatus.FINISHED_LENGTH_CAPPED
    # Its transfer ended already (the node reported it then): its blocks go now, not never.
    assert p.request_finished(running, [1, 2]) == (False, None)
    assert not p.has_pending_push_work()

    node.matched = lambda a: {"count": 16, "async": a["request_id"] == "d1"}
    d = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)
    loading, in_step = from_p("d1"), from_p("d2")
    assert d.get_num_new_matched_tokens(loading, 0) == (16, True)
    assert d.get_num_new_matched_tokens(in_step, 0) == (16, False)
    first = KVConnectorOutput(finished_recving={"d1", "d2"})
    d.update_connector_output(first)
    assert first.finished_recving == {"d1"}
    again = KVConnectorOutput(finished_recving={"d1"})  # reported twice: vLLM got it once
    d.update_connector_output(again)
    assert again.finished_recving == set()


def loading_from_p(node, rid: str):
    """A consumer's scheduler with request ``rid`` loading asynchronously; the node keeps the
    blocks of whatever finishes."""
    node.matched = lambda a: {"count": 16, "async": True}
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": None}
    d = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)
    req = from_p(rid)
    d.get_num_new_matched_tokens(req, 0)
    return d, req


def test_a_request_aborted_while_loading_has_its_receive_report_passed_on(node):
    d, req = loading_from_p(node, "d3")
    req.status = RequestStatus.FINISHED_ABORTED
    assert d.request_finished(req, [3])[0]  # vLLM holds its blocks until the load is over
    assert not d.has_pending_push_work()
    out = KVConnectorOutput(finished_recving={"d3"})
    d.update_connector_output(out)
    assert out.finished_recving == {"d3"}  # vLLM frees its blocks on this report


def test_a_request_aborted_after_its_load_was_reported_is_freed_at_once(node):
    # Every rank reported its receive over, so nothing can land in its blocks; the node, which
    # cannot tell that all ranks are done, still asks to wait, and no second report would come.
    d, req = loading_from_p(node, "d5")
    loaded = KVConnectorOutput(finished_recving={"d5"})
    d.update_connector_output(loaded)
    assert loaded.finished_recving == {"d5"}
    req.status = RequestStatus.FINISHED_ABORTED
    assert d.request_finished(req, [3]) == (False, None)
    late = KVConnectorOutput(finished_recving={"d5"})  # the node's report of the abort
    d.update_connector_output(late)
    assert late.finished_recving == set()


def test_a_worker_reports_each_request_once(node, shm):
    # vLLM counts one report per rank; a second one would complete the count while another
    # rank's copies may still land.
    caches, w, _ = loading_consumer(node, shm)
    node.finished[0].append({"done_receiving": ["a"]})
    assert w.get_finished(set()) == (None, {"a"})
    node.finished[0].append({"failed": {"a": "request a aborted"}, "done_receiving": ["b"]})
    assert w.get_finished(set()) == (None, {"b"})


def test_a_request_freed_at_once_has_a_late_receive_report_dropped(node):
    node.matched = lambda a: {"count": 16, "async": True}
    d = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)
    req = from_p("d4")
    d.get_num_new_matched_tokens(req, 0)
    req.status = RequestStatus.FINISHED_ABORTED
    assert d.request_finished(req, [3]) == (False, None)  # the node let it go at once
    out = KVConnectorOutput(finished_recving={"d4"})
    d.update_connector_output(out)
    assert out.finished_recving == set()


def test_the_connector_asks_vllm_for_piecewise_graphs_and_the_nhd_layout():
    assert kv.KvferryConnector.requires_piecewise_for_cudagraph({}) is True
    assert kv.KvferryConnector.get_required_kvcache_layout(None) == "NHD"


def test_unsupported_parallelism_is_refused_by_name(node):
    cfg = config(node.path)
    cfg.parallel_config.pipeline_parallel_size = 2
    with pytest.raises(ValueError, match="pipeline_parallel_size"):
        kv.KvferryConnector(cfg, kv.KVConnectorRole.SCHEDULER)
    cfg = config(node.path)
    cfg.parallel_config.tensor_parallel_size = 2
    with pytest.raises(ValueError, match="tp_rank"):  # no vLLM here to ask the rank
        kv.KvferryConnector(cfg, kv.KVConnectorRole.WORKER)


def test_zero_matched_tokens_is_never_async(node):
    node.matched = lambda a: {"count": 0, "async": True}
    c = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    assert c.get_num_new_matched_tokens(Request("r", [1, 2]), 0) == (0, False)


def test_worker_registers_shm_caches_and_runs_a_prefill_step_in_vllms_order(node, shm):
    caches, paths = kv_caches(shm)
    w = kv.KvferryConnector(config(node.path, tp_rank=0), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    hello = [h for h in node.hellos if h["side"] == "worker"][0]
    assert hello["geometry"] == {"layout": "standard", "num_blocks": 8, "block_size": 16, "kv_heads": 2,
                                 "head_dim": 4, "dtype_bytes": 2}
    assert hello["memory"] == {"kind": "host", "layers": [
        {"path": p, "offset": 0, "length": 2 * 8 * 16 * 2 * 4 * 2} for p in paths]}
    assert hello["tp_rank"] == 0
    s = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    node.saves = 1  # a step that writes a request's layers: the save frames go
    meta = s.build_connector_meta(SchedulerOutput())
    # the model runner: bind, start_load_kv, per layer (attention) wait/save, wait_for_save, get_finished
    w.bind_connector_metadata(meta)
    assert w.has_connector_metadata()
    w.start_load_kv(forward_context=None)
    for name, t in caches.items():
        w.wait_for_layer_load(name)
        t[0, 1, 0] = 1.0  # the attention layer writes its KV
        w.save_kv_layer(name, t, attn_metadata=None)
    w.wait_for_save()
    node.finished[0].append({"done_sending": ["r1"]})
    # A producer asks get_finished a step ahead: this step's call answers with the last ask's
    # reply (none yet), the next step's with this one's.
    assert w.get_finished({"r0"}) == (None, None)
    assert w.get_finished(set()) == ({"r1"}, None)
    assert w.get_block_ids_with_load_errors() == set()
    w.clear_connector_metadata()
    assert not w.has_connector_metadata()
    assert node.ops("worker", 0) == ["hello", "bind_connector_metadata", "start_load_kv", "save_kv_layer",
                                     "save_kv_layer", "save_kv_layer", "wait_for_save", "get_finished",
                                     "get_finished", "get_block_ids_with_load_errors"]
    assert node.calls("bind_connector_metadata") == [{"metadata": meta.data}]
    assert [a["layer"] for a in node.calls("save_kv_layer")] == [0, 1, 2]
    assert node.calls("get_finished") == [{"finished_req_ids": ["r0"]}, {}]


def loading_consumer(node, shm):
    """A consumer's worker and scheduler over two layers, the node answering every step loads."""
    caches, _ = kv_caches(shm, layers=2)
    node.loads = 1
    w = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    return caches, w, kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)


def test_decode_worker_waits_per_layer_when_loading_and_reports_failures_for_recompute(node, shm):
    caches, w, s = loading_consumer(node, shm)
    w.bind_connector_metadata(s.build_connector_meta(SchedulerOutput()))
    w.start_load_kv(None)
    for name, t in caches.items():
        w.wait_for_layer_load(name)
        w.save_kv_layer(name, t, None)  # D saves nothing, as the seed's consumer
    w.wait_for_save()
    node.finished[0].append({"done_receiving": ["a"], "failed": {"b": "P went away"},
                             "block_ids_with_load_errors": [3, 4]})
    assert w.get_finished(set()) == (None, {"a", "b"})
    assert w.get_block_ids_with_load_errors() == {3, 4}
    assert [a["layer"] for a in node.calls("wait_for_layer_load")] == [0, 1]
    assert node.calls("save_kv_layer") == []


def test_a_step_whose_start_load_kv_comes_after_the_forward_waits_for_no_layer(node, shm):
    # vLLM with only asynchronous loads (kvferry's) starts them after the forward: that forward's
    # per-layer waits must not use the step before's load count.
    caches, w, s = loading_consumer(node, shm)
    w.bind_connector_metadata(s.build_connector_meta(SchedulerOutput()))
    w.start_load_kv(None)  # a step in the older order: it loads, so its layers wait
    for name in caches:
        w.wait_for_layer_load(name)
    w.clear_connector_metadata()
    w.bind_connector_metadata(s.build_connector_meta(SchedulerOutput()))
    for name in caches:  # the newer order: the forward first
        w.wait_for_layer_load(name)
    w.start_load_kv(None)
    # ... and no waits sent ahead then: their replies would come only once the reads landed, and
    # the step's next call would wait for them.
    w.get_finished(set())
    assert [a["layer"] for a in node.calls("wait_for_layer_load")] == [0, 1]
    assert not w.connector_worker.client.pipelined_layer_waits


def test_preempted_requests_reach_the_producers_workers_which_fence_their_saves(node, shm):
    # vLLM frees a preempted request's blocks with no connector call and reuses them once the
    # workers' handle_preemptions returned (newer vLLM hands it the metadata, older the ids).
    s = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    meta = s.build_connector_meta(SchedulerOutput(preempted_req_ids={"b", "a"}))
    assert meta.preempted == ("a", "b")
    caches, _ = kv_caches(shm, layers=2)
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    w.bind_connector_metadata(meta)
    w.handle_preemptions(meta)
    w.handle_preemptions({"c"})
    w.handle_preemptions(s.build_connector_meta(SchedulerOutput()))  # none preempted: no call
    assert [a["request_ids"] for a in node.calls("fence_saves")] == [["a", "b"], ["c"]]
    d = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.WORKER)
    d.register_kv_caches(kv_caches(shm, layers=2)[0])
    d.handle_preemptions({"d"})  # a consumer saves nothing
    assert len(node.calls("fence_saves")) == 2


def test_a_kv_cache_config_of_several_groups_is_refused_at_start(node):
    from types import SimpleNamespace
    two = SimpleNamespace(kv_cache_groups=[object(), object()])
    with pytest.raises(ValueError, match="disable-hybrid-kv-cache-manager"):
        kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER, two)
    kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER, SimpleNamespace(kv_cache_groups=[object()]))


def test_mla_caches_register_with_the_mla_layout(node, shm):
    caches, _ = kv_caches(shm, layers=2, shape=(8, 16, 12))
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    g = [h for h in node.hellos if h["side"] == "worker"][0]["geometry"]
    assert g == {"layout": "mla", "num_blocks": 8, "block_size": 16, "latent": 12, "dtype_bytes": 2}


def test_flashinfer_caches_register_with_the_blocks_first_layout(node, shm):
    caches, _ = kv_caches(shm, layers=2, shape=(8, 2, 16, 2, 4))  # FlashInfer's [N, 2, bs, H, D]
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    g = [h for h in node.hellos if h["side"] == "worker"][0]["geometry"]
    assert g == {"layout": "blocks_first", "num_blocks": 8, "block_size": 16, "kv_heads": 2, "head_dim": 4,
                 "dtype_bytes": 2}


def test_a_shape_that_names_no_layout_or_two_is_refused(node, shm):
    for shape, why in (((2, 2, 16, 2, 4), "cannot say which"), ((8, 3, 16, 2, 4), "none of")):
        caches, _ = kv_caches(shm, layers=1, shape=shape)
        with pytest.raises(ValueError, match=why):
            kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER).register_kv_caches(caches)


def test_blocks_first_kernel_blocks_smaller_than_the_schedulers_are_refused(node, shm):
    # [N, 2, 16, ...] kernel blocks under 32-token scheduler blocks: a scheduler block would hold K
    # and V of its first kernel block, then of its second, which no scheduler-block geometry says.
    caches, _ = kv_caches(shm, layers=1, shape=(8, 2, 16, 2, 4))
    cfg = config(node.path)
    cfg.cache_config = CacheConfig(block_size=32)
    with pytest.raises(ValueError, match="interleave"):
        kv.KvferryConnector(cfg, kv.KVConnectorRole.WORKER).register_kv_caches(caches)


def test_kernel_blocks_smaller_than_the_schedulers_are_named_in_the_schedulers_blocks(node, shm):
    # An attention backend paging 16-token kernel blocks under 32-token scheduler blocks: block
    # id b is kernel blocks 2b and 2b+1, one contiguous run per K or V plane.
    caches, _ = kv_caches(shm, layers=1)  # [2, 8, 16, 2, 4]
    cfg = config(node.path)
    cfg.cache_config = CacheConfig(block_size=32)
    kv.KvferryConnector(cfg, kv.KVConnectorRole.WORKER).register_kv_caches(caches)
    g = [h for h in node.hellos if h["side"] == "worker"][0]["geometry"]
    assert (g["num_blocks"], g["block_size"]) == (4, 32)
    cfg.cache_config = CacheConfig(block_size=24)
    with pytest.raises(ValueError, match="do not divide"):
        kv.KvferryConnector(cfg, kv.KVConnectorRole.WORKER).register_kv_caches(caches)


def test_layers_sharing_one_kv_cache_are_registered_once(node, shm):
    caches, paths = kv_caches(shm, layers=2)
    caches["model.layers.2.self_attn.attn"] = caches["model.layers.0.self_attn.attn"]  # KV sharing
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    hello = [h for h in node.hellos if h["side"] == "worker"][0]
    assert [layer["path"] for layer in hello["memory"]["layers"]] == paths
    w.save_kv_layer("model.layers.2.self_attn.attn", caches["model.layers.2.self_attn.attn"], None)
    assert node.calls("save_kv_layer") == []  # its KV moves with layer 0


def test_a_region_registered_where_an_older_one_was_replaces_it():
    # Found when two tests in one process each made shm caches: the second's landed at the first's
    # (freed) addresses, and the lookup named the first's deleted file to the node.
    base = 1 << 44  # no real mapping of this process is here
    kv.register_shm_region(base, 4096, "/dev/shm/old-a")
    kv.register_shm_region(base + 4096, 4096, "/dev/shm/old-b")
    kv.register_shm_region(base + 2048, 4096, "/dev/shm/new")
    assert kv._find_region(base + 2048, 4096).path == "/dev/shm/new"
    assert kv._find_region(base, 2048) is None and kv._find_region(base + 6144, 2048) is None


def test_caches_outside_shared_memory_are_refused_with_the_fix(node):
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    with pytest.raises(ValueError, match="shm_tensor"):
        w.register_kv_caches({"l0": np.zeros((2, 4, 16, 2, 4), dtype=np.float16)})


class FakeCudaTensor:
    """Only what the connector reads of a CUDA tensor (CI has no GPU; the real case is below)."""

    is_cuda = True
    device = "cuda:0"
    shape = (2, 8, 16, 2, 4)

    def __init__(self, address):
        self.address = address

    def data_ptr(self):
        return self.address

    def element_size(self):
        return 2

    def numel(self):
        return 2 * 8 * 16 * 2 * 4

    def is_contiguous(self):
        return True


class FakeEvent:
    def __init__(self):
        self.records = 0

    def record(self):
        self.records += 1


@pytest.fixture
def fake_cuda(monkeypatch):
    """The driver's side of cuda_port on a host without a GPU: one allocation at 0x10000 holds
    every layer; the ring's events count their records."""
    from kvferry import cuda_port

    made = []

    def ring(size, device=None):
        made.extend(FakeEvent() for _ in range(size))
        return made[-size:], [bytes([i]) * 64 for i in range(size)]

    monkeypatch.setattr(cuda_port, "ipc_mem_handle", lambda pointer, device=None: (b"H" * 64, pointer - 0x10000))
    monkeypatch.setattr(cuda_port, "device_uuid", lambda device: "GPU-0000-test")
    monkeypatch.setattr(cuda_port, "event_ring", ring)
    return made


def fake_cuda_caches(layers=3):
    size = FakeCudaTensor(0).numel() * 2
    return {f"model.layers.{i}.self_attn.attn": FakeCudaTensor(0x10000 + 256 + i * size) for i in range(layers)}


def run_saving_step(node, w, caches):
    """One step that saves every layer, in vLLM's order; returns once the node has its ops (bind,
    start_load_kv, a save per layer, wait_for_save, get_finished)."""
    before = len(node.ops("worker"))
    node.saves = 1
    s = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.SCHEDULER)
    w.bind_connector_metadata(s.build_connector_meta(SchedulerOutput()))
    w.start_load_kv(None)
    for name, t in caches.items():
        w.wait_for_layer_load(name)
        w.save_kv_layer(name, t, None)
    w.wait_for_save()
    w.get_finished(set())
    return node.await_ops(before + 4 + len(caches), "worker")


def test_cuda_caches_are_named_by_ipc_handle_and_each_layers_save_by_its_event(node, fake_cuda):
    caches = fake_cuda_caches()
    w = kv.KvferryConnector(config(node.path, tp_rank=0), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    hello = [h for h in node.hellos if h["side"] == "worker"][0]
    length = 2 * 8 * 16 * 2 * 4 * 2
    assert hello["memory"] == {"kind": "cuda_ipc", "device_uuid": "GPU-0000-test", "layers": [
        {"handle": b"H" * 64, "offset": 256 + i * length, "length": length} for i in range(3)]}
    assert hello["events"] == [bytes([i]) * 64 for i in range(6)]  # 2 x layers
    assert not hello.get("load_events")  # a producer loads nothing
    run_saving_step(node, w, caches)
    assert node.calls("save_kv_layer") == [{"layer": i, "event_slot": i} for i in range(3)]
    assert [e.records for e in fake_cuda] == [1, 1, 1, 0, 0, 0]
    # The next step goes on round the ring.
    run_saving_step(node, w, caches)
    assert [a["event_slot"] for a in node.calls("save_kv_layer")] == [0, 1, 2, 3, 4, 5]


def test_step_marks_record_one_event_after_the_last_layer_for_all_of_them(node, fake_cuda):
    caches = fake_cuda_caches()
    w = kv.KvferryConnector(config(node.path, save_marks="step"), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    run_saving_step(node, w, caches)
    assert node.calls("save_kv_layer") == [{"layer": i, "event_slot": 0} for i in range(3)]
    assert [e.records for e in fake_cuda] == [1, 0, 0, 0, 0, 0]


def test_step_marks_send_at_wait_for_save_when_the_last_layer_saved_nothing(node, fake_cuda):
    caches = fake_cuda_caches()
    w = kv.KvferryConnector(config(node.path, save_marks="step"), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    saved = dict(list(caches.items())[:2])  # this step's forward saved the first two layers only
    run_saving_step(node, w, saved)
    assert node.calls("save_kv_layer") == [{"layer": i, "event_slot": 0} for i in range(2)]
    assert [e.records for e in fake_cuda] == [1, 0, 0, 0, 0, 0]


def test_a_cuda_consumer_asks_for_the_nodes_load_events(node, fake_cuda):
    w = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(fake_cuda_caches(2))
    hello = [h for h in node.hellos if h["side"] == "worker"][0]
    assert hello["load_events"] is True and hello["memory"]["kind"] == "cuda_ipc"


def test_layers_on_two_devices_or_an_unknown_marking_are_refused_by_name(node, fake_cuda, shm):
    host, _ = shm((2, 8, 16, 2, 4))
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    with pytest.raises(ValueError, match="share one device"):
        w.register_kv_caches({"l0": FakeCudaTensor(0x10000), "l1": host})
    with pytest.raises(ValueError, match="kv_connector_extra_config.save_marks"):
        kv.KvferryConnector(config(node.path, save_marks="sometimes"), kv.KVConnectorRole.WORKER)


def test_real_cuda_caches_share_their_allocation_and_events(node):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA here: the real handles need a GPU (the fake_cuda tests cover the protocol)")
    kvc = torch.zeros((3, 2, 8, 16, 2, 4), dtype=torch.float16, device="cuda:0")
    caches = {f"model.layers.{i}.self_attn.attn": kvc[i] for i in range(3)}
    w = kv.KvferryConnector(config(node.path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    hello = [h for h in node.hellos if h["side"] == "worker"][0]
    layers = hello["memory"]["layers"]
    assert hello["memory"]["device_uuid"].startswith("GPU-")
    assert len({bytes(x["handle"]) for x in layers}) == 1 and all(len(x["handle"]) == 64 for x in layers)
    length = kvc[0].numel() * 2
    assert [x["offset"] - layers[0]["offset"] for x in layers] == [0, length, 2 * length]
    assert len(hello["events"]) == 6 and all(len(h) == 64 for h in hello["events"])
    run_saving_step(node, w, caches)
    torch.cuda.synchronize()
    assert node.calls("save_kv_layer") == [{"layer": i, "event_slot": i} for i in range(3)]


def test_worker_says_hello_again_at_the_next_step_after_the_node_restarts(tmp_path, shm):
    path = str(tmp_path / "n.sock")
    node = FakeNode(path)
    caches, _ = kv_caches(shm, layers=1)
    w = kv.KvferryConnector(config(path), kv.KVConnectorRole.WORKER)
    w.register_kv_caches(caches)
    node.close()
    with pytest.raises(NodeUnavailable):
        w.start_load_kv(None)
    node = FakeNode(path)
    s = kv.KvferryConnector(config(path), kv.KVConnectorRole.SCHEDULER)
    w.bind_connector_metadata(s.build_connector_meta(SchedulerOutput()))
    w.start_load_kv(None)
    assert [h["side"] for h in node.hellos] == ["scheduler", "worker"]  # the worker came back at bind
    node.close()


def test_missing_socket_config_is_a_clear_error():
    cfg = VllmConfig(KVTransferConfig("KvferryConnector", "kv_producer", {}))
    os.environ.pop("KVFERRY_ENGINE_SOCKET", None)
    with pytest.raises(ValueError, match="kv_connector_extra_config.socket"):
        kv.KvferryConnector(cfg, kv.KVConnectorRole.SCHEDULER)


def test_a_request_aborted_before_scheduling_is_named_to_the_node_before_it_finishes(node):
    c = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)
    req = Request("gone", list(range(30)), {"do_remote_prefill": True, "transfer_id": "t9", "remote_engine_id": "p0"},
                  RequestStatus.FINISHED_ABORTED)
    c.request_finished(req, [])  # vLLM: abort of a waiting request, the connector never saw it
    assert node.ops("scheduler")[1:] == ["get_num_new_matched_tokens", "request_finished"]
    assert node.calls("get_num_new_matched_tokens")[0]["kv_transfer_params"]["transfer_id"] == "t9"
    assert node.calls("request_finished") == [{"request_id": "gone", "block_ids": [], "status": "aborted"}]


def test_params_the_node_refuses_serve_the_request_without_kvferry_instead_of_stopping_vllm(node):
    """vLLM cannot refuse a request from get_num_new_matched_tokens, and an exception there stops
    its engine core: the connector logs the refusal and the engine computes the request itself;
    the node hears nothing more of it."""
    def matched(a):
        if not a["kv_transfer_params"].get("transfer_id"):
            raise Refuse("bad_args", "kv_transfer_params.transfer_id is missing")
        return {"count": 0, "async": False}

    node.matched = matched
    c = kv.KvferryConnector(config(node.path, "kv_consumer"), kv.KVConnectorRole.SCHEDULER)
    bad = Request("bad", list(range(40)), {"do_remote_prefill": True, "remote_engine_id": "p0"})
    assert c.get_num_new_matched_tokens(bad, 0) == (0, False)
    c.update_state_after_alloc(bad, KVCacheBlocks([1, 2, 3]), 0)
    c.build_connector_meta(SchedulerOutput([NewRequestData("bad", ([1, 2, 3],), 0)], num_scheduled_tokens={"bad": 40}))
    bad.status = RequestStatus.FINISHED_STOPPED
    assert c.request_finished(bad, [1, 2, 3]) == (False, None)
    assert node.ops("scheduler")[1:] == ["get_num_new_matched_tokens", "build_connector_meta"]
    assert node.calls("build_connector_meta")[0]["scheduled_new_reqs"] == []
    # Aborted before it was ever scheduled: named to the node first, refused there, freed at once.
    gone = Request("gone", list(range(40)), {"do_remote_prefill": True}, RequestStatus.FINISHED_ABORTED)
    assert c.request_finished(gone, []) == (False, None)
    assert node.ops("scheduler")[-1] == "get_num_new_matched_tokens"

