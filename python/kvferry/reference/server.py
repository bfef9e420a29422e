"""The reference engine's OpenAI-compatible HTTP endpoint (standard library only).

POST /v1/completions  prompt (string or token ids), max_tokens, stream, kv_transfer_params
POST /v1/chat/completions  messages (as "role: content" lines), the same options
GET  /v1/models, /health, /kvferry/stats
A client that disconnects before its answer aborts its request.
"""

from __future__ import annotations

import itertools
import json
import queue
import select
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .engine import Event, ReferenceEngine, Request
from .model import VOCAB_SIZE, detokenize, tokenize

_ids = itertools.count(1)


class CompletionError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind


def parse_prompt(prompt: Any) -> list[int]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        tokens = tokenize(prompt)
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        tokens = list(prompt)
        if any(t < 0 or t >= VOCAB_SIZE for t in tokens):
            raise CompletionError(400, f"token ids must be in 0..{VOCAB_SIZE - 1}")
    else:
        raise CompletionError(400, "prompt must be a string or a list of token ids (batches are not supported)")
    if not tokens:
        raise CompletionError(400, "prompt is empty")
    return tokens


def chat_prompt(messages: Any) -> str:
    """The prompt a chat request stands for: each message as "role: content" on its own line,
    then the assistant's turn (the reference model has no chat template of its own)."""
    if not isinstance(messages, list) or not messages:
        raise CompletionError(400, "messages must be a non-empty list")
    lines = []
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("content"), str):
            raise CompletionError(400, "each message needs a string content")
        lines.append(f"{m.get('role', 'user')}: {m['content']}")
    return "\n".join(lines) + "\nassistant:"


class EngineHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client (or the router's connection pool) resetting an idle connection is routine.
        import sys
        if isinstance(sys.exc_info()[1], (ConnectionResetError, BrokenPipeError)):
            return
        super().handle_error(request, client_address)

    def __init__(self, address: tuple[str, int], engine: ReferenceEngine, model: str):
        super().__init__(address, Handler)
        self.engine = engine
        self.model = model


class Handler(BaseHTTPRequestHandler):
    # Headers and body go out as separate small writes: with Nagle's algorithm the body waits for
    # the client's delayed ACK of the headers (up to 40 ms on Linux) whenever the client does not
    # ACK at once, as a JVM client behind the router did not.
    disable_nagle_algorithm = True

    protocol_version = "HTTP/1.1"
    server: EngineHTTPServer
    _next_check = 0.0

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: the tests start many
        pass

    # -- helpers --

    def _json(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, status: int, message: str, kind: str = "kv_transfer_error") -> None:
        self._json(status, {"error": {"message": message, "type": kind, "code": status}})

    def _client_gone(self) -> bool:
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # -- routes --

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        path = self.path.split("?", 1)[0]
        engine = self.server.engine
        if path == "/health":
            down = engine.stats().get("node_down")
            if down:
                self._error(503, f"kvferry node unavailable: {down}", "service_unavailable")
            else:
                self._json(200, {"status": "ok"})
        elif path == "/v1/models":
            self._json(200, {"object": "list", "data": [
                {"id": self.server.model, "object": "model", "created": 0, "owned_by": "kvferry",
                 "max_model_len": engine.geometry.num_blocks * engine.geometry.block_size}]})
        elif path == "/kvferry/stats":
            self._json(200, engine.stats())
        else:
            self._error(404, f"no route {path}", "not_found")

    def do_POST(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        if path not in ("/v1/completions", "/v1/chat/completions"):
            self._error(404, f"no route {path}", "not_found")
            return
        chat = path == "/v1/chat/completions"
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise CompletionError(400, "the body must be a JSON object")
            tokens = parse_prompt(chat_prompt(body.get("messages")) if chat else body.get("prompt"))
            max_tokens = body.get("max_tokens", 16)
            if not isinstance(max_tokens, int) or max_tokens < 1:
                raise CompletionError(400, "max_tokens must be a positive integer")
            params = body.get("kv_transfer_params")
            if params is not None and not isinstance(params, dict):
                raise CompletionError(400, "kv_transfer_params must be an object")
        except CompletionError as e:
            self._error(e.status, e.message, e.kind)
            return
        except (ValueError, json.JSONDecodeError) as e:
            self._error(400, f"bad request body: {e}", "invalid_request_error")
            return
        external = self.headers.get("X-Request-Id") or f"{next(_ids)}"
        request_id = f"cmpl-{external}-{next(_ids)}"
        r = Request(request_id, tokens, max_tokens, dict(params) if params else None)
        self.server.engine.submit(r)
        if body.get("stream"):
            self._stream(r, body, chat)
        else:
            self._complete(r, body, chat)

    def _next_event(self, r: Request) -> Event | None:
        """The request's next event; None if the client went away (the request is aborted)."""
        while True:
            try:
                ev = r.events.get(timeout=0.05)
                if ev.kind != "token" or time.monotonic() < self._next_check:
                    return ev
            except queue.Empty:
                ev = None
            self._next_check = time.monotonic() + 0.05
            if self._client_gone():
                self.server.engine.abort(r.request_id)
                self.close_connection = True
                return None
            if ev is not None:
                return ev

    def _base(self, r: Request) -> dict[str, Any]:
        return {"id": r.request_id, "created": int(time.time()), "model": self.server.model}

    def _complete(self, r: Request, body: dict, chat: bool = False) -> None:
        tokens: list[int] = []
        while True:
            ev = self._next_event(r)
            if ev is None:
                return
            if ev.kind == "token":
                tokens.append(ev.token)  # type: ignore[arg-type]
            elif ev.kind == "error":
                status, kind = _error_status(ev)
                self._error(status, ev.message or "failed", kind)
                return
            else:
                out = self._base(r)
                if chat:
                    choice = {"index": 0, "message": {"role": "assistant", "content": detokenize(tokens)},
                              "finish_reason": ev.finish_reason, "token_ids": tokens}
                else:
                    choice = {"index": 0, "text": detokenize(tokens), "logprobs": None,
                              "finish_reason": ev.finish_reason, "stop_reason": None, "token_ids": tokens}
                out.update({
                    "object": "chat.completion" if chat else "text_completion",
                    "choices": [choice],
                    "usage": {"prompt_tokens": len(r.prompt), "completion_tokens": len(tokens),
                              "total_tokens": len(r.prompt) + len(tokens)},
                    "kv_transfer_params": ev.kv_transfer_params,
                    "kvferry": ev.info,
                })
                self._json(200, out)
                return

    def _stream(self, r: Request, body: dict, chat: bool = False) -> None:
        started = False

        def start() -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()

        def send(obj: Any) -> bool:
            try:
                data = obj if isinstance(obj, str) else json.dumps(obj)
                self.wfile.write(f"data: {data}\n\n".encode())
                self.wfile.flush()
                return True
            except OSError:
                self.server.engine.abort(r.request_id)
                return False

        self.close_connection = True
        count = 0
        while True:
            ev = self._next_event(r)
            if ev is None:
                return
            if ev.kind == "error" and not started:
                status, kind = _error_status(ev)
                self._error(status, ev.message or "failed", kind)
                return
            if not started:
                start()
                started = True
            chunk = self._base(r)
            chunk["object"] = "chat.completion.chunk" if chat else "text_completion"
            if ev.kind == "token":
                count += 1
                text = detokenize([ev.token])  # type: ignore[list-item]
                if chat:
                    chunk["choices"] = [{"index": 0, "delta": {"content": text}, "finish_reason": None,
                                         "token_ids": [ev.token]}]
                else:
                    chunk["choices"] = [{"index": 0, "text": text, "logprobs": None,
                                         "finish_reason": None, "stop_reason": None, "token_ids": [ev.token]}]
                if not send(chunk):
                    return
                continue
            if ev.kind == "error":
                send({"error": {"message": ev.message, "type": "kv_transfer_error", "code": 500}})
                return
            if chat:
                chunk["choices"] = [{"index": 0, "delta": {}, "finish_reason": ev.finish_reason, "token_ids": []}]
            else:
                chunk["choices"] = [{"index": 0, "text": "", "logprobs": None,
                                     "finish_reason": ev.finish_reason, "stop_reason": None, "token_ids": []}]
            chunk["kv_transfer_params"] = ev.kv_transfer_params
            chunk["kvferry"] = ev.info
            if body.get("stream_options", {}).get("include_usage"):
                chunk["usage"] = {"prompt_tokens": len(r.prompt), "completion_tokens": count,
                                  "total_tokens": len(r.prompt) + count}
            if send(chunk):
                send("[DONE]")
            return


def _error_status(ev: Event) -> tuple[int, str]:
    """HTTP status and OpenAI error type of an engine error: the node refusing a request's
    params is the client's fault (400); a failed transfer or a lost node is not (500/503)."""
    code = (ev.info or {}).get("code")
    if code in ("bad_args", "unknown_request", "identity_mismatch"):
        return 400, "invalid_request_error"
    if ev.message and "node unavailable" in ev.message:
        return 503, "service_unavailable"
    return 500, "kv_transfer_error"


def serve(engine: ReferenceEngine, host: str, port: int, model: str) -> EngineHTTPServer:
    """Binds (port 0 = any free port) and serves on a daemon thread."""
    server = EngineHTTPServer((host, port), engine, model)
    threading.Thread(target=server.serve_forever, name="reference-http", daemon=True).start()
    return server
