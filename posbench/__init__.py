"""posbench: which positional encoding keeps working past the length it was trained on?

Python API (stable):

    model, cfg = posbench.load_run("outputs/2026-11-30/12-00-00_rope")
    logits = model(tokens)                               # (batch, time) bytes -> (batch, time, 256)
    records = posbench.evaluate_run(run_dir, [1024, 4096])   # results.json eval records
    records = posbench.evaluate(model, tokens, [1024])       # any model, any byte tensor
    task = posbench.data.load_data({"source": "passkey"})     # a Task: prompts with answers
    records = posbench.evaluate_task(model, task, [1024])     # accuracy, sequence_accuracy
    overrides = posbench.rope_scaling_overrides(cfg, "yarn", 8.0)  # eval-time RoPE extension
    records = posbench.evaluate_run(run_dir, [8192], encoding_overrides=overrides)
    diagnosis, paths = posbench.diagnose_run(run_dir, 2048, n_windows=4)  # attention statistics
"""

from posbench import data
from posbench.diagnose import diagnose_run
from posbench.evaluate import evaluate, evaluate_run, evaluate_task, rope_scaling_overrides
from posbench.runs import load_run
from posbench.train import train

__version__ = "0.1.0"
__all__ = [
    "data",
    "diagnose_run",
    "evaluate",
    "evaluate_run",
    "evaluate_task",
    "load_run",
    "rope_scaling_overrides",
    "train",
]
