"""The GPU check's measurements: every encoding trained on one CUDA GPU, evaluated long.

    python benchmarks/gpu_check.py [--steps 300] [--length 16384] [--out DIR]

Run by benchmarks/gpu_check.sh after the CUDA tests. For each encoding, the default config
(model=tiny, data=synthetic, train.precision=auto, which is bf16 on a bf16 GPU) with
``device=cuda``:

1. a warm-up run (3 steps, one window at ``--length``), untimed: it compiles the kernels
   flex_attention needs at both lengths, so the measured numbers are steady-state ones;
2. ``train`` for ``--steps`` steps: training tokens/s and the peak GPU memory of training
   (with its validation and its evaluation at the training length), validation perplexity;
3. ``evaluate_run`` at ``--length``: perplexity, tokens/s and peak GPU memory.

rope is also trained in fp32, for auto's bf16 to be compared with. Prints one table row per run
and writes them to DIR/gpu_check.json. Exits non-zero when a run fails or a length that the
encoding represents was not measured, and when torch.compile would fall back to running
flex_attention unfused (its recompile limit), which would make the numbers meaningless.
"""

from __future__ import annotations

import argparse
import json
import logging
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch._dynamo

from posbench.config import compose_config
from posbench.encodings import encoding_names
from posbench.evaluate import evaluate_run
from posbench.train import train

MIB = 2**20
BOUNDED = {"learned"}  # a table of train.seq_len positions: longer lengths are unsupported
COLUMNS = (
    ("encoding", "encoding", "{}"),
    ("precision", "precision", "{}"),
    ("train tok/s", "train_tokens_per_s", "{:,.0f}"),
    ("train peak MiB", "train_peak_mib", "{:,.0f}"),
    ("val ppl", "val_ppl", "{:.3f}"),
    ("ppl at length", "eval_ppl", "{:.3f}"),
    ("eval tok/s", "eval_tokens_per_s", "{:,.0f}"),
    ("eval peak MiB", "eval_peak_mib", "{:,.0f}"),
)


def measured(work: Callable[[], Any]) -> tuple[Any, float, float]:
    """``work()``'s result, its wall seconds and the peak GPU memory it allocated (MiB)."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    result = work()
    torch.cuda.synchronize()
    return result, time.perf_counter() - started, torch.cuda.max_memory_allocated() / MIB


def check_run(encoding: str, precision: str, args: argparse.Namespace, scratch: Path) -> dict:
    """Warm up, train and evaluate one encoding in ``precision``; its row of the table."""
    torch._dynamo.reset()  # compiled as in a run of its own: the recompile limit is per process
    overrides = [f"encoding={encoding}", "device=cuda", f"train.precision={precision}"]
    # The measured run's shapes: batches of 32 x 128 (training, validation), 512 x 128 and
    # 4 x length (evaluation), so that no kernel is compiled while the clock runs.
    warm_up = [
        *overrides,
        "train.steps=3",
        "train.warmup_steps=1",
        f"eval.lengths=[128,{args.length}]",
        f"eval.max_tokens={4 * args.length}",
    ]
    train(compose_config(warm_up), scratch / f"warm-up-{encoding}-{precision}")
    cfg = compose_config([*overrides, f"train.steps={args.steps}", "eval.lengths=[128]"])
    run_dir = scratch / f"{encoding}-{precision}"
    results, _, train_peak = measured(lambda: train(cfg, run_dir))
    [record], seconds, eval_peak = measured(
        lambda: evaluate_run(run_dir, [args.length], device="cuda")
    )
    return {
        "encoding": encoding,
        "precision": results["precision"],
        "train_tokens_per_s": results["train"]["tokens_per_s"],
        "train_peak_mib": train_peak,
        "val_ppl": results["train"]["val_ppl"],
        "length": args.length,
        "eval_status": record["status"],
        "eval_reason": record["reason"],
        "eval_ppl": record["ppl"],
        "eval_tokens_per_s": record["tokens"] / seconds if record["status"] == "ok" else None,
        "eval_peak_mib": eval_peak,
    }


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (a length not measured shows its status)."""
    lines = [
        "| " + " | ".join(title for title, _, _ in COLUMNS) + " |",
        "|" + " --- |" * len(COLUMNS),
    ]
    for row in rows:
        cells = [
            form.format(row[key]) if row[key] is not None else row["eval_status"]
            for _, key, form in COLUMNS
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def failures(rows: list[dict]) -> list[str]:
    """Why the check failed: a length the encoding represents but that was not measured."""
    return [
        f"{row['encoding']} ({row['precision']}): {row['eval_status']} at {row['length']}: "
        f"{row['eval_reason']}"
        for row in rows
        if row["eval_status"] != "ok" and row["encoding"] not in BOUNDED
    ]


def precision_ratio(rows: list[dict]) -> str:
    """rope's training tokens/s in what auto picked, as a ratio to fp32's."""
    auto, fp32 = (row for row in rows if row["encoding"] == "rope")
    if auto["precision"] == "fp32":
        return "auto picked fp32 on this GPU (no bf16)"
    ratio = auto["train_tokens_per_s"] / fp32["train_tokens_per_s"]
    return f"rope training tokens/s, {auto['precision']} (auto) / fp32: {ratio:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per encoding")
    parser.add_argument("--length", type=int, default=16384, help="evaluation length")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("FAIL: torch sees no CUDA GPU; the GPU check needs one")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never silently unfused
    runs = [(name, "auto") for name in encoding_names()] + [("rope", "fp32")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="posbench-gpu-check-") as scratch:
        for encoding, precision in runs:
            started = time.perf_counter()
            rows.append(check_run(encoding, precision, args, Path(scratch)))
            print(f"{encoding} ({precision}): {time.perf_counter() - started:.0f} s", flush=True)
    print(f"\n{args.steps} training steps, evaluation at {args.length:,} tokens:\n")
    print(table(rows))
    print(f"\n{precision_ratio(rows)}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(rows, indent=2) + "\n")
    if problems := failures(rows):
        raise SystemExit("FAIL: " + "; ".join(problems))


if __name__ == "__main__":
    main()
