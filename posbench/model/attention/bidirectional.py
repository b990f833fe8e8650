"""Bidirectional self-attention (``model.causal=false``): every token attends to every token of
its row, as the encoder of Ruoss et al. 2023 does (google-deepmind/randomized_positional_encodings,
models/transformer.py, ``encoder_causal_masking=False`` by default), which writes every answer
token at once at placeholders (data.answer_mode=placeholders). A bidirectional model calls
``bidirectional_attention`` where a causal one calls posbench.model.attention.causal_attention, with
the same arguments; the layers of a forward pass share its TwoSidedBiases (``two_sided_biases``).
Only an encoding with a two-sided form (``bidirectional``, posbench/encodings/base.py) attends
here, through ``two_sided_bias`` alone: ``check_two_sided`` refuses the others.

Which path runs when (T tokens, H heads, blocks of n queries):

    condition                                  path
    -----------------------------------------  ------------------------------------------------
    no score bias (NoPE, learned, sinusoidal,  one fused SDPA call without the causal mask;
      RoPE)                                      rows padded before T: a key-padding mask of
                                                 (B, 1, 1, T)
    a two-sided bias (ALiBi, T5)               one SDPA call per block of at most QUERY_BLOCK
                                                 queries over every key, its mask ([B|1], H, n,
                                                 T) the bias looked up in a table of every
                                                 distance's, the key padding added

What each holds besides q, k, v and the output: nothing of (T, T) without a bias; with one, the
table (H, 2P - 1) for positions below P, or (B, H, 2T - 1) at randomized distances, and one
block's mask and scores (at most MAX_SCORE_ELEMENTS: query_block_size). A learned bias in
training (T5's) gets its gradient through SDPA, which takes its math path for a mask that needs
one (tests/test_bidirectional_attention.py compares it with autograd of the written-out softmax).

Padding: a batch of mixed problem lengths is padded after each row's end. Causally no token of
the row sees it; both ways every token would. The keys at or past a row's length (each row's
``lengths``: its last trained target's, random_positions.row_lengths) get -inf, so a row's
outputs do not depend on what follows it.
"""

from __future__ import annotations

import torch

from posbench.encodings import ENCODINGS, PositionalEncoding
from posbench.errors import PosbenchError
from posbench.model.attention.biases import layer_biases
from posbench.model.attention.blocks import join_blocks, query_block_size
from posbench.model.attention.fused import fused_attention, sdpa_dtype
from posbench.model.attention.variants import AttentionVariant, two_sided_attention
from posbench.model.random_positions import row_lengths


def check_two_sided(encoding: PositionalEncoding, causal: bool, scaling: str = "none") -> None:
    """Refuse a model that attends both ways (not ``causal``) with an encoding that has no
    two-sided form, or with an attention ``scaling`` (model.attention_scaling) other than none."""
    if causal:
        return
    if scaling != "none":
        raise PosbenchError(
            f"model.attention_scaling={scaling} scales a query by the keys it sees causally (its "
            "position); model.causal=false needs model.attention_scaling=none"
        )
    if encoding.bidirectional:
        return
    two_sided = ", ".join(name for name, cls in ENCODINGS.items() if cls.bidirectional)
    raise PosbenchError(
        f"model.causal=false needs an encoding with a two-sided form ({two_sided}); "
        f"encoding={encoding.config.name} is causal by design (defined for keys at or before "
        "their query only): use model.causal=true"
    )


def has_two_sided_bias(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` biases the logits of a model that attends both ways."""
    return type(encoding).two_sided_bias is not PositionalEncoding.two_sided_bias


class TwoSidedBiases:
    """What the layers of a bidirectional forward pass share: the encoding's two-sided bias at
    every distance between its positions (a table, made at the first layer's call), or at
    randomized ``distances`` (B, T) where given, and the keys past each row's ``lengths`` (B,)
    (None: no row is padded).

    Randomized distances (posbench/model/random_positions.py) relabel a distance d > 0 as s[d] on
    both sides, as the reference's noisy ALiBi does with ``randomize_both_sides=False``
    (compute_noisy_alibi_encodings_biases): the key d tokens before the query takes the bias
    at distance s[d], the key d tokens after it the bias at -s[d]."""

    def __init__(
        self,
        encoding: PositionalEncoding,
        distances: torch.Tensor | None = None,
        lengths: torch.Tensor | None = None,
    ) -> None:
        self.encoding = encoding
        self.distances = distances
        self.lengths = lengths
        self.table: torch.Tensor | None = None  # ([B,] H, R): the bias at distances lowest..
        self.lowest = 0
        self.padding: tuple[torch.Tensor | None] | None = None  # key_padding's, once asked

    def key_padding(self, length: int, device: torch.device) -> torch.Tensor | None:
        """The mask (B, 1, 1, ``length``), float32, of -inf at each row's keys past its end, 0
        before; None when no row ends before ``length``. Computed once for every layer (the
        check reads the lengths back: a device sync on a GPU)."""
        if self.padding is None:
            padded = self.lengths is not None and bool((self.lengths < length).any())
            mask = None
            if padded:
                past = torch.arange(length, device=device) >= self.lengths[:, None]  # (B, T)
                mask = torch.zeros(past.shape, device=device).masked_fill(past, float("-inf"))
                mask = mask[:, None, None]  # (B, 1, 1, T)
            self.padding = (mask,)
        return self.padding[0]

    def bias(self, positions: torch.Tensor, start: int, end: int) -> torch.Tensor:
        """The two-sided bias of the queries [start, end) over every key, for tokens at
        ``positions`` (T,) or (B, T) -> ([B|1], H, n, T)."""
        if self.table is None:
            self.table, self.lowest = self.distance_table(positions)
        # Each (query, key)'s distance i - j as a column of the table: ([B,] n, T).
        column = positions[..., start:end, None] - positions[..., None, :] - self.lowest
        if self.table.dim() == 3:  # a row per sequence: randomized distances, tokens 0..T-1
            assert column.dim() == 2, "randomized distances keep positions 0..T-1"
            return self.table[:, :, column]  # (B, H, n, T)
        bias = self.table[:, column].movedim(0, -3)  # ([B,] H, n, T)
        return bias if bias.dim() == 4 else bias[None]

    def distance_table(self, positions: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The two-sided bias at every distance between ``positions`` (or token offsets, at
        randomized distances) -> (the table ([B,] H, R), the distance of its first column)."""
        if self.distances is None:
            span = int(positions.max() - positions.min())
            distance = torch.arange(-span, span + 1, device=positions.device)  # (2 span + 1,)
            return self.encoding.two_sided_bias(distance), -span  # (H, R)
        s = self.distances  # (B, T), s[:, 0] = 0
        signed = torch.cat([-s[:, 1:].flip(-1), s], dim=-1)  # (B, 2T - 1): offsets 1 - T..T - 1
        B, R = signed.shape
        table = self.encoding.two_sided_bias(signed.flatten()).view(-1, B, R)  # (H, B, R)
        return table.transpose(0, 1), 1 - s.shape[-1]  # (B, H, R)


def two_sided_biases(
    encodings: list[PositionalEncoding],
    positions: torch.Tensor,
    distances: torch.Tensor | None,
    lengths: torch.Tensor | None,
    targets: torch.Tensor | None = None,
) -> list[TwoSidedBiases]:
    """The TwoSidedBiases of each layer of a bidirectional forward pass (layer_biases says which
    layers share one), whose rows end at ``lengths`` (B,), by default where their ``targets``
    (B, T) end (row_lengths; None: every row is whole)."""
    if lengths is None and targets is not None:
        lengths = row_lengths(targets)

    def make(encoding: PositionalEncoding, distances: torch.Tensor | None) -> TwoSidedBiases:
        return TwoSidedBiases(encoding, distances, lengths)

    return layer_biases(encodings, positions, distances, make)


def bidirectional_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
    biases: TwoSidedBiases | None = None,
    content: object | None = None,
    variant: AttentionVariant | None = None,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + encoding's two_sided_bias + key padding) v, for q, k, v of
    (B, H, T, hs) at ``positions`` (T,) or (B, T) -> (B, H, T, hs), with no causal mask;
    ``biases``: the forward pass's TwoSidedBiases (by default this call's own: no padding).
    causal_attention's arguments; ``content`` is always None (no encoding with a bias of the
    content has a two-sided form); a ``variant`` that is not ``plain`` (sinks, sigmoid) takes
    variants.two_sided_attention."""
    assert content is None and encoding.bidirectional, "check_two_sided refuses the encoding"
    if biases is None:
        biases = TwoSidedBiases(encoding)
    B, H, T, _ = q.shape
    dtype = sdpa_dtype(q)
    padding = biases.key_padding(T, q.device)  # (B, 1, 1, T) or None
    padding = None if padding is None else padding.to(dtype)
    if variant is not None and not variant.plain:
        with_bias = has_two_sided_bias(encoding)

        def bias_of_block(start: int, end: int) -> torch.Tensor | None:
            return biases.bias(positions, start, end) if with_bias else None

        return two_sided_attention(q, k, v, bias_of_block, padding, dropout, variant)
    if not has_two_sided_bias(encoding):
        return fused_attention(q, k, v, padding, dropout)
    # Cast once, not per block (a cast per block would sum their gradients in bf16).
    queries, keys, values = (t.to(dtype) for t in (q, k, v))
    block = query_block_size(B, H, T)
    outputs = []
    for start in reversed(range(0, T, block)):  # the order join_blocks expects
        end = min(start + block, T)
        mask = biases.bias(positions, start, end).to(dtype)  # ([B|1], H, n, T)
        if padding is not None:
            mask = mask + padding  # (B, H, n, T)
        outputs.append(fused_attention(queries[:, :, start:end], keys, values, mask, dropout))
    return join_blocks(outputs).to(q.dtype)


def scratch_elements(
    encoding: PositionalEncoding,
    batch_size: int,
    length: int,
    consecutive: bool,
    device: torch.device,
) -> int:
    """An upper estimate of the elements bidirectional_attention holds under inference mode,
    besides q, k, v and its output, for ``batch_size`` sequences of ``length`` tokens
    (posbench.model.attention.attention_scratch_elements' counterpart, with its arguments): the key
    padding without a bias; with one, the table (its rows at randomized distances; at
    randomized positions below N it is H * 2N, small next to a block's scores), q, k, v cast up
    (3*C per token, counted twice for a 16-bit model) and one block's scores: the column
    indices (int64: two elements each), the bias, the padded mask, SDPA's scores and
    probabilities (6 per score)."""
    if not has_two_sided_bias(encoding):
        return batch_size * length
    H, C = encoding.n_head, encoding.d_model
    block = query_block_size(batch_size, H, length)
    table = batch_size * H * 2 * length
    return table + 6 * batch_size * length * C + 6 * batch_size * H * block * length
