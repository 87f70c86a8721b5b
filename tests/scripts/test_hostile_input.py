#!/usr/bin/env python3
"""ctest Scripts.hostile_input (issue 38): the Python scripts on hostile input, through their one boundary
(scripts/script_errors.py). Each case below hung, printed a traceback or a wrong number before:
  * a FIFO (or a directory) where an input file should be -- inside a TensorBoard directory, as a
    --roofline report, as a sweep.csv -- is refused with one line naming its type, never a hang;
  * malformed TensorBoard records with valid CRCs, zero step times, huge JSON integers, deeply nested JSON,
    Ctrl-C and a closed stdout: one line (or none, for the pipe) and the scripts' exit statuses, no
    traceback;
  * every size or count option refuses 0 and negatives with one line naming the option;
  * a TensorBoard file whose last record was cut short (a full disk) is read up to it, as TensorBoard's
    own reader reads it, with one warning line; damage in the middle is still an error;
  * run by a python3 without numpy (a venv's), the scripts that need numpy / matplotlib re-run under
    Debian's /usr/bin/python3 when that one has them.
Plain unittest; no binary, no GPU. Tests that need numpy / matplotlib / torch somewhere skip saying so.
"""

import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.normpath(os.path.join(HERE, "..", "..", "scripts"))
sys.path.insert(0, SCRIPTS)
import script_errors  # noqa: E402


def script(name):
    return os.path.join(SCRIPTS, name)


def run(name, *args, python=(sys.executable,), env=None, stdout=subprocess.PIPE):
    """(rc, stdout, stderr) of scripts/NAME ARGS; the timeout turns a hang into a test error."""
    p = subprocess.run([*python, script(name), *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                       timeout=120, env=env, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout or "", p.stderr


def has_modules(python, *names):
    return subprocess.run([*python, "-c", "import " + ", ".join(names)], capture_output=True).returncode == 0


SYSTEM = script_errors.SYSTEM_PYTHON


def system_has(*names):
    return os.access(SYSTEM, os.X_OK) and has_modules((SYSTEM,), *names)


# What the scripts can use: this python3's modules, or /usr/bin/python3's (they re-run there).
HAS_NUMPY = has_modules((sys.executable,), "numpy") or system_has("numpy")
HAS_PLOTTING = has_modules((sys.executable,), "numpy", "matplotlib") or system_has("numpy", "matplotlib")
NO_NUMPY = f"neither {sys.executable} nor {SYSTEM} has numpy (scripts/setup.sh installs python3-numpy)"


# ---- files written here ---------------------------------------------------------------------------------

def crc32c(data):
    """CRC-32C (Castagnoli), bit by bit: written here apart from log_formats.py's table-driven one."""
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(payload):
    """One TFRecord: length, its masked CRC-32C, the data, its masked CRC-32C."""
    header = struct.pack("<Q", len(payload))
    return header + struct.pack("<I", masked(header)) + payload + struct.pack("<I", masked(payload))


def varint(n):
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def field(num, wire, body):
    """A protobuf field: key, then the body (a length-delimited body gets its length here)."""
    return varint(num << 3 | wire) + (varint(len(body)) + body if wire == 2 else body)


def scalar(tag, value):
    return field(1, 2, field(1, 2, tag.encode()) + field(2, 5, struct.pack("<f", value)))


def event(step, scalars):
    """An Event proto: wall_time, step, a Summary of simple_value scalars."""
    summary = b"".join(scalar(tag, value) for tag, value in scalars)
    return field(1, 1, struct.pack("<d", 1.7e9 + step)) + field(2, 0, varint(step)) + field(5, 2, summary)


def step_event(step):
    """What lib/log/tensorboard.cpp writes per iteration (the tags compare_logs.py reads)."""
    return event(step, [("iteration-time", 0.5), ("lm loss", 10.0 - step), ("batch-size", 8.0),
                        ("throughput/tokens_per_sec", 8 * 128 / 0.5)])


VERSION_EVENT = field(1, 1, struct.pack("<d", 1.7e9)) + field(3, 2, b"brain.Event:2")


def events_file(directory, payloads, name="events.out.tfevents.1.host"):
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, name)
    with open(path, "wb") as fh:
        fh.write(b"".join(tfrecord(p) for p in payloads))
    return path


def text_log(path, ms_values, seq=128, gbs=8):
    """pretrain_llama's text log (apps/pretrain_llama/banner.cpp's lines): a banner with the sequence length,
    one iteration line per step time."""
    n = len(ms_values)
    lines = [f"pretrain_llama | training: {n} iterations, global batch {gbs} = 4 micro-batches x 2 samples x {seq} "
             f"tokens, lr 0.0003 -> 3e-05 (cosine, warmup 2), seed 1234, log interval 1"]
    for i, ms in enumerate(ms_values, 1):
        lines.append(f" [2026-01-01 00:00:00] iteration {i:8d}/{n:8d} | consumed samples: {gbs * i:12d} | elapsed "
                     f"time per iteration (ms): {ms:.1f} | learning rate: 3.000000E-04 | global batch size: "
                     f"{gbs:5d} | lm loss: {5.0 - 0.1 * i:.6E} | loss scale: 1.0 | number of skipped iterations:   "
                     f"0 | number of nan iterations:   0 |")
    with open(path, "w") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def roofline_report(path, tflops=0.5):
    """A --roofline report with the fields roofline_plot.py reads (lib/roofline/report.h's schema)."""
    row = {"op": "linear fc1 fprop", "kind": "gemm", "linear": "fc1", "pass": "fprop", "format": "bf16",
           "ms_per_iter": 10.0, "gflop_per_iter": 5.0, "gb_per_iter": 0.01, "ms_at_ceiling": 4.0,
           "achieved_tflops": tflops}
    doc = {"machine": {"name": "Test CPU", "device": "cpu"}, "step_ms": 12.0, "sol_ms": 4.0,
           "ceilings": {"gemm": [{"format": "bf16", "tflops": 1.2}], "memory": [{"level": "DRAM", "gbps": 20.0}]},
           "rows": [row], "label": os.path.splitext(os.path.basename(path))[0], "recipe": "bf16_mixed"}
    with open(path, "w") as fh:
        json.dump(doc, fh)
    return path


class TempDir(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, *parts):
        return os.path.join(self.dir, *parts)

    def assert_one_line(self, result, status, *parts, prog=None):
        rc, out, err = result
        self.assertEqual(rc, status, err)
        self.assertNotIn("Traceback", err)
        self.assertEqual(len(err.splitlines()), 1, err)
        if prog:
            self.assertTrue(err.startswith(prog + ": "), err)
        for part in parts:
            self.assertIn(part, err)
        return out

    def tensorboard_dir(self, steps=5):
        tb = self.path("tb")
        events_file(tb, [VERSION_EVENT] + [step_event(s) for s in range(1, steps + 1)])
        return tb


# ---- 1. non-regular files -------------------------------------------------------------------------------

@unittest.skipUnless(HAS_NUMPY, NO_NUMPY)
class NonRegularFiles(TempDir):
    def test_fifo_in_a_tensorboard_directory_is_refused_not_waited_on(self):
        tb = self.tensorboard_dir()
        fifo = self.path("tb", "events.out.tfevents.2.fifo")
        os.mkfifo(fifo)
        self.assert_one_line(run("compare_logs.py", tb, "--csv", self.path("x.csv")), 1,
                             f"{fifo}: is a FIFO, not a regular file", prog="compare_logs.py")

    def test_directory_named_like_an_events_file_is_refused(self):
        tb = self.tensorboard_dir()
        os.mkdir(self.path("tb", "events.out.tfevents.3.dir"))
        self.assert_one_line(run("compare_logs.py", tb, "--csv", self.path("x.csv")), 1,
                             f"{self.path('tb', 'events.out.tfevents.3.dir')}: is a directory, not a regular file")

    def test_fifo_as_a_roofline_report(self):
        fifo = self.path("report.json")
        os.mkfifo(fifo)
        self.assert_one_line(run("roofline_plot.py", fifo, "--png", self.path("r.png")), 2,
                             f"{fifo}: is a FIFO", prog="roofline_plot.py")

    @unittest.skipUnless(HAS_PLOTTING, "study_report.py needs numpy and matplotlib")
    def test_fifo_as_a_sweep_csv(self):
        os.mkfifo(self.path("sweep.csv"))
        result = run("study_report.py", self.dir, "--seeds", "1", "--out-doc", self.path("doc"), "--command", "c",
                     "--run-command", "r", "--commit", "x", "--machine", "m", "--device", "cpu", "--model", "t",
                     "--out", self.dir)
        self.assert_one_line(result, 1, f"{self.path('sweep.csv')}: is a FIFO", prog="study_report.py")


# ---- 2. one line, never a traceback ---------------------------------------------------------------------

@unittest.skipUnless(HAS_NUMPY, NO_NUMPY)
class MalformedTensorBoardRecords(TempDir):
    """Records whose CRCs are right but whose data is not an Event proto this reader can use."""

    CASES = {
        "a truncated varint": field(2, 0, b"\x80"),  # a step whose varint never ends
        "an unknown wire type": varint(2 << 3 | 7) + b"\x01",
        "a group (wire type 3)": varint(9 << 3 | 3),
        "a wrong-sized float": field(5, 2, field(1, 2, field(1, 2, b"lm loss") + field(2, 1, b"\0" * 8))),
        "a fixed64 step": field(2, 1, struct.pack("<q", 7)),
        "a length past the end": varint(5 << 3 | 2) + varint(100) + b"\x0a",
        "a summary that is a varint": field(5, 0, varint(3)),
    }

    def test_each_is_one_line_naming_the_file_and_record(self):
        for what, payload in self.CASES.items():
            with self.subTest(what):
                tb = self.path(what.replace(" ", "_"))
                path = events_file(tb, [VERSION_EVENT, step_event(1), payload])
                offset = len(tfrecord(VERSION_EVENT)) + len(tfrecord(step_event(1)))
                self.assert_one_line(run("compare_logs.py", tb, "--csv", self.path("x.csv")), 1,
                                     f"{path}: the record at byte {offset} is not a valid Event proto",
                                     prog="compare_logs.py")


@unittest.skipUnless(HAS_NUMPY, NO_NUMPY)
class CompareLogsNumbers(TempDir):
    def test_size_options_refuse_zero_and_negatives(self):
        a, b = text_log(self.path("a.log"), [100.0] * 5), text_log(self.path("b.log"), [90.0] * 5)
        for option, value in (("--gpus", "0"), ("--seq-length", "-5"), ("--gpus", "x"), ("--seq-length", "1.5")):
            with self.subTest(option=option, value=value):
                self.assert_one_line(run("compare_logs.py", a, b, option, value), 2, f"argument {option}: must be a "
                                     f"positive integer, not '{value}'", prog="compare_logs.py")
        # A per-file size by the same rule; '²' passes str.isdigit() but not int().
        self.assert_one_line(run("compare_logs.py", a, b + ":seq=\u00b2"), 1, "seq must be a positive integer")

    def test_step_times_that_round_to_zero_leave_the_throughput_unavailable(self):
        a, b = text_log(self.path("a.log"), [0.0] * 5), text_log(self.path("b.log"), [0.04] * 5)
        rc, out, err = run("compare_logs.py", a, b, "--csv", self.path("z.csv"))
        self.assertEqual((rc, err), (0, ""))
        rows = {line.split()[0]: line.split() for line in out.splitlines()[2:]}
        # step ms, TFLOP/s/GPU, tok/s/GPU, seq, speed-up, final loss
        self.assertEqual(rows["a.log"][3:9], ["0.0", "-", "-", "log", "-", "4.5000"], out)
        self.assertEqual(rows["b.log"][3:9], ["0.0", "-", "-", "log", "-", "4.5000"], out)

    def test_logs_without_common_iterations(self):
        a = text_log(self.path("a.log"), [100.0] * 3)
        with open(a) as fh, open(self.path("late.log"), "w") as out:
            out.write(fh.read().replace("iteration        ", "iteration       1"))  # iterations 11-13
        self.assert_one_line(run("compare_logs.py", self.path("late.log"), a), 1, "no iterations in common")

    def test_json_integer_too_large_for_a_double(self):
        lines = [{"event": "start", "schema_version": 1, "training": {"seq_length": 128}, "world_size": 1}] + [
            {"event": "iteration", "iteration": i, "elapsed_ms": 10 ** 400 if i == 2 else 50.0, "lm_loss": 3.0,
             "global_batch_size": 8, "tflops": 0.1} for i in (1, 2, 3)]
        path = self.path("big.jsonl")
        with open(path, "w") as fh:
            fh.write("".join(json.dumps(e) + "\n" for e in lines))
        rc, out, err = run("compare_logs.py", path, "--csv", self.path("big.csv"))
        self.assertEqual((rc, err), (0, ""))  # (an unknown step time, as null is)

    def test_closed_stdout_is_quiet(self):
        a, b = text_log(self.path("a.log"), [100.0] * 5), text_log(self.path("b.log"), [90.0] * 5)
        for name, args in (("compare_logs.py", (a, b)), ("jsonl_log.py", ("--help",))):
            with self.subTest(name):
                read_end, write_end = os.pipe()
                os.close(read_end)  # `| head` that has already gone: every write is EPIPE
                try:
                    rc, _, err = run(name, *args, stdout=write_end)
                finally:
                    os.close(write_end)
                self.assertEqual((rc, err), (script_errors.BROKEN_PIPE_STATUS, ""))


class JsonOutput(TempDir):
    def test_lone_surrogate_in_a_json_string_prints(self):
        path = self.path("s.jsonl")
        with open(path, "w") as fh:
            fh.write('{"event": "start", "schema_version": 1, "model": {"name": "\\ud800x"}}\n')
        self.assertEqual(run("jsonl_log.py", path, "start", "model.name"), (0, "\\ud800x\n", ""))


class OptionsOfOtherScripts(TempDir):
    def test_bench_torch_counts(self):
        for option in ("--gbs", "--mbs", "--seq", "--iters", "--threads"):
            with self.subTest(option):
                self.assert_one_line(run("bench_torch.py", "--mode", "fp32_eager", option, "0"), 2,
                                     f"argument {option}: must be a positive integer", prog="bench_torch.py")

    def test_roofline_deep_json_and_huge_numbers(self):
        deep = self.path("deep.json")
        with open(deep, "w") as fh:
            fh.write("[" * 100000 + "]" * 100000)
        self.assert_one_line(run("roofline_plot.py", deep, "--png", self.path("d.png")), 2, deep)
        if not HAS_PLOTTING:
            self.skipTest("the huge-number case draws: needs numpy and matplotlib")
        huge = roofline_report(self.path("huge.json"), tflops=1e308)
        self.assert_one_line(run("roofline_plot.py", huge, "--png", self.path("h.png")), 2, huge, "log axis")
        big_int = roofline_report(self.path("int.json"), tflops=10 ** 400)  # (float() of it: OverflowError)
        self.assert_one_line(run("roofline_plot.py", big_int, "--png", self.path("i.png")), 2,
                             "rows[0].achieved_tflops is not a finite number")
        with open(big_int) as fh:
            doc = json.load(fh)
        doc["rows"] = [dict(doc["rows"][0], ms_per_iter=1e308, achieved_tflops=0.5)] * 2  # one group: sum inf
        with open(big_int, "w") as fh:
            json.dump(doc, fh)
        self.assert_one_line(run("roofline_plot.py", big_int, "--png", self.path("i.png")), 2, "not finite")

    @unittest.skipUnless(HAS_PLOTTING, "study_report.py needs numpy and matplotlib")
    def test_study_report_bad_csv_cell(self):
        with open(self.path("sweep.csv"), "w") as fh:
            fh.write("recipe,path,iterations,tail_iterations,tail_loss,val_loss,step_ms,nonfinite\n"
                     "bf16_mixed,a.jsonl,30,3,abc,4.0,50.0,0\n")
        result = run("study_report.py", self.dir, "--seeds", "1", "--out-doc", self.path("doc"), "--command", "c",
                     "--run-command", "r", "--commit", "x", "--machine", "m", "--device", "cpu", "--model", "t",
                     "--out", self.dir)
        self.assert_one_line(result, 1, f"{self.path('sweep.csv')}:2: tail_loss: not a number: 'abc'")


# Runs a script as `python3 SCRIPT ARGS` does, but sends this process SIGINT (a real Ctrl-C) as the script's
# entry function (argv[1]) is called: the KeyboardInterrupt is raised inside it, every time.
INTERRUPT_IN = r"""
import os, runpy, signal, sys
entry, path = sys.argv[1], os.path.realpath(sys.argv[2])
sys.argv = sys.argv[2:]
def hook(frame, event, arg):
    if event == "call" and frame.f_code.co_name == entry and os.path.realpath(frame.f_code.co_filename) == path:
        sys.setprofile(None)
        os.kill(os.getpid(), signal.SIGINT)
sys.setprofile(hook)
runpy.run_path(path, run_name="__main__")
"""


class CtrlC(TempDir):
    def interrupt(self, name, *args, entry="main"):
        p = subprocess.run([sys.executable, "-c", INTERRUPT_IN, entry, script(name), *args], capture_output=True,
                           text=True, timeout=120)
        return p.returncode, p.stdout, p.stderr

    def test_each_script_says_interrupted_and_exits_130(self):
        log = text_log(self.path("a.log"), [100.0] * 5)
        cases = [("compare_logs.py", (log, log), "main"), ("jsonl_log.py", ("--complete", log), "main"),
                 ("roofline_plot.py", (roofline_report(self.path("r.json")), "--png", self.path("r.png")), "main"),
                 ("mock_data_golden.py", (), "main"),
                 ("bench_torch.py", ("--mode", "fp32_eager"), "main")]
        if HAS_PLOTTING:
            cases.append(("study_report.py", (self.dir, "--seeds", "1", "--out-doc", "d", "--command", "c",
                                              "--run-command", "r", "--commit", "x", "--machine", "m", "--device",
                                              "cpu", "--model", "t", "--out", self.dir), "main"))
        for name, args, entry in cases:
            with self.subTest(name):
                rc, out, err = self.interrupt(name, *args, entry=entry)
                self.assertEqual((rc, err), (script_errors.INTERRUPTED_STATUS, f"{name}: interrupted\n"))


# ---- 4. a torn last record ------------------------------------------------------------------------------

def tensorboard_steps(path):
    """The steps of the events with summaries, by TensorBoard's own reader (None without the package)."""
    try:
        from tensorboard.backend.event_processing import event_file_loader
    except ImportError:
        return None
    return [e.step for e in event_file_loader.EventFileLoader(path).Load() if e.summary.value]


@unittest.skipUnless(HAS_NUMPY, NO_NUMPY)
class TornRecords(TempDir):
    def write_cut(self, name, keep):
        """An events file of steps 1-5 whose last record keeps only `keep(length of its data)` bytes."""
        whole = [tfrecord(VERSION_EVENT)] + [tfrecord(step_event(s)) for s in range(1, 6)]
        last_at = sum(len(r) for r in whole[:-1])
        tb = self.path(name)
        os.makedirs(tb)
        path = os.path.join(tb, "events.out.tfevents.1.host")
        with open(path, "wb") as fh:
            fh.write(b"".join(whole[:-1]) + whole[-1][:keep(len(step_event(5)))])
        return tb, path, last_at

    def test_torn_last_record_is_read_up_to_it_with_one_warning(self):
        cuts = {"length": lambda n: 5, "length_crc": lambda n: 10, "data": lambda n: 12 + n // 2,
                "data_crc": lambda n: 12 + n + 2}
        for name, keep in cuts.items():
            with self.subTest(name):
                tb, path, last_at = self.write_cut(name, keep)
                rc, out, err = run("compare_logs.py", tb, "--csv", self.path(name + ".csv"))
                self.assertEqual(rc, 0, err)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertTrue(err.startswith(f"compare_logs.py: warning: {path}: ends in a torn record at byte "
                                               f"{last_at} ({keep(len(step_event(5)))} "), err)
                self.assertIn("the records before it are read, as TensorBoard reads them", err)
                with open(self.path(name + ".csv")) as fh:
                    row = fh.read().splitlines()[1].split(",")
                self.assertEqual(row[2:5], ["4", "2", "4"])  # iterations 1-4 compared, window 2-4
                steps = tensorboard_steps(path)
                if steps is not None:  # what TensorBoard itself reads of the same file
                    self.assertEqual(steps, [1, 2, 3, 4])

    def test_damage_in_the_middle_is_an_error(self):
        records = [tfrecord(VERSION_EVENT)] + [tfrecord(step_event(s)) for s in range(1, 6)]
        at = sum(len(r) for r in records[:2])
        damaged = bytearray(b"".join(records))
        damaged[at + 20] ^= 0xFF  # inside step 2's data: its data CRC no longer matches; steps 3-5 follow
        tb = self.path("damaged")
        os.makedirs(tb)
        with open(os.path.join(tb, "events.out.tfevents.1.host"), "wb") as fh:
            fh.write(damaged)
        self.assert_one_line(run("compare_logs.py", tb, "--csv", self.path("d.csv")), 1,
                             f"the data CRC of the record at byte {at} does not match")


# ---- 5. the python3 that has numpy ----------------------------------------------------------------------

@unittest.skipUnless(system_has("numpy", "matplotlib"), f"{SYSTEM} has no numpy and matplotlib: nothing to re-run on")
class SystemPython(TempDir):
    """A venv's python3 (no numpy: a venv does not see Debian's dist-packages) first on PATH."""

    @classmethod
    def setUpClass(cls):
        cls.venv_dir = tempfile.mkdtemp()
        p = subprocess.run([SYSTEM, "-m", "venv", "--without-pip", cls.venv_dir], capture_output=True, text=True)
        python = os.path.join(cls.venv_dir, "bin", "python3")
        if p.returncode != 0 or has_modules((python,), "numpy"):
            # (no venv module: Debian's python3 without site-packages lacks numpy the same way)
            cls.python = (SYSTEM, "-S")
        else:
            cls.python = (python,)
        if has_modules(cls.python, "numpy"):
            raise unittest.SkipTest(f"{' '.join(cls.python)} has numpy: no python3 without it to start from")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.venv_dir, ignore_errors=True)

    def test_compare_logs(self):
        a, b = text_log(self.path("a.log"), [100.0] * 5), text_log(self.path("b.log"), [90.0] * 5)
        rc, out, err = run("compare_logs.py", a, b, python=self.python)
        self.assertEqual((rc, err), (0, ""))
        self.assertIn("1.111x", out)

    def test_roofline_plot(self):
        png = self.path("r.png")
        rc, out, err = run("roofline_plot.py", roofline_report(self.path("r.json")), "--png", png, python=self.python)
        self.assertEqual(rc, 0, err)
        with open(png, "rb") as fh:
            self.assertEqual(fh.read(8), b"\x89PNG\r\n\x1a\n")

    def test_mock_data_golden(self):
        rc, out, err = run("mock_data_golden.py", python=self.python)
        self.assertEqual(rc, 0, err)
        self.assertTrue(out.startswith("numpy "), out[:200])

    def test_study_report(self):
        # Past the numpy check: the error is the run directory's, not "needs numpy".
        missing = self.path("no_such_run")
        result = run("study_report.py", missing, "--seeds", "1", "--out-doc", self.path("doc"), "--command", "c",
                     "--run-command", "r", "--commit", "x", "--machine", "m", "--device", "cpu", "--model", "t",
                     "--out", self.dir, python=self.python)
        self.assert_one_line(result, 1, os.path.join(missing, "sweep.csv"), "cannot read")

    def test_a_rerun_never_reruns_again(self):
        # The marker of a re-run already made: the script says what is missing instead of exec'ing again.
        env = dict(os.environ, **{script_errors.RERUN_MARKER: os.path.realpath(script("mock_data_golden.py"))})
        self.assert_one_line(run("mock_data_golden.py", python=self.python, env=env), 1,
                             "mock_data_golden.py: error: needs numpy (Debian: apt-get install python3-numpy)")


if __name__ == "__main__":
    unittest.main(verbosity=2)
