#!/usr/bin/env bash
# Accuracy beside the loss, end to end on the CPU, nothing downloaded (README "Evaluating"; issue 43):
#   0. a corpus with a pattern the context decides ("<noise> | k -> l": the next letter) as a byte dataset, and a
#      held-out task file of that pattern in the generic layout (other noise; the gold among three other letters);
#   1. llama_tiny_bytes trained on it in BF16 (--disable-fp4) and in NVFP4 (every layer: --num-layers-at-end-in-bf16
#      0), each with --downstream-eval on the task every 100 iterations, the checkpoints saved;
#   2. compare_logs.py on the two logs: the loss table and the last accuracies;
#   3. evaluate of each checkpoint (the table, lm-eval's results JSON and the samples).
# Usage: scripts/eval_example.sh [APPS_DIR]   (default build/apps; the binaries of a build of this repository)
# Env: OUT (default out/eval_example; replaced), ITERS (300).
set -euo pipefail
cd "$(dirname "$0")/.."
prog=eval_example
# shellcheck source=scripts/script_util.sh
source scripts/script_util.sh  # require_apps
apps=${1:-build/apps}
out=${OUT:-out/eval_example}
iters=${ITERS:-300}
require_apps "$apps" pretrain_llama preprocess_data evaluate
rm -rf "$out"
mkdir -p "$out"
echo "== 0. the pattern corpus and its held-out task file"
python3 - "$out" <<'PY'
import json, random, sys
out = sys.argv[1]
rng = random.Random(7)
letters = "abcdefghijklmnopqrstuvwxyz"
def noise():
    return "".join(rng.choice(letters) for _ in range(rng.randint(2, 4)))
def succ(c):
    return letters[(letters.index(c) + 1) % 26]
with open(f"{out}/corpus.txt", "w") as f:
    for _ in range(4000):
        c = rng.choice(letters)
        f.write(f"{noise()} | {c} -> {succ(c)}\n\n")
with open(f"{out}/successor.jsonl", "w") as f:
    for _ in range(200):
        c = rng.choice(letters)
        choices = rng.sample([x for x in letters if x != succ(c)], 3)
        label = rng.randrange(4)
        choices.insert(label, succ(c))
        f.write(json.dumps({"context": f"{noise()} | {c} ->", "choices": choices, "label": label}) + "\n")
PY
"$apps/preprocess_data" --input "$out/corpus.txt" --output-prefix "$out/pattern" --tokenizer-type byte --append-eod \
  --text-document paragraph | tail -1
head -2 "$out/successor.jsonl"
common=(--model llama_tiny_bytes --device cpu --data-path "$out/pattern_text_document" --split 100,0,0
        --train-iters "$iters" --global-batch-size 8 --micro-batch-size 8 --seq-length 128 --lr 3e-3 --min-lr 3e-4
        --warmup-iters 10 --log-interval 100 --eval-iters 0 --downstream-eval "$out/successor.jsonl"
        --downstream-eval-interval 100)
echo "== 1. training with --downstream-eval, BF16 and NVFP4"
"$apps/pretrain_llama" "${common[@]}" --disable-fp4 --save "$out/bf16" --log-jsonl "$out/bf16.jsonl" >"$out/bf16.log"
"$apps/pretrain_llama" "${common[@]}" --recipe bf16_with_nvfp4_mixed --num-layers-at-end-in-bf16 0 --save "$out/nvfp4" \
  --log-jsonl "$out/nvfp4.jsonl" >"$out/nvfp4.log"
for r in bf16 nvfp4; do
  echo "-- $r"
  grep -E 'downstream eval at|summary:' "$out/$r.log" | sed -E 's/ acc_stderr: [^|]*\|//; s/ acc_norm_stderr: [^|]*\|//'
done
echo "== 2. compare_logs.py"
python3 scripts/compare_logs.py "$out/bf16.log" "$out/nvfp4.log"
echo "== 3. evaluate"
for r in bf16 nvfp4; do
  echo "\$ evaluate --load $out/$r --task $out/successor.jsonl --output $out/results_$r/results.json --log-samples"
  mkdir -p "$out/results_$r"
  "$apps/evaluate" --load "$out/$r" --task "$out/successor.jsonl" --output "$out/results_$r/results.json" --log-samples \
    2>"$out/evaluate_$r.err"
done
echo "results: $out/results_bf16/results.json (lm-eval's keys), samples: $out/results_bf16/samples_successor.jsonl"
