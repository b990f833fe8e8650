"""``relative_bias_attention``: a bias of the distance alone at consecutive positions (ALiBi, T5,
KERPLE: the encoding's ``consecutive_bias``) on SDPA's kernel, each query block's mask a strided
(Hankel) view of one row of distances, where flex_attention_bias does not run.
"""

from __future__ import annotations

import torch

from posbench.model.attention.blocks import join_blocks, query_block_size
from posbench.model.attention.explicit import explicit_attention
from posbench.model.attention.fused import attention_with_sinks, fused_attention, mask_dtype


def relative_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    dropout: float = 0.0,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of q, k, v (B, H, T, hs) at consecutive positions with the score bias
    ``bias[h, i - j]`` given at distances 0..T-1 (H, T), or ``bias[b, h, i - j]`` (B, H, T) with
    a row per sequence (randomized distances) -> (B, H, T, hs).

    With the keys in reverse order, the bias of query a and reversed key c of a block is a
    function of a + c (a Hankel matrix), which is a strided view of one row of distances
    (``unfold``): no (H, Tq, Tk) tensor is ever written, and SDPA's fused kernel reads the view.
    Softmax does not depend on the order of the keys. Each block of queries [s, e) attends to
    keys [0, e); the future keys of its diagonal square get distances below 0, whose bias is
    -inf: the causal mask comes with the same view. A bias that needs a gradient (a learned
    one, in training) is written out in key order instead, for explicit_attention. ``sinks``
    (H,): a sink logit per head (model.attn_sinks), in evaluation on a CPU only
    (attention_with_sinks).
    """
    B, H, T, _ = q.shape
    trainable = torch.is_grad_enabled() and bias.requires_grad
    block = query_block_size(B, H, T, explicit=trainable)
    dtype = mask_dtype(q, explicit=trainable)
    bias = bias.to(dtype)  # ([B,] H, T)
    future = bias.new_full((*bias.shape[:-1], block - 1), float("-inf"))
    # ([B,] H, block - 1 + T): distances -(block - 1)..T-1
    padded = torch.cat([future, bias], dim=-1)

    def hankel(start: int, end: int) -> torch.Tensor:
        # Query start + a and key end - 1 - c are a + c - (n - 1) apart: row a of the mask is
        # the distances from a - (n - 1) on.
        distances = padded[..., block - (end - start) : block - 1 + end]  # ([B,] H, n - 1 + end)
        mask = distances.unfold(-1, end, 1)  # ([B,] H, n, end), strides (..., 1, 1)
        return mask if mask.dim() == 4 else mask[None]

    starts = range(0, T, block)
    if trainable:  # keys 0 .. end - 1, each block's bias written out: (1, H, n, end)
        masks = [hankel(start, min(start + block, T)).flip(-1) for start in starts]
        return explicit_attention(q, k, v, masks, dropout)
    # Key T - 1 - c at index c; q, k, v in sdpa_dtype: (B, H, T, hs) each.
    queries, keys, values = q.to(dtype), k.flip(2).to(dtype), v.flip(2).to(dtype)
    outputs = []
    for start in reversed(starts):  # the last block first (see blocked_bias_attention)
        end = min(start + block, T)
        parts = (queries[:, :, start:end], keys[:, :, T - end :], values[:, :, T - end :])
        if sinks is not None:
            outputs.append(attention_with_sinks(*parts, hankel(start, end), sinks))
            continue
        outputs.append(fused_attention(*parts, hankel(start, end), dropout))
    return join_blocks(outputs).to(q.dtype)
