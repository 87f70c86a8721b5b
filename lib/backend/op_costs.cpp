// The roofline's table of formulas (backend/op_costs.h): one cost::<op> per op of backend/op_list.h.
// FLOPs are the op's own arithmetic (a multiply-add is 2; exp, sqrt, a division or a compare count 1
// each); bytes are its minimal traffic: every input read once, every output written once, an
// accumulated ("+=") output read and written, each tensor at its storage size (FP32 on the CPU, BF16
// activations on the GPU, so one formula serves both backends); working_set is the bytes of the
// distinct tensors the op touches. Shape arithmetic only: no loop over elements, nothing that throws.
// Names as in op_list.h: T tokens, h hidden, V vocab, nq/nkv heads, d head dim, f ffn hidden.
#include "backend/op_costs.h"

#include "numerics/swizzle.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/device_state.h"
#endif

namespace pl::cost {

namespace {

double bytes_of(const Tensor& t) { return static_cast<double>(t.bytes()); }

// A one-phase op; op = nullptr lets the dispatcher name the row after the op.
OpCosts single(OpKind kind, const char* format, double flops, double bytes, double working_set) {
  OpCosts c;
  c.phase[0] = OpCost{nullptr, kind, format, flops, bytes, working_set};
  return c;
}
// The common case: every tensor touched is read or written exactly once, so bytes == working set.
OpCosts streamed(OpKind kind, const char* format, double flops, double bytes) {
  return single(kind, format, flops, bytes, bytes);
}

// A BF16-path GEMM out[M,N] (+)= a[M,K]·b[N,K]ᵀ, 2·M·N·K; operands read once, out written once
// (read and written when accumulated).
OpCosts gemm(double M, double N, double K, const Tensor& a, const Tensor& b, const Tensor& out, bool accumulate) {
  const double operands = bytes_of(a) + bytes_of(b);
  return single(OpKind::Gemm, "bf16", 2.0 * M * N * K, operands + (accumulate ? 2.0 : 1.0) * bytes_of(out),
                operands + bytes_of(out));
}

// ---- one quantized copy's storage, from its shape (allocate_quantized's layout) ----------------
double elements(const QuantizedCopy& c) { return static_cast<double>(c.rows) * static_cast<double>(c.cols); }
// E2M1 codes pack two to a byte; FP8 and MXFP8 codes are one byte each.
double code_bytes(const QuantizedCopy& c) { return elements(c) * (c.format == QuantFormat::NVFP4 ? 0.5 : 1.0); }
// Compact scales: one byte per block ([rows, cols/block]); none for per-tensor FP8.
double compact_scale_bytes(const QuantizedCopy& c) {
  const int64_t blk = quant_block_size(c.format);
  return blk > 1 ? static_cast<double>(c.rows) * static_cast<double>(c.cols / blk) : 0.0;
}
// Swizzled scales: cuBLASLt's 128x4 tiles, zero padded (numerics/swizzle.h).
double swizzled_scale_bytes(const QuantizedCopy& c) {
  const int64_t blk = quant_block_size(c.format);
  if (blk <= 1) return 0.0;
  return static_cast<double>(num::padded_scale_rows(c.rows)) *
         static_cast<double>(num::padded_scale_cols(c.cols / blk));
}
// The scales a consumer reads: the CPU reads the compact ones, every CUDA consumer the swizzled ones
// (backend/quantize.h QuantizeOptions::compact_scales).
double scale_bytes_read(const OpContext& ctx, const QuantizedCopy& c) {
  return ctx.device == Device::CUDA ? swizzled_scale_bytes(c) : compact_scale_bytes(c);
}
constexpr double kCopyScalarBytes = 8.0;  // a copy's amax and scale_inv (f32 each)

// Whether quantized_gemm runs `f` natively: the CUDA backend's own answer (cuda::gemm_native: the rule
// quantized_gemm_native on this GPU's sm, unless a test forces the emulated path), so the rows split
// exactly where the backend calls op_next_phase. The CPU always emulates.
bool gemm_runs_native(const OpContext& ctx, QuantFormat f) {
  if (ctx.device != Device::CUDA) return false;
#if defined(PL_WITH_CUDA)
  if (ctx.gpu != nullptr) return cuda::gemm_native(*ctx.gpu, f);
#endif
  return quantized_gemm_native(f, device_sm(ctx));
}

// Bytes one element of an emulated GEMM's expanded operand takes: the CPU expands into FP32 scratch,
// the CUDA emulation into BF16 (op_list.h quantized_gemm).
double expanded_element_bytes(const OpContext& ctx) { return ctx.device == Device::CUDA ? 2.0 : 4.0; }

// quantize's FLOPs per element of one copy beyond the amax: the block amax compare (block formats;
// the saturation clamp for per-tensor FP8), the multiply by the encode scale, and the round to the
// code grid: 3. Stochastic rounding's Philox draws are integer ops and are not counted as FLOPs.
constexpr double kEncodeFlopsPerElement = 3.0;
// The 16-point RHT is a 16x16 Hadamard matrix times each 16-element vector (arXiv 2509.25149,
// SPEC-NVFP4): 16 multiply-adds per output element = 32 FLOPs per element of the RHT'd copy.
constexpr double kRhtFlopsPerElement = 32.0;

}  // namespace

OpCosts collective(const Tensor& t, int64_t ranks, double passes, bool reduces) {
  const double share = static_cast<double>(ranks - 1) / static_cast<double>(ranks);
  const double bytes = bytes_of(t);
  OpCosts c;
  c.phase[0] = OpCost{nullptr, OpKind::Comm, dtype_row_name(t.dtype), reduces ? share * static_cast<double>(t.numel()) : 0.0,
                      passes * share * bytes, bytes};
  return c;
}

const char* dtype_row_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::BF16: return "bf16";
    case DType::I32: return "int32";
    case DType::U8: return "u8";
  }
  return "?";
}

const char* format_row_name(QuantFormat f) {
  switch (f) {
    case QuantFormat::NVFP4: return "nvfp4";
    case QuantFormat::MXFP8: return "mxfp8";
    case QuantFormat::FP8_E4M3:
    case QuantFormat::FP8_E5M2: return "fp8";
  }
  return "?";
}

// ---- linear layers: the BF16 GEMM path (FP32 BLAS on the CPU) --------------------------------------
// fprop y[T,out] = x[T,in]·w[out,in]ᵀ: 2·T·out·in; bytes x + w + y.
OpCosts linear_forward(const OpContext&, const Tensor& y, const Tensor& x, const Tensor& w) {
  return gemm(static_cast<double>(x.dim(0)), static_cast<double>(w.dim(0)), static_cast<double>(w.dim(1)), x, w, y,
              false);
}
// dgrad dx[T,in] = dy[T,out]·w[out,in]: 2·T·in·out; bytes dy + w + dx.
OpCosts linear_backward_input(const OpContext&, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  return gemm(static_cast<double>(dy.dim(0)), static_cast<double>(w.dim(1)), static_cast<double>(w.dim(0)), dy, w,
              dx, false);
}
// wgrad dw[out,in] += dy[T,out]ᵀ·x[T,in]: 2·out·in·T; bytes dy + x + 2·dw (accumulated).
OpCosts linear_backward_weight(const OpContext&, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  return gemm(static_cast<double>(dw.dim(0)), static_cast<double>(dw.dim(1)), static_cast<double>(dy.dim(0)), dy, x,
              dw, true);
}

// ---- embedding ---------------------------------------------------------------------------------------
// A gather, no arithmetic; bytes tokens + the T gathered rows of the table + out.
OpCosts embedding_forward(const OpContext&, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  const double rows = static_cast<double>(out.numel()) * static_cast<double>(dtype_size(table.dtype));
  return streamed(OpKind::Embedding, dtype_row_name(out.dtype), 0.0, bytes_of(tokens) + rows + bytes_of(out));
}
// A scatter-add: T·h adds; bytes dout + tokens + the T touched dtable rows read and written.
OpCosts embedding_backward(const OpContext&, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  const double n = static_cast<double>(dout.numel());
  const double rows = n * static_cast<double>(dtype_size(dtable.dtype));
  return single(OpKind::Embedding, dtype_row_name(dout.dtype), n, bytes_of(dout) + bytes_of(tokens) + 2.0 * rows,
                bytes_of(dout) + bytes_of(tokens) + rows);
}

// ---- RMSNorm -------------------------------------------------------------------------------------------
namespace {
// An output's amax, when asked (op_list.h): one compare per element of the output, no bytes (registers).
double out_amax_flops(const Tensor& amax, const Tensor& out) {
  return amax.data != nullptr ? static_cast<double>(out.numel()) : 0.0;
}
}  // namespace
// 4·T·h: per element square, sum, ·rstd, ·w (the per-row rsqrt is O(T), not counted), + the amax.
// Bytes x + w + out + rstd.
OpCosts rmsnorm_forward(const OpContext&, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                        float, const Tensor& out_amax) {
  return streamed(OpKind::Norm, dtype_row_name(x.dtype),
                  4.0 * static_cast<double>(x.numel()) + out_amax_flops(out_amax, out),
                  bytes_of(x) + bytes_of(w) + bytes_of(out) + bytes_of(rstd));
}
// 10·T·h: per element g = w·dout (1), x̂ = x·rstd (1), Σ g·x̂ (2), dw += dout·x̂ (2),
// dx = rstd·(g − x̂·mean) (3), the "+=" into dx (1). Bytes dout + x + w + rstd + 2·dx + 2·dw (both +=).
OpCosts rmsnorm_backward(const OpContext&, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                         const Tensor& w, const Tensor& rstd) {
  const double reads = bytes_of(dout) + bytes_of(x) + bytes_of(w) + bytes_of(rstd);
  return single(OpKind::Norm, dtype_row_name(x.dtype), 10.0 * static_cast<double>(x.numel()),
                reads + 2.0 * bytes_of(dx) + 2.0 * bytes_of(dw), reads + bytes_of(dx) + bytes_of(dw));
}

// As rmsnorm_backward without reading dx (it is overwritten): one dx read less.
OpCosts rmsnorm_backward_overwrite(const OpContext&, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                   const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const double reads = bytes_of(dout) + bytes_of(x) + bytes_of(w) + bytes_of(rstd);
  return single(OpKind::Norm, dtype_row_name(x.dtype), 10.0 * static_cast<double>(x.numel()),
                reads + bytes_of(dx) + 2.0 * bytes_of(dw), reads + bytes_of(dx) + bytes_of(dw));
}
// add then rmsnorm_forward in one pass: 5·T·h FLOPs; bytes a + b + resid_out + w + norm_out + rstd (the
// sum is written once and not read back, which the unfused pair does).
OpCosts add_rmsnorm_forward(const OpContext&, const Tensor& resid_out, const Tensor& norm_out, const Tensor& rstd,
                            const Tensor& a, const Tensor& b, const Tensor& w, float, const Tensor& norm_out_amax) {
  const bool aliased = resid_out.data != nullptr && (resid_out.data == a.data || resid_out.data == b.data);
  const double inputs = bytes_of(a) + bytes_of(b) + bytes_of(w);
  const double outputs = bytes_of(resid_out) + bytes_of(norm_out) + bytes_of(rstd);
  return single(OpKind::Norm, dtype_row_name(a.dtype),
                5.0 * static_cast<double>(a.numel()) + out_amax_flops(norm_out_amax, norm_out), inputs + outputs,
                inputs + outputs - (aliased ? bytes_of(resid_out) : 0.0));
}

// ---- RoPE: 3 FLOPs per rotated element (a pair: 4 multiplies + 2 adds); bytes: the rotated part of
// qkv read and written in place + the seq_len rows of cos and sin it uses. ------------------------------
namespace {
OpCosts rope_cost(const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len, int64_t rotated_heads,
                  int64_t head_dim) {
  const double rotated = static_cast<double>(qkv.dim(0)) * static_cast<double>(rotated_heads * head_dim);
  const double table = static_cast<double>(seq_len) * static_cast<double>(head_dim / 2);
  const double tables = table * static_cast<double>(dtype_size(cos.dtype) + dtype_size(sin.dtype));
  const double part = rotated * static_cast<double>(dtype_size(qkv.dtype));
  return single(OpKind::Elementwise, dtype_row_name(qkv.dtype), 3.0 * rotated, 2.0 * part + tables, part + tables);
}
}  // namespace
OpCosts rope_forward(const OpContext&, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                     int64_t rotated_heads, int64_t head_dim, const TokenPositions&) {
  return rope_cost(qkv, cos, sin, seq_len, rotated_heads, head_dim);
}
OpCosts rope_backward(const OpContext&, const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                      int64_t rotated_heads, int64_t head_dim, const TokenPositions&) {
  return rope_cost(dqkv, cos, sin, seq_len, rotated_heads, head_dim);
}

// ---- causal GQA attention ----------------------------------------------------------------------------
// Forward: the two GEMMs QKᵀ and PV over the S(S+1)/2 causal (query, key) pairs of each of the B·nq
// heads, 2·d FLOPs a pair each: 4·B·nq·d·S(S+1)/2 (softmax not counted). Bytes qkv + out + lse.
// Megatron's model FLOPs (SPEC-MEGATRON §2a) count the attention as 6·q·s² per layer and sample (q =
// nq·d): the causal half as s²/2, not S(S+1)/2, and 3× the forward for forward + backward, where these
// rows count 1 + 2.5 (attention_backward); the roofline report states this. With documents
// (AttentionShape::docs, --reset-attention-mask) these rows still count whole causal samples: the pairs the
// block-diagonal mask removes are not discounted, as Megatron's model FLOPs do not discount them either.
namespace {
double attention_forward_flops(const AttentionShape& s) {
  const double S = static_cast<double>(s.seq);
  return 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.q_heads) * static_cast<double>(s.head_dim) *
         (S * (S + 1.0) / 2.0);
}
}  // namespace
OpCosts attention_forward(const OpContext&, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                          const AttentionShape& s) {
  return streamed(OpKind::Attention, "bf16", attention_forward_flops(s), bytes_of(qkv) + bytes_of(out) + bytes_of(lse));
}
// Backward: 2.5× the forward: five GEMMs (QKᵀ recomputed, dV = Pᵀ·dO, dP = dO·Vᵀ, dQ = dS·K,
// dK = dSᵀ·Q) against the forward's two (FlashAttention-2, Dao 2023). Bytes qkv + out + dout + lse + dqkv.
OpCosts attention_backward(const OpContext&, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                           const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  return streamed(OpKind::Attention, "bf16", 2.5 * attention_forward_flops(s),
                  bytes_of(qkv) + bytes_of(out) + bytes_of(dout) + bytes_of(lse) + bytes_of(dqkv));
}

// Against a KV cache: new row i attends past+i+1 keys, 4·d FLOPs per (query head, key) pair:
// 4·nq·d·(n·past + n(n+1)/2). Bytes: qkv and out once, the n new k/v rows written, every cached k/v row the
// new rows attend (past + n of them) read once.
OpCosts attention_kv_cache(const OpContext&, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                           const Tensor& qkv, int64_t past, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  (void)v_cache;
  const double n = static_cast<double>(qkv.dim(0)), p = static_cast<double>(past);
  const double row_bytes = static_cast<double>(kv_heads * head_dim) * static_cast<double>(dtype_size(k_cache.dtype));
  return streamed(OpKind::Attention, "bf16",
                  4.0 * static_cast<double>(q_heads * head_dim) * (n * p + n * (n + 1.0) / 2.0),
                  bytes_of(qkv) + bytes_of(out) + 2.0 * row_bytes * (n + p + n));
}

// ---- SwiGLU --------------------------------------------------------------------------------------------
// 5 FLOPs per output element: silu(g) = g / (1 + exp(−g)) (exp, add, div, mul), then ·up. Bytes fc1 + out.
OpCosts swiglu_forward(const OpContext&, const Tensor& out, const Tensor& fc1, const Tensor& out_amax) {
  return streamed(OpKind::Elementwise, dtype_row_name(out.dtype),
                  5.0 * static_cast<double>(out.numel()) + out_amax_flops(out_amax, out),
                  bytes_of(fc1) + bytes_of(out));
}
// 11 FLOPs per element of dout: σ(g) (exp, add, div: 3), silu = g·σ (1), dup = dout·silu (1),
// silu' = σ·(1 + g·(1 − σ)) (4), dgate = dout·up·silu' (2). Bytes dout + fc1 + dfc1.
OpCosts swiglu_backward(const OpContext&, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1,
                        const Tensor& dfc1_amax) {
  return streamed(OpKind::Elementwise, dtype_row_name(dout.dtype),
                  11.0 * static_cast<double>(dout.numel()) + out_amax_flops(dfc1_amax, dfc1),
                  bytes_of(dout) + bytes_of(fc1) + bytes_of(dfc1));
}

// ---- elementwise ----------------------------------------------------------------------------------------
// n adds; bytes a + b + out (out may alias an input: the working set counts it once).
OpCosts add(const OpContext&, const Tensor& out, const Tensor& a, const Tensor& b) {
  const bool aliased = out.data != nullptr && (out.data == a.data || out.data == b.data);
  const double inputs = bytes_of(a) + bytes_of(b);
  return single(OpKind::Elementwise, dtype_row_name(out.dtype), static_cast<double>(out.numel()),
                inputs + bytes_of(out), inputs + (aliased ? 0.0 : bytes_of(out)));
}
// n multiplies; bytes x read, out written (once when aliased, as add counts it).
OpCosts scale(const OpContext&, const Tensor& out, const Tensor& x, float) {
  return single(OpKind::Elementwise, dtype_row_name(out.dtype), static_cast<double>(out.numel()),
                bytes_of(x) + bytes_of(out), bytes_of(x) + (out.data == x.data ? 0.0 : bytes_of(out)));
}
// n multiplies (one Philox call per 4 elements not counted as FLOPs); bytes as scale.
OpCosts dropout(const OpContext& ctx, const Tensor& out, const Tensor& x, float, uint64_t, uint32_t, uint64_t) {
  return cost::scale(ctx, out, x, 1.0f);
}
// No arithmetic; bytes x written.
OpCosts fill_zero(const OpContext&, const Tensor& x) {
  return streamed(OpKind::Elementwise, dtype_row_name(x.dtype), 0.0, bytes_of(x));
}
// n adds (the BF16 rounding not counted); bytes 2·acc (read, written) + delta.
OpCosts accumulate_bf16(const OpContext&, const Tensor& acc, const Tensor& delta) {
  return single(OpKind::Elementwise, dtype_row_name(acc.dtype), static_cast<double>(acc.numel()),
                2.0 * bytes_of(acc) + bytes_of(delta), bytes_of(acc) + bytes_of(delta));
}
// A rounding copy, no arithmetic; bytes master + param.
OpCosts copy_master_to_param(const OpContext&, const Tensor& param, const Tensor& master) {
  return streamed(OpKind::Elementwise, dtype_row_name(param.dtype), 0.0, bytes_of(master) + bytes_of(param));
}

// The STREAM triad a = b + s·c (the probe's bandwidth op): one multiply and one add per element, 2·n;
// bytes 3·n·4 (b and c read, a written; as STREAM counts them, the write-allocate read of a is not);
// the working set is the three arrays (two when a aliases b or c).
OpCosts stream_triad(const OpContext&, const Tensor& a, const Tensor& b, const Tensor& c, float) {
  const double n = static_cast<double>(a.numel()), array = n * static_cast<double>(dtype_size(a.dtype));
  const bool aliased = a.data != nullptr && (a.data == b.data || a.data == c.data);
  return single(OpKind::Elementwise, "fp32", 2.0 * n, 3.0 * array, (aliased ? 2.0 : 3.0) * array);
}

// ---- loss ----------------------------------------------------------------------------------------------
// Per logit: the row max (1 compare), x − max (1), exp (1), the sum (1): 4·T·V for the loss; the
// gradient adds one multiply, e·(grad_scale/sum) (the −1 at the target is per row): 5·T·V. Bytes: the
// logits read, and written again in place as the gradient (unless grad_scale == 0) + targets + losses.
OpCosts cross_entropy_forward_backward(const OpContext&, const Tensor& losses, const Tensor& logits,
                                       const Tensor& targets, float grad_scale) {
  const bool grad = grad_scale != 0.0f;
  const double n = static_cast<double>(logits.numel());
  const double others = bytes_of(targets) + bytes_of(losses);
  return single(OpKind::CrossEntropy, dtype_row_name(logits.dtype), (grad ? 5.0 : 4.0) * n,
                (grad ? 2.0 : 1.0) * bytes_of(logits) + others, bytes_of(logits) + others);
}

// ---- optimizer -------------------------------------------------------------------------------------------
// 2n (a multiply-add per element); bytes x.
OpCosts sum_of_squares(const OpContext&, const Tensor& x) {
  return streamed(OpKind::Optimizer, dtype_row_name(x.dtype), 2.0 * static_cast<double>(x.numel()), bytes_of(x));
}
// 2n; bytes x + the partials written.
OpCosts sum_of_squares_chunks(const OpContext&, const Tensor& partials, const Tensor& x) {
  return streamed(OpKind::Optimizer, dtype_row_name(x.dtype), 2.0 * static_cast<double>(x.numel()),
                  bytes_of(x) + bytes_of(partials));
}
// 17 FLOPs per element, numerics/adamw.h adamw_element with the (1 − β) constants hoisted: g = grad·scale
// (1); m = β1·m + (1−β1)·g (3); v = β2·v + (1−β2)·g² (4); m/bc1, v/bc2 (2); sqrt(v̂) + eps (2);
// m̂/denom + wd·master (3); master − lr·update (2). The BF16 rounding of param is not counted.
// Bytes: master, m, v read and written, grad read, param written, each at its dtype.
OpCosts adamw_update_multi(const OpContext&, const Tensor& param, const Tensor& master, const Tensor& grad,
                           const Tensor& m, const Tensor& v, const ElementRanges&, const AdamWStep&) {
  const double state = bytes_of(master) + bytes_of(m) + bytes_of(v);
  const double once = bytes_of(grad) + bytes_of(param);
  return single(OpKind::Optimizer, "fp32", 17.0 * static_cast<double>(master.numel()), 2.0 * state + once,
                state + once);
}

// ---- quantization ----------------------------------------------------------------------------------------
// Per copy made (rowwise, columnwise): the amax, 1 per element (skipped when amax_given), the encode,
// kEncodeFlopsPerElement, and the RHT on an RHT'd columnwise copy, kRhtFlopsPerElement. columnwise_amax
// alone adds one amax pass (its RHT too when rht_columnwise) over the same read of x. Bytes: x read once
// + per copy its codes + its scales (CPU: compact and swizzled; GPU: swizzled, compact when asked) + its
// amax and scale_inv; columnwise_amax alone writes one amax.
OpCosts quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  const double n = static_cast<double>(x.numel());
  const bool gpu = ctx.device == Device::CUDA;
  double flops = 0.0, bytes = bytes_of(x);
  const auto make = [&](const QuantizedCopy& c, bool rht) {
    flops += (opt.amax_given ? 0.0 : n) + kEncodeFlopsPerElement * n + (rht ? kRhtFlopsPerElement * n : 0.0);
    const double compact = !gpu || opt.compact_scales ? compact_scale_bytes(c) : 0.0;
    bytes += code_bytes(c) + compact + swizzled_scale_bytes(c) + kCopyScalarBytes;
  };
  if (opt.rowwise) make(q.rowwise, false);
  if (opt.columnwise) {
    make(q.columnwise, opt.rht_columnwise);
  } else if (opt.columnwise_amax) {
    flops += n + (opt.rht_columnwise ? kRhtFlopsPerElement * n : 0.0);
    bytes += 4.0;
  }
  return streamed(OpKind::Quantize, format_row_name(opt.format), flops, bytes);
}

// One multiply per element (code × block scale, or × scale_inv for per-tensor FP8); bytes codes +
// the scales the backend reads + out.
// No arithmetic; bytes: the codes and the scales read and written, the scalars copied.
OpCosts transpose_quantized(const OpContext& ctx, const QuantizedCopy& dst, const QuantizedCopy& src) {
  return streamed(OpKind::Quantize, format_row_name(src.format), 0.0,
                  code_bytes(src) + code_bytes(dst) + scale_bytes_read(ctx, src) + scale_bytes_read(ctx, dst) +
                      2.0 * kCopyScalarBytes);
}

OpCosts dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format) {
  return streamed(OpKind::Other, format_row_name(format), elements(c),
                  code_bytes(c) + scale_bytes_read(ctx, c) + bytes_of(out));
}

// The GEMM y[M,N] (+)= alpha·A[M,K]·B[N,K]ᵀ. Native (cuBLASLt block-scaled / FP8): one Gemm row,
// 2·M·N·K, bytes both operands' codes and scales + y (2·y when accumulated). Emulated (always on the
// CPU; on a GPU where quantized_gemm_native says no): first "quantized_gemm:expand", a row of kind
// Quantize: one multiply per element of both operands (code × block scale; a lookup for per-tensor
// FP8, counted the same), bytes codes + scales read + the expanded values written (FP32 on the CPU,
// BF16 on the GPU); then the Gemm row, 2·M·N·K, bytes the expanded operands read + y.
OpCosts quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                       QuantFormat format, bool accumulate, const Tensor&, const Tensor&, bool) {
  const double M = static_cast<double>(a.rows), N = static_cast<double>(b.rows), K = static_cast<double>(a.cols);
  const double y_bytes = (accumulate ? 2.0 : 1.0) * bytes_of(y);
  const double quantized = code_bytes(a) + code_bytes(b) + scale_bytes_read(ctx, a) + scale_bytes_read(ctx, b);
  const char* fmt = format_row_name(format);
  const bool native = gemm_runs_native(ctx, format);
  OpCosts c;
  if (native) {
    c.phase[0] = OpCost{"quantized_gemm", OpKind::Gemm, fmt, 2.0 * M * N * K, quantized + y_bytes,
                        quantized + bytes_of(y)};
    return c;
  }
  const double expanded = (M * K + N * K) * expanded_element_bytes(ctx);
  c.phase[0] = OpCost{"quantized_gemm:expand", OpKind::Quantize, fmt, M * K + N * K, quantized + expanded,
                      quantized + expanded};
  c.phase[1] = OpCost{"quantized_gemm", OpKind::Gemm, fmt, 2.0 * M * N * K, expanded + y_bytes,
                      expanded + bytes_of(y)};
  c.phases = 2;
  return c;
}

// Telemetry, 8 FLOPs per element: the dequantized value (1), its error (1) squared and summed (2), the
// reference squared and summed (2), the block amax compare (1), the saturation compare (1). Bytes codes
// + scales + reference.
OpCosts quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference) {
  return streamed(OpKind::Other, format_row_name(format), 8.0 * elements(c),
                  code_bytes(c) + scale_bytes_read(ctx, c) + bytes_of(reference));
}

// A transpose (no arithmetic), or the RHT of the transpose (kRhtFlopsPerElement); bytes x + out.
OpCosts columnwise_source(const OpContext&, const Tensor& out, const Tensor& x, bool rht) {
  const double flops = rht ? kRhtFlopsPerElement * static_cast<double>(x.numel()) : 0.0;
  return streamed(OpKind::Other, dtype_row_name(x.dtype), flops, bytes_of(x) + bytes_of(out));
}

// One compare per history element (the roll and max), the history read and written, the scales.
OpCosts delayed_scaling_update(const OpContext&, const Tensor& history, const Tensor& scale,
                               const DelayedScalingRule&) {
  return streamed(OpKind::Other, "fp32", static_cast<double>(history.numel()),
                  2.0 * bytes_of(history) + 2.0 * bytes_of(scale));
}

}  // namespace pl::cost
