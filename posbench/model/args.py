"""``ModelArgs``: everything besides the encoding that a model is built from, checked as it is
made (a user's mistake in ``model.*`` becomes one PosbenchError line), and stored beside the
weights so that a run's model can be rebuilt from them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch.nn.functional as F

from posbench.errors import PosbenchError
from posbench.model.attention_options import check_attention_options
from posbench.model.attention_scaling import SCALINGS

VOCAB_SIZE = 256  # byte-level: every corpus is read as raw bytes, no tokenizer to download
ACTIVATIONS = {"gelu": F.gelu, "relu": F.relu}  # model.activation: the MLP's
NORM_POSITIONS = ("pre", "post")  # model.norm_position: see Block


@dataclass
class ModelArgs:
    """Everything besides the encoding that is needed to rebuild a model from its weights."""

    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    vocab_size: int = VOCAB_SIZE
    # Queries scaled by the keys they see or their position (attention_scaling.py).
    # Runs saved before these fields existed load with the defaults: no scaling.
    attention_scaling: str = "none"  # none | ssmax | llama4
    attention_floor_scale: int = 8192  # llama4: HF Llama4TextConfig.floor_scale
    attention_scale: float = 0.1  # llama4: HF Llama4TextConfig.attn_scale
    norm_position: str = "pre"  # pre | post (Block); runs saved before it: pre
    activation: str = "gelu"  # gelu | relu (MLP); runs saved before it: gelu
    causal: bool = True  # false: each token attends to its whole row; runs saved before it: true
    # Attention variants (posbench/model/attention_options.py; runs saved before them: all off).
    qk_norm: bool = False  # q and k RMS-normalised per head, learned gains, before the encoding
    attn_gate: str = "none"  # none | headwise | elementwise: sigmoid(x W) on the output
    attn_sinks: bool = False  # a learned sink logit per head in the softmax's denominator
    attention: str = "softmax"  # softmax | sigmoid | stick_breaking
    sigmoid_length: int | None = None  # sigmoid: L of its logits' bias b = -ln L

    def __post_init__(self) -> None:
        for key, allowed in (("norm_position", NORM_POSITIONS), ("activation", ACTIVATIONS)):
            if getattr(self, key) not in allowed:
                raise PosbenchError(
                    f"model.{key} must be one of {', '.join(allowed)} (got {getattr(self, key)!r})"
                )
        if self.d_model % self.n_head:
            raise PosbenchError(
                f"model.n_head ({self.n_head}) must divide model.d_model ({self.d_model})"
            )
        if self.attention_scaling not in SCALINGS:
            raise PosbenchError(
                f"model.attention_scaling must be one of {', '.join(SCALINGS)} "
                f"(got {self.attention_scaling!r})"
            )
        check_attention_options(
            self.attention, self.attn_gate, self.attn_sinks, self.sigmoid_length, self.causal
        )
        if self.attention_floor_scale <= 0:
            raise PosbenchError(
                f"model.attention_floor_scale must be positive (got {self.attention_floor_scale})"
            )

    def to_dict(self) -> dict:
        return asdict(self)
