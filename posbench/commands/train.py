"""``posbench train [key=value ...] [-m ...] [--resume DIR]``: Hydra composes conf/, each job
runs posbench.train.train in its output directory and prints its evaluation table."""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from torch.distributed import DistError

from posbench import distributed
from posbench.checkpoint import CHECKPOINT_FILE
from posbench.commands.arguments import OneLineParser
from posbench.commands.exits import debugging, fail, report, stop, stop_interrupted
from posbench.commands.overrides import check_overrides, compose_or_fail, group_options
from posbench.config import config_dir
from posbench.errors import PosbenchError
from posbench.output_dirs import register_output_dir_resolvers
from posbench.report.run_table import data_baselines, run_table, trained_at
from posbench.runs import CONFIG_FILE, saved_config
from posbench.sweep_summary import record_failed_job
from posbench.train import TrainingInterrupted, train

# Launchers (joblib, submitit) run train_job in fresh processes that import this module but
# never run main(); conf/config.yaml's directory names need its resolvers there.
register_output_dir_resolvers()
log = logging.getLogger(__name__)

# The keys most runs set, named by `posbench --help` and `posbench train --help`.
KEY_OPTIONS = (
    "seed, device (auto|cpu|cuda), threads (auto|N), model.n_layer, model.n_head, model.d_model, "
    "train.seq_len, train.steps, train.batch_size, train.lr, eval.lengths, eval.stride, "
    "data.tokenizer (bytes|bpe|FILE|NAME), data.vocab_size"
)
# What every length means, said where lengths are set.
LENGTHS_IN_TOKENS = (
    "lengths (train.seq_len, eval.lengths, --length) count tokens of the run's tokenizer: "
    "bytes by default, BPE tokens with data.tokenizer=bpe"
)


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
    except (PosbenchError, OSError) as err:  # OSError: the file system (full, not writable)
        remove_if_worthless(run_dir)
        hydra_config = HydraConfig.get()
        if hydra_config.mode != RunMode.MULTIRUN:
            report(err)
        # The other jobs still run; the sweep's summary names each failed job and exits 2.
        if debugging():
            traceback.print_exception(err)
        error = str(err) or type(err).__name__
        log.error(f"job {hydra_config.job.num} failed: {error}")
        if distributed.is_main():
            overrides = list(hydra_config.overrides.task)
            sweep_dir = Path(hydra_config.sweep.dir)
            record_failed_job(sweep_dir, run_dir, hydra_config.job.num, overrides, error)
        return None
    except distributed.PeerFailed:
        raise SystemExit(1) from None  # rank 0 said why
    except (DistError, RuntimeError) as err:
        reason = distributed.lost_contact(err)
        if reason is None:
            raise
        report(PosbenchError(f"lost the other ranks ({reason}): one failed or timed out"))
    if distributed.is_main():
        print(f"\n{cfg.encoding.name} trained at {trained_at(cfg)} -> {run_dir}")
        print(run_table(cfg, results["eval"], results))
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
The {LENGTHS_IN_TOKENS}.
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


def train_arguments_parser() -> OneLineParser:
    """Hydra's own command-line parser (its flags and overrides), with one-line errors."""
    return OneLineParser(prog="posbench train", parents=[get_args_parser()], add_help=False)


def run_train(args: Sequence[str]) -> None:
    args = resume_arguments(args)
    parsed = train_arguments_parser().parse_args(args)
    if parsed.help:
        print(train_help(parsed.overrides))
        return
    modes = [parsed.run, parsed.multirun, parsed.cfg, parsed.info, parsed.shell_completion]
    if sum(mode not in (None, False) for mode in modes) > 1:  # else Hydra's own traceback
        fail(
            "one of --multirun (-m), --cfg, --info, --run and --shell-completion at a time: "
            "--cfg job prints one job's config (without -m)"
        )
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
