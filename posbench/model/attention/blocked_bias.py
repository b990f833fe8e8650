"""``blocked_bias_attention``: any score bias (of both positions, at positions with gaps, of the
content: CoPE, FoX where key_bias_attention does not take it) or a window, the bias computed per
block of queries with the causal mask folded in; in evaluation on a CPU without a window the
blocks take ``past_and_diagonal_attention``, where SDPA's kernel masks the diagonal itself.
"""

from __future__ import annotations

import torch

from posbench.encodings import PositionalEncoding
from posbench.encodings.base import distance_grid

# blocks.QUERY_BLOCK as an attribute: set in one place for every path (the package's docstring)
from posbench.model.attention import blocks
from posbench.model.attention.biases import QueryBlockBiases
from posbench.model.attention.blocks import (
    causal_bias,
    hiding_window,
    join_blocks,
    outside_window,
    query_block_size,
)
from posbench.model.attention.explicit import explicit_attention
from posbench.model.attention.fused import (
    fused_attention,
    mask_dtype,
    merge_by_log_sum_exp,
    merged_with_log_sum_exp,
    merges_by_log_sum_exp,
    unbiased_causal_attention,
)


def blocked_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
    content: object | None = None,
) -> torch.Tensor:
    """causal_attention for any score bias, from the encoding's score_bias and content_bias
    (``content``: its content_state; with gradients content_biases, every block's at once):
    each block of queries [s, e) attends to keys [0, e) only (later keys are all in its future;
    with a window of w tokens, keys [s - w + 1, e)), with the bias and the causal mask folded
    into one float mask of (1, H, e - s, e), or (B, H, e - s, e) for positions (B, T) or a bias
    from the content. The blocks' biases of positions come from ``biases`` (shared by the
    layers of one forward pass; by default, this call's own).

    Blocks run from the last (the most keys) to the first: each block's temporaries then fit
    in memory the previous block freed, where growing ones made glibc's heap grow (measured at
    16,384 tokens: 0.7-1.0 GB added by the forward pass in first-to-last order, 0.4 GB now).
    """
    B, H, T, _ = q.shape
    window = hiding_window(encoding, T)
    # A bias of trained parameters (or of q and k), in training: explicit_attention.
    explicit = torch.is_grad_enabled() and (
        content is not None or any(p.requires_grad for p in encoding.parameters())
    )
    dtype = mask_dtype(q, explicit)
    most_keys = T if window is None else min(T, blocks.QUERY_BLOCK + window - 1)
    block = query_block_size(B, H, most_keys, explicit)
    if biases is None:
        biases = QueryBlockBiases(encoding, keep_elements=0)
    assert biases.distances is None, "randomized distances take relative_bias_attention"
    # Attended in the masks' dtype (explicit_attention casts them itself): (B, H, T, hs) each.
    attended = (q, k, v) if explicit else tuple(t.to(dtype) for t in (q, k, v))
    # Past keys need no mask but the bias when every one of them is in view (no window).
    in_parts = window is None and merges_by_log_sum_exp(q, dropout)
    if in_parts and content is not None and not explicit:
        block = min(block, blocks.CONTENT_QUERY_BLOCK)
    # Each block's queries [start, end) and first key, the last block first.
    spans = [
        (start, min(start + block, T), 0 if window is None else max(0, start - window + 1))
        for start in reversed(range(0, T, block))
    ]
    # With gradients, a bias of the distance alone at consecutive positions shared by the batch
    # is laid out per block from its table (H, T), computed once (distance_grid), not by the
    # encoding's score_bias per block, forward and backward; the one the content state holds
    # (DAPE's) where it has one, not computed (and backpropagated through) a second time.
    table = None
    if explicit and encoding.has_score_bias and positions.dim() == 1:
        held = None if content is None else encoding.content_table(content)
        table = held if held is not None else biases.consecutive_bias(positions)
    # With gradients every block's bias from the content is kept for the backward: asked at once.
    from_content = None
    if explicit and content is not None:
        block_slices = [(slice(start, end), slice(first, end)) for start, end, first in spans]
        from_content = encoding.content_biases(content, block_slices)
    outputs, masks, key_starts = [], [], []
    for index, (start, end, first) in enumerate(spans):
        query_positions, key_positions = positions[..., start:end], positions[..., first:end]
        # ([B|1], H, n, m); a buffer for the bias of a block of queries holds H * block * T.
        # Only an encoding with a bias of positions is asked for one: the default score_bias reads
        # the positions' range (a device sync, and a graph break under torch.compile) for None.
        bias = None
        if table is not None:
            bias = distance_grid(table, query_positions, key_positions).to(dtype)[None]
        elif encoding.has_score_bias:
            bias = biases.bias(start, query_positions, key_positions, dtype, H * block * T)
        far = None  # the content's bias at the keys before its own, one per query
        if content is not None:  # (B, H, n, m), or (B, H, n, c) of the last c keys and far
            queries_slice, keys_slice = slice(start, end), slice(first, end)
            if from_content is not None:
                extra = from_content[index]
            elif in_parts and bias is None:  # attended in parts: the far keys need no mask
                far, extra = encoding.content_bias_parts(content, queries_slice, keys_slice)
            else:
                extra = encoding.content_bias(content, queries_slice, keys_slice)
            bias = extra.to(dtype) if bias is None else bias + extra.to(dtype)
        if bias is None and window is None:  # the encoding adds no bias at all: no mask
            return unbiased_causal_attention(q, k, v, dropout)
        if bias is None:  # only the window's mask
            bias = q.new_zeros(1, H, end - start, end - first, dtype=dtype)
        q_in, k_in, v_in = attended
        queries, keys, values = q_in[:, :, start:end], k_in[:, :, first:end], v_in[:, :, first:end]
        if in_parts:  # only the diagonal square [s, e) needs the causal mask
            far = None if far is None else far.to(dtype)
            outputs.append(past_and_diagonal_attention(queries, keys, values, bias, far))
            continue
        mask = causal_bias(bias, start, first)
        if window is not None:  # keys w or more tokens before a query are out of view
            mask = outside_window(mask, start, first, window)
        if explicit:
            masks.append(mask)
            key_starts.append(first)
        else:
            outputs.append(fused_attention(queries, keys, values, mask, dropout))
    if explicit:
        return explicit_attention(q, k, v, masks[::-1], dropout, key_starts[::-1])
    return join_blocks(outputs).to(q.dtype)


def past_and_diagonal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor,
    far: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of a block of queries q (B, H, n, hs), the last n of keys k, v (B, H, Tk, hs),
    with the score ``bias`` ([B|1], H, n, c) of the last c of the keys, c >= n, and the causal
    mask -> (B, H, n, hs), without writing the masked bias. ``far`` ([B|1], H, n): the bias of
    each query at every key before those c, the same for all (content_bias_parts); None when
    c is all of them.

    The past keys (the bias read in place) and the diagonal square (SDPA's CPU flash kernel
    masks it itself, is_causal, and adds the bias's square read in place) are two calls whose
    outputs are merged exactly by their log-sum-exps (merge_by_log_sum_exp); the first block has
    no past keys. Folding the causal mask in with torch.where first took 1.4 ms per block of
    256 queries (4 heads) where the kernel's own mask takes 0.8 (AMD EPYC Zen 4, one thread).
    The far keys are a third call without a mask, ``far`` added to its log-sum-exp (a constant
    of a row's logits leaves its softmax as it is): no mask is written or read for them.
    CPU only (that kernel returns the log-sum-exp), without gradients; q, k, v in the bias's
    dtype.
    """
    before = k.shape[2] - bias.shape[-1]  # the far keys
    past = bias.shape[-1] - q.shape[2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    near_k, near_v = k[:, :, before:], v[:, :, before:]
    diagonal = bias[..., past:]
    y, lse = flash(q, near_k[:, :, past:], near_v[:, :, past:], is_causal=True, attn_mask=diagonal)
    if past:
        y_past, lse_past = flash(
            q, near_k[:, :, :past], near_v[:, :, :past], attn_mask=bias[..., :past]
        )
        y, lse = merged_with_log_sum_exp(y_past, lse_past, y, lse)
    if before:
        assert far is not None, "a bias of the last keys only needs far's"
        y_far, lse_far = flash(q, k[:, :, :before], v[:, :, :before])
        y = merge_by_log_sum_exp(y_far, lse_far + far, y, lse)
    return y
