"""Every benchmark command still runs against the code it measures: each at its smallest size
(``--quick`` or small arguments), in fp32, whose numbers mean nothing. A benchmark that no
test runs breaks silently when an interface it calls changes."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize(
    "command",
    [
        ["precision.py", "speed", "--quick", "--variants", "fp32"],
        ["bias_attention.py", "eval", "--quick"],
        ["bias_attention.py", "train", "--quick"],
        ["throughput.py", "--rounds", "1", "--length", "256", "--batch", "2", "--seq-len", "32"],
        ["long_eval_memory.py", "--length", "256", "--threads", "1", "--encodings", "none", "fire"],
        ["diagnose_memory.py", "--length", "256", "--threads", "1", "--encodings", "none", "fire"],
    ],
    ids=lambda command: " ".join(command[:2]),
)
def test_the_benchmark_runs(command, tmp_path):
    result = subprocess.run(
        [sys.executable, BENCHMARKS / command[0], *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert "none" in result.stdout or "fp32" in result.stdout  # its table was printed
