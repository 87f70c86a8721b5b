#!/usr/bin/env python3
"""pretrain_llama's JSON-lines log (--log-jsonl FILE, schema version 1): one JSON object per line, each with
an "event" key: "start" (first line of each run or resume), "iteration", "interval", "eval", "end" (last line
of a run that ended normally). The standard library only (no numpy): any python3 runs it.

As a module (compare_logs.py, log_formats.py, study_report.py):
  read_run(path) -> Run          the file's events, with the resume rules below applied
  parse_events(data, path)       the events of a file's bytes (script_errors.read_regular_file reads them)
  value(event, "a.b.0.c")        a nested value by a dotted path (list items by number), MISSING when absent

Reading rules:
  * A last line without its newline is a line still being written (a running run) or cut short (a killed
    one): it is ignored unless it is a whole JSON object (a file written by hand without the final newline).
  * Any other line that is not a JSON object with a string "event" is an error naming FILE:LINE; a blank
    line is skipped; events of other names are kept (and ignored by the readers here).
  * A start event whose schema_version is not 1 is an error (this reader knows version 1).
  * Resumes append to the file: each run's "start" comes first; an iteration number seen again (a resume
    from an earlier checkpoint re-runs it) takes the later line's values (Run.iterations).
  * A run is complete when the file's last event is "end" and that run was not stopped by a signal
    ("stop": "signal"): a file without an "end" after its last "start" is a run that died or is still
    running.
  * The file is opened without blocking and must be a regular file: a FIFO, a directory or a device is
    refused with one line naming its type (never a hang): script_errors.read_regular_file.

As a command (for shell scripts; errors are one line on stderr naming the file, never a traceback; Ctrl-C
exits 130 with one line, a closed stdout (`| head`) 141 without one: script_errors.run_main):
  jsonl_log.py FILE EVENT KEY [KEY...]
      the KEYs of FILE's last EVENT record, tab-separated on one line. A KEY is a dotted path into nested
      objects (memory.max_allocated_bytes, training.seq_length, gemms.0.format). Values: numbers as Python
      writes them (shortest round trip: 57.5, 3e-05, 17807.0; integers without a point), null as "nan"
      (the schema writes null for a number that is not finite or does not exist, e.g. a final loss when no
      iteration ran), true/false, strings as they are (a tab or newline in one becomes a space), lists and
      objects as one-line JSON; a KEY the record does not have prints as an empty field.
      Exit 0 printed; 1 FILE has no EVENT record (nothing printed); 2 bad arguments or a bad FILE.
  jsonl_log.py --complete FILE
      exit 0 when FILE holds a complete run (see above); 1 when not, with one line on stderr saying why;
      2 when FILE cannot be read or is not a JSON-lines log. Prints nothing on stdout.
  jsonl_log.py --gemm FORMAT FILE
      how the last start event's "gemms" list says FORMAT's GEMMs run: "native" or "emulated" (FORMAT as
      the schema names it, any case: bf16, fp8, mxfp8, nvfp4). Exit 1 with one line on stderr when FILE has
      no start event or its gemms have no entry for FORMAT; 2 bad arguments or a bad FILE.
  jsonl_log.py --summary FILE
      the last end event in the words of the text log's summary line ("iterations 12-30 of 30 (run by this
      process: 1-30): mean step time 0.058 s, 0.088 MODEL_TFLOP/s/GPU, 17807 tokens/s | final lm loss
      1.360900E+00 | nan iterations 0"). Exit 1 when FILE has no end event.
"""

import json
import math
import os
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # script_errors.py beside this script
import script_errors  # noqa: E402

PROG = "jsonl_log.py"
SCHEMA_VERSION = 1
MISSING = object()  # value()'s answer for a path the event does not have


class Error(script_errors.ScriptError):
    """A file that cannot be read or is not a JSON-lines log: one line naming the file (and line), exit 2."""

    status = 2


def parse_line(raw):
    """The event of one line's bytes, or None when it is not a JSON object with a string "event"."""
    try:
        obj = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return obj if isinstance(obj, dict) and isinstance(obj.get("event"), str) else None


def parse_events(data, path, error=Error):
    """The events of a JSON-lines log's bytes, in file order (the reading rules of the module's doc)."""
    lines = data.split(b"\n")
    events = []
    for n, raw in enumerate(lines, 1):
        last = n == len(lines)  # the text after the last newline: empty, or a line without its newline
        if not raw.strip():
            continue
        obj = parse_line(raw)
        if obj is None:
            if last:
                break  # still being written, or cut short
            text = raw.decode("utf-8", "replace").strip()
            what = text if len(text) <= 60 else text[:57] + "..."
            raise error(f"{path}:{n}: not a JSON-lines event (a JSON object with an \"event\" key): {what}")
        if obj["event"] == "start" and obj.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise error(f"{path}:{n}: schema_version {json.dumps(obj.get('schema_version'))} (this reader knows "
                        f"version {SCHEMA_VERSION})")
        events.append(obj)
    return events


def value(event, key):
    """event's value at the dotted path `key` (an object's member, a list's item by number), or MISSING."""
    v = event
    for part in key.split("."):
        if isinstance(v, dict) and part in v:
            v = v[part]
        elif isinstance(v, list) and part.isdigit() and int(part) < len(v):
            v = v[int(part)]
        else:
            return MISSING
    return v


def number(v):
    """A JSON number as a float; null (the schema's non-finite), anything else, and an integer too large for a
    double (float() would raise OverflowError: JSON integers have no size limit) as nan."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return math.nan
    try:
        return float(v)
    except OverflowError:
        return math.nan


def is_count(v):
    """A JSON integer (an iteration number), not a boolean (True is an int to Python)."""
    return isinstance(v, int) and not isinstance(v, bool)


class Run:
    """The events of one file, with the resume rules applied."""

    def __init__(self, path, events):
        self.path = path
        self.events = events
        self.starts = [e for e in events if e["event"] == "start"]
        self.ends = [e for e in events if e["event"] == "end"]
        self.evals = [e for e in events if e["event"] == "eval"]
        by_number = {}
        for e in events:
            if e["event"] == "iteration" and is_count(e.get("iteration")):
                by_number[e["iteration"]] = e  # a repeated iteration (a resume): the later line wins
        self.iterations = [by_number[k] for k in sorted(by_number)]

    def last(self, name):
        """The last event called `name`, or None."""
        for e in reversed(self.events):
            if e["event"] == name:
                return e
        return None

    def incomplete_reason(self):
        """None for a complete run, else why it is not."""
        if not self.events:
            return "no events (a run that has not finished its first iteration?)"
        last = self.events[-1]
        if last["event"] != "end":
            if self.ends:
                return "no \"end\" event after the last \"start\" (a resumed run that died or is still running)"
            return "no \"end\" event (a run that died or is still running)"
        if last.get("stop") == "signal":
            return f"the run was stopped by a signal ({last.get('signal', '?')}) at iteration {last.get('last_iteration')}"
        return None

    @property
    def complete(self):
        return self.incomplete_reason() is None

    def gemm_execution(self, fmt):
        """'native' or 'emulated' for format `fmt` (bf16, fp8, mxfp8, nvfp4) in the last start event, or None."""
        start = self.last("start")
        gemms = start.get("gemms") if start else None
        for g in gemms if isinstance(gemms, list) else []:
            if isinstance(g, dict) and str(g.get("format", "")).lower() == fmt.lower():
                return g.get("execution") if g.get("execution") in ("native", "emulated") else None
        return None


def read_run(path, error=Error):
    return Run(path, parse_events(script_errors.read_regular_file(path, error), path, error))


def text_of(v):
    """A value as the command prints it."""
    if v is MISSING:
        return ""
    if v is None:
        return "nan"
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return v.replace("\t", " ").replace("\r", " ").replace("\n", " ")
    return json.dumps(v, separators=(",", ":"))


def summary_text(end):
    """An end event in the words of the text log's summary line (apps/pretrain_llama/banner.cpp)."""
    n = lambda key: number(value(end, key))
    i = lambda key: text_of(value(end, key))
    if end.get("summary_first") is None:
        return f"no iterations run (iteration {i('last_iteration')} of {i('train_iters')})"
    per_gpu = ""
    if n("tokens_per_s_per_gpu") != n("tokens_per_s") and math.isfinite(n("tokens_per_s_per_gpu")):
        per_gpu = f" ({n('tokens_per_s_per_gpu'):.0f} tokens/s/GPU)"
    stop = "" if end.get("stop") in (None, "train_iters") else f" | stop: {end.get('stop')}"
    return (f"iterations {i('summary_first')}-{i('summary_last')} of {i('train_iters')} (run by this process: "
            f"{i('first_iteration')}-{i('last_iteration')}): mean step time {n('mean_step_ms') / 1e3:.3f} s, "
            f"{n('tflops'):.3f} MODEL_TFLOP/s/GPU, {n('tokens_per_s'):.0f} tokens/s{per_gpu} | final lm loss "
            f"{n('final_lm_loss'):.6E} | nan iterations {i('nan_iterations')}{stop}")


USAGE = ("usage: jsonl_log.py FILE EVENT KEY [KEY...] | --complete FILE | --gemm FORMAT FILE | --summary FILE "
         "(see the module's doc)")


def main(argv=None):
    args = sys.argv[1:] if argv is None else argv

    def fail(message, status):
        print(f"{PROG}: {message}", file=sys.stderr)
        return status

    if args and args[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0
    shapes = {"--complete": 2, "--gemm": 3, "--summary": 2}
    if not args or (args[0] in shapes and len(args) != shapes[args[0]]) or \
            (args[0] not in shapes and (args[0].startswith("-") or len(args) < 3)):
        return fail(f"error: bad arguments ({' '.join(args) or 'none'}); {USAGE}", 2)
    path = args[-1] if args[0] in shapes else args[0]
    run = read_run(path)  # (an Error: run_main's one line, exit 2)
    if args[0] == "--complete":
        why = run.incomplete_reason()
        return 0 if why is None else fail(f"{path}: incomplete: {why}", 1)
    if args[0] == "--gemm":
        fmt = args[1]
        if fmt.lower() not in ("bf16", "fp8", "mxfp8", "nvfp4"):
            return fail(f"error: --gemm {fmt}: a format is bf16, fp8, mxfp8 or nvfp4", 2)
        execution = run.gemm_execution(fmt)
        if execution is None:
            where = "no start event" if run.last("start") is None else f"its start event's gemms have no {fmt.lower()} entry"
            return fail(f"{path}: {where}", 1)
        print(execution)
        return 0
    if args[0] == "--summary":
        end = run.last("end")
        if end is None:
            return fail(f"{path}: no \"end\" event (a run that died or is still running)", 1)
        print(summary_text(end))
        return 0
    event = run.last(args[1])
    if event is None:
        return fail(f"{path}: no \"{args[1]}\" event", 1)
    print("\t".join(text_of(value(event, key)) for key in args[2:]))
    return 0


if __name__ == "__main__":
    script_errors.run_main(PROG, main, 2)
