#!/usr/bin/env python3
"""ctest NvfpStudy.smoke: scripts/nvfp4_study.sh --iterations 5 --seeds 1 on llama_tiny (small batches) into a
temp dir: the corpus, the eight variants' runs (each run's precision plan, in its text log and in its
JSON-lines log's start event, is the variant's), the Markdown table (one row per variant, its values
checked against the JSON-lines logs, read here with json alone) and the PNG; a rerun does no training;
the report refuses runs filed under the wrong variant; one-line errors for bad arguments. No GPU.

Environment (set by tests/CMakeLists.txt): PL_APP_PATH (the built pretrain_llama; preprocess_data next to it).
Without Debian's fortunes package (/usr/share/games/fortunes) a small stand-in fortune file is used and
the test says so.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
STUDY = os.path.join(ROOT, "scripts", "nvfp4_study.sh")
REPORT = os.path.join(ROOT, "scripts", "study_report.py")
ITERS, GBS, SEQ = 5, 4, 64
VARIANTS = [  # (log label, table name, a phrase the log's precision plan must hold)
    ("bf16_mixed", "BF16", "in bf16"),
    ("bf16_with_fp8_current_scaling_mixed", "FP8 current scaling", "fp8 current scaling (E4M3 forward, E5M2 gradients)"),
    ("bf16_with_mxfp8_mixed", "MXFP8", "mxfp8 (E4M3, UE8M0 scales per 1x32 block)"),
    ("bf16_with_nvfp4_mixed", "NVFP4 (playbook recipe)",
     "nvfp4 (E2M1, E4M3 scales per 16x16 weight / 1x16 activation blocks, RHT on wgrad on, stochastic rounding of gradients on)"),
    ("nvfp4_no_rht", "NVFP4 without RHT", "RHT on wgrad off, stochastic rounding of gradients on"),
    ("nvfp4_no_sr", "NVFP4 without stochastic rounding", "RHT on wgrad on, stochastic rounding of gradients off"),
    ("nvfp4_no_2d", "NVFP4 without 2D weight blocks", "per 1x16 weight"),
    ("nvfp4_all_layers", "NVFP4 on every layer (no BF16 layers)", "layers 0-1   : linear_qkv linear_proj linear_fc1 linear_fc2 in nvfp4"),
]
ITER_LOSS = re.compile(r"iteration\s+(\d+)/\s*\d+ \|.*lm loss: ([0-9.E+-]+) \|")
FINAL_VAL = re.compile(r"validation loss at iteration \d+ on validation set \| lm loss value: (\S+) \|")

FAKE_FORTUNES = """\
The ___\x08\x08\x08one fortune here, with an underlined word.
%
Another one.

With a blank line inside.
%
"""


def read(path):
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()


def events(path):
    """The events of a JSON-lines log, read with json alone."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh]


def losses_and_val(path):
    """(per-iteration lm losses, the after-training validation loss) of a run's JSON-lines log."""
    ev = events(path)
    val = [e["lm_loss"] for e in ev if e["event"] == "eval" and e["split"] == "validation" and e["after_training"]]
    return [e["lm_loss"] for e in ev if e["event"] == "iteration"], val[-1]


def env(**more):
    e = dict(os.environ)
    e["OMP_WAIT_POLICY"] = "PASSIVE"
    e.setdefault("PYTHON", sys.executable)
    e.update(more)
    return e


class StudySmoke(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.app = os.environ.get("PL_APP_PATH")
        if not cls.app:
            raise RuntimeError("PL_APP_PATH must be set (ctest sets it)")
        cls.tmp = tempfile.TemporaryDirectory()
        cls.work = os.path.join(cls.tmp.name, "work")
        cls.doc = os.path.join(cls.tmp.name, "doc")
        cls.extra_env = {}
        if not os.path.isdir("/usr/share/games/fortunes"):
            fake = os.path.join(cls.tmp.name, "fortunes")
            os.makedirs(fake)
            with open(os.path.join(fake, "stand-in"), "w") as fh:
                fh.write(FAKE_FORTUNES * 200)
            cls.extra_env["FORTUNES_DIR"] = fake
            print("NvfpStudy.smoke: /usr/share/games/fortunes is missing (Debian package fortunes, scripts/setup.sh "
                  "installs it): a stand-in fortune file is used", file=sys.stderr)
        cls.args = ["--iterations", str(ITERS), "--seeds", "1", "--model", "llama_tiny", "--gbs", str(GBS), "--mbs",
                    str(GBS), "--seq", str(SEQ), "--out", cls.work, "--out-doc", cls.doc, "--bin", cls.app]
        cls.p = subprocess.run(["bash", STUDY, *cls.args], capture_output=True, text=True, timeout=600,
                               env=env(**cls.extra_env))
        cls.runs = os.path.join(cls.work, "runs", "seed1234")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def log(self, label):
        return os.path.join(self.runs, f"{label}_mbs{GBS}_seq{SEQ}.log")

    def jsonl(self, label):
        return os.path.join(self.runs, f"{label}_mbs{GBS}_seq{SEQ}.jsonl")

    def table(self):
        """{variant name: cells} of the Markdown table."""
        rows = {}
        for line in read(os.path.join(self.doc, "nvfp4_study.md")).splitlines():
            if line.startswith("| ") and not line.startswith("| variant") and not line.startswith("|---"):
                cells = [c.strip() for c in line.strip("|").split("|")]
                rows[cells[0]] = cells
        return rows

    def test_1_ran(self):
        self.assertEqual(self.p.returncode, 0, self.p.stdout[-3000:] + self.p.stderr[-3000:])
        for i in range(len(VARIANTS)):
            self.assertIn(f"[{i + 1}/8]", self.p.stdout)
        self.assertIn("seed 1234 (1 of 1): runs 1-8 of 8", self.p.stdout)

    def test_2_corpus(self):
        corpus = read(os.path.join(self.work, "data", "corpus.txt"))
        self.assertNotIn("\x08", corpus)  # overstrikes resolved
        self.assertNotIn("\n%\n", corpus)  # fortune separators became blank lines
        if os.path.exists("/usr/share/common-licenses/GPL-3"):
            self.assertIn("GNU GENERAL PUBLIC LICENSE", corpus)
        if "FORTUNES_DIR" not in self.extra_env:
            self.assertIn("Rome", corpus)  # some fortune mentions it; a corpus of licenses alone would not
        for ext in (".bin", ".idx", ".tokenizer.json"):
            self.assertTrue(os.path.exists(os.path.join(self.work, "data", "fortunes_licenses_byte_text_document" + ext)))
        self.assertIn('"vocab_size": 258', read(os.path.join(self.work, "model.json")))

    def test_3_each_run_is_its_variant(self):
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        for label, _, phrase in VARIANTS:
            text = read(self.log(label))
            plan = [l for l in text.splitlines() if ": linear_qkv linear_proj linear_fc1 linear_fc2 in " in l]
            self.assertTrue(plan, label)
            self.assertTrue(any(phrase in l for l in plan), f"{label}: {plan}")
            if label == "bf16_mixed":
                self.assertTrue(all(l.endswith(" in bf16") for l in plan), plan)
            if label == "nvfp4_all_layers":
                self.assertFalse(any(l.endswith(" in bf16") for l in plan), plan)
            self.assertIn(f"--data-path {self.work}/data/fortunes_licenses_byte_text_document", text.splitlines()[0])
            self.assertIn("data: dataset 1 valid:", text)
            # The JSON-lines log's start event holds the same plan (what study_report.py checks).
            ev = events(self.jsonl(label))
            self.assertEqual((ev[0]["event"], ev[-1]["event"]), ("start", "end"))
            self.assertEqual([p for p in ev[0]["precision_plan"] if ": linear_qkv " in p],
                             [l.split("pretrain_llama |", 1)[1].strip() for l in plan])
            self.assertTrue(any("dataset 1 valid:" in d for d in ev[0]["data"]), ev[0]["data"])

    def test_4_table_and_png(self):
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        md = read(os.path.join(self.doc, "nvfp4_study.md"))
        rows = self.table()
        self.assertEqual(list(rows), [name for _, name, _ in VARIANTS])  # one row per variant, in order
        self.assertIn("scripts/nvfp4_study.sh --iterations 5 --seeds 1 --model llama_tiny", md)  # the exact command
        self.assertRegex(md, r"on \d{4}-\d\d-\d\d \d\d:\d\d UTC, commit `[0-9a-f]+")
        self.assertIn(f"on {os.cpu_count()} cores, ", md)
        self.assertIn("--seed SEED --data-seed SEED --log-interval 1", md)  # one run's command, the seed left open
        # The model and data sentence, from the first BF16 run's start event.
        self.assertRegex(md, r"`llama_tiny_bytes` \([0-9]+\.[0-9]{3} M parameters\)")
        self.assertRegex(md, r"split 949,50,1 \(train [0-9,]+ tokens, valid [0-9,]+ tokens, test [0-9,]+ tokens per epoch\)")
        # Values against the logs: train loss = the mean over the last 10% (ceil(0.5) = 1: the last iteration),
        # val loss = the after-training validation, gap = relative to BF16, by hand.
        loss, val = {}, {}
        for label, name, _ in VARIANTS:
            losses, val[label] = losses_and_val(self.jsonl(label))
            self.assertEqual(len(losses), ITERS)
            loss[label] = losses[-1]
            # The text log printed the same values (.6E).
            text = read(self.log(label))
            self.assertEqual([float(m.group(2)) for m in ITER_LOSS.finditer(text)], [float(f"{x:.6E}") for x in losses])
            self.assertEqual(float(FINAL_VAL.findall(text)[-1]), float(f"{val[label]:.6E}"))
            cells = rows[name]
            self.assertEqual(cells[1], f"`{label}`")
            self.assertEqual(cells[2], f"{loss[label]:.4f}")
            self.assertEqual(cells[4], f"{val[label]:.4f}")
            if label != "bf16_mixed":
                gap = 100 * (val[label] - val["bf16_mixed"]) / val["bf16_mixed"]
                self.assertAlmostEqual(float(cells[5].rstrip("%")), gap, delta=0.006)
                tgap = 100 * (loss[label] - loss["bf16_mixed"]) / loss["bf16_mixed"]
                self.assertAlmostEqual(float(cells[3].rstrip("%")), tgap, delta=0.006)
            self.assertEqual(cells[9], "n/a (one seed)")  # one seed: no noise estimate
            self.assertEqual(cells[7], "")  # ... and no standard error
        self.assertIn("![loss gap vs BF16 per variant](nvfp4_study.png)", md)
        with open(os.path.join(self.doc, "nvfp4_study.png"), "rb") as fh:
            data = fh.read()
        self.assertGreater(len(data), 1000)
        self.assertTrue(data.startswith(b"\x89PNG\r\n\x1a\n"))

    def test_5_rerun_resumes(self):
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        before = {label: (os.stat(self.log(label)).st_mtime_ns, os.stat(self.jsonl(label)).st_mtime_ns)
                  for label, _, _ in VARIANTS}
        p = subprocess.run(["bash", STUDY, *self.args], capture_output=True, text=True, timeout=300,
                           env=env(**self.extra_env))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout.count(": skip (complete log"), 8, p.stdout)
        self.assertIn("corpus unchanged", p.stdout)
        self.assertEqual({label: (os.stat(self.log(label)).st_mtime_ns, os.stat(self.jsonl(label)).st_mtime_ns)
                          for label, _, _ in VARIANTS}, before)

    def report_on(self, runs):
        """study_report.py over the run directory `runs`, its document into a scratch folder."""
        return subprocess.run([sys.executable, REPORT, "--seeds", "1234", "--out-doc", os.path.join(self.tmp.name, "baddoc"),
                               "--command", "x", "--run-command", "x", "--commit", "x", "--machine", "x", "--device",
                               "cpu", "--model", "x", "--out", "x", runs], capture_output=True, text=True, timeout=120)

    def test_6_report_checks_the_variants(self):
        # A run filed under the wrong variant (the full recipe's JSON-lines log as the no-RHT one): the report
        # refuses it.
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        bad = os.path.join(self.tmp.name, "bad")
        shutil.copytree(self.runs, bad)
        shutil.copy(os.path.join(bad, f"bf16_with_nvfp4_mixed_mbs{GBS}_seq{SEQ}.jsonl"),
                    os.path.join(bad, f"nvfp4_no_rht_mbs{GBS}_seq{SEQ}.jsonl"))
        with open(os.path.join(bad, "sweep.csv")) as fh:
            text = fh.read().replace(self.runs, bad)
        with open(os.path.join(bad, "sweep.csv"), "w") as fh:
            fh.write(text)
        p = self.report_on(bad)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertIn("nvfp4_no_rht", p.stderr)
        self.assertIn("RHT off", p.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "baddoc", "nvfp4_study.md")))
        # A sweep.csv naming text logs (a run directory from before the JSON-lines logs): one line, no report.
        with open(os.path.join(bad, "sweep.csv")) as fh:
            text = fh.read().replace(".jsonl", ".log")
        with open(os.path.join(bad, "sweep.csv"), "w") as fh:
            fh.write(text)
        p = self.report_on(bad)
        self.assertEqual(p.returncode, 1, p.stdout + p.stderr)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertIn(f"bf16_mixed_mbs{GBS}_seq{SEQ}.log:1: not a JSON-lines event", p.stderr)

    def test_8_interrupt(self):
        # SIGTERM mid-run: the sweep's run is killed, no partial or final log is left, exit status 130.
        import signal
        import time
        work = os.path.join(self.tmp.name, "interrupted")
        args = [("3000" if a == str(ITERS) else a) for a in self.args]
        args[args.index("--out") + 1] = work
        args[args.index("--out-doc") + 1] = os.path.join(self.tmp.name, "interrupted-doc")
        p = subprocess.Popen(["bash", STUDY, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env=env(**self.extra_env))
        runs = os.path.join(work, "runs", "seed1234")
        partial = os.path.join(runs, f".bf16_mixed_mbs{GBS}_seq{SEQ}.log.partial")
        deadline = time.time() + 120
        while time.time() < deadline and not (os.path.exists(partial) and "iteration        2/" in read(partial)):
            time.sleep(0.2)
        self.assertTrue(os.path.exists(partial), "the first run did not start")
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
        self.assertEqual(p.returncode, 130, out[-2000:] + err)
        self.assertIn("nvfp4_study.sh: interrupted", err)
        self.assertEqual(os.listdir(runs), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "interrupted-doc", "nvfp4_study.md")))

    def test_9_second_seed(self):
        # --seeds 2 on the same work directory: seed 1234's runs are reused, seed 1235's run; the table
        # gains the seed spread, the standard error of each gap (two seeds: half their difference) and the
        # verdict (|mean gap| > 2 s.e.), checked here by hand.
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        args = list(self.args)
        args[args.index("--seeds") + 1] = "2"
        p = subprocess.run(["bash", STUDY, *args], capture_output=True, text=True, timeout=600, env=env(**self.extra_env))
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr[-2000:])
        self.assertEqual(p.stdout.count(": skip (complete log"), 8, p.stdout)
        self.assertEqual(p.stdout.count(": running -> "), 8, p.stdout)
        self.assertIn("seed 1235 (2 of 2): runs 9-16 of 16", p.stdout)
        val = {}
        for seed in (1234, 1235):
            for label, _, _ in VARIANTS:
                text = read(os.path.join(self.work, "runs", f"seed{seed}", f"{label}_mbs{GBS}_seq{SEQ}.log"))
                self.assertIn(f"seed {seed},", text)
                path = os.path.join(self.work, "runs", f"seed{seed}", f"{label}_mbs{GBS}_seq{SEQ}.jsonl")
                self.assertEqual(events(path)[0]["training"]["seed"], seed)
                val[label, seed] = losses_and_val(path)[1]
        b = [val["bf16_mixed", s] for s in (1234, 1235)]
        noise = 100 * (max(b) - min(b)) / (sum(b) / 2)
        self.assertGreater(noise, 0.0)  # the seeds differ
        rows = self.table()
        self.assertEqual(len(rows), len(VARIANTS))
        self.assertTrue(rows["BF16"][8].endswith(f" / {noise:.2f}%"), rows["BF16"][8])
        for label, name, _ in VARIANTS[1:]:
            gaps = [100 * (val[label, s] - val["bf16_mixed", s]) / val["bf16_mixed", s] for s in (1234, 1235)]
            cells = rows[name]
            self.assertEqual(cells[6], ", ".join(f"{g:+.2f}%" for g in gaps))
            gap = sum(gaps) / 2
            self.assertAlmostEqual(float(cells[5].rstrip("%")), gap, delta=0.006)
            se = abs(gaps[0] - gaps[1]) / 2
            self.assertAlmostEqual(float(cells[7].rstrip("%")), se, delta=0.006)
            if abs(abs(gap) - 2 * se) > 1e-6:
                self.assertEqual(cells[9], "yes" if abs(gap) > 2 * se else "no", (name, gaps))

    def test_a_record(self):
        # The record (scripts/study_record.sh): each complete run's logs gzipped into OUT_DOC/runs/seedN with the
        # work directory's path written as @STUDY_OUT@, and its provenance line. A new work directory restores
        # them without training, after the numerics check (iterations 1-2 of every variant; run even for the
        # same binary, which may be on another CPU), and runs only a run the record lacks (then records it);
        # another binary (the same code, one byte appended) passes the check and restores them; a record this
        # binary does not reproduce to the last bit is refused naming the variant (and the two GEMM lines when
        # they differ); a record of another configuration is refused.
        import gzip
        import math
        self.assertEqual(self.p.returncode, 0, self.p.stderr[-3000:])
        rec = os.path.join(self.doc, "runs")
        seed = os.path.join(rec, "seed1234")
        provenance = read(os.path.join(seed, "provenance.txt")).splitlines()
        self.assertEqual(sorted(l.split()[0] for l in provenance),
                         sorted(f"{label}_mbs{GBS}_seq{SEQ}" for label, _, _ in VARIANTS))
        for line in provenance:
            self.assertRegex(line, r"^\S+ commit \S+ sha256 [0-9a-f]{16} cpu .+ cores \d+ date \d{4}-\d\d-\d\d$")
        self.assertRegex(read(os.path.join(rec, "config.txt")),
                         rf"^iterations {ITERS} model llama_tiny gbs {GBS} mbs {GBS} seq {SEQ} device cpu corpus [0-9a-f]{{16}}\n$")
        for label, _, _ in VARIANTS:
            for path in (self.log(label), self.jsonl(label)):
                with gzip.open(os.path.join(seed, os.path.basename(path) + ".gz"), "rt", encoding="utf-8") as fh:
                    text = fh.read()
                self.assertNotIn(self.work, text)
                self.assertIn("@STUDY_OUT@/model.json", text)
                self.assertEqual(text.replace("@STUDY_OUT@", self.work), read(path))

        def study(work, binary, *more):
            args = list(self.args) + list(more)
            args[args.index("--out") + 1] = os.path.join(self.tmp.name, work)
            args[args.index("--bin") + 1] = binary
            return subprocess.run(["bash", STUDY, *args], capture_output=True, text=True, timeout=300,
                                  env=env(**self.extra_env))

        def restored(work, label):
            return read(os.path.join(self.tmp.name, work, "runs", "seed1234", f"{label}_mbs{GBS}_seq{SEQ}.log"))

        p = study("restored", self.app)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr)
        self.assertIn("restored 8 run(s) from", p.stdout)
        self.assertIn("numerics unchanged: iterations 1-2 of 8 variant(s)", p.stdout)
        self.assertEqual(p.stdout.count(": skip (complete log"), 8, p.stdout)
        self.assertNotIn(": running -> ", p.stdout)
        moved = os.path.join(self.tmp.name, "restored")
        self.assertEqual(restored("restored", "nvfp4_no_sr"), read(self.log("nvfp4_no_sr")).replace(self.work, moved))

        # A run the record lacks (its provenance line gone): the others are restored, it runs and is recorded.
        # The others as if recorded at another commit by the same binary (rebuilt after a docs-only change):
        # the report names both commits and says it is one binary.
        last = f"nvfp4_all_layers_mbs{GBS}_seq{SEQ}"
        with open(os.path.join(seed, "provenance.txt"), "w") as fh:
            fh.write("".join(re.sub(r" commit \S+ ", " commit feedfacecafe ", l) + "\n"
                             for l in provenance if not l.startswith(last + " ")))
        p = study("partial", self.app)
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr)
        self.assertIn("restored 7 run(s) from", p.stdout)
        self.assertEqual(p.stdout.count(": skip (complete log"), 7, p.stdout)
        self.assertIn(f"[8/8] {last}: running -> ", p.stdout)
        self.assertIn(f"recorded {seed}/{last}", p.stdout)
        self.assertEqual(len(read(os.path.join(seed, "provenance.txt")).splitlines()), 8)
        sha = provenance[0].split()[4]
        self.assertRegex(read(os.path.join(self.doc, "nvfp4_study.md")),
                         rf"commit `feedfacecafe \(seeds 1234\) and \S+ \(seeds 1234\), one binary: every run's sha256 is {sha}`")
        with open(os.path.join(seed, "provenance.txt"), "w") as fh:
            fh.write("".join(l + "\n" for l in provenance))

        bin2 = os.path.join(self.tmp.name, "bin2")
        os.makedirs(bin2)
        for name in ("pretrain_llama", "preprocess_data"):
            shutil.copy2(os.path.join(os.path.dirname(self.app), name), bin2)
        with open(os.path.join(bin2, "pretrain_llama"), "ab") as fh:
            fh.write(b"\0")  # another sha256, the same code
        p = study("checked", os.path.join(bin2, "pretrain_llama"))
        self.assertEqual(p.returncode, 0, p.stdout[-2000:] + p.stderr)
        self.assertIn("iterations 1-2 of each recorded variant", p.stdout)
        self.assertIn("numerics unchanged: iterations 1-2 of 8 variant(s)", p.stdout)
        self.assertNotIn(": running -> ", p.stdout)

        gz = os.path.join(seed, f"nvfp4_no_sr_mbs{GBS}_seq{SEQ}.jsonl.gz")
        with open(gz, "rb") as fh:
            original = fh.read()
        lines = gzip.decompress(original).decode().splitlines(keepends=True)
        for i, line in enumerate(lines):
            e = json.loads(line)
            if e["event"] == "iteration" and e["iteration"] == 2:
                e["lm_loss"] = math.nextafter(e["lm_loss"], math.inf)  # one ulp off
                lines[i] = json.dumps(e) + "\n"
        # ... and as if its runs had used other GEMM kernels: the refusal names both "cpu GEMMs" lines.
        log_gz = gz[: -len(".jsonl.gz")] + ".log.gz"
        with open(log_gz, "rb") as fh:
            original_log = fh.read()
        log = re.sub(r"cpu GEMMs: .*", "cpu GEMMs: oneDNN bf16 (avx512_core_amx)", gzip.decompress(original_log).decode())
        try:
            with open(gz, "wb") as fh:
                fh.write(gzip.compress("".join(lines).encode()))
            with open(log_gz, "wb") as fh:
                fh.write(gzip.compress(log.encode()))
            p = study("refused", os.path.join(bin2, "pretrain_llama"))
        finally:
            with open(gz, "wb") as fh:
                fh.write(original)
            with open(log_gz, "wb") as fh:
                fh.write(original_log)
        self.assertEqual(p.returncode, 2, p.stdout[-2000:] + p.stderr)
        self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
        self.assertIn("does not compute what the record's binary did (nvfp4_no_sr, seed 1234", p.stderr)
        self.assertRegex(p.stderr, r"GEMMs: the record's runs oneDNN bf16 \(avx512_core_amx\), this machine's \S")
        self.assertFalse(os.path.exists(os.path.join(self.tmp.name, "refused", "runs", "seed1234")))

        p = study("other", self.app, "--iterations", str(ITERS + 1))
        self.assertEqual(p.returncode, 2, p.stdout[-2000:] + p.stderr)
        self.assertIn("holds a study of another configuration", p.stderr)

    def test_7_bad_arguments(self):
        for args, message in [
            (("--seeds", "0"), "--seeds '0': must be a positive integer"),
            (("--iterations", "x"), "--iterations 'x': must be a positive integer"),
            (("--device", "tpu"), "--device 'tpu': cpu or cuda"),
            (("--gbs", "6", "--mbs", "4"), "--gbs 6 must be a multiple of --mbs 4"),
            (("--model", "no_such_model"), "--model 'no_such_model'"),
            (("--bin", "/no/such/binary"), "/no/such/binary"),
            (("--frobnicate",), "unknown argument '--frobnicate'"),
            (("--out",), "--out needs a value"),
        ]:
            with self.subTest(args=args):
                scratch = ["--out", os.path.join(self.tmp.name, "x"), "--out-doc", os.path.join(self.tmp.name, "y")]
                full = [*scratch, *args] if "--bin" in args else ["--bin", self.app, *scratch, *args]
                p = subprocess.run(["bash", STUDY, *full], capture_output=True, text=True, timeout=60, env=env())
                self.assertEqual(p.returncode, 2, p.stderr)
                self.assertEqual(p.stdout, "")
                self.assertEqual(len(p.stderr.splitlines()), 1, p.stderr)
                self.assertTrue(p.stderr.startswith("nvfp4_study.sh: error: "), p.stderr)
                self.assertIn(message, p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
