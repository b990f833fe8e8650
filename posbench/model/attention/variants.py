"""Attention whose logits z become weights otherwise than by a plain softmax: learned sink logits
(``model.attn_sinks``), sigmoid attention and stick-breaking attention (``model.attention``),
for every encoding (its biases of positions and content, its window) and at every length.

    softmax + sinks  w_ij = e^z_ij / (e^s_h + sum_l e^z_il): one learned logit s_h per head and
                     layer (0 at the start) joins the denominator with a value of 0 (gpt-oss; HF
                     transformers' gpt-oss ``eager_attention_forward``; x-transformers'
                     ``head_learned_sink``)
    sigmoid          w_ij = sigmoid(z_ij + b), b = -ln L with L = ``model.sigmoid_length``
                     (train.seq_len from the CLI), fixed: no normalisation over the keys (Ramapuram
                     et al. 2024, arXiv 2409.04431; x-transformers' ``Attend(sigmoid=True)``)
    stick_breaking   w_ij = sigmoid(z_ij) prod_{j<l<i} (1 - sigmoid(z_il)) for j < i, and the stick
                     left, prod_{l<i} (1 - sigmoid(z_il)), on the query's own value (Tan et al.
                     2024, arXiv 2410.17980; their kernel's tests add ``rem * v``; fla's
                     ``naive_stickbreaking_attn`` with attend_current=False): the nearest key breaks
                     the stick first, the weights of a query sum to 1

z is q.k / sqrt(hs) plus the encoding's biases, as for softmax; a key the causal mask or a
window hides has no weight and, in stick-breaking, breaks nothing.

Which path runs when:

    variant                     condition                           path
    --------------------------  ----------------------------------  ---------------------------
    sinks                       no score bias, no content bias, no  sink_attention: one fused
                                window                              SDPA call, times
                                                                    sigmoid(lse - s) (CPU, no
                                                                    dropout: SinkAttention), or
                                                                    the sink as one more key
    sinks                       a bias of the distance alone at     relative_bias_attention with
                                consecutive positions (or at        the sinks: its strided mask
                                randomized distances), in           on the flash kernel, times
                                evaluation on a CPU                 sigmoid(lse - s)
    sinks, sigmoid,             any other                           written_attention: blocks of
      stick_breaking                                                queries, z written out; in
                                                                    evaluation evaluated_block,
                                                                    over tiles of keys

sink_attention never writes (T, T): SDPA's CPU flash kernel returns each row's log-sum-exp
lse = ln sum_l e^z_il, and the output with the sink is the plain one times
e^lse / (e^lse + e^s) = sigmoid(lse - s). Its backward is the flash kernel's own, given the
output with the sink and the incoming gradient times sigmoid(lse - s) (see SinkAttention), so
nothing of (T, T) is kept either. Elsewhere (CUDA, or with dropout) the sink is a key of its
own: one more q/k dimension carries s (q's is sqrt(hs), every real key's 0), its value 0, and
a query of zeros in front keeps SDPA's causal kernel aligned (T + 1 queries and keys).

written_attention holds one block's bias and one tile's logits at a time in evaluation
(query_block_size keeps a block's under MAX_SCORE_ELEMENTS); with gradients autograd keeps
every block's (the (T, T) of the training length, as explicit_attention does).
Stick-breaking's weights and their gradient are one autograd node (StickBreaking), which keeps
the logits and weights only.
Everything is computed in float32 (float64 for float64 inputs), under bf16 autocast too.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings import PositionalEncoding

# Attributes of their modules: a test or benchmark that sets them sets them for all paths.
from posbench.model.attention import biases as block_biases
from posbench.model.attention import blocks, fused, tiles
from posbench.model.attention.biases import QueryBlockBiases
from posbench.model.attention.blocks import (
    causal_bias,
    hiding_window,
    join_blocks,
    outside_window,
    query_block_size,
)
from posbench.model.attention.relative_bias import relative_bias_attention


class AttentionVariant(nn.Module):
    """How one layer's attention turns its logits into weights: ``attention`` (softmax, sigmoid
    or stick_breaking), with a learned sink logit per head (``sinks``, softmax only) and
    sigmoid's length L (b = -ln L). Softmax without sinks (``plain``) holds no parameters: a
    model built without the options saves exactly the weights it did before they existed."""

    def __init__(
        self,
        n_head: int,
        attention: str = "softmax",
        sinks: bool = False,
        sigmoid_length: int | None = None,
    ) -> None:
        super().__init__()
        self.attention = attention
        self.sinks = nn.Parameter(torch.zeros(n_head)) if sinks else None  # (H,)
        self.sigmoid_bias = -math.log(sigmoid_length) if attention == "sigmoid" else 0.0

    @property
    def plain(self) -> bool:
        """Softmax without sinks: every path of posbench.model.attention computes it."""
        return self.attention == "softmax" and self.sinks is None

    def weights(self, scores: torch.Tensor, query_start: int, key_start: int = 0) -> torch.Tensor:
        """The weights (B, H, n, m) of queries from token ``query_start`` over keys from token
        ``key_start`` whose logits ``scores`` (B, H, n, m) hold -inf at every key hidden from
        the query (causal mask, window, padding), written out (posbench diagnose, a cached
        decode, written_attention)."""
        if self.attention == "sigmoid":
            return torch.sigmoid(scores + self.sigmoid_bias)
        if self.attention == "stick_breaking":
            weights, left = stick_breaking_weights(diagonal_hidden(scores, query_start, key_start))
            return with_own_weight(weights, left, query_start, key_start)
        if self.sinks is None:
            return torch.softmax(scores, dim=-1)
        sink = self.sinks.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]

    def attend(
        self,
        scores: torch.Tensor,
        values: torch.Tensor,
        own_values: torch.Tensor,
        query_start: int,
        key_start: int,
        dropout: float,
    ) -> torch.Tensor:
        """The output (B, H, n, hs) of queries from ``query_start`` whose logits over the keys
        from ``key_start`` are ``scores`` (B, H, n, m), -inf where hidden, for the keys' values
        (B, H, m, hs) and the queries' own (B, H, n, hs), with attention ``dropout`` on the
        weights."""
        if self.attention == "stick_breaking":
            hidden = diagonal_hidden(scores, query_start, key_start)
            return StickBreaking.apply(hidden, values, own_values, dropout)
        weights = F.dropout(self.weights(scores, query_start, key_start), dropout)
        return torch.matmul(weights, values)


def diagonal_hidden(scores: torch.Tensor, query_start: int, key_start: int) -> torch.Tensor:
    """``scores`` (..., n, m) of queries from ``query_start`` over keys from ``key_start``, with
    -inf at each query's own key too: stick-breaking's weights are over the keys before it."""
    return causal_bias(scores, query_start - 1, key_start)


def stick_breaking_weights(scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stick-breaking's weights (..., n, m) from ``scores`` (..., n, m) that hold -inf at every
    key a query does not attend to (its own among them), and the stick each query leaves,
    (..., n, 1). log w_ij = z_ij + sum_{l >= j} ln(1 - sigmoid(z_il)) over the keys l it sees
    (sigmoid(z) = e^z (1 - sigmoid(z))); ln(1 - sigmoid(-inf)) = 0, so a hidden key breaks
    nothing. The sums run from the nearest key back (a sum from the first key, subtracted from
    the row's total, would lose float32's precision at long lengths)."""
    log_kept = F.logsigmoid(-scores)  # ln(1 - sigmoid(z)), 0 at -inf
    from_nearest = log_kept.flip(-1).cumsum(-1).flip(-1)  # sum over l >= j
    weights = torch.exp(scores + from_nearest)
    return weights, from_nearest[..., :1].exp()


def with_own_weight(
    weights: torch.Tensor, left: torch.Tensor, query_start: int, key_start: int
) -> torch.Tensor:
    """Stick-breaking's ``weights`` (..., n, m) with the stick each query leaves, ``left``
    (..., n, 1), added at its own key (where the keys from ``key_start`` hold it)."""
    n, m = weights.shape[-2:]
    own = torch.arange(query_start, query_start + n, device=weights.device) - key_start  # (n,)
    columns = torch.arange(m, device=weights.device)
    return weights + left * (columns[None, :] == own[:, None])


class StickBreaking(torch.autograd.Function):
    """Stick-breaking attention's output from its logits, with a hand-written backward:
    ``StickBreaking.apply(scores, values, own_values, dropout)`` -> (B, H, n, hs), for logits
    (B, H, n, m) with -inf at every key hidden from a query (its own among them), the keys'
    values (B, H, m, hs) and the queries' own (B, H, n, hs). Autograd of the same computation
    kept six tensors of (n, m) and took 1.6x as long (one layer, forward and backward, at the
    tiny model's 32 x 128 tokens); this keeps the logits and the weights.

    With w = e^(z + c), c_j = sum_{l >= j} ln(1 - sigmoid(z_l)) and the stick left r = e^(c_0):
    g_j = dL/dw_j w_j; dL/dz_j = g_j - sigmoid(z_j) (sum_{l <= j} g_l + dL/dr r)."""

    @staticmethod
    def forward(
        ctx: Any,
        scores: torch.Tensor,
        values: torch.Tensor,
        own_values: torch.Tensor,
        dropout: float,
    ) -> torch.Tensor:
        weights, left = stick_breaking_weights(scores)  # (B, H, n, m), (B, H, n, 1)
        keep = keep_left = None
        if dropout:  # 0 or 1 / (1 - dropout): F.dropout's masks, kept for the backward
            keep = F.dropout(torch.ones_like(weights), dropout)
            keep_left = F.dropout(torch.ones_like(left), dropout)
        dropped, left_dropped = (
            (weights, left) if keep is None else (weights * keep, left * keep_left)
        )
        y = torch.matmul(dropped, values) + left_dropped * own_values
        ctx.save_for_backward(scores, weights, left, values, own_values, keep, keep_left)
        return y

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        scores, weights, left, values, own_values, keep, keep_left = ctx.saved_tensors
        dweights = torch.matmul(dy, values.transpose(-1, -2))  # (B, H, n, m)
        dleft = (dy * own_values).sum(-1, keepdim=True)  # (B, H, n, 1)
        if keep is not None:
            dweights.mul_(keep)
            dleft.mul_(keep_left)
        dropped = weights if keep is None else weights * keep
        left_dropped = left if keep is None else left * keep_left
        g = dweights.mul_(weights)  # dL/d(log w)
        # sum_{l <= j} g_l: each key's own and the farther ones'. At a hidden key g = 0 and
        # sigmoid(-inf) = 0: its gradient is 0.
        to_farthest = g.cumsum(-1)
        dscores = g - torch.sigmoid(scores) * (to_farthest + dleft * left)
        dvalues = torch.matmul(dropped.transpose(-1, -2), dy)
        return dscores, dvalues, left_dropped * dy, None


class SinkAttention(torch.autograd.Function):
    """Causal softmax attention with a sink logit per head on SDPA's CPU flash kernel:
    ``SinkAttention.apply(q, k, v, sinks)`` -> (B, H, T, hs), for q, k, v (B, H, T, hs) and
    sinks (H,), all in one float dtype.

    Forward: y, lse = flash(q, k, v); g = sigmoid(lse - s); the output is o = g y. Backward: the
    flash kernel's backward computes dS = P (dP - D) with D = rowsum(dY o'), from the output o'
    it is given; given o and the incoming gradient times g, D = g^2 rowsum(dO y), which is
    g rowsum(dO y) less the gradient through lse, c = g (1 - g) rowsum(dO y): the gradient
    through lse (c P on the logits) comes with the kernel's own. ds_h = -sum_i c_i."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor
    ) -> torch.Tensor:
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        y, lse = flash(q, k, v, is_causal=True)  # (B, H, T, hs), (B, H, T)
        gate = torch.sigmoid(lse - sinks[:, None])[..., None]  # (B, H, T, 1)
        out = y * gate
        ctx.save_for_backward(q, k, v, out, lse, gate)
        return out

    @staticmethod
    def backward(ctx: Any, dout: torch.Tensor) -> tuple[torch.Tensor, ...]:
        q, k, v, out, lse, gate = ctx.saved_tensors
        backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward
        dout = dout.contiguous()
        dq, dk, dv = backward(dout * gate, q, k, v, out, lse, 0.0, True)
        dsinks = -((1 - gate) * (dout * out).sum(-1, keepdim=True)).sum((0, 2, 3))  # (H,)
        return dq, dk, dv, dsinks


def sink_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """Causal softmax attention of q, k (B, H, T, d) and v (B, H, T, hs), hs <= d (PoPE's q and k
    are wider), with the sink logits ``sinks`` (H,) and no bias -> (B, H, T, hs), without writing
    (T, T) (see the module's docstring), in sdpa_dtype(q)."""
    dtype = fused.sdpa_dtype(q)
    B, H, T, d = q.shape
    hs = v.shape[-1]
    with torch.autocast(q.device.type, enabled=False):
        queries, keys, values = (t.to(dtype) for t in (q, k, v))
        if hs < d:  # the flash kernel takes one width: v's zeros past hs give outputs of 0
            values = F.pad(values, (0, d - hs))
        logits = sinks.to(dtype)
        if q.device.type in fused.LOG_SUM_EXP_DEVICES and not dropout:
            return SinkAttention.apply(queries, keys, values, logits)[..., :hs].to(q.dtype)
        # The sink as key 0 (one more dimension, s) with a value of 0, after a query of zeros.
        queries = F.pad(
            torch.cat([queries, queries.new_full((B, H, T, 1), d**0.5)], -1), (0, 0, 1, 0)
        )
        sink = torch.cat([keys.new_zeros(H, d), logits[:, None]], -1)  # (H, d + 1)
        keys = torch.cat([sink[:, None].expand(B, H, 1, d + 1), F.pad(keys, (0, 1))], dim=2)
        values = F.pad(values, (0, 1, 1, 0))  # (B, H, T + 1, d + 1): as wide as q
        y = F.scaled_dot_product_attention(
            queries, keys, values, dropout_p=dropout, is_causal=True, scale=d**-0.5
        )  # (B, H, T + 1, d + 1)
    return y[:, :, 1:, :hs].to(q.dtype)


def variant_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float,
    biases: QueryBlockBiases | None,
    content: object | None,
    variant: AttentionVariant,
) -> torch.Tensor:
    """causal_attention's result with ``variant``'s weights (not ``plain``),
    for its arguments -> (B, H, T, hs): the module docstring's table says which path."""
    unbiased = not (encoding.has_score_bias or content is not None)
    windowed = hiding_window(encoding, q.shape[2]) is not None
    if variant.attention == "softmax" and unbiased and not windowed:
        return sink_attention(q, k, v, variant.sinks, dropout)
    sinks_in_parts = variant.attention == "softmax" and fused.merges_by_log_sum_exp(q, dropout)
    if sinks_in_parts and encoding.has_score_bias and not (content is not None or windowed):
        if biases is None:
            biases = QueryBlockBiases(encoding, keep_elements=0)
        bias = biases.consecutive_bias(positions)  # a bias of the distance alone: no (T, T)
        if bias is not None:
            return relative_bias_attention(q, k, v, bias, 0.0, variant.sinks)
    return written_attention(q, k, v, positions, encoding, dropout, biases, content, variant)


def written_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float,
    biases: QueryBlockBiases | None,
    content: object | None,
    variant: AttentionVariant,
) -> torch.Tensor:
    """Causal attention of q, k, v (B, H, T, hs) at ``positions`` with ``variant``'s weights, per
    block of queries [s, e) over keys [0, e) (with a window of w tokens, [s - w + 1, e)): the
    logits written out with the encoding's biases (of positions from ``biases``, at its
    randomized distances where it has them; of the content from ``content``), the causal and
    window masks -> (B, H, T, hs). Gradients by autograd (stick-breaking's by StickBreaking);
    without gradients and dropout, each block takes evaluated_block."""
    B, H, T, hs = q.shape
    window = hiding_window(encoding, T)
    dtype = torch.promote_types(q.dtype, torch.float32)
    most_keys = T if window is None else min(T, blocks.QUERY_BLOCK + window - 1)
    block = query_block_size(B, H, most_keys)
    if biases is None:
        biases = QueryBlockBiases(encoding, keep_elements=0)
    spans = [
        (start, min(start + block, T), 0 if window is None else max(0, start - window + 1))
        for start in reversed(range(0, T, block))
    ]
    from_content = None
    if content is not None and torch.is_grad_enabled():  # kept for the backward anyway: at once
        slices = [(slice(start, end), slice(first, end)) for start, end, first in spans]
        from_content = encoding.content_biases(content, slices)
    table = biases.consecutive_bias(positions) if biases.distances is not None else None
    evaluating = not (torch.is_grad_enabled() or dropout)
    outputs = []
    with torch.autocast(q.device.type, enabled=False):
        queries, keys, values = q.to(dtype) * hs**-0.5, k.to(dtype), v.to(dtype)
        for index, (start, end, first) in enumerate(spans):
            bias = None  # ([B|1], H, n, m): the encoding's, without the masks
            if table is not None:  # randomized distances: the table at each pair's distance
                apart = torch.arange(start, end)[:, None] - torch.arange(first, end)[None, :]
                bias = table[..., apart.clamp(min=0).to(q.device)].to(dtype)
            elif encoding.has_score_bias:
                query_positions = positions[..., start:end]
                key_positions = positions[..., first:end]
                size = H * block * most_keys
                bias = biases.bias(start, query_positions, key_positions, dtype, size)
            if content is not None:
                extra = (
                    from_content[index]
                    if from_content is not None
                    else encoding.content_bias(content, slice(start, end), slice(first, end))
                ).to(dtype)
                bias = extra if bias is None else bias + extra
            block_queries, own = queries[:, :, start:end], values[:, :, start:end]
            block_keys, block_values = keys[:, :, first:end], values[:, :, first:end]
            if evaluating:
                outputs.append(
                    evaluated_block(
                        variant,
                        block_queries,
                        block_keys,
                        block_values,
                        own,
                        bias,
                        start,
                        first,
                        window,
                    )
                )
                continue
            scores = torch.matmul(block_queries, block_keys.transpose(-1, -2))
            if bias is not None:
                scores = scores + bias
            scores = causal_bias(scores, start, first)
            if window is not None:
                scores = outside_window(scores, start, first, window)
            outputs.append(variant.attend(scores, block_values, own, start, first, dropout))
    return join_blocks(outputs).to(q.dtype)


def evaluated_block(
    variant: AttentionVariant,
    queries: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    own_values: torch.Tensor,
    bias: torch.Tensor | None,
    query_start: int,
    key_start: int,
    window: int | None,
) -> torch.Tensor:
    """written_attention's block without gradients: queries (B, H, n, hs), scaled, from token
    ``query_start``; keys and values (B, H, m, hs) from ``key_start``; the queries' own values;
    the encoding's ``bias`` ([B|1], H, n, m) or None -> (B, H, n, hs).

    Sigmoid's weights need no normalisation and stick-breaking's only the stick the nearer keys
    left: both run over tiles of keys (tiles.py: KEY_TILE, STICK_TILE), nearest first,
    stick-breaking carrying the log of the stick left (each farther weight is at most that
    stick: once it is below float's smallest subnormal in every row, every farther weight is 0
    and the tiles stop: stick_breaking_block). Sinks take
    SDPA's CPU flash kernel with the bias and masks as its mask, times sigmoid(lse - s)."""
    n, m = queries.shape[2], keys.shape[2]
    if variant.attention == "softmax":  # sinks with a bias or a window
        mask = bias if bias is not None else queries.new_zeros(1, 1, n, m)
        mask = causal_bias(mask, query_start, key_start)
        if window is not None:
            mask = outside_window(mask, query_start, key_start, window)
        if queries.device.type not in fused.LOG_SUM_EXP_DEVICES:
            return variant.attend(
                torch.matmul(queries, keys.transpose(-1, -2)) + mask,
                values,
                own_values,
                query_start,
                key_start,
                0.0,
            )
        flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        y, lse = flash(
            queries, keys, values, attn_mask=mask.expand(-1, queries.shape[1], -1, -1), scale=1.0
        )
        return y * torch.sigmoid(lse - variant.sinks.to(lse.dtype)[:, None])[..., None]
    if variant.attention == "stick_breaking":
        return tiles.stick_breaking_block(
            queries, keys, values, own_values, bias, query_start, key_start, window
        )
    return tiles.sigmoid_block(
        queries, keys, values, bias, query_start, key_start, window, variant.sigmoid_bias
    )


def two_sided_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    bias_of_block: Any,
    padding: torch.Tensor | None,
    dropout: float,
    variant: AttentionVariant,
) -> torch.Tensor:
    """Attention both ways (model.causal=false) of q, k, v (B, H, T, hs) with ``variant``'s
    weights (sinks or sigmoid), per block of queries over every key: ``bias_of_block(start,
    end)`` gives the encoding's two-sided bias of queries [start, end) (([B|1], H, n, T), or
    None), ``padding`` (B, 1, 1, T) -inf at each row's keys past its end -> (B, H, T, hs)."""
    B, H, T, hs = q.shape
    dtype = torch.promote_types(q.dtype, torch.float32)
    block = query_block_size(B, H, T)
    outputs = []
    with torch.autocast(q.device.type, enabled=False):
        queries, keys, values = q.to(dtype) * hs**-0.5, k.to(dtype), v.to(dtype)
        for start in reversed(range(0, T, block)):
            end = min(start + block, T)
            scores = torch.matmul(queries[:, :, start:end], keys.transpose(-1, -2))
            bias = bias_of_block(start, end)
            if bias is not None:
                scores = scores + bias.to(dtype)
            if padding is not None:
                scores = scores + padding.to(dtype)
            outputs.append(
                variant.attend(scores, values, values[:, :, start:end], start, 0, dropout)
            )
    return join_blocks(outputs).to(q.dtype)


def scratch_elements(
    encoding: PositionalEncoding, batch_size: int, length: int, attention: str
) -> int:
    """An upper estimate of the elements written_attention (or sink_attention) holds under
    inference mode besides q, k, v and its output, for ``batch_size`` sequences of ``length``
    tokens (posbench.model.attention.attention_scratch_elements' counterpart): q, k, v in float32
    (3*C per token, counted twice for a 16-bit model), one block's logits with the encoding's
    bias and their masked copies and weights (at most 8 per score; stick-breaking 10), the
    blocks' outputs, and the layers' shared biases."""
    H, C = encoding.n_head, encoding.d_model
    window = hiding_window(encoding, length)
    keys = length if window is None else min(length, blocks.QUERY_BLOCK + window - 1)
    block = query_block_size(batch_size, H, keys)
    per_score = 10 if attention == "stick_breaking" else 8
    shared = min(block_biases.SHARED_BIAS_ELEMENTS, H * length * (keys + block) // 2)
    return 8 * batch_size * length * C + per_score * batch_size * H * block * keys + shared
