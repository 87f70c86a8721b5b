#!/usr/bin/env python3
"""ctest Roofline.run: pretrain_llama --roofline on two short CPU runs of llama_tiny (BF16 and NVFP4), with
--timing-log-level 2 --log-interval 1 so the per-op timers of every iteration are printed too; then
scripts/roofline_plot.py on both reports. Plain unittest; no GPU.

Checks (issue 24's tests): the report's per-op times add up to the level-2 per-op timers over the same
iterations within 1%; no GEMM row above 105% of its ceiling; the printed % of speed of light equals
sol_ms / step_ms; the JSON follows the schema; the plot script writes a non-empty PNG.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH, PL_CONFIG_DIR.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PLOT = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "roofline_plot.py"))
ITERS = 4
# The level-2 per-op timer categories (core/timers.h): the rows of these categories are what the timers
# print under those names.
OP_TIMERS = {"gemm-bf16", "gemm-fp8", "gemm-mxfp8", "gemm-nvfp4", "attention", "quantization", "quant-stats",
             "rmsnorm", "rope", "swiglu", "embedding", "cross-entropy", "elementwise"}
KINDS = {"gemm", "attention", "quantize", "norm", "elementwise", "embedding", "cross_entropy", "optimizer", "comm",
         "other"}
LINEARS = {"qkv", "proj", "fc1", "fc2", "lm_head", None}
PASSES = {"fprop", "dgrad", "wgrad", None}
ROW_NUMBERS = ["calls_per_iter", "ms_per_iter", "gflop_per_iter", "gb_per_iter", "ceiling_tflops",
               "achieved_tflops", "pct_of_ceiling", "ms_at_ceiling"]
ITERATION = re.compile(r"iteration\s+(\d+)/")
TIMER = re.compile(r"^\s+(\S+) \.+: \(([0-9.]+), ([0-9.]+)\)$")
SOL = re.compile(r"step at ([0-9.]+)% of speed of light")


def run_app(args):
    p = subprocess.run([os.environ["PL_APP_PATH"], *args], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise AssertionError(f"pretrain_llama {' '.join(args)} failed ({p.returncode}):\n{p.stderr}\n{p.stdout[-3000:]}")
    return p.stdout


def op_timer_ms_by_iteration(stdout):
    """{iteration: sum of the level-2 per-op timers printed after that iteration's line} (log interval 1)."""
    sums, current = {}, None
    for line in stdout.splitlines():
        m = ITERATION.search(line)
        if m and "consumed samples" in line:
            current = int(m.group(1))
            sums[current] = 0.0
            continue
        t = TIMER.match(line)
        if t and current is not None and t.group(1) in OP_TIMERS:
            sums[current] += float(t.group(2))
    return sums


class RooflineRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        tiny = os.path.join(os.environ["PL_CONFIG_DIR"], "models", "llama_tiny.json")
        cache = os.path.join(cls.tmp.name, "ceilings.json")
        cls.runs = {}
        for label, extra in (("bf16", ["--disable-fp4"]), ("nvfp4", [])):
            path = os.path.join(cls.tmp.name, f"r_{label}.json")
            out = run_app(["--model", tiny, "--device", "cpu", "--threads", "2", "--train-iters", str(ITERS),
                           "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "64",
                           "--timing-log-level", "2", "--log-interval", "1", "--roofline", path,
                           "--machine-ceilings", cache, *extra])
            with open(path) as fh:
                cls.runs[label] = (out, json.load(fh), path)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_json_follows_the_schema(self):
        for label, (_, r, _) in self.runs.items():
            for key in ("machine", "ceilings", "step_ms", "sol_ms", "rows"):
                self.assertIn(key, r, label)
            self.assertIn("gemm", r["ceilings"])
            self.assertIn("memory", r["ceilings"])
            self.assertGreater(len(r["rows"]), 5)
            for row in r["rows"]:
                self.assertIsInstance(row["op"], str)
                self.assertIn(row["kind"], KINDS, row)
                self.assertIn(row["linear"], LINEARS, row)
                self.assertIn(row["pass"], PASSES, row)
                self.assertIsInstance(row["format"], str)
                for k in ROW_NUMBERS:
                    self.assertIsInstance(row[k], (int, float), (k, row))
                    self.assertGreaterEqual(row[k], 0.0, (k, row))
            gemms = {(row["linear"], row["pass"]) for row in r["rows"] if row["kind"] == "gemm"}
            for linear in ("qkv", "proj", "fc1", "fc2", "lm_head"):
                for p in ("fprop", "dgrad", "wgrad"):
                    self.assertIn((linear, p), gemms, label)

    def test_rows_add_up_to_the_level2_timers(self):
        for label, (out, r, _) in self.runs.items():
            per_iter = op_timer_ms_by_iteration(out)
            window = range(r["first_iteration"], r["last_iteration"] + 1)
            self.assertEqual(len(window), r["iterations"])
            timers = sum(per_iter[i] for i in window) / len(window)
            rows = sum(row["ms_per_iter"] for row in r["rows"] if row["timer"] in OP_TIMERS)
            self.assertAlmostEqual(rows, timers, delta=0.01 * timers, msg=label)

    def test_no_gemm_row_above_its_ceiling(self):
        for label, (_, r, _) in self.runs.items():
            for row in r["rows"]:
                if row["kind"] == "gemm":
                    self.assertLessEqual(row["pct_of_ceiling"], 105.0, (label, row))

    def test_printed_speed_of_light_is_sol_over_step(self):
        for label, (out, r, _) in self.runs.items():
            printed = [float(m.group(1)) for m in SOL.finditer(out)]
            self.assertEqual(len(printed), 1, label)
            self.assertAlmostEqual(printed[0], round(100.0 * r["sol_ms"] / r["step_ms"], 1), delta=0.051)
            self.assertAlmostEqual(r["pct_of_sol"], 100.0 * r["sol_ms"] / r["step_ms"], places=6)

    def test_nvfp4_has_quantization_and_expansion_rows(self):
        ops = {row["op"] for row in self.runs["nvfp4"][1]["rows"]}
        self.assertIn("quantize", ops)
        self.assertIn("quantized_gemm:expand", ops)
        self.assertNotIn("quantized_gemm", {row["op"] for row in self.runs["bf16"][1]["rows"]})

    def test_profile_window_bounds_the_measurement(self):
        # Megatron's --profile window: 1-based iterations start+1 .. end; the table at each log interval too.
        tiny = os.path.join(os.environ["PL_CONFIG_DIR"], "models", "llama_tiny.json")
        path = os.path.join(self.tmp.name, "r_window.json")
        out = run_app(["--model", tiny, "--device", "cpu", "--threads", "2", "--train-iters", "5",
                       "--global-batch-size", "4", "--micro-batch-size", "2", "--seq-length", "32", "--disable-fp4",
                       "--roofline", path, "--roofline-at-log-interval", "--log-interval", "2",
                       "--machine-ceilings", os.path.join(self.tmp.name, "ceilings.json"),
                       "--profile", "--profile-step-start", "1", "--profile-step-end", "3"])
        with open(path) as fh:
            r = json.load(fh)
        self.assertEqual((r["first_iteration"], r["last_iteration"], r["iterations"]), (2, 3, 2))
        # Log intervals end at 2 (iteration 2 measured) and 4 (2-3); the last one, 5, is the final table: three.
        self.assertEqual(len(SOL.findall(out)), 3, out)

    def test_the_probe_is_not_the_runs_peak_memory(self):
        # The machine is probed before the model is built (and before a GPU's arena is reserved); the peak
        # memory the run reports is the training's alone: the same as without --roofline.
        tiny = os.path.join(os.environ["PL_CONFIG_DIR"], "models", "llama_tiny.json")
        args = ["--model", tiny, "--device", "cpu", "--threads", "2", "--train-iters", "2", "--global-batch-size", "4",
                "--micro-batch-size", "2", "--seq-length", "32", "--disable-fp4"]
        peak = re.compile(r"mem-max-allocated-gigabytes: ([0-9.]+)")
        plain = peak.findall(run_app(args))
        probed = peak.findall(run_app(args + ["--roofline", "--machine-ceilings", "none"]))
        self.assertTrue(plain)
        self.assertEqual(plain, probed)

    def test_plot_writes_a_png(self):
        png = os.path.join(self.tmp.name, "roof.png")
        p = subprocess.run([sys.executable, PLOT, self.runs["bf16"][2], self.runs["nvfp4"][2], "--png", png],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(p.returncode, 0, p.stderr)
        with open(png, "rb") as fh:
            head = fh.read(8)
        self.assertEqual(head, b"\x89PNG\r\n\x1a\n")
        self.assertGreater(os.path.getsize(png), 10000)


if __name__ == "__main__":
    unittest.main()
