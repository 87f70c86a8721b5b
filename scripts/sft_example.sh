#!/usr/bin/env bash
# Supervised fine-tuning end to end on the CPU, nothing downloaded (README "Supervised fine-tuning"; issue 28):
#   0. a starting model in Hugging Face format: llama_tiny_bytes pretrained briefly on the sample license corpus,
#      exported by our own writer (a real run starts from a downloaded HF Llama instead);
#   1. a generated instruction set (scripts/make_sft_corpus.sh: 200 arithmetic chats and question/answer pairs)
#      made an SFT dataset;
#   2. fine-tuned from the HF weights (--finetune --init-from-hf), validating on the held-out 5%;
#   3. exported to Hugging Face again;
#   4. asked one of its training questions (generate --chat) and a question/answer prompt.
# Usage: scripts/sft_example.sh [APPS_DIR]   (default build/apps; the binaries of a build of this repository)
# Env: OUT (default out/sft_example; replaced), BASE_ITERS (200), SFT_ITERS (400).
set -euo pipefail
cd "$(dirname "$0")/.."
prog=sft_example
# shellcheck source=scripts/script_util.sh
source scripts/script_util.sh  # require_apps, make_tiny_hf_base
apps=${1:-build/apps}
out=${OUT:-out/sft_example}
require_apps "$apps" pretrain_llama preprocess_data convert_checkpoint generate
rm -rf "$out"
mkdir -p "$out"
common=(--device cpu --disable-fp4 --global-batch-size 8 --micro-batch-size 4 --seq-length 256 --lr 1e-3 --min-lr 1e-4
        --warmup-iters 20)
echo "== 0. a starting model in Hugging Face format"
make_tiny_hf_base "$apps" "$out" "${BASE_ITERS:-200}"
echo "== 1. the instruction set"
scripts/make_sft_corpus.sh "$apps/preprocess_data"
echo "== 2. fine-tuning from the Hugging Face weights"
"$apps/pretrain_llama" --finetune --init-from-hf "$out/hf_base" --data-path data/sample/sft_arith --split 95,5,0 \
  "${common[@]}" --train-iters "${SFT_ITERS:-400}" --log-interval 100 --eval-interval 100 --eval-iters 2 \
  --save "$out/sft" | grep -E 'SFT dataset|documents:|initialized from| iteration .*/|validation loss at iteration [0-9]+ \||summary:'
echo "== 3. export"
"$apps/convert_checkpoint" --load "$out/sft" --to-hf "$out/hf_sft"
echo "== 4. asking it"
for q in "What is 3 plus 4?" "What is 8 plus 9?"; do
  echo "\$ generate --init-from-hf $out/hf_sft --chat --prompt \"$q\""
  "$apps/generate" --init-from-hf "$out/hf_sft" --chat --prompt "$q" 2>/dev/null
done
echo "\$ generate --init-from-hf $out/hf_sft --prompt \"Question: what is 6 times 7? Answer: \""
"$apps/generate" --init-from-hf "$out/hf_sft" --prompt "Question: what is 6 times 7? Answer: " 2>/dev/null
