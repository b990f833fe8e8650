"""eval.temperature=fit: DroPE's logit temperature beta = 1 + c ln(L / L_train), c fitted on
the training split, applied at every evaluation length and recorded."""

import dataclasses
import math

import numpy as np
import pytest
import torch
from conftest import TINY, TINY_RUN
from hypothesis import given, settings
from hypothesis import strategies as st

from posbench.config import compose_config
from posbench.data import load_data
from posbench.errors import PosbenchError
from posbench.evaluation import temperature
from posbench.evaluation.run import evaluate_data, evaluate_run
from posbench.evaluation.temperature import (
    check_temperature,
    fit_temperature,
    golden_section_minimum,
    slope_through_origin,
)
from posbench.model import build_model
from posbench.runs.results import merge_eval_records
from posbench.training.train import train

NOPE = {"n_layer": 1, "n_head": 1, "d_model": 16}


def sharp_nope(seed: int = 0) -> torch.nn.Module:
    """A NoPE model whose attention and outputs are sharp enough for the temperature to matter
    (weights of std 0.5: attention logits and next-token logits of a few units)."""
    torch.manual_seed(seed)
    model = build_model(NOPE, {"name": "none"})
    for weight in model.parameters():
        if weight.dim() == 2:
            torch.nn.init.normal_(weight, std=0.5)
    return model.eval()


def test_the_temperature_multiplies_the_logits_as_a_scaled_query_projection():
    # The reference (SakanaAI/DroPE) sets the attention's softmax scale: beta / sqrt(hs) on
    # q.k, which is the model with its query projection times beta.
    beta, tokens = 1.7, torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    ours, reference = sharp_nope().double(), sharp_nope().double()
    with torch.no_grad():
        reference.blocks[0].attn.qkv.weight[:16] *= beta  # the rows that make q
    ours.set_logit_temperature(beta)
    out, expected = ours(tokens), reference(tokens)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-10)
    out.square().sum().backward()
    expected.square().sum().backward()
    theirs = dict(reference.named_parameters())
    for name, weight in ours.named_parameters():
        grad = theirs[name].grad
        if name.endswith("qkv.weight"):  # d/dW_q of the scaled projection is beta times ours
            grad = torch.cat([grad[:16] * beta, grad[16:]])
        torch.testing.assert_close(weight.grad, grad, rtol=1e-9, atol=1e-9)


@settings(max_examples=10, deadline=None)
@given(st.floats(0.3, 3.9))
def test_the_golden_section_search_finds_a_unimodal_minimum(best):
    assert golden_section_minimum(lambda x: (x - best) ** 2, 0.25, 4.0) == pytest.approx(
        best, abs=1e-3
    )


@settings(max_examples=10, deadline=None)
@given(st.floats(-2, 2), st.lists(st.floats(0.1, 4), min_size=1, max_size=4, unique=True))
def test_c_is_the_slope_of_points_on_its_line(c, xs):
    assert slope_through_origin({x: c * x for x in xs}) == pytest.approx(c, abs=1e-9)


def sampled_documents(model, beta: float, n: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` documents of ``length`` + 1 bytes: a random first byte, then each next one drawn
    from ``model`` at logit temperature ``beta``; with each document's start."""
    generator = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 256, (n, 1), generator=generator)
    model.set_logit_temperature(beta)
    with torch.no_grad():
        for _ in range(length):
            probabilities = model(rows)[:, -1].softmax(-1)  # (n, vocab)
            rows = torch.cat([rows, torch.multinomial(probabilities, 1, generator=generator)], 1)
    model.set_logit_temperature(1.0)
    return rows.flatten().numpy().astype(np.uint8), np.arange(n) * (length + 1)


def test_c_is_recovered_where_the_best_temperature_at_twice_the_training_length_is_known(
    monkeypatch,
):
    # Text drawn from the model itself at beta = 2 over windows of 2 L_train: the likelihood is
    # highest at the beta that drew it, so the fit must find beta(2L) = 2, c = 1 / ln 2.
    monkeypatch.setattr(temperature, "BETA_TOLERANCE", 1e-2)
    model = sharp_nope()
    tokens, documents = sampled_documents(model, 2.0, 240, 32)
    fit = fit_temperature(model, tokens, 16, [16, 32], documents=documents)
    assert fit.betas[32] == pytest.approx(2.0, abs=0.1)
    assert fit.c == pytest.approx(1 / math.log(2), abs=0.15)
    assert fit.beta(16) == 1.0 and fit.beta(32) == pytest.approx(fit.betas[32])


def test_the_fit_reads_the_training_split_only(cache_dir, monkeypatch):
    monkeypatch.setattr(temperature, "CALIBRATION_TOKENS", 1024)
    monkeypatch.setattr(temperature, "BETA_TOLERANCE", 1e-2)
    data = load_data(compose_config([*TINY, f"data.cache_dir={cache_dir}"]).data)
    model = sharp_nope()

    def fitted_c(corpus) -> float:
        records = evaluate_data(
            model, corpus, [16, 32], max_tokens=512, train_seq_len=16, temperature="fit"
        )
        return records[0]["temperature_c"]

    other_validation = dataclasses.replace(data, val=np.roll(data.val, 1000)[::-1].copy())
    other_training = dataclasses.replace(data, train=np.roll(data.train, 1000)[::-1].copy())
    assert fitted_c(other_validation) == fitted_c(data)
    assert fitted_c(other_training) != fitted_c(data)


def test_a_fitted_run_records_c_and_beta_at_every_length(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(temperature, "CALIBRATION_TOKENS", 1024)
    monkeypatch.setattr(temperature, "BETA_TOLERANCE", 1e-2)
    fitted = ["eval.temperature=fit", "eval.lengths=[16,32]", "eval.max_tokens=256"]
    overrides = [*tiny, "encoding=none", "train.steps=3", *fitted]
    results = train(compose_config(overrides), tmp_path)
    records = {r["length"]: r for r in results["eval"]}
    assert records.keys() == {16, 32}
    c = records[16]["temperature_c"]
    assert {r["temperature_c"] for r in records.values()} == {c}
    assert records[16]["temperature_fit"]["split"] == "train"
    assert records[16]["temperature_fit"]["betas"].keys() == {"32"}
    for length, record in records.items():
        assert record["scaling"] == "temperature"
        assert record["scaling_factor"] == pytest.approx(1 + c * math.log(length / 16))
    # posbench eval's path: the run's own eval.temperature, fitted again on its training split.
    (again,) = evaluate_run(tmp_path, [32], max_tokens=256)
    assert again["temperature_c"] == pytest.approx(c) and again["ppl"] == records[32]["ppl"]
    (plain,) = evaluate_run(tmp_path, [32], max_tokens=256, temperature="none")
    assert plain["scaling"] == "none" and "temperature_c" not in plain


@pytest.mark.parametrize(
    ("overrides", "lengths", "message"),
    [
        (["eval.temperature=hot"], [32], "eval.temperature must be one of none, fit"),
        (["data=passkey"], [32], "data=passkey is a task"),
        (["encoding.scaling.method=yarn"], [32], "method=yarn are two eval-time extensions"),
        (
            ["encoding=hybrid", "encoding.encodings.rope.scaling.method=linear"],
            [32],
            r"encoding\.encodings\.rope\.scaling\.method=linear are two",
        ),
        ([], [16, 24], r"multiples of train.seq_len=16 .*\[16, 24\] has none"),
    ],
)
def test_a_temperature_that_cannot_apply_is_one_line(overrides, lengths, message):
    cfg = compose_config([*TINY_RUN, "eval.temperature=fit", *overrides])
    with pytest.raises(PosbenchError, match=message) as info:
        check_temperature(cfg.eval.temperature, cfg, lengths)
    assert "\n" not in str(info.value)


def test_a_fit_made_again_replaces_its_record():
    record = {"length": 32, "stride": None, "scaling": "temperature", "positions": "consecutive"}
    first, again = ({**record, "scaling_factor": beta} for beta in (1.5, 1.4))
    merged = merge_eval_records({"eval": [first]}, [again])
    assert merged["eval"] == [again]
