#!/usr/bin/python3
"""kvferry bench peer: the seed's control-plane round trip, timed.

D sends P "remote_blocks", P answers D "write_done", on the seed's stack: ZeroMQ DEALER sockets
sending msgpack maps to one ROUTER listener per side, P and D in separate processes on loopback.
Debian's python3-zmq and python3-msgpack (hence /usr/bin/python3).

usage: seed_notify_rtt.py [ROUND_TRIPS] [BLOCKS_PER_MESSAGE]
One JSON line out: p50_us, p99_us, mean_us over the round trips after a warm-up.
"""
import json
import multiprocessing
import socket
import sys
import time

import msgpack
import zmq


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prefill_side(p_port, d_port, ready):
    """P: every remote_blocks is answered with write_done for the same transfer."""
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.ROUTER)
    inbox.bind(f"tcp://127.0.0.1:{p_port}")
    to_decode = ctx.socket(zmq.DEALER)
    to_decode.connect(f"tcp://127.0.0.1:{d_port}")
    ready.set()
    while True:
        _, frame = inbox.recv_multipart()
        message = msgpack.loads(frame)
        if message.get("type") == "stop":
            break
        to_decode.send(msgpack.dumps({"type": "write_done", "transfer_id": message["transfer_id"]}))
    to_decode.close(linger=0)
    inbox.close(linger=0)
    ctx.term()


def percentile(sorted_us, q):
    return round(sorted_us[min(len(sorted_us) - 1, int(len(sorted_us) * q))], 1)


def main():
    trips = int(sys.argv[1]) if len(sys.argv) > 1 else 20000
    blocks = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    p_port, d_port = free_port(), free_port()
    ready = multiprocessing.Event()
    prefill = multiprocessing.Process(target=prefill_side, args=(p_port, d_port, ready))
    prefill.start()
    ready.wait()
    ctx = zmq.Context()
    inbox = ctx.socket(zmq.ROUTER)
    inbox.bind(f"tcp://127.0.0.1:{d_port}")
    to_prefill = ctx.socket(zmq.DEALER)
    to_prefill.connect(f"tcp://127.0.0.1:{p_port}")
    block_ids = list(range(1000, 1000 + blocks))
    warm_up = min(2000, trips // 5)
    samples = []
    for i in range(trips + warm_up):
        start = time.perf_counter()
        to_prefill.send(msgpack.dumps({"type": "remote_blocks", "transfer_id": f"tx-{i}",
                                       "req_id": f"req-{i}", "block_notify_list": block_ids,
                                       "decode_rank": 0}))
        _, frame = inbox.recv_multipart()
        if msgpack.loads(frame)["transfer_id"] != f"tx-{i}":
            raise SystemExit(f"round trip {i}: answer for another transfer")
        if i >= warm_up:
            samples.append((time.perf_counter() - start) * 1e6)
    to_prefill.send(msgpack.dumps({"type": "stop"}))
    prefill.join()
    samples.sort()
    print(json.dumps({"round_trips": trips, "blocks_per_message": blocks,
                      "p50_us": percentile(samples, 0.5), "p99_us": percentile(samples, 0.99),
                      "mean_us": round(sum(samples) / len(samples), 1)}))
    to_prefill.close(linger=0)
    inbox.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    main()
