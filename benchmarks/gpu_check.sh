#!/usr/bin/env bash
# The GPU check (benchmarks/README.md, "GPU check"), on one CUDA GPU: posbench's CUDA tests,
# then every encoding trained for 300 steps and evaluated at 16,384 tokens
# (benchmarks/gpu_check.py: tokens/s, peak GPU memory, perplexities), then a short run of the
# ALiBi paper's experiment at its model size (+experiment=alibi_wt103: model=large, trained at
# 512, evaluated up to 15,512 tokens) and its report beside the paper's numbers.
#
#     bash benchmarks/gpu_check.sh
#
# It runs this checkout's posbench with python3 and needs posbench's dependencies installed (on a
# machine without network: `pip install --no-index --target DIR` the wheels of hydra-core,
# omegaconf and antlr4-python3-runtime 4.9.3, then PYTHONPATH=DIR bash benchmarks/gpu_check.sh).
#
# Everything it prints also goes to $OUT/gpu_check/ when OUT is set, else outputs/gpu_check/
# (the log, and gpu_check.json with the table's rows). Any failure stops it with a non-zero
# exit status and a line starting with FAIL; each stage has a time limit, so a hang fails too.
set -euo pipefail

cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's posbench
export HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 TQDM_DISABLE=1
OUT_DIR="${OUT:-outputs}/gpu_check"
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/gpu_check-$(date -u +%Y%m%dT%H%M%SZ).log"

stage() {  # stage NAME SECONDS COMMAND...: run COMMAND with a time limit, say how long it took
    local name=$1 limit=$2 started=$SECONDS
    shift 2
    echo "== $name (limit ${limit} s)"
    if ! timeout "$limit" "$@"; then
        echo "FAIL: $name (exit status or time limit; see above)"
        return 1
    fi
    echo "== $name: $((SECONDS - started)) s"
}

# The ALiBi paper's four encodings at the paper's model shape, 50 steps each, then the report
# with the paper's ratio curves. WikiText-103 needs the network, which a lent GPU may lack:
# the standard library's Python source stands in (8 MB, one stream, its last tenth the
# validation split), so the numbers are speed and memory, not the paper's perplexities.
paper_experiment() {
    local dir="$OUT_DIR/alibi_wt103"
    rm -rf "$dir" && mkdir -p "$dir"
    python3 - "$dir/corpus.txt" <<'PY'
import pathlib
import sys
import sysconfig

sources = sorted(pathlib.Path(sysconfig.get_path("stdlib")).rglob("*.py"))
text = "".join(path.read_text(errors="replace") for path in sources)
pathlib.Path(sys.argv[1]).write_text(text[: 8 * 2**20])
PY
    python3 -m posbench train -m +experiment=alibi_wt103 encoding=sinusoidal,rope,t5,alibi \
        data=text data.path="$dir/corpus.txt" device=cuda train.steps=50 eval.max_tokens=15512 \
        hydra.sweep.dir="$dir/sweep"
    python3 -m posbench report "$dir/sweep" --reference alibi-wt103
}
export -f paper_experiment
export OUT_DIR

check() {
    echo "== posbench GPU check, $(date -u), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
        || echo "(nvidia-smi not found)"
    python3 - <<'PY'
import sys

import torch

print(f"python {sys.version.split()[0]}, torch {torch.__version__}, CUDA {torch.version.cuda}")
if not torch.cuda.is_available():
    sys.exit("FAIL: torch sees no CUDA GPU")
print(f"GPU: {torch.cuda.get_device_name()}, bf16 supported: {torch.cuda.is_bf16_supported()}")
PY
    # Only the modules that hold CUDA tests: the others import test-only references (x-transformers)
    # that a GPU machine's environment may lack.
    stage "CUDA tests (pytest -m cuda)" 240 python3 -m pytest -q -m cuda -p no:cacheprovider \
        $(grep -l "mark.cuda" tests/test_*.py)
    stage "train and evaluate every encoding" 300 python3 benchmarks/gpu_check.py --out "$OUT_DIR"
    stage "the ALiBi paper's experiment, short (model=large, 50 steps)" 600 bash -c paper_experiment
    echo "== GPU check passed in $SECONDS s; log: $LOG"
}

check 2>&1 | tee "$LOG"
