#pragma once
// The op interface. The model is written once against these functions; each dispatches on
// ctx.device to backend/cpu/<op>.cpp or backend/cuda/<op>.cu. Tensors are row-major.
//
// Storage convention: on the CPU backend every floating tensor is FP32 storage. Tensors the GPU
// stores in BF16 ("bf16 activations" below) hold BF16-representable values on the CPU: an op whose
// output is such a tensor rounds each stored element with num::round_bf16 when ctx.round_bf16 is
// true. ctx.round_bf16 = false gives a plain-FP32 model, used by the finite-difference gradient test.
// Gradient accumulators (dW, dEmbedding, dNormWeight) are always FP32 and never rounded.
// Shapes: T = tokens in the micro-batch = B*S, h = hidden, V = vocab, nq/nkv = query/kv heads,
// d = head dim, f = ffn hidden. "+=" marks outputs that are accumulated into, not overwritten.
#include <cstdint>

#include "core/tensor.h"

namespace pl {

struct OpContext {
  Device device = Device::CPU;
  bool round_bf16 = true;  // round bf16-activation outputs (see above)
};

// ---- linear layers (BF16 operands, FP32 accumulation) -----------------------------------------
// y[T,out] = x[T,in] · w[out,in]ᵀ                          y: bf16 activation
void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w);
// dx[T,in] = dy[T,out] · w[out,in]                          dx: bf16 activation (overwritten)
void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w);
// dw[out,in] += dy[T,out]ᵀ · x[T,in]                        dw: fp32 accumulator
void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x);

// ---- embedding ---------------------------------------------------------------------------------
// out[T,h] = table[tokens[t], :]                            tokens: i32 [T]
void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table);
// dtable[V,h] += scatter of dout[T,h] by tokens             deterministic (no atomics order dependence)
void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens);

// ---- RMSNorm -----------------------------------------------------------------------------------
// out[T,h] = x * rstd * w,  rstd[T] = 1/sqrt(mean(x²) + eps) (fp32, saved for backward)
void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                     const Tensor& w, float eps);
// dx[T,h] += ∂L/∂x ;  dw[h] += ∂L/∂w                        dx: bf16 activation grad (rounded after +=)
void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                      const Tensor& x, const Tensor& w, const Tensor& rstd);

// ---- rotary position embedding (rotate-half, non-interleaved) -----------------------------------
// qkv[T, (nq+2nkv)*d] with T = B*S: rotates, in place, the first nq+nkv heads (q and k) of every
// row at position t % S. cos/sin: fp32 [S, d/2] (angle of frequency i at position p).
void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                  int64_t seq_len, int64_t rotated_heads, int64_t head_dim);
// The adjoint: rotates the q/k gradient heads of dqkv back by -angle, in place.
void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin,
                   int64_t seq_len, int64_t rotated_heads, int64_t head_dim);

// ---- causal grouped-query attention -------------------------------------------------------------
struct AttentionShape {
  int64_t batch, seq, q_heads, kv_heads, head_dim;
};
// qkv[T, (nq+2nkv)*d] laid out [q heads | k heads | v heads]; query head j uses kv head j/(nq/nkv).
// out[T, nq*d] = softmax(q kᵀ / sqrt(d), causal) v   (scores and softmax in fp32; out bf16 activation)
// lse[B, nq, S] fp32: log-sum-exp of each scaled score row, saved for backward (flash-attention style).
void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s);
// dqkv[T, (nq+2nkv)*d] (overwritten) from dout[T, nq*d]; recomputes probabilities from qkv and lse.
void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s);

// ---- SwiGLU --------------------------------------------------------------------------------------
// fc1[T, 2f] = [gate | up];  out[T,f] = silu(gate) * up     out: bf16 activation
void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1);
// dfc1[T, 2f] (overwritten) from dout[T,f]
void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1);

// ---- elementwise ---------------------------------------------------------------------------------
// out = a + b (same shape; out may alias a or b)            out: bf16 activation
void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b);
// x = 0
void fill_zero(const OpContext& ctx, const Tensor& x);

// ---- loss ----------------------------------------------------------------------------------------
// Fused softmax cross-entropy. logits[T,V] (bf16 activation), targets[T] i32.
// losses[T] fp32 = -log softmax(logits)[target] computed in fp32.
// Then overwrites logits with the gradient  grad_scale * (softmax - onehot(target))  (bf16 activation),
// so the logits buffer holds dlogits afterwards (as llm.c does). grad_scale = 0 skips the gradient.
void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float grad_scale);

// ---- optimizer -----------------------------------------------------------------------------------
// Σ x² over an fp32 tensor, accumulated in fp32 in a fixed schedule (numerics/reduce.h: chunks of
// lane sums, a fixed pairwise tree over the chunk partials), so the result does not depend on the
// thread count and is bit-identical between the CPU and CUDA backends; returned as double. No FP64 on
// the device. (x² overflows fp32 past |x| ~ 1.8e19: the norm is then +Inf.)
double sum_of_squares(const OpContext& ctx, const Tensor& x);
struct AdamWStep {
  float lr, beta1, beta2, eps, weight_decay;
  int64_t step;      // 1-based optimizer step (bias correction)
  float grad_scale;  // clip coefficient
};
// One AdamW step over a flat range: master/m/v/grad fp32 [n]; param (bf16 weights the model reads)
// receives round_bf16(master) (or master itself when !ctx.round_bf16).
void adamw_update(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                  const Tensor& m, const Tensor& v, const AdamWStep& step);
// Sorted, disjoint [begin, end) element ranges of a flat buffer (begin0, end0, begin1, end1, ...):
// `host` always (the CPU backend reads it, every backend validates against it); `device` the same
// 2*count int64 values in memory of the CUDA device, uploaded once by the caller (train/optimizer.cpp at
// construction), read by the CUDA kernel; unused on the CPU.
struct ElementRanges {
  const int64_t* host = nullptr;
  const int64_t* device = nullptr;
  int64_t count = 0;
};
// Multi-tensor AdamW: one step over the whole flat buffers in one pass (one launch on the GPU) instead
// of one adamw_update per parameter tensor. Every element gets exactly adamw_update's math
// (num::adamw_element) with `step`'s hyper-parameters, except that the elements inside `no_decay`
// (the 1-D norm weights) use weight_decay 0, as their per-tensor calls do: the results are bit-identical
// to calling adamw_update per tensor with weight_decay = is_matrix ? step.weight_decay : 0.
void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step);
// param = round_bf16(master)   (initial copy of the fp32 master weights into the bf16 weights)
void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master);

}  // namespace pl
