#!/usr/bin/env python3
"""ctest TensorBoard.events: pretrain_llama --tensorboard-dir on short CPU runs of llama_tiny, read back by
TensorBoard's own reader (the PyPI tensorboard package's EventFileLoader, which checks every record's CRCs).

Checks (issue 27's tests): the scalars in the file are the ones the log printed, at the same steps (lm loss,
learning rate, grad norm, loss scale, batch size, iteration time, TFLOP/s, tokens/s, the timers, memory,
validation loss and PPL, and the "vs samples" variants at the consumed samples); a resumed run (--load)
adds a second events file to the directory; a directory that cannot be created is a one-line error before
any model is built. Plain unittest; no GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH. Needs the tensorboard module (scripts/setup.sh).
"""

import math
import os
import re
import subprocess
import sys
import tempfile
import unittest

GBS, MBS, SEQ = 4, 2, 32
COMMON = ["--model", "llama_tiny", "--device", "cpu", "--threads", "2", "--global-batch-size", str(GBS),
          "--micro-batch-size", str(MBS), "--seq-length", str(SEQ), "--train-iters", "6", "--eval-interval", "2",
          "--eval-iters", "1", "--timing-log-level", "1", "--log-timers-to-tensorboard",
          "--log-memory-to-tensorboard", "--log-validation-ppl-to-tensorboard"]

ITERATION = re.compile(r"iteration\s+(\d+)/\s*\d+ \| consumed samples:\s+(\d+) \| elapsed time per iteration \(ms\): "
                       r"([0-9.]+) \| learning rate: (\S+) \| global batch size:\s+(\d+) \| lm loss: (\S+) \| "
                       r"loss scale: (\S+) \| grad norm: (\S+) \|")
STEP_TIME = re.compile(r"^Step Time : ([0-9.]+)s GPU utilization: ([0-9.]+)MODEL_TFLOP/s/GPU$")
TIMER = re.compile(r"^\s+(\S+) \.+: \(([0-9.]+), ([0-9.]+)\)$")
MEMORY = re.compile(r"\(after (\d+) iterations\) memory \(GB\) \| mem-allocated-gigabytes: (\S+) \|.*"
                    r"mem-reserved-gigabytes: (\S+) \| mem-max-allocated-gigabytes: (\S+) \|.*"
                    r"mem-allocated-count: (\d+)")
VALIDATION = re.compile(r"validation loss at iteration (\d+)( on validation set| on test set)? \| "
                        r"lm loss value: (\S+) \| lm loss PPL: (\S+) \|")
WRITING = re.compile(r"tensorboard: writing (\S+) ")


def have_tensorboard():
    try:
        from tensorboard.backend.event_processing import event_file_loader  # noqa: F401
        return True
    except ImportError:
        return False


def run_app(args, check=True):
    p = subprocess.run([os.environ["PL_APP_PATH"], *args], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OMP_WAIT_POLICY="PASSIVE"))
    if check and p.returncode != 0:
        raise AssertionError(f"pretrain_llama {' '.join(args)} failed ({p.returncode}):\n{p.stderr}\n{p.stdout[-3000:]}")
    return p


def parse_log(stdout):
    """What the log printed: {iteration: fields}, the validation lines, the memory line."""
    iters, validations, memory, step_time, current = {}, [], None, None, None
    for line in stdout.splitlines():
        if m := STEP_TIME.match(line):
            step_time = (float(m.group(1)), float(m.group(2)))
        elif m := ITERATION.search(line):
            current = int(m.group(1))
            iters[current] = {"consumed": int(m.group(2)), "ms": float(m.group(3)), "lr": float(m.group(4)),
                              "gbs": int(m.group(5)), "loss": float(m.group(6)), "scale": float(m.group(7)),
                              "grad": float(m.group(8)), "step_time": step_time, "timers": {}}
        elif (m := TIMER.match(line)) and current is not None:
            iters[current]["timers"][m.group(1)] = float(m.group(3))
        elif m := MEMORY.search(line):
            memory = (int(m.group(1)), [float(m.group(k)) for k in (2, 3, 4)], int(m.group(5)))
        elif m := VALIDATION.search(line):
            validations.append((int(m.group(1)), m.group(2) or "", float(m.group(3)), float(m.group(4))))
    return iters, validations, memory


def read_scalars(path):
    """{tag: [(step, value), ...]} in file order, by TensorBoard's reader (which checks every CRC)."""
    from tensorboard.backend.event_processing import event_file_loader
    from tensorboard.util import tensor_util
    out, versions = {}, []
    for event in event_file_loader.EventFileLoader(path).Load():
        if event.HasField("file_version"):
            versions.append(event.file_version)
        for v in event.summary.value:
            # (the loader turns simple_value into a scalar tensor, as TensorBoard's scalars plugin reads it)
            value = v.simple_value if v.HasField("simple_value") else float(tensor_util.make_ndarray(v.tensor))
            out.setdefault(v.tag, []).append((event.step, value))
    return out, versions


class TensorBoardRuns(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not have_tensorboard():
            raise RuntimeError(f"{sys.executable} has no tensorboard module: run scripts/setup.sh (it installs the "
                               "PyPI tensorboard package this test reads the event files with)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tb = os.path.join(cls.tmp.name, "tb")
        ck = os.path.join(cls.tmp.name, "ck")
        # Iterations 1-3 (stopped and saved by --exit-interval), then 4-6 resumed from the checkpoint.
        cls.first = run_app([*COMMON, "--tensorboard-dir", cls.tb, "--save", ck, "--exit-interval", "3"]).stdout
        cls.second = run_app([*COMMON, "--tensorboard-dir", cls.tb, "--save", ck, "--load", ck]).stdout

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def events_file(self, stdout):
        m = WRITING.search(stdout)
        self.assertIsNotNone(m, "no 'tensorboard: writing FILE' line")
        return m.group(1)

    def assert_close(self, got, printed, abs_tol, what):
        # The log rounds (its digits); the file holds a float32: equal up to the printed rounding.
        self.assertTrue(math.isclose(got, printed, rel_tol=2e-6, abs_tol=abs_tol),
                        f"{what}: TensorBoard has {got!r}, the log printed {printed!r}")

    def check_run(self, stdout, iterations):
        iters, validations, memory = parse_log(stdout)
        self.assertEqual(sorted(iters), iterations)
        scalars, versions = read_scalars(self.events_file(stdout))
        self.assertEqual(versions, ["brain.Event:2"])
        for tag in ("lm loss", "learning-rate", "grad-norm", "loss-scale", "batch-size", "iteration-time",
                    "throughput", "throughput/tokens_per_sec", "forward-backward-time", "optimizer-time"):
            self.assertEqual([s for s, _ in scalars[tag]], iterations, tag)
        for tag, key, abs_tol in (("lm loss", "loss", 0.0), ("learning-rate", "lr", 0.0), ("grad-norm", "grad", 5e-4),
                                  ("loss-scale", "scale", 0.05), ("batch-size", "gbs", 0.0)):
            points = dict(scalars[tag])
            samples = dict(scalars[tag + " vs samples"])
            for it, f in iters.items():
                self.assert_close(points[it], f[key], abs_tol, f"{tag} at iteration {it}")
                self.assertEqual(samples[f["consumed"]], points[it], f"{tag} vs samples at {f['consumed']}")
        for it, f in iters.items():
            seconds = dict(scalars["iteration-time"])[it]
            self.assert_close(seconds * 1e3, f["ms"], 0.05, f"iteration-time at {it}")
            self.assert_close(seconds, f["step_time"][0], 0.005, f"Step Time at {it}")
            self.assert_close(dict(scalars["throughput"])[it], f["step_time"][1], 0.05, f"throughput at {it}")
            self.assert_close(dict(scalars["throughput/tokens_per_sec"])[it], GBS * SEQ / seconds, 0.0,
                              f"tokens/s at {it}")
            for name, ms in f["timers"].items():
                self.assert_close(dict(scalars[name + "-time"])[it] * 1e3, ms, 0.005, f"timer {name} at {it}")
        # The memory line (printed once, GB to 5 significant digits) against the same iteration's bytes.
        mem_it, (allocated, reserved, max_allocated), count = memory
        for tag, gb in (("mem-allocated-bytes", allocated), ("mem-reserved-bytes", reserved),
                        ("mem-max-allocated-bytes", max_allocated)):
            self.assertTrue(math.isclose(dict(scalars[tag])[mem_it] / 1e9, gb, rel_tol=1e-4), tag)
        self.assertEqual(dict(scalars["mem-allocated-count"])[mem_it], count)
        # Every validation line, in order, at its iteration; the test split under a tag of its own.
        for base, kinds in (("lm loss validation", ("", " on validation set")), ("lm loss test", (" on test set",))):
            printed = [(it, loss, ppl) for it, kind, loss, ppl in validations if kind in kinds]
            self.assertEqual([s for s, _ in scalars.get(base, [])], [it for it, _, _ in printed], base)
            points = zip(scalars.get(base, []), scalars.get(base + " ppl", []), printed)
            for (_, loss), (_, ppl), (it, want_loss, want_ppl) in points:
                self.assert_close(loss, want_loss, 0.0, f"{base} at {it}")
                self.assert_close(ppl, want_ppl, 0.0, f"{base} ppl at {it}")
        return validations

    def test_scalars_are_the_logged_values(self):
        validations = self.check_run(self.first, [1, 2, 3])
        self.assertEqual([v[:2] for v in validations], [(2, "")])  # (an --exit-interval stop: no final evaluation)

    def test_resume_appends_a_second_file(self):
        first, second = self.events_file(self.first), self.events_file(self.second)
        self.assertNotEqual(first, second)
        self.assertEqual(sorted(os.listdir(self.tb)), sorted([os.path.basename(first), os.path.basename(second)]))
        # The directory as `tensorboard --logdir` loads it (its server's accumulator): one run, the two files'
        # curves continued.
        from tensorboard.backend.event_processing import plugin_event_accumulator
        acc = plugin_event_accumulator.EventAccumulator(self.tb)
        acc.Reload()
        self.assertEqual([t.step for t in acc.Tensors("lm loss")], [1, 2, 3, 4, 5, 6])
        self.assertEqual([t.step for t in acc.Tensors("learning-rate")], [1, 2, 3, 4, 5, 6])
        validations = self.check_run(self.second, [4, 5, 6])
        self.assertEqual([v[:2] for v in validations],
                         [(4, ""), (6, ""), (6, " on validation set"), (6, " on test set")])

    def test_a_run_that_fails_still_writes_what_it_queued(self):
        # An LR this large overflows the weights at the first step: iteration 2's gradient norm is not finite
        # and --max-nan-iterations 1 ends the run with an error. With --log-interval 4 no log interval flushed
        # the file before: iterations 1 and 2 are in it only if the writer is closed on the error path.
        tb = os.path.join(self.tmp.name, "tb_error")
        p = run_app([*COMMON[:COMMON.index("--train-iters")], "--train-iters", "8", "--log-interval", "4",
                     "--lr", "1e30", "--min-lr", "1e29", "--warmup-iters", "0", "--max-nan-iterations", "1",
                     "--no-log-loss-scale-to-tensorboard", "--log-world-size-to-tensorboard",
                     "--tensorboard-dir", tb], check=False)
        self.assertEqual(p.returncode, 1, p.stderr)
        self.assertIn("consecutive iterations had a non-finite loss", p.stderr)
        scalars, _ = read_scalars(self.events_file(p.stdout))
        self.assertEqual([s for s, _ in scalars["learning-rate"]], [1, 2])
        self.assertEqual([s for s, _ in scalars["grad-norm"]], [1])  # (none for the skipped step, as Megatron)
        self.assertNotIn("loss-scale", scalars)
        self.assertEqual(scalars["world-size"], [(1, 1.0), (2, 1.0)])

    def test_flag_errors_are_one_line_naming_the_flag(self):
        for extra, flag in ((["--log-memory-to-tensorboard"], "--log-memory-to-tensorboard needs --tensorboard-dir"),
                            (["--tensorboard-dir", self.tb, "--tensorboard-log-interval", "0"],
                             "--tensorboard-log-interval must be >= 1")):
            p = run_app([*COMMON[:COMMON.index("--timing-log-level")], *extra], check=False)
            self.assertEqual(p.returncode, 1, p.stderr)
            self.assertEqual(len(p.stderr.strip().splitlines()), 1, p.stderr)
            self.assertIn(flag, p.stderr)

    def test_directory_that_cannot_be_made_is_one_line_at_start_up(self):
        blocker = os.path.join(self.tmp.name, "a_file")
        with open(blocker, "w") as fh:
            fh.write("x")
        p = run_app([*COMMON, "--tensorboard-dir", os.path.join(blocker, "tb")], check=False)
        self.assertNotEqual(p.returncode, 0)
        lines = p.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, p.stderr)
        self.assertIn(f"--tensorboard-dir {blocker}/tb: cannot create the directory", lines[0])
        self.assertNotIn("iteration", p.stdout)  # refused before any model was built
        self.assertNotIn("parameters", p.stdout)


if __name__ == "__main__":
    unittest.main()
