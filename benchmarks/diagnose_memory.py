"""Peak memory of ``posbench diagnose`` on one 16,384-token window, per encoding (model: tiny).

    python benchmarks/diagnose_memory.py [--length 16384] [--threads 2]

Target: under 2 GB per process at 16,384 tokens. Each encoding runs in its own subprocess so
that its peak resident set size (RSS; tracemalloc does not see torch's allocations) is its own.
The table shows the peak RSS after building the model, the peak during the diagnosis (the
forward pass with the recording hooks, then every layer's attention statistics in query
blocks), and posbench's own estimate of what the diagnosis adds
(``posbench.evaluation.diagnose.diagnosis_memory_bytes``, checked against the available memory
first).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import torch
from long_eval_memory import ENCODINGS, peak_rss_bytes
from throughput import trained_encoding

from posbench.evaluation.diagnose import diagnose, diagnosis_memory_bytes
from posbench.model import build_model


def measure_here(encoding: str, length: int) -> dict[str, int]:
    """The peaks of this process before and during the diagnosis and posbench's estimate (run
    by ``measure`` in a fresh process)."""
    torch.manual_seed(0)
    model = build_model({}, trained_encoding(encoding, 128, length))  # tiny, as trained at 128
    tokens = torch.randint(0, 256, (1, length))
    before = peak_rss_bytes()
    diagnose(model, tokens, train_seq_len=128)
    estimate = diagnosis_memory_bytes(model, length)
    return {"before": before, "peak": peak_rss_bytes(), "estimate": estimate}


def measure(encoding: str, length: int, threads: int) -> dict[str, int]:
    """measure_here in a fresh process, whose peak RSS is the encoding's own."""
    arguments = ["--encoding", encoding, "--length", str(length), "--threads", str(threads)]
    out = subprocess.check_output([sys.executable, __file__, *arguments], text=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384, help="tokens in the window")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    parser.add_argument("--encodings", nargs="+", default=ENCODINGS, help="default: %(default)s")
    parser.add_argument("--encoding", help="measure this encoding in this process (internal)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.encoding:
        print(json.dumps(measure_here(args.encoding, args.length)))
        return
    mb = 2**20
    print(f"posbench diagnose of one {args.length}-token window, model tiny (target: < 2048 MiB)")
    print("| encoding | RSS before (MiB) | peak RSS (MiB) | added (MiB) | estimate (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for encoding in args.encodings:
        m = measure(encoding, args.length, args.threads)
        added = m["peak"] - m["before"]
        print(
            f"| {encoding} | {m['before'] / mb:.0f} | {m['peak'] / mb:.0f} | {added / mb:.0f} | "
            f"{m['estimate'] / mb:.0f} |"
        )


if __name__ == "__main__":
    main()
