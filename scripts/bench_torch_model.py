"""The Llama of scripts/bench_torch.py in plain PyTorch, and its training step (imported by bench_torch.py only
after its checks: this module imports torch at once).

The model: fused QKV and gate|up projections in this program's (Megatron's) layout, RMSNorm, rotary embedding
with Llama 3.1 frequency scaling, grouped-query attention, SwiGLU, an untied LM head, no biases; this
program's initialization (N(0, std) for every matrix, std / sqrt(2 layers) for the output projections, norms
1). Attention: on the CPU the explicit causal softmax(QK^T/sqrt(d))V (torch 1.13, Debian's, has no
F.scaled_dot_product_attention); on a GPU F.scaled_dot_product_attention(is_causal=True) with enable_gqa
(torch >= 2.5; before it k and v are repeated per query head).
"""

import math

import torch
import torch.nn.functional as F
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size, eps, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, device=device))

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
    """One decoder layer. attention: "explicit" (masked softmax; the CPU), "sdpa_gqa" (SDPA with
    enable_gqa=True) or "sdpa" (SDPA over k and v repeated per query head)."""

    def __init__(self, cfg, attention="explicit", device=None):
        super().__init__()
        h, d = cfg["hidden"], cfg["head_dim"]
        self.heads, self.groups, self.head_dim, self.ffn = cfg["heads"], cfg["groups"], d, cfg["ffn"]
        self.kind = attention
        self.ln1 = RMSNorm(h, cfg["eps"], device)
        self.qkv = nn.Linear(h, (self.heads + 2 * self.groups) * d, bias=False, device=device)  # [q | k | v heads]
        self.proj = nn.Linear(self.heads * d, h, bias=False, device=device)
        self.ln2 = RMSNorm(h, cfg["eps"], device)
        self.fc1 = nn.Linear(h, 2 * cfg["ffn"], bias=False, device=device)  # [gate | up]
        self.fc2 = nn.Linear(cfg["ffn"], h, bias=False, device=device)

    def attention(self, x, cos, sin, causal_mask):
        b, s, _ = x.shape
        qkv = self.qkv(x).view(b, s, self.heads + 2 * self.groups, self.head_dim).transpose(1, 2)
        q, k, v = qkv.split([self.heads, self.groups, self.groups], dim=1)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        if self.kind == "sdpa_gqa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            # Query head j reads kv head j // (heads / groups), as the program's attention does.
            k = k.repeat_interleave(self.heads // self.groups, dim=1)
            v = v.repeat_interleave(self.heads // self.groups, dim=1)
            if self.kind == "sdpa":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q * (1.0 / math.sqrt(self.head_dim))) @ k.transpose(-2, -1)
                probs = scores.masked_fill(causal_mask, float("-inf")).softmax(dim=-1, dtype=torch.float32)
                out = probs.to(v.dtype) @ v
        return self.proj(out.transpose(1, 2).reshape(b, s, self.heads * self.head_dim))

    def forward(self, x, cos, sin, causal_mask=None):
        x = x + self.attention(self.ln1(x), cos, sin, causal_mask)
        gate, up = self.fc1(self.ln2(x)).split(self.ffn, dim=-1)
        return x + self.fc2(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, cfg, seq, inverse_frequencies, attention="explicit", device=None, init=True):
        super().__init__()
        self.embedding = nn.Embedding(cfg["vocab"], cfg["hidden"], device=device)
        self.layers = nn.ModuleList(Layer(cfg, attention, device) for _ in range(cfg["layers"]))
        self.final_norm = RMSNorm(cfg["hidden"], cfg["eps"], device)
        self.lm_head = nn.Linear(cfg["hidden"], cfg["vocab"], bias=False, device=device)
        # FP32 inverse frequencies times FP32 positions (MCore's RotaryEmbedding, the program's tables).
        inv_freq = torch.tensor(inverse_frequencies, dtype=torch.float32)
        angles = torch.outer(torch.arange(seq, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        # cos and sin of each FP32 angle evaluated in double and rounded once, as the program's tables.
        self.register_buffer("cos", angles.double().cos().float().to(device), persistent=False)
        self.register_buffer("sin", angles.double().sin().float().to(device), persistent=False)
        mask = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1) if attention == "explicit" else None
        self.register_buffer("causal_mask", mask, persistent=False)  # (None: SDPA's is_causal instead)
        self.head_loss = self.final_norm_head_loss  # torch.compile may replace it (compile_like_torchtitan)
        if init:
            # The program's initialization (lib/model/llama.cpp param_layout): N(0, std) for every matrix,
            # std / sqrt(2 layers) for the output projections (Megatron's scaled_init_method_normal), norms 1.
            out_std = cfg["std"] / math.sqrt(2.0 * cfg["layers"])
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    nn.init.normal_(p, 0.0, out_std if name.endswith(("proj.weight", "fc2.weight")) else cfg["std"])

    def final_norm_head_loss(self, x, labels):
        logits = self.lm_head(self.final_norm(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), labels.reshape(-1))

    def forward(self, tokens, labels):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x, self.cos, self.sin, self.causal_mask)
        return self.head_loss(x, labels)


def parameter_count(cfg):
    """sum(p.numel()) of the model of `cfg`, built on the meta device (no memory; torch >= 1.13)."""
    model = Llama(cfg, 1, [1.0] * (cfg["head_dim"] // 2), attention="sdpa", device="meta", init=False)
    return sum(p.numel() for p in model.parameters())


def attention_kind(device):
    """The attention a user writes on `device`: the explicit one on the CPU; on a GPU SDPA with enable_gqa
    when this torch has it (2.5+), else SDPA over repeated k and v."""
    if device == "cpu":
        return "explicit"
    q = torch.zeros(1, 4, 8, 16, device=device, dtype=torch.bfloat16)
    kv = torch.zeros(1, 2, 8, 16, device=device, dtype=torch.bfloat16)
    try:
        F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    except TypeError:
        return "sdpa"
    return "sdpa_gqa"


def fp8_layer_filter(num_layers, bf16_at_start, bf16_at_end):
    """torchao's module_filter_fn: the decoder layers' four linears in FP8 except the first `bf16_at_start`
    and the last `bf16_at_end` layers (as this program's FP8 recipe), the LM head in BF16 (torchtitan's
    filter: fqn "output" there, "lm_head" here)."""
    def keep_fp8(module, fqn):
        parts = fqn.split(".")
        if len(parts) < 3 or parts[0] != "layers" or not parts[1].isdigit():
            return False  # lm_head (and nothing else is an nn.Linear)
        i = int(parts[1])
        # torchao's float8 GEMMs need both dimensions divisible by 16 (its own auto filter's first rule).
        dims_ok = module.in_features % 16 == 0 and module.out_features % 16 == 0
        return bf16_at_start <= i < num_layers - bf16_at_end and dims_ok
    return keep_fp8


def compile_like_torchtitan(model):
    """torch.compile per decoder layer (fullgraph; the layers share one compiled graph per kind) and of the
    final norm + LM head + loss, as torchtitan compiles a model (its `compile` option, layers and loss)."""
    for i, layer in enumerate(model.layers):
        model.layers[i] = torch.compile(layer, fullgraph=True)
    model.head_loss = torch.compile(model.final_norm_head_loss)
    return model


def lr_at(step, iters, gbs, max_lr=3e-4, min_lr=3e-5, warmup_iters=2):
    """lib/train/lr_schedule.cpp in samples: linear warmup from 0, then cosine to min_lr at the last step."""
    warmup_iters = min(warmup_iters, max(iters - 1, 0))
    n, warm, decay = step * gbs, warmup_iters * gbs, iters * gbs
    if warm > 0 and n <= warm:
        return max_lr * n / warm
    ratio = (n - warm) / max(decay - warm, 1)
    return min_lr + 0.5 * (math.cos(math.pi * ratio) + 1.0) * (max_lr - min_lr)


def make_optimizer(model, fused=False):
    """AdamW at this program's defaults (lib/train/optimizer.h); weight decay on the matrices only, not on the
    RMSNorm weights, as the program's. fused: torch's fused CUDA AdamW (one kernel for every tensor)."""
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() != 2]
    extra = {"fused": True} if fused else {}
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.033}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=0.0, betas=(0.9, 0.95), eps=1e-8, **extra)


def train_step(model, opt, args, step, data, precision, vocab, device="cpu"):
    """One global batch: gbs/mbs micro-batches accumulated, clipping at global norm 1.0, AdamW. Returns the
    mean loss (read once per step: no host synchronization per micro-batch)."""
    opt.zero_grad(set_to_none=True)
    micro = args.gbs // args.mbs
    loss_sum = torch.zeros((), device=device)
    for _ in range(micro):
        seqs = torch.randint(0, vocab, (args.mbs, args.seq + 1), generator=data).to(device)
        with precision():
            loss = model(seqs[:, :-1], seqs[:, 1:]) / micro
        loss.backward()
        loss_sum += loss.detach()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    for group in opt.param_groups:
        group["lr"] = lr_at(step, args.iters, args.gbs)
    opt.step()
    return loss_sum.item()
