"""``posbench eval --length N [--run DIR] ...``: re-evaluate a trained run at other lengths,
optionally with eval-time RoPE scaling; the records go to its results.json and its logger."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from posbench.commands.arguments import (
    OneLineParser,
    add_run_argument,
    chosen_run,
    positive_int,
    scale_factor,
    threads_setting,
)
from posbench.commands.exits import fail
from posbench.config import EvalDecode, EvalPositions, check_logger, eval_lengths
from posbench.encodings.rope import SCALING_METHODS
from posbench.evaluation.longppl import LONGPPL_ALPHA, LONGPPL_BETA
from posbench.evaluation.reevaluate import check_rope_run, record_eval
from posbench.evaluation.run import evaluate_run, rope_scaling_overrides
from posbench.evaluation.temperature import TEMPERATURES
from posbench.model.position_remap import METHODS
from posbench.report.run_table import run_table, trained_at
from posbench.runs.directory import load_run_config
from posbench.runs.tensorboard_log import trained_lengths
from posbench.system.threads import AUTO, use_threads


def eval_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench eval",
        description="Re-evaluate a trained run at any length; appends to its results.json "
        "and its logger's view (TensorBoard, or a new W&B run of its group).",
    )
    parser.add_argument(
        "--length",
        type=positive_int,
        action="append",
        metavar="N",
        help="evaluation length in tokens of the run's tokenizer (bytes unless it trained with "
        "data.tokenizer), or the problem length of an algorithmic task (data=parity_check, "
        "...); repeat for several (default: the run's eval.lengths or eval.task_lengths)",
    )
    add_run_argument(parser)
    parser.add_argument(
        "--stride",
        type=positive_int,
        metavar="S",
        help="sliding windows advancing S tokens (default: non-overlapping windows)",
    )
    parser.add_argument("--batch-size", type=positive_int, metavar="B", help="windows per forward")
    parser.add_argument(
        "--max-tokens",
        type=positive_int,
        metavar="N",
        help="validation tokens scored per length (default: the run's eval.max_tokens)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    parser.add_argument(
        "--threads",
        type=threads_setting,
        default=AUTO,
        metavar="N",
        help="CPU threads: auto (the cores free of other work and other posbench jobs, divided "
        "among the jobs torchrun runs at once) or a positive integer, kept as given",
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="of the forward passes; log-probabilities are summed in fp32/fp64 either way "
        "(default: the run's eval.precision)",
    )
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        help="torch.compile the forward passes over a corpus's windows, once per length: the "
        "same numbers, its time recorded apart as compile_s; pays for long evaluations "
        "(default: the run's eval.compile, whatever its train.compile)",
    )
    parser.add_argument(
        "--positions",
        choices=[p.value for p in EvalPositions],
        help="where each window sits: consecutive (0..L-1), random (a sorted random subset of "
        "[0, train.random_positions), as randomized-positions training draws them) or auto "
        "(random for runs trained with train.random_positions); results.json records it as "
        '"positions" (default: the run\'s eval.positions)',
    )
    parser.add_argument(
        "--decode",
        choices=[d.value for d in EvalDecode],
        help="how a task's autoregressive answers are scored: greedy (decoded from the model's "
        "own argmax: accuracy per answer byte and sequence accuracy) or teacher_forced (no "
        "decoding: teacher_forced_accuracy and sequence_accuracy only); answers at "
        "placeholders are written in one forward pass, nothing to decode; results.json records "
        'it as "decode" (default: the run\'s eval.decode)',
    )
    parser.add_argument(
        "--rope-scaling",
        choices=list(SCALING_METHODS),
        metavar="METHOD",
        help="extend a rope run at eval time, without retraining: "
        "none (as trained), linear (position interpolation, Chen et al. 2023), "
        "ntk (base * s^(d/(d-2))), dynamic (HF's dynamic NTK: ntk with s' = s L / L0 - (s - 1) "
        "per length L past the training length L0, s = 1 without --factor), yarn (Peng et al. "
        "2023: per-frequency ramp + attention temperature), "
        "llama3 (Llama 3.1's smooth band interpolation), longrope (Phi-3's per-frequency "
        "factors, from the run's encoding.scaling.short_factor/long_factor); results.json "
        "records it as "
        '"scaling" next to the plain records (default: the run\'s own encoding.scaling)',
    )
    parser.add_argument(
        "--position-remap",
        choices=list(METHODS),
        metavar="METHOD",
        help="remap the far keys' positions at eval time, without retraining: none (as "
        "trained), self_extend (Jin et al. 2024: past a neighbour window W, positions grouped G "
        "to one; the run's eval.self_extend.group and .window) or string (An et al. 2024: keys "
        "S or more back shifted S - W closer; eval.string.shift and .window); rope runs, and "
        "string for alibi, t5, kerple and sandwich too; results.json records it as "
        '"position_remap" and "scaling" (default: the run\'s eval.position_remap)',
    )
    parser.add_argument(
        "--factor",
        type=scale_factor,
        metavar="S",
        help="the scaling factor s >= 1 for --rope-scaling (default: s = max(1, L / training "
        "length) at each length L; for dynamic, s = 1); results of different factors are "
        "kept side by side",
    )
    parser.add_argument(
        "--temperature",
        choices=list(TEMPERATURES),
        help="none (attention logits as trained) or fit (DroPE's logit temperature: "
        "beta = 1 + c ln(L / training length), c fitted again on a slice of the run's training "
        'split at the lengths that are multiples of it); results.json records it as "scaling" '
        '"temperature" with temperature_c (default: the run\'s eval.temperature)',
    )
    parser.add_argument(
        "--metric",
        choices=["ppl", "longppl"],
        default="ppl",
        help="ppl (the default), or also longppl: perplexity over the key tokens, those whose "
        "log-probability under --evaluator with the whole window exceeds that with the run's "
        "training length of context by --alpha and is above --beta (Fang et al. 2025); "
        'results.json records it as "longppl" beside "ppl"',
    )
    parser.add_argument(
        "--evaluator",
        type=Path,
        metavar="RUN",
        help="the run directory of the model that selects LongPPL's key tokens, trained on "
        "the same data and tokenizer (the run itself, or one that extrapolates)",
    )
    parser.add_argument(
        "--alpha",
        type=float,
        default=LONGPPL_ALPHA,
        help=f"LongPPL's long-short difference threshold in nats (default {LONGPPL_ALPHA:g})",
    )
    parser.add_argument(
        "--beta",
        type=float,
        default=LONGPPL_BETA,
        help=f"LongPPL's long-context log-likelihood threshold (default {LONGPPL_BETA:g})",
    )
    return parser


def run_eval(args: Sequence[str]) -> None:
    options = eval_parser().parse_args(list(args))
    if options.factor is not None and options.rope_scaling is None:
        fail("--factor needs --rope-scaling METHOD (see posbench eval --help)")
    if options.temperature == "fit" and options.rope_scaling not in (None, "none"):
        fail(
            "--temperature fit and --rope-scaling are two eval-time extensions and a record "
            "names one: evaluate them apart"
        )
    if (options.metric == "longppl") != (options.evaluator is not None):
        fail("--metric longppl and --evaluator RUN go together (see posbench eval --help)")
    run_dir = chosen_run(options)
    cfg = load_run_config(run_dir)  # for the defaults; evaluate_run loads the weights
    check_logger(cfg)
    lengths = options.length or eval_lengths(cfg)
    if options.stride is not None and options.stride > min(lengths):
        fail(f"--stride {options.stride} must not exceed the shortest --length ({min(lengths)})")
    overrides = None
    if options.rope_scaling is not None:
        check_rope_run(cfg, run_dir)
        overrides = rope_scaling_overrides(cfg, options.rope_scaling, options.factor)
    use_threads(options.threads)
    records = evaluate_run(
        run_dir,
        lengths,
        options.stride,
        options.batch_size,
        options.device,
        options.max_tokens,
        encoding_overrides=overrides,
        precision=options.precision,
        positions=options.positions,
        decode=options.decode,
        temperature=options.temperature,
        evaluator=options.evaluator,
        alpha=options.alpha,
        beta=options.beta,
        position_remap=options.position_remap,
        compiled=options.compile,
    )
    command = shlex.join(["posbench", "eval", *args])
    results = record_eval(run_dir, cfg, records, trained_lengths(cfg), command)
    print(f"{cfg.encoding.name} trained at {trained_at(cfg)} ({run_dir})")
    if options.rope_scaling not in (None, "none"):
        print(scaling_factors(options.rope_scaling, records))
    print(run_table(cfg, records, results))
    if options.evaluator is not None:
        print(longppl_lines(options.evaluator, records))


def longppl_lines(evaluator: Path, records: Sequence[dict[str, Any]]) -> str:
    """LongPPL at each length, with how many key tokens ``evaluator`` selected."""
    lines = [f"LongPPL, key tokens selected by {evaluator}:"]
    for r in records:
        if r["status"] == "ok":
            value = "null (no key token)" if r["longppl"] is None else f"{r['longppl']:.3f}"
            lines.append(f"  length {r['length']}: {value} over {r['key_tokens']} key tokens")
    return "\n".join(lines)


def scaling_factors(method: str, records: Sequence[dict[str, Any]]) -> str:
    """``yarn scaling factor s: 2 at length 256, 4 at 512``: what each length was scaled by
    (the table names the method only)."""
    factors = ", ".join(
        f"{r['scaling_factor']:g} at length {r['length']}"
        for r in records
        if r.get("scaling_factor") is not None
    )
    return f"{method} scaling factor s: {factors or 'none (no length was evaluated)'}"
