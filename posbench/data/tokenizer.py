"""Tokenizers: bytes (the default), a byte-level BPE trained on the training split, or any
Hugging Face fast tokenizer (a ``tokenizer.json`` file, or a hub name for users who are online).

``data.tokenizer`` chooses: ``bytes`` reads the corpus as it is (vocabulary 256, nothing to
train or download); ``bpe`` trains a byte-level BPE of ``data.vocab_size`` tokens with
Hugging Face ``tokenizers`` on the training split only (never the validation split: a word
only there is not one token), deterministic for a corpus and a size; anything else is a path
to a ``tokenizer.json`` or a hub name (``gpt2``, ``EleutherAI/gpt-neox-20b``).

A split is encoded in pieces of about PIECE_BYTES, cut only before a single space between two
characters that are not whitespace: byte-level (GPT-2) and Metaspace (SentencePiece)
pre-tokenizers split there anyway, so the pieces' tokens are the whole text's (tested against
encoding the whole text at once), and no piece holds more than a bounded stretch of the split.
Pieces never cross a document's start, so no token spans two documents. Batches of pieces are
encoded in parallel (``encode_batch``) over the threads the run may use.

With every token the validation split records what metrics across tokenizers need: how many
bytes of the text it covers (``token_bytes``: the bytes from the end of the previous token's
text to the end of its own, so the tokens of a split cover each byte exactly once) and how many
words start in those bytes (``word_starts``: a word is a maximal run of bytes that are not
ASCII whitespace). A byte corpus needs neither: each token is one byte.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from posbench.data.cache import ArrayWriter, build_entry, entry_path, read_entry
from posbench.data.corpus import Corpus, check_documents, unigram_bits
from posbench.errors import PosbenchError

log = logging.getLogger(__name__)

BYTES = "bytes"
BPE = "bpe"
BYTE_VOCAB = 256  # the vocabulary of data.tokenizer=bytes
# About this many bytes of text per piece: small enough for many pieces per batch (the
# parallel unit of encode_batch), large enough that a piece's overhead is small.
PIECE_BYTES = 1 << 16
PIECES_PER_BATCH = 32  # 2 MiB of text: its Encodings (ids, token strings) are tens of MB
WHITESPACE = np.zeros(256, dtype=bool)
WHITESPACE[list(b" \t\n\r\x0b\x0c")] = True
SPACE = ord(" ")
# A tokenized corpus's cache entry: its splits' token ids, each val token's bytes and words,
# and (optional) each split's document starts in tokens.
TOKEN_ARRAYS = ("train", "val", "val_token_bytes", "val_word_starts")
DOCUMENT_ARRAYS = ("train_documents", "val_documents")
# Bump when train_bpe's algorithm or settings change: its tokenizers are cached by this.
BPE_VERSION = 1


@dataclass
class TokenizerOptions:
    """The corpus configs' tokenizer keys."""

    # bytes | bpe | a path to a tokenizer.json | a Hugging Face hub name (gpt2, ...)
    tokenizer: str = BYTES
    vocab_size: int = 8192  # bpe: the vocabulary to train, the 256 bytes included


def tokenized_corpus(
    corpus: Corpus, byte_entry: Path, setting: str, vocab_size: int, cache_dir: str | None
) -> Corpus:
    """The byte ``corpus`` (cached at ``byte_entry``) as the tokens of the tokenizer
    ``setting`` names (``data.tokenizer``; ``vocab_size``: ``bpe``'s), from its cache entry
    (built first when the cache does not hold it). The entry is keyed by the byte entry and
    the tokenizer's JSON, so a run's own tokenizer.json finds the entry training built."""
    tokenizer = _tokenizer(corpus, byte_entry, setting, vocab_size, cache_dir)
    tokenizer_json = tokenizer.to_str()
    inputs = {"corpus": byte_entry.name, "tokenizer": tokenizer_digest(tokenizer_json)}
    entry = entry_path(cache_dir, "tokens", inputs)
    cached = read_entry(entry, TOKEN_ARRAYS, DOCUMENT_ARRAYS, _check_token_arrays)
    if cached is None:
        log.info("encoding corpus %r with tokenizer %r into %s", corpus.name, setting, entry)
        _encode_corpus(corpus, tokenizer, entry)
        cached = read_entry(entry, TOKEN_ARRAYS, DOCUMENT_ARRAYS, _check_token_arrays)
        assert cached is not None, f"{entry} was just built"
    arrays, meta = cached
    return Corpus(
        corpus.name,
        arrays["train"],
        arrays["val"],
        meta["stats"],
        arrays.get("train_documents"),
        arrays.get("val_documents"),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        tokenizer=tokenizer_json,
        val_token_bytes=arrays["val_token_bytes"],
        val_word_starts=arrays["val_word_starts"],
        has_words=corpus.has_words,
    )


def _tokenizer(
    corpus: Corpus, byte_entry: Path, setting: str, vocab_size: int, cache_dir: str | None
):
    """The tokenizer ``setting`` names: ``bpe`` trained on the train split (cached by the byte
    entry, the vocabulary size and BPE_VERSION), else a file or a hub name."""
    from tokenizers import Tokenizer

    if setting != BPE:
        return load_tokenizer(setting)
    inputs = {"corpus": byte_entry.name, "vocab_size": vocab_size, "version": BPE_VERSION}
    entry = entry_path(cache_dir, "bpe", inputs)
    cached = read_entry(entry, ())
    if cached is None:
        log.info("training a BPE of %d tokens on %r into %s", vocab_size, corpus.name, entry)
        with build_entry(entry) as build:
            trained = train_bpe(corpus.train, vocab_size, corpus.train_documents)
            build.meta["tokenizer"] = trained.to_str()
        cached = read_entry(entry, ())
        assert cached is not None, f"{entry} was just built"
    return Tokenizer.from_str(cached[1]["tokenizer"])


def _encode_corpus(corpus: Corpus, tokenizer, entry: Path) -> None:
    """Write ``corpus``'s splits as ``tokenizer``'s ids to the cache ``entry``, with each val
    token's bytes and words and each split's documents in tokens."""
    dtype = id_dtype(tokenizer.get_vocab_size(with_added_tokens=True))
    with build_entry(entry) as build:
        train_counts, train_documents = encode_split(
            tokenizer,
            corpus.train,
            corpus.train_documents,
            build.array("train", dtype),
            description="encoding train",
        )
        val_counts, val_documents = encode_split(
            tokenizer,
            corpus.val,
            corpus.val_documents,
            build.array("val", dtype),
            build.array("val_token_bytes", np.uint32),
            build.array("val_word_starts", np.uint32),
            description="encoding val",
        )
        for split, documents in (("train", train_documents), ("val", val_documents)):
            if documents is not None:
                build.write_array(f"{split}_documents", documents)
        # The unigram baseline in bits per byte: the token unigram's bits over the val bytes.
        bits = unigram_bits(train_counts, val_counts) * int(val_counts.sum())
        build.meta["stats"] = {"unigram_bits_per_byte": bits / len(corpus.val)}


def _check_token_arrays(arrays: dict[str, np.ndarray]) -> None:
    """Raise ValueError unless the val tokens' bytes and words are one per token and the
    documents are offsets into their split."""
    for name in ("val_token_bytes", "val_word_starts"):
        if len(arrays[name]) != len(arrays["val"]):
            raise ValueError(f"{name} has {len(arrays[name])} entries for {len(arrays['val'])}")
    for split in ("train", "val"):
        if f"{split}_documents" in arrays:
            check_documents(arrays[f"{split}_documents"], len(arrays[split]))


def train_bpe(train: np.ndarray, vocab_size: int, documents: np.ndarray | None = None):
    """A byte-level BPE (GPT-2's pre-tokenizer and byte alphabet) of ``vocab_size`` tokens
    trained on the bytes ``train`` (a training split, maybe a memory map), read a piece at a
    time; deterministic for the same bytes and size. Its memory grows with the distinct words
    of the text, not with its length."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < BYTE_VOCAB:
        raise PosbenchError(
            f"data.vocab_size must be at least {BYTE_VOCAB} for a byte-level BPE (got {vocab_size})"
        )
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,  # its own bar is not tqdm's; ours counts the bytes read
    )
    with tqdm(total=len(train), desc="training BPE", unit="B", unit_scale=True) as bar:

        def texts() -> Iterator[str]:
            for begin, end in pieces(train, documents):
                bar.update(end - begin)
                yield decoded(train[begin:end], begin)

        tokenizer.train_from_iterator(texts(), trainer, length=None)
    return tokenizer


def load_tokenizer(setting: str):
    """The tokenizer a ``data.tokenizer`` path (a ``tokenizer.json``) or hub name names."""
    from tokenizers import Tokenizer

    path = os.path.expanduser(setting)
    if os.path.isfile(path):
        try:
            return Tokenizer.from_file(path)
        except Exception as error:  # tokenizers raises bare Exceptions for a bad file
            raise PosbenchError(
                f"data.tokenizer '{setting}' is not a Hugging Face tokenizer.json ({error})"
            ) from None
    if setting.endswith(".json") or setting.startswith((".", "/", "~")):
        raise PosbenchError(f"data.tokenizer '{setting}': no such file")
    try:
        return Tokenizer.from_pretrained(setting)
    except Exception as error:  # offline, unknown, or gated: all one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise PosbenchError(
            f"data.tokenizer '{setting}' is neither a file nor a tokenizer in the local "
            f"Hugging Face cache, and fetching it from the hub failed ({first}); download it "
            "once online, or point data.tokenizer at a tokenizer.json"
        ) from None


def tokenizer_digest(tokenizer_json: str) -> str:
    """The SHA-256 of a tokenizer's JSON: what keys the corpora it encodes."""
    return hashlib.sha256(tokenizer_json.encode()).hexdigest()


def id_dtype(vocab_size: int) -> np.dtype:
    """uint16 where the vocabulary fits, else uint32."""
    return np.dtype(np.uint16 if vocab_size <= 1 << 16 else np.uint32)


def pieces(split: np.ndarray, documents: np.ndarray | None = None) -> Iterator[tuple[int, int]]:
    """[begin, end) of the pieces ``split`` is encoded in (see the module docstring): about
    PIECE_BYTES each, inside one document each, cut before a space between two characters
    that are not whitespace (a piece grows until it finds one, or ends with its document)."""
    starts = [0] if documents is None else documents.tolist()
    for begin, end in zip(starts, [*starts[1:], len(split)], strict=True):
        while begin < end:
            size = PIECE_BYTES
            while True:
                stop = min(begin + size, end)
                if stop == end:
                    break
                window = np.asarray(split[begin:stop])
                # spaces at k with non-whitespace at k - 1 and k + 1 (k in [1, n - 2])
                cuts = (window[1:-1] == SPACE) & ~WHITESPACE[window[:-2]] & ~WHITESPACE[window[2:]]
                found = np.flatnonzero(cuts)
                if len(found):
                    stop = begin + int(found[-1]) + 1
                    break
                size *= 2
            yield begin, stop
            begin = stop


def decoded(data: np.ndarray, offset: int) -> str:
    """The UTF-8 text of the bytes ``data`` (which start at ``offset`` of their split)."""
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as error:
        raise PosbenchError(
            f"the corpus is not UTF-8 text (byte {offset + error.start:,} of a split), which "
            "a tokenizer needs; use data.tokenizer=bytes for it"
        ) from None


def byte_is_whitespace(data: torch.Tensor) -> torch.Tensor:
    """Which of the bytes ``data`` (an integer tensor of any shape, on any device) are ASCII
    whitespace."""
    return torch.from_numpy(WHITESPACE).to(data.device)[data]


def word_start_mask(data: np.ndarray, after_whitespace: bool) -> np.ndarray:
    """(n,) bool: which of the bytes ``data`` start a word (a byte that is not whitespace after
    one that is; ``after_whitespace``: whether the byte before ``data[0]`` was whitespace)."""
    space = WHITESPACE[data]
    before = np.concatenate([[after_whitespace], space[:-1]])
    return ~space & before


def byte_lengths(tokenizer) -> np.ndarray | None:
    """How many bytes of text each token id covers, for a tokenizer whose tokens are byte
    strings (byte-level BPE, no normalizer: a table from id to length); None for any other,
    whose tokens' offsets say it."""
    from tokenizers import pre_tokenizers

    spec = json.loads(tokenizer.to_str())
    if (spec.get("decoder") or {}).get("type") != "ByteLevel" or spec.get("normalizer"):
        return None
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, index in tokenizer.get_vocab(with_added_tokens=True).items():
        if not set(token) <= alphabet:
            return None  # an added token in plain text: offsets say its bytes
        lengths[index] = len(token)  # one alphabet character per byte
    return lengths


def encode_split(
    tokenizer,
    split: np.ndarray,
    documents: np.ndarray | None,
    ids: ArrayWriter,
    token_bytes: ArrayWriter | None = None,
    word_starts: ArrayWriter | None = None,
    description: str = "encoding",
) -> tuple[np.ndarray, np.ndarray | None]:
    """Encode the bytes ``split`` (documents starting at ``documents``) into ``ids``, and when
    given each token's bytes and word starts (the module docstring), a batch of pieces at a
    time. Returns the token counts per id (for the unigram baseline) and the documents' starts
    in tokens (None without documents)."""
    by_table = byte_lengths(tokenizer)
    counts = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    token_documents: list[int] | None = [] if documents is not None else None
    document_starts = {0} if documents is None else set(documents.tolist())
    batch: list[tuple[int, int]] = []
    carry = 0  # bytes of a piece no token covered (whitespace a normalizer dropped): the next's

    def flush() -> None:
        nonlocal carry
        texts = [decoded(split[begin:end], begin) for begin, end in batch]
        # Without offsets, where the table says each token's bytes: faster.
        encode = tokenizer.encode_batch_fast if by_table is not None else tokenizer.encode_batch
        for (begin, end), text, encoding in zip(
            batch, texts, encode(texts, add_special_tokens=False), strict=True
        ):
            if token_documents is not None and begin in document_starts:
                token_documents.append(len(ids))
            values = np.asarray(encoding.ids, dtype=np.int64)
            ids.write(values)
            counts[:] += np.bincount(values, minlength=len(counts))
            if token_bytes is None or word_starts is None:
                continue
            if by_table is not None:
                ends = np.cumsum(by_table[values])
                assert not len(ends) or ends[-1] == end - begin, "byte tokens cover their text"
            else:
                ends = np.minimum(byte_ends(text, encoding.offsets), end - begin)
            if not len(ends):
                carry += end - begin  # (whitespace only: no word starts in it)
                continue
            ends[-1] = end - begin  # bytes after the last token's text (stripped) are its
            starts = np.concatenate([[0], ends[:-1]])
            after_whitespace = begin in document_starts or bool(WHITESPACE[split[begin - 1]])
            data = np.asarray(split[begin:end])
            words = np.concatenate([[0], np.cumsum(word_start_mask(data, after_whitespace))])
            covered = ends - starts
            covered[0] += carry
            carry = 0
            token_bytes.write(covered)
            word_starts.write(words[ends] - words[starts])
        batch.clear()

    with tqdm(total=len(split), desc=description, unit="B", unit_scale=True) as bar:
        for piece in pieces(split, documents):
            batch.append(piece)
            if len(batch) == PIECES_PER_BATCH:
                bar.update(batch[-1][1] - batch[0][0])
                flush()
        if batch:
            bar.update(batch[-1][1] - batch[0][0])
            flush()
    starts = None if token_documents is None else np.asarray(token_documents, dtype=np.int64)
    return counts, starts


def byte_ends(text: str, offsets: list[tuple[int, int]]) -> np.ndarray:
    """The byte offset in ``text``'s UTF-8 where each token's text ends, from its character
    ``offsets``, never decreasing."""
    code_points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (code_points >= 0x80) + (code_points >= 0x800) + (code_points >= 0x10000)
    byte_at = np.concatenate([[0], np.cumsum(widths)])  # (chars + 1,)
    char_ends = np.asarray([end for _, end in offsets], dtype=np.int64)
    return np.maximum.accumulate(byte_at[char_ends]) if len(char_ends) else char_ends
