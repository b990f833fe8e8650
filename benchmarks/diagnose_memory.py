"""Peak memory of ``posbench diagnose`` on one 16,384-token window, per encoding (model: tiny).

    python benchmarks/diagnose_memory.py [--length 16384] [--threads 2]

Target: under 2 GB per process at 16,384 tokens. Each encoding runs in its own subprocess so
that its peak resident set size (RSS; tracemalloc does not see torch's allocations) is its own.
The table shows the peak RSS after building the model, the peak during the diagnosis (the
forward pass with the recording hooks, then every layer's attention statistics in query
blocks), and posbench's own estimate of what the diagnosis adds
(``posbench.diagnose.diagnosis_memory_bytes``, checked against the available memory first).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

ENCODINGS = ("none", "rope", "alibi", "t5", "kerple", "fire")

MEASURE = """
import json, resource, sys, torch
from posbench.config import compose_config
from posbench.diagnose import diagnose, diagnosis_memory_bytes
from posbench.model import build_model

encoding, length, threads = sys.argv[1], *map(int, sys.argv[2:4])
torch.set_num_threads(threads)
# As trained at 128 tokens (the extrapolation experiments): FIRE's threshold L is there.
cfg = compose_config([f"encoding={encoding}", "train.seq_len=128"])
torch.manual_seed(0)
model = build_model(cfg.model, cfg.encoding)
tokens = torch.randint(0, 256, (1, length))
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
diagnose(model, tokens, train_seq_len=128)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
estimate = diagnosis_memory_bytes(model, length)
print(json.dumps({"before": before, "peak": peak, "estimate": estimate}))
"""


def measure(encoding: str, length: int, threads: int) -> dict[str, int]:
    """Peak RSS before and during the diagnosis, and the estimate, from a fresh process."""
    arguments = [encoding, str(length), str(threads)]
    out = subprocess.check_output([sys.executable, "-c", MEASURE, *arguments], text=True)
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384, help="tokens in the window")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per process")
    args = parser.parse_args()
    mb = 2**20
    print(f"posbench diagnose of one {args.length}-token window, model tiny (target: < 2048 MiB)")
    print("| encoding | RSS before (MiB) | peak RSS (MiB) | added (MiB) | estimate (MiB) |")
    print("| --- | --- | --- | --- | --- |")
    for encoding in ENCODINGS:
        m = measure(encoding, args.length, args.threads)
        added = m["peak"] - m["before"]
        print(
            f"| {encoding} | {m['before'] / mb:.0f} | {m['peak'] / mb:.0f} | {added / mb:.0f} | "
            f"{m['estimate'] / mb:.0f} |"
        )


if __name__ == "__main__":
    main()
