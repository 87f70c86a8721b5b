// Every argument rule of every op (backend/op_list.h), checked once, before dispatch (backend/ops.cpp);
// the backends assume what is checked here. The device rule: every tensor lives on ctx.device with the
// dtype that backend stores (act(ctx): a bf16 activation or bf16 weight is F32 on the CPU and BF16 on
// the GPU; accumulators, rstd, lse, losses, masters and moments are F32; token ids I32; codes U8).
// Rules of one backend's implementation (CUDA grid limits, cuBLASLt and cuDNN alignment) are checked
// here too, under ctx.device == CUDA. One idiom: "<op>: <arg> <shape> (<device>) must be ...".
#include "backend/op_checks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "numerics/reduce.h"
#include "numerics/swizzle.h"

#if defined(PL_WITH_CUDA)
#include "backend/cuda/device_state.h"
#endif

namespace pl::check {

namespace {

bool on_gpu(const OpContext& ctx) { return ctx.device == Device::CUDA; }
// The storage of bf16 activations and weights on ctx's backend.
DType act(const OpContext& ctx) { return on_gpu(ctx) ? DType::BF16 : DType::F32; }
const char* device_word(Device d) { return d == Device::CUDA ? "CUDA" : "cpu"; }

// t lives on ctx.device with dtype `dtype` (or `alt` when given), exactly `ndim` dimensions (any when
// ndim < 0), and storage when it has elements.
void arg(const OpContext& ctx, const char* op, const char* name, const Tensor& t, DType dtype, int ndim = -1,
         DType alt = DType::U8) {
  const bool dtype_ok = t.dtype == dtype || (alt != DType::U8 && t.dtype == alt);
  PL_CHECK(t.device == ctx.device && dtype_ok && (ndim < 0 || t.ndim == ndim) && (t.data != nullptr || t.numel() == 0),
           "{}: {} {} ({}) must be a{} {}{} {} tensor with storage", op, name, t.shape_str(), device_name(t.device),
           ndim < 0 ? "n" : fmt::format(" {}-D", ndim), dtype_name(dtype),
           alt != DType::U8 ? fmt::format(" or {}", dtype_name(alt)) : "", device_word(ctx.device));
}

// The bf16 parameters an optimizer op writes: the device's storage (BF16 on the GPU, FP32 on the CPU),
// or on the CPU also BF16 bits (the staging of the optimizer offload, bound for a GPU's weights).
void param_arg(const OpContext& ctx, const char* op, const Tensor& param) {
  arg(ctx, op, "param", param, act(ctx), -1, on_gpu(ctx) ? DType::F32 : DType::BF16);
}

// An output's amax slots (op_list.h, RMSNorm): empty (no storage: not asked), or f32 [1] or [2] on ctx's device.
void out_amax_arg(const OpContext& ctx, const char* op, const char* name, const Tensor& amax) {
  if (amax.data == nullptr) return;
  arg(ctx, op, name, amax, DType::F32, 1);
  PL_CHECK(amax.numel() == 1 || amax.numel() == 2, "{}: {} {} must hold 1 or 2 elements", op, name, amax.shape_str());
}

void same_numel(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  PL_CHECK(t.numel() == ref.numel(), "{}: {} {} does not match {} {} (element counts differ)", op, name,
           t.shape_str(), ref_name, ref.shape_str());
}

// One launch per row (or a grid dimension sized by rows) on the GPU.
void rows_fit_grid(const OpContext& ctx, const char* op, const char* name, const Tensor& t) {
  PL_CHECK(!on_gpu(ctx) || t.dim(0) < (int64_t{1} << 31), "{}: {} {} has more rows than a grid holds", op, name,
           t.shape_str());
}

// Every id must index a row of the vocabulary: the op's own contract (a training run's ids were checked where
// its micro-batch was built, data::TrainingData::micro_batch, naming the sample), on the CPU only (the ids are
// in host memory there; the GPU kernels skip an id outside [0, V) rather than read out of bounds).
// ignored: an id that may also be `ignored` (cross-entropy's masked target, -1); -2 accepts none.
void ids_in_vocab(const OpContext& ctx, const char* op, const char* name, const Tensor& ids, int64_t vocab,
                  int32_t ignored = -2) {
  if (on_gpu(ctx)) return;
  const int32_t* p = ids.i32();
  for (int64_t t = 0; t < ids.dim(0); ++t)
    PL_CHECK((p[t] >= 0 && p[t] < vocab) || p[t] == ignored, "{}: {}[{}] = {} is outside the vocabulary [0, {})", op,
             name, t, p[t], vocab);
}

bool same_shape(const Tensor& a, const Tensor& b) {
  return std::equal(a.shape.begin(), a.shape.begin() + a.ndim, b.shape.begin(), b.shape.begin() + b.ndim);
}

bool is_fp8(QuantFormat f) { return f == QuantFormat::FP8_E4M3 || f == QuantFormat::FP8_E5M2; }

// One quantized copy of format f, allocated on ctx.device (allocate_quantized's layout).
void copy(const OpContext& ctx, const char* op, const char* name, const QuantizedCopy& c, QuantFormat f) {
  PL_CHECK(c.format == f, "{}: copy {} holds {} codes, not {}", op, name, quant_format_name(c.format),
           quant_format_name(f));
  const int64_t blk = quant_block_size(f);
  PL_CHECK(c.rows > 0 && c.cols > 0 && c.cols % blk == 0, "{}: copy {} [{}, {}] is not a valid {} copy", op, name,
           c.rows, c.cols, quant_format_name(f));
  if (!on_gpu(ctx)) return arg(ctx, op, "codes", c.data, DType::U8, 2);  // the CPU reads codes and compact scales
  const int64_t data_cols = f == QuantFormat::NVFP4 ? c.cols / 2 : c.cols;
  auto on = [&](const Tensor& t) { return t.device == Device::CUDA && t.data != nullptr; };
  PL_CHECK(on(c.data) && c.data.dtype == DType::U8 && c.data.numel() == c.rows * data_cols,
           "{}: copy {} [{}, {}] has codes {} ({}), expected [{}, {}] u8 on the GPU (allocate_quantized)", op, name,
           c.rows, c.cols, c.data.shape_str(), device_name(c.data.device), c.rows, data_cols);
  if (blk > 1) {  // the GPU reads the swizzled scales only (quantize writes the compact ones too)
    const int64_t sc = c.cols / blk, swz = num::padded_scale_rows(c.rows) * num::padded_scale_cols(sc);
    PL_CHECK(on(c.scales) && on(c.scales_swizzled) && c.scales_swizzled.numel() == swz &&
                 reinterpret_cast<uintptr_t>(c.scales_swizzled.data) % 16 == 0,
             "{}: copy {} [{}, {}] has swizzled scales {} ({}), expected {} bytes on the GPU, 16-byte aligned", op,
             name, c.rows, c.cols, c.scales_swizzled.shape_str(), device_name(c.scales_swizzled.device), swz);
  }
  PL_CHECK(on(c.amax) && c.amax.dtype == DType::F32 && c.amax.numel() == 1 && on(c.scale_inv) &&
               c.scale_inv.dtype == DType::F32 && c.scale_inv.numel() == 1,
           "{}: copy {} needs its amax and scale_inv as f32 [1] CUDA tensors, got {} / {}", op, name,
           c.amax.shape_str(), c.scale_inv.shape_str());
}

std::string shape_text(const AttentionShape& s) {
  return fmt::format("batch={} seq={} q_heads={} kv_heads={} head_dim={}", s.batch, s.seq, s.q_heads, s.kv_heads,
                     s.head_dim);
}

void attention_shape(const OpContext& ctx, const char* op, const AttentionShape& s) {
  PL_CHECK(s.batch > 0 && s.seq > 0 && s.q_heads > 0 && s.kv_heads > 0 && s.head_dim > 0 &&
               s.q_heads % s.kv_heads == 0,
           "{}: invalid shape {} (q_heads must be a multiple of kv_heads)", op, shape_text(s));
  // cuDNN SDPA: head dim a multiple of 8 (16-byte aligned rows of bf16), at most 256 on Hopper and
  // 128 for the Blackwell backward; the finer limits are cuDNN's to report.
  PL_CHECK(!on_gpu(ctx) || (s.head_dim % 8 == 0 && s.head_dim <= 256),
           "{}: cuDNN attention needs head_dim a multiple of 8 and at most 256, got {}", op, shape_text(s));
}

// The document boundaries' contract (backend/ops.h DocumentBoundaries), for both backends, before anything is
// queued: host offsets always (and device ones on the GPU), 1..T documents, offsets from 0 to T, every document
// non-empty and inside one sample (so every sample boundary is a document boundary).
void attention_documents(const OpContext& ctx, const char* op, const AttentionShape& s) {
  const DocumentBoundaries& d = s.docs;
  if (d.count == 0) return;
  const int64_t T = s.batch * s.seq;
  PL_CHECK(d.count > 0 && d.count <= T && d.host != nullptr && (!on_gpu(ctx) || d.device != nullptr),
           "{} {}: document boundaries need host{} offsets and 1 <= count <= {} tokens, got count {}", op,
           shape_text(s), on_gpu(ctx) ? " and device" : "", T, d.count);
  PL_CHECK(d.host[0] == 0 && d.host[d.count] == T, "{} {}: document offsets must run from 0 to {}, got {} .. {}", op,
           shape_text(s), T, d.host[0], d.host[d.count]);
  for (int64_t i = 0; i < d.count; ++i) {
    const int64_t begin = d.host[i], end = d.host[i + 1];
    PL_CHECK(end > begin, "{} {}: document {} [{}, {}) is empty", op, shape_text(s), i, begin, end);
    PL_CHECK(begin / s.seq == (end - 1) / s.seq,
             "{} {}: document {} [{}, {}) crosses a sample boundary (documents lie inside one sample of {} tokens)", op,
             shape_text(s), i, begin, end, s.seq);
  }
}

void attention_tensor(const OpContext& ctx, const char* op, const char* name, const Tensor& t, DType dtype,
                      std::initializer_list<int64_t> shape, const AttentionShape& s) {
  bool same = t.ndim == static_cast<int>(shape.size());
  int i = 0;
  std::string want;
  for (int64_t n : shape) {
    same = same && t.dim(i++) == n;
    want += (want.empty() ? "" : ", ") + std::to_string(n);
  }
  PL_CHECK(t.device == ctx.device && t.dtype == dtype && same && t.data != nullptr,
           "{}: {} must be a {} {} tensor of shape [{}] for {}, got {} on {}", op, name, dtype_name(dtype),
           on_gpu(ctx) ? "CUDA" : "cpu", want, shape_text(s), t.shape_str(), device_name(t.device));
  PL_CHECK(!on_gpu(ctx) || reinterpret_cast<uintptr_t>(t.data) % 16 == 0, "{}: {} must be 16-byte aligned for cuDNN",
           op, name);
}

// out = a · b of a linear op, reducing a's dim ka with b's dim kb: the three 2-D tensors in argument order
// (out, a, b), then a and b agreeing on the reduction dim, then out [a's other dim, b's other dim].
void gemm(const OpContext& ctx, const char* op, DType out_dtype, const char* out_name, const Tensor& out,
          const char* a_name, const Tensor& a, int ka, const char* b_name, const Tensor& b, int kb) {
  arg(ctx, op, out_name, out, out_dtype, 2);
  arg(ctx, op, a_name, a, act(ctx), 2);
  arg(ctx, op, b_name, b, act(ctx), 2);
  PL_CHECK(a.dim(ka) == b.dim(kb), "{}: {} {} does not match {} {}", op, a_name, a.shape_str(), b_name, b.shape_str());
  const int64_t rows = a.dim(1 - ka), cols = b.dim(1 - kb);
  PL_CHECK(out.dim(0) == rows && out.dim(1) == cols, "{}: {} {} does not match {} {} and {} {} (expected [{}, {}])",
           op, out_name, out.shape_str(), a_name, a.shape_str(), b_name, b.shape_str(), rows, cols);
}

// The rules of rope_forward and rope_backward (`name` the rotated tensor).
void rope(const OpContext& ctx, const char* op, const char* name, const Tensor& qkv, const Tensor& cos,
          const Tensor& sin, int64_t seq_len, int64_t rotated_heads, int64_t head_dim, const TokenPositions& pos) {
  arg(ctx, op, name, qkv, act(ctx), 2);
  arg(ctx, op, "cos", cos, DType::F32, 2);
  arg(ctx, op, "sin", sin, DType::F32, 2);
  PL_CHECK(head_dim > 0 && head_dim % 2 == 0, "{}: head_dim = {} must be even and positive", op, head_dim);
  PL_CHECK(seq_len > 0 && qkv.dim(0) % seq_len == 0, "{}: {} {} rows are not a multiple of seq_len = {}", op, name,
           qkv.shape_str(), seq_len);
  PL_CHECK(rotated_heads >= 0 && qkv.dim(1) % head_dim == 0 && rotated_heads * head_dim <= qkv.dim(1),
           "{}: {} {} cannot hold {} rotated heads of dim {}", op, name, qkv.shape_str(), rotated_heads, head_dim);
  PL_CHECK(cos.dim(0) >= seq_len && cos.dim(1) == head_dim / 2, "{}: cos {} must be at least [{}, {}]", op,
           cos.shape_str(), seq_len, head_dim / 2);
  PL_CHECK(sin.dim(0) == cos.dim(0) && sin.dim(1) == cos.dim(1), "{}: sin {} does not match cos {}", op,
           sin.shape_str(), cos.shape_str());
  // Per-token positions (--reset-position-ids): the host copy is always there and every position is a row of
  // the tables; the CUDA kernel reads the device copy.
  PL_CHECK(pos.host != nullptr || pos.device == nullptr, "{}: positions on the device without their host copy", op);
  if (pos.host == nullptr) return;
  PL_CHECK(!on_gpu(ctx) || pos.device != nullptr, "{}: positions without their device copy on the GPU", op);
  for (int64_t t = 0; t < qkv.dim(0); ++t)
    PL_CHECK(pos.host[t] >= 0 && pos.host[t] < seq_len, "{}: position {} of token {} is outside [0, {}) ({} {})", op,
             pos.host[t], t, seq_len, name, qkv.shape_str());
}

}  // namespace

// ---- linear ------------------------------------------------------------------------------------------

void linear_forward(const OpContext& ctx, const Tensor& y, const Tensor& x, const Tensor& w) {
  gemm(ctx, "linear_forward", act(ctx), "y", y, "x", x, 1, "w", w, 1);  // y = x · wᵀ
}

void linear_backward_input(const OpContext& ctx, const Tensor& dx, const Tensor& dy, const Tensor& w) {
  gemm(ctx, "linear_backward_input", act(ctx), "dx", dx, "dy", dy, 1, "w", w, 0);  // dx = dy · w
}

void linear_backward_weight(const OpContext& ctx, const Tensor& dw, const Tensor& dy, const Tensor& x) {
  gemm(ctx, "linear_backward_weight", DType::F32, "dw", dw, "dy", dy, 0, "x", x, 0);  // dw = dyᵀ · x
}

// ---- embedding ----------------------------------------------------------------------------------------

void embedding_forward(const OpContext& ctx, const Tensor& out, const Tensor& tokens, const Tensor& table) {
  constexpr const char* op = "embedding_forward";
  arg(ctx, op, "out", out, act(ctx), 2);
  arg(ctx, op, "tokens", tokens, DType::I32, 1);
  arg(ctx, op, "table", table, act(ctx), 2);
  PL_CHECK(out.dim(0) == tokens.dim(0) && out.dim(1) == table.dim(1),
           "{}: out {} does not match tokens {} and table {}", op, out.shape_str(), tokens.shape_str(),
           table.shape_str());
  rows_fit_grid(ctx, op, "out", out);
  ids_in_vocab(ctx, op, "tokens", tokens, table.dim(0));
}

void embedding_backward(const OpContext& ctx, const Tensor& dtable, const Tensor& dout, const Tensor& tokens) {
  constexpr const char* op = "embedding_backward";
  arg(ctx, op, "dtable", dtable, DType::F32, 2);
  arg(ctx, op, "dout", dout, act(ctx), 2);
  arg(ctx, op, "tokens", tokens, DType::I32, 1);
  PL_CHECK(dout.dim(0) == tokens.dim(0) && dout.dim(1) == dtable.dim(1),
           "{}: dout {} does not match tokens {} and dtable {}", op, dout.shape_str(), tokens.shape_str(),
           dtable.shape_str());
  rows_fit_grid(ctx, op, "dout", dout);
  PL_CHECK(!on_gpu(ctx) || dout.dim(1) <= int64_t{65535} * 256,  // embedding.cu: kScatterThreads columns a block
           "{}: dout {} is wider than a grid's y dimension holds",
           op, dout.shape_str());
  ids_in_vocab(ctx, op, "tokens", tokens, dtable.dim(0));
}

// ---- RMSNorm ------------------------------------------------------------------------------------------

namespace {
void norm_forward(const char* op, const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x,
                  const Tensor& w, float eps) {
  arg(ctx, op, "out", out, act(ctx), 2);
  arg(ctx, op, "rstd", rstd, DType::F32, 1);
  arg(ctx, op, "x", x, act(ctx), 2);
  arg(ctx, op, "w", w, act(ctx), 1);
  PL_CHECK(x.dim(1) == w.dim(0) && x.dim(1) > 0, "{}: x {} does not match w {}", op, x.shape_str(), w.shape_str());
  PL_CHECK(out.dim(0) == x.dim(0) && out.dim(1) == x.dim(1), "{}: out {} does not match x {}", op, out.shape_str(),
           x.shape_str());
  PL_CHECK(rstd.dim(0) == x.dim(0), "{}: rstd {} does not match x {} (expected [{}])", op, rstd.shape_str(),
           x.shape_str(), x.dim(0));
  PL_CHECK(eps >= 0.0f, "{}: eps = {} must be >= 0", op, eps);
  rows_fit_grid(ctx, op, "x", x);
}

void norm_backward(const char* op, const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                   const Tensor& x, const Tensor& w, const Tensor& rstd) {
  arg(ctx, op, "dx", dx, act(ctx), 2);
  arg(ctx, op, "dw", dw, DType::F32, 1);
  arg(ctx, op, "dout", dout, act(ctx), 2);
  arg(ctx, op, "x", x, act(ctx), 2);
  arg(ctx, op, "w", w, act(ctx), 1);
  arg(ctx, op, "rstd", rstd, DType::F32, 1);
  PL_CHECK(x.dim(1) == w.dim(0) && x.dim(1) > 0, "{}: x {} does not match w {}", op, x.shape_str(), w.shape_str());
  PL_CHECK(dw.dim(0) == w.dim(0), "{}: dw {} does not match w {}", op, dw.shape_str(), w.shape_str());
  PL_CHECK(dout.dim(0) == x.dim(0) && dout.dim(1) == x.dim(1), "{}: dout {} does not match x {}", op,
           dout.shape_str(), x.shape_str());
  PL_CHECK(dx.dim(0) == x.dim(0) && dx.dim(1) == x.dim(1), "{}: dx {} does not match x {}", op, dx.shape_str(),
           x.shape_str());
  PL_CHECK(rstd.dim(0) == x.dim(0), "{}: rstd {} does not match x {} (expected [{}])", op, rstd.shape_str(),
           x.shape_str(), x.dim(0));
  rows_fit_grid(ctx, op, "x", x);
  PL_CHECK(!on_gpu(ctx) || (x.dim(0) + num::kRmsNormDwChunk - 1) / num::kRmsNormDwChunk <= 65535,
           "{}: x {} has more token chunks than a grid's y dimension holds", op, x.shape_str());
}

}  // namespace

void rmsnorm_forward(const OpContext& ctx, const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                     float eps, const Tensor& out_amax) {
  norm_forward("rmsnorm_forward", ctx, out, rstd, x, w, eps);
  out_amax_arg(ctx, "rmsnorm_forward", "out_amax", out_amax);
}

void rmsnorm_backward(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                      const Tensor& w, const Tensor& rstd) {
  norm_backward("rmsnorm_backward", ctx, dx, dw, dout, x, w, rstd);
}

void rmsnorm_backward_overwrite(const OpContext& ctx, const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                const Tensor& x, const Tensor& w, const Tensor& rstd) {
  norm_backward("rmsnorm_backward_overwrite", ctx, dx, dw, dout, x, w, rstd);
}

void add_rmsnorm_forward(const OpContext& ctx, const Tensor& resid_out, const Tensor& norm_out, const Tensor& rstd,
                         const Tensor& a, const Tensor& b, const Tensor& w, float eps, const Tensor& norm_out_amax) {
  constexpr const char* op = "add_rmsnorm_forward";
  out_amax_arg(ctx, op, "norm_out_amax", norm_out_amax);
  arg(ctx, op, "resid_out", resid_out, act(ctx), 2);
  arg(ctx, op, "a", a, act(ctx), 2);
  arg(ctx, op, "b", b, act(ctx), 2);
  PL_CHECK(same_shape(a, b) && same_shape(resid_out, a), "{}: resid_out {}, a {} and b {} must have one shape", op,
           resid_out.shape_str(), a.shape_str(), b.shape_str());
  const void* n = norm_out.data;
  PL_CHECK(n == nullptr || (n != resid_out.data && n != a.data && n != b.data),
           "{}: norm_out {} must not alias resid_out, a or b", op, norm_out.shape_str());
  norm_forward(op, ctx, norm_out, rstd, resid_out, w, eps);
}

// ---- RoPE -----------------------------------------------------------------------------------------------

void rope_forward(const OpContext& ctx, const Tensor& qkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                  int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rope(ctx, "rope_forward", "qkv", qkv, cos, sin, seq_len, rotated_heads, head_dim, positions);
}

void rope_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& cos, const Tensor& sin, int64_t seq_len,
                   int64_t rotated_heads, int64_t head_dim, const TokenPositions& positions) {
  rope(ctx, "rope_backward", "dqkv", dqkv, cos, sin, seq_len, rotated_heads, head_dim, positions);
}

// ---- attention -------------------------------------------------------------------------------------------

void attention_forward(const OpContext& ctx, const Tensor& out, const Tensor& lse, const Tensor& qkv,
                       const AttentionShape& s) {
  constexpr const char* op = "attention_forward";
  attention_shape(ctx, op, s);
  attention_documents(ctx, op, s);
  const int64_t T = s.batch * s.seq, W = (s.q_heads + 2 * s.kv_heads) * s.head_dim, O = s.q_heads * s.head_dim;
  attention_tensor(ctx, op, "qkv", qkv, act(ctx), {T, W}, s);
  attention_tensor(ctx, op, "out", out, act(ctx), {T, O}, s);
  attention_tensor(ctx, op, "lse", lse, DType::F32, {s.batch, s.q_heads, s.seq}, s);
}

void attention_backward(const OpContext& ctx, const Tensor& dqkv, const Tensor& dout, const Tensor& out,
                        const Tensor& lse, const Tensor& qkv, const AttentionShape& s) {
  constexpr const char* op = "attention_backward";
  attention_shape(ctx, op, s);
  attention_documents(ctx, op, s);
  const int64_t T = s.batch * s.seq, W = (s.q_heads + 2 * s.kv_heads) * s.head_dim, O = s.q_heads * s.head_dim;
  attention_tensor(ctx, op, "dqkv", dqkv, act(ctx), {T, W}, s);
  attention_tensor(ctx, op, "dout", dout, act(ctx), {T, O}, s);
  attention_tensor(ctx, op, "out", out, act(ctx), {T, O}, s);
  attention_tensor(ctx, op, "lse", lse, DType::F32, {s.batch, s.q_heads, s.seq}, s);
  attention_tensor(ctx, op, "qkv", qkv, act(ctx), {T, W}, s);
}

void attention_kv_cache(const OpContext& ctx, const Tensor& out, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& qkv, int64_t past, int64_t q_heads, int64_t kv_heads, int64_t head_dim) {
  constexpr const char* op = "attention_kv_cache";
  PL_CHECK(q_heads > 0 && kv_heads > 0 && head_dim > 0 && q_heads % kv_heads == 0,
           "{}: {} query heads, {} kv heads of dim {} (query heads must be a multiple of kv heads)", op, q_heads,
           kv_heads, head_dim);
  // The GPU kernel keeps a query head in registers, head_dim / 32 values per lane (at most 8).
  PL_CHECK(!on_gpu(ctx) || (head_dim <= 256 && q_heads < 65536), "{}: head_dim {} (at most 256) or {} query heads "
           "(fewer than 65536) beyond the kernel's limits", op, head_dim, q_heads);
  arg(ctx, op, "qkv", qkv, act(ctx), 2);
  arg(ctx, op, "out", out, act(ctx), 2);
  arg(ctx, op, "k_cache", k_cache, act(ctx), 2);
  arg(ctx, op, "v_cache", v_cache, act(ctx), 2);
  const int64_t n = qkv.dim(0), kv = kv_heads * head_dim;
  PL_CHECK(qkv.dim(1) == (q_heads + 2 * kv_heads) * head_dim && n >= 1,
           "{}: qkv {} must be [n >= 1, {}] for {} + 2 x {} heads of dim {}", op, qkv.shape_str(),
           (q_heads + 2 * kv_heads) * head_dim, q_heads, kv_heads, head_dim);
  PL_CHECK(out.dim(0) == n && out.dim(1) == q_heads * head_dim, "{}: out {} must be [{}, {}]", op, out.shape_str(), n,
           q_heads * head_dim);
  PL_CHECK(k_cache.dim(1) == kv && same_shape(k_cache, v_cache), "{}: k_cache {} and v_cache {} must both be [capacity, "
           "{}]", op, k_cache.shape_str(), v_cache.shape_str(), kv);
  PL_CHECK(past >= 0 && past + n <= k_cache.dim(0), "{}: {} new rows after {} cached ones do not fit a cache of {} rows",
           op, n, past, k_cache.dim(0));
  PL_CHECK(!on_gpu(ctx) || n < (int64_t{1} << 31), "{}: {} new rows are more than a grid holds", op, n);
}

// ---- SwiGLU ------------------------------------------------------------------------------------------------

void swiglu_forward(const OpContext& ctx, const Tensor& out, const Tensor& fc1, const Tensor& out_amax) {
  constexpr const char* op = "swiglu_forward";
  out_amax_arg(ctx, op, "out_amax", out_amax);
  arg(ctx, op, "out", out, act(ctx), 2);
  arg(ctx, op, "fc1", fc1, act(ctx), 2);
  PL_CHECK(fc1.dim(0) == out.dim(0) && fc1.dim(1) == 2 * out.dim(1),
           "{}: fc1 {} does not match out {} (expected [{}, {}])", op, fc1.shape_str(), out.shape_str(), out.dim(0),
           2 * out.dim(1));
}

void swiglu_backward(const OpContext& ctx, const Tensor& dfc1, const Tensor& dout, const Tensor& fc1,
                     const Tensor& dfc1_amax) {
  constexpr const char* op = "swiglu_backward";
  out_amax_arg(ctx, op, "dfc1_amax", dfc1_amax);
  arg(ctx, op, "dfc1", dfc1, act(ctx), 2);
  arg(ctx, op, "dout", dout, act(ctx), 2);
  arg(ctx, op, "fc1", fc1, act(ctx), 2);
  PL_CHECK(fc1.dim(0) == dout.dim(0) && fc1.dim(1) == 2 * dout.dim(1),
           "{}: fc1 {} does not match dout {} (expected [{}, {}])", op, fc1.shape_str(), dout.shape_str(), dout.dim(0),
           2 * dout.dim(1));
  PL_CHECK(dfc1.dim(0) == fc1.dim(0) && dfc1.dim(1) == fc1.dim(1), "{}: dfc1 {} does not match fc1 {}", op,
           dfc1.shape_str(), fc1.shape_str());
}

// ---- elementwise ---------------------------------------------------------------------------------------------

void add(const OpContext& ctx, const Tensor& out, const Tensor& a, const Tensor& b) {
  constexpr const char* op = "add";
  arg(ctx, op, "out", out, act(ctx));
  arg(ctx, op, "a", a, act(ctx));
  arg(ctx, op, "b", b, act(ctx));
  PL_CHECK(same_shape(a, b), "{}: a {} does not match b {}", op, a.shape_str(), b.shape_str());
  PL_CHECK(same_shape(out, a), "{}: out {} does not match a {}", op, out.shape_str(), a.shape_str());
}

void scale(const OpContext& ctx, const Tensor& out, const Tensor& x, float s) {
  constexpr const char* op = "scale";
  arg(ctx, op, "out", out, act(ctx));
  arg(ctx, op, "x", x, act(ctx));
  PL_CHECK(same_shape(out, x), "{}: out {} does not match x {}", op, out.shape_str(), x.shape_str());
  PL_CHECK(std::isfinite(s), "{}: the scale {} must be finite", op, s);
}

void dropout(const OpContext& ctx, const Tensor& out, const Tensor& x, float p, uint64_t, uint32_t, uint64_t) {
  constexpr const char* op = "dropout";
  arg(ctx, op, "out", out, act(ctx));
  arg(ctx, op, "x", x, act(ctx));
  PL_CHECK(same_shape(out, x), "{}: out {} does not match x {}", op, out.shape_str(), x.shape_str());
  PL_CHECK(p >= 0.0f && p < 1.0f, "{}: the probability {} must lie in [0, 1)", op, p);
}

void fill_zero(const OpContext& ctx, const Tensor& x) {
  PL_CHECK(x.device == ctx.device && (x.data != nullptr || x.numel() == 0),
           "fill_zero: x {} ({}) must be a {} tensor with storage", x.shape_str(), device_name(x.device),
           device_word(ctx.device));
}

void accumulate_bf16(const OpContext& ctx, const Tensor& acc, const Tensor& delta) {
  constexpr const char* op = "accumulate_bf16";
  arg(ctx, op, "acc", acc, act(ctx));
  arg(ctx, op, "delta", delta, DType::F32);
  same_numel(op, "delta", delta, "acc", acc);
}

void copy_master_to_param(const OpContext& ctx, const Tensor& param, const Tensor& master) {
  constexpr const char* op = "copy_master_to_param";
  param_arg(ctx, op, param);
  arg(ctx, op, "master", master, DType::F32);
  same_numel(op, "param", param, "master", master);
}

void stream_triad(const OpContext& ctx, const Tensor& a, const Tensor& b, const Tensor& c, float /*s*/) {
  constexpr const char* op = "stream_triad";
  arg(ctx, op, "a", a, DType::F32, 1);
  arg(ctx, op, "b", b, DType::F32, 1);
  arg(ctx, op, "c", c, DType::F32, 1);
  PL_CHECK(same_shape(a, b) && same_shape(a, c), "{}: a {}, b {} and c {} must have one shape", op, a.shape_str(),
           b.shape_str(), c.shape_str());
}

// ---- loss -------------------------------------------------------------------------------------------------------

void cross_entropy_forward_backward(const OpContext& ctx, const Tensor& losses, const Tensor& logits,
                                    const Tensor& targets, float /*grad_scale*/) {
  constexpr const char* op = "cross_entropy_forward_backward";
  arg(ctx, op, "losses", losses, DType::F32, 1);
  arg(ctx, op, "logits", logits, act(ctx), 2);
  arg(ctx, op, "targets", targets, DType::I32, 1);
  PL_CHECK(targets.dim(0) == logits.dim(0) && logits.dim(1) > 0, "{}: targets {} does not match logits {}", op,
           targets.shape_str(), logits.shape_str());
  PL_CHECK(losses.dim(0) == logits.dim(0), "{}: losses {} does not match logits {} (expected [{}])", op,
           losses.shape_str(), logits.shape_str(), logits.dim(0));
  rows_fit_grid(ctx, op, "logits", logits);
  ids_in_vocab(ctx, op, "targets", targets, logits.dim(1), -1);  // -1: a masked position (op_list.h)
}

// ---- optimizer ----------------------------------------------------------------------------------------------------

void sum_of_squares(const OpContext& ctx, const Tensor& x) {
  // FP32, or the GPU's BF16 main grads (--main-grads-dtype bf16; the CPU keeps them in FP32 storage)
  arg(ctx, "sum_of_squares", "x", x, DType::F32, -1, act(ctx));
  PL_CHECK(!on_gpu(ctx) || x.numel() / num::kSumSquaresChunk < (int64_t{1} << 31) - 1,
           "sum_of_squares: x {} has more chunks than a grid holds", x.shape_str());
}

void sum_of_squares_chunks(const OpContext& ctx, const Tensor& partials, const Tensor& x) {
  check::sum_of_squares(ctx, x);  // the same rules for x
  arg(ctx, "sum_of_squares_chunks", "partials", partials, DType::F32, 1);
  const int64_t chunks = (x.numel() + num::kSumSquaresChunk - 1) / num::kSumSquaresChunk;
  PL_CHECK(partials.numel() == chunks, "sum_of_squares_chunks: partials {} for x {}: needs [{}] (chunks of {})",
           partials.shape_str(), x.shape_str(), chunks, num::kSumSquaresChunk);
}

void adamw_update_multi(const OpContext& ctx, const Tensor& param, const Tensor& master, const Tensor& grad,
                        const Tensor& m, const Tensor& v, const ElementRanges& no_decay, const AdamWStep& step) {
  constexpr const char* op = "adamw_update_multi";
  param_arg(ctx, op, param);
  arg(ctx, op, "master", master, DType::F32);
  // FP32 main grads, or BF16 (the GPU's --main-grads-dtype bf16; on the CPU the bf16 bits of a GPU's
  // gradients copied to the host by the optimizer offload)
  arg(ctx, op, "grad", grad, DType::F32, -1, DType::BF16);
  // The moments: F32, or BF16 (2-byte bf16 bits on every backend) under the precision-aware optimizer.
  arg(ctx, op, "m", m, DType::F32, -1, DType::BF16);
  arg(ctx, op, "v", v, DType::F32, -1, DType::BF16);
  if (param.numel() != 0 || param.ndim != 1) same_numel(op, "param", param, "master", master);  // [0]: not written
  same_numel(op, "grad", grad, "master", master);
  same_numel(op, "m", m, "master", master);
  same_numel(op, "v", v, "master", master);
  PL_CHECK(step.step >= 1, "{}: step = {} must be >= 1 (1-based)", op, step.step);
  // The range table, on its host copy (the device copy is the same table, uploaded once by its owner).
  const int64_t n = master.numel();
  PL_CHECK(no_decay.count == 0 || (no_decay.host != nullptr && (!on_gpu(ctx) || no_decay.device != nullptr)),
           "{}: {} no-decay ranges need the host table{}", op, no_decay.count,
           on_gpu(ctx) ? " and the device table" : "");
  for (int64_t r = 0; r < no_decay.count; ++r) {
    const int64_t b = no_decay.host[2 * r], e = no_decay.host[2 * r + 1];
    const int64_t prev_end = r > 0 ? no_decay.host[2 * r - 1] : 0;
    PL_CHECK(b >= prev_end && b <= e && e <= n,
             "{}: no-decay range {} = [{}, {}) is not sorted, disjoint and inside the {} elements", op, r, b, e, n);
  }
}

// ---- quantization ---------------------------------------------------------------------------------------------------

void quantize(const OpContext& ctx, QuantizedTensor& q, const Tensor& x, const QuantizeOptions& opt) {
  constexpr const char* op = "quantize";
  arg(ctx, op, "x", x, DType::F32, 2, on_gpu(ctx) ? DType::BF16 : DType::U8);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  PL_CHECK(opt.format == q.format, "{}: options ask for {} but the tensor was allocated for {}", op,
           quant_format_name(opt.format), quant_format_name(q.format));
  PL_CHECK(opt.format == QuantFormat::NVFP4 || (!opt.block_2d && !opt.rht_columnwise && !opt.stochastic),
           "{}: 16x16 blocks, RHT and stochastic rounding are NVFP4 options, not {}", op,
           quant_format_name(opt.format));
  PL_CHECK(!(opt.block_2d && opt.rht_columnwise), "{}: RHT is not applied to 16x16-block (weight) tensors", op);
  const bool per_tensor = opt.format == QuantFormat::FP8_E4M3 || opt.format == QuantFormat::FP8_E5M2;
  PL_CHECK((opt.scale.data == nullptr && opt.amax_record.data == nullptr) || per_tensor,
           "{}: a given scale and an amax record (delayed scaling) are FP8 per-tensor options, not {}", op,
           quant_format_name(opt.format));
  for (const auto& [name, t] : {std::pair{"scale", &opt.scale}, std::pair{"amax_record", &opt.amax_record}}) {
    if (t->data == nullptr) continue;
    arg(ctx, op, name, *t, DType::F32, 1);
    PL_CHECK(t->numel() == 1, "{}: {} {} must hold one float", op, name, t->shape_str());
  }
  if (opt.rowwise) {
    PL_CHECK(q.has_rowwise && q.rowwise.rows == rows && q.rowwise.cols == cols,
             "{}: x {} does not match the allocated rowwise copy [{}, {}]", op, x.shape_str(), q.rowwise.rows,
             q.rowwise.cols);
    copy(ctx, op, "rowwise", q.rowwise, opt.format);
  }
  if (opt.columnwise || opt.columnwise_amax) {
    PL_CHECK(q.has_columnwise && q.columnwise.rows == cols && q.columnwise.cols == rows,
             "{}: x {} does not match the allocated columnwise copy [{}, {}] (the transpose)", op, x.shape_str(),
             q.columnwise.rows, q.columnwise.cols);
    copy(ctx, op, "columnwise", q.columnwise, opt.format);
    PL_CHECK(!opt.rht_columnwise || rows % 16 == 0, "{}: RHT needs the row count of x {} to be a multiple of 16", op,
             x.shape_str());
  }
  if (opt.block_2d && (opt.rowwise || opt.columnwise))
    PL_CHECK(rows % 16 == 0 && cols % 16 == 0, "{}: nvfp4 16x16 blocks: x {} must have rows and cols that are "
             "multiples of 16", op, x.shape_str());
  PL_CHECK(!on_gpu(ctx) || (rows + 63) / 64 * ((cols + 63) / 64) <= 0x7FFFFFFF,
           "{}: x {} needs more tiles of 64x64 than a grid holds", op, x.shape_str());
}

void dequantize(const OpContext& ctx, const Tensor& out, const QuantizedCopy& c, QuantFormat format) {
  constexpr const char* op = "dequantize";
  copy(ctx, op, "c", c, format);
  arg(ctx, op, "out", out, DType::F32, 2);
  PL_CHECK(out.dim(0) == c.rows && out.dim(1) == c.cols, "{}: out {} does not match the copy [{}, {}]", op,
           out.shape_str(), c.rows, c.cols);
}

void quantized_gemm(const OpContext& ctx, const Tensor& y, const QuantizedCopy& a, const QuantizedCopy& b,
                    QuantFormat format, [[maybe_unused]] bool accumulate, const Tensor& scratch_a,
                    const Tensor& scratch_b, bool /*fast_accumulation*/) {
  constexpr const char* op = "quantized_gemm";
  copy(ctx, op, "a", a, format);
  copy(ctx, op, "b", b, b.format);
  PL_CHECK(a.format == b.format || (is_fp8(a.format) && is_fp8(b.format)), "{}: cannot multiply {} by {}", op,
           quant_format_name(a.format), quant_format_name(b.format));
  PL_CHECK(!(a.format == QuantFormat::FP8_E5M2 && b.format == QuantFormat::FP8_E5M2),
           "{}: E5M2 x E5M2 is not supported (cuBLASLt)", op);
  PL_CHECK(a.cols == b.cols, "{}: A [{}, {}] and B [{}, {}] disagree on the reduction dim", op, a.rows, a.cols,
           b.rows, b.cols);
  arg(ctx, op, "y", y, DType::F32, 2, on_gpu(ctx) ? DType::BF16 : DType::U8);
  PL_CHECK(y.dim(0) == a.rows && y.dim(1) == b.rows, "{}: y {} is not [{}, {}]", op, y.shape_str(), a.rows, b.rows);
  const int64_t M = a.rows, N = b.rows, K = a.cols;
  if (!on_gpu(ctx)) {
    arg(ctx, op, "scratch_a", scratch_a, DType::F32);
    arg(ctx, op, "scratch_b", scratch_b, DType::F32);
    PL_CHECK(scratch_a.numel() >= M * K && scratch_b.numel() >= N * K,
             "{}: scratch {} / {} too small for A [{}, {}] and B [{}, {}]", op, scratch_a.shape_str(),
             scratch_b.shape_str(), M, K, N, K);
    return;
  }
#if defined(PL_WITH_CUDA)
  // cuBLASLt's 16-byte rules for FP8/FP4 operands (backend/cuda/quantized_gemm.cu).
  const std::string what = fmt::format("y {} {}= a [{}, {}] {} · b [{}, {}]ᵀ {}", y.shape_str(), accumulate ? "+" : "",
                                       M, K, quant_format_name(a.format), N, K, quant_format_name(b.format));
  if (format == QuantFormat::NVFP4)
    PL_CHECK(K % 32 == 0, "{}: {}: nvfp4 GEMMs need K % 32 == 0 (16-byte rows of E2M1), K = {}", op, what, K);
  else
    PL_CHECK(K % 16 == 0, "{}: {}: {} GEMMs need K % 16 == 0 (16-byte rows), K = {}", op, what,
             quant_format_name(format), K);
  PL_CHECK(N * static_cast<int64_t>(dtype_size(y.dtype)) % 16 == 0,
           "{}: {}: the output rows must be a multiple of 16 bytes (N % {} == 0 for {}), N = {}", op, what,
           16 / dtype_size(y.dtype), dtype_name(y.dtype), N);
  PL_CHECK(reinterpret_cast<uintptr_t>(y.data) % 16 == 0, "{}: {}: y must be 16-byte aligned", op, what);
  if (ctx.gpu == nullptr || cuda::gemm_native(*ctx.gpu, format)) return;  // no state: the dispatcher says so
  // The emulated path: exact BF16 block values in the scratch buffers (device tensors of any dtype with
  // room for rows*cols BF16 values).
  PL_CHECK(scratch_a.device == Device::CUDA && scratch_b.device == Device::CUDA && scratch_a.data != nullptr &&
               scratch_b.data != nullptr && scratch_a.bytes() >= static_cast<size_t>(M * K) * 2 &&
               scratch_b.bytes() >= static_cast<size_t>(N * K) * 2,
           "{}: {}: the emulated path needs cuda scratch of at least {} / {} bytes (A [{}, {}], B [{}, {}] as bf16), "
           "got {} / {}",
           op, what, M * K * 2, N * K * 2, M, K, N, K, scratch_a.shape_str(), scratch_b.shape_str());
  const auto pa = reinterpret_cast<uintptr_t>(scratch_a.data), pb = reinterpret_cast<uintptr_t>(scratch_b.data);
  const auto ea = pa + static_cast<uintptr_t>(M * K) * 2, eb = pb + static_cast<uintptr_t>(N * K) * 2;
  PL_CHECK(ea <= pb || eb <= pa, "{}: {}: scratch_a and scratch_b overlap", op, what);
  PL_CHECK(pa % 4 == 0 && pb % 4 == 0, "{}: {}: scratch buffers must be 4-byte aligned", op, what);
#endif
}

void quant_stats(const OpContext& ctx, const QuantizedCopy& c, QuantFormat format, const Tensor& reference) {
  constexpr const char* op = "quant_stats";
  copy(ctx, op, "c", c, format);
  arg(ctx, op, "reference", reference, DType::F32, 2, on_gpu(ctx) ? DType::BF16 : DType::U8);
  PL_CHECK(reference.dim(0) == c.rows && reference.dim(1) == c.cols,
           "{}: reference {} does not match the copy [{}, {}]", op, reference.shape_str(), c.rows, c.cols);
}

void columnwise_source(const OpContext& ctx, const Tensor& out, const Tensor& x, bool rht) {
  constexpr const char* op = "columnwise_source";
  arg(ctx, op, "x", x, DType::F32, 2, on_gpu(ctx) ? DType::BF16 : DType::U8);
  arg(ctx, op, "out", out, DType::F32, 2);
  const int64_t rows = x.dim(0), cols = x.dim(1);
  PL_CHECK(out.dim(0) == cols && out.dim(1) == rows, "{}: out {} is not the transpose of x {}", op, out.shape_str(),
           x.shape_str());
  PL_CHECK(!rht || rows % 16 == 0, "{}: RHT needs rows % 16 == 0, x is {}", op, x.shape_str());
  PL_CHECK(!on_gpu(ctx) || (rows + 63) / 64 * ((cols + 63) / 64) <= 0x7FFFFFFF,
           "{}: x {} needs more tiles of 64x64 than a grid holds", op, x.shape_str());
}

void transpose_quantized(const OpContext& ctx, const QuantizedCopy& dst, const QuantizedCopy& src) {
  constexpr const char* op = "transpose_quantized";
  PL_CHECK(src.format == QuantFormat::NVFP4 || is_fp8(src.format),
           "{}: a {} copy has no transpose of the same blocks (NVFP4 with 2D blocks or FP8 per tensor only)", op,
           quant_format_name(src.format));
  copy(ctx, op, "src", src, src.format);
  copy(ctx, op, "dst", dst, src.format);
  PL_CHECK(dst.rows == src.cols && dst.cols == src.rows, "{}: dst [{}, {}] is not the transpose of src [{}, {}]", op,
           dst.rows, dst.cols, src.rows, src.cols);
}

void delayed_scaling_update(const OpContext& ctx, const Tensor& history, const Tensor& scale,
                            const DelayedScalingRule& rule) {
  constexpr const char* op = "delayed_scaling_update";
  arg(ctx, op, "history", history, DType::F32, 2);
  arg(ctx, op, "scale", scale, DType::F32, 1);
  PL_CHECK(scale.dim(0) == history.dim(1), "{}: scale {} needs one element per history column of {}", op,
           scale.shape_str(), history.shape_str());
  PL_CHECK(rule.num_forward >= 0 && rule.num_forward <= history.dim(1),
           "{}: {} forward columns of a history {}", op, rule.num_forward, history.shape_str());
}

}  // namespace pl::check
