#!/usr/bin/env python3
"""PyTorch's training step on pretrain_llama's model shape: the peer that scripts/bench_cpu.sh (CPU) and
scripts/gpu_check.sh --only peer (GPU) compare with.

A Llama of the exact shape of a model config (default configs/models/llama_small.json; --model takes a file
or a name in configs/models, --num-layers N overrides its layers as pretrain_llama's flag) written in plain
PyTorch as a user would (scripts/bench_torch_model.py): fused QKV and gate|up projections as this program's
(Megatron's) layout, RMSNorm, rotary embedding with Llama 3.1 frequency scaling, grouped-query attention,
SwiGLU, an untied LM head, no biases, this program's initialization (N(0, std), output projections
std/sqrt(2 layers), norms 1). Its parameter count equals pretrain_llama's (ModelConfig::num_parameters:
Megatron's count, no norm biases); --print-parameter-count prints it (computed from the config, and checked
against the PyTorch model's sum of numel when torch is importable) and exits. Trained on random tokens with
AdamW at this program's defaults (lib/train/optimizer.h: betas 0.9/0.95, eps 1e-8, weight decay 0.033 except
the norm weights, gradient clipping at global norm 1.0; lib/train/lr_schedule.cpp: linear warmup over 2
iterations from 0, cosine decay 3e-4 -> 3e-5 over the run), the global batch accumulated over micro-batches.

Modes, --device cpu (the default):
  fp32_eager      everything FP32; attention the explicit causal softmax(QK^T/sqrt(d))V (torch 1.13 has no
                  F.scaled_dot_product_attention, which came with 2.0)
  bf16_autocast   the model under torch.autocast("cpu", dtype=torch.bfloat16): PyTorch's own BF16 mixed
                  precision; FP32 weights, optimizer and softmax; the logits cast to FP32 for the loss
--device cuda, as a demanding PyTorch user trains on one GPU (torchtitan's choices):
  bf16_compile    FP32 master parameters under torch.autocast("cuda", dtype=torch.bfloat16); torch.compile
                  per decoder layer (fullgraph) and of the final norm + LM head + loss, as torchtitan
                  compiles; attention by F.scaled_dot_product_attention(is_causal=True, enable_gqa=True)
                  (k/v repeated per query head on a torch without enable_gqa); fused AdamW
                  (torch.optim.AdamW(fused=True)); the same clipping, hyper-parameters and schedule
  fp8_torchao     the same plus torchao's float8 training with tensorwise dynamic scaling
                  (convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                  module_filter_fn=...) before torch.compile, as torchtitan runs it): E4M3 activations and
                  weights, E5M2 gradients, one scale per tensor computed from the tensor itself (current
                  scaling). FP8: the four linears (qkv, proj, fc1, fc2) of the decoder layers except the first
                  --num-layers-at-start-in-bf16 and the last --num-layers-at-end-in-bf16 (default 1 and 1:
                  this program's bf16_with_fp8_current_scaling_mixed keeps its first and last decoder layer in
                  BF16, so the comparison is like for like; 0 and 0: every layer in FP8). BF16 (autocast): the
                  LM head (torchtitan's filter keeps the output layer in BF16; so does this program), the
                  edge layers, attention's SDPA, norms, embedding
Prints, per mode:
  bench_torch: <mode> | torch V | <model>: N parameters (X M) | loss step 1 L1 (ln vocab ...) ...
  bench_torch: <mode> | threads T | gbs G mbs M seq S | step time X s | Y tokens/s
(on a GPU "GPU <name>" in place of the threads, and "| peak memory Z GB" at the end: torch.cuda's
max_memory_allocated, GB = 1e9; before them a setup line), with the mean step time over the last 60% of the
iterations (iterations round(0.4 n) to n: the window of pretrain_llama's summary line,
lib/train/trainer.cpp; on a GPU each step between torch.cuda.synchronize calls, so the first iterations'
compilation is outside the window) and tokens/s = gbs * seq / that mean. --profile adds one iteration after
the timed ones under torch.profiler and prints its ops, top 15 by self time (not counted in the step time).

Needs PyTorch. --device cpu: Debian's python3-torch installs it for /usr/bin/python3; run by a python3
without it, the script re-runs under /usr/bin/python3 when that one has it, else exits 3 saying so.
--device cuda: PyTorch 2.x with CUDA under this python3 (run it by that environment's python3), exit 3 when
it is missing, has no torch.compile, sees no GPU, or (fp8_torchao) when torchao is not importable (the
bundle of scripts/gpu_bundle.sh carries the wheel of the release that scripts/torch_peer.sh pins;
scripts/gpu_check.sh --only peer puts it on PYTHONPATH). The CUDA-only imports (torchao, torch.compile, SDPA)
happen only with --device cuda. A CUDA mode with --device cpu, or a CPU mode with --device cuda: one line,
exit 2. Every error is one line (script_errors.py), never a traceback.
"""

import argparse
import contextlib
import json
import math
import os
import re
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # script_errors.py beside this script
import script_errors  # noqa: E402

PROG = "bench_torch"  # (the prefix of its result lines, which scripts/bench_cpu.sh and gpu_check.sh read)
SCRIPT = "bench_torch.py"  # (the prefix of its error lines)
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)  # a checkout, or the bundle (.device/: scripts/ beside configs/)
MODES = {"fp32_eager": "cpu", "bf16_autocast": "cpu", "bf16_compile": "cuda", "fp8_torchao": "cuda"}
PIN_FILE = os.path.join(HERE, "torch_peer.sh")


def non_negative_int(text):
    if not re.fullmatch(r"\s*\+?[0-9]+\s*", text):
        raise argparse.ArgumentTypeError(f"must be a non-negative integer, not '{text}'")
    return int(text)


def parse_args(argv):
    parser = script_errors.ArgumentParser(prog=SCRIPT, description=__doc__.split("\n\n")[0],
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    count = script_errors.positive_int
    parser.add_argument("--mode", choices=tuple(MODES), help="required unless --print-parameter-count")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu (fp32_eager, bf16_autocast) or cuda (bf16_compile, fp8_torchao); default cpu")
    parser.add_argument("--model", default=os.path.join(REPO, "configs", "models", "llama_small.json"),
                        help="model config JSON, or a name in configs/models (llama3_8b); default llama_small")
    parser.add_argument("--num-layers", type=count, help="override the config's num_layers (pretrain_llama's flag)")
    parser.add_argument("--num-layers-at-start-in-bf16", type=non_negative_int, default=1,
                        help="fp8_torchao: the first N decoder layers stay BF16 (default 1, as our FP8 recipe)")
    parser.add_argument("--num-layers-at-end-in-bf16", type=non_negative_int, default=1,
                        help="fp8_torchao: the last N decoder layers stay BF16 (default 1, as our FP8 recipe)")
    parser.add_argument("--threads", type=count, default=os.cpu_count() or 1,
                        help="torch.set_num_threads on the CPU (default: all cores)")
    parser.add_argument("--gbs", type=count, default=8, help="global batch size (samples)")
    parser.add_argument("--mbs", type=count, default=2, help="micro-batch size; gbs/mbs micro-batches accumulated")
    parser.add_argument("--seq", type=count, default=256, help="sequence length")
    parser.add_argument("--iters", type=count, default=10, help="iterations (the last 60%% are timed)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--profile", action="store_true", help="profile one more iteration; print the top 15 ops")
    parser.add_argument("--print-parameter-count", action="store_true",
                        help="print the model's parameter count (as pretrain_llama's) and exit")
    args = parser.parse_args(argv)
    if args.gbs % args.mbs:
        parser.error(f"--gbs {args.gbs} is not a multiple of --mbs {args.mbs}")
    if args.print_parameter_count:
        return args
    if args.mode is None:
        parser.error("--mode is required (one of " + ", ".join(MODES) + ")")
    if MODES[args.mode] != args.device:
        parser.error(f"--mode {args.mode} runs on --device {MODES[args.mode]}, not --device {args.device}")
    return args


class Error(script_errors.ScriptError):
    """A model config this script cannot use: one line naming the file and the field, exit 1."""


SIZE_FIELDS = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "vocab_size")
REAL_FIELDS = ("rotary_base", "rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor",
               "rope_original_max_position", "layernorm_epsilon", "init_method_std")


def read_json_object(path):
    data = script_errors.read_regular_file(path, Error)  # a FIFO: one line, never a hang
    try:
        j = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise Error(f"{path}: not JSON ({type(e).__name__})")
    if not isinstance(j, dict):
        raise Error(f"{path}: not a model config (the top level is not an object)")
    return j


def read_config(path):
    """The fields of the program's model config (lib/config/model_config.cpp) with its defaults."""
    j = read_json_object(path)
    missing = [k for k in ("name", "rotary_base") + SIZE_FIELDS if k not in j]
    if missing:
        raise Error(f"{path}: missing field {missing[0]}")
    for key in SIZE_FIELDS + ("num_query_groups", "kv_channels"):
        if key in j and (not isinstance(j[key], int) or isinstance(j[key], bool) or j[key] <= 0):
            raise Error(f"{path}: field {key} must be a positive integer")
    for key in REAL_FIELDS:
        v = j.get(key, 1.0)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
            raise Error(f"{path}: field {key} must be a finite number > 0")
    if j["num_attention_heads"] % j.get("num_query_groups", 1):
        raise Error(f"{path}: num_attention_heads is not a multiple of num_query_groups")
    if j.get("rope_scaling") and j.get("rope_low_freq_factor", 1.0) == j.get("rope_high_freq_factor", 4.0):
        raise Error(f"{path}: rope_low_freq_factor equals rope_high_freq_factor (Llama 3.1's blend divides by "
                    f"their difference)")
    heads = j["num_attention_heads"]
    return {
        "name": j["name"], "layers": j["num_layers"], "hidden": j["hidden_size"], "ffn": j["ffn_hidden_size"],
        "heads": heads, "groups": j.get("num_query_groups", heads),
        "head_dim": j.get("kv_channels", j["hidden_size"] // heads), "vocab": j["vocab_size"],
        "rotary_base": j["rotary_base"], "rope_scaling": j.get("rope_scaling", False),
        "rope_factor": j.get("rope_scaling_factor", 8.0), "rope_low": j.get("rope_low_freq_factor", 1.0),
        "rope_high": j.get("rope_high_freq_factor", 4.0),
        "rope_old_ctx": j.get("rope_original_max_position", 8192), "eps": j.get("layernorm_epsilon", 1e-5),
        "std": j.get("init_method_std", 0.02),
    }


def inverse_frequencies(cfg):
    """The rotary inverse frequencies as lib/model/llama.cpp's rope_tables: Llama 3.1's scaling (Meta's
    apply_scaling: long wavelengths divided by the factor, short ones kept, a smooth blend between)."""
    out = []
    for i in range(cfg["head_dim"] // 2):
        f = 1.0 / cfg["rotary_base"] ** (2 * i / cfg["head_dim"])
        if cfg["rope_scaling"]:
            old, low, high = cfg["rope_old_ctx"], cfg["rope_low"], cfg["rope_high"]
            wavelen = 2 * math.pi / f
            if wavelen > old / low:
                f = f / cfg["rope_factor"]
            elif wavelen >= old / high:
                smooth = (old / wavelen - low) / (high - low)
                f = (1 - smooth) * f / cfg["rope_factor"] + smooth * f
        out.append(f)
    return out


def resolve_model(text):
    """--model: a file as given; a plain name (no '/', no .json) is configs/models/NAME.json, looked up in
    $PRETRAIN_LLAMA_CONFIGS (as pretrain_llama; gpu_check.sh sets it to the bundle's configs), then beside
    this script (a checkout's configs/, the bundle's)."""
    if "/" in text or text.endswith(".json") or os.path.exists(text):
        return text
    tried = []
    for base in (os.environ.get("PRETRAIN_LLAMA_CONFIGS"), os.path.join(REPO, "configs")):
        if base:
            path = os.path.join(base, "models", text + ".json")
            if os.path.isfile(path):
                return path
            tried.append(path)
    raise Error(f"--model {text}: not a file, and no model config of that name ({', '.join(tried)})")


def model_config(args):
    """The config of --model with --num-layers applied, and its label ("llama3_8b --num-layers 4")."""
    cfg = read_config(resolve_model(args.model))
    label = cfg["name"]
    if args.num_layers:
        cfg["layers"] = args.num_layers
        label += f" --num-layers {args.num_layers}"
    return cfg, label


def parameter_count(cfg):
    """pretrain_llama's count (lib/config/model_config.cpp ModelConfig::num_parameters, Megatron's without
    norm biases): per layer two RMSNorm weights, linear_qkv, linear_proj, fc1 (gate|up) and fc2; then the final
    norm and the untied embedding and LM head over the unpadded vocabulary."""
    h, d = cfg["hidden"], cfg["head_dim"]
    per_layer = 2 * h + (cfg["heads"] + 2 * cfg["groups"]) * d * h + h * cfg["heads"] * d + 3 * cfg["ffn"] * h
    return cfg["layers"] * per_layer + h + 2 * cfg["vocab"] * h


def read_pins():
    """scripts/torch_peer.sh's TORCHAO_VERSION and TORCHAO_TORCH ({} when the file is not beside this script)."""
    try:
        text = script_errors.read_regular_file(PIN_FILE, Error).decode("utf-8", "replace")
    except Error:
        return {}
    return dict(re.findall(r"^(TORCHAO_VERSION|TORCHAO_TORCH)=([0-9A-Za-z.+]+)\s*$", text, re.M))


class Unavailable(script_errors.ScriptError):
    """What this run needs is not here (torch, a GPU, torchao): one line, exit 3."""

    status = 3


def print_parameter_count(cfg, label):
    n = parameter_count(cfg)
    try:
        import bench_torch_model
    except ImportError:
        check = "the PyTorch model not built (no torch under this python3)"
    else:
        built = bench_torch_model.parameter_count(cfg)
        if built != n:
            raise Error(f"{label}: the PyTorch model has {built} parameters, pretrain_llama's formula {n}")
        check = "equal to the PyTorch model's sum of numel"
    size = f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.3f} M"
    print(f"{PROG}: {label}: {n} parameters ({size}) | pretrain_llama's count; {check}")
    return 0


def import_torch(args, argv):
    """torch for this run. CPU: re-run under /usr/bin/python3 when this python3 lacks it (exit 3 if that
    has none either). CUDA: this python3's torch 2.x with a GPU; fp8_torchao: and torchao's float8."""
    if args.device == "cpu":
        try:
            script_errors.import_or_rerun(__file__, argv, "torch")
        except script_errors.MissingModule as e:
            raise Unavailable(str(e))
        import bench_torch_model
        return bench_torch_model, None
    try:
        import torch
    except ImportError as e:
        raise Unavailable(f"--device cuda needs PyTorch with CUDA under {sys.executable}: {e}")
    cuda = f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'})"
    if not hasattr(torch, "compile") or not hasattr(torch.nn.functional, "scaled_dot_product_attention"):
        raise Unavailable(f"--mode {args.mode} needs torch.compile and SDPA (torch 2.0 or newer): {cuda}")
    if not torch.cuda.is_available():
        raise Unavailable(f"no GPU is present ({cuda} under {sys.executable}: torch.cuda.is_available() is False)")
    if args.mode == "fp8_torchao":
        cap = torch.cuda.get_device_capability()
        if cap < (8, 9):
            raise Unavailable(f"fp8_torchao needs FP8 GEMMs (sm_89 or newer); {torch.cuda.get_device_name()} is "
                              f"sm_{cap[0]}{cap[1]}")
        try:
            import torchao
            import torchao.float8  # noqa: F401
        except ImportError as e:
            pins = read_pins()
            wheel = f"torchao-{pins.get('TORCHAO_VERSION', '*')}-py3-none-any.whl"
            raise Unavailable(f"fp8_torchao needs torchao under {sys.executable} ({e}): the bundle carries it as "
                              f".device/wheels/{wheel} (scripts/gpu_bundle.sh); scripts/gpu_check.sh --only peer "
                              f"unpacks it onto PYTHONPATH")
        cuda += f", torchao {getattr(torchao, '__version__', '?')}"
    import bench_torch_model
    return bench_torch_model, cuda


def fp8_layers_text(layers, start, end):
    fp8 = [i for i in range(layers) if start <= i < layers - end]
    if not fp8:
        return "no decoder layer in FP8 (all within the BF16 edge layers)"
    return f"FP8 linears in decoder layers {fp8[0]}-{fp8[-1]} of 0-{layers - 1} (tensorwise; LM head and the rest BF16)"


def main(argv):
    args = parse_args(argv)
    cfg, label = model_config(args)
    if args.print_parameter_count:
        return print_parameter_count(cfg, label)
    M, versions = import_torch(args, argv)
    torch = M.torch
    device = args.device
    torch.manual_seed(args.seed)
    if device == "cpu":
        torch.set_num_threads(args.threads)
        model = M.Llama(cfg, args.seq, inverse_frequencies(cfg))
        opt = M.make_optimizer(model)
        if args.mode == "bf16_autocast":
            def precision():
                return torch.autocast("cpu", dtype=torch.bfloat16)
        else:
            precision = contextlib.nullcontext
        versions = f"torch {torch.__version__}"
        where = f"threads {args.threads}"
    else:
        attention = M.attention_kind(device)
        model = M.Llama(cfg, args.seq, inverse_frequencies(cfg), attention=attention, device=device)
        setup = [f"attention {'SDPA enable_gqa' if attention == 'sdpa_gqa' else 'SDPA, k/v repeated'}",
                 "torch.compile per layer + head/loss", "fused AdamW"]
        if args.mode == "fp8_torchao":
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
            convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name("tensorwise"),
                                       module_filter_fn=M.fp8_layer_filter(cfg["layers"],
                                                                           args.num_layers_at_start_in_bf16,
                                                                           args.num_layers_at_end_in_bf16))
            setup.append(fp8_layers_text(cfg["layers"], args.num_layers_at_start_in_bf16,
                                         args.num_layers_at_end_in_bf16))
        M.compile_like_torchtitan(model)
        opt = M.make_optimizer(model, fused=True)

        def precision():
            return torch.autocast("cuda", dtype=torch.bfloat16)
        where = f"GPU {torch.cuda.get_device_name()}"
        print(f"{PROG}: {args.mode} | setup | {' | '.join(setup)}", flush=True)
        torch.cuda.reset_peak_memory_stats()
    n_params = sum(p.numel() for p in model.parameters())
    if n_params != parameter_count(cfg):
        raise Error(f"{label}: the PyTorch model has {n_params} parameters, pretrain_llama's formula "
                    f"{parameter_count(cfg)}")
    data = torch.Generator().manual_seed(args.seed + 1)

    def step(i):
        return M.train_step(model, opt, args, i, data, precision, cfg["vocab"], device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times, losses = [], []
    for i in range(args.iters):
        sync()
        start = time.perf_counter()
        losses.append(step(i))
        sync()
        times.append(time.perf_counter() - start)
    first = min(max(round(0.4 * args.iters) - 1, 0), args.iters - 1)  # trainer.cpp's window, 0-based
    step_s = sum(times[first:]) / len(times[first:])
    first_note = f" | iteration 1 {times[0]:.1f} s (compilation)" if device == "cuda" else ""
    print(f"{PROG}: {args.mode} | {versions} | {label}: {n_params} parameters "
          f"({n_params / 1e6:.3f} M) | loss step 1 {losses[0]:.4f} (ln vocab {math.log(cfg['vocab']):.4f}), "
          f"step {args.iters} {losses[-1]:.4f} | timed iterations {first + 1}-{args.iters} of {args.iters}{first_note}")
    peak = f" | peak memory {torch.cuda.max_memory_allocated() / 1e9:.2f} GB" if device == "cuda" else ""
    print(f"{PROG}: {args.mode} | {where} | gbs {args.gbs} mbs {args.mbs} seq {args.seq} | "
          f"step time {step_s:.3f} s | {round(args.gbs * args.seq / step_s)} tokens/s{peak}", flush=True)
    if args.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            step(args.iters)
            sync()
        key = "self_cpu_time_total"
        if device == "cuda":  # (renamed in torch 2.4)
            events = torch.autograd.profiler_util.FunctionEventAvg
            key = "self_device_time_total" if hasattr(events, "self_device_time_total") else "self_cuda_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=15))
    return 0


if __name__ == "__main__":
    script_errors.run_main(SCRIPT, lambda: main(sys.argv[1:]))
