"""Tokenized corpora: how fast posbench encodes a corpus against Hugging Face ``tokenizers``'
own ``encode_batch`` on the same text, and what a vocabulary of 8,192 tokens costs a training
step against bytes' 256 (tokens/s at the same shapes), in one process.

    python benchmarks/tokenizer.py encode [--text FILE] [--vocab 8192] [--rounds 3] [--threads 2]
    python benchmarks/tokenizer.py train [--vocab 8192] [--rounds 15] [--threads 1]
        [--model tiny|small|base] [--precision fp32|bf16] [--batch 32] [--seq-len 128]
    python benchmarks/tokenizer.py encode --quick      # a small, fast check that it runs

``encode`` trains a BPE of ``--vocab`` tokens on the text (``--text``, default WikiText-2's
validation file from ../shared/data when present, else generated words; the 2.2 MB of
WikiText-2's two files are read twice over), then times, in interleaved rounds, posbench's
``encode_split`` (pieces, ids, each token's bytes and word starts, written to disk) against
``encode_batch`` and ``encode_batch_fast`` of the same text cut into the same pieces (ids only,
nothing written). ``train`` times a training step of the model (``--model``, untrained) with
each vocabulary, its loss as posbench's training computes it (posbench.model.loss.next_token_nll),
and at ``--vocab`` also from the whole logits then cross-entropy (the path a CUDA device takes,
and a CPU took before the chunked loss), in peak memory too (one step of each, measured apart).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import numpy as np
import torch
from bias_attention import MODEL_SIZES
from long_eval_memory import peak_rss_bytes
from throughput import median_seconds

import posbench.model.loss
from posbench.data.cache import ArrayWriter
from posbench.data.tokenizer import encode_split, pieces, train_bpe
from posbench.model import build_model
from posbench.system.precision import autocast

WIKITEXT2 = Path(__file__).resolve().parents[2] / "shared" / "data" / "wikitext-2"


def benchmark_text(path: Path | None, quick: bool) -> bytes:
    """The text to encode: ``path``, WikiText-2 (both files, twice), or generated words."""
    if path is not None:
        return path.read_bytes()
    if WIKITEXT2.is_dir() and not quick:
        text = b"".join((WIKITEXT2 / name).read_bytes() for name in ("valid.txt", "test.txt"))
        return text * 2
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(2000)]
    lines = (" ".join(rng.choice(words, size=12)) for _ in range(2000 if quick else 100_000))
    return "\n".join(lines).encode()


def encode_rounds(text: bytes, vocab: int, rounds: int) -> dict[str, float]:
    """Median seconds of each way of encoding ``text``."""
    split = np.frombuffer(text, dtype=np.uint8)
    tokenizer = train_bpe(split, vocab)
    cut = [bytes(split[begin:end]).decode() for begin, end in pieces(split)]
    folder = Path(tempfile.mkdtemp())

    def posbench_encode() -> None:
        writers = [ArrayWriter(folder / f"{n}.bin", np.uint32) for n in ("ids", "bytes", "words")]
        encode_split(tokenizer, split, None, *writers)
        for writer in writers:
            writer.close()

    steps = {
        "posbench encode_split": posbench_encode,
        "tokenizers encode_batch": lambda: tokenizer.encode_batch(cut, add_special_tokens=False),
        "tokenizers encode_batch_fast": lambda: tokenizer.encode_batch_fast(
            cut, add_special_tokens=False
        ),
    }
    return median_seconds(steps, rounds)


LOGITS_WAY = "logits, then cross-entropy"


def training_steps(
    vocab: int, batch: int, seq_len: int, model: str, precision: str
) -> dict[str, Callable[[], None]]:
    """A training step of the untrained ``model`` (a MODEL_SIZES name) over 256 tokens, over
    ``vocab``, and over ``vocab`` with its loss computed the logits way (LOGITS_WAY)."""
    steps = {}
    for size, name in ((256, "256"), (vocab, f"{vocab:,}"), (vocab, f"{vocab:,}, {LOGITS_WAY}")):
        torch.manual_seed(0)
        network = build_model(MODEL_SIZES[model], {"name": "rope"}, size)
        optimizer = torch.optim.AdamW(network.parameters(), lr=1e-3)
        x = torch.randint(0, size, (batch, seq_len + 1))
        logits_way = name.endswith(LOGITS_WAY)

        def step(network=network, optimizer=optimizer, x=x, logits_way=logits_way) -> None:
            # posbench's loss off its chunked path, for the logits way's step only
            off = mock.patch.object(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
            with off if logits_way else contextlib.nullcontext(), autocast(precision, x.device):
                loss = network(x[:, :-1], targets=x[:, 1:])  # as posbench's training step
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        steps[f"vocabulary {name}"] = step
    return steps


def peak_memory_of_step(args: tuple[str, int, int, int, str, str, int]) -> int:
    """Peak RSS in bytes of a fresh process that runs three of training_steps' step ``name``."""
    name, vocab, batch, seq_len, model, precision, threads = args
    torch.set_num_threads(threads)
    step = training_steps(vocab, batch, seq_len, model, precision)[name]
    for _ in range(3):
        step()
    return peak_rss_bytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["encode", "train"])
    parser.add_argument("--text", type=Path, help="a UTF-8 text file to encode")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="default: 2 encode, 1 train")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--model", choices=list(MODEL_SIZES), default="tiny", help="train")
    parser.add_argument("--precision", choices=["fp32", "bf16"], default="fp32", help="train")
    parser.add_argument("--quick", action="store_true", help="small sizes: a check that it runs")
    args = parser.parse_args()
    threads = args.threads or (2 if args.what == "encode" else 1)
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # before tokenizers first encodes
    torch.set_num_threads(threads)
    if args.what == "encode":
        text = benchmark_text(args.text, args.quick)
        rounds = args.rounds or (1 if args.quick else 3)
        vocab = 512 if args.quick else args.vocab
        seconds = encode_rounds(text, vocab, rounds)
        print(f"{len(text) / 1e6:.1f} MB of text, vocabulary {vocab}, {threads} threads")
        baseline = seconds["tokenizers encode_batch"]
        print(f"{'encoder':<30}{'MB/s':>8}{'vs encode_batch':>17}")
        for name, value in seconds.items():
            print(f"{name:<30}{len(text) / 1e6 / value:>8.1f}{baseline / value:>16.2f}x")
        return
    rounds = args.rounds or (1 if args.quick else 15)
    batch, seq_len = (2, 16) if args.quick else (args.batch, args.seq_len)
    steps = training_steps(args.vocab, batch, seq_len, args.model, args.precision)
    # Each step's peak memory in a process of its own (a process's peak is its largest step's),
    # before this one's steps run: a child starts from its parent's peak (Linux keeps ru_maxrss
    # across fork and exec).
    spawn = multiprocessing.get_context("spawn")
    peaks = {}
    for name in steps:
        with spawn.Pool(1) as pool:
            case = (name, args.vocab, batch, seq_len, args.model, args.precision, threads)
            peaks[name] = pool.apply(peak_memory_of_step, (case,))
    seconds = median_seconds(steps, rounds)
    print(
        f"training step of the {args.model} model, {batch} x {seq_len} tokens, "
        f"{args.precision}, {threads} threads"
    )
    first = next(iter(seconds.values()))
    print(f"{'vocabulary':<48}{'tokens/s':>10}{'ratio':>8}{'peak MiB':>10}")
    for name, value in seconds.items():
        rate = batch * seq_len / value
        print(f"{name:<48}{rate:>10,.0f}{first / value:>8.2f}{peaks[name] / 2**20:>10,.0f}")


if __name__ == "__main__":
    main()
