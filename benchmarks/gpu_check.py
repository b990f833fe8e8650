"""The GPU check's measurements: every encoding trained on one CUDA GPU, evaluated long.

    python benchmarks/gpu_check.py [--steps 300] [--length 16384] [--out DIR]

Run by benchmarks/gpu_check.sh after the CUDA tests. For each encoding, the default config
(model=tiny, data=synthetic, train.precision=auto: fp32 at tiny on a GPU,
posbench/system/precision.py) with ``device=cuda``:

1. a warm-up run (3 steps, one window at ``--length``), untimed: it compiles the kernels
   flex_attention needs at both lengths, so the measured numbers are steady-state ones (and
   before the first encoding, one whole untimed check: the first of a process ran slow);
2. ``train`` for ``--steps`` steps: training tokens/s and the peak GPU memory of training
   (with its validation and its evaluation at the training length), validation perplexity;
3. ``evaluate_run`` at ``--length``: perplexity, tokens/s and peak GPU memory.

rope is also trained in the precision auto did not pick (bf16 or fp32), for the two to be
compared. ``--encodings a,b`` checks those alone (default: every registered one). Prints one
table row per run and rewrites DIR/gpu_check.json after each run, so a check stopped by its
time limit keeps the rows it measured. Exits non-zero when a run fails or a length that the
encoding represents was not measured, and when torch.compile would fall back to running
flex_attention unfused (its recompile limit), which would make the numbers meaningless.
"""

from __future__ import annotations

import argparse
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
from posbench.evaluation.run import evaluate_run
from posbench.system.atomic import write_json
from posbench.system.precision import resolve_precision
from posbench.training.train import train

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
    """rope's training tokens/s in bf16 as a ratio to fp32's, and which one auto picked."""
    rope = {row["precision"]: row for row in rows if row["encoding"] == "rope"}
    ratio = rope["bf16"]["train_tokens_per_s"] / rope["fp32"]["train_tokens_per_s"]
    return f"rope training tokens/s, bf16 / fp32: {ratio:.2f} (auto picks {rows[0]['precision']})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="training steps per encoding")
    parser.add_argument("--length", type=int, default=16384, help="evaluation length")
    parser.add_argument("--out", type=Path, default=Path("outputs/gpu_check"))
    parser.add_argument(
        "--encodings",
        type=lambda names: names.split(","),
        default=encoding_names(),
        help="comma-separated encodings to check (default: every registered one)",
    )
    args = parser.parse_args()
    if unknown := sorted(set(args.encodings) - set(encoding_names())):
        parser.error(f"unknown encodings {unknown}; choose from {', '.join(encoding_names())}")
    if not torch.cuda.is_available():
        raise SystemExit("FAIL: torch sees no CUDA GPU; the GPU check needs one")
    if not torch.cuda.is_bf16_supported():
        raise SystemExit("FAIL: this GPU has no bf16; the GPU check compares bf16 with fp32")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    torch._dynamo.config.fail_on_recompile_limit_hit = True  # never silently unfused
    runs = [(name, "auto") for name in args.encodings]
    if "rope" in args.encodings:  # and in the precision auto does not pick, for the ratio
        d_model = compose_config().model.d_model
        auto = resolve_precision("auto", torch.device("cuda"), d_model)
        runs.append(("rope", "fp32" if auto == "bf16" else "bf16"))
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="posbench-gpu-check-") as scratch:
        # The first check of a process trained at a quarter to a third of the tokens/s the same
        # encoding reached later in it (H200, torch 2.11, 2026-12-04: alibi 92,925 first and
        # 489,561 second, t5 119,181 first and 349,606 second), warm-up run or not: one
        # untimed check first, its row dropped.
        check_run(*runs[0], args, Path(scratch) / "process-warm-up")
        for encoding, precision in runs:
            started = time.perf_counter()
            rows.append(check_run(encoding, precision, args, Path(scratch)))
            print(f"{encoding} ({precision}): {time.perf_counter() - started:.0f} s", flush=True)
            print(table(rows[-1:]).splitlines()[-1], flush=True)
            write_json(args.out / "gpu_check.json", rows)
    print(f"\n{args.steps} training steps, evaluation at {args.length:,} tokens:\n")
    print(table(rows))
    if "rope" in args.encodings:
        print(f"\n{precision_ratio(rows)}")
    if problems := failures(rows):
        raise SystemExit("FAIL: " + "; ".join(problems))


if __name__ == "__main__":
    main()
