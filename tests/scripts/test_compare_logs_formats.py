#!/usr/bin/env python3
"""ctest CompareLogs.formats: scripts/compare_logs.py on NeMo 2, torchtitan, llm.c (stdout and main.log)
fixtures written here from those programs' format strings, on pretrain_llama's --log-jsonl log against the
equivalent text log (both written here: the same table and CSV; a resumed run, a run still being written,
bad files), and on a TensorBoard directory of one short CPU run of ours. Plain unittest; no GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH (the built pretrain_llama), PL_CONFIG_DIR.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.normpath(os.path.join(HERE, "..", "..", "scripts"))
SCRIPT = os.path.join(SCRIPTS, "compare_logs.py")
sys.path.insert(0, SCRIPTS)
import compare_logs  # noqa: E402

# Column positions of the table (compare_logs.py's header).
LOG, ITERATIONS, WINDOW, STEP_MS, TFLOPS, TOKENS, SEQ_SRC, SPEEDUP, FINAL, GAP, NONFINITE, VAL, VAL_GAP = range(13)


def compare(*args):
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def table_rows(stdout):
    lines = stdout.splitlines()
    rule = next(i for i, l in enumerate(lines) if l.startswith("---"))
    return {l.split()[0]: l.split() for l in lines[rule + 1:] if l.strip()}


def nemo_line(it, n, step_s, loss, prefix="mbs_128gbs/0 ", val=""):
    # NeMo 2 ProgressPrinter's line as the NVFP4 benchmark printed it (issue 29), iteration and values varied;
    # 0-based "iteration {n-1}/{total-1}", metrics f" | {metric}: {val:.4}".
    return (f"{prefix}Training epoch 0, iteration {it}/{n - 1} | lr: 1.649e-06 | global_batch_size: 128 | "
            f"global_step: {it} | max_memory_reserved: 140129599488 | max_memory_allocated: 107693703168 | "
            f"reduced_train_loss: {loss:.4} | train_step_timing in s: {step_s} | TFLOPS_per_GPU: 1.831e+03 | "
            f"consumed_samples: {128 * (it + 1)}{val}")


def write(directory, name, lines):
    path = os.path.join(directory, name)
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


class Formats(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        # 15 iterations: window 6..14 (the last 60%), every step 3.684 s as in the line.
        # A validation after the 10th step: its val_loss appears from the 11th step's line on.
        cls.nemo = write(d, "nemo_nvfp4.log", ["[NeMo I] some start-up line"] + [
            nemo_line(i, 15, 3.684, 12.0 - 0.1 * i, val=" | val_loss: 10.5" if i >= 10 else "") for i in range(15)]
            + ["Validation: iteration 1/1"])
        cls.nemo_plain = write(d, "nemo_plain.log", [nemo_line(i, 15, 3.684, 12.0 - 0.1 * i, prefix="")
                                                     for i in range(15)])
        # torchtitan's MetricsProcessor.log line with its ANSI colours (Color: \033[31m red ... \033[39m reset).
        red, green, orange, turq, blue, cyan, magenta, reset = (f"\x1b[{c}m" for c in (31, 32, 33, 36, 34, 96, 35, 39))
        cls.titan = write(d, "titan.log", [
            f"[rank0]:[titan] 2025-01-01 00:00:00,000 - root - INFO - {red}step: {s:2}  {green}loss: {10 - 0.5 * s:8.5f}  "
            f"{orange}grad_norm: {1.5:7.4f}  {turq}memory: {40.1:5.2f}GiB({50.25:.2f}%)  {blue}tps: {4000 + 100 * s:,}  "
            f"{cyan}tflops: {1234.5:,.2f}  {magenta}mfu: {40.0:.2f}%{reset}" for s in range(1, 11)]
            + [f"{turq}validate step: 10  {green}loss:  8.1234  {turq}memory: 40.00GiB(50.00%)  {blue}tps: 9,000{reset}"])
        # llm.c train_gpt2.cu: today's, the earlier and the 2024 printf lines; main.log's logger lines.
        cls.llmc_today = write(d, "llmc_today.log", [
            "| num_processes         | 8                                                  |",
            "| total batch size      | 524288                                             |"] + [
            f"step {s:4d}/10 | loss {5 - 0.1 * s:7.6f} (+0.00z)| norm {1.2345:6.4f} (+0.00z)| lr {6e-4:.2e} | "
            f"{200.0:.2f} ms | {45.1:.1f}% bf16 MFU | {36440:.0f} tok/s" for s in range(1, 11)] + ["val loss 4.1"])
        cls.llmc_earlier = write(d, "llmc_earlier.log", [
            f"step {s:4d}/10 | train loss {5 - 0.1 * s:7.6f} | norm {1.2345:6.4f} | lr {6e-4:.2e} | "
            f"{250.0:.2f} ms | {45.1:.1f}% bf16 MFU | {36440:.0f} tok/s" for s in range(1, 11)])
        cls.llmc_2024 = write(d, "llmc_2024.log", [
            f"step {s}/10: train loss {5 - 0.1 * s:f} ({224.3:f} ms, {36440:.0f} tok/s)" for s in range(1, 11)])
        # main.log: today's train line (with lr and norm) and the earlier one (loss only).
        cls.mainlog = write(d, "main.log", [f"s:{s} trl:{5 - 0.1 * (s + 1):.4f} lr:0.000600 norm:1.23" for s in range(5)]
                            + [f"s:{s} trl:{5 - 0.1 * (s + 1):.4f}" for s in range(5, 10)] + ["s:10 tel:4.1000"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def parse(self, path):
        return compare_logs.parse_any(path, None)

    def test_nemo_tps_formula(self):
        rc, out, err = compare(f"{self.nemo}:seq=8192,gpus=8", "--csv", os.path.join(self.tmp.name, "n.csv"))
        self.assertEqual(rc, 0, err)
        row = table_rows(out)["nemo_nvfp4.log"]
        self.assertAlmostEqual(float(row[TOKENS]), 35578, delta=1)  # 128 x 8192 / 3.684 / 8
        self.assertEqual(row[STEP_MS], "3684.0")
        self.assertAlmostEqual(float(row[TFLOPS]), 1831.0, places=2)
        self.assertEqual(row[VAL], "10.5000")

    def test_nemo_with_and_without_prefix(self):
        for path in (self.nemo, self.nemo_plain):
            log = self.parse(path)
            self.assertEqual(log.fmt, "nemo")
            self.assertEqual(log.iters, list(range(1, 16)))  # 0-based in NeMo's line
            self.assertAlmostEqual(log.loss[3], 11.7)
            self.assertEqual(log.gbs[0], 128)
            self.assertAlmostEqual(log.ms[0], 3684.0)
        self.assertEqual(self.parse(self.nemo).valid, {10: 10.5})

    def test_nemo_without_seq_gpus_is_an_error(self):
        rc, out, err = compare(self.nemo, self.nemo_plain + ":seq=8192,gpus=8")
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.strip().splitlines()), 1, err)
        self.assertIn(self.nemo + ": a NeMo 2 log does not say its seq and gpus", err)

    def test_torchtitan_ansi(self):
        log = self.parse(self.titan)
        self.assertEqual(log.fmt, "torchtitan")
        self.assertEqual(log.iters, list(range(1, 11)))
        self.assertAlmostEqual(log.loss[1], 9.0)
        self.assertEqual(log.tps[2], 4300)
        self.assertEqual(log.valid, {10: 8.1234})
        rc, out, err = compare(self.titan, self.nemo_plain + ":seq=8192,gpus=8")
        self.assertEqual(rc, 0, err)
        row = table_rows(out)["titan.log"]
        self.assertEqual(row[STEP_MS], "-")  # torchtitan prints no step time
        self.assertEqual(float(row[TOKENS]), sum(4000 + 100 * s for s in range(4, 11)) / 7)  # window 4..10

    def test_llmc_three_formats(self):
        for path, ms, loss_fmt in ((self.llmc_today, 200.0, 6), (self.llmc_earlier, 250.0, 6),
                                   (self.llmc_2024, 224.3, 6)):
            log = self.parse(path)
            self.assertEqual(log.fmt, "llmc", path)
            self.assertEqual(log.iters, list(range(1, 11)), path)
            self.assertAlmostEqual(log.ms[4], ms, places=3)
            self.assertAlmostEqual(log.loss[4], 4.5, places=loss_fmt)
        today = self.parse(self.llmc_today)
        self.assertEqual((today.world_size, today.tokens_per_step), (8, 524288))
        self.assertEqual(today.valid, {10: 4.1})  # printed after step 10's line, before step 11 runs
        rc, out, err = compare(self.llmc_today, f"{self.llmc_2024}:gbs=64,seq=1024")
        self.assertEqual(rc, 0, err)
        rows = table_rows(out)
        # Per GPU from the ms column: 524288 tokens / 0.2 s / 8 processes, not the smoothed 36440 tok/s.
        self.assertEqual(rows["llmc_today.log"][TOKENS], "327680")
        self.assertEqual(rows["llmc_2024.log"][TOKENS], f"{64 * 1024 / 0.2243:.0f}")

    def test_llmc_mainlog(self):
        log = self.parse(self.mainlog)
        self.assertEqual(log.fmt, "llmc-mainlog")
        self.assertEqual(log.iters, list(range(1, 11)))  # s:0 is stdout's step 1
        self.assertAlmostEqual(log.loss[0], 4.9)
        self.assertEqual(log.valid, {10: 4.1})
        rc, out, err = compare(self.llmc_today, self.mainlog)
        self.assertEqual(rc, 0, err)
        row = table_rows(out)["main.log"]
        self.assertEqual((row[STEP_MS], row[TOKENS], row[SPEEDUP]), ("-", "-", "-"))
        self.assertEqual(row[FINAL], "4.0000")

    def test_bad_option(self):
        rc, _, err = compare(self.nemo + ":seq=x", self.nemo_plain)
        self.assertEqual(rc, 1)
        self.assertIn("seq must be a positive integer", err)


# ---- pretrain_llama's own logs: the text log and its --log-jsonl twin -------------------------------------
# Written here from the banner's format strings (apps/pretrain_llama/banner.cpp, lib/log/megatron_log.cpp) and
# the JSON-lines schema (version 1). Every number is one the text log prints exactly (ms .1f, losses .6E, the
# summary's TFLOP/s .3f and tokens/s .0f), so the two files of a run must give the very same table.
GBS_J, SEQ_J, ITERS_J = 8, 128, 30


def ours(directory, name, ms_of, loss_of, tflops, tokens, val_of, nan_at=None, resume_at=None):
    """NAME.log and NAME.jsonl of one run of ITERS_J iterations: ms_of(i), loss_of(i) per iteration (nan_at: no
    finite loss), validation at 10 and 20 and after training (val_of(it)), a test-split evaluation after
    training (to be ignored), and the summary / "end" event with `tflops` and `tokens`. resume_at=(died, back):
    the first process runs to `died` and dies (no summary, no "end"), a second resumes from checkpoint `back`
    and re-runs the iterations after it with other values (ms + 1, loss + 0.5: the later lines win)."""
    text = ["sweep.sh | point x | pretrain_llama --model llama_tiny"]
    events = []
    ts = "2026-11-28 16:11:32"

    def banner(first):
        text.append("pretrain_llama | model llama_tiny (configs/models/llama_tiny.json): 2 layers, hidden 256, ffn 256, "
                    "heads 8 (2 kv groups, head dim 32), vocab 128, 0.788 M parameters")
        text.append(f"pretrain_llama | training: {ITERS_J} iterations, global batch {GBS_J} = 4 micro-batches x 2 samples "
                    f"x {SEQ_J} tokens, lr 0.0003 -> 3e-05 (cosine, warmup 2), seed 1234, log interval 1")
        events.append({"event": "start", "schema_version": 1, "program": "pretrain_llama", "timestamp": ts,
                       "command_line": ["pretrain_llama", "--model", "llama_tiny"], "world_size": 1,
                       "first_iteration": first,
                       "model": {"name": "llama_tiny", "num_layers": 2, "parameters": 787712},
                       "recipe": {"name": "bf16_mixed", "file": "bf16_mixed.json", "note": ""},
                       "precision_plan": ["layers 0-1   : linear_qkv linear_proj linear_fc1 linear_fc2 in bf16"],
                       "quantized_format": "bf16", "device": {"type": "cpu", "name": "AMD EPYC", "sm": 0},
                       "gemms": [{"format": "bf16", "execution": "native", "description": "BF16 GEMMs"}],
                       "training": {"train_iters": ITERS_J, "global_batch_size": GBS_J, "micro_batch_size": 2,
                                    "seq_length": SEQ_J, "num_micro_batches": 4, "data_parallel_size": 1},
                       "data": ["Megatron MockGPTDataset: vocab 128, eod 127"]})

    def iteration(i, ms, loss):
        field = "" if loss is None else f" lm loss: {loss:.6E} |"
        text.append(f" [{ts}] iteration {i:8d}/{ITERS_J:8d} | consumed samples: {GBS_J * i:12d} | elapsed time per "
                    f"iteration (ms): {ms:.1f} | learning rate: 3.000000E-04 | global batch size: {GBS_J:5d} |{field} "
                    f"loss scale: 1.0 | number of skipped iterations:   0 | number of nan iterations:   0 |")
        events.append({"event": "iteration", "iteration": i, "train_iters": ITERS_J, "consumed_samples": GBS_J * i,
                       "global_batch_size": GBS_J, "lm_loss": loss, "learning_rate": 3e-4, "lr_used": 3e-4,
                       "grad_norm": 1.5, "loss_scale": 1.0, "skipped": False, "nan": loss is None, "elapsed_ms": ms,
                       "tflops": 0.1, "tokens_per_s": 11172.2})
        events.append({"event": "interval", "iteration": i, "iterations": 1, "elapsed_ms": ms, "tflops": 0.1,
                       "tokens_per_s": 11172.2, "lm_loss": loss, "timers_ms": {}, "memory": {}})

    def validation(it, split, after):
        v = val_of(it) + (1.0 if split == "test" else 0.0)
        where = f"iteration {it}" + (f" on {split} set" if after else "")
        text.append(f" validation loss at {where} | lm loss value: {v:.6E} | lm loss PPL: {math.exp(v):.6E} | ")
        events.append({"event": "eval", "iteration": it, "consumed_samples": GBS_J * it, "split": split,
                       "after_training": after, "lm_loss": v, "ppl": math.exp(min(20, v))})

    def run(first, last, bump):
        banner(first)
        for i in range(first, last + 1):
            loss = None if i == nan_at else exact(loss_of(i) + bump)
            iteration(i, round(ms_of(i) + 2 * bump, 1), loss)
            if i in (10, 20):
                validation(i, "validation", False)

    if resume_at:
        run(1, resume_at[0], 0.0)
        run(resume_at[1] + 1, ITERS_J, 0.5)
    else:
        run(1, ITERS_J, 0.0)
    validation(ITERS_J, "validation", True)
    validation(ITERS_J, "test", True)
    final = exact(loss_of(ITERS_J) + (0.5 if resume_at else 0.0))
    text.append(f"pretrain_llama | summary: iterations 12-30 of 30 (run by this process: "
                f"{resume_at[1] + 1 if resume_at else 1}-30): mean step time 0.058 s, {tflops:.3f} MODEL_TFLOP/s/GPU, "
                f"{tokens:.0f} tokens/s | final lm loss {final:.6E} | nan iterations 0")
    events.append({"event": "end", "first_iteration": resume_at[1] + 1 if resume_at else 1, "last_iteration": 30,
                   "train_iters": 30, "stop": "train_iters", "summary_first": 12, "summary_last": 30,
                   "mean_step_ms": 57.5, "tflops": tflops, "tokens_per_s": tokens, "tokens_per_s_per_gpu": tokens,
                   "final_lm_loss": final, "nan_iterations": 0, "valid_lm_loss": val_of(ITERS_J),
                   "test_lm_loss": val_of(ITERS_J) + 1.0, "allocations_in_loop": 0, "memory": {}})
    log = write(directory, name + ".log", text)
    jsonl = write(directory, name + ".jsonl", [json.dumps(e, allow_nan=False) for e in events])
    return log, jsonl


def exact(x):
    """x as the text log prints and reads it back (.6E)."""
    return float(f"{x:.6E}")


class OurJsonLines(unittest.TestCase):
    """pretrain_llama's --log-jsonl file beside its text log: the same table, by content detection or by name."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        d = cls.tmp.name
        cls.a = ours(d, "bf16", lambda i: 90.0 + (i % 5) * 0.5, lambda i: exact(5.0 - 0.1 * i), 0.088, 17807.0,
                     lambda it: exact(4.0 - 0.05 * it), nan_at=7)
        cls.b = ours(d, "nvfp4", lambda i: 120.0 + (i % 3) * 0.1, lambda i: exact(5.05 - 0.099 * i), 0.066, 13355.0,
                     lambda it: exact(4.1 - 0.05 * it), resume_at=(25, 20))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_detected_and_read_as_the_text_log(self):
        for text, jsonl in (self.a, self.b):
            t, j = compare_logs.parse_any(text, None), compare_logs.parse_any(jsonl, None)
            self.assertEqual((t.fmt, j.fmt), ("megatron", "jsonl"))
            self.assertEqual(j.iters, list(range(1, ITERS_J + 1)))
            self.assertEqual(j.iters, t.iters)
            self.assertEqual(j.ms, t.ms)
            self.assertEqual([x if math.isfinite(x) else "nan" for x in j.loss],
                             [x if math.isfinite(x) else "nan" for x in t.loss])
            self.assertEqual(j.gbs, t.gbs)
            self.assertEqual(j.valid, t.valid)  # the test split left out, the after-training value at 30
            self.assertEqual(j.seq_length, SEQ_J)
            self.assertEqual(j.seq_length, t.seq_length)
            self.assertEqual(j.summary, (0.0575,) + t.summary[1:])  # (the text log's step time has 3 decimals)
            self.assertEqual(j.tokens_rule, "megatron")
        # The resumed run: iterations 21-25 twice, the later lines win.
        resumed = compare_logs.parse_any(self.b[1], None)
        self.assertEqual(resumed.ms[22], round(120.0 + (23 % 3) * 0.1 + 1.0, 1))
        self.assertEqual(resumed.loss[22], exact(exact(5.05 - 0.099 * 23) + 0.5))
        self.assertEqual(resumed.loss[19], exact(5.05 - 0.099 * 20))  # iteration 20: before the resume point

    def test_same_table_and_csv_as_the_text_logs(self):
        d = self.tmp.name
        rc_t, out_t, err_t = compare(self.a[0], self.b[0], "--csv", os.path.join(d, "t.csv"))
        rc_j, out_j, err_j = compare(self.a[1], self.b[1], "--csv", os.path.join(d, "j.csv"))
        self.assertEqual((rc_t, rc_j), (0, 0), err_t + err_j)
        rows_t, rows_j = table_rows(out_t), table_rows(out_j)
        for name in ("bf16", "nvfp4"):
            self.assertEqual(rows_j[name + ".jsonl"][1:], rows_t[name + ".log"][1:], out_t + out_j)
        row = rows_j["bf16.jsonl"]
        self.assertEqual((row[ITERATIONS], row[WINDOW], row[SEQ_SRC], row[NONFINITE]), ("30", "12-30", "log", "1"))
        # By hand: the window's mean step time; the end event's FLOPs per iteration (TFLOP/s x tokens per
        # iteration / tokens/s) over it; tokens/s/GPU = GBS x seq / that time.
        mean_s = sum(90.0 + (i % 5) * 0.5 for i in range(12, 31)) / 19 / 1e3
        self.assertEqual(row[STEP_MS], f"{mean_s * 1e3:.1f}")
        self.assertEqual(row[TFLOPS], f"{0.088 * GBS_J * SEQ_J / 17807.0 / mean_s:.3f}")
        self.assertEqual(row[TOKENS], f"{GBS_J * SEQ_J / mean_s:.0f}")
        self.assertEqual(row[VAL], f"{exact(4.0 - 0.05 * 30):.4f}")
        with open(os.path.join(d, "t.csv")) as ft, open(os.path.join(d, "j.csv")) as fj:
            t_rows = [r.split(",")[2:] for r in ft.read().splitlines()]
            j_rows = [r.split(",")[2:] for r in fj.read().splitlines()]
        self.assertEqual(j_rows, t_rows)
        # One of each: our text and JSON-lines logs are one format (the speed-up is the step-time ratio).
        rc, out, err = compare(self.a[1], self.b[0])
        self.assertEqual(rc, 0, err)
        self.assertEqual(table_rows(out)["nvfp4.log"][SPEEDUP], rows_t["nvfp4.log"][SPEEDUP])

    def test_format_by_name(self):
        rc, out, err = compare(f"{self.a[1]}:format=jsonl", self.b[1], "--format", "jsonl")
        self.assertEqual(rc, 0, err)
        rc, out, err = compare(self.a[1], f"{self.b[0]}:format=jsonl")  # a text log read as JSON lines
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertEqual(err.strip().splitlines(), [f'compare_logs.py: error: {self.b[0]}:1: not a JSON-lines event '
                                                    f'(a JSON object with an "event" key): sweep.sh | point x | '
                                                    f'pretrain_llama --model llama_tiny'])

    def test_run_still_being_written(self):
        # The last line cut short (a running or killed run): ignored; no "end" event: the per-iteration TFLOP/s.
        with open(self.a[1]) as fh:
            lines = fh.read().splitlines()
        events = [json.loads(line) for line in lines]
        path = write(self.tmp.name, "running.jsonl", [line for line, e in zip(lines, events) if e["event"] == "start" or
                                                      (e["event"] != "end" and e.get("iteration", 0) <= 20)])
        with open(path, "a") as fh:
            fh.write('{"event": "iteration", "iteration": 21, "lm_lo')
        rc, out, err = compare(self.a[1], path)
        self.assertEqual(rc, 0, err)
        row = table_rows(out)["running.jsonl"]
        self.assertEqual(row[ITERATIONS], "20")
        self.assertEqual(row[TFLOPS], "0.100")  # each iteration event's tflops (no summary)
        self.assertIn("comparing the common prefix", out)

    def test_bad_files_are_one_line(self):
        bad = write(self.tmp.name, "bad.jsonl", ['{"event": "start", "schema_version": 1}', "not json", "{}"])
        fifo = os.path.join(self.tmp.name, "fifo.jsonl")
        os.mkfifo(fifo)
        empty = write(self.tmp.name, "empty.jsonl", ['{"event": "start", "schema_version": 1}'])
        for path, message in ((bad, f"{bad}:2: not a JSON-lines event"),
                              (fifo, f"{fifo}: is a FIFO, not a regular file"),
                              (empty, f"{empty}: no jsonl iteration events")):
            with self.subTest(path=path):
                rc, out, err = compare(self.a[1], path)  # (a FIFO must not hang: compare() has a timeout)
                self.assertEqual(rc, 1)
                self.assertEqual(out, "")
                self.assertEqual(len(err.strip().splitlines()), 1, err)
                self.assertIn(message, err)
        rc, out, err = compare(self.a[1], f"{self.tmp.name}:format=jsonl")
        self.assertEqual(rc, 1)
        self.assertIn(f"{self.tmp.name}: is a directory, not a regular file", err)


class OurTensorBoard(unittest.TestCase):
    """A --tensorboard-dir of one short CPU run, its log beside it, and a NeMo log against it."""

    @classmethod
    def setUpClass(cls):
        app, configs = os.environ.get("PL_APP_PATH"), os.environ.get("PL_CONFIG_DIR")
        if not app or not configs:
            raise RuntimeError("PL_APP_PATH and PL_CONFIG_DIR must be set (ctest sets them)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tb = os.path.join(cls.tmp.name, "tb")
        cls.log = os.path.join(cls.tmp.name, "ours.log")
        cmd = [app, "--model", os.path.join(configs, "models", "llama_tiny.json"), "--device", "cpu",
               "--train-iters", "6", "--global-batch-size", "2", "--micro-batch-size", "1", "--seq-length", "16",
               "--log-interval", "1", "--eval-interval", "3", "--eval-iters", "1", "--disable-fp4",
               "--tensorboard-dir", cls.tb]
        with open(cls.log, "w") as fh:
            p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=300)
        if p.returncode != 0:
            with open(cls.log) as fh:
                raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {fh.read()[-2000:]}")
        cls.nemo = write(cls.tmp.name, "nemo_bf16.log", [nemo_line(i, 6, 3.684, 12.0) for i in range(6)])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_tensorboard_matches_the_log(self):
        tb = compare_logs.parse_any(self.tb, None)
        text = compare_logs.parse_any(self.log, None)
        self.assertEqual(tb.fmt, "tensorboard")
        self.assertEqual(tb.iters, text.iters)
        for a, b in zip(tb.loss, text.loss):  # float32 scalars against the log's printed digits
            self.assertTrue(math.isclose(a, b, rel_tol=1e-4), (a, b))
        self.assertEqual(tb.seq_length, 16)
        self.assertEqual(tb.gbs, [2.0] * 6)
        self.assertEqual(sorted(tb.valid), sorted(text.valid))

    def test_damaged_event_file(self):
        name = next(f for f in os.listdir(self.tb) if f.startswith("events.out.tfevents"))
        bad = os.path.join(self.tmp.name, "bad")
        os.mkdir(bad)
        with open(os.path.join(self.tb, name), "rb") as src, open(os.path.join(bad, name), "wb") as dst:
            data = bytearray(src.read())
            data[20] ^= 0xFF
            dst.write(data)
        rc, _, err = compare(bad, self.log)
        self.assertEqual(rc, 1)
        self.assertIn("does not match", err)
        self.assertEqual(len(err.strip().splitlines()), 1, err)

    def test_mixed_nemo_against_ours(self):
        png = os.path.join(self.tmp.name, "mixed.png")
        rc, out, err = compare(f"{self.nemo}:seq=8192,gpus=8", self.log, self.tb, "--png", png)
        self.assertEqual(rc, 0, err)
        rows = table_rows(out)
        self.assertEqual(sum(l.startswith("---") for l in out.splitlines()), 1)  # one table
        self.assertEqual(set(rows), {"nemo_bf16.log", "ours.log", "tb"})
        nemo_tps = float(rows["nemo_bf16.log"][TOKENS])
        self.assertAlmostEqual(nemo_tps, 35578, delta=1)
        for name in ("ours.log", "tb"):  # different formats: the speed-up is the tok/s/GPU ratio
            self.assertAlmostEqual(float(rows[name][SPEEDUP].rstrip("x")), float(rows[name][TOKENS]) / nemo_tps,
                                   delta=2e-3)
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            return
        with open(png, "rb") as fh:
            self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
