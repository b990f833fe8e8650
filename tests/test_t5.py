"""T5 relative position bias (Raffel et al. 2020), causal buckets.

Expected buckets are either the values the issue lists for 32 buckets / max distance 128 or
computed here, one distance at a time with ``math.log``, from the published formula.
"""

from __future__ import annotations

import math

import pytest
import torch

from posbench.config import compose_config
from posbench.encodings import build_encoding, t5_bucket
from posbench.errors import PosbenchError
from posbench.model import build_model


def bucket_of_distance(n: int, num_buckets: int, max_distance: int) -> int:
    """T5's unidirectional bucket of a key n >= 0 positions in the past."""
    exact = num_buckets // 2
    if n < exact:
        return n
    spread = num_buckets - exact  # the log-spaced buckets (one more than exact ones if odd)
    log_spaced = exact + int(math.log(n / exact) / math.log(max_distance / exact) * spread)
    return min(log_spaced, num_buckets - 1)


def buckets(distances, num_buckets=32, max_distance=128) -> list[int]:
    relative = -torch.tensor(distances)  # a key n positions back is at relative position -n
    return t5_bucket(relative, num_buckets, max_distance).tolist()


def test_distances_zero_to_fifteen_have_a_bucket_each():
    assert buckets(range(16)) == list(range(16))


def test_distances_sixteen_to_eighteen_share_bucket_sixteen():
    assert buckets([16, 17, 18]) == [16, 16, 16]


def test_distances_from_113_on_share_the_last_bucket():
    assert buckets([112]) == [30]
    assert buckets([113, 114, 128, 1000, 16384, 10**6]) == [31] * 6


@pytest.mark.parametrize(
    ("num_buckets", "max_distance"), [(32, 128), (64, 256), (16, 64), (8, 1000), (33, 40)]
)
def test_buckets_follow_the_formula_at_every_distance(num_buckets, max_distance):
    distances = list(range(2 * max_distance + 10))
    expected = [bucket_of_distance(n, num_buckets, max_distance) for n in distances]
    assert buckets(distances, num_buckets, max_distance) == expected


def test_future_keys_share_bucket_zero():
    assert t5_bucket(torch.tensor([1, 5, 500])).tolist() == [0, 0, 0]


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "message"),
    [(1, 128, "num_buckets must be >= 2"), (32, 16, "max_distance must exceed")],
)
def test_bucket_settings_without_room_are_refused_in_one_line(num_buckets, max_distance, message):
    with pytest.raises(PosbenchError, match=message) as info:
        build_encoding(
            {"name": "t5", "num_buckets": num_buckets, "max_distance": max_distance}, 16, 2
        )
    assert "\n" not in str(info.value)


def test_bias_is_the_learned_scalar_of_each_pairs_bucket_and_head():
    encoding = build_encoding({"name": "t5", "num_buckets": 8, "max_distance": 20}, 16, 2)
    table = encoding.bias_table.weight.detach()  # (buckets, heads)
    queries, keys = [0, 9, 30], [0, 1, 5, 9, 25, 30]
    bias = encoding.score_bias(torch.tensor(queries), torch.tensor(keys))
    expected = [
        [[float(table[bucket_of_distance(max(i - j, 0), 8, 20), h]) for j in keys] for i in queries]
        for h in range(2)
    ]
    torch.testing.assert_close(bias, torch.tensor(expected), rtol=0, atol=0)


def test_one_table_of_buckets_by_heads_is_shared_by_all_layers():
    cfg = compose_config(["encoding=t5", "encoding.num_buckets=64", "model.n_layer=3"])
    model = build_model(cfg.model, cfg.encoding)
    tables = [name for name, _ in model.named_parameters() if "bias_table" in name]
    assert tables == ["encoding.bias_table.weight"]
    assert model.encoding.bias_table.weight.shape == (64, cfg.model.n_head)
