"""Greedy decoding of task answers: the model answers from its own argmax, as Ruoss et al.'s
reference (google-deepmind/randomized_positional_encodings) decodes in its autoregressive mode,
where scoring under teacher forcing would predict each answer byte from the true bytes before
it (a rule that repeats the previous answer byte then scores high on a sorted answer).

An answer is autoregressive: the input after an answer target is that target's byte. Decoded, it is
the model's prediction of that target instead. A batch's examples may differ in their prompts' and
answers' lengths, so they are decoded in lockstep: the tokens before the first input any row feeds
back go through the model at once (the prompt, cached: posbench/model/kv_cache.py), then one token
per step, each row's true input where it is still prompt and its own previous prediction where it
answers. Rows past their end decode padding, which is never scored.
"""

from __future__ import annotations

import torch

from posbench.errors import PosbenchError
from posbench.model import Transformer
from posbench.model.kv_cache import DecodeCache

NOT_DECODED = -1  # a prediction that was not made (before the prompt's last input): no byte


@torch.inference_mode()
def greedy_decode(
    model: Transformer,
    inputs: torch.Tensor,
    answer: torch.Tensor,
    positions: torch.Tensor | None = None,
    distances: torch.Tensor | None = None,
    use_cache: bool = True,
) -> torch.Tensor:
    """The model's argmax at each target of ``inputs`` (B, T) whose answer targets ``answer``
    (B, T, bool) it decodes itself: the input after an answer target is its prediction of that
    target, at ``positions`` (T,), (B, T) or (n_layer, B, T) (None: 0..T-1) and randomized
    ``distances`` (None, (B, T) or (n_layer, B, T): posbench/model/random_positions.py) -> (B, T)
    int64, NOT_DECODED before the last input every row takes from the prompt and after the
    last answer target.

    Each step's logits are those a forward pass over the whole decoded sequence has at its
    token (the cache transforms q and k in their place in it: posbench/model/kv_cache.py).
    ``use_cache`` False recomputes the prefix at every step instead, in O(T^2) per step (what
    benchmarks/decode_cache.py compares with): the same predictions but where an encoding reads
    the whole sequence's positions (RoPE's scaling factor from the length, from the prefix's).
    """
    if not model.args.causal:
        raise PosbenchError(
            "greedy decoding reads each answer token from those before it: a model.causal=false "
            "model writes its answers at once, at placeholders (data.answer_mode=placeholders)"
        )
    B, T = inputs.shape
    device = inputs.device
    predictions = torch.full((B, T), NOT_DECODED, dtype=torch.long, device=device)
    answered = answer.any(0).nonzero()  # (targets with an answer in some row, 1)
    if len(answered) == 0:
        return predictions
    end = int(answered[-1]) + 1  # the last answer target's, plus one: the inputs decoded
    fed_back = torch.zeros_like(answer)  # (B, T): the input is the previous prediction
    fed_back[:, 1:] = answer[:, :-1]
    # Every input before the first one fed back is prompt, in every row (the first input is).
    fed_columns = fed_back.any(0).nonzero()
    prompt = int(fed_columns[0]) if len(fed_columns) else end
    if positions is None:
        positions = torch.arange(T, device=device)  # (T,), else as drawn
    decoded = inputs[:, :end].clone()  # (B, end): the inputs, as decoded so far
    cache = DecodeCache(positions, len(model.blocks), distances) if use_cache else None

    def last_logits(start: int, stop: int) -> torch.Tensor:
        """The logits (B, vocab) after the inputs decoded before ``stop``, those before
        ``start`` cached."""
        if cache is None:
            at = None if distances is None else distances[..., :stop]
            return model(decoded[:, :stop], positions[..., :stop], distances=at)[:, -1]
        return model(decoded[:, start:stop], cache=cache)[:, -1]

    predictions[:, prompt - 1] = last_logits(0, prompt).argmax(-1)
    for t in range(prompt, end):
        previous = predictions[:, t - 1]  # (B,)
        decoded[:, t] = torch.where(fed_back[:, t], previous, decoded[:, t])
        predictions[:, t] = last_logits(t, t + 1).argmax(-1)
    return predictions
