"""The port client: frames, hello, typed errors, one-way ops, a node that goes away."""

from __future__ import annotations

import socket
import struct
import threading
import time

import msgpack
import pytest

from kvferry import port
from kvferry.port import (BadArgs, BadVersion, FrameReader, NodeUnavailable, PortClient, PortError,
                          ProtocolViolation, UnknownMetadata, UnknownOp, WrongSide, encode_frame)

from .fakenode import FakeNode, Refuse


def worker_client(path: str, **kw) -> PortClient:
    return PortClient(path, "worker", tp_rank=0,
                      geometry={"layout": "standard", "num_blocks": 4, "block_size": 16, "kv_heads": 2,
                                "head_dim": 8, "dtype_bytes": 2},
                      memory={"kind": "host", "layers": []}, **kw)


def test_frame_is_big_endian_length_then_one_msgpack_map():
    frame = encode_frame({"id": 7, "op": "ping", "args": {"b": b"\x00\x01"}})
    (n,) = struct.unpack(">I", frame[:4])
    assert n == len(frame) - 4
    assert msgpack.unpackb(frame[4:], raw=False) == {"id": 7, "op": "ping", "args": {"b": b"\x00\x01"}}


def test_binary_and_text_stay_distinct_through_a_frame():
    a, b = socket.socketpair()
    a.sendall(encode_frame({"s": "text", "b": b"bytes"}))
    got = FrameReader(b).read()
    assert got == {"s": "text", "b": b"bytes"}
    assert isinstance(got["s"], str) and isinstance(got["b"], bytes)


def test_reader_refuses_a_zero_length_frame_and_a_non_map():
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", 0))
    with pytest.raises(ProtocolViolation, match="length 0"):
        FrameReader(b).read()
    a.sendall(struct.pack(">I", 1) + msgpack.packb(5))
    with pytest.raises(ProtocolViolation, match="not a map"):
        FrameReader(b).read()


def test_a_spinning_reader_reads_frames_within_and_after_its_spin_and_keeps_the_timeout():
    a, b = socket.socketpair()
    b.settimeout(5.0)
    r = FrameReader(b, spin_s=0.02)
    a.sendall(encode_frame({"id": 1}))
    assert r.read() == {"id": 1}
    frame = encode_frame({"id": 2, "ok": {"x": b"y" * 100}})
    later = threading.Timer(0.1, lambda: (a.sendall(frame[:3]), time.sleep(0.01), a.sendall(frame[3:])))
    later.start()  # past the spin, in two pieces: the reader sleeps on the socket for it
    assert r.read() == {"id": 2, "ok": {"x": b"y" * 100}}
    later.join()
    assert b.gettimeout() == 5.0
    a.close()
    with pytest.raises(EOFError):
        r.read()


def test_reply_spin_is_checked(monkeypatch):
    for bad in (-1, float("inf"), float("nan")):
        with pytest.raises(ValueError, match=">= 0 and finite"):
            port.PortClient("/nowhere", "scheduler", reply_spin_us=bad)
    assert port.PortClient("/nowhere", "scheduler", reply_spin_us=5e6, timeout_s=2.0).reply_spin_s == 2.0
    monkeypatch.setenv("KVFERRY_PORT_SPIN_US", "fast")
    with pytest.raises(ValueError, match="KVFERRY_PORT_SPIN_US"):
        port.PortClient("/nowhere", "scheduler")
    monkeypatch.setenv("KVFERRY_PORT_SPIN_US", "150")
    assert port.PortClient("/nowhere", "scheduler").reply_spin_s == pytest.approx(150e-6)


def test_reader_refuses_a_frame_over_64_mib():
    a, b = socket.socketpair()
    a.sendall(struct.pack(">I", port.MAX_FRAME_BYTES + 1))
    with pytest.raises(ProtocolViolation, match="outside"):
        FrameReader(b).read()


def test_every_spec_error_code_has_its_own_class():
    codes = ["bad_frame", "unauthorized", "bad_version", "hello_required", "already_hello", "unknown_op",
             "wrong_side", "bad_args", "identity_mismatch", "engine_busy", "bad_memory", "unknown_request",
             "unknown_metadata", "workers_missing", "node_stopping", "internal"]
    classes = {type(port.error_for(c, "m")) for c in codes}
    assert len(classes) == len(codes) and PortError not in classes
    assert {c for c in codes if port.error_for(c, "m").fatal} == {"bad_frame", "unauthorized", "bad_version"}
    unknown = port.error_for("from_the_future", "m")
    assert type(unknown) is PortError and unknown.code == "from_the_future"


def test_hello_sends_version_side_and_identity(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "read"}, http_url="http://x:1")
    info = c.hello()
    assert info["version"] == 2
    assert node.hellos == [{"version": 2, "side": "scheduler", "engine": {"role": "prefill", "mode": "read"},
                            "http_url": "http://x:1"}]
    assert c.ping() == {"node": "fake"}
    node.close()


def test_worker_hello_carries_rank_geometry_and_memory(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    worker_client(node.path).hello()
    h = node.hellos[0]
    assert h["side"] == "worker" and h["tp_rank"] == 0 and h["geometry"]["kv_heads"] == 2
    assert h["memory"] == {"kind": "host", "layers": []}
    node.close()


def test_error_reply_raises_its_typed_error_and_the_connection_stays_usable(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = worker_client(node.path)
    c.hello()
    with pytest.raises(WrongSide) as e:
        c.get_num_new_matched_tokens("r", 10, None, 0)
    assert e.value.code == "wrong_side" and e.value.op == "get_num_new_matched_tokens"
    with pytest.raises(UnknownOp):
        c.call("no_such_op")
    assert c.start_load_kv() == 0  # still connected
    node.close()


def test_a_fatal_error_closes_the_client(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler")
    c._hello_args = lambda *_: {"version": 99, "side": "scheduler"}  # type: ignore[method-assign]
    with pytest.raises(BadVersion, match=r"supported: \[1, 2\]"):
        c.hello()
    assert not c.connected
    with pytest.raises(NodeUnavailable):
        c.ping()
    node.close()


def test_one_way_ops_get_no_reply_and_their_errors_come_back_in_get_finished(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = worker_client(node.path)
    c.hello()
    c.bind_connector_metadata(b"never built")
    c.save_kv_layer(0)
    with pytest.raises(UnknownMetadata) as e:
        c.get_finished(["r1"])
    assert e.value.finished["done_sending"] == []  # the sets are not lost
    assert node.calls("get_finished")[0] == {"finished_req_ids": ["r1"]}
    assert node.ops() == ["hello", "bind_connector_metadata", "save_kv_layer", "get_finished"]
    node.close()


def test_get_finished_can_return_op_errors_instead_of_raising(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = worker_client(node.path)
    c.hello()
    c.bind_connector_metadata(b"bogus")
    f = c.get_finished(raise_op_errors=False)
    assert [e["code"] for e in f["op_errors"]] == ["unknown_metadata"]
    node.close()


def test_missing_socket_raises_node_unavailable_naming_the_path(tmp_path):
    path = str(tmp_path / "absent.sock")
    with pytest.raises(NodeUnavailable, match="absent.sock"):
        PortClient(path, "scheduler").hello()


def test_node_closing_mid_call_raises_node_unavailable_then_every_call_until_reconnect(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler")
    c.hello()
    node.reply_before_close = b"request_finished"
    with pytest.raises(NodeUnavailable, match="closed the connection during request_finished"):
        c.request_finished("r", [], "aborted")
    with pytest.raises(NodeUnavailable):
        c.ping()
    node.reply_before_close = None
    c.reconnect()
    assert c.ping() == {"node": "fake"}
    assert len(node.hellos) == 2  # said hello again
    node.close()


def test_reconnect_waits_for_a_node_that_comes_back(tmp_path):
    path = str(tmp_path / "n.sock")
    node = FakeNode(path)
    c = PortClient(path, "scheduler")
    c.hello()
    node.close()
    with pytest.raises(NodeUnavailable):
        c.ping()
    holder = {}
    t = threading.Timer(0.3, lambda: holder.setdefault("node", FakeNode(path)))
    t.start()
    with pytest.raises(NodeUnavailable):
        c.reconnect(wait_s=0)
    c.reconnect(wait_s=10)
    assert c.ping() == {"node": "fake"}
    holder["node"].close()


def test_a_decode_scheduler_lends_no_block_where_nothing_is_loaded(tmp_path):
    """A decode engine's blocks go to the node only with tokens to load: with none (a full prefix
    hit, or the call after the load) the engine's list may hold cached blocks other requests
    share, and the node would lend them to a transfer."""
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", engine={"role": "decode", "mode": "read"})
    c.hello()
    params = {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p0", "remote_block_ids": [1, 2, 3]}
    c.get_num_new_matched_tokens("full", 33, params, 32)
    c.update_state_after_alloc("full", [3, 4, 9], 0)
    c.get_num_new_matched_tokens("some", 33, {**params, "transfer_id": "t2"}, 16)
    c.update_state_after_alloc("some", [8, 9], 16)
    c.ping()  # a round trip: the one-way ops before it have been read
    assert [(a["request_id"], a["block_ids"]) for a in node.calls("update_state_after_alloc")] == [
        ("full", []), ("some", [8, 9])]
    node.close()


def test_scheduler_ops_send_the_spec_args(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.matched = lambda a: {"count": a["num_prompt_tokens"] - 1, "async": True}
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": {"do_remote_prefill": True}}
    c = PortClient(node.path, "scheduler")
    c.hello()
    assert c.get_num_new_matched_tokens("r", 33, {"do_remote_prefill": True}, 0) == (32, True)
    c.update_state_after_alloc("r", [3, 4], 0)
    meta = c.build_connector_meta([{"request_id": "r", "block_ids": [3, 4], "num_computed_tokens": 33}], [])
    assert msgpack.unpackb(meta) == {"step": 1, "loads": 0, "saves": 0}
    assert c.request_finished("r", [3, 4], "length_capped") == (True, {"do_remote_prefill": True})
    assert node.calls("get_num_new_matched_tokens") == [
        {"request_id": "r", "num_prompt_tokens": 33, "kv_transfer_params": {"do_remote_prefill": True},
         "num_computed_tokens": 0}]
    assert node.calls("request_finished") == [{"request_id": "r", "block_ids": [3, 4], "status": "length_capped"}]
    with pytest.raises(ValueError):
        c.request_finished("r", [], "finished")
    node.close()


def test_a_prefill_engines_scheduler_sends_a_routers_params_one_way_and_asks_about_any_other(tmp_path):
    """A prefill node never loads: for params of the form a router gives P the answer is (0, False),
    so P's scheduler does not wait for it before its prefill (the node still hears of the request
    first). Params the client cannot vouch for still ask, so the node's refusal comes at once."""
    node = FakeNode(str(tmp_path / "n.sock"))

    def matched(a):
        if "transfer_id" not in a["kv_transfer_params"]:
            raise Refuse("bad_args", "kv_transfer_params.transfer_id is missing")
        return {"count": 99, "async": True}  # were it asked, P's client would say (99, True)

    node.matched = matched
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "write"})
    c.hello()
    routed = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "t",
              "remote_engine_id": "decode-0", "remote_dp_rank": 0}
    assert c.get_num_new_matched_tokens("p", 40, routed, 0) == (0, False)
    c.update_state_after_alloc("p", [1, 2, 3], 0)
    c.build_connector_meta([{"request_id": "p", "block_ids": [1, 2, 3], "num_computed_tokens": 40}], [])
    assert node.ops() == ["hello", "get_num_new_matched_tokens", "update_state_after_alloc",
                          "build_connector_meta"]
    assert node.calls("get_num_new_matched_tokens")[0]["kv_transfer_params"] == routed
    with pytest.raises(BadArgs, match="transfer_id"):
        c.get_num_new_matched_tokens("bad", 40, {"do_remote_decode": True}, 0)
    # Telling the node of plain requests changes nothing here: a prefill node's answer is fixed.
    sp = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "write"}, send_plain=True)
    sp.hello()
    assert sp.get_num_new_matched_tokens("p2", 40, routed, 0) == (0, False)
    # A decode engine's scheduler always asks: its count is the node's.
    d = PortClient(node.path, "scheduler", engine={"role": "decode", "mode": "write"})
    d.hello()
    assert d.get_num_new_matched_tokens("q", 40, {"do_remote_prefill": True, "transfer_id": "u"}, 0) == (99, True)
    node.close()


@pytest.mark.parametrize("mode", ["write", "read"])
def test_a_prefill_engines_scheduler_answers_request_finished_once_the_node_showed_d_s_params(tmp_path, mode):
    """The first length-capped finish on a connection asks; later ones are answered from that
    answer (the node's engine, DP rank, TP size and workers are fixed while the connection
    lasts) with their own transfer id and blocks, and the op goes one-way at once carrying the
    answer. Stopped and aborted finishes, params the client cannot vouch for, a node that
    refused an answer and a new connection all ask again."""
    node = FakeNode(str(tmp_path / "n.sock"))
    uids = [-7, 12] if mode == "read" else []

    def finish(a):
        if a["status"] != "length_capped":
            return {"delay_free": a["status"] == "stopped", "kv_transfer_params": None}
        d = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": f"x-{a['request_id']}",
             "remote_engine_id": "prefill-0", "remote_dp_rank": 1, "remote_block_ids": a["block_ids"],
             "remote_host": "", "remote_port": 0, "tp_size": 2}
        return {"delay_free": bool(a["block_ids"]), "kv_transfer_params": {**d, "remote_worker_uids": uids} if uids else d}

    node.finish = finish
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": mode})
    c.hello()

    def routed(rid):
        return {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": f"x-{rid}",
                "remote_engine_id": "decode-0"}

    for rid in ("a", "b", "c", "d", "e", "f"):
        c.get_num_new_matched_tokens(rid, 40, routed(rid), 0)
    c.get_num_new_matched_tokens("odd", 40, {**routed("odd"), "remote_block_ids": [1]}, 0)

    def nodes(rid, blocks):
        r = finish({"request_id": rid, "block_ids": blocks, "status": "length_capped"})
        return r["delay_free"], r["kv_transfer_params"]

    assert c.request_finished("a", [1, 2, 3], "length_capped") == nodes("a", [1, 2, 3])
    n = len(node.calls("request_finished"))
    delay, params = c.request_finished("b", [4, 5], "length_capped")
    assert (delay, params) == nodes("b", [4, 5])
    params["tp_size"] = 99  # the engine's to change: the next answer is the node's still
    if uids:
        params["remote_worker_uids"].append(5)
    assert c.request_finished("c", [], "length_capped") == (False, {**nodes("c", [])[1], "remote_block_ids": []})
    # One-way, sent at once (nothing else follows it here), with the answer for the node to check.
    node.await_ops(11)  # hello, seven get_num_new_matched_tokens, three request_finished
    sent = node.calls("request_finished")[n:]
    assert [a.get("answered") for a in sent] == [{"delay_free": True, "kv_transfer_params": nodes("b", [4, 5])[1]},
                                                 {"delay_free": False, "kv_transfer_params": {**nodes("c", [])[1],
                                                                                             "remote_block_ids": []}}]
    # The node's answer depends on more than the client saw: asked.
    assert c.request_finished("d", [6], "stopped") == (True, None)
    assert c.request_finished("e", [7], "aborted") == (False, None)
    assert c.request_finished("odd", [8], "length_capped")[1]["transfer_id"] == "x-odd"
    assert all("answered" not in a for a in node.calls("request_finished")[n + 2:])
    # A refusal of an answer (the node would have answered otherwise) makes the client ask again.
    def refusing(a):
        raise Refuse("bad_args", f"request_finished of {a['request_id']}: the client answered otherwise")

    node.finish = refusing
    c.request_finished("f", [9], "length_capped")
    with pytest.raises(BadArgs):
        c.build_connector_meta([], [])
    node.finish = finish
    c.get_num_new_matched_tokens("g", 40, routed("g"), 0)
    m = len(node.calls("request_finished"))
    c.request_finished("g", [10], "length_capped")
    assert "answered" not in node.calls("request_finished")[m]
    # A new connection asks first again, as does a client told not to answer.
    c.reconnect()
    c.get_num_new_matched_tokens("h", 40, routed("h"), 0)
    c.request_finished("h", [11], "length_capped")
    assert "answered" not in node.calls("request_finished")[-1]
    asking = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": mode}, local_answers=False)
    asking.hello()
    for rid in ("i", "j"):
        asking.get_num_new_matched_tokens(rid, 40, routed(rid), 0)
        asking.request_finished(rid, [12], "length_capped")
    assert all("answered" not in a for a in node.calls("request_finished")[-2:])
    assert all("answered" not in a for a in node.calls("get_num_new_matched_tokens")[-2:])
    node.close()


def test_a_transfer_id_kept_for_another_request_is_not_answered_locally(tmp_path):
    """A prefill scheduler answers a finish locally only where the node would: a transfer id whose
    blocks it kept for another request's reader is the node's to refuse (its worker refuses the id
    and frees those blocks), so that finish is asked, and the node's answer is the client's."""
    node = FakeNode(str(tmp_path / "n.sock"))

    def finish(a):
        if a["request_id"] == "twin":
            return {"delay_free": False, "kv_transfer_params": None}  # the node's refusal
        return {"delay_free": True, "kv_transfer_params": {
            "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "tx-shared",
            "remote_engine_id": "prefill-0", "remote_dp_rank": 0, "remote_block_ids": a["block_ids"],
            "remote_host": "", "remote_port": 0, "tp_size": 1}}

    node.finish = finish
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "read"})
    c.hello()
    routed = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "tx-shared",
              "remote_engine_id": "decode-0"}
    for rid in ("first", "twin"):
        c.get_num_new_matched_tokens(rid, 40, routed, 0)
    assert c.request_finished("first", [1, 2], "length_capped")[0] is True
    n = len(node.calls("request_finished"))
    assert c.request_finished("twin", [3, 4], "length_capped") == (False, None)
    asked = node.calls("request_finished")[n:]
    assert [a["request_id"] for a in asked] == ["twin"] and "answered" not in asked[0]
    node.close()


def test_local_answers_follow_the_environment(monkeypatch):
    assert port.PortClient("/nowhere", "scheduler").local_answers
    monkeypatch.setenv("KVFERRY_PORT_LOCAL_ANSWERS", "0")
    assert not port.PortClient("/nowhere", "scheduler").local_answers
    assert port.PortClient("/nowhere", "scheduler", local_answers=True).local_answers
    monkeypatch.setenv("KVFERRY_PORT_LOCAL_ANSWERS", "no")
    with pytest.raises(ValueError, match="KVFERRY_PORT_LOCAL_ANSWERS"):
        port.PortClient("/nowhere", "scheduler")


@pytest.mark.parametrize("params", [
    None, {}, {"do_remote_decode": 1, "transfer_id": "t", "remote_engine_id": "d"},
    {"do_remote_decode": True, "remote_engine_id": "d"},
    {"do_remote_decode": True, "transfer_id": " ", "remote_engine_id": "d"},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": 7},
    {"do_remote_decode": True, "do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "d"},
    {"do_remote_decode": False, "do_remote_prefill": False, "transfer_id": "t", "remote_engine_id": "d"},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "remote_dp_rank": -1},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "remote_dp_rank": True},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "remote_port": 70000},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "tp_size": 0},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "remote_block_ids": [1]},
    {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d", "surprise": 1},
    {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p", "remote_block_ids": [1, -2]},
    {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p", "remote_block_ids": [1, True]},
    {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p", "remote_block_ids": "1,2"},
    {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p", "remote_worker_uids": [2**31]},
    {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p", "remote_host": 1},
])
def test_params_the_client_does_not_vouch_for_go_to_the_node(params):
    assert port._vouched(params) is None


def test_params_a_router_gives_p_and_p_gives_d_are_vouched_for():
    assert port._vouched({"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d"}) == "decode"
    assert port._vouched({"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": "t",
                          "remote_engine_id": "d", "remote_dp_rank": 3, "remote_host": "", "remote_port": 0,
                          "tp_size": 2}) == "decode"
    # As P's node returns them from request_finished (KvTransferParams.toMap).
    assert port._vouched({"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "t",
                          "remote_engine_id": "p", "remote_dp_rank": 0, "remote_block_ids": [4, 5, 6],
                          "remote_host": "", "remote_port": 0, "tp_size": 1,
                          "remote_worker_uids": [-7, 12]}) == "prefill"


@pytest.mark.parametrize("mode,last", [("write", 0), ("read", 1)])
def test_a_decode_engines_scheduler_answers_matched_tokens_with_the_nodes_rule(tmp_path, mode, last):
    """D's count is the prompt (as first named) less the tokens D has, less the last in READ;
    none once update_state_after_alloc took the transfer. The op still reaches the node, with
    the answer given, so a node that would have answered otherwise can refuse it."""
    node = FakeNode(str(tmp_path / "n.sock"))
    node.matched = lambda a: {"count": 999, "async": False}  # never read: the client answers
    c = PortClient(node.path, "scheduler", engine={"role": "decode", "mode": mode})
    c.hello()
    from_p = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": "t", "remote_engine_id": "p0",
              "remote_block_ids": [1, 2, 3, 4], "tp_size": 1}
    assert c.get_num_new_matched_tokens("r", 64, from_p, 16) == (48 - last, True)
    assert c.get_num_new_matched_tokens("r", 70, from_p, 0) == (64 - last, True), "the first prompt length"
    c.update_state_after_alloc("r", [7, 8, 9, 10], 64 - last)
    assert c.get_num_new_matched_tokens("r", 64, from_p, 0) == (0, False), "one transfer per request"
    c.build_connector_meta([], [])
    asked = node.calls("get_num_new_matched_tokens")
    assert [a["answered"] for a in asked] == [{"count": 48 - last, "async": True}, {"count": 64 - last, "async": True},
                                              {"count": 0, "async": False}]
    assert node.ops() == ["hello", "get_num_new_matched_tokens", "get_num_new_matched_tokens",
                          "update_state_after_alloc", "get_num_new_matched_tokens", "build_connector_meta"]
    # Finished: forgotten, so the same id later is a new request.
    c.request_finished("r", [7, 8, 9, 10], "stopped")
    assert c.get_num_new_matched_tokens("r", 32, from_p, 0) == (32 - last, True)
    # So after a new connection (a restarted node knows no request).
    c.update_state_after_alloc("r", [7, 8], 32 - last)
    c.reconnect()
    assert c.get_num_new_matched_tokens("r", 32, from_p, 0) == (32 - last, True)
    # Params it cannot vouch for, a client that tells the node of plain requests, or an engine
    # whose mode it does not know: asked.
    assert c.get_num_new_matched_tokens("odd", 64, {"do_remote_prefill": True, "transfer_id": "t"}, 0) == (999, False)
    plain = PortClient(node.path, "scheduler", engine={"role": "decode", "mode": mode}, send_plain=True)
    plain.hello()
    assert plain.get_num_new_matched_tokens("q", 64, from_p, 0) == (999, False)
    unknown = PortClient(node.path, "scheduler", engine={"role": "decode"})
    unknown.hello()
    assert unknown.get_num_new_matched_tokens("q2", 64, from_p, 0) == (999, False)
    node.close()


def test_answers_the_protocol_fixes_come_back_without_waiting_for_the_node(tmp_path):
    """A request without params matches nothing and is freed at once with nothing for a peer:
    with send_plain the client sends those ops one-way, so this fake node's other answers are
    never read for it."""
    node = FakeNode(str(tmp_path / "n.sock"))
    node.matched = lambda a: {"count": 99, "async": True}
    node.finish = lambda a: {"delay_free": True, "kv_transfer_params": {"x": 1}}
    c = PortClient(node.path, "scheduler", send_plain=True)
    c.hello()
    assert c.get_num_new_matched_tokens("plain", 40, None, 0) == (0, False)
    assert c.get_num_new_matched_tokens("to-d", 40, {"do_remote_decode": True, "transfer_id": "t"}, 0) == (99, True)
    assert c.get_num_new_matched_tokens("from-p", 40, {"do_remote_prefill": True, "transfer_id": "u"}, 0) == (99, True)
    assert c.request_finished("plain", [1], "stopped") == (False, None)
    assert c.request_finished("to-d", [2], "length_capped") == (True, {"x": 1})  # asked: P may keep its blocks
    c.build_connector_meta([], [])  # after one-way ops: the node has seen them all, in order
    assert [a["request_id"] for a in node.calls("get_num_new_matched_tokens")] == ["plain", "to-d", "from-p"]
    assert [a["request_id"] for a in node.calls("request_finished")] == ["plain", "to-d"]
    node.close()


def test_by_default_the_node_never_hears_of_a_request_without_params(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.matched = lambda a: {"count": 99, "async": True}
    c = PortClient(node.path, "scheduler")
    c.hello()
    assert c.get_num_new_matched_tokens("plain", 40, None, 0) == (0, False)
    c.update_state_after_alloc("plain", [1], 0)
    assert c.get_num_new_matched_tokens("to-d", 40, {"do_remote_decode": True, "transfer_id": "t"}, 0) == (99, True)
    c.update_state_after_alloc("to-d", [2], 0)
    c.build_connector_meta([{"request_id": "plain", "block_ids": [1], "num_computed_tokens": 40},
                            {"request_id": "to-d", "block_ids": [2], "num_computed_tokens": 40}], [])
    assert c.request_finished("plain", [1], "stopped") == (False, None)
    c.flush()
    assert c.request_finished("to-d", [2], "stopped") == (False, None)  # the fake's answer
    assert node.ops() == ["hello", "get_num_new_matched_tokens", "update_state_after_alloc",
                          "build_connector_meta", "request_finished"]
    assert all(a["request_id"] == "to-d" for _, _, op, a in node.log if op != "hello" and "request_id" in a)
    assert [r["request_id"] for r in node.calls("build_connector_meta")[0]["scheduled_new_reqs"]] == ["to-d"]
    # A request named plain once and later with params is asked about from then on.
    assert c.get_num_new_matched_tokens("later", 40, None, 0) == (0, False)
    assert c.get_num_new_matched_tokens("later", 40, {"do_remote_decode": True, "transfer_id": "l"}, 0) == (99, True)
    c.update_state_after_alloc("later", [3], 0)
    assert [a["request_id"] for a in _await_calls(node, "update_state_after_alloc", 2)] == ["to-d", "later"]
    node.close()


def test_a_plain_requests_one_way_ops_are_held_until_the_next_send_and_keep_their_order(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", send_plain=True)
    c.hello()
    c.get_num_new_matched_tokens("plain", 40, None, 0)
    c.update_state_after_alloc("plain", [1], 0)
    c.request_finished("plain", [1], "stopped")
    time.sleep(0.05)
    assert node.ops() == ["hello"]  # nothing acts on them, so nothing was sent yet
    c.ping()  # a round trip: the held frames go first, in one write
    assert node.ops() == ["hello", "get_num_new_matched_tokens", "update_state_after_alloc", "request_finished",
                          "ping"]
    # A request kvferry moves: its update_state_after_alloc goes at once (D's node tells P where
    # to write), after the plain frames held before it.
    c.get_num_new_matched_tokens("plain-2", 40, None, 0)
    assert c.get_num_new_matched_tokens("moved", 40, {"do_remote_prefill": True, "transfer_id": "t"}, 0) == (0, False)
    c.get_num_new_matched_tokens("plain-3", 40, None, 0)
    c.update_state_after_alloc("moved", [2], 0)
    assert [a["request_id"] for a in _await_calls(node, "update_state_after_alloc", 2)] == ["plain", "moved"]
    assert [a["request_id"] for a in node.calls("get_num_new_matched_tokens")] == ["plain", "plain-2", "moved",
                                                                                  "plain-3"]
    node.close()


def test_held_frames_go_when_they_reach_the_limit_or_on_flush(tmp_path, monkeypatch):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", send_plain=True)
    c.hello()
    c.get_num_new_matched_tokens("a", 40, None, 0)
    c.flush()
    assert [a["request_id"] for a in _await_calls(node, "get_num_new_matched_tokens", 1)] == ["a"]
    monkeypatch.setattr(port, "HELD_OPS_LIMIT", 4)
    frames = node.frames
    for i in range(10):
        c.get_num_new_matched_tokens(f"r{i}", 40, None, 0)
    seen = _await_calls(node, "get_num_new_matched_tokens", 9)
    assert [op for op, _ in c._held] == ["get_num_new_matched_tokens"] * 2, "the last two are still held"
    assert [a["request_id"] for a in seen[1:]] == [f"r{i}" for i in range(8)]
    assert node.frames == frames + 2, "each 4 went as one batch frame"
    c.build_connector_meta([], [])
    assert len(node.calls("get_num_new_matched_tokens")) == 11
    node.close()


def test_a_node_that_speaks_only_version_1_gets_held_ops_a_frame_each(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.versions = (1,)
    c = PortClient(node.path, "scheduler", send_plain=True)
    assert c.hello()["version"] == 1 and c.version == 1  # refused version 2, asked again with 1
    assert [h["version"] for h in node.hellos] == [1]
    for i in range(3):
        c.get_num_new_matched_tokens(f"r{i}", 40, None, 0)
        c.request_finished(f"r{i}", [i], "stopped")
    frames = node.frames
    c.build_connector_meta([], [])
    assert node.ops() == ["hello", "hello"] + ["get_num_new_matched_tokens", "request_finished"] * 3 + [
        "build_connector_meta"]
    assert node.frames == frames + 7, "no batch op for a version 1 node"
    assert c.last_op_errors == []
    node.close()


def test_frames_held_for_a_lost_connection_are_not_sent_on_the_next_one(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler")
    c.hello()
    c.get_num_new_matched_tokens("old", 40, None, 0)
    node.drop_connections()
    with pytest.raises(NodeUnavailable):
        c.ping()
    c.reconnect()
    c.build_connector_meta([], [])  # no hello_required: the new connection began with its hello
    assert node.calls("get_num_new_matched_tokens") == []
    assert c.last_op_errors == []
    node.close()


def test_a_request_with_params_the_node_refuses_is_refused_at_once(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))

    def refuse(a: dict) -> dict:
        raise Refuse("bad_args", "args.kv_transfer_params.transfer_id must be a string")
    node.matched = refuse
    c = PortClient(node.path, "scheduler")
    c.hello()
    with pytest.raises(BadArgs):
        c.get_num_new_matched_tokens("r", 40, {"transfer_id": 5}, 0)
    assert c.get_num_new_matched_tokens("plain", 40, None, 0) == (0, False)  # not asked
    node.close()


def test_a_worker_hello_without_memory_is_refused_before_sending():
    with pytest.raises(ValueError, match="tp_rank, geometry and memory"):
        PortClient("/nonexistent", "worker", tp_rank=0)


def test_an_error_reply_without_id_raises_its_typed_error_and_closes(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler")
    c.hello()
    c._sock.sendall(struct.pack(">I", 0))  # a frame the node cannot read: it answers id nil
    with pytest.raises(port.BadFrame):
        c.ping()
    assert not c.connected
    node.close()


def test_update_state_after_alloc_is_one_way_and_its_error_comes_back_in_build_connector_meta(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler")
    c.hello()
    c._send({"op": "no_such_one_way_op", "args": {}})  # refused; no reply to a one-way frame
    c.update_state_after_alloc("r", [1], 0)
    with pytest.raises(UnknownOp) as e:
        c.build_connector_meta([], [])
    assert e.value.metadata and [x["code"] for x in e.value.op_errors] == ["unknown_op"]
    assert c.build_connector_meta([], [], raise_op_errors=False) and c.last_op_errors == []
    node.close()


def scheduler_and_worker(tmp_path) -> tuple[FakeNode, PortClient, PortClient]:
    """A fake node with one engine's scheduler and TP-rank-0 worker connected."""
    node = FakeNode(str(tmp_path / "n.sock"))
    s = PortClient(node.path, "scheduler")
    s.hello()
    w = worker_client(node.path)
    w.hello()
    return node, s, w


def test_start_load_kv_skips_its_round_trip_when_the_metadata_says_nothing_loads(tmp_path):
    node, s, w = scheduler_and_worker(tmp_path)
    w.bind_connector_metadata(s.build_connector_meta([], []))
    assert w.start_load_kv() == 0
    w.wait_for_save()
    node.loads = 2
    w.bind_connector_metadata(s.build_connector_meta([], []))
    assert w.start_load_kv() == 2  # asked: the metadata says two
    w.get_finished()
    assert node.ops("worker", 0) == ["hello", "bind_connector_metadata", "start_load_kv",
                                     "bind_connector_metadata", "start_load_kv", "get_finished"]
    node.close()


def test_save_frames_go_only_when_the_metadata_says_the_step_saves(tmp_path):
    node, s, w = scheduler_and_worker(tmp_path)

    def step() -> None:
        w.bind_connector_metadata(s.build_connector_meta([], []))
        w.start_load_kv()
        for layer in range(2):
            w.save_kv_layer(layer)
        w.wait_for_save()
        w.get_finished()

    step()  # saves 0: the node would ignore the frames, so none go
    node.saves = 1
    step()
    node.saves = None  # an older node says nothing: the frames go as before
    step()
    saving = ["bind_connector_metadata", "start_load_kv", "save_kv_layer", "save_kv_layer", "wait_for_save",
              "get_finished"]
    assert node.ops("worker", 0) == ["hello", "bind_connector_metadata", "start_load_kv", "get_finished",
                                     *saving, *saving]
    node.close()


def test_build_connector_meta_sends_only_the_cached_entries_the_node_reads(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "write"})
    c.hello()
    c.get_num_new_matched_tokens("plain", 64, None, 0)
    c.get_num_new_matched_tokens("to-d", 64, {"do_remote_decode": True, "transfer_id": "t"}, 0)
    c.get_num_new_matched_tokens("from-p", 64, {"do_remote_prefill": True, "transfer_id": "u"}, 0)
    cached = [{"request_id": r, "new_block_ids": [9], "num_computed_tokens": 65} for r in ("plain", "to-d", "from-p")]
    new = [{"request_id": "fresh", "block_ids": [1], "num_computed_tokens": 16}]
    c.build_connector_meta(new, cached)
    sent = node.calls("build_connector_meta")[-1]
    assert sent["scheduled_new_reqs"] == new  # new requests always go
    assert [x["request_id"] for x in sent["scheduled_cached_reqs"]] == ["to-d"]
    c.request_finished("to-d", [9], "length_capped")
    c.build_connector_meta([], cached)
    assert node.calls("build_connector_meta")[-1]["scheduled_cached_reqs"] == []
    node.close()


# ---- the node's load events (READ loads on GPU memory) ----


class _FakeTorch:
    """Just what the client touches of torch for load events, recording what it did."""

    def __init__(self):
        self.opened: list[tuple[str, bytes]] = []
        self.waits: list[tuple[str, bytes]] = []
        torch = self

        class Event:
            def __init__(self, device: str, handle: bytes):
                self.device, self.handle = device, handle

            @classmethod
            def from_ipc_handle(cls, device, handle):
                torch.opened.append((str(device), bytes(handle)))
                return cls(str(device), bytes(handle))

        class Stream:
            def __init__(self, device: str):
                self.device = device

            def wait_event(self, ev):
                torch.waits.append((self.device, ev.handle))

        self.cuda = type("cuda", (), {
            "Event": Event,
            "current_device": staticmethod(lambda: 3),
            "current_stream": staticmethod(lambda device=None: Stream(str(device))),
        })

    class device:  # noqa: N801 - torch's name
        def __init__(self, kind, index=None):
            kind = str(kind)
            if ":" in kind:
                kind, index = kind.split(":")[0], int(kind.split(":")[1])
            self.type, self.index = kind, index

        def __str__(self):
            return self.type if self.index is None else f"{self.type}:{self.index}"


HANDLES = [bytes([i]) * 64 for i in range(4)]


def test_a_worker_asks_for_load_events_only_when_told(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES
    plain = worker_client(node.path)
    plain.hello()
    asking = worker_client(node.path, load_events=True)
    asking.hello()
    assert "load_events" not in node.hellos[0] and node.hellos[1]["load_events"] is True
    assert plain.load_event_handles == [] and asking.load_event_handles == HANDLES
    node.close()


def test_a_layer_load_without_a_slot_is_the_cpu_wait_and_no_stream_waits(tmp_path, monkeypatch):
    fake = _FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = []  # host memory: the node exports none
    answers = iter([{"ok": True}, {"ok": False}])
    node.layer_load = lambda a: next(answers)
    c = worker_client(node.path, load_events=True)
    c.hello()
    assert c.wait_for_layer_load(0) is True
    assert c.wait_for_layer_load(1) is False  # a failed layer: its blocks come with get_finished
    assert c.load_waits == {"event": 0, "no_event": 2}
    assert fake.opened == [] and fake.waits == []
    node.close()


def test_an_event_slot_makes_the_current_stream_wait_on_that_event_opened_once(tmp_path, monkeypatch):
    fake = _FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES
    node.layer_load = lambda a: {"ok": True, "event_slot": a["layer"] + 1}
    c = worker_client(node.path, load_events=True, event_device=1)
    c.hello()
    assert c.wait_for_layer_load(0) is True
    assert c.wait_for_layer_load(2) is True
    assert c.wait_for_layer_load(0) is True
    assert fake.opened == [("cuda:1", HANDLES[1]), ("cuda:1", HANDLES[3])]
    assert fake.waits == [("cuda:1", HANDLES[1]), ("cuda:1", HANDLES[3]), ("cuda:1", HANDLES[1])]
    assert c.load_waits == {"event": 3, "no_event": 0}
    # A new connection gets new events: nothing opened before is used again.
    c.reconnect()
    c.wait_for_layer_load(0)
    assert fake.opened[-1] == ("cuda:1", HANDLES[1]) and len(fake.opened) == 3
    node.close()


@pytest.mark.parametrize("named", [None, "cuda"])
def test_the_current_cuda_device_is_used_when_none_is_named(tmp_path, monkeypatch, named):
    fake = _FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES
    node.layer_load = lambda a: {"ok": True, "event_slot": 0}
    c = worker_client(node.path, load_events=True, event_device=named)
    c.hello()
    c.wait_for_layer_load(5)
    assert fake.opened == [("cuda:3", HANDLES[0])] and fake.waits == [("cuda:3", HANDLES[0])]
    node.close()


def test_a_slot_outside_the_ring_or_a_bad_handle_is_a_protocol_violation(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES[:2]
    node.layer_load = lambda a: {"ok": True, "event_slot": 2}
    c = worker_client(node.path, load_events=True)
    c.hello()
    with pytest.raises(ProtocolViolation, match="event_slot 2 is not a slot of the 2 load events"):
        c.wait_for_layer_load_event(0)
    node.load_event_handles = [b"\x00" * 63]
    with pytest.raises(ProtocolViolation, match="load_events\\[0\\] is not a 64-byte handle"):
        worker_client(node.path, load_events=True).hello()
    node.close()


def test_wait_for_layer_load_event_returns_the_slot_without_waiting(tmp_path, monkeypatch):
    fake = _FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES
    node.layer_load = lambda a: {"ok": True, "event_slot": 2}
    c = worker_client(node.path, load_events=True)
    c.hello()
    assert c.wait_for_layer_load_event(0) == (True, 2)
    assert fake.waits == []
    node.close()


# ---- pipelined layer waits: a step that loads asks for every layer at once ----


def _pipelining_worker(node: FakeNode, layers: int, **kw) -> PortClient:
    c = worker_client(node.path, **kw)
    c.memory = {"kind": "host", "layers": [{"path": f"/dev/shm/l{i}"} for i in range(layers)]}
    c.hello()
    return c


def _await_calls(node: FakeNode, op: str, n: int) -> list[dict]:
    deadline = time.monotonic() + 5
    while len(node.calls(op)) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    return node.calls(op)


def test_a_step_that_loads_asks_every_layer_ahead_and_each_wait_gets_its_own_answer(tmp_path, monkeypatch):
    fake = _FakeTorch()
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.load_event_handles = HANDLES
    node.loads = 1
    node.layer_load = lambda a: {"ok": a["layer"] != 2, "event_slot": 3 - a["layer"]}
    c = _pipelining_worker(node, 4, load_events=True, event_device=0)
    assert c.start_load_kv() == 1
    # Sent before the engine asks: the node works on them while the engine computes.
    assert [a["layer"] for a in _await_calls(node, "wait_for_layer_load", 4)] == [0, 1, 2, 3]
    assert [c.wait_for_layer_load(layer) for layer in range(4)] == [True, True, False, True]
    assert fake.waits == [("cuda:0", HANDLES[3]), ("cuda:0", HANDLES[2]), ("cuda:0", HANDLES[1]),
                          ("cuda:0", HANDLES[0])]
    assert len(node.calls("wait_for_layer_load")) == 4  # no round trip of its own
    # The same layer again in this step: nothing is left for it, so it asks.
    assert c.wait_for_layer_load(1) is True
    assert len(node.calls("wait_for_layer_load")) == 5
    node.close()


def test_a_call_between_layer_waits_reads_their_replies_first_and_they_stay_for_their_layers(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.loads = 2
    node.layer_load = lambda a: {"ok": a["layer"] % 2 == 0}
    c = _pipelining_worker(node, 3)
    c.start_load_kv()
    assert c.wait_for_layer_load(0) is True
    assert c.get_finished()["done_sending"] == []  # its own reply, not a layer's
    assert c.wait_for_layer_load(1) is False and c.wait_for_layer_load(2) is True
    assert len(node.calls("wait_for_layer_load")) == 3
    node.close()


def _loading_node(tmp_path, answer) -> FakeNode:
    """A node whose steps load, answering each layer wait with ``answer(args)``."""
    node = FakeNode(str(tmp_path / "n.sock"))
    node.loads = 1
    node.layer_load = answer
    return node


def test_a_new_step_drops_answers_nobody_asked_for(tmp_path):
    step = {"n": 0}
    node = _loading_node(tmp_path, lambda a: {"ok": step["n"] == 1 or a["layer"] != 0})
    c = _pipelining_worker(node, 2)
    c.start_load_kv()
    _await_calls(node, "wait_for_layer_load", 2)  # step 0's answers: layer 0 fails, never asked
    step["n"] = 1
    c.start_load_kv()
    assert c.wait_for_layer_load(0) is True  # this step's answer, not the last step's
    # Layer 1's ask went out with layer 0's; the node may read it after answering layer 0.
    assert len(_await_calls(node, "wait_for_layer_load", 4)) == 4
    # A step that loads nothing asks nothing ahead, and a wait there is a round trip.
    node.loads = 0
    assert c.start_load_kv() == 0
    assert c.wait_for_layer_load(0) is True
    assert len(node.calls("wait_for_layer_load")) == 5
    node.close()


def test_an_error_for_a_layer_asked_ahead_is_raised_at_that_layer_only(tmp_path):
    def answer(a: dict) -> dict:
        if a["layer"] == 1:
            raise Refuse("bad_args", "layer 1 is not yours")
        return {"ok": True}

    node = _loading_node(tmp_path, answer)
    c = _pipelining_worker(node, 3)
    c.start_load_kv()
    assert c.wait_for_layer_load(0) is True
    with pytest.raises(PortError) as e:
        c.wait_for_layer_load(1)
    assert e.value.code == "bad_args"
    assert c.wait_for_layer_load(2) is True
    node.close()


def test_pipelining_can_be_turned_off(tmp_path):
    node = _loading_node(tmp_path, lambda a: {"ok": True})
    c = _pipelining_worker(node, 3)
    c.pipelined_layer_waits = False
    c.start_load_kv()
    time.sleep(0.1)
    assert node.calls("wait_for_layer_load") == []
    assert c.wait_for_layer_load(0) is True
    assert len(node.calls("wait_for_layer_load")) == 1
    node.close()


def test_a_subclass_that_adds_hello_args_keeps_them_when_the_version_falls_back(tmp_path):
    """kvferry.gpu_model's worker client adds its events this way (it needs torch, so CI cannot
    run it): the override takes no arguments and the version comes from connect."""

    class Extra(PortClient):
        def _hello_args(self) -> dict:
            args = super()._hello_args()
            args["engine"] = {"engine_id": "extra-0"}
            return args

    node = FakeNode(str(tmp_path / "n.sock"))
    node.versions = (1,)
    c = Extra(node.path, "scheduler")
    assert c.hello()["engine_id"] == "extra-0"
    assert node.hellos == [{"version": 1, "side": "scheduler", "engine": {"engine_id": "extra-0"}}]
    node.close()


# -- get_finished asked ahead (a prefill engine's worker) --

def test_asked_ahead_get_finished_answers_with_the_last_asks_reply(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.finished[0].append({"done_sending": ["r1"]})
    node.finished[0].append({"done_sending": ["r2"]})
    c = worker_client(node.path, finished_ahead=True)
    c.hello()
    first = c.get_finished(["a"])
    assert first["done_sending"] == []  # nothing asked before: empty sets, no wait
    _await_calls(node, "get_finished", 1)  # this step's ask went out
    assert c.get_finished()["done_sending"] == ["r1"]  # the first ask's answer
    assert c.get_finished()["done_sending"] == ["r2"]
    assert node.calls("get_finished")[0] == {"finished_req_ids": ["a"]}
    node.close()


def test_an_asked_ahead_reply_is_kept_across_other_calls_and_errors_come_a_step_later(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    node.finished[0].append({"done_sending": ["r1"]})
    c = worker_client(node.path, finished_ahead=True)
    c.hello()
    c.get_finished()
    assert c.ping() == {"node": "fake"}  # reads the ask's reply first, keeps it
    c.bind_connector_metadata(b"never built")  # one-way; its error comes with a later ask's reply
    assert c.get_finished()["done_sending"] == ["r1"]
    with pytest.raises(UnknownMetadata) as e:
        c.get_finished()
    assert e.value.finished["done_sending"] == []
    assert c.get_finished()["op_errors"] == []  # the connection goes on
    node.close()


def test_a_lost_connection_drops_the_ask_in_flight(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = worker_client(node.path, finished_ahead=True)
    c.hello()
    c.get_finished()
    _await_calls(node, "get_finished", 1)
    node.drop_connections()
    with pytest.raises(NodeUnavailable):
        for _ in range(3):
            c.get_finished()
    c.reconnect(wait_s=5)
    node.finished[0].append({"done_sending": ["r9"]})
    assert c.get_finished()["done_sending"] == []  # a new connection starts with no ask out
    assert c.get_finished()["done_sending"] == ["r9"]
    node.close()


def test_only_a_worker_asks_ahead_and_by_default_get_finished_is_a_round_trip(tmp_path):
    with pytest.raises(ValueError, match="worker"):
        PortClient(str(tmp_path / "n.sock"), "scheduler", finished_ahead=True)
    node = FakeNode(str(tmp_path / "n.sock"))
    node.finished[0].append({"done_sending": ["r1"]})
    c = worker_client(node.path)
    c.hello()
    assert c.get_finished()["done_sending"] == ["r1"]
    node.close()


@pytest.mark.parametrize("role, ahead", [("prefill", True), ("decode", False)])
def test_a_prefill_engines_worker_asks_ahead_unless_told_not_to(tmp_path, role, ahead):
    node = FakeNode(str(tmp_path / "n.sock"))
    assert worker_client(node.path, engine={"role": role}).finished_ahead is ahead
    assert worker_client(node.path, engine={"role": role}, finished_ahead=False).finished_ahead is False
    assert PortClient(node.path, "scheduler", engine={"role": role}).finished_ahead is False
    node.close()


# -- steps built ahead (build_ahead) --

P_PARAMS = {"do_remote_decode": True, "transfer_id": "t", "remote_engine_id": "d0"}


def ahead_scheduler(node: FakeNode, **kw) -> PortClient:
    node.client_steps = True
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "write"}, **kw)
    c.hello()
    return c


def test_a_step_is_built_ahead_once_the_node_named_one_and_its_reply_is_read_at_the_next_call(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = ahead_scheduler(node)
    first = c.build_connector_meta([], [])  # asked: the node's handle names the engine and the step
    assert msgpack.unpackb(first) == {"engine": 7, "step": 1, "loads": 0, "saves": 0}
    second = c.build_connector_meta([], [])
    assert msgpack.unpackb(second) == {"engine": 7, "step": 2, "loads": 0, "saves": 0}
    assert c.local_answer_counts.get("build_connector_meta") == 1
    assert [a.get("step") for a in node.await_calls("build_connector_meta", 2)] == [None, 2]
    assert c._build_later.request_id is not None  # its reply is read by the next call
    assert c.ping() == {"node": "fake"}
    assert c._build_later.request_id is None and c._build_later.reply is not None
    w = worker_client(node.path)
    w.hello()
    w.bind_connector_metadata(second)  # the node knows the client's handle as its own
    assert w.get_finished()["op_errors"] == []
    node.close()


def test_a_chunked_prefills_save_is_counted_in_the_step_of_its_last_chunk(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = ahead_scheduler(node)
    c.build_connector_meta([], [])
    assert c.get_num_new_matched_tokens("a", 40, P_PARAMS, 0) == (0, False)
    c.update_state_after_alloc("a", [1, 2], 0)
    meta = c.build_connector_meta([{"request_id": "a", "block_ids": [1, 2], "num_computed_tokens": 32}], [])
    assert msgpack.unpackb(meta)["saves"] == 0
    c.ping()
    node.saves = 1
    meta = c.build_connector_meta([], [{"request_id": "a", "new_block_ids": [3], "num_computed_tokens": 40}])
    assert msgpack.unpackb(meta)["saves"] == 1
    c.ping()  # the node has read the build sent ahead (it answers in order)
    node.saves = 0
    c.build_connector_meta([], [])
    assert c.local_answer_counts.get("build_connector_meta") == 3 and c.build_ahead_off is None
    assert [a.get("answered") for a in node.await_calls("build_connector_meta", 4)][1:] == [
        {"loads": 0, "saves": 0}, {"loads": 0, "saves": 1}, {"loads": 0, "saves": 0}]
    node.close()


def test_a_refused_ahead_build_comes_back_as_an_op_error_and_the_client_asks_from_then_on(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = ahead_scheduler(node)
    c.build_connector_meta([], [])
    node.saves = 1  # the node saves where this client's mirror of its rules says nothing is saved
    c.build_connector_meta([], [])
    assert c.ping() == {"node": "fake"}  # reads the refusal and keeps it for the next build
    node.saves = 0
    with pytest.raises(BadArgs, match="the client answered") as e:
        c.build_connector_meta([], [])
    assert e.value.op == "build_connector_meta" and e.value.metadata  # this step's handle, asked
    assert c.build_ahead_off is not None and "the client answered" in c.build_ahead_off
    c.build_connector_meta([], [])
    assert [a.get("step") for a in node.await_calls("build_connector_meta", 4)] == [None, 2, None, None]
    node.close()


def test_steps_are_asked_where_the_client_cannot_know_the_counts(tmp_path):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = ahead_scheduler(node)
    c.build_connector_meta([], [])
    odd = {**P_PARAMS, "something_else": 1}  # params only the node can judge
    c.get_num_new_matched_tokens("u", 40, odd, 0)
    c.update_state_after_alloc("u", [1], 0)
    c.build_connector_meta([{"request_id": "u", "block_ids": [1], "num_computed_tokens": 40}], [])
    c.get_num_new_matched_tokens("a", 40, P_PARAMS, 0)
    c.update_state_after_alloc("a", [2], 0)
    c.build_connector_meta([{"request_id": "a", "block_ids": [2]}], [])  # no num_computed_tokens
    c.build_connector_meta([], [{"request_id": "a", "num_computed_tokens": 40}])  # "a"'s place unknown
    assert [a.get("step") for a in node.await_calls("build_connector_meta", 4)] == [None, None, None, None]
    c.request_finished("a", [2], "stopped")
    c.build_connector_meta([], [])
    assert node.await_calls("build_connector_meta", 5)[-1].get("step") == 5
    node.close()


def test_build_ahead_is_off_without_the_nodes_offer_or_when_turned_off(tmp_path, monkeypatch):
    node = FakeNode(str(tmp_path / "n.sock"))
    c = PortClient(node.path, "scheduler", engine={"role": "prefill", "mode": "write"})
    c.hello()
    for _ in range(3):
        c.build_connector_meta([], [])
    assert c.local_answer_counts.get("build_connector_meta") is None  # a node that does not offer it
    node.close()
    node = FakeNode(str(tmp_path / "m.sock"))
    monkeypatch.setenv("KVFERRY_PORT_BUILD_AHEAD", "0")
    c = ahead_scheduler(node)
    for _ in range(3):
        c.build_connector_meta([], [])
    assert c.local_answer_counts.get("build_connector_meta") is None
    monkeypatch.setenv("KVFERRY_PORT_BUILD_AHEAD", "yes")
    with pytest.raises(ValueError, match="KVFERRY_PORT_BUILD_AHEAD"):
        PortClient(node.path, "scheduler")
    node.close()


D_PARAMS = {"do_remote_prefill": True, "transfer_id": "t", "remote_engine_id": "p0", "remote_block_ids": [1, 2]}


@pytest.mark.parametrize("mode,at_admission,ahead", [("read", True, True), ("write", False, True),
                                                      ("read", False, False)])
def test_a_decode_step_that_receives_is_built_ahead_only_where_its_loads_are_known(tmp_path, mode, at_admission,
                                                                                    ahead):
    """D's loads are the step's only when READ reads at the step; at admission (the node's default)
    and in WRITE the step loads nothing, and the client builds it ahead."""
    node = FakeNode(str(tmp_path / "n.sock"))
    node.client_steps, node.mode, node.reads_at_admission = True, mode, at_admission
    c = PortClient(node.path, "scheduler", engine={"role": "decode", "mode": mode})
    c.hello()
    c.build_connector_meta([], [])
    c.get_num_new_matched_tokens("r", 40, D_PARAMS, 0)
    c.update_state_after_alloc("r", [5, 6, 7], 39 if mode == "read" else 40)
    c.build_connector_meta([{"request_id": "r", "block_ids": [5, 6, 7], "num_computed_tokens": 40}], [])
    c.build_connector_meta([], [])  # nothing allocated since: loads nothing either way
    steps = [a.get("step") for a in node.await_calls("build_connector_meta", 3)]
    assert steps == ([None, 2, 3] if ahead else [None, None, 3]), steps
    node.close()
