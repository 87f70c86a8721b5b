#!/usr/bin/env python3
"""ctest BenchTorch.peer: scripts/bench_torch.py (the PyTorch peer) and scripts/gpu_check.sh --only peer, on a
machine without a GPU and without torch (CI's):
  - bench_torch.py's argument handling: a CUDA mode on the CPU and a CPU mode on a GPU refused in one line,
    exit 2; --mode required; --num-layers and the BF16 edge-layer counts checked; a model config by name
    (configs/models/NAME.json) or by path, an unknown name in one line; --device cuda without torch or
    without a GPU: one line, exit 3;
  - --print-parameter-count equal to pretrain_llama's count (ModelConfig::num_parameters, computed here again
    from the config JSON; and, when ctest gives the binary, pretrain_llama's own: the exact count of a one-
    iteration llama_tiny run's --log-jsonl start event, the dry run's "parameters: X B" for the 8B shapes)
    for llama3_8b, llama_tiny and llama3_8b --num-layers 4;
  - scripts/torch_peer.sh's pin as bench_torch.py reads it;
  - gpu_check.sh --only peer without a GPU: one line, exit 3; and with a fake GPU (nvidia-smi), a fake build
    (pretrain_llama writing a JSON-lines log) and a fake CUDA torch ($PEER_PYTHON printing bench_torch.py's
    lines): the peer table, its ratios, the python and torch named, and the warning for an unpaired torch.
Whatever needs torch (a CPU training run of the peer, the PyTorch model's own parameter count) runs when some
python3 here has torch and is skipped saying so otherwise. Plain unittest.
"""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SCRIPTS = os.path.join(REPO, "scripts")
BENCH = os.path.join(SCRIPTS, "bench_torch.py")
GPU_CHECK = os.path.join(SCRIPTS, "gpu_check.sh")
CONFIGS = os.environ.get("PL_CONFIG_DIR") or os.path.join(REPO, "configs")
sys.path.insert(0, SCRIPTS)
import bench_torch  # noqa: E402  (standard library only at import time)


def run(*args, python=None, env=None, timeout=120):
    p = subprocess.run([python or sys.executable, BENCH, *args], capture_output=True, text=True, timeout=timeout,
                       env=env, stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def has_torch(python):
    try:
        return subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def has_cuda_torch(python):
    try:
        return subprocess.run([python, "-c", "import torch, sys; sys.exit(not torch.cuda.is_available())"],
                              capture_output=True, timeout=120).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def gpu_present():
    if shutil.which("nvidia-smi"):
        p = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
        if p.returncode == 0 and re.search(r"^GPU [0-9]", p.stdout, re.M):
            return True
    return any(re.fullmatch(r"nvidia[0-9]+", n) for n in os.listdir("/dev"))


def expected_count(model, num_layers=None):
    """pretrain_llama's count from the config JSON (lib/config/model_config.cpp ModelConfig::num_parameters),
    written out here independently of bench_torch.py."""
    with open(os.path.join(CONFIGS, "models", model + ".json")) as fh:
        j = json.load(fh)
    h, f, n = j["hidden_size"], j["ffn_hidden_size"], j["num_attention_heads"]
    g, d = j.get("num_query_groups", n), j.get("kv_channels", h // n)
    norms, qkv, proj, mlp = 2 * h, (n + 2 * g) * d * h, h * n * d, 3 * f * h
    return (num_layers or j["num_layers"]) * (norms + qkv + proj + mlp) + h + 2 * j["vocab_size"] * h


def printed_count(out):
    m = re.search(r"^bench_torch: .*: ([0-9]+) parameters \(", out, re.M)
    assert m, out
    return int(m.group(1))


def app_path():
    p = os.environ.get("PL_APP_PATH")
    return p if p and os.access(p, os.X_OK) else None


class Arguments(unittest.TestCase):
    def one_line(self, result, status, *parts):
        rc, out, err = result
        self.assertEqual(rc, status, (out, err))
        self.assertEqual(out, "")
        self.assertEqual(len(err.splitlines()), 1, err)
        self.assertTrue(err.startswith("bench_torch.py: error: "), err)
        for p in parts:
            self.assertIn(p, err)

    def test_cuda_modes_refused_on_the_cpu_and_cpu_modes_on_a_gpu(self):
        self.one_line(run("--mode", "bf16_compile"), 2, "--mode bf16_compile runs on --device cuda, not --device cpu")
        self.one_line(run("--mode", "fp8_torchao", "--device", "cpu"), 2, "--mode fp8_torchao runs on --device cuda")
        self.one_line(run("--mode", "fp32_eager", "--device", "cuda"), 2, "--mode fp32_eager runs on --device cpu")
        self.one_line(run("--mode", "bf16_autocast", "--device", "cuda"), 2, "runs on --device cpu")

    def test_bad_options(self):
        self.one_line(run(), 2, "--mode is required")
        self.one_line(run("--mode", "fp8"), 2, "argument --mode: invalid choice")
        self.one_line(run("--mode", "fp32_eager", "--device", "gpu"), 2, "argument --device: invalid choice")
        self.one_line(run("--mode", "fp32_eager", "--num-layers", "0"), 2, "argument --num-layers: must be a positive")
        self.one_line(run("--mode", "fp8_torchao", "--device", "cuda", "--num-layers-at-end-in-bf16", "-1"), 2,
                      "argument --num-layers-at-end-in-bf16: must be a non-negative integer")
        self.one_line(run("--mode", "fp32_eager", "--gbs", "6", "--mbs", "4"), 2, "--gbs 6 is not a multiple of --mbs 4")

    def test_model_by_name_and_by_path_and_an_unknown_name(self):
        by_name = run("--print-parameter-count", "--model", "llama_small")
        by_path = run("--print-parameter-count", "--model", os.path.join(CONFIGS, "models", "llama_small.json"))
        default = run("--print-parameter-count")
        self.assertEqual(by_name[0], 0, by_name)
        self.assertEqual(by_name, by_path)
        self.assertEqual(by_name, default)
        self.one_line(run("--print-parameter-count", "--model", "no_such_model"), 1,
                      "--model no_such_model: not a file, and no model config of that name")
        # $PRETRAIN_LLAMA_CONFIGS first, as pretrain_llama (gpu_check.sh points it at the bundle's configs).
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "models"))
            with open(os.path.join(CONFIGS, "models", "llama_tiny.json")) as fh:
                j = json.load(fh)
            j.update(name="tiny_elsewhere", num_layers=3)
            with open(os.path.join(d, "models", "tiny_elsewhere.json"), "w") as fh:
                json.dump(j, fh)
            rc, out, err = run("--print-parameter-count", "--model", "tiny_elsewhere",
                               env=dict(os.environ, PRETRAIN_LLAMA_CONFIGS=d))
            self.assertEqual(rc, 0, err)
            self.assertIn("bench_torch: tiny_elsewhere: ", out)
            self.assertEqual(printed_count(out), expected_count("llama_tiny", 3))

    def test_device_cuda_without_torch_or_gpu_is_one_line_exit_3(self):
        if has_cuda_torch(sys.executable):
            self.skipTest(f"{sys.executable} has a CUDA torch and sees a GPU: the runs would be real")
        for mode in ("bf16_compile", "fp8_torchao"):
            with self.subTest(mode):
                rc, out, err = run("--mode", mode, "--device", "cuda", "--model", "llama_tiny", "--iters", "1")
                self.assertEqual((rc, out), (3, ""), err)
                self.assertEqual(len(err.splitlines()), 1, err)
                self.assertRegex(err, r"^bench_torch.py: error: (--device cuda needs PyTorch with CUDA under |"
                                      r"no GPU is present |--mode \w+ needs torch.compile)")

    def test_the_pin_as_bench_torch_reads_it(self):
        pins = bench_torch.read_pins()
        self.assertRegex(pins.get("TORCHAO_VERSION", ""), r"^[0-9]+\.[0-9]+\.[0-9]+$")
        self.assertRegex(pins.get("TORCHAO_TORCH", ""), r"^[0-9]+\.[0-9]+$")
        p = subprocess.run(["bash", "-c", 'source "$1"; echo "$TORCHAO_VERSION $TORCHAO_TORCH $TORCHAO_WHEEL"', "-",
                            os.path.join(SCRIPTS, "torch_peer.sh")], capture_output=True, text=True, timeout=30)
        self.assertEqual(p.stdout.split(), [pins["TORCHAO_VERSION"], pins["TORCHAO_TORCH"],
                                            f"torchao-{pins['TORCHAO_VERSION']}-py3-none-any.whl"])


class ParameterCount(unittest.TestCase):
    CASES = (("llama3_8b", None), ("llama_tiny", None), ("llama3_8b", 4))

    def test_equals_pretrain_llamas_formula(self):
        torch_here = has_torch(sys.executable)
        for model, layers in self.CASES:
            with self.subTest(model=model, layers=layers):
                args = ["--print-parameter-count", "--model", model] + (["--num-layers", str(layers)] if layers else [])
                rc, out, err = run(*args)
                self.assertEqual((rc, err), (0, ""))
                self.assertEqual(printed_count(out), expected_count(model, layers))
                label = model + (f" --num-layers {layers}" if layers else "")
                self.assertTrue(out.startswith(f"bench_torch: {label}: "), out)
                # With torch, the PyTorch model's own sum of numel was compared (and equal, or exit 1).
                self.assertIn("equal to the PyTorch model's sum of numel" if torch_here else "not built", out)
        self.assertEqual(expected_count("llama3_8b"), 8030261248)  # pretrain_llama --dry-run: "8.03 B"

    def test_the_pytorch_models_own_count(self):
        pythons = [p for p in (sys.executable, "/usr/bin/python3") if os.access(p, os.X_OK) and has_torch(p)]
        if not pythons:
            self.skipTest("no python3 here has torch (the PyTorch model's own count is checked where one has)")
        for model, layers in self.CASES:
            args = ["--print-parameter-count", "--model", model] + (["--num-layers", str(layers)] if layers else [])
            rc, out, err = run(*args, python=pythons[0])
            self.assertEqual((rc, err), (0, ""))
            self.assertIn("equal to the PyTorch model's sum of numel", out)

    def test_equals_pretrain_llamas_own_count(self):
        app = app_path()
        if not app:
            self.skipTest("PL_APP_PATH not set (ctest sets it): pretrain_llama's own count not compared")
        with tempfile.TemporaryDirectory() as d:
            jsonl = os.path.join(d, "tiny.jsonl")
            p = subprocess.run([app, "--model", "llama_tiny", "--device", "cpu", "--train-iters", "1",
                                "--global-batch-size", "2", "--micro-batch-size", "1", "--seq-length", "16",
                                "--log-jsonl", jsonl], capture_output=True, text=True, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            with open(jsonl) as fh:
                start = next(json.loads(line) for line in fh if '"start"' in line)
            self.assertEqual(printed_count(run("--print-parameter-count", "--model", "llama_tiny")[1]),
                             start["model"]["parameters"])
        for layers in (None, 4):
            extra = ["--num-layers", str(layers)] if layers else []
            p = subprocess.run([app, "--dry-run", "--model", "llama3_8b", "--device", "cpu", "--micro-batch-size", "1",
                                "--seq-length", "4096", *extra], capture_output=True, text=True, timeout=300)
            m = re.search(r"parameters: ([0-9.]+) B", p.stdout + p.stderr)
            self.assertTrue(m, p.stdout + p.stderr)
            ours = printed_count(run("--print-parameter-count", "--model", "llama3_8b", *extra)[1])
            self.assertEqual(m.group(1), f"{ours / 1e9:.2f}")


class CpuRun(unittest.TestCase):
    def test_fp32_eager_on_llama_tiny(self):
        python = next((p for p in (sys.executable, "/usr/bin/python3") if os.access(p, os.X_OK) and has_torch(p)), None)
        if python is None:
            self.skipTest("no python3 here has torch (Debian: python3-torch): the CPU peer's run not tried")
        rc, out, err = run("--mode", "fp32_eager", "--model", "llama_tiny", "--iters", "3", "--gbs", "2", "--mbs", "1",
                           "--seq", "32", "--threads", "1", python=python, timeout=600)
        self.assertEqual(rc, 0, err)
        lines = out.splitlines()
        self.assertEqual(len(lines), 2, out)
        self.assertIn(f"llama_tiny: {expected_count('llama_tiny')} parameters", lines[0])
        self.assertRegex(lines[1], r"^bench_torch: fp32_eager \| threads 1 \| gbs 2 mbs 1 seq 32 \| "
                                   r"step time [0-9.]+ s \| [0-9]+ tokens/s$")


# ---- gpu_check.sh --only peer ------------------------------------------------------------------------

FAKE_SMI = """#!/bin/sh
case "$*" in
  -L) echo 'GPU 0: NVIDIA H200 (UUID: GPU-fake)' ;;
  *query-gpu=compute_cap*) echo '9.0' ;;
  *) echo 'NVIDIA H200, 9.0, 580.00, 143771 MiB' ;;
esac
"""
# pretrain_llama: the library check passes; a run writes a JSON-lines log, FP8 faster than BF16.
FAKE_APP = r"""#!/bin/bash
[[ $1 == --print-library-versions ]] && { echo 'pretrain_llama | ✓ fake'; exit 0; }
echo "pretrain_llama $*" >>"${FAKE_LOG:-/dev/null}"
jsonl="" tok=60000 peak=40000000000
while (($#)); do
  case $1 in
    --log-jsonl) jsonl=$2; shift ;;
    --recipe) [[ $2 == bf16_with_fp8_current_scaling_mixed ]] && tok=75000 peak=42000000000; shift ;;
  esac
  shift
done
printf '{"event": "start", "schema_version": 1, "model": {"name": "llama3_8b", "parameters": 1923125248}}\n' >"$jsonl"
printf '{"event": "end", "tokens_per_s": %s, "final_lm_loss": 10.5, "nan_iterations": 0, "memory": {"max_allocated_bytes": %s}}\n' \
  "$tok" "$peak" >>"$jsonl"
"""
# A python3 with a CUDA torch: answers gpu_check.sh's probes and prints bench_torch.py's result lines.
FAKE_PY = r"""#!/bin/bash
if [[ $1 == -c && $2 == *'import torch;'* ]]; then echo "${FAKE_TORCH:-2.11.0+cu130} 13.0"; exit 0; fi
if [[ $1 == -c && $2 == *'import torchao'* ]]; then
  [[ -n $PYTHONPATH && -f $PYTHONPATH/torchao/float8/__init__.py ]] || exit 1
  echo "0.17.0 $PYTHONPATH/torchao/__init__.py"; exit 0
fi
if [[ $1 == - ]]; then exec python3 "$@"; fi
mode=""; for ((i = 1; i <= $#; i++)); do [[ ${!i} == --mode ]] && { j=$((i + 1)); mode=${!j}; }; done
tok=50000; [[ $mode == fp8_torchao ]] && tok=62500
echo "bench_torch: $mode | setup | fake"
echo "bench_torch: $mode | torch 2.11.0+cu130 (CUDA 13.0) | llama3_8b --num-layers 4: 1923125248 parameters (1923.125 M) | loss"
echo "bench_torch: $mode | GPU NVIDIA H200 | gbs 8 mbs 1 seq 4096 | step time 0.655 s | $tok tokens/s | peak memory 45.50 GB"
"""


def write_exe(path, text):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def make_wheel(path):
    """A stand-in for torchao's py3-none-any wheel: a zip with torchao/float8, a test/ folder and a .so."""
    import zipfile
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("torchao/__init__.py", "__version__ = '0.17.0'\n")
        z.writestr("torchao/float8/__init__.py", "")
        z.writestr("torchao/_C.abi3.so", "not a library")
        z.writestr("test/test_x.py", "")
        z.writestr("torchao-0.17.0.dist-info/METADATA", "Name: torchao\nVersion: 0.17.0\n")


class GpuCheckPeer(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def test_without_a_gpu_one_line_exit_3(self):
        if gpu_present():
            self.skipTest("this machine has a GPU: gpu_check.sh would run for real")
        empty = os.path.join(self.dir, "empty")
        os.makedirs(empty)
        p = subprocess.run(["bash", GPU_CHECK, "--only", "peer"], capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PATH=f"{empty}:/usr/bin:/bin"))
        self.assertEqual((p.returncode, p.stdout), (3, ""), p.stderr)
        self.assertEqual(p.stderr, "gpu_check: no GPU is present (nvidia-smi not found, no /dev/nvidia*): nothing to check\n")

    def test_only_lists_its_steps(self):
        p = subprocess.run(["bash", GPU_CHECK, "--only", "nothing"], capture_output=True, text=True, timeout=60)
        self.assertEqual(p.returncode, 2)
        self.assertEqual(p.stderr, "gpu_check: --only conformance|training|roofline|peer|kernels\n")

    def fake_run(self, torch_version="2.11.0+cu130", wheel=True):
        """gpu_check.sh --only peer from a fake bundle-less build, a fake GPU and a fake CUDA torch."""
        bin_dir, build = os.path.join(self.dir, "bin"), os.path.join(self.dir, "build")
        for d in (bin_dir, os.path.join(build, "apps"), os.path.join(build, "tests"), os.path.join(self.dir, "out")):
            os.makedirs(d, exist_ok=True)
        write_exe(os.path.join(bin_dir, "nvidia-smi"), FAKE_SMI)
        write_exe(os.path.join(build, "apps", "pretrain_llama"), FAKE_APP)
        write_exe(os.path.join(build, "tests", "pl_tests"), "#!/bin/sh\nexit 0\n")
        py = write_exe(os.path.join(self.dir, "fake_python3"), FAKE_PY)
        # gpu_check.sh beside a copy of the scripts: the checkout's .cache/wheels is this test's own.
        scripts = os.path.join(self.dir, "repo", "scripts")
        shutil.copytree(SCRIPTS, scripts, ignore=shutil.ignore_patterns("__pycache__"))
        if wheel:
            wheels = os.path.join(self.dir, "repo", ".cache", "wheels")
            os.makedirs(wheels)
            make_wheel(os.path.join(wheels, f"torchao-{bench_torch.read_pins()['TORCHAO_VERSION']}-py3-none-any.whl"))
        env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin", PEER_PYTHON=py, FAKE_TORCH=torch_version,
                   OUT=os.path.join(self.dir, "out"), FAKE_LOG=os.path.join(self.dir, "app.log"))
        p = subprocess.run(["bash", os.path.join(scripts, "gpu_check.sh"), "--build-dir", build, "--only", "peer"],
                           capture_output=True, text=True, timeout=300, env=env)
        return p.returncode, p.stdout + p.stderr

    def test_the_peer_table_from_fake_runs(self):
        rc, out = self.fake_run()
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"peer \(ours and PyTorch, 8B 4 layers\) +~ *\d+ s")
        self.assertIn(f"PyTorch: {self.dir}/fake_python3, torch 2.11.0+cu130 (CUDA 13.0)", out)
        self.assertIn("torchao 0.17.0 (from ", out)
        self.assertNotIn("warning: torch", out)
        rows = {line.split()[0]: line.split() for line in out.splitlines()
                if line.startswith(("bf16_mixed ", "bf16_with_fp8_current_scaling_mixed ", "FP8 / BF16"))}
        self.assertEqual(rows["bf16_mixed"][:7], ["bf16_mixed", "60000", "50000", "1.20", "bf16_compile", "40.00", "45.50"])
        self.assertEqual(rows["bf16_with_fp8_current_scaling_mixed"][:7],
                         ["bf16_with_fp8_current_scaling_mixed", "75000", "62500", "1.20", "fp8_torchao", "42.00", "45.50"])
        self.assertIn("FP8 / BF16 (tokens/s)                       1.25           1.25", out)
        # Ours: the recipes as the training table selects them, the 8B slice, --log-jsonl.
        with open(os.path.join(self.dir, "app.log")) as fh:
            runs = fh.read().splitlines()
        self.assertEqual(len(runs), 2, runs)
        self.assertIn("--model llama3_8b --num-layers 4 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8",
                      runs[0])
        self.assertTrue(runs[0].endswith("--disable-fp4"), runs[0])
        self.assertTrue(runs[1].endswith("--recipe bf16_with_fp8_current_scaling_mixed"), runs[1])
        self.assertTrue(os.path.isfile(os.path.join(self.dir, "out", "gpu_check.txt")))

    def test_an_unpaired_torch_is_warned_about_and_no_torchao_fails_its_row(self):
        rc, out = self.fake_run(torch_version="2.12.0+cu130", wheel=False)
        self.assertEqual(rc, 1, out)
        self.assertIn("warning: torch 2.12.0+cu130 is not torch 2.11", out)
        self.assertIn("torchao: not importable", out)
        self.assertIn("FAILED: peer PyTorch fp8_torchao: not run (no torchao)", out)
        self.assertRegex(out, r"bf16_mixed +60000 +50000 +1\.20 ")


if __name__ == "__main__":
    unittest.main(verbosity=2)
