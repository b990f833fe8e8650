"""posbench diagnose: exact attention statistics, checked against closed forms and the model."""

import io
import json

import numpy as np
import PIL.Image
import pytest
import torch
from conftest import error_line, finished_run, posbench, terabyte_split
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from posbench.cli import main
from posbench.config import compose_config
from posbench.data import load_corpus
from posbench.encodings import build_encoding, encoding_names
from posbench.encodings.alibi import alibi_slopes
from posbench.errors import PosbenchError
from posbench.evaluation import diagnose as diagnose_module
from posbench.evaluation.diagnose import (
    STATISTICS,
    attention_inputs,
    check_diagnosable,
    diagnose,
    diagnose_run,
    diagnosis_memory_bytes,
    validation_windows,
)
from posbench.evaluation.perplexity import position_buckets, windows
from posbench.evaluation.sink import SINK_RECORD, sink_rates
from posbench.model import Transformer, build_model
from posbench.model.args import ModelArgs
from posbench.model.attention import attention_probabilities
from posbench.model.random_positions import PositionDraw, PositionSampler, randomizes_distances
from posbench.report import build_report
from posbench.report.tables import json_content, markdown
from posbench.runs.directory import load_run_config
from posbench.training.train import train

S = 16  # the training length of the hand-built models


def zero_qk_alibi_model() -> Transformer:
    """One ALiBi layer whose q and k are zero: query i attends to key j with weight
    proportional to exp(-m (i - j)), whatever the tokens."""
    model = Transformer(
        ModelArgs(n_layer=1, n_head=2, d_model=8), build_encoding({"name": "alibi"}, 8, 2)
    )
    torch.nn.init.zeros_(model.blocks[0].attn.qkv.weight)
    return model.double()  # float64: the statistics can be compared to 1e-9


def closed_form(m: float, i: int) -> dict[str, float]:
    """The statistics of query i when p_ij = r^(i - j) / Z, r = exp(-m), from the geometric
    series: Z = sum_{d=0}^{i} r^d, E[d] = sum d r^d / Z, H = ln Z + m E[d]."""
    r = np.exp(-m)
    z = (1 - r ** (i + 1)) / (1 - r)
    mean_d = r * (1 - (i + 1) * r**i + i * r ** (i + 1)) / (1 - r) ** 2 / z
    beyond = (r**S - r ** (i + 1)) / (1 - r) / z if i >= S else 0.0
    return {
        "entropy": np.log(z) + m * mean_d,
        "mean_distance": mean_d,
        "sink_mass": r**i / z,
        "mass_beyond_train_length": beyond,
    }


@pytest.mark.parametrize("block_elements", [2**23, 2 * 48 * 5])  # one block; blocks of 5
def test_zero_qk_alibi_statistics_equal_the_closed_form(monkeypatch, block_elements):
    monkeypatch.setattr(diagnose_module, "DIAGNOSE_SCORE_ELEMENTS", block_elements)
    tokens = torch.randint(0, 256, (3, 48))
    result = diagnose(zero_qk_alibi_model(), tokens, train_seq_len=S)
    assert [(b["start"], b["end"]) for b in result["buckets"]] == position_buckets(48, S)
    for head, m in enumerate(alibi_slopes(2).tolist()):
        for bucket, b in enumerate(result["buckets"]):
            queries = range(b["start"], b["end"])
            for name in STATISTICS:
                expected = np.mean([closed_form(m, i)[name] for i in queries])
                assert result[name][0][head][bucket] == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_the_heatmap_is_the_mass_beyond_averaged_over_queries_past_the_training_length():
    result = diagnose(zero_qk_alibi_model(), torch.randint(0, 256, (1, 48)), train_seq_len=S)
    for head, m in enumerate(alibi_slopes(2).tolist()):
        expected = np.mean([closed_form(m, i)["mass_beyond_train_length"] for i in range(S, 48)])
        assert result["mass_beyond_train_length_heatmap"][0][head] == pytest.approx(expected)


def test_within_the_training_length_nothing_is_beyond_it_and_there_is_no_heatmap():
    result = diagnose(zero_qk_alibi_model(), torch.randint(0, 256, (2, S)), train_seq_len=S)
    assert result["mass_beyond_train_length_heatmap"] is None
    assert np.all(np.array(result["mass_beyond_train_length"]) == 0.0)


def zero_qk_fire_model(n_layer: int, per_layer: bool) -> Transformer:
    """FIRE layers (L = 8) whose q and k are zero: each layer's attention is its FIRE's bias."""
    encoding = {"name": "fire", "threshold": 8.0, "per_layer": per_layer}
    model = build_model({"n_layer": n_layer, "n_head": 2, "d_model": 8}, encoding)
    for block in model.blocks:
        torch.nn.init.zeros_(block.attn.qkv.weight[:16])  # the q and k rows
    return model.double()


def test_a_per_layer_fire_models_layers_are_read_with_their_own_encodings():
    torch.manual_seed(0)
    model = zero_qk_fire_model(n_layer=2, per_layer=True)
    with torch.no_grad():
        for parameter in model.deeper_encodings.parameters():  # far from the first layer's
            parameter.normal_(std=1.0)
    tokens = torch.randint(0, 256, (2, 24))
    result = diagnose(model, tokens, train_seq_len=S)
    for layer, encoding in enumerate(model.layer_encodings):
        alone = zero_qk_fire_model(n_layer=1, per_layer=False)
        alone.encoding.load_state_dict(encoding.state_dict())
        expected = diagnose(alone, tokens, train_seq_len=S)
        for name in STATISTICS:  # [layer][head][bucket]
            np.testing.assert_allclose(result[name][layer], expected[name][0], rtol=1e-9)


@pytest.mark.parametrize("k", [1, 3])
def test_sink_attention_is_the_mean_attention_on_token_k_over_the_queries_that_see_it(k):
    """By hand: p_ij = r^(i - j) / Z_i on the zero-q/k ALiBi layer, key j = k - 1."""
    result = diagnose(zero_qk_alibi_model(), torch.randint(0, 256, (2, 24)), S, sink_token=k)
    for head, m in enumerate(alibi_slopes(2).tolist()):
        r = np.exp(-m)
        p = [r ** (i - k + 1) * (1 - r) / (1 - r ** (i + 1)) for i in range(k - 1, 24)]
        assert result["sink_attention"][0][head] == pytest.approx(np.mean(p), rel=1e-9)


def test_the_sink_rate_is_the_share_of_heads_whose_attention_on_token_k_exceeds_epsilon():
    tokens = torch.randint(0, 256, (2, 64))
    attention = diagnose(zero_qk_alibi_model(), tokens, S)["sink_attention"][0]  # [head]
    between = sum(attention) / 2  # one head above it, one below
    result = diagnose(zero_qk_alibi_model(), tokens, S, sink_epsilon=between)
    assert (result["sink_rate"], result["sink_rate_by_layer"]) == (0.5, [0.5])
    assert diagnose(zero_qk_alibi_model(), tokens, S, sink_epsilon=1.0)["sink_rate"] == 0.0


def test_each_window_is_thresholded_alone_as_the_papers_code_does():
    # head 0 sinks in window 0 only (its mean over windows, 0.35, would sink); head 1 never
    attention = torch.tensor([[[0.5, 0.1]], [[0.2, 0.1]]], dtype=torch.float64)  # (K, L, H)
    rates = sink_rates(attention, epsilon=0.3, token=1)
    assert (rates["sink_rate"], rates["sink_rate_by_layer"]) == (0.25, [0.25])
    assert rates["sink_attention"] == [[pytest.approx(0.35), pytest.approx(0.1)]]


def test_buckets_count_every_query_of_every_window():
    result = diagnose(zero_qk_alibi_model(), torch.randint(0, 256, (3, 40)), train_seq_len=S)
    assert [b["queries"] for b in result["buckets"]] == [
        3 * (end - start) for start, end in position_buckets(40, S)
    ]


@pytest.mark.parametrize(
    "encoding",
    [{"name": name} for name in encoding_names()]
    + [{"name": "rope", "scaling": {"method": "yarn", "factor": 4.0, "original_length": 8}}]
    + [{"name": "fire", "per_layer": True, "threshold": 8.0}],  # 24 tokens: past L
    ids=lambda e: e["name"] + ("+yarn" if "scaling" in e else "+per_layer" * ("per_layer" in e)),
)
@pytest.mark.parametrize("randomized", [False, True], ids=["consecutive", "random"])
def test_the_recomputed_probabilities_reproduce_each_layers_attention_output(encoding, randomized):
    """At 0..T-1, and at randomized positions drawn per layer (or distances, for a bias of the
    distance alone) as a random-positions run's are."""
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, encoding).eval()
    tokens = torch.randint(0, 256, (2, 24))
    at = PositionDraw()
    if randomized:
        mode = "distances" if randomizes_distances(model.layer_encodings) else "positions"
        sampler = PositionSampler(64, n_layer=2, per_layer=True, mode=mode)
        at = sampler.draw(torch.tensor([24, 24]), 24, torch.Generator().manual_seed(1))
    outputs = []
    hooks = [
        block.attn.register_forward_hook(lambda module, args, out: outputs.append(out))
        for block in model.blocks
    ]
    with torch.no_grad():
        inputs = attention_inputs(model, tokens, at)
    for hook in hooks:
        hook.remove()
    for block, layer_input, output in zip(model.blocks, inputs, outputs, strict=True):
        x, positions, encoding, distances = layer_input
        q, k, v, content = block.attn.queries_keys_values(x, positions, encoding)
        # (B, H, T, T)
        p = attention_probabilities(q, k, positions, encoding, content, 0, 24, distances)
        y = block.attn.proj((p @ v).transpose(1, 2).reshape(2, 24, 16))
        torch.testing.assert_close(y, output, rtol=1e-5, atol=1e-6)


def test_sixteen_thousand_tokens_of_the_default_model_fit_in_two_gigabytes():
    cfg = compose_config([])
    model = build_model(cfg.model, cfg.encoding)
    assert diagnosis_memory_bytes(model, 16384) < 2e9


# ----------------------------------------------------------------------------- errors


def test_a_length_past_a_learned_table_is_one_line():
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 8}, {"name": "learned"})
    with pytest.raises(PosbenchError, match="--length <= ") as err:
        check_diagnosable(model, model.max_length + 1, torch.device("cpu"))
    assert "\n" not in str(err.value)


def test_more_windows_than_the_split_holds_is_one_line():
    with pytest.raises(PosbenchError, match="pass --windows <= 3") as err:
        validation_windows(torch.zeros(100, dtype=torch.uint8), 32, 5)
    assert "\n" not in str(err.value)


def test_diagnosis_reads_only_its_windows_of_a_split_larger_than_memory():
    tokens = validation_windows(terabyte_split(), 64, 3)
    assert tokens.shape == (3, 64) and tokens.dtype == torch.int64
    # documents of 100 tokens (one whole window) and of half the split (the other two)
    tokens = validation_windows(terabyte_split(), 64, 3, np.array([0, 100, 1 << 39]))
    assert tokens.shape == (3, 64) and tokens.dtype == torch.int64


def test_a_length_longer_than_the_split_is_one_line():
    with pytest.raises(PosbenchError, match="needs at least 101"):
        validation_windows(torch.zeros(100, dtype=torch.uint8), 100, 1)


def test_windows_stay_inside_documents_as_evaluation_cuts_them():
    # documents of 10, 5 and 20 tokens, each token its document's number
    tokens = torch.repeat_interleave(
        torch.tensor([1, 2, 3], dtype=torch.uint8), torch.tensor([10, 5, 20])
    )
    documents = torch.tensor([0, 10, 15])
    # whole windows of 8: one in the first document (its second one only scores a tail), none in
    # the second (5 < 8 + 1), two in the third
    windows_tokens = validation_windows(tokens, 8, 3, documents)
    assert windows_tokens.tolist() == [[1] * 8, [3] * 8, [3] * 8]
    with pytest.raises(PosbenchError, match=r"the 3 validation documents .* pass --windows <= 3"):
        validation_windows(tokens, 8, 4, documents)
    with pytest.raises(
        PosbenchError, match="longest validation document has 20 tokens; --length 20"
    ):
        validation_windows(tokens, 20, 1, documents)


def test_a_missing_run_is_one_line(tmp_path):
    with pytest.raises(PosbenchError, match="not found") as err:
        diagnose_run(tmp_path / "nowhere", 64)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- a run


@pytest.fixture(scope="module")
def alibi_run(tmp_path_factory, cache_dir):
    from conftest import TINY

    run_dir = tmp_path_factory.mktemp("alibi")
    overrides = [*TINY, "encoding=alibi", "train.steps=10", f"data.cache_dir={cache_dir}"]
    train(compose_config(overrides), run_dir)
    return run_dir


def test_diagnose_run_writes_json_figures_and_tensorboard_images(alibi_run):
    result, written = diagnose_run(alibi_run, 64, n_windows=2)
    out = alibi_run / "diagnostics"
    assert written == [
        out / "L64.json",
        out / "L64_entropy.png",
        out / "L64_mass_beyond_train_length.png",
    ]
    assert json.loads((out / "L64.json").read_text()) == json.loads(json.dumps(result))
    (sink,) = json.loads((alibi_run / "results.json").read_text())["sink"]
    assert sink == {key: result[key] for key in SINK_RECORD} and sink["sink_token"] == 1
    assert all(path.read_bytes()[:4] == b"\x89PNG" for path in written[1:])
    events = EventAccumulator(str(alibi_run))
    events.Reload()
    images = set(events.Tags()["images"])
    assert {"diagnostics/L64/entropy", "diagnostics/L64/mass_beyond_train_length"} <= images
    (image,) = events.Images("diagnostics/L64/entropy")  # the file's drawing, not another
    assert PIL.Image.open(io.BytesIO(image.encoded_image_string)).size == (
        PIL.Image.open(out / "L64_entropy.png").size
    )


def test_diagnose_run_uses_the_windows_posbench_eval_scores(alibi_run, monkeypatch):
    seen = []
    monkeypatch.setattr(
        diagnose_module,
        "diagnose",
        lambda model, tokens, s, positions, keys, *sink: seen.append((tokens, positions, keys)),
    )
    monkeypatch.setattr(diagnose_module, "record_sink", lambda run_dir, result: None)
    monkeypatch.setattr(diagnose_module, "write_diagnostics", lambda run_dir, result: [])
    diagnose_run(alibi_run, 32, n_windows=3)
    val = load_corpus(load_run_config(alibi_run).data).val
    starts = [start for start, _ in windows(len(val), 32, None)][:3]
    expected = np.stack([val[s : s + 32] for s in starts]).astype(np.int64)
    tokens, positions, keys = seen[0]
    assert torch.equal(tokens, torch.from_numpy(expected))
    # Keyed as evaluation keys them (by their starts), for the draws of a random-positions run.
    assert positions is None and keys == starts


@pytest.mark.slow
def test_the_diagnose_command_prints_a_table_and_writes_the_files(alibi_run, tmp_path):
    args = ["diagnose", "--run", alibi_run, "--length", "32", "--windows", "1"]
    result = posbench(*args, cwd=tmp_path)
    assert "| layer | head | entropy |" in result.stdout
    assert (alibi_run / "diagnostics" / "L32.json").is_file()


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ({"sink_token": 33}, "--sink-token 33 is not in a window of --length 32"),
        ({"sink_epsilon": -0.1}, "--sink-epsilon must be >= 0"),
    ],
)
def test_a_sink_outside_the_window_or_a_negative_epsilon_is_one_line(sink, message):
    with pytest.raises(PosbenchError, match=message):
        diagnose_run("not read: the sink is checked first", 32, **sink)


def test_top_level_help_lists_the_diagnose_command(capsys):
    main(["--help"])
    assert "diagnose" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run", "nowhere", "--length", "64"], "run directory nowhere not found"),
        (["--run", "nowhere"], "the following arguments are required: --length"),
        (["--length", "64", "--windows", "0"], "expected a positive integer"),
    ],
)
def test_diagnose_errors_are_one_line(tmp_path, monkeypatch, capsys, args, message):
    """posbench's main in this process; the command itself: test_cli.py's bad input."""
    monkeypatch.chdir(tmp_path)
    assert message in error_line(capsys, "diagnose", *args)


def test_the_report_tabulates_the_sink_rate_by_encoding_over_seeds(tmp_path):
    for encoding, seed, rate in [("alibi", 0, 0.25), ("alibi", 1, 0.75), ("rope", 0, 0.5)]:
        record = {"length": 16, "stride": None, "ppl": 2.0, "status": "ok"}
        sink = {"length": 64, "sink_epsilon": 0.3, "sink_token": 1, "sink_rate": rate}
        results = {"eval": [record], "sink": [sink]}
        finished_run(tmp_path / f"{encoding}{seed}", encoding, results, seed)
    report = build_report(tmp_path)
    text = markdown(report)
    assert "| encoding | 64 tokens, eps 0.3, k 1 |" in text
    assert "| alibi | 0.50 ± 0.35 |" in text and "| rope | 0.50 |" in text
    (alibi, _) = json_content(report, [])["groups"][0]["sink"]
    assert (alibi["encoding"], alibi["sink_rate_n"], alibi["sink_rate_mean"]) == ("alibi", 2, 0.5)
