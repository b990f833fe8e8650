"""train.precision, eval.precision, train.compile and eval.compile: what auto picks on which
hardware, that bf16 computes what fp32 does within bf16's accuracy, that compiled computes what
eager does, and what results and resumes record."""

import functools
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from conftest import TINY, TINY_REVERSE_STRING, chunked_calls

import posbench.model.loss
from posbench.cli import main
from posbench.config import compose_config, position_sampler, validate
from posbench.data import Corpus, load_data
from posbench.encodings import ENCODINGS
from posbench.encodings.rope import SCALING_METHODS
from posbench.errors import PosbenchError
from posbench.evaluation.perplexity import evaluate, evaluate_length
from posbench.evaluation.positions import RandomPositions
from posbench.evaluation.run import evaluate_run
from posbench.evaluation.task_accuracy import evaluate_task_length
from posbench.model import build_model
from posbench.model.attention import unbiased_causal_attention
from posbench.model.random_positions import PositionDraw, PositionSampler, randomizes_distances
from posbench.runs.directory import CHECKPOINT_FILE
from posbench.system.dynamo import raised_recompile_limits
from posbench.system.precision import (
    BF16_MIN_D_MODEL,
    autocast,
    bf16_hardware,
    compile_for_training,
    resolve_precision,
)
from posbench.training.checkpoint import load_checkpoint
from posbench.training.train import train
from posbench.training.train_loop import train_step

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
# bf16 keeps 8 significant bits: one rounding is off by at most u = 2^-9 relative. A bf16
# training step rounds the output of every product, forward and backward; a parameter's
# gradient passes through a few of them per layer, so it may be off by several u (measured:
# 0.4 % in norm for the test model, 0.7 % for model=tiny). The loss averages its tokens' errors.
GRAD_TOLERANCE = 8 * 2**-9  # relative error of the gradients in norm: 8 u, about 1.6 %
LOSS_TOLERANCE = 2 * 2**-9  # relative error of the loss (measured: 2e-6 and 4e-5)
# An evaluation's ppl = exp(mean NLL): its relative error is the mean NLL's absolute error, which
# averages the logits' rounding errors (a few u of logits of order 1) over the tokens.
PPL_TOLERANCE = 2 * 2**-9


def fake_cpu(monkeypatch, **flags: bool) -> None:
    """Pretend the CPU has exactly the bf16 features in ``flags`` (amx_bf16, avx512_bf16)."""
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: flags)


@pytest.mark.parametrize(
    ("flags", "hardware"),
    [
        ({"amx_bf16": True, "avx512_bf16": True}, "amx"),
        ({"amx_bf16": False, "avx512_bf16": True}, "avx512_bf16"),
        ({"amx_bf16": False, "avx512_bf16": False}, None),
    ],
)
def test_bf16_hardware_is_detected_from_the_cpus_flags(monkeypatch, flags, hardware):
    fake_cpu(monkeypatch, **flags)
    assert bf16_hardware(CPU) == hardware


@pytest.mark.parametrize("hardware", ["amx", "avx512_bf16"])
def test_auto_picks_bf16_on_a_bf16_cpu_from_the_measured_width_on(monkeypatch, hardware):
    fake_cpu(monkeypatch, **{"amx_bf16": hardware == "amx", "avx512_bf16": True})
    width = BF16_MIN_D_MODEL[hardware]
    assert resolve_precision("auto", CPU, width) == "bf16"
    assert resolve_precision("auto", CPU, width // 2) == "fp32"


@pytest.mark.parametrize("flags", [{"amx_bf16": True}, {"amx_bf16": False}])
def test_auto_trains_the_default_tiny_model_in_bf16_on_a_bf16_cpu_where_it_was_measured_faster(
    monkeypatch, flags
):
    # issue 57: 1.62x fp32 at tiny on AMX; 1.57x on AVX512-BF16 (benchmarks/README.md)
    fake_cpu(monkeypatch, avx512_bf16=True, **flags)
    tiny = compose_config().model.d_model
    assert resolve_precision("auto", CPU, tiny) == "bf16"


def test_auto_picks_fp32_on_a_cpu_without_bf16_units_at_any_size(monkeypatch):
    fake_cpu(monkeypatch, amx_bf16=False, avx512_bf16=False)
    assert resolve_precision("auto", CPU, 4096) == "fp32"


@pytest.mark.parametrize(
    ("supported", "model", "expected"),
    [(True, "tiny", "fp32"), (True, "small", "bf16"), (True, "large", "bf16")]
    + [(False, model, "fp32") for model in ("tiny", "small", "large")],
)
def test_auto_on_cuda_picks_bf16_where_the_gpu_has_it_from_the_small_model_on(
    monkeypatch, supported, model, expected
):
    # An H200 trained the tiny model slower in bf16 than in fp32 (posbench/system/precision.py).
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: supported)
    d_model = compose_config([f"model={model}"]).model.d_model
    assert resolve_precision("auto", CUDA, d_model) == expected


@pytest.mark.parametrize("requested", ["fp32", "bf16"])
def test_an_explicit_precision_is_used_on_any_hardware(monkeypatch, requested):
    for flags in ({"amx_bf16": True}, {}):
        fake_cpu(monkeypatch, **flags)
        assert resolve_precision(requested, CPU, 512) == requested


# --- the bf16 attention fast path -------------------------------------------------------------


def attention_and_grads(attention, q, k, v, grad):
    """Output and input gradients of ``attention`` at inputs of ``grad``'s dtype."""
    inputs = [t.detach().to(grad.dtype).requires_grad_() for t in (q, k, v)]
    out = attention(*inputs)
    out.backward(grad)
    return [out, *(t.grad for t in inputs)]


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


@pytest.mark.parametrize("shape", [(4, 4, 128, 32), (2, 8, 128, 64), (3, 2, 17, 16)])
def test_bf16_attention_is_fp32_attention_rounded_to_bf16_forward_and_backward(shape):
    torch.manual_seed(0)
    # bf16-valued inputs (as a bf16 model makes them); scaled, so that attention is peaked
    q, k, v = (3 * torch.randn(shape).bfloat16() for _ in range(3))
    grad = torch.randn(shape).bfloat16()
    fp32 = attention_and_grads(sdpa, q, k, v, grad.float())
    with torch.autocast("cpu", torch.bfloat16):  # as in training: autocast must not interfere
        fast = attention_and_grads(unbiased_causal_attention, q, k, v, grad)
    for name, want, got in zip(("out", "dq", "dk", "dv"), fp32, fast, strict=True):
        assert got.dtype == torch.bfloat16, name
        assert torch.equal(got, want.bfloat16()), name


def test_attention_in_fp32_is_sdpas_fused_kernel_itself():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 16, 8) for _ in range(3))
    assert torch.equal(unbiased_causal_attention(q, k, v), sdpa(q, k, v))


# --- training and evaluation in bf16 ----------------------------------------------------------


@pytest.mark.parametrize("encoding", ["rope", "alibi", "t5", "fire"])  # their attention paths
@pytest.mark.parametrize("data", ["corpus", "task"])
def test_a_bf16_training_step_computes_the_fp32_loss_and_gradients_within_bf16_accuracy(
    encoding, data
):
    """On a corpus's full windows, and on a task's padded rows run in width slices at
    randomized positions (only the answers scored)."""
    if data == "corpus":
        cfg = compose_config([*TINY, f"encoding={encoding}"])
        torch.manual_seed(0)
        tokens = torch.randint(0, 256, (4096,), dtype=torch.uint8)
        source = Corpus("random", train=tokens.numpy(), val=tokens.numpy())
    else:
        overrides = [*TINY_REVERSE_STRING, f"encoding={encoding}", "train.random_positions=256"]
        cfg = compose_config(overrides)
        source = load_data(cfg.data)
    outcomes = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_model(cfg.model, cfg.encoding)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # keeps the gradients
        sampler = torch.Generator().manual_seed(0)
        positions = position_sampler(cfg)
        loss, _ = train_step(model, optimizer, source, sampler, 0, cfg.train, precision, positions)
        grads = torch.cat([p.grad.flatten() for p in model.parameters()])
        outcomes[precision] = loss, grads
    (loss32, grads32), (loss16, grads16) = outcomes["fp32"], outcomes["bf16"]
    assert loss16 != loss32  # it did run in bf16
    assert loss16 == pytest.approx(loss32, rel=LOSS_TOLERANCE)
    assert (grads16 - grads32).norm() / grads32.norm() < GRAD_TOLERANCE


def test_bf16_evaluation_matches_fp32_perplexity_and_says_it_ran_in_bf16():
    cfg = compose_config(TINY)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding)
    tokens = torch.randint(0, 256, (2048,), dtype=torch.uint8)
    fp32 = evaluate_length(model, tokens, 64)
    bf16 = evaluate_length(model, tokens, 64, precision="bf16")
    assert (fp32["precision"], bf16["precision"]) == ("fp32", "bf16")
    assert bf16["ppl"] != fp32["ppl"]  # it did run in bf16
    assert bf16["ppl"] == pytest.approx(fp32["ppl"], rel=PPL_TOLERANCE)


def test_bf16_task_evaluation_matches_fp32_on_the_answers_and_says_it_ran_in_bf16():
    cfg = compose_config([*TINY_REVERSE_STRING, "encoding=fire", "data.val_examples=64"])
    task = load_data(cfg.data)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding)
    fp32 = evaluate_task_length(model, task, 10)
    bf16 = evaluate_task_length(model, task, 10, precision="bf16")
    assert (fp32["precision"], bf16["precision"]) == ("fp32", "bf16")
    assert bf16["ppl"] != fp32["ppl"]  # it did run in bf16
    assert bf16["ppl"] == pytest.approx(fp32["ppl"], rel=PPL_TOLERANCE)
    # an untrained model's argmax rarely sits within bf16's rounding of the runner-up
    assert bf16["accuracy"] == pytest.approx(fp32["accuracy"], abs=2 / fp32["tokens"])


@pytest.fixture(scope="module")
def bf16_run(tmp_path_factory, cache_dir):
    run_dir = tmp_path_factory.mktemp("bf16")
    overrides = [*TINY, f"data.cache_dir={cache_dir}", "train.precision=bf16"]
    return run_dir, train(compose_config(overrides), run_dir)


def test_results_record_the_precision_used_and_a_bf16_run_learns(bf16_run):
    run_dir, results = bf16_run
    assert json.loads((run_dir / "results.json").read_text())["precision"] == "bf16"
    # At least the unigram's loss, a plateau no CPU's rounding moves: 0.53 to 0.58 of log 256
    # over seeds 0 to 2 on three sets of kernels (tests/test_algorithmic.py names them).
    assert results["train"]["final_loss"] < 0.75 * torch.log(torch.tensor(256.0)).item()
    assert load_checkpoint(run_dir / CHECKPOINT_FILE)["precision"] == "bf16"


def test_results_record_what_auto_resolved_to_not_auto(monkeypatch, tiny, tmp_path):
    fake_cpu(monkeypatch, avx512_bf16=True)
    width = BF16_MIN_D_MODEL["avx512_bf16"]
    overrides = [*tiny, f"model.d_model={width}", "train.steps=2", "eval.lengths=[16]"]
    assert train(compose_config(overrides), tmp_path)["precision"] == "bf16"


def test_the_same_seed_gives_the_same_numbers_in_bf16(bf16_run, cache_dir, tmp_path):
    overrides = [*TINY, f"data.cache_dir={cache_dir}", "train.precision=bf16"]
    again = train(compose_config(overrides), tmp_path)
    assert again["train"]["final_loss"] == bf16_run[1]["train"]["final_loss"]
    assert again["eval"] == bf16_run[1]["eval"]


def test_eval_precision_applies_to_the_runs_evaluation_and_posbench_eval(bf16_run):
    run_dir, results = bf16_run
    assert {r["precision"] for r in results["eval"]} == {"fp32"}  # eval.precision's default
    records = evaluate_run(run_dir, [16], device="cpu", precision="bf16")
    assert records[0]["precision"] == "bf16"
    # a trained model's logits are larger than a fresh one's: so are their rounding errors
    assert records[0]["ppl"] == pytest.approx(results["eval"][0]["ppl"], rel=4 * 2**-9)


def test_posbench_eval_precision_flag_records_bf16_beside_the_fp32_records(bf16_run, capsys):
    run_dir, _ = bf16_run
    main(["eval", "--run", str(run_dir), "--length", "40", "--precision", "bf16"])
    records = json.loads((run_dir / "results.json").read_text())["eval"]
    assert {r["length"]: r["precision"] for r in records} == {
        16: "fp32",
        32: "fp32",
        40: "bf16",
        64: "fp32",
    }


# --- resume -----------------------------------------------------------------------------------


def copy_run(source, target) -> None:
    for name in ("config.yaml", CHECKPOINT_FILE):
        (target / name).write_bytes((source / name).read_bytes())


def test_resuming_refuses_another_precision_than_the_run_was_trained_in(bf16_run, tiny, tmp_path):
    copy_run(bf16_run[0], tmp_path)
    overrides = [*tiny, "train.resume=true", "train.precision=fp32", "train.steps=45"]
    with pytest.raises(PosbenchError, match=r"trained in bf16.*train.precision=bf16") as err:
        train(compose_config(overrides), tmp_path)
    assert "\n" not in str(err.value)


def test_resuming_may_spell_out_the_precision_auto_chose(monkeypatch, bf16_run, tiny, tmp_path):
    copy_run(bf16_run[0], tmp_path)
    fake_cpu(monkeypatch)  # auto resolves to fp32 here, so the run must say bf16 explicitly
    base = [*tiny, "train.resume=true", "train.steps=42", "eval.lengths=[16]"]
    with pytest.raises(PosbenchError, match="trained in bf16"):
        train(compose_config([*base, "train.precision=auto"]), tmp_path)
    results = train(compose_config([*base, "train.precision=bf16"]), tmp_path)
    assert results["precision"] == "bf16" and results["train"]["steps"] == 42


def test_checkpoints_from_before_train_precision_count_as_fp32(bf16_run, tiny, tmp_path):
    copy_run(bf16_run[0], tmp_path)
    state = load_checkpoint(tmp_path / CHECKPOINT_FILE)
    del state["precision"]
    torch.save(state, tmp_path / CHECKPOINT_FILE)
    overrides = [*tiny, "train.resume=true", "train.precision=bf16", "train.steps=45"]
    with pytest.raises(PosbenchError, match="trained in fp32"):
        train(compose_config(overrides), tmp_path)


# --- train.compile ----------------------------------------------------------------------------


def test_a_run_compiles_its_model_whatever_the_runs_before_it_in_its_process_compiled(
    monkeypatch,
):
    """A multirun's jobs train in one process: each job's model compiles, however many graphs
    the jobs before it compiled for the same code (dynamo's recompile limit, lowered to 1 here,
    counted them). Dynamo's counting backend takes the graphs, so that no kernel is built."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounter()
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend=counter))
    tokens = torch.randint(0, 256, (2, 16))
    per_function_limit = next(iter(raised_recompile_limits(1)))  # recompile_limit, by its name
    with torch._dynamo.config.patch({per_function_limit: 1}):
        for encoding in ("none", "learned", "alibi"):  # each a graph of Transformer.forward
            model = build_model({"n_layer": 1, "n_head": 2, "d_model": 32}, {"name": encoding})
            compiled_before = counter.frame_count
            compile_for_training(model, tokens, "fp32")
            assert counter.frame_count > compiled_before, encoding


@pytest.mark.slow
def test_a_compiled_run_trains_like_the_eager_one_and_reports_its_compile_time(tiny, tmp_path):
    """About 20 s on a 2-core Zen 3 (2026-12-07): inductor compiles the model's forward and
    backward into C++ kernels, built by the system's compiler, on a cold cache."""
    short = [*tiny, "train.steps=6", "eval.lengths=[16]", "train.precision=fp32"]
    eager = train(compose_config(short), tmp_path / "eager")
    compiled = train(compose_config([*short, "train.compile=true"]), tmp_path / "compiled")
    assert eager["train"]["compile_s"] == 0.0 < compiled["train"]["compile_s"]
    assert compiled["train"]["final_loss"] == pytest.approx(eager["train"]["final_loss"], rel=1e-4)
    assert compiled["eval"][0]["ppl"] == pytest.approx(eager["eval"][0]["ppl"], rel=1e-4)


@pytest.mark.parametrize("varying_shape", [False, True])
def test_the_training_steps_run_the_graph_the_warm_up_compiled(monkeypatch, varying_shape):
    """compile_for_training compiles before the timed steps what they run: its warm-up once
    passed its tokens as their own targets, dynamo guarded on that aliasing, and the first
    step compiled the model again (in the steps' time, not in compile_s); a task's steps, in
    width slices of many shapes, compiled a dynamic graph beside the warm-up's static one."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounter()
    compile_model = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model: compile_model(model, backend=counter))
    torch._dynamo.reset()
    cfg = compose_config(TINY)
    model = build_model(cfg.model, cfg.encoding)
    tokens = torch.zeros(4, 16, dtype=torch.long)
    stepper, _ = compile_for_training(model, tokens, "fp32", varying_shape=varying_shape)
    assert counter.frame_count == 1
    shapes = [(4, 16), (3, 9), (2, 12)] if varying_shape else [(4, 16)]
    for shape in shapes:
        x, y = torch.randint(0, 64, (2, *shape))
        stepper(x, None, targets=y, distances=None).backward()  # as train_step calls it
    assert counter.frame_count == 1


@pytest.mark.slow
def test_a_compiled_run_on_a_task_trains_like_the_eager_one(tmp_path):
    """A task's batches run in width slices of many shapes: the compiled step, one graph of
    symbolic shape (compile_for_training's varying_shape), must compute what the eager one
    does at each. About 20 s: inductor compiles that graph, forward and backward."""
    short = [*TINY_REVERSE_STRING, "train.steps=3"]
    eager = train(compose_config(short), tmp_path / "eager")
    compiled = train(compose_config([*short, "train.compile=true"]), tmp_path / "compiled")
    assert compiled["train"]["final_loss"] == pytest.approx(eager["train"]["final_loss"], rel=1e-5)
    assert compiled["eval"][0]["accuracy"] == eager["eval"][0]["accuracy"]
    assert compiled["eval"][0]["ppl"] == pytest.approx(eager["eval"][0]["ppl"], rel=1e-5)


# Every option that changes which positions a layer sees or what it adds to the scores: a
# compiled training step must compute exactly what the eager one does with each of them (a
# second rotation path for compiled training once dropped p-RoPE and a fine-tune's scaling).
SCALED = {
    "original_length": 8,
    "in_training": True,
    # longrope's rescale factors, one per rotated pair of the head dim 8 below
    "short_factor": [1.0, 1.25, 1.5, 2.0],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
}
COMPILED_OPTIONS = [
    *({"name": name} for name in ENCODINGS),
    {"name": "rope", "keep_frequencies": 0.5},
    {"name": "rope", "fraction": 0.5},
    {"name": "rope", "layout": "half"},
    *(
        {"name": "rope", "scaling": {**SCALED, "method": method, "factor": factor}}
        for method in SCALING_METHODS
        if method != "none"
        for factor in (4.0, None)
    ),
    {"name": "kerple", "kernel": "power"},
    # DAPE's network (an autograd Function over pieces) and the table of distances it shares
    # with attention (content_table), at consecutive positions and at randomized ones
    {"name": "fire", "dape": True},
]


def option_id(options: dict) -> str:
    parts = [options["name"]]
    for key, value in options.items():
        if key == "scaling":
            parts.append(f"{value['method']}-factor={value['factor']}")
        elif key != "name":
            parts.append(f"{key}={value}")
    return "-".join(parts)


@pytest.mark.parametrize("random_positions", [False, True], ids=["consecutive", "random"])
@pytest.mark.parametrize("encoding", COMPILED_OPTIONS, ids=option_id)
def test_a_compiled_training_forward_and_its_gradients_equal_eagers(encoding, random_positions):
    torch.manual_seed(0)
    model_config = {"n_layer": 2, "n_head": 2, "d_model": 16}
    model = build_model(model_config, {**encoding}).train()
    tokens = torch.randint(256, (2, 16), generator=torch.Generator().manual_seed(1))
    at = PositionDraw()
    if random_positions:  # as train.random_positions draws them: per layer, a padded row too
        mode = "distances" if randomizes_distances(model.layer_encodings) else "positions"
        sampler = PositionSampler(64, n_layer=2, mode=mode)
        at = sampler.draw(torch.tensor([16, 9]), 16, torch.Generator().manual_seed(2))

    def logits_and_gradients(forward) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        logits = forward(tokens, at.positions, distances=at.distances)
        logits.square().mean().backward()
        return [logits, *(p.grad for p in model.parameters() if p.grad is not None)]

    eager = logits_and_gradients(model)
    # aot_eager traces what inductor compiles (the graph, and autograd through it), with
    # eager kernels: a difference is the tracing's, not a code generator's rounding.
    compiled = logits_and_gradients(torch.compile(model, backend="aot_eager"))
    assert len(compiled) == len(eager)
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("chunked", [True, False], ids=["chunked", "logits"])
def test_a_compiled_training_loss_and_its_gradients_equal_eagers(chunked, monkeypatch):
    # What a compiled training step computes: the summed NLL given targets, by either way
    # (F.linear_cross_entropy's chunks, here for these small logits too, or the logits whole).
    calls = chunked_calls(monkeypatch)
    if not chunked:
        monkeypatch.setattr(posbench.model.loss, "CHUNKED_LOSS_DEVICES", frozenset())
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": "rope"}).train()
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(256, (2, 16), generator=generator)
    targets = torch.randint(256, (2, 16), generator=generator)
    targets[:, :4] = -100

    def loss_and_gradients(forward) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        loss = forward(tokens, targets=targets)
        loss.backward()
        return [loss, *(p.grad for p in model.parameters())]

    eager = loss_and_gradients(model)
    torch._dynamo.reset()  # traced afresh, whatever earlier tests compiled
    compiled = loss_and_gradients(torch.compile(model, backend="aot_eager"))
    assert bool(calls) == chunked
    for got, expected in zip(compiled, eager, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


# rope: its position table is the one thing that used to break; fox, cope: a bias from the
# content once asked the default score_bias, whose lookup reads the positions' range.
@pytest.mark.parametrize("encoding", ["rope", "fox", "cope"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_training_forward_is_one_graph_for_torch_compile(precision, encoding):
    cfg = compose_config([*TINY, f"encoding={encoding}"])
    model = build_model(cfg.model, cfg.encoding).train()
    with autocast(precision, CPU):
        explained = torch._dynamo.explain(model)(torch.zeros(2, 16, dtype=torch.long))
    assert explained.graph_break_count == 0, explained.break_reasons


# --- eval.compile -----------------------------------------------------------------------------

# 112 targets: at 16 tokens 7 windows, in batches of 3, 3 and 1; at 24 tokens 5, in 3 and 2.
PARTIAL_BATCHES = {"lengths": [16, 24], "batch_size": 3}
EVAL_TOKENS = torch.randint(256, (113,), generator=torch.Generator().manual_seed(3))


def compiled_with(monkeypatch, backend) -> None:
    """torch.compile, as evaluation calls it, with ``backend`` instead of inductor."""
    compile_model = torch.compile
    monkeypatch.setattr(
        torch, "compile", lambda model, **options: compile_model(model, backend=backend, **options)
    )


@pytest.mark.parametrize(
    ("encoding", "mode"),
    [("rope", None), ("alibi", None), ("rope", "positions"), ("alibi", "distances")],
)
def test_compiled_evaluation_computes_eagers_perplexity_where_the_last_batch_is_partial(
    monkeypatch, encoding, mode
):
    # aot_eager traces what inductor compiles, with eager kernels: a difference would be the
    # tracing's or the padding's, not a code generator's rounding (test_cli runs inductor).
    compiled_with(monkeypatch, "aot_eager")
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": encoding})
    positions = None if mode is None else RandomPositions(PositionSampler(64, 2, mode=mode), 0)
    eager = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES, positions=positions)
    compiled = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES, positions=positions, compiled=True)
    for got, expected in zip(compiled, eager, strict=True):
        assert expected["compile_s"] is None and got["compile_s"] > 0
        assert got["tokens"] == expected["tokens"] == 112
        assert got["ppl"] == pytest.approx(expected["ppl"], rel=1e-6)
        by_position = [b["nll"] for b in expected["loss_by_position"]]
        assert [b["nll"] for b in got["loss_by_position"]] == pytest.approx(by_position, rel=1e-6)


def test_compiled_bf16_evaluation_computes_eager_bf16s_perplexity(monkeypatch):
    """`posbench eval --compile --precision bf16`: the autocast is traced with the model (a
    compiled graph that dropped it would compute fp32's numbers, or bf16's elsewhere)."""
    compiled_with(monkeypatch, "aot_eager")
    torch.manual_seed(0)
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": "rope"})
    fp32 = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES)
    eager = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES, precision="bf16")
    compiled = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES, precision="bf16", compiled=True)
    for got, expected, full in zip(compiled, eager, fp32, strict=True):
        assert got["ppl"] == pytest.approx(expected["ppl"], rel=1e-6)
        assert got["ppl"] != full["ppl"] and got["ppl"] == pytest.approx(full["ppl"], rel=2e-2)


def test_compiled_evaluation_compiles_once_per_length_whatever_dynamos_recompile_limit(
    monkeypatch,
):
    """The last batch of each length, fewer windows, runs at the full batch's shape: a graph
    per length, not per batch shape; and the limit dynamo keeps per function (1 here) is raised
    while evaluation compiles, never reached by the lengths (past it dynamo runs eagerly)."""
    import torch._dynamo.testing

    counter = torch._dynamo.testing.CompileCounter()
    compiled_with(monkeypatch, counter)
    torch._dynamo.reset()
    model = build_model({"n_layer": 2, "n_head": 2, "d_model": 16}, {"name": "rope"})
    # config.patch, not monkeypatch: monkeypatch's undo deletes a key a config module keeps
    # outside its __dict__, which hides it from every later test in the process
    with torch._dynamo.config.patch(recompile_limit=1):
        records = evaluate(model, EVAL_TOKENS, **PARTIAL_BATCHES, compiled=True)
        assert torch._dynamo.config.recompile_limit == 1  # raised for the evaluation only
    assert counter.frame_count == len(PARTIAL_BATCHES["lengths"])  # rope's forward: one graph
    assert all(r["compile_s"] > 0 for r in records)


def test_raised_recompile_limits_raise_each_of_dynamos_limits_and_lower_none(monkeypatch):
    with torch._dynamo.config.patch(recompile_limit=3, accumulated_recompile_limit=5000):
        limits = raised_recompile_limits(100)
    assert limits == {"recompile_limit": 100, "accumulated_recompile_limit": 5000}
    # torch before 2.7 named them so (the module attribute replaced, not a config key)
    old = SimpleNamespace(cache_size_limit=8, accumulated_cache_size_limit=256)
    monkeypatch.setattr(torch._dynamo, "config", old)
    assert raised_recompile_limits(100) == {
        "cache_size_limit": 100,
        "accumulated_cache_size_limit": 256,
    }


@pytest.mark.parametrize(("train_compile", "eval_compile"), [(False, True), (True, False)])
def test_eval_compile_alone_decides_whether_a_runs_evaluation_compiles(
    monkeypatch, tiny, tmp_path, train_compile, eval_compile
):
    compiled_with(monkeypatch, "eager")  # dynamo's tracing without a compiler: seconds
    overrides = [*tiny, "train.steps=2", "eval.lengths=[16]", "train.precision=fp32"]
    overrides += [f"train.compile={train_compile}", f"eval.compile={eval_compile}"]
    (record,) = train(compose_config(overrides), tmp_path)["eval"]
    assert (record["compile_s"] is not None) == eval_compile


def test_compiled_evaluation_of_a_task_is_refused_before_training():
    cfg = compose_config([*TINY_REVERSE_STRING, "eval.compile=true"])
    with pytest.raises(PosbenchError, match=r"prompts: eval\.compile applies to corpora only"):
        validate(cfg)


def test_posbench_eval_help_lists_the_compile_flag_and_its_default(capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "--compile, --no-compile torch.compile the forward passes" in help_text
    assert "(default: the run's eval.compile, whatever its train.compile)" in help_text
