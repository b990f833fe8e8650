"""Attention under a position remap (posbench/model/position_remap.py: Self-Extend, STRING):
queries and keys come rotated twice, side by side, (B, H, T, 2 hs) = [near | far]; a key fewer
than ``near`` tokens before its query scores with the near halves, any other with the far
halves, and one softmax runs over both:

    a_ij = softmax_j(s_ij),  s_ij = q_near_i . k_near_j / sqrt(hs)  if 0 <= i - j < near
                                  = q_far_i . k_far_j / sqrt(hs)    if i - j >= near

(the reference's torch.where of the two score matrices, datamllab/LongLM). No (H, T, T) tensor
at evaluation lengths:

* ``merged_remap_attention`` (evaluation on LOG_SUM_EXP_DEVICES: no gradient): two fused calls,
  the near keys in blocks of queries over a band of keys, the far keys causal over the queries
  from ``near`` on against the keys up to T - near (query i sees keys j <= i - near), merged by
  their log-sum-exps, as both references merge their two flash-attention calls.
* ``explicit_remap_attention`` (gradients, or other devices): the scores above per block of
  queries, written out in float32 (float64 for float64 inputs).
"""

from __future__ import annotations

import math

import torch

from posbench.model.attention import blocks
from posbench.model.attention.blocks import causal_bias, join_blocks, outside_window
from posbench.model.attention.fused import (
    merge_by_log_sum_exp,
    merges_by_log_sum_exp,
    sdpa_dtype,
    unbiased_causal_attention,
)


def remap_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, near: int, dropout: float = 0.0
) -> torch.Tensor:
    """Attention of q, k (B, H, T, 2 hs) = [near | far] halves and v (B, H, T, hs) whose keys
    fewer than ``near`` tokens back score with the near halves -> (B, H, T, hs)."""
    assert not dropout, "a remap applies in evaluation, without dropout"
    hs = v.shape[-1]
    near_q, far_q = q.split(hs, dim=-1)  # (B, H, T, hs) each
    near_k, far_k = k.split(hs, dim=-1)
    T = q.shape[2]
    if T <= near:  # no key is far
        return unbiased_causal_attention(near_q, near_k, v)
    merged = merges_by_log_sum_exp(q, dropout)
    # Cast once for every block: SDPA's dtype, or the explicit scores' float32 (float64 stays).
    dtype = sdpa_dtype(q) if merged else torch.promote_types(v.dtype, torch.float32)
    parts = (t.to(dtype) for t in (near_q, near_k, far_q, far_k, v))
    path = merged_remap_attention if merged else explicit_remap_attention
    return path(*parts, near).to(v.dtype)


def merged_remap_attention(
    near_q: torch.Tensor,
    near_k: torch.Tensor,
    far_q: torch.Tensor,
    far_k: torch.Tensor,
    v: torch.Tensor,
    near: int,
) -> torch.Tensor:
    """The near keys' attention and the far keys' (each (B, H, T, hs) in SDPA's dtype, T >
    near), merged by their log-sum-exps -> (B, H, T, hs), without gradients."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    T = near_q.shape[2]
    # The near keys: blocks of n queries over the band of keys they reach, n + near - 1.
    n = max(blocks.QUERY_BLOCK, near)
    outputs, sums = [], []
    for start in range(0, T, n):
        end = min(start + n, T)
        first = max(0, start - near + 1)
        band = near_q.new_zeros(end - start, end - first)  # (n, keys)
        band = outside_window(causal_bias(band, start, first), start, first, near)
        y, lse = flash(
            near_q[:, :, start:end],
            near_k[:, :, first:end],
            v[:, :, first:end],
            attn_mask=band[None, None],
        )  # (B, H, n, hs), (B, H, n)
        outputs.append(y)
        sums.append(lse)
    y_near, lse_near = torch.cat(outputs, dim=2), torch.cat(sums, dim=2)  # (B, H, T, ...)
    # The far keys: query i over keys j <= i - near, a causal square of T - near.
    y_far, lse_far = flash(
        far_q[:, :, near:], far_k[:, :, : T - near], v[:, :, : T - near], is_causal=True
    )  # (B, H, T - near, hs), (B, H, T - near)
    merged = merge_by_log_sum_exp(y_near[:, :, near:], lse_near[:, :, near:], y_far, lse_far)
    return torch.cat((y_near[:, :, :near], merged), dim=2)


def explicit_remap_attention(
    near_q: torch.Tensor,
    near_k: torch.Tensor,
    far_q: torch.Tensor,
    far_k: torch.Tensor,
    v: torch.Tensor,
    near: int,
) -> torch.Tensor:
    """The scores of the module's formula written out per block of queries, through autograd
    (inputs (B, H, T, hs) in float32 or float64) -> (B, H, T, hs)."""
    B, H, T, hs = v.shape
    scale = 1 / math.sqrt(hs)
    n = blocks.query_block_size(B, H, T)
    outputs = []
    for start in reversed(range(0, T, n)):
        end = min(start + n, T)
        queries = slice(start, end)
        near_s = near_q[:, :, queries] @ near_k[:, :, :end].transpose(-1, -2)  # (B, H, n, end)
        far_s = far_q[:, :, queries] @ far_k[:, :, :end].transpose(-1, -2)
        distance = torch.arange(start, end, device=v.device)[:, None] - torch.arange(
            end, device=v.device
        )  # (n, end)
        scores = torch.where(distance < near, near_s, far_s) * scale
        weights = causal_bias(scores, start).softmax(dim=-1)
        outputs.append(weights @ v[:, :, :end])  # (B, H, n, hs)
    return join_blocks(outputs)
