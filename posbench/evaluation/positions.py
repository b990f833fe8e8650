"""Where evaluation puts each window or task example: at 0..L-1, or at randomized positions.

Randomized positions (a run trained with ``train.random_positions=N``, Ruoss et al. 2023):
evaluation and validation draw from the distribution training drew from
(posbench/model/random_positions.py): each window, or task example for its own length (up to its
last answer byte), at a sorted random subset of [0, N), a fresh one in every layer by default
(``train.random_positions_per_layer``), or, for a bias of the distance alone (ALiBi, T5,
KERPLE, Sandwich; ``train.random_positions_mode``), at 0..L-1 with its distances relabelled by
a sorted subset of [1, N), as the reference (google-deepmind/randomized_positional_encodings)
draws them; not at 0..L-1 (``eval.positions``: ``auto`` does so for such runs;
``consecutive`` evaluates at 0..L-1 instead, to study what the model does without them). The
draws come from a generator seeded by the data's seed, the example's length and the window (or
example), layer by layer, so every run compared on the same data sees the same draws; a length
above N is unsupported. Records say which (``positions``: "random" or "consecutive",
``random_positions``: N, ``random_positions_mode``: "positions" or "distances",
``random_positions_per_layer``, ``position_draws``: how many windows drew).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from posbench.config import choice, position_sampler
from posbench.data import TASKS
from posbench.encodings import build_encoding
from posbench.errors import PosbenchError
from posbench.model.position_remap import PositionRemap, configured_remap, remap_layers
from posbench.model.random_positions import PositionDraw, PositionSampler

# The record fields of an evaluation at positions 0..L-1.
CONSECUTIVE = {
    "positions": "consecutive",
    "random_positions": None,
    "random_positions_mode": None,
    "random_positions_per_layer": None,
    "position_draws": None,
}


@dataclass(frozen=True)
class RandomPositions:
    """Randomized positions at evaluation: each window (or task example) drawn as training
    draws it (``sampler``, posbench/model/random_positions.py: for its own length, per layer,
    positions or distances), from a generator seeded by ``seed`` (the data's), the example's
    length and its ``key`` (a window's start in the split, or a task example's index): the same
    for every run on the same data, and independent of batch sizes and of which other lengths
    or windows are evaluated."""

    sampler: PositionSampler
    seed: int

    @property
    def n_positions(self) -> int:
        return self.sampler.n_positions

    @property
    def consecutive(self) -> bool:
        """Whether the tokens stay at 0..L-1 (randomized distances), for the memory estimate."""
        return self.sampler.mode == "distances"

    def of_windows(
        self, width: int, keys: Sequence[int], lengths: torch.Tensor | None = None
    ) -> PositionDraw:
        """The draws of the windows ``keys`` of ``lengths`` (B,) tokens (None: every one
        ``width``), padded to ``width``: (B, width) tensors, or (n_layer, B, width) per layer."""
        lengths = torch.full((len(keys),), width) if lengths is None else lengths
        draws = []
        for key, length in zip(keys, lengths.tolist(), strict=True):
            state = np.random.SeedSequence([self.seed, length, key]).generate_state(1, np.uint64)
            generator = torch.Generator().manual_seed(int(state[0]))
            draws.append(self.sampler.draw(torch.tensor([length]), width, generator))
        return PositionDraw.cat(draws)

    def unsupported_reason(self, length: int) -> str | None:
        """Why ``length`` distinct positions cannot be drawn, or None when they can."""
        if length <= self.n_positions:
            return None
        return (
            f"randomized positions draw {length} distinct positions from [0, "
            f"{self.n_positions}) (train.random_positions); evaluate lengths <= "
            f"{self.n_positions}, or at 0..L-1 with eval.positions=consecutive"
        )

    def record(self, draws: int) -> dict[str, Any]:
        return {"positions": "random", **self.sampler.record(), "position_draws": draws}


def positions_record(positions: RandomPositions | None, draws: int) -> dict[str, Any]:
    """A record's ``positions``, ``random_positions`` and ``position_draws`` fields."""
    return CONSECUTIVE if positions is None else positions.record(draws)


def eval_positions(cfg: DictConfig, setting: str | None = None) -> RandomPositions | None:
    """Where the run configured by ``cfg`` is evaluated: at randomized positions (for
    ``setting`` random, or auto in a run trained with train.random_positions) or at 0..L-1
    (None). ``setting`` None: the run's ``eval.positions`` (auto for runs from before it)."""
    setting = setting or choice(OmegaConf.select(cfg, "eval.positions", default="auto"))
    sampler = position_sampler(cfg)
    if setting == "consecutive" or (setting == "auto" and not (sampler and sampler.at_evaluation)):
        return None
    if sampler is None:
        raise PosbenchError(
            "eval.positions=random draws from [0, train.random_positions), and this run was "
            "trained without train.random_positions; use eval.positions=auto or consecutive"
        )
    return RandomPositions(sampler, OmegaConf.select(cfg, "data.seed", default=0))


def eval_remap(cfg: DictConfig, method: str | None = None) -> PositionRemap | None:
    """The position remap the run configured by ``cfg`` is evaluated under (``method``, else its
    ``eval.position_remap``; None: none), checked against the run before anything runs: one
    forward pass over windows at 0..L-1, through the layers' encodings, with softmax weights."""
    method = method or OmegaConf.select(cfg, "eval.position_remap", default="none")
    select = OmegaConf.select
    remap = configured_remap(
        method, select(cfg, "eval.self_extend"), select(cfg, "eval.string"), cfg.train.seq_len
    )
    if remap is None:
        return None
    why = None
    if eval_positions(cfg) is not None:
        why = "the windows sit at randomized positions: set eval.positions=consecutive"
    greedy = choice(select(cfg, "eval.decode", default="greedy")) == "greedy"
    answers = choice(select(cfg, "data.answer_mode", default="autoregressive"))
    if cfg.data.source in TASKS and greedy and answers != "placeholders":
        why = "a greedy decode steps through a cache it does not fill: eval.decode=teacher_forced"
    model = cfg.model
    if select(model, "attention", default="softmax") != "softmax" or select(model, "attn_sinks"):
        why = "its softmax is merged from two parts: use model.attention=softmax, no attn_sinks"
    if not select(model, "causal", default=True):
        why = "its near and far keys are keys before the query: use model.causal=true"
    if why is not None:
        raise PosbenchError(
            f"eval.position_remap={method} remaps positions 0..L-1 of a causal softmax; {why}"
        )
    with torch.device("meta"):
        encoding = build_encoding(cfg.encoding, model.d_model, model.n_head)
        remap_layers(encoding.layer_encodings(model.n_layer), remap)
    return remap
