"""Specification of tokenized corpora (posbench/data/tokenizer.py) and of the metrics that
compare runs across tokenizers (bits_per_byte, word_ppl in posbench/evaluation/perplexity.py)."""

from __future__ import annotations

import itertools
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import TINY_RUN

from posbench.config import compose_config
from posbench.data import load_corpus
from posbench.data.cache import ArrayWriter
from posbench.data.tokenizer import (
    PIECE_BYTES,
    encode_split,
    id_dtype,
    load_tokenizer,
    pieces,
    train_bpe,
)
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import evaluate
from posbench.model import build_model
from posbench.report import build_report
from posbench.report.tables import markdown
from posbench.runs.directory import load_run_config
from posbench.training.train import train

WIKITEXT2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"
WORDS = "the of and to in a is that for it as was with be by on not he this are or his from at"


def english_like(seed: int, n_words: int) -> str:
    """Lines of words drawn (Zipf-like) from 3,000 made-up words of two or three syllables,
    with punctuation, a few non-ASCII words and numbers: text whose words recur, as BPE needs,
    with more distinct words than a small vocabulary holds."""
    rng = np.random.default_rng(seed)
    syllables = [a + b for a in "bcdfghklmnprstvz" for b in "aeiou"]
    made_up = {
        "".join(np.random.default_rng(i).choice(syllables, size=2 + i % 2)) for i in range(3000)
    }
    vocabulary = [*sorted(made_up), "Ωmega", "naïve", "1984", "café"]
    weights = 1 / np.arange(1, len(vocabulary) + 1)
    words = rng.choice(vocabulary, size=n_words, p=weights / weights.sum())
    marks = rng.choice([".", ",", " !", ""], size=n_words // 12 + 1)
    lines = [" ".join(words[i : i + 12]) + marks[i // 12] for i in range(0, n_words, 12)]
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def text_files(tmp_path_factory):
    """A training and a validation file; the word ``zyzzyva`` only in the validation one."""
    folder = tmp_path_factory.mktemp("text")
    train_text = english_like(0, 60_000)
    val_text = english_like(1, 8_000) + "zyzzyva zyzzyva zyzzyva\n"
    (folder / "train.txt").write_text(train_text)
    (folder / "val.txt").write_text(val_text)
    return folder / "train.txt", folder / "val.txt"


def text_data(text_files, cache_dir, tokenizer: str = "bpe", vocab_size: int = 512) -> dict:
    train_file, val_file = text_files
    return {
        "source": "text",
        "path": str(train_file),
        "val_path": str(val_file),
        "tokenizer": tokenizer,
        "vocab_size": vocab_size,
        "cache_dir": str(cache_dir),
    }


def as_bytes(text: str) -> np.ndarray:
    return np.frombuffer(text.encode(), dtype=np.uint8)


def encoded(tokenizer, text: str, documents=None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """encode_split's ids, bytes and word starts of ``text``, read back from its arrays."""
    folder = Path(tempfile.mkdtemp())
    writers = [ArrayWriter(folder / f"{name}.bin", np.uint32) for name in ("ids", "b", "w")]
    encode_split(tokenizer, as_bytes(text), documents, *writers)
    for writer in writers:
        writer.close()
    return tuple(np.fromfile(folder / f"{name}.bin", np.uint32) for name in ("ids", "b", "w"))


# --- training a BPE ------------------------------------------------------------------------


def test_training_a_bpe_twice_on_the_same_corpus_gives_the_same_tokenizer_json(text_files):
    train_bytes = as_bytes(text_files[0].read_text())
    assert train_bpe(train_bytes, 400).to_str() == train_bpe(train_bytes, 400).to_str()


def test_the_bpe_is_trained_on_the_training_split_only(text_files, cache_dir):
    corpus = load_corpus(text_data(text_files, cache_dir))
    tokenizer = load_tokenizer_json(corpus.tokenizer)
    # A word seen only in the validation file has no token of its own; train words do.
    assert len(tokenizer.encode(" zyzzyva").ids) > 1
    assert len(tokenizer.encode(" " + common_word(text_files[0])).ids) == 1


def common_word(path: Path) -> str:
    """The most frequent word of a text file."""
    words, counts = np.unique(path.read_text().split(), return_counts=True)
    return str(words[counts.argmax()])


def load_tokenizer_json(text: str):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(text)


def test_the_vocabulary_has_the_size_asked_for_and_the_model_takes_it(text_files, cache_dir):
    corpus = load_corpus(text_data(text_files, cache_dir, vocab_size=600))
    assert corpus.vocab_size == 600
    assert corpus.train.dtype == np.uint16 and corpus.val.max() < 600
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "none"}, 600)
    assert model.lm_head.weight.shape == (600, 16)


def test_token_ids_are_uint16_where_the_vocabulary_fits_else_uint32():
    assert id_dtype(256) == np.uint16 and id_dtype(65536) == np.uint16
    assert id_dtype(65537) == np.uint32


def test_a_vocabulary_smaller_than_the_bytes_is_one_line(text_files):
    with pytest.raises(PosbenchError, match=r"data\.vocab_size must be at least 256"):
        train_bpe(as_bytes("a b c " * 100), 100)


# --- encoding ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(text_files):
    return train_bpe(as_bytes(text_files[0].read_text()), 500)


def test_a_text_encoded_in_pieces_gets_the_tokens_of_the_whole_text(tokenizer, text_files):
    text = text_files[1].read_text() * 5  # several pieces
    assert len(text.encode()) > 3 * PIECE_BYTES
    ids, _, _ = encoded(tokenizer, text)
    assert ids.tolist() == tokenizer.encode(text, add_special_tokens=False).ids


def test_the_tokens_cover_each_byte_once_and_count_the_words_of_the_text(tokenizer, text_files):
    text = text_files[1].read_text() * 3
    ids, token_bytes, word_starts = encoded(tokenizer, text)
    assert token_bytes.sum() == len(text.encode())
    assert word_starts.sum() == len(text.split())
    # Each token's bytes are its own text's.
    for i in (0, 1, 100, len(ids) - 1):
        assert token_bytes[i] == len(tokenizer.decode([int(ids[i])]).encode())


def test_encoded_text_decodes_back_to_itself(tokenizer, text_files):
    text = text_files[1].read_text()
    ids, _, _ = encoded(tokenizer, text)
    assert tokenizer.decode(ids.tolist()) == text


def test_pieces_end_before_a_space_between_words_and_never_cross_a_document():
    text = as_bytes(("word " * 40_000) + "tail")
    bounds = list(pieces(text, np.array([0, 70_001])))
    assert bounds[0][0] == 0 and bounds[-1][1] == len(text)
    assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
    assert any(begin == 70_001 for begin, _ in bounds)  # the second document starts a piece
    for _, end in bounds[:-1]:
        if end != 70_001:
            assert text[end] == ord(" ") and text[end - 1] != ord(" ")


def test_a_tokenizer_without_a_byte_table_counts_bytes_from_offsets(text_files):
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    wordpiece = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    wordpiece.normalizer = normalizers.Lowercase()
    wordpiece.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordPieceTrainer(vocab_size=300, special_tokens=["[UNK]"])
    wordpiece.train_from_iterator([text_files[0].read_text()], trainer)
    text = "The naïve encoding.\n  Ωmega  1984\n"
    _, token_bytes, word_starts = encoded(wordpiece, text)
    assert token_bytes.sum() == len(text.encode())
    assert word_starts.sum() == len(text.split())


def test_text_that_is_not_utf8_is_one_line_saying_to_use_bytes():
    with pytest.raises(PosbenchError, match=r"not UTF-8 text.*data\.tokenizer=bytes"):
        train_bpe(np.frombuffer(b"ok \xff\xfe broken", dtype=np.uint8), 300)


# --- tokenizers from files and the hub -------------------------------------------------------


def test_a_tokenizer_json_path_encodes_like_the_bpe_it_was_saved_from(
    text_files, cache_dir, tmp_path
):
    trained = load_corpus(text_data(text_files, cache_dir))
    path = tmp_path / "tokenizer.json"
    path.write_text(trained.tokenizer)
    from_file = load_corpus(text_data(text_files, cache_dir, tokenizer=str(path)))
    assert np.array_equal(from_file.val, trained.val)
    assert np.array_equal(from_file.val_token_bytes, trained.val_token_bytes)


def test_a_hub_name_that_is_not_in_the_local_cache_is_one_line_offline():
    with pytest.raises(PosbenchError) as error:
        load_tokenizer("gpt2")
    message = str(error.value)
    assert "\n" not in message and "local Hugging Face cache" in message


def test_a_json_path_that_does_not_exist_is_one_line():
    with pytest.raises(PosbenchError, match="no such file"):
        load_tokenizer("missing/tokenizer.json")


# --- metrics across tokenizers ---------------------------------------------------------------


def nll_of_windows(model, tokens: torch.Tensor, windows: list[tuple[int, int]], length: int):
    """The summed NLL of the targets each (start, first scored index) window scores, written
    out one window at a time."""
    total = 0.0
    for start, first in windows:
        window = tokens[start : start + length + 1]
        with torch.no_grad():
            logits = model(window[None, :-1])[0]
        nll = F.cross_entropy(logits, window[1:], reduction="none").double()
        total += nll[first:].sum().item()
    return total


def test_bits_per_byte_of_a_byte_run_is_its_mean_nll_over_ln2_and_bytes_are_its_tokens():
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "none"}).eval()
    tokens = torch.tensor(list(b"one two  three\nfour five six seven"), dtype=torch.long)
    (record,) = evaluate(model, tokens, [11])
    total = nll_of_windows(model, tokens, [(0, 0), (11, 0), (22, 0)], 11)  # 34 = 3 * 11 + 1
    assert record["bytes"] == record["tokens"] == len(tokens) - 1
    # total / bytes / ln 2 with bytes = tokens: the mean NLL / ln 2 it always was.
    assert record["bits_per_byte"] == pytest.approx(total / record["tokens"] / math.log(2), 1e-6)


def test_word_perplexity_is_exp_of_the_total_nll_over_the_words_scored_in_three_windows():
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "none"}).eval()
    text = b"ab cd  ef\ngh ij kl"  # 18 bytes: 17 targets, windows of 6 score 6 + 6 + 5
    tokens = torch.tensor(list(text), dtype=torch.long)
    (record,) = evaluate(model, tokens, [6])
    # The last window ends at the last target and scores the five not scored yet.
    total = nll_of_windows(model, tokens, [(0, 0), (6, 0), (11, 1)], 6)
    # The scored bytes are text[1:]: "b cd  ef\ngh ij kl" starts words at c, e, g, i, k (the
    # word "ab" starts at the first byte, which is context only).
    assert record["words"] == 5 and record["bytes"] == 17
    assert record["word_ppl"] == pytest.approx(math.exp(total / 5), rel=1e-6)


def test_token_runs_count_the_bytes_and_words_of_the_text_their_tokens_cover(text_files, cache_dir):
    corpus = load_corpus(text_data(text_files, cache_dir))
    torch.manual_seed(0)
    model = build_model(
        {"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": "none"}, corpus.vocab_size
    )
    tokens = corpus.val
    records = evaluate(
        model,
        tokens,
        [64],
        token_bytes=corpus.val_token_bytes,
        word_starts=corpus.val_word_starts,
    )
    text = text_files[1].read_text()
    first_token_bytes = int(corpus.val_token_bytes[0])  # context only: never scored
    assert records[0]["bytes"] == len(text.encode()) - first_token_bytes
    assert records[0]["words"] == len(text.split()) - 1  # the first word starts in token 0
    nats = records[0]["bits_per_byte"] * math.log(2) * records[0]["bytes"]
    assert records[0]["word_ppl"] == pytest.approx(math.exp(nats / records[0]["words"]))


# --- runs on tokens ----------------------------------------------------------------------------


def text_overrides(text_files, cache_dir) -> list[str]:
    """``posbench train`` overrides for a run on the test's text files."""
    train_file, val_file = text_files
    return [
        "data=text",
        f"data.path={train_file}",
        f"data.val_path={val_file}",
        f"data.cache_dir={cache_dir}",
    ]


@pytest.mark.slow
def test_a_run_on_bpe_tokens_keeps_its_tokenizer_and_evaluates_with_it(
    text_files, cache_dir, tmp_path
):
    overrides = [*TINY_RUN, *text_overrides(text_files, cache_dir), "data.tokenizer=bpe"]
    results = train(compose_config([*overrides, "data.vocab_size=512"]), tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "tokenizer.json").read_text())
    assert len(saved["model"]["vocab"]) == 512
    assert results["data"]["tokenizer"] == "bpe" and results["data"]["vocab_size"] == 512
    # Every later use of the run reads its data with the run's own tokenizer.json.
    config = load_run_config(tmp_path / "run")
    assert config.data.tokenizer == str((tmp_path / "run" / "tokenizer.json").resolve())
    record = results["eval"][0]
    assert record["bytes"] > record["tokens"] and record["word_ppl"] > record["ppl"]


@pytest.mark.slow
def test_a_byte_run_and_a_bpe_run_are_rows_of_one_report_compared_by_bits_per_byte(
    text_files, cache_dir, tmp_path
):
    data = text_overrides(text_files, cache_dir)
    for tokenizer in ("bytes", "bpe"):
        options = [*TINY_RUN, *data, f"data.tokenizer={tokenizer}", "data.vocab_size=512"]
        train(compose_config(options), tmp_path / "runs" / tokenizer)
    report = build_report(tmp_path / "runs", metric="bits_per_byte")
    (group,) = report.groups  # the tokenizer makes rows, not groups
    assert [row.label for row in group.rows] == ["rope [bpe 512]", "rope [bytes]"]
    for row, tokenizer in zip(group.rows, ("bpe", "bytes"), strict=True):
        results = json.loads((tmp_path / "runs" / tokenizer / "results.json").read_text())
        expected = {r["length"]: r["bits_per_byte"] for r in results["eval"]}
        assert {c.length: c.value.mean for c in row.cells} == expected
    assert "Bits per byte" in markdown(report)
    assert "bits_per_byte / bits_per_byte at 16" in markdown(report)


def test_report_metric_must_be_one_of_the_three(tmp_path):
    with pytest.raises(PosbenchError, match="--metric must be one of ppl, bits_per_byte, word_ppl"):
        build_report(tmp_path, metric="bleu")


def test_a_runs_tokenizer_is_none_for_bytes_and_its_own_for_tokens(tmp_path, text_files, cache_dir):
    from posbench import run_tokenizer

    overrides = [*TINY_RUN, *text_overrides(text_files, cache_dir), "train.steps=2"]
    train(compose_config(overrides), tmp_path / "bytes")
    train(compose_config([*overrides, "data.tokenizer=bpe"]), tmp_path / "bpe")
    assert run_tokenizer(tmp_path / "bytes") is None
    saved = (tmp_path / "bpe" / "tokenizer.json").read_text()
    assert run_tokenizer(tmp_path / "bpe").to_str() == load_tokenizer_json(saved).to_str()
