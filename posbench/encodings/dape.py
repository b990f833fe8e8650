"""DAPE: data-adaptive positional encoding (Zheng et al., NeurIPS 2024,
https://arxiv.org/abs/2405.14722; DAPE V2, https://arxiv.org/abs/2410.04798), an option of a
bias of positions (``encoding.dape=true`` on alibi, kerple and fire).

A small network reads, at every (query i, key j), the H heads' attention logits
z_ij = q_i . k_j / sqrt(d) and the H heads' bias of positions b_ij, and adds its H outputs to
the logits, which become

    z + b + f([z; b])

with f two convolutions over the key axis of the 2H channels [z; b] (each row of queries is a
one-pixel-high image of its keys): 2H -> ``dape_width`` -> H channels, kernels of 1 x
``dape_kernel`` zero-padded on both sides, a LeakyReLU (slope 0.01) between. The logits and the
bias at keys the query does not see (its future; outside a window) are set to 0 before f, as
the authors' code (github.com/chuanyang-Zheng/DAPE, positional_embeddings.py's
``Alibi_DAPEV2``) applies ``torch.tril``; f is then a function of the keys the query sees alone.
``dape_kernel`` 1 is DAPE (V1: an MLP over the heads at each (i, j), the code's ``AliBi_DAPE``);
3, the default, is DAPE V2's ``DAPE_{1x3}``, the variant its paper recommends (each key's
output also reads its two neighbours' logits), whose repository's configurations use it.

Each layer has its own f (the reference builds one per attention layer), so a model with DAPE
gives every layer its own instance of the encoding: KERPLE's and FIRE's parameters become per
layer too, as the reference's per-layer ``ParallelKerpleLog_DAPE`` and ``FIRE_DAPEV2`` have them.
The logits f reads are those before ``model.attention_scaling``, the ones a bias from the
content reads (posbench/model/model.py). f runs as matrix products with a hand-written backward
(posbench/encodings/dape_network.py), every block attention asks for in one autograd node
(``content_biases``), in pieces of rows of queries at long lengths. Where the bias of
positions is one of the distance alone (consecutive positions; FIRE within its threshold) it
is computed once per layer, as a table of distances (``consecutive_bias``), and looked up per
piece (``distance_grid``); attention, in training, looks its blocks' bias up in the same table
(``content_table``), not in one of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import torch

# dape_network.CHUNK_PAIRS as an attribute: set in one place for both modules
from posbench.encodings import dape_network
from posbench.encodings.base import EncodingConfig, PositionalEncoding, distance_grid
from posbench.encodings.dape_network import DapeNetwork, Piece
from posbench.errors import PosbenchError


@dataclass
class DapeOptions(EncodingConfig):
    """The fields ``encoding.dape*`` that alibi's, kerple's and fire's configs add."""

    dape: bool = False  # add f([logits; bias]) to the logits (DAPE)
    dape_width: int = 32  # f's hidden channels
    dape_kernel: int = 3  # f's kernel along the keys: 1 (DAPE V1's MLP) or 3 (V2's 1x3) or more


class DapeState(NamedTuple):
    """DapeEncoding's content state of one layer's forward pass."""

    q: torch.Tensor  # (B, H, T, hs), after queries_and_keys
    k: torch.Tensor  # (B, H, T, hs)
    positions: torch.Tensor  # (T,) or (B, T)
    # consecutive_bias (H, T) at consecutive positions shared by the batch, else None: the
    # network's pieces and attention's blocks both lay out their bias from it (content_table).
    table: torch.Tensor | None


class DapeEncoding(PositionalEncoding):
    """A bias of positions that takes DAPE as an option (``config.dape``): f([z; b]) is this
    encoding's bias from the content (content_state: a DapeState; content_bias: f of a block),
    added by attention to z + b as any content bias is."""

    def __init__(self, config: DapeOptions, d_model: int, n_head: int) -> None:
        super().__init__(config, d_model, n_head)
        self.dape: DapeNetwork | None = None
        if not config.dape:
            return
        if config.dape_width < 1:
            raise PosbenchError(f"encoding.dape_width must be positive (got {config.dape_width})")
        if config.dape_kernel < 1 or config.dape_kernel % 2 == 0:
            raise PosbenchError(
                "encoding.dape_kernel must be a positive odd number, so that each key's output "
                f"is centred on it (got {config.dape_kernel})"
            )
        self.dape = DapeNetwork(n_head, config.dape_width, config.dape_kernel)
        # f reads the causal logits of past keys only: no two-sided form.
        self.bidirectional = False

    @property
    def per_layer(self) -> bool:
        return self.dape is not None or super().per_layer

    @property
    def has_content_bias(self) -> bool:
        return self.dape is not None

    def content_state(
        self, x: torch.Tensor, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor
    ) -> DapeState | None:
        if self.dape is None:
            return None
        # A bias of the distance alone there (consecutive positions shared by the batch; FIRE
        # within its threshold): its (H, T) table once, laid out per piece (distance_grid),
        # where score_bias ran the bias's formula, forward and backward, for every piece.
        table = None
        if positions.dim() == 1 and bool((positions.diff() == 1).all()):
            table = self.consecutive_bias(positions)
        return DapeState(q, k, positions, table)

    def content_table(self, state: DapeState) -> torch.Tensor | None:
        return state.table

    def content_bias(self, state: DapeState, queries: slice, keys: slice) -> torch.Tensor:
        return self.content_biases(state, [(queries, keys)])[0]

    def content_biases(
        self, state: DapeState, blocks: list[tuple[slice, slice]]
    ) -> list[torch.Tensor]:
        assert self.dape is not None, "content_bias without DAPE: content_state gave None"
        q, k, positions, table = state
        pieces, biases, counts = [], [], []
        for queries, keys in blocks:
            block = list(self.pieces(positions, table, queries, keys, k.shape[2]))
            pieces += [piece for piece, _ in block]
            biases += [bias for _, bias in block]
            counts.append(len(block))
        outputs = iter(self.dape(q, k, pieces, biases))  # (B, H, r, m) each
        joined = []
        for count in counts:
            parts = [next(outputs) for _ in range(count)]
            joined.append(parts[0] if count == 1 else torch.cat(parts, dim=2))  # (B, H, n, m)
        return joined

    def pieces(
        self,
        positions: torch.Tensor,
        table: torch.Tensor | None,
        queries: slice,
        keys: slice,
        length: int,
    ) -> Iterator[tuple[Piece, torch.Tensor]]:
        """The pieces of a block of ``queries`` over ``keys`` (of a sequence of ``length``
        tokens at ``positions``), rows of queries, and the bias of positions each reads,
        ([B|1], H, r, M): from its ``table`` of distances (H, length) if not None."""
        assert self.dape is not None
        # f's output at a key reads the hidden layer `half` keys away, which reads the features
        # `half` keys further: the block's keys are widened by `half` on each side, those past
        # the sequence's last key zeros (the features past each query's diagonal are anyway).
        half = self.dape.up.kernel_size[1] // 2
        wide = slice(max(0, keys.start - half), min(length, keys.stop + half))
        beyond = keys.stop + half - wide.stop  # zero keys past the sequence's last
        inside = slice(keys.start - wide.start, keys.stop - wide.start)
        # f's hidden layer of one sequence's rows fits dape_network.CHUNK_PAIRS pairs (at long
        # lengths: the network computes a chunk of sequences at a time).
        rows = max(1, dape_network.CHUNK_PAIRS // (keys.stop - keys.start + 2 * half))
        for start in range(queries.start, queries.stop, rows):
            chunk = slice(start, min(start + rows, queries.stop))
            if table is not None:
                bias = distance_grid(table, positions[chunk], positions[wide])
            else:
                bias = self.score_bias(positions[..., chunk], positions[..., wide])
            # ([B,] H, r, M)
            if bias.dim() == 3:
                bias = bias.unsqueeze(0)  # (1, H, r, M)
            hidden = unseen(chunk, wide, self.window, positions.device)  # (r, M)
            yield Piece(chunk, wide, beyond, inside, hidden), bias


def unseen(queries: slice, keys: slice, window: int | None, device: torch.device) -> torch.Tensor:
    """Which keys (token indices ``keys``) each query (``queries``) does not attend to: its future,
    and with a ``window`` the keys ``window`` or more tokens before it -> (n, m) bool."""
    query = torch.arange(queries.start, queries.stop, device=device)[:, None]
    key = torch.arange(keys.start, keys.stop, device=device)[None, :]
    hidden = key > query
    if window is not None:
        hidden |= query - key >= window
    return hidden
