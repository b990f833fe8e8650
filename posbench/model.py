"""A small decoder-only transformer whose positional encoding is pluggable.

Read top to bottom: attention -> MLP -> block -> ModelArgs -> Transformer. The model asks its
encoding (posbench.encodings.base.PositionalEncoding) to embed, rotate and bias, and never
branches on which encoding it has.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings import PositionalEncoding, build_encoding
from posbench.errors import PosbenchError

VOCAB_SIZE = 256  # byte-level: every corpus is read as raw bytes, no tokenizer to download


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_head: int, dropout: float):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout

    def forward(
        self, x: torch.Tensor, positions: torch.Tensor, encoding: PositionalEncoding
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        q = encoding.rotate(q, positions)  # (B, nh, T, hs)
        k = encoding.rotate(k, positions)
        bias = encoding.score_bias(positions, positions)
        dropout = self.dropout if self.training else 0.0
        if bias is None:
            # The fused causal kernel never builds a (T, T) mask.
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(
                q, k, v, attn_mask=causal_bias(bias), dropout_p=dropout
            )
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


def causal_bias(bias: torch.Tensor) -> torch.Tensor:
    """Fold the causal mask into an additive score bias (H, Tq, Tk): future keys get -inf.

    Assumes queries and keys cover the same positions, so key j is in query i's future iff j > i.
    """
    tq, tk = bias.shape[-2:]
    future = torch.ones(tq, tk, dtype=torch.bool, device=bias.device).triu(1)
    return bias.masked_fill(future, float("-inf"))


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
        self, x: torch.Tensor, positions: torch.Tensor, encoding: PositionalEncoding
    ) -> torch.Tensor:
        x = x + self.attn(self.ln_attn(x), positions, encoding)
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
        self.encoding = encoding  # one instance, shared by every layer
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
    def max_length(self) -> int | None:
        """Longest input the model can represent (``None``: any length)."""
        return self.encoding.max_length

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        T = tokens.shape[1]
        if self.max_length is not None and T > self.max_length:
            raise PosbenchError(
                f"input length {T} exceeds the {self.max_length} positions this "
                f"{self.encoding.config.name} model can represent"
            )
        positions = torch.arange(T, device=tokens.device)  # (T,)
        x = self.token_embedding(tokens)  # (B, T, C)
        x = self.dropout(self.encoding.embed(x, positions))
        for block in self.blocks:
            x = block(x, positions, self.encoding)
        return self.lm_head(self.ln_final(x))  # (B, T, vocab)

    def num_parameters(self) -> int:
        """Parameters counted once (the tied embedding is shared with the output layer)."""
        return sum(p.numel() for p in self.parameters())


def build_model(model: Mapping[str, Any], encoding: Mapping[str, Any]) -> Transformer:
    """A fresh model from plain config mappings (a ``model`` and an ``encoding`` section)."""
    args = ModelArgs(**model)
    return Transformer(args, build_encoding(encoding, args.d_model, args.n_head))
