#!/usr/bin/env bash
# Writes a small, deterministic instruction set (no download) and makes it an SFT dataset with the byte
# tokenizer (preprocess_data --dataset-type sft, issue 28):
#   data/sample/sft_arith.jsonl          200 examples: 100 chats {"messages": [user "What is A plus B?",
#                                         assistant "A plus B is C."]} and 100 NeMo-style {"input": "Question: what
#                                         is A times B? Answer:", "output": "C"}, for A, B in 0..9, in a fixed
#                                         shuffled order (example i is pair (37 i) mod 200)
#   data/sample/sft_arith.bin/.idx/.loss_mask/.sft.json/.tokenizer.json   the SFT dataset (--data-path data/sample/sft_arith)
# Usage: scripts/make_sft_corpus.sh [PREPROCESS_DATA_BINARY]   (default build/apps/preprocess_data)
# Env: OUT_DIR (default data/sample).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/apps/preprocess_data}
[[ -x "$bin" ]] || { echo "make_sft_corpus: $bin not found; build first (cmake --build build --target preprocess_data)" >&2; exit 1; }
out=${OUT_DIR:-data/sample}
mkdir -p "$out"
jsonl="$out/sft_arith.jsonl"
tmp=$(mktemp "$out/.sft_arith.XXXXXX")
trap 'rm -f "$tmp"' EXIT
for ((i = 0; i < 200; i++)); do
  k=$(( (37 * i) % 200 )) p=$(( k % 100 ))
  a=$(( p / 10 )) b=$(( p % 10 ))
  if (( k < 100 )); then
    printf '{"messages": [{"role": "user", "content": "What is %d plus %d?"}, {"role": "assistant", "content": "%d plus %d is %d."}]}\n' \
      "$a" "$b" "$a" "$b" $(( a + b ))
  else
    printf '{"input": "Question: what is %d times %d? Answer:", "output": "%d"}\n' "$a" "$b" $(( a * b ))
  fi
done >"$tmp"
chmod 644 "$tmp"
mv "$tmp" "$jsonl"
"$bin" --dataset-type sft --input "$jsonl" --output-prefix "$out/sft_arith" --tokenizer-type byte
