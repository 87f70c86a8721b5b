#!/usr/bin/env bash
# The reproducible NVFP4 accuracy study: what each part of the NVFP4 recipe does to the loss.
#
#   scripts/nvfp4_study.sh [--iterations 300] [--seeds 6] [--device cpu|cuda] [--threads T]
#                          [--model llama_small] [--gbs 8] [--mbs 8] [--seq 256]
#                          [--out build/study] [--out-doc docs/study] [--bin build/apps/pretrain_llama]
#
# 1. Corpus: the text files of Debian's `fortunes` package (/usr/share/games/fortunes, '%' separators
#    made blank lines, overstrike backspaces removed) and the license texts of base-files
#    (/usr/share/common-licenses), in C-locale name order, through preprocess_data with the byte
#    tokenizer (one document per paragraph, <|end_of_text|> appended) -> OUT/data/.
# 2. Model: --model's shape (a name in configs/models/ or a JSON path) with the byte tokenizer's
#    vocabulary (vocab_size 258) -> OUT/model.json.
# 3. Variants (recipes; the ablations are copies of bf16_with_nvfp4_mixed written to OUT/recipes/):
#      bf16_mixed                           BF16 (the baseline)
#      bf16_with_fp8_current_scaling_mixed  FP8 current scaling (E4M3 forward, E5M2 gradients)
#      bf16_with_mxfp8_mixed                MXFP8
#      bf16_with_nvfp4_mixed                NVFP4 as the playbook runs it (last 4 layers BF16)
#      nvfp4_no_rht                         ... nvfp4.random_hadamard_transform false
#      nvfp4_no_sr                          ... nvfp4.stochastic_rounding false
#      nvfp4_no_2d                          ... nvfp4.weight_2d_quantization false (1x16 weight blocks)
#      nvfp4_all_layers                     ... no BF16 edge layers (num_layers_at_end_in_bf16 0)
#    each for --seeds seeds (1234, 1235, ...: the seed of the initialisation and of the data shuffle;
#    within one seed every variant sees the same initial weights and batches), --iterations iterations,
#    validation every iterations/6 on 8 batches of the 5% validation split (--split 949,50,1).
# 4. Runs every (variant, seed) through scripts/sweep.sh into OUT/runs/seedN/: per run a text log NAME.log
#    and a JSON-lines log NAME.jsonl (pretrain_llama --log-jsonl), the sweep.csv over the latter (resumable:
#    rerun the same command after an interruption; complete runs are skipped, and runs of a work directory
#    from before the JSON-lines logs are run again). Then scripts/study_report.py writes
#    OUT_DOC/nvfp4_study.md (the table, the date, commit, command and machine) and OUT_DOC/nvfp4_study.png,
#    reading the JSON-lines logs only: each run's "start" event (its precision_plan must be its variant's;
#    the model and the data splits' sizes), its "iteration" and "eval" events (the figure's curves).
# 5. The record (scripts/study_record.sh): each complete run is kept, gzipped, in OUT_DOC/runs/seedN/ with
#    its provenance (commit, binary, CPU); commit it with the report. A later start (another session, a new
#    work directory, a rebuilt binary) restores the recorded runs instead of running them again, once the
#    binary is shown to compute what the recorded one did (iterations 1-2 of every variant equal to the last
#    bit); numerics that changed refuse the record.
# Time on an idle 2-core CPU (the defaults; quantized GEMMs are emulated): about 20 min per seed on the AMD EPYC
# of 2026-12-02, about 58 min on the Intel Xeon of 2026-12-02's later session (docs/COMPARING.md).
# Env: PYTHON (default /usr/bin/python3 when it has numpy, else python3); FORTUNES_DIR, LICENSE_DIR.
set -uo pipefail

prog=nvfp4_study.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=scripts/script_util.sh
source "$repo/scripts/script_util.sh"  # die, quote_words, print_usage, find_python
usage() { print_usage "${BASH_SOURCE[0]}"; }

# The exact command, for the report (before the arguments are consumed).
invocation="scripts/nvfp4_study.sh${*:+ $(quote_words "$@")}"

iterations=300 nseeds=6 device=cpu threads="" model=llama_small gbs=8 mbs=8 seq=256
out="$repo/build/study" out_doc="$repo/docs/study" bin="$repo/build/apps/pretrain_llama"
while (($#)); do
  case "$1" in
    --iterations|--seeds|--device|--threads|--model|--gbs|--mbs|--seq|--out|--out-doc|--bin)
      (($# >= 2)) && [[ -n "$2" && "$2" != --* ]] || die "$1 needs a value"
      case "$1" in
        --iterations) iterations=$2 ;; --seeds) nseeds=$2 ;; --device) device=$2 ;; --threads) threads=$2 ;;
        --model) model=$2 ;; --gbs) gbs=$2 ;; --mbs) mbs=$2 ;; --seq) seq=$2 ;; --out) out=$2 ;;
        --out-doc) out_doc=$2 ;; --bin) bin=$2 ;;
      esac
      shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) die "unknown argument '$1' (see --help)" ;;
  esac
done
for pair in "--iterations:$iterations" "--seeds:$nseeds" "--gbs:$gbs" "--mbs:$mbs" "--seq:$seq" ${threads:+"--threads:$threads"}; do
  v=${pair#*:}
  [[ "$v" =~ ^[0-9]+$ ]] && ((10#$v > 0)) || die "${pair%%:*} '$v': must be a positive integer"
done
((gbs % mbs == 0)) || die "--gbs $gbs must be a multiple of --mbs $mbs"
[[ "$device" == cpu || "$device" == cuda ]] || die "--device '$device': cpu or cuda"
[[ -x "$bin" && -f "$bin" ]] || die "--bin $bin: no such executable (build it: cmake --build build --target pretrain_llama preprocess_data)"
preprocess="$(dirname "$bin")/preprocess_data"
[[ -x "$preprocess" ]] || die "$preprocess not found next to --bin (cmake --build build --target preprocess_data)"
if [[ "$model" == */* || "$model" == *.json ]]; then
  model_file=$model
else
  model_file="$repo/configs/models/$model.json"
fi
[[ -f "$model_file" ]] || die "--model '$model': no such model (a name in configs/models/ or a JSON file)"
fortunes=${FORTUNES_DIR:-/usr/share/games/fortunes}
licenses=${LICENSE_DIR:-/usr/share/common-licenses}
[[ -d "$fortunes" ]] || die "$fortunes not found: install Debian's fortunes package (apt-get install fortunes; scripts/setup.sh does)"
[[ -d "$licenses" ]] || die "$licenses not found (Debian's base-files provides it; set LICENSE_DIR)"

find_python
"$python" -c 'import numpy, matplotlib' 2>/dev/null ||
  die "$python lacks numpy or matplotlib (Debian: apt-get install python3-numpy python3-matplotlib; or set PYTHON)"

mkdir -p "$out/data" "$out/recipes" "$out_doc" 2>/dev/null || die "cannot create $out or $out_doc"
out=$(cd "$out" && pwd) out_doc=$(cd "$out_doc" && pwd)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
# oneDNN picks its BF16 GEMM kernels by the CPU's instruction set, and their sums differ in the last bits, so
# the record holds only on CPUs that pick the same kernels. The cap keeps a CPU with AMX or AVX512-FP16 on the
# avx512_core_bf16 kernels the record's runs used (each log's "cpu GEMMs" line names them; untested, no such
# CPU here). A CPU without a BF16 dot product (AVX2; AVX-512 without BF16) takes the FP32 path and other bits:
# with ONEDNN_MAX_CPU_ISA=AVX2 or AVX512_CORE, iteration 1 of BF16 seed 1234 gave lm loss 5.476126674 against
# the record's 5.476149470 (2026-12-02), and the record's check refuses it. Set the variable to override.
export ONEDNN_MAX_CPU_ISA=${ONEDNN_MAX_CPU_ISA:-AVX512_CORE_BF16}

# ---- 1. the corpus (rebuilt only when its text changes) ----
prefix="$out/data/fortunes_licenses_byte"
dataset="${prefix}_text_document"
tmp=$(mktemp "$out/data/.corpus.XXXXXX") || die "cannot write in $out/data"
trap 'rm -f "$tmp"' EXIT
trap 'rm -f "$tmp"; echo "$prog: interrupted" >&2; exit 130' INT TERM
nfiles=0
while IFS= read -r f; do
  # Fortune files: '%' lines separate fortunes -> blank lines (paragraph documents); overstrikes for
  # terminals (bold 'X<BS>X', underline '_<BS>X' or '___<BS><BS><BS>XYZ') -> the text: each character
  # followed by a backspace goes, left to right, until none is left.
  sed -e ':a' -e 's/[^\x08]\x08//' -e 'ta' -e 's/^%$//' "$f" >>"$tmp"
  printf '\n\n' >>"$tmp"
  nfiles=$((nfiles + 1))
done < <(find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' -print | LC_ALL=C sort)
while IFS= read -r f; do
  cat "$f" >>"$tmp"
  printf '\n\n' >>"$tmp"
  nfiles=$((nfiles + 1))
done < <(find "$licenses" -maxdepth 1 -type f -print | LC_ALL=C sort)
corpus="$out/data/corpus.txt"
if [[ -f "$corpus" ]] && cmp -s "$tmp" "$corpus" && [[ -f "$dataset.bin" && -f "$dataset.idx" ]]; then
  rm -f "$tmp"
  echo "$prog: corpus unchanged: $corpus ($nfiles files, $(stat -c %s "$corpus") bytes); tokenized data $dataset"
else
  chmod 644 "$tmp"
  mv -f "$tmp" "$corpus"
  rm -rf "$out/data/cache" "$out/data"/fortunes_licenses_byte_*
  echo "$prog: corpus $corpus: $nfiles files from $fortunes and $licenses, $(stat -c %s "$corpus") bytes, sha256 $(sha256sum "$corpus" | cut -c1-16)"
  "$preprocess" --input "$corpus" --output-prefix "$prefix" --tokenizer-type byte --append-eod \
    --text-document paragraph --workers "$(nproc)" --log-interval 1000000000 ||
    die "preprocess_data failed on $corpus"
  [[ -f "$dataset.bin" && -f "$dataset.idx" ]] || die "preprocess_data wrote no $dataset.bin/.idx"
fi
trap - EXIT INT TERM

# ---- 2. the model (the byte vocabulary) and 3. the ablation recipes ----
"$python" - "$model_file" "$out/model.json" "$repo/configs/recipes/bf16_with_nvfp4_mixed.json" "$out/recipes" <<'EOF' ||
import json, os, sys
model_file, model_out, nvfp4_file, recipe_dir = sys.argv[1:]

def write(path, obj):  # unchanged files are not rewritten (the sweep's resumption compares commands, not files)
    text = json.dumps(obj, indent=2) + "\n"
    if os.path.exists(path) and open(path).read() == text:
        return
    with open(path + ".tmp", "w") as fh:
        fh.write(text)
    os.replace(path + ".tmp", path)

m = json.load(open(model_file))
m["name"] = m["name"] + "_bytes" if not m["name"].endswith("_bytes") else m["name"]
m["vocab_size"] = 258  # the byte tokenizer: 256 bytes, <|begin_of_text|>, <|end_of_text|>
write(model_out, m)
base = json.load(open(nvfp4_file))
for name, edit in (("nvfp4_no_rht", {"nvfp4": {"random_hadamard_transform": False}}),
                   ("nvfp4_no_sr", {"nvfp4": {"stochastic_rounding": False}}),
                   ("nvfp4_no_2d", {"nvfp4": {"weight_2d_quantization": False}}),
                   ("nvfp4_all_layers", {"first_last_layers_bf16": False, "num_layers_at_start_in_bf16": 0,
                                         "num_layers_at_end_in_bf16": 0})):
    r = json.loads(json.dumps(base))
    r["name"] = name
    for k, v in edit.items():
        if isinstance(v, dict):
            r[k].update(v)
        else:
            r[k] = v
    write(os.path.join(recipe_dir, name + ".json"), r)
EOF
  die "cannot write $out/model.json or the recipes"

labels=(bf16_mixed bf16_with_fp8_current_scaling_mixed bf16_with_mxfp8_mixed bf16_with_nvfp4_mixed
        nvfp4_no_rht nvfp4_no_sr nvfp4_no_2d nvfp4_all_layers)
recipe_args=("${labels[@]:0:4}")
for r in "${labels[@]:4}"; do recipe_args+=("$out/recipes/$r.json"); done
recipes=$(IFS=,; echo "${recipe_args[*]}")
eval_interval=$((iterations / 6 > 0 ? iterations / 6 : 1))
nvariants=${#labels[@]}

# ---- 4. the runs ----
# One binary per work directory: the first start records the commit and the binary's sha256 in
# OUT/runs/binary.txt; a resumption with another binary is refused (a new work directory with the new binary
# takes the finished seeds from the record, after checking its numerics).
mkdir -p "$out/runs" || die "cannot create $out/runs"
bin_sha=$(sha256sum "$bin" | cut -c1-16)
if [[ -f "$out/runs/binary.txt" ]]; then
  read -r _ run_commit _ run_sha < "$out/runs/binary.txt"
  [[ "$run_sha" == "$bin_sha" ]] ||
    die "the runs in $out/runs were made by a binary of commit $run_commit (sha256 $run_sha), --bin $bin is $bin_sha: pass that binary or a new --out"
else
  run_commit=$(git -C "$repo" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
  [[ -z "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ]] || run_commit+="+changes"
  echo "commit $run_commit sha256 $bin_sha" > "$out/runs/binary.txt"
fi
seeds=()
for ((i = 0; i < nseeds; i++)); do seeds+=($((1234 + i))); done
# Sets `flags`: the pretrain_llama flags of seed $1's runs (after --recipe, --micro-batch-size, --seq-length).
seed_flags() {
  flags=(--model "$out/model.json" --device "$device" --train-iters "$iterations" --global-batch-size "$gbs"
         --data-path "$dataset" --split 949,50,1 --eval-interval "$eval_interval" --eval-iters 8
         --seed "$1" --data-seed "$1" --log-interval 1)
  [[ -z "$threads" ]] || flags+=(--threads "$threads")
}
# shellcheck source=scripts/study_record.sh
source "$repo/scripts/study_record.sh"  # record, sync_record, record_runs, provenance_of_seeds
sync_record
echo "$prog: $nvariants variants x ${#seeds[@]} seed(s) = $((nvariants * ${#seeds[@]})) runs of $iterations iterations" \
     "(model $model with vocab 258, GBS $gbs x seq $seq, MBS $mbs, device $device) in $out/runs"
sweep_status=0
for i in "${!seeds[@]}"; do
  s=${seeds[i]}
  echo "$prog: seed $s ($((i + 1)) of ${#seeds[@]}): runs $((i * nvariants + 1))-$(((i + 1) * nvariants)) of $((nvariants * ${#seeds[@]}))"
  seed_flags "$s"
  # In the background so that a SIGTERM to this script reaches the sweep at once (it kills its run and
  # removes the partial log); Ctrl-C reaches the sweep through the terminal's process group.
  PYTHON=$python "$repo/scripts/sweep.sh" --recipes "$recipes" --mbs "$mbs" --seq "$seq" --out "$out/runs/seed$s" \
    --bin "$bin" --no-png -- "${flags[@]}" &
  sweep_pid=$!
  trap 'kill -TERM "$sweep_pid" 2>/dev/null; wait "$sweep_pid"; record_runs "$s"; echo "$prog: interrupted (rerun the same command to resume)" >&2; exit 130' INT TERM
  wait "$sweep_pid"
  rc=$?
  trap - INT TERM
  record_runs "$s"  # the seed's complete runs, also those of a sweep that failed or was interrupted
  ((rc == 130)) && { echo "$prog: interrupted (rerun the same command to resume)" >&2; exit 130; }
  ((rc == 2)) && die "sweep.sh refused to run (its error above)"
  ((rc == 0)) || sweep_status=$rc
done
((sweep_status == 0)) || die "some runs failed (see the .failed.log files under $out/runs); no report written"

# ---- 5. the report ----
provenance_of_seeds  # commit, machine
if [[ "$device" == cuda ]] && command -v nvidia-smi >/dev/null 2>&1; then
  machine+=", GPU $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
fi
run_dirs=()
for s in "${seeds[@]}"; do run_dirs+=("$out/runs/seed$s"); done
example="pretrain_llama --recipe RECIPE --micro-batch-size $mbs --seq-length $seq $(quote_words "${flags[@]}")"
example=${example//"$out"/OUT}
example=${example//"--seed $s --data-seed $s"/--seed SEED --data-seed SEED}  # the last seed's flags
"$python" "$repo/scripts/study_report.py" --out-doc "$out_doc" --command "$invocation" --commit "$commit" \
  --machine "$machine" --device "$device" --run-command "$example" --model "$model" --out "$out" \
  --seeds "$(IFS=,; echo "${seeds[*]}")" "${run_dirs[@]}" || die "study_report.py failed"
