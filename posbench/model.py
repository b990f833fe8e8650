"""A small decoder-only transformer whose positional encoding is pluggable.

Read top to bottom: attention -> MLP -> block -> ModelArgs -> Transformer. The model asks its
encoding (posbench.encodings.base.PositionalEncoding) to embed, rotate and bias, and never
branches on which encoding it has.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from posbench.encodings import PositionalEncoding, build_encoding
from posbench.errors import PosbenchError

if TYPE_CHECKING:  # importing flex_attention imports torch._dynamo: seconds per process start
    from torch.nn.attention.flex_attention import BlockMask

VOCAB_SIZE = 256  # byte-level: every corpus is read as raw bytes, no tokenizer to download


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoding: PositionalEncoding,
        biases: QueryBlockBiases | None = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        q = encoding.rotate(q, positions)  # (B, nh, T, hs)
        k = encoding.rotate(k, positions)
        dropout = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, positions, encoding, dropout, biases)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


# A score bias cannot use SDPA's fused causal kernel: SDPA takes it as a float mask of (H, queries,
# keys). A bias of the distance alone (ALiBi, T5, KERPLE: the encoding's relative_bias) never
# needs that tensor written (relative_bias_attention). Any other bias is built per block of
# queries, each block's bias and scores kept under this many elements (64 MiB in float32): at
# evaluation lengths a whole (H, T, T) tensor is gigabytes (4 heads at 16,384 tokens: 4 GiB).
MAX_SCORE_ELEMENTS = 2**24
# At most this many queries per SDPA call with a bias: each call also computes the future half
# of its block's diagonal square (and the bias there), so smaller blocks waste less work,
# larger ones make fewer calls.
QUERY_BLOCK = 256
# At most this many queries per block of explicit_attention (a bias that needs a gradient:
# training T5, KERPLE, FIRE). Each block computes, then discards, the scores of its future keys,
# twice in the backward pass, and the explicit path has no fused kernel to skip them: at 128
# tokens, blocks of 32 skip 3/8 of that work. One layer at 32 x 128 tokens, 4
# heads, forward and backward: 56.8 ms with blocks of 32, 63.9 with 64, 77.3 with one block
# (NoPE's fused kernel 53.1 ms); 32 was also the fastest at 8 x 512 and 64 x 64 tokens, and 16
# slower (more calls).
EXPLICIT_QUERY_BLOCK = 32
# The device types on which a bias of the distance alone takes flex_attention_bias (one fused
# kernel that torch.compile generates, reading the bias table) instead of relative_bias_attention.
# CPUs keep the SDPA paths: they were measured faster there, and in torch 2.13 flex_attention
# has no backward on a CPU. The one place the choice is made; tests override it.
FLEX_ATTENTION_DEVICES = frozenset({"cuda"})


def query_block_size(batch: int, n_head: int, length: int, explicit: bool = False) -> int:
    """Queries per attention call with a bias: at most QUERY_BLOCK (EXPLICIT_QUERY_BLOCK for
    ``explicit`` attention), and few enough that their scores fit MAX_SCORE_ELEMENTS."""
    most = EXPLICIT_QUERY_BLOCK if explicit else QUERY_BLOCK
    return max(1, min(length, most, MAX_SCORE_ELEMENTS // (batch * n_head * length)))


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + encoding's score bias + causal mask) v, for q, k, v of
    (B, H, T, hs) at increasing ``positions`` (T,) or (B, T) -> (B, H, T, hs); ``biases``: the
    query blocks' biases shared by the layers of a forward pass (blocked_bias_attention).

    Without a bias this is one fused causal SDPA call, which never builds a (T, T) mask. A bias
    of the distance alone at consecutive positions (the encoding's consecutive_bias) takes
    flex_attention_bias on the FLEX_ATTENTION_DEVICES (without attention dropout, which
    flex_attention lacks), else relative_bias_attention; any other bias takes
    blocked_bias_attention.
    """
    if not encoding.has_score_bias:
        return unbiased_causal_attention(q, k, v, dropout)
    consecutive = bool((positions.diff() == 1).all())
    bias = encoding.consecutive_bias(positions) if consecutive else None
    if bias is not None:
        if q.device.type in FLEX_ATTENTION_DEVICES and not dropout:
            return flex_attention_bias(q, k, v, bias)
        return relative_bias_attention(q, k, v, bias.to(q.dtype), dropout)
    return blocked_bias_attention(q, k, v, positions, encoding, dropout, biases)


def relative_bias_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """Causal attention of q, k, v (B, H, T, hs) at consecutive positions with the score bias
    ``bias[h, i - j]`` given at distances 0..T-1 (H, T) -> (B, H, T, hs).

    With the keys in reverse order, the bias of query a and reversed key c of a block is a
    function of a + c (a Hankel matrix), which is a strided view of one row of distances
    (``unfold``): no (H, Tq, Tk) tensor is ever written, and SDPA's fused kernel reads the view.
    Softmax does not depend on the order of the keys. Each block of queries [s, e) attends to
    keys [0, e); the future keys of its diagonal square get distances below 0, whose bias is
    -inf: the causal mask comes with the same view. A bias that needs a gradient (a learned
    one, in training) is written out in key order instead, for explicit_attention.
    """
    B, H, T, _ = q.shape
    trainable = torch.is_grad_enabled() and bias.requires_grad
    block = query_block_size(B, H, T, explicit=trainable)
    future = bias.new_full((H, block - 1), float("-inf"))
    padded = torch.cat([future, bias], dim=1)  # (H, block - 1 + T): distances -(block - 1)..T-1

    def hankel(start: int, end: int) -> torch.Tensor:
        # Query start + a and key end - 1 - c are a + c - (n - 1) apart: row a of the mask is
        # the distances from a - (n - 1) on.
        distances = padded[:, block - (end - start) : block - 1 + end]  # (H, n - 1 + end)
        return distances.unfold(1, end, 1)[None]  # (1, H, n, end), strides (., ., 1, 1)

    starts = range(0, T, block)
    if trainable:  # keys 0 .. end - 1, each block's bias written out: (1, H, n, end)
        masks = [hankel(start, min(start + block, T)).flip(-1) for start in starts]
        return explicit_attention(q, k, v, masks, dropout)
    k, v = k.flip(2), v.flip(2)  # key T - 1 - c at index c
    outputs = []
    for start in reversed(starts):  # the last block first (see blocked_bias_attention)
        end = min(start + block, T)
        queries, keys, values = q[:, :, start:end], k[:, :, T - end :], v[:, :, T - end :]
        outputs.append(
            F.scaled_dot_product_attention(
                queries, keys, values, attn_mask=hankel(start, end), dropout_p=dropout
            )
        )
    return join_blocks(outputs)


def flex_attention_bias(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, compiled: bool = True
) -> torch.Tensor:
    """relative_bias_attention's result from one flex_attention call (FlexAttention, Dong et al.
    2024, https://arxiv.org/abs/2412.05496): q, k, v (B, H, T, hs) at consecutive positions and
    the bias table ``bias[h, i - j]`` at distances 0..T-1 (H, T) -> (B, H, T, hs).

    Its score_mod adds the table entry of each score's distance inside the fused kernel, and a
    causal BlockMask skips the key blocks wholly in a query block's future: no scores or bias of
    (T, T) are written, forward or backward, and a learned table (T5, KERPLE) gets its gradient
    through the lookup. The table stays float32 under bf16 autocast: rounded to bf16, ALiBi's
    flattest head's bias at 16,384 tokens (about -64) could move by 0.25. ``compiled=False``
    runs flex_attention's unfused implementation (tests), which writes the (B, H, T, T) scores.
    """
    from torch.nn.attention.flex_attention import flex_attention

    table = bias.float()  # (H, T)

    def add_bias(
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        # Future keys (negative distances) are masked by the block mask; clamped, their lookup
        # stays inside the table.
        return score + table[h, (q_idx - kv_idx).clamp(min=0)]

    # In a compiled model (train.compile) the model's compilation fuses flex_attention itself.
    fused = compiled and not torch.compiler.is_compiling()
    attention = compiled_flex_attention() if fused else flex_attention
    # The mask is built eagerly (and cached) even when called from a compiled model.
    mask = torch.compiler.disable(causal_block_mask)(q.shape[2], q.device)
    return attention(q, k, v, score_mod=add_bias, block_mask=mask)


@functools.cache
def compiled_flex_attention() -> Callable[..., torch.Tensor]:
    """flex_attention compiled once per process: uncompiled, it writes the whole (B, H, T, T)
    scores. torch.compile caches a kernel per score_mod code and input shapes, so every layer
    and step reuses it."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def causal(
    b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
) -> torch.Tensor:
    """flex_attention's mask_mod of causal attention: a query sees its own and earlier keys."""
    return q_idx >= kv_idx


@functools.lru_cache(maxsize=16)
def causal_block_mask(length: int, device: torch.device) -> BlockMask:
    """The causal BlockMask of ``length`` queries and keys, shared by every batch and head
    (create_block_mask evaluates ``causal`` on the whole (T, T) grid once, hence the cache)."""
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(causal, None, None, length, length, device=device)


def explicit_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    masks: list[torch.Tensor],
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + mask) v for q, k, v (B, H, T, hs), in blocks of queries whose
    additive float masks ([B|1], H, n, e) need a gradient (a learned bias, in training): masks[i]
    is the i-th block's, queries [e - n, e) and keys [0, e); the blocks cover the queries in
    order, the last one ending at T -> (B, H, T, hs).

    SDPA's fused CPU kernel gives no gradient for a mask, and its unfused fallback is slower
    than this computation. ExplicitAttention writes the gradients itself rather than leave
    them to autograd, which copied each block's slices of q, k and v and zero-filled and
    summed their gradients into full-size tensors. One attention layer (4 heads, d 128),
    forward and backward, as a multiple of NoPE's time with the fused causal kernel: at 32 x 128
    tokens 1.08x (autograd's computation 1.12-1.19x), at 16 x 256 1.06x (1.29x), at 8 x 512
    0.97x (1.11x).
    """
    return ExplicitAttention.apply(q, k, v, dropout, *masks)


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
        *masks: torch.Tensor,
    ) -> torch.Tensor:
        B, H, T, hs = q.shape
        dtype = torch.promote_types(q.dtype, torch.float32)
        with torch.autocast(q.device.type, enabled=False):
            q3, k3, v3 = (t.to(dtype).reshape(B * H, T, hs) for t in (q, k, v))
            q3 = q3 * (1 / math.sqrt(hs))
            y = q.new_empty(B, T, H, hs, dtype=dtype)
            weights, keeps = [], []
            for mask in masks:
                n, end = mask.shape[-2:]
                start = end - n
                scores = torch.bmm(q3[:, start:end], k3[:, :end].transpose(1, 2))  # (BH, n, e)
                w = torch.softmax(scores.view(B, H, n, end).add_(mask), dim=-1)
                weights.append(w)
                if dropout:  # 0 or 1 / (1 - dropout): F.dropout's mask, kept for the backward
                    keeps.append(F.dropout(torch.ones_like(w), dropout))
                    w = w * keeps[-1]
                part = torch.bmm(w.view(B * H, n, end), v3[:, :end])  # (BH, n, hs)
                y[:, start:end] = part.view(B, H, n, hs).transpose(1, 2)
        ctx.save_for_backward(q3, k3, v3, *weights, *keeps)
        ctx.input_dtypes = [t.dtype for t in (q, k, v)]
        ctx.masks = [(m.shape[0], m.dtype) for m in masks]
        return y.transpose(1, 2).to(q.dtype)  # (B, H, T, hs)

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q3, k3, v3, *saved = ctx.saved_tensors
        blocks = len(ctx.masks)
        weights, keeps = saved[:blocks], saved[blocks:] or [None] * blocks
        BH, T, hs = q3.shape
        B, H = dy.shape[:2]
        with torch.autocast(dy.device.type, enabled=False):
            dy3 = dy.to(q3.dtype).reshape(BH, T, hs)
            dq = dy3.new_empty(B, T, H, hs)
            dk = dv = None
            mask_grads = []
            for w, keep, (mask_batch, mask_dtype) in reversed(
                list(zip(weights, keeps, ctx.masks, strict=True))
            ):
                n, end = w.shape[-2:]
                start = end - n
                dropped = w if keep is None else w * keep
                dv_part = torch.bmm(dropped.view(BH, n, end).transpose(1, 2), dy3[:, start:end])
                dw = torch.bmm(dy3[:, start:end], v3[:, :end].transpose(1, 2)).view(B, H, n, end)
                if keep is not None:
                    dw.mul_(keep)
                dscores = torch._softmax_backward_data(dw, w, -1, w.dtype)  # (B, H, n, e)
                ds3 = dscores.view(BH, n, end)
                dk_part = torch.bmm(ds3.transpose(1, 2), q3[:, start:end])  # (BH, e, hs)
                if dk is None:  # the last block: every key
                    dk, dv = dk_part, dv_part
                else:
                    dk[:, :end] += dk_part
                    dv[:, :end] += dv_part
                dq[:, start:end] = torch.bmm(ds3, k3[:, :end]).view(B, H, n, hs).transpose(1, 2)
                summed = dscores.sum(0, keepdim=True) if mask_batch == 1 else dscores
                mask_grads.append(summed.to(mask_dtype))
            dq.mul_(1 / math.sqrt(hs))  # q3 was scaled
        dq_dtype, dk_dtype, dv_dtype = ctx.input_dtypes
        return (
            dq.transpose(1, 2).to(dq_dtype),
            dk.view(B, H, T, hs).to(dk_dtype),
            dv.view(B, H, T, hs).to(dv_dtype),
            None,
            *reversed(mask_grads),
        )


def blocked_bias_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: QueryBlockBiases | None = None,
) -> torch.Tensor:
    """causal_attention for any score bias, from the encoding's score_bias: each block of queries
    [s, e) attends to keys [0, e) only (later keys are all in its future), with the bias and the
    causal mask folded into one float mask of (1, H, e - s, e), or (B, H, e - s, e) for
    positions (B, T). The blocks' biases come from ``biases`` (shared by the layers of one
    forward pass; by default, this call's own).

    Blocks run from the last (the most keys) to the first: each block's temporaries then fit
    in memory the previous block freed, where growing ones made glibc's heap grow (measured at
    16,384 tokens: 0.7-1.0 GB added by the forward pass in first-to-last order, 0.4 GB now).
    """
    B, H, T, _ = q.shape
    # A bias of trained parameters, in training: explicit_attention.
    explicit = torch.is_grad_enabled() and any(p.requires_grad for p in encoding.parameters())
    block = query_block_size(B, H, T, explicit)
    if biases is None:
        biases = QueryBlockBiases(encoding, keep_elements=0)
    in_parts = q.device.type == "cpu" and not (torch.is_grad_enabled() or dropout)
    outputs, masks = [], []
    for start in reversed(range(0, T, block)):
        end = min(start + block, T)
        query_positions, key_positions = positions[..., start:end], positions[..., :end]
        # ([B|1], H, n, e); a buffer for the bias of a block of queries holds H * block * T.
        bias = biases.bias(start, query_positions, key_positions, q.dtype, H * block * T)
        if bias is None:  # the encoding adds no bias at all: no mask to build
            return unbiased_causal_attention(q, k, v, dropout)
        queries, keys, values = q[:, :, start:end], k[:, :, :end], v[:, :, :end]
        if in_parts and start:  # only the diagonal square [s, e) needs the causal mask
            diagonal = causal_bias(bias[..., start:], query_positions, key_positions[..., start:])
            outputs.append(past_and_diagonal_attention(queries, keys, values, bias, diagonal))
        else:
            mask = causal_bias(bias, query_positions, key_positions)
            if explicit:
                masks.append(mask)
            else:
                outputs.append(
                    F.scaled_dot_product_attention(
                        queries, keys, values, attn_mask=mask, dropout_p=dropout
                    )
                )
    if explicit:
        return explicit_attention(q, k, v, masks[::-1], dropout)
    return join_blocks(outputs)


# In evaluation the layers of a forward pass share its query blocks' biases, up to this many
# elements in all (64 MiB in float32: every block of 2,048 tokens with 4 heads). Computed in
# each layer, they took 2/3 of the forward pass of a 2-layer FIRE model with all 32 switch
# points inside (0, 1) at 2,048 tokens (shared: 0.28 s instead of 0.50 s). At longer lengths
# the blocks beyond it are computed in each layer: memory stays bounded.
SHARED_BIAS_ELEMENTS = 2**24


class QueryBlockBiases:
    """Where blocked_bias_attention gets each query block's score bias, as an attention mask of
    ([B|1], H, n, e) without the causal part: from the encoding, or from an earlier layer.

    One instance serves the layers of one forward pass, which share one encoding instance, so a
    block's bias is the same in each (with an encoding per layer, each layer's attention has
    its own). Without gradients, the biases of the first layer are kept, up to
    ``keep_elements`` in all (the blocks run from the largest), for the layers after it, and
    each bias not kept is written into one buffer (the encoding's score_bias(out=)): a fresh
    tensor of tens of MB per block at long lengths had its pages zeroed again by the operating
    system every time, which took longer than computing FIRE's bias (one layer at 16,384
    tokens: 1.8 s of page faults for 0.46 s of writing). With gradients every bias is computed
    afresh, for autograd (out= records none).
    """

    def __init__(self, encoding: PositionalEncoding, keep_elements: int) -> None:
        self.encoding = encoding
        self.keep_elements = keep_elements
        self.kept: dict[int, torch.Tensor] = {}  # by the block's first query
        self.kept_elements = 0
        self.workspace: torch.Tensor | None = None

    def bias(
        self,
        start: int,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        dtype: torch.dtype,
        largest: int,
    ) -> torch.Tensor | None:
        """The bias of the block of queries at ``query_positions`` (from the ``start``-th query)
        and keys at ``key_positions``, in ``dtype``, of at most ``largest`` elements per
        sequence; ``None``: the encoding adds none."""
        if start in self.kept:
            return self.kept[start]
        shape = (self.encoding.n_head, query_positions.shape[-1], key_positions.shape[-1])
        size = math.prod(query_positions.shape[:-1]) * math.prod(shape)
        fresh = torch.is_grad_enabled()
        keep = not fresh and self.kept_elements + size <= self.keep_elements
        # Positions shared by the batch: out= is laid out as that bias, (H, n, e).
        reuse = not (fresh or keep) and query_positions.dim() == 1
        out = self.workspace[:size].view(shape) if reuse and self.workspace is not None else None
        bias = self.encoding.score_bias(query_positions, key_positions, out=out)
        if bias is None:
            return None
        if reuse and self.workspace is None:  # in the dtype the encoding computes its bias in
            self.workspace = bias.new_empty(largest)
        bias = bias.to(dtype)
        if bias.dim() == 3:  # SDPA's CPU kernel takes a 4-D mask fused, a 3-D one 5x slower
            bias = bias[None]
        if keep:
            self.kept[start] = bias
            self.kept_elements += size
        return bias


def past_and_diagonal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor, diagonal: torch.Tensor
) -> torch.Tensor:
    """Attention of a block of queries q (B, H, n, hs) and keys k, v (B, H, Tk, hs)
    whose mask is ``bias`` (1, H, n, Tk) except over the last n keys, where it is ``diagonal``
    (1, H, n, n), the bias with the causal mask -> (B, H, n, hs), without writing that mask.

    The past keys (bias only, read in place) and the diagonal square are two SDPA calls whose
    outputs are merged exactly by their log-sum-exps (as flash-decoding merges key splits).
    CPU only (SDPA's CPU flash kernel returns the log-sum-exp), without gradients.
    """
    past = k.shape[2] - q.shape[2]
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    y_past, lse_past = flash(q, k[:, :, :past], v[:, :, :past], attn_mask=bias[..., :past])[:2]
    y_diag, lse_diag = flash(q, k[:, :, past:], v[:, :, past:], attn_mask=diagonal)[:2]
    lse = torch.logaddexp(lse_past, lse_diag)[..., None]  # (B, H, n, 1)
    return y_past * (lse_past[..., None] - lse).exp() + y_diag * (lse_diag[..., None] - lse).exp()


def join_blocks(outputs: list[torch.Tensor]) -> torch.Tensor:
    """The outputs (B, H, n, hs) of query blocks computed last to first, joined in query order
    -> (B, H, T, hs); one block (training lengths) is returned as it is, where cat would copy it
    (forward and backward)."""
    return outputs[0] if len(outputs) == 1 else torch.cat(outputs[::-1], dim=2)


def unbiased_causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float = 0.0
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + causal mask) v for q, k, v of (B, H, T, hs): SDPA's fused
    causal kernel, run in fp32 for bf16 inputs on a CPU.

    SDPA's CPU flash attention is slower in bf16 than in fp32, its backward most of all (the
    issue measured 22.9 ms bf16 vs 13.3 ms fp32 forward and backward at (32, 4, 128, 64)), and
    that made bf16 training steps slow. Casting q, k, v up and the output down costs little next
    to the (T, T) work, keeps the fused kernel's memory bound at any length, and is as accurate
    as fp32 attention. (Plain bf16 products around an fp32 softmax measured as fast in whole
    training steps, but rounds the scores to bf16: 5x SDPA's error at peaked attention.)
    """
    if q.dtype != torch.bfloat16 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    with torch.autocast("cpu", enabled=False):  # autocast would cast q, k, v back to bf16
        y = F.scaled_dot_product_attention(
            q.float(), k.float(), v.float(), dropout_p=dropout, is_causal=True
        )  # (B, H, T, hs) fp32
    return y.to(q.dtype)


def causal_bias(
    bias: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """Fold the causal mask into an additive score bias (..., H, Tq, Tk) of positions
    (..., Tq) and (..., Tk): a key whose position is after the query's gets -inf."""
    future = key_positions[..., None, :] > query_positions[..., :, None]  # (..., Tq, Tk)
    # One pass, where masked_fill copies first; the mask is the same for every head.
    return torch.where(future.unsqueeze(-3), float("-inf"), bias)


class MLP(nn.Module):
    def __init__(self, d_model: int, hidden: int, dropout: float):
        super().__init__()
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down(F.gelu(self.up(x))))


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln_attn = nn.LayerNorm(args.d_model)
        self.attn = CausalSelfAttention(args.d_model, args.n_head, args.dropout)
        self.ln_mlp = nn.LayerNorm(args.d_model)
        self.mlp = MLP(args.d_model, args.mlp_ratio * args.d_model, args.dropout)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoding: PositionalEncoding,
        biases: QueryBlockBiases | None = None,
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), positions, encoding, biases)
        return x + self.mlp(self.ln_mlp(x))


@dataclass
class ModelArgs:
    """Everything besides the encoding that is needed to rebuild a model from its weights."""

    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    vocab_size: int = VOCAB_SIZE

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise PosbenchError(
                f"model.n_head ({self.n_head}) must divide model.d_model ({self.d_model})"
            )

    def to_dict(self) -> dict:
        return asdict(self)


class Transformer(nn.Module):
    """Decoder-only language model over bytes: ``model(tokens (B, T)) -> logits (B, T, vocab)``."""

    def __init__(self, args: ModelArgs, encoding: PositionalEncoding):
        super().__init__()
        self.args = args
        self.encoding = encoding  # the first layer's, and the one that embeds and bounds lengths
        # An encoding that is per_layer gets a fresh instance, from its config, for every layer
        # after the first; any other serves every layer.
        deeper = range(args.n_layer - 1) if encoding.per_layer else range(0)
        self.deeper_encodings = nn.ModuleList(
            type(encoding)(encoding.config, encoding.d_model, encoding.n_head) for _ in deeper
        )
        self.token_embedding = nn.Embedding(args.vocab_size, args.d_model)
        self.dropout = nn.Dropout(args.dropout)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.n_layer))
        self.ln_final = nn.LayerNorm(args.d_model)
        self.lm_head = nn.Linear(args.d_model, args.vocab_size, bias=False)
        # Weight tying (Press & Wolf 2017, https://arxiv.org/abs/1608.05859).
        self.lm_head.weight = self.token_embedding.weight
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # GPT-2's initialisation: small normal weights keep the residual stream well scaled.
        if isinstance(module, nn.Linear | nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    @property
    def layer_encodings(self) -> list[PositionalEncoding]:
        """The encoding each layer attends with, first layer first."""
        if self.deeper_encodings:
            return [self.encoding, *self.deeper_encodings]
        return [self.encoding] * self.args.n_layer

    @property
    def max_length(self) -> int | None:
        """Longest input the model can represent (``None``: any length)."""
        return self.encoding.max_length

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab) for ``tokens`` (B, T) at increasing integer ``positions``: (T,),
        shared by the batch (0..T-1 by default), or (B, T), one row per sequence (randomized
        positions train each sequence at its own)."""
        T = tokens.shape[1]
        needed = T  # the largest position + 1 (T by default, known without a device sync)
        if positions is None:
            positions = torch.arange(T, device=tokens.device)  # (T,)
        elif self.max_length is not None:
            needed = int(positions[..., -1].max()) + 1
        if self.max_length is not None and needed > self.max_length:
            raise PosbenchError(
                f"input length {needed} exceeds the {self.max_length} positions this "
                f"{self.encoding.config.name} model can represent"
            )
        x = self.token_embedding(tokens)  # (B, T, C)
        x = self.dropout(self.encoding.embed(x, positions))
        # The layers share one encoding's query-block biases; with an encoding per layer, each
        # layer's attention computes its own (biases=None).
        shared = not self.deeper_encodings
        biases = QueryBlockBiases(self.encoding, SHARED_BIAS_ELEMENTS) if shared else None
        for block, encoding in zip(self.blocks, self.layer_encodings, strict=True):
            x = block(x, positions, encoding, biases)
        return self.lm_head(self.ln_final(x))  # (B, T, vocab)

    def inference_memory_bytes(self, batch_size: int, length: int, consecutive: bool = True) -> int:
        """An upper estimate of the memory one forward pass adds under inference mode (on top
        of the weights) for ``batch_size`` sequences of ``length`` tokens at ``consecutive``
        positions (else each at its own), so that evaluation can choose a batch that fits
        before it starts (benchmarks/long_eval_memory.py compares it with measured peaks).

        Terms, in elements: the live activations of one block (residual, layer-norm output,
        q/k/v and their rotated copies, attention output, the MLP's hidden layer and its GELU:
        at most 8*C + 2*hidden per token) and the logits with the log-softmax of the loss (3*V
        per token). A bias of the distance alone at consecutive positions
        (relative_bias_attention) adds the reversed
        keys and values and the query blocks' outputs before they are joined (3*C per token)
        and its bias row per head (twice, with its padded copy). Any other score bias adds the
        attention scratch of one query block (the bias, its masked copy, SDPA's scores and
        probabilities, and the encoding's own intermediates: at most 6 per score), which
        query_block_size keeps bounded at any length, and the blocks' biases the layers share
        (at most SHARED_BIAS_ELEMENTS).
        """
        a = self.args
        tokens = batch_size * length
        hidden = a.mlp_ratio * a.d_model
        elements = tokens * (8 * a.d_model + 2 * hidden + 3 * a.vocab_size)
        first = torch.zeros(1, dtype=torch.long, device=self.lm_head.weight.device)
        if consecutive and self.encoding.relative_bias(first) is not None:
            elements += 3 * tokens * a.d_model + 2 * a.n_head * (length + QUERY_BLOCK)
        elif self.encoding.score_bias(first, first) is not None:
            block = query_block_size(batch_size, a.n_head, length)
            elements += 6 * batch_size * a.n_head * block * length
            every_block = a.n_head * length * (length + block) // 2  # (H, n, e) for each block
            elements += min(SHARED_BIAS_ELEMENTS, every_block)
        return elements * self.lm_head.weight.element_size()

    def num_parameters(self) -> int:
        """Parameters counted once (the tied embedding is shared with the output layer)."""
        return sum(p.numel() for p in self.parameters())


def check_model_config(model: Mapping[str, Any], encoding: Mapping[str, Any]) -> None:
    """Raise the PosbenchError ``build_model`` would raise for these configs, without building
    the model: its checks are the model's shape (ModelArgs) and the encoding's own, and an
    encoding's parameters are small. Even on the meta device, initialising the weights would
    cost more than the check (meta normal_ imports torch._dynamo, as slow as importing torch)."""
    args = ModelArgs(**model)
    build_encoding(encoding, args.d_model, args.n_head)


def build_model(model: Mapping[str, Any], encoding: Mapping[str, Any]) -> Transformer:
    """A fresh model from plain config mappings (a ``model`` and an ``encoding`` section)."""
    args = ModelArgs(**model)
    return Transformer(args, build_encoding(encoding, args.d_model, args.n_head))
