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
# Writes, in DIR, per point NAME = RECIPE_mbsM_seqS[_seedN][_FLAG-VALUE...] (FLAG without its dashes, e.g.
# _weight-decay-0.1):
#   NAME.log                      the point's output (stdout and stderr), for people: its first line the
#                                 point's command (the binary left out)
#   NAME.jsonl                    its JSON-lines log (pretrain_llama --log-jsonl; scripts/jsonl_log.py reads
#                                 it): what the sweep reads, for completeness and for the table
#   sweep.csv                     the point's settings (recipe, mbs, seq_length[, seed][, one column per
#                                 --vary flag, named like weight_decay]) then compare_logs.py's columns over
#                                 the NAME.jsonl files (its log and path columns name them); the first point
#                                 is the reference of the gaps
#   sweep.png                     compare_logs.py's figure over all complete points (unless --no-png)
# Resumable: a point is complete when NAME.log is there and NAME.jsonl's last event is "end" (the run ended
# normally, not stopped by a signal: jsonl_log.py --complete); a complete point is skipped. A point runs
# into DIR/.NAME.log.partial and DIR/.NAME.jsonl.partial, renamed to NAME.log and then NAME.jsonl when it
# exited with status 0 and its JSON-lines log is complete; else its output is kept as NAME.failed.log (and
# NAME.failed.jsonl when the run got as far as writing one) and the sweep goes on (exit status 1 at the end).
# A directory from before the JSON-lines logs (NAME.log without NAME.jsonl) is run again.
# A NAME.log made by another command (other extra flags, another recipe path) is not reused: the sweep stops
# before running anything. The command is read from NAME.log's first line, not from the JSON-lines log's
# start event: its command_line holds the binary's path and the partial --log-jsonl name, which change
# when a build tree moves and when the file is renamed, while the first line holds only the point's flags.
# Ctrl-C / SIGTERM: the running point is killed, its partial logs removed, exit status 130.
# RECIPE is a name in configs/recipes/ or a path to a JSON recipe (its file name, less .json, names the log).
# --log-jsonl is the sweep's own: it may not come after -- or in --vary.
# Env: PYTHON (default /usr/bin/python3 when it has numpy, else python3 on PATH) runs compare_logs.py and
# jsonl_log.py (which needs only the standard library).
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
    --log-jsonl) die "--vary $f: the sweep writes each point's JSON-lines log itself (NAME.jsonl)" ;;
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
    --log-jsonl|--log-jsonl=*) die "'$flag' after --: the sweep writes each point's JSON-lines log itself (NAME.jsonl)" ;;
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
# Every point's completeness is read with it: a python that cannot run it would rerun every point.
reader="$repo/scripts/jsonl_log.py"
"$python" "$reader" --help >/dev/null 2>&1 || die "$python cannot run $reader (set PYTHON to a working python3)"

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
is_complete() {  # NAME: NAME.log is there and NAME.jsonl holds a complete run
  [[ -f "$out/$1.log" && -f "$out/$1.jsonl" ]] && "$python" "$reader" --complete "$out/$1.jsonl" 2>/dev/null
}
# (A NAME.log is only ever a finished point's, renamed into place: whatever its JSON-lines log says, one
# made by another command is not run over.)
for k in "${!names[@]}"; do
  log="$out/${names[k]}.log"
  if [[ -f "$log" ]] && [[ "$(head -n 1 "$log")" != "$(header_of "${names[k]}" "$k")" ]]; then
    die "$log was made by another command (its first line: $(head -n 1 "$log" | cut -c1-200)); use another --out or remove it"
  fi
done

child="" partial="" partial_jsonl=""
on_signal() {
  trap '' INT TERM
  if [[ -n "$child" ]]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  [[ -z "$partial" ]] || rm -f "$partial"
  [[ -z "$partial_jsonl" ]] || rm -f "$partial_jsonl"
  echo "$prog: interrupted${current:+ during $current}; its partial logs removed (run the same command again to resume)" >&2
  exit 130
}
current=""
trap on_signal INT TERM

failed=0 ran=0
for k in "${!names[@]}"; do
  name=${names[k]} log="$out/${names[k]}.log" jsonl="$out/${names[k]}.jsonl"
  tag="[$((k + 1))/$n] $name"
  if is_complete "$name"; then
    echo "$prog: $tag: skip (complete log $log)"
    continue
  fi
  eval "args=(${cmds[k]})"  # the quoted words back into an array
  echo "$prog: $tag: running -> $log"
  partial="$out/.${name}.log.partial" partial_jsonl="$out/.${name}.jsonl.partial" current=$name
  # (pretrain_llama leaves an existing file alone when it fails before its first iteration, and a run
  # that resumes from a checkpoint appends to it: no stale partial may be there.)
  rm -f "$partial_jsonl"
  header_of "$name" "$k" >"$partial"
  start=$SECONDS
  # In the background so that the trap runs at once on Ctrl-C (a non-interactive shell's background
  # child ignores SIGINT; the trap sends it SIGTERM).
  "$bin" "${args[@]}" --log-jsonl "$partial_jsonl" >>"$partial" 2>&1 &
  child=$!
  wait "$child"
  rc=$?
  child=""
  ran=$((ran + 1))
  why=""
  ((rc == 0)) && why=$("$python" "$reader" --complete "$partial_jsonl" 2>&1)
  if ((rc == 0)) && [[ -z "$why" ]]; then
    # The JSON-lines log last: a NAME.jsonl in place means its NAME.log is too.
    mv -f "$partial" "$log"
    mv -f "$partial_jsonl" "$jsonl"
    partial="" partial_jsonl=""
    echo "$prog: $tag: done in $((SECONDS - start)) s: $("$python" "$reader" --summary "$jsonl" 2>&1)"
  else
    mv -f "$partial" "$out/${name}.failed.log"
    if [[ -f "$partial_jsonl" ]]; then mv -f "$partial_jsonl" "$out/${name}.failed.jsonl"; else rm -f "$out/${name}.failed.jsonl"; fi
    partial="" partial_jsonl=""
    failed=$((failed + 1))
    last=$(grep -v '^[[:space:]]*$' "$out/${name}.failed.log" | tail -n 1 | cut -c1-300)
    [[ -n "$why" ]] && last="${why#jsonl_log.py: } (last line of the log: $last)"
    echo "$prog: $tag: FAILED (exit status $rc; output kept in $out/${name}.failed.log): $last" >&2
  fi
  current=""
done

# The table, the CSV and the figure over the complete points, in grid order.
logs=() rows=()
for k in "${!names[@]}"; do
  if is_complete "${names[k]}"; then
    logs+=("$out/${names[k]}.jsonl") rows+=("${settings[k]}")
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
