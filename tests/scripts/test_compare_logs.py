#!/usr/bin/env python3
"""ctest CompareLogs.python: scripts/compare_logs.py on two short CPU runs of llama_tiny (BF16 and NVFP4)
and on hand-written Megatron-LM / Megatron-Bridge lines. Plain unittest; no GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH (the built pretrain_llama), PL_CONFIG_DIR.
"""

import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "compare_logs.py"))
ITERS = 10
GBS, MBS, SEQ = 4, 2, 32

ITER_LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([0-9.]+) \|.*"
                       r"lm loss: ([0-9.E+-]+) \|")


def compare(*args):
    """Runs compare_logs.py; returns (rc, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def table_rows(stdout):
    """The table's data rows, by log name: the cells split on whitespace (blank trailing cells absent)."""
    lines = stdout.splitlines()
    rule = next(i for i, l in enumerate(lines) if l.startswith("---"))
    return {l.split()[0]: l.split() for l in lines[rule + 1:] if l.strip()}


# Column positions of the table (compare_logs.py's header).
LOG, ITERATIONS, WINDOW, STEP_MS, TFLOPS, TOKENS, SEQ_SRC, SPEEDUP, FINAL, GAP, NONFINITE, VAL, VAL_GAP = range(13)


def read(path):
    with open(path) as fh:
        return fh.read()


def have_matplotlib():
    """Whether the script can draw: this python3 has matplotlib, or /usr/bin/python3 has it (the script re-runs
    there: scripts/script_errors.py)."""
    return any(os.access(py, os.X_OK) and
               subprocess.run([py, "-c", "import matplotlib"], capture_output=True).returncode == 0
               for py in (sys.executable, "/usr/bin/python3"))


class OurLogs(unittest.TestCase):
    """Two short CPU runs written to temp logs, then the comparison on them."""

    @classmethod
    def setUpClass(cls):
        app, configs = os.environ.get("PL_APP_PATH"), os.environ.get("PL_CONFIG_DIR")
        if not app or not configs:
            raise RuntimeError("PL_APP_PATH and PL_CONFIG_DIR must be set (ctest sets them)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.logs = {}
        for name, extra in (("bf16.log", ["--disable-fp4"]), ("nvfp4.log", [])):
            cmd = [app, "--model", os.path.join(configs, "models", "llama_tiny.json"), "--device", "cpu",
                   "--train-iters", str(ITERS), "--global-batch-size", str(GBS), "--micro-batch-size", str(MBS),
                   "--seq-length", str(SEQ), "--log-interval", "1", "--eval-interval", "5", "--eval-iters", "1",
                   *extra]
            path = os.path.join(cls.tmp.name, name)
            with open(path, "w") as fh:
                p = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, timeout=300)
            if p.returncode != 0:
                raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {read(path)[-2000:]}")
            cls.logs[name] = path
        cls.rc, cls.out, cls.err = compare(cls.logs["bf16.log"], cls.logs["nvfp4.log"])

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def hand_parse(self, name):
        """(iterations, ms, losses) of the log's iteration lines, read here independently of the script."""
        its, ms, loss = [], [], []
        for line in read(self.logs[name]).splitlines():
            m = ITER_LINE.search(line)
            if m:
                its.append(int(m.group(1)))
                ms.append(float(m.group(2)))
                loss.append(float(m.group(3)))
        return its, ms, loss

    def test_table_values(self):
        self.assertEqual(self.rc, 0, self.err)
        self.assertEqual(self.err, "")
        rows = table_rows(self.out)
        self.assertEqual(set(rows), {"bf16.log", "nvfp4.log"})
        means = {}
        for name, row in rows.items():
            its, ms, loss = self.hand_parse(name)
            self.assertEqual(its, list(range(1, ITERS + 1)))
            self.assertEqual(row[ITERATIONS], str(ITERS))
            # The summary's window: the last 60%, from iteration round(0.4 * 10) = 4 to 10.
            self.assertEqual(row[WINDOW], "4-10")
            means[name] = sum(ms[3:]) / len(ms[3:])
            self.assertAlmostEqual(float(row[STEP_MS]), means[name], delta=0.051)
            self.assertEqual(row[FINAL], f"{loss[-1]:.4f}")
            self.assertEqual(row[NONFINITE], "0")
            self.assertEqual(row[SEQ_SRC], "log")  # from the 'training:' banner
            tokens = GBS * SEQ / (means[name] / 1e3)
            self.assertAlmostEqual(float(row[TOKENS]), tokens, delta=0.01 * tokens)
            self.assertGreater(float(row[TFLOPS]), 0.0)
        self.assertEqual(rows["bf16.log"][SPEEDUP], "1.000x")
        self.assertAlmostEqual(float(rows["nvfp4.log"][SPEEDUP].rstrip("x")), means["bf16.log"] / means["nvfp4.log"],
                               delta=0.002)
        # Loss gap over the last 10% (iteration 10 alone), by hand.
        _, _, ref = self.hand_parse("bf16.log")
        _, _, fp4 = self.hand_parse("nvfp4.log")
        self.assertAlmostEqual(float(rows["nvfp4.log"][GAP].rstrip("%")), 100 * (fp4[-1] - ref[-1]) / ref[-1],
                               delta=0.006)
        # Validation: the after-training 'on validation set' value at iteration 10 (not the test set's).
        for name in rows:
            vals = re.findall(r"validation loss at iteration 10 on validation set \| lm loss value: (\S+) \|",
                              read(self.logs[name]))
            self.assertEqual(len(vals), 1)
            self.assertEqual(rows[name][VAL], f"{float(vals[0]):.4f}")
        self.assertEqual(rows["bf16.log"][VAL_GAP], "+0.00%")

    def test_png(self):
        if not have_matplotlib():
            self.skipTest(f"matplotlib is not installed for {sys.executable} (Debian: python3-matplotlib): "
                          "the PNG part is not checked; the table is")
        png = os.path.join(self.tmp.name, "cmp.png")
        rc, out, err = compare(self.logs["bf16.log"], self.logs["nvfp4.log"], "--png", png)
        self.assertEqual(rc, 0, err)
        self.assertEqual(set(table_rows(out)), {"bf16.log", "nvfp4.log"})  # the table is printed with --png too
        with open(png, "rb") as fh:
            data = fh.read()
        self.assertGreater(len(data), 1000)
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))
        self.assertEqual([f for f in os.listdir(self.tmp.name) if f.startswith(".pl_output.")], [])
        # A PNG that cannot be written: one error line, no table, no temp file left.
        rc, out, err = compare(self.logs["bf16.log"], self.logs["nvfp4.log"], "--png",
                               os.path.join(self.tmp.name, "no-such-dir", "x.png"))
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)

    def test_csv(self):
        path = os.path.join(self.tmp.name, "cmp.csv")
        rc, out, err = compare(self.logs["bf16.log"], self.logs["nvfp4.log"], "--csv", path)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, self.out)  # the same table
        import csv
        with open(path, newline="") as fh:
            rows = list(csv.DictReader(fh))
        self.assertEqual([r["log"] for r in rows], ["bf16.log", "nvfp4.log"])
        table = table_rows(self.out)
        _, _, ref = self.hand_parse("bf16.log")
        for r in rows:
            its, ms, loss = self.hand_parse(r["log"])
            cells = table[r["log"]]
            self.assertEqual(r["path"], self.logs[r["log"]])
            self.assertEqual(int(r["iterations"]), ITERS)
            self.assertEqual(f'{r["window_first"]}-{r["window_last"]}', cells[WINDOW])
            self.assertAlmostEqual(float(r["step_ms"]), sum(ms[3:]) / len(ms[3:]), places=9)  # all the digits
            self.assertEqual(f'{float(r["step_ms"]):.1f}', cells[STEP_MS])
            self.assertEqual(f'{float(r["tflops_per_gpu"]):.3f}', cells[TFLOPS])
            self.assertEqual(float(r["final_loss"]), loss[-1])
            self.assertEqual(int(r["tail_iterations"]), 1)  # ceil(0.1 * 10)
            self.assertEqual(float(r["tail_loss"]), loss[-1])
            self.assertAlmostEqual(float(r["loss_gap_pct"]), 100 * (loss[-1] - ref[-1]) / ref[-1], places=9)
            self.assertEqual(f'{float(r["val_loss"]):.4f}', cells[VAL])
            self.assertEqual(r["val_iteration"], "10")
            self.assertEqual(r["nonfinite"], "0")
        # One log is enough with --csv (a sweep of one point); without it, an error.
        rc, out, err = compare(self.logs["nvfp4.log"], "--csv", path)
        self.assertEqual(rc, 0, err)
        with open(path, newline="") as fh:
            self.assertEqual(len(list(csv.DictReader(fh))), 1)
        rc, out, err = compare(self.logs["nvfp4.log"])
        self.assertEqual(rc, 1)
        self.assertIn("at least two logs", err)

    def test_data_parallel_world_size(self):
        # pretrain_llama's data-parallel start-up line gives the GPUs of tokens/s/GPU (Megatron's
        # world_size argument does for Megatron's logs): the same log said to run on 2 ranks halves it.
        two = os.path.join(self.tmp.name, "two_ranks.log")
        with open(self.logs["bf16.log"]) as src, open(two, "w") as dst:
            dst.write("pretrain_llama | data parallel: world size 2, data-parallel size 2 (rank 0 of 2), 1 "
                      "micro-batches per rank per iteration\n" + src.read())
        path = os.path.join(self.tmp.name, "dp.csv")
        rc, out, err = compare(self.logs["bf16.log"], two, "--csv", path)
        self.assertEqual(rc, 0, err)
        import csv
        with open(path, newline="") as fh:
            rows = {r["log"]: r for r in csv.DictReader(fh)}
        self.assertAlmostEqual(float(rows["two_ranks.log"]["tokens_per_s_per_gpu"]),
                               float(rows["bf16.log"]["tokens_per_s_per_gpu"]) / 2, places=6)

    def test_different_lengths(self):
        short = os.path.join(self.tmp.name, "short.log")
        lines = read(self.logs["nvfp4.log"]).splitlines(keepends=True)
        cut = next(i for i, l in enumerate(lines) if re.search(r"iteration\s+7/", l))
        with open(short, "w") as fh:
            fh.writelines(lines[:cut + 1])
        rc, out, err = compare(self.logs["bf16.log"], short)
        self.assertEqual(rc, 0, err)
        notes = [l for l in out.splitlines() if "common prefix" in l]
        self.assertEqual(len(notes), 1, out)
        rows = table_rows(out)
        self.assertEqual(rows["bf16.log"][ITERATIONS], "7")
        self.assertEqual(rows["short.log"][ITERATIONS], "7")
        self.assertEqual(rows["bf16.log"][WINDOW], "3-7")  # round(0.4 * 7) = 3
        _, ms, loss = self.hand_parse("bf16.log")
        self.assertAlmostEqual(float(rows["bf16.log"][STEP_MS]), sum(ms[2:7]) / 5, delta=0.051)
        self.assertEqual(rows["bf16.log"][FINAL], f"{loss[6]:.4f}")
        self.assertEqual(rows["bf16.log"][VAL], f"{self.valid_at(5):.4f}")  # the last one within 1..7

    def valid_at(self, it):
        text = read(self.logs["bf16.log"])
        return float(re.search(rf"validation loss at iteration {it} \| lm loss value: (\S+) \|", text).group(1))


MEGATRON_LM = """\
using world size: 1, data-parallel size: 1, context-parallel size: 1
------------------------ arguments ------------------------
  seq_length ...................................... 4096
  world_size ...................................... 1
-------------------- end of arguments ---------------------
[rank0]: [2025-06-01 10:00:01.123456] iteration        1/       5 | consumed samples:           64 | elapsed time per iteration (ms): 2000.0 | throughput per GPU (TFLOP/s/GPU): 400.0 | learning rate: 1.500000E-04 | global batch size:    64 | lm loss: 1.100000E+01 | loss scale: 1.0 | grad norm: 12.345 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank0]: [2025-06-01 10:00:02.234567] iteration        2/       5 | consumed samples:          128 | elapsed time per iteration (ms): 1000.0 | throughput per GPU (TFLOP/s/GPU): 800.0 | learning rate: 3.000000E-04 | global batch size:    64 | lm loss: 1.000000E+01 | loss scale: 1.0 | grad norm: 10.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank0]: [2025-06-01 10:00:03.345678] iteration        3/       5 | consumed samples:          192 | elapsed time per iteration (ms): 1100.0 | throughput per GPU (TFLOP/s/GPU): 727.3 | learning rate: 2.900000E-04 | global batch size:    64 | lm loss: 9.000000E+00 | loss scale: 1.0 | grad norm: 9.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank0]: [2025-06-01 10:00:04.456789] iteration        4/       5 | consumed samples:          256 | elapsed time per iteration (ms): 900.0 | throughput per GPU (TFLOP/s/GPU): 888.9 | learning rate: 2.800000E-04 | global batch size:    64 | lm loss: 8.000000E+00 | loss scale: 1.0 | grad norm: 8.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank0]: [2025-06-01 10:00:05.567890] iteration        5/       5 | consumed samples:          320 | elapsed time per iteration (ms): 1000.0 | throughput per GPU (TFLOP/s/GPU): 800.0 | learning rate: 2.700000E-04 | global batch size:    64 | lm loss: 7.000000E+00 | loss scale: 1.0 | grad norm: 7.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
[rank0]: ----------------------------------------------------------------------------------------------
[rank0]:  validation loss at iteration 5 | lm loss value: 7.500000E+00 | lm loss PPL: 1.808042E+03 |
[rank0]: ----------------------------------------------------------------------------------------------
[rank0]:  validation loss at iteration 5 on test set | lm loss value: 9.900000E+00 | lm loss PPL: 1.993701E+04 |
"""

# Megatron-Bridge style with a "0: " launcher prefix, no microseconds, a nan loss, one line without a
# loss (a skipped interval), and no seq length anywhere.
BRIDGE = """\
0: Step Time : 0.50s GPU utilization: 1600.0MODEL_TFLOP/s/GPU
0:  [2025-06-01 11:00:01] iteration        1/       5 | consumed samples:           64 | elapsed time per iteration (ms): 500.0 | learning rate: 1.500000E-04 | global batch size:    64 | lm loss: 1.100000E+01 | loss scale: 1.0 | grad norm: 12.345 | number of skipped iterations:   0 | number of nan iterations:   0 |
0: Step Time : 0.50s GPU utilization: 1600.0MODEL_TFLOP/s/GPU
0:  [2025-06-01 11:00:02] iteration        2/       5 | consumed samples:          128 | elapsed time per iteration (ms): 500.0 | learning rate: 3.000000E-04 | global batch size:    64 | lm loss: nan | loss scale: 1.0 | number of skipped iterations:   1 | number of nan iterations:   1 |
0: Step Time : 0.50s GPU utilization: 1600.0MODEL_TFLOP/s/GPU
0:  [2025-06-01 11:00:03] iteration        3/       5 | consumed samples:          192 | elapsed time per iteration (ms): 500.0 | learning rate: 2.900000E-04 | global batch size:    64 | loss scale: 1.0 | number of skipped iterations:   1 | number of nan iterations:   1 |
0: Step Time : 0.50s GPU utilization: 1600.0MODEL_TFLOP/s/GPU
0:  [2025-06-01 11:00:04] iteration        4/       5 | consumed samples:          256 | elapsed time per iteration (ms): 500.0 | learning rate: 2.800000E-04 | global batch size:    64 | lm loss: 8.800000E+00 | loss scale: 1.0 | grad norm: 8.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
0: Step Time : 0.50s GPU utilization: 1600.0MODEL_TFLOP/s/GPU
0:  [2025-06-01 11:00:05] iteration        5/       5 | consumed samples:          320 | elapsed time per iteration (ms): 500.0 | learning rate: 2.700000E-04 | global batch size:    64 | lm loss: 7.700000E+00 | loss scale: 1.0 | grad norm: 7.000 | number of skipped iterations:   0 | number of nan iterations:   0 |
"""


class MegatronLogs(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.mlm = self.write("mlm.log", MEGATRON_LM)
        self.bridge = self.write("bridge.log", BRIDGE)

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as fh:
            fh.write(text)
        return path

    def test_megatron_lines(self):
        rc, out, err = compare(self.mlm, self.bridge, "--seq-length", "2048")
        self.assertEqual(rc, 0, err)
        rows = table_rows(out)
        mlm, br = rows["mlm.log"], rows["bridge.log"]
        self.assertEqual(mlm[ITERATIONS], "5")
        self.assertEqual(mlm[WINDOW], "2-5")  # round(0.4 * 5) = 2
        self.assertEqual(mlm[STEP_MS], "1000.0")  # (1000 + 1100 + 900 + 1000) / 4
        # FLOPs per iteration from 'throughput per GPU' x step time: 800 TFLOP/s x 1 s (727.3 x 1.1 ...).
        self.assertAlmostEqual(float(mlm[TFLOPS]), 800.0, delta=0.05)
        self.assertEqual(mlm[TOKENS], str(64 * 4096))  # seq_length from the arguments block
        self.assertEqual(mlm[SEQ_SRC], "log")
        self.assertEqual(mlm[FINAL], "7.0000")
        self.assertEqual(mlm[NONFINITE], "0")
        self.assertEqual(mlm[VAL], "7.5000")  # the test-set line is not a validation loss
        # Bridge: TFLOP/s from the Step Time lines; seq length from --seq-length.
        self.assertEqual(br[STEP_MS], "500.0")
        self.assertAlmostEqual(float(br[TFLOPS]), 1600.0, delta=0.05)
        self.assertEqual(br[TOKENS], str(64 * 2048 * 2))
        self.assertEqual(br[SEQ_SRC], "--seq-length")
        self.assertEqual(br[SPEEDUP], "2.000x")
        self.assertEqual(br[FINAL], "7.7000")
        self.assertEqual(br[GAP], "+10.00%")  # last 10% of 5 iterations = iteration 5: 7.7 vs 7.0
        self.assertEqual(br[NONFINITE], "2")  # 'lm loss: nan' and the line without a loss
        self.assertEqual(len(br), NONFINITE + 1)  # no validation loss: blank

    def test_downstream_table(self):
        # pretrain_llama --downstream-eval lines (issue 43): each log's last accuracies per task, acc_norm where given.
        line = (" downstream eval at iteration {it} | {task} | acc: {acc} | acc_stderr: 0.0300 | {norm}documents: 200 | "
                "0-shot | forward: bf16 | 0.2 s | \n")
        a = self.write("a.log", MEGATRON_LM + line.format(it=3, task="hs", acc="0.2500", norm="acc_norm: 0.2600 | ")
                       + line.format(it=5, task="hs", acc="0.3100", norm="acc_norm: 0.3300 | ")
                       + line.format(it=5, task="wg", acc="0.5100", norm=""))
        b = self.write("b.log", MEGATRON_LM + line.format(it=5, task="hs", acc="0.2900", norm="acc_norm: 0.3000 | "))
        rc, out, err = compare(a, b, "--seq-length", "2048")
        self.assertEqual(rc, 0, err)
        tail = out[out.index("downstream accuracy"):].splitlines()
        self.assertEqual(tail[1].split(), ["log", "hs", "acc", "hs", "acc_norm", "at", "wg", "acc", "wg", "acc_norm", "at"])
        self.assertEqual(tail[3].split(), ["a.log", "0.3100", "0.3300", "5", "0.5100", "-", "5"])
        self.assertEqual(tail[4].split(), ["b.log", "0.2900", "0.3000", "5", "-", "-", "-"])
        rc, out, err = compare(self.mlm, self.bridge, "--seq-length", "2048")
        self.assertNotIn("downstream", out)  # no table without the lines

    def test_no_seq_length(self):
        rc, out, err = compare(self.mlm, self.bridge)
        self.assertEqual(rc, 0, err)
        self.assertEqual(table_rows(out)["bridge.log"][TOKENS], "-")

    def test_png_with_nan(self):
        if not have_matplotlib():
            self.skipTest(f"matplotlib is not installed for {sys.executable}: the PNG part is not checked")
        png = os.path.join(self.tmp.name, "m.png")
        rc, out, err = compare(self.mlm, self.bridge, "--png", png)
        self.assertEqual(rc, 0, err)
        self.assertGreater(os.path.getsize(png), 1000)

    def test_no_iteration_lines(self):
        empty = self.write("empty.log", "pretrain_llama | nothing here\nStep Time : 0.50s GPU utilization: 1.0MODEL_TFLOP/s/GPU\n")
        png = os.path.join(self.tmp.name, "never.png")
        rc, out, err = compare(self.mlm, empty, "--png", png)
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn(empty, err)
        self.assertIn("no iteration lines", err)
        self.assertFalse(os.path.exists(png))

    def test_unreadable(self):
        missing = os.path.join(self.tmp.name, "missing.log")
        rc, out, err = compare(self.mlm, missing)
        self.assertEqual(rc, 1)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn(missing, err)

    def test_different_lengths(self):
        lines = MEGATRON_LM.splitlines(keepends=True)
        cut = next(i for i, l in enumerate(lines) if "iteration        3/" in l)
        short = self.write("short.log", "".join(lines[:cut + 1]))
        rc, out, err = compare(self.mlm, short)
        self.assertEqual(rc, 0, err)
        notes = [l for l in out.splitlines() if "common prefix" in l]
        self.assertEqual(len(notes), 1, out)
        self.assertIn("mlm.log: 5", notes[0])
        self.assertIn("short.log: 3", notes[0])
        rows = table_rows(out)
        self.assertEqual(rows["mlm.log"][ITERATIONS], "3")
        self.assertEqual(rows["mlm.log"][FINAL], "9.0000")
        self.assertEqual(len(rows["mlm.log"]), NONFINITE + 1)  # the validation at 5 is past the prefix


if __name__ == "__main__":
    unittest.main(verbosity=2)
