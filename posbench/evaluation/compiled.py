"""``eval.compile``: a corpus's perplexity windows run through ``torch.compile``, compiled once per
evaluation length.

Each length compiles graphs of one static shape, its batch of windows (B, T): static shapes are
what flex_attention's kernel (posbench/model/attention/flex.py) and SDPA's want. A length's last
batch usually holds fewer windows; it runs padded to B with copies of its last window, whose
losses are dropped (``WindowPasses.rows``). That is exact, since no operation of the model mixes
the windows of a batch, and it costs at most one batch's compute per length, where a graph for
the last batch's shape would cost a second compile (seconds on a CPU). Marking the batch
dimension dynamic instead would still compile a last batch of one window apart (torch
specializes sizes 0 and 1), and flex_attention's dynamic-shape kernels failed to compile (flex.py).

Only the evaluated run's own forward passes compile; LongPPL's evaluator, DroPE's temperature fit
and a task's accuracy (refused: its decoding changes shape at every token) run eagerly.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from posbench.system.dynamo import raised_recompile_limits

log = logging.getLogger(__name__)

# dynamo's recompile limits (per function, and per function over all objects) while evaluation
# compiles; past them it would run the rest uncompiled, saying so only in a warning. Each length
# compiles each function of the forward pass once, but an encoding whose bias breaks the graph
# (ALiBi's and T5's check of consecutive positions, FIRE's blocks of queries) compiles a frame
# per block of queries too: up to 64 at 16,384 tokens, times the lengths evaluated.
EVAL_RECOMPILE_LIMIT = 1024


@contextmanager
def compiled_for_evaluation(model: nn.Module) -> Iterator[nn.Module]:
    """``torch.compile(model)`` with static shapes (a graph per input shape, never one for any
    length), and dynamo's recompile limits raised to at least EVAL_RECOMPILE_LIMIT until the
    block ends (they are process-wide settings)."""
    with torch._dynamo.config.patch(raised_recompile_limits(EVAL_RECOMPILE_LIMIT)):
        yield torch.compile(model, dynamic=False)


class WindowPasses:
    """The forward passes over one length's batches of windows: ``model`` itself, or with
    ``compiled`` (compiled_for_evaluation's wrapper of it) that wrapper, every batch padded to
    ``batch_size`` windows, the shape its graph was compiled for. ``compile_s``: the seconds
    of the first compiled pass, in which torch.compile compiled it (with that pass's own
    computation, as train.compile_s holds its warm-up step's); None for the model itself."""

    def __init__(self, model: nn.Module, compiled: nn.Module | None, batch_size: int) -> None:
        self.forward = model if compiled is None else compiled
        self.batch_size = None if compiled is None else batch_size
        self.compile_s: float | None = None

    def rows(self, starts: list[int]) -> list[int]:
        """The windows a batch of windows at ``starts`` runs as: themselves, or when compiled,
        followed by copies of the last one up to ``batch_size`` (their losses are dropped)."""
        if self.batch_size is None:
            return starts
        return [*starts, *[starts[-1]] * (self.batch_size - len(starts))]

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.batch_size is None or self.compile_s is not None:
            return self.forward(*args, **kwargs)
        started = time.perf_counter()
        output = self.forward(*args, **kwargs)
        if output.is_cuda:  # the compile is the host's; its kernels' work is asynchronous
            torch.cuda.synchronize(output.device)
        self.compile_s = time.perf_counter() - started
        log.info("torch.compile of windows %s: %.1f s", tuple(output.shape), self.compile_s)
        return output
