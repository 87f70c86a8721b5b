#!/usr/bin/env python3
"""ctest GpuCheck.kernels: scripts/gpu_check.sh --only kernels without a GPU.

  - no GPU: one line on stderr, exit 3, nothing on stdout;
  - a fake GPU (nvidia-smi), a fake build whose pretrain_llama passes the library smoke test, and the real
    bench_kernels of this build run on the CPU (GPU_CHECK_TRAIN_DEVICE=cpu: llama_tiny, the parsing's try): the
    estimate line, bench_kernels' whole table in the report, its JSON in $OUT/kernels.json, the summary line;
  - a bench_kernels that stopped at its budget, or is missing, fails the step with one FAILED line;
  - --quantize-kernels reference reaches every pretrain_llama run of the training table (a fake pretrain_llama
    records its arguments); a value other than fast or reference is refused in one line, exit 2.
Needs $PL_APP_PATH (ctest gives it: bench_kernels is beside pretrain_llama).
"""
import json
import os
import re
import shutil
import stat
import subprocess
import tempfile
import unittest

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPU_CHECK = os.path.join(REPO, "scripts", "gpu_check.sh")
BENCH_KERNELS = os.path.join(os.path.dirname(os.environ.get("PL_APP_PATH", "")), "bench_kernels")

FAKE_SMI = """#!/bin/sh
case "$*" in
  -L) echo 'GPU 0: NVIDIA H200 (UUID: GPU-fake)' ;;
  *query-gpu=compute_cap*) echo '9.0' ;;
  *) echo 'NVIDIA H200, 9.0, 580.00, 143771 MiB' ;;
esac
"""
FAKE_APP = "#!/bin/bash\n[[ $1 == --print-library-versions ]] && { echo 'pretrain_llama | ✓ fake'; exit 0; }\nexit 1\n"
# A bench_kernels cut short by its --budget-seconds.
FAKE_STOPPED = """#!/bin/bash
echo 'bench_kernels: estimate ~30 s'
echo 'bench_kernels: stopped at --budget-seconds 150: 10 of 96 kernels timed'
"""


def gpu_present():
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if p.returncode == 0 and re.search(r"^GPU [0-9]", p.stdout, re.M):
            return True
    return any(re.fullmatch(r"nvidia[0-9]+", n) for n in os.listdir("/dev"))


def write_exe(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


class GpuCheckKernels(unittest.TestCase):
    def setUp(self):
        if gpu_present():
            self.skipTest("this machine has a GPU: gpu_check.sh would run for real")
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_without_a_gpu_one_line_exit_3(self):
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        p = subprocess.run(["bash", GPU_CHECK, "--only", "kernels"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PATH=f"{empty}:/usr/bin:/bin"))
        self.assertEqual((p.returncode, p.stdout), (3, ""), p.stderr)
        self.assertEqual(p.stderr, "gpu_check: no GPU is present (nvidia-smi not found, no /dev/nvidia*): nothing to check\n")

    def test_quantize_kernels_reaches_every_training_run(self):
        bin_dir, build, out = (os.path.join(self.dir, d) for d in ("bin", "build", "out"))
        for d in (bin_dir, os.path.join(build, "apps"), os.path.join(build, "tests"), out):
            os.makedirs(d, exist_ok=True)
        calls = os.path.join(self.dir, "calls.txt")
        write_exe(os.path.join(bin_dir, "nvidia-smi"), FAKE_SMI)
        write_exe(os.path.join(build, "apps", "pretrain_llama"),
                  "#!/bin/bash\n[[ $1 == --print-library-versions ]] && { echo 'pretrain_llama | ✓ fake'; exit 0; }\n"
                  f"echo \"$*\" >> '{calls}'\nexit 1\n")
        write_exe(os.path.join(build, "tests", "pl_tests"), "#!/bin/sh\nexit 0\n")
        env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", OUT=out, GPU_CHECK_TRAIN_DEVICE="cpu")
        p = subprocess.run(["bash", GPU_CHECK, "--build-dir", build, "--only", "training", "--quantize-kernels",
                            "reference"], capture_output=True, text=True, timeout=300, env=env)
        text = p.stdout + p.stderr
        self.assertEqual(p.returncode, 1, text)  # every fake run fails
        self.assertIn("quantize kernels: reference (--quantize-kernels, every training, roofline and peer run)", text)
        with open(calls) as fh:
            runs = fh.read().splitlines()
        self.assertGreaterEqual(len(runs), 4, text)
        for r in runs:
            self.assertIn("--quantize-kernels reference", r)
        bad = subprocess.run(["bash", GPU_CHECK, "--quantize-kernels", "fastest"], capture_output=True, text=True,
                             timeout=60, env=env)
        self.assertEqual((bad.returncode, bad.stdout), (2, ""), bad.stderr)
        self.assertEqual(bad.stderr, "gpu_check: --quantize-kernels fast|reference (got 'fastest')\n")

    def fake_run(self, bench=None):
        """gpu_check.sh --only kernels from a fake build on a fake GPU; bench: a fake bench_kernels, else the real one."""
        bin_dir, build, out = (os.path.join(self.dir, d) for d in ("bin", "build", "out"))
        for d in (bin_dir, os.path.join(build, "apps"), os.path.join(build, "tests"), out):
            os.makedirs(d, exist_ok=True)
        write_exe(os.path.join(bin_dir, "nvidia-smi"), FAKE_SMI)
        write_exe(os.path.join(build, "apps", "pretrain_llama"), FAKE_APP)
        write_exe(os.path.join(build, "tests", "pl_tests"), "#!/bin/sh\nexit 0\n")
        if bench == "missing":
            pass
        elif bench is not None:
            write_exe(os.path.join(build, "apps", "bench_kernels"), bench)
        else:
            os.symlink(BENCH_KERNELS, os.path.join(build, "apps", "bench_kernels"))
        env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", OUT=out, GPU_CHECK_TRAIN_DEVICE="cpu")
        p = subprocess.run(["bash", GPU_CHECK, "--build-dir", build, "--only", "kernels"], capture_output=True,
                           text=True, timeout=300, env=env)
        return p.returncode, p.stdout + p.stderr, out

    def test_the_kernel_table_from_the_real_bench_kernels_on_the_cpu(self):
        if not os.access(BENCH_KERNELS, os.X_OK):
            self.fail(f"no bench_kernels beside $PL_APP_PATH ({BENCH_KERNELS}): run this test through ctest")
        rc, text, out = self.fake_run()
        self.assertEqual(rc, 0, text)
        self.assertRegex(text, r"kernels \(bench_kernels, 8B layers\) +~ *\d+ s  \(limit 170 s")
        self.assertIn("== kernels (limit ", text)
        # --quantize-kernels both: the fast and the reference quantize kernels side by side (issue 40); on the
        # CPU, which has one set, each row once.
        self.assertIn("--device cpu --model llama_tiny --seq-length 128 --micro-batch-size 2 --quantize-kernels both "
                      "--json " + os.path.join(out, "kernels.json"), text)
        kernel_rows = [l for l in text.splitlines() if re.match(r"^(quantize|expand) ", l)]
        gemm_rows = [l for l in text.splitlines() if re.match(r"^(qkv|proj|fc1|fc2) +\d+x\d+x\d+ +(fprop|dgrad|wgrad) ", l)]
        # Each row once on the screen (say prints it and appends it to the report).
        self.assertEqual(len(kernel_rows), 4 * (17 + 3), text)
        self.assertEqual(len(gemm_rows), 4 * 3, text)
        self.assertIn("kernels: 80 kernel rows, 12 GEMM rows; JSON " + os.path.join(out, "kernels.json"), text)
        with open(os.path.join(out, "kernels.json")) as fh:
            j = json.load(fh)
        self.assertEqual((j["complete"], len(j["kernels"]), len(j["gemms"])), (True, 80, 12))
        with open(os.path.join(out, "gpu_check.txt")) as fh:
            report = fh.read()
        self.assertIn("nvfp4 dy row + col RHT, SR", report)
        self.assertIn("gpu_check: all checks passed", report)

    def test_a_table_cut_short_or_a_missing_bench_fails(self):
        rc, text, _ = self.fake_run(FAKE_STOPPED)
        self.assertEqual(rc, 1, text)
        self.assertIn("FAILED: kernels: bench_kernels: stopped at --budget-seconds 150: 10 of 96 kernels timed", text)
        shutil.rmtree(self.dir)
        os.makedirs(self.dir)
        rc, text, _ = self.fake_run("missing")
        self.assertEqual(rc, 1, text)
        self.assertRegex(text, r"FAILED: kernels: \S+/apps/bench_kernels is missing \(scripts/gpu_bundle.sh bundles bench_kernels\)")


if __name__ == "__main__":
    unittest.main(verbosity=2)
