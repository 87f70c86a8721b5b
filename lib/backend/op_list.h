// Every op, listed once (an X-macro list; no include guard: it is included once per expansion).
//   PL_OP(name, return type, timer category, (parameters), (arguments))        ops of backend/ops.h
//   PL_QUANT_OP(name, return type, timer category, (parameters), (arguments))  ops of backend/quantize.h
// The includer defines both (an empty one skips that half); they are #undef'd at the end. Expansions:
//   ops.h / quantize.h     the public declarations in namespace pl (the API the model calls);
//   backend/op_checks.cpp  check::<name>, every shape/dtype/device rule of the op, run once before dispatch;
//   backend/ops.cpp        the dispatcher: checks, times the op (OpTimer of its category), calls
//                          cpu::<name> or cuda::<name>, or fails when the build has no CUDA backend;
//   cpu/cpu_ops.h, cuda/cuda_ops.h  the backend declarations (pl::cpu, pl::cuda), defined in cpu/X.cpp, cuda/X.cu.
// The timer category is an expression over the arguments (quantized_gemm's depends on its format).
// Plain preprocessor text: nvcc's C++17 includes it. Shapes and semantics are documented here, op by op.
//
// Storage convention: on the CPU backend every floating tensor is FP32 storage. Tensors the GPU
// stores in BF16 ("bf16 activations" below) hold BF16-representable values on the CPU: an op whose
// output is such a tensor rounds each stored element with num::round_bf16 when ctx.round_bf16 is
// true. ctx.round_bf16 = false gives a plain-FP32 model, used by the finite-difference gradient test.
// Gradient accumulators (dW, dEmbedding, dNormWeight) are always FP32 and never rounded.
// Shapes: T = tokens in the micro-batch = B*S, h = hidden, V = vocab, nq/nkv = query/kv heads,
// d = head dim, f = ffn hidden. "+=" marks outputs that are accumulated into, not overwritten.

// ---- linear layers (BF16 operands, FP32 accumulation) -----------------------------------------
// y[T,out] = x[T,in] · w[out,in]ᵀ                          y: bf16 activation
PL_OP(linear_forward, void, TimerId::GemmBf16,
      (const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w), (ctx, y, x, w))
// dx[T,in] = dy[T,out] · w[out,in]                          dx: bf16 activation (overwritten)
PL_OP(linear_backward_input, void, TimerId::GemmBf16,
      (const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w), (ctx, dx, dy, w))
// dw[out,in] += dy[T,out]ᵀ · x[T,in]                        dw: fp32 accumulator
PL_OP(linear_backward_weight, void, TimerId::GemmBf16,
      (const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x), (ctx, dw, dy, x))

// ---- embedding ---------------------------------------------------------------------------------
// out[T,h] = table[tokens[t], :]                            tokens: i32 [T]
PL_OP(embedding_forward, void, TimerId::Embedding,
      (const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table), (ctx, out, tokens, table))
// dtable[V,h] += scatter of dout[T,h] by tokens             deterministic (no atomics order dependence)
PL_OP(embedding_backward, void, TimerId::Embedding,
      (const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens),
      (ctx, dtable, dout, tokens))

// ---- RMSNorm -----------------------------------------------------------------------------------
// out_amax (RMSNorm forward, SwiGLU forward and backward): empty (no storage), or f32 [1] or [2] whose every
// element the op sets to the amax of the output it writes, max |v| over the stored (rounded) values with NaN
// ignored, the value quantize's amax pass would compute from that output (Transformer Engine's fused
// norm/activation amax): a per-tensor quantizer of the output can take it as given and skip its own pass
// (issue 40).
// out[T,h] = x * rstd * w,  rstd[T] = 1/sqrt(mean(x²) + eps) (fp32, saved for backward)
PL_OP(rmsnorm_forward, void, TimerId::RmsNorm,
      (const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w, float eps,
       const Tensor& out_amax),
      (ctx, out, rstd, x, w, eps, out_amax))
// dx[T,h] += ∂L/∂x ;  dw[h] += ∂L/∂w                        dx: bf16 activation grad (rounded after +=)
PL_OP(rmsnorm_backward, void, TimerId::RmsNorm,
      (const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
       const Tensor& rstd),
      (ctx, dx, dw, dout, x, w, rstd))
// The same with dx overwritten: dx = bf16(0 + ∂L/∂x), bit for bit fill_zero(dx) then rmsnorm_backward,
// without the zeroing pass (the first gradient of the residual stream: the final norm's).
PL_OP(rmsnorm_backward_overwrite, void, TimerId::RmsNorm,
      (const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x, const Tensor& w,
       const Tensor& rstd),
      (ctx, dx, dw, dout, x, w, rstd))
// The residual add fused into the RMSNorm that follows it, one pass over the rows:
// resid_out[T,h] = bf16(a + b) (exactly add; resid_out may alias a or b), then norm_out/rstd exactly as
// rmsnorm_forward(norm_out, rstd, resid_out, w, eps, norm_out_amax). Its backward is rmsnorm_backward, whose
// dx += already adds the residual stream's gradient.
PL_OP(add_rmsnorm_forward, void, TimerId::RmsNorm,
      (const OpContext& ctx, const Tensor& resid_out, const Tensor& norm_out, const Tensor& rstd, const Tensor& a,
       const Tensor& b, const Tensor& w, float eps, const Tensor& norm_out_amax),
      (ctx, resid_out, norm_out, rstd, a, b, w, eps, norm_out_amax))

// ---- rotary position embedding (rotate-half, non-interleaved) -----------------------------------
// qkv[T, (nq+2nkv)*d] with T = B*S: rotates, in place, the first nq+nkv heads (q and k) of every
// row t at position positions[t] (ops.h TokenPositions; none given: t % S). cos/sin: fp32 [S, d/2] (angle of
// frequency i at position p).
PL_OP(rope_forward, void, TimerId::Rope,
      (const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
       int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions),
      (ctx, qkv, cos, sin, seq_len, rotated_heads, head_dim, positions))
// The adjoint: rotates the q/k gradient heads of dqkv back by -angle, in place (the same positions).
PL_OP(rope_backward, void, TimerId::Rope,
      (const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
       int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions),
      (ctx, dqkv, cos, sin, seq_len, rotated_heads, head_dim, positions))

// ---- causal grouped-query attention -------------------------------------------------------------
// qkv[T, (nq+2nkv)*d] laid out [q heads | k heads | v heads]; query head j uses kv head j/(nq/nkv).
// out[T, nq*d] = softmax(q kᵀ / sqrt(d), causal) v   (scores and softmax in fp32; out bf16 activation)
// lse[B, nq, S] fp32: log-sum-exp of each scaled score row, saved for backward (flash-attention style).
PL_OP(attention_forward, void, TimerId::Attention,
      (const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv, const AttentionShape& s),
      (ctx, out, lse, qkv, s))
// dqkv[T, (nq+2nkv)*d] (overwritten) from dout[T, nq*d]; recomputes probabilities from qkv and lse.
PL_OP(attention_backward, void, TimerId::Attention,
      (const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out, const Tensor& lse,
       const Tensor& qkv, const AttentionShape& s),
      (ctx, dqkv, dout, out, lse, qkv, s))

// Attention of n new rows against one sequence's KV cache (the generate tool, issue 28). qkv[n, (nq+2nkv)*d]: the
// new tokens' q, k and v heads, q and k already rotated at positions past .. past+n-1. Their k and v heads are
// first written into rows [past, past+n) of k_cache / v_cache [capacity, nkv*d]; then new row i attends cached
// rows 0 .. past+i:  out[n, nq*d] = softmax(q kᵀ / sqrt(d)) v  (scores, softmax and sums in fp32; out a bf16
// activation; query head j reads kv head j/(nq/nkv)). With past = 0 and n tokens it is attention_forward's causal
// attention over one sequence.
PL_OP(attention_kv_cache, void, TimerId::Attention,
      (const OpContext& ctx, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache, const Tensor& qkv,
       int64_t past, int64_t q_heads, int64_t kv_heads, int64_t head_dim),
      (ctx, out, k_cache, v_cache, qkv, past, q_heads, kv_heads, head_dim))

// ---- SwiGLU --------------------------------------------------------------------------------------
// fc1[T, 2f] = [gate | up];  out[T,f] = silu(gate) * up     out: bf16 activation
// out_amax: see RMSNorm (the amax of out).
PL_OP(swiglu_forward, void, TimerId::Swiglu,
      (const OpContext& ctx, const Tensor& out, const Tensor& fc1, const Tensor& out_amax), (ctx, out, fc1, out_amax))
// dfc1[T, 2f] (overwritten) from dout[T,f]; dfc1_amax: see RMSNorm (the amax of the whole dfc1)
PL_OP(swiglu_backward, void, TimerId::Swiglu,
      (const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1, const Tensor& dfc1_amax),
      (ctx, dfc1, dout, fc1, dfc1_amax))

// ---- elementwise ---------------------------------------------------------------------------------
// out = a + b (same shape; out may alias a or b)            out: bf16 activation
PL_OP(add, void, TimerId::Elementwise, (const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b),
      (ctx, out, a, b))
// out = s · x (same shape; out may alias x)                 out: bf16 activation (the product rounded once)
// LoRA's adapter scaling alpha/dim on the adapter's output and, in backward, on its gradient (Megatron-Bridge's
// ParallelLinearAdapter: x * (alpha / dim) after linear_out).
PL_OP(scale, void, TimerId::Elementwise, (const OpContext& ctx, const Tensor& out, const Tensor& x, float s),
      (ctx, out, x, s))
// out = dropout(x): element i is x[i] · 1/(1-p) when kept, x[i] · 0 when dropped, the mask drawn from
// numerics/dropout.h's Philox stream of (seed, stream_id, counter) and element index (same shape; out may alias
// x; p in [0, 1)).                                          out: bf16 activation (rounded once)
// Its backward is the same op on the gradient with the same arguments (the mask regenerated, never stored).
PL_OP(dropout, void, TimerId::Elementwise,
      (const OpContext& ctx, const Tensor& out, const Tensor& x, float p, uint64_t seed, uint32_t stream_id,
       uint64_t counter),
      (ctx, out, x, p, seed, stream_id, counter))
// x = 0
PL_OP(fill_zero, void, TimerId::Elementwise, (const OpContext& ctx, const Tensor& x), (ctx, x))
// acc = bf16(acc + delta)   acc [n]: bf16 storage (rounded when ctx.round_bf16), delta [n] fp32: one
// micro-batch's FP32 gradients added into BF16 main grads (--main-grads-dtype bf16)
PL_OP(accumulate_bf16, void, TimerId::Elementwise, (const OpContext& ctx, const Tensor& acc, const Tensor& delta),
      (ctx, acc, delta))
// param = round_bf16(master)   (initial copy of the fp32 master weights into the bf16 weights)
PL_OP(copy_master_to_param, void, TimerId::Elementwise,
      (const OpContext& ctx, const Tensor& param, const Tensor& master), (ctx, param, master))
// a[i] = b[i] + s * c[i]   a, b, c: fp32 [n] of one shape (a may be b or c itself, not a partial overlap).
// The STREAM benchmark's triad (J. D. McCalpin, "Memory Bandwidth and Machine Balance in Current High
// Performance Computers", IEEE TCCA Newsletter 1995): the machine probe's bandwidth kernel
// (roofline/machine_ceilings.h), 2 reads and 1 write of 4 bytes per element (3·n·4 bytes per call, as
// STREAM counts them: the write-allocate read of `a` is not counted) and 2·n FLOPs. Not used by the model.
PL_OP(stream_triad, void, TimerId::Elementwise,
      (const OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c, float s), (ctx, a, b, c, s))

// ---- loss ----------------------------------------------------------------------------------------
// Fused softmax cross-entropy. logits[T,V] (bf16 activation), targets[T] i32.
// losses[T] fp32 = -log softmax(logits)[target] computed in fp32.
// Then overwrites logits with the gradient  grad_scale * (softmax - onehot(target))  (bf16 activation),
// so the logits buffer holds dlogits afterwards (as llm.c does). grad_scale = 0 skips the gradient.
// A target of -1 is ignored (a masked position, data/documents.h kIgnoredLabel; PyTorch's ignore_index): its loss
// is 0 and, unless grad_scale = 0, its dlogits row is 0. Any other target must lie in [0, V).
PL_OP(cross_entropy_forward_backward, void, TimerId::CrossEntropy,
      (const OpContext& ctx, const Tensor& losses, const Tensor& logits, const Tensor& targets, float grad_scale),
      (ctx, losses, logits, targets, grad_scale))

// ---- optimizer -----------------------------------------------------------------------------------
// Σ x² over an fp32 tensor, accumulated in fp32 in a fixed schedule (numerics/reduce.h: chunks of
// lane sums, a fixed pairwise tree over the chunk partials), so the result does not depend on the
// thread count and is bit-identical between the CPU and CUDA backends; returned as double. No FP64 on
// the device. (x² overflows fp32 past |x| ~ 1.8e19: the norm is then +Inf.)
PL_OP(sum_of_squares, double, TimerId::OptimizerClipMainGrad, (const OpContext& ctx, const Tensor& x), (ctx, x))
// The chunk partials of sum_of_squares: partials[c] fp32 = the lane sum of x² over x's elements
// [c * kSumSquaresChunk, min((c + 1) * kSumSquaresChunk, n)), partials [ceil(n / kSumSquaresChunk)] on
// ctx's device; num::group_tree_sum over them is sum_of_squares(x). The distributed optimizer's gradient
// norm: every rank's chunk-aligned shard gives its partials, the tree runs over all of them in order, so
// the norm is bit-identical to the one-rank norm of the whole gradient.
PL_OP(sum_of_squares_chunks, void, TimerId::OptimizerClipMainGrad,
      (const OpContext& ctx, const Tensor& partials, const Tensor& x), (ctx, partials, x))
// Multi-tensor AdamW: one step over the whole flat buffers master/grad fp32, m/v fp32 or bf16 (their dtypes) [n] in one pass (one
// launch on the GPU); param (bf16 weights the model reads) receives round_bf16(master) (or master itself
// when !ctx.round_bf16), unless param is empty ([0]: FP8 primary weights, whose BF16 weights the model makes
// for the ranges it keeps). Every element gets num::adamw_element_stored with `step`'s hyper-parameters, except
// that the elements inside `no_decay` (the 1-D norm weights) use weight_decay 0: bit-identical to a
// per-tensor adamw_update (ops.h: this op without ranges) with weight_decay = is_matrix ? wd : 0.
PL_OP(adamw_update_multi, void, TimerId::OptimizerInnerStep,
      (const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad, const Tensor& m,
       const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step),
      (ctx, param, master, grad, m, v, no_decay, step))

// ---- quantization (backend/quantize.h) -------------------------------------------------------------
// x: [rows, cols] (f32 on the CPU; bf16 or f32 on the GPU) holding the values to quantize (BF16
// values where the recipe requires BF16; RHT requires it). Writes the copies requested in opt (which
// must have been allocated).
PL_QUANT_OP(quantize, void, TimerId::Quantization,
            (const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt), (ctx, q, x, opt))
// The `format` arguments below must equal the copy's own format (checked); a GEMM may mix
// FP8_E4M3 and FP8_E5M2 copies (Megatron's "hybrid": E4M3 forward, E5M2 gradients).
// out[rows, cols] f32 = the exact dequantized values of one copy (global scale included).
PL_QUANT_OP(dequantize, void, TimerId::QuantStats,
            (const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format),
            (ctx, out, c, format))
// y[M, N] = alpha · A[M, K] · B[N, K]ᵀ (+ y when accumulate), alpha from the two copies' global
// scales as cuBLASLt gets it. fast_accumulation: a native FP8 (per-tensor or MXFP8) GEMM may use
// cuBLASLt's FAST_ACCUM (TE does for the forward GEMM only); ignored elsewhere and on the CPU.
// Scratch: the CPU needs scratch_a/scratch_b of >= M·K / N·K f32 elements; the CUDA backend needs
// them only on its emulated path, and there only M·K / N·K BF16 values (half the bytes). Both copies
// blocked along K; `format` is A's (B may be the other FP8). On the CPU every operand is dequantized
// exactly (block scale included, global scale in alpha) into the scratch buffers and multiplied by
// BLAS with FP32 accumulation: an emulation of the block-scaled GEMM, equal up to summation order.
// y: bf16 activation (rounded when ctx.round_bf16 and !accumulate) or fp32 accumulator.
// (quantize.h repeats the declaration once, to give fast_accumulation its default, false.)
PL_QUANT_OP(quantized_gemm, void, gemm_timer(format),
            (const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b, QuantFormat format,
             bool accumulate, const Tensor& scratch_a, const Tensor& scratch_b, bool fast_accumulation),
            (ctx, y, a, b, format, accumulate, scratch_a, scratch_b, fast_accumulation))
// Telemetry of one copy against the values it was quantized from (reference: [rows, cols] x for
// rowwise; for columnwise, the [cols, rows] transpose of x, RHT'd if the copy was).
PL_QUANT_OP(quant_stats, QuantStats, TimerId::QuantStats,
            (const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference),
            (ctx, c, format, reference))
// The high-precision values a copy was quantized from: x (rowwise) or xᵀ / RHT(xᵀ) (columnwise),
// written to out [cols, rows]. Used by telemetry and tests.
PL_QUANT_OP(columnwise_source, void, TimerId::QuantStats,
            (const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht), (ctx, out, x, rht))
// dst = the transpose of src, a weight's copy whose blocks span both dims alike (NVFP4 quantized with 16x16 2D
// blocks; FP8 per tensor; never MXFP8, whose 1x32 blocks run along K only): dst [src.cols, src.rows] of src's
// format with codes dst(c, r) = src(r, c), block scales dst[c][r/16] = src[16*(r/16)][c/16] (NVFP4: the compact
// ones on the CPU, read from src's compact; the swizzled ones on both backends, on the GPU read from src's
// swizzled), amax and scale_inv src's: bit for bit the columnwise copy quantize makes of the same weight. A frozen
// base's Wᵀ for dgrad, made per layer into scratch instead of stored (issue 41).
PL_QUANT_OP(transpose_quantized, void, TimerId::Quantization,
            (const OpContext& ctx, const QuantizedCopy& dst, const QuantizedCopy& src), (ctx, dst, src))
// FP8 delayed scaling, after each step: history f32 [len, n] (row 0: this step's amaxes) and scale
// f32 [n] updated in place, tensor by tensor, by num::delayed_scaling_update_one (TE's kernel_bulk).
PL_QUANT_OP(delayed_scaling_update, void, TimerId::Quantization,
            (const OpContext& ctx, const Tensor& history, const Tensor& scale, const DelayedScalingRule& rule),
            (ctx, history, scale, rule))

#undef PL_OP
#undef PL_QUANT_OP
