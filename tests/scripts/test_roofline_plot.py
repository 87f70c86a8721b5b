#!/usr/bin/env python3
"""ctest RooflinePlot.python: scripts/roofline_plot.py on two hand-made --roofline reports (a BF16 and an
NVFP4 one, the schema of lib/roofline/report.h) and on bad ones. Plain unittest; no GPU, no training run
(the lead's end-to-end test draws real reports).
"""

import copy
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "roofline_plot.py"))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def plot(*args):
    """Runs roofline_plot.py; returns (rc, stdout, stderr)."""
    p = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def have_matplotlib():
    """Whether the script can draw: this python3 has matplotlib, or /usr/bin/python3 has it (the script re-runs
    there: scripts/script_errors.py)."""
    return any(os.access(py, os.X_OK) and
               subprocess.run([py, "-c", "import matplotlib, numpy"], capture_output=True).returncode == 0
               for py in (sys.executable, "/usr/bin/python3"))


def row(op, kind, ms, gflop, gb, ms_at_ceiling, linear=None, gemm_pass=None, fmt="bf16"):
    return {"op": op, "kind": kind, "linear": linear, "pass": gemm_pass, "format": fmt, "timer": kind,
            "calls_per_iter": 4, "ms_per_iter": ms, "gflop_per_iter": gflop, "gb_per_iter": gb,
            "intensity": gflop / gb if gb else 0.0, "memory_level": "DRAM", "ceiling_tflops": 1.0,
            "achieved_tflops": gflop / ms if ms else 0.0, "achieved_gbps": gb / ms * 1000 if ms else 0.0,
            "pct_of_ceiling": 100.0 * ms_at_ceiling / ms if ms else 0.0, "ms_at_ceiling": ms_at_ceiling}


def report(label, recipe, gemm_format, gemm_ms):
    """A small report: GEMM rows of three passes, attention, a norm, a quantize row and a 0-FLOP row."""
    rows = [row("linear fc1 fprop", "gemm", gemm_ms, 20.0, 0.05, gemm_ms / 3, "fc1", "fprop", gemm_format),
            row("linear fc1 dgrad", "gemm", gemm_ms, 20.0, 0.05, gemm_ms / 3, "fc1", "dgrad", gemm_format),
            row("linear qkv wgrad", "gemm", gemm_ms / 2, 8.0, 0.03, gemm_ms / 5, "qkv", "wgrad", gemm_format),
            row("attention forward", "attention", 6.0, 4.0, 0.02, 1.5),
            row("rmsnorm", "norm", 2.0, 0.01, 0.04, 0.3),
            row("embedding", "embedding", 0.5, 0.0, 0.01, 0.05)]  # 0 FLOPs: counted in the legend, not drawn
    if gemm_format == "nvfp4":
        rows.append(row("quantize nvfp4", "quantize", 3.0, 0.02, 0.06, 0.4))
    inside = sum(r["ms_per_iter"] for r in rows)
    sol = sum(r["ms_at_ceiling"] for r in rows)
    step = inside + 4.0
    return {"machine": {"device": "cpu", "name": "Test CPU", "driver": "", "threads": 2, "gemm_impl": "OpenBLAS"},
            "ceilings": {"gemm": [{"format": "bf16", "tflops": 1.2, "path": "OpenBLAS sgemm", "datasheet_tflops": 0},
                                  {"format": "nvfp4", "tflops": 0.4, "path": "emulated", "datasheet_tflops": 0}],
                         "memory": [{"level": "L2", "capacity_bytes": 2e6, "gbps": 400.0},
                                    {"level": "DRAM", "capacity_bytes": 0, "gbps": 20.0}]},
            "recipe": recipe, "label": label, "iterations": 4, "step_ms": step, "sol_ms": sol,
            "pct_of_sol": 100.0 * sol / step, "inside_ops_ms": inside, "outside_ops_ms": step - inside, "rows": rows}


def load_script():
    """The script as a module, for its pure helpers (no matplotlib is imported by loading it)."""
    spec = importlib.util.spec_from_file_location("roofline_plot", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RoofLabels(unittest.TestCase):
    def test_roofs_within_three_percent_share_one_label(self):
        rp = load_script()
        # The CPU probe's four formats (one FP32 GEMM underneath) and two roofs of a second report.
        entries = [("bf16", 0.2074, 0), ("fp8", 0.2068, 0), ("mxfp8", 0.2064, 0), ("nvfp4", 0.20754, 0),
                   ("bf16", 0.19, 1), ("nvfp4", 0.0, 1)]
        groups = rp.merge_roofs(entries)
        self.assertEqual([g["names"] for g in groups], [["bf16", "fp8", "mxfp8", "nvfp4"], ["bf16"]])
        self.assertEqual(rp.roof_label(groups[0], "TFLOP/s"), "bf16/fp8/mxfp8/nvfp4 0.206-0.208 TFLOP/s")
        self.assertEqual(rp.roof_label(groups[1], "TFLOP/s"), "bf16 0.19 TFLOP/s")
        self.assertEqual([g["solid"] for g in groups], [True, False])  # report 0's roofs solid, the others dashed

    def test_stacked_labels_never_overlap(self):
        rp = load_script()
        h = rp.LABEL_HEIGHT_PT
        anchors = [100.0, 104.0, 108.0, 300.0, 40.0, 41.0]  # three roofs a few points apart, two nearly equal
        offsets = rp.stack_labels(anchors)
        spans = sorted((a + d, a + d + h) for a, d in zip(anchors, offsets))
        for (_, top), (bottom, _) in zip(spans, spans[1:]):
            self.assertLessEqual(top, bottom + 1e-9)
        self.assertAlmostEqual(offsets[3], rp.LABEL_PAD_PT)  # a lone roof keeps its label just above it


class RooflinePlot(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)

    def write(self, name, content):
        path = os.path.join(self.tmp.name, name)
        with open(path, "w") as fh:
            fh.write(content if isinstance(content, str) else json.dumps(content))
        return path

    def expect_one_line_error(self, args, *needles):
        rc, out, err = plot(*args)
        self.assertEqual(rc, 2, err)
        lines = err.splitlines()
        self.assertEqual(len(lines), 1, err)
        self.assertTrue(lines[0].startswith("roofline_plot.py: error: "), lines[0])
        for n in needles:
            self.assertIn(n, lines[0])
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "out.png")))

    @unittest.skipUnless(have_matplotlib(), "python3 has no matplotlib/numpy (scripts/setup.sh installs them)")
    def test_two_reports_make_one_png(self):
        bf16 = self.write("bf16.json", report("bf16", "bf16_mixed", "bf16", 30.0))
        nvfp4 = self.write("nvfp4.json", report("nvfp4", "bf16_with_nvfp4_mixed", "nvfp4", 20.0))
        png = os.path.join(self.tmp.name, "out.png")
        rc, out, err = plot(bf16, nvfp4, "--png", png)
        self.assertEqual(rc, 0, err)
        self.assertEqual(err, "")
        with open(png, "rb") as fh:
            data = fh.read()
        self.assertGreater(len(data), 10000)  # two panels with markers and bars, not an empty canvas
        self.assertEqual(data[:8], PNG_SIGNATURE)
        # The printed titles carry each report's label and % of speed of light.
        for name, path in (("bf16", bf16), ("nvfp4", nvfp4)):
            with open(path) as fh:
                doc = json.load(fh)
            self.assertIn(f"{name} ({doc['recipe']})", out)
            self.assertIn(f"= {doc['pct_of_sol']:.1f}% of speed of light", out)

    @unittest.skipUnless(have_matplotlib(), "python3 has no matplotlib/numpy (scripts/setup.sh installs them)")
    def test_one_report_and_optional_fields_left_out(self):
        doc = report("bf16", "bf16_mixed", "bf16", 30.0)
        for r in doc["rows"]:  # derived fields the script computes when absent
            for k in ("intensity", "achieved_tflops", "linear", "pass"):
                del r[k]
        for k in ("pct_of_sol", "outside_ops_ms", "label"):
            del doc[k]
        png = os.path.join(self.tmp.name, "one.png")
        rc, out, err = plot(self.write("only.json", doc), "--png", png)
        self.assertEqual(rc, 0, err)
        self.assertIn("only (bf16_mixed)", out)  # the label falls back to the file's name
        with open(png, "rb") as fh:
            self.assertEqual(fh.read(8), PNG_SIGNATURE)

    def test_missing_file(self):
        missing = os.path.join(self.tmp.name, "nope.json")
        self.expect_one_line_error([missing, "--png", os.path.join(self.tmp.name, "out.png")], missing, "cannot read")

    def test_not_json(self):
        bad = self.write("bad.json", "roofline | op ... this is the table, not the JSON\n")
        self.expect_one_line_error([bad, "--png", os.path.join(self.tmp.name, "out.png")], bad, "not JSON")

    def test_missing_fields_are_named(self):
        good = report("bf16", "bf16_mixed", "bf16", 30.0)
        cases = []
        for key in ("step_ms", "sol_ms", "rows", "ceilings", "machine"):
            doc = copy.deepcopy(good)
            del doc[key]
            cases.append((doc, key))
        doc = copy.deepcopy(good)
        del doc["rows"][2]["ms_at_ceiling"]
        cases.append((doc, "rows[2].ms_at_ceiling"))
        doc = copy.deepcopy(good)
        del doc["ceilings"]["memory"][1]["gbps"]
        cases.append((doc, "ceilings.memory[1].gbps"))
        doc = copy.deepcopy(good)
        doc["rows"][0]["gflop_per_iter"] = "many"
        cases.append((doc, "rows[0].gflop_per_iter"))
        doc = copy.deepcopy(good)
        doc["rows"][1]["kind"] = "matmul"
        cases.append((doc, "rows[1].kind"))
        ok = self.write("ok.json", good)
        for doc, name in cases:
            with self.subTest(field=name):
                bad = self.write("bad.json", doc)
                # The bad report second: the error names it, not the good one before it.
                self.expect_one_line_error([ok, bad, "--png", os.path.join(self.tmp.name, "out.png")], bad, name)

    def test_png_is_required(self):
        rc, _, err = plot(self.write("ok.json", report("bf16", "bf16_mixed", "bf16", 30.0)))
        self.assertEqual(rc, 2)
        self.assertIn("--png", err)


if __name__ == "__main__":
    unittest.main(verbosity=2)
