"""train.positions=pose (PoSE, Zhu et al. 2024): skip-wise position ids drawn as the reference's
train_preprocess_function_pose draws them, refused combinations in one line."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posbench.config import compose_config, position_sampler, validate
from posbench.errors import PosbenchError
from posbench.evaluation.positions import eval_positions
from posbench.model.random_positions import pose_positions, pose_sampler


def reference_pose(n: int, target: int, rng: random.Random) -> list[int]:
    """dwzhu-pku/PoSE's position ids for a window of n tokens (its revision with lt = 0)."""
    rt1 = rng.randint(1, (n + 1) // 2)
    rt = rng.randint(0, target - n)
    return [i + (rt if i >= rt1 else 0) for i in range(n)]


def chunks(row: list[int]) -> tuple[int, int]:
    """A row's first chunk's length and its skip: where consecutive ids first jump, and by what."""
    jumps = [(i + 1, b - a - 1) for i, (a, b) in enumerate(itertools.pairwise(row)) if b - a != 1]
    assert len(jumps) <= 1, "at most one skip"
    return jumps[0] if jumps else (len(row), 0)


@settings(max_examples=20, deadline=None)
@given(n=st.integers(2, 12), extra=st.integers(0, 20), seed=st.integers(0, 2**31))
def test_pose_draws_what_the_reference_can_draw_and_all_of_it(n, extra, seed):
    target = n + extra
    generator = torch.Generator().manual_seed(seed)
    ours = pose_positions(torch.full((400,), n), n, target, generator).tolist()
    rng = random.Random(seed)
    theirs = [reference_pose(n, target, rng) for _ in range(400)]
    # The same support: a first chunk of 1..(n+1)//2 ids from 0, a skip in [0, target - n].
    assert {chunks(row) for row in ours} <= {
        (first, skip) if skip else (n, 0)
        for first in range(1, (n + 1) // 2 + 1)
        for skip in range(target - n + 1)
    }
    assert all(row[0] == 0 and row[-1] < target for row in ours + theirs)
    assert {row[-1] for row in ours} == set(range(n - 1, target))  # every skip reached
    assert {row[-1] for row in theirs} <= {row[-1] for row in ours}


def test_pose_rows_pad_with_their_last_position():
    rows = pose_positions(torch.tensor([3, 5]), 5, 20, torch.Generator().manual_seed(0))
    assert rows[0, 3:].tolist() == [rows[0, 2].item()] * 2
    assert (rows.diff(dim=1) >= 0).all()


def test_pose_trains_skipped_and_evaluates_at_consecutive_positions():
    cfg = compose_config(["train.positions=pose", "train.seq_len=16"])
    sampler = position_sampler(cfg)
    assert (sampler.mode, sampler.n_positions, sampler.per_layer) == ("pose", 256, False)
    assert eval_positions(cfg) is None


@pytest.mark.parametrize(
    ("setting", "target", "random_positions", "says"),
    [
        ("skip", None, None, "unknown train.positions 'skip'; choose one of: consecutive, pose"),
        ("pose", 8, None, "must be >= train.seq_len"),
        ("pose", 0, None, "must be >= train.seq_len"),  # 0 is 0, not the default
        ("pose", None, 64, "choose one"),
    ],
)
def test_pose_refuses_in_one_line(setting, target, random_positions, says):
    with pytest.raises(PosbenchError, match=says):
        pose_sampler(setting, target, 16, random_positions, 2)


@pytest.mark.parametrize(
    ("encoding", "says"),
    [
        ("learned", "train.pose_length=2048 trains at positions past the 128 this learned model"),
        ("xpos", "train.pose_length=2048 trains at positions past the"),
    ],
)
def test_pose_past_what_the_encoding_represents_is_refused_when_the_config_is_checked(
    encoding, says
):
    """validate runs before Hydra makes the run directory (the -m pre-check included)."""
    overrides = [f"encoding={encoding}", "train.positions=pose", "train.seq_len=128"]
    if encoding == "xpos":  # its decay bounds positions at about 135 x scale_base
        overrides.append("encoding.scale_base=8")
    with pytest.raises(PosbenchError, match=says):
        validate(compose_config(overrides))
