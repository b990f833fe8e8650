"""posbench.data: the synthetic process, local text and hub loading, the cache, batches."""

import hashlib
import json
import logging
import math
import re
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import command_pid, forked_posbench, terabyte_split

from posbench import data
from posbench.data import (
    ALPHABET,
    SEPARATOR,
    CopyMarkovProcess,
    DocumentMarkovProcess,
    SpanMarkovProcess,
    hub,
    load_corpus,
    sample_batch,
    text,
)
from posbench.data.cache import ArrayWriter, build_entry, read_entry, verify_entry
from posbench.data.corpus import CHUNK_BYTES, SplitWriter
from posbench.data.synthetic import LONG_RANGE
from posbench.errors import PosbenchError

TEXT = "first line\nzweite Zeile: größer, ŝ, 数据\n\n  indented\tand tabbed\nno final newline"


@pytest.fixture
def synthetic(tmp_path):
    """A small synthetic config with its own cache."""
    return {
        "source": "synthetic",
        "train_tokens": 20_000,
        "val_tokens": 5_000,
        "cache_dir": str(tmp_path / "cache"),
    }


@pytest.fixture
def process():
    return CopyMarkovProcess.random(
        vocab_size=16, successors=3, copy_prob=0.4, lags=[4, 9, 20], rng=np.random.default_rng(0)
    )


def span_process(**overrides) -> SpanMarkovProcess:
    """A small ``long_range=spans`` process: spans of mean 6 from 3 to 20 symbols back."""
    params = {"repeat_prob": 0.1, "repeat_length": 6.0, "distances": [3, 20], **overrides}
    return SpanMarkovProcess.random(
        vocab_size=16, successors=3, rng=np.random.default_rng(0), **params
    )


@pytest.fixture
def spans():
    return span_process()


@pytest.fixture
def documents():
    """A small ``long_range=documents`` process: 4 groups of 4 symbols, documents of ~60."""
    return DocumentMarkovProcess.random(
        vocab_size=16,
        successors=2,
        group_size=4,
        concentration=0.3,
        document_length=60.0,
        rng=np.random.default_rng(0),
    )


@pytest.fixture(params=["process", "spans", "documents"], ids=["lags", "spans", "documents"])
def any_process(request):
    """Each synthetic process in turn (lags, spans, documents): what all of them must do."""
    return request.getfixturevalue(request.param)


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """datasets in offline mode, with its own cache under tmp_path."""
    import datasets
    import huggingface_hub

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # Both libraries read those variables once, at import, which may have happened already.
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf"))
    return datasets


@pytest.fixture
def small_chunks(monkeypatch):
    """Builds stream in 64-byte chunks, so small corpora cross many chunk boundaries."""
    for module in ("corpus", "cache", "text", "hub"):
        monkeypatch.setattr(f"posbench.data.{module}.CHUNK_BYTES", 64)


def text_config(tmp_path, path, **overrides):
    return {"source": "text", "path": str(path), "cache_dir": str(tmp_path / "cache"), **overrides}


def as_bytes(tokens: np.ndarray) -> bytes:
    return tokens.tobytes()


def write(path, text: str):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode())
    return path


def one_line_error(call) -> str:
    with pytest.raises(PosbenchError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    return message


# The synthetic process --------------------------------------------------------------------------


def test_synthetic_corpus_is_deterministic_from_the_seed(synthetic, tmp_path):
    first = load_corpus(synthetic)
    again = load_corpus({**synthetic, "cache_dir": str(tmp_path / "other")})
    reseeded = load_corpus({**synthetic, "seed": 1})
    assert np.array_equal(first.train, again.train) and np.array_equal(first.val, again.val)
    assert first.stats == again.stats
    assert not np.array_equal(first.train, reseeded.train)


def test_synthetic_long_range_chooses_the_process_and_its_own_cache_entry(synthetic, tmp_path):
    """data.long_range=lags is the exact-lag process, whose copies sit at the lags (16, 48, 96)
    and nowhere else; each choice is its own corpus, built into its own cache entry."""
    corpora = {kind: load_corpus({**synthetic, "long_range": kind}) for kind in LONG_RANGE}
    assert len(list((tmp_path / "cache").iterdir())) == len(LONG_RANGE)
    symbols = np.frombuffer(as_bytes(corpora["lags"].val), dtype=np.uint8)
    rate = {d: np.mean(symbols[d:] == symbols[:-d]) for d in (15, 16, 17, 47, 48, 49, 96)}
    assert min(rate[16], rate[48], rate[96]) > max(rate[15], rate[17], rate[47], rate[49]) + 0.1
    vals = [as_bytes(corpus.val) for corpus in corpora.values()]
    assert len(set(vals)) == len(vals)


def test_synthetic_val_is_not_a_window_of_train(synthetic):
    corpus = load_corpus(synthetic)
    train, val = as_bytes(corpus.train), as_bytes(corpus.val)
    assert train[:64] not in val and val[:64] not in train and val[-64:] not in train


@pytest.mark.parametrize("long_range", LONG_RANGE)
def test_synthetic_bytes_are_the_first_vocab_size_printable_characters(synthetic, long_range):
    """And a newline, which ends each document of long_range=documents."""
    corpus = load_corpus({**synthetic, "vocab_size": 20, "long_range": long_range})
    separators = set(SEPARATOR) if long_range == "documents" else set()
    assert set(as_bytes(corpus.train)) == set(ALPHABET[:20]) | separators
    assert as_bytes(corpus.val).decode("ascii").replace("\n", "").isprintable()


def test_synthetic_corpus_has_both_splits_and_json_float_stats(synthetic):
    corpus = load_corpus(synthetic)
    assert corpus.train.dtype == corpus.val.dtype == np.uint8
    assert (len(corpus.train), len(corpus.val)) == (20_000, 5_000)
    assert set(corpus.stats) == {"unigram_bits_per_byte", "entropy_floor_bits_per_byte"}
    assert all(type(v) is float for v in corpus.stats.values())
    assert json.loads(json.dumps(corpus.stats)) == corpus.stats


def test_byte_histogram_is_the_same_in_both_halves_of_a_stream(any_process):
    """Over enough of it: a document's taste makes its own histogram, so a stream of
    documents settles only over thousands of them."""
    process = any_process
    stream = process.sample(1_000_000, np.random.default_rng(1))[process.burn_in :]
    first, second = np.array_split(stream, 2)
    p, q = (np.bincount(half, minlength=16) / len(half) for half in (first, second))
    assert 0.5 * np.abs(p - q).sum() < 0.02  # total variation distance


def test_ideal_loss_does_not_depend_on_position_in_the_stream(any_process):
    process, rng = any_process, np.random.default_rng(2)
    bits = np.stack([process.bits(process.sample(80, rng)) for _ in range(1000)])  # (streams, t)
    by_quarter = bits.reshape(1000, 4, 20).mean(axis=(0, 2))
    long_run = process.bits(process.sample(100_000, rng)).mean()
    assert np.allclose(by_quarter, long_run, atol=0.05)


def test_match_rate_at_each_distance_is_copy_prob_over_lags_plus_chance(process):
    """At a lag e, x_t equals x_{t-e} when copied from it (probability c / len(lags)) or by
    chance: drawn by the chain or copied from another lag, which P(x_t | past) gives exactly."""
    stream = process.sample(200_000, np.random.default_rng(3))
    t0, n, c, lags = process.burn_in, len(stream), process.copy_prob, process.lags
    for e in (*lags, 5, 11):
        target = stream[t0 - e : n - e]
        markov = process.transition[stream[t0 - 1 : n - 1], target]
        others = sum(stream[t0 - d : n - d] == target for d in lags if d != e)
        chance = np.mean((1 - c) * markov + c / len(lags) * others)
        copied = c / len(lags) if e in lags else 0.0
        assert np.mean(stream[t0:] == target) == pytest.approx(copied + chance, abs=0.006)


def test_entropy_floor_matches_a_brute_force_reference(process):
    stream = process.sample(300, np.random.default_rng(4)).tolist()
    reference = []
    for t in range(process.burn_in, len(stream)):
        p = (1 - process.copy_prob) * process.transition[stream[t - 1], stream[t]]
        for d in process.lags:
            if stream[t - d] == stream[t]:
                p += process.copy_prob / len(process.lags)
        reference.append(-math.log2(p))
    assert process.bits(np.asarray(stream)) == pytest.approx(reference, rel=1e-12)


def markov_entropy_rate(transition: np.ndarray) -> float:
    """The entropy rate of a Markov chain, in bits: its stationary law's mean row entropy."""
    eigenvalues, eigenvectors = np.linalg.eig(transition.T)
    stationary = np.real(eigenvectors[:, np.argmax(np.real(eigenvalues))])
    stationary /= stationary.sum()
    logs = np.log2(np.where(transition > 0, transition, 1))
    return -(stationary[:, None] * transition * logs).sum()


@pytest.mark.parametrize(
    "process",
    [
        CopyMarkovProcess.random(12, 3, 0.0, [5], np.random.default_rng(5)),
        SpanMarkovProcess.random(12, 3, 0.0, 8.0, [2, 30], np.random.default_rng(5)),
    ],
    ids=["lags", "spans"],
)
def test_entropy_floor_without_repeats_is_the_markov_entropy_rate(process):
    floor = process.bits(process.sample(200_000, np.random.default_rng(6))).mean()
    assert floor == pytest.approx(markov_entropy_rate(process.transition), abs=0.02)


def hidden_state_forward(process: SpanMarkovProcess, stream: np.ndarray) -> np.ndarray:
    """The reference for ``SpanMarkovProcess.bits``: P(x_t = v | x_0..x_{t-1}) for every
    t >= 1 and symbol v, (n - 1, V), by the textbook normalised forward pass over an explicit
    (1 + D, 1 + D) transition matrix between the hidden states "outside a span" (0) and "inside
    a span from d" (1 + d - min), with no span starting before t = max."""
    low, high = process.distances
    distances = np.arange(low, high + 1)
    stay, start = 1 - 1 / process.repeat_length, process.repeat_prob
    ends = np.r_[1.0, np.full(len(distances), 1 - stay)]  # P(free at t | state at t - 1)
    transition = np.outer(ends, np.r_[1 - start, start * process.distance_probs])
    transition[1:, 1:] += stay * np.eye(len(distances))  # or the span goes on
    only_chain = np.r_[1.0, np.zeros(len(distances))]
    belief, predictions = only_chain, []
    for t in range(1, len(stream)):
        predicted = belief @ transition if t >= high else only_chain
        # emits[s, v]: P(x_t = v | state s): the chain's row, or the symbol d back
        emits = np.zeros((1 + len(distances), len(process.transition)))
        emits[0] = process.transition[stream[t - 1]]
        for i, d in enumerate(distances):
            if d <= t:
                emits[1 + i, stream[t - d]] = 1.0
        predictions.append(predicted @ emits)
        belief = predicted * emits[:, stream[t]] / predictions[-1][stream[t]]
    return np.asarray(predictions)


def test_span_floor_matches_a_forward_pass_over_an_explicit_transition_matrix(spans):
    stream = spans.sample(400, np.random.default_rng(4))
    predictions = hidden_state_forward(spans, stream)[spans.burn_in - 1 :]
    reference = -np.log2(predictions[np.arange(len(predictions)), stream[spans.burn_in :]])
    assert spans.bits(stream) == pytest.approx(reference, rel=1e-9)


def test_match_rate_at_each_distance_is_what_the_span_process_predicts(spans):
    """A Monte-Carlo check of the process's probabilities on its own samples: at a distance
    e, the frequency of x_t == x_{t-e} is the mean predicted P(x_t = x_{t-e} | past), inside
    [min, max] (copies), past it (chains of copies) and below it (the chain)."""
    stream = spans.sample(40_000, np.random.default_rng(3))
    t = np.arange(spans.burn_in, len(stream))
    predictions = hidden_state_forward(spans, stream)[t - 1]  # (kept, V)
    for e in (1, 2, 3, 7, 20, 23, 40):
        predicted = predictions[np.arange(len(t)), stream[t - e]].mean()
        assert np.mean(stream[t] == stream[t - e]) == pytest.approx(predicted, abs=0.008)


def test_span_process_predicts_a_distribution_over_the_alphabet(spans):
    """P(x_t = v | past) summed over every symbol v is 1: bits(prefix + [v])[-1] is its
    -log2, since x_t's loss depends only on x_0..x_t."""
    stream = spans.sample(300, np.random.default_rng(7))
    for t in range(spans.burn_in, len(stream), 37):
        prefixes = [np.r_[stream[:t], v] for v in range(len(spans.transition))]
        with np.errstate(divide="ignore", invalid="ignore"):  # symbols the past rules out
            probs = [2.0 ** -spans.bits(prefix)[-1] for prefix in prefixes]
        assert sum(probs) == pytest.approx(1, rel=1e-12)


@pytest.mark.parametrize(
    "wrong",
    [{"repeat_prob": 0.3}, {"repeat_prob": 0.03}, {"repeat_length": 2.0}, {"repeat_length": 18.0}],
)
def test_no_other_span_process_predicts_its_samples_better_than_the_one_that_drew_them(
    spans, wrong
):
    """A Monte-Carlo check that the floor is the process's own: the expected loss of any other
    predictor, here the same recursion with another parameter, is higher (by their KL)."""
    stream = spans.sample(40_000, np.random.default_rng(8))
    other = SpanMarkovProcess(
        spans.transition,
        wrong.get("repeat_prob", spans.repeat_prob),
        wrong.get("repeat_length", spans.repeat_length),
        spans.distances,
    )
    assert spans.bits(stream).mean() < other.bits(stream).mean() - 0.01


def order_one_bits(stream: np.ndarray) -> float:
    """The plug-in entropy of x_t given x_{t-1} in ``stream``, in bits: what a model that
    never looks farther back than one symbol can reach."""
    size = stream.max() + 1
    pairs = np.bincount(stream[:-1] * size + stream[1:], minlength=size * size)
    pairs = pairs.reshape(size, size)
    given = pairs / np.maximum(pairs.sum(axis=1, keepdims=True), 1)
    return -(pairs * np.log2(np.where(given > 0, given, 1))).sum() / pairs.sum()


def test_spans_make_the_floor_well_below_what_the_previous_symbol_gives(spans):
    stream = spans.sample(200_000, np.random.default_rng(9))
    assert spans.bits(stream).mean() < order_one_bits(stream[spans.burn_in - 1 :]) - 0.3


def counted_predictions(
    process: DocumentMarkovProcess, stream: np.ndarray, first: int, window_starts: np.ndarray
) -> np.ndarray:
    """The reference for ``DocumentMarkovProcess.bits``: P(x_t = v | what t sees) for every
    t >= ``first`` and symbol v (the separator last), (n - first, V + 1), counting afresh for
    each t the symbols it sees: those after the last separator before t and, when t's window
    starts later (``window_starts[t]``), from there."""
    k, beta, end = process.group_size, process.concentration, 1 / process.document_length
    vocab_size, predictions = process.separator, []
    for t in range(first, len(stream)):
        if stream[t - 1] == process.separator:
            predictions.append(np.r_[np.full(vocab_size, 1 / vocab_size), 0.0])
            continue
        since = np.flatnonzero(stream[:t] == process.separator)[-1] + 1
        seen = stream[max(since, window_starts[t]) : t]
        counts = np.bincount(seen, minlength=vocab_size).reshape(-1, k)  # (groups, k)
        taste = ((counts + beta) / (counts.sum(1, keepdims=True) + k * beta)).ravel()
        groups = process.transition[stream[t - 1] // k].repeat(k)  # (V,) P(group of v)
        predictions.append(np.r_[(1 - end) * groups * taste, end])
    return np.asarray(predictions)


def realised_bits(predictions: np.ndarray, symbols: np.ndarray) -> np.ndarray:
    return -np.log2(predictions[np.arange(len(symbols)), symbols])


def test_document_floor_matches_counting_each_documents_symbols(documents):
    stream = documents.sample(3_000, np.random.default_rng(4))
    t0 = documents.burn_in
    predictions = counted_predictions(documents, stream, t0, np.zeros(len(stream), dtype=int))
    assert documents.bits(stream) == pytest.approx(realised_bits(predictions, stream[t0:]))


def test_document_floor_at_a_context_counts_only_within_each_evaluation_window(documents):
    """Windows of 16 inputs from the first kept symbol, which is context only: the symbol at
    t0 + 16 is the last target of the first window and the first input of the second."""
    stream = documents.sample(3_000, np.random.default_rng(5))
    t0 = documents.burn_in
    window_starts = t0 + np.maximum(np.arange(len(stream)) - t0 - 1, 0) // 16 * 16
    predictions = counted_predictions(documents, stream, t0 + 1, window_starts)
    reference = realised_bits(predictions, stream[t0 + 1 :])
    assert documents.bits(stream, context=16) == pytest.approx(reference)


def test_document_floor_falls_as_the_context_grows_towards_the_unlimited_one(documents):
    stream = documents.sample(100_000, np.random.default_rng(6))
    floors = [documents.bits(stream, context).mean() for context in (4, 16, 64, 256)]
    assert floors == sorted(floors, reverse=True)
    assert floors[0] > floors[-1] + 0.1 and floors[-1] > documents.bits(stream).mean()


def test_document_process_predicts_a_distribution_over_the_symbols_and_the_separator(
    documents,
):
    stream = documents.sample(2_000, np.random.default_rng(7))
    for t in range(documents.burn_in, len(stream), 211):
        prefixes = [np.r_[stream[:t], v] for v in range(documents.separator + 1)]
        with np.errstate(divide="ignore"):  # a separator right after one: ruled out
            probs = [2.0 ** -documents.bits(prefix)[-1] for prefix in prefixes]
        assert sum(probs) == pytest.approx(1, rel=1e-12)


def test_match_rate_at_each_distance_is_what_the_document_process_predicts(documents):
    """A Monte-Carlo check of the closed form on the process's own samples (the taste of each
    document drawn, never told to the formula): at a distance e, the frequency of
    x_t == x_{t-e} is the mean predicted P(x_t = x_{t-e} | past); so is the separator's."""
    stream = documents.sample(30_000, np.random.default_rng(3))
    t = np.arange(documents.burn_in, len(stream))
    unwindowed = np.zeros(len(stream), dtype=int)
    predictions = counted_predictions(documents, stream, documents.burn_in, unwindowed)
    for e in (1, 2, 5, 30, 200):
        predicted = predictions[np.arange(len(t)), stream[t - e]].mean()
        assert np.mean(stream[t] == stream[t - e]) == pytest.approx(predicted, abs=0.006)
    separators = np.mean(stream[t] == documents.separator)
    assert separators == pytest.approx(predictions[:, -1].mean(), rel=0.1)


def test_document_floor_without_tastes_is_the_group_chains_rate_plus_the_choice_in_a_group():
    """A huge concentration makes every document's taste uniform: the floor is then the
    entropy rate of the chain over groups plus log2(group_size) (documents end rarely)."""
    process = DocumentMarkovProcess.random(16, 2, 4, 1e9, 1e4, np.random.default_rng(5))
    floor = process.bits(process.sample(200_000, np.random.default_rng(6))).mean()
    assert floor == pytest.approx(markov_entropy_rate(process.transition) + 2, abs=0.02)


def test_documents_make_the_floor_well_below_what_the_previous_symbol_gives(documents):
    stream = documents.sample(200_000, np.random.default_rng(9))
    assert documents.bits(stream).mean() < order_one_bits(stream[documents.burn_in - 1 :]) - 0.3


def test_entropy_floor_is_well_below_the_unigram_baseline(synthetic):
    stats = load_corpus(synthetic).stats
    assert stats["entropy_floor_bits_per_byte"] < stats["unigram_bits_per_byte"] - 1


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ({"vocab_size": 1}, "data.vocab_size"),
        ({"vocab_size": 96}, "data.vocab_size"),
        ({"successors": 0}, "data.successors"),
        ({"vocab_size": 8, "successors": 3}, "data.successors"),  # 2 groups of 4
        ({"long_range": "topics"}, "data.long_range"),
        ({"group_size": 3}, "data.group_size"),
        ({"group_size": 32}, "data.group_size"),
        ({"group_size": 0}, "data.group_size"),
        ({"concentration": 0.0}, "data.concentration"),
        ({"document_length": 0.5}, "data.document_length"),
        ({"long_range": "spans", "repeat_prob": 1.0}, "data.repeat_prob"),
        ({"long_range": "spans", "repeat_prob": -0.1}, "data.repeat_prob"),
        ({"long_range": "spans", "repeat_length": 0.5}, "data.repeat_length"),
        ({"long_range": "spans", "repeat_distances": [0, 8]}, "data.repeat_distances"),
        ({"long_range": "spans", "repeat_distances": [9, 8]}, "data.repeat_distances"),
        ({"long_range": "spans", "repeat_distances": [8]}, "data.repeat_distances"),
        ({"long_range": "spans", "vocab_size": 8, "successors": 9}, "data.successors"),
        ({"long_range": "lags", "copy_prob": 1.0}, "data.copy_prob"),
        ({"long_range": "lags", "copy_prob": -0.1}, "data.copy_prob"),
        ({"long_range": "lags", "lags": []}, "data.lags"),
        ({"long_range": "lags", "lags": [4, 0]}, "data.lags"),
        ({"train_tokens": 0}, "data.train_tokens"),
        ({"val_tokens": -5}, "data.val_tokens"),
    ],
)
def test_invalid_synthetic_parameters_raise_one_line_errors(synthetic, override, key):
    assert key in one_line_error(lambda: load_corpus({**synthetic, **override}))


def test_synthetic_max_bytes_caps_each_split(synthetic):
    corpus = load_corpus({**synthetic, "max_bytes": 8000})
    assert (len(corpus.train), len(corpus.val)) == (8000, 5000)


def test_unknown_source_names_the_choices():
    assert "synthetic, text, hub" in one_line_error(lambda: load_corpus({"source": "web"}))


def test_unigram_bits_per_byte_is_add_one_smoothed_cross_entropy():
    train = np.array([65, 65, 66], dtype=np.uint8)  # counts + 1: A=3, B=2, others 1; total 259
    val = np.array([65, 67], dtype=np.uint8)
    expected = -(math.log2(3 / 259) + math.log2(1 / 259)) / 2
    assert data.unigram_bits_per_byte(train, val) == pytest.approx(expected)


# Local text --------------------------------------------------------------------------------------


def test_text_file_is_split_at_the_exact_val_fraction_and_round_trips(tmp_path, small_chunks):
    path = write(tmp_path / "corpus.txt", TEXT * 80)
    corpus = load_corpus(text_config(tmp_path, path, val_fraction=0.25))
    raw = path.read_bytes()
    split = len(raw) - round(0.25 * len(raw))
    assert as_bytes(corpus.train) == raw[:split] and as_bytes(corpus.val) == raw[split:]
    assert corpus.name == "text" and set(corpus.stats) == {"unigram_bits_per_byte"}


def test_text_directory_concatenates_its_files_recursively_in_sorted_order(tmp_path):
    write(tmp_path / "books" / "b.txt", "B" * 600)
    write(tmp_path / "books" / "a" / "z.txt", "AZ" * 300)
    write(tmp_path / "books" / ".git" / "HEAD", "ref: main\n")
    val = write(tmp_path / "val.txt", TEXT * 30)
    corpus = load_corpus(text_config(tmp_path, tmp_path / "books", val_path=str(val)))
    assert as_bytes(corpus.train) == b"AZ" * 300 + b"B" * 600
    assert as_bytes(corpus.val) == val.read_bytes()


def test_text_glob_reads_only_matching_files(tmp_path):
    write(tmp_path / "docs" / "one.txt", TEXT * 30)
    write(tmp_path / "docs" / "deep" / "two.txt", "second\n" * 2000)
    write(tmp_path / "docs" / "notes.md", "# not text\n" * 200)
    corpus = load_corpus(text_config(tmp_path, tmp_path / "docs" / "**" / "*.txt"))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == ("second\n" * 2000 + TEXT * 30).encode()


@pytest.mark.parametrize(
    ("path", "val_path"),
    [
        ("docs/one.txt", "docs/one.txt"),  # the same file
        ("docs/./one.txt", "docs/one.txt"),  # the same file, spelt differently
        ("docs", "docs/deep/two.txt"),  # inside a training directory
        ("docs/**/*.txt", "docs/deep/two.txt"),  # matched by a training glob
    ],
)
def test_a_validation_file_that_is_also_trained_on_is_a_one_line_error(tmp_path, path, val_path):
    write(tmp_path / "docs" / "one.txt", TEXT * 30)
    write(tmp_path / "docs" / "deep" / "two.txt", TEXT * 30)
    config = text_config(tmp_path, tmp_path / path, val_path=str(tmp_path / val_path))
    with pytest.raises(
        PosbenchError, match=r"data\.val_path .* is also in the training set"
    ) as info:
        load_corpus(config)
    assert "\n" not in str(info.value)


def test_a_validation_file_beside_the_training_files_is_accepted(tmp_path):
    write(tmp_path / "docs" / "one.txt", TEXT * 30)
    val = write(tmp_path / "valid.txt", TEXT * 30)
    corpus = load_corpus(text_config(tmp_path, tmp_path / "docs", val_path=str(val)))
    assert as_bytes(corpus.val) == val.read_bytes()


def test_text_cache_is_invalidated_when_a_file_changes(tmp_path):
    path = write(tmp_path / "corpus.txt", "a" * 10_000 + "b" * 10_000)
    assert as_bytes(load_corpus(text_config(tmp_path, path)).val) == b"b" * 2000
    write(path, "c" * 30_000)
    assert as_bytes(load_corpus(text_config(tmp_path, path)).val) == b"c" * 3000


def test_empty_text_file_raises_a_one_line_error(tmp_path):
    path = write(tmp_path / "empty.txt", "")
    assert "contains no text" in one_line_error(lambda: load_corpus(text_config(tmp_path, path)))


def test_missing_text_path_raises_a_one_line_error(tmp_path):
    config = text_config(tmp_path, tmp_path / "nowhere" / "*.txt")
    assert "matches no file" in one_line_error(lambda: load_corpus(config))


def test_unset_text_path_raises_a_one_line_error():
    assert "data.path" in one_line_error(lambda: load_corpus({"source": "text"}))


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1.5])
def test_val_fraction_outside_the_unit_interval_is_rejected(tmp_path, fraction):
    config = text_config(tmp_path, write(tmp_path / "c.txt", TEXT * 40), val_fraction=fraction)
    assert "data.val_fraction" in one_line_error(lambda: load_corpus(config))


def test_too_short_validation_split_is_rejected(tmp_path):
    config = text_config(tmp_path, write(tmp_path / "c.txt", "x" * 5000), val_fraction=0.01)
    assert "val split" in one_line_error(lambda: load_corpus(config))


def test_a_file_that_is_not_utf8_text_is_read_as_raw_bytes(tmp_path):
    path = tmp_path / "data.bin"
    content = bytes(torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0)))
    path.write_bytes(content)
    corpus = load_corpus(text_config(tmp_path, path))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == content


def test_text_that_turns_out_not_to_be_utf8_is_reread_as_raw_bytes(tmp_path, small_chunks):
    # The first file streams into the cache before the second fails to decode.
    first = write(tmp_path / "docs" / "a.txt", TEXT * 100).read_bytes()
    second = b"\xff\xfe latin-1: \xe9t\xe9\n" * 600
    (tmp_path / "docs" / "b.txt").write_bytes(second)
    corpus = load_corpus(text_config(tmp_path, tmp_path / "docs"))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == first + second


def test_raw_bytes_stop_at_max_bytes(tmp_path):
    path = tmp_path / "data.bin"
    path.write_bytes(bytes(range(256)) * 100)
    corpus = load_corpus(text_config(tmp_path, path, max_bytes=12_000))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == (bytes(range(256)) * 100)[:12_000]


def test_text_max_bytes_caps_path_and_val_path_each(tmp_path):
    train = write(tmp_path / "train.txt", "a" * 10_000)
    val = write(tmp_path / "val.txt", "b" * 3000)
    corpus = load_corpus(text_config(tmp_path, train, val_path=str(val), max_bytes=2500))
    assert as_bytes(corpus.train) == b"a" * 2500 and as_bytes(corpus.val) == b"b" * 2500


def test_text_max_bytes_holds_val_out_of_the_bytes_read(tmp_path):
    path = write(tmp_path / "c.txt", "a" * 16_000 + "b" * 16_000)
    corpus = load_corpus(text_config(tmp_path, path, max_bytes=20_000))
    assert as_bytes(corpus.train) == b"a" * 16_000 + b"b" * 2000
    assert as_bytes(corpus.val) == b"b" * 2000


def test_max_bytes_is_part_of_the_cache_key(synthetic, tmp_path):
    assert len(load_corpus({**synthetic, "max_bytes": 8000}).train) == 8000
    assert len(load_corpus(synthetic).train) == 20_000
    assert len(list((tmp_path / "cache").iterdir())) == 2


def test_max_bytes_smaller_than_a_split_is_a_one_line_error(synthetic):
    assert "data.max_bytes" in one_line_error(lambda: load_corpus({**synthetic, "max_bytes": 100}))


def test_held_out_split_keeps_its_stats_and_checksums_exact(tmp_path, small_chunks):
    # Val is moved out of the end of train after both were counted and hashed chunk by chunk.
    corpus = load_corpus(text_config(tmp_path, write(tmp_path / "c.txt", TEXT * 160)))
    expected = data.unigram_bits_per_byte(np.array(corpus.train), np.array(corpus.val))
    assert corpus.stats["unigram_bits_per_byte"] == pytest.approx(expected, rel=1e-12)
    (entry,) = (tmp_path / "cache").iterdir()
    assert verify_entry(entry) == []


def starts(documents: np.ndarray | None) -> list[int] | None:
    return None if documents is None else documents.tolist()


def test_files_of_a_text_directory_are_documents(tmp_path):
    write(tmp_path / "val" / "a.txt", "a" * 300)
    write(tmp_path / "val" / "b.txt", "")  # an empty file starts no document
    write(tmp_path / "val" / "c.txt", "c" * 900)
    write(tmp_path / "train" / "t.txt", "t" * 2000)
    config = text_config(tmp_path, tmp_path / "train", val_path=str(tmp_path / "val"))
    corpus = load_corpus(config)
    assert starts(corpus.val_documents) == [0, 300]
    assert starts(corpus.train_documents) == [0]
    assert corpus.describe() == "2,000 train / 1,200 val bytes, 1 train documents, 2 val documents"


def test_a_single_text_file_is_one_stream_without_documents(tmp_path):
    path = write(tmp_path / "corpus.txt", TEXT * 200)
    corpus = load_corpus(
        text_config(tmp_path, path, val_path=str(write(tmp_path / "v", TEXT * 30)))
    )
    assert corpus.train_documents is None and corpus.val_documents is None
    corpus = load_corpus(text_config(tmp_path, path))
    assert corpus.train_documents is None and corpus.val_documents is None


def test_the_val_fraction_cut_makes_two_documents_of_the_file_it_falls_in(tmp_path):
    for name, size in {"a": 1000, "b": 3000, "c": 4000, "d": 2000}.items():
        write(tmp_path / "docs" / f"{name}.txt", name * size)
    corpus = load_corpus(text_config(tmp_path, tmp_path / "docs", val_fraction=0.25))
    # 10,000 bytes cut at 7,500, inside c (4,000..8,000): its tail is val's first document
    assert starts(corpus.train_documents) == [0, 1000, 4000]
    assert starts(corpus.val_documents) == [0, 500]
    assert as_bytes(corpus.val) == b"c" * 500 + b"d" * 2000


def test_document_starts_count_a_crlf_as_the_one_byte_it_is_read_as(tmp_path):
    write(tmp_path / "val" / "a.txt", "x\r\n" * 400)  # read as "x\n": 800 bytes
    write(tmp_path / "val" / "b.txt", "y\ry\n" * 300)
    config = text_config(
        tmp_path, write(tmp_path / "t.txt", TEXT * 40), val_path=str(tmp_path / "val")
    )
    corpus = load_corpus(config)
    assert starts(corpus.val_documents) == [0, 800]
    assert as_bytes(corpus.val) == b"x\n" * 400 + b"y\ny\n" * 300


def test_files_of_raw_bytes_are_documents_too(tmp_path):
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "a.bin").write_bytes(b"\xff\xfe" * 600)  # not UTF-8
    (tmp_path / "val" / "b.bin").write_bytes(b"\x00\x81" * 400)
    config = text_config(
        tmp_path, write(tmp_path / "t.txt", TEXT * 40), val_path=str(tmp_path / "val")
    )
    assert starts(load_corpus(config).val_documents) == [0, 1200]


def read_as_text_mode(path) -> bytes:
    """A file as Python's text mode reads it (universal newlines, strict UTF-8), re-encoded."""
    with open(path, encoding="utf-8") as file:
        return file.read().encode()


class RecordingWriter(SplitWriter):
    """A split in a flat file that records the size of each write."""

    def __init__(self, path):
        super().__init__(ArrayWriter(path, np.uint8))
        self.writes = []

    def write(self, data):
        self.writes.append(len(data))
        super().write(data)

    def bytes(self) -> bytes:
        return b"".join(as_bytes(chunk) for chunk in self.array.read(0, len(self)))


def copied(tmp_path, files, chunk_bytes, max_bytes=None):
    """``files`` read as text by ``text._copy_files`` into a fresh split: its bytes and each
    file's size."""
    out = RecordingWriter(tmp_path / "split.bin")
    sizes = text._copy_files(files, max_bytes, out, chunk_bytes, as_text=True)
    return out.bytes(), sizes


TEXT_MODE_CASES = {
    "crlf": b"one\r\ntwo\r\n\r\nthree\r\n",
    "lone cr": b"one\rtwo\r\rthree\r",
    "mixed line breaks": b"a\r\nb\rc\nd\r\r\ne\n\rf\r\r\r\n\n\n",
    "empty lines": b"\n\n\r\n\r\n\r\r\n",
    "no final newline": b"first\nsecond\r\nlast",
    "ends in cr": b"line\r\nline\r",
    "utf-8": TEXT.encode() + "\r\n𝄞 €\u2028 \x85 \x0b\x0c".encode(),
    "bom": "\ufeffwith a byte order mark\r\n".encode(),
}


@pytest.mark.parametrize("content", TEXT_MODE_CASES.values(), ids=TEXT_MODE_CASES.keys())
def test_text_is_read_as_python_text_mode_reads_it_at_any_chunk_size(tmp_path, content):
    # One-byte chunks cut every \r\n and every multi-byte character; longer ones cut elsewhere.
    path = tmp_path / "text.txt"
    path.write_bytes(content * 3)
    expected = read_as_text_mode(path)
    for chunk_bytes in (*range(1, 8), 64):
        assert copied(tmp_path, [path], chunk_bytes) == (expected, [len(expected)]), chunk_bytes


def test_a_crlf_split_across_two_chunks_is_one_newline(tmp_path):
    path = tmp_path / "crlf.txt"
    path.write_bytes(b"x" * 63 + b"\r\n" + b"y\r" * 3 + b"\r\n")
    assert copied(tmp_path, [path], chunk_bytes=64)[0] == b"x" * 63 + b"\n" + b"y\n" * 3 + b"\n"


def test_a_file_without_line_breaks_is_written_a_chunk_at_a_time(tmp_path, small_chunks):
    # text8 is 100 MB without a line break: a reader of lines would hold all of it at once.
    path = write(tmp_path / "one_line.txt", "a few words without a line break " * 300)
    out = RecordingWriter(tmp_path / "split.bin")
    text._read_text(str(path), "path", None, out)
    assert out.bytes() == path.read_bytes() and max(out.writes) <= 64


def test_text_max_bytes_counts_bytes_after_newline_translation_and_may_cut_a_character(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes("é\r\n".encode() * 1000)
    expected = ("é\n".encode() * 1000)[:1999]  # ends inside an é
    assert copied(tmp_path, [path], chunk_bytes=7, max_bytes=1999) == (expected, [1999])


def test_bytes_past_max_bytes_do_not_decide_whether_a_file_is_text(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"x\r\n" * 5000 + b"\xff")
    corpus = load_corpus(text_config(tmp_path, path, max_bytes=5000, val_fraction=0.5))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == b"x\n" * 2500


def test_a_file_that_ends_inside_a_character_is_read_as_raw_bytes(tmp_path):
    path = tmp_path / "text.txt"
    path.write_bytes(b"x\r\n" * 4000 + "数".encode()[:2])
    corpus = load_corpus(text_config(tmp_path, path))
    assert as_bytes(corpus.train) + as_bytes(corpus.val) == path.read_bytes()


def test_a_crlf_split_between_two_files_is_two_newlines(tmp_path):
    # Each file is read as text by itself, so the \r ending one file is a line break of its own.
    write(tmp_path / "docs" / "a.txt", "a" * 1500 + "\r")
    write(tmp_path / "docs" / "b.txt", "\n" + "b" * 1500)
    out = RecordingWriter(tmp_path / "split.bin")
    text._read_text(str(tmp_path / "docs"), "path", None, out)
    assert out.bytes() == b"a" * 1500 + b"\n\n" + b"b" * 1500
    assert starts(out.documents) == [0, 1501]


# Hub corpora -------------------------------------------------------------------------------------


# Rows as wikitext (each ends in a newline, blank lines are empty rows) and pg19 (books without
# a final newline) store them, and the bytes they must become.
HUB_ROWS = ["", " = Title = \n", "wikitext-like row\n", "a book without a final newline"]
HUB_TEXT = "\n = Title = \nwikitext-like row\na book without a final newline\n"


@pytest.fixture
def local_hub_dataset(tmp_path):
    """A dataset directory laid out like a hub repository: one parquet file per split."""
    root = tmp_path / "hub"
    (root / "data").mkdir(parents=True)
    pq.write_table(pa.table({"text": HUB_ROWS * 100}), root / "data" / "train-00000.parquet")
    pq.write_table(pa.table({"text": ["ünïcode"] * 300}), root / "data" / "validation.parquet")
    return root


def hub_config(tmp_path, hub_path, **overrides):
    return {
        "source": "hub",
        "name": "local",
        "hub_path": str(hub_path),
        "cache_dir": str(tmp_path / "cache"),
        **overrides,
    }


def test_hub_rows_become_lines(offline, tmp_path, local_hub_dataset):
    corpus = load_corpus(hub_config(tmp_path, local_hub_dataset))
    assert as_bytes(corpus.train) == (HUB_TEXT * 100).encode()
    assert as_bytes(corpus.val) == ("ünïcode\n" * 300).encode()


def test_hub_max_bytes_cuts_each_split_exactly(offline, tmp_path, local_hub_dataset):
    corpus = load_corpus(hub_config(tmp_path, local_hub_dataset, max_bytes=1500))
    assert as_bytes(corpus.train) == (HUB_TEXT * 100).encode()[:1500]
    assert as_bytes(corpus.val) == ("ünïcode\n" * 300).encode()[:1500]


def test_encoding_stops_reading_at_max_bytes_and_holds_a_chunk_at_a_time():
    def endless():
        while True:
            yield "ab" * 1000

    chunks = list(hub._encode(endless(), max_bytes=3 * CHUNK_BYTES + 1))
    assert b"".join(chunks) == (b"ab" * (2 * CHUNK_BYTES))[: 3 * CHUNK_BYTES + 1]
    assert max(len(chunk) for chunk in chunks) < CHUNK_BYTES + 2000


BOOKS = ["first book " * 60, "second, longer book " * 90, "third\n" * 100]


@pytest.fixture
def local_books(tmp_path):
    """A dataset directory laid out like pg19: one row per book, no final newlines."""
    root = tmp_path / "books"
    (root / "data").mkdir(parents=True)
    for split in ("train", "validation"):
        pq.write_table(pa.table({"text": BOOKS * 2}), root / "data" / f"{split}.parquet")
    return root


def test_hub_rows_are_documents_with_rows_are_documents(offline, tmp_path, local_books):
    corpus = load_corpus(hub_config(tmp_path, local_books, rows_are_documents=True))
    sizes = [len(book.encode()) + (not book.endswith("\n")) for book in BOOKS * 2]
    expected = np.cumsum([0, *sizes[:-1]]).tolist()
    assert starts(corpus.val_documents) == expected and starts(corpus.train_documents) == expected
    assert (
        as_bytes(corpus.val)[expected[1] : expected[2]]
        == ("second, longer book " * 90 + "\n").encode()
    )


def test_a_hub_byte_cap_keeps_the_head_of_the_row_it_cuts(offline, tmp_path, local_books):
    config = hub_config(tmp_path, local_books, rows_are_documents=True, max_bytes=2500)
    corpus = load_corpus(config)
    # rows of 661 and 1801 bytes, then 600 of which the cap keeps 38
    assert len(corpus.val) == 2500 and starts(corpus.val_documents) == [0, 661, 2462]
    assert len(corpus.train) == 2500 and starts(corpus.train_documents) == [0, 661, 2462]


def test_hub_rows_are_one_stream_by_default(offline, tmp_path, local_books):
    corpus = load_corpus(hub_config(tmp_path, local_books))
    assert corpus.train_documents is None and corpus.val_documents is None


def test_the_pg19_config_takes_each_book_as_a_document():
    from posbench.config import compose_config

    assert compose_config(["data=pg19"]).data.rows_are_documents is True


def test_hub_missing_text_field_is_rejected(offline, tmp_path, local_hub_dataset):
    config = hub_config(tmp_path, local_hub_dataset, text_field="content")
    assert "data.text_field 'content'" in one_line_error(lambda: load_corpus(config))


def test_hub_unknown_split_is_rejected(offline, tmp_path, local_hub_dataset):
    config = hub_config(tmp_path, local_hub_dataset, val_split="test")
    assert "split 'test'" in one_line_error(lambda: load_corpus(config))


def test_offline_hub_corpus_fails_with_one_line_pointing_to_local_text(offline, tmp_path):
    config = hub_config(
        tmp_path, "Salesforce/wikitext", name="wikitext2", hub_name="wikitext-2-raw-v1"
    )
    assert "data=text data.path=" in one_line_error(lambda: load_corpus(config))


def test_unreachable_hub_fails_fast_outside_offline_mode(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_DATASETS_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    # Nothing listens on the discard port, so every request made in this test fails at once.
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    config = hub_config(tmp_path, "Salesforce/wikitext", hub_name="wikitext-2-raw-v1")
    start = time.monotonic()
    assert "unreachable" in one_line_error(lambda: load_corpus(config))
    assert time.monotonic() - start < 1  # datasets alone retries for ~25 s before failing


def test_an_uncached_hub_corpus_in_offline_mode_fails_before_building(
    monkeypatch, tmp_path, caplog
):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    monkeypatch.delenv("HF_DATASETS_CACHE", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    config = hub_config(tmp_path, "Salesforce/wikitext", hub_name="wikitext-103-raw-v1")
    start = time.monotonic()
    with caplog.at_level(logging.INFO):
        assert "data=text data.path=" in one_line_error(lambda: load_corpus(config))
    assert time.monotonic() - start < 1
    assert "building corpus" not in caplog.text


# The cache ---------------------------------------------------------------------------------------


def fail_if_called(config):
    raise AssertionError("the corpus was rebuilt instead of read from the cache")


def test_second_load_is_read_from_the_cache(synthetic, monkeypatch):
    first = load_corpus(synthetic)
    monkeypatch.setitem(data._BUILDERS, "synthetic", fail_if_called)
    second = load_corpus({**synthetic, "name": "renamed"})
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    assert second.stats == first.stats and second.name == "renamed"


def test_a_loaded_corpus_is_a_read_only_memory_map_of_its_cache_entry(synthetic, tmp_path):
    for corpus in (load_corpus(synthetic), load_corpus(synthetic)):  # built, then cached
        (entry,) = (tmp_path / "cache").iterdir()
        for split in (corpus.train, corpus.val):
            assert isinstance(split, np.memmap) and not split.flags.writeable
        assert Path(corpus.train.filename) == entry / "train.bin"


def in_memory(corpus: data.Corpus) -> data.Corpus:
    """``corpus`` copied out of its cache files: a test that rewrites them in place would
    change (or, by truncating, crash with SIGBUS) what a memory map of them reads."""
    return data.Corpus(corpus.name, np.array(corpus.train), np.array(corpus.val), corpus.stats)


def rewrite_meta(entry, change):
    meta = json.loads((entry / "meta.json").read_text())
    change(meta)
    (entry / "meta.json").write_text(json.dumps(meta))


@pytest.mark.parametrize(
    "damage",
    [
        lambda entry: (entry / "train.bin").write_bytes((entry / "train.bin").read_bytes()[:500]),
        lambda entry: (entry / "val.bin").write_bytes((entry / "val.bin").read_bytes() + b"!"),
        lambda entry: (entry / "train.bin").write_bytes(b""),
        lambda entry: (entry / "val.bin").unlink(),
        lambda entry: (entry / "meta.json").write_text("{"),
        lambda entry: rewrite_meta(entry, lambda meta: meta["arrays"].pop("val")),
        lambda entry: rewrite_meta(entry, lambda meta: meta["arrays"]["train"].update(dtype="<i8")),
        lambda entry: rewrite_meta(entry, lambda meta: meta.update(format=1)),
    ],
    ids=[
        "truncated",
        "extended",
        "empty",
        "missing file",
        "bad json",
        "array not in meta",
        "other dtype",
        "old format",
    ],
)
def test_damaged_cache_entry_is_rebuilt(synthetic, tmp_path, damage, caplog):
    first = in_memory(load_corpus(synthetic))  # the damage rewrites the mapped files
    (entry,) = (tmp_path / "cache").iterdir()
    damage(entry)
    with caplog.at_level(logging.INFO):
        second = load_corpus(synthetic)
    assert "building corpus" in caplog.text
    assert np.array_equal(first.train, second.train) and np.array_equal(first.val, second.val)
    assert load_corpus(synthetic).stats == first.stats


def test_a_byte_changed_in_place_is_found_by_verify_corpus_not_on_load(synthetic, tmp_path):
    # The trade-off of memory-mapped entries: loading checks sizes, not checksums, which
    # would read the whole corpus on every run.
    first = in_memory(load_corpus(synthetic))
    (entry,) = (tmp_path / "cache").iterdir()
    assert data.verify_corpus(synthetic) == []
    damaged = bytearray((entry / "val.bin").read_bytes())
    damaged[len(damaged) // 2] ^= 1
    (entry / "val.bin").write_bytes(damaged)
    assert not np.array_equal(load_corpus(synthetic).val, first.val)
    assert data.verify_corpus(synthetic) == ["val"]


def test_verifying_a_corpus_never_built_is_a_one_line_error(synthetic):
    assert "no intact cache entry" in one_line_error(lambda: data.verify_corpus(synthetic))


def test_cache_entry_without_its_meta_file_is_rebuilt(synthetic, tmp_path):
    first = load_corpus(synthetic)
    (entry,) = (tmp_path / "cache").iterdir()
    (entry / "meta.json").unlink()  # as if killed before the last write
    assert np.array_equal(load_corpus(synthetic).val, first.val)
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_a_failed_build_leaves_no_files_and_no_meta(tmp_path):
    path = write(tmp_path / "c.txt", "x" * 5000)
    config = text_config(tmp_path, path, val_fraction=0.01)  # a val split of 50 bytes
    assert "val split" in one_line_error(lambda: load_corpus(config))
    (entry,) = (tmp_path / "cache").iterdir()
    assert list(entry.iterdir()) == []


def test_an_unwritable_cache_is_a_one_line_error(synthetic, tmp_path):
    blocker = write(tmp_path / "a_file", "not a directory")
    config = {**synthetic, "cache_dir": str(blocker / "cache")}
    assert "set data.cache_dir or POSBENCH_CACHE" in one_line_error(lambda: load_corpus(config))


def test_a_cache_entry_holds_any_named_flat_array(tmp_path):
    # Per-split arrays besides the bytes (e.g. document offsets) go in the same entry.
    offsets = np.array([0, 10, 300], dtype=np.int64)
    with build_entry(tmp_path / "entry") as build:
        build.write_array("offsets", offsets)
        chunks = build.array("bytes")
        chunks.write(np.arange(100, dtype=np.uint8))
        chunks.write(np.arange(50, dtype=np.uint8))
        build.meta["stats"] = {}
    arrays, meta = read_entry(tmp_path / "entry", ["offsets", "bytes"])
    assert arrays["offsets"].dtype == np.int64 and np.array_equal(arrays["offsets"], offsets)
    assert np.array_equal(arrays["bytes"], np.r_[np.arange(100), np.arange(50)])
    assert meta["arrays"]["bytes"]["shape"] == [150] and verify_entry(tmp_path / "entry") == []


def documents_corpus(tmp_path):
    for name, size in {"a": 1000, "b": 3000, "c": 2000}.items():
        write(tmp_path / "docs" / f"{name}.txt", name * size)
    return text_config(tmp_path, tmp_path / "docs", val_fraction=0.5)


def test_documents_are_cached_next_to_their_splits(tmp_path, monkeypatch):
    config = documents_corpus(tmp_path)
    first = load_corpus(config)
    monkeypatch.setitem(data._BUILDERS, "text", fail_if_called)
    second = load_corpus(config)
    assert starts(second.train_documents) == starts(first.train_documents) == [0, 1000]
    assert starts(second.val_documents) == starts(first.val_documents) == [0, 1000]
    (entry,) = (tmp_path / "cache").iterdir()
    meta = json.loads((entry / "meta.json").read_text())
    for split in ("train", "val"):
        assert meta["arrays"][f"{split}_documents"] == {
            "dtype": "<i8",
            "shape": [2],
            "sha256": hashlib.sha256(np.array([0, 1000], dtype=np.int64).tobytes()).hexdigest(),
        }
    assert verify_entry(entry) == []


def test_a_corpus_without_documents_caches_none(synthetic, tmp_path):
    corpus = load_corpus(synthetic)
    assert corpus.train_documents is None and corpus.val_documents is None
    (entry,) = (tmp_path / "cache").iterdir()
    assert sorted(p.name for p in entry.iterdir()) == ["meta.json", "train.bin", "val.bin"]


def test_max_bytes_keeps_the_head_of_the_file_it_cuts_as_a_document(tmp_path):
    # 6,000 bytes of files read up to 5,000, inside c (4,000..6,000), then halved at 2,500,
    # inside b (1,000..4,000): b's tail is val's first document, c's head its second
    corpus = load_corpus({**documents_corpus(tmp_path), "max_bytes": 5000})
    assert starts(corpus.train_documents) == [0, 1000]
    assert starts(corpus.val_documents) == [0, 1500]
    assert as_bytes(corpus.val) == b"b" * 1500 + b"c" * 1000


@pytest.mark.parametrize(
    "damage",
    [
        lambda path: np.array([0, 3000], dtype=np.int64).tofile(path),  # at the split's end
        lambda path: np.array([0, 0], dtype=np.int64).tofile(path),  # not increasing
        lambda path: np.array([1000, 2000], dtype=np.int64).tofile(path),  # not from 0
        lambda path: np.array([0], dtype=np.int64).tofile(path),  # fewer than meta.json says
        lambda path: path.unlink(),
    ],
    ids=["at the end", "not increasing", "not from 0", "wrong count", "missing"],
)
def test_a_damaged_documents_file_is_rebuilt(tmp_path, damage):
    config = documents_corpus(tmp_path)
    load_corpus(config)
    (entry,) = (tmp_path / "cache").iterdir()
    damage(entry / "val_documents.bin")
    assert starts(load_corpus(config).val_documents) == [0, 1000]
    assert starts(load_corpus(config).val_documents) == [0, 1000]


def test_cache_directory_falls_back_to_posbench_cache_then_xdg(synthetic, tmp_path, monkeypatch):
    config = {**synthetic, "cache_dir": None}
    monkeypatch.setenv("POSBENCH_CACHE", str(tmp_path / "env"))
    load_corpus(config)
    monkeypatch.delenv("POSBENCH_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    load_corpus(config)
    assert len(list((tmp_path / "env").iterdir())) == 1
    assert len(list((tmp_path / "xdg" / "posbench").iterdir())) == 1


# Batches -----------------------------------------------------------------------------------------


def test_sample_batch_targets_are_inputs_shifted_by_one():
    tokens = torch.arange(200, dtype=torch.uint8)
    x, y = sample_batch(tokens, 8, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (8, 16) and x.dtype == y.dtype == torch.int64
    assert torch.equal(y[:, :-1], x[:, 1:]) and torch.equal(y[:, -1], x[:, -1] + 1)


def test_sample_batch_is_deterministic_for_a_seeded_generator():
    tokens = torch.randint(
        256, (5000,), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    first = sample_batch(tokens, 4, 32, torch.Generator().manual_seed(7))
    again = sample_batch(tokens, 4, 32, torch.Generator().manual_seed(7))
    other = sample_batch(tokens, 4, 32, torch.Generator().manual_seed(8))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], other[0])


def test_sample_batch_fits_a_split_of_exactly_seq_len_plus_one():
    tokens = torch.arange(17, dtype=torch.uint8)
    x, y = sample_batch(tokens, 3, 16, torch.Generator().manual_seed(0))
    assert torch.equal(x, tokens[:16].long().expand(3, 16))
    assert torch.equal(y, tokens[1:].long().expand(3, 16))


def test_sample_batch_reads_only_its_windows_of_a_split_larger_than_memory():
    x, y = sample_batch(terabyte_split(), 4, 16, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 16) and bool((x == 7).all()) and bool((y == 7).all())


def test_sample_batch_rejects_a_split_shorter_than_seq_len_plus_one():
    tokens = torch.zeros(16, dtype=torch.uint8)
    message = one_line_error(lambda: sample_batch(tokens, 1, 16, torch.Generator()))
    assert "seq_len 16" in message


# Corpora larger than memory ----------------------------------------------------------------------

# A run that touches little of its corpus: a few steps of a tiny model, a short evaluation.
FEW_STEPS = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "train.seq_len=16",
    "train.steps=3",
    "train.batch_size=4",
    "train.log_every=1",
    "train.val_every=3",
    "train.val_batches=1",
    "eval.lengths=[16]",
    "eval.max_tokens=1024",
    "threads=1",
    "device=cpu",
]


def made_up_words(count: int, seed: int = 0) -> list[bytes]:
    """``count`` distinct lower-case words of one to three syllables (``ka``, ``trel``,
    ``moranpe``): text a BPE merges as it merges a language's, not random bytes."""
    rng = np.random.default_rng(seed)
    onsets = ["", "b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "tr", "st", "ch"]
    vowels = ["a", "e", "i", "o", "u", "ai", "ou", "ea"]
    codas = ["", "", "n", "r", "l", "s", "t", "nd", "ng"]
    words: dict[str, None] = {}
    while len(words) < count:
        syllables = rng.integers(1, 4)
        word = "".join(
            rng.choice(onsets) + rng.choice(vowels) + rng.choice(codas) for _ in range(syllables)
        )
        words[word] = None
    return [word.encode() for word in words]


def write_word_corpus(path, lines_mebibytes: int, one_line_mebibytes: int = 0):
    """``lines_mebibytes`` MiB of words in lines of about 80 bytes, then ``one_line_mebibytes``
    MiB of them without a line break (text8 has none): one MiB of text, repeated. The words
    are 5,000 made-up ones at Zipf's law's frequencies (the most common ``the``-like short
    ones), so a corpus of any size holds the same distinct words: the BPE's own memory (its
    word counts) is the same for every size."""
    words = sorted(made_up_words(5000), key=len)  # the commonest words are the shortest
    rng = np.random.default_rng(0)
    frequency = 1 / np.arange(1, len(words) + 1)
    drawn = rng.choice(len(words), size=1 << 18, p=frequency / frequency.sum())
    text, line = bytearray(), 0
    for index in drawn:
        word = words[index]
        if line + len(word) >= 80:
            text += b"\n"
            line = 0
        elif line:
            text += b" "
            line += 1
        text += word
        line += len(word)
        if len(text) >= 1 << 20:
            break
    lines = bytes(text[: (1 << 20) - 1]) + b"\n"
    one_line = lines.replace(b"\n", b" ")
    with open(path, "wb") as file:
        for block, mebibytes in ((lines, lines_mebibytes), (one_line, one_line_mebibytes)):
            for _ in range(mebibytes):
                file.write(block)
    return path


def rss_anon(pid: int) -> int | None:
    """The process's resident anonymous memory (bytes: the heap, not mapped file pages), or
    None once it has exited."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    found = re.search(r"^RssAnon:\s+(\d+) kB", status, flags=re.MULTILINE)
    return int(found[1]) * 1024 if found else None  # a zombie has no memory lines


def peak_anon_of_trains(runs, built_entries: int = 0) -> list[tuple[int, int, str]]:
    """Run ``posbench train <args>`` in ``workdir`` for each ``(args, workdir)`` of ``runs``,
    side by side, one child process each (forked from the worker's warm interpreter: each
    starts with the same memory, its imports'). For each child: its peak anonymous memory
    (RssAnon, read every 5 ms; unlike ru_maxrss it leaves out the memory-mapped cache's pages,
    which the kernel keeps or drops as it likes) until ``built_entries`` entries of
    ``workdir/cache`` are built (their meta.json written), its peak over the whole run, and
    its output."""
    children = []
    for args, workdir in runs:
        with open(workdir / "posbench.log", "w") as out:
            command = [*forked_posbench(), "train", *args]
            children.append(
                subprocess.Popen(command, cwd=workdir, stdout=out, stderr=subprocess.STDOUT)
            )
    pids: list[int | None] = [None] * len(runs)
    building, whole = [0] * len(runs), [0] * len(runs)
    while any(child.poll() is None for child in children):
        for i, (child, (_, workdir)) in enumerate(zip(children, runs, strict=True)):
            pids[i] = pids[i] or command_pid(child, workdir)
            anon = (rss_anon(pids[i]) if pids[i] else None) or 0
            whole[i] = max(whole[i], anon)
            if len(list(workdir.glob("cache/*/meta.json"))) < built_entries:
                building[i] = max(building[i], anon)
        time.sleep(0.005)
    results = []
    for child, build_peak, peak, (_, workdir) in zip(children, building, whole, runs, strict=True):
        output = (workdir / "posbench.log").read_text()
        assert child.returncode == 0, output
        results.append((build_peak, peak, output))
    return results


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("tokenizer", ["bytes", "bpe"])
def test_peak_memory_of_building_and_training_does_not_grow_with_the_corpus(tmp_path, tokenizer):
    """Building a 16 MiB corpus (8 MiB of lines, then an 8 MiB line: a reader of lines would
    hold that line at once, a reader of the file all of it; with bpe, building also trains the
    tokenizer and encodes the splits), then training on its cache, takes no more anonymous
    memory than a 4 MiB corpus (two of BPE's 2 MiB batches of pieces: the encoder's working
    set). The build is compared while it runs: the model and the training allocate more
    later, and would hide it (and what the allocator keeps of the encoder's batches raises
    the rest of that run). Measured on a Zen 4 VM (2026-12-06): the 16 MiB corpus's peaks
    were 0.01 MB (bytes) and 3.5 MB (bpe) over the 4 MiB one's while building, 0.2 MB while
    training; reading the file whole raised the build's by 20 MB (12.6 MB with the commands
    forked, 2026-12-06), holding BPE's texts at once by 18 MB. Over 20 s with bpe (30 s of CPU
    on a 2-core VM at load 8, 2026-12-06; bytes 14 s): training the BPE and encoding the 16 MiB
    corpus is most of it, four posbench commands (forked, not processes that import torch:
    44 and 25 s before) the rest."""
    runs = []
    for lines, one_line in ((4, 0), (8, 8)):
        workdir = tmp_path / f"{lines + one_line}MiB"
        workdir.mkdir()
        corpus = write_word_corpus(workdir / "corpus.txt", lines, one_line)
        data = ["data=text", f"data.path={corpus}", f"data.cache_dir={workdir}/cache"]
        tokens = [f"data.tokenizer={tokenizer}", "data.vocab_size=512"]
        runs.append(([*data, *tokens, *FEW_STEPS], workdir))
    entries = 1 if tokenizer == "bytes" else 3  # the bytes; bpe: and the tokenizer, the tokens
    (small_build, _, small_log), (large_build, _, large_log) = peak_anon_of_trains(runs, entries)
    assert "building corpus" in small_log and "building corpus" in large_log
    (_, small_train, small_log), (_, large_train, large_log) = peak_anon_of_trains(runs)
    assert "building corpus" not in small_log + large_log
    peaks = f"building / training: 4 MiB {small_build:,} / {small_train:,} B, "
    peaks += f"16 MiB {large_build:,} / {large_train:,} B"
    assert large_build - small_build < 8e6, peaks  # streaming it into the cache
    assert large_train - small_train < 8e6, peaks  # the runs that map the cache
