#!/usr/bin/env python3
"""ctest CompareLogs.formats: scripts/compare_logs.py on NeMo 2, torchtitan, llm.c (stdout and main.log)
fixtures written here from those programs' format strings, and on a TensorBoard directory of one short
CPU run of ours. Plain unittest; no GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH (the built pretrain_llama), PL_CONFIG_DIR.
"""

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
