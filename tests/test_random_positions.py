"""Randomized positional encodings (Ruoss et al. 2023, train.random_positions): training
sequences sit at sorted random subsets of [0, N), and so do evaluation windows by default
(eval.positions=auto; consecutive evaluates at 0..L-1). The tests marked "reference" check
posbench's draws against google-deepmind/randomized_positional_encodings, whose sampling each
transcribes afresh from its code (models/positional_encodings.py, models/transformer.py)."""

import json
import math
import shutil

import pytest
import torch
from test_checkpoint import SHORT, assert_same_run, at_batch, crash

from posbench.cli import main
from posbench.config import compose_config, validate
from posbench.data import Corpus, sample_positions
from posbench.encodings import build_encoding, encoding_names
from posbench.errors import PosbenchError
from posbench.evaluate import RandomPositions, eval_positions, evaluate_length
from posbench.model import ModelArgs, Transformer, build_model
from posbench.random_positions import PositionSampler
from posbench.train import train, validation_loss

SMALL = ModelArgs(n_layer=1, n_head=2, d_model=16)


@pytest.mark.parametrize(("n", "length"), [(64, 16), (16, 16), (1000, 3)])
def test_each_sequence_gets_a_sorted_subset_of_distinct_positions_below_n(n, length):
    positions = sample_positions(n, 5, length, torch.Generator().manual_seed(0))
    assert positions.shape == (5, length) and positions.dtype == torch.long
    for row in positions.tolist():
        assert row == sorted(set(row))
    assert 0 <= positions.min() and positions.max() < n


def test_sampled_positions_follow_the_generator_differ_per_sequence_and_cover_the_range():
    draws = sample_positions(64, 50, 16, torch.Generator().manual_seed(0))
    assert torch.equal(draws, sample_positions(64, 50, 16, torch.Generator().manual_seed(0)))
    assert len({tuple(row) for row in draws.tolist()}) == 50
    assert draws.min() == 0 and draws.max() == 63
    # Uniform over subsets: every position is in a subset with probability 16/64.
    many = sample_positions(64, 4000, 16, torch.Generator().manual_seed(1))
    share = torch.bincount(many.flatten(), minlength=64) / 4000
    assert share.sub(0.25).abs().max() < 0.05


def test_the_model_gives_its_encoding_the_positions_it_is_given(monkeypatch):
    model = Transformer(SMALL, build_encoding({"name": "none"}, SMALL.d_model, SMALL.n_head))
    seen = []
    for hook in ("embed", "rotate", "score_bias"):
        original = getattr(model.encoding, hook)

        def recording(*args, original=original):
            seen.extend(a for a in args if a.dtype == torch.long)  # the position arguments
            return original(*args)

        monkeypatch.setattr(model.encoding, hook, recording)
    positions = torch.tensor([2, 5, 6, 40])
    model(torch.zeros(1, 4, dtype=torch.long), positions)
    assert len(seen) >= 1 + 2 * SMALL.n_layer
    assert all(torch.equal(p, positions) for p in seen)


# Encodings that read no positions: NoPE, and the biases of the content alone (FoX, CoPE).
POSITION_FREE = {"none", "fox", "cope"}


@pytest.mark.parametrize("name", encoding_names())
@pytest.mark.parametrize("length", [12, 300])  # 300: several query blocks with a score bias
def test_one_row_of_positions_per_sequence_equals_each_sequence_alone(name, length):
    """Positions (B, T) through every encoding hook (embed, rotate, score_bias) and attention
    path: row b of the batch gives what sequence b alone gives at its own positions (T,)."""
    torch.manual_seed(0)
    config = {"name": name, "max_length": 1024} if name == "learned" else {"name": name}
    model = Transformer(SMALL, build_encoding(config, SMALL.d_model, SMALL.n_head)).double()
    tokens = torch.randint(0, 256, (3, length))
    positions = sample_positions(1024, 3, length, torch.Generator().manual_seed(1))
    for training in (True, False):  # with gradients, and the blocked inference path
        model.train(training)
        with torch.set_grad_enabled(training):
            batched = model(tokens, positions)
            alone = [model(tokens[b : b + 1], positions[b]) for b in range(3)]
        torch.testing.assert_close(batched, torch.cat(alone))
    assert not torch.allclose(alone[0], model(tokens[:1])) or name in POSITION_FREE


def test_a_learned_table_serves_positions_past_the_input_length_up_to_its_rows():
    model = Transformer(SMALL, build_encoding({"name": "learned", "max_length": 64}, 16, 2))
    tokens = torch.zeros(1, 4, dtype=torch.long)
    assert model(tokens, torch.tensor([0, 9, 30, 63])).shape == (1, 4, 256)
    with pytest.raises(PosbenchError, match="64"):
        model(tokens, torch.tensor([0, 9, 30, 64]))


def test_rope_scores_at_shifted_positions_equal_those_at_zero_to_t():
    torch.manual_seed(0)
    model = Transformer(SMALL, build_encoding({"name": "rope"}, 16, 2)).double()
    tokens = torch.randint(0, 256, (2, 12))
    torch.testing.assert_close(model(tokens, torch.arange(100, 112)), model(tokens))


def test_the_learned_table_has_one_row_per_random_position():
    cfg = compose_config(["encoding=learned", "train.seq_len=32", "train.random_positions=256"])
    assert build_model(cfg.model, cfg.encoding).max_length == 256
    plain = compose_config(["encoding=learned", "train.seq_len=32"])
    assert build_model(plain.model, plain.encoding).max_length == 32


def test_fewer_random_positions_than_the_training_length_is_a_one_line_error():
    cfg = compose_config(["train.seq_len=128", "train.random_positions=100"])
    with pytest.raises(PosbenchError, match=r"train\.random_positions \(100\) must be >= ") as info:
        validate(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        # xPos's decay leaves float32 past 69,478 positions (gamma 512).
        (["encoding=xpos", "train.random_positions=100000"], "scale_base>=737"),
        (["encoding=learned", "encoding.max_length=1024", "train.random_positions=4096"], "4096"),
        (["encoding=learned", "encoding.max_length=64"], "max_length>=128"),  # seq_len 128
    ],
)
def test_training_past_the_positions_an_encoding_represents_is_refused_before_it_starts(
    overrides, message
):
    with pytest.raises(PosbenchError, match=message) as info:
        validate(compose_config(overrides))
    assert "\n" not in str(info.value)
    assert "trains at positions past the" in str(info.value)
    assert "; set encoding." in str(info.value)  # nothing trained yet: nothing to retrain


@pytest.mark.parametrize("name", encoding_names())
def test_every_encodings_default_trains_within_the_positions_it_represents(name):
    validate(compose_config([f"encoding={name}", "train.random_positions=4096"]))


RANDOM = [*SHORT, "encoding=learned", "train.random_positions=64", "eval.lengths=[16,64]"]


@pytest.fixture(scope="module")
def straight_random(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("straight_random")
    results = train(compose_config([*RANDOM, f"data.cache_dir={cache_dir}"]), run_dir)
    return run_dir, results


def recorded_positions(monkeypatch) -> list[tuple[bool, torch.Tensor | None]]:
    """(training?, positions) of every forward pass of a Transformer from now on."""
    used = []
    forward = Transformer.forward

    def recording(self, tokens, positions=None, *args, **kwargs):
        used.append((self.training, positions))
        return forward(self, tokens, positions, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", recording)
    return used


def assert_sorted_distinct_subsets_below(positions: torch.Tensor, n: int) -> None:
    assert positions.dtype == torch.long and 0 <= positions.min() and positions.max() < n
    assert all(row == sorted(set(row)) for row in positions.tolist())


def test_training_and_evaluation_both_draw_positions_from_the_range(
    straight_random, monkeypatch, cache_dir, tmp_path
):
    used = recorded_positions(monkeypatch)
    train(compose_config([*RANDOM, "train.steps=3", f"data.cache_dir={cache_dir}"]), tmp_path)
    drawn = [p for training, p in used if training]
    cfg = compose_config(RANDOM)
    shape = (cfg.model.n_layer, cfg.train.batch_size, 16)  # a draw per layer (by default)
    assert len(drawn) == 3 and all(p.shape == shape and p.max() < 64 for p in drawn)
    rows = [tuple(row) for p in drawn for row in p.flatten(0, 1).tolist()]
    assert len(set(rows)) == len(rows)  # per row and layer
    assert any(p.max() >= 16 for p in drawn)  # not 0..15
    evaluated = [p for training, p in used if not training]  # validation and evaluation
    assert evaluated and all(p is not None for p in evaluated)
    for p in evaluated:
        assert_sorted_distinct_subsets_below(p.flatten(0, 1), 64)
    assert any(p.max() >= 16 for p in evaluated if p.shape[-1] == 16)  # not 0..15 either
    _, results = straight_random
    assert [(r["length"], r["status"]) for r in results["eval"]] == [(16, "ok"), (64, "ok")]
    for record in results["eval"]:
        assert (record["positions"], record["random_positions"]) == ("random", 64)
        assert record["random_positions_mode"] == "positions"
        assert record["random_positions_per_layer"] is True
    windows = [r["tokens"] // r["length"] for r in results["eval"]]  # max_tokens: whole windows
    assert [r["position_draws"] for r in results["eval"]] == windows


def random_windows_evaluation(monkeypatch, encoding: str, batch_size: int) -> torch.Tensor:
    """The positions the 7 windows of a 32-token evaluation of 200 tokens are given, in
    window order -> (7, 32)."""
    torch.manual_seed(0)
    model = Transformer(SMALL, build_encoding({"name": encoding}, SMALL.d_model, SMALL.n_head))
    used = recorded_positions(monkeypatch)
    tokens = torch.arange(200) % 256
    at = RandomPositions(PositionSampler(100, SMALL.n_layer, per_layer=False), seed=7)
    record = evaluate_length(model, tokens, 32, batch_size=batch_size, positions=at)
    monkeypatch.undo()
    assert record["positions"] == "random" and record["position_draws"] == 7
    return torch.cat([p for _, p in used])


def test_evaluation_positions_depend_on_the_window_not_on_the_run_or_the_batch_size(monkeypatch):
    one = random_windows_evaluation(monkeypatch, "rope", batch_size=1)
    three = random_windows_evaluation(monkeypatch, "alibi", batch_size=3)
    assert torch.equal(one, three)  # another encoding and batching: the same positions
    assert one.shape == (7, 32)
    assert_sorted_distinct_subsets_below(one, 100)
    assert len({tuple(row) for row in one.tolist()}) == 7  # a subset of its own per window
    other_seed = RandomPositions(PositionSampler(100, 1, False), seed=8).of_windows(32, [0])
    assert not torch.equal(other_seed.positions[0], one[0])


def test_a_length_above_the_range_is_unsupported_with_the_reason():
    model = Transformer(SMALL, build_encoding({"name": "rope"}, SMALL.d_model, SMALL.n_head))
    record = evaluate_length(
        model,
        torch.zeros(500, dtype=torch.long),
        128,
        positions=RandomPositions(PositionSampler(100, SMALL.n_layer), 0),
    )
    assert record["status"] == "unsupported" and record["ppl"] is None
    assert "[0, 100)" in record["reason"] and "eval.positions=consecutive" in record["reason"]
    assert (record["positions"], record["random_positions"]) == ("random", 100)


def test_validation_during_training_scores_its_windows_at_the_positions_evaluation_uses():
    torch.manual_seed(0)
    model = Transformer(SMALL, build_encoding({"name": "rope"}, SMALL.d_model, SMALL.n_head))
    with torch.no_grad():  # weights large enough for the positions to change the loss
        for weight in model.parameters():
            weight.normal_(0, 0.5)
    val = (torch.arange(4000) * 7 % 251).to(torch.uint8).numpy()
    corpus = Corpus("bytes", val, val)
    cfg = compose_config(["train.seq_len=16", "train.batch_size=4", "train.val_batches=2"]).train
    positions = RandomPositions(PositionSampler(64, SMALL.n_layer), seed=3)
    loss = validation_loss(model, corpus, cfg, positions=positions)
    # The same 8 windows of 16 tokens, evaluated as posbench evaluates them.
    record = evaluate_length(model, val[: 8 * 16 + 1], 16, positions=positions)
    assert loss == pytest.approx(record["bits_per_byte"] * math.log(2), rel=1e-6)
    assert loss != pytest.approx(validation_loss(model, corpus, cfg), rel=1e-3)  # not 0..15


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ([], None),
        (["train.random_positions=256"], RandomPositions(PositionSampler(256, 2), 0)),
        (
            ["train.random_positions=256", "data.seed=5"],
            RandomPositions(PositionSampler(256, 2), 5),
        ),
        (["train.random_positions=256", "eval.positions=consecutive"], None),
        (
            ["train.random_positions=256", "eval.positions=random"],
            RandomPositions(PositionSampler(256, 2), 0),
        ),
        (
            [
                "encoding=alibi",
                "train.random_positions=256",
                "train.random_positions_per_layer=false",
            ],
            RandomPositions(PositionSampler(256, 2, per_layer=False, mode="distances"), 0),
        ),
    ],
)
def test_eval_positions_follow_the_training_unless_set(overrides, expected):
    assert eval_positions(compose_config(["model.n_layer=2", *overrides])) == expected


def test_random_evaluation_positions_without_a_training_range_is_a_one_line_error():
    with pytest.raises(
        PosbenchError, match=r"eval.positions=random .*train.random_positions"
    ) as info:
        validate(compose_config(["eval.positions=random"]))
    assert "\n" not in str(info.value)


def test_posbench_eval_at_consecutive_positions_keeps_the_random_records_beside(
    straight_random, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    shutil.copytree(straight_random[0], run_dir)
    main(["eval", "--run", str(run_dir), "--length", "16", "--positions", "consecutive"])
    records = json.loads((run_dir / "results.json").read_text())["eval"]
    at_16 = {r["positions"]: r for r in records if r["length"] == 16}
    assert at_16.keys() == {"random", "consecutive"}
    assert at_16["consecutive"]["random_positions"] is None
    assert at_16["random"] == straight_random[1]["eval"][0]  # kept as it was
    assert at_16["consecutive"]["ppl"] != at_16["random"]["ppl"]


def test_a_resumed_random_positions_run_equals_an_uninterrupted_one(
    straight_random, cache_dir, tmp_path, monkeypatch
):
    overrides = [*RANDOM, f"data.cache_dir={cache_dir}"]
    at_batch(monkeypatch, 13, crash)  # after the step-10 checkpoint
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), tmp_path)
    monkeypatch.undo()
    train(compose_config([*overrides, "train.resume=true"]), tmp_path)
    assert_same_run(tmp_path, straight_random[0])
