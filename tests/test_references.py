"""posbench's encodings against the reference implementations themselves, where they are on
PyPI: HF transformers (RoPE scaling, Llama's rotary) and lucidrains' x-transformers (rotary,
xPos, ALiBi, T5's bias), with learned weights copied across.

Both are test-only dependencies (the ``dev`` extra); posbench never imports them. The
references compute their frequencies in float32, so frequencies and rotations agree to float32
precision (a relative 1e-6), and everything posbench computes is float64.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.llama.modeling_llama import (
    apply_rotary_pos_emb as llama_apply_rotary_pos_emb,
)
from x_transformers.x_transformers import (
    AlibiPositionalBias,
    RelativePositionBias,
    RotaryEmbedding,
    apply_rotary_pos_emb,
)

from posbench.encodings import build_encoding
from posbench.encodings.rope import SCALING_METHODS

F64 = torch.float64
FLOAT32 = {"rtol": 1e-6, "atol": 1e-6}  # what a float32 reference can be held to


def random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


# --- HF transformers: RoPE scaling (modeling_rope_utils.ROPE_INIT_FUNCTIONS) ------------------

HEAD_DIM = 16  # d_model 64 / 4 heads
ORIGINAL = 32  # the training length the methods extend from


def hf_config(rope_scaling: dict, max_position_embeddings: int = ORIGINAL) -> LlamaConfig:
    """A Llama config of head dim 16 with ``rope_scaling`` (the config keys HF documents)."""
    return LlamaConfig(
        hidden_size=64,
        num_attention_heads=4,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        rope_scaling=rope_scaling,
    )


def posbench_frequencies(scaling: dict, length: int) -> tuple[torch.Tensor, float]:
    """theta (d/2,) and the attention factor posbench's rope uses at ``length`` positions."""
    options = {"name": "rope", "scaling": {"original_length": ORIGINAL, **scaling}}
    rope = build_encoding(options, d_model=64, n_head=4).eval()
    return rope.frequencies(rope.scaling_factor(length), length)


LONGROPE = {
    "short_factor": [1.0 + i / 16 for i in range(HEAD_DIM // 2)],
    "long_factor": [1.0 + i**2 / 2 for i in range(HEAD_DIM // 2)],
}
# (posbench's scaling options, HF's rope_scaling, the length): each method below, at the
# original length and past it.
HF_CASES = [
    ({"method": "linear", "factor": 4.0}, {"rope_type": "linear", "factor": 4.0}, 64),
    *(
        ({"method": "dynamic", "factor": 2.0}, {"rope_type": "dynamic", "factor": 2.0}, length)
        for length in (ORIGINAL, 80, 500)
    ),
    *(
        (
            {"method": "yarn", "factor": s},
            {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": ORIGINAL},
            128,
        )
        for s in (2.0, 4.0, 16.0)
    ),
    (
        {"method": "yarn", "factor": 4.0, "beta_fast": 16.0, "beta_slow": 2.0},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        128,
    ),
    (
        {"method": "yarn", "factor": 4.0, "attention_factor": 1.25},
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "attention_factor": 1.25,
            "original_max_position_embeddings": ORIGINAL,
        },
        128,
    ),
    (
        {"method": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0},
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": ORIGINAL,
        },
        256,
    ),
    *(
        (
            {"method": "longrope", "factor": 4.0, **LONGROPE},
            {
                "rope_type": "longrope",
                "factor": 4.0,
                "original_max_position_embeddings": ORIGINAL,
                **LONGROPE,
            },
            length,
        )
        for length in (ORIGINAL // 2, ORIGINAL, ORIGINAL + 1, 4 * ORIGINAL)
    ),
    (
        {"method": "longrope", "factor": 4.0, "attention_factor": 1.1, **LONGROPE},
        {
            "rope_type": "longrope",
            "factor": 4.0,
            "attention_factor": 1.1,
            "original_max_position_embeddings": ORIGINAL,
            **LONGROPE,
        },
        4 * ORIGINAL,
    ),
]


def case_id(case) -> str:
    scaling, _, length = case
    extras = ",".join(f"{k}={v}" for k, v in scaling.items() if k not in ("method", *LONGROPE))
    return f"{scaling['method']}[{extras}]-L{length}"


@pytest.mark.parametrize("case", HF_CASES, ids=[case_id(case) for case in HF_CASES])
def test_scaled_frequencies_and_attention_factor_equal_hfs_rope_init_functions(case):
    scaling, rope_scaling, length = case
    # HF's dynamic NTK extends from max_position_embeddings, the others from the original length
    config = hf_config(rope_scaling)
    inv_freq, hf_factor = ROPE_INIT_FUNCTIONS[rope_scaling["rope_type"]](
        config, None, seq_len=length
    )
    theta, factor = posbench_frequencies(scaling, length)
    torch.testing.assert_close(theta, inv_freq.double(), **FLOAT32)
    assert factor == pytest.approx(hf_factor, rel=1e-12)


def test_longrope_with_a_null_factor_is_hfs_with_the_length_as_max_position_embeddings():
    # HF's null factor is max_position_embeddings / original; posbench's is L / original at
    # each length L, so the two agree where the length is max_position_embeddings.
    length = 5 * ORIGINAL
    rope_scaling = {"rope_type": "longrope", "original_max_position_embeddings": ORIGINAL}
    config = hf_config(rope_scaling | LONGROPE, max_position_embeddings=length)
    inv_freq, hf_factor = ROPE_INIT_FUNCTIONS["longrope"](config, None, seq_len=length)
    theta, factor = posbench_frequencies({"method": "longrope", **LONGROPE}, length)
    torch.testing.assert_close(theta, inv_freq.double(), **FLOAT32)
    assert factor == pytest.approx(math.sqrt(1 + math.log(5) / math.log(ORIGINAL)), rel=1e-12)
    assert factor == pytest.approx(hf_factor, rel=1e-12)


def test_every_scaling_method_of_posbench_but_ntk_has_an_hf_case_here():
    # ntk (a fixed factor) is HF's dynamic at one length; "none" is the default rotary
    assert {case[0]["method"] for case in HF_CASES} == set(SCALING_METHODS) - {"none", "ntk"}


# --- HF transformers: Llama's rotary (layout half) --------------------------------------------


def test_rope_half_layout_equals_llamas_apply_rotary_pos_emb():
    config = hf_config(rope_scaling=None, max_position_embeddings=2048)
    positions = torch.tensor([0, 1, 2, 7, 100, 1000, 2047])
    q, k = random(2, 4, len(positions), HEAD_DIM, seed=1), random(2, 4, 7, HEAD_DIM, seed=2)
    cos, sin = LlamaRotaryEmbedding(config=config)(q, positions[None])  # (1, T, hs)
    q_hf, k_hf = llama_apply_rotary_pos_emb(q, k, cos, sin)
    rope = build_encoding({"name": "rope", "layout": "half"}, d_model=64, n_head=4)
    q_ours, k_ours = rope.queries_and_keys(q, k, positions)
    # float32 angles of up to 2047 radians: 1e-4 absolute
    torch.testing.assert_close(q_ours, q_hf, rtol=0, atol=1e-4)
    torch.testing.assert_close(k_ours, k_hf, rtol=0, atol=1e-4)


# --- x-transformers: RotaryEmbedding (plain and xPos; interleaved pairs) ----------------------

# x-transformers 2.x pairs dims (2i, 2i+1) (its rotate_half splits the last dim into (d r),
# r = 2): posbench's interleaved layout.
POSITIONS = torch.arange(48)


def test_rope_equals_x_transformers_rotary_embedding():
    rotary = RotaryEmbedding(HEAD_DIM).double()
    freqs, scale = rotary(POSITIONS)
    assert scale == 1.0
    x = random(2, 4, len(POSITIONS), HEAD_DIM, seed=3)
    rope = build_encoding({"name": "rope"}, d_model=64, n_head=4)
    torch.testing.assert_close(rope.rotate(x, POSITIONS), apply_rotary_pos_emb(x, freqs), **FLOAT32)


@pytest.mark.parametrize("scale_base", [512.0, 8.0])
@pytest.mark.parametrize("length", [48, 47])
def test_xpos_equals_x_transformers_rotary_embedding_with_xpos(scale_base, length):
    # x-transformers centres 0..L-1 at L // 2, as posbench does: q and k agree themselves.
    rotary = RotaryEmbedding(HEAD_DIM, use_xpos=True, scale_base=scale_base).double()
    positions = torch.arange(length)
    freqs, scale = rotary(positions)
    q, k = random(2, 4, length, HEAD_DIM, seed=4), random(2, 4, length, HEAD_DIM, seed=5)
    xpos = build_encoding({"name": "xpos", "scale_base": scale_base}, d_model=64, n_head=4)
    q_ours, k_ours = xpos.queries_and_keys(q, k, positions)
    # as x-transformers' Attention applies it: queries scaled up, keys down. Their float32
    # frequencies' error grows with the scale (up to zeta_0^-3 = 43 at scale_base 8): 1e-5.
    close = {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(q_ours, apply_rotary_pos_emb(q, freqs, scale), **close)
    torch.testing.assert_close(k_ours, apply_rotary_pos_emb(k, freqs, scale**-1), **close)


# --- x-transformers: ALiBi and T5's relative bias ---------------------------------------------


@pytest.mark.parametrize("n_head", [8, 12, 6, 1])
def test_alibi_bias_equals_x_transformers_on_every_key_a_query_sees(n_head):
    # x-transformers' bias is -slope * |i - j|, posbench's -slope * (i - j): the same wherever
    # j <= i; at future keys (masked) the signs differ.
    length = 40
    theirs = AlibiPositionalBias(heads=n_head)(length, length)  # (H, T, T)
    alibi = build_encoding({"name": "alibi"}, d_model=8 * n_head, n_head=n_head)
    ours = alibi.score_bias(torch.arange(length), torch.arange(length))  # (H, T, T)
    seen = torch.ones(length, length, dtype=torch.bool).tril()
    assert torch.equal(ours[:, seen], theirs[:, seen])


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 256), (8, 20)])
def test_t5_bias_equals_x_transformers_causal_relative_position_bias(num_buckets, max_distance):
    # Both bucket as T5's decoder: distance n = i - j, future keys at n = 0; n exact below
    # num_buckets / 2, then log-spaced to max_distance, capped at the last bucket. x-transformers
    # takes the log in float32, posbench in float64: the buckets still agree at every distance
    # here. x-transformers multiplies its bias by its ``scale`` argument (1 here).
    length = 3 * max_distance
    theirs = RelativePositionBias(
        scale=1.0, causal=True, num_buckets=num_buckets, max_distance=max_distance, heads=4
    )
    options = {"name": "t5", "num_buckets": num_buckets, "max_distance": max_distance}
    t5 = build_encoding(options, d_model=32, n_head=4)
    with torch.no_grad():
        t5.bias_table.weight.copy_(theirs.relative_attention_bias.weight)
    ours = t5.score_bias(torch.arange(length), torch.arange(length))  # (H, T, T)
    assert torch.equal(ours, theirs(length, length))
