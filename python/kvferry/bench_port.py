"""The engine port's cost, measured from a client: `python -m kvferry.bench_port --socket PATH`.

Against a running node (`kvferry node --engine port --engine-socket PATH`), as one engine with
one worker: the round trip of `ping` and of a scheduler call, and the port's time in one engine
step at N requests per step, as vLLM would call the connector: the scheduler's
`build_connector_meta` over N scheduled requests, then the worker's `bind_connector_metadata`,
`start_load_kv`, one `save_kv_layer` per layer, `wait_for_save` and `get_finished` (asked a step
ahead, as a prefill engine's worker does; `--finished-round-trip`: a round trip each step). With
`--new K`, K of the N requests are new that step (`get_num_new_matched_tokens` and
`update_state_after_alloc` each) and K finish (`request_finished`). The requests carry no
kv_transfer_params (kvferry moves none of them): by default the client answers them itself and
the node never hears of them; `--send-plain` has the client tell the node (in batches), so its
side of each request is timed too. `--p-params`: the new requests carry the params a router gives
P (`do_remote_decode`, a transfer id, D's engine id), are scheduled for the first half of their
prompt (so nothing is saved) and finish `length_capped`, as P's requests do, sent as P's client,
whose engine role is `prefill`, sends them (`get_num_new_matched_tokens` one-way, and
`request_finished` one-way once the node's first answer showed D's params);
`--matched-round-trip` makes the client ask the node both as round trips (`local_answers` off).
`build_connector_meta` goes a step ahead where the client knows the step's counts (PortClient
`build_ahead`); `--build-round-trip` makes it a round trip each step.
The timed steps follow WARM_UP_S seconds of the same steps.
`--gap-ms G` also times pings that each follow G ms of sleep, as an engine's calls follow a
forward pass: both the node's thread and the client's have gone to sleep by then
(`KVFERRY_PORT_SPIN_US` and the node's `-Dkvferry.port.spin-us` change what that costs).
Prints one JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time

from .port import PortClient

WARM_UP_S = 2.0  # steps run before the timed ones (at least a quarter of them, too)


def _percentile(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def _timed(fn, count: int) -> list[float]:
    out = []
    for _ in range(count):
        t0 = time.perf_counter_ns()
        fn()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


def _pings_after_sleep(client: PortClient, gap_ms: float, count: int) -> list[float]:
    """Microseconds of each ping that follows ``gap_ms`` of sleep (the sleep not counted)."""
    out = []
    for _ in range(count):
        time.sleep(gap_ms / 1000.0)
        out.extend(_timed(client.ping, 1))
    return out


def run(socket_path: str, requests: int, new: int, layers: int, steps: int, round_trips: int,
        send_plain: bool = False, gaps_ms: tuple[float, ...] = (), finished_ahead: bool = True,
        p_params: bool = False, matched_round_trip: bool = False, build_ahead: bool = True) -> dict:
    geometry = {"layout": "standard", "num_blocks": 64, "block_size": 16, "kv_heads": 1, "head_dim": 8,
                "dtype_bytes": 2}
    layer_bytes = 2 * 64 * 16 * 1 * 8 * 2
    fd, path = tempfile.mkstemp(prefix="kvferry-bench-port-", dir="/dev/shm")
    try:
        os.fchmod(fd, 0o600)
        os.ftruncate(fd, layers * layer_bytes)
        os.close(fd)
        memory = {"kind": "host", "layers": [{"path": path, "offset": i * layer_bytes, "length": layer_bytes}
                                             for i in range(layers)]}
        # The node is a prefill node: its worker asks get_finished ahead, as the vLLM connector's
        # and the reference engine's producers do (PortClient finished_ahead).
        worker = PortClient(socket_path, "worker", tp_rank=0, geometry=geometry, memory=memory,
                            finished_ahead=finished_ahead)
        worker.connect()
        # A prefill engine's role in the hello is what lets the client answer P's
        # get_num_new_matched_tokens and request_finished itself; without it the client asks.
        engine = {"role": "prefill"} if p_params else None
        scheduler = PortClient(socket_path, "scheduler", engine=engine, send_plain=send_plain,
                               local_answers=not matched_round_trip, build_ahead=build_ahead)
        scheduler.connect()
        try:
            out = _measure(scheduler, worker, requests, new, layers, steps, round_trips, p_params)
            for gap in gaps_ms:
                after_gap = _pings_after_sleep(scheduler, gap, max(round_trips // 10, 20))
                out[f"ping_after_{gap:g}ms_p50_us"] = round(_percentile(after_gap, 0.5), 1)
                out[f"ping_after_{gap:g}ms_p90_us"] = round(_percentile(after_gap, 0.9), 1)
            out["client_spin_us"] = round(scheduler.reply_spin_s * 1e6, 1)
            out["finished_ahead"] = finished_ahead
            out["builds_ahead"] = scheduler.local_answer_counts.get("build_connector_meta", 0)
            if p_params:
                out["p_params"] = True
                out["matched_round_trip"] = matched_round_trip
            return out
        finally:
            scheduler.close()
            worker.close()
    finally:
        os.unlink(path)


def _measure(scheduler: PortClient, worker: PortClient, requests: int, new: int, layers: int, steps: int,
             round_trips: int, p_params: bool = False) -> dict:
    _timed(scheduler.ping, round_trips // 4)  # warm the node's paths
    ping = _timed(scheduler.ping, round_trips)
    ids = iter(range(10 ** 9))

    def one_call() -> None:
        # Asked as a round trip on purpose: the client sends this op one-way for a request
        # without params, which would time a send, not the node's answer.
        scheduler.call("get_num_new_matched_tokens", {"request_id": f"rtt-{next(ids)}", "num_prompt_tokens": 64,
                                                      "kv_transfer_params": None, "num_computed_tokens": 0})

    call = _timed(one_call, round_trips)
    running = [f"run-{i}" for i in range(requests)]
    for r in running:
        scheduler.get_num_new_matched_tokens(r, 64, None, 0)
        scheduler.update_state_after_alloc(r, [1, 2, 3, 4], 0)
    cached = [{"request_id": r, "new_block_ids": [], "num_computed_tokens": 65} for r in running]

    def step() -> None:
        fresh = []
        for _ in range(new):
            r = f"new-{next(ids)}"
            if p_params:  # P's first chunk of a 128-token prompt: nothing to save this step
                params = {"do_remote_decode": True, "transfer_id": f"x-{r}", "remote_engine_id": "bench-d"}
                scheduler.get_num_new_matched_tokens(r, 128, params, 0)
            else:
                scheduler.get_num_new_matched_tokens(r, 64, None, 0)
            scheduler.update_state_after_alloc(r, [5, 6, 7, 8], 0)
            fresh.append({"request_id": r, "block_ids": [5, 6, 7, 8], "num_computed_tokens": 64})
        meta = scheduler.build_connector_meta(fresh, cached[: requests - new])
        worker.bind_connector_metadata(meta)
        worker.start_load_kv()
        for layer in range(layers):
            worker.save_kv_layer(layer)
        worker.wait_for_save()
        worker.get_finished()
        for f in fresh:
            scheduler.request_finished(f["request_id"], [5, 6, 7, 8], "length_capped" if p_params else "stopped")

    # Warm up for a time, not a count: the node's code for new requests runs interpreted until the
    # JIT has seen it often enough, and a node serves for hours.
    warm_until = time.perf_counter() + WARM_UP_S
    warm_steps = 0
    while warm_steps < max(steps // 4, 5) or time.perf_counter() < warm_until:
        step()
        warm_steps += 1
    step_us = _timed(step, steps)
    p50 = statistics.median(step_us)
    return {
        "ping_p50_us": round(_percentile(ping, 0.5), 1), "ping_p99_us": round(_percentile(ping, 0.99), 1),
        "scheduler_call_p50_us": round(_percentile(call, 0.5), 1),
        "scheduler_call_p99_us": round(_percentile(call, 0.99), 1),
        "requests_per_step": requests, "new_per_step": new, "layers": layers,
        "step_port_p50_us": round(p50, 1), "step_port_p99_us": round(_percentile(step_us, 0.99), 1),
        "share_of_10ms_step_p50": round(p50 / 10_000.0, 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m kvferry.bench_port", description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--requests", type=int, default=256, help="requests scheduled per step")
    p.add_argument("--new", type=int, default=0, help="of them new (and finishing) each step")
    p.add_argument("--layers", type=int, default=32)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--round-trips", type=int, default=2000)
    p.add_argument("--send-plain", action="store_true", help="tell the node of the requests (PortClient send_plain)")
    p.add_argument("--finished-round-trip", action="store_true",
                   help="get_finished as a round trip in every step (the default asks it a step ahead, "
                        "as a prefill engine's worker does)")
    p.add_argument("--gap-ms", type=float, action="append", default=[],
                   help="also time pings after this long asleep (repeatable)")
    p.add_argument("--p-params", action="store_true",
                   help="new requests carry the params a router gives P, sent as P's client does")
    p.add_argument("--matched-round-trip", action="store_true",
                   help="with --p-params: get_num_new_matched_tokens and request_finished as round trips "
                        "(the client's local answers off)")
    p.add_argument("--build-round-trip", action="store_true",
                   help="build_connector_meta as a round trip in every step (the default builds a step ahead "
                        "where the client knows its counts: PortClient build_ahead)")
    a = p.parse_args(argv)
    if a.matched_round_trip and not a.p_params:
        p.error("--matched-round-trip needs --p-params")
    print(json.dumps(run(a.socket, a.requests, a.new, a.layers, a.steps, a.round_trips, a.send_plain,
                         tuple(a.gap_ms), finished_ahead=not a.finished_round_trip,
                         p_params=a.p_params, matched_round_trip=a.matched_round_trip,
                         build_ahead=not a.build_round_trip)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
