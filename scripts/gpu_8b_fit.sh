#!/usr/bin/env bash
# Issue 12's GPU record: the whole llama3_8b (32 layers, the playbook's NVFP4 recipe with its last 4
# layers in BF16, seq 4096, micro-batch 1) on the one GPU of this machine, with the flags the fit table
# names for it (`pretrain_llama --dry-run --dry-run-gpu NAME`: on an H100 the CPU optimizer offload, on
# an H200 the precision-aware optimizer's BF16 moments). Prints the flags, the dry run's GPU and host
# totals, then one line of measurements from the run's JSON-lines log (--log-jsonl, its "end" event, read
# by scripts/jsonl_log.py with python3's standard library): mean step time, MODEL_TFLOP/s, tokens/s, final
# loss and nan iterations in the summary line's words, and the peak GPU memory (memory.max_allocated_bytes,
# in GB of 1e9). Offline, from the bundle (gpu_check.sh --unpack sets it up); builds nothing.
#
#   scripts/gpu_8b_fit.sh [--bundle DIR] [--gpu h100|h200|b200|gb300|rtx5090] [--iters N] [--gbs N]
#                         [--recipe NAME] [--extra "FLAGS"]
#
# --recipe: the precision recipe (default: the playbook's bf16_with_nvfp4_mixed); the whole-8B FP8 row is
# --recipe bf16_with_fp8_current_scaling_mixed (its FP8 primary weights, fp8_param_gather, on as the recipe
# says: the fit table then names BF16 moments alone for an H200). Given, the logs are named after it
# (gpu_8b_fit_NAME.log, .jsonl) so that two rows of one call keep theirs; the report is appended to.
#
# --gpu: the fit table's GPU (default: from nvidia-smi's name). --iters 10 and --gbs 8 (8 micro-batches
# per iteration: the playbook's GBS 64 would take several minutes per iteration on one GPU) by default.
# With $OUT set (the device tool) the report and the logs (gpu_8b_fit.log, gpu_8b_fit.jsonl) go there.
# Exit 0 when the run finished (an "end" event) with finite losses, 1 otherwise, 2 on bad arguments or
# nothing to run, 3 without a GPU.
set -uo pipefail
self_dir=$(cd "$(dirname "$0")" && pwd)
bundle="" gpu="" iters=10 gbs=8 extra="" recipe=""
while (($#)); do
  case $1 in
    --recipe) recipe=${2:?}; shift 2 ;;
    --bundle) bundle=${2:?}; shift 2 ;;
    --gpu) gpu=${2:?}; shift 2 ;;
    --iters) iters=${2:?}; shift 2 ;;
    --gbs) gbs=${2:?}; shift 2 ;;
    --extra) extra=${2:?}; shift 2 ;;
    -h|--help) awk 'NR > 1 && /^#/ {sub(/^# ?/, ""); print; next} NR > 1 {exit}' "$0"; exit 0 ;;
    *) echo "gpu_8b_fit: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ $iters =~ ^[1-9][0-9]*$ && $gbs =~ ^[1-9][0-9]*$ ]] || { echo "gpu_8b_fit: --iters and --gbs take a positive number" >&2; exit 2; }
[[ -z $recipe || $recipe =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "gpu_8b_fit: --recipe takes a recipe name (configs/recipes/NAME.json)" >&2; exit 2; }
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU [0-9]' ||
  { echo "gpu_8b_fit: no GPU is present: nothing to run" >&2; exit 3; }

# The bundle's programs, unpacked with their libraries by gpu_check.sh (one place knows how).
[[ -z $bundle ]] && for d in "$self_dir/.." "$self_dir/../.device"; do [[ -f $d/BUILD_INFO ]] && bundle=$d && break; done
[[ -n $bundle ]] || { echo "gpu_8b_fit: no bundle (.device/, made by scripts/gpu_bundle.sh)" >&2; exit 2; }
rt=$(mktemp -d "${TMPDIR:-/tmp}/pl_8b.XXXXXX")
trap 'rm -rf "$rt"' EXIT
bash "$self_dir/gpu_check.sh" --bundle "$bundle" --unpack "$rt/u" >/dev/null || { echo "gpu_8b_fit: cannot unpack $bundle" >&2; exit 2; }
# shellcheck disable=SC1091
source "$rt/u/env.sh"
app=$rt/u/bin/pretrain_llama

if [[ -z $gpu ]]; then
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1)
  case $name in
    *GB300*) gpu=gb300 ;; *H200*) gpu=h200 ;; *H100*) gpu=h100 ;; *B200*) gpu=b200 ;; *5090*) gpu=rtx5090 ;;
    *) echo "gpu_8b_fit: no fit-table entry for '$name': give --gpu" >&2; exit 2 ;;
  esac
fi
out=${OUT:-$rt}
stem=gpu_8b_fit${recipe:+_$recipe}
report=$out/gpu_8b_fit.txt log=$out/$stem.log jsonl=$out/$stem.jsonl reader=$self_dir/jsonl_log.py
say() { printf '%s\n' "$*" | tee -a "$report"; }
shape=(--device cuda --model llama3_8b --micro-batch-size 1 --seq-length 4096 --global-batch-size "$gbs")
[[ -n $recipe ]] && shape+=(--recipe "$recipe")

# shellcheck disable=SC2086
dry=$("$app" "${shape[@]}" $extra --dry-run --dry-run-gpu "$gpu" 2>&1) || { say "FAILED: dry run: $(tail -n 1 <<<"$dry")"; exit 1; }
line=$(grep 'cheapest flags for' <<<"$dry" | tail -n 1)
say "== llama3_8b${recipe:+ ($recipe)} on $(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | head -n 1) (fit table: $gpu)"
say "   ${line#*| }"
grep -q 'does not fit with any' <<<"$line" && { say "FAILED: the fit table finds no flags for $gpu"; exit 1; }
# "cheapest flags for X (N GB usable): as given (...)" or ": --flag ... (GPU a GB, host b GB)"
flags=$(sed -nE 's/.*usable\): (.*) \(GPU [0-9.]+ GB.*/\1/p' <<<"$line")
[[ $flags == "as given" ]] && flags=""
# shellcheck disable=SC2086
plan=$("$app" "${shape[@]}" $extra $flags --dry-run --dry-run-gpu "$gpu" 2>&1 | grep -E 'memory total' | sed 's/^pretrain_llama | memory //')
while IFS= read -r l; do say "   plan: $l"; done <<<"$plan"

say "   run: pretrain_llama ${shape[*]} $extra $flags --train-iters $iters --log-interval 1 --timing-log-level 1"
start=$(date +%s)
rm -f "$jsonl"
# shellcheck disable=SC2086
timeout -k 10 570 "$app" "${shape[@]}" $extra $flags --train-iters "$iters" --log-interval 1 --timing-log-level 1 \
  --log-jsonl "$jsonl" >"$log" 2>&1
rc=$?
s=$(python3 "$reader" --summary "$jsonl" 2>&1)
src=$?
if ((rc != 0 || src != 0)); then
  why=$(grep -v '^$' "$log" | tail -n 1 | cut -c1-200)
  ((rc == 0)) && why="${s#jsonl_log.py: }"
  say "FAILED (rc $rc after $(( $(date +%s) - start )) s): $why"; exit 1
fi
# nan iterations, final loss (null: nan), peak memory in bytes
IFS=$'\t' read -r nan loss peak < <(python3 "$reader" "$jsonl" end nan_iterations final_lm_loss memory.max_allocated_bytes)
say "   $s"
say "   peak GPU memory (max allocated): $(LC_ALL=C awk -v b="$peak" 'BEGIN { if (b ~ /^[0-9.eE+-]+$/) printf "%.3f", b / 1e9; else printf "?" }') GB; wall $(( $(date +%s) - start )) s including start-up"
grep -E 'optimizer-(copy-to-main-grad|inner-step|copy-main-to-model-params)' "$log" | tail -n 3 | sed 's/^/   /' | tee -a "$report"
[[ $nan == 0 && $loss != nan ]] || { say "FAILED: non-finite losses"; exit 1; }
