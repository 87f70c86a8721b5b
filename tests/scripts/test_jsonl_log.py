#!/usr/bin/env python3
"""ctest JsonlLog.reader: scripts/jsonl_log.py, the reader of pretrain_llama's --log-jsonl files, on files
written here from the schema (version 1): the events and the resume rules (two starts, a repeated
iteration), a last line cut short or without its newline, bad lines named FILE:LINE, a FIFO, a directory
and a missing file refused in one line, completeness, and the command's output for shell scripts (values,
nested keys, null and missing keys, --complete, --gemm, --summary), also under `python3 -S` (no
site-packages: the standard library is all it needs). Plain unittest; no binary, no GPU.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.normpath(os.path.join(HERE, "..", "..", "scripts"))
READER = os.path.join(SCRIPTS, "jsonl_log.py")
sys.path.insert(0, SCRIPTS)
import jsonl_log  # noqa: E402

GEMMS = [{"format": "bf16", "execution": "native", "description": "BF16 GEMMs: native on sm_90 (cuBLASLt)"},
         {"format": "nvfp4", "execution": "emulated", "description": "NVFP4 GEMMs: emulated on sm_90"}]


def start(first=1, **more):
    e = {"event": "start", "schema_version": 1, "program": "pretrain_llama", "timestamp": "2026-11-28 16:11:32",
         "command_line": ["pretrain_llama", "--model", "llama_tiny"], "world_size": 1, "first_iteration": first,
         "model": {"name": "llama_tiny", "parameters": 787712}, "quantized_format": "nvfp4",
         "device": {"type": "cuda", "name": "NVIDIA H200", "driver": "580.159.04", "sm": 90}, "gemms": GEMMS,
         "training": {"train_iters": 30, "global_batch_size": 8, "seq_length": 128},
         "data": ["mock train: 33333 sequences", "a\ttab"]}
    e.update(more)
    return e


def iteration(i, loss=4.5, ms=91.6):
    return {"event": "iteration", "iteration": i, "train_iters": 30, "consumed_samples": 8 * i, "global_batch_size": 8,
            "lm_loss": loss, "grad_norm": None if loss is None else 2.5, "skipped": False, "nan": loss is None,
            "elapsed_ms": ms, "tflops": 0.031, "tokens_per_s": 11172.2}


def end(last=30, **more):
    e = {"event": "end", "first_iteration": 1, "last_iteration": last, "train_iters": 30, "stop": "train_iters",
         "summary_first": 12, "summary_last": last, "mean_step_ms": 57.5, "tflops": 0.088, "tokens_per_s": 17807.0,
         "tokens_per_s_per_gpu": 17807.0, "final_lm_loss": 1.3609, "nan_iterations": 0, "valid_lm_loss": None,
         "test_lm_loss": None, "allocations_in_loop": 0,
         "memory": {"allocated_bytes": 18693000, "max_allocated_bytes": 21456789012, "alloc_count": 7}}
    e.update(more)
    return e


def lines(*events):
    return "".join(json.dumps(e) + "\n" for e in events)


def run(*args, python=(sys.executable,)):
    p = subprocess.run([*python, READER, *args], capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout, p.stderr


class Reader(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def write(self, name, text, mode="w"):
        path = os.path.join(self.tmp.name, name)
        with open(path, mode) as fh:
            fh.write(text)
        return path

    def one_line_error(self, args, status, *parts):
        rc, out, err = run(*args)
        self.assertEqual(rc, status, err)
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith("jsonl_log.py: "), err)
        self.assertNotIn("Traceback", err)
        for p in parts:
            self.assertIn(p, err)

    def test_events_and_completeness(self):
        path = self.write("run.jsonl", lines(start(), iteration(1), iteration(2, loss=None), end(last=2)))
        r = jsonl_log.read_run(path)
        self.assertEqual([e["event"] for e in r.events], ["start", "iteration", "iteration", "end"])
        self.assertEqual([e["iteration"] for e in r.iterations], [1, 2])
        self.assertTrue(r.complete)
        self.assertEqual(r.gemm_execution("NVFP4"), "emulated")
        self.assertEqual(r.gemm_execution("bf16"), "native")
        self.assertIsNone(r.gemm_execution("mxfp8"))
        self.assertEqual(jsonl_log.value(r.last("end"), "memory.max_allocated_bytes"), 21456789012)
        self.assertEqual(jsonl_log.value(r.last("start"), "gemms.1.format"), "nvfp4")
        self.assertIs(jsonl_log.value(r.last("start"), "gemms.2.format"), jsonl_log.MISSING)
        self.assertIs(jsonl_log.value(r.last("end"), "no.such"), jsonl_log.MISSING)

    def test_resume_with_two_starts(self):
        # The first process ran 1-25 and died; the second resumed from checkpoint 20: 21-25 again, then 26-30.
        text = lines(start(), *(iteration(i, loss=5.0 - 0.1 * i) for i in range(1, 26)),
                     start(first=21, gemms=[GEMMS[0]]), *(iteration(i, loss=9.0 + i) for i in range(21, 31)), end())
        r = jsonl_log.read_run(self.write("resumed.jsonl", text))
        self.assertEqual(len(r.starts), 2)
        self.assertEqual([e["iteration"] for e in r.iterations], list(range(1, 31)))
        self.assertEqual(r.iterations[19]["lm_loss"], 5.0 - 0.1 * 20)  # before the resume point: the first run's
        self.assertEqual(r.iterations[22]["lm_loss"], 9.0 + 23)  # repeated: the later line wins
        self.assertTrue(r.complete)
        self.assertIsNone(r.gemm_execution("nvfp4"))  # the last start event's gemms count
        # The first run ended; the resumed one died: incomplete.
        text = lines(start(), iteration(1), end(last=1), start(first=2), iteration(2))
        r = jsonl_log.read_run(self.write("died.jsonl", text))
        self.assertFalse(r.complete)
        self.assertIn("after the last \"start\"", r.incomplete_reason())

    def test_stopped_by_a_signal_is_incomplete(self):
        path = self.write("sig.jsonl", lines(start(), iteration(1), end(last=1, stop="signal", signal="SIGTERM")))
        self.assertIn("stopped by a signal (SIGTERM) at iteration 1", jsonl_log.read_run(path).incomplete_reason())
        for stop in ("exit_interval", "exit_duration", "observer"):  # stops the run was asked for
            path = self.write(f"{stop}.jsonl", lines(start(), iteration(1), end(last=1, stop=stop)))
            self.assertTrue(jsonl_log.read_run(path).complete, stop)

    def test_last_line_cut_short_or_without_newline(self):
        good = lines(start(), iteration(1))
        for tail in ('{"event": "iteration", "iterat', '{"event": "iteration", "iteration": 2, "lm_loss": 4.',
                     "\xe9"):
            path = self.write("cut.jsonl", good + tail)
            self.assertEqual(len(jsonl_log.read_run(path).events), 2, tail)
        # Invalid UTF-8 cut in the middle of a character.
        path = self.write("cut_bytes.jsonl", good.encode() + b'{"event": "eval", "note": "\xc3', "wb")
        self.assertEqual(len(jsonl_log.read_run(path).events), 2)
        # A whole object without the final newline (written by hand): read.
        path = self.write("no_newline.jsonl", good + json.dumps(end(last=1)))
        r = jsonl_log.read_run(path)
        self.assertEqual(r.events[-1]["event"], "end")
        self.assertTrue(r.complete)
        # Blank lines are skipped; the line numbers of errors still count them.
        path = self.write("blank.jsonl", "\n" + lines(start()) + "\n\n" + "oops\n")
        with self.assertRaises(jsonl_log.Error) as cm:
            jsonl_log.read_run(path)
        self.assertIn(f"{path}:5: ", str(cm.exception))

    def test_bad_lines_name_file_and_line(self):
        cases = [
            ("not json", 2, "not a JSON-lines event"),
            ("[1, 2, 3]", 2, "not a JSON-lines event"),
            ('{"iteration": 3}', 2, "not a JSON-lines event"),
            ('{"event": 7}', 2, "not a JSON-lines event"),
            ("\udcff", 2, "not a JSON-lines event"),  # (written below as a lone 0xff byte)
        ]
        for line, n, message in cases:
            with self.subTest(line=line):
                data = lines(start()).encode() + line.encode("utf-8", "surrogateescape") + b"\n" + lines(end()).encode()
                path = self.write("bad.jsonl", data, "wb")
                with self.assertRaises(jsonl_log.Error) as cm:
                    jsonl_log.read_run(path)
                self.assertTrue(str(cm.exception).startswith(f"{path}:{n}: {message}"), cm.exception)
                self.one_line_error([path, "end", "tflops"], 2, f"{path}:{n}: {message}")
                self.one_line_error(["--complete", path], 2, f"{path}:{n}: {message}")
        path = self.write("v2.jsonl", lines(start(schema_version=2), iteration(1)))
        self.one_line_error(["--complete", path], 2, f"{path}:1: schema_version 2 (this reader knows version 1)")
        # A very long bad line is shortened in the message.
        path = self.write("long.jsonl", "x" * 5000 + "\n")
        rc, _, err = run("--complete", path)
        self.assertEqual(rc, 2)
        self.assertLess(len(err), 300)

    def test_fifo_directory_and_missing_file_are_refused(self):
        fifo = os.path.join(self.tmp.name, "fifo.jsonl")
        os.mkfifo(fifo)
        with self.assertRaises(jsonl_log.Error) as cm:  # O_NONBLOCK: returns at once, no writer needed
            jsonl_log.read_run(fifo)
        self.assertEqual(str(cm.exception), f"{fifo}: is a FIFO, not a regular file")
        self.one_line_error(["--complete", fifo], 2, f"{fifo}: is a FIFO")  # run() times out on a hang
        self.one_line_error([self.tmp.name, "end", "tflops"], 2, f"{self.tmp.name}: is a directory")
        missing = os.path.join(self.tmp.name, "missing.jsonl")
        self.one_line_error(["--summary", missing], 2, f"{missing}: cannot read: No such file or directory")
        self.one_line_error(["--gemm", "nvfp4", "/dev/null"], 2, "/dev/null: is a character device")

    def test_values_command(self):
        path = self.write("run.jsonl", lines(start(), iteration(1), iteration(2, loss=None),
                                             end(last=2, final_lm_loss=None, nan_iterations=1)))
        rc, out, err = run(path, "end", "mean_step_ms", "tflops", "tokens_per_s", "final_lm_loss", "nan_iterations",
                           "memory.max_allocated_bytes", "stop", "signal", "valid_lm_loss")
        self.assertEqual((rc, err), (0, ""))
        self.assertEqual(out, "57.5\t0.088\t17807.0\tnan\t1\t21456789012\ttrain_iters\t\tnan\n")
        # The last record of the event: iteration 2; booleans, lists and objects; a tab inside a string.
        rc, out, err = run(path, "iteration", "iteration", "nan", "lm_loss", "grad_norm")
        self.assertEqual(out, "2\ttrue\tnan\tnan\n")
        rc, out, err = run(path, "start", "training.seq_length", "device.type", "device.sm", "data", "model")
        self.assertEqual(out, '128\tcuda\t90\t["mock train: 33333 sequences","a\\ttab"]\t'
                              '{"name":"llama_tiny","parameters":787712}\n')
        rc, out, err = run(path, "start", "data.1")
        self.assertEqual(out, "a tab\n")
        # No such event: exit 1, one line, nothing on stdout.
        self.one_line_error([path, "eval", "lm_loss"], 1, f"{path}: no \"eval\" event")

    def test_complete_command(self):
        done = self.write("done.jsonl", lines(start(), iteration(1), end(last=1)))
        running = self.write("running.jsonl", lines(start(), iteration(1)) + '{"event": "iter')
        empty = self.write("empty.jsonl", "")
        self.assertEqual(run("--complete", done), (0, "", ""))
        self.one_line_error(["--complete", running], 1, f"{running}: incomplete: no \"end\" event")
        self.one_line_error(["--complete", empty], 1, f"{empty}: incomplete: no events")

    def test_gemm_command(self):
        path = self.write("run.jsonl", lines(start(), iteration(1)))
        self.assertEqual(run("--gemm", "NVFP4", path), (0, "emulated\n", ""))
        self.assertEqual(run("--gemm", "bf16", path), (0, "native\n", ""))
        self.one_line_error(["--gemm", "mxfp8", path], 1, f"{path}: its start event's gemms have no mxfp8 entry")
        self.one_line_error(["--gemm", "fp4", path], 2, "--gemm fp4: a format is bf16, fp8, mxfp8 or nvfp4")
        nostart = self.write("nostart.jsonl", lines(iteration(1)))
        self.one_line_error(["--gemm", "bf16", nostart], 1, f"{nostart}: no start event")

    def test_summary_command(self):
        path = self.write("run.jsonl", lines(start(), iteration(1), end(final_lm_loss=1.3609)))
        rc, out, err = run("--summary", path)
        self.assertEqual(rc, 0, err)
        self.assertEqual(out, "iterations 12-30 of 30 (run by this process: 1-30): mean step time 0.058 s, 0.088 "
                              "MODEL_TFLOP/s/GPU, 17807 tokens/s | final lm loss 1.360900E+00 | nan iterations 0\n")
        path = self.write("sig.jsonl", lines(start(), iteration(1), end(stop="signal", signal="SIGINT",
                                                                         tokens_per_s_per_gpu=8903.5)))
        self.assertTrue(run("--summary", path)[1].endswith(
            "17807 tokens/s (8904 tokens/s/GPU) | final lm loss 1.360900E+00 | nan iterations 0 | stop: signal\n"))
        nothing = self.write("none.jsonl", lines(start(), end(summary_first=None, last=0, final_lm_loss=None)))
        self.assertEqual(run("--summary", nothing)[1], "no iterations run (iteration 0 of 30)\n")
        self.one_line_error(["--summary", self.write("r.jsonl", lines(start()))], 1, "no \"end\" event")

    def test_bad_arguments(self):
        path = self.write("run.jsonl", lines(start()))
        for args in ([], [path], [path, "end"], ["--complete"], ["--complete", path, path], ["--gemm", path],
                     ["--frobnicate", path, "x"]):
            with self.subTest(args=args):
                self.one_line_error(args, 2, "bad arguments", "usage: jsonl_log.py")
        rc, out, err = run("--help")
        self.assertEqual(rc, 0)
        self.assertIn("jsonl_log.py FILE EVENT KEY [KEY...]", out)

    def test_standard_library_only(self):
        # python3 -S: no site-packages (no numpy, nothing installed): the command still works.
        path = self.write("run.jsonl", lines(start(), iteration(1), end(last=1)))
        self.assertEqual(run("--complete", path, python=(sys.executable, "-S")), (0, "", ""))
        self.assertEqual(run(path, "end", "tflops", python=(sys.executable, "-S")), (0, "0.088\n", ""))


if __name__ == "__main__":
    unittest.main(verbosity=2)
