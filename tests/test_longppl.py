"""LongPPL: the key tokens an evaluator selects (checked against the ``longppl`` package's own
``find_key_token``) and the perplexity over them."""

import json
import math
from types import SimpleNamespace

import pytest
import torch
from conftest import finished_run
from longppl.longppl import find_key_token
from omegaconf import OmegaConf

from posbench.errors import PosbenchError
from posbench.evaluation.longppl import KeyTokens, check_evaluator, key_token_cache
from posbench.evaluation.perplexity import evaluate_length, windows
from posbench.model import build_model
from posbench.report import build_report
from posbench.report.tables import markdown
from posbench.runs.directory import WEIGHTS_FILE
from posbench.runs.results import append_eval_results

S, W, L = 16, 4, 64  # training length, short-context stride, window


def tiny_model(encoding="alibi"):
    torch.manual_seed(0)
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16}, {"name": encoding})
    return model.double().eval()


def differences(model, rows):
    """Each target's long-minus-short log-probability and long log-probability (B, T)."""
    selection = KeyTokens(model, S, short_stride=W)
    long = selection.log_probs(rows)
    return long - selection.short_log_probs(rows), long


def between(values):
    """A threshold halfway between the two middle distinct values: no value sits at it."""
    distinct = sorted(set(values.flatten().tolist()))
    middle = len(distinct) // 2
    return (distinct[middle - 1] + distinct[middle]) / 2


class ByteTokenizer:
    """The stand-in tokenizer find_key_token calls: the "text" is already token ids (1, n), and
    token j covers the characters [j, j + 1)."""

    def __call__(self, text, return_tensors, return_offsets_mapping):
        n = text.shape[1]
        offsets = torch.stack([torch.arange(n), torch.arange(1, n + 1)], dim=1)[None]
        return {"input_ids": text, "offset_mapping": offsets}


class Evaluator:
    """A posbench model as find_key_token calls a transformers model."""

    device = torch.device("cpu")

    def __init__(self, model):
        self.model = model

    def __call__(self, input_ids):
        return SimpleNamespace(logits=self.model(input_ids))


@pytest.mark.parametrize("encoding", ["alibi", "rope"])
def test_the_key_tokens_are_those_the_longppl_packages_find_key_token_selects(encoding):
    model = tiny_model(encoding)
    rows = torch.randint(0, 256, (1, L + 1))
    lsd, long = differences(model, rows)
    past = lsd[:, S:]  # within the first S targets both contexts are the same: 0 but noise
    alpha, beta = between(past[past > 0]), between(long[:, S:])  # a random model's LSD is small
    mine = KeyTokens(model, S, alpha, beta, short_stride=W)(rows)[0]  # (L,): target t
    assert 0 < mine.sum() < L - S  # the thresholds cut through the tokens
    # The package's windows of trunc_len + sliding_window tokens score a token with trunc_len to
    # trunc_len + sliding_window - 1 tokens of context: S - W + 1 to S, as ours of S inputs do.
    intervals = find_key_token(
        rows, Evaluator(model), ByteTokenizer(), S - W + 1, W, alpha=alpha, beta=beta
    )
    theirs = {j for start, end in intervals.tolist() for j in range(start, end)}  # token j
    assert {t + 1 for t in mine.nonzero().flatten().tolist()} == theirs


def test_the_first_training_length_of_targets_and_a_short_window_have_no_key_token():
    model = tiny_model()
    rows = torch.randint(0, 256, (2, L + 1))
    lsd, _ = differences(model, rows)
    assert lsd[:, :S].abs().max() < 1e-5  # the same context both ways
    assert not KeyTokens(model, S, alpha=-1.0, beta=-1e9)(rows[:, : S + 1]).any()


@pytest.mark.parametrize("every", [1, 3, None], ids=["all", "every third", "none"])
def test_longppl_is_the_perplexity_over_the_selected_targets_that_are_scored(every):
    model = tiny_model()
    tokens = torch.randint(0, 256, (256,))

    class Select:  # every ``every``-th position of each window
        def __call__(self, rows):
            chosen = torch.zeros_like(rows[:, 1:], dtype=torch.bool)
            chosen[:, :: every or len(chosen[0]) + 1] = every is not None
            return chosen

        def memory_bytes(self, batch_size, length):
            return 0

    record = evaluate_length(model, tokens, 32, key_tokens=Select())
    key_nll = []  # by hand: each window's targets from its first scored one
    for start, first in windows(256, 32, None):
        row = tokens[None, start : start + 33]
        nll = model(row[:, :-1], targets=row[:, 1:], reduction="none")[0]
        key_nll += [nll[i].item() for i in range(first, 32) if every and i % every == 0]
    assert record["key_tokens"] == len(key_nll)
    if every is None:
        assert record["longppl"] is None
    else:
        assert record["longppl"] == pytest.approx(math.exp(sum(key_nll) / len(key_nll)))
    assert record["ppl"] == evaluate_length(model, tokens, 32)["ppl"]


def test_a_cached_selection_is_read_back_for_the_same_batch_and_settings_only(tmp_path):
    """The evaluator's passes are most of LongPPL's time and a sweep scores every run on the
    same windows: a batch's selection is kept and read back, with no evaluator pass, for the
    same tokens and settings; other settings or tokens select again."""
    model = tiny_model()
    passes = []
    model.register_forward_hook(lambda *_: passes.append(1))
    rows = torch.randint(0, 256, (2, L + 1))

    def selection(alpha, rows, cache=None):
        return KeyTokens(model, S, alpha, beta=-1e9, short_stride=W, cache=cache)(rows)

    fresh = selection(0.0, rows)
    assert 0 < fresh.sum() < fresh.numel()
    assert torch.equal(selection(0.0, rows, tmp_path), fresh)  # selected, then kept
    passes.clear()
    assert torch.equal(selection(0.0, rows, tmp_path), fresh) and not passes
    assert torch.equal(selection(0.5, rows, tmp_path), selection(0.5, rows)) and passes
    other = rows.clone()
    other[0, -1] = (other[0, -1] + 1) % 256
    assert torch.equal(selection(0.0, other, tmp_path), selection(0.0, other))
    assert len(list(tmp_path.iterdir())) == 3


def test_an_unreadable_cached_selection_is_selected_again_and_replaced(tmp_path):
    model = tiny_model()
    rows = torch.randint(0, 256, (1, L + 1))
    selection = KeyTokens(model, S, alpha=0.0, beta=-1e9, short_stride=W, cache=tmp_path)
    fresh = selection(rows)
    (path,) = tmp_path.iterdir()
    path.write_bytes(b"not a safetensors file")
    assert torch.equal(selection(rows), fresh)
    passes = []
    model.register_forward_hook(lambda *_: passes.append(1))
    assert torch.equal(selection(rows), fresh) and not passes  # the file was written again


def test_the_cache_of_an_evaluator_is_its_weights_own(tmp_path):
    """A run trained again (other weights) never reads the selections of the one before."""
    for name, weights in [("a", b"one"), ("b", b"two"), ("c", b"one")]:
        (tmp_path / name).mkdir()
        (tmp_path / name / WEIGHTS_FILE).write_bytes(weights)
    a, b, c = (key_token_cache(tmp_path / name, str(tmp_path / "cache")) for name in "abc")
    assert a != b and a == c and a.parent == tmp_path / "cache" / "longppl"


def test_an_evaluator_of_other_data_is_a_one_line_error():
    mine = OmegaConf.create({"data": {"name": "synthetic", "seed": 0, "cache_dir": "a"}})
    theirs = OmegaConf.create({"data": {"name": "synthetic", "seed": 1, "cache_dir": "b"}})
    with pytest.raises(PosbenchError, match=r"its data differs in data\.seed:"):
        check_evaluator(mine, tiny_model(), theirs, [64])
    check_evaluator(mine, tiny_model(), mine, [64])


def test_a_report_of_longppl_shows_its_values_and_says_why_it_has_no_ratio(tmp_path):
    records = [
        {"length": n, "stride": None, "ppl": 3.0, "longppl": value, "status": "ok"}
        for n, value in [(16, None), (64, 5.0)]
    ]
    finished_run(tmp_path / "run", "alibi", {"eval": records})
    text = markdown(build_report(tmp_path, metric="longppl"))
    assert "| alibi | 1 | – [1] | 5.00 |" in text
    assert "LongPPL at the training length is null" in text


def test_a_longppl_record_and_a_plain_one_of_a_length_stand_side_by_side(tmp_path):
    (tmp_path / "results.json").write_text(json.dumps({"train_seq_len": 16, "eval": []}))
    plain = {"length": 64, "stride": None, "ppl": 3.0, "status": "ok"}
    longppl = {**plain, "longppl": 5.0, "longppl_evaluator": "/runs/judge"}
    append_eval_results(tmp_path, [longppl])
    append_eval_results(tmp_path, [plain])
    results = append_eval_results(tmp_path, [{**longppl, "longppl": 6.0}])  # measured again
    assert sorted(r.get("longppl", 0) for r in results["eval"]) == [0, 6.0]


def test_a_report_counts_a_run_with_a_plain_and_a_longppl_record_once(tmp_path):
    records = [
        {"length": n, "stride": None, "ppl": 3.0, "status": "ok", **judged}
        for n in (16, 64)
        for judged in ({}, {"longppl": 5.0, "longppl_evaluator": "/runs/judge"})
    ]
    finished_run(tmp_path / "run", "alibi", {"eval": records})
    assert "| alibi | 1 | 3.00 | 3.00 |" in markdown(build_report(tmp_path))
    assert "| alibi | 1 | 5.00 | 5.00 |" in markdown(build_report(tmp_path, metric="longppl"))
