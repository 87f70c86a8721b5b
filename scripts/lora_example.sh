#!/usr/bin/env bash
# LoRA fine-tuning end to end on the CPU, nothing downloaded (README "LoRA"; issue 41):
#   0. a starting model in Hugging Face format and the instruction set, as scripts/sft_example.sh makes them
#      (llama_tiny_bytes pretrained briefly on the sample license corpus, exported by our own writer; 200
#      generated arithmetic chats and question/answer pairs as an SFT dataset);
#   1. LoRA on all four targets over a frozen NVFP4 base (every layer in NVFP4: --num-layers-at-end-in-bf16 0),
#      validating on the held-out 5%, the adapters saved; the same run over a BF16 base (--disable-fp4) beside it;
#   2. the adapters as PEFT's files (convert_checkpoint --to-peft);
#   3. asked one of its training questions with the adapters (generate --load of the LoRA checkpoint), and the base
#      alone for comparison;
#   4. merged into the base as a Hugging Face model (--merge-lora --to-hf) and that reloaded by generate.
# Usage: scripts/lora_example.sh [APPS_DIR]   (default build/apps; the binaries of a build of this repository)
# Env: OUT (default out/lora_example; replaced), BASE_ITERS (200), LORA_ITERS (300).
set -euo pipefail
cd "$(dirname "$0")/.."
prog=lora_example
# shellcheck source=scripts/script_util.sh
source scripts/script_util.sh  # require_apps, make_tiny_hf_base
apps=${1:-build/apps}
out=${OUT:-out/lora_example}
require_apps "$apps" pretrain_llama preprocess_data convert_checkpoint generate
rm -rf "$out"
mkdir -p "$out"
common=(--device cpu --global-batch-size 8 --micro-batch-size 4 --seq-length 256 --min-lr 1e-4 --warmup-iters 20)
echo "== 0. a starting model in Hugging Face format, and the instruction set"
make_tiny_hf_base "$apps" "$out" "${BASE_ITERS:-200}" | grep -E 'summary:'
scripts/make_sft_corpus.sh "$apps/preprocess_data"
lora=(--init-from-hf "$out/hf_base" --data-path data/sample/sft_arith --split 95,5,0 "${common[@]}" --lr 5e-3
      --train-iters "${LORA_ITERS:-300}" --log-interval 100 --eval-interval 100 --eval-iters 2 --peft lora)
echo "== 1. LoRA over a frozen NVFP4 base"
"$apps/pretrain_llama" "${lora[@]}" --recipe bf16_with_nvfp4_mixed --num-layers-at-end-in-bf16 0 --save "$out/lora" |
  grep -E 'layers 0|LoRA|initialized from|validation loss at iteration [0-9]+ \||summary:'
echo "== 1b. the same over a BF16 base"
"$apps/pretrain_llama" "${lora[@]}" --disable-fp4 | grep -E 'validation loss at iteration [0-9]+ \||summary:'
echo "== 2. the adapters as PEFT's files"
"$apps/convert_checkpoint" --load "$out/lora" --to-peft "$out/peft"
echo "== 3. asking it, with the adapters and without"
q="What is 3 plus 4?"
echo "\$ generate --load $out/lora --chat --prompt \"$q\""
"$apps/generate" --load "$out/lora" --chat --prompt "$q" --max-new-tokens 32 2>/dev/null
echo "\$ generate --init-from-hf $out/hf_base --chat --prompt \"$q\"   # the base alone"
"$apps/generate" --init-from-hf "$out/hf_base" --chat --prompt "$q" --max-new-tokens 32 2>/dev/null | cat -v
echo "== 4. merged into the base, and reloaded"
"$apps/convert_checkpoint" --load "$out/lora" --merge-lora --to-hf "$out/hf_merged"
echo "\$ generate --init-from-hf $out/hf_merged --chat --prompt \"$q\""
"$apps/generate" --init-from-hf "$out/hf_merged" --chat --prompt "$q" --max-new-tokens 32 2>/dev/null
