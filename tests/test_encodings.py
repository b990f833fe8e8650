"""Specification of the positional encodings and their registry.

Every expected value is computed independently of posbench: with ``math`` from the formulas in
the seed documents (Vaswani et al. 2017 for sinusoidal positions, Su et al. 2021 for RoPE), or
with a hand-built 2x2 rotation matrix. The code under test never produces its own expectation.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posbench.config import config_dir
from posbench.encodings import (
    ENCODINGS,
    PositionalEncoding,
    apply_rope,
    build_encoding,
    encoding_config,
    encoding_names,
    registry,
    sinusoidal_table,
)
from posbench.encodings.base import distance_grid
from posbench.encodings.registry import register
from posbench.encodings.rope import rotate_by
from posbench.errors import PosbenchError

F64 = torch.float64
C128 = torch.complex128  # a unit complex per (position, pair) is a rotation


def sinusoid_reference(position: int, dim: int, base: float = 10000.0) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / base^(2i/d)), PE(pos, 2i+1) = cos(pos / base^(2i/d))."""
    row = []
    for i in range(dim // 2):
        angle = position / base ** (2 * i / dim)
        row += [math.sin(angle), math.cos(angle)]
    return torch.tensor(row, dtype=F64)


def rotation(angle: float) -> torch.Tensor:
    """The 2-D rotation matrix R(angle) = [[cos, -sin], [sin, cos]]."""
    c, s = math.cos(angle), math.sin(angle)
    return torch.tensor([[c, -s], [s, c]], dtype=F64)


def rope_reference(x: torch.Tensor, position: int, base: float = 10000.0) -> torch.Tensor:
    """RoPE of one vector ``x`` (d,): pair (x[2i], x[2i+1]) rotated by R(position * theta_i),
    theta_i = base^(-2i/d)."""
    d = x.shape[-1]
    pairs = [
        rotation(position * base ** (-2 * i / d)) @ x[2 * i : 2 * i + 2] for i in range(d // 2)
    ]
    return torch.cat(pairs)


def rope_reference_rows(
    x: torch.Tensor, positions: list[int], base: float = 10000.0
) -> torch.Tensor:
    """``rope_reference`` applied to every row of ``x`` (..., T, d), row t at ``positions[t]``."""
    flat = x.reshape(-1, len(positions), x.shape[-1])
    rows = [
        torch.stack([rope_reference(seq[t], p, base) for t, p in enumerate(positions)])
        for seq in flat
    ]
    return torch.stack(rows).reshape(x.shape)


# --- sinusoidal -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("position", "expected"),
    [
        (0, [0.0, 1.0, 0.0, 1.0]),
        (1, [math.sin(1), math.cos(1), math.sin(1 / 100), math.cos(1 / 100)]),
        (5, [math.sin(5), math.cos(5), math.sin(5 / 100), math.cos(5 / 100)]),
    ],
)
def test_sinusoidal_table_matches_the_seed_worked_example_for_d4(position, expected):
    # d = 4: the second pair's frequency is 1 / 10000^(2/4) = 1/100.
    table = sinusoidal_table(torch.tensor([position]), dim=4)
    torch.testing.assert_close(
        table[0].double(), torch.tensor(expected, dtype=F64), rtol=0, atol=1e-7
    )


def test_sinusoidal_table_matches_the_formula_at_positions_far_beyond_training():
    positions = [0, 1, 511, 4096, 50_000]
    table = sinusoidal_table(torch.tensor(positions), dim=16)
    expected = torch.stack([sinusoid_reference(p, 16) for p in positions])
    assert torch.isfinite(table).all()
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_table_uses_the_given_base():
    table = sinusoidal_table(torch.tensor([3, 70]), dim=8, base=100.0)
    expected = torch.stack([sinusoid_reference(p, 8, base=100.0) for p in (3, 70)])
    torch.testing.assert_close(table.double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_encoding_has_no_length_cap():
    assert build_encoding({"name": "sinusoidal"}, d_model=16, n_head=2).max_length is None


def test_sinusoidal_embed_adds_exactly_the_table_to_the_embeddings():
    encoding = build_encoding(
        {"name": "sinusoidal", "scale_embeddings": False}, d_model=8, n_head=2
    )
    positions = [0, 1, 5, 1000, 50_000]
    x = torch.randn(3, len(positions), 8, generator=torch.Generator().manual_seed(0))
    expected = x.double() + torch.stack([sinusoid_reference(p, 8) for p in positions])
    out = encoding.embed(x, torch.tensor(positions))
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_embed_scales_embeddings_by_sqrt_d_model_by_default():
    """Vaswani et al. 2017, section 3.4: embeddings are multiplied by sqrt(d_model)."""
    encoding = build_encoding({"name": "sinusoidal"}, d_model=16, n_head=2)
    positions = [0, 3, 700]
    x = torch.randn(2, len(positions), 16, generator=torch.Generator().manual_seed(1))
    expected = 4.0 * x.double() + torch.stack([sinusoid_reference(p, 16) for p in positions])
    out = encoding.embed(x, torch.tensor(positions))
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)


def test_sinusoidal_embed_uses_the_configured_base():
    encoding = build_encoding({"name": "sinusoidal", "base": 100.0}, d_model=8, n_head=2)
    out = encoding.embed(torch.zeros(1, 3, 8), torch.tensor([0, 7, 300]))
    expected = torch.stack([sinusoid_reference(p, 8, base=100.0) for p in (0, 7, 300)])
    torch.testing.assert_close(out[0].double(), expected, rtol=0, atol=1e-6)


def test_sinusoidal_encoding_refuses_an_odd_model_width():
    with pytest.raises(PosbenchError, match=r"model\.d_model"):
        build_encoding({"name": "sinusoidal"}, d_model=15, n_head=3)


# --- rope -------------------------------------------------------------------------------------


def test_rope_reproduces_the_seed_example_score_of_minus_one_over_root_two():
    # q = [1, 0] at m = 0 and k = [0, 1] at n = 3 with theta = pi/4: k turns by 3*pi/4.
    theta = math.pi / 4

    def rotate_by_angle(x: torch.Tensor, angle: float) -> torch.Tensor:
        rotation = torch.tensor([[complex(math.cos(angle), math.sin(angle))]], dtype=C128)
        return rotate_by(x, rotation)

    q = rotate_by_angle(torch.tensor([[1.0, 0.0]], dtype=F64), 0 * theta)
    k = rotate_by_angle(torch.tensor([[0.0, 1.0]], dtype=F64), 3 * theta)
    # R(3pi/4) [0, 1] = [-sin(3pi/4), cos(3pi/4)] = [-1, -1] / sqrt(2); the seed prints the
    # second entry as +1/sqrt(2), a slip that does not touch the score (it only reads entry 0).
    torch.testing.assert_close(k[0], torch.tensor([-1.0, -1.0], dtype=F64) / math.sqrt(2))
    assert float(q[0] @ k[0]) == pytest.approx(-1 / math.sqrt(2), abs=1e-12)


@pytest.mark.parametrize("base", [10000.0, 500.0])
def test_apply_rope_rotates_each_pair_by_position_times_its_frequency(base):
    positions = [0, 1, 7, 1234]
    x = torch.randn(2, 3, len(positions), 8, dtype=F64, generator=torch.Generator().manual_seed(1))
    out = apply_rope(x, torch.tensor(positions), base=base)
    torch.testing.assert_close(out, rope_reference_rows(x, positions, base), rtol=0, atol=1e-12)


def test_apply_rope_with_a_two_dim_head_turns_by_one_radian_per_position():
    # theta_0 = base^0 = 1 whatever the base, so position 3 is a rotation by 3 rad.
    x = torch.tensor([[0.6, -0.8]], dtype=F64)
    out = apply_rope(x, torch.tensor([3]))
    torch.testing.assert_close(out[0], rotation(3.0) @ x[0], rtol=0, atol=1e-12)


def test_rope_at_position_zero_is_the_identity():
    x = torch.randn(2, 3, 5, 8, dtype=F64, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(apply_rope(x, torch.zeros(5, dtype=torch.long)), x, rtol=0, atol=0)


def test_rope_preserves_the_norm_of_every_pair():
    x = torch.randn(4, 16, dtype=F64, generator=torch.Generator().manual_seed(3))
    out = apply_rope(x, torch.tensor([0, 17, 9999, 50_000]))
    norms = x.unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(out.unflatten(-1, (-1, 2)).norm(dim=-1), norms, rtol=1e-12, atol=0)


def test_apply_rope_refuses_an_odd_head_dimension():
    with pytest.raises(PosbenchError):
        apply_rope(torch.zeros(4, 5), torch.arange(4))


@st.composite
def query_and_key(draw) -> tuple[torch.Tensor, torch.Tensor]:
    head_dim = 2 * draw(st.integers(1, 8))
    entries = st.floats(-4, 4, allow_nan=False, allow_infinity=False)
    vector = st.lists(entries, min_size=head_dim, max_size=head_dim)
    return torch.tensor(draw(vector), dtype=F64), torch.tensor(draw(vector), dtype=F64)


@settings(max_examples=50, deadline=None)
@given(
    qk=query_and_key(),
    m=st.integers(0, 5000),
    n=st.integers(0, 5000),
    shift=st.integers(0, 5000),
)
def test_rope_scores_depend_only_on_relative_distance(qk, m, n, shift):
    q, k = qk

    def score(query_position: int, key_position: int) -> float:
        q_rot = apply_rope(q[None], torch.tensor([query_position]))[0]
        k_rot = apply_rope(k[None], torch.tensor([key_position]))[0]
        return float(q_rot @ k_rot)

    tolerance = 1e-9 * (1 + float(q.norm() * k.norm()))
    assert score(m + shift, n + shift) == pytest.approx(score(m, n), abs=tolerance)


def rope_module(base: float = 10000.0) -> PositionalEncoding:
    return build_encoding({"name": "rope", "base": base}, d_model=32, n_head=4)  # head dim 8


def test_rope_module_rotate_equals_apply_rope():
    encoding = rope_module()
    x = torch.randn(2, 4, 8, 8, generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(encoding.rotate(x, torch.arange(8)), apply_rope(x, torch.arange(8)))


def test_rope_module_rotates_with_the_configured_base():
    encoding = rope_module(base=500.0)
    x = torch.randn(1, 4, 6, 8, dtype=F64, generator=torch.Generator().manual_seed(5))
    out = encoding.rotate(x.float(), torch.arange(6)).double()
    torch.testing.assert_close(
        out, rope_reference_rows(x, list(range(6)), 500.0), atol=1e-5, rtol=0
    )


def test_rope_module_equals_apply_rope_at_short_and_long_lengths_in_turn():
    encoding = rope_module()
    generator = torch.Generator().manual_seed(6)
    for length in (8, 5000, 8):
        x = torch.randn(1, 4, length, 8, generator=generator)
        positions = torch.arange(length)
        torch.testing.assert_close(encoding.rotate(x, positions), apply_rope(x, positions))


def test_rope_module_rotates_positions_beyond_any_seen_before():
    encoding = rope_module()
    encoding.rotate(torch.zeros(1, 4, 8, 8), torch.arange(8))
    positions = [3, 20_000, 9_000]
    x = torch.randn(1, 4, len(positions), 8, dtype=F64, generator=torch.Generator().manual_seed(7))
    out = encoding.rotate(x.float(), torch.tensor(positions)).double()
    torch.testing.assert_close(out, rope_reference_rows(x, positions), atol=1e-5, rtol=0)


def test_rope_cache_is_not_saved_in_the_state_dict():
    encoding = rope_module()
    encoding.rotate(torch.zeros(1, 4, 8, 8), torch.arange(8))
    assert encoding.state_dict() == {}


def test_rope_refuses_an_odd_head_dim_naming_the_model_settings():
    with pytest.raises(PosbenchError, match=r"model\.d_model") as info:
        build_encoding({"name": "rope"}, d_model=12, n_head=4)  # head dim 3
    assert "model.n_head" in str(info.value)


# --- learned ----------------------------------------------------------------------------------


def test_learned_max_length_equals_the_configured_rows():
    encoding = build_encoding({"name": "learned", "max_length": 37}, d_model=16, n_head=2)
    assert encoding.max_length == 37
    assert sum(p.numel() for p in encoding.parameters()) == 37 * 16


def test_learned_embed_adds_the_row_of_each_position():
    encoding = build_encoding({"name": "learned", "max_length": 10}, d_model=4, n_head=2)
    (table,) = encoding.parameters()
    positions = torch.tensor([0, 9, 4])
    out = encoding.embed(torch.zeros(2, 3, 4), positions)
    torch.testing.assert_close(out, table[positions].expand(2, 3, 4))


def test_learned_refuses_a_table_with_no_rows():
    with pytest.raises(PosbenchError, match=r"encoding\.max_length"):
        build_encoding({"name": "learned", "max_length": 0}, d_model=16, n_head=2)


# --- none -------------------------------------------------------------------------------------


def test_none_leaves_embeddings_queries_and_keys_unchanged():
    encoding = build_encoding({"name": "none"}, d_model=16, n_head=2)
    x = torch.randn(2, 5, 16)
    qk = torch.randn(2, 2, 5, 8)
    assert torch.equal(encoding.embed(x, torch.arange(5)), x)
    assert torch.equal(encoding.rotate(qk, torch.arange(5)), qk)


def test_none_adds_no_score_bias_and_has_no_length_cap():
    encoding = build_encoding({"name": "none"}, d_model=16, n_head=2)
    assert encoding.score_bias(torch.arange(5), torch.arange(5)) is None
    assert encoding.max_length is None


@pytest.mark.parametrize("name", ["none", "rope", "sinusoidal", "learned"])
def test_encodings_without_a_bias_have_no_relative_bias(name):
    encoding = build_encoding({"name": name}, d_model=16, n_head=2)
    assert encoding.relative_bias(torch.arange(-3, 4)) is None


@pytest.mark.parametrize("name", ["alibi", "t5", "kerple", "sandwich"])
def test_score_bias_of_a_relative_bias_is_its_value_at_each_pairs_distance(name):
    encoding = build_encoding({"name": name}, d_model=16, n_head=2).double()
    queries, keys = torch.tensor([5, 40, 300]), torch.tensor([0, 5, 41, 299, 7])
    bias = encoding.score_bias(queries, keys)
    assert bias.shape == (2, 3, 5)
    for a, i in enumerate(queries.tolist()):
        for b, j in enumerate(keys.tolist()):
            expected = encoding.relative_bias(torch.tensor([i - j]))[:, 0]  # (H,)
            torch.testing.assert_close(bias[:, a, b], expected, rtol=0, atol=0)


def test_distance_grid_is_the_table_at_each_pairs_distance_and_its_gradient_sums_per_distance():
    # KERPLE's table at distances 0..11, laid out for queries 6..9 over keys 2..10 (future: 0).
    encoding = build_encoding({"name": "kerple"}, d_model=16, n_head=2).double()
    queries, keys = torch.arange(6, 10), torch.arange(2, 11)
    grad = torch.randn(2, 4, 9, dtype=torch.float64)
    grid = distance_grid(encoding.consecutive_bias(torch.arange(12)), queries, keys)
    got = torch.autograd.grad(grid, list(encoding.parameters()), grad)
    distance = (queries[:, None] - keys[None, :]).clamp(min=0)  # (4, 9)
    expected = encoding.relative_bias(distance.flatten()).view(2, 4, 9)
    torch.testing.assert_close(grid, expected, rtol=0, atol=0)
    wanted = torch.autograd.grad(expected, list(encoding.parameters()), grad)
    for a, b in zip(got, wanted, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# --- registry ---------------------------------------------------------------------------------


def test_every_encoding_config_file_names_a_registered_encoding_and_back():
    files = {path.stem for path in (config_dir() / "encoding").glob("*.yaml")}
    assert files == set(encoding_names())


def test_encoding_names_are_sorted_whatever_the_registration_order(monkeypatch):
    monkeypatch.setattr(registry, "ENCODINGS", {"rope": None, "alibi": None, "none": None})
    assert encoding_names() == ["alibi", "none", "rope"]


def test_unknown_encoding_name_is_refused_listing_the_valid_names():
    with pytest.raises(PosbenchError, match="unknown encoding 'rotary'") as info:
        build_encoding({"name": "rotary"}, d_model=16, n_head=2)
    for name in encoding_names():
        assert name in str(info.value)


def test_registering_a_class_under_another_name_than_its_configs_is_refused():
    with pytest.raises(AssertionError, match=r"Config\.name must be 'other'"):
        register("other")(ENCODINGS["rope"])


def test_registering_a_name_twice_is_refused():
    with pytest.raises(AssertionError, match="registered twice"):
        register("rope")(ENCODINGS["rope"])


@pytest.mark.parametrize("name", encoding_names())
def test_every_registered_encoding_builds_from_its_name_alone(name):
    encoding = build_encoding({"name": name}, d_model=16, n_head=2)
    assert isinstance(encoding, ENCODINGS[name])
    assert encoding.config.name == name


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"name": "rope"}, {"base": 10000.0}),
        ({"name": "sinusoidal"}, {"base": 10000.0}),
        ({"name": "learned"}, {"max_length": 1024}),
        ({"name": "learned", "max_length": 64}, {"max_length": 64}),
        ({"name": "rope", "base": 500.0}, {"base": 500.0}),
    ],
)
def test_build_encoding_fills_defaults_from_a_partial_dict(values, expected):
    config = build_encoding(values, d_model=16, n_head=2).config
    assert {key: getattr(config, key) for key in expected} == expected


def test_encoding_config_accepts_a_typed_config():
    config = encoding_config(ENCODINGS["rope"].Config(base=123.0))
    assert (config.name, config.base) == ("rope", 123.0)


@pytest.mark.parametrize("name", encoding_names())
def test_has_score_bias_says_whether_the_encoding_returns_a_bias(name):
    encoding = build_encoding({"name": name}, d_model=32, n_head=4)
    positions = torch.arange(8)
    assert encoding.has_score_bias == (encoding.score_bias(positions, positions) is not None)


@pytest.mark.parametrize("name", encoding_names())
def test_has_key_bias_says_whether_the_encoding_returns_a_bias_of_the_key(name):
    encoding = build_encoding({"name": name}, d_model=32, n_head=4)
    x, q = torch.randn(2, 8, 32), torch.randn(2, 4, 8, 8)
    state = encoding.content_state(x, q, q, torch.arange(8))
    assert encoding.has_key_bias == (encoding.key_bias(state) is not None)
