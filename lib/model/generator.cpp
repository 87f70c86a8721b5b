// The generate tool's model: training's forward with a KV cache (see generator.h).
#include "model/generator.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "core/error.h"
#include "model/memory_plan.h"
#include "numerics/bf16.h"

namespace pl {

namespace {

constexpr int64_t kChunk = 512;  // prompt tokens per pass through the layers

}  // namespace

Generator::Generator(const ModelConfig& cfg, const OpContext& ctx, int64_t capacity)
    : cfg_(cfg), ctx_(ctx), capacity_(capacity), chunk_(std::min(capacity, kChunk)), entries_(param_layout(cfg)) {
  PL_CHECK(capacity >= 1 && capacity <= cfg.max_position_embeddings,
           "generate: room for {} tokens asked, but model {} has {} positions", capacity, cfg.name,
           cfg.max_position_embeddings);
  const DType act = float_storage(ctx.device);
  const int64_t P = cfg.num_parameters(), h = cfg.hidden_size, f = cfg.ffn_hidden_size, V = cfg.vocab_size;
  weights_buf_ = Buffer(static_cast<size_t>(P) * dtype_size(act), ctx.device);
  w_ = param_views(cfg, entries_, weights_buf_.data(), act, ctx.device);
  const auto make = [&](std::initializer_list<int64_t> dims, DType t) {
    int64_t n = 1;
    for (const int64_t d : dims) n *= d;
    owner_.emplace_back(static_cast<size_t>(n) * dtype_size(t), ctx.device);
    return owner_.back().as(dims, t);
  };
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k_cache_.push_back(make({capacity, cfg.kv_dim()}, act));
    v_cache_.push_back(make({capacity, cfg.kv_dim()}, act));
  }
  const int64_t half = cfg.kv_channels / 2;
  std::vector<float> cos(static_cast<size_t>(capacity * half)), sin(cos.size());
  rope_tables(cfg, capacity, cos.data(), sin.data());
  cos_ = make({capacity, half}, DType::F32);
  sin_ = make({capacity, half}, DType::F32);
  copy_from_host(cos_, cos.data());
  copy_from_host(sin_, sin.data());
  const int64_t c = chunk_;
  tokens_ = make({c}, DType::I32);
  x_ = make({c, h}, act);
  ln_ = make({c, h}, act);
  rstd_ = make({c}, DType::F32);
  qkv_ = make({c, cfg.qkv_dim()}, act);
  attn_ = make({c, cfg.q_dim()}, act);
  h_ = make({c, h}, act);
  fc1_ = make({c, 2 * f}, act);
  swi_ = make({c, f}, act);
  y_ = make({c, h}, act);
  logits_ = make({c, V}, act);
}

void Generator::write_weights(int64_t offset, const float* values, int64_t count) {
  PL_CHECK(offset >= 0 && count >= 0 && offset + count <= cfg_.num_parameters(),
           "internal: weights [{}, {}) of {} parameters", offset, offset + count, cfg_.num_parameters());
  const Tensor dst = w_.flat.rows(offset, count);
  if (float_storage(ctx_.device) == DType::F32) {  // the CPU: FP32 storage of BF16 values
    staging_.resize(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) staging_[static_cast<size_t>(i)] = num::round_bf16(values[i]);
    copy_from_host(dst, staging_.data());
    return;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) bits[static_cast<size_t>(i)] = num::float_to_bf16_bits(values[i]);
  copy_from_host(dst, bits.data());
}

std::vector<float> Generator::append(std::span<const int32_t> tokens, bool all_logits) {
  PL_CHECK(!tokens.empty(), "generate: nothing to append");
  PL_CHECK(length_ + static_cast<int64_t>(tokens.size()) <= capacity_,
           "generate: {} tokens after {} do not fit the {} positions this generator holds", tokens.size(), length_,
           capacity_);
  for (const int32_t t : tokens)
    PL_CHECK(t >= 0 && t < cfg_.vocab_size, "generate: token id {} is outside model {}'s vocabulary [0, {})", t,
             cfg_.name, cfg_.vocab_size);
  std::vector<float> logits;
  for (size_t at = 0; at < tokens.size(); at += static_cast<size_t>(chunk_)) {
    const size_t n = std::min(tokens.size() - at, static_cast<size_t>(chunk_));
    // Without all_logits only the last chunk's last row goes through the LM head.
    const Heads heads = all_logits ? Heads::all : (at + n == tokens.size() ? Heads::last : Heads::none);
    forward_chunk(tokens.subspan(at, n), heads, logits);
  }
  return logits;
}

// One chunk of n tokens at positions [length_, length_ + n): the layers, then the LM head on the rows `heads` says,
// their logits appended to `logits` as floats.
void Generator::forward_chunk(std::span<const int32_t> tokens, Heads heads, std::vector<float>& logits) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t past = length_;
  const float eps = static_cast<float>(cfg_.layernorm_epsilon);
  const int64_t nq = cfg_.num_attention_heads, nkv = cfg_.num_query_groups, d = cfg_.kv_channels;
  const Tensor tok = tokens_.rows(0, n), x = x_.rows(0, n), ln = ln_.rows(0, n), rstd = rstd_.rows(0, n);
  const Tensor qkv = qkv_.rows(0, n), attn = attn_.rows(0, n), h = h_.rows(0, n), y = y_.rows(0, n);
  const Tensor fc1 = fc1_.rows(0, n), swi = swi_.rows(0, n);
  copy_from_host(tok, tokens.data());
  embedding_forward(ctx_, x, tok, w_.embedding);
  for (int64_t l = 0; l < cfg_.num_layers; ++l) {
    const LayerParams& w = w_.layers[static_cast<size_t>(l)];
    rmsnorm_forward(ctx_, ln, rstd, x, w.ln1, eps, {});
    linear_forward(ctx_, qkv, ln, w.qkv);
    // Positions past .. past+n-1: the tables' rows from `past`, seen as the n rows of one sequence.
    rope_forward(ctx_, qkv, cos_.rows(past, n), sin_.rows(past, n), n, nq + nkv, d, {});
    attention_kv_cache(ctx_, attn, k_cache_[static_cast<size_t>(l)], v_cache_[static_cast<size_t>(l)], qkv, past, nq,
                       nkv, d);
    linear_forward(ctx_, y, attn, w.proj);
    add_rmsnorm_forward(ctx_, h, ln, rstd, x, y, w.ln2, eps, {});  // h = x + attention; ln = its norm
    linear_forward(ctx_, fc1, ln, w.fc1);
    swiglu_forward(ctx_, swi, fc1, {});
    linear_forward(ctx_, y, swi, w.fc2);
    add(ctx_, x, h, y);  // the residual stream after the layer
  }
  length_ += n;
  if (heads == Heads::none) return;
  const int64_t first = heads == Heads::all ? 0 : n - 1, rows = n - first;
  const Tensor xs = x.rows(first, rows), lns = ln.rows(first, rows), rs = rstd.rows(first, rows);
  rmsnorm_forward(ctx_, lns, rs, xs, w_.final_norm, eps, {});
  const Tensor out = logits_.rows(0, rows);
  linear_forward(ctx_, out, lns, w_.lm_head);
  const size_t V = static_cast<size_t>(cfg_.vocab_size), at = logits.size();
  logits.resize(at + static_cast<size_t>(rows) * V);
  if (out.dtype == DType::F32) {
    copy_to_host(logits.data() + at, out);
    return;
  }
  std::vector<uint16_t> bits(static_cast<size_t>(rows) * V);
  copy_to_host(bits.data(), out);
  for (size_t i = 0; i < bits.size(); ++i) logits[at + i] = num::bf16_bits_to_float(bits[i]);
}

int32_t sample_token(std::span<const float> logits, const Sampling& s, std::mt19937_64& rng) {
  PL_CHECK(!logits.empty(), "internal: sampling from no logits");
  PL_CHECK(s.temperature >= 0.0 && s.top_p > 0.0 && s.top_p <= 1.0,
           "sampling: temperature {} must be >= 0 and top_p {} in (0, 1]", s.temperature, s.top_p);
  // A NaN logit would be picked (or skipped) by no rule at all: greedy would answer token 0 forever.
  const auto bad = std::count_if(logits.begin(), logits.end(), [](float v) { return !std::isfinite(v); });
  PL_CHECK(bad == 0, "generate: {} of the {} logits are not finite (NaN or inf): the model's weights are not "
           "(a corrupt checkpoint or export?)", bad, logits.size());
  if (s.temperature == 0.0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<std::pair<double, int32_t>> p(logits.size());  // (probability, id), most likely first
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = {std::exp((static_cast<double>(logits[i]) - m) / s.temperature), static_cast<int32_t>(i)};
    total += p[i].first;
  }
  std::stable_sort(p.begin(), p.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  size_t keep = 0;
  double mass = 0.0;
  while (keep < p.size() && (keep == 0 || mass < s.top_p * total)) mass += p[keep++].first;
  const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * mass;  // uniform in [0, mass)
  double acc = 0.0;
  for (size_t k = 0; k < keep; ++k) {
    acc += p[k].first;
    if (u < acc) return p[k].second;
  }
  return p[keep - 1].second;  // (u within rounding of the mass)
}

Generated generate_tokens(Generator& g, std::span<const int32_t> prompt, int64_t max_new_tokens,
                          std::span<const int32_t> stop_ids, const Sampling& s, std::mt19937_64& rng,
                          const std::function<void(int32_t)>& on_token) {
  Generated out;
  if (max_new_tokens <= 0) return out;
  std::vector<float> logits = g.append(prompt);
  while (static_cast<int64_t>(out.tokens.size()) < max_new_tokens) {
    const int32_t next = sample_token(logits, s, rng);
    if (std::find(stop_ids.begin(), stop_ids.end(), next) != stop_ids.end()) {
      out.stopped = true;
      break;
    }
    out.tokens.push_back(next);
    if (on_token) on_token(next);
    if (static_cast<int64_t>(out.tokens.size()) == max_new_tokens || g.length() == g.capacity()) break;
    logits = g.append(std::span<const int32_t>(&next, 1));
  }
  return out;
}

}  // namespace pl
