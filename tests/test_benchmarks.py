"""Every benchmark command still runs against the code it measures: each at its smallest size
(``--quick`` or small arguments), in fp32 (bf16 too where a command takes ``--precision``),
whose numbers mean nothing. A benchmark that no test runs breaks silently when an interface it
calls changes. Each script runs forked from the worker's warm interpreter
(conftest.forked_python), without the 2.5 s of CPU a fresh one spends importing torch."""

import subprocess
from pathlib import Path

import pytest
from conftest import forked_python

pytestmark = pytest.mark.slow
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


# Each benchmark at small sizes, and a word of the table it must print.
RUNS = [
    ("precision.py speed --quick --variants fp32", "fp32"),
    ("precision.py attention --quick", "posbench-bf16-mask"),
    ("bias_attention.py eval --quick", "none"),
    ("bias_attention.py train --quick", "none"),
    ("bias_attention.py layer --quick", "blocks of 32"),
    ("bias_attention.py shared --quick", "per layer"),
    (
        "bias_attention.py train --quick --precision fp32 bf16 --encodings alibi --clock cpu",
        "same model's",
    ),
    ("throughput.py --rounds 1 --length 256 --batch 2 --seq-len 32 --longppl", "/ plain"),
    ("throughput.py --rounds 1 --length 256 --batch 2 --seq-len 32 --precision bf16", "(bf16)"),
    ("long_eval_memory.py --length 256 --threads 1 --encodings none fire,dape=true", "none"),
    ("diagnose_memory.py --length 256 --threads 1 --encodings none fire", "none"),
    ("tokenizer.py encode --quick", "encode_split"),
    ("tokenizer.py train --quick", "vocabulary 8,192"),
    ("task_steps.py --rounds 1 --tasks parity_check --encodings rope --slices 1 2", "2 slices"),
    ("decode_cache.py --quick", "recomputed"),
    ("attention_variants.py train --quick", "stick_breaking"),
    ("attention_variants.py eval --quick", "alibi+sinks"),
]


@pytest.mark.parametrize(
    ("command", "printed"),
    [
        pytest.param(command.split(), printed, id=command.split(" --")[0])
        for command, printed in RUNS
    ],
)
def test_the_benchmark_runs(command, printed, tmp_path):
    result = subprocess.run(
        [*forked_python(), BENCHMARKS / command[0], *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert printed in result.stdout  # its table was printed


# The interface of nanoGPT's model.py that nanogpt_parity.py uses (nanoGPT is not installed
# here): GPTConfig's fields, and GPT(config)(idx, targets) -> (logits, loss).
NANOGPT_STAND_IN = """
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class GPTConfig:
    block_size: int
    vocab_size: int
    n_layer: int
    n_head: int
    n_embd: int
    dropout: float
    bias: bool


class GPT(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embedding = torch.nn.Embedding(config.vocab_size, config.n_embd)
        self.head = torch.nn.Linear(config.n_embd, config.vocab_size, bias=config.bias)

    def forward(self, idx, targets):
        logits = self.head(self.embedding(idx))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
"""


def test_the_nanogpt_parity_benchmark_runs_against_a_model_py(tmp_path):
    model_py = tmp_path / "model.py"
    model_py.write_text(NANOGPT_STAND_IN)
    command = ["--nanogpt", model_py, "--rounds", "1", "--shapes", "1x32", "--batch", "2"]
    result = subprocess.run(
        [*forked_python(), BENCHMARKS / "nanogpt_parity.py", *command, "--seq-len", "16"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "1x32    nanogpt" in result.stdout and "1x32    rope" in result.stdout
