"""Posbench jobs side by side: wall times against running them serially, and tokens/s on a
machine that other work keeps busy, against the same job on the quiet machine.

    python benchmarks/parallel_jobs.py [--rounds 1] [--only busy,together,shell,joblib]
                                       [--main PATH] [--quick]

The jobs are the issue's short ones: `posbench train encoding=E train.steps=150` (train, then
evaluate at 128..2048), each in a fresh process as a user runs them.

(a) shell: both jobs (E = none, rope) started together from the shell with `threads=1` each,
    against the same two jobs run one after the other with `threads=auto`.
    Target: <= 0.95x the serial wall time.
(b) joblib: `posbench train -m encoding=none,rope hydra/launcher=joblib hydra.launcher.n_jobs=2`
    against the same sweep on Hydra's basic launcher (serial, one process).
    Target: <= 1.0x the serial sweep's wall time.
(c) busy (issue 27): a default `posbench train encoding=rope` (no `threads=`; evaluated at 128
    only: its training is measured) started while other work runs: a posbench `threads=1` job
    training, or a one-thread torch matmul loop.
    Its training tokens/s against the same default run on the quiet machine (target >= 0.5x),
    and the other work's rate while it runs against that work alone (target >= 0.8x). The
    contenders: `adaptive` (the default: threads=auto and its controller), `passive` (every core,
    `threads=N`, with OMP_WAIT_POLICY=PASSIVE: the wait policy alone), `short spin` (the same
    with GOMP_SPINCOUNT=10000 instead) and `every core`
    (`threads=N`, what threads=auto took before issue 27). The quiet rows: the default run,
    the same with OMP_WAIT_POLICY=PASSIVE or GOMP_SPINCOUNT=10000 (target >= 0.98x: a wait
    policy must not slow a quiet machine) and, with `--main PATH`, the default run of the
    checkout at PATH (this branch's default within 2 %: target >= 0.98x).
(d) together (issue 27): two default runs (E = none, rope, no `threads=`) started at once by
    hand, against the same two run one after the other. Target: <= 0.9x the serial wall time.

Every command names its `threads` or none (the default), and OMP_NUM_THREADS / MKL_NUM_THREADS
are removed from the jobs' environment. The variants run in interleaved rounds (the order
reversed every other round, so a drift in load hits them alike) after one untimed warm-up job
that builds the data cache; the tables show medians over the rounds, each ratio to its
baseline measured in the same run. The other work's rate while a job trains is measured over
that job's training (first to last logged step): a posbench job's from its TensorBoard steps,
the matmul loop's from the counts it prints. `--quick` runs tiny jobs once, to check that the
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
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
PASSIVE = {"OMP_WAIT_POLICY": "PASSIVE"}
# GNU OpenMP (torch's CPU build) spins 300,000 times at a barrier before it sleeps, unless told
SHORT_SPIN = {"GOMP_SPINCOUNT": "10000"}
# (c)'s other work: a posbench job on one thread that outlasts the default run (stopped once
# it is done), logging often enough to time its steps; or a one-thread matmul loop that prints
# the time and its count of products every twentieth of a second.
LOAD_JOB = ["encoding=none", "threads=1", "train.steps=3000", "train.log_every=5"]
BUSY_JOB = ["encoding=rope", "eval.lengths=[128]"]  # (c)'s job: its training is measured
QUICK_BUSY_JOB = [*BUSY_JOB, "train.steps=200", "train.log_every=5"]  # long enough to time
MATMUL_LOOP = """
import time, torch
torch.set_num_threads(1)
a = torch.randn(256, 256)
count, last = 0, time.time()
while True:
    a @ a
    count += 1
    if time.time() - last >= 0.05:
        last = time.time()
        print(last, count, flush=True)
"""
LOOP_ALONE_SECONDS = 10.0


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


def together_variants(job: list[str]) -> list[Variant]:
    """(d): two default runs started at once by hand, against the two one after the other."""
    commands = [train(f"encoding={e}", *job) for e in ENCODINGS]
    return [
        Variant("(d) serial, default", commands, False),
        Variant(
            "(d) together, default",
            commands,
            True,
            baseline="(d) serial, default",
            target="<= 0.90",
        ),
    ]


@dataclass
class Busy:
    """(c): a job started while other work (``load``) runs, or one of the two alone."""

    name: str
    job: list[str] | None  # the job's overrides after the shared ones; None: the load alone
    load: str | None  # "posbench" (LOAD_JOB), "matmul" (MATMUL_LOOP) or None: a quiet machine
    env: dict[str, str] = field(default_factory=dict)  # over the job's environment
    baseline: str | None = None  # the quiet variant its tokens/s is a ratio to
    target: str = ""
    load_baseline: str | None = None  # the variant of the load alone
    repo: Path = REPO  # the checkout whose posbench the job runs
    tokens_per_s: list[float] = field(default_factory=list)
    load_rate: list[float] = field(default_factory=list)  # steps/s or products/s


LOAD_ALONE = {"posbench": "quiet: posbench threads=1 job alone", "matmul": "quiet: matmul loop"}


def busy_variants(main: Path | None) -> list[Busy]:
    """(c): the quiet rows (the default run, its wait policies, main's, each load alone), then
    each contender beside each load."""
    every_core = [f"threads={CORES}"]
    default = Busy("quiet: default", [], None)
    quiet = [
        default,
        Busy("quiet: default, PASSIVE", [], None, PASSIVE, default.name, ">= 0.98"),
        Busy("quiet: default, short spin", [], None, SHORT_SPIN, default.name, ">= 0.98"),
        *(Busy(name, None, load) for load, name in LOAD_ALONE.items()),
    ]
    if main is not None:
        quiet.append(Busy("quiet: default, main", [], None, repo=main))
        default.baseline, default.target = "quiet: default, main", ">= 0.98"
    contenders = [
        ("adaptive (default)", [], {}),
        ("passive, every core", every_core, PASSIVE),
        ("short spin, every core", every_core, SHORT_SPIN),
        ("every core (before)", every_core, {}),
    ]
    busy = [
        Busy(f"beside {load}: {name}", job, load, env, default.name, ">= 0.50", alone)
        for load, alone in LOAD_ALONE.items()
        for name, job, env in contenders
    ]
    return quiet + busy


def training_steps(directory: Path) -> list[tuple[float, int]]:
    """(wall time, step) of every logged training step of the run under ``directory``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    [events] = {p.parent for p in directory.glob("outputs/**/events.out.tfevents.*")}
    accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})  # 0: keep all
    accumulator.Reload()
    if "train/loss" not in accumulator.Tags()["scalars"]:
        return []  # not logged yet
    return [(e.wall_time, e.step) for e in accumulator.Scalars("train/loss")]


def rate_within(points: list[tuple[float, int]], start: float, end: float) -> float:
    """Counts per second between the first and last of ``points`` (time, count) in the window."""
    inside = [(t, n) for t, n in points if start <= t <= end]
    assert len(inside) >= 2, f"too few samples of the other work's rate ({len(inside)})"
    (t0, n0), (t1, n1) = inside[0], inside[-1]
    return (n1 - n0) / (t1 - t0)


def started_training(directory: Path, process: subprocess.Popen) -> None:
    """Wait until the posbench job in ``directory`` has logged a training step."""
    while (
        not list(directory.glob("outputs/**/events.out.tfevents.*"))
        or len(training_steps(directory)) < 2
    ):
        if process.poll() is not None:
            sys.exit(
                f"the load job exited with {process.returncode}; run it by hand in {directory}"
            )
        time.sleep(0.5)


def measure_busy(
    variant: Busy, job: list[str], busy_job: list[str], cwd: Path, env: dict[str, str]
) -> None:
    """Run ``variant``: its load (if any) in the background, then its job (if any); record the
    job's tokens/s and the load's rate over the job's training."""
    load_dir, job_dir = cwd / "load", cwd / "job"
    load_dir.mkdir(parents=True)
    job_dir.mkdir()
    background = None
    if variant.load == "posbench":
        command = train(*job, *LOAD_JOB)
        background = subprocess.Popen(command, cwd=load_dir, env=env, **QUIET)
        started_training(load_dir, background)
    elif variant.load == "matmul":
        out = (load_dir / "counts.txt").open("w")
        command = [sys.executable, "-c", MATMUL_LOOP]
        background = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.DEVNULL)
        time.sleep(1.0)  # past torch's import
    if variant.job is None:
        time.sleep(LOOP_ALONE_SECONDS)
        start, end = 0.0, float("inf")
    else:
        path = os.pathsep.join([str(variant.repo), env["PYTHONPATH"]])
        job_env = {**env, **variant.env, "PYTHONPATH": path}
        command = train(*job, *busy_job, *variant.job)
        if subprocess.run(command, cwd=job_dir, env=job_env, **QUIET).returncode:
            sys.exit(f"failed: {' '.join(command)} (run it by hand in {job_dir} to see why)")
        [results] = job_dir.glob("outputs/**/results.json")
        variant.tokens_per_s.append(json.loads(results.read_text())["train"]["tokens_per_s"])
        steps = training_steps(job_dir)
        start, end = steps[0][0], steps[-1][0]
    if background is not None:
        background.terminate()  # posbench checkpoints and stops at its next step
        background.wait()
        if variant.load == "posbench":
            points = training_steps(load_dir)
        else:
            lines = (load_dir / "counts.txt").read_text().split("\n")
            points = [(float(t), int(n)) for t, n in (line.split() for line in lines if line)]
        variant.load_rate.append(rate_within(points, start, end))


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


GROUPS = ("busy", "together", "shell", "joblib")


def groups(text: str) -> list[str]:
    chosen = text.split(",")
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {', '.join(sorted(unknown))}; from {GROUPS}")
    return chosen


def print_wall_times(chosen: list[Variant]) -> None:
    medians = {v.name: statistics.median(v.seconds) for v in chosen}
    print(f"{'variant':<30}{'wall s':>9}{'ratio':>8}{'target':>9}{'train tok/s per job':>22}")
    for v in chosen:
        ratio = medians[v.name] / medians[v.baseline or v.name]
        tokens = statistics.median(v.tokens_per_s)
        print(f"{v.name:<30}{medians[v.name]:>9.1f}{ratio:>8.2f}{v.target:>9}{tokens:>22,.0f}")


def print_busy(chosen: list[Busy]) -> None:
    """Each job's tokens/s and its ratio to the quiet default run, and the load's rate while it
    ran as a ratio to the load alone (the other job's target: >= 0.8x)."""
    by_name = {v.name: v for v in chosen}
    print(f"{'variant':<42}{'tok/s':>9}{'ratio':>8}{'target':>9}{'other work':>12}{'ratio':>8}")
    for v in chosen:
        tokens = ratio = other = other_ratio = ""
        if v.tokens_per_s:
            median = statistics.median(v.tokens_per_s)
            tokens = f"{median:,.0f}"
            if v.baseline:
                ratio = f"{median / statistics.median(by_name[v.baseline].tokens_per_s):.2f}"
        if v.load_rate:
            other = f"{statistics.median(v.load_rate):,.1f}"
            if v.load_baseline:
                alone = statistics.median(by_name[v.load_baseline].load_rate)
                other_ratio = f"{statistics.median(v.load_rate) / alone:.2f}"
        print(f"{v.name:<42}{tokens:>9}{ratio:>8}{v.target:>9}{other:>12}{other_ratio:>8}")
    print("other work: a posbench job's steps/s or the matmul loop's products/s; target >= 0.80")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument(
        "--only", type=groups, default=["busy", "together"], help=f"comma-separated: {GROUPS}"
    )
    parser.add_argument("--main", type=Path, help="a checkout of main: its quiet default run")
    parser.add_argument("--quick", action="store_true", help="tiny jobs, one round: a smoke test")
    args = parser.parse_args()
    job, rounds = (QUICK_JOB, 1) if args.quick else (JOB, args.rounds)
    busy_job = QUICK_BUSY_JOB if args.quick else BUSY_JOB
    if "joblib" in args.only:
        try:
            import hydra_plugins.hydra_joblib_launcher  # noqa: F401
        except ImportError:
            sys.exit('(b) needs the joblib launcher: pip install -e ".[launchers]"')
    print(f"machine: {machine()}")
    print(f"jobs: {' '.join(job)}; {rounds} round(s); {', '.join(args.only)}")
    chosen = [v for key in ("shell", "joblib") if key in args.only for v in variants(job, key)]
    if "together" in args.only:
        chosen += together_variants(job)
    busy = busy_variants(args.main) if "busy" in args.only else []
    everything: list[Variant | Busy] = [*chosen, *busy]
    with tempfile.TemporaryDirectory(prefix="posbench-parallel-") as tmp:
        root = Path(tmp)
        env = job_environment(root / "cache")
        run(Variant("warm-up", [train(*job)], False), root / "warm-up", env)  # builds the cache
        for round_index in range(rounds):
            order = everything if round_index % 2 == 0 else everything[::-1]
            for number, variant in enumerate(order):
                cwd = root / f"round{round_index}" / str(number)
                if isinstance(variant, Busy):
                    measure_busy(variant, job, busy_job, cwd, env)
                else:
                    variant.seconds.append(run(variant, cwd, env))
    if chosen:
        print_wall_times(chosen)
    if busy:
        print_busy(busy)
    print(f"after: {machine()}")


if __name__ == "__main__":
    main()
