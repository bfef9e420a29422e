"""Both engines detach and attach again, then one transfer starts at once, CYCLES times (the
re-attach race of docs/results/2026-12-04-reattach-race/): kvferry.gpu_check's engine processes on
the CPU with a 2-layer model, against a router and P and D nodes already running (see
scripts/reattach-race-ab.sh). Prints one line per failed cycle and a count; exit status 0.

usage: python3 scripts/reattach_stress.py P_SOCKET D_SOCKET CYCLES [MODE]
"""

import random
import sys
import time

import torch.multiprocessing as tmp

from kvferry import gpu_check as gc


def main() -> int:
    p_socket, d_socket, cycles = sys.argv[1], sys.argv[2], int(sys.argv[3])
    mode = sys.argv[4] if len(sys.argv) > 4 else "write"
    args = gc.parse_args(["--p-socket", p_socket, "--d-socket", d_socket, "--layers", "2",
                          "--num-blocks", "256", "--p-device", "cpu", "--d-device", "cpu"])
    cfg = {"spec": {"arch": args.arch, "layers": args.layers, "vocab": args.vocab, "seed": args.seed,
                    "attention": args.attention, "heads": args.heads, "kv_heads": args.kv_heads,
                    "head_dim": args.head_dim, "intermediate": args.intermediate},
           "num_blocks": args.num_blocks, "block_size": args.block_size, "chunk_tokens": args.chunk_tokens,
           "load_events": True, "pipelined_layer_waits": True, "torch_threads": 1}
    ctx = tmp.get_context("spawn")
    p = gc._Proc(ctx, "prefill", "cpu", p_socket, {**cfg, "cpus": None})
    d = gc._Proc(ctx, "decode", "cpu", d_socket, {**cfg, "cpus": None})
    rng = random.Random(1)
    left = other = 0
    began = time.perf_counter()
    try:
        for c in range(cycles):
            p_info = p.call("attach", mode=mode)
            d_info = d.call("attach", mode=mode)
            rid = f"stress-{c}"
            try:
                gc._disaggregated_first(p, d, mode, rid, [rng.randrange(3, args.vocab) for _ in range(48)],
                                        p_info, d_info)
            except RuntimeError as e:
                left += "left the cluster" in str(e)
                other += "left the cluster" not in str(e)
                print(f"cycle {c}: {str(e).strip().splitlines()[-1][:300]}", flush=True)
                d.call("abort", rid=rid)
            p.call("detach")
            d.call("detach")
    finally:
        p.stop()
        d.stop()
    print(f"cycles {cycles} left_the_cluster {left} other_failures {other} "
          f"wall_s {time.perf_counter() - began:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
