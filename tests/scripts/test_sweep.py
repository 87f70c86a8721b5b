#!/usr/bin/env python3
"""ctest Sweep.script: scripts/sweep.sh on a 2x1x1 grid of llama_tiny (BF16 and NVFP4, 3 iterations): the
text logs and JSON-lines logs (--log-jsonl), the CSV checked against the JSON-lines logs (read here with
json, not the scripts' reader) and the text logs, the figure, a rerun that does no work, an incomplete
JSON-lines log rerun, a directory of text logs only rerun, a failed point, a run that exits 0 without an
"end" event, a seed axis, two --vary axes (weight decay x LR decay style), Ctrl-C, and one-line errors for
bad arguments. Plain unittest; no GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH (the built pretrain_llama).
"""

import csv
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SWEEP = os.path.normpath(os.path.join(HERE, "..", "..", "scripts", "sweep.sh"))
RECIPES = ["bf16_mixed", "bf16_with_nvfp4_mixed"]
ITERS, GBS, MBS, SEQ = 3, 4, 2, 32
EXTRA = ["--model", "llama_tiny", "--device", "cpu", "--train-iters", str(ITERS), "--global-batch-size", str(GBS),
         "--eval-interval", "3", "--eval-iters", "1", "--log-interval", "1"]

ITER_LINE = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*elapsed time per iteration \(ms\): ([0-9.]+) \|.*"
                       r"lm loss: ([0-9.E+-]+) \|")
FINAL_VAL = re.compile(r"validation loss at iteration (\d+) on validation set \| lm loss value: (\S+) \|")


def app():
    path = os.environ.get("PL_APP_PATH")
    if not path:
        raise RuntimeError("PL_APP_PATH must be set (ctest sets it)")
    return path


def env():
    e = dict(os.environ)
    e["OMP_WAIT_POLICY"] = "PASSIVE"
    e.setdefault("PYTHON", sys.executable)  # the python that runs this test has numpy (CMake picks it)
    return e


def sweep(*args, timeout=600):
    p = subprocess.run(["bash", SWEEP, *args], capture_output=True, text=True, timeout=timeout, env=env())
    return p.returncode, p.stdout, p.stderr


def grid(out, recipes=RECIPES, mbs=(MBS,), extra=EXTRA, more=()):
    return sweep("--recipes", ",".join(recipes), "--mbs", ",".join(map(str, mbs)), "--seq", str(SEQ), "--out", out,
                 "--bin", app(), *more, "--", *extra)


def read(path):
    with open(path) as fh:
        return fh.read()


def events(path):
    """The events of a JSON-lines log, read with json alone."""
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def jsonl_parse(path):
    """(iterations, ms, losses, final validation loss, end event) of a JSON-lines log, read independently of
    the scripts (one run, no resume)."""
    ev = events(path)
    its = [e for e in ev if e["event"] == "iteration"]
    val = [e["lm_loss"] for e in ev if e["event"] == "eval" and e["split"] == "validation" and e["after_training"]]
    ends = [e for e in ev if e["event"] == "end"]
    return ([e["iteration"] for e in its], [e["elapsed_ms"] for e in its], [e["lm_loss"] for e in its],
            val[-1] if val else None, ends[-1] if ends else None)


def hand_parse(path):
    """(iterations, ms, losses, final validation loss) read from a log independently of the scripts."""
    its, ms, loss = [], [], []
    text = read(path)
    for line in text.splitlines():
        m = ITER_LINE.search(line)
        if m:
            its.append(int(m.group(1)))
            ms.append(float(m.group(2)))
            loss.append(float(m.group(3)))
    val = FINAL_VAL.findall(text)
    return its, ms, loss, (float(val[-1][1]) if val else None)


def have_matplotlib():
    return subprocess.run([env()["PYTHON"], "-c", "import matplotlib"], capture_output=True).returncode == 0


class SweepGrid(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.out = os.path.join(cls.tmp.name, "grid")
        cls.rc, cls.stdout, cls.stderr = grid(cls.out, more=() if have_matplotlib() else ("--no-png",))
        cls.names = [f"{r}_mbs{MBS}_seq{SEQ}" for r in RECIPES]

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def log(self, i):
        return os.path.join(self.out, self.names[i] + ".log")

    def jsonl(self, i):
        return os.path.join(self.out, self.names[i] + ".jsonl")

    def rows(self):
        with open(os.path.join(self.out, "sweep.csv"), newline="") as fh:
            return list(csv.DictReader(fh))

    def test_1_logs_and_csv(self):
        self.assertEqual(self.rc, 0, self.stderr)
        self.assertEqual(sorted(f for f in os.listdir(self.out) if f.endswith(".log")),
                         sorted(n + ".log" for n in self.names))
        self.assertEqual(sorted(f for f in os.listdir(self.out) if f.endswith(".jsonl")),
                         sorted(n + ".jsonl" for n in self.names))
        self.assertEqual([f for f in os.listdir(self.out) if f.startswith(".")], [])  # no partial files left
        for i, recipe in enumerate(RECIPES):
            text = read(self.log(i))
            first = text.splitlines()[0]
            self.assertTrue(first.startswith(f"sweep.sh | point {self.names[i]} | pretrain_llama --recipe {recipe} "
                                             f"--micro-batch-size {MBS} --seq-length {SEQ} --model llama_tiny"), first)
            self.assertNotIn("--log-jsonl", first)  # the point's command: the sweep's own flag left out
            self.assertIn("pretrain_llama | summary: ", text)
            self.assertIn(f"recipe {recipe} (", text)  # the banner: the point ran with its recipe
            self.assertIn(f"x {MBS} samples x {SEQ} tokens", text)
            self.assertEqual(len(re.findall(rf"\[{i + 1}/2\] {self.names[i]}: running", self.stdout)), 1, self.stdout)
            # The JSON-lines log: the point's run from its start to its end, written to the partial name.
            ev = events(self.jsonl(i))
            self.assertEqual((ev[0]["event"], ev[-1]["event"]), ("start", "end"))
            self.assertEqual(ev[0]["recipe"]["name"], recipe)
            self.assertEqual(ev[0]["training"]["seq_length"], SEQ)
            self.assertEqual(ev[0]["training"]["micro_batch_size"], MBS)
            cmd = ev[0]["command_line"]
            self.assertEqual(cmd[cmd.index("--log-jsonl") + 1], os.path.join(self.out, f".{self.names[i]}.jsonl.partial"))
            self.assertEqual(ev[-1]["stop"], "train_iters")
            # The done line is the end event's summary, in the text summary line's words.
            summary = text[text.index("pretrain_llama | summary: ") + len("pretrain_llama | summary: "):].splitlines()[0]
            self.assertIn(f"{self.names[i]}: done in ", self.stdout)
            done = re.search(rf"{self.names[i]}: done in \d+ s: (.*)", self.stdout).group(1)
            self.assertEqual(done.split(" | ")[0].split(": mean")[0], summary.split(" | ")[0].split(": mean")[0])
            self.assertEqual(done.split(" | ")[1:], summary.split(" | ")[1:])
        rows = self.rows()
        self.assertEqual(len(rows), 2)
        ref_ms = None
        ref_loss = None
        for i, (row, recipe) in enumerate(zip(rows, RECIPES)):
            its, ms, loss, val, end = jsonl_parse(self.jsonl(i))
            self.assertEqual(its, [1, 2, 3])
            # The text log says the same at its printed precision (.1f ms, .6E losses).
            t_its, t_ms, t_loss, t_val = hand_parse(self.log(i))
            self.assertEqual(t_its, its)
            self.assertEqual(t_ms, [float(f"{x:.1f}") for x in ms])
            self.assertEqual(t_loss, [float(f"{x:.6E}") for x in loss])
            self.assertEqual(t_val, float(f"{val:.6E}"))
            self.assertEqual((row["recipe"], row["mbs"], row["seq_length"]), (recipe, str(MBS), str(SEQ)))
            self.assertEqual(row["log"], self.names[i] + ".jsonl")
            self.assertEqual(row["path"], self.jsonl(i))
            self.assertEqual(int(row["iterations"]), ITERS)
            # The window of 3 lines starts at line round(0.4 * 3) = 1: all three.
            self.assertEqual((row["window_first"], row["window_last"]), ("1", "3"))
            mean_ms = sum(ms) / 3
            self.assertAlmostEqual(float(row["step_ms"]), mean_ms, places=6)
            self.assertEqual(float(row["final_loss"]), loss[-1])
            self.assertEqual(float(row["final_loss"]), end["final_lm_loss"])
            self.assertEqual(int(row["tail_iterations"]), 1)  # ceil(0.1 * 3)
            self.assertEqual(float(row["tail_loss"]), loss[-1])
            self.assertEqual(int(row["nonfinite"]), 0)
            self.assertIsNotNone(val)
            self.assertEqual(float(row["val_loss"]), val)
            self.assertEqual(int(row["val_iteration"]), 3)
            tokens = GBS * SEQ / (mean_ms / 1e3)
            self.assertAlmostEqual(float(row["tokens_per_s_per_gpu"]), tokens, delta=1e-6 * tokens)
            if i == 0:
                ref_ms, ref_loss, ref_val = mean_ms, loss[-1], val
                self.assertEqual(float(row["speedup"]), 1.0)
                self.assertEqual(float(row["loss_gap_pct"]), 0.0)
            else:
                self.assertAlmostEqual(float(row["speedup"]), ref_ms / mean_ms, places=9)
                self.assertAlmostEqual(float(row["loss_gap_pct"]), 100 * (loss[-1] - ref_loss) / ref_loss, places=9)
                self.assertAlmostEqual(float(row["val_gap_pct"]), 100 * (val - ref_val) / ref_val, places=9)
        # The two recipes did differ (NVFP4's loss is not BF16's).
        self.assertNotEqual(rows[0]["final_loss"], rows[1]["final_loss"])
        # The table went to stdout too, one row per point.
        self.assertEqual(len([l for l in self.stdout.splitlines() if l.startswith(tuple(self.names))]), 2)

    def test_2_png(self):
        if not have_matplotlib():
            self.skipTest("matplotlib is not installed (Debian: python3-matplotlib): the figure is not checked")
        with open(os.path.join(self.out, "sweep.png"), "rb") as fh:
            data = fh.read()
        self.assertGreater(len(data), 1000)
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))

    def test_3_rerun_does_no_work(self):
        self.assertEqual(self.rc, 0, self.stderr)
        before = [os.stat(p).st_mtime_ns for i in range(2) for p in (self.log(i), self.jsonl(i))]
        csv_before = read(os.path.join(self.out, "sweep.csv"))
        rc, out, err = grid(self.out, more=("--no-png",))
        self.assertEqual(rc, 0, err)
        self.assertEqual(out.count(": skip (complete log"), 2, out)
        self.assertNotIn("running", out)
        self.assertIn("(0 run now)", out)
        self.assertEqual([os.stat(p).st_mtime_ns for i in range(2) for p in (self.log(i), self.jsonl(i))], before)
        self.assertEqual(read(os.path.join(self.out, "sweep.csv")), csv_before)

    def test_4_incomplete_log_is_rerun(self):
        self.assertEqual(self.rc, 0, self.stderr)
        keep = os.stat(self.jsonl(0)).st_mtime_ns
        lines = read(self.jsonl(1)).splitlines(keepends=True)
        self.assertEqual(json.loads(lines[-1])["event"], "end")
        with open(self.jsonl(1), "w") as fh:
            fh.writelines(lines[:-1])  # the end event gone, the text log whole: a run that died
            fh.write('{"event":"itera')  # and a line cut short
        rc, out, err = grid(self.out, more=("--no-png",))
        self.assertEqual(rc, 0, err)
        self.assertIn(f"[1/2] {self.names[0]}: skip", out)
        self.assertIn(f"[2/2] {self.names[1]}: running", out)
        self.assertEqual(os.stat(self.jsonl(0)).st_mtime_ns, keep)
        self.assertEqual(events(self.jsonl(1))[-1]["event"], "end")
        self.assertEqual(len(self.rows()), 2)
        # A text log without its JSON-lines log (a directory from before --log-jsonl): run again.
        os.remove(self.jsonl(0))
        rc, out, err = grid(self.out, more=("--no-png",))
        self.assertEqual(rc, 0, err)
        self.assertIn(f"[1/2] {self.names[0]}: running", out)
        self.assertIn(f"[2/2] {self.names[1]}: skip", out)
        self.assertEqual(events(self.jsonl(0))[-1]["event"], "end")

    def test_5_other_command_is_refused(self):
        self.assertEqual(self.rc, 0, self.stderr)
        extra = [("4" if a == str(ITERS) else a) for a in EXTRA]  # --train-iters 4
        rc, out, err = grid(self.out, extra=extra)
        self.assertEqual(rc, 2)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertIn("made by another command", err)


class SweepMore(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def test_failed_point(self):
        # MBS 3 does not divide GBS 4: that point fails, the other completes; exit status 1.
        out = os.path.join(self.tmp.name, "f")
        rc, stdout, err = grid(out, recipes=["bf16_mixed"], mbs=(2, 3), more=("--no-png",))
        self.assertEqual(rc, 1, stdout + err)
        self.assertIn("FAILED", err)
        self.assertTrue(os.path.exists(os.path.join(out, f"bf16_mixed_mbs3_seq{SEQ}.failed.log")))
        self.assertFalse(os.path.exists(os.path.join(out, f"bf16_mixed_mbs3_seq{SEQ}.log")))
        # It failed before its first iteration: no JSON-lines log at all, and no partial left.
        self.assertEqual(sorted(f for f in os.listdir(out) if "mbs3" in f), [f"bf16_mixed_mbs3_seq{SEQ}.failed.log"])
        with open(os.path.join(out, "sweep.csv"), newline="") as fh:
            rows = list(csv.DictReader(fh))
        self.assertEqual([r["mbs"] for r in rows], ["2"])

    def test_exit_0_without_end_event_is_a_failed_point(self):
        # A binary that exits 0 but whose JSON-lines log has no "end" event (its last line dropped by a
        # wrapper): not complete, kept as .failed.log / .failed.jsonl, and rerun by the next sweep.
        wrapper = os.path.join(self.tmp.name, "pretrain_llama_no_end")
        with open(wrapper, "w") as fh:
            fh.write(f"""#!/usr/bin/env bash
"{app()}" "$@"; rc=$?
for ((i = 1; i < $#; i++)); do [[ ${{!i}} == --log-jsonl ]] && {{ j=$((i + 1)); sed -i '$d' "${{!j}}"; }}; done
exit $rc
""")
        os.chmod(wrapper, 0o755)
        out = os.path.join(self.tmp.name, "e")
        args = ["--recipes", "bf16_mixed", "--mbs", str(MBS), "--seq", str(SEQ), "--out", out, "--no-png"]
        rc, stdout, err = sweep(*args, "--bin", wrapper, "--", *EXTRA)
        self.assertEqual(rc, 1, stdout + err)
        name = f"bf16_mixed_mbs{MBS}_seq{SEQ}"
        self.assertIn(f"{name}: FAILED (exit status 0; ", err)
        self.assertIn("incomplete: no \"end\" event", err)
        self.assertEqual(sorted(os.listdir(out)), [f"{name}.failed.jsonl", f"{name}.failed.log"])
        self.assertIn("error: no point completed", err)
        rc, stdout, err = sweep(*args, "--bin", app(), "--", *EXTRA)
        self.assertEqual(rc, 0, stdout + err)
        self.assertIn(f"[1/1] {name}: running", stdout)
        self.assertTrue(os.path.exists(os.path.join(out, f"{name}.jsonl")))

    def test_seeds(self):
        out = os.path.join(self.tmp.name, "s")
        rc, stdout, err = grid(out, recipes=["bf16_mixed"], more=("--no-png", "--seeds", "7,8"))
        self.assertEqual(rc, 0, err)
        with open(os.path.join(out, "sweep.csv"), newline="") as fh:
            rows = list(csv.DictReader(fh))
        self.assertEqual([r["seed"] for r in rows], ["7", "8"])
        losses = []
        for s in (7, 8):
            text = read(os.path.join(out, f"bf16_mixed_mbs{MBS}_seq{SEQ}_seed{s}.log"))
            self.assertIn(f"seed {s},", text)  # the 'training:' banner
            losses.append(hand_parse(os.path.join(out, f"bf16_mixed_mbs{MBS}_seq{SEQ}_seed{s}.log"))[2])
        self.assertNotEqual(losses[0], losses[1])

    def test_vary(self):
        # Two --vary axes: 2 x 2 points, the last axis fastest, each log named and each CSV row filled by them.
        out = os.path.join(self.tmp.name, "v")
        extra = EXTRA + ["--warmup-iters", "0", "--lr-wsd-decay-iters", "1"]
        rc, stdout, err = grid(out, recipes=["bf16_mixed"], extra=extra,
                               more=("--no-png", "--vary", "--weight-decay=0.033,0.1",
                                     "--vary", "--lr-decay-style=cosine,WSD"))
        self.assertEqual(rc, 0, stdout + err)
        points = [("0.033", "cosine"), ("0.033", "WSD"), ("0.1", "cosine"), ("0.1", "WSD")]
        names = [f"bf16_mixed_mbs{MBS}_seq{SEQ}_weight-decay-{wd}_lr-decay-style-{style}" for wd, style in points]
        self.assertEqual(sorted(f for f in os.listdir(out) if f.endswith(".log")), sorted(n + ".log" for n in names))
        with open(os.path.join(out, "sweep.csv"), newline="") as fh:
            rows = list(csv.DictReader(fh))
        self.assertEqual([(r["weight_decay"], r["lr_decay_style"]) for r in rows], points)
        self.assertEqual([r["log"] for r in rows], [n + ".jsonl" for n in names])
        lrs = []
        for (wd, style), name in zip(points, names):
            text = read(os.path.join(out, name + ".log"))
            self.assertIn(f"--weight-decay {wd} --lr-decay-style {style} --model llama_tiny", text.splitlines()[0])
            self.assertIn(f"weight decay {wd} (", text)  # the banner: the point ran with its values
            self.assertIn(f"lr schedule: 0.0003 -> 3e-05, {style}, ", text)
            lrs.append(re.findall(r"iteration +1/ +\d+ \|.*learning rate: (\S+) \|", text))
        self.assertEqual(lrs[0], lrs[2])
        self.assertNotEqual(lrs[0], lrs[1])  # WSD holds the peak where cosine decays

    def test_interrupt(self):
        out = os.path.join(self.tmp.name, "i")
        extra = [("100000" if a == str(ITERS) else a) for a in EXTRA]
        p = subprocess.Popen(["bash", SWEEP, "--recipes", "bf16_mixed", "--mbs", str(MBS), "--seq", str(SEQ), "--out", out,
                              "--bin", app(), "--no-png", "--", *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
        partial = os.path.join(out, f".bf16_mixed_mbs{MBS}_seq{SEQ}.log.partial")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(partial) and "iteration        2/" in read(partial)):
            time.sleep(0.2)
        self.assertTrue(os.path.exists(partial), "the run did not start")
        p.send_signal(signal.SIGINT)
        stdout, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, stdout + err)
        self.assertIn("interrupted", err)
        self.assertEqual(os.listdir(out), [])  # neither a final log nor the partial one
        # No pretrain_llama left running with this sweep's output.
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = read(f"/proc/{pid}/cmdline")
            except OSError:
                continue
            self.assertFalse("pretrain_llama" in cmdline and "100000" in cmdline and out in cmdline, cmdline)

    def test_bad_arguments(self):
        out = os.path.join(self.tmp.name, "b")
        cases = [
            ((), "--recipes is required"),
            (("--recipes", "bf16_mixed", "--seq", "32", "--out", out), "--mbs is required"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--out", out), "--seq is required"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32"), "--out DIR is required"),
            (("--recipes", "no_such_recipe", "--mbs", "1", "--seq", "32", "--out", out), "no recipe 'no_such_recipe'"),
            (("--recipes", "bf16_mixed", "--mbs", "1,x", "--seq", "32", "--out", out), "'x' is not"),
            (("--recipes", "bf16_mixed", "--mbs", "0", "--seq", "32", "--out", out), "must be positive"),
            (("--recipes", "bf16_mixed", "--mbs", "1,", "--seq", "32", "--out", out), "empty item"),
            (("--recipes", "bf16_mixed,bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out), "given twice"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--frobnicate"), "unknown argument"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--", "--seq-length", "64"),
             "give sequence lengths with --seq"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--", "--disable-fp4"),
             "give the recipes with --recipes"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--seeds", "1", "--", "--seed", "3"),
             "give the seeds with --seeds"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--bin", "/no/such/binary"),
             "/no/such/binary"),
            (("--recipes",), "--recipes needs a value"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "weight-decay=1"),
             "--vary needs --FLAG=V1,V2"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--seed=1,2"),
             "the grid sets --seed"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--lr=1,2",
              "--vary", "--lr=3"), "--vary --lr given twice"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--lr=1,1"), "given twice"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--lr=a/b"),
             "cannot name a log"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--lr=1,2", "--",
              "--lr", "3"), "also varied by --vary --lr"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--", "--log-jsonl", "x.jsonl"),
             "the sweep writes each point's JSON-lines log itself"),
            (("--recipes", "bf16_mixed", "--mbs", "1", "--seq", "32", "--out", out, "--vary", "--log-jsonl=a,b"),
             "the sweep writes each point's JSON-lines log itself"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                if "--bin" not in args and len(args) >= 2:
                    args = (*args[:2], "--bin", app(), *args[2:])
                rc, stdout, err = sweep(*args)
                self.assertEqual(rc, 2, err)
                self.assertEqual(stdout, "")
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertTrue(err.startswith("sweep.sh: error: "), err)
                self.assertIn(message, err)
        self.assertFalse(os.path.exists(out))


if __name__ == "__main__":
    unittest.main(verbosity=2)
