"""Attention whose logits go through transitions between key and query (``transitions``: PaTH,
posbench/encodings/path.py), one chunk of queries at a time: ``transition_attention``.

The encoding gives each chunk's logits as its queries taken back to the chunk's start, the
earlier keys carried forward to it, and the chunk's own (n, n) logits (``chunk_logits``); no
(T, T) tensor is written. With gradients a chunk's scores over every key up to it are kept for
the backward pass (T^2 / 2 per head: small at training lengths). In evaluation on a CPU
(merges_by_log_sum_exp) the keys are carried in one buffer, in place, and the chunk's queries
attend to them with SDPA's fused kernel (a key bias as one more q/k dimension, as
key_bias.py's), merged with the chunk's own by their log-sum-exps: nothing of (n, T) is
written either.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posbench.encodings import PositionalEncoding
from posbench.encodings.path import chunk_logits
from posbench.errors import PosbenchError
from posbench.model.attention.blocks import causal_bias
from posbench.model.attention.fused import merge_by_log_sum_exp, merges_by_log_sum_exp

Transitions = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]  # w, beta, b (or None)


def transition_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    transitions: Transitions,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(q_i^T H_i ... H_{j+1} k_j / sqrt(hs) + b_j - b_i + causal mask) v for q, k, v
    (B, H, T, hs) and the encoding's ``transitions`` (w (B, H, T, hs), beta (B, H, T), b
    (B, H, T) or None) -> (B, H, T, hs), computed in the dtype of w (float32, or float64).

    b_i is the same for every key of query i, so it is left out (it cancels in the softmax);
    b_j is taken relative to the chunk's first query's, a key every query of the chunk sees."""
    dtype = transitions[0].dtype
    with torch.autocast(q.device.type, enabled=False):  # autocast would round them to bf16
        if merges_by_log_sum_exp(q, dropout):
            y = merged_chunks(q, k, v.to(dtype), transitions)
        else:
            y = whole_chunks(q, k, v.to(dtype), transitions, dropout)
    return y.to(q.dtype)


def check_transitions(encodings: list[PositionalEncoding], scaling: str) -> None:
    """Refuse an attention ``scaling`` (model.attention_scaling) in a model one of whose layers'
    ``encodings`` has transitions: a decode, diagnose and the attention variants take their
    logits as content_bias, from the queries before scaling, added to the scaled q.k."""
    name = next((e.config.name for e in encodings if e.has_transitions), None)
    if scaling != "none" and name is not None:
        raise PosbenchError(
            f"encoding={name} turns q through its transitions, which model.attention_scaling="
            f"{scaling} would scale apart from q.k; use model.attention_scaling=none"
        )


def chunk_key_bias(
    key_bias: torch.Tensor, start: int, end: int, dtype: torch.dtype
) -> torch.Tensor:
    """b_j - b_start of the keys [0, end) (B, H, end) in ``dtype``: small near the chunk, where
    the weight is, whatever b's size (FoX's running sums reach -11,000 at 16,384 tokens)."""
    return (key_bias[..., :end] - key_bias[..., start, None]).to(dtype)


def whole_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, transitions: Transitions, dropout: float
) -> torch.Tensor:
    """transition_attention with each chunk's scores over its keys written out (autograd's
    path): (B, H, T, hs)."""
    w, beta, key_bias = transitions
    scale = 1 / math.sqrt(q.shape[-1])
    outputs = []
    for chunk in chunk_logits(q, k, w, beta):
        start, end = chunk.start, chunk.end
        past = chunk.queries @ chunk.keys.transpose(-1, -2)  # (B, H, n, start)
        scores = torch.cat([past, chunk.local], dim=-1) * scale  # (B, H, n, end)
        if key_bias is not None:
            scores = scores + chunk_key_bias(key_bias, start, end, w.dtype)[..., None, :]
        weights = F.softmax(causal_bias(scores, start), dim=-1)  # (B, H, n, end)
        weights = F.dropout(weights, dropout) if dropout else weights
        outputs.append(weights @ v[:, :, :end])  # (B, H, n, hs)
    return torch.cat(outputs, dim=2)


def merged_chunks(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, transitions: Transitions
) -> torch.Tensor:
    """transition_attention in evaluation on a CPU: each chunk's queries over the keys before
    it on SDPA's fused kernel (with a key bias, one more q/k dimension of sqrt(hs) and b_j),
    merged with its own keys' attention by their log-sum-exps: (B, H, T, hs)."""
    w, beta, key_bias = transitions
    B, H, T, hs = q.shape
    scale = 1 / math.sqrt(hs)
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    extra = 0 if key_bias is None else 1  # the key bias's dimension
    store = q.new_empty(B, H, T, hs + extra, dtype=w.dtype)  # the carried keys (and b_j)
    values = F.pad(v, (0, extra))  # the kernel takes v only at q's width
    outputs = []
    for chunk in chunk_logits(q, k, w, beta, store=store):
        start, end = chunk.start, chunk.end
        local = chunk.local * scale  # (B, H, n, n)
        if key_bias is not None:
            bias = chunk_key_bias(key_bias, start, end, w.dtype)  # (B, H, end)
            local = local + bias[..., None, start:end]
        local = causal_bias(local)
        lse = torch.logsumexp(local, dim=-1)  # (B, H, n)
        y = torch.softmax(local, dim=-1) @ v[:, :, start:end]  # (B, H, n, hs)
        if start:
            queries = chunk.queries
            if key_bias is not None:
                store[..., :start, hs] = bias[..., :start]
                queries = F.pad(queries, (0, 1), value=math.sqrt(hs))  # (B, H, n, hs + 1)
            past, past_lse = flash(queries, chunk.keys, values[:, :, :start], scale=scale)
            y = merge_by_log_sum_exp(past[..., :hs], past_lse, y, lse)
        outputs.append(y)
    return torch.cat(outputs, dim=2)
