"""The evaluation protocol: which tokens are scored, with how much context, and the maths."""

import math
from itertools import pairwise

import numpy as np
import pytest
import torch
from conftest import chunked_calls, terabyte_split

import posbench.model.loss
from posbench.config import compose_config
from posbench.data import IGNORE, load_data
from posbench.data.baselines import prefix_rule_accuracy
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import (
    MAX_POSITION_BUCKETS,
    count_windows,
    document_bounds,
    document_windows,
    evaluate,
    evaluate_length,
    position_buckets,
    windows,
)
from posbench.evaluation.run import evaluate_data, rope_scaling_overrides
from posbench.evaluation.task_accuracy import answer_scores, evaluate_task_length, task_predictions
from posbench.model import Transformer
from posbench.model.args import ModelArgs


def uniform_model(encoding: str = "none", **encoding_options) -> Transformer:
    """A model whose logits are all zero: it predicts every byte with probability 1/256."""
    args = ModelArgs(n_layer=1, n_head=2, d_model=8)
    model = Transformer(args, build_encoding({"name": encoding, **encoding_options}, 8, 2))
    torch.nn.init.zeros_(model.token_embedding.weight)  # tied: also zeroes the output layer
    return model


def random_rope_model(**options) -> Transformer:
    torch.manual_seed(0)
    return Transformer(
        ModelArgs(n_layer=1, n_head=2, d_model=16),
        build_encoding({"name": "rope", **options}, 16, 2),
    )


def scored_positions(n_tokens: int, length: int, stride: int | None) -> list[tuple[int, int]]:
    """(target index, context size) of every scored token."""
    return [
        (start + i + 1, i)
        for start, first in windows(n_tokens, length, stride)
        for i in range(first, length)
    ]


@pytest.mark.parametrize("stride", [None, 1, 3, 7, 8])
@pytest.mark.parametrize("n_tokens", [100, 9, 33, 46])
def test_every_target_is_scored_exactly_once(stride, n_tokens):
    targets = [t for t, _ in scored_positions(n_tokens, 8, stride)]
    assert sorted(targets) == list(range(1, n_tokens))
    assert len(targets) == len(set(targets))


def test_the_last_window_ends_at_the_last_target_and_scores_only_new_targets():
    # 40 targets, length 16: windows at 0 and 16 score 1..32; the last starts at 24 and
    # scores targets 33..40, its inputs 8..15
    assert list(windows(41, 16, None)) == [(0, 0), (16, 0), (24, 8)]


@pytest.mark.parametrize("stride", [None, 1, 3, 7, 8])
@pytest.mark.parametrize("n_tokens", [5, 8, 9, 10, 33, 46, 100])
def test_count_windows_counts_windows_without_listing_them(stride, n_tokens):
    assert count_windows(n_tokens, 8, stride) == len(list(windows(n_tokens, 8, stride)))


def test_evaluation_reads_only_the_windows_it_scores_of_a_split_larger_than_memory():
    records = evaluate(uniform_model(), terabyte_split(), [16, 64], max_tokens=1000)
    assert [(r["status"], r["tokens"]) for r in records] == [("ok", 1000), ("ok", 1000)]
    assert records[0]["ppl"] == pytest.approx(256)


def test_documents_of_a_split_larger_than_memory_are_read_window_by_window():
    # 1,001 tokens kept: documents of 300 and 701 tokens (the second one's head)
    documents = np.array([0, 300, 1 << 39])
    records = evaluate(
        uniform_model(), terabyte_split(), [16, 512], max_tokens=1000, documents=documents
    )
    assert [(r["documents"], r["tokens"]) for r in records] == [(2, 299 + 700), (1, 700)]
    assert records[0]["ppl"] == pytest.approx(256)


def test_non_overlapping_windows_tile_the_tokens():
    assert [s for s, _ in windows(33, 8, None)] == [0, 8, 16, 24]
    assert [t for t, _ in scored_positions(33, 8, None)] == list(range(1, 33))


@pytest.mark.parametrize("stride", [1, 3, 8])
def test_sliding_windows_give_each_later_token_length_minus_stride_context(stride):
    length = 8
    for target, context in scored_positions(200, length, stride):
        if target > length:  # past the first window
            assert context >= length - stride


def test_uniform_model_has_perplexity_256_and_8_bits_per_byte():
    tokens = torch.randint(0, 256, (1000,), dtype=torch.uint8)
    record = evaluate_length(uniform_model(), tokens, length=32)
    assert record["ppl"] == pytest.approx(256.0)
    assert record["bits_per_byte"] == pytest.approx(8.0)
    assert record["tokens"] == 999
    assert record["status"] == "ok" and record["reason"] is None


def test_word_perplexity_of_a_text_with_few_words_is_infinite_not_an_overflow():
    """199 bytes at ln 256 each over one word: exp(1103) overflows a float."""
    tokens = torch.tensor(list(b" " + b"a" * 199), dtype=torch.uint8)
    record = evaluate_length(uniform_model(), tokens, length=199)
    assert (record["words"], record["word_ppl"]) == (1, math.inf)
    assert record["ppl"] == pytest.approx(256.0)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "logits"])
def test_perplexity_is_exp_of_mean_nll_against_a_direct_computation(chunked, monkeypatch):
    # Both ways of the model's NLL: a chunk of logits at a time (a CPU's, for large logits:
    # here for all) and the logits whole (CUDA's).
    calls = chunked_calls(monkeypatch)
    if not chunked:
        monkeypatch.setattr(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
    model = random_rope_model()
    tokens = torch.randint(0, 256, (65,), dtype=torch.uint8)
    record = evaluate_length(model, tokens, length=16)
    assert len(calls) == chunked  # one batch of four windows
    rows = tokens[:65].long().view(1, -1)
    with torch.no_grad():
        nll = [
            torch.nn.functional.cross_entropy(
                model(rows[:, s : s + 16])[0], rows[0, s + 1 : s + 17], reduction="sum"
            )
            for s in range(0, 64, 16)
        ]
    assert record["ppl"] == pytest.approx(math.exp(float(sum(nll)) / 64), rel=1e-5)


def test_stride_equal_to_length_matches_non_overlapping_windows():
    model = random_rope_model()
    tokens = torch.randint(0, 256, (300,), dtype=torch.uint8)
    plain = evaluate_length(model, tokens, length=16)
    strided = evaluate_length(model, tokens, length=16, stride=16)
    assert strided["ppl"] == pytest.approx(plain["ppl"], rel=1e-6)
    assert strided["tokens"] == plain["tokens"]


def test_batch_size_does_not_change_the_result():
    model = random_rope_model()
    tokens = torch.randint(0, 256, (500,), dtype=torch.uint8)
    one = evaluate_length(model, tokens, length=16, stride=4, batch_size=1)
    many = evaluate_length(model, tokens, length=16, stride=4, batch_size=7)
    assert many["ppl"] == pytest.approx(one["ppl"], rel=1e-6)


def test_lengths_past_a_learned_table_are_unsupported_not_clamped():
    model = uniform_model("learned", max_length=16)
    tokens = torch.randint(0, 256, (200,), dtype=torch.uint8)
    ok, beyond = evaluate(model, tokens, [16, 32])
    assert ok["status"] == "ok"
    assert beyond["status"] == "unsupported" and beyond["ppl"] is None
    assert "encoding.max_length>=32" in beyond["reason"]


def test_length_longer_than_the_split_is_unsupported_with_the_reason():
    (record,) = evaluate(uniform_model(), torch.zeros(50, dtype=torch.uint8), [64])
    assert record["status"] == "unsupported"
    assert "needs at least 65" in record["reason"]


@pytest.mark.parametrize("stride", [None, 16])
def test_max_tokens_makes_every_length_score_the_same_tokens(stride):
    # 1000 is divided by none of 48, 128, 300 (before, 128 scored 896 tokens)
    tokens = torch.randint(0, 256, (5000,), dtype=torch.uint8)
    records = evaluate(uniform_model(), tokens, [16, 48, 128, 300], stride, max_tokens=1000)
    assert [r["tokens"] for r in records] == [1000] * 4


# Documents --------------------------------------------------------------------------------------

# Documents of 20, 9, 31 and 40 tokens in a split of 100.
DOCUMENTS = torch.tensor([0, 20, 29, 60])


@pytest.mark.parametrize("stride", [None, 1, 3, 8])
@pytest.mark.parametrize("length", [4, 8, 19, 20, 39])
def test_document_windows_stay_inside_a_document_and_score_each_of_its_targets_once(length, stride):
    bounds = document_bounds(100, DOCUMENTS)
    assert bounds == [(0, 20), (20, 29), (29, 60), (60, 100)]
    scored = []
    for start, first in document_windows(bounds, length, stride):
        end = next(e for b, e in bounds if b <= start < e)
        assert start + length < end  # the last target, start + length, is in the document
        scored += range(start + first + 1, start + length + 1)
    long_enough = [(b, e) for b, e in bounds if e - b >= length + 1]
    assert sorted(scored) == [t for b, e in long_enough for t in range(b + 1, e)]


@pytest.mark.parametrize(
    ("length", "documents", "tokens"),
    [(8, 4, 96), (19, 3, 19 + 30 + 39), (20, 2, 30 + 39), (39, 1, 39)],
)
def test_documents_shorter_than_length_plus_one_are_skipped(length, documents, tokens):
    generator = torch.Generator().manual_seed(0)
    split = torch.randint(0, 256, (100,), dtype=torch.uint8, generator=generator)
    record = evaluate_length(uniform_model(), split, length, documents=DOCUMENTS)
    assert (record["documents"], record["tokens"]) == (documents, tokens)
    assert record["ppl"] == pytest.approx(256.0)


def test_a_length_no_document_can_hold_is_unsupported_with_the_longest_document():
    split = torch.zeros(100, dtype=torch.uint8)
    record = evaluate_length(uniform_model(), split, 40, documents=DOCUMENTS)
    assert record["status"] == "unsupported" and record["documents"] == 0
    assert (
        record["reason"]
        == "the longest validation document has 40 tokens; length 40 needs at least 41"
    )


def test_a_stream_scores_as_one_document_and_its_records_say_null_documents():
    model = random_rope_model()
    tokens = torch.randint(0, 256, (300,), dtype=torch.uint8)
    stream = evaluate_length(model, tokens, 16)
    one = evaluate_length(model, tokens, 16, documents=torch.tensor([0]))
    assert stream["documents"] is None and one["documents"] == 1
    assert (stream["ppl"], stream["tokens"]) == (one["ppl"], one["tokens"])


def test_max_tokens_cuts_the_document_it_falls_in():
    tokens = torch.randint(0, 256, (200,), dtype=torch.uint8)
    documents = torch.tensor([0, 50, 120])
    # 101 tokens kept: documents of 50 and 51 tokens, the second one's head
    short, long = evaluate(uniform_model(), tokens, [8, 50], max_tokens=100, documents=documents)
    assert (short["documents"], short["tokens"]) == (2, 49 + 50)
    assert (long["documents"], long["tokens"]) == (1, 50)


ALPHABETS = [b"abcdefgh", b"ABCDEFGH", b"01234567"]


class AlphabetModel(Transformer):
    """After a byte of one of ALPHABETS, a uniform guess among that alphabet's bytes (and
    almost nothing on any other byte): perplexity 8 exactly when every target is in the same
    alphabet as the input before it, i.e. when no window crosses from one file to the next."""

    def __init__(self) -> None:
        super().__init__(
            ModelArgs(n_layer=1, n_head=2, d_model=8), build_encoding({"name": "none"}, 8, 2)
        )
        self.alphabet_of = torch.full((256,), -1)
        for i, alphabet in enumerate(ALPHABETS):
            self.alphabet_of[list(alphabet)] = i

    def forward(self, tokens, positions=None, targets=None, reduction="sum", distances=None):
        same = self.alphabet_of[tokens][..., None] == self.alphabet_of  # (B, T, 256)
        logits = torch.zeros(same.shape).masked_fill(~same, -30.0)
        if targets is None:
            return logits
        return torch.nn.functional.cross_entropy(
            logits.transpose(1, 2), targets, reduction=reduction
        )


def test_a_text_directory_is_scored_file_by_file(tmp_path):
    generator = torch.Generator().manual_seed(0)
    sizes = {"a.txt": 1500, "b.txt": 300, "c.txt": 700}  # 300 < 512 + 1 < 700
    for (name, size), alphabet in zip(sizes.items(), ALPHABETS, strict=True):
        symbols = torch.randint(0, 8, (size,), generator=generator)
        (tmp_path / "val").mkdir(exist_ok=True)
        (tmp_path / "val" / name).write_bytes(bytes(alphabet[i] for i in symbols.tolist()))
    (tmp_path / "train.txt").write_bytes(b"train " * 300)
    data = load_data(
        {
            "source": "text",
            "path": str(tmp_path / "train.txt"),
            "val_path": str(tmp_path / "val"),
            "cache_dir": str(tmp_path / "cache"),
        }
    )
    records = evaluate_data(AlphabetModel(), data, [128, 512, 1024, 2048], stride=None)
    assert [r["documents"] for r in records] == [3, 2, 1, 0]
    assert [r["tokens"] for r in records] == [1499 + 299 + 699, 1499 + 699, 1499, 0]
    assert [r["ppl"] for r in records[:3]] == [pytest.approx(8.0)] * 3
    assert "the longest validation document has 1500 tokens" in records[3]["reason"]
    (sliding,) = evaluate_data(AlphabetModel(), data, [512], stride=100)
    assert (sliding["documents"], sliding["tokens"]) == (2, 1499 + 699)
    assert sliding["ppl"] == pytest.approx(8.0)


def test_records_name_the_scaling_method_and_the_factor_used_at_each_length():
    tokens = torch.randint(0, 256, (500,), dtype=torch.uint8)
    plain = evaluate(random_rope_model(), tokens, [16, 64])
    yarn = random_rope_model(scaling={"method": "yarn", "original_length": 16})
    scaled = evaluate(yarn, tokens, [16, 64])
    assert [(r["scaling"], r["scaling_factor"]) for r in plain] == [("none", None)] * 2
    assert [(r["scaling"], r["scaling_factor"]) for r in scaled] == [("yarn", 1.0), ("yarn", 4.0)]
    # the same weights: identical at the training length (s = 1), different beyond it
    assert scaled[0]["ppl"] == pytest.approx(plain[0]["ppl"], rel=1e-12)
    assert scaled[1]["ppl"] != plain[1]["ppl"]


def test_unsupported_records_also_name_their_scaling():
    (record,) = evaluate(uniform_model("learned", max_length=16), torch.zeros(99), [32])
    assert (record["status"], record["scaling"]) == ("unsupported", "none")


def test_rope_scaling_overrides_take_the_original_length_from_the_run_not_the_eval_length():
    cfg = compose_config(["train.seq_len=48"])
    overrides = rope_scaling_overrides(cfg, "yarn", 8.0)
    assert overrides == {"scaling": {"method": "yarn", "factor": 8.0, "original_length": 48}}


def test_rope_scaling_overrides_refuse_a_run_without_rope_in_one_line():
    with pytest.raises(PosbenchError, match="encoding=rope") as info:
        rope_scaling_overrides(compose_config(["encoding=sinusoidal"]), "yarn")
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- loss by position


def test_position_buckets_are_linear_inside_the_training_length_and_per_quarter_octave_beyond():
    edges = [start for start, _ in position_buckets(512, 128)] + [512]
    assert edges == [0, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448, 512]


@pytest.mark.parametrize(
    ("length", "train_seq_len"),
    [(1, 1), (7, 16), (16, 16), (100, 16), (2048, 128), (16384, 128), (3000, 5), (10**6, 1)],
)
def test_position_buckets_tile_the_window_with_the_training_length_as_a_boundary(
    length, train_seq_len
):
    buckets = position_buckets(length, train_seq_len)
    assert buckets[0][0] == 0 and buckets[-1][1] == length
    assert all(start < end for start, end in buckets)
    assert all(a[1] == b[0] for a, b in pairwise(buckets))
    assert len(buckets) <= MAX_POSITION_BUCKETS
    if train_seq_len < length:
        assert train_seq_len in {start for start, _ in buckets}


def test_loss_by_position_is_the_mean_nll_of_each_bucket_over_all_windows():
    model = random_rope_model()
    tokens = torch.randint(0, 256, (3 * 64 + 1,), dtype=torch.uint8)
    record = evaluate_length(model, tokens, length=64, train_seq_len=16)
    rows = tokens.long().view(1, -1)
    with torch.no_grad():  # (windows, 64): each token's NLL, computed directly
        nll = torch.stack(
            [
                torch.nn.functional.cross_entropy(
                    model(rows[:, s : s + 64])[0], rows[0, s + 1 : s + 65], reduction="none"
                )
                for s in range(0, 192, 64)
            ]
        ).double()
    buckets = record["loss_by_position"]
    assert [(b["start"], b["end"]) for b in buckets] == position_buckets(64, 16)
    for b in buckets:
        assert b["tokens"] == 3 * (b["end"] - b["start"])
        assert b["nll"] == pytest.approx(nll[:, b["start"] : b["end"]].mean().item(), rel=1e-5)
    # token-weighted, the buckets give back the record's perplexity
    mean = sum(b["nll"] * b["tokens"] for b in buckets) / record["tokens"]
    assert math.exp(mean) == pytest.approx(record["ppl"], rel=1e-9)


def test_sliding_window_records_have_no_loss_by_position():
    tokens = torch.randint(0, 256, (300,), dtype=torch.uint8)
    plain, strided = (
        evaluate_length(random_rope_model(), tokens, length=32, stride=s, train_seq_len=16)
        for s in (None, 8)
    )
    assert "loss_by_position" in plain and "loss_by_position" not in strided


def test_loss_by_position_counts_only_the_scored_tail_of_a_last_partial_window():
    model = random_rope_model()
    tokens = torch.randint(0, 256, (3 * 64 + 20 + 1,), dtype=torch.uint8)  # 20 targets left over
    record = evaluate_length(model, tokens, length=64, train_seq_len=16)
    buckets = record["loss_by_position"]
    # three whole windows, then one that ends at the last target and scores positions 44..63
    for b in buckets:
        tail = max(0, b["end"] - max(b["start"], 44))
        assert b["tokens"] == 3 * (b["end"] - b["start"]) + tail
    assert sum(b["tokens"] for b in buckets) == record["tokens"] == 3 * 64 + 20
    mean = sum(b["nll"] * b["tokens"] for b in buckets) / record["tokens"]
    assert math.exp(mean) == pytest.approx(record["ppl"], rel=1e-9)


# Task scoring --------------------------------------------------------------------------------


def test_answer_scores_count_bytes_whole_answers_and_each_depth():
    teacher_forced, decoded = torch.tensor([5, 4, 4, 5]), torch.tensor([5, 3, 0, 5])
    answer_bytes = torch.tensor([5, 5, 5, 5])
    depths = torch.tensor([0, 25, 0, 25])
    scores = answer_scores(decoded, teacher_forced, answer_bytes, depth_percent=depths)
    assert scores["accuracy"] == 13 / 20 and scores["sequence_accuracy"] == 2 / 4
    assert scores["teacher_forced_accuracy"] == 18 / 20
    assert scores["accuracy_by_depth"] == [
        {
            "depth_percent": 0,
            "accuracy": 5 / 10,
            "sequence_accuracy": 1 / 2,
            "teacher_forced_accuracy": 9 / 10,
            "examples": 2,
        },
        {
            "depth_percent": 25,
            "accuracy": 8 / 10,
            "sequence_accuracy": 1 / 2,
            "teacher_forced_accuracy": 9 / 10,
            "examples": 2,
        },
    ]


def test_answers_of_different_lengths_weigh_by_their_bytes():
    scores = answer_scores(None, torch.tensor([1, 9]), torch.tensor([2, 10]))
    assert scores == {
        "accuracy": None,
        "sequence_accuracy": 0.0,
        "teacher_forced_accuracy": 10 / 12,
    }


class Teacher(torch.nn.Module):
    """Logits that put all the mass on the true target of each input of each example (looked up
    by its inputs; byte 0 where nothing is trained), except where ``wrong`` says: (example,
    target index) predicted as byte 0."""

    def __init__(self, examples, wrong=()):
        super().__init__()
        rows = [bytes(x.tolist()) for x in examples.input_bytes]
        self.targets = dict(zip(rows, examples.targets().clamp(min=0), strict=True))
        self.wrong = {rows[i]: t for i, t in wrong}

    def forward(self, inputs, positions=None, distances=None, lengths=None):  # as Transformer
        logits = torch.zeros(*inputs.shape, 256)  # (B, T, vocab)
        for row, x in enumerate(inputs):
            targets = self.targets[bytes(x.tolist())].clone()  # (T,)
            if bytes(x.tolist()) in self.wrong:
                targets[self.wrong[bytes(x.tolist())]] = 0
            logits[row, torch.arange(len(targets)), targets] = 30.0
        return logits


def test_a_model_that_predicts_every_answer_byte_scores_one():
    examples = load_data({"source": "recall", "val_examples": 6}).examples(48)
    cpu = torch.device("cpu")
    nll, correct, decoded = task_predictions(Teacher(examples), examples, 4, cpu)
    assert decoded is None  # not asked to decode
    assert torch.equal(correct, examples.answer.sum(1)) and nll < 1e-9


def test_one_wrong_answer_byte_costs_one_byte_and_one_whole_answer():
    examples = load_data({"source": "copy", "val_examples": 3}).examples(16)
    last = examples.answer.shape[1] - 1  # the last answer byte of example 1
    teacher = Teacher(examples, [(1, last)])
    _, correct, _ = task_predictions(teacher, examples, 2, torch.device("cpu"))
    scores = answer_scores(None, correct, examples.answer.sum(1))
    assert scores["teacher_forced_accuracy"] == 23 / 24 and scores["sequence_accuracy"] == 2 / 3


def test_placeholders_score_the_answer_up_to_its_terminator_not_the_padding_after_it():
    """binary_addition's blanks after a sum's terminator are trained on zeros that a model may
    get wrong without losing accuracy (the reference's accuracy_mask)."""
    examples = load_data({"source": "binary_addition", "val_examples": 4}).examples(8)
    padded = (examples.targets() != IGNORE) & ~examples.answer  # (N, T): trained, unscored
    row = int(padded.any(1).nonzero()[0])
    last = int(padded[row].nonzero()[-1])
    teacher = Teacher(examples, [(row, last)])
    nll, correct, _ = task_predictions(teacher, examples, 2, torch.device("cpu"))
    assert torch.equal(correct, examples.answer.sum(1)) and nll < 1e-9


@pytest.mark.parametrize(
    ("source", "mode"),
    [("parity_check", "placeholders"), ("bucket_sort", "autoregressive"), ("copy", None)],
)
def test_task_records_say_their_answer_mode_beside_the_prompt_blind_baselines(source, mode):
    task = load_data(
        {"source": source, "val_examples": 8, **({"answer_mode": mode} if mode else {})}
    )
    length = 16
    record = evaluate_task_length(uniform_model(), task, length)
    examples = task.examples(length)
    answers = (examples.targets(), examples.answer)
    assert record["answer_mode"] == (mode or "autoregressive")
    assert record["chance_accuracy"] == task.chance_accuracy()
    assert record["constant_answer_accuracy"] == task.constant_answer_accuracy([length])
    if mode == "placeholders":
        assert "prefix_rule_accuracy" not in record  # nothing is teacher-forced to bound
    else:
        assert record["prefix_rule_accuracy"] == prefix_rule_accuracy(*answers, length)
    unscorable = evaluate_task_length(uniform_model(), task, 0)  # shorter than any problem
    assert (
        unscorable["status"] == "unsupported" and unscorable["answer_mode"] == record["answer_mode"]
    )
    assert unscorable["constant_answer_accuracy"] is None


def test_a_uniform_model_scores_its_argmax_byte_and_perplexity_256_on_the_answers():
    task = load_data({"source": "passkey", "val_examples": 10})
    record = evaluate_task_length(uniform_model(), task, 128)
    assert record["ppl"] == pytest.approx(256.0, rel=1e-5) and record["tokens"] == 50
    assert record["accuracy"] == 0.0  # its argmax is byte 0, never a digit
    assert [d["depth_percent"] for d in record["accuracy_by_depth"]] == [0, 25, 50, 75, 100]


def test_task_lengths_too_short_or_beyond_the_encoding_are_unsupported():
    task = load_data({"source": "passkey"})
    record = evaluate_task_length(uniform_model(), task, 64)
    assert record["status"] == "unsupported" and "at least 102 tokens" in record["reason"]
    learned = uniform_model("learned", max_length=128)
    record = evaluate_task_length(learned, task, 256)
    assert record["status"] == "unsupported" and record["accuracy"] is None


def test_word_perplexity_is_recorded_only_for_data_that_has_words(tmp_path, cache_dir):
    """The synthetic corpus's bytes come from a Markov chain: its whitespace bytes delimit no
    words, and a word perplexity of it (2.4e32) would mean nothing."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the quick brown fox jumps over the lazy dog. " * 500)
    synthetic = {"source": "synthetic", "train_tokens": 40000, "val_tokens": 8192}
    text = {"source": "text", "path": str(corpus)}
    records = {
        config["source"]: evaluate_data(
            uniform_model(), load_data({**config, "cache_dir": str(cache_dir)}), [64]
        )[0]
        for config in (synthetic, text)
    }
    assert records["synthetic"]["word_ppl"] is None and records["synthetic"]["words"] is None
    assert records["text"]["words"] > 0
    assert records["text"]["word_ppl"] == pytest.approx(
        256 ** (records["text"]["bytes"] / records["text"]["words"])
    )
