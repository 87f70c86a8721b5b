// cost::<op> (backend/op_costs.h): every op's FLOP and byte formula against numbers worked out by hand
// for one odd shape (T = 15 tokens, h = 24, GQA nq = 6 / nkv = 2 / d = 8, f = 40, V = 300); the GEMM
// rows of one iteration of a small model against Megatron's model FLOPs (model/accounting.h) and the
// attention rows against Megatron's attention term; the two phases of an emulated quantized GEMM.
// The cost functions read shapes only, so every tensor here is a view without storage (no allocation).
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "backend/op_costs.h"
#include "config/model_config.h"
#include "model/accounting.h"

namespace pl {
namespace {

Tensor shape(std::initializer_list<int64_t> dims, DType t = DType::F32, Device d = Device::CPU) {
  return Tensor(nullptr, dims, t, d);
}

QuantizedCopy copy_of(QuantFormat f, int64_t rows, int64_t cols) {
  QuantizedCopy c;
  c.format = f;
  c.rows = rows;
  c.cols = cols;
  c.data = shape({rows, f == QuantFormat::NVFP4 ? cols / 2 : cols}, DType::U8);
  return c;
}

OpContext cpu() { return OpContext{}; }
// A CUDA context without a device state: device_sm is 0, so every quantized GEMM counts as emulated.
OpContext gpu_without_state() {
  OpContext ctx;
  ctx.device = Device::CUDA;
  return ctx;
}

// A one-phase row: kind, format, FLOPs, bytes and working set as worked out by hand.
void expect_row(const OpCosts& c, OpKind kind, const std::string& format, double flops, double bytes,
                double working_set) {
  ASSERT_EQ(c.phases, 1);
  EXPECT_EQ(c.phase[0].op, nullptr);  // the dispatcher names it
  EXPECT_EQ(c.phase[0].kind, kind);
  EXPECT_EQ(std::string(c.phase[0].format), format);
  EXPECT_DOUBLE_EQ(c.phase[0].flops, flops);
  EXPECT_DOUBLE_EQ(c.phase[0].bytes, bytes);
  EXPECT_DOUBLE_EQ(c.phase[0].working_set, working_set);
}

// ---- 1. each formula against a hand computation (CPU: every floating tensor FP32, 4 bytes) ---------

TEST(OpCosts, LinearPasses) {
  // qkv layer: in = 24, out = 80 (6 + 2·2 heads of 8), T = 15. Every pass 2·15·80·24 = 57600 FLOPs.
  const Tensor x = shape({15, 24}), w = shape({80, 24}), y = shape({15, 80});
  // x 360 + w 1920 + y 1200 elements = 3480 · 4 B = 13920
  expect_row(cost::linear_forward(cpu(), y, x, w), OpKind::Gemm, "bf16", 57600, 13920, 13920);
  // dy 1200 + w 1920 + dx 360 = 3480 · 4 = 13920
  expect_row(cost::linear_backward_input(cpu(), x, y, w), OpKind::Gemm, "bf16", 57600, 13920, 13920);
  // dy 1200 + x 360 + 2·dw 3840 = 5400 · 4 = 21600 (dw += : read and written); working set 13920
  expect_row(cost::linear_backward_weight(cpu(), w, y, x), OpKind::Gemm, "bf16", 57600, 21600, 13920);
}

TEST(OpCosts, EmbeddingNormRope) {
  const Tensor out = shape({15, 24}), tokens = shape({15}, DType::I32), table = shape({300, 24});
  // tokens 60 B + 15 gathered rows 1440 B + out 1440 B = 2940
  expect_row(cost::embedding_forward(cpu(), out, tokens, table), OpKind::Embedding, "fp32", 0, 2940, 2940);
  // 360 adds; dout 1440 + tokens 60 + 2·1440 (the touched dtable rows) = 4380; working set 2940
  expect_row(cost::embedding_backward(cpu(), table, out, tokens), OpKind::Embedding, "fp32", 360, 4380, 2940);
  const Tensor w = shape({24}), rstd = shape({15});
  // 4·360 = 1440; x 1440 + w 96 + out 1440 + rstd 60 = 3036
  expect_row(cost::rmsnorm_forward(cpu(), out, rstd, out, w, 1e-5f, {}), OpKind::Norm, "fp32", 1440, 3036, 3036);
  // with the output's amax asked for: + 360 compares, no bytes (issue 40: no pass over out)
  float slot = 0.0f;
  const Tensor amax(&slot, {1}, DType::F32);
  expect_row(cost::rmsnorm_forward(cpu(), out, rstd, out, w, 1e-5f, amax), OpKind::Norm, "fp32", 1800, 3036, 3036);
  // 10·360 = 3600; dout 1440 + x 1440 + w 96 + rstd 60 + 2·dx 2880 + 2·dw 192 = 6108; working set 4572
  expect_row(cost::rmsnorm_backward(cpu(), out, w, out, out, w, rstd), OpKind::Norm, "fp32", 3600, 6108, 4572);
  // overwritten dx is not read: 6108 - 1440 = 4668; the same working set
  expect_row(cost::rmsnorm_backward_overwrite(cpu(), out, w, out, out, w, rstd), OpKind::Norm, "fp32", 3600, 4668,
             4572);
  // add + norm, 5·360 = 1800; a 1440 + b 1440 + w 96 + resid 1440 + out 1440 + rstd 60 = 5916 (the unfused pair:
  // add 4320 + rmsnorm 3036 = 7356, the sum read back)
  expect_row(cost::add_rmsnorm_forward(cpu(), out, out, rstd, out, out, w, 1e-5f, {}), OpKind::Norm, "fp32", 1800, 5916,
             5916);
  // RoPE on qkv [15, 80], seq_len 5 (cos/sin hold 8 positions, only 5 are read), 8 rotated heads of 8:
  // 15·64 = 960 rotated elements, 3·960 = 2880 FLOPs; 2·960·4 = 7680 + cos, sin 2·5·4·4 = 160 → 7840
  const Tensor qkv = shape({15, 80}), cs = shape({8, 4});
  expect_row(cost::rope_forward(cpu(), qkv, cs, cs, 5, 8, 8, {}), OpKind::Elementwise, "fp32", 2880, 7840, 4000);
  expect_row(cost::rope_backward(cpu(), qkv, cs, cs, 5, 8, 8, {}), OpKind::Elementwise, "fp32", 2880, 7840, 4000);
}

TEST(OpCosts, AttentionGqa) {
  const AttentionShape s{3, 5, 6, 2, 8};  // B=3, S=5, nq=6, nkv=2, d=8
  const Tensor qkv = shape({15, 80}), out = shape({15, 48}), lse = shape({3, 6, 5});
  // 4·B·nq·d·S(S+1)/2 = 4·3·6·8·15 = 8640; qkv 4800 + out 2880 + lse 360 = 8040
  expect_row(cost::attention_forward(cpu(), out, lse, qkv, s), OpKind::Attention, "bf16", 8640, 8040, 8040);
  // 2.5·8640 = 21600; qkv 4800 + out 2880 + dout 2880 + lse 360 + dqkv 4800 = 15720
  expect_row(cost::attention_backward(cpu(), qkv, out, out, lse, qkv, s), OpKind::Attention, "bf16", 21600, 15720,
             15720);
}

TEST(OpCosts, SwigluAndElementwise) {
  const Tensor fc1 = shape({15, 80}), out = shape({15, 40});
  // 5·600 = 3000; fc1 4800 + out 2400 = 7200
  expect_row(cost::swiglu_forward(cpu(), out, fc1, {}), OpKind::Elementwise, "fp32", 3000, 7200, 7200);
  // 11·600 = 6600; dout 2400 + fc1 4800 + dfc1 4800 = 12000
  expect_row(cost::swiglu_backward(cpu(), fc1, out, fc1, {}), OpKind::Elementwise, "fp32", 6600, 12000, 12000);
  // the amax of dfc1 asked for: + 1200 compares (every element of dfc1)
  float slot = 0.0f;
  const Tensor amax(&slot, {1}, DType::F32);
  expect_row(cost::swiglu_backward(cpu(), fc1, out, fc1, amax), OpKind::Elementwise, "fp32", 7800, 12000, 12000);
  char storage[3];
  const Tensor a(&storage[0], {15, 24}, DType::F32), b(&storage[1], {15, 24}, DType::F32),
      o(&storage[2], {15, 24}, DType::F32);
  // 360 adds; 3·1440 = 4320; out aliasing a: working set 2·1440 = 2880
  expect_row(cost::add(cpu(), o, a, b), OpKind::Elementwise, "fp32", 360, 4320, 4320);
  expect_row(cost::add(cpu(), a, a, b), OpKind::Elementwise, "fp32", 360, 4320, 2880);
  expect_row(cost::fill_zero(cpu(), a), OpKind::Elementwise, "fp32", 0, 1440, 1440);
  // acc [100] BF16 on the GPU, delta FP32: 100 adds; 2·200 + 400 = 800; working set 600
  const OpContext g = gpu_without_state();
  const Tensor acc = shape({100}, DType::BF16, Device::CUDA), delta = shape({100}, DType::F32, Device::CUDA);
  expect_row(cost::accumulate_bf16(g, acc, delta), OpKind::Elementwise, "bf16", 100, 800, 600);
  // the CPU, both FP32: 2·400 + 400 = 1200; working set 800
  expect_row(cost::accumulate_bf16(cpu(), shape({100}), shape({100})), OpKind::Elementwise, "fp32", 100, 1200, 800);
  // master 400 + param (BF16 on the GPU) 200 = 600
  expect_row(cost::copy_master_to_param(g, acc, delta), OpKind::Elementwise, "bf16", 0, 600, 600);
}

TEST(OpCosts, CrossEntropyAndOptimizer) {
  const Tensor losses = shape({15}), logits = shape({15, 300}), targets = shape({15}, DType::I32);
  // 5·4500 = 22500; 2·18000 + targets 60 + losses 60 = 36120; working set 18120
  expect_row(cost::cross_entropy_forward_backward(cpu(), losses, logits, targets, 0.25f), OpKind::CrossEntropy,
             "fp32", 22500, 36120, 18120);
  // grad_scale 0: the loss only, 4·4500 = 18000, logits read once: 18120
  expect_row(cost::cross_entropy_forward_backward(cpu(), losses, logits, targets, 0.0f), OpKind::CrossEntropy,
             "fp32", 18000, 18120, 18120);
  // 2·1000; x 4000 (+ 3 partials 12)
  expect_row(cost::sum_of_squares(cpu(), shape({1000})), OpKind::Optimizer, "fp32", 2000, 4000, 4000);
  expect_row(cost::sum_of_squares_chunks(cpu(), shape({3}), shape({1000})), OpKind::Optimizer, "fp32", 2000, 4012,
             4012);
  // n = 100, m and v BF16: 17·100 = 1700; 2·(master 400 + m 200 + v 200) + grad 400 + param 400 = 2400
  const Tensor p = shape({100}), m = shape({100}, DType::BF16);
  const AdamWStep step{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f};
  expect_row(cost::adamw_update_multi(cpu(), p, p, p, m, m, ElementRanges{}, step), OpKind::Optimizer, "fp32", 1700,
             2400, 1600);
}

TEST(OpCosts, Quantize) {
  // NVFP4 x [32, 48] FP32 (n = 1536); rowwise copy: codes 768 B, compact scales 32·3 = 96, swizzled
  // 128·4 = 512, amax + scale_inv 8 → 1384 per copy; the columnwise copy [48, 32]: 768 + 48·2 = 96 + 512 + 8.
  QuantizedTensor q;
  q.format = QuantFormat::NVFP4;
  q.rowwise = copy_of(QuantFormat::NVFP4, 32, 48);
  q.columnwise = copy_of(QuantFormat::NVFP4, 48, 32);
  const Tensor x = shape({32, 48});
  QuantizeOptions opt;  // NVFP4, rowwise
  // amax 1 + encode 3 = 4·1536 = 6144 FLOPs; 6144 (x) + 1384 = 7528
  expect_row(cost::quantize(cpu(), q, x, opt), OpKind::Quantize, "nvfp4", 6144, 7528, 7528);
  opt.columnwise = opt.rht_columnwise = true;
  // + columnwise amax 1 + encode 3 + RHT 32 = 36·1536; 40·1536 = 61440; 7528 + 1384 = 8912
  expect_row(cost::quantize(cpu(), q, x, opt), OpKind::Quantize, "nvfp4", 61440, 8912, 8912);
  opt.amax_given = true;  // no amax passes: 3 + 35 = 38·1536 = 58368
  expect_row(cost::quantize(cpu(), q, x, opt), OpKind::Quantize, "nvfp4", 58368, 8912, 8912);
  opt.amax_given = opt.columnwise = false;
  opt.columnwise_amax = true;  // rowwise 4 + the RHT'd amax 33 = 37·1536 = 56832; 7528 + one amax 4
  expect_row(cost::quantize(cpu(), q, x, opt), OpKind::Quantize, "nvfp4", 56832, 7532, 7532);
  // The GPU, x BF16, swizzled scales only: 3072 + 768 + 512 + 8 = 4360
  QuantizeOptions gpu_opt;
  gpu_opt.compact_scales = false;
  expect_row(cost::quantize(gpu_without_state(), q, shape({32, 48}, DType::BF16, Device::CUDA), gpu_opt),
             OpKind::Quantize, "nvfp4", 6144, 4360, 4360);
  // FP8 E4M3 rowwise [32, 48]: codes 1536, no scales: 6144 + 1536 + 8 = 7688
  QuantizedTensor f8;
  f8.format = QuantFormat::FP8_E4M3;
  f8.rowwise = copy_of(QuantFormat::FP8_E4M3, 32, 48);
  QuantizeOptions f8_opt;
  f8_opt.format = QuantFormat::FP8_E4M3;
  expect_row(cost::quantize(cpu(), f8, x, f8_opt), OpKind::Quantize, "fp8", 6144, 7688, 7688);
  // MXFP8 rowwise [32, 64] (n = 2048): 8192 + codes 2048 + compact 32·2 = 64 + swizzled 128·4 = 512 + 8 = 10824
  QuantizedTensor mx;
  mx.format = QuantFormat::MXFP8;
  mx.rowwise = copy_of(QuantFormat::MXFP8, 32, 64);
  QuantizeOptions mx_opt;
  mx_opt.format = QuantFormat::MXFP8;
  expect_row(cost::quantize(cpu(), mx, shape({32, 64}), mx_opt), OpKind::Quantize, "mxfp8", 8192, 10824, 10824);
}

TEST(OpCosts, TelemetryOps) {
  const QuantizedCopy c = copy_of(QuantFormat::NVFP4, 32, 48);
  const Tensor full = shape({32, 48}), transposed = shape({48, 32});
  // 1536 multiplies; codes 768 + compact scales 96 + out 6144 = 7008
  expect_row(cost::dequantize(cpu(), full, c, QuantFormat::NVFP4), OpKind::Other, "nvfp4", 1536, 7008, 7008);
  // 8·1536 = 12288; the same bytes (the reference instead of out)
  expect_row(cost::quant_stats(cpu(), c, QuantFormat::NVFP4, full), OpKind::Other, "nvfp4", 12288, 7008, 7008);
  // a transpose: 0; with the RHT 32·1536 = 49152; x 6144 + out 6144
  expect_row(cost::columnwise_source(cpu(), transposed, full, false), OpKind::Other, "fp32", 0, 12288, 12288);
  expect_row(cost::columnwise_source(cpu(), transposed, full, true), OpKind::Other, "fp32", 49152, 12288, 12288);
}

TEST(OpCosts, FormatRowNames) {
  EXPECT_STREQ(cost::format_row_name(QuantFormat::NVFP4), "nvfp4");
  EXPECT_STREQ(cost::format_row_name(QuantFormat::MXFP8), "mxfp8");
  EXPECT_STREQ(cost::format_row_name(QuantFormat::FP8_E4M3), "fp8");
  EXPECT_STREQ(cost::format_row_name(QuantFormat::FP8_E5M2), "fp8");
}

// ---- 2. one iteration's GEMM rows against Megatron's model FLOPs ------------------------------------

// The GEMM FLOPs of one micro-batch's forward and backward as the model calls them (model/llama.cpp,
// linear_layer.cpp): per layer qkv, proj, fc1, fc2 and then the LM head, each fprop + dgrad + wgrad.
double micro_batch_gemm_flops(const ModelConfig& m, int64_t tokens) {
  const int64_t h = m.hidden_size;
  const auto three = [&](int64_t in, int64_t out) {
    const Tensor x = shape({tokens, in}), w = shape({out, in}), y = shape({tokens, out});
    return cost::linear_forward(cpu(), y, x, w).phase[0].flops +
           cost::linear_backward_input(cpu(), x, y, w).phase[0].flops +
           cost::linear_backward_weight(cpu(), w, y, x).phase[0].flops;
  };
  const double layer = three(h, m.qkv_dim()) + three(m.q_dim(), h) + three(h, 2 * m.ffn_hidden_size) +
                       three(m.ffn_hidden_size, h);
  return static_cast<double>(m.num_layers) * layer + three(h, m.vocab_size);
}

// The attention rows of one micro-batch (forward + backward of every layer).
double micro_batch_attention_flops(const ModelConfig& m, int64_t batch, int64_t seq) {
  const AttentionShape s{batch, seq, m.num_attention_heads, m.num_query_groups, m.kv_channels};
  const int64_t T = batch * seq;
  const Tensor qkv = shape({T, m.qkv_dim()}), out = shape({T, m.q_dim()});
  const Tensor lse = shape({batch, m.num_attention_heads, seq});
  const double forward = cost::attention_forward(cpu(), out, lse, qkv, s).phase[0].flops;
  const double backward = cost::attention_backward(cpu(), qkv, out, out, lse, qkv, s).phase[0].flops;
  return static_cast<double>(m.num_layers) * (forward + backward);
}

// flops_per_iteration (model/accounting.cpp, SPEC-MEGATRON §2b) counts fwd + wgrad + dgrad of every
// GEMM, the LM head over the PADDED vocabulary (6·h·V_pad a token), and the causal attention as
// 6·q·s² a layer and sample (s²/2 pairs, 3 passes). The GEMM rows use the model's own vocabulary.
TEST(OpCosts, GemmRowsAddUpToMegatronModelFlops) {
  const int64_t global = 8, micro = 2, S = 96;  // 4 micro-batches; S not a power of two
  for (int64_t vocab : {int64_t{128}, int64_t{300}}) {  // 128: no padding; 300 pads to 384
    ModelConfig m = load_model_config(std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json");
    m.vocab_size = vocab;
    const double B = global, s = S, L = m.num_layers, h = m.hidden_size, q = m.q_dim();
    const double megatron_attention = 6.0 * B * s * s * L * q;       // SPEC-MEGATRON §2a: 6·q·s² per layer, sample
    const double padding = 6.0 * B * s * h * (m.padded_vocab_size() - vocab);  // the LM head's padded columns
    const double gemm_rows = (global / micro) * micro_batch_gemm_flops(m, micro * S);
    const double megatron = flops_per_iteration(m, global, S);
    EXPECT_NEAR(gemm_rows / (megatron - megatron_attention - padding), 1.0, 1e-9) << "vocab " << vocab;
    if (vocab == 300) {
      EXPECT_GT(padding, 0.0);
    }
    // The attention rows: S(S+1)/2 causal pairs against s²/2, and 1 + 2.5 passes against Megatron's 3.
    const double attention_rows = (global / micro) * micro_batch_attention_flops(m, micro, S);
    EXPECT_NEAR(attention_rows / megatron_attention, (3.5 / 3.0) * (s + 1.0) / s, 1e-12);
  }
}

// ---- 3. the quantized GEMM: two phases when emulated, the GEMM phase 2·M·N·K only ---------------------

TEST(OpCosts, QuantizedGemmEmulatedHasTwoPhases) {
  // A [24, 48] NVFP4 (codes 576 B, compact scales 24·3 = 72), B [40, 48] (codes 960, scales 120), y [24, 40].
  const QuantizedCopy a = copy_of(QuantFormat::NVFP4, 24, 48), b = copy_of(QuantFormat::NVFP4, 40, 48);
  const Tensor scratch = shape({4096});
  for (bool accumulate : {false, true}) {
    const OpCosts c = cost::quantized_gemm(cpu(), shape({24, 40}), a, b, QuantFormat::NVFP4, accumulate, scratch,
                                           scratch, false);
    ASSERT_EQ(c.phases, 2);
    // expand: 24·48 + 40·48 = 3072 multiplies; 576 + 72 + 960 + 120 = 1728 + 3072 FP32 values 12288 = 14016
    EXPECT_STREQ(c.phase[0].op, "quantized_gemm:expand");
    EXPECT_EQ(c.phase[0].kind, OpKind::Quantize);
    EXPECT_STREQ(c.phase[0].format, "nvfp4");
    EXPECT_DOUBLE_EQ(c.phase[0].flops, 3072);
    EXPECT_DOUBLE_EQ(c.phase[0].bytes, 14016);
    // the GEMM: 2·24·40·48 = 92160 only; expanded 12288 + y 3840 (twice when accumulated)
    EXPECT_STREQ(c.phase[1].op, "quantized_gemm");
    EXPECT_EQ(c.phase[1].kind, OpKind::Gemm);
    EXPECT_STREQ(c.phase[1].format, "nvfp4");
    EXPECT_DOUBLE_EQ(c.phase[1].flops, 92160);
    EXPECT_DOUBLE_EQ(c.phase[1].bytes, accumulate ? 19968 : 16128);
    EXPECT_DOUBLE_EQ(c.phase[1].working_set, 16128);
  }
  // A GPU where NVFP4 is emulated (no device state: sm 0): swizzled scales 128·4 = 512 each, BF16 values:
  // expand 576 + 960 + 512 + 512 + 3072·2 = 8704; GEMM 6144 + y BF16 1920 = 8064
  const OpContext g = gpu_without_state();
  const OpCosts c = cost::quantized_gemm(g, shape({24, 40}, DType::BF16, Device::CUDA), a, b, QuantFormat::NVFP4,
                                         false, scratch, scratch, false);
  ASSERT_EQ(c.phases, 2);
  EXPECT_DOUBLE_EQ(c.phase[0].bytes, 8704);
  EXPECT_DOUBLE_EQ(c.phase[1].flops, 92160);
  EXPECT_DOUBLE_EQ(c.phase[1].bytes, 8064);
  // Hybrid FP8 (E4M3 × E5M2): one "fp8" row pair; codes 1152 + 1920, no scales, + 12288 expanded = 15360
  const OpCosts h = cost::quantized_gemm(cpu(), shape({24, 40}), copy_of(QuantFormat::FP8_E4M3, 24, 48),
                                         copy_of(QuantFormat::FP8_E5M2, 40, 48), QuantFormat::FP8_E4M3, false, scratch,
                                         scratch, false);
  ASSERT_EQ(h.phases, 2);
  EXPECT_STREQ(h.phase[0].format, "fp8");
  EXPECT_STREQ(h.phase[1].format, "fp8");
  EXPECT_DOUBLE_EQ(h.phase[0].bytes, 15360);
  EXPECT_DOUBLE_EQ(h.phase[1].flops, 92160);
}

}  // namespace
}  // namespace pl
