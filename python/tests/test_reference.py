"""The reference engine on its own (undisaggregated) and against a scripted node."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from kvferry.reference import Geometry, ReferenceEngine, Request
from kvferry.reference.model import block_hashes, prefix_seeds, token_layer_kv
from kvferry.reference.server import serve

from .fakenode import FakeNode

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def geometry(**kw) -> Geometry:
    base = dict(layers=3, num_blocks=64, block_size=16, kv_heads=4, head_dim=16, tp_size=1)
    base.update(kw)
    return Geometry(**base)


def run(engine: ReferenceEngine, prompt: list[int], max_tokens: int = 6, params=None, rid=None):
    r = engine.submit(Request(rid or f"r{time.monotonic_ns()}", prompt, max_tokens, params))
    tokens = []
    while True:
        ev = r.events.get(timeout=30)
        if ev.kind == "token":
            tokens.append(ev.token)
        else:
            return tokens, ev


def wait_idle(engine: ReferenceEngine, timeout=10.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = engine.stats()
        if s["free_blocks"] == s["num_blocks"] and s["running"] == 0 and s["waiting"] == 0 and s["delayed_free"] == 0:
            return s
        time.sleep(0.01)
    return engine.stats()


@pytest.fixture
def engines():
    made = []

    def make(g: Geometry, **kw) -> ReferenceEngine:
        e = ReferenceEngine(g, **kw)
        e.start()
        made.append(e)
        return e

    yield make
    for e in made:
        e.stop()


PROMPT = [(i * 7919) % 32000 for i in range(1, 200)]


def test_same_prompt_gives_the_same_tokens_and_a_different_prompt_does_not(engines):
    e = engines(geometry())
    a, done = run(e, PROMPT)
    b, _ = run(e, PROMPT)
    c, _ = run(e, PROMPT[:-1] + [PROMPT[-1] + 1])
    assert a == b and len(a) == 6 and done.finish_reason == "length"
    assert a != c


def test_output_does_not_depend_on_tp_size_chunk_budget_or_prefix_caching(engines):
    ref, _ = run(engines(geometry(tp_size=1), max_num_batched_tokens=1000, prefix_caching=False), PROMPT)
    for kw in [dict(tp_size=2), dict(tp_size=4)]:
        out, _ = run(engines(geometry(**kw), max_num_batched_tokens=37), PROMPT)
        assert out == ref, kw


def test_mla_layout_is_deterministic_across_tp(engines):
    a, _ = run(engines(geometry(mla=True, latent=24, tp_size=1)), PROMPT)
    b, _ = run(engines(geometry(mla=True, latent=24, tp_size=2), max_num_batched_tokens=50), PROMPT)
    assert a == b


def test_tokens_come_from_the_cache_so_a_corrupted_block_changes_them(engines):
    g = geometry()
    e = engines(g, prefix_caching=False)
    clean, _ = run(e, PROMPT, max_tokens=3)
    original = e._forward

    def forward_then_corrupt(scheduled, loads):
        original(scheduled, loads)
        for r in scheduled:  # one token's K at layer 1, after the model wrote it
            e.caches[0].write(1, 0, r.blocks[0], 3, b"\xff" * g.rank_token_bytes)

    e._forward = forward_then_corrupt
    dirty, _ = run(e, PROMPT, max_tokens=3)
    e._forward = original
    again, _ = run(e, PROMPT, max_tokens=3)
    assert clean == again
    assert dirty[0] != clean[0]


def test_prefix_cache_reuses_full_blocks_and_keeps_the_output(engines):
    e = engines(geometry(), max_num_batched_tokens=1000)
    first, done1 = run(e, PROMPT)
    second, done2 = run(e, PROMPT)
    assert done1.info["prefix_hit_tokens"] == 0
    # 199 tokens: 12 full blocks; vLLM computes at least the last token, so 12 * 16 hit.
    assert done2.info["prefix_hit_tokens"] == 192
    assert first == second


def test_prefix_cache_hit_is_capped_to_leave_the_last_token_to_compute(engines):
    e = engines(geometry())
    prompt = PROMPT[:64]  # exactly 4 blocks
    run(e, prompt)
    _, done = run(e, prompt)
    assert done.info["prefix_hit_tokens"] == 48


def test_chunked_prefill_spreads_a_long_prompt_over_steps(engines):
    g = geometry(num_blocks=256)
    e = engines(g, max_num_batched_tokens=64)
    steps = []
    original = e._schedule

    def counting():
        out = original()
        steps.append([(r.request_id, r.chunk) for r in out[0]])
        return out

    e._schedule = counting
    prompt = list(range(1, 1001))
    out, _ = run(e, prompt, max_tokens=2, rid="long")
    chunks = [c for s in steps for rid, c in s if rid == "long"]
    assert chunks[0] == (0, 64) and chunks[15] == (960, 1000)
    assert all(b - a <= 64 for a, b in chunks)
    ref, _ = run(engines(g, max_num_batched_tokens=4096, prefix_caching=False), prompt, max_tokens=2)
    assert out == ref


def test_every_block_returns_to_the_pool_after_many_requests(engines):
    g = geometry(num_blocks=40)
    e = engines(g, max_num_batched_tokens=48)
    reqs = [e.submit(Request(f"q{i}", list(range(i, i + 20 + 13 * i)), 5, None)) for i in range(12)]
    for r in reqs:
        while r.events.get(timeout=30).kind == "token":
            pass
    s = wait_idle(e)
    assert (s["free_blocks"], s["num_blocks"], s["running"], s["waiting"]) == (40, 40, 0, 0)
    assert s["completed"] == 12


def test_kv_bytes_in_the_shm_file_are_the_models_bytes_in_vllm_layout(engines):
    g = geometry(tp_size=2)
    e = engines(g, prefix_caching=True)
    prompt = PROMPT[:40]
    run(e, prompt, max_tokens=1)
    hit = e.pool.lookup(block_hashes(prompt, g.block_size))
    assert len(hit) == 2  # two full blocks cached
    seeds = prefix_seeds(prompt)
    rank = 1
    path = e.caches[rank].path
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    with open(path, "rb") as f:
        data = f.read()
    t, layer = 17, 2  # block 1 slot 1
    full = token_layer_kv(seeds[t], layer, g)
    per = g.rank_token_bytes
    layer_off = e.caches[rank].layer_stride * layer
    region = g.num_blocks * g.block_size * per
    for kv in (0, 1):
        off = layer_off + kv * region + (hit[1] * g.block_size + 1) * per
        base = kv * g.full_region_token_bytes + rank * per
        assert data[off:off + per] == full[base:base + per]


def test_a_request_longer_than_the_cache_is_refused(engines):
    e = engines(geometry(num_blocks=4))
    _, ev = run(e, list(range(100)))
    assert ev.kind == "error" and "more blocks" in ev.message


# ---- HTTP ----


@pytest.fixture
def http_engine(engines):
    e = engines(geometry(), max_num_batched_tokens=32)
    server = serve(e, "127.0.0.1", 0, "ref-model")
    yield e, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def post(url: str, body: dict, headers=None) -> dict:
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def test_completions_accepts_a_string_or_token_ids_and_answers_in_openai_format(http_engine):
    e, url = http_engine
    a = post(url, {"model": "ref-model", "prompt": " ".join(str(t) for t in PROMPT), "max_tokens": 5})
    b = post(url, {"prompt": PROMPT, "max_tokens": 5}, headers={"X-Request-Id": "abc"})
    assert a["object"] == "text_completion" and a["choices"][0]["finish_reason"] == "length"
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    assert a["choices"][0]["text"] == "".join(f" {t}" for t in a["choices"][0]["token_ids"])
    assert a["usage"] == {"prompt_tokens": len(PROMPT), "completion_tokens": 5, "total_tokens": len(PROMPT) + 5}
    assert "abc" in b["id"] and b["kv_transfer_params"] is None


def test_streaming_sends_one_chunk_per_token_then_done(http_engine):
    e, url = http_engine
    whole = post(url, {"prompt": PROMPT, "max_tokens": 4})
    req = urllib.request.Request(url + "/v1/completions",
                                 data=json.dumps({"prompt": PROMPT, "max_tokens": 4, "stream": True}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.headers["Content-Type"] == "text/event-stream"
        lines = [l for l in resp.read().decode().split("\n\n") if l]
    assert lines[-1] == "data: [DONE]"
    chunks = [json.loads(l[len("data: "):]) for l in lines[:-1]]
    tokens = [t for c in chunks for t in c["choices"][0]["token_ids"]]
    assert tokens == whole["choices"][0]["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_models_health_and_stats(http_engine):
    e, url = http_engine
    models = json.loads(urllib.request.urlopen(url + "/v1/models").read())
    assert models["data"][0]["id"] == "ref-model"
    assert json.loads(urllib.request.urlopen(url + "/health").read()) == {"status": "ok"}
    stats = json.loads(urllib.request.urlopen(url + "/kvferry/stats").read())
    assert stats["num_blocks"] == 64 and stats["free_blocks"] == 64 and stats["running"] == 0


def test_bad_requests_get_an_openai_error(http_engine):
    e, url = http_engine
    with pytest.raises(urllib.error.HTTPError) as err:
        post(url, {"prompt": {"x": 1}})
    assert err.value.code == 400
    assert json.loads(err.value.read())["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("stream", [True, False])
def test_a_client_that_disconnects_aborts_its_request_and_frees_its_blocks(engines, stream):
    e = engines(geometry(num_blocks=1024))
    server = serve(e, "127.0.0.1", 0, "m")
    try:
        body = json.dumps({"prompt": list(range(1, 100)), "max_tokens": 10000, "stream": stream}).encode()
        sock = socket.create_connection(("127.0.0.1", server.server_address[1]))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        if stream:
            got = b""
            while b"data: " not in got:  # tokens are flowing
                chunk = sock.recv(65536)
                assert chunk, got
                got += chunk
        else:
            deadline = time.monotonic() + 10
            while e.stats()["running"] == 0 and time.monotonic() < deadline:
                time.sleep(0.005)
        sock.close()
        s = wait_idle(e)
        assert (s["aborted"], s["completed"]) == (1, 0)
        assert s["free_blocks"] == s["num_blocks"]
    finally:
        server.shutdown()


def test_cli_prints_its_ready_line_and_serves(tmp_path):
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    p = subprocess.Popen([sys.executable, "-m", "kvferry.reference", "--no-connector", "--http-port", "0",
                          "--num-blocks", "32", "--layers", "2"], stdout=subprocess.PIPE, text=True, env=env)
    try:
        line = p.stdout.readline().strip()
        assert line.startswith("kvferry-reference ready http://127.0.0.1:")
        url = line.split()[-1]
        out = post(url, {"prompt": [1, 2, 3], "max_tokens": 2})
        assert len(out["choices"][0]["token_ids"]) == 2
    finally:
        p.terminate()
        p.wait(10)
    assert p.returncode == 0


# ---- with a scripted node: the connector's call order and the block lifetime ----


def test_prefill_steps_call_the_port_in_vllms_order(tmp_path, engines):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.saves = 1  # every step's metadata says it saves, so every step sends its save frames
    g = geometry(layers=2)
    e = engines(g, role="prefill", socket_path=node.path, max_num_batched_tokens=16)
    e.connect()
    # A P request for D (WRITE): the node reads its chunks' cached entries.
    run(e, list(range(1, 21)), max_tokens=1, rid="p1",
        params={"do_remote_decode": True, "transfer_id": "t-p1", "remote_engine_id": "d0"})
    sched = node.ops("scheduler")
    assert sched[:4] == ["hello", "get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta"]
    assert sched[-1] == "request_finished"
    step = ["bind_connector_metadata", "start_load_kv", "save_kv_layer", "save_kv_layer", "wait_for_save",
            "get_finished"]
    worker = node.await_ops(13, "worker", 0)  # the last step's one-way frames may still be in flight
    assert worker[1:7] == step and worker[7:13] == step  # two chunks of 16 and 4 tokens
    metas = node.calls("build_connector_meta")
    assert metas[0]["scheduled_new_reqs"] == [{"request_id": "p1", "block_ids": metas[0]["scheduled_new_reqs"][0]["block_ids"],
                                               "num_computed_tokens": 16}]
    assert metas[1]["scheduled_cached_reqs"][0]["num_computed_tokens"] == 20
    assert len(metas[1]["scheduled_cached_reqs"][0]["new_block_ids"]) == 1
    assert [c["layer"] for c in node.calls("save_kv_layer")[:2]] == [0, 1]
    node.close()


def prefill_keeping_blocks_for_d(tmp_path, engines, rid: str):
    """A READ P engine at TP 2 over a fake node, whose request ``rid`` finished with its blocks
    kept for D: (node, geometry, engine, the request's done event)."""
    node = FakeNode(str(tmp_path / "n.sock"))
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": {"do_remote_prefill": True,
                                                                         "remote_block_ids": a["block_ids"]}}
    g = geometry(tp_size=2)
    e = engines(g, role="prefill", mode="read", socket_path=node.path)
    e.connect()
    # A P request for D: only such a request can get delay_free back (a plain one is freed at once).
    _, done = run(e, list(range(1, 40)), max_tokens=1, rid=rid,
                  params={"do_remote_decode": True, "transfer_id": f"t-{rid}", "remote_engine_id": "d0"})
    time.sleep(0.1)
    return node, g, e, done


def test_delayed_free_blocks_come_back_only_when_every_rank_reports_done_sending(tmp_path, engines):
    node, g, e, done = prefill_keeping_blocks_for_d(tmp_path, engines, "p1")
    assert done.kv_transfer_params["do_remote_prefill"] is True
    assert e.stats()["free_blocks"] == g.num_blocks - 3 and e.stats()["delayed_free"] == 1
    node.finished[0].append({"done_sending": ["p1"]})
    time.sleep(0.1)
    assert e.stats()["free_blocks"] == g.num_blocks - 3  # rank 1 has not said so yet
    node.finished[1].append({"done_sending": ["p1"]})
    s = wait_idle(e)
    assert s["free_blocks"] == g.num_blocks and s["delayed_free"] == 0
    assert {"finished_req_ids": ["p1"]} in node.calls("get_finished")
    node.close()


def test_a_rank_reporting_a_request_twice_does_not_stand_for_another_rank(tmp_path, engines):
    # A worker reports a request again when it ends after its done (an abort after the done):
    # the blocks stay lent until every rank has reported, whatever one rank says twice.
    node, g, e, _ = prefill_keeping_blocks_for_d(tmp_path, engines, "p2")
    assert e.stats()["delayed_free"] == 1
    node.finished[0].append({"done_sending": ["p2"]})
    node.finished[0].append({"failed": {"p2": "request p2 aborted"}})
    time.sleep(0.2)
    assert e.stats()["free_blocks"] == g.num_blocks - 3 and e.stats()["delayed_free"] == 1
    node.finished[1].append({"done_sending": ["p2"]})
    s = wait_idle(e)
    assert s["free_blocks"] == g.num_blocks and s["delayed_free"] == 0
    node.close()


def test_abort_before_scheduling_tells_the_node_with_no_blocks(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    e = ReferenceEngine(geometry(), role="decode", socket_path=node.path)
    try:
        e.connect()
        # Both reach the loop in one batch, the abort after them: "small" is never scheduled.
        # "small" is one kvferry would move (P holds its blocks until told), so the node hears of
        # it; a request without params it would not (PortClient's send_plain).
        big = e.submit(Request("big", list(range(1, 100)), 5, None))
        small = e.submit(Request("small", list(range(500, 540)), 5,
                                 {"do_remote_prefill": True, "transfer_id": "t-small", "remote_engine_id": "p0"}))
        e.abort("small")
        e.start()
        events = []
        while not events or events[-1].kind == "token":
            events.append(small.events.get(timeout=10))
        assert [ev.kind for ev in events] == ["done"] and events[0].finish_reason == "abort"
        while big.events.get(timeout=30).kind == "token":
            pass
        assert [(a["request_id"], a["block_ids"], a["status"]) for a in node.calls("request_finished")] == [
            ("small", [], "aborted")]
        assert "small" not in [a["request_id"] for a in node.calls("update_state_after_alloc")]
        assert wait_idle(e)["free_blocks"] == 64
    finally:
        e.stop()
        node.close()
