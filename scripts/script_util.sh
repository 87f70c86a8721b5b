# Shell helpers shared by scripts/sweep.sh and scripts/nvfp4_study.sh (sourced; `prog` names the caller).

die() { echo "$prog: error: $*" >&2; exit 2; }

# The words as a shell command line: plain words as they are, the others quoted (printf %q).
quote_words() {
  local w out=""
  for w in "$@"; do
    if [[ "$w" =~ ^[A-Za-z0-9_./:=,+@%-]+$ ]]; then out+=" $w"; else out+=" $(printf '%q' "$w")"; fi
  done
  printf '%s' "${out# }"
}

# The header comment of script $1 (from its second line up to `set -uo`), without the leading '# '.
print_usage() { sed -n '2,/^set -uo/{/^set -uo/d;s/^# \{0,1\}//;p}' "$1"; }

# Sets `python`: $PYTHON, else Debian's /usr/bin/python3 when it has numpy (scripts/setup.sh installs
# python3-numpy and python3-matplotlib there; a python3 earlier on PATH may lack them), else python3.
find_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    python=$PYTHON
  elif [[ -x /usr/bin/python3 ]] && /usr/bin/python3 -c 'import numpy' 2>/dev/null; then
    python=/usr/bin/python3
  else
    python=python3
  fi
}
