#!/usr/bin/env bash
# Builds a small, deterministic sample corpus from the license texts every Debian system ships
# (/usr/share/common-licenses, package base-files) and tokenizes it with the byte tokenizer:
#   data/sample/license_corpus.txt                        the text (files in C-locale name order,
#                                                          symlinks skipped, a blank line between files)
#   data/sample/license_byte_text_document.bin/.idx       Megatron indexed dataset, one paragraph per
#                                                          document, <|end_of_text|> (257) appended
#   data/sample/license_byte_text_document.tokenizer.json the tokenizer record
# Usage: scripts/make_sample_corpus.sh [PREPROCESS_DATA_BINARY]   (default build/apps/preprocess_data)
# Env: LICENSE_DIR (default /usr/share/common-licenses), MAX_BYTES (default 2097152: files are added
#      while the corpus stays under it), OUT_DIR (default data/sample; the tests write elsewhere).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-build/apps/preprocess_data}
LICENSE_DIR=${LICENSE_DIR:-/usr/share/common-licenses}
MAX_BYTES=${MAX_BYTES:-2097152}
[[ -x "$bin" ]] || { echo "make_sample_corpus: $bin not found; build first (cmake -S . -B build && cmake --build build --target preprocess_data)" >&2; exit 1; }
[[ -d "$LICENSE_DIR" ]] || { echo "make_sample_corpus: $LICENSE_DIR not found (Debian's base-files provides it; set LICENSE_DIR)" >&2; exit 1; }

out=${OUT_DIR:-data/sample}
mkdir -p "$out"
corpus="$out/license_corpus.txt"
tmp=$(mktemp "$out/.license_corpus.XXXXXX")
trap 'rm -f "$tmp"' EXIT

# Regular files only (-type f skips symlinks such as GPL -> GPL-3, which would duplicate text), in a
# fixed order so that the corpus is the same on every machine with the same license files.
mapfile -t files < <(find "$LICENSE_DIR" -maxdepth 1 -type f -print | LC_ALL=C sort)
total=0 used=0
for f in "${files[@]}"; do
  size=$(stat -c %s "$f")
  (( total + size + 2 <= MAX_BYTES )) || continue
  cat "$f" >>"$tmp"
  printf '\n\n' >>"$tmp"
  total=$(( total + size + 2 )) used=$(( used + 1 ))
done
(( used > 0 )) || { echo "make_sample_corpus: no license file fits in $MAX_BYTES bytes" >&2; exit 1; }
chmod 644 "$tmp"
mv "$tmp" "$corpus"
echo "make_sample_corpus: $corpus: $used files from $LICENSE_DIR, $(stat -c %s "$corpus") bytes, sha256 $(sha256sum "$corpus" | cut -c1-16)"

"$bin" --input "$corpus" --output-prefix "$out/license_byte" --tokenizer-type byte --append-eod \
  --text-document paragraph --workers "$(nproc)"
