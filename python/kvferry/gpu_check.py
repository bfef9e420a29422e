"""``python -m kvferry.gpu_check``: disaggregated decoding with a real transformer's KV, checked
bit for bit against the same engine without kvferry (docs/gpu.md, "A real model").

P and D are two processes (spawned here), each with a ``ModelEngine`` over its own paged cache and
each driving its own kvferry node through the engine port. D's process also runs the engine
without kvferry (the baseline, its own cache) so the two can be compared on one GPU. Per request:
D's received KV equals P's byte for byte (compared on D's device); D's first-token logits equal the
baseline's bit for bit, where the baseline does the same work (P's prefill chunks, then the last
prompt token as one step, as D does); 64 greedy tokens are compared step by step; agreement with
transformers' own full-prompt ``generate()`` is reported for information.

Without CUDA (CI) it runs on the CPU with host memory (``--device cpu``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
import traceback
from typing import Any

from .paired import describe, estimate, paired

PROMPT_MIN, PROMPT_MAX = 16, 4096


# ---------------------------------------------------------------- the engine processes

def _engine_main(conn: Any, role: str, device: str, socket_path: str | None, cfg: dict) -> None:
    import torch

    from .gpu_model import ModelSpec, PagedKvCache, build_model

    try:
        if cfg.get("cpus"):
            os.sched_setaffinity(0, cfg["cpus"])
        # One intra-op thread unless asked (vLLM sets OMP_NUM_THREADS=1 when unset): with a pool of
        # one thread per CPU a 4,096-element CPU gather took ms right after a transfer (docs/gpu.md).
        torch.set_num_threads(cfg["torch_threads"])
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        spec = ModelSpec(**cfg["spec"])
        model = build_model(spec, dev)
        cache = PagedKvCache(spec, cfg["num_blocks"], cfg["block_size"], dev)
        # D's engine without kvferry is the check's baseline; P makes its own only if the TTFT
        # split asks for it (_EngineState.baseline_engine).
        base_cache = PagedKvCache(spec, cfg["num_blocks"], cfg["block_size"], dev) if role == "decode" else None
        state = _EngineState(model, spec, cache, base_cache, role, socket_path, cfg)
        conn.send(("ok", {"pid": os.getpid(), "device": str(dev),
                          "name": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
                          "torch_threads": torch.get_num_threads(), "cuda_graphs": cfg.get("cuda_graphs", False)}))
    except Exception:  # noqa: BLE001 - reported to the driver
        conn.send(("error", traceback.format_exc()))
        return
    while True:
        try:
            cmd, args = conn.recv()
        except EOFError:
            return
        if cmd == "exit":
            state.close()
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(state, "cmd_" + cmd)(**args)))
        except Exception:  # noqa: BLE001 - reported to the driver
            conn.send(("error", traceback.format_exc()))


class _EngineState:
    """What one engine process keeps between the driver's commands."""

    def __init__(self, model: Any, spec: Any, cache: Any, base_cache: Any, role: str,
                 socket_path: str | None, cfg: dict):
        from .gpu_model import ModelEngine

        self.model, self.spec, self.cache = model, spec, cache
        self.role, self.socket_path, self.cfg = role, socket_path, cfg
        self.engine: ModelEngine | None = None
        self.baseline = self._bare_engine(base_cache) if base_cache is not None else None
        self.reqs: dict[str, dict] = {}

    def _bare_engine(self, cache: Any) -> Any:
        """The engine without kvferry on ``cache``: the check's and the TTFT's baseline."""
        from .gpu_model import ModelEngine

        return ModelEngine(self.model, self.spec, cache, role="decode", mode="write",
                           chunk_tokens=self.cfg["chunk_tokens"], cuda_graphs=self.cfg.get("cuda_graphs", False))

    def close(self) -> None:
        if self.engine is not None:
            self.engine.disconnect()
        self.cache.close()  # host memory: its /dev/shm file goes
        if self.baseline is not None:
            self.baseline.cache.close()

    def _e(self) -> Any:
        assert self.engine is not None, "attach first"
        return self.engine

    def cmd_attach(self, mode: str) -> dict:
        from .gpu_model import ModelEngine

        if self.engine is not None:
            self.engine.disconnect()
        self.engine = ModelEngine(self.model, self.spec, self.cache, role=self.role, mode=mode,
                                  socket_path=self.socket_path, chunk_tokens=self.cfg["chunk_tokens"],
                                  load_events=self.cfg.get("load_events", True),
                                  cuda_graphs=self.cfg.get("cuda_graphs", False))
        if self.engine.worker is not None:
            self.engine.worker.pipelined_layer_waits = self.cfg.get("pipelined_layer_waits", True)
        # How this engine marks saved layers (KVFERRY_SAVE_MARKS), so a run says which it timed.
        info = dict(self.engine.connect(wait_s=180), save_marks=self.engine.save_marks)
        if self.baseline is not None:
            self.baseline.reset_prefix_cache()
        return info

    def cmd_detach(self) -> dict:
        e = self._e()
        free = e.pool.free_count
        waits = e.load_waits()
        e.disconnect()
        self.engine = None
        out = {"free_blocks": free, "num_blocks": e.pool.num_blocks, "load_waits": waits}
        if self.baseline is not None:
            out["baseline_free_blocks"] = self.baseline.pool.free_count
        return out

    # -- P --

    def cmd_prefill(self, rid: str, prompt: list[int], params: dict, abort_after_chunks: int | None = None,
                    want_kv: bool = True, profile: bool = False) -> dict:
        import torch

        e = self._e()
        prof = _profiler() if profile else None
        clients = [c for c in (e.sched, e.worker) if c is not None]
        for c in clients:
            c.reset_op_seconds()
        out = e.prefill(rid, prompt, params, abort_after_chunks=abort_after_chunks)
        # Milliseconds in each connector op during this prefill (request_finished included, and
        # the worker's event records as event_record): which of P's calls its port time goes to.
        out["port_ops_ms"] = {op: t[1] * 1e3 for c in clients for op, t in c.reset_op_seconds().items()}
        if prof is not None:
            out["profile"] = _profiler_done(prof, sort_by="self_cpu_time_total")
        if want_kv and out["status"] == "length_capped":
            kv = e.cache.gather(out["blocks"], 0, len(prompt))
            out["kv"] = kv.view(torch.int16).cpu().numpy().tobytes()
        return out

    def cmd_timeline(self, on: bool) -> None:
        self._e().record_timeline = on

    def cmd_drain(self, rids: list[str], timeout_s: float = 30.0) -> dict:
        return self._e().drain(rids, timeout_s)

    def cmd_free_sent(self, rid: str, blocks: list[int]) -> None:
        self._e().pool.free(blocks)

    # -- D --

    def cmd_admit(self, rid: str, prompt: list[int], params: dict) -> dict:
        t0 = time.perf_counter()
        adm = self._e().admit_remote(rid, prompt, params)
        adm = {**adm, "admit_start": t0, "admit_end": time.perf_counter()}
        self.reqs[rid] = {"prompt": prompt, "adm": adm}
        return adm

    def cmd_receive_first(self, rid: str, profile: bool = False, quiet_ms: float = 0.0,
                          snapshot: bool = True) -> dict:
        """Waits for the KV, snapshots it for the check (not timed; ``snapshot``), then computes
        the last prompt token; ``quiet_ms`` (a diagnostic) waits that long in between, untimed."""
        e = self._e()
        r = self.reqs[rid]
        prompt, adm = r["prompt"], r["adm"]
        if adm["count"] == 0:
            # Its prefix cache holds every token before the last: nothing to load (vLLM does not
            # wait for a load of 0 tokens; the seed's connector answers async anyway).
            got = {"ok": True, "end": time.perf_counter(), "load_errors": []}
        else:
            got = e.receive(rid)
        if not got["ok"]:
            return {"ok": False, "why": got["why"]}
        lo, hi = adm["hit_tokens"], adm["hit_tokens"] + adm["count"]
        if snapshot:
            r["received"] = e.cache.gather(adm["blocks"], lo, hi).clone()
        r["range"] = (lo, hi)
        e._sync()
        if quiet_ms > 0:
            time.sleep(quiet_ms / 1e3)
        prof = _profiler() if profile else None
        allocs = _device_allocs(e.cache.device)
        t0 = time.perf_counter()
        logits, blocks = e.first_token(rid, prompt, adm["blocks"], remote=True)
        e._sync()
        t1 = time.perf_counter()
        allocs = _allocs_between(allocs, _device_allocs(e.cache.device))
        prof_text = _profiler_done(prof, sort_by="self_cpu_time_total")
        r["logits"], r["blocks"] = logits, blocks
        return {"ok": True, "received_at": got["end"], "first_start": t0, "first_end": t1, "profile": prof_text,
                "device_allocs": allocs,
                "receive": {k: got.get(k) for k in ("start", "loads_at", "layer0_at", "waited_at", "steps")},
                "load_errors": got["load_errors"], "range": [lo, hi], "first_split": dict(e.last_first)}

    def cmd_check_kv(self, rid: str, p_kv: bytes) -> dict:
        """D's received KV against P's bytes, compared on D's device."""
        import numpy as np
        import torch

        r = self.reqs[rid]
        lo, hi = r["range"]
        got = r.pop("received")
        p = self.cache.positions(torch.from_numpy(np.frombuffer(p_kv, dtype=np.int16).copy()), lo, hi).to(got.device)
        g = got.view(torch.int16)
        equal = bool(torch.equal(p, g))
        diff = 0 if equal else int((p != g).sum())
        # Kept for the decode's checks: whether D's copy still holds P's bytes after decoding (else
        # something wrote it after this check: a late copy), and whether the engine without
        # kvferry computed P's bytes for the same chunks (else the baseline is not P's work).
        r["p_kv"] = p
        return {"kv_equal": equal, "kv_bytes": g.numel() * 2, "kv_diff_elements": diff, "tokens": hi - lo}

    def cmd_abort(self, rid: str) -> str:
        r = self.reqs.pop(rid)
        return self._e().abort_remote(rid, r["adm"]["blocks"], timeout_s=5.0)

    def cmd_abort_unscheduled(self, rid: str, prompt: list[int], params: dict) -> str:
        """vLLM's path for a request aborted while waiting: named, never allocated, finished."""
        e = self._e()
        assert e.sched is not None
        e.sched.get_num_new_matched_tokens(rid, len(prompt), params, 0)
        e.sched.request_finished(rid, [], "aborted")
        return "aborted"

    def cmd_compare(self, rid: str, p_chunks: list[list[int]], p_hit: int, steps: int,
                    with_generate: bool, control: bool = False, probe: bool = False,
                    profile: bool = False, delay_s: float = 0.0, pre_steps: int = 0) -> dict:
        """Decodes on D and on the engine without kvferry doing P's work, step by step. With
        ``control`` the engine without kvferry decodes a second time from the same state: whether
        it agrees with itself tells kernel nondeterminism from a kvferry fault."""
        import torch

        e, b = self._e(), self.baseline
        assert b is not None
        r = self.reqs.pop(rid)
        prompt = r["prompt"]
        bid = rid + "-baseline"
        t_start = time.perf_counter()
        pre = b.prefill(bid, prompt, None, chunks=[tuple(c) for c in p_chunks], finish=False)
        if pre["hit_tokens"] != p_hit:
            raise RuntimeError(f"{rid}: baseline prefix hit {pre['hit_tokens']} != P's {p_hit}")
        p_kv = r.pop("p_kv", None)
        kv_range = r.get("range")
        baseline_kv_is_p = None
        if p_kv is not None and kv_range is not None:
            baseline_kv_is_p = bool(torch.equal(
                b.cache.gather(pre["blocks"], *kv_range).view(torch.int16).to(p_kv.device), p_kv))
        b_first, b_blocks = b.first_token(bid, prompt, pre["blocks"], remote=False)
        b_blocks_first = list(b_blocks)  # decode appends to the table it is given
        assert e.sched is not None and e.worker is not None
        e.sched.reset_op_seconds()
        e.worker.reset_op_seconds()
        if delay_s:
            time.sleep(delay_s)
        pre_decode = None
        if pre_steps:
            # Diagnostic: the same decode for a few steps on a copy of the table first.
            n_blocks = -(-len(prompt) // e.cache.block_size)
            warm = list(r["blocks"][:n_blocks])
            e.decode("probe-before", prompt, warm, r["logits"], pre_steps)
            pre_decode = dict(e.last_decode)
            e.pool.free(warm[n_blocks:])
        gc_d = _GcTimer()
        prof = _profiler() if profile else None
        t_base = time.perf_counter()
        d_tokens, d_logits = e.decode(rid, prompt, r["blocks"], r["logits"], steps)
        t_d = time.perf_counter()
        prof_text = _profiler_done(prof)
        gc_d.stop()
        d_split = dict(e.last_decode)
        d_ops = {"scheduler": e.sched.reset_op_seconds(), "worker": e.worker.reset_op_seconds()}
        gc_b = _GcTimer()
        b_tokens, b_logits = b.decode(bid, prompt, b_blocks, b_first, steps)
        t_b = time.perf_counter()
        gc_b.stop()
        b_split = dict(b.last_decode)
        after = self._cache_after_decode(e, b, r["blocks"], b_blocks, len(prompt), steps,
                                         d_tokens == b_tokens)
        if p_kv is not None and kv_range is not None:
            # Only the positions D does not compute itself: in WRITE the range holds the last
            # prompt token too, whose KV D's first step writes again with its own kernels (the
            # engine without kvferry does the same; bitwise equal to P's only for some shapes).
            lo, hi = kv_range
            kept = min(hi, len(prompt) - 1) - lo
            if kept > 0:
                axis = 1 if e.cache.spec.mla else 2
                after["d_kv_still_p"] = bool(torch.equal(
                    e.cache.gather(r["blocks"], lo, lo + kept).view(torch.int16).to(p_kv.device),
                    p_kv.narrow(axis, 0, kept)))
            after["baseline_kv_is_p"] = baseline_kv_is_p
        ctl = None
        t_c0 = t_c1 = time.perf_counter()
        if control:
            # The positions before the prompt's end are untouched by decoding, and each decoded
            # position is written before it is read: the same state, decoded again.
            c_blocks = list(b_blocks_first)
            c_tokens, c_logits = b.decode(bid, prompt, c_blocks, b_first, steps)
            t_c1 = time.perf_counter()
            ctl = {"tokens_equal": c_tokens == b_tokens,
                   "logits_equal_steps": sum(1 for x, y in zip(c_logits, b_logits)
                                             if torch.equal(x.view(torch.int16), y.view(torch.int16))),
                   "first_differing_step": next((i for i, (x, y) in enumerate(zip(c_logits, b_logits))
                                                 if not torch.equal(x.view(torch.int16), y.view(torch.int16))), None)}
            b.pool.free(c_blocks[len(b_blocks_first):])
        probes = self._decode_probes(e, b, prompt, r, b_blocks_first, b_first, steps, profile) if probe else None
        e.finish_decoded(rid, r["blocks"])
        b.finish_decoded(bid, b_blocks)
        first_equal = bool(torch.equal(d_logits[0].view(torch.int16), b_logits[0].view(torch.int16)))
        divergence = None
        logits_equal_steps = 0
        for i, (dl, bl) in enumerate(zip(d_logits, b_logits)):
            same = bool(torch.equal(dl.view(torch.int16), bl.view(torch.int16)))
            logits_equal_steps += same
            if divergence is None and d_tokens[i] != b_tokens[i]:
                top = torch.topk(bl.float(), 2).values
                divergence = {"step": i, "logits_bitwise_equal": same, "d_token": d_tokens[i],
                              "baseline_token": b_tokens[i], "top2_margin": float(top[0] - top[1])}
        out = {"first_logits_bitwise_equal": first_equal, "tokens_equal": d_tokens == b_tokens,
               "logits_equal_steps": logits_equal_steps, "steps": len(d_logits), "divergence": divergence,
               "d_tokens": d_tokens}
        out["cache_after_decode"] = after
        if ctl is not None:
            out["control"] = ctl
        if probes is not None:
            out["decode_probes"] = probes
        out["decode_split_ms"] = {"d": d_split, "baseline": b_split}
        out["decode_gc"] = {"d": gc_d.summary(), "baseline": gc_b.summary()}
        if prof_text is not None:
            out["d_decode_profile"] = prof_text
        if pre_decode is not None:
            out["pre_decode"] = pre_decode
        out["d_decode_port_ops"] = {side: {op: [int(v[0]), round(v[1] * 1e3, 3), round(v[2] * 1e3, 3)]
                                           for op, v in ops.items()} for side, ops in d_ops.items()}
        t_g = time.perf_counter()
        if with_generate:
            out["generate"] = self._generate_agreement(prompt, b_tokens)
        out["compare_ms"] = {"baseline_prefill": (t_base - t_start) * 1e3, "d_decode": (t_d - t_base) * 1e3,
                             "baseline_decode": (t_b - t_d) * 1e3,
                             "cache_check": (t_g - t_b) * 1e3 - (t_c1 - t_c0) * 1e3,
                             "control_decode": (t_c1 - t_c0) * 1e3,
                             "generate": (time.perf_counter() - t_g) * 1e3}
        return out

    def _decode_probes(self, e: Any, b: Any, prompt: list[int], r: dict, b_blocks_first: list[int],
                       b_first: Any, steps: int, profile: bool = False) -> dict:
        """Where D's slower decode comes from (a diagnostic): the same decode again (each decoded
        position is written before it is read) on D's cache without the port, and on the cache of
        the engine without kvferry with two port pings per step. Wall ms of forward+argmax."""
        from .gpu_model import ModelEngine

        out = {}
        n_blocks = -(-len(prompt) // e.cache.block_size)
        again = list(r["blocks"][:n_blocks])
        prof = _profiler() if profile else None
        e.decode("probe-again", prompt, again, r["logits"], steps)
        text = _profiler_done(prof)
        if text is not None:
            out["d_again_profile"] = text
        out["d_again"] = dict(e.last_decode)
        e.pool.free(again[n_blocks:])
        calls = list(b_blocks_first)
        b.decode("probe-step-calls", prompt, calls, b_first, steps,
                 between_steps=lambda: (e._step_begin([], []), e._step_end()))
        out["baseline_cache_with_step_calls"] = dict(b.last_decode)
        b.pool.free(calls[len(b_blocks_first):])
        bare = ModelEngine(self.model, self.spec, e.cache, role="decode", mode="write",
                           chunk_tokens=self.cfg["chunk_tokens"])
        bare.pool = e.pool
        d_first = r["logits"]
        d_blocks = list(r["blocks"][:n_blocks])
        bare.decode(r["request"] if "request" in r else "probe", prompt, d_blocks, d_first, steps)
        out["d_cache_without_port"] = dict(bare.last_decode)
        e.pool.free(d_blocks[n_blocks:])
        pings = list(b_blocks_first)
        b.decode("probe-pings", prompt, pings, b_first, steps,
                 between_steps=lambda: (e.sched.ping(), e.worker.ping()))
        out["baseline_cache_with_pings"] = dict(b.last_decode)
        b.pool.free(pings[len(b_blocks_first):])
        return out

    @staticmethod
    def _cache_after_decode(e: Any, b: Any, d_blocks: list[int], b_blocks: list[int], n: int, steps: int,
                            same_tokens: bool) -> dict:
        """D's whole cache for the request after decoding against the engine without kvferry's:
        a byte changed in the transferred part after the check (a late copy) shows here, and so
        does the first decoded position whose KV differs. Only meaningful while the tokens agree."""
        import torch

        if not same_tokens:
            return {"compared": False}
        end = n + steps  # the last sampled token's KV is never written
        dg = e.cache.gather(d_blocks, 0, end).view(torch.int16)
        bg = b.cache.gather(b_blocks, 0, end).view(torch.int16)
        differs = e.cache.by_position(dg != bg).any(dim=1)
        pos = torch.nonzero(differs).flatten().tolist()
        if not pos:
            return {"compared": True, "equal": True, "positions": end}
        first = pos[0]
        where = "transferred" if first < n - 1 else ("last prompt token" if first == n - 1 else "decoded")
        return {"compared": True, "equal": False, "positions": end, "first_differing_position": first,
                "first_differing_part": where, "differing_positions": len(pos),
                "transferred_positions_differing": sum(1 for x in pos if x < n - 1)}

    def _generate_agreement(self, prompt: list[int], tokens: list[int]) -> dict:
        import torch

        if not hasattr(self.model, "generate"):
            return {"error": "generate() is transformers', which is not installed here"}
        try:
            ids = torch.tensor([prompt], device=self.cache.device)
            with torch.inference_mode():
                g = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                        max_new_tokens=len(tokens), min_new_tokens=len(tokens),
                                        do_sample=False, pad_token_id=0)
            gen = g[0, len(prompt):].tolist()
            agree = 0
            for x, y in zip(gen, tokens):
                if x != y:
                    break
                agree += 1
            return {"agree_prefix": agree, "of": len(tokens)}
        except Exception as ex:  # noqa: BLE001 - information only
            return {"error": f"{type(ex).__name__}: {ex}"}

    def cmd_finish_first(self, rid: str) -> None:
        """TTFT runs: the first token is all that is wanted."""
        r = self.reqs.pop(rid)
        self._e().finish_decoded(rid, r["blocks"])

    def baseline_engine(self) -> Any:
        """The engine without kvferry; on P made at the first use (the TTFT split times P's
        prefill without kvferry in P's own process), so runs without TTFT hold no second cache."""
        if self.baseline is None:
            from .gpu_model import PagedKvCache

            cache = PagedKvCache(self.spec, self.cfg["num_blocks"], self.cfg["block_size"], self.cache.device)
            self.baseline = self._bare_engine(cache)
        return self.baseline

    def cmd_baseline_ttft(self, rid: str, prompt: list[int], profile: bool = False,
                          profile_first: bool = False, idle_steps_ms: float = 0.0) -> dict:
        """``profile``: torch's profiler around the prefill; ``profile_first``: around the first
        token (D's side of the split). ``idle_steps_ms`` (a diagnostic, D): between the prefill
        and the first token, untimed, this process's kvferry engine steps with nothing scheduled
        for that long, as D's engine does while it waits for a transfer (vLLM's D too: steps of
        connector calls only): is D's first forward slower after a transfer because of that loop?"""
        b = self.baseline_engine()
        b._sync()
        prof = _profiler() if profile else None
        t0 = time.perf_counter()
        pre = b.prefill(rid, prompt, None, finish=False)
        tp = time.perf_counter()
        prof_text = _profiler_done(prof, sort_by="self_cpu_time_total")
        idle_steps = self._e().idle_for(idle_steps_ms / 1e3) if idle_steps_ms > 0 else 0
        tp_idle = time.perf_counter()
        prof = _profiler() if profile_first else None
        allocs = _device_allocs(b.cache.device)
        tf = time.perf_counter()
        _, blocks = b.first_token(rid, prompt, pre["blocks"], remote=False)
        b._sync()
        t1 = time.perf_counter()
        allocs = _allocs_between(allocs, _device_allocs(b.cache.device))
        first_text = _profiler_done(prof, sort_by="self_cpu_time_total")
        b.finish_decoded(rid, blocks)
        return {"ttft_s": t1 - t0 - (tp_idle - tp), "prefill_s": tp - t0, "first_s": t1 - tf,
                "first_split": dict(b.last_first), "profile": prof_text, "first_profile": first_text,
                "device_allocs": allocs, "idle_steps": idle_steps}

    def cmd_layer_copy_time(self, tokens: int, reps: int = 20) -> dict:
        """One layer's KV of ``tokens`` tokens copied device to device by torch (the same bytes
        as one layer's transfer), median of ``reps``."""
        import torch

        nbytes = tokens * self.spec.token_elements * 2
        if self.cache.device.type != "cuda":
            return {"bytes": nbytes, "ms": None}
        src = torch.empty(nbytes, dtype=torch.uint8, device=self.cache.device)
        dst = torch.empty_like(src)
        times = []
        for _ in range(reps + 2):
            a, z = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            dst.copy_(src)
            z.record()
            z.synchronize()
            times.append(a.elapsed_time(z))
        return {"bytes": nbytes, "ms": statistics.median(times[2:])}


def _device_allocs(device: Any) -> int | None:
    """How many device allocations (cudaMalloc) PyTorch's caching allocator has made so far in
    this process; 0 on the CPU, None where this PyTorch does not count them. Read around a timed
    step (``_allocs_between``), it says whether the step had to grow the allocator's pool (each
    such call takes the CPU far longer than a cached block)."""
    if getattr(device, "type", "cpu") != "cuda":
        return 0
    import torch

    stats = torch.cuda.memory_stats(device)
    return int(stats["num_device_alloc"]) if "num_device_alloc" in stats else None


def _allocs_between(before: int | None, after: int | None) -> int:
    """Device allocations between two readings; -1 when either is missing, never read as none."""
    return -1 if before is None or after is None else after - before


def _profiler() -> Any:
    """torch's profiler with CUDA activity (kernel times on the GPU), else cProfile."""
    import torch

    if torch.cuda.is_available():
        from torch.profiler import ProfilerActivity, profile

        p = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True)
        p.__enter__()
        return p
    import cProfile

    p = cProfile.Profile()
    p.enable()
    return p


def _profiler_done(p: Any, sort_by: str = "cuda_time_total") -> str | None:
    if p is None:
        return None
    import io
    import pstats

    if hasattr(p, "key_averages"):
        p.__exit__(None, None, None)
        return (p.key_averages().table(sort_by=sort_by, row_limit=25)
                + "\n" + p.key_averages().table(sort_by="cpu_time_total", row_limit=12)
                + "\n" + _longest_calls(p.events(), 15))
    p.disable()
    text = io.StringIO()
    pstats.Stats(p, stream=text).sort_stats("tottime").print_stats(25)
    return text.getvalue()


def _longest_calls(events: Any, limit: int) -> str:
    """The single operator calls with the most self CPU time, in the order they ran: an average over
    calls of one name hides whether one call or all of them took the time."""
    ops = [e for e in events if e.name.startswith("aten::") and e.self_cpu_time_total > 0]
    if not ops:
        return "no operator calls recorded"
    t0 = min(e.time_range.start for e in events)
    top = sorted(sorted(ops, key=lambda e: -e.self_cpu_time_total)[:limit], key=lambda e: e.time_range.start)
    lines = [f"the {len(top)} operator calls with the most self CPU time, of {len(ops)}, in order "
             "(start after the first event, us; self CPU, us; input shapes):"]
    for e in top:
        index = sum(1 for o in ops if o.name == e.name and o.time_range.start < e.time_range.start)
        lines.append(f"  {e.time_range.start - t0:10.1f}  {e.self_cpu_time_total:9.1f}  {e.name} "
                     f"#{index + 1}  {e.input_shapes}")
    return "\n".join(lines)


class _GcTimer:
    """Python's garbage collections while it runs: count per generation and their wall time."""

    def __init__(self) -> None:
        import gc

        self.counts = [0, 0, 0]
        self.seconds = 0.0
        self.longest = 0.0
        self._began = 0.0
        self._gc = gc
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            took = time.perf_counter() - self._began
            self.seconds += took
            self.longest = max(self.longest, took)
            self.counts[info.get("generation", 0)] += 1

    def stop(self) -> None:
        if self._callback in self._gc.callbacks:
            self._gc.callbacks.remove(self._callback)

    def summary(self) -> dict:
        return {"collections": list(self.counts), "ms": round(self.seconds * 1e3, 2),
                "longest_ms": round(self.longest * 1e3, 2)}


class _Proc:
    """One spawned engine process and its command pipe."""

    def __init__(self, ctx: Any, role: str, device: str, socket_path: str | None, cfg: dict):
        self.role = role
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_engine_main, args=(child, role, device, socket_path, cfg),
                                name=f"kvferry-{role}", daemon=True)
        self.proc.start()
        self.info = self.result(600)

    def send(self, cmd: str, **args: Any) -> None:
        self.conn.send((cmd, args))

    def result(self, timeout_s: float = 300) -> Any:
        if not self.conn.poll(timeout_s):
            raise RuntimeError(f"{self.role}: no answer within {timeout_s} s")
        status, value = self.conn.recv()
        if status != "ok":
            raise RuntimeError(f"{self.role} failed:\n{value}")
        return value

    def call(self, cmd: str, **args: Any) -> Any:
        self.send(cmd, **args)
        return self.result()

    def stop(self) -> None:
        try:
            self.send("exit")
            self.result(30)
        except Exception:  # noqa: BLE001
            pass
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()


# ---------------------------------------------------------------- the workload

def prompt_lengths(n: int, rng: random.Random, longest: int = PROMPT_MAX) -> list[int]:
    """Log-uniform between 16 and ``longest`` (4,096), both ends included."""
    import math

    out = [PROMPT_MIN, longest][:n]
    while len(out) < n:
        out.append(int(round(2 ** rng.uniform(4, math.log2(longest)))))
    rng.shuffle(out)
    return out


class _Phases:
    """Wall milliseconds of each phase of one request, in the order they ran (where time goes)."""

    def __init__(self) -> None:
        self.ms: dict[str, float] = {}
        self._last = time.perf_counter()

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        self.ms[name] = round((now - self._last) * 1e3, 1)
        self._last = now


def run_mode(p: _Proc, d: _Proc, mode: str, args: argparse.Namespace, rng: random.Random,
             log: Any) -> dict:
    bs, vocab = args.block_size, args.vocab
    p_info = p.call("attach", mode=mode)
    d_info = d.call("attach", mode=mode)
    log(f"[{mode}] P engine {p_info['engine_id']} on node {p_info['node']} ({p_info['transport']}; saves"
        f" marked per {p_info['save_marks']}); D engine {d_info['engine_id']} on node {d_info['node']}")
    lengths = prompt_lengths(args.prompts, rng, args.max_prompt_tokens)
    completed: list[list[int]] = []
    results: list[dict] = []
    began = time.monotonic()
    for i, n in enumerate(lengths):
        if time.monotonic() - began > args.mode_budget_s:
            log(f"[{mode}] time budget of {args.mode_budget_s} s spent: stopping after {i} requests")
            break
        rid = f"{mode}-{i:03d}"
        kind = "plain"
        prompt = [rng.randrange(3, vocab) for _ in range(n)]
        eligible = [c for c in completed if len(c) >= 2 * bs]
        if i % 5 == 3 and eligible:
            base = rng.choice(eligible)
            k = rng.randint(1, (len(base) - bs) // bs)
            prompt = base[: k * bs] + prompt[: max(2, n - k * bs)]
            kind = "prefix-on-D"
        elif i % 10 == 7 and n > args.chunk_tokens:
            kind = "abort"
        n = len(prompt)
        xfer = f"xfer-{rid}"
        p_params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer,
                    "remote_engine_id": d_info["engine_id"]}
        rec: dict[str, Any] = {"request": rid, "mode": mode, "prompt_tokens": n, "kind": kind}
        try:
            if kind == "abort":
                rec.update(_abort(p, d, mode, rid, prompt, p_params, p_info, rng))
                results.append(rec)
                log(f"{rid} n={n} abort: {rec['abort']}")
                continue
            phase = _Phases()
            if mode == "write":
                d_params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": xfer,
                            "remote_engine_id": p_info["engine_id"]}
                adm = d.call("admit", rid=rid, prompt=prompt, params=d_params)
                d.send("receive_first", rid=rid)
                try:
                    pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params)
                finally:
                    first = d.result()
                phase.mark("prefill_and_receive")
            else:
                pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params)
                phase.mark("prefill")
                params = dict(pre["kv_transfer_params"] or {})
                params.setdefault("transfer_id", xfer)
                adm = d.call("admit", rid=rid, prompt=prompt, params=params)
                first = d.call("receive_first", rid=rid)
                phase.mark("receive")
            sent = p.call("drain", rids=[rid]) if pre["delay_free"] else {rid: "not delayed"}
            if pre["delay_free"] and sent.get(rid) != "timeout":
                p.call("free_sent", rid=rid, blocks=pre["blocks"])
            phase.mark("p_drain")
            rec["phase_ms"] = phase.ms
            rec.update({"p_hit": pre["hit_tokens"], "d_hit": adm["hit_tokens"], "loaded": adm["count"],
                        "chunks": len(pre["chunks"]), "p_sent": sent.get(rid)})
            if not first["ok"]:
                rec["error"] = f"D did not receive: {first['why']}"
                results.append(rec)
                log(f"{rid} n={n} FAILED: {rec['error']}")
                continue
            rec.update(d.call("check_kv", rid=rid, p_kv=pre["kv"]))
            phase.mark("kv_check")
            rec["ttft_s"] = (first["received_at"] - pre["start"]) + (first["first_end"] - first["first_start"])
            generate = not args.no_generate and i % args.generate_every == 0
            control = args.control_every > 0 and i % args.control_every == 0
            rec.update(d.call("compare", rid=rid, p_chunks=pre["chunks"], p_hit=pre["hit_tokens"],
                              steps=args.decode_steps, with_generate=generate, control=control,
                              probe=i < args.decode_probes, profile=i < args.profile_decode,
                              delay_s=args.decode_delay_s if i % 2 else 0.0,
                              pre_steps=args.pre_decode_steps if i % 2 == 0 else 0))
            if "d_decode_profile" in rec:
                log(f"{rid}: D's decode, profiled:\n{rec.pop('d_decode_profile')}")
            if "d_again_profile" in rec.get("decode_probes", {}):
                log(f"{rid}: D's decode again, profiled:\n{rec['decode_probes'].pop('d_again_profile')}")
            phase.mark("compare")
            completed.append(prompt)
        except Exception as ex:  # noqa: BLE001 - one request's failure is reported, the run goes on
            rec["error"] = str(ex)[-2000:]
        results.append(rec)
        log(_line(rec))
        if "error" in rec:
            log(rec["error"])
            if sum(1 for r in results if "error" in r) >= args.max_errors:
                log(f"[{mode}] {args.max_errors} errors: the rest of this mode is skipped")
                break
    leaks = {"P": p.call("detach"), "D": d.call("detach")}
    return {"mode": mode, "requests": results, "blocks_at_end": leaks}


def _abort(p: _Proc, d: _Proc, mode: str, rid: str, prompt: list[int], p_params: dict, p_info: dict,
           rng: random.Random) -> dict:
    """WRITE: D waits for the KV, P is aborted after its first chunk, then D aborts. READ: P
    finishes, D aborts before scheduling, which must release P's blocks."""
    if mode == "write":
        d_params = {"do_remote_prefill": True, "do_remote_decode": False, "transfer_id": p_params["transfer_id"],
                    "remote_engine_id": p_info["engine_id"]}
        d.call("admit", rid=rid, prompt=prompt, params=d_params)
        pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params, abort_after_chunks=1, want_kv=False)
        p_out = "freed"
        if pre["delay_free"]:
            p_out = p.call("drain", rids=[rid], timeout_s=5.0).get(rid)
            p.call("free_sent", rid=rid, blocks=pre["blocks"])
        d_out = d.call("abort", rid=rid)
        return {"abort": f"P aborted after its first chunk ({p_out}); D aborted while waiting ({d_out})"}
    pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params, want_kv=False)
    params = dict(pre["kv_transfer_params"] or {})
    params.setdefault("transfer_id", p_params["transfer_id"])
    d.call("abort_unscheduled", rid=rid, prompt=prompt, params=params)
    p_out = p.call("drain", rids=[rid], timeout_s=5.0).get(rid) if pre["delay_free"] else "not delayed"
    if pre["delay_free"] and p_out != "timeout":
        p.call("free_sent", rid=rid, blocks=pre["blocks"])
    return {"abort": f"P finished; D aborted before scheduling; P's blocks: {p_out}"}


def _after(r: dict) -> str:
    a = r.get("cache_after_decode", {})
    kv = "".join(f" {k}={a[k]}" for k in ("d_kv_still_p", "baseline_kv_is_p") if a.get(k) is not None)
    if not a.get("compared"):
        return kv
    if a["equal"]:
        return f" cache_after_decode_equal=True/{a['positions']}{kv}"
    return (f" cache_after_decode_equal=False first_differing_position={a['first_differing_position']}"
            f"({a['first_differing_part']}) differing={a['differing_positions']}/{a['positions']}"
            f" transferred_differing={a['transferred_positions_differing']}{kv}")


def _control(r: dict) -> str:
    c = r.get("control")
    if c is None:
        return ""
    return (f" control_tokens_equal={c['tokens_equal']} control_logits_equal_steps={c['logits_equal_steps']}"
            f"/{r['steps']}")


def _split(r: dict) -> str:
    sp = r.get("decode_split_ms")
    if not sp:
        return ""
    d, b = sp["d"], sp["baseline"]
    pr = r.get("decode_probes")
    probes = "" if not pr else (
        f" probe_d_cache_without_port_compute_ms={pr['d_cache_without_port']['compute_ms']:.1f}"
        f" probe_baseline_cache_with_pings_compute_ms={pr['baseline_cache_with_pings']['compute_ms']:.1f}"
        f" probe_pings_ms={pr['baseline_cache_with_pings']['port_ms']:.1f}"
        f" probe_d_again_compute_ms={pr['d_again']['compute_ms']:.1f}"
        f" probe_baseline_cache_with_step_calls_compute_ms={pr['baseline_cache_with_step_calls']['compute_ms']:.1f}")
    g = r.get("decode_gc", {})
    gcs = "" if not g else (f" gc_d={g['d']['collections']}/{g['d']['ms']}ms"
                            f" gc_baseline={g['baseline']['collections']}/{g['baseline']['ms']}ms")
    pre = r.get("pre_decode")
    if pre:
        probes += f" pre_decode_steps={pre['steps']} pre_decode_compute_ms={pre['compute_ms']:.1f}"
    return (f" d_decode_port_ms={d['port_ms']:.1f} d_decode_compute_ms={d['compute_ms']:.1f}"
            f" baseline_decode_compute_ms={b['compute_ms']:.1f}{probes}{gcs}")


def _line(r: dict) -> str:
    if "error" in r:
        return f"{r['request']} n={r['prompt_tokens']} {r['kind']}: ERROR {r['error'].splitlines()[-1] if r['error'] else ''}"
    g = r.get("generate", {})
    gen = f"{g['agree_prefix']}/{g['of']}" if "agree_prefix" in g else g.get("error", "-")
    div = r.get("divergence")
    return (f"{r['request']} n={r['prompt_tokens']} {r['kind']} P-hit={r['p_hit']} D-hit={r['d_hit']} "
            f"chunks={r['chunks']} kv_equal={r['kv_equal']} first_logits_equal={r['first_logits_bitwise_equal']} "
            f"tokens_equal={r['tokens_equal']} logits_equal_steps={r['logits_equal_steps']}/{r['steps']} "
            f"generate_agree={gen} ttft_ms={r['ttft_s'] * 1e3:.2f}{_after(r)}"
            f"{_control(r)}{_split(r)}"
            f" phases_ms={json.dumps(r.get('phase_ms', {}), separators=(',', ':'))}"
            f" compare_ms={json.dumps({k: round(v, 1) for k, v in r.get('compare_ms', {}).items()}, separators=(',', ':'))}"
            + (f" DIVERGENCE step={div['step']} logits_bitwise_equal={div['logits_bitwise_equal']} "
               f"top2_margin={div['top2_margin']:.4g}" if div else ""))


def _disaggregated_first(p: _Proc, d: _Proc, mode: str, rid: str, prompt: list[int], p_info: dict, d_info: dict,
                         profiled: bool = False, d_after_p: bool = False, d_quiet_ms: float = 0.0,
                         d_snapshot: bool = False) -> tuple[dict, dict]:
    """One request through P and D up to D's first token (then finished and freed): P's prefill
    result and D's first-token result. D keeps no snapshot of the KV it received unless
    ``d_snapshot``: the timed runs check nothing, and the engine without kvferry makes no such copy
    before its first token (the copy's memory changes what the allocator has cached for it). ``d_after_p`` (WRITE): D starts waiting for the KV only once
    P's prefill has returned, so its first forward never shares the GPU with P's last kernels (a
    diagnostic: it delays D's start, so its TTFT is not the pipeline's)."""
    xfer = f"xfer-{rid}"
    p_params = {"do_remote_decode": True, "do_remote_prefill": False, "transfer_id": xfer,
                "remote_engine_id": d_info["engine_id"]}
    if mode == "write":
        d.call("admit", rid=rid, prompt=prompt, params={
            "do_remote_prefill": True, "do_remote_decode": False, "transfer_id": xfer,
            "remote_engine_id": p_info["engine_id"]})
        if d_after_p:
            pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params, want_kv=False, profile=profiled)
            first = d.call("receive_first", rid=rid, profile=profiled, quiet_ms=d_quiet_ms, snapshot=d_snapshot)
        else:
            d.send("receive_first", rid=rid, profile=profiled, quiet_ms=d_quiet_ms, snapshot=d_snapshot)
            try:
                pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params, want_kv=False,
                             profile=profiled)
            finally:
                first = d.result()
    else:
        pre = p.call("prefill", rid=rid, prompt=prompt, params=p_params, want_kv=False, profile=profiled)
        params = dict(pre["kv_transfer_params"] or {})
        params.setdefault("transfer_id", xfer)
        adm = d.call("admit", rid=rid, prompt=prompt, params=params)
        first = d.call("receive_first", rid=rid, profile=profiled, quiet_ms=d_quiet_ms, snapshot=d_snapshot)
        first["admit"] = adm
    if pre["delay_free"]:
        p.call("drain", rids=[rid])
        p.call("free_sent", rid=rid, blocks=pre["blocks"])
    if not first["ok"]:
        raise RuntimeError(f"{rid}: {first['why']}")
    d.call("finish_first", rid=rid)
    return pre, first


def run_ttft(p: _Proc, d: _Proc, mode: str, args: argparse.Namespace, rng: random.Random, log: Any) -> list[dict]:
    """Time to first token with and without disaggregation, fresh prompts (no prefix hits)."""
    p_info = p.call("attach", mode=mode)
    d_info = d.call("attach", mode=mode)
    log(f"  TTFT {mode}: P's saves marked per {p_info['save_marks']} (KVFERRY_SAVE_MARKS)")
    if args.ttft_warmup > 0:
        # A serving node has run its per-request code (the actors' handling of a transfer, the
        # port's ops) thousands of times, compiled by the JIT; a few TTFT reps alone would time it
        # interpreted. Short requests through the same path first, not timed.
        began = time.perf_counter()
        for i in range(args.ttft_warmup):
            prompt = [rng.randrange(3, args.vocab) for _ in range(48)]
            _disaggregated_first(p, d, mode, f"ttft-warm-{mode}-{i}", prompt, p_info, d_info)
        log(f"  TTFT {mode}: {args.ttft_warmup} warm-up requests of 48 tokens took "
            f"{time.perf_counter() - began:.1f} s")
    rows = []
    for n in args.ttft_lengths:
        dis, base = [], []
        parts: dict[str, list[float]] = {}
        timeline = None
        # Extra runs, not counted: one with timing events (the timeline); with --ttft-profile, at
        # the longest length one more with torch's profiler around P's prefill, with and without
        # kvferry in P's process (where P's added time goes: CPU ops, kernels, GPU idle).
        profiled_n = args.ttft_profile and n == max(args.ttft_lengths)
        for rep in range(args.ttft_reps + 2 + (1 if profiled_n else 0)):
            last = rep == args.ttft_reps + 1
            profiled = rep == args.ttft_reps + 2
            p.call("timeline", on=last)
            prompt = [rng.randrange(3, args.vocab) for _ in range(n)]
            rid = f"ttft-{mode}-{n}-{rep}"
            # Odd reps measure the engine without kvferry first: neither side always runs a
            # shape first (first-time costs land on whichever does).
            b = None
            if rep % 2 == 1:
                b = d.call("baseline_ttft", rid=rid + "-b", prompt=[rng.randrange(3, args.vocab) for _ in range(n)],
                           profile_first=profiled, idle_steps_ms=args.ttft_baseline_idle_steps_ms)
                pb = p.call("baseline_ttft", rid=rid + "-pb", prompt=[rng.randrange(3, args.vocab) for _ in range(n)],
                            profile=profiled)
            pre, first = _disaggregated_first(p, d, mode, rid, prompt, p_info, d_info, profiled,
                                              d_after_p=args.ttft_d_after_p, d_quiet_ms=args.ttft_d_quiet_ms,
                                              d_snapshot=args.ttft_d_snapshot)
            if b is None:
                b = d.call("baseline_ttft", rid=rid + "-b", prompt=[rng.randrange(3, args.vocab) for _ in range(n)],
                           profile_first=profiled, idle_steps_ms=args.ttft_baseline_idle_steps_ms)
                pb = p.call("baseline_ttft", rid=rid + "-pb", prompt=[rng.randrange(3, args.vocab) for _ in range(n)],
                            profile=profiled)
            if last:
                timeline = _timeline(pre, first)
                continue
            if profiled:
                log(f"  TTFT {mode} n={n}: P's prefill with kvferry, profiled "
                    f"({(pre['end'] - pre['start']) * 1e3:.3f} ms):\n{pre.get('profile')}")
                log(f"  TTFT {mode} n={n}: P's prefill without kvferry, profiled "
                    f"({pb['prefill_s'] * 1e3:.3f} ms):\n{pb.get('profile')}")
                log(f"  TTFT {mode} n={n}: D's first token with kvferry, profiled "
                    f"({(first['first_end'] - first['first_start']) * 1e3:.3f} ms):\n{first.get('profile')}")
                log(f"  TTFT {mode} n={n}: D's first token without kvferry, profiled "
                    f"({b['first_s'] * 1e3:.3f} ms):\n{b.get('first_profile')}")
                continue
            if rep == 0:
                continue  # warm-up
            dis.append((first["received_at"] - pre["start"]) + (first["first_end"] - first["first_start"]))
            base.append(b["ttft_s"])
            # Where the added time goes: P's prefill against the same chunks without kvferry, the
            # KV landing after P's end, D's first token against the same step without kvferry.
            # p_port_ms: P's wall time inside connector calls during its prefill;
            # p_process_baseline_prefill_ms: the same prefill without kvferry in P's own process.
            for k, v in (("p_prefill_ms", (pre["end"] - pre["start"]) * 1e3),
                         ("baseline_prefill_ms", b["prefill_s"] * 1e3),
                         ("p_process_baseline_prefill_ms", pb["prefill_s"] * 1e3),
                         ("p_port_ms", pre.get("port_ms", 0.0)),
                         ("kv_after_p_end_ms", (first["received_at"] - pre["end"]) * 1e3),
                         ("d_first_token_ms", (first["first_end"] - first["first_start"]) * 1e3),
                         ("baseline_first_token_ms", b["first_s"] * 1e3),
                         ("d_first_port_ms", first["first_split"].get("port_ms", 0.0)),
                         ("d_first_forward_ms", first["first_split"].get("forward_ms", 0.0)),
                         ("baseline_first_forward_ms", b["first_split"].get("forward_ms", 0.0)),
                         ("d_first_device_allocs", first["device_allocs"]),
                         ("baseline_first_device_allocs", b["device_allocs"]),
                         *((f"p_op_ms[{op}]", ms) for op, ms in sorted(pre.get("port_ops_ms", {}).items()))):
                parts.setdefault(k, []).append(v)
            if args.ttft_baseline_idle_steps_ms > 0:
                parts.setdefault("baseline_idle_steps", []).append(float(b["idle_steps"]))
            # READ: the span from P's end until D had every layer, in steps (P's request_finished
            # and the driver handing its params to D; D's admission; D's first step until its
            # loads were started; from there until get_finished listed the request).
            rc, adm = first.get("receive") or {}, first.get("admit")
            if adm is not None and rc.get("start") is not None:
                for k, v in (("r_admit_after_p_end_ms", (adm["admit_start"] - pre["end"]) * 1e3),
                             ("r_admit_ms", (adm["admit_end"] - adm["admit_start"]) * 1e3),
                             ("r_receive_after_admit_ms", (rc["start"] - adm["admit_end"]) * 1e3),
                             ("r_loads_after_receive_ms",
                              ((rc["loads_at"] or rc["start"]) - rc["start"]) * 1e3),
                             ("r_layer0_wait_ms",
                              ((rc.get("layer0_at") or rc["loads_at"] or rc["start"])
                               - (rc["loads_at"] or rc["start"])) * 1e3),
                             ("r_layer_waits_ms",
                              ((rc["waited_at"] or rc["loads_at"] or rc["start"])
                               - (rc["loads_at"] or rc["start"])) * 1e3),
                             ("r_done_after_waits_ms",
                              (first["received_at"] - (rc["waited_at"] or rc["loads_at"] or rc["start"])) * 1e3),
                             ("r_receive_steps", float(rc["steps"]))):
                    parts.setdefault(k, []).append(v)
        layer = d.call("layer_copy_time", tokens=n)
        row = {"mode": mode, "prompt_tokens": n, "reps": len(dis),
               "ttft_disagg_ms": statistics.median(dis) * 1e3, "ttft_baseline_ms": statistics.median(base) * 1e3,
               "layer_bytes": layer["bytes"], "layer_copy_ms": layer["ms"]}
        row["added_ms"] = row["ttft_disagg_ms"] - row["ttft_baseline_ms"]
        row["parts_ms"] = {k: statistics.median(v) for k, v in parts.items()}
        row["timeline"] = timeline
        log(f"  TTFT {mode} n={n} medians: " + ", ".join(f"{k} {v:.3f}" for k, v in row["parts_ms"].items()))
        if timeline:
            for line in timeline["lines"]:
                log(f"  timeline {mode} n={n}: {line}")
        if layer["ms"] is not None:
            row["goal_ms"] = layer["ms"] + 1.0
            row["within_goal"] = row["added_ms"] <= row["goal_ms"]
        row["paired"] = _paired_estimates(dis, base, parts, row.get("goal_ms"))
        rows.append(row)
        log(f"TTFT {mode} n={n}: disaggregated {row['ttft_disagg_ms']:.2f} ms, without {row['ttft_baseline_ms']:.2f} ms, "
            f"added {row['added_ms']:.2f} ms; one layer's copy ({layer['bytes']} B, torch) "
            f"{layer['ms'] if layer['ms'] is None else round(layer['ms'], 4)} ms"
            + (f"; goal <= {row['goal_ms']:.3f} ms: {'met' if row['within_goal'] else 'NOT met'}" if "goal_ms" in row else ""))
        for name, est in row["paired"].items():
            log(f"  TTFT {mode} n={n} paired, {name}: {describe(est)}")
    p.call("detach")
    d.call("detach")
    return rows


def _paired_estimates(dis: list[float], base: list[float], parts: dict[str, list[float]],
                      goal_ms: float | None) -> dict[str, dict]:
    """Added time per repetition, each "with" differenced against the "without" run beside it, as
    medians with bootstrap intervals (kvferry.paired): against D's process doing all the work, and
    against the matched work, each part in the process that does it with kvferry (P's prefill in
    P's, the first token in D's: the two processes' host times for the same work have differed by
    more than the goal); then the matched estimate's three parts."""
    ms = [x * 1e3 for x in dis]
    matched = [a + b for a, b in zip(parts["p_process_baseline_prefill_ms"], parts["baseline_first_token_ms"])]
    return {
        "added, without = D's process": paired(ms, [x * 1e3 for x in base], goal_ms),
        "added, without = P's prefill in P's process + first token in D's": paired(ms, matched, goal_ms),
        "P's prefill, added": paired(parts["p_prefill_ms"], parts["p_process_baseline_prefill_ms"]),
        "KV in place after P's prefill": estimate(parts["kv_after_p_end_ms"]),
        "D's first token, added": paired(parts["d_first_token_ms"], parts["baseline_first_token_ms"]),
    }


def _timeline(pre: dict, first: dict) -> dict:
    """P's last chunk, layer by layer (KV written, its save sent; the node's copy of the layer
    queues behind that event), against when D had all of it and its first token: from P's start."""
    ends = pre.get("layer_ends_ms") or []
    received = (first["received_at"] - pre["start"]) * 1e3
    p_done = (pre["end"] - pre["start"]) * 1e3
    lines = [f"P layer {i} KV written at {ms:.3f} ms" for i, ms in enumerate(ends)]
    lines.append(f"P prefill done (synchronized, request_finished next) at {p_done:.3f} ms")
    lines.append(f"D has every layer (get_finished lists it) at {received:.3f} ms")
    lines.append(f"D first token at {received + (first['first_end'] - first['first_start']) * 1e3:.3f} ms")
    return {"layer_ends_ms": ends, "p_done_ms": p_done, "d_received_ms": received, "lines": lines}


def mla_probe(device: str) -> dict:
    """Whether transformers builds a DeepSeek-V3 (MLA) model offline, and what its cache holds."""
    try:
        import torch
        from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

        cfg = DeepseekV3Config(vocab_size=1024, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                               num_hidden_layers=2, first_k_dense_replace=2, num_attention_heads=4,
                               num_key_value_heads=4, kv_lora_rank=64, q_lora_rank=None, qk_rope_head_dim=16,
                               qk_nope_head_dim=32, v_head_dim=32, n_routed_experts=4, num_experts_per_tok=2,
                               n_shared_experts=1)
        torch.manual_seed(0)
        model = DeepseekV3ForCausalLM(cfg).to(device=device, dtype=torch.bfloat16).eval()
        ids = torch.arange(3, 19, device=device)[None]
        with torch.inference_mode():
            out = model(input_ids=ids, use_cache=True)
        try:
            pkv = out.past_key_values
            shape: Any = tuple(pkv.layers[0].keys.shape)
        except Exception as ex:  # noqa: BLE001 - the cache's layout is information only
            shape = f"unknown ({type(ex).__name__}: {ex})"
        return {"builds": True, "cached_key_shape_layer0": shape,
                "latent_per_token": cfg.kv_lora_rank + cfg.qk_rope_head_dim,
                "note": "transformers' DeepSeek-V3 attention caches per-head K/V decompressed from the latent "
                        "(shape above), not the compressed latent vLLM's MLA layout [num_blocks, block_size, "
                        "kv_lora_rank + qk_rope_head_dim] pages; kvferry's MLA engine (--arch mla, "
                        "gpu_model.PagedMla) runs the same modules' attention from a paged latent instead"}
    except Exception as ex:  # noqa: BLE001 - reported
        return {"builds": False, "why": f"{type(ex).__name__}: {ex}"}


# ---------------------------------------------------------------- main

def _torch_threads(asked: int | None) -> int:
    """``--torch-threads``, else ``$OMP_NUM_THREADS``, else 1; at least 1."""
    source = "--torch-threads"
    if asked is None:
        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        source = "OMP_NUM_THREADS"
        try:
            asked = int(env) if env else 1
        except ValueError:
            raise SystemExit(f"OMP_NUM_THREADS must be a whole number, got {env!r}") from None
    if asked < 1:
        raise SystemExit(f"{source} (the engines' torch threads) must be at least 1, got {asked}")
    return asked


def _cpu_sets(arg: str | None) -> tuple[list[int] | None, list[int] | None]:
    """``--pin-cpus P:D`` -> the two engines' CPU lists (each side a kernel CPU list: N, N-M,
    comma lists of those)."""
    if not arg:
        return None, None
    from .cpu_sets import parse_list

    sides = arg.split(":")
    if len(sides) != 2 or not all(sides):
        raise SystemExit(f"--pin-cpus wants P_CPUS:D_CPUS (e.g. 2:3), got {arg!r}")
    return parse_list(sides[0]), parse_list(sides[1])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvferry.gpu_check", description=__doc__.splitlines()[0])
    p.add_argument("--p-socket", required=True)
    p.add_argument("--d-socket", required=True)
    p.add_argument("--p-device", default="cuda:0", help="cuda:N or cpu")
    p.add_argument("--d-device", default="cuda:0")
    p.add_argument("--modes", default="write,read")
    p.add_argument("--prompts", type=int, default=100, help="per mode")
    p.add_argument("--decode-steps", type=int, default=64)
    p.add_argument("--chunk-tokens", type=int, default=512)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--num-blocks", type=int, default=32768)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--arch", default="llama", choices=["llama", "mla"],
                   help="llama: grouped-query attention, vLLM's standard K/V pages; mla: DeepSeek-V3's "
                        "latent attention, vLLM's MLA pages [num_blocks, block_size, kv_lora_rank + rope dim]")
    p.add_argument("--heads", type=int, default=8, help="query heads (llama; MLA: heads)")
    p.add_argument("--kv-heads", type=int, default=2, help="KV heads (llama)")
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=1536, help="the MLP's width")
    p.add_argument("--pin-cpus", default=None,
                   help="diagnostic: P_CPUS:D_CPUS, e.g. 2-5:6-9: each engine process runs only there. "
                        "One core each (2:3) made 4,096-token prefills ~10x slower on an H200 host "
                        "(docs/gpu.md)")
    p.add_argument("--torch-threads", type=int, default=None,
                   help="each engine process's intra-op CPU threads (default: $OMP_NUM_THREADS, else 1, as "
                        "vLLM; with torch's default, one per CPU, a CPU gather in P's and D's steps took ms "
                        "right after a transfer, docs/gpu.md)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--attention", default="efficient", choices=["efficient", "cudnn", "math", "default"],
                   help="the attention kernel on a GPU, the same in P, D and the engine without kvferry")
    p.add_argument("--no-generate", action="store_true", help="skip transformers' generate() comparison")
    p.add_argument("--generate-every", type=int, default=1,
                   help="run the generate() comparison (information) on every K-th request only")
    p.add_argument("--control-every", type=int, default=4,
                   help="on every K-th request the engine without kvferry decodes twice (0: never): "
                        "its agreement with itself is the control for the greedy comparison")
    p.add_argument("--decode-probes", type=int, default=0,
                   help="diagnostic: on the first K requests of each mode, decode again on D's cache "
                        "without the port and on the other cache with port pings, timed")
    p.add_argument("--decode-delay-s", type=float, default=0.0,
                   help="diagnostic: on every odd request D waits this long before decoding")
    p.add_argument("--pre-decode-steps", type=int, default=0,
                   help="diagnostic: on every even request D first decodes this many steps on a copy")
    p.add_argument("--profile-decode", type=int, default=0,
                   help="diagnostic: profile D's decode (cProfile) on the first K requests of each mode")
    p.add_argument("--ttft-lengths", type=lambda s: [int(x) for x in s.split(",") if x], default=[256, 1024, 2048, 4096])
    p.add_argument("--ttft-reps", type=int, default=5)
    p.add_argument("--ttft-warmup", type=int, default=300,
                   help="disaggregated 48-token requests per mode before the TTFT runs, not timed: the nodes' "
                        "per-request code is then compiled, as in a node that has served a while (0: none)")
    p.add_argument("--ttft-d-after-p", action="store_true",
                   help="WRITE: D waits for the KV only once P's prefill returned (a diagnostic: does D's first "
                        "forward run slower because it shares the GPU with P's last kernels?)")
    p.add_argument("--ttft-d-quiet-ms", type=float, default=0.0,
                   help="diagnostic: D waits this long (untimed) between its KV landing and its first forward "
                        "(is that forward slower because of GPU work that follows the transfer?)")
    p.add_argument("--ttft-baseline-idle-steps-ms", type=float, default=0.0,
                   help="diagnostic: D's engine without kvferry waits this long (untimed) between its prefill and "
                        "its first token, in steps of D's kvferry engine with nothing scheduled (the loop D runs "
                        "while it waits for a transfer): is D's first forward slower because of that loop?")
    p.add_argument("--ttft-d-snapshot", action="store_true",
                   help="diagnostic: D copies the KV it received before its first forward (untimed), as the "
                        "check does and the TTFT runs did before 2026-12-03")
    p.add_argument("--ttft-profile", action="store_true",
                   help="profile one more P prefill at the longest TTFT length, with and without kvferry")
    p.add_argument("--max-prompt-tokens", type=int, default=PROMPT_MAX)
    p.add_argument("--no-mla-probe", action="store_true")
    p.add_argument("--max-errors", type=int, default=3, help="per mode, then the mode stops")
    p.add_argument("--mode-budget-s", type=float, default=600.0, help="per mode: no new request after this")
    p.add_argument("--no-pipelined-layer-waits", action="store_true",
                   help="READ on D: each wait_for_layer_load is its own round trip (the client's "
                        "default sends a loading step's waits for every layer at once)")
    p.add_argument("--cpu-load-wait", action="store_true",
                   help="READ on D: do not ask for the node's load events; the CPU waits for each layer's copies")
    p.add_argument("--cuda-graphs", choices=("auto", "on", "off"), default="auto",
                   help="every engine runs the last prompt token's step as a CUDA graph, captured at the first "
                        "step of each shape and replayed after, as vLLM runs decode-shaped steps; off: that "
                        "step issues its kernels one by one from Python, milliseconds of host time that swamp "
                        "the TTFT goal (docs/gpu.md). auto (default): on where P and D are on GPUs; on: "
                        "refused on the CPU")
    p.add_argument("--json", help="write the full report here")
    args = p.parse_args(argv)
    gpus = args.p_device.startswith("cuda") and args.d_device.startswith("cuda")
    if args.cuda_graphs == "on" and not gpus:
        p.error(f"--cuda-graphs on needs GPU devices; P is on {args.p_device}, D on {args.d_device}")
    args.cuda_graphs = args.cuda_graphs == "on" or (args.cuda_graphs == "auto" and gpus)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import signal

    import torch.multiprocessing as tmp

    # SIGTERM (gpu-model.sh when a node died, a timeout) unwinds like an error, so the engine
    # processes are stopped in the finally below rather than left holding their GPUs.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    def log(msg: str) -> None:
        print(msg, flush=True)

    ctx = tmp.get_context("spawn")
    cfg = {"spec": {"arch": args.arch, "layers": args.layers, "vocab": args.vocab, "seed": args.seed,
                    "attention": args.attention, "heads": args.heads, "kv_heads": args.kv_heads,
                    "head_dim": args.head_dim, "intermediate": args.intermediate},
           "num_blocks": args.num_blocks, "block_size": args.block_size, "chunk_tokens": args.chunk_tokens,
           "load_events": not args.cpu_load_wait, "pipelined_layer_waits": not args.no_pipelined_layer_waits,
           "torch_threads": _torch_threads(args.torch_threads), "cuda_graphs": args.cuda_graphs}
    rng = random.Random(args.seed)
    report: dict[str, Any] = {"config": vars(args)}
    t0 = time.time()
    p_cpus, d_cpus = _cpu_sets(args.pin_cpus)
    p = _Proc(ctx, "prefill", args.p_device, args.p_socket, {**cfg, "cpus": p_cpus})
    d = _Proc(ctx, "decode", args.d_device, args.d_socket, {**cfg, "cpus": d_cpus})
    log(f"P: {p.info}; D: {d.info}")
    from .gpu_model import ModelSpec, model_source

    source = model_source(ModelSpec(arch=args.arch))
    report["model_source"] = source
    log(f"model: {cfg['spec']}, built by {source}")
    rc = 0
    try:
        report["modes"] = []
        for mode in [m for m in args.modes.split(",") if m]:
            report["modes"].append(run_mode(p, d, mode, args, rng, log))
        report["ttft"] = []
        if args.ttft_reps > 0:
            for mode in [m for m in args.modes.split(",") if m]:
                try:
                    report["ttft"] += run_ttft(p, d, mode, args, rng, log)
                except Exception as ex:  # noqa: BLE001
                    log(f"TTFT {mode} failed: {ex}")
                    report["ttft_error"] = str(ex)[-2000:]
    finally:
        p.stop()
        d.stop()
    if not args.no_mla_probe:
        report["mla"] = mla_probe(args.d_device)
        log(f"MLA: {json.dumps(report['mla'])}")
    report["summary"] = summarize(report)
    report["wall_s"] = time.time() - t0
    for line in report["summary"]["lines"]:
        log(line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    if not report["summary"]["all_ok"]:
        rc = 1
    return rc


def summarize(report: dict) -> dict:
    lines = []
    all_ok = True
    for m in report.get("modes", []):
        reqs = m["requests"]
        done = [r for r in reqs if "error" not in r and r["kind"] != "abort"]
        aborted = [r for r in reqs if r["kind"] == "abort" and "error" not in r]
        errors = [r for r in reqs if "error" in r]
        kv = sum(1 for r in done if r["kv_equal"])
        first = sum(1 for r in done if r["first_logits_bitwise_equal"])
        toks = sum(1 for r in done if r["tokens_equal"])
        prefix = sum(1 for r in done if r["kind"] == "prefix-on-D" and r["d_hit"] > 0)
        gen = [r["generate"] for r in done if "agree_prefix" in r.get("generate", {})]
        gen_full = sum(1 for g in gen if g["agree_prefix"] == g["of"])
        lines.append(f"SUMMARY {m['mode']}: {len(reqs)} requests, {len(done)} completed, {len(aborted)} aborted, "
                     f"{len(errors)} errors; {prefix} completed with a prefix already on D; "
                     f"KV equal byte for byte {kv}/{len(done)}; first-token logits bitwise equal {first}/{len(done)}; "
                     f"{len(done) and done[0]['steps']} greedy steps identical {toks}/{len(done)}; "
                     f"generate() agrees on every token {gen_full}/{len(gen)} (information)")
        after = [r["cache_after_decode"] for r in done if r.get("cache_after_decode", {}).get("compared")]
        # D's copy of P's KV read again after decoding: changed means something wrote it after the
        # check (a late copy). The engine without kvferry's prefill of the same chunks against P's
        # bytes: different means the two processes' kernels disagree, and no bitwise comparison
        # with that baseline can hold (not kvferry's doing; said apart so it is not taken for it).
        late = [r["request"] for r in done if r.get("cache_after_decode", {}).get("d_kv_still_p") is False]
        unlike_p = [r["request"] for r in done if r.get("cache_after_decode", {}).get("baseline_kv_is_p") is False]
        lines.append(f"  cache after decoding equal to the engine without kvferry's (every position, every layer) "
                     f"{sum(1 for a in after if a['equal'])}/{len(after)}; D's transferred KV changed after the "
                     f"check in {len(late)}" + (f": {', '.join(late)}" if late else ""))
        if unlike_p:
            lines.append(f"  the engine without kvferry computed other KV than P for the same chunks in "
                         f"{len(unlike_p)}: {', '.join(unlike_p)} (the processes' kernels disagree: their "
                         f"first-token logits cannot be compared bit for bit)")
        ctl = [r for r in done if "control" in r]
        if ctl:
            lines.append(f"  control (the engine without kvferry decoding the same state twice): tokens identical "
                         f"{sum(1 for r in ctl if r['control']['tokens_equal'])}/{len(ctl)}, every step's logits "
                         f"bitwise equal {sum(1 for r in ctl if r['control']['first_differing_step'] is None)}"
                         f"/{len(ctl)}")
        for r in done:
            if r.get("divergence"):
                dv = r["divergence"]
                lines.append(f"  divergence {r['request']} step {dv['step']}: logits bitwise equal {dv['logits_bitwise_equal']}, "
                             f"top-2 margin {dv['top2_margin']:.4g}")
        lines.append(f"  blocks at end: {json.dumps(m['blocks_at_end'])}")
        lw = m["blocks_at_end"].get("D", {}).get("load_waits")
        if lw is not None and m["mode"] == "read":
            path = "GPU event" if lw["event"] > 0 else "CPU wait"
            lines.append(f"  D's wait_for_layer_load path: {path} (asked for load events {lw['asked']}, node exported "
                         f"{lw['exported']}; answers with an event {lw['event']}, without {lw['no_event']})")
        # A mode that planned no request (--prompts 0: a TTFT run) has nothing to fail; one that
        # planned some and completed none does.
        ok = not errors and kv == len(done) == first == toks and (len(done) > 0 or not reqs) and not late
        ends = m["blocks_at_end"]
        for side in ("P", "D"):
            if ends[side]["free_blocks"] != ends[side]["num_blocks"]:
                ok = False
                lines.append(f"  LEAK: {side} has {ends[side]['num_blocks'] - ends[side]['free_blocks']} blocks held at the end")
        all_ok &= ok
    if report.get("ttft_error"):
        # A TTFT run that stopped fails the run: its rows are missing, not merely slow.
        lines.append(f"TTFT FAILED: {report['ttft_error'][-500:]}")
        all_ok = False
    for row in report.get("ttft", []):
        lines.append(f"TTFT {row['mode']} {row['prompt_tokens']} tokens: disaggregated {row['ttft_disagg_ms']:.3f} ms, "
                     f"without {row['ttft_baseline_ms']:.3f} ms, added {row['added_ms']:.3f} ms, one layer's copy "
                     f"{row['layer_copy_ms']} ms" + (f", goal {'met' if row.get('within_goal') else 'NOT met'}"
                                                     if "within_goal" in row else ""))
        for name, est in row.get("paired", {}).items():
            if "verdict" in est:
                lines.append(f"  paired, {name}: {describe(est)}")
    return {"lines": lines, "all_ok": all_ok}


if __name__ == "__main__":
    sys.exit(main())
