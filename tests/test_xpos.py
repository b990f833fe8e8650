"""Specification of xPos: RoPE's rotation with a decay zeta_i^((m - n)/gamma) in the scores.

Expected values come from the paper's formula as microsoft/torchscale's
``xpos_relative_position.py`` computes it, written out here with ``math``, or from RoPE with
the decay multiplied in by hand (x-transformers' own module is compared in
test_references.py).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_encodings import rotation

from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import beyond_max_length
from posbench.model import Transformer
from posbench.model.args import ModelArgs

F64 = torch.float64
HEAD_DIM = 8  # d_model 32 / 4 heads


def random(*shape: int, seed: int = 0, dtype: torch.dtype = F64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, dtype=F64, generator=generator).to(dtype)


def xpos(**options):
    """An xpos encoding with head dim 8, in eval mode (where RoPE's scaling applies)."""
    return build_encoding({"name": "xpos", **options}, d_model=32, n_head=4).eval()


def zeta(i: int, d: int) -> float:
    """The paper's per-pair decay base, zeta_i = (2i/d + 0.4) / 1.4."""
    return (2 * i / d + 0.4) / 1.4


def torchscale_rows(
    x: torch.Tensor, length: int, gamma: float, downscale: bool, base: float = 1e4
) -> torch.Tensor:
    """torchscale's XPOS forward on ``x`` (length, d), written out: the positions 0..L-1 are
    shifted by min_pos = -(L // 2) rounded down (Python's -(L) // 2), pair (x[2i], x[2i+1]) of
    row t is rotated by R(t * base^(-2i/d)) (its sin and cos tables count t from 0) and scaled
    by zeta_i^((t + min_pos)/gamma), or by its inverse for keys (``downscale``)."""
    d = x.shape[-1]
    min_pos = -length // 2
    out = torch.empty_like(x)
    for t in range(length):
        for i in range(d // 2):
            scale = zeta(i, d) ** ((t + min_pos) / gamma)
            scale = 1 / scale if downscale else scale
            turned = rotation(t * base ** (-2 * i / d)) @ x[t, 2 * i : 2 * i + 2]
            out[t, 2 * i : 2 * i + 2] = scale * turned
    return out


@pytest.mark.parametrize("gamma", [512.0, 2.0])
def test_queries_and_keys_equal_torchscales_xpos_at_an_even_length(gamma):
    # At an even length torchscale's centre, L // 2 rounded up, is posbench's (min + max + 1) // 2.
    q, k = random(10, HEAD_DIM, seed=1), random(10, HEAD_DIM, seed=2)
    q_x, k_x = xpos(scale_base=gamma).queries_and_keys(q, k, torch.arange(10))
    torch.testing.assert_close(q_x, torchscale_rows(q, 10, gamma, downscale=False))
    torch.testing.assert_close(k_x, torchscale_rows(k, 10, gamma, downscale=True))


def test_scores_equal_torchscales_at_an_odd_length_where_the_centres_differ():
    # torchscale centres 0..10 at 6, posbench at 5: the q and k differ by a factor per pair,
    # the scores, which depend on m - n only, do not.
    q, k = random(11, HEAD_DIM, seed=3), random(11, HEAD_DIM, seed=4)
    q_x, k_x = xpos(scale_base=4.0).queries_and_keys(q, k, torch.arange(11))
    expected = torchscale_rows(q, 11, 4.0, False) @ torchscale_rows(k, 11, 4.0, True).T
    torch.testing.assert_close(q_x @ k_x.T, expected)


def decayed(x: torch.Tensor, positions: list[int], gamma: float, dims: int, sign: int):
    """``x`` (..., T, hs) with pair i of its first ``dims`` interleaved dims multiplied by
    zeta_i^(sign * (m - c)/gamma), c = (min + max + 1) // 2 of the positions m."""
    centre = (min(positions) + max(positions) + 1) // 2
    out = x.clone()
    for t, m in enumerate(positions):
        for i in range(dims // 2):
            out[..., t, 2 * i : 2 * i + 2] *= zeta(i, dims) ** (sign * (m - centre) / gamma)
    return out


@pytest.mark.parametrize(
    "scaling",
    [
        {"method": "none"},
        {"method": "linear", "factor": 4.0},
        {"method": "yarn", "factor": 4.0},
        {"method": "longrope", "short_factor": [1.0, 1.5, 2, 3], "long_factor": [1, 2, 4, 8]},
    ],
    ids=lambda scaling: scaling["method"],
)
@pytest.mark.parametrize("fraction", [1.0, 0.5])
def test_xpos_is_ropes_rotation_with_the_decay_on_the_rotated_pairs(scaling, fraction):
    # Eval-time scaling changes the rotation (and its attention factor) only: the decay stays
    # zeta_i^(+-(m - c)/gamma) as trained. Dims that do not rotate get no decay.
    positions = [0, 3, 4, 9, 40]
    options = {"fraction": fraction, "scaling": {**scaling, "original_length": 8}}
    if scaling["method"] == "longrope":
        options["fraction"] = 1.0  # its lists name one factor per rotated pair
    dims = int(HEAD_DIM * options["fraction"])
    q, k = random(2, 4, len(positions), HEAD_DIM, seed=5), random(2, 4, 5, HEAD_DIM, seed=6)
    rope = build_encoding({"name": "rope", **options}, d_model=32, n_head=4).eval()
    q_x, k_x = xpos(scale_base=8.0, **options).queries_and_keys(q, k, torch.tensor(positions))
    q_r, k_r = rope.queries_and_keys(q, k, torch.tensor(positions))
    torch.testing.assert_close(q_x, decayed(q_r, positions, 8.0, dims, +1))
    torch.testing.assert_close(k_x, decayed(k_r, positions, 8.0, dims, -1))


@pytest.mark.parametrize("distance", [0, 1, 7, 100])
def test_a_one_pair_head_scores_ropes_score_times_two_sevenths_to_the_distance_over_gamma(
    distance,
):
    # d = 2: zeta_0 = 0.4 / 1.4; the score at distance m - n is RoPE's times zeta_0^((m-n)/gamma)
    encoding = build_encoding({"name": "xpos", "scale_base": 16.0}, d_model=2, n_head=1).eval()
    rope = build_encoding({"name": "rope"}, d_model=2, n_head=1)
    q, k = random(2, 2, seed=7), random(2, 2, seed=8)
    positions = torch.tensor([3, 3 + distance])
    q_x, k_x = encoding.queries_and_keys(q, k, positions)
    q_r, k_r = rope.queries_and_keys(q, k, positions)
    expected = float(q_r[1] @ k_r[0]) * (0.4 / 1.4) ** (distance / 16)
    assert float(q_x[1] @ k_x[0]) == pytest.approx(expected, rel=1e-12)


@settings(max_examples=60, deadline=None)
@given(
    layout=st.sampled_from(["interleaved", "half"]),
    fraction=st.sampled_from([1.0, 0.5]),
    keep=st.sampled_from([1.0, 0.5]),
    gamma=st.sampled_from([512.0, 64.0, 8.0]),
    positions=st.lists(st.integers(0, 3000), min_size=2, max_size=6, unique=True),
    shift=st.integers(0, 3000),
    seed=st.integers(0, 2**16),
)
def test_xpos_scores_depend_only_on_relative_distance(
    layout, fraction, keep, gamma, positions, shift, seed
):
    encoding = xpos(layout=layout, fraction=fraction, keep_frequencies=keep, scale_base=gamma)
    q, k = random(len(positions), HEAD_DIM, seed=seed), random(len(positions), HEAD_DIM, seed=~seed)
    at = torch.tensor(sorted(positions))

    def scores(where: torch.Tensor) -> torch.Tensor:
        q_x, k_x = encoding.queries_and_keys(q, k, where)
        return q_x @ k_x.T  # (T, T)

    torch.testing.assert_close(scores(at + shift), scores(at), rtol=1e-9, atol=1e-9)


def test_one_row_of_positions_per_sequence_equals_each_row_alone():
    # Randomized positions: each row has its own centre, and the same q, k as alone.
    rows = torch.tensor([[0, 5, 9, 300], [2, 3, 1000, 4000]])
    q, k = random(2, 4, 4, HEAD_DIM, seed=9), random(2, 4, 4, HEAD_DIM, seed=10)
    q_x, k_x = xpos().queries_and_keys(q, k, rows)
    for b in range(2):
        q_b, k_b = xpos().queries_and_keys(q[b : b + 1], k[b : b + 1], rows[b])
        torch.testing.assert_close(q_x[b : b + 1], q_b, rtol=0, atol=0)
        torch.testing.assert_close(k_x[b : b + 1], k_b, rtol=0, atol=0)


@pytest.mark.parametrize("length", [16384, 69478], ids=["16384", "max_length"])
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 1e-5), (torch.bfloat16, 3e-2)])
def test_up_to_max_length_tokens_stay_finite_and_score_as_in_float64(length, dtype, rtol):
    # Uncentred, the last key at 16,384 would be scaled by zeta_0^(-32) = e^40 and the first
    # query's partner by e^-40; centred, every factor is within e^(+-20) there, and within
    # e^(+-85) at max_length (69,478 positions at gamma 512).
    assert length <= xpos().max_length
    q = random(1, 1, length, HEAD_DIM, seed=11, dtype=dtype)
    k = random(1, 1, length, HEAD_DIM, seed=12, dtype=dtype)
    q_x, k_x = xpos().queries_and_keys(q, k, torch.arange(length))
    assert q_x.dtype == k_x.dtype == dtype
    assert torch.isfinite(q_x).all() and torch.isfinite(k_x).all()
    assert (q_x.abs().amax(-1) > 0).all() and (k_x.abs().amax(-1) > 0).all()  # no underflow
    q64, k64 = xpos().queries_and_keys(q.double(), k.double(), torch.arange(length))
    middle = length // 2
    ends = torch.tensor([0, 1, middle - 1, middle, length - 2, length - 1])  # the scale's extremes
    scores = q_x[0, 0, ends].double() @ k_x[0, 0, ends].double().T
    expected = q64[0, 0, ends] @ k64[0, 0, ends].T
    past = torch.ones(len(ends), len(ends), dtype=torch.bool).tril()  # the keys attention sees
    torch.testing.assert_close(scores[past], expected[past], rtol=rtol, atol=rtol)


def test_max_length_is_where_the_first_pairs_factor_would_leave_e_to_the_85():
    assert xpos().max_length == 69478  # 2 * floor(85 * 512 / log 3.5)
    assert xpos(scale_base=1024.0).max_length == 138956
    assert xpos().max_length * math.log(3.5) / 2 / 512 == pytest.approx(85, abs=0.01)


def test_past_twice_max_length_the_factors_would_overflow_float32():
    # Why the cap: at 2 * 69,478 positions the first pair's factor is e^(+-170).
    length = 2 * xpos().max_length
    q = torch.ones(1, 1, length, HEAD_DIM)
    _, k_x = xpos().queries_and_keys(q, q, torch.arange(length))
    assert not torch.isfinite(k_x).all()


def test_an_evaluation_past_max_length_is_unsupported_naming_the_scale_base_that_would_fit():
    model = Transformer(ModelArgs(n_layer=1, n_head=4, d_model=32, vocab_size=16), xpos())
    assert beyond_max_length(model, 69478) is None
    assert beyond_max_length(model, 131072) == (
        "the xpos encoding represents 69478 positions; past them its decay "
        "zeta^(distance / scale_base) leaves float32's range; retrain with "
        "encoding.scale_base>=966"
    )
    assert xpos(scale_base=966.0).max_length >= 131072


@pytest.mark.parametrize("gamma", [0.0, -512.0])
def test_a_scale_base_that_is_not_positive_is_a_one_line_error(gamma):
    with pytest.raises(PosbenchError, match=r"encoding\.scale_base must be positive") as info:
        xpos(scale_base=gamma)
    assert "\n" not in str(info.value)


def test_xpos_has_no_bias():
    encoding = xpos()
    assert not encoding.has_score_bias and not encoding.has_content_bias
