#!/usr/bin/env python3
"""Compare training logs: pretrain_llama's (its text log or its --log-jsonl JSON-lines log), Megatron-LM /
Megatron-Bridge's, NeMo 2's, torchtitan's, llm.c's and TensorBoard event directories (log_formats.py and
jsonl_log.py beside this script read the others). Every log file is opened without blocking and must be a
regular file (a FIFO or a device is refused with one line, never a hang); every error is one line
(script_errors.py), and a TensorBoard event file whose last record was cut short is read up to it, as
TensorBoard reads it, with one warning line.

Prints one table (one row per log, the first log is the reference) and, with --png, writes one figure.
Only the standard library and numpy; matplotlib only for --png (Agg backend, no display needed).
"""

import argparse
import math
import os
import re
import sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # atomic_output.py beside this script
from atomic_output import write_atomically  # noqa: E402
import log_formats  # noqa: E402
import script_errors  # noqa: E402

PROG = "compare_logs.py"

HELP_EPILOG = """\
how the columns are computed:
  iterations     iteration lines compared (logs of different lengths: the common prefix, said so)
  window         the averaging window, as pretrain_llama's summary line: the last 60% of the n
                 compared iteration lines, from line round(0.4*n) on (iterations 20-50 of 50,
                 12-30 of 30: lib/train/trainer.cpp's rule), of the first log; the same
                 iterations for every log when every log has a line at its start, else (said in
                 a note) the last 60% of each log's own lines;
                 with --log-interval > 1 each line is the mean of its interval
  step ms        mean 'elapsed time per iteration (ms)' over the window (pretrain_llama's JSON-lines
                 log: its "iteration" events' elapsed_ms; NeMo: 'train_step_timing in s';
                 torchtitan: 'elapsed_time_per_step' where printed; llm.c: its ms column; TensorBoard:
                 iteration-time); '-' when the format has none
  TFLOP/s/GPU    the FLOPs per iteration over the window's mean step time; the FLOPs from
                 pretrain_llama's summary line (its TFLOP/s x global batch x seq length / its
                 tokens/s: more digits than the per-line .1f values; in the JSON-lines log the
                 "end" event's tflops and tokens_per_s), else the mean over the window
                 of a line's TFLOP/s/GPU x its step time (Megatron's 'throughput per GPU (TFLOP/s/GPU)' field, else the
                 'Step Time : ... MODEL_TFLOP/s/GPU' line before it; a JSON-lines log without an "end"
                 event: each "iteration" event's tflops); '-' when the log has neither
  tok/s/GPU      as each benchmark defines it:
                 NeMo 2: global_batch_size x seq / mean train_step_timing / GPUs (the NeMo
                   benchmark's TPS/GPU, 128 x 8192 / 3.684 / 8 = 35,578); seq and GPUs are not in its lines: give them
                   (FILE:seq=8192,gpus=8, or --seq-length and --gpus), else an error
                 torchtitan: the mean of its 'tps' over the window (already per device)
                 llm.c: tokens per step / mean step ms / processes, not its smoothed all-process
                   tok/s; tokens per step from its 'total batch size' start-up row, else
                   gbs x seq (FILE:gbs=N,seq=N); processes from 'num_processes', else gpus
                 llm.c main.log: '-' (no times)
                 TensorBoard directories: as Megatron's lines (iteration-time, batch-size; the
                   seq length from throughput/tokens_per_sec x iteration-time / batch-size)
                 Megatron / pretrain_llama:
                 global batch size x seq length / mean step time / GPUs; the seq length from the
                 log's banner (pretrain_llama's 'training:' line, Megatron's 'seq_length ....' argument
                 or 'seq_length: N'; the JSON-lines log's "start" event, training.seq_length), else
                 --seq-length; the GPUs from Megatron's 'world_size ....' argument or pretrain_llama's
                 'data parallel: world size N' line (the "start" event's world_size), else --gpus
                 (default 1); the 'seq' column says where the length came from
  speed-up       the first log's window step time / this log's; between logs of different formats
                 (or without step times) this log's tok/s/GPU / the first log's, '-' without them
                 (pretrain_llama's text and JSON-lines logs count as one format here)
  formats        detected per file from its lines (a directory is TensorBoard; a first line that is a
                 JSON object with "event": "start" is pretrain_llama's --log-jsonl log, 'jsonl'), or
                 forced with --format or FILE:format=NAME; per-file options
                 FILE:seq=N,gpus=N,gbs=N,format=NAME override --seq-length / --gpus for that file
  JSON-lines     (pretrain_llama --log-jsonl FILE) read as its text log: one line per "iteration"
                 event (a resumed run's repeated iteration: the later line), so the window is the
                 summary's own (the last 60% of the iterations); a truncated last line is ignored
  final loss     the last compared iteration line's lm loss (NeMo: reduced_train_loss; JSON-lines:
                 the "iteration" event's lm_loss, null being non-finite; '-' for a format with no
                 loss column)
  loss gap       (loss - first log's loss) / first log's loss at the same iteration, averaged over the
                 last 10% of the compared iterations (at least one), iterations where both are finite
  non-finite     iteration lines whose lm loss is nan/inf or missing (Megatron leaves the loss out
                 when every iteration of the interval was skipped); they are never dropped silently:
                 a gap is averaged over the finite iterations only and the count is shown
  val loss       the last 'validation loss at iteration N' (test-set lines are ignored; the
                 after-training 'on validation set' value replaces the in-loop one at its
                 iteration; JSON-lines: the "eval" events of split "validation", likewise) within the
                 compared iterations; val gap: relative to the first log's at the same iteration;
                 blank when there is none
  downstream     pretrain_llama --downstream-eval's accuracies (text: 'downstream eval at iteration N |
                 TASK | acc: X |' lines; JSON-lines: "eval" events of split "downstream"): a second table
                 with each log's last acc and acc_norm per task and the iteration they are from
"""

ITER_RE = re.compile(r"\biteration\s+(\d+)\s*/\s*(\d+)\s*\|")
STEP_TIME_RE = re.compile(r"Step Time\s*:\s*([-+0-9.eE]+|nan|inf)s\s+GPU utilization:\s*([-+0-9.eE]+|nan|inf)\s*MODEL_TFLOP")
# --downstream-eval's line (issue 43): " downstream eval at iteration N | TASK | acc: X | ... [acc_norm: Y | ...]".
DOWNSTREAM_RE = re.compile(r"downstream eval at iteration (\d+) \| (\S+) \| acc: (\S+) \|(?:.*?\| acc_norm: (\S+) \|)?")
VALID_RE = re.compile(r"validation loss at (?:iteration\s+(\d+))(.*?)\|\s*lm loss value:\s*(\S+)\s*\|")
SEQ_RES = [
    (re.compile(r"pretrain_llama \| training: .*? x (\d+) tokens"), "banner"),
    (re.compile(r"\bseq_length\s*\.{2,}\s*(\d+)"), "banner"),
    (re.compile(r"\bseq_length\s*[:=]\s*(\d+)"), "banner"),
]
# Megatron's argument dump, or pretrain_llama's data-parallel start-up line ("data parallel: world size 8").
WORLD_RE = re.compile(r"\bworld_size\s*\.{2,}\s*(\d+)|\bdata parallel: world size (\d+)")
SUMMARY_RE = re.compile(r"pretrain_llama \| summary: .*?mean step time ([0-9.eE+-]+) s, ([0-9.eE+-]+) "
                        r"MODEL_TFLOP/s/GPU, ([0-9.eE+-]+) tokens/s")


class Error(script_errors.ScriptError):
    """A log that cannot be read or compared, a bad option: one line, exit 1."""


def to_float(text):
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_fields(line):
    """The 'key: value |' pairs of an iteration line."""
    fields = {}
    for part in line.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


class Log:
    def __init__(self, path):
        self.path = path
        self.label = os.path.basename(path)
        self.iters = []      # iteration numbers, one per iteration line
        self.ms = []         # elapsed time per iteration (ms)
        self.loss = []       # lm loss (nan when missing or non-finite)
        self.flops = []      # FLOPs per iteration per GPU (nan when unknown)
        self.gbs = []        # global batch size
        self.valid = {}      # iteration -> validation lm loss
        self.downstream = {}  # task -> (iteration, acc, acc_norm or nan) of its last --downstream-eval
        self.seq_length = None
        self.world_size = None
        self.summary = None  # (mean step s, TFLOP/s/GPU, tokens/s) of pretrain_llama's summary line
        self.index = {}      # iteration -> position (log_formats.add_line)
        self.tps = []        # torchtitan's per-device tokens/s, one per line
        self.tokens_per_step = None  # llm.c's total_batch_size
        self.tokens_rule = "megatron"
        self.fmt = "megatron"
        self.opts = {}       # FILE:key=value options


def split_spec(spec):
    """'FILE:seq=8192,gpus=8' -> (FILE, {'seq': '8192', 'gpus': '8'}); a plain path stays as it is."""
    path, sep, tail = spec.rpartition(":")
    if not sep or not re.fullmatch(r"[a-z]+=[^,=]+(,[a-z]+=[^,=]+)*", tail):
        return spec, {}
    opts = dict(kv.split("=", 1) for kv in tail.split(","))
    for key, value in opts.items():
        if key not in ("seq", "gpus", "gbs", "format"):
            raise Error(f"{spec}: unknown option '{key}' (seq, gpus, gbs, format)")
        if key == "format" and value not in log_formats.FORMATS:
            raise Error(f"{spec}: unknown format '{value}' ({', '.join(log_formats.FORMATS)})")
        if key != "format":
            try:
                opts[key] = script_errors.positive_int(value)  # the options' own rule (--seq-length, --gpus)
            except argparse.ArgumentTypeError:
                raise Error(f"{spec}: {key} must be a positive integer, not '{value}'")
    return path, opts


def sort_lines(log):
    order = sorted(range(len(log.iters)), key=lambda i: log.iters[i])
    for name in ("iters", "ms", "loss", "flops", "gbs"):
        values = getattr(log, name)
        setattr(log, name, [values[i] for i in order])
    if log.tps:
        log.tps = [log.tps[i] for i in order]


def parse_any(spec, forced_format):
    """A log of any format, with its FILE:key=value options."""
    path, opts = split_spec(spec)
    fmt = opts.get("format", forced_format)
    if fmt in (None, "tensorboard") and os.path.isdir(path):
        log = Log(path)
        log_formats.parse_tensorboard(log, path, Error, lambda message: script_errors.warn(PROG, message))
        log.fmt = "tensorboard"
    else:
        data = script_errors.read_regular_file(path, Error)  # a FIFO or a directory: one line, never a hang
        lines = data.decode("utf-8", "replace").splitlines()
        fmt = fmt or log_formats.detect(path, lines)
        if fmt == "megatron":
            log = parse_log(path, data)
        elif fmt == "tensorboard":
            raise Error(f"{path}: --format tensorboard needs a directory of event files")
        elif fmt == "jsonl":
            log = Log(path)
            log_formats.parse_jsonl(log, data, path, Error)
            log.fmt = fmt
        else:
            log = Log(path)
            log_formats.PARSERS[fmt](log, lines)
            log.fmt = fmt
    if not log.iters:
        raise Error(f"{path}: no {log.fmt} iteration " + ("events" if log.fmt == "jsonl" else "lines"))
    sort_lines(log)
    log.opts = opts
    return log


def parse_log(path, data=None):
    """Our text log or Megatron's (`data`: the file's bytes when already read)."""
    text = (script_errors.read_regular_file(path, Error) if data is None else data).decode("utf-8", "replace")
    log = Log(path)
    pending_tflops = None
    seen = {}
    for line in text.splitlines():
        m = STEP_TIME_RE.search(line)
        if m:
            pending_tflops = to_float(m.group(2))
            continue
        m = DOWNSTREAM_RE.search(line)
        if m:
            log.downstream[m.group(2)] = (int(m.group(1)), to_float(m.group(3)),
                                          to_float(m.group(4)) if m.group(4) else math.nan)
            continue
        m = VALID_RE.search(line)
        if m:
            if "test set" not in m.group(2):
                log.valid[int(m.group(1))] = to_float(m.group(3))
            continue
        m = ITER_RE.search(line)
        if m and "elapsed time per iteration" in line:
            f = parse_fields(line[m.end():])
            it = int(m.group(1))
            ms = to_float(f.get("elapsed time per iteration (ms)", "nan"))
            tflops = to_float(f["throughput per GPU (TFLOP/s/GPU)"]) if "throughput per GPU (TFLOP/s/GPU)" in f \
                else (pending_tflops if pending_tflops is not None else math.nan)
            pending_tflops = None
            loss = to_float(f.get("lm loss", "nan"))
            gbs = to_float(f.get("global batch size", "nan"))
            if it in seen:  # a resumed run repeats iterations: the later line wins
                i = seen[it]
                log.ms[i], log.loss[i], log.flops[i], log.gbs[i] = ms, loss, tflops * 1e12 * ms / 1e3, gbs
                continue
            seen[it] = len(log.iters)
            log.iters.append(it)
            log.ms.append(ms)
            log.loss.append(loss)
            log.flops.append(tflops * 1e12 * ms / 1e3)
            log.gbs.append(gbs)
            continue
        m = SUMMARY_RE.search(line)
        if m:
            log.summary = tuple(to_float(m.group(k)) for k in (1, 2, 3))  # ("1.2.3" matches the pattern too)
            continue
        if log.seq_length is None:
            for rx, _ in SEQ_RES:
                s = rx.search(line)
                if s:
                    log.seq_length = int(s.group(1))
                    break
        if log.world_size is None:
            w = WORLD_RE.search(line)
            if w:
                log.world_size = int(w.group(1) or w.group(2))
    if not log.iters:
        raise Error(f"{path}: no iteration lines (expected Megatron's ' iteration N/ M | ... | elapsed time per "
                    f"iteration (ms): ...' lines, or NeMo 2's, torchtitan's, llm.c's: see --help)")
    sort_lines(log)  # (study_report.py calls parse_log directly)
    return log


def window_start(n):
    """0-based index of the first line of the averaging window (lib/train/trainer.cpp's rule)."""
    return min(max(int(math.floor(0.4 * n + 0.5)) - 1, 0), n - 1)


def fmt_num(x, spec):
    if x is None:
        return ""
    if isinstance(x, float) and not math.isfinite(x):
        return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    return format(x, spec)


def positive(x):
    """x when it is a finite number > 0 (a size or a time to divide by), else None."""
    return x if x is not None and math.isfinite(x) and x > 0 else None


def per_second(amount, step_s):
    """amount / step_s, or None when there is no step time to divide by. Step times that all round to 0.0 ms
    (a tiny model's .1f column), a negative or missing one: the throughput columns are '-' (unavailable),
    not a division by zero and not a refusal, since the losses are still worth comparing."""
    return amount / step_s if positive(step_s) is not None and amount is not None else None


def other_format_columns(log, seq, gpus, gbs, flops, np):
    """TFLOP/s/GPU and tok/s/GPU of a NeMo 2, torchtitan or llm.c log, as that benchmark defines them."""
    step_s = log.mean_ms / 1e3
    tflops = per_second(float(np.mean(flops)) if flops.size else None, step_s)
    log.tflops = tflops / 1e12 if tflops is not None else None
    log.tokens = None
    if log.tokens_rule == "nemo":
        missing = [name for name, v in (("seq", seq), ("gpus", gpus)) if v is None]
        if missing:
            raise Error(f"{log.path}: a NeMo 2 log does not say its {' and '.join(missing)}: give "
                        f"{log.path}:seq=N,gpus=N (NeMo's TPS/GPU = global_batch_size x seq / "
                        f"train_step_timing / GPUs)")
        if positive(gbs) is not None:
            log.tokens = per_second(gbs * seq / gpus, step_s)
    elif log.tokens_rule == "torchtitan":
        tps = np.array(log.tps[log.w0:log.n], dtype=float)
        tps = tps[np.isfinite(tps)]
        log.tokens = float(np.mean(tps)) if tps.size else None
    elif log.tokens_rule == "llmc":
        per_step = log.tokens_per_step
        if per_step is None and seq is not None and positive(gbs) is not None:
            per_step = gbs * seq
        if per_step:
            log.tokens = per_second(per_step / (gpus or 1), step_s)


def megatron_columns(log, seq, gpus, gbs, flops, np):
    """TFLOP/s/GPU and tok/s/GPU of our logs and Megatron's: FLOPs and tokens per iteration over the window's
    mean step time."""
    step_s = log.mean_ms / 1e3
    if log.summary is not None:
        summary_s, tf, tok_s = log.summary
        # FLOPs per iteration: TFLOP/s x tokens per iteration / tokens/s keeps more digits than
        # TFLOP/s x the summary's 3-decimal step time.
        per_iter = tf * 1e12 * gbs * seq / tok_s if seq is not None and positive(tok_s) else tf * 1e12 * summary_s
    else:
        per_iter = float(np.mean(flops)) if flops.size else None
    tflops = per_second(per_iter, step_s)
    log.tflops = tflops / 1e12 if tflops is not None else None
    enough = seq is not None and positive(gbs) is not None
    log.tokens = per_second(gbs * seq / (gpus or 1), step_s) if enough else None


def sequence_length(log, seq_option):
    """(seq, where from: 'file', 'log', 'option' or ''): FILE:seq=N, else the log's own, else --seq-length."""
    if "seq" in log.opts:
        return log.opts["seq"], "file"
    if positive(log.seq_length) is not None:
        return log.seq_length, "log"
    if seq_option is not None:
        return seq_option, "option"
    return None, ""


def check_overlap(logs, last):
    """Every log has an iteration line at or before `last` (the shortest log's end): else nothing is common."""
    for log in logs:
        if log.iters[0] > last:
            short = min(logs, key=lambda x: x.iters[-1])
            raise Error(f"{log.path}: its iterations ({log.iters[0]}-{log.iters[-1]}) start after {short.path} "
                        f"ends (iteration {last}): no iterations in common to compare")


def window_columns(log, last, start, common, seq_option, gpus_option, np):
    """The per-log figures over its averaging window (log.n, w0, mean_ms, tflops, tokens, losses)."""
    k = sum(1 for it in log.iters if it <= last)
    log.n = k
    log.w0 = log.iters.index(start) if common else window_start(k)
    ms = np.array(log.ms[:k], dtype=float)
    win = ms[log.w0:]
    win = win[np.isfinite(win)]
    log.mean_ms = float(np.mean(win)) if win.size else math.nan
    flops = np.array(log.flops[log.w0:k], dtype=float)
    flops = flops[np.isfinite(flops)]
    seq, log.seq_src = sequence_length(log, seq_option)
    gpus = log.opts.get("gpus") or positive(log.world_size) or gpus_option
    gbs = float(log.opts["gbs"]) if "gbs" in log.opts else log.gbs[k - 1]
    if log.tokens_rule != "megatron":
        other_format_columns(log, seq, gpus, gbs, flops, np)
    else:
        megatron_columns(log, seq, gpus, gbs, flops, np)
    log.final_loss = log.loss[k - 1]
    log.tail_n = max(1, int(math.ceil(0.1 * k)))
    tail_vals = [x for x in log.loss[k - log.tail_n:k] if math.isfinite(x)]
    log.tail_loss = sum(tail_vals) / len(tail_vals) if tail_vals else None
    log.nonfinite = sum(1 for x in log.loss[:k] if not math.isfinite(x))
    log.no_loss = log.nonfinite == k  # a format without a loss column: '-', never 0
    vals = [(it, v) for it, v in log.valid.items() if it <= last]
    log.val_iter, log.val_loss = max(vals) if vals else (None, None)


def speedup(log, ref, mixed):
    """The first log's window step time / this log's (same format), else the tok/s/GPU ratio, else None."""
    if not mixed and positive(ref.mean_ms) and positive(log.mean_ms):
        return ref.mean_ms / log.mean_ms
    if positive(ref.tokens) and positive(log.tokens):
        return log.tokens / ref.tokens
    return None


def analyse(logs, seq_option, gpus_option, np):
    notes = []
    last = min(log.iters[-1] for log in logs)
    check_overlap(logs, last)
    if any(log.iters[-1] != last for log in logs):
        lengths = ", ".join(f"{log.label}: {log.iters[-1]}" for log in logs)
        notes.append(f"note: the logs have different lengths ({lengths} iterations); comparing the common prefix, "
                     f"iterations up to {last}")
    rows = []
    # One window for every log: from the first log's window start (the last 60% of its compared lines:
    # iterations 20-50 of 50) when every log has a line at that iteration, else the last 60% of each.
    k0 = sum(1 for it in logs[0].iters if it <= last)
    start = logs[0].iters[window_start(k0)]
    common = all(start in log.iters[:sum(1 for it in log.iters if it <= last)] for log in logs)
    if not common:
        notes.append(f"note: not every log has iteration {start} (the first log's window start): each log's "
                     f"window is the last 60% of its own compared lines")
    for log in logs:
        window_columns(log, last, start, common, seq_option, gpus_option, np)
    ref = logs[0]
    ref_loss = dict(zip(ref.iters, ref.loss))
    tail = max(1, int(math.ceil(0.1 * ref.n)))
    tail_iters = set(ref.iters[ref.n - tail:ref.n])
    family = lambda fmt: "megatron" if fmt == "jsonl" else fmt  # our JSON-lines log: the text log's numbers
    mixed = any(family(log.fmt) != family(ref.fmt) for log in logs)
    for log in logs:
        log.speedup = speedup(log, ref, mixed)
        gaps = []
        log.gap_series = ([], [])
        for it, x in zip(log.iters[:log.n], log.loss[:log.n]):
            r = ref_loss.get(it)
            if r is None or not (math.isfinite(x) and math.isfinite(r)) or r == 0:
                continue
            log.gap_series[0].append(it)
            log.gap_series[1].append((x - r) / r)
            if it in tail_iters:
                gaps.append((x - r) / r)
        log.gap = float(np.mean(gaps)) if gaps else None
        log.val_gap = None
        if log.val_loss is not None and log.val_iter in ref.valid:
            r = ref.valid[log.val_iter]
            if math.isfinite(r) and r != 0:
                log.val_gap = (log.val_loss - r) / r
        rows.append(table_row(log, ref))
    header = ["log", "iterations", "window", "step ms", "TFLOP/s/GPU", "tok/s/GPU", "seq", "speed-up",
              "final loss", f"loss gap (last {tail})", "non-finite", "val loss", "val gap"]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = list(notes)
    fmt_row = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    lines.append(fmt_row(header).rstrip())
    lines.append("  ".join("-" * w for w in widths))
    lines.extend(fmt_row(r).rstrip() for r in rows)
    lines.extend(downstream_table(logs))
    return "\n".join(lines) + "\n"


def downstream_table(logs):
    """The last --downstream-eval accuracies of each log (its own last iteration per task), when any log has them."""
    tasks = sorted({t for log in logs for t in log.downstream})
    if not tasks:
        return []
    header = ["log"]
    for t in tasks:
        header += [f"{t} acc", f"{t} acc_norm", "at"]
    rows = []
    for log in logs:
        row = [log.label]
        for t in tasks:
            it, acc, norm = log.downstream.get(t, (None, math.nan, math.nan))
            row += [fmt_num(acc, ".4f") if math.isfinite(acc) else "-",
                    fmt_num(norm, ".4f") if math.isfinite(norm) else "-", "-" if it is None else str(it)]
        rows.append(row)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt_row = lambda r: "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
    return ["", "downstream accuracy (the last --downstream-eval of each log; 'at': its iteration):",
            fmt_row(header).rstrip(), "  ".join("-" * w for w in widths)] + [fmt_row(r).rstrip() for r in rows]


def table_row(log, ref):
    seq_col = {"log": "log", "option": "--seq-length", "file": "LOG:seq", "": "-"}[log.seq_src]
    return [
        log.label,
        str(log.n),
        f"{log.iters[log.w0]}-{log.iters[log.n - 1]}",
        fmt_num(log.mean_ms, ".1f") if math.isfinite(log.mean_ms) else "-",
        fmt_num(log.tflops, ".3f") if log.tflops is not None else "-",
        fmt_num(log.tokens, ".0f") if log.tokens is not None else "-",
        seq_col,
        "-" if log.speedup is None else fmt_num(log.speedup, ".3f") + "x",
        "-" if log.no_loss else fmt_num(log.final_loss, ".4f"),
        ("" if log is ref else "-") if log.gap is None else fmt_num(100 * log.gap, "+.2f") + "%",
        str(log.nonfinite),
        fmt_num(log.val_loss, ".4f") if log.val_loss is not None else "",
        "" if log.val_gap is None else fmt_num(100 * log.val_gap, "+.2f") + "%",
    ]


def smooth(np, y, span):
    """Moving average over finite values (nan-aware), centred on trailing `span` points."""
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(y)
    vals = np.where(ok, y, 0.0)
    c = np.cumsum(np.concatenate([[0.0], vals]))
    n = np.cumsum(np.concatenate([[0], ok.astype(int)]))
    idx = np.arange(1, y.size + 1)
    lo = np.maximum(idx - span, 0)
    cnt = n[idx] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(cnt > 0, (c[idx] - c[lo]) / np.maximum(cnt, 1), np.nan)


CSV_COLUMNS = ["log", "path", "iterations", "window_first", "window_last", "step_ms", "tflops_per_gpu",
               "tokens_per_s_per_gpu", "speedup", "final_loss", "tail_loss", "tail_iterations", "loss_gap_pct",
               "nonfinite", "val_iteration", "val_loss", "val_gap_pct"]


def csv_num(x):
    """A number for the CSV: all the digits a float has, 'nan'/'inf' as such, blank when unknown."""
    if x is None:
        return ""
    if isinstance(x, float):
        if not math.isfinite(x):
            return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")
        return repr(x)
    return str(x)


def write_csv(path, logs):
    """One row per log, in the order given: the table's figures with all their digits (after analyse())."""
    import csv
    import io
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for log in logs:
        w.writerow([log.label, log.path, log.n, log.iters[log.w0], log.iters[log.n - 1], csv_num(log.mean_ms),
                    csv_num(log.tflops), csv_num(log.tokens), csv_num(log.speedup), csv_num(log.final_loss),
                    csv_num(log.tail_loss), log.tail_n, csv_num(None if log.gap is None else 100 * log.gap),
                    log.nonfinite, csv_num(log.val_iter), csv_num(log.val_loss),
                    csv_num(None if log.val_gap is None else 100 * log.val_gap)])
    # (surrogateescape: a path's undecodable bytes are written back as they were in its name)
    write_atomically(path, ".csv", Error, lambda fh: fh.write(buf.getvalue().encode("utf-8", "surrogateescape")))


def write_png(path, logs, np):
    import matplotlib  # (main checked that it is there: script_errors.import_or_rerun)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_loss, ax_gap, ax_time) = plt.subplots(3, 1, figsize=(10, 11), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, log in enumerate(logs):
        c = colors[i % len(colors)]
        it = np.array(log.iters[:log.n])
        loss = np.array(log.loss[:log.n], dtype=float)
        span = min(log.n, max(3, log.n // 20))  # trailing moving average of this many iterations
        ax_loss.plot(it, loss, color=c, linewidth=0.6, alpha=0.35)
        ax_loss.plot(it, smooth(np, loss, span), color=c, linewidth=1.6, label=f"{log.label} (train, mean of {span})")
        bad = ~np.isfinite(loss)
        if bad.any():
            ax_loss.plot(it[bad], np.full(bad.sum(), np.nanmax(loss) if np.isfinite(loss).any() else 0.0), "x",
                         color=c, label=f"{log.label}: {int(bad.sum())} non-finite")
        vi = sorted(v for v in log.valid if v <= log.iters[log.n - 1])
        if vi:
            ax_loss.plot(vi, [log.valid[v] for v in vi], "o--", color=c, markersize=4, label=f"{log.label} (validation)")
        if i > 0:
            ax_gap.plot(log.gap_series[0], 100 * np.array(log.gap_series[1]), color=c, linewidth=0.6, alpha=0.35)
            ax_gap.plot(log.gap_series[0], 100 * smooth(np, log.gap_series[1], span), color=c, linewidth=1.6,
                        label=f"{log.label} vs {logs[0].label}")
        ax_time.plot(it, log.ms[:log.n], color=c, linewidth=1.0, label=log.label)
    ref = logs[0]
    ax_time.axvspan(ref.iters[ref.w0], ref.iters[ref.n - 1], color="grey", alpha=0.15,
                    label=f"averaging window {ref.iters[ref.w0]}-{ref.iters[ref.n - 1]}")
    ax_gap.axhline(0.0, color="black", linewidth=0.8)
    ax_loss.set_ylabel("lm loss")
    ax_gap.set_ylabel(f"relative loss gap vs {ref.label} (%)")
    ax_time.set_ylabel("step time (ms)")
    ax_time.set_xlabel("iteration")
    for ax in (ax_loss, ax_gap, ax_time):
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        write_atomically(path, ".png", Error, lambda fh: fig.savefig(fh, format="png", dpi=100))
    finally:
        plt.close(fig)


def main(argv=None):
    ap = script_errors.ArgumentParser(
        prog=PROG, formatter_class=argparse.RawDescriptionHelpFormatter, epilog=HELP_EPILOG,
        description="Compare two or more training logs (pretrain_llama's text or --log-jsonl log, Megatron-LM's or "
                    "Megatron-Bridge's, NeMo 2's, "
                    "torchtitan's, llm.c's stdout or main.log, TensorBoard event directories): "
                    "one table, the first log is the reference; --png FILE also writes one figure (training and "
                    "validation loss, relative loss gap, step time with the averaging window shaded).")
    ap.add_argument("logs", nargs="+", metavar="LOG", help="a log file or TensorBoard directory, optionally "
                    "with per-file options: LOG:seq=N,gpus=N,gbs=N,format=NAME")
    ap.add_argument("--format", choices=log_formats.FORMATS, help="read every LOG as this format (default: "
                    "detected per file from its lines; a directory is TensorBoard)")
    ap.add_argument("--png", metavar="FILE", help="write the figure to FILE (needs matplotlib)")
    ap.add_argument("--csv", metavar="FILE", help="also write the figures as CSV, one row per log with all their "
                    "digits (columns: " + ", ".join(CSV_COLUMNS) + "; tail_loss is the mean lm loss over the "
                    "log's last 10%% of compared iterations, tail_iterations of them; gaps in percent); with "
                    "--csv one log is enough")
    ap.add_argument("--seq-length", type=script_errors.positive_int,
                    help="sequence length for logs whose banner does not give one")
    ap.add_argument("--gpus", type=script_errors.positive_int,
                    help="GPUs per run for tokens/s/GPU when the log does not say "
                    "(Megatron's world_size argument); default 1, except for NeMo 2 logs (required there)")
    args = ap.parse_args(argv)
    if len(args.logs) < 2 and not args.csv:
        raise Error("give at least two logs (the first is the reference), or one with --csv")
    # Run by a python3 without numpy (a venv's, first on PATH): re-run under Debian's, which has it.
    np = script_errors.import_or_rerun(__file__, argv, "numpy", *(["matplotlib"] if args.png else []))[0]
    logs = [parse_any(p, args.format) for p in args.logs]
    table = analyse(logs, args.seq_length, args.gpus, np)
    if args.csv:
        write_csv(args.csv, logs)
    if args.png:
        write_png(args.png, logs, np)
    sys.stdout.write(table)
    return 0


if __name__ == "__main__":
    script_errors.run_main(PROG, main)
