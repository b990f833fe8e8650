"""The ``posbench`` command: a thin layer that turns flags into configs and results into tables.

posbench train [key=value ...] [-m ...]   Hydra app: compose conf/, train, evaluate
posbench eval --length N [--run DIR] ...  re-evaluate a trained run at other lengths
posbench report DIR [--out OUT]           tables, plot and TensorBoard comparison of a sweep
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import hydra
import torch
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import CompactHydraException, HydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.utils.tensorboard import SummaryWriter

from posbench.config import compose_config, config_dir, eval_lengths, register_schemas, validate
from posbench.encodings import encoding_names
from posbench.errors import PosbenchError
from posbench.evaluate import evaluate_run
from posbench.model import build_model
from posbench.output_dirs import register_unique_dir_resolver
from posbench.report import build_report, markdown, write_report
from posbench.runs import append_eval_results, latest_run, load_run_config
from posbench.tables import data_baselines, eval_table
from posbench.tensorboard_log import log_eval_records
from posbench.train import train

# Launchers (joblib, submitit) run train_job in fresh processes that import this module but
# never run main(); conf/config.yaml's ${unique_dir:...} directory names need the resolver there.
register_unique_dir_resolver()

KEY_OPTIONS = (
    "seed, device (auto|cpu|cuda), model.n_layer, model.n_head, model.d_model, "
    "train.seq_len, train.steps, train.batch_size, train.lr, eval.lengths, eval.stride"
)


def group_options(group: str) -> list[str]:
    """The options of a config group, as the YAML files in conf/<group>/ name them."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def main_help() -> str:
    return f"""usage: posbench {{train,eval,report}} ...

Train a small decoder-only transformer at a short context with a chosen positional
encoding, then measure perplexity at longer lengths ("train short, test long").

commands:
  train    train and evaluate; Hydra overrides key=value, -m for sweeps (posbench train --help)
  eval     re-evaluate a trained run at any length (posbench eval --help)
  report   compare the runs of a sweep: tables, plot, TensorBoard (posbench report --help)

encodings (encoding=...): {", ".join(encoding_names())}
models    (model=...):    {", ".join(group_options("model"))}
data      (data=...):     {", ".join(group_options("data"))}
key options: {KEY_OPTIONS}

examples:
  posbench train encoding=rope
  posbench train encoding=learned model=small train.seq_len=256 seed=3
  posbench train -m encoding=none,learned,sinusoidal,rope
  posbench train -m +experiment=extrapolation      # every encoding x 3 seeds
  posbench report outputs/multirun/<date>/<time>/
  posbench eval --length 2048
  posbench eval --length 1024 --length 4096 --run outputs/<date>/<time>_rope/
"""


def fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


# ---------------------------------------------------------------------------- train


def hydra_error_line(err: Exception) -> str:
    """One line for a Hydra/OmegaConf composition error (their messages span many lines)."""
    text = str(err)
    missing = re.search(r"Could not find '([^']+)/([^'/]+)'", text)
    if missing:
        group, option = missing.groups()
        options = re.findall(r"^\t(\S+)$", text, flags=re.MULTILINE)
        message = f"unknown {group} '{option}'; choose one of: {', '.join(options)}"
        if group == "hydra/launcher":
            message += " (joblib, submitit_*: pip install 'posbench[launchers]')"
        return message
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException | HydraException):
        lines.append(str(cause).strip().splitlines()[0])
    summary = lines[0].rstrip(".")
    if "Could not override" in summary or "Key '" in summary:
        summary += " (no such key; `posbench train --cfg job` lists every key)"
    elif len(lines) > 1:
        summary += f": {lines[-1]}"
    return summary


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Hydra's parse of ``overrides``; a key given twice keeps its last value, as in Hydra's
    basic sweeper."""
    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return list({o.get_key_element(): o for o in parsed}.values())


def expand_sweeps(overrides: Sequence[str]) -> list[list[str]]:
    """Override lists to check before a sweep starts: the fixed overrides plus, for each swept
    key, each of its values (linear in the number of values, not their product)."""
    parsed = parse_overrides(overrides)
    fixed = [o.input_line for o in parsed if not o.is_sweep_override()]
    variants = [
        [*fixed, f"{o.get_key_element()}={value}"]
        for o in parsed
        if o.is_sweep_override()
        for value in o.sweep_string_iterator()
    ]
    return variants or [fixed]


def check_overrides(overrides: Sequence[str], multirun: bool) -> None:
    """Compose (and validate) the config for ``overrides`` before Hydra starts any job, so a
    typo is one line here instead of a multi-line report or a failure deep in a sweep."""
    candidates = expand_sweeps(sweep_overrides(overrides)) if multirun else [list(overrides)]
    for candidate in candidates:
        cfg = compose_or_fail(candidate)
        validate(cfg)
        with torch.device("meta"):  # shapes only: checks the encoding fits the model, instantly
            build_model(cfg.model, cfg.encoding)


def sweep_overrides(overrides: Sequence[str]) -> list[str]:
    """What a multirun sweeps: the config's ``hydra.sweeper.params`` (set by experiments),
    then the command line, whose values win per key."""
    fixed = [o.input_line for o in parse_overrides(overrides) if not o.is_sweep_override()]
    params = compose_or_fail(fixed, with_hydra=True).hydra.sweeper.get("params") or {}
    return [*(f"{key}={value}" for key, value in params.items()), *overrides]


def compose_or_fail(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The composed config for ``overrides``, or a one-line error."""
    try:
        return compose_config(overrides, with_hydra)
    except (HydraException, OmegaConfBaseException) as err:
        fail(hydra_error_line(err))


class JobFailed(CompactHydraException):
    """A sweep job's user error; Hydra reports it in one line and the other jobs still run."""


def train_job(cfg: DictConfig) -> float | None:
    """Hydra's task function: one training run in Hydra's output directory."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        results = train(cfg, run_dir)
    except PosbenchError as err:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise JobFailed(str(err)) from None
        fail(str(err))
    print(f"\n{cfg.encoding.name} trained at {cfg.train.seq_len} -> {run_dir}")
    print(eval_table(results["eval"], cfg.train.seq_len))
    print(data_baselines(results["data"]))
    return results["train"]["val_ppl"]  # for optimising sweepers (e.g. Optuna)


def train_help(overrides: Sequence[str]) -> str:
    """``posbench train --help``: the config groups and the config these overrides compose."""
    groups = "\n".join(
        f"  {group:<9} {', '.join(group_options(group))}" for group in ("encoding", "model", "data")
    )
    cfg = compose_or_fail(overrides)
    return f"""usage: posbench train [KEY=VALUE ...] [-m KEY=A,B ...] [--cfg job] [--hydra-help]

Train at train.seq_len, evaluate at eval.lengths; writes outputs/<date>/<time>_<encoding>/.
Sweeps: -m (--multirun) runs one job per combination, e.g. -m encoding=rope,learned seed=0,1.

config groups (GROUP=OPTION):
{groups}

config (override any key with KEY=VALUE; key options: {KEY_OPTIONS}):
{OmegaConf.to_yaml(cfg).rstrip()}

Hydra's own flags (--cfg, --info, --multirun, hydra.* keys, launchers): posbench train --hydra-help
"""


def run_train(args: Sequence[str]) -> None:
    parsed = get_args_parser().parse_args(list(args))
    if parsed.help:
        print(train_help(parsed.overrides))
        return
    informational = parsed.hydra_help or parsed.cfg or parsed.info
    if not informational and not parsed.shell_completion:
        check_overrides(parsed.overrides, parsed.multirun)
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    sys.argv = ["posbench train", *args]
    app(train_job)()


# ----------------------------------------------------------------------------- eval


class OneLineParser(argparse.ArgumentParser):
    """argparse whose errors are one line (argparse prints usage first by default)."""

    def error(self, message: str) -> NoReturn:
        fail(f"{self.prog}: {message} (see {self.prog} --help)")


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def eval_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench eval",
        description="Re-evaluate a trained run at any length; appends to its results.json "
        "and TensorBoard.",
    )
    parser.add_argument(
        "--length",
        type=positive_int,
        action="append",
        metavar="N",
        help="evaluation length in tokens; repeat for several (default: the run's eval.lengths)",
    )
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="run directory (default: the newest run under ./outputs)",
    )
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
    return parser


def run_eval(args: Sequence[str]) -> None:
    options = eval_parser().parse_args(list(args))
    run_dir = options.run if options.run is not None else latest_run(Path("outputs"))
    cfg = load_run_config(run_dir)  # for the defaults; evaluate_run loads the weights
    lengths = options.length or eval_lengths(cfg)
    if options.stride is not None and options.stride > min(lengths):
        fail(f"--stride {options.stride} must not exceed the shortest --length ({min(lengths)})")
    records = evaluate_run(
        run_dir, lengths, options.stride, options.batch_size, options.device, options.max_tokens
    )
    append_eval_results(run_dir, records)
    with SummaryWriter(log_dir=str(run_dir)) as writer:
        log_eval_records(writer, records, cfg.train.seq_len)
    print(f"{cfg.encoding.name} trained at {cfg.train.seq_len} ({run_dir})")
    print(eval_table(records, cfg.train.seq_len))


# --------------------------------------------------------------------------- report


def report_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench report",
        description="Compare the runs below DIR (a multirun directory or any folder of runs): "
        "mean ± std perplexity over seeds per encoding and length, as Markdown (printed), "
        "CSV, JSON, a PNG plot and TensorBoard runs. Unfinished and diverged runs are listed, "
        "not averaged.",
    )
    parser.add_argument("dir", type=Path, metavar="DIR", help="searched recursively for runs")
    parser.add_argument(
        "--out", type=Path, metavar="OUT", help="output directory (default: DIR/report)"
    )
    return parser


def run_report(args: Sequence[str]) -> None:
    options = report_parser().parse_args(list(args))
    out = options.out if options.out is not None else options.dir / "report"
    report = build_report(options.dir, out)
    written = write_report(report, out)
    print(markdown(report))
    print("wrote " + ", ".join(str(path) for path in written))


# ----------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    register_schemas()
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    try:
        if command == "train":
            run_train(rest)
        elif command == "eval":
            run_eval(rest)
        elif command == "report":
            run_report(rest)
        elif command in (None, "-h", "--help", "help"):
            print(main_help())
        else:
            fail(f"unknown command {command!r}; use `posbench train`, `eval` or `report`")
    except PosbenchError as err:
        fail(str(err))


if __name__ == "__main__":
    main()
