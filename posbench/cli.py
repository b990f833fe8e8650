"""The ``posbench`` command: a thin layer that turns flags into configs and results into tables.

posbench train [key=value ...] [-m ...]   Hydra app: compose conf/, train, evaluate
posbench eval --length N [--run DIR] ...  re-evaluate a trained run at other lengths
posbench report DIR... [--out OUT]        tables, plot and TensorBoard comparison of sweeps
posbench diagnose --length N [--run DIR]  attention statistics by position (evaluation/diagnose.py)

Each command is a module of posbench/commands/; this one only dispatches to them and turns
what any of them raises into one line and an exit code.
"""

from __future__ import annotations

import os
import signal
import sys
import traceback
from collections.abc import Sequence

from posbench.commands.diagnose import run_diagnose
from posbench.commands.eval import run_eval
from posbench.commands.exits import debugging, fail, raise_terminated, report, stop_interrupted
from posbench.commands.overrides import group_options
from posbench.commands.report import run_report
from posbench.commands.train import KEY_OPTIONS, LENGTHS_IN_TOKENS, run_train
from posbench.config import register_schemas
from posbench.encodings import encoding_names
from posbench.errors import PosbenchError
from posbench.system.signals import handling


def main_help() -> str:
    return f"""usage: posbench [--debug] {{train,eval,report,diagnose}} ...

Train a small decoder-only transformer at a short context with a chosen positional
encoding, then measure perplexity at longer lengths ("train short, test long").

commands:
  train    train and evaluate; Hydra overrides key=value, -m for sweeps (posbench train --help)
  eval     re-evaluate a trained run at any length, LongPPL too (posbench eval --help)
  report   compare the runs of a sweep: tables, plot, TensorBoard, effective context length
           (posbench report --help)
  diagnose attention entropy, distance, sink and mass beyond the training length by query
           position, per layer and head; the attention-sink rate Sink^eps_k (posbench
           diagnose --help)

--debug (or HYDRA_FULL_ERROR=1) shows the traceback behind an error message.

encodings (encoding=...): {", ".join(encoding_names())}
models    (model=...):    {", ".join(group_options("model"))}
data      (data=...):     {", ".join(group_options("data"))}
loggers   (logger=...):   {", ".join(group_options("logger"))} (tensorboard by default)
sweeps    (-m +experiment=...): {", ".join(group_options("experiment"))}
key options: {KEY_OPTIONS}
{LENGTHS_IN_TOKENS}

examples:
  posbench train encoding=rope
  posbench train encoding=learned model=small train.seq_len=256 seed=3
  posbench train -m encoding=none,learned,sinusoidal,rope
  posbench train --resume outputs/<date>/<time>_rope/
  posbench train -m +experiment=extrapolation      # every encoding x 3 seeds
  posbench report outputs/multirun/<date>/<time>/
  posbench train -m +experiment=alibi_wt103 model=small   # the ALiBi paper's WikiText-103 setup
  posbench report outputs/multirun/<date>/<time>/ --reference alibi-wt103   # beside its tables
  posbench eval --length 2048
  posbench eval --length 1024 --length 4096 --run outputs/<date>/<time>_rope/
  posbench eval --length 8192 --rope-scaling yarn --factor 8
  posbench train encoding=none train.init_from=<rope run> eval.temperature=fit   # DroPE
  posbench eval --length 1024 --metric longppl --evaluator outputs/<date>/<time>_alibi/
  posbench report outputs/multirun/<date>/<time>/ --effective-threshold 0.8
  posbench diagnose --length 2048 --run outputs/<date>/<time>_alibi/
  posbench diagnose --length 64 --sink-epsilon 0.3 --sink-token 1   # Gu et al.'s Sink^eps_k
"""


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
