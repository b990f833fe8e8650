"""Where the blocked paths get a query block's bias of positions: ``QueryBlockBiases``, one per
layer of a forward pass (``layer_biases``), shared by the layers that attend with one encoding
at one draw of positions; and a bias of the distance alone at randomized distances
(``distance_bias``).
"""

from __future__ import annotations

import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from posbench.encodings import PositionalEncoding

# In evaluation the layers of a forward pass share its query blocks' biases, up to this many
# elements in all (64 MiB in float32: every block of 2,048 tokens with 4 heads). Computed in
# each layer, they took 2/3 of the forward pass of a 2-layer FIRE model with all 32 switch
# points inside (0, 1) at 2,048 tokens (shared: 0.28 s instead of 0.50 s). At longer lengths
# the blocks beyond it are computed in each layer: memory stays bounded.
SHARED_BIAS_ELEMENTS = 2**24
# The storage of kept biases and of the buffer, given back when their QueryBlockBiases (one
# forward pass's) is collected and reused by the next: freed, tens of MB went back to the
# operating system, which zeroed their pages again at the next forward pass (a block's FIRE bias
# of 4 x 256 x 2,048 written in 0.3 ms into reused memory, 12 ms into fresh; AMD EPYC Zen 4).
SPARE_STORAGE: list[torch.Tensor] = []
# Models run in threads of one process (torch.nn.DataParallel's replicas, a server's requests)
# share SPARE_STORAGE: a spare is found and taken under this lock, or two of them could take
# one storage (and write each other's biases) or take the one the other took. Reentrant: a
# collection inside the search may give a pass's storage back (give_back) in the same thread.
SPARE_LOCK = threading.RLock()


def leased_storage(
    owner: object, elements: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A tensor of at least ``elements`` values (1-D, uninitialised) from SPARE_STORAGE or new,
    given back there when ``owner`` is collected. One made under torch.inference_mode (an
    inference tensor) is written in place only under it, so it serves only passes under it,
    and one made outside serves only passes outside."""
    inference = torch.is_inference_mode_enabled()
    with SPARE_LOCK:
        storage = next(
            (
                SPARE_STORAGE.pop(index)
                for index, spare in enumerate(SPARE_STORAGE)
                if spare.dtype == dtype
                and spare.device == device
                and spare.numel() >= elements
                and spare.is_inference() == inference
            ),
            None,
        )
    if storage is None:
        storage = torch.empty(elements, dtype=dtype, device=device)
    weakref.finalize(owner, give_back, storage)
    return storage


def give_back(storage: torch.Tensor) -> None:
    """``storage`` to SPARE_STORAGE, for the next leased_storage."""
    with SPARE_LOCK:
        SPARE_STORAGE.append(storage)


def computes_in(encoding: PositionalEncoding) -> torch.dtype:
    """The dtype of the encoding's biases: its parameters' (else torch's default)."""
    parameter = next(encoding.parameters(), None)
    return torch.get_default_dtype() if parameter is None else parameter.dtype


def distance_bias(encoding: PositionalEncoding, distances: torch.Tensor) -> torch.Tensor:
    """The encoding's bias of the distance alone at randomized ``distances`` (B, T), int64:
    row b's bias between tokens d apart is its relative_bias at distances[b, d]
    (posbench/model/random_positions.py) -> (B, H, T)."""
    B, T = distances.shape
    bias = encoding.relative_bias(distances.flatten())  # (H, B * T)
    assert bias is not None, "randomized distances need a bias of the distance alone"
    return bias.view(-1, B, T).transpose(0, 1)  # (B, H, T)


class QueryBlockBiases:
    """Where blocked_bias_attention gets each query block's score bias, as an attention mask of
    ([B|1], H, n, e) without the causal part: from the encoding, or from an earlier layer.

    One instance serves the layers of one forward pass, which share one encoding instance, so a
    block's bias is the same in each (with an encoding per layer, or randomized positions drawn
    per layer, each layer's attention has its own). With randomized ``distances`` (B, T)
    (posbench/model/random_positions.py) it holds the bias of the distance alone at them
    (distance_bias) instead, for relative_bias_attention.

    Without gradients, the biases of the first layer are kept, up to ``keep_elements`` in all
    (by default SHARED_BIAS_ELEMENTS; the blocks run from the largest), for the layers after
    it, and each bias not kept is written into one buffer (the encoding's score_bias(out=)): a fresh
    tensor of tens of MB per block at long lengths had its pages zeroed again by the operating
    system every time, which took longer than computing FIRE's bias (one layer at 16,384
    tokens: 1.8 s of page faults for 0.46 s of writing). For positions shared by the batch the
    kept biases and the buffer are written into storage that outlives the forward pass
    (leased_storage). With gradients every bias is computed afresh, for autograd (out= records
    none).
    """

    def __init__(
        self,
        encoding: PositionalEncoding,
        keep_elements: int | None = None,
        distances: torch.Tensor | None = None,
    ) -> None:
        self.encoding = encoding
        self.distances = distances
        self.keep_elements = SHARED_BIAS_ELEMENTS if keep_elements is None else keep_elements
        self.kept: dict[int, torch.Tensor] = {}  # by the block's first query
        self.kept_elements = 0
        self.workspace: torch.Tensor | None = None
        self.storage: torch.Tensor | None = None  # the kept biases', leased at the first kept
        self.table: tuple[torch.Tensor | None] | None = None  # consecutive_bias's, once asked

    def consecutive_bias(self, positions: torch.Tensor) -> torch.Tensor | None:
        """The encoding's bias of the distance alone, (H, T), when ``positions`` (the forward
        pass's, the same in every layer) are consecutive and it has one; else None. With
        randomized distances, its bias at them, (B, H, T) (the positions are 0..T-1 then).
        Computed at the first layer's call for all: the check reads the positions back (a device
        sync per layer on a GPU) and a learned table (T5's buckets, FIRE's MLP) would be
        recomputed."""
        if self.table is None and self.distances is not None:
            assert self.distances.shape[-1] == positions.shape[-1], "a distance per token"
            self.table = (distance_bias(self.encoding, self.distances),)
        if self.table is None:
            consecutive = bool((positions.diff() == 1).all())
            self.table = (self.encoding.consecutive_bias(positions) if consecutive else None,)
        return self.table[0]

    def bias(
        self,
        start: int,
        query_positions: torch.Tensor,
        key_positions: torch.Tensor,
        dtype: torch.dtype,
        largest: int,
    ) -> torch.Tensor | None:
        """The bias of the block of queries at ``query_positions`` (from the ``start``-th query)
        and keys at ``key_positions``, in ``dtype``, of at most ``largest`` elements per
        sequence; ``None``: the encoding adds none."""
        if start in self.kept:
            return self.kept[start]
        shape = (self.encoding.n_head, query_positions.shape[-1], key_positions.shape[-1])
        size = math.prod(query_positions.shape[:-1]) * math.prod(shape)
        fresh = torch.is_grad_enabled()
        keep = not fresh and self.kept_elements + size <= self.keep_elements
        # Positions shared by the batch: out= is laid out as that bias, (H, n, e).
        shared = query_positions.dim() == 1
        reuse = not (fresh or keep) and shared
        out = self.workspace[:size].view(shape) if reuse and self.workspace is not None else None
        if keep and shared and computes_in(self.encoding) == dtype:  # out= in the bias's dtype
            if self.storage is None:
                device = key_positions.device
                self.storage = leased_storage(self, self.keep_elements, dtype, device)
            out = self.storage[self.kept_elements : self.kept_elements + size].view(shape)
        bias = self.encoding.score_bias(query_positions, key_positions, out=out)
        if bias is None:
            return None
        if reuse and self.workspace is None:  # in the dtype the encoding computes its bias in
            self.workspace = leased_storage(self, largest, bias.dtype, bias.device)
        bias = bias.to(dtype)
        if bias.dim() == 3:  # SDPA's CPU kernel takes a 4-D mask fused, a 3-D one 5x slower
            bias = bias[None]
        if keep:
            self.kept[start] = bias
            self.kept_elements += size
        return bias


def of_layer(draw: torch.Tensor | None, layer: int) -> torch.Tensor | None:
    """The positions or distances ``layer`` attends at: its row of a draw per layer
    (n_layer, B, T), else the draw itself (or None)."""
    return draw[layer] if draw is not None and draw.dim() == 3 else draw


def layer_biases(
    encodings: list[PositionalEncoding],
    positions: torch.Tensor,
    distances: torch.Tensor | None,
    make: Callable[..., Any] = QueryBlockBiases,
) -> list[Any]:
    """The QueryBlockBiases (or what ``make(encoding, distances=...)`` builds: a bidirectional
    model's TwoSidedBiases) of each layer of a forward pass whose layers attend with
    ``encodings`` at ``positions`` and randomized ``distances`` (None, or (B, T)) or a draw of
    either per layer ((n_layer, B, T)): layers that share an encoding instance share one,
    unless they attend at draws of their own, whose blocks' biases differ."""
    if positions.dim() == 3 or (distances is not None and distances.dim() == 3):
        return [make(e, distances=of_layer(distances, layer)) for layer, e in enumerate(encodings)]
    shared = {id(e): make(e, distances=distances) for e in encodings}
    return [shared[id(e)] for e in encodings]
