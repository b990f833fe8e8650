"""The attention probabilities causal_attention attends with, written out: for ``posbench
diagnose`` (``attention_probabilities``) and a cached decode's later steps, a few queries over
every key (``query_probabilities``, posbench/model/kv_cache.py).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from posbench.encodings import PositionalEncoding
from posbench.model.attention.biases import distance_bias
from posbench.model.attention.blocks import causal_bias, outside_window
from posbench.model.attention.variants import AttentionVariant


def attention_probabilities(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    content: object | None,
    start: int,
    end: int,
    distances: torch.Tensor | None = None,
    variant: AttentionVariant | None = None,
) -> torch.Tensor:
    """The attention probabilities of queries [start, end) over keys [0, end) that
    causal_attention attends with, for q, k (B, H, T, hs) at ``positions`` (T,) or (B, T)
    -> (B, H, n, e), written out (posbench diagnose): the encoding's biases of positions (at
    the randomized ``distances`` (B, T) where given: distance_bias) and of the content
    (``content``: its content_state), 0 at future keys and outside a window; the weights of
    ``variant`` where given (sinks, sigmoid, stick-breaking: variants.py)."""
    keys = k[:, :, :end]
    queries = q[:, :, start:end]
    return query_probabilities(queries, keys, positions, encoding, content, distances, variant)


def query_probabilities(
    queries: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    content: object | None,
    distances: torch.Tensor | None = None,
    variant: AttentionVariant | None = None,
) -> torch.Tensor:
    """attention_probabilities of the last n queries (B, H, n, hs) of a sequence over its keys
    k (B, H, e, hs) at ``positions`` (e,) or (B, e) (or longer), at randomized ``distances``
    (B, e) (or longer) where given, with ``variant``'s weights -> (B, H, n, e): what a cached
    decode's step attends with (posbench/model/kv_cache.py)."""
    end = k.shape[2]
    start = end - queries.shape[2]
    scores = queries @ k.transpose(-1, -2) / math.sqrt(queries.shape[-1])
    if distances is None:  # ([B,] H, n, e) or None
        bias = encoding.score_bias(positions[..., start:end], positions[..., :end])
    else:  # the table at each pair's distance in tokens (future keys: 0's, masked below)
        apart = torch.arange(start, end)[:, None] - torch.arange(end)[None, :]  # (n, e)
        table = distance_bias(encoding, distances[..., :end])  # (B, H, e)
        bias = table[..., apart.clamp(min=0).to(queries.device)]  # (B, H, n, e)
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if content is not None:
        scores = scores + encoding.content_bias(content, slice(start, end), slice(0, end))
    scores = causal_bias(scores, start)
    if encoding.window is not None:
        scores = outside_window(scores, start, 0, encoding.window)
    if variant is not None:
        return variant.weights(scores, start)
    return F.softmax(scores, dim=-1)
