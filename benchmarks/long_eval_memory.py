"""Peak memory of evaluating one 16,384-token window, per encoding (default model: tiny).

    python benchmarks/long_eval_memory.py [--length 16384] [--batch-size 1] [--threads 2]
                                          [--vocab 256] [--logits-way]

Each encoding runs in its own subprocess, so that its peak resident set size (RSS, what the
out-of-memory killer looks at; tracemalloc does not see torch's allocations) is its own. The
table shows the process's peak RSS after building the model (imports, weights), the peak
during posbench's evaluation of one length (forward pass and loss), and the model's own
estimate of what the forward pass adds (``posbench.evaluation.memory.inference_memory_bytes``, which
``posbench eval`` checks against the available memory before it starts a length).
``--vocab``: a tokenizer's vocabulary (default bytes'), whose logits dominate at 8,192;
``--logits-way``: with the (B, T, vocab) logits formed whole (CUDA's way, and posbench's
before the chunked NLL), not a chunk at a time (posbench.model.loss.next_token_nll).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import subprocess
import sys
from unittest import mock

import torch
from throughput import trained_encoding

import posbench.model.loss
from posbench.evaluation.memory import inference_memory_bytes
from posbench.evaluation.perplexity import evaluate_length
from posbench.model import build_model

ENCODINGS = ("none", "rope", "alibi", "t5", "kerple", "fire")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far (Linux reports it in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def measure_here(
    encoding: str, length: int, batch_size: int, vocab: int, logits_way: bool
) -> dict[str, int | str]:
    """The peaks of this process before and during the evaluation of one length, the model's
    estimate and the evaluation's status (run by ``measure`` in a fresh process)."""
    torch.manual_seed(0)
    # tiny, as trained at 128
    model = build_model({}, trained_encoding(encoding, 128, length), vocab_size=vocab)
    tokens = torch.randint(0, vocab, (batch_size * length + 1,))
    # A tokenizer's tokens: one byte and one word each (the counts do not change the memory).
    per_token = None if vocab == 256 else torch.ones_like(tokens, dtype=torch.uint8)
    # posbench's NLL off its chunked path for the logits way only
    whole = mock.patch.object(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
    with whole if logits_way else contextlib.nullcontext():
        before = peak_rss_bytes()
        record = evaluate_length(
            model,
            tokens,
            length,
            batch_size=batch_size,
            token_bytes=per_token,
            word_starts=per_token,
        )
        estimate = inference_memory_bytes(model, batch_size, length)
    return {
        "before": before,
        "peak": peak_rss_bytes(),
        "estimate": estimate,
        "status": record["status"],
    }


def measure(encoding: str, args: argparse.Namespace) -> dict:
    """measure_here in a fresh process, whose peak RSS is the encoding's own."""
    arguments = ["--encoding", encoding, "--length", str(args.length), "--vocab", str(args.vocab)]
    arguments += ["--threads", str(args.threads), "--batch-size", str(args.batch_size)]
    command = [sys.executable, __file__, *arguments, *(["--logits-way"] * args.logits_way)]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256, help="default: bytes' %(default)s")
    parser.add_argument("--logits-way", action="store_true", help="form the logits whole")
    parser.add_argument("--encodings", nargs="+", default=ENCODINGS, help="default: %(default)s")
    parser.add_argument("--encoding", help="measure this encoding in this process (internal)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoding:
        measured = measure_here(
            args.encoding, args.length, args.batch_size, args.vocab, args.logits_way
        )
        print(json.dumps(measured))
        return
    mb = 2**20
    way = "logits formed whole" if args.logits_way else "posbench's way"
    print(
        f"eval of one length at {args.length} tokens, batch {args.batch_size}, model tiny, "
        f"vocabulary {args.vocab}, {way}"
    )
    print(f"{'encoding':<9} {'RSS before':>11} {'peak RSS':>9} {'added':>7} {'estimate':>9}")
    for encoding in args.encodings:
        m = measure(encoding, args)
        assert m["status"] == "ok", m
        print(
            f"{encoding:<9} {m['before'] / mb:>8.0f} MiB {m['peak'] / mb:>5.0f} MiB "
            f"{(m['peak'] - m['before']) / mb:>3.0f} MiB {m['estimate'] / mb:>5.0f} MiB"
        )


if __name__ == "__main__":
    main()
