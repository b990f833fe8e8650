"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", https://arxiv.org/abs/2212.10554):
RoPE whose scores decay with distance.

After RoPE's rotation, pair i of the query at position m is multiplied by zeta_i^(m/gamma)
and pair i of the key at n by zeta_i^(-n/gamma), with zeta_i = (2i/d + 0.4) / 1.4 < 1 and
gamma = ``scale_base``. Their product zeta_i^((m - n)/gamma) depends on the distance alone, so
the score is still a function of m - n, and it shrinks as the key recedes into the past: the
fast pairs (small zeta_i) decay most, the slow ones (zeta_i near 1) hardly at all.

Every RoPE option carries over (``base``, ``layout``, ``fraction``, ``keep_frequencies``),
and so does the eval-time ``scaling``: it changes the rotation's frequencies (and YaRN's or
LongRoPE's factor on q and k) and leaves the decay, a function of the distance as trained,
alone. Pairs that p-RoPE stops turning keep their decay; dims that do not rotate under partial
rotary get none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from posbench.encodings.base import remedy_verb
from posbench.encodings.registry import register
from posbench.encodings.rope import (
    RopeConfig,
    RotaryPositionalEncoding,
    rotate_leading,
    shared_by_heads,
)
from posbench.errors import PosbenchError

# The largest |exponent| of e that a factor may reach: float32 and bf16 hold e^+-87.3 as normal
# numbers, and the margin leaves room for the values of q and k the factors multiply.
MAX_LOG_FACTOR = 85.0
LOG_FASTEST_DECAY = math.log(1.4 / 0.4)  # -log zeta_0, the first pair's (the fastest) decay


@dataclass
class XposConfig(RopeConfig):
    name: str = "xpos"
    scale_base: float = 512.0  # gamma: the decay zeta_i^(distance / gamma)


def xpos_decay(positions: torch.Tensor, dim: int, scale_base: float) -> torch.Tensor:
    """zeta_i^((m - c)/gamma) for the queries at integer ``positions`` m ((T,) or (B, T)) and
    the d/2 = ``dim``/2 pairs -> ([B,] T, d/2) float64; the keys get its inverse.

    c is the middle of each row's positions, (min + max + 1) // 2 (T // 2 for 0..T-1, as
    x-transformers centres it). The scores depend on m - n only, so any c gives the same
    scores, but c bounds the exponent's magnitude by half the span of positions: at 16,384
    tokens and gamma = 512 the factors stay within zeta_0^(+-16) = e^(+-20), far inside the
    range of float32 and bf16 (e^(+-88)). From 0 instead, the keys at the end of a
    sequence of 36k positions (gamma = 512, or randomized positions that far) would be scaled by
    more than float32 can hold; centred, a span of 2 * 85 * gamma / log(3.5) = 69,478 positions
    (gamma = 512) reaches e^(+-85), the most ``max_length`` admits.
    """
    zeta = (torch.arange(0, dim, 2, dtype=torch.float64) / dim + 0.4) / 1.4  # (d/2,)
    lowest = positions.amin(dim=-1, keepdim=True)
    centre = (lowest + positions.amax(dim=-1, keepdim=True) + 1) // 2  # ([B,] 1)
    exponent = (positions - centre).to(torch.float64)[..., None] / scale_base  # ([B,] T, 1)
    return zeta.to(positions.device) ** exponent  # ([B,] T, d/2)


@register("xpos")
class XposEncoding(RotaryPositionalEncoding):
    Config = XposConfig
    # Its decay zeta^((i - j) / gamma) grows without bound for keys after the query: defined for
    # past keys only (Sun et al. 2022 use it causally).
    bidirectional = False

    def __init__(self, config: XposConfig, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        if not config.scale_base > 0:
            raise PosbenchError(
                f"encoding.scale_base must be positive: the decay is zeta^(distance / "
                f"scale_base) (got {config.scale_base})"
            )

    @property
    def max_length(self) -> int:
        """The longest span of positions whose factors stay within e^(+-MAX_LOG_FACTOR)."""
        return 2 * math.floor(MAX_LOG_FACTOR * self.config.scale_base / LOG_FASTEST_DECAY)

    def beyond_max_length_remedy(self, length: int, trained: bool = True) -> str:
        needed = math.ceil(length / 2 * LOG_FASTEST_DECAY / MAX_LOG_FACTOR)
        return (
            f"past them its decay zeta^(distance / scale_base) leaves float32's range; "
            f"{remedy_verb(trained)} encoding.scale_base>={needed}"
        )

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        rotation, attention_factor = self.rotations(positions)  # ([B, 1,] T, d/2)
        decay = xpos_decay(positions, self.dim, self.config.scale_base)  # ([B,] T, d/2)
        decay = shared_by_heads(decay, positions)  # ([B, 1,] T, d/2)
        layout = self.config.layout
        return (
            rotate_leading(q, rotation * decay, layout, attention_factor),
            rotate_leading(k, rotation / decay, layout, attention_factor),
        )
