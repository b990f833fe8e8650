"""Causal attention with a float mask that needs a gradient, written out per block of queries,
with a hand-written backward pass (posbench.model.attention takes it for a bias that is trained).

SDPA's fused CPU kernel gives no gradient for its mask, and its unfused fallback is slower than
this. The blocks are those of posbench.model.attention: each covers queries [e - n, e) and keys
[s, e) (s = 0 but in a sliding window), and its mask already holds the causal part (-inf at
future keys).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

# blocks.EXPLICIT_QUERY_BLOCK as an attribute: set in one place for every path
from posbench.model.attention import blocks
from posbench.model.attention.blocks import causal_bias


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    masks: list[torch.Tensor],
    dropout: float = 0.0,
    key_starts: list[int] | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + mask) v for q, k (B, H, T, d) and v (B, H, T, hs) (hs = d but
    for PoPE's wider q and k), in blocks of queries whose additive float masks ([B|1], H, n, m)
    need a gradient (a learned bias, in training): masks[i] is the i-th block's, keys [s, s + m)
    with s = key_starts[i] (0 by default) and queries [s + m - n, s + m); the blocks cover the
    queries in order, the last one ending at T -> (B, H, T, hs).

    SDPA's fused CPU kernel gives no gradient for a mask, and its unfused fallback is slower
    than this computation. ExplicitAttention writes the gradients itself rather than leave
    them to autograd, which copied each block's slices of q, k and v and zero-filled and
    summed their gradients into full-size tensors. One attention layer (4 heads, d 128),
    forward and backward, as a multiple of NoPE's time with the fused causal kernel: at 32 x 128
    tokens 1.08x (autograd's computation 1.12-1.19x), at 16 x 256 1.06x (1.29x), at 8 x 512
    0.97x (1.11x).
    """
    starts = tuple(key_starts) if key_starts is not None else (0,) * len(masks)
    return ExplicitAttention.apply(q, k, v, dropout, starts, *masks)


def narrow_values_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(d) + causal mask) v for q, k (B, H, T, d) wider than v (B, H, T, hs)
    (PoPE's), with gradients: explicit_attention with only the causal mask, in blocks of
    EXPLICIT_QUERY_BLOCK queries -> (B, H, T, hs).

    SDPA's fused kernels take one width, so the fused path pads v with zeros to q's width and
    computes the weights' products with those zeros too, forward and backward: this writes the
    (T, T) weights out instead, at v's own width. One layer of PoPE's q, k (d 64) and v (hs 32),
    4 heads, forward and backward, against SDPA on v padded: 53 ms against 68 ms at 32 x 128
    tokens, 158 against 212 at 8 x 512, 694 against 644 at 2 x 2,048 (one thread, a loaded
    machine): hence only up to NARROW_VALUES_LENGTH tokens (fused.py).
    """
    T, n = q.shape[2], blocks.EXPLICIT_QUERY_BLOCK
    zeros = q.new_zeros(1, 1, min(n, T), T, dtype=torch.promote_types(q.dtype, torch.float32))
    # Queries [s, s + n) over keys [0, s + n): the causal mask alone, the same for every head.
    masks = [causal_bias(zeros[..., : min(n, T - s), : s + n], s) for s in range(0, T, n)]
    return explicit_attention(q, k, v, masks, dropout)


class ExplicitAttention(torch.autograd.Function):
    """explicit_attention's forward and backward. Inputs of lower precision than float32
    (bf16 autocast) are computed in float32, as unbiased_causal_attention does, and their
    gradients returned in their own dtype.

    Layouts are chosen for the neighbouring operations: q, k and v are copied once into
    (B * H, T, hs) batches of matrices that every block's products read in place; the output
    and q's gradient are written as (B, T, H, hs), the layout of the projections they come
    from and go to (the output projection reads it without a copy); the last block (which
    attends to every key) starts the sums of the keys' and values' gradients, the others add
    to them.
    """

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout: float,
        key_starts: tuple[int, ...],
        *masks: torch.Tensor,
    ) -> torch.Tensor:
        B, H, T, d = q.shape
        hs = v.shape[-1]  # d, or less (PoPE's q and k are wider)
        dtype = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            q3, k3, v3 = (t.to(dtype).reshape(B * H, T, t.shape[-1]) for t in (q, k, v))
            q3 = q3 * (1 / math.sqrt(d))
            y = q.new_empty(B, T, H, hs, dtype=dtype)
            weights, keeps = [], []
            for key_start, mask in zip(key_starts, masks, strict=True):
                n, m = mask.shape[-2:]
                end = key_start + m
                start = end - n
                keys = k3[:, key_start:end].transpose(1, 2)
                scores = torch.bmm(q3[:, start:end], keys)  # (BH, n, m)
                w = torch.softmax(scores.view(B, H, n, m).add_(mask), dim=-1)
                weights.append(w)
                if dropout:  # 0 or 1 / (1 - dropout): F.dropout's mask, kept for the backward
                    keeps.append(F.dropout(torch.ones_like(w), dropout))
                    w = w * keeps[-1]
                part = torch.bmm(w.view(B * H, n, m), v3[:, key_start:end])  # (BH, n, hs)
                y[:, start:end] = part.view(B, H, n, hs).transpose(1, 2)
        ctx.save_for_backward(q3, k3, v3, *weights, *keeps)
        ctx.input_dtypes = [t.dtype for t in (q, k, v)]
        # Each mask's batch, dtype and whether it needs a gradient (not the causal mask alone).
        ctx.masks = [
            (m.shape[0], m.dtype, needs)
            for m, needs in zip(masks, ctx.needs_input_grad[5:], strict=True)
        ]
        ctx.key_starts = key_starts
        return y.transpose(1, 2).to(q.dtype)  # (B, H, T, hs)

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q3, k3, v3, *saved = ctx.saved_tensors
        blocks = len(ctx.masks)
        weights, keeps = saved[:blocks], saved[blocks:] or [None] * blocks
        BH, T, d = q3.shape
        hs = v3.shape[-1]
        B, H = dy.shape[:2]
        with torch.autocast(dy.device.type, enabled=False):
            dy3 = dy.to(q3.dtype).reshape(BH, T, hs)
            dq = dy3.new_empty(B, T, H, d)
            dk = dv = None
            mask_grads = []
            for w, keep, key_start, (mask_batch, mask_dtype, mask_needs_grad) in reversed(
                list(zip(weights, keeps, ctx.key_starts, ctx.masks, strict=True))
            ):
                n, m = w.shape[-2:]
                end = key_start + m
                start = end - n
                keys = slice(key_start, end)
                dropped = w if keep is None else w * keep
                dv_part = torch.bmm(dropped.view(BH, n, m).transpose(1, 2), dy3[:, start:end])
                dw = torch.bmm(dy3[:, start:end], v3[:, keys].transpose(1, 2)).view(B, H, n, m)
                if keep is not None:
                    dw.mul_(keep)
                dscores = torch._softmax_backward_data(dw, w, -1, w.dtype)  # (B, H, n, e)
                ds3 = dscores.view(BH, n, m)
                dk_part = torch.bmm(ds3.transpose(1, 2), q3[:, start:end])  # (BH, m, d)
                if dk is None and key_start == 0:  # the last block of full attention: every key
                    dk, dv = dk_part, dv_part
                else:
                    if dk is None:  # a sliding window: the last block sees the last keys only
                        dk, dv = torch.zeros_like(k3), torch.zeros_like(v3)
                    dk[:, keys] += dk_part
                    dv[:, keys] += dv_part
                dq[:, start:end] = torch.bmm(ds3, k3[:, keys]).view(B, H, n, d).transpose(1, 2)
                grad = None  # the causal mask alone (narrow_values_attention) needs none
                if mask_needs_grad:
                    grad = dscores.sum(0, keepdim=True) if mask_batch == 1 else dscores
                    grad = grad.to(mask_dtype)
                mask_grads.append(grad)
            dq.mul_(1 / math.sqrt(d))  # q3 was scaled
        dq_dtype, dk_dtype, dv_dtype = ctx.input_dtypes
        return (
            dq.transpose(1, 2).to(dq_dtype),
            dk.view(B, H, T, d).to(dk_dtype),
            dv.view(B, H, T, hs).to(dv_dtype),
            None,
            None,
            *reversed(mask_grads),
        )
