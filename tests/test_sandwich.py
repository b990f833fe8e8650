"""Sandwich (Chi et al. 2023): the inner product of sinusoidal positions, shifted to 0 at distance
0 and compressed per head by h * 8/H.

Expected biases are written out here with ``math`` in float64: the sinusoid vectors p_i, p_j
built pair by pair and their dot product summed, never posbench's own helpers. The encoding
computes in float64 and returns float32, hence float32's tolerance.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posbench.encodings import build_encoding
from posbench.errors import PosbenchError

QUERIES, KEYS = [0, 3, 17, 250, 4000], [0, 1, 3, 16, 249, 3999]


def sandwich(n_head: int = 4, **options):
    return build_encoding({"name": "sandwich", **options}, d_model=8 * n_head, n_head=n_head)


def sinusoid(position: int, dim: int, base: float) -> list[float]:
    """p at ``position``: (sin, cos) of position / base^(2k/dim) for k = 1..dim/2."""
    vector = []
    for k in range(1, dim // 2 + 1):
        angle = position / base ** (2 * k / dim)
        vector += [math.sin(angle), math.cos(angle)]
    return vector


def written_out_bias(h: int, n_head: int, i: int, j: int, dim: int, base: float) -> float:
    """(p_i . p_j - dim/2) / (h * 8 / H) for head h = 1..H."""
    inner = sum(a * b for a, b in zip(sinusoid(i, dim, base), sinusoid(j, dim, base), strict=True))
    return (inner - dim / 2) / (h * 8 / n_head)


@pytest.mark.parametrize(("n_head", "dim", "base"), [(4, 128, 10000.0), (3, 16, 500.0)])
def test_bias_is_the_shifted_inner_product_of_sinusoids_over_each_heads_compression(
    n_head, dim, base
):
    encoding = sandwich(n_head, dim=dim, base=base)
    bias = encoding.score_bias(torch.tensor(QUERIES), torch.tensor(KEYS)).double()  # (H, Tq, Tk)
    expected = torch.tensor(
        [
            [[written_out_bias(h, n_head, i, j, dim, base) for j in KEYS] for i in QUERIES]
            for h in range(1, n_head + 1)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(bias, expected, rtol=1e-6, atol=1e-6)


def test_a_hand_computed_case_two_heads_dim_four_base_sixteen():
    # Frequencies 16^(-2/4) = 1/4 and 16^(-1) = 1/16; at distance 4 the inner product is
    # cos(1) + cos(1/4) = 0.5403023058681398 + 0.9689124217106447, minus d'/2 = 2:
    # -0.4907852724212155, divided by h * 8/2 = 4 (head 1) and 8 (head 2).
    bias = sandwich(2, dim=4, base=16.0).relative_bias(torch.tensor([0, 4])).double()
    expected = torch.tensor(
        [[0.0, -0.12269631810530388], [0.0, -0.06134815905265194]], dtype=torch.float64
    )
    torch.testing.assert_close(bias, expected, rtol=1e-7, atol=0)


@settings(max_examples=60, deadline=None)
@given(
    query=st.integers(0, 5000),
    key=st.integers(0, 5000),
    shift=st.integers(0, 20000),
    n_head=st.integers(1, 8),
)
def test_bias_depends_only_on_the_distance(query, key, shift, n_head):
    encoding = sandwich(n_head)

    def bias(i: int, j: int) -> torch.Tensor:
        return encoding.score_bias(torch.tensor([i]), torch.tensor([j]))  # (H, 1, 1)

    assert torch.equal(bias(query + shift, key + shift), bias(query, key))


def test_bias_is_finite_and_within_its_bounds_at_16384_tokens():
    n_head, dim = 4, 128
    bias = sandwich(n_head).consecutive_bias(torch.arange(16384))  # (H, 16384) float32
    assert bias.shape == (n_head, 16384) and bias.dtype == torch.float32
    assert torch.isfinite(bias).all()
    # p_i . p_j lies in [-d'/2, d'/2], so head h's bias lies in [-d' / (h * 8/H), 0].
    lower = -dim / (torch.arange(1, n_head + 1) * 8 / n_head)  # (H,)
    assert (bias <= 0).all() and (bias >= lower[:, None]).all()
    assert (bias[:, 0] == 0).all()  # no penalty on a token's own position


def test_the_first_head_is_the_most_local():
    bias = sandwich(4).relative_bias(torch.arange(1, 2000))  # (H, D)
    assert (bias[:-1] < bias[1:]).all()  # a smaller compression, a larger penalty


def test_it_has_no_parameters_and_saves_nothing():
    encoding = sandwich(4)
    assert list(encoding.parameters()) == [] and encoding.state_dict() == {}


@pytest.mark.parametrize(
    ("options", "message"),
    [({"dim": 7}, "encoding.dim must be a positive even number"), ({"base": 1.0}, "encoding.base")],
)
def test_bad_options_are_one_line_errors(options, message):
    with pytest.raises(PosbenchError, match=message) as error:
        sandwich(4, **options)
    assert "\n" not in str(error.value)
