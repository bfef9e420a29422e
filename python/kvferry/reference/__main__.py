"""``python -m kvferry.reference``: one reference engine (P or D, or undisaggregated)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from ..port import NodeUnavailable, PortError
from .engine import ReferenceEngine
from .model import Geometry
from .server import serve


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvferry.reference",
                                description="kvferry's reference engine: a paged KV cache in /dev/shm, "
                                            "chunked prefill, a prefix cache, an OpenAI-compatible endpoint, "
                                            "driving a kvferry node through the engine port.")
    p.add_argument("--socket", help="the node's engine socket (kvferry node --engine port --engine-socket)")
    p.add_argument("--no-connector", action="store_true", help="run undisaggregated: no node (the baseline)")
    p.add_argument("--http-host", default="127.0.0.1")
    p.add_argument("--http-port", type=int, default=0, help="0 picks a free port (default)")
    p.add_argument("--advertise-url", help="the base URL routers call this engine at (default: "
                                           "http://HTTP_HOST:PORT; set it when binding 0.0.0.0)")
    p.add_argument("--mode", choices=["write", "read"], default="write")
    p.add_argument("--role", choices=["prefill", "decode"], default="decode")
    p.add_argument("--engine-id", help="must match the node's engine id when given")
    p.add_argument("--tp-size", type=int, default=1, help="TP ranks: one worker connection each")
    p.add_argument("--num-blocks", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=8, help="KV heads over all TP ranks")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype-bytes", type=int, default=2)
    p.add_argument("--mla", action="store_true", help="MLA layout [num_blocks, block_size, latent]")
    p.add_argument("--blocks-first", action="store_true",
                   help="FlashInfer's layout [num_blocks, 2, block_size, heads, head_dim] instead of "
                        "[2, num_blocks, ...]")
    p.add_argument("--latent", type=int, default=576)
    p.add_argument("--max-num-batched-tokens", type=int, default=256, help="token budget per step")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--model", default="kvferry-reference", help="the model name /v1/models reports")
    p.add_argument("--shm-dir", default="/dev/shm")
    p.add_argument("--node-wait", type=float, default=60.0, help="seconds to wait for the node's socket")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    if not args.no_connector and not args.socket:
        p.error("--socket is required unless --no-connector")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        geometry = Geometry(layers=args.layers, num_blocks=args.num_blocks, block_size=args.block_size,
                            kv_heads=args.kv_heads, head_dim=args.head_dim, dtype_bytes=args.dtype_bytes,
                            tp_size=args.tp_size, mla=args.mla, latent=args.latent if args.mla else 0,
                            blocks_first=args.blocks_first)
    except ValueError as e:
        print(f"kvferry-reference: {e}", file=sys.stderr)
        return 2
    engine: ReferenceEngine | None = None
    server = None
    try:
        # Bind first: the scheduler's hello carries the HTTP URL.
        engine = ReferenceEngine(geometry, role=args.role, mode=args.mode,
                                 socket_path=None if args.no_connector else args.socket,
                                 engine_id=args.engine_id, max_num_batched_tokens=args.max_num_batched_tokens,
                                 prefix_caching=not args.no_prefix_caching, shm_dir=args.shm_dir)
        server = serve(engine, args.http_host, args.http_port, args.model)
        url = args.advertise_url or f"http://{args.http_host}:{server.server_address[1]}"
        if engine.connector is not None:
            engine.connector.scheduler.http_url = url
            engine.connect(wait_s=args.node_wait)
        engine.start()
        print(f"kvferry-reference ready {url}", flush=True)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        stop.wait()
        return 0
    except (NodeUnavailable, PortError) as e:
        print(f"kvferry-reference: {e}", file=sys.stderr)
        return 1
    finally:
        if server is not None:
            server.shutdown()
        if engine is not None:
            engine.stop()


if __name__ == "__main__":
    sys.exit(main())
