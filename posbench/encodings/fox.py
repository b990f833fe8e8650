"""FoX: the Forgetting Transformer's forget gate (Lin et al. 2025, https://arxiv.org/abs/2503.02130).

Every head h of every layer reads a scalar forget gate from each token's input x_t (the layer's
input after its layer norm),

    f_t = sigmoid(w_h . x_t + b_h),

and the attention logit of query i and key j <= i gets the log of the gates between them,

    bias_ij = sum_{l=j+1..i} log f_l = c_i - c_j,    c_t = sum_{l<=t} log f_l,

a decay that the content decides (an ALiBi whose slope each token sets: x-transformers calls it
``DataDependentAlibi``). No other position signal: positions are never read, so randomized
positions leave FoX unchanged. w and b start as the paper's code starts them
(zhixuan-lin/forgetting-transformer, ``fgate_proj``): w ~ N(0, 0.02), b = 0, so every gate
starts near 1/2 and attention near the diagonal.

c falls with the position (by 0.69 per token at the start: -11,000 at 16,384 tokens), so it is
accumulated in float64, and each query block's differences are taken relative to the block's
first query before they are rounded: near the diagonal float32 (or bf16) holds small numbers,
and only far keys, whose weight is exp(-large), see large ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from posbench.encodings.base import EncodingConfig, PositionalEncoding
from posbench.encodings.registry import register

GATE_INIT_STD = 0.02  # the paper's code: nn.init.normal_(std=initializer_range), 0.02


@dataclass
class FoxConfig(EncodingConfig):
    name: str = "fox"


@register("fox")
class ForgetGateBias(PositionalEncoding):
    Config = FoxConfig

    def __init__(self, config: FoxConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.gate_weight = nn.Parameter(torch.randn(n_head, d_model) * GATE_INIT_STD)  # (H, C)
        self.gate_bias = nn.Parameter(torch.zeros(n_head))  # (H,)

    @property
    def per_layer(self) -> bool:
        return True  # the paper's forget gate is one projection per layer

    def log_gate_sums(self, x: torch.Tensor) -> torch.Tensor:
        """c_t = sum_{l<=t} log f_l for each head of the layer input ``x`` (B, T, C)
        -> (B, H, T), in float64 (differentiable in x, w and b)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):  # in float32 whatever the autocast
            logits = F.linear(x.to(dtype), self.gate_weight.to(dtype), self.gate_bias.to(dtype))
        # A gate's rounding stays in the differences of the keys it lies between; a running
        # sum's would reach every later one, so the sum is float64.
        return F.logsigmoid(logits.double()).transpose(1, 2).cumsum(dim=-1)  # (B, H, T)

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.dtype]:
        # The bias in float32, or in float64 for a float64 model.
        return self.log_gate_sums(x), torch.promote_types(q.dtype, torch.float32)

    def key_bias(self, state: tuple[torch.Tensor, torch.dtype]) -> torch.Tensor:
        # c_i - c_j: c_i is the same for every key of query i, so the key's bias is -c_j.
        sums, _ = state
        return -sums  # (B, H, T) float64

    def content_bias(
        self, state: tuple[torch.Tensor, torch.dtype], queries: slice, keys: slice
    ) -> torch.Tensor:
        sums, dtype = state
        reference = sums[..., queries.start, None]  # (B, H, 1): c at the block's first query
        query_sums = (sums[..., queries] - reference).to(dtype)  # (B, H, n)
        key_sums = (sums[..., keys] - reference).to(dtype)  # (B, H, m)
        return query_sums[..., :, None] - key_sums[..., None, :]  # (B, H, n, m)
