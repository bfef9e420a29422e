"""The router as the disaggregation proxy, end to end: a router JVM serving OpenAI-compatible
HTTP (`kvferry router --http-port`), a P and a D node (JVMs), reference engines beside them that
register their HTTP URL through the engine port, and a baseline engine without kvferry. A client
talks only to the router: answers must equal the baseline's, streaming or not; a client that goes
mid-stream must leave no block in use; an engine that dies gives the client an OpenAI-style error,
never a hang. Skipped, with the reason, when the jar is absent."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import struct
import time
import urllib.parse
import urllib.request

import pytest

from .cluster import (Engine, JvmProcess, Node, complete, free_port, jvm_threads_started, metric, needs_node, settle,
                      workdir)

pytestmark = needs_node

GEOMETRY = ["--layers", "2", "--kv-heads", "4", "--head-dim", "16", "--block-size", "16",
            "--num-blocks", "160", "--max-num-batched-tokens", "64"]


class Router(JvmProcess):
    """`kvferry router --http-port` as a JVM."""

    def __init__(self, wd: str, *, jvm_options: list[str] | None = None, in_service: bool = False):
        self.port = free_port()
        self.http_port = free_port()
        self.management_port = free_port()
        super().__init__(os.path.join(wd, f"router-{time.monotonic_ns()}.log"),
                         ["router", "--port", str(self.port), "--management-port", str(self.management_port),
                          "--seed-nodes", f"127.0.0.1:{self.port}", "--http-port", str(self.http_port)],
                         jvm_options=jvm_options, in_service=in_service)
        self.url = f"http://127.0.0.1:{self.http_port}"


def post(url: str, path: str, body: dict, headers: dict | None = None,
         timeout: float = 120) -> tuple[int, dict, dict]:
    """(status, headers, parsed body); a streaming answer is parsed into its chunks' texts."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        c.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        raw = r.read().decode()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        if hdrs.get("content-type", "").startswith("text/event-stream"):
            texts, ids, errors = [], [], []
            for line in raw.splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        errors.append(chunk["error"])
                        continue
                    for ch in chunk.get("choices", []):
                        texts.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
                        ids.extend(ch.get("token_ids", []))
            return r.status, hdrs, {"text": "".join(texts), "token_ids": ids, "errors": errors,
                                    "done": "data: [DONE]" in raw}
        return r.status, hdrs, json.loads(raw) if raw else {}
    finally:
        c.close()


class Deployment:
    """Router, P node, D node (both modes), and the engines of one mode."""

    def __init__(self, mode: str = "write"):
        self.wd = workdir()
        self.router = Router(self.wd)
        self.p_node = Node(self.wd, "prefill", engine_id="p0", seed_port=self.router.port)
        self.d_node = Node(self.wd, "decode", engine_id="d0", seed_port=self.router.port)
        self.p_node.wait_ready()
        self.d_node.wait_ready()
        self.baseline = Engine(self.wd, "baseline", *GEOMETRY, "--no-connector")
        self.engines: list[Engine] = [self.baseline]
        self.start_engines(mode)

    def start_engines(self, mode: str) -> None:
        self.p = Engine(self.wd, f"p-{mode}", *GEOMETRY, "--socket", self.p_node.socket, "--role", "prefill",
                        "--mode", mode)
        self.d = Engine(self.wd, f"d-{mode}", *GEOMETRY, "--socket", self.d_node.socket, "--role", "decode",
                        "--mode", mode)
        self.engines += [self.p, self.d]
        self.await_routable()

    def await_routable(self, timeout_s: float = 90) -> None:
        """Until the router lists a P and a D of one mode (it learns them from membership)."""
        deadline = time.monotonic() + timeout_s
        last = None
        while time.monotonic() < deadline:
            try:
                status, _, body = post(self.router.url, "/v1/completions", {"prompt": [1, 2, 3], "max_tokens": 1})
                if status == 200:
                    return
                last = (status, body)
            except OSError as e:
                last = e
            time.sleep(0.3)
        raise AssertionError(f"router never routed: {last}\n{self.router.tail()}")

    def close(self) -> None:
        for e in self.engines:
            e.stop()
        for n in (self.d_node, self.p_node):
            n.stop()
        self.router.stop()


@pytest.fixture(scope="module")
def deployment():
    d = Deployment("write")
    yield d
    d.close()


def node_transfers(node: Node) -> str:
    """A node's GET /kvferry/transfers, or why it could not be read (diagnostics only)."""
    try:
        with urllib.request.urlopen(node.management_url + "/kvferry/transfers", timeout=10) as r:
            return r.read().decode(errors="replace")
    except OSError as e:
        return f"unreadable: {e}"


def prompt(n: int, salt: int = 0) -> list[int]:
    return [(i * 31 + salt * 7 + 5) % 250 + 1 for i in range(n)]


def test_answers_through_the_router_equal_the_undisaggregated_ones(deployment: Deployment) -> None:
    for n, salt in [(5, 1), (40, 2), (97, 3), (200, 4)]:
        expected = complete(deployment.baseline.url, prompt(n, salt), 6)["choices"][0]
        status, headers, body = post(deployment.router.url, "/v1/completions",
                                     {"prompt": prompt(n, salt), "max_tokens": 6},
                                     {"X-Request-Id": f"keep-me-{n}"})
        assert status == 200, body
        assert headers.get("x-request-id") == f"keep-me-{n}"
        # A whole JSON answer is passed on whole, with its length, not re-sent in chunks.
        assert "chunked" not in headers.get("transfer-encoding", ""), headers
        assert int(headers["content-length"]) > 0, headers
        assert body["choices"][0]["token_ids"] == expected["token_ids"], n
        assert body["kvferry"]["kv_verified"] is True or body["kvferry"].get("verified_bytes", 1) > 0, body
        # Streaming: the same tokens, chunk by chunk, then [DONE].
        status, stream_headers, streamed = post(deployment.router.url, "/v1/completions",
                                                {"prompt": prompt(n, salt), "max_tokens": 6, "stream": True})
        assert status == 200
        assert stream_headers.get("transfer-encoding") == "chunked", stream_headers
        assert streamed["done"] and not streamed["errors"]
        assert streamed["token_ids"] == expected["token_ids"], n
    assert settle(deployment.p)["free_blocks"] == settle(deployment.p)["num_blocks"]
    assert settle(deployment.d)["free_blocks"] == settle(deployment.d)["num_blocks"]


def test_models_and_unknown_routes(deployment: Deployment) -> None:
    u = urllib.parse.urlparse(deployment.router.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("GET", "/v1/models")
    r = c.getresponse()
    models = json.loads(r.read())
    assert r.status == 200 and models["data"], models
    c.request("GET", "/v1/nothing")
    r = c.getresponse()
    err = json.loads(r.read())
    assert r.status == 404 and err["error"]["type"] == "invalid_request_error"
    c.close()
    u = urllib.parse.urlparse(deployment.router.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
    c.request("POST", "/v1/completions", "{not json", {"Content-Type": "application/json"})
    r = c.getresponse()
    err = json.loads(r.read())
    assert r.status == 400 and "bad JSON" in err["error"]["message"]
    c.close()


def test_a_client_that_goes_mid_stream_leaves_no_block_in_use(deployment: Deployment) -> None:
    u = urllib.parse.urlparse(deployment.router.url)
    for n in (64, 150):
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c.request("POST", "/v1/completions",
                  json.dumps({"prompt": prompt(n, 9), "max_tokens": 200, "stream": True}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        assert r.read(6) == b"data: "  # D is generating
        c.close()  # the client goes
    for e in (deployment.p, deployment.d):
        s = settle(e)
        assert s["free_blocks"] == s["num_blocks"], (e.name, s)
    # The router still serves.
    status, _, _ = post(deployment.router.url, "/v1/completions", {"prompt": prompt(10), "max_tokens": 2})
    assert status == 200


def legs_in_flight(router: Router, role: str) -> float:
    """The router's own count of legs in flight on the engines of one role (its /metrics)."""
    u = f"http://127.0.0.1:{router.management_port}/metrics"
    with urllib.request.urlopen(u, timeout=30) as r:
        return sum(float(line.split()[-1]) for line in r.read().decode().splitlines()
                   if line.startswith("kvferry_router_in_flight{") and f'role="{role}"' in line)


def test_a_client_that_goes_before_the_answer_starts_leaves_nothing_counted(deployment: Deployment) -> None:
    # The client sends its request and goes at once: the router's answer, built later, is dropped
    # by its HTTP server unread. D's leg still ends, and is no longer counted in flight (it was
    # for good: after 64 such clients the router refused every request to that D).
    u = urllib.parse.urlparse(deployment.router.url)
    for i in range(3):
        body = json.dumps({"prompt": prompt(150, 20 + i), "max_tokens": 50, "stream": True}).encode()
        with socket.create_connection((u.hostname, u.port), timeout=30) as s:
            # Reset, not closed: a closed socket still takes the answer's bytes for a moment.
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\n"
                      + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    deadline = time.monotonic() + 60
    while legs_in_flight(deployment.router, "decode") != 0:
        assert time.monotonic() < deadline, (
            f"{legs_in_flight(deployment.router, 'decode')} decode legs still counted in flight 60 s after "
            f"their clients went\n{deployment.router.tail()}")
        time.sleep(0.5)
    for e in (deployment.p, deployment.d):
        s = settle(e)
        assert s["free_blocks"] == s["num_blocks"], (e.name, s)


def test_an_engines_refusal_reaches_the_client_as_its_own_status(deployment: Deployment) -> None:
    # A request no engine can serve as it is: the engine's 4xx and its reason, not a 502 (which a
    # client would retry).
    for stream in (False, True):
        status, _, body = post(deployment.router.url, "/v1/completions",
                               {"prompt": [], "max_tokens": 2, "stream": stream})
        assert status == 400, body
        assert "prompt is empty" in body["error"]["message"], body
        assert body["error"]["type"] == "invalid_request_error", body


@pytest.mark.skipif(shutil.which("jcmd") is None, reason="needs the JDK's jcmd")
def test_the_router_starts_no_thread_per_request(deployment: Deployment) -> None:
    # Callbacks on Pekko's futures ran on the JDK's common pool, which on one or two cores starts
    # a thread per callback: five per proxied request (dev.kvferry.node.PekkoFutures). On more
    # cores that pool keeps its threads, so this catches it only on small machines such as CI's.
    def ask(stream: bool) -> None:
        status, _, body = post(deployment.router.url, "/v1/completions",
                               {"prompt": prompt(30, 9), "max_tokens": 2, "stream": stream})
        assert status == 200, body

    for stream in (False, True, False, True):  # pools and connections made first
        ask(stream)
    before = jvm_threads_started(deployment.router.proc.pid)
    for i in range(20):
        ask(i % 2 == 1)
    after = jvm_threads_started(deployment.router.proc.pid)
    assert before is not None and after is not None, "jcmd could not read the router's counters"
    started = after - before
    assert started < 10, f"the router started {started} threads for 20 requests"


def test_metrics_count_outcomes_and_time_to_first_token(deployment: Deployment) -> None:
    u = f"http://127.0.0.1:{deployment.router.management_port}"
    assert metric(u, 'kvferry_router_requests_total{outcome="ok"}') > 0
    text = urllib.request.urlopen(u + "/metrics", timeout=30).read().decode()
    assert "kvferry_router_ttft_seconds_bucket" in text


def test_read_mode_and_an_engine_that_dies_mid_request(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every JVM logs kvferry's debug lines (the environment variable reaches them all): what P's
    # node knew of D is in its log if this fails.
    monkeypatch.setenv("KVFERRY_LOG_LEVEL", "DEBUG")
    dep = Deployment("read")
    try:
        expected = complete(dep.baseline.url, prompt(90, 5), 5)["choices"][0]["token_ids"]
        status, _, body = post(dep.router.url, "/v1/completions", {"prompt": prompt(90, 5), "max_tokens": 5})
        assert status == 200, body
        assert body["choices"][0]["token_ids"] == expected
        # D dies while the client reads a long answer: the stream ends without [DONE] (or with an
        # error event), it does not hang.
        u = urllib.parse.urlparse(dep.router.url)
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        c.request("POST", "/v1/completions",
                  json.dumps({"prompt": prompt(120, 6), "max_tokens": 2000, "stream": True}),
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        assert r.read(6) == b"data: "  # D is generating
        dep.d.kill9()
        started = time.monotonic()
        try:
            rest = r.read().decode(errors="replace")
        except http.client.IncompleteRead as e:  # a chunked answer cut off: also an end
            rest = e.partial.decode(errors="replace")
        c.close()
        assert time.monotonic() - started < 60, "the client waited over a minute after D died"
        assert "data: [DONE]" not in rest, rest[-500:]
        # The router takes D off its list: a new request gets an OpenAI-style error, not a hang.
        deadline = time.monotonic() + 60
        while True:
            status, _, body = post(dep.router.url, "/v1/completions", {"prompt": prompt(9), "max_tokens": 2},
                                   timeout=60)
            if status != 200:
                assert body["error"]["message"], body
                break
            assert time.monotonic() < deadline, "the router kept routing to a dead engine"
            time.sleep(0.5)
        # P frees everything once its transfer ends (D's worker stopped), long before its
        # read-abort deadline (120 s). On a loaded host D's engine can attach, read and die before
        # P's listing ever shows it (docs/reliability.md): P then learns of D's end from the worker
        # that asked for its metadata.
        s = settle(dep.p, 90)
        assert s["free_blocks"] == s["num_blocks"], (
            f"P still holds blocks 90 s after D died: {s}\nP's transfers: "
            f"{node_transfers(dep.p_node)}\nP's node log:\n{dep.p_node.tail(60)}")
        assert " DEBUG d.kvferry." in open(dep.p_node.log, errors="replace").read(), \
            "KVFERRY_LOG_LEVEL=DEBUG did not reach P's node"
    finally:
        dep.close()


def test_chat_completions_through_the_router(deployment: Deployment) -> None:
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}]
    u = urllib.parse.urlparse(deployment.baseline.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    c.request("POST", "/v1/chat/completions", json.dumps({"messages": messages, "max_tokens": 5}),
              {"Content-Type": "application/json"})
    expected = json.loads(c.getresponse().read())["choices"][0]["message"]["content"]
    c.close()
    status, _, body = post(deployment.router.url, "/v1/chat/completions", {"messages": messages, "max_tokens": 5})
    assert status == 200, body
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"]["content"] == expected
    status, _, streamed = post(deployment.router.url, "/v1/chat/completions",
                               {"messages": messages, "max_tokens": 5, "stream": True})
    assert status == 200 and streamed["done"]
