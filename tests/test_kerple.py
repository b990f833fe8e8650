"""KERPLE (Chi et al. 2022): the logarithmic and power kernels, their constraints, learning.

Expected biases are computed here entry by entry with ``math`` from the paper's formulas.
"""

from __future__ import annotations

import math

import pytest
import torch

from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model import Transformer
from posbench.model.args import ModelArgs

QUERIES, KEYS = [0, 4, 50], [0, 1, 4, 20, 50]


def kerple(kernel: str, r1: list[float], r2: list[float]):
    encoding = build_encoding({"name": "kerple", "kernel": kernel}, d_model=16, n_head=2).double()
    with torch.no_grad():
        encoding.r1.copy_(torch.tensor(r1, dtype=torch.float64))
        encoding.r2.copy_(torch.tensor(r2, dtype=torch.float64))
    return encoding


def bias_of(encoding) -> torch.Tensor:
    return encoding.score_bias(torch.tensor(QUERIES), torch.tensor(KEYS))


def expected_bias(kernel_of_distance) -> torch.Tensor:
    rows = [[[kernel_of_distance(h, abs(i - j)) for j in KEYS] for i in QUERIES] for h in range(2)]
    return torch.tensor(rows, dtype=torch.float64)


def test_log_kernel_is_minus_r1_log_of_one_plus_r2_distance():
    r1, r2 = [0.5, 1.7], [0.3, 2.5]
    expected = expected_bias(lambda h, d: -r1[h] * math.log(1 + r2[h] * d))
    torch.testing.assert_close(bias_of(kerple("log", r1, r2)), expected, rtol=1e-14, atol=1e-14)


def test_power_kernel_is_minus_r1_distance_to_the_r2():
    r1, r2 = [0.5, 1.7], [0.4, 1.9]
    expected = expected_bias(lambda h, d: -r1[h] * d ** r2[h])
    torch.testing.assert_close(bias_of(kerple("power", r1, r2)), expected, rtol=1e-14, atol=1e-14)


def test_power_kernel_with_exponent_one_is_alibi_with_the_same_slope():
    # ALiBi's first slope for 2 heads, 2^-4; its second, 2^-8, is below KERPLE's 0.01 floor.
    encoding = kerple("power", [2**-4, 0.5], [1.0, 1.0])
    alibi = build_encoding({"name": "alibi"}, d_model=16, n_head=2).double()
    positions = torch.arange(40)
    torch.testing.assert_close(
        encoding.score_bias(positions, positions)[0].tril(),
        alibi.score_bias(positions, positions)[0].tril(),
    )


@pytest.mark.parametrize(
    ("kernel", "r1", "r2", "projected_r1", "projected_r2"),
    [
        ("log", [-1.0, 0.5], [0.001, 7.0], [0.01, 0.5], [0.01, 7.0]),  # log: r2 unbounded above
        ("power", [0.0, 3.0], [2.5, -0.2], [0.01, 3.0], [2.0, 0.01]),  # power: r2 in (0, 2]
    ],
)
def test_parameters_outside_the_constraints_are_projected_back_before_use(
    kernel, r1, r2, projected_r1, projected_r2
):
    encoding = kerple(kernel, r1, r2)
    bias_of(encoding)
    assert encoding.r1.tolist() == pytest.approx(projected_r1)
    assert encoding.r2.tolist() == pytest.approx(projected_r2)


@pytest.mark.parametrize(("kernel", "r1_max", "r2_max"), [("log", 2.0, 1.0), ("power", 1.0, 2.0)])
def test_initial_parameters_are_uniform_in_the_authors_ranges(kernel, r1_max, r2_max):
    torch.manual_seed(0)
    encoding = build_encoding({"name": "kerple", "kernel": kernel}, d_model=512, n_head=256)
    for param, upper in ((encoding.r1, r1_max), (encoding.r2, r2_max)):
        assert 0 < param.min() and param.max() < upper
        assert param.max() > 0.9 * upper  # the whole range, not a narrower one


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_no_parameter_is_used_below_the_floor_of_0_01(kernel):
    torch.manual_seed(0)
    encoding = build_encoding({"name": "kerple", "kernel": kernel}, d_model=512, n_head=256)
    assert (encoding.r1 < 0.01).any() or (encoding.r2 < 0.01).any()  # 256 draws reach below
    encoding.score_bias(torch.arange(3), torch.arange(3))
    assert encoding.r1.min() >= 0.01 and encoding.r2.min() >= 0.01


@pytest.mark.parametrize("kernel", ["log", "power"])
def test_both_parameters_get_finite_gradients_through_a_multi_layer_model(kernel):
    torch.manual_seed(0)
    args = ModelArgs(n_layer=2, n_head=2, d_model=16)
    model = Transformer(args, build_encoding({"name": "kerple", "kernel": kernel}, 16, 2))
    tokens = torch.randint(0, 256, (2, 12))
    model(tokens).logsumexp(-1).sum().backward()  # would fail if a layer's use were overwritten
    for param in (model.encoding.r1, model.encoding.r2):
        assert torch.isfinite(param.grad).all() and (param.grad != 0).any()


def test_an_unknown_kernel_is_refused_in_one_line_naming_the_choices():
    with pytest.raises(PosbenchError, match=r"encoding\.kernel must be one of log, power"):
        build_encoding({"name": "kerple", "kernel": "cubic"}, d_model=16, n_head=2)
