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

Every position of the sequence is known up front (randomized positions draw them per example),
so the cache holds them all, and each call takes the next. An encoding may read the sequence's
positions at large when it transforms q and k (RoPE's eval-time scaling factor follows the
last position, xPos centres its factors between the first and the last): the new tokens' q and
k are transformed in their place in the whole sequence, as a forward pass over it transforms
them (O(T) too), so a step's logits are those of that forward pass at its token.

The first call (the prompt, all at once) attends as a forward pass without a cache does
(posbench.attention.causal_attention); the later ones written out
(posbench.attention.query_probabilities): a few queries over t keys hold O(t) scores.
"""

from __future__ import annotations

import torch

from posbench.attention import causal_attention, query_probabilities
from posbench.encodings import PositionalEncoding


class DecodeCache:
    """The cache of a decode of sequences at ``positions`` (T,), shared by the batch, or
    (B, T): the whole sequence's, T the most tokens it will cache; one LayerCache per each of
    ``n_layer`` layers (``Transformer.forward(tokens, cache=...)``)."""

    def __init__(self, positions: torch.Tensor, n_layer: int) -> None:
        self.positions = positions  # (T,) or (B, T)
        self.length = 0  # tokens cached so far
        self.layers = [LayerCache(self) for _ in range(n_layer)]

    @property
    def capacity(self) -> int:
        return self.positions.shape[-1]

    def next_positions(self, n: int) -> torch.Tensor:
        """The positions of the next ``n`` tokens -> (n,) or (B, n)."""
        assert self.length + n <= self.capacity, f"{self.length} + {n} > {self.capacity} tokens"
        return self.positions[..., self.length : self.length + n]

    def advance(self, n: int) -> None:
        """``n`` more tokens have been through every layer."""
        self.length += n


class LayerCache:
    """One layer's keys and values (and, for a content bias, its inputs and queries) of the
    tokens its ``DecodeCache`` has seen, in buffers of the decode's capacity."""

    def __init__(self, decode: DecodeCache) -> None:
        self.decode = decode
        self.buffers: dict[str, torch.Tensor] = {}  # "k", "v" (B, H, T, hs); "x" (B, T, C), "q"

    def seen_positions(self, n: int) -> torch.Tensor:
        """The positions of every token through the next ``n`` -> (t + n,) or (B, t + n)."""
        return self.decode.positions[..., : self.decode.length + n]

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, encoding: PositionalEncoding
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``encoding.queries_and_keys`` of the next n tokens' q, k (B, H, n, hs), transformed
        in their place in the whole sequence (whose other rows are zeros here)."""
        if not transforms_queries_and_keys(encoding):
            return q, k
        B, H, n, hs = q.shape
        start = self.decode.length
        whole_q, whole_k = (t.new_zeros(B, H, self.decode.capacity, hs) for t in (q, k))
        whole_q[:, :, start : start + n], whole_k[:, :, start : start + n] = q, k
        whole_q, whole_k = encoding.queries_and_keys(whole_q, whole_k, self.decode.positions)
        return whole_q[:, :, start : start + n], whole_k[:, :, start : start + n]

    def kept(self, name: str, new: torch.Tensor, dim: int) -> torch.Tensor:
        """Every token's ``name`` through ``new``'s, whose tokens (along ``dim``) are the next."""
        start = self.decode.length
        end = start + new.shape[dim]
        if name not in self.buffers:
            shape = list(new.shape)
            shape[dim] = self.decode.capacity
            self.buffers[name] = new.new_empty(shape)
        buffer = self.buffers[name]
        buffer.narrow(dim, start, end - start).copy_(new)
        return buffer.narrow(dim, 0, end)

    def attend(
        self,
        x: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        encoding: PositionalEncoding,
    ) -> torch.Tensor:
        """The attention output (B, H, n, hs) of the next n tokens' queries q and keys and
        values k, v (B, H, n, hs), from the layer's normed input ``x`` (B, n, C), over the
        cached tokens and themselves, with ``encoding``'s biases; caches them."""
        first = self.decode.length == 0
        positions = self.seen_positions(q.shape[2])  # (t + n,) or (B, t + n)
        keys, values = self.kept("k", k, 2), self.kept("v", v, 2)  # (B, H, t + n, hs) each
        content = None
        if encoding.has_content_bias:
            inputs, queries = self.kept("x", x, 1), self.kept("q", q, 2)
            content = encoding.content_state(inputs, queries, keys, positions)
        if first:  # the prompt: as a forward pass without a cache attends
            return causal_attention(q, k, v, positions, encoding, content=content)
        weights = query_probabilities(q, keys, positions, encoding, content)  # (B, H, n, t + n)
        return weights.to(values.dtype) @ values


def transforms_queries_and_keys(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` overrides the hooks that transform q and k (RoPE, xPos)."""
    cls = type(encoding)
    return (
        cls.queries_and_keys is not PositionalEncoding.queries_and_keys
        or cls.rotate is not PositionalEncoding.rotate
    )
