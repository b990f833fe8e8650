"""``posbench diagnose``: what attention does inside and beyond the training length.

On K validation windows of N tokens (the first K non-overlapping windows that ``posbench eval``
scores at N), the exact attention probabilities of every layer and head,

    p_ij = softmax_j(q_i . k_j / sqrt(hs) + score_bias(i, j) + content_bias(i, j)),  j <= i,

(or the weights of the model's attention variant: with sinks the row sums to less than 1, the
rest on the sink; sigmoid's are not normalised; stick-breaking's sum to 1, the stick left on
the query's own token: posbench/model/attention/variants.py),

with q and k transformed by the run's encoding (rotated, for RoPE), are summarised per query i
and averaged over the queries of each position bucket
(posbench.evaluation.perplexity.position_buckets) in every window. A run trained with randomized
positions is diagnosed at them, as evaluation draws them for the same windows (every layer at its
own draw, or at its randomized distances: posbench/model/random_positions.py); i, j and the buckets
count tokens either way:

    entropy                   -sum_j p_ij ln p_ij (nats); ln(i + 1) would be uniform attention
    mean_distance             sum_j p_ij (i - j), in tokens
    sink_mass                 p_i0: attention on the window's first token ("attention sink")
    mass_beyond_train_length  sum of p_ij over keys with i - j >= train.seq_len: attention at
                              distances training never showed (its largest distance is S - 1)

With them, the attention-sink rate Sink^eps_k of Gu et al. (posbench/evaluation/sink.py).

Written to ``<run>/diagnostics/``: ``L<N>.json`` (every statistic as [layer][head][bucket], the
sink rate, also in results.json's ``sink``: one record per length, eps and k, what ``posbench
report`` tabulates), ``L<N>_entropy.png`` (entropy against query position, one panel per layer)
and, when N exceeds the training length, ``L<N>_mass_beyond_train_length.png`` (a layer x head
heatmap over the queries at positions >= train.seq_len); the same figures as TensorBoard images
in the run.

The model does not know it is observed: forward pre-hooks record each attention module's input, and
q, k are recomputed by that module (its weights, the encoding's ``queries_and_keys`` and its
attention scaling); the probabilities are posbench.model.attention.attention_probabilities, with the
encoding's biases and window, so every encoding is diagnosed through its interface, never by its
name.
Queries are processed in blocks (DIAGNOSE_SCORE_ELEMENTS), so 16,384 tokens fit in 2 GB.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import PIL.Image
import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from posbench.config import resolve_device
from posbench.data import Bytes, Offsets, gather_windows, load_corpus
from posbench.encodings import PositionalEncoding
from posbench.errors import PosbenchError
from posbench.evaluation.memory import available_memory, inference_memory_bytes
from posbench.evaluation.perplexity import (
    document_bounds,
    document_windows,
    position_buckets,
    too_short,
)
from posbench.evaluation.positions import RandomPositions, eval_positions, positions_record
from posbench.evaluation.sink import (
    SINK_EPSILON,
    SINK_TOKEN,
    check_sink,
    record_sink,
    sink_rates,
)
from posbench.model import Transformer
from posbench.model.attention import AttentionVariant, attention_probabilities
from posbench.model.random_positions import PositionDraw
from posbench.runs.directory import load_run
from posbench.system.atomic import atomic_write, write_json

if TYPE_CHECKING:
    from matplotlib.figure import Figure

STATISTICS = ("entropy", "mean_distance", "sink_mass", "mass_beyond_train_length")
DEFINITIONS = {
    "entropy": "-sum_j p_ij ln p_ij over the keys j <= i of query i (nats)",
    "mean_distance": "sum_j p_ij (i - j): the expected distance attended to (tokens)",
    "sink_mass": "p_i0: attention on the window's first token",
    "mass_beyond_train_length": "sum of p_ij over keys with i - j >= train_seq_len",
    "mass_beyond_train_length_heatmap": "[layer][head] mass_beyond_train_length averaged "
    "over the queries at positions >= train_seq_len (null when the window is not longer)",
    "buckets": "each statistic is averaged over the queries of a bucket in every window",
    "sink_attention": "[layer][head] mean over windows of (1 / (N - k + 1)) sum_{i >= k-1} "
    "p_i,k-1: attention on token k (sink_token, 1 = the first) over the queries that see it",
    "sink_rate": "Sink^eps_k (Gu et al. 2025): the share of (window, layer, head) whose mean "
    "attention on token k exceeds eps (sink_epsilon); sink_rate_by_layer: per layer",
}
# Scores per block of queries. At most about six tensors of that size are alive at once (the
# scores, the encoding's bias and its intermediates, the biased and masked scores, the
# probabilities, one statistic's product), so about 6 x 4 bytes x 2^23 = 200 MB in float32.
DIAGNOSE_SCORE_ELEMENTS = 2**23
LIVE_SCORE_COPIES = 6
DIAGNOSTICS_DIR = "diagnostics"
FIGURE_DPI = 100


# ----------------------------------------------------------------------------- attention


# One layer's attention input: x (B, T, C), its positions ((T,) or (B, T)), its encoding and
# its randomized distances ((B, T) or None).
AttentionInput = tuple[torch.Tensor, torch.Tensor, PositionalEncoding, torch.Tensor | None]


def attention_inputs(
    model: Transformer, tokens: torch.Tensor, at: PositionDraw | None = None
) -> list[AttentionInput]:
    """Run ``model`` on ``tokens`` (B, T) at ``at`` (None: 0..T-1) and return each layer's
    attention input, recorded by forward pre-hooks."""
    at = at or PositionDraw()
    recorded: list[AttentionInput] = []

    def record(module: nn.Module, args: tuple) -> None:
        x, positions, encoding, biases = args[:4]
        recorded.append((x, positions, encoding, biases.distances))

    hooks = [block.attn.register_forward_pre_hook(record) for block in model.blocks]
    try:
        model(tokens, at.positions, distances=at.distances)
    finally:
        for hook in hooks:
            hook.remove()
    return recorded


def query_statistics(
    p: torch.Tensor, query_positions: torch.Tensor, key_positions: torch.Tensor, train_seq_len: int
) -> torch.Tensor:
    """STATISTICS of each query from its probabilities p (B, H, Tq, Tk) -> (4, B, H, Tq)."""
    distance = (query_positions[:, None] - key_positions[None, :]).clamp(min=0).to(p.dtype)
    return torch.stack(
        [
            torch.special.entr(p).sum(-1),  # entr(0) = 0: masked keys add nothing
            (p * distance).sum(-1),
            p[..., 0],
            (p * (distance >= train_seq_len)).sum(-1),
        ]
    )


def diagnose_block_size(rows: int, length: int) -> int:
    """Queries per block when ``rows`` (batch x heads) attend over ``length`` keys:
    DIAGNOSE_SCORE_ELEMENTS scores at most."""
    return max(1, min(length, DIAGNOSE_SCORE_ELEMENTS // (rows * length)))


def layer_statistics(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    encoding: PositionalEncoding,
    content: object | None,
    train_seq_len: int,
    bucket_of: torch.Tensor,
    n_buckets: int,
    distances: torch.Tensor | None = None,
    variant: AttentionVariant | None = None,
    sink_key: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """STATISTICS of one layer, summed over the batch and the queries of each bucket ->
    (4, H, n_buckets) float64, and the attention on key ``sink_key`` (counted from 0) summed
    over the batch and every query -> (H,) float64. ``content``: the encoding's content_state
    for this layer; ``bucket_of`` (T,) is each token's bucket; ``distances``: the layer's
    randomized distances (None: none); ``variant``: the layer's attention weights (sinks,
    sigmoid, stick-breaking; None: softmax)."""
    B, H, T, _ = q.shape
    tokens = torch.arange(T, device=q.device)  # the statistics count tokens, not positions
    sums = torch.zeros(len(STATISTICS), H, n_buckets, dtype=torch.float64, device=q.device)
    on_sink = torch.zeros(H, dtype=torch.float64, device=q.device)
    block = diagnose_block_size(B * H, T)
    # From the last block (the most keys) to the first, as in posbench.model.attention's blocked
    # paths: each block's temporaries then fit in memory the previous block freed.
    for start in reversed(range(0, T, block)):
        end = min(start + block, T)  # queries [start, end) attend to keys [0, end)
        # (B, H, n, e)
        p = attention_probabilities(
            q, k, positions, encoding, content, start, end, distances, variant
        )
        stats = query_statistics(p, tokens[start:end], tokens[:end], train_seq_len)
        sums.index_add_(2, bucket_of[start:end], stats.sum(1).double())  # (4, H, e - s)
        if sink_key < end:  # queries before the key give it nothing: it is masked for them
            on_sink += p[..., sink_key].sum((0, 2)).double()
    return sums, on_sink


@torch.inference_mode()
def diagnose(
    model: Transformer,
    windows_tokens: torch.Tensor,
    train_seq_len: int,
    positions: RandomPositions | None = None,
    keys: Sequence[int] | None = None,
    sink_epsilon: float = SINK_EPSILON,
    sink_token: int = SINK_TOKEN,
) -> dict[str, Any]:
    """Attention statistics of ``model`` on ``windows_tokens`` (K, N) at randomized
    ``positions`` (None: 0..N-1), drawn as evaluation draws them for the windows ``keys``
    (their starts in the split; None: 0..K-1): the content of ``L<N>.json`` (see the module
    docstring), each statistic as [layer][head][bucket], and Sink^eps_k at ``sink_epsilon``
    and ``sink_token`` (k, 1 = the first token)."""
    model.eval()
    K, N = windows_tokens.shape
    assert 1 <= sink_token <= N, "check_sink checks k"
    draws = PositionDraw() if positions is None else positions.of_windows(N, keys or range(K))
    buckets = position_buckets(N, train_seq_len)
    bucket_of = torch.zeros(N, dtype=torch.long, device=windows_tokens.device)  # (N,)
    for i, (start, end) in enumerate(buckets):
        bucket_of[start:end] = i
    shape = (len(STATISTICS), model.args.n_layer, model.args.n_head, len(buckets))
    sums = torch.zeros(shape, dtype=torch.float64)
    on_sink = torch.zeros(K, model.args.n_layer, model.args.n_head, dtype=torch.float64)
    for index, window in enumerate(windows_tokens):  # one at a time: the memory of one window
        at = draws.rows(torch.tensor([index]), N).to(window.device)
        inputs = attention_inputs(model, window[None], at)
        layers = zip(model.blocks, inputs, strict=True)
        for layer, (block, (x, at_layer, encoding, distances)) in enumerate(layers):
            # After the encoding's queries_and_keys (RoPE's rotation) and the layer's scaling.
            q, k, _, content = block.attn.queries_keys_values(x, at_layer, encoding)
            layer_sums, layer_on_sink = layer_statistics(
                q,
                k,
                at_layer,
                encoding,
                content,
                train_seq_len,
                bucket_of,
                len(buckets),
                distances,
                block.attn.variant,
                sink_token - 1,
            )
            sums[:, layer] += layer_sums.cpu()
            on_sink[index, layer] = layer_on_sink.cpu()
    queries = torch.tensor([K * (end - start) for start, end in buckets], dtype=torch.float64)
    means = sums / queries  # (4, L, H, buckets)
    after = [i for i, (start, _) in enumerate(buckets) if start >= train_seq_len]
    heatmap = None
    if after:  # query-weighted over the buckets at positions >= train_seq_len
        weights = queries[after] / queries[after].sum()
        heatmap = means[STATISTICS.index("mass_beyond_train_length")][..., after] @ weights
    return {
        "length": N,
        "windows": K,
        "train_seq_len": train_seq_len,
        "encoding": model.encoding.config.name,
        **model.encoding.scaling_record(N),
        **positions_record(positions, K),
        "n_layer": model.args.n_layer,
        "n_head": model.args.n_head,
        "buckets": [
            {"start": start, "end": end, "queries": int(n)}
            for (start, end), n in zip(buckets, queries.tolist(), strict=True)
        ],
        **{name: means[i].tolist() for i, name in enumerate(STATISTICS)},
        "mass_beyond_train_length_heatmap": None if heatmap is None else heatmap.tolist(),
        **sink_rates(on_sink / (N - sink_token + 1), sink_epsilon, sink_token),
        "definitions": DEFINITIONS,
    }


# ----------------------------------------------------------------------------- a run


def diagnosis_memory_bytes(model: Transformer, length: int, consecutive: bool = True) -> int:
    """An upper estimate of the memory ``diagnose`` adds for one window of ``length`` tokens at
    ``consecutive`` positions (else at randomized ones): the forward pass
    (posbench.evaluation.memory.inference_memory_bytes), the recorded attention inputs of every
    layer, one layer's q and k, and one block of scores."""
    a = model.args
    elements = a.n_layer * length * a.d_model + 2 * length * a.d_model
    elements += LIVE_SCORE_COPIES * a.n_head * diagnose_block_size(a.n_head, length) * length
    element_size = model.lm_head.weight.element_size()
    return inference_memory_bytes(model, 1, length, consecutive) + elements * element_size


def check_diagnosable(
    model: Transformer, length: int, device: torch.device, positions: RandomPositions | None = None
) -> None:
    """A one-line error when ``length`` is past the encoding's positions (or the randomized
    ``positions``' range) or does not fit."""
    if not model.args.causal:
        raise PosbenchError(
            "posbench diagnose writes out causal attention; this run attends both ways "
            "(model.causal=false)"
        )
    if positions is not None and length > positions.n_positions:
        raise PosbenchError(
            f"this run trained at randomized positions from [0, {positions.n_positions}) "
            f"(train.random_positions); diagnose at --length <= {positions.n_positions}"
        )
    if model.max_length is not None and length > model.max_length:
        raise PosbenchError(
            f"the {model.encoding.config.name} encoding represents {model.max_length} "
            f"positions; diagnose at --length <= {model.max_length}"
        )
    available = available_memory(device)
    needed = diagnosis_memory_bytes(model, length, positions is None or positions.consecutive)
    if available is not None and needed > available:
        raise PosbenchError(
            f"diagnosing {length} tokens needs about {needed / 1e9:.1f} GB and only "
            f"{available / 1e9:.1f} GB is available on {device.type}; pass a shorter --length"
        )


def validation_windows(
    tokens: Bytes, length: int, n_windows: int, documents: Offsets | None = None
) -> torch.Tensor:
    """The first ``n_windows`` non-overlapping windows of ``length`` tokens -> (K, length),
    inside the documents that start at ``documents`` (None: one stream) as evaluation cuts them
    (``window_starts``)."""
    return gather_windows(tokens, window_starts(len(tokens), length, n_windows, documents), length)


def window_starts(
    n_tokens: int, length: int, n_windows: int, documents: Offsets | None = None
) -> list[int]:
    """Where ``validation_windows`` cuts its windows in a split of ``n_tokens`` tokens (the keys
    evaluation draws their randomized positions by).

    Only whole windows: evaluation's last window may overlap the one before it to score the
    leftover tail, and its queries would be counted twice here."""
    spans = document_windows(document_bounds(n_tokens, documents), length, None)
    whole = (start for start, first_scored in spans if not first_scored)
    starts = list(islice(whole, n_windows))
    if len(starts) < n_windows:
        split = (
            f"the validation split has {n_tokens} tokens:"
            if documents is None
            else f"the {len(documents)} validation documents ({n_tokens} tokens) hold"
        )
        raise PosbenchError(
            f"{split} {len(starts)} windows of {length} tokens, fewer than --windows "
            f"{n_windows}; pass --windows <= {len(starts)} or a shorter --length"
            if starts
            else too_short(n_tokens, documents, length, "--length")
        )
    return starts


def diagnose_run(
    run_dir: str | Path,
    length: int,
    n_windows: int = 4,
    device: str = "auto",
    sink_epsilon: float = SINK_EPSILON,
    sink_token: int = SINK_TOKEN,
) -> tuple[dict[str, Any], list[Path]]:
    """Diagnose a trained run at ``length`` on ``n_windows`` windows of its validation split
    (the split and windows ``posbench eval`` scores), Sink^eps_k at ``sink_epsilon`` and
    ``sink_token``; write the JSON, the figures, the TensorBoard images and the sink rate
    into results.json. Returns the JSON content and the paths written."""
    check_sink(length, sink_epsilon, sink_token)
    run_dir = Path(run_dir)
    model, cfg = load_run(run_dir, resolve_device(device))
    model_device = next(model.parameters()).device
    positions = eval_positions(cfg)  # where evaluation scores the run
    check_diagnosable(model, length, model_device, positions)
    corpus = load_corpus(cfg.data)
    starts = window_starts(len(corpus.val), length, n_windows, corpus.val_documents)
    tokens = gather_windows(corpus.val, starts, length)  # (K, length)
    result = diagnose(
        model,
        tokens.to(model_device),
        cfg.train.seq_len,
        positions,
        starts,
        sink_epsilon,
        sink_token,
    )
    record_sink(run_dir, result)
    return result, write_diagnostics(run_dir, result)


# ----------------------------------------------------------------------------- outputs


def bucket_ends(result: dict[str, Any]) -> np.ndarray:
    return np.array([b["end"] for b in result["buckets"]])


def entropy_figure(result: dict[str, Any]) -> Figure:
    """Entropy against query position (log x, each bucket at its end), one panel per layer,
    one line per head; uniform attention's entropy dashed, the training length marked."""
    # matplotlib takes a second to import: only a diagnose that draws pays for it
    from matplotlib.figure import Figure

    n_layer = result["n_layer"]
    figure = Figure(figsize=(4 * n_layer, 3.5), dpi=FIGURE_DPI, layout="constrained")
    axes = figure.subplots(1, n_layer, squeeze=False, sharey=True)[0]
    ends = bucket_ends(result)
    uniform = [np.log(np.arange(b["start"], b["end"]) + 1).mean() for b in result["buckets"]]
    for layer, ax in enumerate(axes):
        for head, entropy in enumerate(result["entropy"][layer]):
            ax.plot(ends, entropy, marker=".", label=f"head {head}")
        ax.plot(ends, uniform, color="black", linestyle=":", label="uniform")
        ax.axvline(result["train_seq_len"], color="grey", linestyle="--", label="train length")
        ax.set_xscale("log", base=2)
        ax.set_title(f"layer {layer}", fontsize="small")
        ax.set_xlabel("query position (bucket end)")
        ax.grid(True, alpha=0.3)
    axes[0].set_ylabel("attention entropy (nats)")
    axes[-1].legend(fontsize="x-small")
    figure.suptitle(f"{result['encoding']}: attention entropy at {result['length']} tokens")
    return figure


def heatmap_figure(result: dict[str, Any]) -> Figure:
    """The layer x head heatmap of mass_beyond_train_length over queries past the training
    length, each cell labelled with its value."""
    # matplotlib takes a second to import: only a diagnose that draws pays for it
    from matplotlib.figure import Figure

    values = np.array(result["mass_beyond_train_length_heatmap"])  # (L, H)
    size = (1.2 * values.shape[1] + 2, 0.8 * values.shape[0] + 1.5)
    figure = Figure(figsize=size, dpi=FIGURE_DPI, layout="constrained")
    ax = figure.subplots()
    image = ax.imshow(values, vmin=0.0, vmax=1.0, cmap="viridis")
    for (layer, head), value in np.ndenumerate(values):
        color = "white" if value < 0.6 else "black"  # readable on the dark and the light end
        ax.text(head, layer, f"{value:.2f}", ha="center", va="center", color=color, fontsize=8)
    ax.set_xticks(range(values.shape[1]))
    ax.set_yticks(range(values.shape[0]))
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(
        f"{result['encoding']}: mass at distance >= {result['train_seq_len']}\n"
        f"(queries {result['train_seq_len']}..{result['length'] - 1})",
        fontsize="small",
    )
    figure.colorbar(image, ax=ax)
    return figure


def figures(result: dict[str, Any]) -> dict[str, Figure]:
    """The figures of a diagnosis by name (the heatmap only when the window is longer than
    the training length: before it no key is that far)."""
    named = {"entropy": entropy_figure(result)}
    if result["mass_beyond_train_length_heatmap"] is not None:
        named["mass_beyond_train_length"] = heatmap_figure(result)
    return named


def write_diagnostics(run_dir: Path, result: dict[str, Any]) -> list[Path]:
    """``<run>/diagnostics/L<N>.json`` and ``L<N>_<figure>.png``, each atomically, and the
    figures as TensorBoard images ``diagnostics/L<N>/<figure>`` in the run."""
    out = run_dir / DIAGNOSTICS_DIR
    stem = f"L{result['length']}"
    written = [out / f"{stem}.json"]
    write_json(written[0], result)
    # Each figure drawn once, as a PNG, which the file and TensorBoard's image both hold
    # (add_figure would draw it again: a tenth of a diagnosis at 2,048 tokens).
    drawn = {name: png_bytes(figure) for name, figure in figures(result).items()}
    for name, data in drawn.items():
        written.append(out / f"{stem}_{name}.png")
        atomic_write(written[-1], data)
    with SummaryWriter(log_dir=str(run_dir)) as writer:
        for name, data in drawn.items():
            image = np.asarray(PIL.Image.open(io.BytesIO(data)).convert("RGB"))  # (H, W, 3)
            writer.add_image(f"{DIAGNOSTICS_DIR}/{stem}/{name}", image, dataformats="HWC")
    return written


def png_bytes(figure: Figure) -> bytes:
    """``figure`` drawn as a PNG file's bytes, at FIGURE_DPI."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=FIGURE_DPI)
    return buffer.getvalue()


def summary_table(result: dict[str, Any]) -> str:
    """One line per layer and head: each statistic averaged over all the window's queries."""
    queries = np.array([b["queries"] for b in result["buckets"]], dtype=float)
    header = "| layer | head | " + " | ".join(STATISTICS) + " |"
    lines = [header, "|" + " --- |" * (2 + len(STATISTICS))]
    for layer in range(result["n_layer"]):
        for head in range(result["n_head"]):
            values = [
                float(np.average(result[name][layer][head], weights=queries)) for name in STATISTICS
            ]
            lines.append(f"| {layer} | {head} | " + " | ".join(f"{v:.3f}" for v in values) + " |")
    return "\n".join(lines)
