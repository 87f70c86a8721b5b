#!/usr/bin/env bash
# Runs a grid of pretrain_llama settings: recipes x micro-batch sizes x sequence lengths (x seeds) (x the
# values of any other flag, --vary), one log per point named by its settings, then one CSV of the summary
# figures (a row per point, from scripts/compare_logs.py --csv) and the comparison figure over all points
# (compare_logs.py --png).
#
#   scripts/sweep.sh --recipes bf16_mixed,bf16_with_nvfp4_mixed --mbs 1,2 --seq 128 --out DIR \
#       [--seeds 1234,1235] [--vary --FLAG=V1,V2 ...] [--bin PATH] [--no-png] -- <extra pretrain_llama flags>
#
# --vary --FLAG=V1,V2[,...] (repeatable): one more axis, pretrain_llama's --FLAG taking each value in turn
# (innermost, in the order given). Weight decay x LR decay style on llama_tiny (four points):
#
#   scripts/sweep.sh --recipes bf16_mixed --mbs 1 --seq 64 --vary --weight-decay=0.033,0.1 \
#       --vary --lr-decay-style=cosine,WSD --out DIR -- --model llama_tiny --device cpu --train-iters 20 \
#       --global-batch-size 4 --lr-wsd-decay-iters 5
#
# Writes, in DIR:
#   RECIPE_mbsM_seqS[_seedN][_FLAG-VALUE...].log  each point's output (stdout and stderr), its first line
#                                 the command (FLAG without its dashes, e.g. _weight-decay-0.1)
#   sweep.csv                     the point's settings (recipe, mbs, seq_length[, seed][, one column per
#                                 --vary flag, named like weight_decay]) then compare_logs.py's columns;
#                                 the first point is the reference of the gaps
#   sweep.png                     compare_logs.py's figure over all complete points (unless --no-png)
# Resumable: a point whose log is complete (its last line is pretrain_llama's summary line) is skipped;
# a point runs into DIR/.NAME.log.partial, renamed to NAME.log when complete; a failed run's output is
# kept as NAME.failed.log and the sweep goes on (exit status 1 at the end). A complete log made by another
# command (other extra flags, another recipe path) is not reused: the sweep stops before running anything.
# Ctrl-C / SIGTERM: the running point is killed, its partial log removed, exit status 130.
# RECIPE is a name in configs/recipes/ or a path to a JSON recipe (its file name, less .json, names the log).
# Env: PYTHON (default /usr/bin/python3 when it has numpy, else python3 on PATH) runs compare_logs.py.
set -uo pipefail

prog=sweep.sh
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# shellcheck source=scripts/script_util.sh
source "$repo/scripts/script_util.sh"  # die, quote_words, print_usage, find_python
usage() { print_usage "${BASH_SOURCE[0]}"; }

recipes_arg="" mbs_arg="" seq_arg="" seeds_arg="" out="" bin="$repo/build/apps/pretrain_llama" png=1
extra=() vary_flags=() vary_values=()
while (($#)); do
  case "$1" in
    --vary)
      (($# >= 2)) && [[ "$2" =~ ^--[A-Za-z0-9][A-Za-z0-9-]*=. ]] ||
        die "--vary needs --FLAG=V1,V2 (a pretrain_llama flag, '=', its values), got '${2:-}'"
      vary_flags+=("${2%%=*}") vary_values+=("${2#*=}")
      shift 2 ;;
    --recipes|--mbs|--seq|--seeds|--out|--bin)
      (($# >= 2)) && [[ -n "$2" && "$2" != --* ]] || die "$1 needs a value"
      case "$1" in
        --recipes) recipes_arg=$2 ;; --mbs) mbs_arg=$2 ;; --seq) seq_arg=$2 ;; --seeds) seeds_arg=$2 ;;
        --out) out=$2 ;; --bin) bin=$2 ;;
      esac
      shift 2 ;;
    --no-png) png=0; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) die "unknown argument '$1' (extra pretrain_llama flags go after --; see --help)" ;;
  esac
done
[[ -n "$recipes_arg" ]] || die "--recipes is required (e.g. --recipes bf16_mixed,bf16_with_nvfp4_mixed)"
[[ -n "$mbs_arg" ]] || die "--mbs is required (e.g. --mbs 1,2)"
[[ -n "$seq_arg" ]] || die "--seq is required (e.g. --seq 128)"
[[ -n "$out" ]] || die "--out DIR is required"
[[ -x "$bin" && -f "$bin" ]] || die "--bin $bin: no such executable (build it: cmake --build build --target pretrain_llama)"

# split_list NAME VALUE KIND: the comma-separated list VALUE into array NAME; KIND int checks positive integers.
split_list() {
  local -n _arr=$1
  local opt=$2 value=$3 kind=$4 item
  [[ "$value" != ,* && "$value" != *, && "$value" != *,,* ]] || die "$opt '$value': empty item"
  IFS=, read -r -a _arr <<<"$value"
  for item in "${_arr[@]}"; do
    [[ -n "$item" ]] || die "$opt '$value': empty item"
    if [[ $kind == int ]]; then
      [[ "$item" =~ ^[0-9]+$ ]] || die "$opt '$value': '$item' is not a non-negative integer"
      [[ $opt == --seeds || $((10#$item)) -gt 0 ]] || die "$opt '$value': '$item' must be positive"
    fi
  done
  local sorted
  sorted=$(printf '%s\n' "${_arr[@]}" | sort | uniq -d | head -1)
  [[ -z "$sorted" ]] || die "$opt '$value': '$sorted' given twice"
}
recipes=() mbss=() seqs=()
split_list recipes --recipes "$recipes_arg" str
split_list mbss --mbs "$mbs_arg" int
split_list seqs --seq "$seq_arg" int
seeds=("")
[[ -z "$seeds_arg" ]] || split_list seeds --seeds "$seeds_arg" int
# --vary: each axis's values (checked like the others; a value names logs, so it is one plain word).
for a in "${!vary_flags[@]}"; do
  f=${vary_flags[a]}
  case "$f" in
    --recipe|--disable-fp4|--micro-batch-size|--seq-length|--seed)
      die "--vary $f: the grid sets $f itself (use --recipes, --mbs, --seq or --seeds)" ;;
  esac
  for ((b = 0; b < a; b++)); do [[ "${vary_flags[b]}" != "$f" ]] || die "--vary $f given twice"; done
  split_list _values "--vary $f" "${vary_values[a]}" str
  for v in "${_values[@]}"; do
    [[ "$v" =~ ^[A-Za-z0-9._+-]+$ ]] || die "--vary $f: value '$v' cannot name a log (letters, digits and ._+- only)"
  done
  for flag in "${extra[@]}"; do
    [[ "$flag" != "$f" && "$flag" != "$f="* ]] || die "'$flag' after -- is also varied by --vary $f"
  done
done

# Flags the grid sets itself must not come again after --.
for flag in "${extra[@]}"; do
  case "$flag" in
    --recipe|--recipe=*|--disable-fp4) die "'$flag' after --: give the recipes with --recipes (bf16_mixed is the BF16 baseline)" ;;
    --micro-batch-size|--micro-batch-size=*) die "'$flag' after --: give micro-batch sizes with --mbs" ;;
    --seq-length|--seq-length=*) die "'$flag' after --: give sequence lengths with --seq" ;;
    --seed|--seed=*) [[ -z "$seeds_arg" ]] || die "'$flag' after -- together with --seeds: give the seeds with --seeds" ;;
  esac
done

# Each recipe: the argument pretrain_llama gets (a name in configs/recipes/ or a path) and its label.
labels=() recipe_args=()
for r in "${recipes[@]}"; do
  if [[ "$r" == */* || "$r" == *.json ]]; then
    [[ -f "$r" ]] || die "--recipes: recipe file '$r' not found"
    label=$(basename "$r" .json)
  else
    [[ -f "$repo/configs/recipes/$r.json" ]] || die "--recipes: no recipe '$r' (not in configs/recipes/; a file needs a path or .json)"
    label=$r
  fi
  [[ "$label" =~ ^[A-Za-z0-9._+-]+$ ]] || die "--recipes: '$label' cannot name a log (letters, digits and ._+- only)"
  for l in "${labels[@]}"; do [[ "$l" != "$label" ]] || die "--recipes: two recipes named '$label'"; done
  labels+=("$label") recipe_args+=("$r")
done

mkdir -p "$out" 2>/dev/null || die "--out $out: cannot create the directory"
[[ -w "$out" ]] || die "--out $out: not writable"

find_python

# The --vary axes' combinations, the last axis fastest: each as name suffix, CSV cells and flags.
combo_names=("") combo_settings=("") combo_args=("")
for a in "${!vary_flags[@]}"; do
  f=${vary_flags[a]}
  IFS=, read -r -a _values <<<"${vary_values[a]}"
  next_names=() next_settings=() next_args=()
  for c in "${!combo_names[@]}"; do
    for v in "${_values[@]}"; do
      next_names+=("${combo_names[c]}_${f#--}-$v") next_settings+=("${combo_settings[c]},$v")
      next_args+=("${combo_args[c]} $(quote_words "$f" "$v")")
    done
  done
  combo_names=("${next_names[@]}") combo_settings=("${next_settings[@]}") combo_args=("${next_args[@]}")
done

# The points, in order: seeds (outermost), recipes, micro-batch sizes, sequence lengths, --vary axes.
names=() settings=() cmds=()
for seed in "${seeds[@]}"; do
  for i in "${!recipes[@]}"; do
    for m in "${mbss[@]}"; do
      for s in "${seqs[@]}"; do
        for c in "${!combo_names[@]}"; do
          name="${labels[i]}_mbs${m}_seq${s}"
          args=(--recipe "${recipe_args[i]}" --micro-batch-size "$m" --seq-length "$s")
          setting="${labels[i]},$m,$s"
          if [[ -n "$seed" ]]; then
            name+="_seed${seed}" args+=(--seed "$seed") setting+=",$seed"
          fi
          eval "args+=(${combo_args[c]})"  # the quoted words of this combination's flags
          args+=("${extra[@]}")
          name+=${combo_names[c]} setting+=${combo_settings[c]}
          names+=("$name") settings+=("$setting") cmds+=("$(quote_words "${args[@]}")")
        done
      done
    done
  done
done
n=${#names[@]}

# First line of each log: the command of its point (the binary left out, so that a moved build tree
# still resumes).
header_of() { echo "sweep.sh | point $1 | pretrain_llama ${cmds[$2]}"; }
is_complete() {  # the last non-empty line is pretrain_llama's summary line
  [[ -f "$1" ]] && [[ "$(grep -v '^[[:space:]]*$' "$1" | tail -n 1)" == "pretrain_llama | summary: "* ]]
}
for k in "${!names[@]}"; do
  log="$out/${names[k]}.log"
  if is_complete "$log" && [[ "$(head -n 1 "$log")" != "$(header_of "${names[k]}" "$k")" ]]; then
    die "$log is complete but was made by another command (its first line: $(head -n 1 "$log" | cut -c1-200)); use another --out or remove it"
  fi
done

child="" partial=""
on_signal() {
  trap '' INT TERM
  if [[ -n "$child" ]]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  [[ -z "$partial" ]] || rm -f "$partial"
  echo "$prog: interrupted${current:+ during $current}; its partial log removed (run the same command again to resume)" >&2
  exit 130
}
current=""
trap on_signal INT TERM

failed=0 ran=0
for k in "${!names[@]}"; do
  name=${names[k]} log="$out/${names[k]}.log"
  tag="[$((k + 1))/$n] $name"
  if is_complete "$log"; then
    echo "$prog: $tag: skip (complete log $log)"
    continue
  fi
  eval "args=(${cmds[k]})"  # the quoted words back into an array
  echo "$prog: $tag: running -> $log"
  partial="$out/.${name}.log.partial" current=$name
  header_of "$name" "$k" >"$partial"
  start=$SECONDS
  # In the background so that the trap runs at once on Ctrl-C (a non-interactive shell's background
  # child ignores SIGINT; the trap sends it SIGTERM).
  "$bin" "${args[@]}" >>"$partial" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  ran=$((ran + 1))
  if ((rc == 0)) && is_complete "$partial"; then
    mv -f "$partial" "$log"
    partial=""
    echo "$prog: $tag: done in $((SECONDS - start)) s: $(tail -n 1 "$log" | sed 's/^pretrain_llama | summary: //')"
  else
    mv -f "$partial" "$out/${name}.failed.log"
    partial=""
    failed=$((failed + 1))
    last=$(grep -v '^[[:space:]]*$' "$out/${name}.failed.log" | tail -n 1 | cut -c1-300)
    echo "$prog: $tag: FAILED (exit status $rc; output kept in $out/${name}.failed.log): $last" >&2
  fi
  current=""
done

# The table, the CSV and the figure over the complete points, in grid order.
logs=() rows=()
for k in "${!names[@]}"; do
  if is_complete "$out/${names[k]}.log"; then
    logs+=("$out/${names[k]}.log") rows+=("${settings[k]}")
  fi
done
if ((${#logs[@]} == 0)); then
  echo "$prog: error: no point completed; no CSV written" >&2
  exit 1
fi
points="$out/.sweep.points.csv"
partial="$points"
cmp=("$python" "$repo/scripts/compare_logs.py" "${logs[@]}" --csv "$points")
((png)) && cmp+=(--png "$out/sweep.png")
"${cmp[@]}"
rc=$?
if ((rc != 0)); then
  rm -f "$points"
  echo "$prog: error: compare_logs.py failed (exit status $rc); no CSV written" >&2
  exit 1
fi
head_cols="recipe,mbs,seq_length"
[[ -z "$seeds_arg" ]] || head_cols+=",seed"
for f in "${vary_flags[@]}"; do
  col=${f#--}
  head_cols+=",${col//-/_}"
done
tmp_csv="$out/.sweep.csv.partial"
partial="$tmp_csv"
{
  IFS= read -r header
  echo "$head_cols,$header"
  i=0
  while IFS= read -r line; do
    echo "${rows[i]},$line"
    i=$((i + 1))
  done
} <"$points" >"$tmp_csv"
mv -f "$tmp_csv" "$out/sweep.csv"
rm -f "$points"
partial=""
echo "$prog: ${#logs[@]} of $n points complete ($ran run now); $out/sweep.csv$( ((png)) && echo " and $out/sweep.png")"
((failed == 0)) || { echo "$prog: error: $failed point(s) failed (see the .failed.log files in $out)" >&2; exit 1; }
exit 0
