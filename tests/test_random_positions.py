"""Randomized positional encodings (Ruoss et al. 2023, train.random_positions): training
sequences sit at sorted random subsets of [0, N), and so do evaluation windows by default
(eval.positions=auto; consecutive evaluates at 0..L-1). The tests marked "reference" check
posbench's draws against google-deepmind/randomized_positional_encodings, whose sampling each
transcribes afresh from its code (models/positional_encodings.py, models/transformer.py)."""

import itertools
import json
import math
import shutil

import numpy as np
import pytest
import torch
from conftest import TINY_REVERSE_STRING
from test_checkpoint import SHORT, assert_same_run, at_batch, crash

from posbench.cli import main
from posbench.config import compose_config, position_sampler, validate
from posbench.data import Corpus, load_data, sample_positions
from posbench.encodings import build_encoding, encoding_names
from posbench.errors import PosbenchError
from posbench.evaluation import diagnose as diagnose_module
from posbench.evaluation.diagnose import diagnose_run
from posbench.evaluation.perplexity import evaluate_length
from posbench.evaluation.positions import RandomPositions, eval_positions
from posbench.model import Transformer, build_model
from posbench.model.args import ModelArgs
from posbench.model.attention import QueryBlockBiases, causal_attention
from posbench.model.random_positions import PositionSampler, randomizes_distances, row_lengths
from posbench.runs.directory import load_run_config
from posbench.training.train import make_optimizer, train
from posbench.training.train_loop import train_step, validation_loss

SMALL = ModelArgs(n_layer=1, n_head=2, d_model=16)
SMALL2 = ModelArgs(n_layer=2, n_head=2, d_model=16)
# The encodings whose bias is a function of the distance alone, and nothing else positional.
DISTANCE_ONLY = {"alibi", "t5", "kerple", "sandwich"}


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
POSITION_FREE = {"none", "fox", "cope", "path"}


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


@pytest.mark.parametrize("encoding", ["learned", "t5"])  # drawn positions; drawn distances
def test_a_resumed_random_positions_run_equals_an_uninterrupted_one(
    encoding, straight_random, cache_dir, tmp_path, monkeypatch
):
    overrides = [*RANDOM, f"encoding={encoding}", f"data.cache_dir={cache_dir}"]
    straight = straight_random[0]
    if encoding != "learned":  # the fixture's run is learned's
        straight = tmp_path / "straight"
        train(compose_config(overrides), straight)
    resumed = tmp_path / "resumed"
    at_batch(monkeypatch, 13, crash)  # after the step-10 checkpoint
    with pytest.raises(RuntimeError, match="simulated crash"):
        train(compose_config(overrides), resumed)
    monkeypatch.undo()
    train(compose_config([*overrides, "train.resume=true"]), resumed)
    assert_same_run(resumed, straight)


# --- the reference's sampling, transcribed afresh (models/positional_encodings.py) -------------


def reference_sorted_subset(rng: np.random.Generator, values: np.ndarray, n: int) -> np.ndarray:
    """``jnp.sort(jrandom.choice(key, values, shape=(n,), replace=False))``: the reference's
    noisy_fixed_positional_encodings draws its indexes so from ``values`` = arange(N), and
    compute_noisy_alibi_encodings_biases and compute_attention_with_noisy_relative_encodings
    their distances from arange(1, N)."""
    return np.sort(rng.choice(values, size=n, replace=False))


def reference_alibi_slopes(num_heads: int) -> list[float]:
    """The reference's _get_alibi_slopes."""

    def power_of_2(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_2(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_2(closest) + reference_alibi_slopes(2 * closest)[0::2][: num_heads - closest]


def reference_rel_shift(logits: np.ndarray, attention_length: int) -> np.ndarray:
    """The reference's _rel_shift_inner (relative_shift with causal=False) of (T_q, T_v + T_q)."""
    tq, total = logits.shape
    shifted = logits.reshape(total, tq)[1:].reshape(tq, total - 1)
    return shifted[:, :attention_length]


def reference_noisy_alibi(sample: np.ndarray, num_heads: int, length: int) -> np.ndarray:
    """compute_noisy_alibi_encodings_biases((num_heads, length, length), N), with
    randomize_both_sides=False, given its draw ``sample`` (length - 1 values of arange(1, N))
    -> (H, T, T), query by key."""
    symmetric = -np.sort(sample)
    right = symmetric[: length - 1]
    left = np.flip(symmetric)[: length - 1] + 0.5
    left = np.concatenate([[np.nan], left])  # jnp.empty((1,)): "the value will be ignored"
    row = np.concatenate([left, [0.0], right])  # (2T,)
    alibi = reference_rel_shift(np.tile(row, (length, 1)), length)  # (T, T)
    return alibi[None] * np.array(reference_alibi_slopes(num_heads))[:, None, None]


def last_positions(positions: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's position at its last own token, (B,)."""
    return positions.gather(-1, (lengths - 1)[:, None])[:, 0]


def test_a_short_problem_in_a_mixed_batch_spans_the_range_as_the_reference_draws_it():
    """The review measured problems of 1-5 letters of duplicate_string ending near position 157
    of 2,048 (their subset drawn for the batch's widest row): each row now draws for its own
    length, as the reference draws a sequence's, and ends where the reference's would."""
    n_positions = 2048
    task = load_data({"source": "duplicate_string", "train_lengths": [1, 40]})
    sampler = PositionSampler(n_positions, n_layer=1, per_layer=False)
    generator, rng = torch.Generator().manual_seed(0), np.random.default_rng(0)
    ours, reference = [], []
    for step in range(40):
        x, y = task.train_batch(32, 128, generator, step)
        lengths = row_lengths(y)
        positions = sampler.draw(lengths, x.shape[1], generator).positions  # (B, T)
        for row, n in zip(positions, lengths.tolist(), strict=True):
            own = row[:n].tolist()
            assert own == sorted(set(own)) and 0 <= own[0] and own[-1] < n_positions
            assert (row[n:] == own[-1]).all()  # the padding repeats the last position
        short = lengths <= 3 * 5 + 1  # problems of 1-5 letters: 3n inputs
        ours += last_positions(positions, lengths)[short].tolist()
        reference += [
            reference_sorted_subset(rng, np.arange(n_positions), n)[-1]
            for n in lengths[short].tolist()
        ]
    assert len(ours) > 100
    assert np.mean(ours) == pytest.approx(np.mean(reference), abs=150)
    assert np.mean(ours) > 1500  # the review's posbench: 157


@pytest.mark.parametrize("length", [1, 7])
def test_each_order_statistic_of_a_draw_matches_the_references(length):
    """Not only the last position: the k-th smallest of a row's subset has the reference's
    distribution, padded or not (rows of ``length`` in a batch of width 20)."""
    n_positions, rows = 50, 4000
    lengths = torch.tensor([length, 20]).repeat(rows // 2)
    drawn = PositionSampler(n_positions, 1, per_layer=False).draw(
        lengths, 20, torch.Generator().manual_seed(0)
    )
    ours = drawn.positions[lengths == length, :length].double().mean(0)
    rng = np.random.default_rng(1)
    reference = np.mean(
        [reference_sorted_subset(rng, np.arange(n_positions), length) for _ in range(rows // 2)], 0
    )
    np.testing.assert_allclose(ours.numpy(), reference, atol=1.0)


def layer_inputs(model: Transformer, monkeypatch) -> tuple[list, list]:
    """(every layer's attention positions, the embedding's positions), recorded from now on."""
    layers, embedded = [], []
    for block in model.blocks:
        block.attn.register_forward_pre_hook(lambda _, args: layers.append(args[1]))
    embed = model.encoding.embed

    def recording(x, positions):
        embedded.append(positions)
        return embed(x, positions)

    monkeypatch.setattr(model.encoding, "embed", recording)
    return layers, embedded


@pytest.mark.parametrize("per_layer", [True, False])
@pytest.mark.parametrize("encoding", ["rope", "learned"])
def test_each_layer_attends_at_a_fresh_draw_and_the_embedding_at_the_first(
    per_layer, encoding, monkeypatch
):
    """The reference's NOISY_ROTARY calls hk.next_rng_key() in every attention layer; its
    NOISY_LEARNT and NOISY_SIN_COS draw once, at the embedding."""
    overrides = [
        *TINY_REVERSE_STRING,
        f"encoding={encoding}",
        "model.n_layer=3",
        "train.random_positions=256",
        f"train.random_positions_per_layer={per_layer}",
    ]
    cfg = compose_config(overrides)
    model = build_model(cfg.model, cfg.encoding)
    layers, embedded = layer_inputs(model, monkeypatch)
    train_step(
        model,
        make_optimizer(model, cfg.train),
        load_data(cfg.data),
        torch.Generator().manual_seed(0),
        0,
        cfg.train,
        positions=position_sampler(cfg),
    )
    pieces = len(embedded)
    assert pieces >= 1 and len(layers) == 3 * pieces  # a piece per width slice
    for piece in range(pieces):
        first, second, third = layers[3 * piece : 3 * piece + 3]
        assert torch.equal(embedded[piece], first)
        assert torch.equal(first, second) != per_layer and torch.equal(second, third) != per_layer


def attention_bias(encoding, distances: torch.Tensor, gradients: bool) -> torch.Tensor:
    """The bias that causal_attention adds, read back from its output: with q = 0 and one-hot
    values, output (i, j) is the probability p_ij, and log p_ij - log p_ii is
    bias(i, j) - bias(i, i) -> (H, T, T), NaN at future keys."""
    T = distances.shape[-1]
    H = encoding.n_head
    q, k = torch.zeros(2, 1, H, T, 16, dtype=torch.float64)
    v = torch.eye(T, 16, dtype=torch.float64).expand(1, H, T, 16)
    biases = QueryBlockBiases(encoding, distances=distances[None])
    with torch.set_grad_enabled(gradients):
        p = causal_attention(q, k, v, torch.arange(T), encoding, biases=biases)[0, :, :, :T]
    log_p = p.detach().log()
    return (
        (log_p - log_p.diagonal(dim1=-2, dim2=-1)[..., None])
        .tril()
        .masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("nan"))
    )


def distance_draw(n_positions: int, length: int, seed: int) -> torch.Tensor:
    """One row of randomized distances of ``length`` tokens, as training draws it -> (T,)."""
    sampler = PositionSampler(n_positions, 1, per_layer=False, mode="distances")
    drawn = sampler.draw(torch.tensor([length]), length, torch.Generator().manual_seed(seed))
    return drawn.distances[0]


def test_randomized_alibi_is_the_references_noisy_alibi_a_function_of_the_distance_alone():
    """The causal half of the reference's NOISY_ALIBI at the same draw, less the +0.5 the
    reference adds to past keys to tell them from future ones in its non-causal encoder (its
    plain ALiBi adds it too; posbench's causal ALiBi has neither)."""
    T, H, n_positions = 12, 4, 2048
    encoding = build_encoding({"name": "alibi"}, 16 * H, H).double()
    distances = distance_draw(n_positions, T, seed=0)
    assert distances[0] == 0 and distances.diff().min() > 0 and distances.max() < n_positions
    ours = attention_bias(encoding, distances, gradients=False)
    for d in range(T):  # zero spread along every diagonal i - j = d
        diagonal = ours.diagonal(offset=-d, dim1=-2, dim2=-1)  # (H, T - d)
        assert (diagonal.amax(-1) - diagonal.amin(-1)).abs().max() < 1e-9
    reference = torch.from_numpy(reference_noisy_alibi(distances[1:].numpy(), H, T))
    slopes = torch.tensor(reference_alibi_slopes(H), dtype=torch.float64)[:, None, None]
    past = torch.ones(T, T).tril(-1)
    expected = (reference - 0.5 * slopes * past).masked_fill(past.T.bool(), float("nan"))
    torch.testing.assert_close(ours, expected, equal_nan=True, rtol=0, atol=1e-9)


@pytest.mark.parametrize("name", ["t5", "kerple", "sandwich"])
@pytest.mark.parametrize("gradients", [False, True], ids=["eval", "train"])
def test_randomized_relative_biases_take_their_bias_at_the_drawn_distance(name, gradients):
    """As NOISY_RELATIVE relabels Transformer-XL's distances: the bias of tokens d apart is the
    encoding's at the d-th drawn distance (with gradients: the learned tables' path too)."""
    torch.manual_seed(0)
    T, H = 12, 2
    encoding = build_encoding({"name": name}, 16 * H, H).double()
    distances = distance_draw(64, T, seed=1)
    ours = attention_bias(encoding, distances, gradients)
    with torch.no_grad():
        # (H, T): its bias at s[0], ..., s[T - 1] (Sandwich's in float32)
        table = encoding.relative_bias(distances).double()
    apart = torch.arange(T)[:, None] - torch.arange(T)[None, :]  # (T, T)
    expected = (table[:, apart.clamp(min=0)] - table[:, :1, None]).masked_fill(apart < 0, math.nan)
    torch.testing.assert_close(ours, expected, equal_nan=True, rtol=0, atol=1e-9)


def test_randomized_distances_are_a_sorted_subset_of_one_to_n_drawn_as_the_reference_draws():
    n_positions, length, rows = 40, 9, 3000
    sampler = PositionSampler(n_positions, 1, per_layer=False, mode="distances")
    lengths = torch.full((rows,), length)
    drawn = sampler.draw(lengths, length, torch.Generator().manual_seed(0)).distances
    assert (drawn[:, 0] == 0).all() and (drawn[:, 1:].diff() > 0).all()
    assert drawn[:, 1:].min() >= 1 and drawn.max() < n_positions
    rng = np.random.default_rng(0)
    values = np.arange(1, n_positions)
    reference = np.mean([reference_sorted_subset(rng, values, length - 1) for _ in range(rows)], 0)
    np.testing.assert_allclose(drawn[:, 1:].double().mean(0).numpy(), reference, atol=0.5)


@pytest.mark.parametrize("per_layer", [True, False])
def test_each_layer_takes_its_bias_at_distances_of_its_own(per_layer, monkeypatch):
    cfg = compose_config(
        [
            "encoding=alibi",
            "model.n_layer=3",
            "train.random_positions=256",
            f"train.random_positions_per_layer={per_layer}",
        ]
    )
    model = build_model(cfg.model, cfg.encoding)
    seen = []
    relative_bias = model.encoding.relative_bias
    monkeypatch.setattr(
        model.encoding, "relative_bias", lambda d: seen.append(d) or relative_bias(d)
    )
    at = position_sampler(cfg).draw(torch.tensor([20, 9]), 20, torch.Generator().manual_seed(0))
    assert at.positions is None  # the tokens stay at 0..T-1
    with torch.no_grad():
        model(torch.zeros(2, 20, dtype=torch.long), at.positions, distances=at.distances)
    assert len(seen) == (3 if per_layer else 1)  # a bias per layer, or one for all
    if per_layer:
        assert all(not torch.equal(a, b) for a, b in itertools.pairwise(seen))
    layers = at.distances if per_layer else at.distances[None]  # (layers, B, T)
    assert all(torch.equal(d, layer.flatten()) for d, layer in zip(seen, layers, strict=True))


@pytest.mark.parametrize(
    ("name", "mode"),
    [(n, "distances" if n in DISTANCE_ONLY else "positions") for n in encoding_names()],
)
def test_auto_randomizes_distances_of_a_bias_of_the_distance_alone_and_positions_elsewhere(
    name, mode
):
    cfg = compose_config([f"encoding={name}", "train.random_positions=4096"])
    assert position_sampler(cfg).mode == mode


def test_distances_for_an_encoding_that_reads_positions_is_a_one_line_error():
    cfg = compose_config(
        ["encoding=fire", "train.random_positions=256", "train.random_positions_mode=distances"]
    )
    with pytest.raises(PosbenchError, match="random_positions_mode=auto or positions") as info:
        validate(cfg)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", encoding_names())
@pytest.mark.parametrize("length", [12, 300])  # 300: several query blocks with a score bias
def test_a_padded_rows_outputs_are_those_of_its_own_tokens_alone(name, length):
    """A row drawn for its own length, its padding at its last position repeated: causal in
    token order, every path gives its own tokens what they get without the padding (per-layer
    draws; distances for a bias of the distance alone)."""
    torch.manual_seed(0)
    config = {"name": name, "max_length": 1024} if name == "learned" else {"name": name}
    model = Transformer(SMALL2, build_encoding(config, SMALL2.d_model, SMALL2.n_head)).double()
    mode = "distances" if randomizes_distances(model.layer_encodings) else "positions"
    lengths = torch.tensor([length, length // 2, 1])
    at = PositionSampler(1024, SMALL2.n_layer, mode=mode).draw(
        lengths, length, torch.Generator().manual_seed(1)
    )
    tokens = torch.randint(0, 256, (3, length))
    for training in (True, False):  # with gradients, and the blocked inference path
        model.train(training)
        with torch.set_grad_enabled(training):
            batched = model(tokens, at.positions, distances=at.distances)
            for b, n in enumerate(lengths.tolist()):
                own = at.rows(torch.tensor([b]), n)
                alone = model(tokens[b : b + 1, :n], own.positions, distances=own.distances)
                torch.testing.assert_close(batched[b : b + 1, :n], alone)


def test_training_and_evaluation_draw_an_example_of_a_length_alike():
    """An example of 6 tokens: in a training batch padded to 30 and on its own at evaluation
    (keyed by its index), the same distribution of positions, the reference's."""
    n_positions, rows = 64, 3000
    sampler = PositionSampler(n_positions, 1, per_layer=False)
    lengths = torch.tensor([6, 30]).repeat(rows)
    trained = sampler.draw(lengths, 30, torch.Generator().manual_seed(0)).positions
    trained = trained[lengths == 6, :6].double().mean(0)
    evaluated = RandomPositions(sampler, seed=0).of_windows(30, range(rows), torch.full((rows,), 6))
    assert (evaluated.positions[:, 6:] == evaluated.positions[:, 5:6]).all()  # padded alike
    evaluated = evaluated.positions[:, :6].double().mean(0)
    rng = np.random.default_rng(0)
    reference = np.mean(
        [reference_sorted_subset(rng, np.arange(n_positions), 6) for _ in range(rows)], 0
    )
    np.testing.assert_allclose(trained.numpy(), reference, atol=1.0)
    np.testing.assert_allclose(evaluated.numpy(), reference, atol=1.0)


def test_validation_draws_each_task_example_for_its_own_length_as_evaluation_keys_it(monkeypatch):
    cfg = compose_config([*TINY_REVERSE_STRING, "train.random_positions=64"])
    model = build_model(cfg.model, cfg.encoding)
    task = load_data(cfg.data)
    used = []
    forward = Transformer.forward

    def recording(self, tokens, positions=None, targets=None, *args, **kwargs):
        used.append((positions, targets))
        return forward(self, tokens, positions, targets, *args, **kwargs)

    monkeypatch.setattr(Transformer, "forward", recording)
    positions = eval_positions(cfg)
    validation_loss(model, task, cfg.train, positions=positions)
    [(drawn, targets)] = used  # 8 examples, one batch
    lengths = row_lengths(targets)
    assert lengths.min() < lengths.max() == targets.shape[1]  # rows of several lengths
    expected = positions.of_windows(targets.shape[1], range(len(targets)), lengths).positions
    assert torch.equal(drawn, expected)
    for layer in drawn:  # each row's own subset, its padding at its last position
        assert (
            (layer == layer.gather(-1, (lengths - 1)[:, None]).expand_as(layer))
            .sum(1)
            .ge(targets.shape[1] - lengths + 1)
            .all()
        )


def test_diagnose_of_a_random_positions_run_attends_at_the_draws_evaluation_makes(
    straight_random, monkeypatch
):
    run_dir, _ = straight_random
    seen = []
    inputs = diagnose_module.attention_inputs
    monkeypatch.setattr(
        diagnose_module,
        "attention_inputs",
        lambda model, tokens, at: seen.append(at) or inputs(model, tokens, at),
    )
    monkeypatch.setattr(diagnose_module, "write_diagnostics", lambda run_dir, result: [])
    result, _ = diagnose_run(run_dir, 16, n_windows=2)
    assert (result["positions"], result["random_positions"]) == ("random", 64)
    cfg = load_run_config(run_dir)
    corpus = load_data(cfg.data)
    starts = diagnose_module.window_starts(len(corpus.val), 16, 2, corpus.val_documents)
    expected = eval_positions(cfg).of_windows(16, starts).positions  # (n_layer, 2, 16)
    assert len(seen) == 2
    for window, at in enumerate(seen):
        assert torch.equal(at.positions, expected[:, window : window + 1])
        assert not torch.equal(at.positions[..., -1], torch.full_like(at.positions[..., -1], 15))


@pytest.mark.parametrize("name", ["t5", "kerple"])
def test_a_learned_bias_gets_its_gradient_at_the_drawn_distances(name):
    """Training T5's or KERPLE's table at randomized distances (explicit attention, a row of
    distances per sequence): the gradients of the written-out computation."""
    torch.manual_seed(0)
    B, H, T = 2, 2, 40
    encoding = build_encoding({"name": name}, 16 * H, H).double()
    sampler = PositionSampler(256, 1, per_layer=False, mode="distances")
    distances = sampler.draw(torch.tensor([T, 25]), T, torch.Generator().manual_seed(1)).distances
    q, k, v = (torch.randn(B, H, T, 16, dtype=torch.float64) for _ in range(3))
    out_grad = torch.randn(B, H, T, 16, dtype=torch.float64)
    biases = QueryBlockBiases(encoding, distances=distances)
    ours = causal_attention(q, k, v, torch.arange(T), encoding, biases=biases)
    got = torch.autograd.grad(ours, list(encoding.parameters()), out_grad)
    apart = (torch.arange(T)[:, None] - torch.arange(T)[None, :]).clamp(min=0)  # (T, T)
    at = distances[:, apart]  # (B, T, T): each pair's drawn distance
    bias = encoding.relative_bias(at.flatten()).view(H, B, T, T).transpose(0, 1)
    scores = q @ k.transpose(-1, -2) / 4 + bias + torch.full((T, T), -math.inf).triu(1)
    plain = torch.softmax(scores, dim=-1) @ v
    expected = torch.autograd.grad(plain, list(encoding.parameters()), out_grad)
    torch.testing.assert_close(ours, plain.detach(), rtol=0, atol=1e-12)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
