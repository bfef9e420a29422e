"""A real transformer's KV cache through the engine port: a Hugging Face ``LlamaForCausalLM``
(grouped-query attention, bf16, weights from a fixed seed, no model hub) run over a paged KV cache
in vLLM's layout, one request at a time, calling the connector in vLLM's order. A second geometry,
``arch="mla"``: a ``DeepseekV3ForCausalLM`` (multi-head latent attention) whose paged cache holds
vLLM's MLA latent, ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]`` per layer.

The model's modules are transformers' own (embeddings, RMSNorm, rotary embedding, q/k/v/o
projections, MLP, LM head); only attention is driven here, as vLLM does: each layer's K and V of
the step's tokens are scattered into their blocks (``[2, num_blocks, block_size, kv_heads,
head_dim]`` per layer), the layer's event is recorded and ``save_kv_layer`` sent at once, and
attention reads every earlier position back from the paged cache. So P, D and an engine without
kvferry all compute from the same cache bytes, and D's logits can be compared bit for bit.

Memory: on a GPU the cache is one allocation shared with the node by its CUDA IPC handle
(``memory.kind = "cuda_ipc"``) with a ring of interprocess events; on the CPU (CI) it is a
/dev/shm file (``memory.kind = "host"``), as the reference engine's.

torch and transformers are imported here only: the rest of the package works without them.
Without transformers (CI: Debian packages torch, not transformers) the Llama is
``kvferry.torch_llama``'s, the same shape and math in torch alone; the MLA model needs transformers.
"""

from __future__ import annotations

import functools
import mmap
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from .cuda_port import GpuWorkerClient, SaveMarks, device_uuid, event_ring, ipc_mem_handle, save_marks_setting
from .port import PortClient
from .reference.cache import BlockPool
from .reference.model import block_hashes
from .torch_llama import attend

PAGE = 4096


@dataclass(frozen=True)
class ModelSpec:
    """A small Llama with grouped-query attention (the issue's example geometry), or with
    ``arch="mla"`` a small DeepSeek-V3 whose attention caches the latent (dense MLPs: the experts
    change nothing in the KV)."""

    arch: str = "llama"
    layers: int = 8
    heads: int = 8
    kv_heads: int = 2
    head_dim: int = 64
    intermediate: int = 1536
    vocab: int = 32000
    seed: int = 1234
    max_positions: int = 8192
    # The attention kernel on a GPU: "efficient" (PyTorch's memory-efficient kernel), "cudnn",
    # "math" or "default" (PyTorch picks; on an H200 with torch 2.11 that is cuDNN, which builds an
    # execution plan the first time it sees each KV length: ~35 ms per new length, paid by whichever
    # engine decodes a length first; docs/gpu.md, run 6).
    attention: str = "efficient"
    # MLA only (DeepSeek-V3's names): the cached latent is kv_lora_rank + qk_rope_head_dim wide.
    kv_lora_rank: int = 256
    qk_rope_head_dim: int = 64
    qk_nope_head_dim: int = 64
    v_head_dim: int = 64

    def __post_init__(self) -> None:
        if self.arch not in ("llama", "mla"):
            raise ValueError(f"arch must be 'llama' or 'mla', not {self.arch!r}")

    @property
    def mla(self) -> bool:
        return self.arch == "mla"

    @property
    def hidden(self) -> int:
        return self.heads * self.head_dim

    @property
    def latent(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def token_elements(self) -> int:
        """Elements one token occupies in one layer's cache."""
        return self.latent if self.mla else 2 * self.kv_heads * self.head_dim


def build_model(spec: ModelSpec, device: torch.device) -> Any:
    """The model ``spec`` names, with weights drawn from ``spec.seed`` (see ``build_llama``)."""
    return build_mla(spec, device) if spec.mla else build_llama(spec, device)


@functools.lru_cache(maxsize=None)
def have_transformers() -> bool:
    """Whether Hugging Face transformers can be imported here (a GPU host: yes; CI's Debian: no).
    Asked once per process: a failed import searches the whole path again each time."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def model_source(spec: ModelSpec) -> str:
    """Which code builds ``spec``'s model on this host, for reports."""
    if have_transformers():
        return "transformers " + ("DeepseekV3ForCausalLM" if spec.mla else "LlamaForCausalLM")
    return "kvferry.torch_llama (transformers is not installed)"


def build_llama(spec: ModelSpec, device: torch.device) -> Any:
    """``LlamaForCausalLM`` with weights drawn from ``spec.seed`` on the CPU (the same bits in every
    process), in bf16 on ``device``. Without transformers (CI), ``kvferry.torch_llama``'s Llama of
    the same shape and math."""
    if not have_transformers():
        from .torch_llama import LlamaShape, TorchLlamaForCausalLM

        torch.manual_seed(spec.seed)
        model = TorchLlamaForCausalLM(LlamaShape(
            vocab=spec.vocab, hidden=spec.hidden, intermediate=spec.intermediate, layers=spec.layers,
            heads=spec.heads, kv_heads=spec.kv_heads, head_dim=spec.head_dim))
        return model.to(device=device, dtype=torch.bfloat16).eval()
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.kv_heads, head_dim=spec.head_dim,
        max_position_embeddings=spec.max_positions, tie_word_embeddings=False,
        pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    model = model.to(device=device, dtype=torch.bfloat16).eval()
    return model


def build_mla(spec: ModelSpec, device: torch.device) -> Any:
    """``DeepseekV3ForCausalLM`` (multi-head latent attention, no query compression, every MLP
    dense) with weights drawn from ``spec.seed`` on the CPU, in bf16 on ``device``. Needs
    transformers: kvferry has no MLA model of its own."""
    if not have_transformers():
        raise RuntimeError("the MLA model is transformers' DeepseekV3ForCausalLM, and transformers is not "
                           "installed here; the Llama runs without it (kvferry.torch_llama)")
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    config = DeepseekV3Config(
        vocab_size=spec.vocab, hidden_size=spec.hidden, intermediate_size=spec.intermediate,
        moe_intermediate_size=spec.intermediate, num_hidden_layers=spec.layers,
        first_k_dense_replace=spec.layers, num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads, kv_lora_rank=spec.kv_lora_rank, q_lora_rank=None,
        qk_rope_head_dim=spec.qk_rope_head_dim, qk_nope_head_dim=spec.qk_nope_head_dim,
        v_head_dim=spec.v_head_dim, n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, max_position_embeddings=spec.max_positions,
        tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    torch.manual_seed(spec.seed)
    model = DeepseekV3ForCausalLM(config)
    return model.to(device=device, dtype=torch.bfloat16).eval()


class PagedKvCache:
    """Every layer's KV in vLLM's layout, ``[layers, 2, num_blocks, block_size, kv_heads,
    head_dim]`` (MLA: ``[layers, num_blocks, block_size, latent]``) in one piece of memory: a CUDA
    allocation (shared by IPC handle) or, on the CPU, a /dev/shm file the node maps."""

    def __init__(self, spec: ModelSpec, num_blocks: int, block_size: int, device: torch.device,
                 shm_path: str | None = None):
        self.spec = spec
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.device = device
        if spec.mla:
            shape: tuple[int, ...] = (spec.layers, num_blocks, block_size, spec.latent)
        else:
            shape = (spec.layers, 2, num_blocks, block_size, spec.kv_heads, spec.head_dim)
        self.layer_bytes = num_blocks * block_size * spec.token_elements * 2
        self.shm_path: str | None = None
        self._map: mmap.mmap | None = None
        if device.type == "cuda":
            self.kv = torch.zeros(shape, dtype=torch.bfloat16, device=device)
        else:
            path = shm_path or f"/dev/shm/kvferry-gpu-model-{os.getpid()}-{id(self) & 0xffffff:x}"
            total = self.layer_bytes * spec.layers
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, -(-total // PAGE) * PAGE)
                self._map = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self.shm_path = path
            self.kv = torch.frombuffer(self._map, dtype=torch.bfloat16).view(shape)
        # Per layer, slot-indexed: K and V as [num_blocks * block_size, kv_heads, head_dim], or
        # MLA's latent as [num_blocks * block_size, latent].
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.latent: list[torch.Tensor] = []
        for layer in range(spec.layers):
            if spec.mla:
                self.latent.append(self.kv[layer].view(-1, spec.latent))
            else:
                self.k.append(self.kv[layer, 0].view(-1, spec.kv_heads, spec.head_dim))
                self.v.append(self.kv[layer, 1].view(-1, spec.kv_heads, spec.head_dim))

    def port_geometry(self) -> dict[str, Any]:
        if self.spec.mla:
            return {"layout": "mla", "num_blocks": self.num_blocks, "block_size": self.block_size,
                    "latent": self.spec.latent, "dtype_bytes": 2}
        return {"layout": "standard", "num_blocks": self.num_blocks, "block_size": self.block_size,
                "kv_heads": self.spec.kv_heads, "head_dim": self.spec.head_dim, "dtype_bytes": 2}

    def port_memory(self) -> dict[str, Any]:
        if self.device.type != "cuda":
            return {"kind": "host", "layers": [
                {"path": self.shm_path, "offset": layer * self.layer_bytes, "length": self.layer_bytes}
                for layer in range(self.spec.layers)]}
        # The allocation holding the cache and the cache's offset in it, from the driver, as the
        # node opens it (PyTorch's own _share_cuda_ handle carries a version/type prefix).
        handle, base = ipc_mem_handle(self.kv.data_ptr())
        return {"kind": "cuda_ipc", "device_uuid": device_uuid(self.device),
                "layers": [{"handle": handle, "offset": base + layer * self.layer_bytes,
                            "length": self.layer_bytes} for layer in range(self.spec.layers)]}

    def slots(self, blocks: list[int], start: int, end: int) -> torch.Tensor:
        """The slot index of each position in [start, end) under the block table ``blocks``."""
        bs = self.block_size
        pos = torch.arange(start, end, dtype=torch.int64)
        table = torch.tensor(blocks, dtype=torch.int64)
        return (table[pos // bs] * bs + pos % bs).to(self.device)

    def gather(self, blocks: list[int], start: int, end: int) -> torch.Tensor:
        """Positions [start, end) of every layer: [layers, 2, end - start, kv_heads, head_dim]
        (MLA: [layers, end - start, latent])."""
        s = self.slots(blocks, start, end)
        if self.spec.mla:
            return torch.stack([lat[s] for lat in self.latent])
        return torch.stack([torch.stack([self.k[layer][s], self.v[layer][s]])
                            for layer in range(self.spec.layers)])

    def by_position(self, gathered: torch.Tensor) -> torch.Tensor:
        """``gather``'s result as one row per position: [positions, everything of that position]."""
        axis = 1 if self.spec.mla else 2
        return gathered.movedim(axis, 0).reshape(gathered.shape[axis], -1)

    def positions(self, flat: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """Positions [start, end) of a flat copy of ``gather``'s result over more positions."""
        s = self.spec
        if s.mla:
            return flat.view(s.layers, -1, s.latent)[:, start:end]
        return flat.view(s.layers, 2, -1, s.kv_heads, s.head_dim)[:, :, start:end]

    def close(self) -> None:
        if self._map is not None:
            del self.kv, self.k, self.v, self.latent
            try:
                self._map.close()
            except BufferError:
                pass
            self._map = None
        if self.shm_path is not None:
            try:
                os.unlink(self.shm_path)
            except FileNotFoundError:
                pass


# How many step shapes a runner keeps captured (each holds its graph's memory pool).
GRAPHS = 8


@dataclass
class _StepGraph:
    """A captured step and its static tensors: the inputs copied in before each replay, and the
    logits the replay writes."""

    graph: Any
    cache: Any  # the PagedKvCache whose layers the graph reads and writes
    ids: torch.Tensor
    new_slots: torch.Tensor
    all_slots: torch.Tensor
    logits: torch.Tensor | None = None
    replays: int = 0


class PagedLlama:
    """The model's forward over a paged cache: per layer, K/V of the step's positions go into their
    slots, then attention reads positions [0, end) back from the cache. ``layer_written(layer)``
    runs as soon as a layer's KV is in its blocks (P saves it there); ``before_layer(layer)`` runs
    before a layer reads the cache (D's wait_for_layer_load)."""

    def __init__(self, model: Any, spec: ModelSpec):
        if have_transformers():
            from transformers.models.llama.modeling_llama import apply_rotary_pos_emb
        else:
            from .torch_llama import apply_rotary_pos_emb

        self.model = model
        self.spec = spec
        self._rope = apply_rotary_pos_emb
        # forward_graphed's captured steps, by (cache, start, tokens), least recently used first,
        # and the stream their eager first steps and captures run on.
        self._graphs: dict[tuple[int, int, int], _StepGraph] = {}
        self._side: Any = None

    @torch.inference_mode()
    def forward(self, cache: PagedKvCache, tokens: list[int], blocks: list[int], start: int,
                layer_written: Callable[[int], None] | None = None,
                before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Computes positions [start, start + len(tokens)); returns the last position's logits."""
        return self._compute(cache, *self._inputs(cache, tokens, blocks, start), start, layer_written, before_layer)

    @staticmethod
    def _inputs(cache: PagedKvCache, tokens: list[int], blocks: list[int],
                start: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A step's tensors on the device: its token ids, its positions' slots, and the slots of
        every position up to its end."""
        end = start + len(tokens)
        ids = torch.tensor(tokens, dtype=torch.int64, device=cache.device)[None]
        return ids, cache.slots(blocks, start, end), cache.slots(blocks, 0, end)

    @torch.inference_mode()
    def forward_graphed(self, cache: PagedKvCache, tokens: list[int], blocks: list[int], start: int) -> torch.Tensor:
        """forward() of a step without callbacks, as a CUDA graph: vLLM replays its decode-shaped
        steps (D's first token is one) as CUDA graphs, so their host time is a few launches, not
        the hundreds of kernels eager PyTorch issues one by one. The first step of a shape (start,
        len(tokens)) runs eager, on a side stream as capture wants its warm-up, and returns that;
        the graph captured after it (capture runs nothing) is replayed by the later steps of that
        shape with their tokens and slots copied in. Up to GRAPHS shapes are kept, the least
        recently used dropped first. Unlike vLLM's decode graphs, which serve any context length,
        a graph here is one prompt length's: it replays where lengths repeat (the TTFT runs)."""
        dev = cache.device
        if dev.type != "cuda":
            raise ValueError("CUDA graphs need the cache on a GPU")
        ids, new_slots, all_slots = self._inputs(cache, tokens, blocks, start)
        # A graph holds its cache (g.cache), so no other cache can take that cache's id meanwhile.
        key = (id(cache), start, len(tokens))
        g = self._graphs.pop(key, None)
        if g is not None:
            self._graphs[key] = g  # most recently used again
            g.ids.copy_(ids)
            g.new_slots.copy_(new_slots)
            g.all_slots.copy_(all_slots)
            g.graph.replay()
            g.replays += 1
            assert g.logits is not None
            return g.logits.clone()  # the graph writes its next output over this one
        with torch.cuda.device(dev):  # capture's own stream and pool are made on the current device
            if self._side is None or self._side.device != dev:
                self._side = torch.cuda.Stream(dev)
            stream, side = torch.cuda.current_stream(dev), self._side
            side.wait_stream(stream)
            with torch.cuda.stream(side):
                logits = self._compute(cache, ids, new_slots, all_slots, start)
            stream.wait_stream(side)
            logits.record_stream(stream)  # made on the side stream, read on this one
            g = _StepGraph(torch.cuda.CUDAGraph(), cache, ids.clone(), new_slots.clone(), all_slots.clone())
            try:
                # thread_local: the port client's threads may touch CUDA meanwhile, legitimately.
                with torch.cuda.graph(g.graph, stream=side, capture_error_mode="thread_local"):
                    g.logits = self._compute(cache, g.ids, g.new_slots, g.all_slots, start)
            except RuntimeError as e:
                raise RuntimeError(f"capturing a step of {len(tokens)} token(s) at position {start} as a CUDA "
                                   f"graph failed: {e}; gpu_check --cuda-graphs off runs it eager") from e
        while len(self._graphs) >= GRAPHS:
            del self._graphs[next(iter(self._graphs))]
        self._graphs[key] = g
        return logits

    def _compute(self, cache: PagedKvCache, ids: torch.Tensor, new_slots: torch.Tensor, all_slots: torch.Tensor,
                 start: int, layer_written: Callable[[int], None] | None = None,
                 before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """forward()'s work on tensors already on the device (a graph captures exactly this)."""
        spec, m = self.spec, self.model.model
        dev = cache.device
        n = ids.shape[1]
        end = start + n
        h = m.embed_tokens(ids)
        pos = torch.arange(start, end, device=dev)[None]
        cos, sin = m.rotary_emb(h, pos)
        mask = (torch.arange(end, device=dev)[None, :] <= torch.arange(start, end, device=dev)[:, None])
        with _attention_kernel(spec.attention, dev):
            return self._layers(cache, h, cos, sin, new_slots, all_slots, mask, n, layer_written, before_layer)

    def _layers(self, cache: PagedKvCache, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                new_slots: torch.Tensor, all_slots: torch.Tensor, mask: torch.Tensor, n: int,
                layer_written: Callable[[int], None] | None,
                before_layer: Callable[[int], None] | None) -> torch.Tensor:
        spec, m = self.spec, self.model.model
        groups = spec.heads // spec.kv_heads
        for i, layer in enumerate(m.layers):
            if before_layer is not None:
                before_layer(i)
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(1, n, spec.heads, spec.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(1, n, spec.kv_heads, spec.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(1, n, spec.kv_heads, spec.head_dim).transpose(1, 2)
            q, k = self._rope(q, k, cos, sin)
            cache.k[i][new_slots] = k[0].transpose(0, 1)
            cache.v[i][new_slots] = v[0].transpose(0, 1)
            if layer_written is not None:
                layer_written(i)
            kk = cache.k[i][all_slots].transpose(0, 1)[None].repeat_interleave(groups, dim=1)
            vv = cache.v[i][all_slots].transpose(0, 1)[None].repeat_interleave(groups, dim=1)
            o = attend(q, kk, vv, mask, a.scaling)
            h = h + a.o_proj(o.transpose(1, 2).reshape(1, n, spec.hidden))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(m.norm(h[:, -1:]))[0, -1]


class PagedMla(PagedLlama):
    """DeepSeek-V3's multi-head latent attention over a paged cache of the latent, as vLLM pages
    it: per position the normalized compressed KV (``kv_lora_rank``) then the key's rotary part
    after RoPE (``qk_rope_head_dim``). Attention decompresses every cached position's per-head keys
    and values with ``kv_b_proj`` (no weight absorption: simpler, the same bits in every engine)."""

    def __init__(self, model: Any, spec: ModelSpec):
        super().__init__(model, spec)
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as ds

        interleave = bool(getattr(model.config, "rope_interleave", False))
        self._rope = ds.apply_rotary_pos_emb_interleave if interleave else ds.apply_rotary_pos_emb

    def _layers(self, cache: PagedKvCache, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                new_slots: torch.Tensor, all_slots: torch.Tensor, mask: torch.Tensor, n: int,
                layer_written: Callable[[int], None] | None,
                before_layer: Callable[[int], None] | None) -> torch.Tensor:
        spec, m = self.spec, self.model.model
        heads, nope, rope, lora = spec.heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank
        total = all_slots.numel()
        for i, layer in enumerate(m.layers):
            if before_layer is not None:
                before_layer(i)
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(1, n, heads, nope + rope).transpose(1, 2)
            q_pass, q_rot = torch.split(q, [nope, rope], dim=-1)
            c, k_rot = torch.split(a.kv_a_proj_with_mqa(x), [lora, rope], dim=-1)
            q_rot, k_rot = self._rope(q_rot, k_rot.view(1, 1, n, rope), cos, sin)
            cache.latent[i][new_slots] = torch.cat([a.kv_a_layernorm(c)[0], k_rot[0, 0]], dim=-1)
            if layer_written is not None:
                layer_written(i)
            c_all, k_rot_all = torch.split(cache.latent[i][all_slots], [lora, rope], dim=-1)
            kv = a.kv_b_proj(c_all).view(1, total, heads, nope + spec.v_head_dim).transpose(1, 2)
            k_pass, v = torch.split(kv, [nope, spec.v_head_dim], dim=-1)
            k = torch.cat([k_pass, k_rot_all.view(1, 1, total, rope).expand(1, heads, total, rope)], dim=-1)
            o = F.scaled_dot_product_attention(torch.cat([q_pass, q_rot], dim=-1), k, v, attn_mask=mask,
                                               scale=a.scaling)
            h = h + a.o_proj(o.transpose(1, 2).reshape(1, n, heads * spec.v_head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return self.model.lm_head(m.norm(h[:, -1:]))[0, -1]


def _attention_kernel(name: str, device: torch.device) -> Any:
    """The context that restricts scaled_dot_product_attention to the chosen kernel (GPU only)."""
    import contextlib

    if device.type != "cuda" or name == "default":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {"efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
               "math": SDPBackend.MATH}
    if name not in kernels:
        raise ValueError(f"attention must be one of {sorted(kernels) + ['default']}, not {name!r}")
    # The math kernel stays allowed behind the chosen one: a shape the chosen kernel refuses still
    # runs (the same shape picks the same kernel in every engine, so bits stay comparable).
    return sdpa_kernel([kernels[name], SDPBackend.MATH] if name != "math" else [SDPBackend.MATH])


@dataclass
class Timing:
    start: float = 0.0
    end: float = 0.0
    layer_ends_ms: list[float] = field(default_factory=list)
    # Wall time spent in the connector's calls (step begin and end, save_kv_layer), CPU side.
    port_s: float = 0.0


class ModelEngine:
    """One engine (P, D, or without kvferry when ``socket_path`` is None) running one request at a
    time: admission with the prefix cache, chunked prefill, the last prompt token as its own step,
    greedy decoding; the connector is called in vLLM's order on every step."""

    def __init__(self, model: Any, spec: ModelSpec, cache: PagedKvCache, *, role: str, mode: str,
                 socket_path: str | None = None, chunk_tokens: int = 512, ring: int = 0,
                 load_events: bool = True, cuda_graphs: bool = False):
        """``load_events``: D in READ mode on a GPU asks the node for its load-event ring, so
        ``wait_for_layer_load`` makes the stream wait on the GPU (false: the CPU waits for the
        copies, as before); ``load_waits()`` says which path the waits took. ``cuda_graphs``: the
        last prompt token's step runs as a CUDA graph (``PagedLlama.forward_graphed``), as vLLM
        runs decode-shaped steps; a GPU cache only."""
        if cuda_graphs and cache.device.type != "cuda":
            raise ValueError("cuda_graphs needs the KV cache on a GPU")
        self.runner = PagedMla(model, spec) if spec.mla else PagedLlama(model, spec)
        self.cuda_graphs = cuda_graphs
        self.spec = spec
        self.cache = cache
        self.role = role
        self.mode = mode
        self.chunk_tokens = chunk_tokens
        self.pool = BlockPool(cache.num_blocks, prefix_caching=True)
        self.gpu = cache.device.type == "cuda"
        self.sched: PortClient | None = None
        self.worker: GpuWorkerClient | None = None
        self.marker: SaveMarks | None = None
        self._finished_ids: list[str] = []
        self.last_decode: dict[str, float] = {}
        self.last_first: dict[str, float] = {}
        # GPU: how a step's saved layers are marked for the node (KVFERRY_SAVE_MARKS): "layer",
        # an event and a save_kv_layer as each layer's KV is written, so its copies overlap the
        # next layers' compute; "step", one event after the last layer with every layer's save
        # behind it (one stream operation and one frame per step, the copies after the step).
        self.save_marks = save_marks_setting(os.environ.get("KVFERRY_SAVE_MARKS"), "KVFERRY_SAVE_MARKS")
        # With record_timeline (GPU): a timing event after each layer's KV is written, per step.
        self.record_timeline = False
        self._timeline: list[tuple[int, Any]] = []
        self.engine_id: str | None = None
        if socket_path is not None:
            events, handles = event_ring(ring or 2 * spec.layers) if self.gpu else ([], [])
            ident = {"role": role, "mode": mode, "tp_size": 1}
            self.worker = GpuWorkerClient(socket_path, "worker", engine=ident, tp_rank=0,
                                          geometry=cache.port_geometry(), memory=cache.port_memory(),
                                          events=handles,
                                          load_events=load_events and self.gpu and role == "decode"
                                          and mode == "read",
                                          event_device=cache.device if self.gpu else None)
            self.sched = PortClient(socket_path, "scheduler", engine=ident)
            if events:
                self.marker = SaveMarks(self.worker, events, spec.layers, self.save_marks)

    def connect(self, wait_s: float = 120.0) -> dict[str, Any]:
        assert self.worker is not None and self.sched is not None
        self.worker.reconnect(wait_s=wait_s)
        info = self.sched.reconnect(wait_s=wait_s)
        self.engine_id = info["engine_id"]
        return info

    def disconnect(self) -> None:
        if self.worker is not None:
            try:
                self.worker.shutdown()
            except Exception:  # noqa: BLE001 - the node may be gone already
                pass
        if self.sched is not None:
            self.sched.close()

    def load_waits(self) -> dict[str, Any]:
        """Which path D's wait_for_layer_load took: whether the node exported events, and how
        many waits were answered with an event (the stream waited) or without one."""
        w = self.worker
        if w is None:
            return {"asked": False, "exported": 0, "event": 0, "no_event": 0}
        return {"asked": w.load_events, "exported": len(w.load_event_handles), **w.load_waits}

    def reset_prefix_cache(self) -> None:
        self.pool = BlockPool(self.cache.num_blocks, prefix_caching=True)

    def idle_for(self, seconds: float) -> int:
        """Steps with nothing scheduled for ``seconds`` (at least one), as an engine waiting for a
        transfer runs them; returns how many. For use between transfers only: a result in them
        would be another request's, lost to its own wait, so it raises."""
        end = time.perf_counter() + seconds
        steps = 0
        while steps == 0 or time.perf_counter() < end:
            f = self._idle_step()
            steps += 1
            if f["done_sending"] or f["done_receiving"] or f["failed"]:
                raise RuntimeError(f"idle steps got a transfer's result, none may be in flight: {f}")
        return steps

    # ---- one step's connector calls ----

    def _idle_step(self) -> dict[str, Any]:
        """One step with nothing to compute: the connector calls only."""
        self._step_begin([], [])
        return self._step_end()

    def _step_begin(self, new: list[dict], cached: list[dict]) -> int:
        if self.sched is None:
            return 0
        assert self.worker is not None
        meta = self.sched.build_connector_meta(new, cached)
        self.worker.bind_connector_metadata(meta)
        return self.worker.start_load_kv()

    def _step_end(self) -> dict[str, Any]:
        if self.worker is None:
            return {"done_sending": [], "done_receiving": [], "failed": {}, "block_ids_with_load_errors": []}
        self.worker.wait_for_save()
        ids, self._finished_ids = self._finished_ids, []
        return self.worker.get_finished(ids)

    def _saver(self, timing: Timing | None) -> Callable[[int], None] | None:
        worker = self.worker
        if worker is None:
            return None
        if not self.gpu:
            return worker.save_kv_layer

        def saved(layer: int) -> None:
            t0 = time.perf_counter()
            if self.record_timeline:
                ev = torch.cuda.Event(enable_timing=True)
                ev.record()
                self._timeline.append((layer, ev))
            if self.marker is not None:
                self.marker.saved(layer)
            if timing is not None:
                timing.port_s += time.perf_counter() - t0
        return saved

    def _sync(self) -> None:
        if self.gpu:
            torch.cuda.synchronize(self.cache.device)

    # ---- prefill (P, and the engine without kvferry) ----

    def prefill(self, rid: str, prompt: list[int], params: dict | None, chunks: list[tuple[int, int]] | None = None,
                abort_after_chunks: int | None = None, finish: bool = True) -> dict[str, Any]:
        """Admits and prefills the whole prompt in chunks (``chunks`` replays another engine's);
        then finishes the request (P keeps its blocks while the node sends), unless ``finish`` is
        false (the engine without kvferry goes on to the last token with the same blocks)."""
        bs = self.cache.block_size
        n = len(prompt)
        t = Timing(start=time.perf_counter())
        self._timeline = []
        start_ev = None
        if self.record_timeline and self.gpu:
            start_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
        hashes = block_hashes(prompt, bs)[: (n - 1) // bs]
        hit = self.pool.lookup(hashes)
        hit_tokens = len(hit) * bs
        if self.sched is not None:
            self.sched.get_num_new_matched_tokens(rid, n, params, hit_tokens)
        self.pool.touch(hit)
        blocks = list(hit)
        if chunks is None:
            chunks = [(s, min(s + self.chunk_tokens, n)) for s in range(hit_tokens, n, self.chunk_tokens)]
        elif chunks and chunks[0][0] != hit_tokens:
            raise RuntimeError(f"{rid}: replayed chunks start at {chunks[0][0]} but the prefix cache has {hit_tokens}")
        first = True
        logits = None
        for i, (s, e) in enumerate(chunks):
            added = self.pool.allocate(-(-e // bs) - len(blocks))
            if added is None:
                raise RuntimeError(f"{rid}: out of KV blocks")
            blocks += added
            if first:
                if self.sched is not None:
                    self.sched.update_state_after_alloc(rid, list(blocks), 0)
                new, cached = [{"request_id": rid, "block_ids": list(blocks), "num_computed_tokens": e}], []
                first = False
            else:
                new, cached = [], [{"request_id": rid, "new_block_ids": added or None, "num_computed_tokens": e}]
            t0 = time.perf_counter()
            self._step_begin(new, cached)
            t.port_s += time.perf_counter() - t0
            logits = self.runner.forward(self.cache, prompt[s:e], blocks, s, layer_written=self._saver(t))
            t0 = time.perf_counter()
            self._step_end()
            t.port_s += time.perf_counter() - t0
            if abort_after_chunks is not None and i + 1 >= abort_after_chunks and e < n:
                return self._finish(rid, blocks, "aborted", t, hit_tokens, chunks[: i + 1], None)
        self._cache_full_blocks(prompt, blocks, n)
        if start_ev is not None:
            self._sync()
            # Milliseconds from the prefill's start to each layer's KV being written (last chunk).
            last = self._timeline[-self.spec.layers:]
            t.layer_ends_ms = [start_ev.elapsed_time(ev) for _, ev in last]
        if not finish:
            self._sync()
            t.end = time.perf_counter()
            return {"request_id": rid, "blocks": blocks, "hit_tokens": hit_tokens,
                    "chunks": [list(c) for c in chunks], "start": t.start, "end": t.end}
        return self._finish(rid, blocks, "length_capped", t, hit_tokens, chunks, logits)

    def _finish(self, rid: str, blocks: list[int], status: str, t: Timing, hit_tokens: int,
                chunks: list[tuple[int, int]], logits: torch.Tensor | None) -> dict[str, Any]:
        self._sync()
        t.end = time.perf_counter()
        delay, params = False, None
        if self.sched is not None:
            delay, params = self.sched.request_finished(rid, list(blocks), status)
            self._finished_ids.append(rid)
        if not delay:
            self.pool.free(blocks)
        return {"request_id": rid, "blocks": list(blocks), "delay_free": delay, "kv_transfer_params": params,
                "hit_tokens": hit_tokens, "chunks": [list(c) for c in chunks], "start": t.start, "end": t.end,
                "status": status, "layer_ends_ms": t.layer_ends_ms, "port_ms": t.port_s * 1e3}

    def _cache_full_blocks(self, prompt: list[int], blocks: list[int], computed: int) -> None:
        bs = self.cache.block_size
        full = min(computed, len(prompt)) // bs
        for i, h in enumerate(block_hashes(prompt[: full * bs], bs)):
            self.pool.cache_block(blocks[i], h)

    def drain(self, rids: list[str], timeout_s: float = 20.0) -> dict[str, str]:
        """Steps (nothing to compute) until the node reports each of ``rids`` over (sent,
        received or failed); the caller frees their blocks then. Returns rid -> "sent" /
        "received" / "failed: why" / "timeout"."""
        left = set(rids)
        out: dict[str, str] = {}
        deadline = time.monotonic() + timeout_s
        while left and time.monotonic() < deadline:
            f = self._idle_step()
            for rid in f["done_sending"] + f["done_receiving"]:
                if rid in left:
                    out[rid] = "sent" if rid in f["done_sending"] else "received"
                    left.discard(rid)
            for rid, why in f["failed"].items():
                if rid in left:
                    out[rid] = f"failed: {why}"
                    left.discard(rid)
            if left:
                time.sleep(0.0005)
        for rid in left:
            out[rid] = "timeout"
        return out

    # ---- D: admission, receiving, the last prompt token, decoding ----

    def admit_remote(self, rid: str, prompt: list[int], params: dict) -> dict[str, Any]:
        bs = self.cache.block_size
        n = len(prompt)
        hashes = block_hashes(prompt, bs)[: (n - 1) // bs]
        hit = self.pool.lookup(hashes)
        hit_tokens = len(hit) * bs
        assert self.sched is not None
        count, is_async = self.sched.get_num_new_matched_tokens(rid, n, params, hit_tokens)
        self.pool.touch(hit)
        added = self.pool.allocate(-(-(hit_tokens + count) // bs) - len(hit))
        if added is None:
            raise RuntimeError(f"{rid}: out of KV blocks")
        self.sched.update_state_after_alloc(rid, added, count)
        return {"request_id": rid, "blocks": hit + added, "hit_tokens": hit_tokens, "count": count,
                "async": is_async}

    def receive(self, rid: str, timeout_s: float = 20.0) -> dict[str, Any]:
        """Steps until the node reports ``rid`` received (or failed); per-layer waits when the
        node says this step loads (READ): with the node's load events the current stream waits
        on the GPU (the client does it), else the CPU waits until the layer landed."""
        deadline = time.monotonic() + timeout_s
        load_errors: list[int] = []
        # Where the wait goes (perf_counter, comparable across processes): the first step that
        # started loads, and how many steps it took.
        stamps: dict[str, Any] = {"start": time.perf_counter(), "loads_at": None, "layer0_at": None,
                                  "waited_at": None, "steps": 0}
        while time.monotonic() < deadline:
            loads = self._step_begin([], [])
            stamps["steps"] += 1
            if loads:
                if stamps["loads_at"] is None:
                    stamps["loads_at"] = time.perf_counter()
                assert self.worker is not None
                for layer in range(self.spec.layers):
                    self.worker.wait_for_layer_load(layer)
                    if layer == 0:
                        stamps["layer0_at"] = time.perf_counter()
                stamps["waited_at"] = time.perf_counter()
            f = self._step_end()
            load_errors += f["block_ids_with_load_errors"]
            if rid in f["failed"]:
                return {"ok": False, "why": str(f["failed"][rid]), "end": time.perf_counter(), **stamps}
            if rid in f["done_receiving"]:
                return {"ok": True, "load_errors": load_errors, "end": time.perf_counter(), **stamps}
        return {"ok": False, "why": "timeout", "end": time.perf_counter(), **stamps}

    def abort_remote(self, rid: str, blocks: list[int], timeout_s: float = 30.0) -> str:
        """D's side of an abort: request_finished, then free once the node lets go."""
        assert self.sched is not None
        delay, _ = self.sched.request_finished(rid, list(blocks), "aborted")
        self._finished_ids.append(rid)
        outcome = "freed"
        if delay:
            outcome = self.drain([rid], timeout_s).get(rid, "timeout")
        self.pool.free(blocks)
        return outcome

    def first_token(self, rid: str, prompt: list[int], blocks: list[int], remote: bool) -> tuple[torch.Tensor, list[int]]:
        """The last prompt token as one step (D after its KV came; the engine without kvferry after
        prefilling the rest). Returns its logits and the block table."""
        bs = self.cache.block_size
        n = len(prompt)
        t0 = time.perf_counter()
        added = self.pool.allocate(max(0, -(-n // bs) - len(blocks))) or []
        blocks = blocks + added
        if self.sched is not None and remote:
            self.sched.update_state_after_alloc(rid, added, 0)  # vLLM's second call, no external tokens
        new = [{"request_id": rid, "block_ids": list(blocks), "num_computed_tokens": n}]
        self._step_begin(new, [])
        t1 = time.perf_counter()
        step = self.runner.forward_graphed if self.cuda_graphs else self.runner.forward
        logits = step(self.cache, prompt[n - 1:], blocks, n - 1)
        self._sync()
        t2 = time.perf_counter()
        self._step_end()
        t3 = time.perf_counter()
        self._cache_full_blocks(prompt, blocks, n)
        # Where the step's time went (the forward synchronized, so it holds the GPU's time).
        self.last_first = {"port_ms": (t1 - t0 + t3 - t2) * 1e3, "forward_ms": (t2 - t1) * 1e3,
                           "prefix_hashes_ms": (time.perf_counter() - t3) * 1e3}
        return logits, blocks

    def decode(self, rid: str, prompt: list[int], blocks: list[int], first: torch.Tensor, steps: int,
               between_steps: Callable[[], None] | None = None) -> tuple[list[int], list[torch.Tensor]]:
        """Greedy: the first token from ``first``, then ``steps`` more; every step's logits kept.
        ``between_steps`` (a diagnostic) runs after each step's connector calls, timed with them."""
        bs = self.cache.block_size
        tokens = [int(torch.argmax(first))]
        logits_seen = [first]
        pos = len(prompt)
        port: list[float] = []
        compute: list[float] = []
        for _ in range(steps):
            added = self.pool.allocate(max(0, -(-(pos + 1) // bs) - len(blocks))) or []
            blocks += added
            t0 = time.perf_counter()
            self._step_begin([], [{"request_id": rid, "new_block_ids": added or None, "num_computed_tokens": pos + 1}])
            t1 = time.perf_counter()
            logits = self.runner.forward(self.cache, tokens[-1:], blocks, pos)
            tokens.append(int(torch.argmax(logits)))  # waits for the GPU: compute ends here
            t2 = time.perf_counter()
            self._step_end()
            if between_steps is not None:
                between_steps()
            port.append(t1 - t0 + time.perf_counter() - t2)
            compute.append(t2 - t1)
            logits_seen.append(logits)
            pos += 1
        # Where the steps' wall time went: the connector's calls against the forward pass.
        self.last_decode = {"steps": steps, "port_ms": sum(port) * 1e3, "compute_ms": sum(compute) * 1e3,
                            "port_max_ms": max(port, default=0.0) * 1e3,
                            "compute_max_ms": max(compute, default=0.0) * 1e3}
        return tokens, logits_seen

    def finish_decoded(self, rid: str, blocks: list[int]) -> None:
        if self.sched is not None:
            self.sched.request_finished(rid, list(blocks), "length_capped")
            self._finished_ids.append(rid)
        self.pool.free(blocks)
