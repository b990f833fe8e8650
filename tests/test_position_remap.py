"""eval.position_remap (Self-Extend, STRING): attention under the remap against the papers'
position matrices written out in float64, outputs and gradients; a bias of the distance alone
under STRING; the encodings and settings refused in one line."""

from __future__ import annotations

import math

import pytest
import torch

from posbench.config import compose_config
from posbench.encodings import apply_rope, build_encoding
from posbench.errors import PosbenchError
from posbench.evaluation.positions import eval_remap
from posbench.model import build_model
from posbench.model.attention import blocks, causal_attention
from posbench.model.position_remap import (
    PositionRemap,
    configured_remap,
    remap_encoding,
    remap_record,
    remapped_positions,
)

SELF_EXTEND = PositionRemap("self_extend", window=8, group=4)
STRING = PositionRemap("string", window=3, shift=11)


def paper_positions(remap: PositionRemap, T: int) -> torch.Tensor:
    """The relative position of query i and key j (T, T), as the papers write it: Self-Extend's
    (Jin et al. 2024, eq. 3-4; LongLM's group_query_position - group_key_position past the
    neighbour window W) and STRING's (An et al. 2024: i - j - S + W from the shift S on)."""
    i = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    d = i - j
    if remap.method == "self_extend":
        G, W = remap.group, remap.window
        far = (i // G + W - W / G) - j // G  # LongLM's float form; G divides W here
        return torch.where(d < W, d, far.long())
    return torch.where(d < remap.shift, d, d - remap.shift + remap.window)


def paper_attention(q, k, v, remap: PositionRemap) -> torch.Tensor:
    """softmax over j <= i of q_i . R(P_ij) k_j / sqrt(hs), one rotation per (i, j), float64."""
    B, H, T, hs = q.shape
    P = paper_positions(remap, T).flatten()  # (T * T,)
    rotated = apply_rope(q.repeat_interleave(T, dim=2), P)  # (B, H, T * T, hs): q_i at P_ij
    scores = (rotated * k.repeat(1, 1, T, 1)).sum(-1).view(B, H, T, T) / math.sqrt(hs)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ v


@pytest.mark.parametrize("remap", [SELF_EXTEND, STRING], ids=["self_extend", "string"])
def test_remapped_attention_matches_the_papers_positions_outputs_and_gradients(remap, monkeypatch):
    monkeypatch.setattr(blocks, "QUERY_BLOCK", 8)  # several blocks of queries on either path
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 40, 8, dtype=torch.float64, requires_grad=True) for _ in "qkv")
    encoding = remap_encoding(build_encoding({"name": "rope"}, 16, 2), remap)
    positions = torch.arange(40)

    def remapped():
        q2, k2 = encoding.queries_and_keys(q, k, positions)  # (B, H, T, 2 hs)
        return causal_attention(q2, k2, v, positions, encoding)

    expected = paper_attention(q, k, v, remap)
    got = remapped()  # with gradients: the scores written out per block
    torch.testing.assert_close(got, expected, rtol=1e-10, atol=1e-10)
    grads = torch.autograd.grad((got * expected.detach()).sum(), (q, k, v))
    wanted = torch.autograd.grad((expected * expected.detach()).sum(), (q, k, v))
    for a, b in zip(grads, wanted, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)
    with torch.no_grad():  # evaluation: two fused calls merged by their log-sum-exps
        torch.testing.assert_close(remapped(), expected, rtol=1e-10, atol=1e-10)


def test_string_takes_a_bias_of_the_distance_at_the_shifted_distance():
    alibi = build_encoding({"name": "alibi"}, 16, 2)
    remapped = remap_encoding(alibi, STRING)
    d = torch.arange(30)
    shifted = torch.where(d < 11, d, d - 11 + 3)
    torch.testing.assert_close(remapped.relative_bias(d), alibi.relative_bias(shifted))
    past = d[:, None] - d[None, :]  # (T, T): i - j
    grid = alibi.relative_bias(shifted)[:, past.clamp(min=0)]  # (H, T, T) at i - j >= 0
    torch.testing.assert_close(remapped.score_bias(d, d).tril(), grid.tril())


def test_a_remap_leaves_windows_within_its_near_keys_and_the_weights_alone():
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "d_model": 16, "n_head": 2}, {"name": "rope"}).eval()
    tokens = torch.randint(0, 256, (1, 24))
    state = {key: value.clone() for key, value in model.state_dict().items()}
    with torch.no_grad():
        plain = model(tokens)
        with remapped_positions(model, PositionRemap("string", window=4, shift=24)):
            near_only = model(tokens)
        with remapped_positions(model, SELF_EXTEND):
            grouped = model(tokens)
    torch.testing.assert_close(near_only, plain)
    assert not torch.allclose(grouped, plain)
    assert all(torch.equal(state[key], value) for key, value in model.state_dict().items())


@pytest.mark.parametrize(
    ("encoding", "remap", "says"),
    [
        ({"name": "alibi"}, SELF_EXTEND, "use eval.position_remap=string"),
        ({"name": "learned"}, STRING, "learned reads positions otherwise"),
        ({"name": "xpos"}, STRING, "xpos reads positions otherwise"),
        (
            {"name": "rope", "scaling": {"method": "yarn", "original_length": 8}},
            STRING,
            "use one of the two",
        ),
    ],
)
def test_remaps_refuse_what_they_do_not_define_in_one_line(encoding, remap, says):
    with pytest.raises(PosbenchError, match=says) as error:
        remap_encoding(build_encoding(encoding, 16, 2), remap)
    assert "\n" not in str(error.value)


def test_remap_settings_default_from_the_training_length_and_are_checked():
    assert configured_remap("self_extend", None, None, 128) == PositionRemap(
        "self_extend", window=32, group=8
    )
    assert configured_remap("string", {}, {"shift": None}, 120) == PositionRemap(
        "string", window=7, shift=40
    )
    assert configured_remap("none", None, None, 128) is None
    with pytest.raises(PosbenchError, match=r"must be below eval\.string\.shift"):
        configured_remap("string", None, {"shift": 8, "window": 8}, 128)
    with pytest.raises(PosbenchError, match="choose one of: none, self_extend, string"):
        configured_remap("yarn", None, None, 128)


@pytest.mark.parametrize(
    ("self_extend", "string", "says"),
    [
        ({"window": 0}, None, "needs a window >= 1 and a group >= 1 .got window 0, group 8"),
        ({"group": 0}, None, "needs a window >= 1 and a group >= 1 .got window 32, group 0"),
        (None, {"window": 0}, "needs a window >= 1 and a group >= 1 .got window 0, group 1"),
        (None, {"shift": 0}, r"eval\.string\.window \(8\) must be below eval\.string\.shift \(0\)"),
    ],
)
def test_a_remap_setting_of_0_is_refused_not_read_as_its_default(self_extend, string, says):
    method = "self_extend" if string is None else "string"
    with pytest.raises(PosbenchError, match=says):
        configured_remap(method, self_extend, string, 128)


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        (["train.random_positions=512"], "set eval.positions=consecutive"),
        (["data=passkey"], "eval.decode=teacher_forced"),
        (["model.attention=sigmoid"], "use model.attention=softmax"),
        (["encoding=none"], "reads no positions to remap"),
    ],
)
def test_a_run_that_a_remap_cannot_evaluate_is_refused_before_training(overrides, says):
    with pytest.raises(PosbenchError, match=says):
        eval_remap(compose_config(["eval.position_remap=string", *overrides]))


def test_a_runs_remap_comes_from_its_eval_settings_and_names_its_records():
    cfg = compose_config(["eval.position_remap=self_extend", "eval.self_extend.group=4"])
    remap = eval_remap(cfg)
    assert remap == PositionRemap("self_extend", window=32, group=4)
    assert remap_record(remap)["scaling"] == "self_extend"
    assert remap_record(None)["position_remap"] == "none"
    assert eval_remap(compose_config([])) is None
