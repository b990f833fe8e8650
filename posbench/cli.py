"""The ``posbench`` command: a thin layer that turns flags into configs and results into tables.

posbench train [key=value ...] [-m ...]   Hydra app: compose conf/, train, evaluate
posbench eval --length N [--run DIR] ...  re-evaluate a trained run at other lengths
posbench report DIR [--out OUT]           tables, plot and TensorBoard comparison of a sweep
posbench diagnose --length N [--run DIR]  attention statistics by position (posbench/diagnose.py)
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import shlex
import shutil
import signal
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import CompactHydraException, HydraException, OverrideParseException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.distributed import DistError

from posbench import distributed
from posbench.checkpoint import CHECKPOINT_FILE
from posbench.config import (
    EvalPositions,
    compose_config,
    config_dir,
    eval_lengths,
    flat_config,
    register_schemas,
    validate,
)
from posbench.diagnose import diagnose_run, summary_table
from posbench.encodings import encoding_names
from posbench.encodings.rope import SCALING_METHODS
from posbench.errors import PosbenchError
from posbench.evaluate import evaluate_run, rope_scaling_overrides
from posbench.model import check_model_config
from posbench.output_dirs import register_unique_dir_resolver, unclaimed
from posbench.reevaluate import default_run, record_eval
from posbench.report import build_report, markdown, write_report
from posbench.runs import CONFIG_FILE, check_can_create, load_run_config, saved_config
from posbench.signals import handling
from posbench.tables import data_baselines, eval_table
from posbench.threads import AUTO, use_threads
from posbench.train import TrainingInterrupted, train

# Launchers (joblib, submitit) run train_job in fresh processes that import this module but
# never run main(); conf/config.yaml's ${unique_dir:...} directory names need the resolver there.
register_unique_dir_resolver()

KEY_OPTIONS = (
    "seed, device (auto|cpu|cuda), threads (auto|N), model.n_layer, model.n_head, model.d_model, "
    "train.seq_len, train.steps, train.batch_size, train.lr, eval.lengths, eval.stride"
)


def group_options(group: str) -> list[str]:
    """The options of a config group, as the YAML files in conf/<group>/ name them."""
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


def main_help() -> str:
    return f"""usage: posbench [--debug] {{train,eval,report,diagnose}} ...

Train a small decoder-only transformer at a short context with a chosen positional
encoding, then measure perplexity at longer lengths ("train short, test long").

commands:
  train    train and evaluate; Hydra overrides key=value, -m for sweeps (posbench train --help)
  eval     re-evaluate a trained run at any length (posbench eval --help)
  report   compare the runs of a sweep: tables, plot, TensorBoard (posbench report --help)
  diagnose attention entropy, distance, sink and mass beyond the training length by query
           position, per layer and head (posbench diagnose --help)

--debug (or HYDRA_FULL_ERROR=1) shows the traceback behind an error message.

encodings (encoding=...): {", ".join(encoding_names())}
models    (model=...):    {", ".join(group_options("model"))}
data      (data=...):     {", ".join(group_options("data"))}
sweeps    (-m +experiment=...): {", ".join(group_options("experiment"))}
key options: {KEY_OPTIONS}

examples:
  posbench train encoding=rope
  posbench train encoding=learned model=small train.seq_len=256 seed=3
  posbench train -m encoding=none,learned,sinusoidal,rope
  posbench train --resume outputs/<date>/<time>_rope/
  posbench train -m +experiment=extrapolation      # every encoding x 3 seeds
  posbench report outputs/multirun/<date>/<time>/
  posbench eval --length 2048
  posbench eval --length 1024 --length 4096 --run outputs/<date>/<time>_rope/
  posbench eval --length 8192 --rope-scaling yarn --factor 8
  posbench diagnose --length 2048 --run outputs/<date>/<time>_alibi/
"""


def fail(message: str) -> NoReturn:
    say(f"error: {message}")
    raise SystemExit(2)


def say(message: str) -> None:
    """``message`` on stderr; from rank 0 only when torchrun or SLURM runs several ranks: they
    all meet the same mistakes, and one that rank 0 alone meets stops the others quietly
    (distributed.PeerFailed)."""
    if distributed.is_main():
        print(message, file=sys.stderr)


def debugging() -> bool:
    """``--debug`` sets HYDRA_FULL_ERROR, so Hydra shows full tracebacks too."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


def report(err: BaseException) -> NoReturn:
    """``err`` as one line (and its traceback first under --debug), exit 2."""
    if debugging():
        traceback.print_exception(err)
    fail(str(err) or type(err).__name__)


def stop(message: str, exit_code: int) -> NoReturn:
    """A deliberate stop (a signal): one line, the shell's exit code for that signal."""
    say(message)
    raise SystemExit(exit_code)


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, SLURM pre-emption) outside the training loop, which handles it
    itself: it unwinds like Ctrl-C, so the same clean-up runs, and exits 143."""


def raise_terminated(signum: int, frame: object) -> NoReturn:
    raise Terminated


def stop_interrupted(err: KeyboardInterrupt, detail: str = "") -> NoReturn:
    """One line for Ctrl-C (exit 130) or SIGTERM (exit 143), ``detail`` appended."""
    if isinstance(err, Terminated):
        stop(f"terminated{detail}", 128 + signal.SIGTERM)
    stop(f"interrupted{detail}", 128 + signal.SIGINT)


# ---------------------------------------------------------------------------- train


def hydra_error_line(err: Exception, overrides: Sequence[str] = ()) -> str:
    """One line for a Hydra/OmegaConf composition error (their messages span many lines) of
    the command line ``overrides``."""
    if isinstance(err, OverrideParseException):
        return parse_error_line(err, overrides)
    text = str(err)
    ambiguous = re.match(r"Ambiguous value for argument '([^']+)'", text)
    if ambiguous:
        return ambiguous_sweep_line(ambiguous.group(1))
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
        unknown = re.search(r"Could not override '([^']+)'", summary)
        hint = unknown_key_hint(unknown.group(1), overrides) if unknown else NO_SUCH_KEY
        summary += f" ({hint})"
    elif len(lines) > 1:
        summary += f": {lines[-1]}"
    return summary


LIST_KEYS = "`posbench train --cfg job` lists every key"
NO_SUCH_KEY = f"no such key; {LIST_KEYS}"


def unknown_key_hint(key: str, overrides: Sequence[str]) -> str:
    """What to do about ``key``, which the config that the other ``overrides`` compose lacks:
    choose the option of its group that has it (``data.path``: ``data=text``), else the most
    alike key of that config (so a group's options count: ``encoding=t5
    encoding.num_bucket=8``)."""
    parsed = parse_overrides(overrides)
    others = [o.input_line for o in parsed if o.key_or_group != key]
    try:
        cfg = compose_config(others, with_hydra=True)
    except (HydraException, OmegaConfBaseException):  # another mistake: the default keys
        cfg = compose_config([], with_hydra=True)
    group = key.partition(".")[0]
    chosen = cfg.hydra.runtime.choices.get(group)
    having = options_with_key(group, key) if chosen is not None else []
    if having:
        options = " or ".join(f"{group}={option}" for option in having)
        override = next((o.input_line for o in parsed if o.key_or_group == key), f"{key}=...")
        fix = f"{group}={having[0]} {override}"
        return f"{key} is a key of {options}, not of {group}={chosen}: use `{fix}`"
    ours = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # hydra.*: run time
    matches = difflib.get_close_matches(key, flat_config(ours), n=1)
    return f"no such key; did you mean {matches[0]}? {LIST_KEYS}" if matches else NO_SUCH_KEY


def options_with_key(group: str, key: str) -> list[str]:
    """The options of config group ``group`` whose config has ``key``."""
    having = []
    for option in group_options(group):
        try:
            cfg = compose_config([f"{group}={option}"])
        except (HydraException, OmegaConfBaseException):  # not a group the defaults choose from
            continue
        if key in flat_config(cfg):
            having.append(option)
    return having


LEXER_ERROR = "LexerNoViableAltException: "


def parse_error_line(err: OverrideParseException, overrides: Sequence[str]) -> str:
    """One line for an override that Hydra's grammar rejects: why (Hydra's reason, without
    the grammar's token names) and how to write it."""
    *details, see = str(err).splitlines()  # the last line: "See <the grammar's page> for details"
    if details[0].startswith(LEXER_ERROR):  # the line below it marks the first unreadable char
        reason = f"unexpected {err.override[details[-1].index('^') - len(LEXER_ERROR) :]!r}"
    else:
        reason = re.sub(r" expecting \{.*\}$", "", details[-1])
    fix = override_fix(err.override, overrides)
    return f"cannot parse the override {err.override!r} ({reason}): {fix} (see {see.split()[1]})"


def override_fix(override: str, overrides: Sequence[str]) -> str:
    """How to write the unparsable ``override``, where the mistake is clear: a sweep split at a
    space (``encoding=rope, alibi``), a group's option without its group (``alibi``)."""
    given = list(overrides)
    after = given[given.index(override) + 1 :] if override in given else []
    if override.endswith(",") and after:
        return f"did you mean {override}{after[0]}? A sweep's values are one word, no spaces"
    groups = [group for group in ("encoding", "model", "data") if override in group_options(group)]
    if groups:
        return "did you mean " + " or ".join(f"{group}={override}" for group in groups) + "?"
    return "write key=value, key=a,b for a sweep (with -m), key=[a,b] for a list"


def ambiguous_sweep_line(override: str) -> str:
    """One line for ``key=a,b`` without ``-m``: Hydra's three readings of it, for this key."""
    key, _, values = override.partition("=")
    return (
        f"{override} is ambiguous: write {key}=[{values}] for a list, "
        f"\"{key}='{values}'\" for a string, or add -m to sweep over {values.replace(',', ', ')}"
    )


def parse_overrides(overrides: Sequence[str]) -> list[Override]:
    """Hydra's parse of ``overrides``; a key given twice keeps its last value, as in Hydra's
    basic sweeper."""
    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except OverrideParseException as err:
        raise PosbenchError(parse_error_line(err, overrides)) from err
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
        cfg = compose_or_fail(candidate, with_hydra=True)
        validate(cfg)
        check_model_config(cfg.model, cfg.encoding)
        with unclaimed():  # Hydra claims the directory when the job starts
            check_can_create(Path(cfg.hydra.sweep.dir if multirun else cfg.hydra.run.dir))


def sweep_overrides(overrides: Sequence[str]) -> list[str]:
    """What a multirun sweeps: the config's ``hydra.sweeper.params`` (set by experiments),
    then the command line, whose values win per key. The params are read with the fixed group
    choices and hydra keys only: a value such as ``data.digits=3`` may belong to a group
    choice (``data=passkey``) that only the sweep makes."""
    fixed = [
        o.input_line
        for o in parse_overrides(overrides)
        if not o.is_sweep_override()
        and ("." not in o.get_key_element() or o.get_key_element().startswith("hydra."))
    ]
    params = compose_or_fail(fixed, with_hydra=True).hydra.sweeper.get("params") or {}
    return [*(f"{key}={value}" for key, value in params.items()), *overrides]


def compose_or_fail(overrides: Sequence[str], with_hydra: bool = False) -> DictConfig:
    """The composed config for ``overrides``, or a one-line error."""
    try:
        return compose_config(overrides, with_hydra)
    except (HydraException, OmegaConfBaseException) as err:
        fail(hydra_error_line(err, overrides))


class JobFailed(CompactHydraException):
    """A sweep job's user error; Hydra reports it in one line and the other jobs still run."""


def train_job(cfg: DictConfig) -> float | None:
    """Hydra's task function: one training run in Hydra's output directory."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resume_hint = f"resume with: posbench train --resume {shlex.quote(str(run_dir))}"
    try:
        if cfg.train.resume:
            cfg = resumed_config(cfg, run_dir)
        results = train(cfg, run_dir)
    except TrainingInterrupted as err:
        stop(f"interrupted: {err}; {resume_hint}", err.exit_code)
    except KeyboardInterrupt as err:  # outside the training loop: loading data, evaluating
        remove_if_worthless(run_dir)
        saved = (run_dir / CHECKPOINT_FILE).is_file()
        stop_interrupted(err, f"; {resume_hint}" if saved else "")
    except PosbenchError as err:
        remove_if_worthless(run_dir)
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise JobFailed(str(err)) from None
        report(err)
    except distributed.PeerFailed:
        raise SystemExit(1) from None  # rank 0 said why
    except (DistError, RuntimeError) as err:
        reason = distributed.lost_contact(err)
        if reason is None:
            raise
        report(PosbenchError(f"lost the other ranks ({reason}): one failed or timed out"))
    if distributed.is_main():
        print(f"\n{cfg.encoding.name} trained at {cfg.train.seq_len} -> {run_dir}")
        print(eval_table(results["eval"], cfg.train.seq_len))
        print(data_baselines(results["data"]))
    return results["train"]["val_ppl"]  # for optimising sweepers (e.g. Optuna)


def resumed_config(cfg: DictConfig, run_dir: Path) -> DictConfig:
    """With ``train.resume``: the run's saved config with only the keys this command line
    sets put on top, so a resume need not repeat the run's overrides (train() refuses those
    that would change the result). Without a checkpoint yet, the composed config as is."""
    if not (run_dir / CHECKPOINT_FILE).is_file():
        return cfg
    resumed = saved_config(run_dir)
    for key in cfg.keys() - resumed.keys():  # added to posbench after the run was saved
        resumed[key] = cfg[key]
    for override in OverridesParser.create().parse_overrides(HydraConfig.get().overrides.task):
        key = override.get_key_element().lstrip("+~")
        if not key.startswith("hydra."):
            OmegaConf.update(resumed, key, OmegaConf.select(cfg, key), merge=False)
    return resumed


def remove_if_worthless(run_dir: Path) -> None:
    """Remove the directory of a run that failed before writing a checkpoint, weights or
    results, when it holds only what Hydra and posbench put there at the start (never the
    current directory, nor one holding anything else). Only rank 0 decides: the directory is
    theirs in common."""
    if not distributed.is_main():
        return
    created_at_start = {".hydra", f"{HydraConfig.get().job.name}.log", CONFIG_FILE}
    names = {p.name for p in run_dir.iterdir()} if run_dir.is_dir() else set()
    leftovers = {n for n in names if n not in created_at_start and "tfevents" not in n}
    if names and not leftovers and not Path.cwd().resolve().is_relative_to(run_dir.resolve()):
        shutil.rmtree(run_dir, ignore_errors=True)
        remove_empty_parents(run_dir)


def remove_empty_parents(path: Path) -> None:
    """Remove the directories above ``path`` that it alone filled (outputs/<date>/), up to
    the current directory."""
    cwd = Path.cwd().resolve()
    for parent in path.resolve().parents:
        if parent == cwd or not parent.is_relative_to(cwd) or any(parent.iterdir()):
            return
        parent.rmdir()


def train_help(overrides: Sequence[str]) -> str:
    """``posbench train --help``: the config groups and the config these overrides compose."""
    groups = "\n".join(
        f"  {group:<10} {', '.join(group_options(group))}"
        for group in ("encoding", "model", "data", "experiment")
    )
    cfg = compose_or_fail(overrides)
    return f"""usage: posbench train [KEY=VALUE ...] [-m KEY=A,B ...] [--resume DIR] [--debug]
                      [--cfg job] [--hydra-help]

Train at train.seq_len, evaluate at eval.lengths; writes outputs/<date>/<time>_<encoding>/.
Sweeps: -m (--multirun) runs one job per combination, e.g. -m encoding=rope,learned seed=0,1.
Resume: --resume DIR continues DIR from its checkpoint.pt (Ctrl-C/SIGTERM write one and
print this command); with train.steps=N it extends a finished run.

config groups (GROUP=OPTION; experiments are sweeps: -m +experiment=OPTION):
{groups}

config (override any key with KEY=VALUE; key options: {KEY_OPTIONS}):
{OmegaConf.to_yaml(cfg).rstrip()}

Hydra's own flags (--cfg, --info, --multirun, hydra.* keys, launchers): posbench train --hydra-help
"""


def resume_arguments(args: Sequence[str]) -> list[str]:
    """``--resume DIR`` as the Hydra overrides that continue DIR's run in DIR."""
    args = list(args)
    if "--resume" not in args:
        return args
    at = args.index("--resume")
    if at + 1 == len(args) or "=" in args[at + 1]:
        fail("--resume needs the run directory: posbench train --resume DIR [train.steps=N]")
    run_dir = Path(args[at + 1])
    if not (run_dir / CHECKPOINT_FILE).is_file():
        fail(f"{run_dir} holds no {CHECKPOINT_FILE} to resume from; pass a run directory")
    if "-m" in args or "--multirun" in args:
        fail("--resume takes one run; resume a sweep with train.resume=true hydra.sweep.dir=DIR")
    return [*args[:at], *args[at + 2 :], f"hydra.run.dir='{run_dir}'", "train.resume=true"]


def run_train(args: Sequence[str]) -> None:
    args = resume_arguments(args)
    parsed = get_args_parser().parse_args(args)
    if parsed.help:
        print(train_help(parsed.overrides))
        return
    informational = parsed.hydra_help or parsed.cfg or parsed.info
    if not informational and not parsed.shell_completion:
        check_overrides(parsed.overrides, parsed.multirun)
        if distributed.launch() is not None:  # torchrun
            args = [*args, *shared_output_dir(parsed.overrides, parsed.multirun)]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    sys.argv = ["posbench train", *args]
    app(train_job)()


def shared_output_dir(overrides: Sequence[str], multirun: bool) -> list[str]:
    """Overrides that give every torchrun rank rank 0's output directory. Each rank runs this
    command, and resolving ``${now:...}`` and ``${unique_dir:...}`` itself would make one
    directory per rank: rank 0 claims the directory and sends its name to the others, which
    also leave Hydra's record of the run (``.hydra/``) to rank 0."""
    distributed.setup()
    key = "hydra.sweep.dir" if multirun else "hydra.run.dir"
    path = distributed.from_rank_zero(
        lambda: str(OmegaConf.select(compose_or_fail(overrides, with_hydra=True), key))
    )
    quiet = [] if distributed.is_main() else ["hydra.output_subdir=null"]
    return [f"{key}='{path}'", *quiet]


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


def threads_setting(text: str) -> int | str:
    """``--threads``: auto or a positive integer, as the ``threads`` config key."""
    if text == AUTO:
        return AUTO
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected auto or a positive integer, got {text!r}"
        ) from None


def scale_factor(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {text!r}") from None
    if not value >= 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def add_run_argument(parser: argparse.ArgumentParser) -> None:
    """``--run DIR``; ``chosen_run`` turns its absence into the newest run."""
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="run directory (default: the newest run under ./outputs)",
    )


def chosen_run(options: argparse.Namespace) -> Path:
    """``--run``, else the newest run under outputs/, after saying which one and why."""
    if options.run is not None:
        return options.run
    run_dir, why = default_run()
    print(why)
    return run_dir


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
        help="CPU threads: auto (the cores this process may use, divided among the jobs "
        "torchrun runs at once) or a positive integer, e.g. 1 for evaluations run side by side",
    )
    parser.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        help="of the forward passes; log-probabilities are summed in fp32/fp64 either way "
        "(default: the run's eval.precision)",
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
        "--rope-scaling",
        choices=list(SCALING_METHODS),
        metavar="METHOD",
        help="extend a rope run at eval time, without retraining: "
        "none (as trained), linear (position interpolation, Chen et al. 2023), "
        "ntk (base * s^(d/(d-2))), dynamic (HF's dynamic NTK: ntk with s' = s L / L0 - (s - 1) "
        "per length L past the training length L0, s = 1 without --factor), yarn (Peng et al. "
        "2023: per-frequency ramp + attention temperature), "
        "llama3 (Llama 3.1's smooth band interpolation); results.json records it as "
        '"scaling" next to the plain records (default: the run\'s own encoding.scaling)',
    )
    parser.add_argument(
        "--factor",
        type=scale_factor,
        metavar="S",
        help="the scaling factor s >= 1 for --rope-scaling (default: s = max(1, L / training "
        "length) at each length L; for dynamic, s = 1); results of different factors are "
        "kept side by side",
    )
    return parser


def run_eval(args: Sequence[str]) -> None:
    options = eval_parser().parse_args(list(args))
    if options.factor is not None and options.rope_scaling is None:
        fail("--factor needs --rope-scaling METHOD (see posbench eval --help)")
    run_dir = chosen_run(options)
    cfg = load_run_config(run_dir)  # for the defaults; evaluate_run loads the weights
    lengths = options.length or eval_lengths(cfg)
    if options.stride is not None and options.stride > min(lengths):
        fail(f"--stride {options.stride} must not exceed the shortest --length ({min(lengths)})")
    overrides = None
    if options.rope_scaling is not None:
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
    )
    results = record_eval(run_dir, records, cfg.train.seq_len)
    print(f"{cfg.encoding.name} trained at {cfg.train.seq_len} ({run_dir})")
    print(eval_table(records, cfg.train.seq_len, references=results["eval"]))


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


# ------------------------------------------------------------------------- diagnose


def diagnose_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="posbench diagnose",
        description="Exact attention statistics of a trained run on windows of its validation "
        "split, per layer, head and query-position bucket: entropy, mean attended distance, "
        "mass on the first token, mass at distances >= train.seq_len. Writes "
        "DIR/diagnostics/L<N>.json, PNG figures and TensorBoard images.",
    )
    parser.add_argument(
        "--length", type=positive_int, required=True, metavar="N", help="window length in tokens"
    )
    add_run_argument(parser)
    parser.add_argument(
        "--windows",
        type=positive_int,
        default=4,
        metavar="K",
        help="validation windows averaged over (default: 4)",
    )
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    return parser


def run_diagnose(args: Sequence[str]) -> None:
    options = diagnose_parser().parse_args(list(args))
    run_dir = chosen_run(options)
    result, written = diagnose_run(run_dir, options.length, options.windows, options.device)
    print(
        f"{result['encoding']} trained at {result['train_seq_len']} ({run_dir}): attention at "
        f"{result['length']} tokens, averaged over {result['windows']} windows"
    )
    print(summary_table(result))
    print("wrote " + ", ".join(str(path) for path in written))


# ----------------------------------------------------------------------------- main


def dispatch(command: str | None, rest: list[str]) -> None:
    if command == "train":
        run_train(rest)
    elif command == "eval":
        run_eval(rest)
    elif command == "report":
        run_report(rest)
    elif command == "diagnose":
        run_diagnose(rest)
    elif command in (None, "-h", "--help", "help"):
        print(main_help())
    else:
        fail(f"unknown command {command!r}; use `posbench train`, `eval`, `report` or `diagnose`")


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--debug" in argv:  # before the command (posbench --debug train) or among its flags
        argv = [arg for arg in argv if arg != "--debug"]
        os.environ["HYDRA_FULL_ERROR"] = "1"
    register_schemas()
    command, rest = (argv[0], argv[1:]) if argv else (None, [])
    try:
        with handling([signal.SIGTERM], raise_terminated):  # not a silent kill: unwind
            dispatch(command, rest)
    except PosbenchError as err:
        report(err)
    except KeyboardInterrupt as err:
        if debugging():
            traceback.print_exc()
        stop_interrupted(err)
    except OSError as err:  # the file system: a full disk, a permission, a vanished file
        report(err)


if __name__ == "__main__":
    main()
