"""Peak memory of evaluating one 16,384-token window, per encoding (default model: tiny).

    python benchmarks/long_eval_memory.py [--length 16384] [--batch-size 1] [--threads 2]

Each encoding runs in its own subprocess, so that its peak resident set size (RSS, what the
out-of-memory killer looks at; tracemalloc does not see torch's allocations) is its own. The
table shows the process's peak RSS after building the model (imports, weights), the peak
during posbench's evaluation of one length (forward pass and loss), and the model's own
estimate of what the forward pass adds (``Transformer.inference_memory_bytes``, which
``posbench eval`` checks against the available memory before it starts a length).
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
from posbench.evaluate import evaluate_length
from posbench.model import build_model

encoding, length, batch_size, threads = sys.argv[1], *map(int, sys.argv[2:5])
torch.set_num_threads(threads)
# As trained at 128 tokens (the extrapolation experiments): FIRE's threshold L is there.
cfg = compose_config([f"encoding={encoding}", "train.seq_len=128"])
torch.manual_seed(0)
model = build_model(cfg.model, cfg.encoding)
tokens = torch.randint(0, 256, (batch_size * length + 1,), dtype=torch.uint8)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB
record = evaluate_length(model, tokens, length, batch_size=batch_size)
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
estimate = model.inference_memory_bytes(batch_size, length)
status = record["status"]
print(json.dumps({"before": before, "peak": peak, "estimate": estimate, "status": status}))
"""


def measure(encoding: str, length: int, batch_size: int, threads: int) -> dict[str, int]:
    out = subprocess.run(
        [sys.executable, "-c", MEASURE, encoding, str(length), str(batch_size), str(threads)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", type=int, default=16384)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    mb = 2**20
    print(f"eval of one length at {args.length} tokens, batch {args.batch_size}, model tiny")
    print(f"{'encoding':<9} {'RSS before':>11} {'peak RSS':>9} {'added':>7} {'estimate':>9}")
    for encoding in ENCODINGS:
        m = measure(encoding, args.length, args.batch_size, args.threads)
        assert m["status"] == "ok", m
        print(
            f"{encoding:<9} {m['before'] / mb:>8.0f} MiB {m['peak'] / mb:>5.0f} MiB "
            f"{(m['peak'] - m['before']) / mb:>3.0f} MiB {m['estimate'] / mb:>5.0f} MiB"
        )


if __name__ == "__main__":
    main()
