"""posbench: which positional encoding keeps working past the length it was trained on?

Python API (stable; docs/api.md runs it):

    run_dir = posbench.latest_run()                          # the newest run under ./outputs
    model, cfg = posbench.load_run(run_dir)
    logits = model(tokens)                               # (batch, time) bytes -> (batch, time, 256)
    tokenizer = posbench.run_tokenizer(run_dir)          # a run on tokens' tokenizer; None: bytes
    records = posbench.evaluate_run(run_dir, [1024, 4096])   # eval records; writes nothing
    records = posbench.evaluate(model, tokens, [1024])       # any model, any byte tensor
    task = posbench.data.load_data({"source": "passkey"})     # a Task: prompts with answers
    records = posbench.evaluate_task(model, task, [1024])     # accuracy, sequence_accuracy
    overrides = posbench.rope_scaling_overrides(cfg, "yarn", 8.0)  # eval-time RoPE extension
    records = posbench.evaluate_run(run_dir, [8192], encoding_overrides=overrides)
    diagnosis, paths = posbench.diagnose_run(run_dir, 2048, n_windows=4)  # attention statistics
    results = posbench.train(cfg, "outputs/my_run")      # may raise posbench.Diverged
"""

from posbench import data
from posbench.evaluation.diagnose import diagnose_run
from posbench.evaluation.perplexity import evaluate
from posbench.evaluation.run import evaluate_run, rope_scaling_overrides
from posbench.evaluation.task_accuracy import evaluate_task
from posbench.runs.directory import latest_run, load_run, run_tokenizer
from posbench.training.train import train
from posbench.training.train_loop import Diverged

__version__ = "0.1.0"
__all__ = [
    "Diverged",
    "data",
    "diagnose_run",
    "evaluate",
    "evaluate_run",
    "evaluate_task",
    "latest_run",
    "load_run",
    "rope_scaling_overrides",
    "run_tokenizer",
    "train",
]
