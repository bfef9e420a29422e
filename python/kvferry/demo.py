"""``python -m kvferry.demo``: a disaggregation proxy's workload against P, D and a baseline.

It sends requests as vLLM's toy disaggregation proxy does:
  WRITE: D's leg and P's leg at once, with matching kv_transfer_params
         (P: do_remote_decode, D: do_remote_prefill; the same transfer_id; each names the other's
         engine as remote_engine_id);
  READ:  P's leg first (do_remote_decode, max_tokens 1), then D's leg with the
         kv_transfer_params P returned.
Prompts have many lengths (long ones are chunked), some requests are aborted (the client goes
away), some reuse a prompt prefix D already holds. D's tokens are compared with the baseline
engine's (an undisaggregated reference engine), D's own byte verification is checked, and at the
end every engine must be back to 0 blocks in use. One JSON line per mode with ``--json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

VOCAB = 32000


@dataclass
class Outcome:
    request_id: str
    prompt: list[int]
    kind: str  # "normal", "prefix", "abort"
    completed: bool = False
    aborted: bool = False
    error: str | None = None
    tokens: list[int] | None = None
    baseline: list[int] | None = None
    kv_verified: bool | None = None
    prefix_hit_tokens: int = 0
    detail: dict[str, Any] = field(default_factory=dict)


class HttpError(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


def _request_json(method: str, url: str, path: str, body: dict | None, request_id: str | None,
                  timeout: float) -> dict:
    """One request on its own connection: the parsed JSON of a 200 answer, else HttpError."""
    u = urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        headers: dict[str, str] = {}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if request_id:
            headers["X-Request-Id"] = request_id
        c.request(method, path, body=None if body is None else json.dumps(body), headers=headers)
        r = c.getresponse()
        data = r.read().decode()
        if r.status != 200:
            raise HttpError(r.status, data)
        return json.loads(data)
    finally:
        c.close()


def post_json(url: str, path: str, body: dict, request_id: str | None = None, timeout: float = 300) -> dict:
    return _request_json("POST", url, path, body, request_id, timeout)


def get_json(url: str, path: str, timeout: float = 30) -> dict:
    return _request_json("GET", url, path, None, None, timeout)


def post_then_abandon(url: str, body: dict, request_id: str, after_s: float, stream_tokens: int = 0) -> None:
    """Sends a completion request and closes the connection after ``after_s`` (or after
    ``stream_tokens`` streamed chunks): the engine sees its client go away and aborts."""
    u = urlsplit(url)
    data = json.dumps(body).encode()
    s = socket.create_connection((u.hostname, u.port or 80), timeout=60)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  + f"X-Request-Id: {request_id}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
        if stream_tokens:
            got = b""
            s.settimeout(max(after_s, 0.01))  # 0 would make the socket non-blocking
            try:
                while got.count(b"data: ") < stream_tokens:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    got += chunk
            except socket.timeout:
                pass
        else:
            time.sleep(after_s)
    finally:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


def completion(url: str, prompt: list[int], max_tokens: int, params: dict | None, request_id: str) -> dict:
    body: dict[str, Any] = {"model": "kvferry-reference", "prompt": prompt, "max_tokens": max_tokens}
    if params is not None:
        body["kv_transfer_params"] = params
    return post_json(url, "/v1/completions", body, request_id)


class Workload:
    def __init__(self, args: argparse.Namespace, mode: str):
        self.args = args
        self.mode = mode
        self.prefills = [u.strip() for u in args.prefill.split(",") if u.strip()]
        self.decode = args.decode
        self.baseline = args.baseline
        self.rng = random.Random(args.seed + (0 if mode == "write" else 1))
        self.lock = threading.Lock()
        self.next_prefill = 0
        self.done_on_d: list[list[int]] = []
        self.p_engine_ids = [args.prefill_engine_id or self._engine_id(u) for u in self.prefills]
        self.d_engine_id = args.decode_engine_id or self._engine_id(self.decode)

    @staticmethod
    def _engine_id(url: str) -> str | None:
        try:
            return get_json(url, "/kvferry/stats").get("engine_id")
        except (OSError, HttpError):
            return None

    def _pick_prefill(self) -> tuple[str, str | None]:
        with self.lock:
            i = self.next_prefill % len(self.prefills)
            self.next_prefill += 1
        return self.prefills[i], self.p_engine_ids[i]

    def _prompt(self, length: int) -> list[int]:
        return [self.rng.randrange(1, VOCAB) for _ in range(length)]

    def plan(self) -> tuple[list[Outcome], list[Outcome]]:
        a = self.args
        first, second = [], []
        n_first = max(1, a.requests // 3)
        for i in range(a.requests):
            length = self.rng.randint(a.min_prompt, a.max_prompt)
            kind = "normal"
            if self.rng.random() < a.abort_rate:
                kind = "abort"
            elif i >= n_first and self.rng.random() < a.prefix_rate:
                kind = "prefix"
            o = Outcome(f"demo-{self.mode}-{i}-{uuid.uuid4().hex[:8]}", self._prompt(length), kind)
            (first if i < n_first else second).append(o)
        return first, second

    def run_one(self, o: Outcome) -> Outcome:
        a = self.args
        if o.kind == "prefix":
            with self.lock:
                source = self.rng.choice(self.done_on_d) if self.done_on_d else None
            if source is not None and len(source) > 2 * a.block_size:
                keep = self.rng.randint(a.block_size, len(source) - 1)
                o.prompt = source[:keep] + o.prompt[: max(1, len(o.prompt) - keep)]
            else:
                o.kind = "normal"
        transfer_id = f"xfer-{o.request_id}"
        p_url, p_id = self._pick_prefill()
        try:
            if o.kind == "abort":
                if a.router:
                    o.aborted = True  # a client that hangs up on the router mid-stream
                    post_then_abandon(a.router, {"prompt": o.prompt, "max_tokens": a.max_tokens, "stream": True},
                                      o.request_id, self.rng.uniform(0.0, 0.05), stream_tokens=1)
                else:
                    self._abort(o, p_url, p_id, transfer_id)
                return o
            if a.router:
                # As a client would: the router picks P and D and runs both legs.
                out = completion(a.router, o.prompt, a.max_tokens, None, o.request_id)
            elif self.mode == "write":
                out = self._write(o, p_url, p_id, transfer_id)
            else:
                out = self._read(o, p_url, p_id, transfer_id)
            o.tokens = out["choices"][0]["token_ids"]
            info = out.get("kvferry") or {}
            o.kv_verified = info.get("kv_verified")
            o.prefix_hit_tokens = int(info.get("prefix_hit_tokens") or 0)
            o.detail = info
            o.completed = True
            with self.lock:
                self.done_on_d.append(o.prompt)
            base = completion(self.baseline, o.prompt, a.max_tokens, None, f"base-{o.request_id}")
            o.baseline = base["choices"][0]["token_ids"]
        except (OSError, HttpError, KeyError, ValueError) as e:
            o.error = f"{type(e).__name__}: {e}"
        return o

    def _p_params(self, transfer_id: str) -> dict:
        params: dict[str, Any] = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id}
        if self.d_engine_id:
            params["remote_engine_id"] = self.d_engine_id
        return params

    def _d_params_write(self, transfer_id: str, p_id: str | None) -> dict:
        params: dict[str, Any] = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": transfer_id}
        if p_id:
            params["remote_engine_id"] = p_id
        return params

    def _write(self, o: Outcome, p_url: str, p_id: str | None, transfer_id: str) -> dict:
        result: dict[str, Any] = {}

        def p_leg() -> None:
            try:
                result["p"] = completion(p_url, o.prompt, 1, self._p_params(transfer_id), o.request_id)
            except (OSError, HttpError) as e:
                result["p_error"] = e

        t = threading.Thread(target=p_leg)
        t.start()
        try:
            d = completion(self.decode, o.prompt, self.args.max_tokens,
                           self._d_params_write(transfer_id, p_id), o.request_id)
        finally:
            t.join()
        if "p_error" in result:
            raise result["p_error"]
        return d

    def _read(self, o: Outcome, p_url: str, p_id: str | None, transfer_id: str) -> dict:
        p = completion(p_url, o.prompt, 1, self._p_params(transfer_id), o.request_id)
        params = dict(p.get("kv_transfer_params") or {})
        if not params:
            raise HttpError(200, f"P returned no kv_transfer_params for {o.request_id}")
        params.setdefault("transfer_id", transfer_id)
        return completion(self.decode, o.prompt, self.args.max_tokens, params, o.request_id)

    def _abort(self, o: Outcome, p_url: str, p_id: str | None, transfer_id: str) -> None:
        """The client goes away at a random point; what matters is that nothing leaks."""
        o.aborted = True
        delay = self.rng.uniform(0.0, 0.05)
        body_p = {"prompt": o.prompt, "max_tokens": 1, "kv_transfer_params": self._p_params(transfer_id)}
        if self.mode == "write":
            body_d = {"prompt": o.prompt, "max_tokens": self.args.max_tokens, "stream": True,
                      "kv_transfer_params": self._d_params_write(transfer_id, p_id)}
            t = threading.Thread(target=post_then_abandon, args=(p_url, body_p, o.request_id, delay))
            t.start()
            post_then_abandon(self.decode, body_d, o.request_id, delay, stream_tokens=1)
            t.join()
            return
        if self.rng.random() < 0.5:
            post_then_abandon(p_url, body_p, o.request_id, delay)  # gone during P's prefill
            return
        try:  # P finished; the client leaves while D loads or decodes
            p = completion(p_url, o.prompt, 1, self._p_params(transfer_id), o.request_id)
        except (OSError, HttpError) as e:
            o.error = f"P leg of an aborted request failed: {e}"
            return
        params = dict(p.get("kv_transfer_params") or {})
        params.setdefault("transfer_id", transfer_id)
        body_d = {"prompt": o.prompt, "max_tokens": self.args.max_tokens, "stream": True, "kv_transfer_params": params}
        post_then_abandon(self.decode, body_d, o.request_id, delay, stream_tokens=1)

    def leaked(self, timeout_s: float) -> dict[str, int]:
        """Blocks still in use per side once the engines settle (0 = nothing leaked)."""
        urls = {"decode": [self.decode], "prefill": self.prefills}
        deadline = time.monotonic() + timeout_s
        while True:
            out = {}
            busy = False
            for side, us in urls.items():
                total = 0
                for u in us:
                    try:
                        s = get_json(u, "/kvferry/stats")
                    except (OSError, HttpError):
                        total += 1 << 30
                        continue
                    total += s["num_blocks"] - s["free_blocks"]
                    busy |= bool(s.get("running") or s.get("waiting") or s.get("delayed_free"))
                out[side] = total
            if (not busy and not any(out.values())) or time.monotonic() > deadline:
                return out
            time.sleep(0.1)

    def run(self) -> dict[str, Any]:
        first, second = self.plan()
        with ThreadPoolExecutor(self.args.concurrency) as pool:
            done = list(pool.map(self.run_one, first))
            done += list(pool.map(self.run_one, second))
        completed = [o for o in done if o.completed]
        failed = [o for o in done if o.error]
        mismatched = [o for o in completed if o.tokens != o.baseline]
        unverified = [o for o in completed if o.kv_verified is not True]
        leaked = self.leaked(self.args.settle_timeout)
        result: dict[str, Any] = {
            "mode": self.mode,
            "requests": len(done),
            "completed": len(completed),
            "aborted": sum(1 for o in done if o.aborted),
            "failed": len(failed),
            "tokens_match": bool(completed) and not mismatched,
            "kv_verified": bool(completed) and not unverified,
            "leaked_blocks": leaked,
            "prefix_hits": sum(1 for o in completed if o.prefix_hit_tokens > 0),
            "chunked": sum(1 for o in completed if len(o.prompt) > self.args.chunk_hint),
        }
        problems = []
        for o in failed[:3]:
            problems.append(f"{o.request_id}: {o.error}")
        for o in mismatched[:3]:
            problems.append(f"{o.request_id}: D gave {o.tokens}, the baseline {o.baseline}")
        for o in unverified[:3]:
            problems.append(f"{o.request_id}: KV not verified: {o.detail}")
        if problems:
            result["problems"] = problems
        return result


def ok(result: dict[str, Any]) -> bool:
    return (result["tokens_match"] and result["kv_verified"] and result["failed"] == 0
            and not any(result["leaked_blocks"].values()))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvferry.demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--prefill", required=True, help="P engines' base URLs, comma separated")
    p.add_argument("--decode", required=True, help="D engine's base URL")
    p.add_argument("--baseline", required=True, help="an undisaggregated engine's base URL (--no-connector)")
    p.add_argument("--router", help="send each request to this router (kvferry router --http-port) as a client "
                                    "would, instead of running P's and D's legs here")
    p.add_argument("--mode", default="write", help="write, read or write,read")
    p.add_argument("--json", action="store_true", help="print one JSON line per mode")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--min-prompt", type=int, default=8)
    p.add_argument("--max-prompt", type=int, default=700)
    p.add_argument("--max-tokens", type=int, default=8, help="tokens D generates per request")
    p.add_argument("--abort-rate", type=float, default=0.15)
    p.add_argument("--prefix-rate", type=float, default=0.3)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--chunk-hint", type=int, default=256, help="prompts longer than this count as chunked")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--settle-timeout", type=float, default=120.0, help="seconds to wait for 0 blocks in use")
    p.add_argument("--prefill-engine-id", help="P's engine id (default: from its /kvferry/stats)")
    p.add_argument("--decode-engine-id", help="D's engine id (default: from its /kvferry/stats)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    modes = [m.strip() for m in args.mode.split(",") if m.strip()]
    for m in modes:
        if m not in ("write", "read"):
            print(f"kvferry demo: mode must be write or read, got {m!r}", file=sys.stderr)
            return 2
    all_ok = True
    for m in modes:
        result = Workload(args, m).run()
        all_ok &= ok(result)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(f"{m}: {result['completed']}/{result['requests']} completed, {result['aborted']} aborted, "
                  f"{result['failed']} failed; tokens match the baseline: {result['tokens_match']}; "
                  f"KV verified on D: {result['kv_verified']}; blocks in use after: {result['leaked_blocks']}; "
                  f"prefix hits on D: {result['prefix_hits']}", flush=True)
            for line in result.get("problems", []):
                print(f"  {line}", flush=True)
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
