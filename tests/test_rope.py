"""Specification of RoPE's options (layout, fraction) and its eval-time scaling methods.

Expected values come from the papers' formulas written out here with ``math`` (or from the
hand-built rotation reference in test_encodings), never from posbench's own helpers.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_encodings import rope_reference_rows, rotation

from posbench.encodings import apply_rope, build_encoding
from posbench.errors import PosbenchError

F64 = torch.float64
HEAD_DIM = 8  # d_model 32 / 4 heads


def random(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=F64, generator=torch.Generator().manual_seed(seed))


def rope(training: bool = False, **options):
    """A float64 rope encoding with head dim 8, in eval mode unless ``training``."""
    encoding = build_encoding({"name": "rope", **options}, d_model=32, n_head=4)
    return encoding.train(training)


def scaled(
    method: str,
    factor: float | None = None,
    original_length: int = 16,
    layout: str = "interleaved",
    fraction: float = 1.0,
    **scaling_options,
):
    """A rope encoding in eval mode that extends the given ``original_length`` by ``method``."""
    scaling = {"method": method, "factor": factor, "original_length": original_length}
    return rope(layout=layout, fraction=fraction, scaling=scaling | scaling_options)


def pair_angles_and_norms(encoding, position: int) -> tuple[list[float], list[float]]:
    """Rotate (1, 0) in every interleaved pair at ``position``: each pair becomes
    norm * (cos a, sin a), where a is that pair's angle and norm the attention factor."""
    x = torch.tensor([1.0, 0.0] * (HEAD_DIM // 2), dtype=F64)[None, None, None]
    out = encoding.rotate(x, torch.tensor([position]))[0, 0, 0].unflatten(-1, (-1, 2))
    return [math.atan2(b, a) for a, b in out.tolist()], [math.hypot(a, b) for a, b in out.tolist()]


# --- layout and fraction ----------------------------------------------------------------------


def half_reference_rows(x: torch.Tensor, positions: list[int], base: float = 1e4) -> torch.Tensor:
    """GPT-NeoX layout by hand: pair i is (x[i], x[i + d/2]), rotated by R(m * base^(-2i/d))."""
    d = x.shape[-1]
    out = x.clone()
    for t, m in enumerate(positions):
        for i in range(d // 2):
            pair = torch.stack((x[..., t, i], x[..., t, i + d // 2]), dim=-1)
            turned = pair @ rotation(m * base ** (-2 * i / d)).T
            out[..., t, i], out[..., t, i + d // 2] = turned[..., 0], turned[..., 1]
    return out


def test_half_layout_rotates_dimension_i_with_dimension_i_plus_half():
    positions = [0, 3, 250]
    x = random(2, len(positions), HEAD_DIM, seed=1)
    out = apply_rope(x, torch.tensor(positions), layout="half")
    torch.testing.assert_close(out, half_reference_rows(x, positions), rtol=0, atol=1e-12)


# interleaved pair i is dims (2i, 2i+1); half pair i is (i, i + d/2): this permutation maps one
# onto the other (a head's dims reordered as 0, 2, 4, 6, 1, 3, 5, 7).
TO_HALF = [*range(0, HEAD_DIM, 2), *range(1, HEAD_DIM, 2)]


def test_interleaved_and_half_layouts_give_identical_scores_after_permuting_dims():
    positions = torch.arange(12)
    q, k = random(2, 12, HEAD_DIM, seed=2), random(2, 12, HEAD_DIM, seed=3)
    q_i, k_i = apply_rope(q, positions), apply_rope(k, positions)
    q_h = apply_rope(q[..., TO_HALF], positions, layout="half")
    k_h = apply_rope(k[..., TO_HALF], positions, layout="half")
    torch.testing.assert_close(q_h @ k_h.mT, q_i @ k_i.mT, rtol=0, atol=1e-12)
    torch.testing.assert_close(q_h, q_i[..., TO_HALF], rtol=0, atol=1e-12)


def test_module_half_layout_equals_the_functional_one():
    x = random(1, 4, 10, HEAD_DIM, seed=4)
    out = rope(layout="half").rotate(x, torch.arange(10))
    torch.testing.assert_close(out, apply_rope(x, torch.arange(10), layout="half"))


def test_fraction_one_is_full_rope():
    x = random(2, 6, HEAD_DIM, seed=5)
    positions = [0, 1, 2, 50, 51, 9000]
    full = rope_reference_rows(x, positions)
    out = apply_rope(x, torch.tensor(positions), fraction=1.0)
    torch.testing.assert_close(out, full, rtol=0, atol=1e-12)
    module = rope(fraction=1.0).rotate(x, torch.tensor(positions))
    torch.testing.assert_close(module, full, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [0.25, 0.5, 0.75])
def test_partial_rotary_rotates_the_leading_dims_and_leaves_the_rest_untouched(layout, fraction):
    rotated = int(HEAD_DIM * fraction)
    positions = [0, 7, 1000]
    x = random(3, len(positions), HEAD_DIM, seed=6)
    out = rope(layout=layout, fraction=fraction).rotate(x, torch.tensor(positions))
    # theta_i = base^(-2i/d) with d the rotated count, as in GPT-NeoX
    reference = rope_reference_rows if layout == "interleaved" else half_reference_rows
    expected = reference(x[..., :rotated], positions)
    torch.testing.assert_close(out[..., :rotated], expected, rtol=0, atol=1e-12)
    assert torch.equal(out[..., rotated:], x[..., rotated:])


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("fraction", [1.0, 0.5])
@pytest.mark.parametrize("per_sequence", [False, True])
def test_head_slices_of_the_fused_projection_rotate_as_their_contiguous_copies(
    layout, fraction, per_sequence
):
    """The model's q and k are (B, nh, T, hs) views of one (B, T, 3C) projection, (B, T, nh,
    hs) in memory, which rope rotates in that memory order: the same values and gradients as
    rotating a contiguous copy, for positions shared by the batch or one row per sequence."""
    B, T, n_head = 2, 5, 4
    projection = random(B, T, 3 * n_head * HEAD_DIM, seed=11).requires_grad_()
    q = projection[..., : n_head * HEAD_DIM].view(B, T, n_head, HEAD_DIM).transpose(1, 2)
    copy = q.detach().contiguous().requires_grad_()
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 30, 31, 900, 901]])
    positions = positions if per_sequence else positions[1]
    encoding = rope(layout=layout, fraction=fraction)
    out, expected = encoding.rotate(q, positions), encoding.rotate(copy, positions)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    if fraction == 1.0:  # kept the projection's order: no copy to (B, nh, T, hs) order
        assert out.stride(1) < out.stride(2)
    weights = random(*out.shape, seed=12)
    (out * weights).sum().backward()
    (expected * weights).sum().backward()
    q_grad = projection.grad[..., : n_head * HEAD_DIM].view(B, T, n_head, HEAD_DIM)
    torch.testing.assert_close(q_grad.transpose(1, 2), copy.grad, rtol=0, atol=1e-12)
    assert projection.grad[..., n_head * HEAD_DIM :].eq(0).all()


@pytest.mark.parametrize("fraction", [0.3, 0.125, 0.0, 1.5])
def test_a_fraction_that_does_not_rotate_an_even_dim_count_is_a_one_line_error(fraction):
    with pytest.raises(PosbenchError, match=r"encoding\.fraction") as info:
        rope(fraction=fraction)
    assert "\n" not in str(info.value)
    with pytest.raises(PosbenchError, match="fraction"):
        apply_rope(torch.zeros(2, HEAD_DIM), torch.arange(2), fraction=fraction)


def test_an_unknown_layout_lists_the_valid_ones():
    with pytest.raises(PosbenchError, match="interleaved, half"):
        rope(layout="neox")


# --- scaling: each method against its formula -------------------------------------------------


def test_scaling_is_ignored_in_training_mode():
    encoding = rope(training=True, scaling={"method": "yarn", "factor": 8.0, "original_length": 4})
    x = random(1, 2, 40, HEAD_DIM, seed=7)
    torch.testing.assert_close(
        encoding.rotate(x, torch.arange(40)), apply_rope(x, torch.arange(40))
    )
    assert encoding.scaling_record(40)["scaling"] == "none"


def test_scaling_applies_in_training_mode_when_in_training_is_set():
    scaling = {"method": "linear", "factor": 2.0, "original_length": 4, "in_training": True}
    encoding = rope(training=True, scaling=scaling)
    m = torch.tensor([0, 1, 5, 17])
    x = random(1, 2, len(m), HEAD_DIM, seed=7)
    torch.testing.assert_close(encoding.rotate(x, 2 * m), apply_rope(x, m), rtol=0, atol=1e-12)


@pytest.mark.parametrize("s", [2.0, 4.0, 8.0])
def test_linear_scaling_by_s_at_position_s_times_m_equals_plain_rope_at_m(s):
    m = torch.tensor([0, 1, 5, 17, 300])
    x = random(2, len(m), HEAD_DIM, seed=8)
    out = scaled("linear", s).rotate(x, (m * s).long())
    torch.testing.assert_close(out, apply_rope(x, m), rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_yarn_with_factor_one_is_plain_rope(layout):
    x = random(1, 4, 64, HEAD_DIM, seed=9)
    out = scaled("yarn", 1.0, layout=layout).rotate(x, torch.arange(64))
    torch.testing.assert_close(out, apply_rope(x, torch.arange(64), layout=layout))


def test_ntk_multiplies_the_base_by_s_to_the_d_over_d_minus_2():
    positions = [0, 3, 100, 4000]
    x = random(2, len(positions), HEAD_DIM, seed=10)
    out = scaled("ntk", 4.0).rotate(x, torch.tensor(positions))
    new_base = 10000.0 * 4.0 ** (8 / 6)
    torch.testing.assert_close(out, rope_reference_rows(x, positions, new_base), atol=1e-10, rtol=0)


def test_ntk_keeps_the_fastest_pair_and_divides_the_slowest_by_s():
    angles, _ = pair_angles_and_norms(scaled("ntk", 4.0), position=1)
    assert angles[0] == pytest.approx(1.0, abs=1e-12)  # theta_0 = 1 for any base
    assert angles[-1] == pytest.approx(10000.0 ** (-6 / 8) / 4, rel=1e-12)


def test_dynamic_is_plain_at_the_training_length_and_ntk_with_s_4_at_four_times_it():
    encoding = scaled("dynamic", original_length=16)
    x16, x64 = random(1, 2, 16, HEAD_DIM, seed=11), random(1, 2, 64, HEAD_DIM, seed=12)
    torch.testing.assert_close(
        encoding.rotate(x16, torch.arange(16)), rope_reference_rows(x16, list(range(16)))
    )
    ntk_base = 10000.0 * 4.0 ** (8 / 6)  # s = 64 / 16 from the ORIGINAL length, not from 64
    torch.testing.assert_close(
        encoding.rotate(x64, torch.arange(64)), rope_reference_rows(x64, list(range(64)), ntk_base)
    )
    assert encoding.scaling_record(64) == {
        "scaling": "dynamic",
        "scaling_factor": 4.0,
        "scaling_factor_setting": None,
    }
    assert encoding.scaling_record(8)["scaling_factor"] == 1.0  # never below 1


@pytest.mark.parametrize(("s", "length"), [(2.0, 64), (4.0, 40), (8.0, 17)])
def test_dynamic_with_a_factor_is_hfs_dynamic_ntk(s, length):
    # HF transformers' dynamic NTK: base' = base * (s L / L0 - (s - 1))^(d / (d - 2)) for L > L0
    encoding = scaled("dynamic", s, original_length=16)
    x = random(1, 2, length, HEAD_DIM, seed=14)
    new_base = 10000.0 * (s * length / 16 - (s - 1)) ** (8 / 6)
    expected = rope_reference_rows(x, list(range(length)), new_base)
    torch.testing.assert_close(encoding.rotate(x, torch.arange(length)), expected)
    record = encoding.scaling_record(length)
    assert record["scaling_factor"] == pytest.approx(s * length / 16 - (s - 1))
    assert record["scaling_factor_setting"] == s


def test_dynamic_with_any_factor_is_plain_up_to_the_training_length():
    x = random(1, 2, 16, HEAD_DIM, seed=15)
    out = scaled("dynamic", 8.0, original_length=16).rotate(x, torch.arange(16))
    torch.testing.assert_close(out, apply_rope(x, torch.arange(16)), rtol=0, atol=1e-12)


def test_a_null_factor_is_the_eval_length_over_the_training_length():
    encoding = scaled("linear", original_length=16)
    assert encoding.scaling_record(16)["scaling_factor"] == 1.0
    assert encoding.scaling_record(40)["scaling_factor"] == 2.5
    angles, _ = pair_angles_and_norms(encoding, position=39)  # length 40: s = 2.5
    assert angles[0] == pytest.approx(math.remainder(39 / 2.5, 2 * math.pi), abs=1e-9)


def test_yarn_paper_ramp_and_temperature_match_the_paper_for_a_small_head():
    # d = 8, base 1e4: theta = 1, 0.1, 0.01, 0.001. With L = 256 training tokens, pair i turns
    # r_i = L * theta_i / (2 pi) = 40.74, 4.074, 0.407, 0.041 times: pair 0 is above
    # beta_fast = 32 (kept), pairs 2 and 3 below beta_slow = 1 (divided by s), and pair 1 is on
    # the ramp, gamma = (4.074 - 1) / (32 - 1).
    s = 4.0
    r1 = 256 * 0.1 / (2 * math.pi)
    gamma = (r1 - 1) / 31
    expected = [1.0, (1 - gamma) * 0.1 / s + gamma * 0.1, 0.01 / s, 0.001 / s]
    paper = scaled("yarn", s, original_length=256, ramp="paper")
    angles, norms = pair_angles_and_norms(paper, position=1)
    assert angles == pytest.approx(expected, rel=1e-12)
    # sqrt(1/t) = 0.1 ln(s) + 1 multiplies both q and k, so the logits gain (0.1 ln s + 1)^2
    assert norms == pytest.approx([0.1 * math.log(4) + 1] * 4, rel=1e-12)


def test_yarn_paper_ramp_uses_the_configured_betas():
    # beta_fast = 4.5, beta_slow = 4: pair 1 (r = 4.074) is now on a short ramp.
    gamma = (256 * 0.1 / (2 * math.pi) - 4) / 0.5
    encoding = scaled("yarn", 2.0, original_length=256, beta_fast=4.5, beta_slow=4.0, ramp="paper")
    angles, _ = pair_angles_and_norms(encoding, position=1)
    assert angles[1] == pytest.approx((1 - gamma) * 0.1 / 2 + gamma * 0.1, rel=1e-12)


def test_llama3_keeps_short_wavelengths_divides_long_ones_and_blends_between():
    # L = 128, factor 8, low 1, high 4: wavelengths 2 pi / theta = 6.3, 62.8, 628, 6283.
    # Below L/4 = 32 -> theta kept; above L/1 = 128 -> theta / 8; 62.8 is in between, blended
    # with smooth = (L / 62.8 - 1) / (4 - 1).
    smooth = (128 / (2 * math.pi / 0.1) - 1) / 3
    expected = [1.0, (1 - smooth) * 0.1 / 8 + smooth * 0.1, 0.01 / 8, 0.001 / 8]
    angles, norms = pair_angles_and_norms(scaled("llama3", 8.0, original_length=128), position=1)
    assert angles == pytest.approx(expected, rel=1e-12)
    assert norms == pytest.approx([1.0] * 4, rel=1e-12)  # no temperature


def longrope_lists(pairs: int = HEAD_DIM // 2) -> dict[str, list[float]]:
    """LongRoPE's per-pair rescale factors for a head of ``pairs`` rotated pairs: every pair
    distinct, long factors larger than short ones (as the searched factors of Phi-3 are)."""
    return {
        "short_factor": [1.0 + i / 4 for i in range(pairs)],
        "long_factor": [2.0**i for i in range(pairs)],
    }


ONES = {"short_factor": [1.0] * (HEAD_DIM // 2), "long_factor": [1.0] * (HEAD_DIM // 2)}


@pytest.mark.parametrize("method", ["linear", "ntk", "yarn", "llama3", "longrope"])
def test_every_method_with_factor_one_is_plain_rope(method):
    x = random(1, 2, 32, HEAD_DIM, seed=13)
    out = scaled(method, 1.0, **ONES).rotate(x, torch.arange(32))
    torch.testing.assert_close(out, apply_rope(x, torch.arange(32)), rtol=0, atol=1e-12)


def test_longrope_with_all_factors_one_is_plain_rope_up_to_the_original_length():
    # a null factor: s = max(1, L / original_length) = 1 up to 16 tokens, so sqrt(1 + 0) = 1
    x = random(1, 2, 16, HEAD_DIM, seed=19)
    out = scaled("longrope", original_length=16, **ONES).rotate(x, torch.arange(16))
    torch.testing.assert_close(out, apply_rope(x, torch.arange(16)), rtol=0, atol=1e-12)


def longrope_angles_and_norms(encoding, length: int) -> tuple[list[float], list[float]]:
    """``pair_angles_and_norms`` at position 1 of a sequence of ``length`` positions (LongRoPE
    picks its factors by the length): every angle theta_i / lambda_i <= 1 reads back
    unwrapped."""
    x = torch.tensor([1.0, 0.0] * (HEAD_DIM // 2), dtype=F64).expand(1, 1, 2, HEAD_DIM)
    out = encoding.rotate(x, torch.tensor([1, length - 1]))[0, 0, 0].unflatten(-1, (-1, 2))
    return [math.atan2(b, a) for a, b in out.tolist()], [math.hypot(a, b) for a, b in out.tolist()]


@pytest.mark.parametrize(("length", "which"), [(16, "short_factor"), (17, "long_factor")])
def test_longrope_divides_each_theta_by_the_short_factors_up_to_the_original_length_else_long(
    length, which
):
    lists = longrope_lists()
    encoding = scaled("longrope", 4.0, original_length=16, **lists)
    angles, norms = longrope_angles_and_norms(encoding, length)
    expected = [10000.0 ** (-2 * i / HEAD_DIM) / f for i, f in enumerate(lists[which])]
    assert angles == pytest.approx(expected, rel=1e-12)
    # the attention factor follows s, at every length: sqrt(1 + ln 4 / ln 16) = sqrt(1.5)
    assert norms == pytest.approx([math.sqrt(1.5)] * 4, rel=1e-12)


def test_longrope_with_a_null_factor_takes_s_from_the_length():
    encoding = scaled("longrope", original_length=16, **longrope_lists())
    _, norms = longrope_angles_and_norms(encoding, 64)  # s = 64 / 16 = 4
    assert norms == pytest.approx([math.sqrt(1 + math.log(4) / math.log(16))] * 4, rel=1e-12)
    assert encoding.scaling_record(64) == {
        "scaling": "longrope",
        "scaling_factor": 4.0,
        "scaling_factor_setting": None,
    }


@pytest.mark.parametrize("method", ["yarn", "longrope"])
def test_an_explicit_attention_factor_replaces_the_methods_own(method):
    encoding = scaled(method, 4.0, original_length=16, attention_factor=1.3, **longrope_lists())
    _, norms = longrope_angles_and_norms(encoding, 64)
    assert norms == pytest.approx([1.3] * 4, rel=1e-12)


@pytest.mark.parametrize("which", ["short_factor", "long_factor"])
@pytest.mark.parametrize(("values", "given"), [(None, "none"), ([1.0] * 3, "3"), ([1.0] * 5, "5")])
def test_a_longrope_factor_list_of_the_wrong_length_is_a_one_line_error_naming_the_length(
    which, values, given
):
    lists = longrope_lists() | {which: values}
    with pytest.raises(PosbenchError, match=rf"scaling\.{which} needs 4 .* got {given}$") as info:
        scaled("longrope", 2.0, **lists)
    assert "\n" not in str(info.value)


def test_longrope_lists_count_the_rotated_pairs_under_partial_rotary():
    # fraction 0.5 of head dim 8 rotates 4 dims: 2 pairs, 2 factors each
    scaled("longrope", 2.0, fraction=0.5, **longrope_lists(pairs=2))
    with pytest.raises(PosbenchError, match="needs 2 rescale factors"):
        scaled("longrope", 2.0, fraction=0.5, **longrope_lists())


def test_a_longrope_factor_that_is_not_positive_is_a_one_line_error():
    with pytest.raises(PosbenchError, match=r"long_factor must be positive \(got 0.0\)"):
        scaled("longrope", 2.0, **longrope_lists() | {"long_factor": [1.0, 2.0, 0.0, 3.0]})


@settings(max_examples=60, deadline=None)
@given(
    method=st.sampled_from(["none", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope"]),
    layout=st.sampled_from(["interleaved", "half"]),
    fraction=st.sampled_from([1.0, 0.5, 0.25]),
    m=st.integers(0, 150),
    n=st.integers(0, 150),
    shift=st.integers(0, 100),
    seed=st.integers(0, 2**16),
)
def test_scaled_rope_scores_depend_only_on_relative_distance(
    method, layout, fraction, m, n, shift, seed
):
    # One sequence of 256 positions (s = 256 / 16 = 16 for every method), the same query and
    # key vector at every position: score(m, n) must equal score(m + c, n + c).
    lists = longrope_lists(pairs=int(HEAD_DIM * fraction) // 2)
    encoding = scaled(method, layout=layout, fraction=fraction, **lists)
    q, k = random(HEAD_DIM, seed=seed), random(HEAD_DIM, seed=seed + 1)
    positions = torch.arange(256)
    q_rot = encoding.rotate(q.expand(1, 1, 256, HEAD_DIM), positions)[0, 0]
    k_rot = encoding.rotate(k.expand(1, 1, 256, HEAD_DIM), positions)[0, 0]
    scores = q_rot @ k_rot.T  # (T, T)
    assert float(scores[m + shift, n + shift]) == pytest.approx(float(scores[m, n]), abs=1e-9)


# --- configuration errors ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scaling", "message"),
    [
        ({"method": "rescale"}, "one of: none, linear, ntk, dynamic, yarn, llama3, longrope"),
        ({"method": "yarn", "factor": 0.5, "original_length": 16}, "factor must be >= 1"),
        ({"method": "yarn", "original_length": 16, "ramp": "smooth"}, "reference, paper"),
        ({"method": "yarn"}, "original_length"),
        ({"method": "yarn", "original_length": 16, "beta_fast": 1.0}, "beta_fast"),
        ({"method": "llama3", "original_length": 16, "high_freq_factor": 1.0}, "high_freq"),
        ({"method": "longrope", "original_length": 1, **ONES}, "original_length .* >= 2"),
        ({"method": "yarn", "original_length": 16, "attention_factor": 0.0}, "attention_factor"),
    ],
)
def test_bad_scaling_configs_are_one_line_errors(scaling, message):
    with pytest.raises(PosbenchError, match=message) as info:
        rope(scaling=scaling)
    assert "\n" not in str(info.value)


# --- yarn's reference ramp --------------------------------------------------------------------


def reference_yarn_ratios(length: int, dim: int, s: float, base: float = 10000.0) -> list[float]:
    """theta'_i / theta_i of YaRN as the authors' code and HF transformers compute it, written
    out from the formula: the pair index that turns r times within L is
    d ln(L / (2 pi r)) / (2 ln base); low = floor(that at r = 32), high = ceil(that at r = 1),
    clipped to [0, d - 1]; the interpolation weight ramps linearly in the pair index from 0 at
    low to 1 at high, and theta' = theta / s * weight + theta * (1 - weight)."""

    def index(rotations: float) -> float:
        return dim * math.log(length / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(index(32)), 0), min(math.ceil(index(1)), dim - 1)
    if low == high:
        high += 0.001
    ratios = []
    for i in range(dim // 2):
        weight = min(1.0, max(0.0, (i - low) / (high - low)))
        ratios.append(weight / s + (1 - weight))
    return ratios


def yarn_ratios(length: int, dim: int, s: float) -> list[float]:
    encoding = build_encoding(
        {"name": "rope", "scaling": {"method": "yarn", "factor": s, "original_length": length}},
        d_model=dim,
        n_head=1,
    ).eval()
    x = torch.tensor([1.0, 0.0] * (dim // 2), dtype=F64)[None, None, None]
    pairs = encoding.rotate(x, torch.tensor([1]))[0, 0, 0].unflatten(-1, (-1, 2))
    theta = [10000.0 ** (-2 * i / dim) for i in range(dim // 2)]
    return [math.atan2(b, a) / t for (a, b), t in zip(pairs.tolist(), theta, strict=True)]


def test_yarn_default_ramp_gives_the_reference_values_at_128_tokens_head_dim_32_and_s_4():
    ratios = yarn_ratios(128, 32, 4.0)
    assert ratios[:6] == pytest.approx([1.0, 0.875, 0.75, 0.625, 0.5, 0.375], abs=1e-9)


@pytest.mark.parametrize(
    ("length", "dim", "s"),
    [(128, 32, 4.0), (4096, 128, 16.0), (2048, 64, 8.0), (512, 16, 2.0), (64, 8, 3.0)],
)
def test_yarn_default_ramp_matches_the_reference_formula(length, dim, s):
    # at position 1 every angle is theta' <= 1 < pi, so atan2 reads it back unwrapped
    assert yarn_ratios(length, dim, s) == pytest.approx(
        reference_yarn_ratios(length, dim, s), rel=1e-9
    )


def test_yarn_temperature_scales_only_the_rotating_dims_under_partial_rotary():
    encoding = scaled("yarn", 4.0, fraction=0.5)
    x = random(1, 1, 3, HEAD_DIM, seed=16)
    out = encoding.rotate(x, torch.arange(3))
    factor = 0.1 * math.log(4.0) + 1
    assert torch.equal(out[..., HEAD_DIM // 2 :], x[..., HEAD_DIM // 2 :])
    pair_norms = out[..., : HEAD_DIM // 2].unflatten(-1, (-1, 2)).norm(dim=-1)
    expected = factor * x[..., : HEAD_DIM // 2].unflatten(-1, (-1, 2)).norm(dim=-1)
    torch.testing.assert_close(pair_norms, expected, rtol=1e-12, atol=0)


# --- p-RoPE (keep_frequencies) ----------------------------------------------------------------


def pair(x: torch.Tensor, i: int, layout: str) -> torch.Tensor:
    """Pair i of ``x`` (..., d) -> (..., 2): dims (2i, 2i+1) interleaved, (i, i + d/2) half."""
    first, second = (i, i + x.shape[-1] // 2) if layout == "half" else (2 * i, 2 * i + 1)
    return torch.stack((x[..., first], x[..., second]), dim=-1)


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize(
    ("keep", "kept_pairs"), [(1.0, 4), (0.75, 3), (0.5, 2), (0.25, 1), (0.0, 0)]
)
def test_p_rope_keeps_the_highest_frequencies_and_leaves_the_rest_unrotated(
    layout, keep, kept_pairs
):
    positions = [0, 3, 250]
    x = random(2, len(positions), HEAD_DIM, seed=17)
    out = rope(layout=layout, keep_frequencies=keep).rotate(x, torch.tensor(positions))
    # theta_i = base^(-2i/d) with d the full head dim for the kept pairs, 0 for the others
    theta = [10000.0 ** (-2 * i / HEAD_DIM) if i < kept_pairs else 0.0 for i in range(4)]
    for t, m in enumerate(positions):
        for i in range(4):
            expected = rotation(m * theta[i]) @ pair(x[..., t, :], i, layout).T
            torch.testing.assert_close(pair(out[..., t, :], i, layout), expected.T)


def test_p_rope_keeps_full_ropes_frequencies_where_partial_rotary_recomputes_them():
    x = random(1, 5, HEAD_DIM, seed=18)
    positions = torch.arange(5)
    p_rope = apply_rope(x, positions, keep_frequencies=0.5)
    partial = apply_rope(x, positions, fraction=0.5)
    full = apply_rope(x, positions)
    torch.testing.assert_close(p_rope[..., :4], full[..., :4], rtol=0, atol=1e-12)  # pairs 0, 1
    assert torch.equal(p_rope[..., 4:], x[..., 4:])
    assert not torch.allclose(partial[..., :4], full[..., :4])  # theta_1 = base^(-2/4) there


@pytest.mark.parametrize("keep", [0.3, -0.5, 1.5])
def test_a_keep_share_that_is_not_a_whole_number_of_frequencies_is_a_one_line_error(keep):
    with pytest.raises(PosbenchError, match=r"encoding\.keep_frequencies") as info:
        rope(keep_frequencies=keep)
    assert "\n" not in str(info.value)
