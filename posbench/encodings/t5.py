"""T5 relative position bias (Raffel et al. 2020, https://arxiv.org/abs/1910.10683, section 2.1).

Each (query, key) pair falls into one of ``num_buckets`` buckets by its distance; the bias is a
learned scalar per (bucket, head), added to the attention logits and shared by every layer (the
model holds one encoding instance). Causal (unidirectional) buckets, as in T5's decoder: half
the buckets hold one distance each (0, 1, ..., num_buckets/2 - 1), the other half cover
distances up to ``max_distance`` in logarithmically growing ranges, and every farther distance
shares the last bucket, which is what lets the bias extend to any length. Attending both ways
(``model.causal=false``), T5's encoder's bidirectional buckets: half of them for keys at or
before the query, half for keys after it, each half bucketed as above (t5_two_sided_bucket).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class T5Config(EncodingConfig):
    name: str = "t5"
    num_buckets: int = 32
    max_distance: int = 128


def check_buckets(num_buckets: int, max_distance: int) -> None:
    """Refuse bucket settings that leave no room for the exact or the log-spaced half."""
    if num_buckets < 2:
        raise PosbenchError(f"encoding.num_buckets must be >= 2 (got {num_buckets})")
    if max_distance <= num_buckets // 2:
        raise PosbenchError(
            f"encoding.max_distance must exceed num_buckets/2 = {num_buckets // 2}, the last "
            f"exactly bucketed distance (got {max_distance})"
        )


def t5_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """Causal T5 bucket of each ``relative_position`` = key position - query position.

    As in T5 (Mesh TensorFlow's ``_relative_position_bucket`` with ``bidirectional=False``):
    a past key at distance n = -relative_position goes to bucket n when n < num_buckets/2,
    else to num_buckets/2 + floor(log(n / (num_buckets/2)) / log(max_distance / (num_buckets/2))
    * num_buckets/2), capped at num_buckets - 1. Future keys (n < 0) share bucket 0; a causal
    mask hides them anyway. The logarithm is taken in float64 (T5 uses float32), so a bucket
    boundary is never moved by rounding.
    """
    check_buckets(num_buckets, max_distance)
    exact = num_buckets // 2
    distance = (-relative_position).clamp(min=0)
    # Clamped to >= exact so that the log is finite where the exact branch is taken anyway.
    log_ratio = torch.log(distance.clamp(min=exact).double() / exact) / math.log(
        max_distance / exact
    )
    log_bucket = exact + (log_ratio * (num_buckets - exact)).long()
    return torch.where(distance < exact, distance, log_bucket.clamp(max=num_buckets - 1))


def t5_two_sided_bucket(
    relative_position: torch.Tensor, num_buckets: int = 32, max_distance: int = 128
) -> torch.Tensor:
    """Bidirectional T5 bucket of each ``relative_position`` = key position - query position, as
    T5's encoder buckets it (``_relative_position_bucket`` with ``bidirectional=True``): keys at
    or before the query take t5_bucket of their distance among num_buckets/2 buckets, keys after
    it the same of theirs, from bucket num_buckets/2 on."""
    half = num_buckets // 2
    if half < 2:  # each side needs two buckets at least (check_buckets of its half)
        raise PosbenchError(
            "model.causal=false splits encoding.num_buckets between keys before and after the "
            f"query: it must be >= 4 (got {num_buckets})"
        )
    after = (relative_position > 0).long() * half
    return after + t5_bucket(-relative_position.abs(), half, max_distance)


@register("t5")
class T5RelativeBias(PositionalEncoding):
    Config = T5Config
    bidirectional = True

    def __init__(self, config: T5Config, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        check_buckets(config.num_buckets, config.max_distance)
        # An embedding table, like every learned position table here, so it is initialised
        # like one and kept out of weight decay (train.make_optimizer).
        self.bias_table = nn.Embedding(config.num_buckets, n_head)

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor:
        buckets = t5_bucket(-distance, self.config.num_buckets, self.config.max_distance)
        return self.bias_table.weight.T[:, buckets]  # (H, D)

    def two_sided_bias(self, distance: torch.Tensor) -> torch.Tensor:
        buckets = t5_two_sided_bucket(-distance, self.config.num_buckets, self.config.max_distance)
        return self.bias_table.weight.T[:, buckets]  # (H, D)
