"""The interface every positional encoding implements.

A decoder asks its encoding for what it adds, through the hooks below, each with a neutral
default, and never looks at the encoding's name. Which hook gets what, and when:

=====================  ======================================  ================================
hook                   gets                                    returns; who overrides it
=====================  ======================================  ================================
``embed``              token embeddings x (B, T, C) and        x with positions added, once
                       positions, before the first layer       (learned, sinusoidal)
``queries_and_keys``   one layer's q, k (B, H, T, hs)          q, k transformed (xPos scales
                       and positions                           them apart); by default each
                                                               through ``rotate`` (RoPE)
``relative_bias``      integer distances i - j (D,)            (H, D), a bias of the distance
                                                               alone (ALiBi, T5, KERPLE)
``consecutive_bias``   positions (T,) or consecutive (B, T)    (H, T) at distances 0..T-1 when
                                                               it is one of the distance there
``score_bias``         query and key positions                 (H, Tq, Tk) or (B, H, Tq, Tk),
                                                               any bias of positions (FIRE)
``content_state``      one layer's input x (B, T, C) (after    whatever ``content_bias`` needs,
                       its layer norm), its q, k after         once per layer; ``None``: no
                       ``queries_and_keys``, positions         bias from content (FoX, CoPE)
``content_bias``       that state, a slice of queries and      (B, H, n, m) for those indices
                       one of keys (indices, not positions)
``content_bias_parts`` the same, without gradients             (far (B, H, n) or None, near
                                                               (B, H, n, c)): one bias per
                                                               query at every key before the
                                                               last c (CoPE's far keys), which
                                                               attention takes unmasked; by
                                                               default (None, content_bias)
``content_biases``     that state and every block's (queries,  each block's content_bias, asked
                       keys) slices, in training               at once where all are kept for
                                                               the backward: one computation
                                                               may serve them (CoPE); by
                                                               default content_bias of each
``content_table``      that state                              ``consecutive_bias`` where the
                                                               state holds it (DAPE's, which
                                                               reads it too): attention takes
                                                               it, not a second computation
``key_bias``           that state                              (B, H, T) when the content bias
                                                               is a_i + b_j (a_i cancels): b,
                                                               which attention folds into its
                                                               fused kernel (FoX); overriding
                                                               it sets ``has_key_bias``
``transitions``        that state                              (w (B, H, T, hs), beta (B, H, T),
                                                               b (B, H, T) or None) when the
                                                               logit of query i and key j is
                                                               q_i^T H_i..H_{j+1} k_j / sqrt(hs)
                                                               + b_j - b_i, H_t = I - beta_t
                                                               w_t w_t^T: attention takes it
                                                               chunk by chunk (PaTH); overriding
                                                               it sets ``has_transitions``
``layer_encodings``    the model's number of layers            the encoding of each layer
                                                               (per-layer FIRE, hybrid)
``two_sided_bias``     integer distances i - j (D,) of either  (H, D), the bias of a model
                       sign, under ``model.causal=false``      that attends both ways (ALiBi's
                                                               symmetric one, T5's two-sided
                                                               buckets); only an encoding that
                                                               sets ``bidirectional``
=====================  ======================================  ================================

What an encoding author may assume:

* Positions are integers, strictly increasing along the sequence, either (T,), shared by the
  batch (0..T-1 by default), or (B, T), one row per sequence (randomized positions train each
  sequence at its own subset); every hook that takes positions takes both.
* Attention asks for biases per block of queries at long lengths, with the keys up to the
  block's last query (fewer with a ``window``), so a bias hook must depend only on what it is
  given; it never includes the causal mask (attention adds it, and ignores the bias at future
  keys, which must still be finite).
* Biases are added to the logits after the 1/sqrt(hs) scaling of q.k, in float32 or the
  model's dtype; a bias that carries parameters (or comes from q, k) gets its gradient.
* One instance serves every layer unless ``layer_encodings`` says otherwise; ``per_layer``
  gives every layer a fresh instance built from the same config (its own parameters; the first
  layer's also embeds and answers ``max_length`` and ``scaling_record``).
* ``window`` (``None`` by default; a hybrid sets it for its windowed layers): a query attends
  only to the ``window`` most recent tokens, itself included (counted in tokens, not positions).

``two_part_window`` (``None`` by default; a position remap's wrapper sets it, Self-Extend and
STRING at evaluation): ``queries_and_keys`` returns each of q and k as two halves side by side,
(B, H, T, 2 hs), and a key fewer than ``two_part_window`` tokens before its query scores with
the first halves, any other with the second (posbench/model/attention/remap.py).

``bidirectional`` (``False`` by default) says the encoding has a two-sided form, which a model built
with ``model.causal=false`` (posbench/model/attention/bidirectional.py) attends with: every token
sees every token of its row, through ``embed``, ``queries_and_keys`` and ``two_sided_bias`` alone
(its other bias hooks are not asked). An encoding defined for keys at or before their query (a bias
of past keys only, gates or counts accumulated over them, a window) keeps it off.

``max_length`` says how long a sequence the encoding can represent (``None``: any length),
so evaluation can report a length as unsupported instead of silently clamping positions (or
overflowing), and ``beyond_max_length_remedy`` what a user could change to go further.
``scaling_record`` says which eval-time extension (e.g. RoPE's YaRN) the encoding applies at a
length, so every evaluation record names the method it measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn


def remedy_verb(trained: bool) -> str:
    """How a remedy starts: a trained model must be trained again to change a setting, a run
    not started yet only sets it."""
    return "retrain with" if trained else "set"


def distance_grid(
    table: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor
) -> torch.Tensor:
    """A bias of the distance alone, ``table`` (H, D) at distances 0..D-1 (consecutive_bias's),
    at every pair of ``query_positions`` (n,) and ``key_positions`` (m,) -> (H, n, m); a key
    after its query reads distance 0 (every caller masks it). Where the same table serves many
    blocks (a learned bias, in training) this spares evaluating the bias's formula, forward
    and backward, per block: the lookup's backward sums each pair's gradient into its distance."""
    # int32, which index_select takes: half of int64's traffic
    distance = (query_positions.int()[:, None] - key_positions.int()[None, :]).clamp_(min=0)
    return table.index_select(1, distance.flatten()).view(len(table), *distance.shape)


@dataclass
class EncodingConfig:
    """Fields shared by every encoding's config; subclasses add their own parameters."""

    name: str = "none"


class PositionalEncoding(nn.Module):
    """Base class: a no-op encoding. Subclasses override only the hooks they need."""

    Config: type[EncodingConfig] = EncodingConfig
    bidirectional: bool = False  # has a two-sided form (model.causal=false): see above
    # queries_and_keys' q and k are this many head dims wide (PoPE's polar vectors: 2); the
    # memory estimate counts it (posbench/model/attention/scratch.py)
    query_key_width: int = 1

    def __init__(self, config: EncodingConfig, d_model: int, n_head: int) -> None:
        super().__init__()
        self.config = config
        self.d_model = d_model
        self.n_head = n_head
        self.head_dim = d_model // n_head
        self.window: int | None = None  # attend to at most this many recent tokens (None: all)
        # eval.position_remap (posbench/model/position_remap.py): see the module docstring
        self.two_part_window: int | None = None

    @property
    def per_layer(self) -> bool:
        """Whether every layer gets its own instance of this encoding, built from the same config
        (``False``, the default: one instance serves every layer)."""
        return False

    def layer_encodings(self, n_layer: int) -> list[PositionalEncoding]:
        """The encoding each of a model's ``n_layer`` layers attends with, first layer first:
        this instance for every layer, or with ``per_layer`` this one and then a fresh instance
        per layer from the same config. The model keeps (and saves) the instances that are not
        this module or part of it; the first layer's must be this one."""
        if not self.per_layer:
            return [self] * n_layer
        fresh = (type(self)(self.config, self.d_model, self.n_head) for _ in range(n_layer - 1))
        return [self, *fresh]

    @property
    def max_length(self) -> int | None:
        """Longest sequence this encoding represents; ``None`` means unbounded."""
        return None

    def beyond_max_length_remedy(self, length: int, trained: bool = True) -> str:
        """What would let a model represent ``length`` > ``max_length`` positions: said when
        evaluation reports the length unsupported (``trained``: "retrain with ...") and when a
        run's settings would train past them (not ``trained`` yet: "set ...")."""
        return f"evaluate at lengths <= {self.max_length}"

    def scaling_record(self, length: int) -> dict[str, Any]:
        """The eval-time extension applied to a sequence of ``length`` positions, as eval-record
        fields: ``scaling`` (the method; "none" = evaluated as trained), ``scaling_factor`` (the
        factor s it used at this length, or None) and ``scaling_factor_setting`` (the configured
        factor; None when s follows each length, or without scaling)."""
        return {"scaling": "none", "scaling_factor": None, "scaling_factor_setting": None}

    def embed(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Token embeddings ``x`` (B, T, C) at integer ``positions`` (T,) or (B, T) -> (B, T, C)."""
        return x

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Queries or keys ``x`` (B, H, T, hs) at ``positions`` (T,) or (B, T) -> (B, H, T, hs)."""
        return x

    def queries_and_keys(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's queries and keys (B, H, T, hs) at ``positions`` -> (q, k), each
        (B, H, T, hs), before their dot product. The default rotates both alike (``rotate``);
        an encoding that treats them differently (xPos scales queries up and keys down)
        overrides this instead."""
        return self.rotate(q, positions), self.rotate(k, positions)

    @property
    def has_score_bias(self) -> bool:
        """Whether this encoding biases attention logits at all, i.e. overrides a bias hook (the
        defaults add none). Known without computing a bias, so attention without one goes
        straight to the fused causal kernel, with no data-dependent check (no graph break under
        torch.compile)."""
        cls = type(self)
        return (
            cls.relative_bias is not PositionalEncoding.relative_bias
            or cls.score_bias is not PositionalEncoding.score_bias
        )

    def relative_bias(self, distance: torch.Tensor) -> torch.Tensor | None:
        """The attention-logit bias of a query at position i and a key at j, when it depends on
        the distance ``i - j`` alone: every head's bias at integer distances ``distance`` (D,)
        -> (H, D), for any sign (negative distances are future keys, masked anyway). ``None``
        (the default): the bias depends on more than i - j, or there is no bias."""
        return None

    def consecutive_bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The bias among consecutive ``positions`` ((T,), or (B, T) with consecutive rows) when
        it is a function of the distance alone there: every head's bias at distances 0..T-1
        (H, T), which the model attends with without building (H, T, T). ``None``: it is not
        one there, or there is no bias. The default is ``relative_bias``, a function of the
        distance alone everywhere."""
        return self.relative_bias(torch.arange(positions.shape[-1], device=positions.device))

    def score_bias(
        self,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor | None:
        """Additive attention-logit bias (H, Tq, Tk) for positions (Tq,), (Tk,), or
        (B, H, Tq, Tk) for one row of positions per sequence, (B, Tq), (B, Tk); ``None`` for no
        bias.

        At long lengths the model asks per block of queries, with the keys up to the block's
        last position, so the bias must depend only on the positions it is given. In evaluation
        (without gradients, which ``out=`` does not record) it may then pass ``out``, a
        contiguous tensor of the bias's shape that the bias may be written to (callers use the
        tensor returned): one buffer for every block spares the operating system's zeroing of
        fresh pages for each. The default is ``relative_bias`` laid out over the (query, key)
        grid."""
        # Each distinct distance once (there are at most Tq + Tk - 1), then the grid looked up.
        lowest = query_positions.min() - key_positions.max()
        highest = query_positions.max() - key_positions.min()
        bias = self.relative_bias(torch.arange(lowest, highest + 1, device=lowest.device))
        if bias is None:
            return None
        # i - j - lowest ([B,] Tq, Tk) in int32, which index_select takes: half of int64's traffic.
        row = (query_positions - lowest).int()[..., :, None] - key_positions.int()[..., None, :]
        # index_select of the flat grid: 5x faster than bias[:, row] (measured at 256 x 2048).
        # With one row of positions per sequence the grid is (H, B, ...), not out's layout.
        flat = out.view(len(bias), -1) if out is not None and row.dim() == 2 else None
        grid = torch.index_select(bias, 1, row.flatten(), out=flat)  # (H, [B *] Tq * Tk)
        grid = grid.view(-1, *row.shape)  # (H, [B,] Tq, Tk)
        return grid.movedim(0, -3)  # ([B,] H, Tq, Tk)

    def two_sided_bias(self, distance: torch.Tensor) -> torch.Tensor | None:
        """The attention-logit bias of a query at position i and a key at j in a model that
        attends both ways (``bidirectional``): every head's bias at integer distances
        ``distance`` = i - j (D,) of either sign (negative: keys after the query) -> (H, D).
        ``None`` (the default): no bias."""
        return None

    @property
    def has_content_bias(self) -> bool:
        """Whether this encoding biases attention logits by their content (overrides
        ``content_state``), known without a forward pass."""
        return type(self).content_state is not PositionalEncoding.content_state

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> Any:
        """What ``content_bias`` needs from one layer's forward pass, computed once per layer
        from the layer's input ``x`` (B, T, C) (after its layer norm), its queries and keys q, k
        (B, H, T, hs) (after ``queries_and_keys``) and ``positions``. ``None`` (the default):
        the logits get no bias from the content (the bias hooks above depend on positions
        only)."""
        return None

    def content_bias(self, state: Any, queries: slice, keys: slice) -> torch.Tensor:
        """The attention-logit bias (B, H, n, m) of the queries at indices ``queries`` (n of
        them) over the keys at indices ``keys`` (m), from ``content_state``'s ``state``, without
        the causal mask; indices count tokens of the sequence from 0 (not positions). Called
        per block of queries; added to any bias of positions."""
        raise NotImplementedError(f"{type(self).__name__} has a content_state but no content_bias")

    def content_bias_parts(
        self, state: Any, queries: slice, keys: slice
    ) -> tuple[torch.Tensor | None, torch.Tensor]:
        """``content_bias`` as (far, near), asked by attention in evaluation: ``near``
        (B, H, n, c) is the bias over the last c of the keys, ``far`` (B, H, n) the bias of
        each query at every one of the keys before them, the same for all (``None``: c is all
        of them). Attention over the far keys then needs no mask, and the far value enters only
        their log-sum-exp (a constant added to a row's logits leaves its softmax as it is). The
        default: (None, content_bias)."""
        return None, self.content_bias(state, queries, keys)

    def content_biases(self, state: Any, blocks: list[tuple[slice, slice]]) -> list[torch.Tensor]:
        """``content_bias`` of each block of ``blocks``, (queries, keys) index slices, from
        ``content_state``'s ``state``, asked at once by attention with gradients, which keeps
        every block's bias for its backward pass anyway: an encoding may compute them in one
        autograd node, whose backward writes the gradients of its state once, where one node
        per block gives each block's gradient of the state as a zero-filled tensor of the
        state's size, all then added up. The default asks ``content_bias`` for each."""
        return [self.content_bias(state, queries, keys) for queries, keys in blocks]

    def content_table(self, state: Any) -> torch.Tensor | None:
        """``consecutive_bias`` (H, T) at the layer's positions where ``content_state`` computed
        it into ``state`` already (DAPE's network reads the bias of positions too), for
        attention to take instead of computing it again: one computation, and one backward
        through it, per layer. ``None`` (the default): the state holds none, attention asks
        ``consecutive_bias`` itself."""
        return None

    @property
    def has_key_bias(self) -> bool:
        """Whether this encoding's content bias is a bias of the key alone (overrides
        ``key_bias``), known without a forward pass (for the memory estimate too)."""
        return type(self).key_bias is not PositionalEncoding.key_bias

    def key_bias(self, state: Any) -> torch.Tensor | None:
        """When ``content_bias`` of query i and key j is a_i + b_j, with a_i the same for every
        key the query sees (so it cancels in the softmax): b of every key, (B, H, T), in any
        float dtype (attention takes it relative to a nearby key's before rounding), which
        attention can then fold into SDPA's fused kernel instead of building the bias per block.
        An encoding that overrides it returns b for every state; ``None`` (the default): the
        content bias is not of that form."""
        return None

    @property
    def has_transitions(self) -> bool:
        """Whether this encoding's logits go through transitions between key and query
        (overrides ``transitions``), known without a forward pass."""
        return type(self).transitions is not PositionalEncoding.transitions

    def transitions(
        self, state: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None:
        """When the logit of query i and key j <= i is q_i^T H_i H_{i-1} ... H_{j+1} k_j / sqrt(hs)
        + b_j - b_i, H_t = I - beta_t w_t w_t^T (PaTH's Householder-like transitions): the unit
        directions w (B, H, T, hs), the strengths beta (B, H, T) and the key's bias b (B, H, T)
        (None: no bias), from ``content_state``'s ``state``; attention then takes the logits
        chunk by chunk (posbench/model/attention/transitions.py) instead of asking content_bias
        per block. Such an encoding's ``content_bias`` is the same logit less
        q_i . k_j / sqrt(hs), for the paths that ask it (a cached decode, diagnose, the
        attention variants). ``None`` (the default): no transitions."""
        return None
