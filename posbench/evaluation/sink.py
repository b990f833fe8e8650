"""The attention-sink rate ``posbench diagnose`` records (posbench/evaluation/diagnose.py):
Sink^eps_k of Gu et al. (ICLR 2025, https://arxiv.org/abs/2410.10781):
a head of a window sinks on token k (1 = the first) when its mean attention on k, over the
queries that see it (i >= k - 1, counting from 0), exceeds eps,

    sink_attention   (1 / (N - k + 1)) sum_{i >= k-1} p_i,k-1   per window, layer and head
    sink_rate        the share of (window, layer, head) whose sink_attention exceeds eps;
                     sink_rate_by_layer the same share per layer

as the paper's code computes it (each window thresholded alone, then the shares averaged; its
results are at N = 64 tokens, eps = 0.3, k = 1). diagnose's ``sink_mass`` is p_i0 by query position;
its mean over every query of a window is k = 1's sink_attention.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from posbench.errors import PosbenchError
from posbench.runs.results import read_results, write_results

SINK_EPSILON = 0.3  # Gu et al.'s eps and k: a head sinks on the first token
SINK_TOKEN = 1


def sink_rates(attention: torch.Tensor, epsilon: float, token: int) -> dict[str, Any]:
    """Sink^eps_k from each window's, layer's and head's mean attention on token k,
    ``attention`` (K, L, H): its entries of ``L<N>.json``."""
    sinks = (attention > epsilon).double()  # (K, L, H)
    return {
        "sink_epsilon": epsilon,
        "sink_token": token,
        "sink_attention": attention.mean(0).tolist(),  # (L, H)
        "sink_rate_by_layer": sinks.mean((0, 2)).tolist(),  # (L,)
        "sink_rate": sinks.mean().item(),
    }


def check_sink(length: int, epsilon: float, token: int) -> None:
    """A one-line error for a Sink^eps_k that cannot be measured at ``length``."""
    if not 1 <= token <= length:
        raise PosbenchError(
            f"--sink-token {token} is not in a window of --length {length}: pass 1 (the "
            f"first token) to {length}"
        )
    if epsilon < 0:
        raise PosbenchError(f"--sink-epsilon must be >= 0 (got {epsilon}), e.g. 0.3 as Gu et al.")


SINK_RECORD = ("length", "windows", "sink_epsilon", "sink_token", "sink_rate", "sink_rate_by_layer")


def record_sink(run_dir: Path, result: dict[str, Any]) -> None:
    """The diagnosis's sink rate in the run's results.json ``sink`` list, replacing the
    record of the same length, eps and k (``posbench report`` tabulates them by encoding)."""
    results = read_results(run_dir)
    record = {key: result[key] for key in SINK_RECORD}
    same = (record["length"], record["sink_epsilon"], record["sink_token"])
    kept = [
        r
        for r in results.get("sink", [])
        if (r["length"], r["sink_epsilon"], r["sink_token"]) != same
    ]
    write_results(run_dir, {**results, "sink": [*kept, record]})
