"""Wall time of two posbench jobs run in parallel, as a ratio to the same two jobs run serially.

    python benchmarks/parallel_jobs.py [--rounds 3] [--only shell|joblib] [--quick]

The jobs are the issue's short ones: `posbench train encoding=E train.steps=150` for E = none
and rope (train, then evaluate at 128..2048), each in a fresh process as a user runs them.

(a) shell: both jobs started together from the shell with `threads=1` each, against the same
    two jobs run one after the other with `threads=auto` (a lone job's default: every core).
    Target: <= 0.95x the serial wall time.
(b) joblib: `posbench train -m encoding=none,rope hydra/launcher=joblib hydra.launcher.n_jobs=2`
    (threads=auto: the cores divided between the two workers), against the same sweep on
    Hydra's basic launcher, which runs the jobs one after the other in one process.
    Target: <= 1.0x the serial sweep's wall time.

Every command names its `threads`, and OMP_NUM_THREADS / MKL_NUM_THREADS are removed from
the jobs' environment, so the thread counts are the ones compared. The variants run in
interleaved rounds (the order reversed every other round, so a drift in load hits them alike)
after one untimed warm-up job that builds the data cache; the table shows the median wall
time of each, its ratio to its baseline measured in the same run, and the median training
tokens/s per job from the runs' results.json. `--quick` runs tiny jobs once, to check that the
script works; its numbers mean nothing. Needs `pip install -e ".[launchers]"` for (b).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
POSBENCH = [sys.executable, "-m", "posbench.cli"]
ENCODINGS = ("none", "rope")
JOB = ["train.steps=150"]
# A job of a second or two: checks the script, measures nothing.
QUICK_JOB = [
    "model.n_layer=1",
    "model.n_head=2",
    "model.d_model=32",
    "train.seq_len=16",
    "train.steps=10",
    "train.batch_size=8",
    "train.val_every=10",
    "eval.lengths=[16,32]",
    "eval.max_tokens=1024",
    "data.train_tokens=40000",
    "data.val_tokens=8192",
    "data.successors=2",
    "data.document_length=512",
]


QUIET = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}


@dataclass
class Variant:
    name: str
    commands: list[list[str]]
    together: bool  # start all commands at once, else one after the other
    baseline: str | None = None  # the variant this one is a ratio to; None: it is a baseline
    target: str = ""
    seconds: list[float] = field(default_factory=list)
    tokens_per_s: list[float] = field(default_factory=list)


def train(*overrides: str) -> list[str]:
    return [*POSBENCH, "train", *overrides]


def variants(job: list[str], only: str | None) -> list[Variant]:
    """The (a) shell and (b) joblib comparisons, each a baseline and its contender."""
    sweep = ["-m", f"encoding={','.join(ENCODINGS)}", *job, "threads=auto"]
    shell = [
        Variant(
            "(a) serial, threads=auto",
            [train(f"encoding={e}", *job, "threads=auto") for e in ENCODINGS],
            False,
        ),
        Variant(
            "(a) together, threads=1",
            [train(f"encoding={e}", *job, "threads=1") for e in ENCODINGS],
            True,
            baseline="(a) serial, threads=auto",
            target="<= 0.95",
        ),
    ]
    joblib = [
        Variant("(b) sweep, basic launcher", [train(*sweep)], False),
        Variant(
            "(b) sweep, joblib n_jobs=2",
            [train(*sweep, "hydra/launcher=joblib", "hydra.launcher.n_jobs=2")],
            False,
            baseline="(b) sweep, basic launcher",
            target="<= 1.00",
        ),
    ]
    chosen = {"shell": shell, "joblib": joblib}
    return [v for key, group in chosen.items() if only in (None, key) for v in group]


def run(variant: Variant, cwd: Path, env: dict[str, str]) -> float:
    """Wall seconds of ``variant``'s commands, run in ``cwd`` (they write under cwd/outputs)."""
    cwd.mkdir(parents=True)
    started = time.perf_counter()
    if variant.together:
        jobs = [subprocess.Popen(c, cwd=cwd, env=env, **QUIET) for c in variant.commands]
        failed = [job.args for job in jobs if job.wait() != 0]
    else:
        failed = [
            c for c in variant.commands if subprocess.run(c, cwd=cwd, env=env, **QUIET).returncode
        ]
    seconds = time.perf_counter() - started
    if failed:
        sys.exit(f"failed: {' '.join(failed[0])} (run it by hand in {cwd} to see why)")
    for results in sorted(cwd.glob("outputs/**/results.json")):
        variant.tokens_per_s.append(json.loads(results.read_text())["train"]["tokens_per_s"])
    return seconds


def job_environment(cache: Path) -> dict[str, str]:
    """The user's environment, minus thread-count variables, running this checkout's posbench."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["POSBENCH_CACHE"] = str(cache)
    env["TQDM_DISABLE"] = "1"
    return env


def machine() -> str:
    """CPU model, the cores this process may use, and the 1-minute load average."""
    model = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        lines = cpuinfo.read_text().splitlines()
        names = [line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")]
        model = names[0] if names else model
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"{model}, {cores} cores, load average {os.getloadavg()[0]:.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", choices=["shell", "joblib"])
    parser.add_argument("--quick", action="store_true", help="tiny jobs, one round: a smoke test")
    args = parser.parse_args()
    job, rounds = (QUICK_JOB, 1) if args.quick else (JOB, args.rounds)
    if args.only != "shell":
        try:
            import hydra_plugins.hydra_joblib_launcher  # noqa: F401
        except ImportError:
            sys.exit(
                '(b) needs the joblib launcher: pip install -e ".[launchers]" (or --only shell)'
            )
    print(f"machine: {machine()}")
    print(f"jobs: encoding={','.join(ENCODINGS)} {' '.join(job)}; {rounds} round(s)")
    chosen = variants(job, args.only)
    with tempfile.TemporaryDirectory(prefix="posbench-parallel-") as tmp:
        root = Path(tmp)
        env = job_environment(root / "cache")
        run(Variant("warm-up", [train(*job)], False), root / "warm-up", env)  # builds the cache
        for round_index in range(rounds):
            order = chosen if round_index % 2 == 0 else chosen[::-1]
            for number, variant in enumerate(order):
                variant.seconds.append(
                    run(variant, root / f"round{round_index}" / str(number), env)
                )
    medians = {v.name: statistics.median(v.seconds) for v in chosen}
    print(f"{'variant':<30}{'wall s':>9}{'ratio':>8}{'target':>9}{'train tok/s per job':>22}")
    for v in chosen:
        ratio = medians[v.name] / medians[v.baseline or v.name]
        tokens = statistics.median(v.tokens_per_s)
        print(f"{v.name:<30}{medians[v.name]:>9.1f}{ratio:>8.2f}{v.target:>9}{tokens:>22,.0f}")
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
