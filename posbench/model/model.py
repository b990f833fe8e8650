"""A small decoder-only transformer whose positional encoding is pluggable.

Read top to bottom: attention -> MLP -> block -> Transformer, built from ModelArgs (args.py).
The model asks its encoding (posbench.encodings.base.PositionalEncoding, whose docstring tables
its hooks) to embed, transform queries and keys, and bias, and never branches on which encoding
it has. How attention adds a bias (fused kernels, blocks of queries, a hand-written backward) is
attention/'s business: the model calls its one entry point, causal_attention (or, with
``causal=False``, attention/bidirectional.py's). The loss is loss.py's, the memory a forward
pass needs posbench/evaluation/memory.py's estimate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import torch
from torch import nn

from posbench.encodings import PositionalEncoding, build_encoding
from posbench.errors import PosbenchError
from posbench.model.args import ACTIVATIONS, ModelArgs
from posbench.model.attention import (
    AttentionVariant,
    QueryBlockBiases,
    bidirectional,
    causal_attention,
    layer_biases,
    of_layer,
)
from posbench.model.attention.transitions import check_transitions
from posbench.model.attention_options import OutputGate, QKNorm
from posbench.model.attention_scaling import AttentionScaling, build_attention_scaling
from posbench.model.kv_cache import DecodeCache, LayerCache
from posbench.model.loss import next_token_nll


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention whose encoding may transform queries and keys (RoPE) and
    bias their scores by position (ALiBi, T5, ...) or content (FoX, CoPE), its queries scaled by
    ``scaling`` (posbench/model/attention_scaling.py; none by default), with the attention variants
    (posbench/model/attention_options.py): ``qk_norm``, an output ``gate`` (none, headwise or
    elementwise) and the ``variant``'s weights (sinks, sigmoid, stick-breaking; None: softmax):
    ``attn(x (B, T, C), positions, encoding) -> (B, T, C)``."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        dropout: float,
        scaling: AttentionScaling | None = None,
        qk_norm: bool = False,
        gate: str = "none",
        variant: AttentionVariant | None = None,
    ):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout
        self.scaling = scaling or AttentionScaling()
        # Modules only where an option is on: a model without them saves the weights it did.
        self.qk_norm = QKNorm(n_head, d_model // n_head) if qk_norm else None
        self.gate = OutputGate(d_model, n_head, gate) if gate != "none" else None
        self.variant = variant if variant is not None else AttentionVariant(n_head)

    def queries_keys_values(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoding: PositionalEncoding,
        cache: LayerCache | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, Any]:
        """The q, k, v (B, nh, T, hs) this layer attends with, from its input ``x`` (B, T, C),
        and the encoding's content_state (None: no bias from the content). With a ``cache``, x
        is the next T tokens of a decode: k and v (B, nh, t + T, hs) are every token's so far."""
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)  # (B, T, C) each
        # (B, nh, T, hs) each
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if self.qk_norm is not None:  # before the encoding: RoPE rotates the normalised q, k
            q, k = self.qk_norm(q, k)
        # The encoding acts on the scores: it transforms queries and keys, never values.
        # Before the scaling: a bias from the content (CoPE's gates and counts) reads q as is.
        if cache is None:
            q, k = encoding.queries_and_keys(q, k, positions)  # (B, nh, T, hs) each
            content = encoding.content_state(x, q, k, positions)
            first = 0  # the token index of x's first token
        else:
            first = cache.length
            q, k, v, content = cache.queries_keys_values(x, q, k, v, encoding)
        # Scaling the query scales q.k alone: the biases attention adds stay as they are.
        return self.scaling(q, encoding.window, first), k, v, content

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoding: PositionalEncoding,
        biases: QueryBlockBiases | bidirectional.TwoSidedBiases | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v, content = self.queries_keys_values(x, positions, encoding, cache)
        if cache is not None:  # x is the next T tokens of a cached decode
            y = cache.attend(q, k, v, encoding, content, self.variant)  # (B, nh, T, hs)
        else:
            dropout = self.dropout if self.training else 0.0
            both_ways = isinstance(biases, bidirectional.TwoSidedBiases)
            attend = bidirectional.bidirectional_attention if both_ways else causal_attention
            y = attend(q, k, v, positions, encoding, dropout, biases, content, self.variant)
        y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        if self.gate is not None:  # from the layer's input, before the output projection
            y = self.gate(x, y)
        return self.proj(y)


class MLP(nn.Module):
    """The position-wise feed-forward layer: up to ``hidden``, GELU (or ReLU), back down."""

    def __init__(self, d_model: int, hidden: int, dropout: float, activation: str = "gelu"):
        super().__init__()
        self.up = nn.Linear(d_model, hidden, bias=False)
        self.down = nn.Linear(hidden, d_model, bias=False)
        self.dropout = nn.Dropout(dropout)
        self.activation = ACTIVATIONS[activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.activation(self.up(x))  # (B, T, hidden)
        return self.dropout(self.down(h))  # (B, T, C)


class Block(nn.Module):
    """Pre-LN residual block: x + attn(ln(x)), then x + mlp(ln(x)). Normalising inside the
    residual branch keeps the gradients well behaved at initialisation, where post-LN needs a
    careful warm-up (Xiong et al. 2020, https://arxiv.org/abs/2002.04745). Post-LN
    (``norm_position="post"``), the original transformer's and Ruoss et al.'s: ln(x + attn(x)),
    then ln(x + mlp(x))."""

    def __init__(self, args: ModelArgs):
        super().__init__()
        self.ln_attn = nn.LayerNorm(args.d_model)
        scaling = build_attention_scaling(
            args.attention_scaling, args.n_head, args.attention_floor_scale, args.attention_scale
        )
        variant = AttentionVariant(
            args.n_head, args.attention, args.attn_sinks, args.sigmoid_length
        )
        self.attn = CausalSelfAttention(
            args.d_model, args.n_head, args.dropout, scaling, args.qk_norm, args.attn_gate, variant
        )
        self.ln_mlp = nn.LayerNorm(args.d_model)
        self.mlp = MLP(args.d_model, args.mlp_ratio * args.d_model, args.dropout, args.activation)
        self.post_norm = args.norm_position == "post"

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        encoding: PositionalEncoding,
        biases: QueryBlockBiases | None = None,
        cache: LayerCache | None = None,
    ) -> torch.Tensor:
        if self.post_norm:
            x = self.ln_attn(x + self.attn(x, positions, encoding, biases, cache))  # (B, T, C)
            return self.ln_mlp(x + self.mlp(x))  # (B, T, C)
        x = x + self.attn(self.ln_attn(x), positions, encoding, biases, cache)  # (B, T, C)
        return x + self.mlp(self.ln_mlp(x))  # (B, T, C)


class Transformer(nn.Module):
    """Decoder-only language model over bytes or a tokenizer's tokens:
    ``model(tokens (B, T)) -> logits (B, T, vocab)``."""

    def __init__(self, args: ModelArgs, encoding: PositionalEncoding):
        super().__init__()
        self.args = args
        self.encoding = encoding  # the first layer's, and the one that embeds and bounds lengths
        bidirectional.check_two_sided(encoding, args.causal, args.attention_scaling)
        # The encoding says which encoding each layer attends with (one for all by default); the
        # instances it does not hold itself (a per-layer FIRE's fresh ones) are kept here.
        self.layer_encodings = encoding.layer_encodings(args.n_layer)
        check_transitions(self.layer_encodings, args.attention_scaling)
        own = {id(module) for module in encoding.modules()}
        self.deeper_encodings = nn.ModuleList(
            e for e in unique(self.layer_encodings) if id(e) not in own
        )
        self.token_embedding = nn.Embedding(args.vocab_size, args.d_model)
        self.dropout = nn.Dropout(args.dropout)
        self.blocks = nn.ModuleList(Block(args) for _ in range(args.n_layer))
        # Post-LN blocks end normalised already (Ruoss et al.'s encoder has no final norm).
        self.ln_final = nn.LayerNorm(args.d_model) if args.norm_position == "pre" else nn.Identity()
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

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        reduction: Literal["sum", "none"] = "sum",
        distances: torch.Tensor | None = None,
        cache: DecodeCache | None = None,
        lengths: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits (B, T, vocab) for ``tokens`` (B, T) at increasing integer ``positions``: (T,),
        shared by the batch (0..T-1 by default), (B, T), one row per sequence (randomized
        positions train each sequence at its own), or (n_layer, B, T), a draw per layer (the
        embedding takes the first's); ``distances`` (B, T) or (n_layer, B, T): randomized
        distances, at which a bias of the distance alone is taken (random_positions.py).
        Given ``targets`` (B, T), instead their negative log-likelihood in float32
        (``next_token_nll``), without the (B, T, vocab) logits where they are large: summed
        over those that are not -100 (``reduction="sum"``,
        what training needs) or one per target (``"none"``, (B, T), 0 where -100: what
        evaluation needs). Given a ``cache`` (kv_cache.py) instead of ``positions``
        and ``distances``, ``tokens`` are the next T tokens of a decode after those cached, at
        the cache's next positions (and distances), and are cached in turn. A bidirectional model
        (``causal=False``) hides each row's tokens past ``lengths`` (B,) (by default ``targets``'
        row_lengths) from it."""
        T = tokens.shape[1]
        needed = T  # the largest position + 1 (T by default, known without a device sync)
        if cache is not None:
            assert positions is None and distances is None, "a cache holds the decode's draws"
            positions = cache.next_positions(T)
        if positions is None:
            positions = torch.arange(T, device=tokens.device)  # (T,)
        elif self.max_length is not None:
            needed = int(positions[..., -1].max()) + 1
        if self.max_length is not None and needed > self.max_length:
            raise PosbenchError(
                f"input length {needed} exceeds the {self.max_length} positions this "
                f"{self.encoding.config.name} model can represent"
            )
        x = self.token_embedding(tokens)  # (B, T, C)
        x = self.dropout(self.encoding.embed(x, of_layer(positions, 0)))  # (B, T, C)
        biases = (  # one per layer
            layer_biases(self.layer_encodings, positions, distances)
            if self.args.causal
            else bidirectional.two_sided_biases(
                self.layer_encodings, positions, distances, lengths, targets
            )
        )
        for layer, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[layer]
            at = of_layer(positions, layer)
            x = block(x, at, self.layer_encodings[layer], biases[layer], layer_cache)
        if cache is not None:
            cache.advance(T)
        x = self.ln_final(x)  # (B, T, C)
        if targets is not None:
            nll = next_token_nll(x.flatten(0, 1), self.lm_head.weight, targets.flatten(), reduction)
            return nll.view_as(targets) if reduction == "none" else nll
        return self.lm_head(x)  # (B, T, vocab)

    def set_logit_temperature(self, beta: float) -> None:
        """Multiply every layer's q.k logits by ``beta`` from now on (1: as trained; biases stay
        unscaled): evaluation's fitted temperature (posbench/evaluation/temperature.py)."""
        for block in self.blocks:
            block.attn.scaling.temperature = beta

    def num_parameters(self) -> int:
        """Parameters counted once (the tied embedding is shared with the output layer)."""
        return sum(p.numel() for p in self.parameters())


def unique(encodings: list[PositionalEncoding]) -> list[PositionalEncoding]:
    """The distinct instances among ``encodings``, in order of first appearance."""
    return list({id(e): e for e in encodings}.values())


def build_model(
    model: Mapping[str, Any], encoding: Mapping[str, Any], vocab_size: int | None = None
) -> Transformer:
    """A fresh model from plain config mappings (a ``model`` and an ``encoding`` section), over
    ``vocab_size`` tokens (the data's tokenizer's; None: the model's own, bytes by default)."""
    args = (
        ModelArgs(**model)
        if vocab_size is None
        else ModelArgs(**{**model, "vocab_size": vocab_size})
    )
    return Transformer(args, build_encoding(encoding, args.d_model, args.n_head))
