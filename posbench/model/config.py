"""The schema of the ``model`` config group (conf/model/), beside the model it configures, as
posbench/data/ keeps its sources' schemas: posbench/config.py registers it with the others.
``ModelArgs`` (args.py) is what a run stores beside its weights; this is what users set."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ModelConfig:
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    mlp_ratio: int = 4
    dropout: float = 0.0
    # none | ssmax | llama4: queries scaled by the keys they see (ssmax, learned per head) or by
    # their position (llama4), for any encoding (posbench/model/attention_scaling.py)
    attention_scaling: str = "none"
    # llama4: log(floor((m + 1) / floor_scale) + 1) * scale + 1 at position m (HF's floor_scale
    # and attn_scale)
    attention_floor_scale: int = 8192
    attention_scale: float = 0.1
    # pre | post: where each block's layer norms sit (post: Ruoss et al.'s, no final norm)
    norm_position: str = "pre"
    activation: str = "gelu"  # gelu | relu: the MLP's
    # false: every token attends to every token of its row, as Ruoss et al.'s encoder does
    # (posbench/model/attention/bidirectional.py); answers at placeholders only, two-sided encodings
    causal: bool = True
    # Attention variants, for any encoding (posbench/model/attention_options.py, docs/attention.md):
    # q and k RMS-normalised per head with learned gains, before the encoding
    qk_norm: bool = False
    # none | headwise | elementwise: the output times sigmoid(x W) (Qiu et al. 2025)
    attn_gate: str = "none"
    # a learned sink logit per head in the softmax's denominator (gpt-oss)
    attn_sinks: bool = False
    # softmax | sigmoid (sigmoid(z - ln sigmoid_length)) | stick_breaking (Tan et al. 2024)
    attention: str = "softmax"
    # sigmoid: L of the bias b = -ln L on every logit (conf/model: train.seq_len)
    sigmoid_length: int | None = None
