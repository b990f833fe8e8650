"""Position remaps at evaluation (``eval.position_remap``): a model evaluated past its training
length attends to its far keys at positions it saw in training, without retraining.

Both split the keys of query i at token distance d = i - j: the near keys keep their positions,
the far keys take remapped ones, and one softmax runs over all of them (two attentions merged
by their log-sum-exps: posbench/model/attention/remap.py).

* ``self_extend`` (Jin et al., ICML 2024, "LLM Maybe LongLM", https://arxiv.org/abs/2401.01325;
  datamllab/LongLM ``self_extend_patch``): keys with d < W (the neighbour window) at the
  positions i and j; the rest grouped, G positions to one: the query at i // G + W - W // G,
  the key at j // G, so the grouped distance takes over at W where the neighbours stop.
* ``string`` (An et al. 2024, "Why Does the Effective Context Length of LLMs Fall Short?",
  https://arxiv.org/abs/2410.18745; HKUNLP/STRING ``string_flash_forward``): keys with d < S
  (the shift) at their distance; the rest shifted S - W closer, to distance d - S + W, where W
  is a small local window: the far keys take the well-trained distances from W on in place of
  the rarely trained ones near the training length. It is a function of the distance alone, so
  a bias of the distance alone (ALiBi, T5, KERPLE, Sandwich) takes it too, at d - S + W.

A rotary encoding (RoPE; its layers' ``rotate``) takes either: its remapped layers rotate
queries and keys twice and hand both to attention side by side (``two_part_window``). An
encoding that reads no positions (NoPE, a hybrid's NoPE layers) is left as it is. Everything
else is refused in one line: what a remap of it would mean is not defined by either paper.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from posbench.encodings import PositionalEncoding
from posbench.encodings.rope import RotaryPositionalEncoding
from posbench.errors import PosbenchError
from posbench.model.random_positions import POSITION_HOOKS, overrides

METHODS = ("none", "self_extend", "string")


@dataclass
class SelfExtendSettings:
    """``eval.self_extend``: the group size G and the neighbour window W (null: train.seq_len
    // 4)."""

    group: int = 8
    window: int | None = None


@dataclass
class StringSettings:
    """``eval.string``: the shift S (null: train.seq_len // 3, the reference's 0.33 L) and the
    local window W (null: train.seq_len // 16; the reference's 128 at Llama 3.1's 128k)."""

    shift: int | None = None
    window: int | None = None


def configured_remap(
    method: str,
    self_extend: Mapping[str, Any] | None,
    string: Mapping[str, Any] | None,
    seq_len: int,
) -> PositionRemap | None:
    """The remap ``eval.position_remap=method`` configures with ``eval.self_extend`` and
    ``eval.string`` (None: a run saved before them: the defaults) for a model trained at
    ``seq_len`` tokens; None for ``none``."""
    if method not in METHODS:
        raise PosbenchError(
            f"unknown eval.position_remap {method!r}; choose one of: {', '.join(METHODS)}"
        )
    if method == "none":
        return None
    if method == "self_extend":
        settings = {**vars(SelfExtendSettings()), **(self_extend or {})}
        window = or_default(settings["window"], max(1, seq_len // 4))
        return PositionRemap(method, window, group=settings["group"])
    settings = {**vars(StringSettings()), **(string or {})}
    shift = or_default(settings["shift"], max(2, seq_len // 3))
    return PositionRemap(method, or_default(settings["window"], max(1, seq_len // 16)), shift=shift)


def or_default(setting: int | None, default: int) -> int:
    """``setting``, or ``default`` where it is null: a 0 is a 0 (refused), not the default."""
    return default if setting is None else setting


@dataclass(frozen=True)
class PositionRemap:
    """One remap: ``method`` (self_extend | string), ``window`` W (self_extend's neighbour
    window, string's local window), ``group`` G (self_extend) and ``shift`` S (string)."""

    method: str
    window: int
    group: int = 1
    shift: int = 0

    def __post_init__(self) -> None:
        assert self.method in METHODS[1:], self.method
        if self.window < 1 or self.group < 1:
            raise PosbenchError(
                f"eval.position_remap={self.method} needs a window >= 1 and a group >= 1 "
                f"(got window {self.window}, group {self.group})"
            )
        if self.method == "string" and not self.window < self.shift:
            raise PosbenchError(
                f"eval.string.window ({self.window}) must be below eval.string.shift "
                f"({self.shift}): the far keys move S - W closer"
            )

    @property
    def near(self) -> int:
        """Keys fewer than this many tokens before their query keep their positions."""
        return self.window if self.method == "self_extend" else self.shift

    def far_query_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions (T,) queries take over their far keys -> (T,)."""
        if self.method == "self_extend":
            return positions // self.group + self.window - self.window // self.group
        return positions - self.shift + self.window

    def far_key_positions(self, positions: torch.Tensor) -> torch.Tensor:
        """The positions (T,) far keys take -> (T,)."""
        return positions // self.group if self.method == "self_extend" else positions

    def distance(self, distance: torch.Tensor) -> torch.Tensor:
        """string's remapped distance of integer ``distance`` (D,): d below S, else d - S + W."""
        assert self.method == "string", "self_extend's grouped distance is not one of d alone"
        far = distance >= self.shift
        return torch.where(far, distance - self.shift + self.window, distance)

    def record(self) -> dict[str, Any]:
        """An eval record's fields that name the remap; it is also the record's eval-time
        extension (``scaling``, with self_extend's G as its factor), so reports, tables and
        TensorBoard keep it apart from the run's plain records (RoPE's scaling is refused with
        it: posbench/runs/results.py scaling_name)."""
        grouped = self.method == "self_extend"
        factor = self.group if grouped else None
        return {
            "position_remap": self.method,
            "position_remap_window": self.window,
            "position_remap_group": factor,
            "position_remap_shift": None if grouped else self.shift,
            "scaling": self.method,
            "scaling_factor": factor,
            "scaling_factor_setting": factor,
        }


NO_REMAP = {
    "position_remap": "none",
    "position_remap_window": None,
    "position_remap_group": None,
    "position_remap_shift": None,
}


def remap_record(remap: PositionRemap | None) -> dict[str, Any]:
    """The record fields of an evaluation under ``remap`` (None: as trained)."""
    return NO_REMAP if remap is None else remap.record()


class RemappedRotations(PositionalEncoding):
    """A rotary encoding ``inner`` under ``remap``: queries and keys rotated at their positions
    and at the remap's far positions, side by side: (B, H, T, 2 hs), [near | far]."""

    def __init__(self, inner: PositionalEncoding, remap: PositionRemap) -> None:
        super().__init__(inner.config, inner.d_model, inner.n_head)
        self.inner = inner
        self.remap = remap
        self.two_part_window = remap.near
        self.query_key_width = 2 * inner.query_key_width  # [near | far]

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        near_q, near_k = self.inner.queries_and_keys(q, k, positions)  # (B, H, T, hs) each
        far_q = self.inner.rotate(q, self.remap.far_query_positions(positions))
        far_k = self.inner.rotate(k, self.remap.far_key_positions(positions))
        return torch.cat((near_q, far_q), dim=-1), torch.cat((near_k, far_k), dim=-1)


class RemappedDistances(PositionalEncoding):
    """A bias of the distance alone ``inner`` under string's remap: its bias at d - S + W for
    d >= S; every attention path of such a bias takes it as it is."""

    def __init__(self, inner: PositionalEncoding, remap: PositionRemap) -> None:
        super().__init__(inner.config, inner.d_model, inner.n_head)
        self.inner = inner
        self.remap = remap

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor | None:
        return self.inner.relative_bias(self.remap.distance(distance))


def reads_positions(encoding: PositionalEncoding) -> bool:
    """Whether ``encoding`` reads positions at all (through a hook, a window or its content)."""
    hooks = (*POSITION_HOOKS, "relative_bias")
    return (
        any(overrides(encoding, hook) for hook in hooks)
        or encoding.window is not None
        or encoding.has_content_bias
    )


def remap_encoding(encoding: PositionalEncoding, remap: PositionRemap) -> PositionalEncoding:
    """``encoding`` (one layer's) under ``remap``, or a one-line error where it is not defined."""
    name = encoding.config.name
    if not reads_positions(encoding):
        return encoding
    others = (*(h for h in POSITION_HOOKS if h not in ("rotate", "queries_and_keys")),)
    plain = encoding.window is None and not encoding.has_content_bias
    rotary_qk = (RotaryPositionalEncoding.queries_and_keys, PositionalEncoding.queries_and_keys)
    if (
        plain
        and overrides(encoding, "rotate")
        and type(encoding).queries_and_keys in rotary_qk
        and not any(overrides(encoding, hook) for hook in (*others, "relative_bias"))
    ):
        scaling = getattr(encoding.config, "scaling", None)
        if scaling is not None and scaling.method != "none":
            raise PosbenchError(
                f"eval.position_remap={remap.method} remaps RoPE's positions, and "
                f"encoding.scaling.method={scaling.method} rescales them: use one of the two"
            )
        return RemappedRotations(encoding, remap)
    distance_only = plain and not any(overrides(encoding, hook) for hook in POSITION_HOOKS)
    if distance_only and remap.method == "string":
        return RemappedDistances(encoding, remap)
    if distance_only:
        raise PosbenchError(
            f"eval.position_remap=self_extend groups positions, and {name}'s bias is one of the "
            "distance: floor(i/G) - floor(j/G) is not one; use eval.position_remap=string"
        )
    raise PosbenchError(
        f"eval.position_remap={remap.method} remaps RoPE's rotations (or, string, a bias of the "
        f"distance alone); {name} reads positions otherwise (its embedding, a scale, a window, "
        "its content or a bias of both positions): evaluate it without a remap"
    )


class RemappableModel(Protocol):
    layer_encodings: list[PositionalEncoding]


def remap_layers(
    layers: list[PositionalEncoding], remap: PositionRemap
) -> list[PositionalEncoding]:
    """Each of a model's ``layers`` (one encoding per layer, shared instances shared) under
    ``remap``, or a one-line error where a layer cannot take it or none reads positions."""
    wrapped = {id(e): remap_encoding(e, remap) for e in layers}
    if all(wrapped[id(e)] is e for e in layers):
        raise PosbenchError(
            f"eval.position_remap={remap.method}: this model reads no positions to remap"
        )
    return [wrapped[id(e)] for e in layers]


@contextmanager
def remapped_positions(model: RemappableModel, remap: PositionRemap | None) -> Iterator[None]:
    """Within the block, ``model``'s layers attend under ``remap`` (None: as trained); the
    encodings themselves, and the weights, stay as they are."""
    if remap is None:
        yield
        return
    layers = model.layer_encodings
    model.layer_encodings = remap_layers(layers, remap)
    try:
        yield
    finally:
        model.layer_encodings = layers
