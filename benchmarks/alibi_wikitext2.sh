#!/usr/bin/env bash
# The ALiBi paper's extrapolation protocol (+experiment=alibi_wt103: trained at 512 tokens,
# non-overlapping evaluation at 512 ... 15,512, BPE of 8,192 tokens, word-level perplexity) at a
# scale one GPU runs in minutes: WikiText-2's test split for training (303,636 BPE tokens) and
# its validation split for evaluation (285,996 tokens, all of it at every length), model=small
# with the paper's dropout 0.3, 400 steps of 16 x 512 tokens (about 11 epochs). One process per
# encoding, all at once, then the report beside the paper's Table 2 (docs/results.md shows it).
#
#     bash benchmarks/alibi_wikitext2.sh WIKITEXT2_DIR OUT_DIR [OVERRIDE ...]
#
# WIKITEXT2_DIR holds test.txt and valid.txt (the word-level release, as in pytorch/examples);
# OUT_DIR gets a run directory per encoding and report/; OVERRIDEs (key=value) go to every run
# after the settings below (e.g. device=cpu train.steps=2 for a rehearsal).
# ENCODINGS overrides the encodings (default below: FIRE is left out, as its bias under attention
# dropout takes the blocked path, which trained at about 1 step/s on an H200, too slow here).
set -euo pipefail

usage="usage: bash benchmarks/alibi_wikitext2.sh WIKITEXT2_DIR OUT_DIR [OVERRIDE ...]"
data=$(cd "${1:?$usage}" && pwd)
mkdir -p "${2:?$usage}"
out=$(cd "$2" && pwd)
shift 2
read -r -a encodings <<<"${ENCODINGS:-sinusoidal rope t5 alibi none kerple fox}"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # this checkout's posbench

settings=(
    +experiment=alibi_wt103 model=small model.dropout=0.3
    data=text "data.path=$data/test.txt" "data.val_path=$data/valid.txt"
    device=cuda train.steps=400 train.batch_size=16 train.warmup_steps=40 train.val_every=50
    train.checkpoint_every=0 eval.max_tokens=null "$@"
)
run() {  # run ENCODING: one training run and its evaluation, its output in OUT_DIR/ENCODING.log
    python3 -m posbench train "${settings[@]}" "encoding=$1" "hydra.run.dir=$out/$1" \
        >"$out/$1.log" 2>&1
}
# The first run trains the tokenizer and writes the token cache that the others then read.
run "${encodings[0]}"
for encoding in "${encodings[@]:1}"; do
    run "$encoding" &
done
failed=0
for job in $(jobs -p); do
    wait "$job" || failed=1
done
python3 -m posbench report "$out" --reference alibi-wt103 --metric word_ppl --out "$out/report"
exit $failed
