"""Learned absolute positions: one trainable vector per position, added to the embeddings.

As in GPT-2. The table has ``max_length`` rows (by default ``train.seq_len``); a position past
the table has no vector, so longer inputs are refused rather than clamped.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding, remedy_verb
from posbench.encodings.registry import register
from posbench.errors import PosbenchError


@dataclass
class LearnedConfig(EncodingConfig):
    name: str = "learned"
    max_length: int = 1024


@register("learned")
class LearnedPositionalEncoding(PositionalEncoding):
    Config = LearnedConfig
    bidirectional = True  # an absolute position says where a token is, whoever attends to it

    def __init__(self, config: LearnedConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if config.max_length < 1:
            raise PosbenchError(f"encoding.max_length must be >= 1 (got {config.max_length})")
        self.table = nn.Embedding(config.max_length, d_model)

    @property
    def max_length(self) -> int:
        return self.config.max_length

    def beyond_max_length_remedy(self, length: int, trained: bool = True) -> str:
        return f"{remedy_verb(trained)} encoding.max_length>={length}"

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return x + self.table(positions)  # (T, C) broadcasts over the batch, or (B, T, C)
