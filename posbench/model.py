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
        dropout = self.dropout if self.training else 0.0
        y = causal_attention(q, k, v, positions, encoding, dropout)  # (B, nh, T, hs)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        return self.proj(y)


# A score bias (ALiBi, T5, KERPLE) cannot use SDPA's fused causal kernel: it is a float mask of
# (H, queries, keys), and SDPA builds scores of (B, H, queries, keys) next to it. At evaluation
# lengths that is gigabytes (4 heads at 16,384 tokens: 4 GiB per tensor in float32), so queries
# are split into blocks that keep each block's scores under this many elements (64 MiB in
# float32). Training lengths stay far below it and take the single-call path.
MAX_SCORE_ELEMENTS = 2**24


def query_block_size(batch: int, n_head: int, length: int) -> int:
    """Queries per attention call: all of them when their scores fit MAX_SCORE_ELEMENTS."""
    return max(1, min(length, MAX_SCORE_ELEMENTS // (batch * n_head * length)))


def causal_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    dropout: float = 0.0,
) -> torch.Tensor:
    """softmax(q k^T / sqrt(hs) + encoding's score bias + causal mask) v, for q, k, v of
    (B, H, T, hs) at ``positions`` (T,) -> (B, H, T, hs).

    Without a bias this is one fused causal SDPA call, which never builds a (T, T) mask. With
    one, each block of queries [s, e) attends to keys [0, e) only (later keys are all in its
    future), with the bias and the causal mask folded into one float mask of (H, e - s, e).
    Blocks run from the last (the most keys) to the first: each block's temporaries then fit
    in memory the previous block freed, where growing ones made glibc's heap grow (measured at
    16,384 tokens: 0.7-1.0 GB added by the forward pass in first-to-last order, 0.4 GB now).
    """
    B, H, T, _ = q.shape
    block = query_block_size(B, H, T)
    outputs = []
    for start in reversed(range(0, T, block)):
        end = min(start + block, T)
        query_positions, key_positions = positions[start:end], positions[:end]
        bias = encoding.score_bias(query_positions, key_positions)  # (H, e - s, e) or None
        if bias is None:  # the encoding adds no bias at all: no mask to build
            return unbiased_causal_attention(q, k, v, dropout)
        # (1, H, e - s, e): SDPA's CPU kernel takes a 4-D mask fused, a 3-D one 5x slower.
        mask = causal_bias(bias, query_positions, key_positions).to(q.dtype)[None]
        outputs.append(
            F.scaled_dot_product_attention(
                q[:, :, start:end], k[:, :, :end], v[:, :, :end], attn_mask=mask, dropout_p=dropout
            )
        )
    return torch.cat(outputs[::-1], dim=2)


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
    """Fold the causal mask into an additive score bias (H, Tq, Tk): a key whose position is
    after the query's gets -inf."""
    future = key_positions[None, :] > query_positions[:, None]  # (Tq, Tk)
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

    def inference_memory_bytes(self, batch_size: int, length: int) -> int:
        """An upper estimate of the memory one forward pass adds under inference mode (on top
        of the weights) for ``batch_size`` sequences of ``length`` tokens, so that evaluation
        can choose a batch that fits before it starts (benchmarks/long_eval_memory.py compares
        it with measured peaks).

        Terms, in elements: the live activations of one block (residual, layer-norm output,
        q/k/v and their rotated copies, attention output, the MLP's hidden layer and its GELU:
        at most 8*C + 2*hidden per token), the logits with the log-softmax of the loss (3*V per
        token) and, for a score bias, the attention scratch of one query block (the bias, its
        masked copy, SDPA's scores and probabilities, and the encoding's own intermediates:
        at most 6 per score), which query_block_size keeps bounded at any length.
        """
        a = self.args
        tokens = batch_size * length
        hidden = a.mlp_ratio * a.d_model
        elements = tokens * (8 * a.d_model + 2 * hidden + 3 * a.vocab_size)
        first = torch.zeros(1, dtype=torch.long, device=self.lm_head.weight.device)
        if self.encoding.score_bias(first, first) is not None:
            block = query_block_size(batch_size, a.n_head, length)
            elements += 6 * batch_size * a.n_head * block * length
        return elements * self.lm_head.weight.element_size()

    def num_parameters(self) -> int:
        """Parameters counted once (the tied embedding is shared with the output layer)."""
        return sum(p.numel() for p in self.parameters())


def build_model(model: Mapping[str, Any], encoding: Mapping[str, Any]) -> Transformer:
    """A fresh model from plain config mappings (a ``model`` and an ``encoding`` section)."""
    args = ModelArgs(**model)
    return Transformer(args, build_encoding(encoding, args.d_model, args.n_head))
