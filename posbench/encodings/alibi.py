"""ALiBi: attention with linear biases (Press et al. 2022, https://arxiv.org/abs/2108.12409).

No position is added to the embeddings. Head h adds -m_h * (i - j) to the logit of query i and
key j, after the 1/sqrt(d) scaling of q.k (SDPA adds its mask after scaling), so attention
fades linearly with distance at a rate fixed per head. The slopes m_h are a geometric sequence,
set (not learned) exactly as in the paper's reference code.

Attending both ways (``model.causal=false``), the bias is Ruoss et al.'s symmetric one
(google-deepmind/randomized_positional_encodings, compute_alibi_encodings_biases):
-m_h * (|i - j| - 1/2) for keys before the query, -m_h * |i - j| for keys after it; the 1/2
tells left from right.

``encoding.dape=true`` adds DAPE's network of the logits and this bias (posbench/encodings/dape.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from posbench.encodings.dape import DapeEncoding, DapeOptions
from posbench.encodings.registry import register


@dataclass
class AlibiConfig(DapeOptions):
    name: str = "alibi"


def alibi_slopes(n_heads: int) -> torch.Tensor:
    """The ALiBi slope of each of ``n_heads`` heads -> (n_heads,) float64.

    For n a power of two: the geometric sequence that starts at 2^(-8/n) with ratio 2^(-8/n),
    i.e. 2^(-8k/n) for k = 1..n. For other n, as the paper's reference code does: the c slopes
    of the largest power of two c < n, then every other slope of the 2c sequence (k = 1, 3, 5,
    ...) until there are n.
    """
    assert n_heads >= 1, "ALiBi needs at least one head"
    base = 1 << (n_heads.bit_length() - 1)  # the largest power of two <= n_heads
    slopes = [2 ** (-8 * k / base) for k in range(1, base + 1)]
    slopes += [2 ** (-8 * k / (2 * base)) for k in range(1, 2 * (n_heads - base), 2)]
    return torch.tensor(slopes, dtype=torch.float64)


@register("alibi")
class AlibiPositionalBias(DapeEncoding):
    Config = AlibiConfig
    bidirectional = True

    def __init__(self, config: AlibiConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        # Fixed and recomputable from n_head, so not saved in checkpoints.
        self.register_buffer("slopes", alibi_slopes(n_head).float(), persistent=False)

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor:
        # In the slopes' dtype: distances are exact below 2^24 in float32.
        return -self.slopes[:, None] * distance.to(self.slopes.dtype)  # (H, D)

    def two_sided_bias(self, distance: torch.Tensor) -> torch.Tensor:
        d = distance.to(self.slopes.dtype)
        return -self.slopes[:, None] * (d.abs() - 0.5 * (d > 0))  # (H, D)
