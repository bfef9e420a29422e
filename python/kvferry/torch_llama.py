"""A Llama written with PyTorch alone, for hosts that have torch but not Hugging Face
``transformers``: CI's Debian has ``python3-torch`` and no transformers package, and reaches no
PyPI. ``kvferry.gpu_model`` builds it in place of ``LlamaForCausalLM`` only when transformers
cannot be imported, so CI runs the real-model check's whole Python path (paged cache in vLLM's
layout, the connector in vLLM's order, nodes, byte and logit checks) on the CPU. On a GPU host
transformers is present and is what runs.

The math is Llama's as transformers writes it (RMSNorm in float32, rotary embedding of the
rotate-half kind, grouped-query attention scaled by ``head_dim ** -0.5``, a SiLU-gated MLP, no
biases), and the modules carry transformers' attribute names (``model.layers[i].self_attn.q_proj``
...), because ``PagedLlama`` drives them by those names. Weights are drawn from the seed the
caller sets, so every process builds the same bits; they are not transformers' bits for the same
seed (other initialisers), which nothing compares.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class LlamaShape:
    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_pos_emb(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                         unsqueeze_dim: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotates ``q`` and ``k`` (``[batch, heads, positions, head_dim]``) by their positions' angles."""
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def _sdpa_takes_scale() -> bool:
    """torch 2.1 added ``scale`` to scaled_dot_product_attention; Debian bookworm's torch is 1.13."""
    if not hasattr(F, "scaled_dot_product_attention"):
        return False
    major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) >= (2, 1)


_SDPA_SCALE = _sdpa_takes_scale()


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """Attention of ``q`` over ``k``/``v`` where ``mask`` (``[q_positions, k_positions]``, True =
    attend) allows. PyTorch's fused kernel where this torch has it, else the same math spelled out;
    every engine of one run uses the same torch, so their bits stay comparable."""
    if _SDPA_SCALE:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    scores = torch.matmul(q, k.transpose(-2, -1)).float() * scale
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, dim=-1).to(v.dtype), v)


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin per position, ``[batch, positions, head_dim]``, in ``x``'s dtype."""
        inv = self.inv_freq[None, :, None].float().expand(position_ids.shape[0], -1, 1).to(x.device)
        freqs = (inv @ position_ids[:, None, :].float()).transpose(1, 2)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


class Attention(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.q_proj = nn.Linear(s.hidden, s.heads * s.head_dim, bias=False)
        self.k_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.v_proj = nn.Linear(s.hidden, s.kv_heads * s.head_dim, bias=False)
        self.o_proj = nn.Linear(s.heads * s.head_dim, s.hidden, bias=False)
        self.scaling = s.head_dim ** -0.5


class Mlp(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.gate_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.up_proj = nn.Linear(s.hidden, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, s.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.self_attn = Attention(s)
        self.mlp = Mlp(s)
        self.input_layernorm = RMSNorm(s.hidden, s.rms_eps)
        self.post_attention_layernorm = RMSNorm(s.hidden, s.rms_eps)


class LlamaModel(nn.Module):
    def __init__(self, s: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(s.vocab, s.hidden)
        self.layers = nn.ModuleList(DecoderLayer(s) for _ in range(s.layers))
        self.norm = RMSNorm(s.hidden, s.rms_eps)
        self.rotary_emb = RotaryEmbedding(s.head_dim, s.rope_theta)


class TorchLlamaForCausalLM(nn.Module):
    """``model.model`` and ``model.lm_head`` as transformers names them; ``model(input_ids=...)``
    is a plain causal forward over the whole sequence (no cache), returning ``.logits``."""

    def __init__(self, s: LlamaShape):
        super().__init__()
        self.shape = s
        self.model = LlamaModel(s)
        self.lm_head = nn.Linear(s.hidden, s.vocab, bias=False)

    def forward(self, input_ids: torch.Tensor) -> SimpleNamespace:
        s, m = self.shape, self.model
        b, n = input_ids.shape
        h = m.embed_tokens(input_ids)
        pos = torch.arange(n, device=input_ids.device)[None].expand(b, -1)
        cos, sin = m.rotary_emb(h, pos)
        mask = torch.ones(n, n, dtype=torch.bool, device=input_ids.device).tril()
        for layer in m.layers:
            a = layer.self_attn
            x = layer.input_layernorm(h)
            q = a.q_proj(x).view(b, n, s.heads, s.head_dim).transpose(1, 2)
            k = a.k_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
            v = a.v_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            groups = s.heads // s.kv_heads
            o = attend(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1), mask, a.scaling)
            h = h + a.o_proj(o.transpose(1, 2).reshape(b, n, s.heads * s.head_dim))
            h = h + layer.mlp(layer.post_attention_layernorm(h))
        return SimpleNamespace(logits=self.lm_head(m.norm(h)))
