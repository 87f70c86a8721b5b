# shellcheck shell=bash disable=SC2154  # sourced by nvfp4_study.sh, whose variables it reads
# The study's record (sourced by scripts/nvfp4_study.sh): the finished runs' logs, kept beside the report in
# OUT_DOC/runs/ and committed with it, so that a study longer than one working session, on a machine whose
# work directories do not outlive it, goes on where it stopped, and a reader can recompute every number.
#
#   OUT_DOC/runs/config.txt            the study's configuration (iterations, model, batch, device, corpus
#                                      sha256); a start with another configuration is refused
#   OUT_DOC/runs/seedN/NAME.log.gz     a complete run's text log and JSON-lines log (gzip -n), the work
#   OUT_DOC/runs/seedN/NAME.jsonl.gz   directory's path written as @STUDY_OUT@ (restored into any other)
#   OUT_DOC/runs/seedN/provenance.txt  one line per recorded run: NAME commit C sha256 S cpu MODEL cores N date D
#                                      (a run is recorded once its line is there)
#
# A run is recorded once it is complete: at the start, after each seed's sweep, and when the study is
# interrupted. A start restores the recorded runs its work directory lacks, after checking (even when --bin
# is the binary that made them: the CPU may not be the one) that --bin computes what that binary did:
# iterations 1-2 of every recorded variant (at the first seed that has it), the lm loss and grad norm of the
# JSON-lines logs (full double precision) equal to the last bit. It is a check of the first two iterations: a
# change that shows only later (the tail of the LR schedule, the validation pass) passes it; rerun the study
# after such a change (remove OUT_DOC/runs). Numerics that differ refuse the record.
#
# Uses the caller's: prog, die, python, repo, out, out_doc, bin, bin_sha, run_commit, seeds, mbs, seq, device,
# iterations, model, gbs, corpus, seed_flags (sets `flags`, a seed's pretrain_llama flags), labels (the
# variants' sweep names without _mbsM_seqS, in sweep order) and recipe_args (their --recipe values).

record="$out_doc/runs"
record_token="@STUDY_OUT@"

record_config() {
  echo "iterations $iterations model $model gbs $gbs mbs $mbs seq $seq device $device corpus $(sha256sum "$corpus" | cut -c1-16)"
}

run_name() { echo "${labels[$1]}_mbs${mbs}_seq${seq}"; }  # K: the sweep's name of variant K's run

run_is_recorded() {  # SEED NAME
  [[ -f "$record/seed$1/$2.log.gz" && -f "$record/seed$1/$2.jsonl.gz" ]] &&
    grep -q "^$2 " "$record/seed$1/provenance.txt" 2>/dev/null
}

run_is_complete() {  # SEED NAME: the work directory holds the complete run
  [[ -f "$out/runs/seed$1/$2.log" && -f "$out/runs/seed$1/$2.jsonl" ]] &&
    "$python" "$repo/scripts/jsonl_log.py" --complete "$out/runs/seed$1/$2.jsonl" >/dev/null 2>&1
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

record_runs() {  # SEED: gzip the seed's complete runs that the record lacks into it (the provenance line last)
  local s=$1 k n ext from dir="$record/seed$1" cpu
  from=$(sed_literal "$out")
  cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
  for k in "${!labels[@]}"; do
    n=$(run_name "$k")
    run_is_complete "$s" "$n" && ! run_is_recorded "$s" "$n" || continue
    mkdir -p "$dir" || die "cannot create $dir"
    [[ -f "$record/config.txt" ]] || record_config > "$record/config.txt"
    for ext in log jsonl; do
      sed "s|$from|$(sed_literal "$record_token")|g" "$out/runs/seed$s/$n.$ext" | gzip -9 -n > "$dir/.$n.$ext.gz" &&
        mv -f "$dir/.$n.$ext.gz" "$dir/$n.$ext.gz" || die "cannot write $dir/$n.$ext.gz"
    done
    echo "$n commit $run_commit sha256 $bin_sha cpu $cpu cores $(nproc) date $(date -u +%Y-%m-%d)" >> "$dir/provenance.txt"
    echo "$prog: recorded $dir/$n (commit it with the report)"
  done
}

restore_run() {  # SEED NAME: the recorded logs into the work directory (the text log before the JSON-lines log)
  local s=$1 n=$2 ext dir="$out/runs/seed$1" to
  to=$(sed_literal "$out")
  mkdir -p "$dir" || die "cannot create $dir"
  for ext in log jsonl; do
    gzip -dc "$record/seed$s/$n.$ext.gz" | sed "s|$record_token|$to|g" > "$dir/.$n.$ext.restore" &&
      mv -f "$dir/.$n.$ext.restore" "$dir/$n.$ext" || die "cannot restore $record/seed$s/$n.$ext.gz into $dir"
  done
}

# Iterations 1-2 of every recorded variant (at the first seed that has it) with --bin, against the record.
# "; GEMMs: the record's runs ..., this machine's ..." when the two logs' "cpu GEMMs" lines differ (oneDNN's
# kernels follow the CPU's instruction set, and their sums differ): the likely cause of a refusal.
gemm_difference() {
  local had has
  had=$(gzip -dc "$1" 2>/dev/null | grep -m1 -o 'cpu GEMMs: .*') has=$(grep -m1 -o 'cpu GEMMs: .*' "$2")
  if [[ "$had" != "$has" ]]; then echo "; GEMMs: the record's runs ${had#cpu GEMMs: }, this machine's ${has#cpu GEMMs: }"; fi
}

check_recorded_numerics() {
  local k n s tmp why ref checked=0
  tmp=$(mktemp -d "$out/.numerics.XXXXXX") || die "cannot write in $out"
  echo "$prog: checking that $bin computes what the record's binaries did: iterations 1-2 of each recorded variant"
  for k in "${!labels[@]}"; do
    n=$(run_name "$k") ref=""
    for s in "${seeds[@]}"; do run_is_recorded "$s" "$n" && { ref=$s; break; }; done
    [[ -n "$ref" ]] || continue
    seed_flags "$ref"
    "$bin" --recipe "${recipe_args[k]}" --micro-batch-size "$mbs" --seq-length "$seq" "${flags[@]}" \
      --exit-interval 2 --log-jsonl "$tmp/$n.jsonl" > "$tmp/$n.log" 2>&1 ||
      die "the numerics check run of ${labels[k]} failed (its log: $tmp/$n.log)"
    gzip -dc "$record/seed$ref/$n.jsonl.gz" > "$tmp/$n.recorded.jsonl" || die "cannot read $record/seed$ref/$n.jsonl.gz"
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
      why+=$(gemm_difference "$record/seed$ref/$n.log.gz" "$tmp/$n.log")
      rm -rf "$tmp"
      die "$bin does not compute what the record's binary did (${labels[k]}, seed $ref: $why): its numerics changed; rerun the study at this commit (remove $record)"
    fi
    checked=$((checked + 1))
  done
  rm -rf "$tmp"
  echo "$prog: numerics unchanged: iterations 1-2 of $checked variant(s) equal the record's to the last bit"
}

# Before the runs: restore the recorded runs the work directory lacks (checking the numerics first), then
# record the complete runs the record lacks.
sync_record() {
  local s k n restore=()
  record_check_config
  for s in "${seeds[@]}"; do
    for k in "${!labels[@]}"; do
      n=$(run_name "$k")
      if run_is_recorded "$s" "$n" && ! run_is_complete "$s" "$n"; then restore+=("$s:$n"); fi
    done
  done
  if ((${#restore[@]})); then
    # Checked even when the binary is the recorded one: a build of the same commit can be byte-identical on
    # another machine, whose CPU may take other oneDNN kernels (the provenance's CPU name does not tell: a
    # virtual machine's "Intel(R) Xeon(R) Processor" names no generation).
    check_recorded_numerics
    for s in "${restore[@]}"; do restore_run "${s%%:*}" "${s#*:}"; done
    echo "$prog: restored ${#restore[@]} run(s) from $record"
  fi
  for s in "${seeds[@]}"; do record_runs "$s"; done
}

# Sets `commit` and `machine` for the report from the runs' provenance: one phrase when one binary on one
# kind of machine made every run (naming each commit it was built at, with its seeds, when there were
# several), else one per binary (machine) with the seeds it ran.
provenance_of_seeds() {
  local s line c sha m key
  local -A by_commit=() by_machine=() shas=()
  local commit_order=() machine_order=()
  for s in "${seeds[@]}"; do
    while read -r line; do
      read -r _ _ c _ sha _ <<< "$line"
      m=$(sed -E 's/.* cpu (.*) cores ([0-9]+) date .*/\2 cores, \1/' <<< "$line")
      key="$c (binary sha256 $sha"
      shas[$sha]=1
      [[ -n "${by_commit[$key]:-}" ]] || commit_order+=("$key")
      [[ ", ${by_commit[$key]:-}, " == *", $s, "* ]] || by_commit[$key]+="${by_commit[$key]:+, }$s"
      [[ -n "${by_machine[$m]:-}" ]] || machine_order+=("$m")
      [[ ", ${by_machine[$m]:-}, " == *", $s, "* ]] || by_machine[$m]+="${by_machine[$m]:+, }$s"
    done < "$record/seed$s/provenance.txt"
  done
  if ((${#commit_order[@]} == 1)); then
    commit="${commit_order[0]/ (binary/ (every run; binary})"
  elif ((${#shas[@]} == 1)); then
    # The same sources built again at a later commit (one that changed only scripts or docs) give the same
    # bytes: say it is one binary rather than list it as two.
    commit=""
    for key in "${commit_order[@]}"; do commit+="${commit:+ and }${key%% *} (seeds ${by_commit[$key]})"; done
    commit+=", one binary: every run's sha256 is ${!shas[*]}"
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
