# shellcheck shell=bash disable=SC2154  # sourced by nvfp4_study.sh, whose variables it reads
# The study's record (sourced by scripts/nvfp4_study.sh): the finished seeds' logs, kept beside the report
# in OUT_DOC/runs/ and committed with it, so that a study longer than one working session, on a machine whose
# work directories do not outlive it, goes on where it stopped and a reader can recompute every number.
#
#   OUT_DOC/runs/config.txt            the study's configuration (iterations, model, batch, device, corpus
#                                      sha256); a start with another configuration is refused
#   OUT_DOC/runs/seedN/NAME.log.gz     a complete run's text log and JSON-lines log (gzip -n), OUT's path
#   OUT_DOC/runs/seedN/NAME.jsonl.gz   written as @STUDY_OUT@ (restored into any work directory)
#   OUT_DOC/runs/seedN/provenance.txt  commit, binary sha256, CPU, cores and date of the seed's runs
#
# A seed is recorded once its eight runs are complete. A start restores the recorded seeds that its work
# directory lacks, after checking that --bin computes what the recorded binary did: iterations 1-2 of every
# variant at the first recorded seed, the lm loss and grad norm of the JSON-lines logs (full double
# precision) equal to the last bit. The check is skipped when --bin's sha256 is the recorded one. Numerics
# that differ refuse the record: the study is then rerun at this commit (remove OUT_DOC/runs).
#
# Uses the caller's: prog, die, python, out, out_doc, bin, bin_sha, run_commit, seeds, mbs, seq, device,
# iterations, model, gbs, corpus, seed_flags (sets `flags`, a seed's pretrain_llama flags) and labels
# (the variants' sweep names without _mbsM_seqS, in sweep order) with recipe_args (their --recipe values).

record="$out_doc/runs"
record_token="@STUDY_OUT@"

record_config() {
  echo "iterations $iterations model $model gbs $gbs mbs $mbs seq $seq device $device corpus $(sha256sum "$corpus" | cut -c1-16)"
}

run_names() { local l; for l in "${labels[@]}"; do echo "${l}_mbs${mbs}_seq${seq}"; done; }

seed_is_recorded() {  # SEED
  local n
  [[ -f "$record/seed$1/provenance.txt" ]] || return 1
  for n in $(run_names); do
    [[ -f "$record/seed$1/$n.log.gz" && -f "$record/seed$1/$n.jsonl.gz" ]] || return 1
  done
}

seed_is_complete() {  # SEED: the work directory holds the seed's eight complete runs
  local n dir="$out/runs/seed$1"
  for n in $(run_names); do
    [[ -f "$dir/$n.log" && -f "$dir/$n.jsonl" ]] || return 1
    "$python" "$repo/scripts/jsonl_log.py" --complete "$dir/$n.jsonl" >/dev/null 2>&1 || return 1
  done
}

# sed replacement text for a literal string (\, & and the | delimiter escaped).
sed_literal() { local s=${1//\\/\\\\}; s=${s//&/\\&}; printf '%s' "${s//|/\\|}"; }

record_check_config() {  # refuses a record of another configuration
  [[ -f "$record/config.txt" ]] || return 0
  local have want
  have=$(cat "$record/config.txt") want=$(record_config)
  [[ "$have" == "$want" ]] ||
    die "$record holds a study of another configuration ($have; this one: $want): pass another --out-doc, or remove $record to replace it"
}

record_seed() {  # SEED: gzip the complete seed's logs into the record (atomically: a seed folder is whole)
  local s=$1 n ext dir="$out/runs/seed$1" tmp="$record/.seed$1.tmp" from
  from=$(sed_literal "$out")
  rm -rf "$tmp" && mkdir -p "$tmp" || die "cannot write $tmp"
  for n in $(run_names); do
    for ext in log jsonl; do
      sed "s|$from|$(sed_literal "$record_token")|g" "$dir/$n.$ext" | gzip -9 -n > "$tmp/$n.$ext.gz" ||
        die "cannot write $tmp/$n.$ext.gz"
    done
  done
  echo "commit $run_commit sha256 $bin_sha cpu $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //') cores $(nproc)" \
       "date $(date -u +%Y-%m-%d)" > "$tmp/provenance.txt"
  [[ -f "$record/config.txt" ]] || record_config > "$record/config.txt"
  rm -rf "$record/seed$s" && mv "$tmp" "$record/seed$s" || die "cannot move $tmp to $record/seed$s"
  echo "$prog: seed $s recorded in $record/seed$s (commit it with the report)"
}

restore_seed() {  # SEED: the recorded logs into the work directory (each text log before its JSON-lines log)
  local s=$1 n ext dir="$out/runs/seed$1" to
  to=$(sed_literal "$out")
  mkdir -p "$dir" || die "cannot create $dir"
  for n in $(run_names); do
    for ext in log jsonl; do
      gzip -dc "$record/seed$s/$n.$ext.gz" | sed "s|$record_token|$to|g" > "$dir/.$n.$ext.restore" &&
        mv -f "$dir/.$n.$ext.restore" "$dir/$n.$ext" || die "cannot restore $record/seed$s/$n.$ext.gz into $dir"
    done
  done
  echo "$prog: seed $s restored from $record/seed$s ($(cut -d' ' -f1-4 "$record/seed$s/provenance.txt"))"
}

# Iterations 1-2 of every variant at seed SEED with --bin, against the recorded JSON-lines logs.
check_recorded_numerics() {  # SEED
  local s=$1 k n tmp why
  tmp=$(mktemp -d "$out/.numerics.XXXXXX") || die "cannot write in $out"
  echo "$prog: checking that $bin computes what the record's binary did ($(cut -d' ' -f1-4 "$record/seed$s/provenance.txt")):" \
       "iterations 1-2 of each variant at seed $s"
  seed_flags "$s"
  for k in "${!labels[@]}"; do
    n="${labels[k]}_mbs${mbs}_seq${seq}"
    "$bin" --recipe "${recipe_args[k]}" --micro-batch-size "$mbs" --seq-length "$seq" "${flags[@]}" \
      --exit-interval 2 --log-jsonl "$tmp/$n.jsonl" > "$tmp/$n.log" 2>&1 ||
      { rm -rf "$tmp"; die "the numerics check run of ${labels[k]} failed (its log was $tmp/$n.log)"; }
    gzip -dc "$record/seed$s/$n.jsonl.gz" > "$tmp/$n.recorded.jsonl" || die "cannot read $record/seed$s/$n.jsonl.gz"
    if ! why=$("$python" - "$tmp/$n.recorded.jsonl" "$tmp/$n.jsonl" <<'EOF'
import json, sys
def first_two(path):
    with open(path) as fh:
        ev = [json.loads(line) for line in fh]
    return [(e["iteration"], e["lm_loss"], e["grad_norm"]) for e in ev if e["event"] == "iteration"][:2]
want, have = first_two(sys.argv[1]), first_two(sys.argv[2])
if len(have) < 2 or have != want:
    print(f"recorded (iteration, lm loss, grad norm) {want}, this binary {have}")
    sys.exit(1)
EOF
    ); then
      rm -rf "$tmp"
      die "$bin does not compute what the record's binary did (${labels[k]}, seed $s: $why): its numerics changed; rerun the study at this commit (remove $record)"
    fi
  done
  rm -rf "$tmp"
  echo "$prog: numerics unchanged: every variant's iterations 1-2 equal the record's to the last bit"
}

# Before the runs: restore the recorded seeds the work directory lacks (checking the numerics first when
# --bin is another binary), and record the complete seeds the record lacks.
sync_record() {
  local s check="" rec_sha
  record_check_config
  for s in "${seeds[@]}"; do
    if seed_is_recorded "$s" && ! seed_is_complete "$s"; then
      read -r _ _ _ rec_sha _ < "$record/seed$s/provenance.txt"
      if [[ "$rec_sha" != "$bin_sha" && -z "$check" ]]; then
        check_recorded_numerics "$s"
        check=done
      fi
      restore_seed "$s"
    fi
  done
  for s in "${seeds[@]}"; do
    if seed_is_complete "$s" && ! seed_is_recorded "$s"; then record_seed "$s"; fi
  done
}

# Sets `commit` and `machine` for the report from the seeds' provenance: one phrase when every seed was run
# by one binary on one kind of machine, else one per group of seeds.
provenance_of_seeds() {
  local s line c sha m key
  local -A by_commit=() by_machine=()
  local commit_order=() machine_order=()
  for s in "${seeds[@]}"; do
    line=$(cat "$record/seed$s/provenance.txt")
    read -r _ c _ sha _ <<< "$line"
    m=$(sed -E 's/.* cpu (.*) cores ([0-9]+) date .*/\2 cores, \1/' <<< "$line")
    key="$c (binary sha256 $sha"
    [[ -n "${by_commit[$key]:-}" ]] || commit_order+=("$key")
    by_commit[$key]+="${by_commit[$key]:+, }$s"
    [[ -n "${by_machine[$m]:-}" ]] || machine_order+=("$m")
    by_machine[$m]+="${by_machine[$m]:+, }$s"
  done
  if ((${#commit_order[@]} == 1)); then
    commit="${commit_order[0]/ (binary/ (every run; binary})"
  else
    commit=""
    for key in "${commit_order[@]}"; do commit+="${commit:+; }$key, seeds ${by_commit[$key]})"; done
    commit+="; later binaries' numerics checked equal to the record's (iterations 1-2 of every variant)"
  fi
  if ((${#machine_order[@]} == 1)); then
    machine=${machine_order[0]}
  else
    machine=""
    for m in "${machine_order[@]}"; do machine+="${machine:+; }$m (seeds ${by_machine[$m]})"; done
  fi
}
