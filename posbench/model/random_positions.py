"""Randomized positions (Ruoss et al. 2023, https://arxiv.org/abs/2305.16843) drawn as the
reference draws them (google-deepmind/randomized_positional_encodings: models/transformer.py,
models/positional_encodings.py): what ``train.random_positions=N`` gives each example of a
batch in each layer. Training, validation, evaluation and ``posbench diagnose`` all draw here,
so they see one distribution.

* Span: each example draws a sorted uniform subset of [0, N) for its own length, as the
  reference's noisy_fixed_positional_encodings draws one for the sequence it encodes (one
  length per batch there): an algorithmic task's row up to its last answer byte (row_lengths),
  a corpus window whole. The padding after a row repeats the row's last position: no scored
  token attends to it (attention is causal in token order), and it stays a position the
  encoding represents (a learned table's rows).
* Per layer (``train.random_positions_per_layer``, true by default): each layer attends at a
  draw of its own, as the reference's NOISY_ROTARY calls hk.next_rng_key() in every attention
  layer; the embedding (learned, sinusoidal) takes the first layer's, as NOISY_SIN_COS and
  NOISY_LEARNT draw once at the embedding. False: one draw shared by every layer.
* Distances (``train.random_positions_mode``): an encoding whose bias is a function of the
  distance alone (ALiBi, T5, KERPLE, Sandwich: ``relative_bias``) keeps its tokens at 0..T-1
  and has its distances randomized instead, as NOISY_ALIBI (compute_noisy_alibi_encodings_biases)
  and NOISY_RELATIVE (compute_attention_with_noisy_relative_encodings) do: query i and key j get
  the bias at distance s[i - j], where s[0] = 0 and s[1] < ... < s[n - 1] are a sorted subset
  of [1, N), drawn per example (its length n) and per layer. The bias stays a function of
  i - j: a random monotone relabelling of the distances. ``auto`` (the default) randomizes
  distances where every layer reads positions only that way (randomizes_distances), positions
  elsewhere; ``positions`` and ``distances`` force one.

Where posbench differs from the reference: it draws per example where the reference draws one
subset for the whole batch (one length per batch there; mixed lengths here unless
data.batch_lengths=same: the same distribution per example either way); a causal model
(model.causal=true, the default) takes only the reference's causal half of a bias, without the
+0.5 on past keys that the reference's non-causal ALiBi adds to tell left from right (a model
with model.causal=false takes both halves, the +0.5 included: the same relabelled distances
on either side, as its randomize_both_sides=False; attention/bidirectional.py);
NOISY_RELATIVE is Transformer-XL's relative encoding,
which posbench does not have: its relabelling of distances is what T5, KERPLE and Sandwich get
here. FIRE's bias depends on the query's position as well as the distance, and
RoPE/xPos/learned/sinusoidal read positions: they take positions. FoX and CoPE read no
positions (their biases come from the content), so randomized positions leave them unchanged.

PoSE (Zhu et al., ICLR 2024, https://arxiv.org/abs/2309.10400; dwzhu-pku/PoSE
``train_preprocess_function_pose``), ``train.positions=pose``: skip-wise position ids, one draw
per example shared by every layer. Its reference cuts each training window in two chunks: the
first r1 tokens, r1 uniform in [1, (n + 1) // 2] for a row of n tokens, at positions
0..r1 - 1; the rest at r1 + u .. n - 1 + u, the skip u uniform in [0, L_t - n] for the target
length L_t (``train.pose_length``): a window of n tokens covers relative positions up to L_t - 1.
The reference takes the second chunk's text from further on in a longer document; posbench's
windows stay contiguous text (only the positions skip). Evaluation and validation take 0..L-1
(``eval.positions=auto``; ``random`` draws as training does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch
import torch.nn.functional as F

from posbench.data import IGNORE, sample_positions
from posbench.encodings import PositionalEncoding
from posbench.errors import PosbenchError


class RandomPositionsMode(Enum):
    auto = "auto"  # distances where randomizes_distances, else positions
    positions = "positions"  # a sorted subset of [0, N) per example (and layer)
    pose = "pose"  # PoSE's two chunks, the second skipped by u in [0, N - n] (train.positions)
    distances = "distances"  # positions 0..T-1, distances relabelled by a subset of [1, N)


# The hooks through which an encoding reads positions other than relative_bias.
POSITION_HOOKS = ("embed", "rotate", "queries_and_keys", "score_bias", "consecutive_bias")


def overrides(encoding: PositionalEncoding, hook: str) -> bool:
    """Whether ``encoding``'s class overrides the base class's ``hook``."""
    return getattr(type(encoding), hook) is not getattr(PositionalEncoding, hook)


def randomizes_distances(encodings: Sequence[PositionalEncoding]) -> bool:
    """Whether a model whose layers attend with ``encodings`` can have its distances
    randomized: each layer reads positions through ``relative_bias`` alone (a bias of the
    distance alone) or not at all, without a window or a bias of the content, and one does."""
    plain = all(
        not any(overrides(e, hook) for hook in POSITION_HOOKS)
        and e.window is None
        and not e.has_content_bias
        for e in encodings
    )
    return plain and any(overrides(e, "relative_bias") for e in encodings)


def row_lengths(targets: torch.Tensor) -> torch.Tensor:
    """Each row's own length (B,) int64 for ``targets`` (B, T): its inputs up to its last target
    that carries a loss (trained on, whether or not accuracy scores it; at least 1). What follows
    is padding or a window's untrained tail: causal attention never reads it, and attention both
    ways masks it by these lengths."""
    columns = torch.arange(1, targets.shape[1] + 1, device=targets.device)
    return torch.where(targets != IGNORE, columns, 1).amax(dim=1)


@dataclass(frozen=True)
class PositionDraw:
    """Where a batch's tokens sit, for ``Transformer.forward``: ``positions`` (B, T), or
    (n_layer, B, T) with a row per layer, or None for 0..T-1; ``distances`` (B, T) or
    (n_layer, B, T), randomized distances (row b's bias between tokens d apart is taken at
    distance distances[..., b, d]), or None."""

    positions: torch.Tensor | None = None
    distances: torch.Tensor | None = None

    def rows(self, kept: torch.Tensor, width: int) -> PositionDraw:
        """The draw of the batch rows ``kept``, cut to their first ``width`` tokens."""
        return PositionDraw(*(None if t is None else t[..., kept, :width] for t in self.tensors))

    def to(self, device: torch.device) -> PositionDraw:
        return PositionDraw(*(None if t is None else t.to(device) for t in self.tensors))

    @property
    def tensors(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        return self.positions, self.distances

    @staticmethod
    def cat(draws: Sequence[PositionDraw]) -> PositionDraw:
        """The draws of consecutive rows of a batch, joined into one batch's."""
        joined = [
            None if parts[0] is None else torch.cat(parts, dim=-2)
            for parts in zip(*(d.tensors for d in draws), strict=True)
        ]
        return PositionDraw(*joined)


@dataclass(frozen=True)
class PositionSampler:
    """How randomized positions are drawn for a model of ``n_layer`` layers: from
    [0, ``n_positions``), a draw per layer (``per_layer``) or one for all, as positions or as
    distances (``mode``, resolved: positions | distances)."""

    n_positions: int
    n_layer: int
    per_layer: bool = True
    mode: str = "positions"

    def draw(self, lengths: torch.Tensor, width: int, generator: torch.Generator) -> PositionDraw:
        """The draw of a batch of rows of ``lengths`` (B,) tokens padded to ``width``, from
        ``generator`` alone: (B, width) per tensor, or (n_layer, B, width) per layer."""
        layers = self.n_layer if self.per_layer else 1
        rows = lengths.repeat(layers)  # (layers * B,): layer by layer
        if self.mode == "pose":
            return PositionDraw(pose_positions(rows, width, self.n_positions, generator))
        if self.mode == "distances":
            # s[0] = 0, then a sorted subset of [1, N) of the row's length - 1.
            beyond = sample_positions(
                self.n_positions - 1, len(rows), width - 1, generator, rows - 1
            )
            drawn = F.pad(beyond + 1, (1, 0))  # (layers * B, width)
        else:
            drawn = sample_positions(self.n_positions, len(rows), width, generator, rows)
        drawn = drawn.view(layers, len(lengths), width) if self.per_layer else drawn
        return PositionDraw(distances=drawn) if self.mode == "distances" else PositionDraw(drawn)

    @property
    def at_evaluation(self) -> bool:
        """Whether evaluation takes these draws by default (eval.positions=auto): randomized
        positions do; PoSE trains at them to evaluate at 0..L-1."""
        return self.mode != "pose"

    def record(self) -> dict[str, object]:
        """What an eval record says was drawn, besides ``positions`` and ``position_draws``."""
        return {
            "random_positions": self.n_positions,
            "random_positions_mode": self.mode,
            "random_positions_per_layer": self.per_layer,
        }


def pose_positions(
    lengths: torch.Tensor, width: int, target: int, generator: torch.Generator
) -> torch.Tensor:
    """PoSE's skip-wise positions of rows of ``lengths`` (R,) tokens padded to ``width``, for
    the ``target`` length, from ``generator`` alone -> (R, width) int64: the first chunk
    0..r1 - 1, the rest shifted by the skip u (module docstring); the padding repeats the row's
    last position."""
    n = lengths.clamp(min=1)
    draws = torch.rand(2, len(n), generator=generator, dtype=torch.float64)
    first = 1 + (draws[0] * ((n + 1) // 2)).long()  # (R,): uniform in [1, (n + 1) // 2]
    skip = (draws[1] * (target - n + 1)).long()  # (R,): uniform in [0, target - n]
    index = torch.arange(width).minimum(n[:, None] - 1)  # (R, width)
    return index + torch.where(index >= first[:, None], skip[:, None], 0)


def pose_sampler(
    setting: str, target: int | None, seq_len: int, random_positions: int | None, n_layer: int
) -> PositionSampler:
    """``train.positions=pose``'s sampler (``setting``: train.positions, not consecutive):
    positions up to ``target`` (``train.pose_length``; null: 16 x ``seq_len``, evaluation's
    longest default length), or a one-line error."""
    if setting != "pose":
        raise PosbenchError(
            f"unknown train.positions {setting!r}; choose one of: consecutive, pose"
        )
    if random_positions is not None:
        raise PosbenchError(
            "train.positions=pose draws skip-wise positions and train.random_positions random "
            "ones: choose one (set train.random_positions=null or train.positions=consecutive)"
        )
    target = 16 * seq_len if target is None else target  # 0 is refused below, not the default
    if target < seq_len:
        raise PosbenchError(
            f"train.pose_length ({target}) must be >= train.seq_len ({seq_len}): the target "
            "length PoSE's skips reach"
        )
    return PositionSampler(target, n_layer, per_layer=False, mode="pose")
