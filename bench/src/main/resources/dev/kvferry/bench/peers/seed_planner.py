#!/usr/bin/env python3
"""kvferry bench peer: the seed's transfer planner, timed beside kvferry's.

The seed (vLLM's MoRIIO connector) plans one layer's copies in two steps of its worker:
`_compute_block_transfer_offsets` lists a (local offset, remote offset, size) triple per K and V
block, then `merge_contiguous_blocks` sorts them by local offset with numpy and fuses runs that are
adjacent on both sides. This peer does the same work with the same numpy operations, on the KV
cache's shape and strides instead of a torch tensor. Needs numpy only.

stdin, one JSON object:
  {"layout": "standard" | "mla", "num_blocks": N, "remote_num_blocks": M,
   "block_size": 16, "kv_heads": 8, "head_dim": 128,   # standard
   "latent": 576,                                       # mla
   "elem_size": 2, "local_block_ids": [...], "remote_block_ids": [...]}
stdout, one JSON object: {"local_offsets": [...], "remote_offsets": [...], "sizes": [...]}
`--bench K` also times K calls and adds "seconds_per_call" (the median of 5 rounds).
"""
import json
import sys
import time

import numpy as np


def fuse_adjacent(local, remote, sizes):
    """Sorts the triples by local offset and fuses runs adjacent on both sides (the seed's merge)."""
    n = len(local)
    if n == 0:
        return [], [], []
    if not n == len(remote) == len(sizes):
        raise ValueError("offset and size lists differ in length")
    loc = np.fromiter(local, dtype=np.int64, count=n)
    rem = np.fromiter(remote, dtype=np.int64, count=n)
    siz = np.fromiter(sizes, dtype=np.int64, count=n)
    if not np.all(loc[:-1] <= loc[1:]):
        order = np.argsort(loc, kind="stable")
        loc, rem, siz = loc[order], rem[order], siz[order]
    if n == 1:
        return [int(loc[0])], [int(rem[0])], [int(siz[0])]
    step = siz[:-1]
    joins = ((loc[1:] - loc[:-1]) == step) & ((rem[1:] - rem[:-1]) == step)
    if not joins.any():
        return loc.tolist(), rem.tolist(), siz.tolist()
    if joins.all():
        return [int(loc[0])], [int(rem[0])], [int(siz.sum())]
    cuts = np.flatnonzero(~joins) + 1
    starts = np.concatenate(([0], cuts))
    ends = np.concatenate((cuts, [n]))
    out_l, out_r, out_s = [], [], []
    for s, e in zip(starts, ends):
        out_l.append(int(loc[s]))
        out_r.append(int(rem[s]))
        out_s.append(int(loc[e - 1] + siz[e - 1] - loc[s]))
    return out_l, out_r, out_s


def compute_block_transfer_offsets(shape, local_ids, remote_ids):
    """One triple per block (MLA) or per K and V block (standard), then fused (the seed's offsets)."""
    elem = shape["elem_size"]
    mla = shape["layout"] == "mla"
    if mla:
        block_elems = shape["block_size"] * shape["latent"]
        k_to_v_local = k_to_v_remote = 0
    else:
        block_elems = shape["block_size"] * shape["kv_heads"] * shape["head_dim"]
        k_to_v_local = block_elems * shape["num_blocks"]
        k_to_v_remote = block_elems * shape.get("remote_num_blocks", shape["num_blocks"])
    size = block_elems * elem
    halves = 1 if mla else 2
    local = [0] * (len(local_ids) * halves)
    remote = [0] * len(local)
    sizes = [size] * len(local)
    i = 0
    for lb, rb in zip(local_ids, remote_ids):
        local[i] = elem * lb * block_elems
        remote[i] = elem * rb * block_elems
        i += 1
        if not mla:
            local[i] = elem * (k_to_v_local + lb * block_elems)
            remote[i] = elem * (k_to_v_remote + rb * block_elems)
            i += 1
    return fuse_adjacent(local, remote, sizes)


def main():
    shape = json.load(sys.stdin)
    local_ids, remote_ids = shape["local_block_ids"], shape["remote_block_ids"]
    lo, ro, sz = compute_block_transfer_offsets(shape, local_ids, remote_ids)
    out = {"local_offsets": lo, "remote_offsets": ro, "sizes": sz}
    if len(sys.argv) == 3 and sys.argv[1] == "--bench":
        calls = int(sys.argv[2])
        per_call = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                compute_block_transfer_offsets(shape, local_ids, remote_ids)
            per_call.append((time.perf_counter() - start) / calls)
        out["seconds_per_call"] = sorted(per_call)[2]
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
