"""CoPE: contextual position encoding (Golovneva et al. 2024, https://arxiv.org/abs/2405.18719).

Positions are counted by the content: query i gates every past key j by its attention logit,

    g_ij = sigmoid(q_i . k_j / sqrt(hs)),    p_ij = sum_{t=j..i} g_it,

so p_ij is how many keys between j and i (both included) the query counts, a fraction in
(0, i - j + 1], clamped at ``npos - 1``. Its logit gets q_i . e[p_ij], the learned position
embedding e (npos, hs) interpolated linearly between the integer positions floor(p) and
ceil(p): q_i . e[p] = (1 - w) q_i . e[floor p] + w q_i . e[ceil p] with w = p - floor(p), so
only the products q_i . e[n] per query are computed (n up to the largest count of its block),
and p gets a gradient through w.

As in facebookresearch/RAM (projects/cope/src/cope/context_position.py) e starts at zeros,
and each layer has its own e, shared by its heads. The bias is added to the logits after
their 1/sqrt(hs) scaling, as x-transformers' ``CoPE`` adds it and RAM does with
``--cope-nodiv``; RAM's default divides it too, which is this bias with e / sqrt(hs).

Future keys get the gate 0 (so a future key's p is 0). The counts are summed from the
diagonal back (keys reversed), so a short count near the diagonal never comes from the
difference of two long sums.

In training every block of queries of a layer gets its bias from one autograd node
(CountedPositionBiases, through content_biases) with a hand-written backward.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.autograd.function import once_differentiable

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class CopeConfig(EncodingConfig):
    name: str = "cope"
    npos: int = 512  # positions 0..npos-1 (conf/encoding/cope.yaml: train.seq_len + 1)


def block(
    state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
) -> tuple[torch.Tensor, torch.Tensor]:
    """The queries at indices ``queries`` (B, H, n, hs) and the keys at ``keys``, latest first
    (B, H, m, hs), of content_state's ``state``, in float32 (or float64): the counts' precision.
    The queries are copied once into rows of their own, which every product with them reads
    (each would copy a strided block of the layer's queries again)."""
    q, reversed_keys = state
    dtype = torch.promote_types(q.dtype, torch.float32)
    T = reversed_keys.shape[2]
    keys = reversed_keys[:, :, T - keys.stop : T - keys.start].to(dtype)
    return q[:, :, queries].to(dtype).contiguous(), keys


def reversed_gates(
    q: torch.Tensor, reversed_keys: torch.Tensor, first_query: int, first_key: int
) -> torch.Tensor:
    """g = sigmoid(q . k / sqrt(hs)) of the queries q (B, H, n, hs) from index ``first_query``
    over the keys from index ``first_key``, given latest first (B, H, m, hs) -> (B, H, n, m),
    keys reversed, 0 at a query's future keys."""
    B, H, n, hs = q.shape
    m = reversed_keys.shape[2]
    # The scale inside the product (alpha), where scaling q first would be one more pass.
    logits = torch.baddbmm(
        q.new_empty(()).expand(B * H, n, m),
        q.reshape(B * H, n, hs),
        reversed_keys.reshape(B * H, m, hs).transpose(1, 2),
        beta=0,
        alpha=1 / math.sqrt(hs),
    ).view(B, H, n, m)
    # The first `ahead` reversed keys come after the block's first query: only they can be in a
    # query's future, whose gate is 0.
    last_key = first_key + m - 1
    ahead = keys_ahead(first_query, last_key, m)
    query = torch.arange(first_query, first_query + n, device=q.device)
    key = torch.arange(last_key, last_key - ahead, -1, device=q.device)
    # Added as a mask of 0 and -inf (n, ahead): masked_fill_ into the strided slice took twice
    # as long. The same logits, as the finite q . k stay finite.
    future = torch.where(key > query[:, None], float("-inf"), 0.0).to(logits.dtype)
    logits[..., :ahead] += future
    return logits.sigmoid_()


def keys_ahead(first_query: int, last_key: int, m: int) -> int:
    """How many of ``m`` keys up to index ``last_key``, latest first, come after the query at
    index ``first_query``: only they can be in the future of a block's queries from it."""
    return min(m, max(0, last_key - first_query))


def nearest_counts(
    q: torch.Tensor, reversed_keys: torch.Tensor, first_query: int, first_key: int, last: int
) -> torch.Tensor:
    """Without gradients: p_ij unclamped of the queries q (B, H, n, hs) from index
    ``first_query`` over the s nearest of the keys from index ``first_key``, given latest first
    (B, H, m, hs) -> (B, H, n, s), keys reversed, in which order each row is a running sum,
    nondecreasing, 0 over the query's future keys: s keys are enough for every query to count
    to ``last`` (or they are all m).

    Past the training length the nearest few hundred keys of a query count to the last
    position, which every farther key is at: their gates would be most of the work. A gate is
    at most 1, so fewer than ``last`` keys never count to it; each try takes twice as many (a
    prefix of a running sum is the running sum of the prefix: the counts are those of all
    keys). The block's keys after its first query come first and count 0 for it: the tries
    start past them (at 2,048 tokens, blocks of 256, a first try of 2 (last + 1) keys in all
    failed at the first queries of nearly every block: a third of the gates' work). A later
    try computes only the gates of its new keys, their running sum continued from the last
    count (random unit-normal q and k, 4 heads of 32, the last 256 queries of 2,048 tokens,
    npos 129: 521 keys count to the last position where the first try takes 513, and the
    second try's 771 keys took 9.7 ms recomputing the first try's gates, 5.2 ms not; AMD EPYC
    Zen 3. The untrained `tiny` model's blocks at 2,048 tokens need no second try). Summed in
    place: a fresh tensor of tens of MB per query block has its pages zeroed by the operating
    system again, which took longer than the sum."""
    m = reversed_keys.shape[2]
    ahead = keys_ahead(first_query, first_key + m - 1, m)
    done, span = 0, min(m, ahead + 2 * (last + 1))
    counts = None
    while True:
        new = reversed_keys[:, :, done:span]  # keys first_key + m - span .. + m - 1 - done
        added = reversed_gates(q, new, first_query, first_key + m - span)
        if counts is not None:
            added[..., 0] += counts[..., -1]
        added = added.cumsum_(-1)
        counts = added if counts is None else torch.cat([counts, added], dim=-1)
        if span == m or bool((counts[..., -1] >= last).all()):
            return counts
        done, span = span, min(m, ahead + 2 * (span - ahead))


def position_logits(
    q: torch.Tensor, embedding: torch.Tensor, reach: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q_i . e[n] of the queries q (B, H, n, hs) at the positions n = 0..reach, and their steps
    q_i . (e[n + 1] - e[n]), 0 at the last position of the embedding e (npos, hs), which
    nothing follows -> (table, steps), each (B, H, n, reach + 1): both from one product with
    e[:reach + 2] (the next position's row gives the last step)."""
    extended = q @ embedding[: reach + 2].T  # (B, H, n, reach + 2), or npos at the last
    steps = extended.diff(dim=-1)
    if extended.shape[-1] == reach + 1:  # reach is the last position
        steps = F.pad(steps, (0, 1))
    return extended[..., : reach + 1], steps


def interpolated(
    table: torch.Tensor, steps: torch.Tensor, counts: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q_i . e[p] from the ``table`` of q_i . e[n] and its ``steps`` (B, H, n, N) at the
    positions ``counts`` p (B, H, n, m), at most N - 1, which become their fractions w
    (in place) -> (bias, floor(p), w, the step at floor(p)), each (B, H, n, m)."""
    below = counts.long()  # floor(p), for p >= 0
    weight = counts.frac_()  # the share of ceil(p)
    stepped = steps.gather(-1, below)
    return table.gather(-1, below).addcmul_(stepped, weight), below, weight, stepped


def largest_count(queries: slice, keys: slice, last: int) -> int:
    """The largest floor(p) of the queries at indices ``queries`` over the keys at ``keys``,
    counts clamped at ``last``: the last query's count of the first key, at most its distance
    + 1."""
    return min(last, queries.stop - keys.start)


def block_bias(
    q: torch.Tensor,
    reversed_keys: torch.Tensor,
    embedding: torch.Tensor,
    queries: slice,
    keys: slice,
    last: int,
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The bias q_i . e[p_ij] of the queries at indices ``queries`` over the keys at ``keys`` of
    content_state's q and keys latest first (B, H, T, hs), with the embedding e (npos, hs),
    counts clamped at ``last`` -> (B, H, n, m), keys in order, and what block_gradients takes:
    the block's queries and keys, gates, floor(p), w and the steps at floor(p).

    The gates are summed with the keys reversed, and the sums turned to key order once: there
    the backward needs no flip (block_gradients)."""
    q, reversed_keys = block((q, reversed_keys), queries, keys)  # (B, H, n | m, hs)
    gates = reversed_gates(q, reversed_keys, queries.start, keys.start)  # (B, H, n, m)
    counts = gates.cumsum(-1).flip(-1)  # (B, H, n, m), keys in order
    # A key j is at most the last query's distance + 1 = queries.stop - j back: only those
    # before queries.stop - last can count past the last position.
    counts[..., : max(0, queries.stop - last - keys.start)].clamp_(max=last)
    table, steps = position_logits(q, embedding, largest_count(queries, keys, last))
    bias, below, weight, stepped = interpolated(table, steps, counts)
    return bias, [q, reversed_keys, gates, below, weight, stepped]


def block_gradients(
    dbias: torch.Tensor, embedding: torch.Tensor, reach: int, saved: list[torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The gradients of block_bias's queries (B, H, n, hs), keys latest first (B, H, m, hs)
    and first rows of the embedding (those of position_logits' product) from the bias's
    ``dbias`` (B, H, n, m), the block's largest count ``reach`` and ``saved``, what block_bias
    returned with the bias.

    In key order the count's gradient is dp_ij = dbias_ij * (q_i . e step at floor p_ij), 0
    where p is clamped (the step there is 0), and g_it is in every p_ij with j <= t: its
    gradient is the running sum of dp from the block's first key. The table's gradient is two
    scatter-adds of dbias, split between e[floor p] and e[ceil p] by w."""
    q, reversed_keys, gates, below, weight, stepped = saved
    B, H, n, m = gates.shape
    hs = q.shape[-1]
    columns = min(reach + 2, len(embedding))  # those of position_logits' product
    dproduct = dbias.new_zeros(B, H, n, columns)
    dproduct[..., : reach + 1].scatter_add_(-1, below, dbias)  # through the table
    dsteps = dbias.new_zeros(B, H, n, reach + 1).scatter_add_(-1, below, dbias * weight)
    dsteps = dsteps[..., : columns - 1]  # the 0 step after the last position has none
    dproduct[..., :-1] -= dsteps
    dproduct[..., 1:] += dsteps
    dgates = (dbias * stepped).cumsum(-1).flip(-1)  # (B, H, n, m), keys reversed
    dlogits = torch.ops.aten.sigmoid_backward(dgates, gates).view(B * H, n, m)
    scale = 1 / math.sqrt(hs)
    q3, keys3 = q.view(B * H, n, hs), reversed_keys.reshape(B * H, m, hs)
    dq = (dproduct @ embedding[:columns]).view(B * H, n, hs)
    dq.baddbmm_(dlogits, keys3, alpha=scale)
    dkeys = torch.baddbmm(
        q.new_empty(()).expand(B * H, m, hs), dlogits.transpose(1, 2), q3, beta=0, alpha=scale
    )
    dembedding = dproduct.view(-1, columns).T @ q.view(-1, hs)  # (columns, hs)
    return dq.view(B, H, n, hs), dkeys.view(B, H, m, hs), dembedding


class CountedPositionBiases(torch.autograd.Function):
    """block_bias of each of ``blocks`` ((queries, keys) index slices) of content_state's q and
    keys latest first (B, H, T, hs), with the embedding e (npos, hs), counts clamped at ``last``
    -> one bias (B, H, n, m) per block, keys in order; the backward is block_gradients'.

    One node for all the blocks of a layer, with a hand-written backward: autograd's own spent
    most of CoPE's training step in the gathers' scatter-add backward (each into a zeroed
    table), the flips around the reversed running sum and the clamp, and, for each block, a
    zero-filled gradient of the layer's q and keys, added to the others."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        reversed_keys: torch.Tensor,
        embedding: torch.Tensor,
        blocks: list[tuple[slice, slice]],
        last: int,
    ) -> tuple[torch.Tensor, ...]:
        biases, saved = [], []
        for queries, keys in blocks:
            bias, kept = block_bias(q, reversed_keys, embedding, queries, keys, last)
            biases.append(bias)
            saved += kept
        ctx.save_for_backward(q, reversed_keys, embedding, *saved)
        ctx.blocks, ctx.last = blocks, last
        return tuple(biases)

    @staticmethod
    @once_differentiable  # its gradients are not recorded for a second derivative
    def backward(ctx: Any, *dbiases: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, reversed_keys, embedding, *saved = ctx.saved_tensors
        T = reversed_keys.shape[2]
        # zeros_like keeps q's layout, that of the projection it comes from, in which
        # attention's own gradient of q is too: the two add up without a transpose.
        dq, dkeys, dembedding = (torch.zeros_like(t) for t in (q, reversed_keys, embedding))
        per_block = len(saved) // len(ctx.blocks)
        for index, ((queries, keys), dbias) in enumerate(zip(ctx.blocks, dbiases, strict=True)):
            reach = largest_count(queries, keys, ctx.last)
            kept = saved[index * per_block : (index + 1) * per_block]
            dq_block, dkeys_block, drows = block_gradients(dbias, embedding, reach, kept)
            dq[:, :, queries] += dq_block
            dkeys[:, :, T - keys.stop : T - keys.start] += dkeys_block
            dembedding[: len(drows)] += drows
        return dq, dkeys, dembedding, None, None


@register("cope")
class ContextualPositions(PositionalEncoding):
    Config = CopeConfig

    def __init__(self, config: CopeConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.npos < 1:
            raise PosbenchError(f"encoding.npos must be positive (got {config.npos})")
        self.position_embedding = nn.Parameter(torch.zeros(config.npos, self.head_dim))

    @property
    def per_layer(self) -> bool:
        return True  # one e per layer, as in the paper

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The keys latest first, the order each query's counts are summed in, once per layer
        # (not per block of queries), in rows of their own: each block's products read a
        # slice of them in place.
        return q, k.flip(2).contiguous()  # (B, H, T, hs) each

    def content_biases(
        self, state: tuple[torch.Tensor, torch.Tensor], blocks: list[tuple[slice, slice]]
    ) -> list[torch.Tensor]:
        if not torch.is_grad_enabled():
            return super().content_biases(state, blocks)
        q, reversed_keys = state
        dtype = torch.promote_types(q.dtype, torch.float32)  # counts in float32 (or float64)
        with torch.autocast(q.device.type, enabled=False):
            q, reversed_keys = q.to(dtype), reversed_keys.to(dtype)
            embedding = self.position_embedding.to(dtype)
            last = self.config.npos - 1
            return list(CountedPositionBiases.apply(q, reversed_keys, embedding, blocks, last))

    def content_bias(
        self, state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
    ) -> torch.Tensor:
        if torch.is_grad_enabled():
            return self.content_biases(state, [(queries, keys)])[0]
        far, near = self.content_bias_parts(state, queries, keys)
        if far is None:
            return near
        before = keys.stop - keys.start - near.shape[-1]
        return torch.cat([far[..., None].expand(*far.shape, before), near], dim=-1)

    def content_bias_parts(
        self, state: tuple[torch.Tensor, torch.Tensor], queries: slice, keys: slice
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        if torch.is_grad_enabled():
            return super().content_bias_parts(state, queries, keys)
        last = self.config.npos - 1  # the largest position
        q, reversed_keys = block(state, queries, keys)
        with torch.autocast(q.device.type, enabled=False):
            counts = nearest_counts(q, reversed_keys, queries.start, keys.start, last)
            m = reversed_keys.shape[2]
            # In evaluation, past the training length, the far keys of every query count to
            # the last position (the bias is q_i . e[npos - 1] there): interpolate only the
            # nearest `counted` keys, those below it for some query (searchsorted finds where
            # each row reaches it). The far keys' bias is one value per query, never written
            # out per key: at 2,048 tokens the block's bias written whole (a cat of the far
            # value and the near bias) took a sixth of CoPE's forward pass (AMD EPYC Zen 3).
            reached = torch.searchsorted(counts, counts.new_full((*counts.shape[:-1], 1), last))
            counted = int(reached.max())
            embedding = self.position_embedding.to(q.dtype)
            table, steps = position_logits(q, embedding, largest_count(queries, keys, last))
            near = counts[..., :counted].clamp_(max=last)  # p, interpolated
            bias = interpolated(table, steps, near)[0].flip(-1)  # keys in order
            return (None if counted == m else table[..., last]), bias
