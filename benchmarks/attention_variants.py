"""The attention variants (model.qk_norm, model.attn_gate, model.attn_sinks, model.attention)
and DroPE (QK-norm, evaluated under eval.temperature's beta): training tokens/s and evaluation
time of each, as ratios to plain NoPE measured in the same process (model: tiny, untrained;
every variant on NoPE unless its name says another encoding); and the position remaps
(eval.position_remap: evaluation time only; train.positions=pose: training only).

    python benchmarks/attention_variants.py train [--rounds 15] [--threads 1] [--precision fp32]
        [--variants qk_norm sinks ...]
    python benchmarks/attention_variants.py eval [--lengths 2048 16384] [--rounds 3]
    python benchmarks/attention_variants.py train --quick    # a small, fast check that it runs

Models are timed in interleaved rounds (one training step or forward pass of each per round,
each round starting one model later; median per model: benchmarks/throughput.py). Issue 55's
targets: training tokens/s at least 0.8x NoPE's (stick-breaking 0.4x), evaluation at most 3x
NoPE's time (stick-breaking 6x); ``MISSED`` and ``!`` mark a variant past its target.
"""

from __future__ import annotations

import argparse

import torch
from throughput import median_seconds

from posbench.model import build_model
from posbench.model.position_remap import PositionRemap, remapped_positions
from posbench.model.random_positions import pose_sampler
from posbench.system.precision import autocast, resolve_precision

MODEL = {"n_layer": 2, "n_head": 4, "d_model": 128, "mlp_ratio": 4, "dropout": 0.0}
# name: (encoding, model options)
VARIANTS = {
    "none": ("none", {}),
    "qk_norm": ("none", {"qk_norm": True}),
    "gate-headwise": ("none", {"attn_gate": "headwise"}),
    "gate-elementwise": ("none", {"attn_gate": "elementwise"}),
    "sinks": ("none", {"attn_sinks": True}),
    "sigmoid": ("none", {"attention": "sigmoid"}),
    "stick_breaking": ("none", {"attention": "stick_breaking"}),
    "rope": ("rope", {}),
    "rope+qk_norm": ("rope", {"qk_norm": True}),
    "alibi": ("alibi", {}),
    "alibi+sinks": ("alibi", {"attn_sinks": True}),
    # DroPE after its switch: NoPE with QK-norm, evaluated under a logit temperature (a beta
    # of a fit at 8x: posbench/evaluation/temperature.py); it trains as qk_norm does.
    "drope": ("none", {"qk_norm": True}),
    # eval.position_remap at a training length of 128 (its defaults there): evaluation only
    "rope+self_extend": ("rope", {}),
    "rope+string": ("rope", {}),
    "alibi+string": ("alibi", {}),
    # train.positions=pose (PoSE's skip-wise ids, drawn every step as training draws them)
    "rope+pose": ("rope", {}),
    "alibi+pose": ("alibi", {}),
}
EVAL_TEMPERATURES = {"drope": 1.5}  # the beta each variant evaluates under (else none)
REMAPS = {
    "rope+self_extend": PositionRemap("self_extend", window=32, group=8),
    "rope+string": PositionRemap("string", window=8, shift=42),
    "alibi+string": PositionRemap("string", window=8, shift=42),
}
POSE = {"rope+pose", "alibi+pose"}
TRAIN_TARGETS = {"stick_breaking": 0.4}  # else 0.8
EVAL_TARGETS = {"stick_breaking": 6.0}  # else 3.0


def model_of(name: str, seq_len: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    encoding, options = VARIANTS[name]
    options = {**options, "sigmoid_length": seq_len}  # as the CLI sets it: train.seq_len
    return build_model({**MODEL, **options}, {"name": encoding}).to(device)


def train_step(name: str, seq_len: int, batch: int, device: str, precision: str):
    model = model_of(name, seq_len, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, 256, (batch, seq_len + 1), device=device)
    resolved = resolve_precision(precision, x.device, MODEL["d_model"])
    pose = pose_sampler("pose", None, seq_len, None, MODEL["n_layer"]) if name in POSE else None
    generator = torch.Generator().manual_seed(0)
    lengths = torch.full((batch,), seq_len)

    def step() -> None:
        positions = None if pose is None else pose.draw(lengths, seq_len, generator).positions
        with autocast(resolved, x.device):
            loss = model(x[:, :-1], positions, targets=x[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss.item()

    return step


def eval_step(name: str, seq_len: int, length: int, device: str):
    model = model_of(name, seq_len, device).eval()
    model.set_logit_temperature(EVAL_TEMPERATURES.get(name, 1.0))
    x = torch.randint(0, 256, (1, length), device=device)

    @torch.inference_mode()
    def step() -> None:
        with remapped_positions(model, REMAPS.get(name)):
            model(x).sum().item()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["train", "eval"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 16384])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=["fp32", "bf16", "auto"], default="fp32")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    args = parser.parse_args()
    if args.quick:
        args.seq_len, args.batch, args.lengths, args.rounds = 32, 2, [64], 1
    torch.set_num_threads(args.threads)
    names = ["none", *(name for name in args.variants if name != "none")]
    # A remap applies in evaluation only, PoSE in training only.
    names = [name for name in names if name not in (REMAPS if args.mode == "train" else POSE)]
    if args.mode == "train":
        steps = {
            name: train_step(name, args.seq_len, args.batch, args.device, args.precision)
            for name in names
        }
        seconds = median_seconds(steps, args.rounds)
        tokens = args.batch * args.seq_len
        print(f"threads={args.threads} train {args.batch}x{args.seq_len} in {args.precision}")
        print(f"{'variant':<18}{'tok/s':>10}{'ratio':>7}{'target':>8}")
        for name in names:
            ratio = seconds["none"] / seconds[name]
            target = TRAIN_TARGETS.get(name, 0.8)
            targeted = VARIANTS[name][1] or name in POSE
            met = "" if not targeted else ("met" if ratio >= target else "MISSED")
            print(f"{name:<18}{tokens / seconds[name]:>10,.0f}{ratio:>7.2f}{met:>8}")
        return
    print(f"threads={args.threads} eval 1xL in fp32, time as a ratio to NoPE's")
    print(f"{'variant':<18}" + "".join(f"{length:>10}" for length in args.lengths))
    ratios: dict[str, list[str]] = {name: [] for name in names}
    for length in args.lengths:
        steps = {name: eval_step(name, args.seq_len, length, args.device) for name in names}
        seconds = median_seconds(steps, args.rounds)
        for name in names:
            ratio = seconds[name] / seconds["none"]
            targeted = VARIANTS[name][1] or name in REMAPS
            missed = targeted and ratio > EVAL_TARGETS.get(name, 3.0)
            flag = "!" if missed else ""
            ratios[name].append(f"{ratio:.2f}{flag}" if name != "none" else f"{seconds[name]:.3f}s")
    for name in names:
        print(f"{name:<18}" + "".join(f"{cell:>10}" for cell in ratios[name]))


if __name__ == "__main__":
    main()
