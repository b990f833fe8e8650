"""NoPE: no positional information at all.

A causal decoder can still infer position from the causal mask (Kazemnejad et al. 2023,
"The Impact of Positional Encoding on Length Generalization in Transformers",
https://arxiv.org/abs/2305.19466), which makes this the baseline every other encoding must beat.
"""

from posbench.encodings.base import PositionalEncoding
from posbench.encodings.registry import register


@register("none")
class NoPositionalEncoding(PositionalEncoding):
    """Every hook keeps the base class's neutral default."""

    # Nothing of positions to orient: a model attending both ways sees a bag of tokens, as the
    # reference's NoPE encoder does (Ruoss et al. 2023).
    bidirectional = True
