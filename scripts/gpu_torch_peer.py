#!/usr/bin/env python3
"""The PyTorch peer of kvferry's GPU bench, and the report.

Copies the same bytes as GpuTransferBench (same layer layout, same block ids, read from the ids
files the bench wrote) between the same two devices, in one process: contiguous runs with one
copy_ per run, scattered blocks with one copy_ per 32 KiB block (and, for reference, an index
gather/scatter). Then prints kvferry's GB/s against PyTorch's with the goals, and writes
summary.{txt,json} (with both sides' raw figures).

usage: gpu_torch_peer.py P_GPU D_GPU WORK_DIR OUT_DIR
"""
import json
import statistics
import sys
import time

import torch


def runs(local, remote, block_bytes):
    out = []
    for l, r in zip(local, remote):
        if out and out[-1][0] + out[-1][2] == l and out[-1][1] + out[-1][2] == r:
            out[-1][2] += block_bytes
        else:
            out.append([l, r, block_bytes])
    return out


def slots(ids, capacity, block_bytes):
    return [i * block_bytes for i in ids] + [(capacity + i) * block_bytes for i in ids]


def main():
    p_gpu, d_gpu, work, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    kv = json.load(open(f"{work}/kvferry-gpu.json"))
    layers, blocks, bb, reps = kv["layers"], kv["blocks"], kv["block_bytes"], kv["reps"]
    capacity = kv.get("capacity") or 2 * blocks
    pd, dd = torch.device("cuda", p_gpu), torch.device("cuda", d_gpu)
    layer_bytes = 2 * capacity * bb
    src = [torch.randint(0, 256, (layer_bytes,), dtype=torch.uint8, device=pd) for _ in range(layers)]
    dst = [torch.zeros(layer_bytes, dtype=torch.uint8, device=dd) for _ in range(layers)]

    def sync():
        torch.cuda.synchronize(pd)
        torch.cuda.synchronize(dd)

    def timed(fn):
        fn()  # warm-up
        sync()
        ns = []
        for _ in range(reps):
            t0 = time.perf_counter_ns()
            fn()
            sync()
            ns.append(time.perf_counter_ns() - t0)
        return statistics.median(ns)

    peer = {"torch": torch.__version__, "p_gpu": p_gpu, "d_gpu": d_gpu,
            "gpu": torch.cuda.get_device_name(pd), "results": []}
    for layout in ("contiguous", "scattered"):
        lines = open(f"{work}/ids-{layout}.txt").read().split("\n")
        p_ids = [int(x) for x in lines[0].split(",")]
        d_ids = [int(x) for x in lines[1].split(",")]
        nbytes = layers * 2 * len(p_ids) * bb
        entries = runs(slots(p_ids, capacity, bb), slots(d_ids, capacity, bb), bb)

        def copy_runs():
            for l in range(layers):
                s, d = src[l], dst[l]
                for lo, ro, n in entries:
                    d[ro:ro + n].copy_(s[lo:lo + n], non_blocking=True)

        ns = timed(copy_runs)
        ok = all(torch.equal(dst[l][ro:ro + n].cpu(), src[l][lo:lo + n].cpu())
                 for l in (0, layers - 1) for lo, ro, n in entries[:4])
        peer["results"].append({"layout": layout, "method": "copy_ per run", "entries_per_layer": len(entries),
                                "bytes": nbytes, "ns": ns, "gbps": nbytes / ns, "spot_check": ok})
        if layout == "scattered":
            s_idx = torch.tensor([o // bb for o in slots(p_ids, capacity, bb)], device=pd)
            d_idx = torch.tensor([o // bb for o in slots(d_ids, capacity, bb)], device=dd)

            def gather_scatter():
                for l in range(layers):
                    g = src[l].view(-1, bb).index_select(0, s_idx)
                    dst[l].view(-1, bb).index_copy_(0, d_idx, g.to(dd, non_blocking=True))

            gns = timed(gather_scatter)
            peer["results"].append({"layout": layout, "method": "index_select + index_copy_",
                                    "entries_per_layer": len(entries), "bytes": nbytes, "ns": gns,
                                    "gbps": nbytes / gns})

    goals = {"contiguous": 0.9, "scattered": 0.8}
    torch_gbps = {r["layout"]: r["gbps"] for r in peer["results"] if r["method"] == "copy_ per run"}
    torch_idx = {r["layout"]: r["gbps"] for r in peer["results"] if r["method"].startswith("index")}
    rows, summary = [], {"gpu": peer["gpu"], "p_gpu": p_gpu, "d_gpu": d_gpu, "rows": [], "overlap": kv["overlap"],
                         "kvferry": kv, "torch_peer": peer}
    head = f"P on GPU {p_gpu}, D on GPU {d_gpu} ({peer['gpu']}), {layers} layers x {len(p_ids)} blocks x 2 x {bb} B = {nbytes / 2**30:.2f} GiB per pass"
    rows.append(head)
    rows.append(f"{'mode':5} {'layout':10} {'method':12} {'kvferry GB/s':>12} {'torch GB/s':>10} {'ratio':>6} {'goal':>5}  verified")
    for r in kv["results"]:
        t = torch_gbps[r["layout"]]
        ratio = r["gbps"] / t
        goal = goals[r["layout"]]
        ok = "ok" if r["mismatched_words"] == 0 else f"FAILED ({r['mismatched_words']} words)"
        mark = "meets" if ratio >= goal else "MISSES"
        rows.append(f"{r['mode']:5} {r['layout']:10} {r['method']:12} {r['gbps']:12.1f} {t:10.1f} {ratio:6.2f} {goal:5.1f}  {ok} ({mark} goal)")
        summary["rows"].append({**r, "torch_gbps": t, "ratio": ratio, "goal": goal,
                                "torch_index_gbps": torch_idx.get(r["layout"])})
    for layout, g in torch_idx.items():
        rows.append(f"(reference: torch index_select+index_copy_ {layout}: {g:.1f} GB/s)")
    for o in kv["overlap"]:
        rows.append(f"overlap {o['layout']:10} {o['method']:12} last layer -> D done (p50 of {o['samples']}): done word {o['last_event_to_d_done_word_us']:.1f} us, pipe {o['last_event_to_d_done_us']:.1f} us vs one layer {o['one_layer_transfer_us']:.1f} us (x{o['tail_over_layer']:.2f} word, x{o['pipe_tail_over_layer']:.2f} pipe); compute {o['compute_alone_us']:.0f} us alone, {o['compute_with_transfers_us_p50']:.0f} us with transfers; verified {'ok' if o['mismatched_words'] == 0 else 'FAILED'}")
    text = "\n".join(rows) + "\n"
    print(text, end="")
    open(f"{out}/summary.txt", "w").write(text)
    json.dump(summary, open(f"{out}/summary.json", "w"), indent=1)


if __name__ == "__main__":
    main()
