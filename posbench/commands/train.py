"""``posbench train [key=value ...] [-m ...] [--resume DIR]``: Hydra composes conf/, each job
runs posbench.training.train.train in its output directory and prints its evaluation table."""

from __future__ import annotations

import json
import logging
import os
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

from posbench.commands.arguments import OneLineParser
from posbench.commands.exits import debugging, fail, report, stop, stop_interrupted
from posbench.commands.overrides import (
    check_overrides,
    compose_or_fail,
    flag_overrides,
    force_added_in_sweeps,
    group_options,
)
from posbench.config import config_dir
from posbench.errors import PosbenchError
from posbench.report.run_table import data_baselines, run_table, trained_at
from posbench.report.summary import sweep_command
from posbench.runs.directory import CHECKPOINT_FILE, CONFIG_FILE, saved_config
from posbench.runs.sweep_summary import record_failed_job
from posbench.system import distributed
from posbench.system.output_dirs import names_new_dir, register_output_dir_resolvers, unclaimed
from posbench.training.resume import check_can_continue, check_same_run
from posbench.training.train import train
from posbench.training.train_loop import TrainingInterrupted

# Launchers (joblib, submitit) run train_job in fresh processes that import this module but
# never run main(); conf/config.yaml's directory names need its resolvers there.
register_output_dir_resolvers()
log = logging.getLogger(__name__)

# The overrides posbench force-added for Hydra (force_added_in_sweeps), as JSON: a job records
# its sweep's command as typed, without their "++".
FORCE_ADDED_ENV = "POSBENCH_FORCE_ADDED"
# The keys most runs set, named by `posbench --help` and `posbench train --help`.
KEY_OPTIONS = (
    "seed, device (auto|cpu|cuda), threads (auto|N), model.n_layer, model.n_head, model.d_model, "
    "model.qk_norm, model.attn_gate (none|headwise|elementwise), model.attn_sinks, "
    "model.attention (softmax|sigmoid|stick_breaking), encoding.dape (alibi|kerple|fire), "
    "train.seq_len, train.steps, train.positions (consecutive|pose), "
    "train.batch_size, train.lr, train.init_from (DIR: a fine-tune; with encoding=none, DroPE), "
    "eval.lengths, eval.stride, eval.temperature (none|fit), "
    "eval.position_remap (none|self_extend|string), "
    "data.tokenizer (bytes|bpe|FILE|NAME), data.vocab_size"
)
# What every length means, said where lengths are set.
LENGTHS_IN_TOKENS = (
    "lengths (train.seq_len, eval.lengths, --length) count tokens of the run's tokenizer: "
    "bytes by default, BPE tokens with data.tokenizer=bpe"
)


def job_command() -> str:
    """What started this job: its sweep's ``posbench train -m ...`` (Hydra's multirun.yaml,
    read as the job starts: a later sweep into the same directory rewrites it), or the run's
    ``posbench train <overrides>``."""
    hydra_config = HydraConfig.get()
    if hydra_config.mode == RunMode.MULTIRUN:
        command = sweep_command(Path(hydra_config.sweep.dir))
        if command is not None:  # as typed: without the ++ posbench added for Hydra
            forced = set(json.loads(os.environ.get(FORCE_ADDED_ENV, "[]")))
            return shlex.join(
                w.removeprefix("++") if w in forced else w for w in shlex.split(command)
            )
    return shlex.join(["posbench", "train", *hydra_config.overrides.task])


def train_job(cfg: DictConfig, own_config: bool = False) -> float | None:
    """Hydra's task function: one training run in Hydra's output directory (``own_config``:
    ``--resume DIR``, which continues DIR's run from its own config)."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resume_hint = f"resume with: posbench train --resume {shlex.quote(str(run_dir))}"
    try:
        if cfg.train.resume:
            cfg = resumed_config(cfg, run_dir, own_config)
        results = train(cfg, run_dir, job_command())
    except TrainingInterrupted as err:
        stop(f"interrupted: {err}; {resume_hint}", err.exit_code)
    except KeyboardInterrupt as err:  # outside the training loop: loading data, evaluating
        remove_if_worthless(run_dir, cfg.train.resume)
        saved = (run_dir / CHECKPOINT_FILE).is_file()
        stop_interrupted(err, f"; {resume_hint}" if saved else "")
    except (PosbenchError, OSError) as err:  # OSError: the file system (full, not writable)
        remove_if_worthless(run_dir, cfg.train.resume)
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


def resume_job(cfg: DictConfig) -> float | None:
    """Hydra's task function of ``--resume DIR``."""
    return train_job(cfg, own_config=True)


def resumed_config(cfg: DictConfig, run_dir: Path, own_config: bool) -> DictConfig:
    """With ``train.resume``: the run's saved config with only the keys this command line
    sets put on top, so ``--resume DIR`` (``own_config``) need not repeat the run's overrides
    (train() refuses those that would change the result); ``train.resume=true`` must compose
    the run's config (check_same_run). Without a saved config yet, the composed config as is."""
    if not (run_dir / CONFIG_FILE).is_file():
        return cfg
    if not own_config:
        check_same_run(cfg, run_dir)
    resumed = saved_config(run_dir)
    for key in cfg.keys() - resumed.keys():  # added to posbench after the run was saved
        resumed[key] = cfg[key]
    for override in OverridesParser.create().parse_overrides(HydraConfig.get().overrides.task):
        key = override.get_key_element().lstrip("+~")
        if not key.startswith("hydra."):
            OmegaConf.update(resumed, key, OmegaConf.select(cfg, key), merge=False)
    return resumed


def remove_if_worthless(run_dir: Path, resumed: bool) -> None:
    """Remove the directory of a run that failed before writing a checkpoint, weights or
    results, when it holds only what Hydra and posbench put there at the start (never the
    current directory, nor one holding anything else, nor a ``resumed`` run's: its files may be
    an earlier start's). Only rank 0 decides: the directory is theirs in common."""
    if resumed or not distributed.is_main():
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
        for group in ("encoding", "model", "data", "logger", "experiment")
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


def resume_arguments(args: Sequence[str]) -> tuple[list[str], bool]:
    """``--resume DIR`` as the Hydra overrides that continue DIR's run in DIR, and whether the
    command resumes so (from DIR's own config)."""
    args = list(args)
    if "--resume" not in args:
        return args, False
    at = args.index("--resume")
    if at + 1 == len(args) or "=" in args[at + 1]:
        fail("--resume needs the run directory: posbench train --resume DIR [train.steps=N]")
    run_dir = Path(args[at + 1])
    if not (run_dir / CONFIG_FILE).is_file():
        fail(
            f"{run_dir} holds no {CONFIG_FILE}, so it is not a run directory; pass --resume the "
            "directory `posbench train` wrote"
        )
    if "-m" in args or "--multirun" in args:
        fail("--resume takes one run; resume a sweep with train.resume=true hydra.sweep.dir=DIR")
    check_can_continue(run_dir)
    return [*args[:at], *args[at + 2 :], f"hydra.run.dir='{run_dir}'", "train.resume=true"], True


def check_run_dir_holds_this_run(cfg: DictConfig) -> None:
    """Before Hydra writes into it (its .hydra/ and train.log): a run directory named on the
    command line (hydra.run.dir=DIR) that holds another run than ``cfg`` (the run's composed
    config, with its hydra node), or a finished one that cannot continue, is refused
    (check_same_run, check_can_continue). A ``${unique_dir:...}`` directory (the default) is
    always a new one."""
    if names_new_dir(cfg.hydra.run, "dir"):
        return
    with unclaimed():
        run_dir = Path(cfg.hydra.run.dir)
    check_same_run(OmegaConf.masked_copy(cfg, [key for key in cfg if key != "hydra"]), run_dir)
    if cfg.train.resume:
        check_can_continue(run_dir)


def train_arguments_parser() -> OneLineParser:
    """Hydra's own command-line parser (its flags and overrides), with one-line errors."""
    return OneLineParser(prog="posbench train", parents=[get_args_parser()], add_help=False)


def run_train(args: Sequence[str]) -> None:
    args, resuming = resume_arguments(args)
    check_flags(args)
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
        # composed once here for every check: a composition is a sixth of a tiny run's CPU
        composed = check_overrides(parsed.overrides, parsed.multirun)
        if parsed.multirun:
            forced = force_added_in_sweeps(parsed.overrides)
            args = [forced.get(arg, arg) for arg in args]
            # for job_command, in this process or a launcher's (which inherit the environment)
            os.environ[FORCE_ADDED_ENV] = json.dumps(sorted(forced.values()))
        if not parsed.multirun and not resuming:
            check_run_dir_holds_this_run(composed[0])
        if distributed.launch() is not None:  # torchrun
            args = [*args, *shared_output_dir(parsed.overrides, parsed.multirun)]
    app = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")
    sys.argv = ["posbench train", *args]
    app(resume_job if resuming else train_job)()


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


def check_flags(args: Sequence[str]) -> None:
    """A flag that names a config key (``--steps 100``) is one line naming the override it
    meant (``train.steps=100``): ``posbench train`` sets config keys as KEY=VALUE only. Other
    unknown flags are left to the parser's own line."""
    _, unknown = train_arguments_parser().parse_known_args(args)
    flag = next((arg for arg in unknown if arg.startswith("--")), None)
    if flag is None:
        return
    name, _, value = flag.partition("=")
    following = args[args.index(flag) + 1 : args.index(flag) + 2]
    if not value and following and "=" not in following[0] and not following[0].startswith("-"):
        value = following[0]
    meant = flag_overrides(name, value or "VALUE")
    if meant:
        fail(
            f"posbench train: unrecognized arguments: {name}; config keys are set as KEY=VALUE: "
            f"did you mean {' or '.join(meant)}? (see posbench train --help)"
        )
