"""The interface every positional encoding implements.

A decoder asks its encoding for three things, each with a neutral default, and never looks
at the encoding's name:

* ``embed``  - add position information to the token embeddings (absolute encodings);
* ``rotate`` - transform queries and keys per head before their dot product (RoPE);
* ``score_bias`` - an additive bias on the attention logits (ALiBi, T5-style biases).

``max_length`` says how long a sequence the encoding can represent (``None``: any length),
so evaluation can report a length as unsupported instead of silently clamping positions.
``scaling_record`` says which eval-time extension (e.g. RoPE's YaRN) the encoding applies at a
length, so every evaluation record names the method it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


@dataclass
class EncodingConfig:
    """Fields shared by every encoding's config; subclasses add their own parameters."""

    name: str = "none"


class PositionalEncoding(nn.Module):
    """Base class: a no-op encoding. Subclasses override only the hooks they need."""

    Config: type[EncodingConfig] = EncodingConfig

    def __init__(self, config: EncodingConfig, d_model: int, n_head: int) -> None:
        super().__init__()
        self.config = config
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head

    @property
    def max_length(self) -> int | None:
        """Longest sequence this encoding represents; ``None`` means unbounded."""
        return None

    def scaling_record(self, length: int) -> dict[str, Any]:
        """The eval-time extension applied to a sequence of ``length`` positions, as eval-record
        fields: ``scaling`` (the method; "none" = evaluated as trained), ``scaling_factor`` (the
        factor s it used at this length, or None) and ``scaling_factor_setting`` (the configured
        factor; None when s follows each length, or without scaling)."""
        return {"scaling": "none", "scaling_factor": None, "scaling_factor_setting": None}

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``x`` (B, T, C) at integer ``positions`` (T,) -> (B, T, C)."""
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries or keys ``x`` (B, H, T, hs) at ``positions`` (T,) -> (B, H, T, hs)."""
        return x

    def score_bias(
        self, query_positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor | None:
        """Additive attention-logit bias (H, Tq, Tk), or ``None`` for no bias.

        At long lengths the model asks per block of queries, with the keys up to the block's
        last position, so the bias must depend only on the positions it is given."""
        return None
