#!/usr/bin/env python3
"""PyTorch's training step on pretrain_llama's model shape: the peer that scripts/bench_cpu.sh compares with.

A Llama of the exact shape of a model config (default configs/models/llama_small.json) written in plain
PyTorch as a user would: fused QKV and gate|up projections as this program's (Megatron's) layout, RMSNorm,
rotary embedding with Llama 3.1 frequency scaling, grouped-query attention (the explicit causal
softmax(QK^T/sqrt(d))V: torch 1.13 has no F.scaled_dot_product_attention, which came with 2.0), SwiGLU,
an untied LM head, no biases. Trained on random tokens with AdamW at this program's defaults
(lib/train/optimizer.h: betas 0.9/0.95, eps 1e-8, weight decay 0.033 except the norm weights, gradient
clipping at global norm 1.0; lib/train/lr_schedule.cpp: linear warmup over 2 iterations from 0, cosine
decay 3e-4 -> 3e-5 over the run), the global batch accumulated over micro-batches.

Modes: fp32_eager (everything FP32) and bf16_autocast (the model under torch.autocast("cpu",
dtype=torch.bfloat16): PyTorch's own BF16 mixed precision; FP32 weights, optimizer and softmax; the
logits cast to FP32 for the loss). Prints, per mode:
  bench_torch: <mode> | torch V | <model>: N parameters (X M) | loss step 1 L1 (ln vocab ...) ...
  bench_torch: <mode> | threads T | gbs G mbs M seq S | step time X s | Y tokens/s
with the mean step time over the last 60% of the iterations (iterations round(0.4 n) to n: the window
of pretrain_llama's summary line, lib/train/trainer.cpp) and tokens/s = gbs * seq / that mean.
--profile adds one iteration after the timed ones under torch.profiler and prints its ops, top 15 by
self CPU time (not counted in the step time).

Needs PyTorch (Debian's python3-torch installs it for /usr/bin/python3): run by a python3 without it, the
script re-runs under /usr/bin/python3 when that one has it, else exits 3 saying so (script_errors.py, as
every script's errors: one line, never a traceback).
"""

import argparse
import contextlib
import json
import math
import os
import sys
import time
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # script_errors.py beside this script
import script_errors  # noqa: E402

PROG = "bench_torch"  # (the prefix of its result lines, which scripts/bench_cpu.sh reads)
SCRIPT = "bench_torch.py"  # (the prefix of its error lines)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODES = ("fp32_eager", "bf16_autocast")


def parse_args(argv):
    parser = script_errors.ArgumentParser(prog=SCRIPT, description=__doc__.split("\n\n")[0],
                                          formatter_class=argparse.RawDescriptionHelpFormatter)
    count = script_errors.positive_int
    parser.add_argument("--mode", choices=MODES, required=True)
    parser.add_argument("--model", default=os.path.join(REPO, "configs", "models", "llama_small.json"),
                        help="model config JSON (default: configs/models/llama_small.json)")
    parser.add_argument("--threads", type=count, default=os.cpu_count() or 1,
                        help="torch.set_num_threads (default: all cores)")
    parser.add_argument("--gbs", type=count, default=8, help="global batch size (samples)")
    parser.add_argument("--mbs", type=count, default=2, help="micro-batch size; gbs/mbs micro-batches accumulated")
    parser.add_argument("--seq", type=count, default=256, help="sequence length")
    parser.add_argument("--iters", type=count, default=10, help="iterations (the last 60%% are timed)")
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--profile", action="store_true", help="profile one more iteration; print the top 15 ops")
    args = parser.parse_args(argv)
    if args.gbs % args.mbs:
        parser.error(f"--gbs {args.gbs} is not a multiple of --mbs {args.mbs}")
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


try:
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError:
    if __name__ != "__main__":
        raise

    def torch_missing():
        parse_args(sys.argv[1:])  # --help and argument errors work without PyTorch
        script_errors.import_or_rerun(__file__, None, "torch")  # re-runs under /usr/bin/python3, or raises

    script_errors.run_main(SCRIPT, torch_missing, 3)


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x):
        x32 = x.float()
        y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).to(x.dtype)


def rotate(x, cos, sin):
    """Rotate-half rotary embedding (the program's non-interleaved layout), x [B, H, S, d]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return x * cos.to(x.dtype) + torch.cat((-x2, x1), dim=-1) * sin.to(x.dtype)


class Layer(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        h, d = cfg["hidden"], cfg["head_dim"]
        self.heads, self.groups, self.head_dim, self.ffn = cfg["heads"], cfg["groups"], d, cfg["ffn"]
        self.ln1 = RMSNorm(h, cfg["eps"])
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * d, bias=False)  # [q heads | k heads | v heads]
        self.proj = nn.Linear(self.heads * d, h, bias=False)
        self.ln2 = RMSNorm(h, cfg["eps"])
        self.fc1 = nn.Linear(h, 2 * cfg["ffn"], bias=False)  # [gate | up]
        self.fc2 = nn.Linear(cfg["ffn"], h, bias=False)

    def attention(self, x, cos, sin, causal_mask):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.groups, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.groups, self.groups], dim=1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        # Query head j reads kv head j // (heads / groups), as the program's attention does.
        k = k.repeat_interleave(self.heads // self.groups, dim=1)
        v = v.repeat_interleave(self.heads // self.groups, dim=1)
        scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)
        probs = scores.masked_fill(causal_mask, float("-inf")).softmax(dim=-1, dtype=torch.float32)
        out = probs.to(v.dtype) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))

    def forward(self, x, cos, sin, causal_mask):
        x = x + self.attention(self.ln1(x), cos, sin, causal_mask)
        gate, up = self.fc1(self.ln2(x)).split(self.ffn, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, cfg, seq):
        super().__init__()
        self.embedding = nn.Embedding(cfg["vocab"], cfg["hidden"])
        self.layers = nn.ModuleList(Layer(cfg) for _ in range(cfg["layers"]))
        self.final_norm = RMSNorm(cfg["hidden"], cfg["eps"])
        self.lm_head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False)
        # FP32 inverse frequencies times FP32 positions (MCore's RotaryEmbedding, the program's tables).
        inv_freq = torch.tensor(inverse_frequencies(cfg), dtype=torch.float32)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        # cos and sin of each FP32 angle evaluated in double and rounded once, as the program's tables.
        self.register_buffer("cos", angles.double().cos().float(), persistent=False)
        self.register_buffer("sin", angles.double().sin().float(), persistent=False)
        self.register_buffer("causal_mask", torch.ones(seq, seq, dtype=torch.bool).triu(1), persistent=False)
        # The program's initialization (lib/model/llama.cpp param_layout): N(0, std) for every matrix,
        # std / sqrt(2 layers) for the output projections (Megatron's scaled_init_method_normal), norms 1.
        out_std = cfg["std"] / math.sqrt(2.0 * cfg["layers"])
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, out_std if name.endswith(("proj.weight", "fc2.weight")) else cfg["std"])

    def forward(self, tokens, labels):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.causal_mask)
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))


def lr_at(step, iters, gbs, max_lr=3e-4, min_lr=3e-5, warmup_iters=2):
    """lib/train/lr_schedule.cpp in samples: linear warmup from 0, then cosine to min_lr at the last step."""
    warmup_iters = min(warmup_iters, max(iters - 1, 0))
    n, warm, decay = step * gbs, warmup_iters * gbs, iters * gbs
    if warm > 0 and n <= warm:
        return max_lr * n / warm
    ratio = (n - warm) / max(decay - warm, 1)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def make_optimizer(model):
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]  # the RMSNorm weights, as the program's
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.033}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=0.0, betas=(0.9, 0.95), eps=1e-8)


def train_step(model, opt, args, step, data, precision):
    """One global batch: gbs/mbs micro-batches accumulated, clipping, AdamW. Returns the mean loss."""
    opt.zero_grad(set_to_none=True)
    micro = args.gbs // args.mbs
    loss_sum = 0.0
    for _ in range(micro):
        seqs = torch.randint(0, model.lm_head.out_features, (args.mbs, args.seq + 1), generator=data)
        with precision():
            loss = model(seqs[:, :-1], seqs[:, 1:]) / micro
        loss.backward()
        loss_sum += loss.item()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, args.iters, args.gbs)
    opt.step()
    return loss_sum


def main(argv):
    args = parse_args(argv)
    cfg = read_config(args.model)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model = Llama(cfg, args.seq)
    opt = make_optimizer(model)
    data = torch.Generator().manual_seed(args.seed + 1)
    if args.mode == "bf16_autocast":
        def precision():
            return torch.autocast("cpu", dtype=torch.bfloat16)
    else:
        precision = contextlib.nullcontext
    times, losses = [], []
    for step in range(args.iters):
        start = time.perf_counter()
        losses.append(train_step(model, opt, args, step, data, precision))
        times.append(time.perf_counter() - start)
    first = min(max(round(0.4 * args.iters) - 1, 0), args.iters - 1)  # trainer.cpp's window, 0-based
    step_s = sum(times[first:]) / len(times[first:])
    n_params = sum(p.numel() for p in model.parameters())
    print(f"{PROG}: {args.mode} | torch {torch.__version__} | {cfg['name']}: {n_params} parameters "
          f"({n_params / 1e6:.3f} M) | loss step 1 {losses[0]:.4f} (ln vocab {math.log(cfg['vocab']):.4f}), "
          f"step {args.iters} {losses[-1]:.4f} | timed iterations {first + 1}-{args.iters} of {args.iters}")
    print(f"{PROG}: {args.mode} | threads {args.threads} | gbs {args.gbs} mbs {args.mbs} seq {args.seq} | "
          f"step time {step_s:.3f} s | {round(args.gbs * args.seq / step_s)} tokens/s", flush=True)
    if args.profile:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            train_step(model, opt, args, args.iters, data, precision)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    script_errors.run_main(SCRIPT, lambda: main(sys.argv[1:]))
