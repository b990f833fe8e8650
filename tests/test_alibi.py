"""ALiBi (Press et al. 2022): slopes exactly as the paper's reference code, the bias -m_h (i - j).

Expected slopes are written out as powers of two, or built by the paper's recursive recipe
(geometric sequence for a power of two, interleaving with the next power of two otherwise),
which the code under test does not use.
"""

from __future__ import annotations

import math

import pytest
import torch

from posbench.encodings import alibi_slopes, build_encoding

F64 = torch.float64


def paper_slopes(n: int) -> list[float]:
    """The paper's recipe, recursively: for a power of two, start = ratio = 2^(-8/n); else the
    slopes of the closest smaller power of two c, then slopes 0, 2, 4, ... of the 2c ones."""
    if math.log2(n).is_integer():
        start = 2 ** (-8 / n)
        return [start * start**i for i in range(n)]
    c = 2 ** math.floor(math.log2(n))
    return paper_slopes(c) + paper_slopes(2 * c)[0::2][: n - c]


def test_eight_heads_get_one_half_to_one_over_256():
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]


def test_twelve_heads_get_the_eight_head_slopes_then_four_odd_half_powers():
    expected = [2.0**-k for k in range(1, 9)] + [2**-0.5, 2**-1.5, 2**-2.5, 2**-3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected, dtype=F64))


def test_sixteen_heads_get_half_powers_from_one_over_root_two_to_one_over_256():
    expected = [2 ** (-k / 2) for k in range(1, 17)]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor(expected, dtype=F64))


@pytest.mark.parametrize("n_heads", range(1, 65))
def test_slopes_follow_the_papers_recipe_for_every_head_count(n_heads):
    expected = torch.tensor(paper_slopes(n_heads), dtype=F64)
    torch.testing.assert_close(alibi_slopes(n_heads), expected, rtol=1e-14, atol=0)


def test_alibi_bias_is_minus_slope_times_query_minus_key_position():
    encoding = build_encoding({"name": "alibi"}, d_model=32, n_head=4).double()
    queries, keys = [3, 7, 100], [0, 3, 5, 7, 99]
    bias = encoding.score_bias(torch.tensor(queries), torch.tensor(keys))
    slopes = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]  # 4 heads: 2^(-8k/4)
    expected = [[[-m * (i - j) for j in keys] for i in queries] for m in slopes]
    torch.testing.assert_close(bias, torch.tensor(expected, dtype=F64), rtol=0, atol=0)


def test_alibi_adds_nothing_to_embeddings_queries_or_keys_and_has_no_length_cap():
    encoding = build_encoding({"name": "alibi"}, d_model=16, n_head=2)
    x, qk = torch.randn(2, 5, 16), torch.randn(2, 2, 5, 8)
    assert torch.equal(encoding.embed(x, torch.arange(5)), x)
    assert torch.equal(encoding.rotate(qk, torch.arange(5)), qk)
    assert encoding.max_length is None


def test_alibi_has_nothing_to_learn_or_save():
    encoding = build_encoding({"name": "alibi"}, d_model=16, n_head=2)
    assert list(encoding.parameters()) == []
    assert encoding.state_dict() == {}
