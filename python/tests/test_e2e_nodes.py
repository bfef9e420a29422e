"""End to end: real kvferry nodes (P with TP 2, D with TP 1, separate JVMs from the jar) with
reference engines beside them as separate processes, driven as a disaggregation proxy would.
D checks every byte it receives; its tokens must equal an undisaggregated engine's; both sides
must end with every block free. Skipped, with the reason, when the jar is absent."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import pytest

from kvferry.port import EngineBusy, NodeUnavailable, PortClient

from .cluster import Engine, Node, complete, metric, needs_node, settle, workdir

pytestmark = needs_node

GEOMETRY = ["--layers", "2", "--kv-heads", "4", "--head-dim", "16", "--block-size", "16",
            "--num-blocks", "160", "--max-num-batched-tokens", "64"]
P_TP, D_TP = 2, 1
READ_ABORT_TIMEOUT_S = 20
DEFER_TIMEOUT_S = 20


class Pair:
    def __init__(self, p: Engine, d: Engine, mode: str):
        self.p, self.d, self.mode = p, d, mode
        self.p_id = p.stats()["engine_id"]
        self.d_id = d.stats()["engine_id"]

    def run(self, prompt: list[int], max_tokens: int = 6) -> tuple[dict, dict]:
        """One request through P and D as vLLM's toy proxy sends it; returns (P's, D's) answers."""
        rid = uuid.uuid4().hex[:10]
        tid = f"xfer-{rid}"
        p_params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": tid,
                    "remote_engine_id": self.d_id}
        if self.mode == "read":
            p_out = complete(self.p.url, prompt, 1, p_params, rid)
            d_params = dict(p_out["kv_transfer_params"])
            d_params.setdefault("transfer_id", tid)
            return p_out, complete(self.d.url, prompt, max_tokens, d_params, rid)
        d_params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": tid,
                    "remote_engine_id": self.p_id}
        box: dict = {}
        t = threading.Thread(target=lambda: box.setdefault("p", complete(self.p.url, prompt, 1, p_params, rid)))
        t.start()
        d_out = complete(self.d.url, prompt, max_tokens, d_params, rid)
        t.join(120)
        return box.get("p", {}), d_out


class Cluster:
    """A P node (TP 2) and a D node (TP 1), a baseline engine, and the current mode's P and D
    engines: a node serves one engine at a time, so switching modes replaces both engines."""

    def __init__(self) -> None:
        self.wd = workdir()
        # Short READ abort and WRITE defer timeouts, so blocks the nodes hold until a timeout (see
        # the abort tests) come back within the tests' waits.
        timeouts = {"kvferry.connector.read-abort-timeout": f"{READ_ABORT_TIMEOUT_S}s",
                    "kvferry.connector.defer-timeout": f"{DEFER_TIMEOUT_S}s"}
        self.p_node = Node(self.wd, "prefill", engine_id="p0", tp=P_TP, config=timeouts)
        self.d_node = Node(self.wd, "decode", engine_id="d0", tp=D_TP, seed_port=self.p_node.port, config=timeouts)
        self.engines: list[Engine] = []
        self.current: Pair | None = None
        self.p_node.wait_ready()
        self.d_node.wait_ready()
        self.baseline = self.engine("baseline", "--no-connector")

    def engine(self, name: str, *args: str) -> Engine:
        e = Engine(self.wd, name, *GEOMETRY, *args)
        self.engines.append(e)
        return e

    def p_engine(self, mode: str) -> Engine:
        return self.engine(f"p-{mode}", "--socket", self.p_node.socket, "--role", "prefill", "--mode", mode,
                           "--tp-size", str(P_TP))

    def d_engine(self, mode: str) -> Engine:
        return self.engine(f"d-{mode}", "--socket", self.d_node.socket, "--role", "decode", "--mode", mode,
                           "--tp-size", str(D_TP))

    def use(self, mode: str) -> Pair:
        if self.current is not None and self.current.mode == mode:
            return self.current
        if self.current is not None:
            self.current.p.stop()
            self.current.d.stop()
        self.current = Pair(self.p_engine(mode), self.d_engine(mode), mode)
        return self.current

    def close(self) -> None:
        for e in self.engines:
            e.stop()
        self.p_node.stop()
        self.d_node.stop()

    def logs(self) -> str:
        return "\n----\n".join([self.p_node.tail(), self.d_node.tail(), *[e.tail() for e in self.engines]])


@pytest.fixture(scope="module")
def cluster():
    c = Cluster()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module", params=["write", "read"])
def mode(request):
    return request.param


@pytest.fixture
def pair(cluster, mode) -> Pair:
    return cluster.use(mode)


def prompt(n: int, salt: int = 0) -> list[int]:
    rnd = uuid.uuid5(uuid.NAMESPACE_OID, f"{n}-{salt}-{time.monotonic_ns()}").int
    return [(rnd >> (i % 100)) % 31000 + 1 + i % 7 for i in range(n)]


def baseline_tokens(cluster: Cluster, p: list[int], max_tokens: int = 6) -> list[int]:
    return complete(cluster.baseline.url, p, max_tokens)["choices"][0]["token_ids"]


def assert_no_leak(*engines: Engine, timeout_s: float = 60) -> None:
    for e in engines:
        s = settle(e, timeout_s=timeout_s)
        assert s["free_blocks"] == s["num_blocks"], (e.name, s)
        assert (s["running"], s["waiting"], s["delayed_free"]) == (0, 0, 0), (e.name, s)
        # Nothing the node refused: among others, an answer the client gave the engine itself
        # that the node would have given otherwise (PortClient's get_num_new_matched_tokens).
        assert s["op_errors"] == 0, (e.name, s)


def test_kv_moves_tp2_to_tp1_every_byte_verified_and_tokens_match_the_baseline(cluster, pair, mode):
    by_word = "kvferry_receives_done_by_word_total"
    words_before = metric(cluster.d_node.management_url, by_word)
    for n in (5, 16, 17, 64, 130, 300):  # shorter than a block, exact blocks, chunked prefill
        p = prompt(n)
        p_out, d_out = pair.run(p)
        info = d_out["kvferry"]
        assert info["kv_verified"] is True, (mode, n, info)
        want_received = n if mode == "write" else n - 1
        assert info["received_tokens"] == want_received, (mode, n, info)
        assert info["checked_bytes"] > 0 or want_received == 0
        assert d_out["choices"][0]["token_ids"] == baseline_tokens(cluster, p), (mode, n)
        if mode == "read":
            assert p_out["kv_transfer_params"]["do_remote_prefill"] is True
    if mode == "write":
        # Both P workers write D's one worker, each with a done word of its own: D learns from
        # the words (each word is stored before its worker's WriteDone is sent, so the words win
        # nearly always; at least one receive shows the path works with two writers).
        assert metric(cluster.d_node.management_url, by_word) > words_before
    assert_no_leak(pair.p, pair.d)
    # The clients answered these ops themselves (P's finish after its connection's first; both
    # sides' admission), and the node, which checks each answer, refused none (above).
    p_local, d_local = settle(pair.p)["local_answers"], settle(pair.d)["local_answers"]
    assert p_local.get("request_finished", 0) >= 5 and p_local.get("get_num_new_matched_tokens", 0) >= 6, p_local
    assert d_local.get("get_num_new_matched_tokens", 0) >= 6, d_local
    # Steps built ahead (the client named the step and made the handle; the node, which checks
    # each step's counts, refused none): all but each connection's first, where counts are known.
    assert p_local.get("build_connector_meta", 0) >= 6 and d_local.get("build_connector_meta", 0) >= 6, (p_local, d_local)


def test_a_prefix_d_already_holds_is_not_transferred_again(cluster, pair, mode):
    first = prompt(200, 1)
    pair.run(first)
    second = first[:150] + prompt(40, 2)
    _, d_out = pair.run(second)
    info = d_out["kvferry"]
    assert info["prefix_hit_tokens"] == 144  # 9 full blocks of 16
    assert info["kv_verified"] is True
    assert info["received_tokens"] == (190 - 144 if mode == "write" else 190 - 1 - 144)
    assert d_out["choices"][0]["token_ids"] == baseline_tokens(cluster, second)
    assert_no_leak(pair.p, pair.d)


def _abandon(url: str, body: dict, rid: str, after_first_chunk: bool, delay_s: float) -> None:
    data = json.dumps(body).encode()
    host, port = url[len("http://"):].split(":")
    s = socket.create_connection((host, int(port)), timeout=60)
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"X-Request-Id: {rid}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    if after_first_chunk:
        got = b""
        while b"data: " not in got:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += chunk
    else:
        time.sleep(delay_s)
    s.shutdown(socket.SHUT_RDWR)
    s.close()


def test_write_abort_on_d_while_the_kv_is_on_its_way_frees_both_sides(cluster):
    pair = cluster.use("write")
    before = pair.d.stats()["aborted"]
    for i in range(8):  # the client leaves at different points: before, during and after the KV lands
        p = prompt(600, 10 + i)
        rid = uuid.uuid4().hex[:8]
        tid = f"xfer-{rid}"
        d_body = {"prompt": p, "max_tokens": 50, "stream": True,
                  "kv_transfer_params": {"do_remote_prefill": True, "transfer_id": tid, "remote_engine_id": pair.p_id}}
        p_body = {"prompt": p, "max_tokens": 1,
                  "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid, "remote_engine_id": pair.d_id}}
        t = threading.Thread(target=complete_quietly, args=(pair.p.url, p_body, rid))
        t.start()
        _abandon(pair.d.url, d_body, rid, after_first_chunk=False, delay_s=0.03 * i)
        t.join(60)
    # D aborting while it waits for P's writes: its blocks must come back (get_finished reports the
    # request). This failed in full runs (D's engine had just attached, so P's writers did not list
    # it yet): P's rank 1 of TP 2 confirmed the abandon to a D rank 1 that D of TP 1 does not have,
    # and D held the blocks until its engine detached.
    assert_no_leak(pair.p, pair.d, timeout_s=60)
    assert pair.d.stats()["aborted"] >= before + 1
    # and the pair still works
    p = prompt(70, 99)
    _, d_out = pair.run(p)
    assert d_out["kvferry"]["kv_verified"] is True


def complete_quietly(url: str, body: dict, rid: str) -> None:
    try:
        complete(url, body["prompt"], body["max_tokens"], body.get("kv_transfer_params"), rid)
    except (AssertionError, OSError):
        pass  # P's leg of an aborted or killed request may fail; what counts is that nothing leaks


def _in_process_d(cluster: Cluster, mode: str):
    """The mode's P engine (a process) and, on the D node, a D engine in this process (not yet
    started), to act at exact points of D's loop."""
    from kvferry.reference import Geometry, ReferenceEngine

    pair = cluster.use(mode)
    pair.d.stop()
    g = Geometry(layers=2, num_blocks=160, block_size=16, kv_heads=4, head_dim=16, tp_size=D_TP)
    d = ReferenceEngine(g, role="decode", mode=mode, socket_path=cluster.d_node.socket, max_num_batched_tokens=64)
    d.connect(wait_s=30)
    return pair, d


def _end_in_process_d(cluster: Cluster, pair: Pair, d) -> None:
    d.stop()
    pair.p.stop()
    cluster.current = None


def _wait_in_process_idle(d, timeout_s: float = 30) -> dict:
    deadline = time.monotonic() + timeout_s
    s = d.stats()
    while time.monotonic() < deadline:
        s = d.stats()
        if s["free_blocks"] == s["num_blocks"] and not s["delayed_free"] and not s["running"] and not s["waiting"]:
            break
        time.sleep(0.05)
    return s


def _read_prefill(pair: Pair, d, p: list[int], rid: str) -> dict:
    params = {"do_remote_decode": True, "transfer_id": f"x-{rid}", "remote_engine_id": d.stats()["engine_id"]}
    out = complete(pair.p.url, p, 1, params, rid)
    assert pair.p.stats()["delayed_free"] == 1  # P keeps its blocks for D
    return out["kv_transfer_params"]


def test_read_abort_on_d_before_it_is_scheduled_tells_p_to_free(cluster):
    from kvferry.reference import Request

    pair, d = _in_process_d(cluster, "read")
    try:
        p = prompt(300, 20)
        rid = uuid.uuid4().hex[:8]
        params = _read_prefill(pair, d, p, rid)
        r = d.submit(Request(f"cmpl-{rid}", p, 5, params))
        d.abort(r.request_id)  # both reach D's loop before its first step: never scheduled
        d.start()
        ev = r.events.get(timeout=30)
        assert (ev.kind, ev.finish_reason) == ("done", "abort")
        started = time.monotonic()
        s = settle(pair.p, timeout_s=READ_ABORT_TIMEOUT_S + 30)
        released_after_s = time.monotonic() - started
        assert s["free_blocks"] == s["num_blocks"] and s["delayed_free"] == 0, s
        assert _wait_in_process_idle(d)["free_blocks"] == 160
        # The spec: "the node tells P to free" -- not P's abort timeout.
        assert released_after_s < READ_ABORT_TIMEOUT_S / 2, f"P freed after {released_after_s:.1f} s"
    finally:
        _end_in_process_d(cluster, pair, d)


def test_read_abort_on_d_while_it_loads_frees_both_sides(cluster):
    from kvferry.reference import Request

    pair, d = _in_process_d(cluster, "read")
    try:
        after_alloc = d.connector.scheduler.update_state_after_alloc

        def then_abort(request_id, block_ids, num_external_tokens):
            after_alloc(request_id, block_ids, num_external_tokens)
            if num_external_tokens > 0:
                d.abort(request_id)  # the load is under way: the client leaves

        d.connector.scheduler.update_state_after_alloc = then_abort
        d.start()
        p = prompt(300, 22)
        rid = uuid.uuid4().hex[:8]
        params = _read_prefill(pair, d, p, rid)
        r = d.submit(Request(f"cmpl-{rid}", p, 5, params))
        ev = r.events.get(timeout=30)
        assert (ev.kind, ev.finish_reason) == ("done", "abort")
        assert _wait_in_process_idle(d)["free_blocks"] == 160
        # At once when D's node tells P's, at the latest at the READ abort timeout (seen both ways).
        s = settle(pair.p, timeout_s=READ_ABORT_TIMEOUT_S + 30)
        assert s["free_blocks"] == s["num_blocks"] and s["delayed_free"] == 0, s
    finally:
        _end_in_process_d(cluster, pair, d)


def test_read_abort_on_p_mid_prefill_frees_p(cluster):
    """P's client leaves after P's first chunk of a long prompt: P frees at once (no D is owed)."""
    from kvferry.reference import Geometry, ReferenceEngine, Request

    pair = cluster.use("read")
    pair.p.stop()
    g = Geometry(layers=2, num_blocks=160, block_size=16, kv_heads=4, head_dim=16, tp_size=P_TP)
    p_engine = ReferenceEngine(g, role="prefill", mode="read", socket_path=cluster.p_node.socket,
                               max_num_batched_tokens=64)
    try:
        p_engine.connect(wait_s=30)
        forward = p_engine._forward

        def forward_then_abort(scheduled, loads):
            forward(scheduled, loads)
            for r in scheduled:
                if r.num_computed == 0:  # its first chunk
                    p_engine.abort(r.request_id)

        p_engine._forward = forward_then_abort
        p_engine.start()
        rid = uuid.uuid4().hex[:8]
        r = p_engine.submit(Request(f"cmpl-{rid}", prompt(900, 21), 1, {
            "do_remote_decode": True, "transfer_id": f"x-{rid}", "remote_engine_id": pair.d_id}))
        ev = r.events.get(timeout=30)
        assert (ev.kind, ev.finish_reason) == ("done", "abort"), ev
        s = _wait_in_process_idle(p_engine, timeout_s=30)
        assert (s["free_blocks"], s["delayed_free"], s["aborted"]) == (160, 0, 1), s
    finally:
        p_engine.stop()
        pair.d.stop()
        cluster.current = None


def test_demo_driver_reports_matching_tokens_verified_kv_and_no_leaks(cluster, pair, mode):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-m", "kvferry.demo", "--prefill", pair.p.url, "--decode", pair.d.url,
                          "--baseline", cluster.baseline.url, "--mode", mode, "--json", "--requests", "14",
                          "--max-prompt", "500", "--seed", "7", "--abort-rate", "0.2"],
                         capture_output=True, text=True, env=env, timeout=600)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert lines, out.stdout + out.stderr
    r = json.loads(lines[-1])
    assert r["mode"] == mode and r["requests"] == 14
    assert r["tokens_match"] and r["kv_verified"], r
    assert r["leaked_blocks"] == {"decode": 0, "prefill": 0}, r
    assert r["completed"] + r["aborted"] == 14 and r["aborted"] >= 1, r
    assert out.returncode == 0, out.stdout + out.stderr


def test_kill9_of_p_engine_mid_transfer_fails_ds_request_and_d_frees_everything(cluster):
    c = cluster
    pair = c.use("write")
    big = prompt(2400, 30)  # many chunked steps on P
    rid = uuid.uuid4().hex[:8]
    tid = f"xfer-{rid}"
    result: dict = {}

    def d_leg() -> None:
        try:
            result["d"] = complete(pair.d.url, big, 5, {"do_remote_prefill": True, "transfer_id": tid,
                                                        "remote_engine_id": pair.p_id}, rid)
        except AssertionError as e:
            result["error"] = str(e)

    t = threading.Thread(target=d_leg)
    t.start()
    threading.Thread(target=complete_quietly, args=(pair.p.url, {
        "prompt": big, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid, "remote_engine_id": pair.d_id}}, rid),
        daemon=True).start()
    deadline = time.monotonic() + 30
    while pair.p.stats()["running"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    pair.p.kill9()
    t.join(120)
    assert "error" in result, result  # D's request failed rather than decoding from missing KV
    assert_no_leak(pair.d)
    # The P node accepts a new P engine, and the pair works again.
    c.current = pair = Pair(c.p_engine("write"), pair.d, "write")
    q = prompt(100, 31)
    _, d_out = pair.run(q)
    assert d_out["kvferry"]["kv_verified"] is True
    assert d_out["choices"][0]["token_ids"] == baseline_tokens(c, q)


def test_kill9_of_d_engine_makes_p_free_what_it_kept_for_d(cluster):
    c = cluster
    pair = c.use("read")
    p = prompt(250, 40)
    rid = uuid.uuid4().hex[:8]
    complete(pair.p.url, p, 1, {"do_remote_decode": True, "transfer_id": f"x-{rid}", "remote_engine_id": pair.d_id}, rid)
    assert pair.p.stats()["delayed_free"] == 1
    pair.d.kill9()
    # D never comes: P frees when the node learns D is gone (or at the abort timeout).
    s = settle(pair.p, timeout_s=180)
    assert s["free_blocks"] == s["num_blocks"] and s["delayed_free"] == 0, s
    c.current = pair = Pair(pair.p, c.d_engine("read"), "read")
    q = prompt(90, 41)
    _, d_out = pair.run(q)
    assert d_out["kvferry"]["kv_verified"] is True


def test_kill9_of_a_node_raises_node_unavailable_and_clients_reconnect_when_it_is_back(tmp_path):
    wd = workdir()
    node = Node(wd, "prefill", engine_id="solo", modes="write", tp=1)
    engine = None
    try:
        node.wait_ready()
        engine = Engine(wd, "solo", *GEOMETRY, "--socket", node.socket, "--role", "prefill", "--mode", "write")
        out = complete(engine.url, prompt(40, 50), 3)
        assert len(out["choices"][0]["token_ids"]) == 3
        client = PortClient(node.socket, "scheduler", engine={"mode": "write"})
        with pytest.raises(EngineBusy):
            client.hello()  # the engine's own scheduler holds the slot
        node.kill9()
        with pytest.raises(NodeUnavailable):
            PortClient(node.socket, "scheduler").hello()
        # The engine notices at its next request: it answers an error, and /health says why.
        with pytest.raises(AssertionError, match="unavailable"):
            complete(engine.url, prompt(40, 51), 3)
        node.start()
        node.wait_ready()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                out = complete(engine.url, prompt(40, 52), 3)
                break
            except AssertionError:
                time.sleep(0.5)
        else:
            raise AssertionError("the engine did not reconnect to the restarted node:\n" + engine.tail())
        assert len(out["choices"][0]["token_ids"]) == 3
        assert engine.stats()["node_down"] is None
    finally:
        if engine is not None:
            engine.stop()
        node.stop()


def test_mla_layout_moves_verified_kv_tp2_to_tp1(cluster):
    """MLA: one latent region per layer, every TP rank holding all of it."""
    if cluster.current is not None:
        cluster.current.p.stop()
        cluster.current.d.stop()
        cluster.current = None
    mla = ["--mla", "--latent", "48"]
    p = cluster.engine("p-mla", *mla, "--socket", cluster.p_node.socket, "--role", "prefill", "--mode", "write",
                       "--tp-size", str(P_TP))
    d = cluster.engine("d-mla", *mla, "--socket", cluster.d_node.socket, "--role", "decode", "--mode", "write",
                       "--tp-size", str(D_TP))
    base = cluster.engine("baseline-mla", *mla, "--no-connector")
    pair = Pair(p, d, "write")
    try:
        for n in (20, 150):
            q = prompt(n, 60)
            _, d_out = pair.run(q)
            assert d_out["kvferry"]["kv_verified"] is True, d_out["kvferry"]
            assert d_out["kvferry"]["received_tokens"] == n
            assert d_out["choices"][0]["token_ids"] == complete(base.url, q, 6)["choices"][0]["token_ids"]
        assert_no_leak(p, d)
    finally:
        p.stop()
        d.stop()
        base.stop()


def _blocks_first_pair_moves_verified_kv(engine, p_socket: str, d_socket: str, p_layout: list[str],
                                         p_tp: int, d_tp: int, mode: str, baseline_url: str) -> None:
    p = engine("p-bf", *p_layout, "--socket", p_socket, "--role", "prefill", "--mode", mode, "--tp-size", str(p_tp))
    d = engine("d-bf", "--blocks-first", "--socket", d_socket, "--role", "decode", "--mode", mode,
               "--tp-size", str(d_tp))
    pair = Pair(p, d, mode)
    try:
        for n in (20, 150):  # within a block; several blocks and chunked prefill
            q = prompt(n, 61)
            _, d_out = pair.run(q)
            assert d_out["kvferry"]["kv_verified"] is True, d_out["kvferry"]
            assert d_out["kvferry"]["received_tokens"] == (n if mode == "write" else n - 1)
            assert d_out["choices"][0]["token_ids"] == complete(baseline_url, q, 6)["choices"][0]["token_ids"]
        assert_no_leak(p, d)
    finally:
        p.stop()
        d.stop()


@pytest.mark.parametrize("p_layout,mode", [
    ([], "write"),  # [2, num_blocks, ...] on P: the layouts differ, token ranges map them
    ([], "read"),
    (["--blocks-first"], "write"),  # both blocks-first, P's TP 2 heads sliced into D's TP 1
])
def test_blocks_first_layout_moves_verified_kv_tp2_to_tp1(cluster, p_layout, mode):
    """FlashInfer's [num_blocks, 2, block_size, heads, head_dim] on D, every byte checked, D's
    tokens those of the undisaggregated baseline (its own layout the standard one)."""
    if cluster.current is not None:
        cluster.current.p.stop()
        cluster.current.d.stop()
        cluster.current = None
    _blocks_first_pair_moves_verified_kv(cluster.engine, cluster.p_node.socket, cluster.d_node.socket, p_layout,
                                         P_TP, D_TP, mode, cluster.baseline.url)


def test_blocks_first_on_both_sides_of_one_tp_size_moves_whole_blocks(cluster):
    """Same layout, block size and TP on both sides: the block plan, one copy per run of whole
    blocks (K and V together). Its own TP 1 nodes, as the shared ones are TP 2 and 1."""
    wd = workdir()
    p_node = Node(wd, "prefill", engine_id="p-bf1", tp=1)
    d_node = Node(wd, "decode", engine_id="d-bf1", tp=1, seed_port=p_node.port)
    engines: list[Engine] = []

    def engine(name: str, *args: str) -> Engine:
        engines.append(Engine(wd, name, *GEOMETRY, *args))
        return engines[-1]

    try:
        p_node.wait_ready()
        d_node.wait_ready()
        for mode in ("write", "read"):
            _blocks_first_pair_moves_verified_kv(engine, p_node.socket, d_node.socket, ["--blocks-first"], 1, 1,
                                                 mode, cluster.baseline.url)
    finally:
        for e in engines:
            e.stop()
        d_node.stop()
        p_node.stop()


def test_connector_starts_a_node_beside_the_engine_when_none_answers(tmp_path):
    from kvferry import vllm as kv

    from .cluster import JAR, JAVA, free_port
    from .test_vllm_adapter import VllmConfig, KVTransferConfig

    sock = str(tmp_path / "started.sock")
    extra = {"socket": sock, "mode": "write", "start_node": True, "kvferry_jar": JAR, "java": JAVA,
             "node_args": ["--port", str(free_port()), "--management-port", str(free_port())]}
    cfg = VllmConfig(KVTransferConfig("KvferryConnector", "kv_producer", extra))
    try:
        c = kv.KvferryConnector(cfg, kv.KVConnectorRole.SCHEDULER)
        assert c.connector_scheduler.client.node_info["role"] == "prefill"
        assert len(kv._started_nodes) == 1 and kv._started_nodes[0].poll() is None
        # A second connector finds the node answering and starts none.
        kv.ensure_node(sock, extra, {"role": "prefill", "mode": "write"})
        assert len(kv._started_nodes) == 1
        c.shutdown()
    finally:
        kv.stop_started_nodes()
    assert not kv._started_nodes


def test_abort_after_the_kv_landed_but_before_d_computed_frees_both_sides(cluster):
    """The narrow window: D's node reported the KV in (done_receiving), then the client leaves
    before D's next step schedules the request. D's request_finished(aborted) must not leave its
    blocks waiting for a report that already came."""
    from kvferry.reference import Geometry, ReferenceEngine, Request

    pair = cluster.use("write")
    pair.d.stop()  # an in-process D instead, to abort at that exact point
    g = Geometry(layers=2, num_blocks=160, block_size=16, kv_heads=4, head_dim=16, tp_size=D_TP)
    d = ReferenceEngine(g, role="decode", mode="write", socket_path=cluster.d_node.socket, max_num_batched_tokens=64)
    try:
        d.connect(wait_s=30)
        received = d._received

        def received_then_abort(r):
            received(r)
            d.abort(r.request_id)  # drained before the next step schedules it

        d._received = received_then_abort
        d.start()
        for i in range(3):
            p = prompt(300, 70 + i)
            rid = uuid.uuid4().hex[:8]
            tid = f"xfer-{rid}"
            t = threading.Thread(target=complete_quietly, args=(pair.p.url, {
                "prompt": p, "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": True, "transfer_id": tid,
                                       "remote_engine_id": d.stats()["engine_id"]}}, rid))
            t.start()
            r = d.submit(Request(f"cmpl-{rid}", p, 5, {"do_remote_prefill": True, "transfer_id": tid,
                                                       "remote_engine_id": pair.p_id}))
            events = [r.events.get(timeout=120)]
            while events[-1].kind == "token":
                events.append(r.events.get(timeout=120))
            assert events[-1].kind == "done" and events[-1].finish_reason == "abort", events[-1]
            t.join(60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            s = d.stats()
            if s["free_blocks"] == s["num_blocks"] and not s["delayed_free"]:
                break
            time.sleep(0.1)
        assert (s["free_blocks"], s["delayed_free"], s["running"]) == (160, 0, 0), s
        assert_no_leak(pair.p)
    finally:
        d.stop()
        pair.p.stop()
        cluster.current = None
