"""The other logs compare_logs.py reads: pretrain_llama's JSON-lines log (--log-jsonl, through jsonl_log.py),
NeMo 2, torchtitan, llm.c (stdout and main.log) and TensorBoard event directories (pretrain_llama
--tensorboard-dir, Megatron's tag names).

Each parser fills a compare_logs.Log: per line the iteration, step time (ms), loss (nan when absent), FLOPs
per iteration per GPU (nan when unknown) and global batch size; `tokens_rule` says how tok/s/GPU is
computed for that format (compare_logs.analyse reads it). Fields are found by name, not position, where
a format's fields change across versions.
"""

import fnmatch
import json
import math
import os
import re
import struct

import jsonl_log
import script_errors

# ANSI colour codes (torchtitan's logger colours each field: torchtitan/tools/utils.py Color).
ANSI_RE = re.compile(r"\x1b\[[0-9;]*m")

# NeMo 2: nemo/lightning/pytorch/callbacks/progress_printer.py (ProgressPrinter.on_train_batch_end) prints
#   prefix = f"Training epoch {epoch}, iteration {n-1}/{total-1}", then format_string adds
#   f" | {metric}: {val}" (integral floats) or f" | {metric}: {val:.4}" per logged metric
# (by name: lr, global_batch_size, global_step, reduced_train_loss, 'train_step_timing in s',
# TFLOPS_per_GPU, consumed_samples, and val_loss once a validation has run; the benchmark's launcher
# prepends the job name, e.g. "mbs_128gbs/0 "). The iteration is 0-based: stored + 1, the updates done, as
# Megatron's and ours count. A val_loss is recorded where its value first changes, at the line before (the
# validation ran after that step); a bare "val_loss: X" / Lightning "val_loss=X" line counts too.
NEMO_ITER_RE = re.compile(r"Training epoch\s+\d+,\s*iteration\s+(\d+)\s*/\s*(\d+)\s*\|")
NEMO_VAL_RE = re.compile(r"\bval_loss\s*[:=]\s*([-+0-9.eE]+|nan|inf)")

# torchtitan: torchtitan/components/metrics.py MetricsProcessor.log (train.py before it) logs
#   f"{color.red}step: {step:2}  {color.green}loss: {loss:7.4f}  ... memory: {gib:5.2f}GiB({pct:.2f}%)
#     {color.blue}tps: {round(tps):,}  {color.cyan}tflops: {tflops:,.2f}  {color.magenta}mfu: {mfu:.2f}%"
# (grad_norm and elapsed_time_per_step appear in some versions); tps is tokens/s per device
# (ntokens_since_last_log / (time_delta * non_data_parallel_size)); "validate step: N  loss: X" for validation.
TITAN_STEP_RE = re.compile(r"(?<![A-Za-z_])(validate )?step:\s*(\d+)\s{2}")
TITAN_FIELD_RE = re.compile(r"([A-Za-z_]+):\s*([-+0-9.,eE]+|nan|inf)")

# llm.c (karpathy/llm.c), train_gpt2.cu's printf0, three generations:
#   today   "step %4d/%d | loss %7.6f (%+.2fz)| norm %6.4f (%+.2fz)| lr %.2e | %.2f ms | %.1f%% bf16 MFU | %.0f tok/s"
#   earlier "step %4d/%d | train loss %7.6f | norm %6.4f | lr %.2e | %.2f ms | %.1f%% A100 fp16 MFU | %.0f tok/s"
#           (May-June 2024; train_gpt2.py: "... | train loss {:.6f} | ... | ({:.2f} ms | {:.0f} tok/s)")
#   2024    "step %4d/%d: train loss %f (%f ms, %d tok/s)" (April 2024)
# and "val loss %f" (printf0, before the step after the validation). Its main.log (llmc/logger.h):
# "s:%d trl:%.4f lr:%.6f norm:%.2f" (earlier just "s:%d trl:%.4f"), "s:%d tel:%.4f", with the 0-based loop
# step: a train line's s:N is stdout's step N+1 (N+1 updates done), a validation at s:N follows N updates.
# Start-up rows "| total batch size      | %-50d |" and "| num_processes         | %-50d |" (also
# "... num_processes=%d and total_batch_size=%d"). tok/s is a bias-corrected EMA over all processes.
LLMC_STEP_RE = re.compile(r"^\s*step\s+(\d+)\s*/\s*(\d+)\s*[|:]")
LLMC_LOSS_RE = re.compile(r"(?:train loss|loss)\s+([-+0-9.eE]+|nan|inf)")
LLMC_MS_RE = re.compile(r"([0-9.]+)\s*ms\b")
LLMC_VAL_RE = re.compile(r"^\s*val loss\s+([-+0-9.eE]+|nan|inf)")
LLMC_MAINLOG_RE = re.compile(r"^s:(\d+)\s+(trl|tel):([-+0-9.eE]+|nan|inf)(\s|$)")
LLMC_PROCS_RE = re.compile(r"\|\s*num_processes\s*\|\s*(\d+)\s*\||\bnum_processes=(\d+)")
LLMC_TOTAL_RE = re.compile(r"total[_ ]batch[_ ]size[^0-9|]*\|?\s*(\d+)")

FORMATS = ("megatron", "jsonl", "nemo", "torchtitan", "llmc", "llmc-mainlog", "tensorboard")


def to_float(text):
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return math.nan


def detect(path, lines):
    """The format of a file (or 'tensorboard' for a directory), from its first lines that say."""
    if os.path.isdir(path):
        return "tensorboard"
    first = next((line for line in lines if line.strip()), "")
    if first.lstrip().startswith("{"):  # pretrain_llama --log-jsonl: its first line is the "start" event
        try:
            obj = json.loads(first)
        except ValueError:
            obj = None
        if isinstance(obj, dict) and obj.get("event") == "start":
            return "jsonl"
    for line in lines:
        line = ANSI_RE.sub("", line)
        if "elapsed time per iteration" in line:
            return "megatron"
        if NEMO_ITER_RE.search(line):
            return "nemo"
        if TITAN_STEP_RE.search(line) and "tps:" in line:
            return "torchtitan"
        if LLMC_STEP_RE.search(line) and " ms" in line:
            return "llmc"
        if LLMC_MAINLOG_RE.match(line):
            return "llmc-mainlog"
    return "megatron"  # compare_logs.py's own parser says what it expected


def add_line(log, it, ms, loss, flops=math.nan, gbs=math.nan):
    """One iteration line; a repeated iteration (a resumed run) replaces the earlier one."""
    if it in log.index:
        i = log.index[it]
        log.ms[i], log.loss[i], log.flops[i], log.gbs[i] = ms, loss, flops, gbs
        return
    log.index[it] = len(log.iters)
    log.iters.append(it)
    log.ms.append(ms)
    log.loss.append(loss)
    log.flops.append(flops)
    log.gbs.append(gbs)


def nemo_fields(line):
    """NeMo's ' | key: value' pairs after the iteration prefix."""
    fields = {}
    for part in line.split("|")[1:]:
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            fields[key.strip()] = value.strip()
    return fields


def parse_nemo(log, lines):
    last_it, last_val = None, None
    for line in lines:
        m = NEMO_ITER_RE.search(line)
        if m:
            f = nemo_fields(line[m.start():])
            step_s = to_float(f.get("train_step_timing in s", "nan"))
            tflops = to_float(f.get("TFLOPS_per_GPU", "nan"))
            it = int(m.group(1)) + 1
            if "val_loss" in f and to_float(f["val_loss"]) != last_val and last_it is not None:
                last_val = to_float(f["val_loss"])
                log.valid[last_it] = last_val
            last_it = it
            add_line(log, it, step_s * 1e3, to_float(f.get("reduced_train_loss", "nan")),
                     tflops * 1e12 * step_s, to_float(f.get("global_batch_size", "nan")))
            continue
        v = NEMO_VAL_RE.search(line)
        if v and last_it is not None:
            log.valid[last_it] = to_float(v.group(1))
    # NeMo's own TPS/GPU (scripts/performance): GBS x seq / train_step_timing / GPUs; seq and GPUs are not
    # in its lines, so they must be given (FILE:seq=N,gpus=N).
    log.tokens_rule = "nemo"


def parse_torchtitan(log, lines):
    for line in lines:
        line = ANSI_RE.sub("", line)
        m = TITAN_STEP_RE.search(line)
        if not m:
            continue
        f = {k: v for k, v in TITAN_FIELD_RE.findall(line[m.end():])}
        it, loss = int(m.group(2)), to_float(f.get("loss", "nan"))
        if m.group(1):
            log.valid[it] = loss
            continue
        tps = to_float(f.get("tps", "nan"))
        tflops = to_float(f.get("tflops", "nan"))
        # elapsed_time_per_step (some versions) is the step time; else the step time is not printed and
        # the per-device tps stands in for it: ms = seq x local batch / tps is unknown, so keep tps itself.
        step_s = to_float(f.get("elapsed_time_per_step", "nan").rstrip("s"))
        add_line(log, it, step_s * 1e3, loss, tflops * 1e12 * step_s if math.isfinite(step_s) else math.nan)
        log.tps.append(tps)
    log.tokens_rule = "torchtitan"


def parse_llmc(log, lines):
    last_it = None
    for line in lines:
        p = LLMC_PROCS_RE.search(line)
        if p:
            log.world_size = int(p.group(1) or p.group(2))
        t = LLMC_TOTAL_RE.search(line)
        if t and log.tokens_per_step is None:
            log.tokens_per_step = int(t.group(1))
        m = LLMC_STEP_RE.search(line)
        if m:
            rest = line[m.end():]
            loss = LLMC_LOSS_RE.search(rest)
            ms = LLMC_MS_RE.search(rest)
            last_it = int(m.group(1))
            add_line(log, last_it, to_float(ms.group(1)) if ms else math.nan,
                     to_float(loss.group(1)) if loss else math.nan)
            continue
        v = LLMC_VAL_RE.search(line)
        if v:
            log.valid[last_it or 0] = to_float(v.group(1))  # after last_it updates, before step last_it + 1
    log.tokens_rule = "llmc"


def parse_llmc_mainlog(log, lines):
    for line in lines:
        m = LLMC_MAINLOG_RE.match(line)
        if not m:
            continue
        step = int(m.group(1))  # 0-based loop step
        if m.group(2) == "trl":
            add_line(log, step + 1, math.nan, to_float(m.group(3)))  # the step stdout prints
        else:
            log.valid[step] = to_float(m.group(3))  # after `step` updates
    log.tokens_rule = "none"


def parse_jsonl(log, data, path, error):
    """pretrain_llama's --log-jsonl file (its bytes; jsonl_log.py's reading rules: a truncated last line
    ignored, a repeated iteration's later line wins). Read as our text log is: per "iteration" event the
    step time (elapsed_ms), lm_loss (null: nan) and FLOPs (its tflops x its time); the sequence length from
    the first "start" event's training.seq_length and the GPUs from its world_size; the validation losses
    from the "eval" events of the validation split (a later one at the same iteration wins: the
    after-training value), the downstream accuracies from those of split "downstream" (each task's last); the last "end" event stands for the summary line (mean step time, TFLOP/s,
    tokens/s, at full precision), so the TFLOP/s column is computed as for the text log."""
    run = jsonl_log.Run(path, jsonl_log.parse_events(data, path, error))
    num = jsonl_log.number
    for e in run.iterations:
        ms = num(e.get("elapsed_ms"))
        add_line(log, e["iteration"], ms, num(e.get("lm_loss")), num(e.get("tflops")) * 1e12 * ms / 1e3,
                 num(e.get("global_batch_size")))
    for e in run.evals:
        if e.get("split") == "validation" and jsonl_log.is_count(e.get("iteration")):
            log.valid[e["iteration"]] = num(e.get("lm_loss"))
        elif e.get("split") == "downstream" and jsonl_log.is_count(e.get("iteration")) and isinstance(e.get("task"), str):
            log.downstream[e["task"]] = (e["iteration"], num(e.get("acc")), num(e.get("acc_norm")))
    if run.starts:
        seq = jsonl_log.value(run.starts[0], "training.seq_length")
        world = run.starts[0].get("world_size")
        log.seq_length = seq if jsonl_log.is_count(seq) and seq > 0 else None
        log.world_size = world if jsonl_log.is_count(world) and world > 0 else None
    end = run.last("end")
    if end is not None:
        summary = (num(end.get("mean_step_ms")) / 1e3, num(end.get("tflops")), num(end.get("tokens_per_s")))
        log.summary = summary if all(math.isfinite(x) for x in summary) else None
    log.tokens_rule = "megatron"


# ---- TensorBoard event files ------------------------------------------------------------------------
# A TFRecord file is records of: uint64 length, uint32 masked CRC-32C of the length, the data, uint32
# masked CRC-32C of the data (tensorflow/core/lib/io/record_writer.cc; lib/log/tensorboard.cpp writes
# them). The data is an Event proto (tensorflow/core/util/event.proto): wall_time = 1 (double),
# step = 2 (int64), summary = 5 (Summary: repeated Value = 1 {tag = 1, simple_value = 2 (float)}).
#
# A last record cut short (its length, a CRC or its data incomplete at the end of the file: a writer
# killed, a full disk) is read as TensorBoard's own reader reads it: the complete records before it are
# used, the torn one is not. TensorBoard 2.20's RawEventFileLoader.Load
# (tensorboard/backend/event_processing/event_file_loader.py) stops at the DataLossError that its record
# reader (tensorboard/compat/tensorflow_stub/pywrap_tensorflow.py PyRecordReader_New.GetNext: "has
# truncated record in header / header crc / data / data crc") raises, keeping the events it yielded;
# TensorFlow's C++ RecordReader (tensorflow/core/lib/io/record_reader.cc, now tsl/lib/io) calls such a
# record "truncated record at N" (DataLoss) too. TensorBoard logs it at debug level only; here it is one
# warning line naming the file and the record's byte offset. A CRC that does not match is damage, not a
# cut: TensorBoard stops there silently too, but here it is an error (one line), since the records after
# it would be lost unseen.

def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC32C_TABLE = _crc32c_table()


def masked_crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = CRC32C_TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


class MalformedEvent(Exception):
    """Why a record's data (with valid CRCs) is not an Event proto read_events can use; read_events turns it
    into the caller's one-line error naming the file and the record's offset."""


WIRE_TYPES = {0: "varint", 1: "fixed64", 2: "length-delimited", 5: "fixed32"}
STEP, SUMMARY, SUMMARY_VALUE, TAG, SIMPLE_VALUE = 2, 5, 1, 1, 2  # event.proto / summary.proto field numbers


def _varint(buf, at):
    """(value, next offset) of the base-128 varint at `at`; at most 10 bytes (a 64-bit value)."""
    value = 0
    for i in range(10):
        if at + i >= len(buf):
            raise MalformedEvent("a varint runs past the end of its message")
        b = buf[at + i]
        value |= (b & 0x7F) << (7 * i)
        if not b & 0x80:
            return value, at + i + 1
    raise MalformedEvent("a varint longer than 10 bytes")


def _take(buf, at, n):
    """The n bytes at `at` and the offset after them; fewer left is a malformed message."""
    if at + n > len(buf):
        raise MalformedEvent(f"a field of {n} bytes runs past the end of its message ({len(buf) - at} left)")
    return buf[at:at + n], at + n


def proto_fields(buf):
    """(field number, wire type, value) of a protobuf message; value is bytes, int or raw 4/8 bytes.
    Raises MalformedEvent for anything a protobuf parser rejects (truncated fields, groups, wire types 6-7)."""
    at = 0
    while at < len(buf):
        key, at = _varint(buf, at)
        num, wire = key >> 3, key & 7
        if num == 0:
            raise MalformedEvent("field number 0")
        if wire == 0:
            value, at = _varint(buf, at)
        elif wire == 1:
            value, at = _take(buf, at, 8)
        elif wire == 2:
            n, at = _varint(buf, at)
            value, at = _take(buf, at, n)
        elif wire == 5:
            value, at = _take(buf, at, 4)
        else:
            raise MalformedEvent(f"field {num} has protobuf wire type {wire} (groups and types 6-7 are not "
                                 f"in event.proto)")
        yield num, wire, value


def _expect_wire(wire, want, what):
    """A known field with another wire type: protobuf would keep it as an unknown field and read the
    default (step 0, no value), silently; a file written that way is not one this reader understands."""
    if wire != want:
        raise MalformedEvent(f"{what} has wire type {wire} ({WIRE_TYPES.get(wire)}), expected "
                             f"{want} ({WIRE_TYPES[want]})")


def _signed64(value):
    """An int64 varint's value (a negative step is written as its 64-bit two's complement)."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >> 63 else value


def event_scalars(event):
    """(step, [(tag, simple_value)]) of one Event proto's bytes."""
    step, values = 0, []
    for num, wire, value in proto_fields(event):
        if num == STEP:
            _expect_wire(wire, 0, "Event.step")
            step = _signed64(value)
        elif num == SUMMARY:
            _expect_wire(wire, 2, "Event.summary")
            values.extend(summary_scalars(value))
    return step, values


def summary_scalars(summary):
    """[(tag, simple_value)] of a Summary proto's values that have both."""
    out = []
    for num, wire, value in proto_fields(summary):
        if num != SUMMARY_VALUE:
            continue
        _expect_wire(wire, 2, "Summary.value")
        tag = simple = None
        for vnum, vwire, v in proto_fields(value):
            if vnum == TAG:
                _expect_wire(vwire, 2, "Summary.Value.tag")
                tag = v.decode("utf-8", "replace")
            elif vnum == SIMPLE_VALUE:
                _expect_wire(vwire, 5, "Summary.Value.simple_value")
                simple = struct.unpack("<f", v)[0]
        if tag is not None and simple is not None:
            out.append((tag, simple))
    return out


def records(data, path, error, warn):
    """(offset, data) of each whole record of a TFRecord file's bytes; a torn last record: warn(), then the end."""
    at = 0
    while at < len(data):
        if at + 12 > len(data):
            return _torn(data, at, path, warn, None)
        header = data[at:at + 8]
        n, = struct.unpack("<Q", header)
        if struct.unpack("<I", data[at + 8:at + 12])[0] != masked_crc32c(header):
            raise error(f"{path}: a damaged record at byte {at} (its length CRC does not match)")
        if at + 16 + n > len(data):
            return _torn(data, at, path, warn, 16 + n)
        event = data[at + 12:at + 12 + n]
        if struct.unpack("<I", data[at + 12 + n:at + 16 + n])[0] != masked_crc32c(event):
            raise error(f"{path}: the data CRC of the record at byte {at} does not match")
        yield at, event
        at += 16 + n


def _torn(data, at, path, warn, size):
    """The warning for a last record cut short; `size`: its whole size when its header says it, else None."""
    if warn is not None:
        have = f"{len(data) - at} of its {size} bytes" if size else f"{len(data) - at} bytes, less than its header"
        warn(f"{path}: ends in a torn record at byte {at} ({have}): the records before it are read, as "
             f"TensorBoard reads them")


def read_events(path, error, warn=None):
    """[(step, tag, value)] of one event file's simple_value scalars; `error` for a damaged file or one that
    is not a regular file, `warn(message)` for a torn last record (see above)."""
    data = script_errors.read_regular_file(path, error)
    out = []
    for at, event in records(data, path, error, warn):
        try:
            step, values = event_scalars(event)
        except MalformedEvent as e:
            raise error(f"{path}: the record at byte {at} is not a valid Event proto: {e}")
        out.extend((step, tag, value) for tag, value in values)
    return out


def event_files(directory, error):
    """The paths named events.out.tfevents.* under `directory`, sorted; a directory (or FIFO, ...) so named
    is listed too, for read_events to refuse. os.walk does not follow symbolic links to directories, so
    a link cycle cannot make the walk endless; a subdirectory it cannot list is an error, not skipped."""
    def unreadable(e):
        raise error(f"{e.filename}: cannot list: {script_errors.os_reason(e)}")
    found = []
    for root, dirs, files in os.walk(directory, onerror=unreadable):
        found.extend(os.path.join(root, name) for name in dirs + files
                     if fnmatch.fnmatchcase(name, "events.out.tfevents.*"))
    return sorted(found)


def finite(x):
    return x is not None and math.isfinite(x)


def parse_tensorboard(log, directory, error, warn=None):
    files = event_files(directory, error)
    if not files:
        raise error(f"{directory}: no events.out.tfevents.* files")
    scalars = {}  # tag -> {step: value}; a later file (a resumed run) wins
    for path in files:
        for step, tag, value in read_events(path, error, warn):
            scalars.setdefault(tag, {})[step] = value
    times = scalars.get("iteration-time", {})
    loss = scalars.get("lm loss", {})
    tflops = scalars.get("throughput", {})
    batch = scalars.get("batch-size", {})
    tokens = scalars.get("throughput/tokens_per_sec", {})
    for it in sorted(times):
        s = times[it]
        add_line(log, it, s * 1e3, loss.get(it, math.nan), tflops.get(it, math.nan) * 1e12 * s,
                 batch.get(it, math.nan))
    log.valid.update(scalars.get("lm loss validation", {}))
    world = scalars.get("world-size")
    if world and finite(world[max(world)]) and world[max(world)] >= 1:  # (a float32 scalar: nan or inf is no size)
        log.world_size = int(world[max(world)])
    # The sequence length is not a scalar: tokens/s x s/iteration / batch size gives it (float32 values).
    if tokens and times and batch:
        it = max(times)
        seq = tokens.get(it, math.nan) * times[it] / batch[it] if batch.get(it) else math.nan
        if finite(seq) and round(seq) >= 1:
            log.seq_length = int(round(seq))
    log.tokens_rule = "megatron"


PARSERS = {"nemo": parse_nemo, "torchtitan": parse_torchtitan, "llmc": parse_llmc,
           "llmc-mainlog": parse_llmc_mainlog}
