"""A key-value cache, so that decoding a sequence one token at a time costs O(T) per token:
the new token's rows alone go through the model, and its query attends over every key cached
before it, where recomputing the prefix at each step would cost O(T^2) (benchmarks/README.md
measures the two: benchmarks/decode_cache.py).

What a layer keeps of the tokens so far: k and v (after the encoding's ``queries_and_keys``,
so a rotation is the key's own position's), and, for an encoding with a bias from the content
(FoX, CoPE), the layer's normed input x and its q too, from which ``content_state`` is
recomputed at each step (FoX's running sum of log-gates, CoPE's reversed keys: O(T) each) and
``content_bias`` asked for the new queries' rows only. Biases of positions (ALiBi, T5, FIRE,
...) come from the encoding's ``score_bias`` of the new queries' positions over the keys'; a
window and the attention scaling (SSMax counts the tokens before the query) read the token's
index, which the cache counts.

Every position of the sequence is known up front (randomized positions draw them per example,
and per layer: each layer's cache keeps its own row of the draw), so the cache holds them all,
and each call takes the next. An encoding may read the sequence's positions at large when it
transforms q and k (RoPE's eval-time scaling factor follows the last position, xPos centres its
factors between the first and the last): the new tokens' q and k are transformed in their place
in the whole sequence, as a forward pass over it transforms them (O(T) too), so a step's logits
are those of that forward pass at its token. Randomized distances (a bias of the distance alone
at relabelled distances, random_positions.py) are held the same way, a table per
sequence (and layer) indexed by the distance in tokens.

A bias from the content reads q before the attention scaling scales it (CoPE's gates and
counts), so the cache keeps q unscaled; the scaling then counts the new token's index (its
``first`` argument), never its position.

The first call (the prompt, all at once) attends as a forward pass without a cache does
(posbench.model.attention.causal_attention); the later ones written out
(posbench.model.attention.query_probabilities): a few queries over t keys hold O(t) scores.
"""

from __future__ import annotations

import torch

from posbench.encodings import PositionalEncoding
from posbench.model.attention import (
    AttentionVariant,
    QueryBlockBiases,
    causal_attention,
    of_layer,
    query_probabilities,
)
from posbench.model.random_positions import overrides


class DecodeCache:
    """The cache of a decode of sequences at ``positions`` (T,), shared by the batch, (B, T), or
    (n_layer, B, T), a draw per layer, and at randomized ``distances`` (None, (B, T) or
    (n_layer, B, T)): the whole sequence's, T the most tokens it will cache; one LayerCache per
    each of ``n_layer`` layers (``Transformer.forward(tokens, cache=...)``)."""

    def __init__(
        self, positions: torch.Tensor, n_layer: int, distances: torch.Tensor | None = None
    ) -> None:
        self.positions = positions  # (T,), (B, T) or (n_layer, B, T)
        self.length = 0  # tokens cached so far
        self.layers = [
            LayerCache(self, of_layer(positions, layer), of_layer(distances, layer))
            for layer in range(n_layer)
        ]

    @property
    def capacity(self) -> int:
        return self.positions.shape[-1]

    def next_positions(self, n: int) -> torch.Tensor:
        """The positions of the next ``n`` tokens -> (n,), (B, n) or (n_layer, B, n)."""
        assert self.length + n <= self.capacity, f"{self.length} + {n} > {self.capacity} tokens"
        return self.positions[..., self.length : self.length + n]

    def advance(self, n: int) -> None:
        """``n`` more tokens have been through every layer."""
        self.length += n


class LayerCache:
    """One layer's keys and values (and, for a content bias, its inputs and unscaled queries)
    of the tokens its ``DecodeCache`` has seen, in buffers of the decode's capacity, and the
    layer's ``positions`` (T,) or (B, T) and randomized ``distances`` (None or (B, T))."""

    def __init__(
        self, decode: DecodeCache, positions: torch.Tensor, distances: torch.Tensor | None
    ) -> None:
        self.decode = decode
        self.positions = positions
        self.distances = distances
        self.buffers: dict[str, torch.Tensor] = {}  # "k", "v" (B, H, T, hs); "x" (B, T, C), "q"

    @property
    def length(self) -> int:
        """The tokens cached so far: the token index of the next."""
        return self.decode.length

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, encoding: PositionalEncoding
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``encoding.queries_and_keys`` of the next n tokens' q, k (B, H, n, hs), transformed
        in their place in the whole sequence (whose other rows are zeros here)."""
        if not transforms_queries_and_keys(encoding):
            return q, k
        B, H, n, hs = q.shape
        start = self.length
        whole_q, whole_k = (t.new_zeros(B, H, self.decode.capacity, hs) for t in (q, k))
        whole_q[:, :, start : start + n], whole_k[:, :, start : start + n] = q, k
        whole_q, whole_k = encoding.queries_and_keys(whole_q, whole_k, self.positions)
        return whole_q[:, :, start : start + n], whole_k[:, :, start : start + n]

    def kept(self, name: str, new: torch.Tensor, dim: int) -> torch.Tensor:
        """Every token's ``name`` through ``new``'s, whose tokens (along ``dim``) are the next."""
        start = self.length
        end = start + new.shape[dim]
        if name not in self.buffers:
            shape = list(new.shape)
            shape[dim] = self.decode.capacity
            self.buffers[name] = new.new_empty(shape)
        buffer = self.buffers[name]
        buffer.narrow(dim, start, end - start).copy_(new)
        return buffer.narrow(dim, 0, end)

    def queries_keys_values(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        encoding: PositionalEncoding,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, object | None]:
        """The next n tokens' q (B, H, n, hs), transformed by ``encoding`` and not yet scaled,
        every token's k and v (B, H, t + n, hs) through them, and the encoding's content_state
        of every token (None: no bias from the content), from the layer's input ``x`` (B, n, C)
        and its untransformed q, k, v (B, H, n, hs); caches them."""
        q, k = self.queries_and_keys(q, k, encoding)  # (B, H, n, hs) each
        keys, values = self.kept("k", k, 2), self.kept("v", v, 2)  # (B, H, t + n, hs) each
        if not encoding.has_content_bias:
            return q, keys, values, None
        inputs, queries = self.kept("x", x, 1), self.kept("q", q, 2)
        positions = self.positions[..., : keys.shape[2]]  # (t + n,) or (B, t + n)
        return q, keys, values, encoding.content_state(inputs, queries, keys, positions)

    def attend(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        encoding: PositionalEncoding,
        content: object | None,
        variant: AttentionVariant | None = None,
    ) -> torch.Tensor:
        """The attention output (B, H, n, hs) of the next n tokens' queries q (B, H, n, hs) over
        the cached tokens and themselves, ``keys`` and ``values`` (B, H, t + n, hs), with
        ``encoding``'s biases (``content``: its content_state of every token) and the layer's
        attention ``variant``'s weights."""
        end = keys.shape[2]
        positions = self.positions[..., :end]  # (t + n,) or (B, t + n)
        distances = None if self.distances is None else self.distances[..., :end]  # (B, t + n)
        if self.length == 0:  # the prompt: as a forward pass without a cache attends
            biases = QueryBlockBiases(encoding, keep_elements=0, distances=distances)
            return causal_attention(
                q, keys, values, positions, encoding, 0.0, biases, content, variant
            )
        weights = query_probabilities(q, keys, positions, encoding, content, distances, variant)
        return weights.to(values.dtype) @ values  # (B, H, n, hs)


def transforms_queries_and_keys(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` overrides the hooks that transform q and k (RoPE, xPos)."""
    return overrides(encoding, "queries_and_keys") or overrides(encoding, "rotate")
