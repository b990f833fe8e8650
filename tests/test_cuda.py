"""On a CUDA GPU (skipped without one; `bash benchmarks/gpu_check.sh` runs them): every
encoding trains in bf16 with fused AdamW, a bias of the distance alone through flex_attention,
also under train.compile, and evaluation runs at 16,384 tokens."""

import math

import pytest
import torch
import torch._dynamo
from conftest import TINY_SYNTHETIC

import posbench.model.attention
from posbench.config import compose_config
from posbench.encodings import encoding_names
from posbench.evaluation.perplexity import evaluate
from posbench.model import Transformer, build_model
from posbench.training.train import make_optimizer, train

pytestmark = pytest.mark.cuda
# a bias of the distance alone: flex_attention on CUDA (FIRE's, while no query is past its
# learned threshold, which starts at train.seq_len: at least the first step)
RELATIVE = {"alibi", "t5", "kerple", "sandwich", "fire"}
# The default model at its training shapes, so that gpu_check.py, run next, finds these kernels
# compiled; on a small corpus, 30 steps take the loss far below 0.75 ln 256 = 4.16 (to 2.8-3.0
# for alibi and rope on a CPU in fp32).
SHORT_RUN = [
    "device=cuda",
    "train.precision=bf16",
    "train.steps=30",
    "train.warmup_steps=5",
    "train.lr=1e-2",
    "train.min_lr=1e-3",
    "train.log_every=5",
    "train.val_every=30",
    "train.val_batches=2",
    "eval.lengths=[128,256]",
    "eval.max_tokens=4096",
    *TINY_SYNTHETIC,
]


@pytest.fixture
def short_run(cache_dir) -> list[str]:
    return [*SHORT_RUN, f"data.cache_dir={cache_dir}"]


@pytest.fixture(autouse=True)
def never_unfused():
    """Each test compiles as a fresh `posbench` process would; past torch.compile's recompile
    limit flex_attention would run unfused, writing (T, T) scores: fail instead (torch's own
    patch: pytest's monkeypatch deletes a dynamo setting when it undoes one)."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
        yield


@pytest.fixture
def flex_calls(monkeypatch) -> list[int]:
    """Records each flex_attention_bias call (its sequence length)."""
    calls = []
    flex_attention_bias = posbench.model.attention.flex_attention_bias

    def recording(q, *args, **kwargs):
        calls.append(q.shape[2])
        return flex_attention_bias(q, *args, **kwargs)

    monkeypatch.setattr(posbench.model.attention, "flex_attention_bias", recording)
    return calls


@pytest.mark.parametrize("encoding", encoding_names())
def test_a_few_training_steps_on_cuda_run_in_bf16_and_lower_the_loss(
    encoding, short_run, tmp_path, flex_calls
):
    assert torch.cuda.is_bf16_supported(), "benchmarks/gpu_check.sh expects a bf16 GPU"
    results = train(compose_config([f"encoding={encoding}", *short_run]), tmp_path)
    assert results["precision"] == "bf16"
    assert results["train"]["final_loss"] < 0.75 * math.log(256)
    assert bool(flex_calls) == (encoding in RELATIVE)


def test_compiled_bf16_training_with_a_learned_bias_table_on_cuda_learns(short_run, tmp_path):
    # T5's table gets its gradient through flex_attention inside the compiled model.
    overrides = ["encoding=t5", *short_run, "train.compile=true"]
    results = train(compose_config(overrides), tmp_path)
    assert results["train"]["compile_s"] > 0
    assert results["train"]["final_loss"] < 0.75 * math.log(256)


def test_adamw_is_fused_for_a_model_on_cuda():
    cfg = compose_config()
    model = build_model(cfg.model, cfg.encoding).cuda()
    assert make_optimizer(model, cfg.train).defaults["fused"] is True


def sharp_model(encoding: str) -> Transformer:
    """The default model with weights large enough that attention moves the logits far beyond
    the tolerances below (at GPT-2's std 0.02 its outputs hardly depend on attention)."""
    cfg = compose_config([f"encoding={encoding}"])
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.encoding).cuda().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(std=0.3)
    return model


@pytest.mark.parametrize("encoding", ["alibi"])
def test_evaluation_at_16384_tokens_on_cuda_matches_the_sdpa_path(
    encoding, flex_calls, monkeypatch
):
    model = sharp_model(encoding)
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 256, (2 * 16384 + 1,), dtype=torch.uint8, generator=generator)
    [record] = evaluate(model, tokens, [16384])
    assert record["status"] == "ok" and record["tokens"] == 2 * 16384
    assert flex_calls and set(flex_calls) == {16384}
    window = tokens[None, :16384].long().cuda()
    with torch.inference_mode():
        flex = model(window)
        monkeypatch.setattr(posbench.model.attention, "FLEX_ATTENTION_DEVICES", frozenset())
        sdpa = model(window)
    torch.testing.assert_close(flex, sdpa, rtol=1e-4, atol=1e-3)
