#pragma once
// Text generation for the generate tool (issue 28): the trained Llama's forward (model/llama.cpp, the same ops in
// the same order: embedding, per layer RMSNorm -> QKV -> RoPE -> attention -> proj -> add+RMSNorm -> fc1 -> SwiGLU
// -> fc2 -> add, final RMSNorm, LM head) for one sequence, a prompt or a token at a time, with a KV cache: each
// layer keeps the rotated k and v rows of every token seen (backend attention_kv_cache), so a new token costs one
// row through the layers and one pass over the cache, not the whole sequence again.
// Every linear layer runs in BF16 whatever recipe trained the weights (the weights are the BF16 copies of the FP32
// masters, as training's; a quantized recipe is a training choice). Memory: the BF16 weights (FP32 on the CPU,
// holding BF16 values, as the CPU backend stores them), the caches (2 x layers x capacity x kv_dim) and the
// activations of a chunk of at most 512 tokens (a longer prompt goes through in chunks); nothing of training (no
// masters, gradients or optimizer state).
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "backend/ops.h"
#include "config/model_config.h"
#include "core/tensor.h"
#include "model/llama.h"

namespace pl {

class Generator {
 public:
  // A model of `cfg` on ctx.device (CPU: ctx.round_bf16 should be on, as training's) with room for `capacity`
  // tokens (prompt and generated, at most the model's max_position_embeddings). Its weights are zero until
  // written through write_weights.
  Generator(const ModelConfig& cfg, const OpContext& ctx, int64_t capacity);

  // FP32 values of the flat parameter layout (param_layout offsets) into the model, rounded to BF16: a checkpoint's
  // masters or a Hugging Face directory's tensors, a contiguous run at a time.
  void write_weights(int64_t offset, const float* values, int64_t count);

  // Appends `tokens` at positions [length(), length() + n) and returns the logits of the last one (vocab_size
  // floats), or of all n (n x vocab_size) with all_logits. The sequence must stay within capacity().
  std::vector<float> append(std::span<const int32_t> tokens, bool all_logits = false);
  int64_t length() const { return length_; }
  int64_t capacity() const { return capacity_; }
  void reset() { length_ = 0; }  // the cache is overwritten from row 0
  const ModelConfig& config() const { return cfg_; }

 private:
  enum class Heads { none, last, all };  // the rows of a chunk that go through the LM head
  void forward_chunk(std::span<const int32_t> tokens, Heads heads, std::vector<float>& logits);

  ModelConfig cfg_;
  OpContext ctx_;
  int64_t capacity_, chunk_, length_ = 0;
  std::vector<ParamEntry> entries_;
  Buffer weights_buf_;
  ParamViews w_;
  std::vector<Buffer> owner_;  // caches, tables and activations
  std::vector<Tensor> k_cache_, v_cache_;  // per layer [capacity, kv_dim]
  Tensor cos_, sin_;                       // [capacity, d/2] fp32
  Tensor tokens_;                          // [chunk] i32
  Tensor x_, ln_, rstd_, qkv_, attn_, h_, fc1_, swi_, y_, logits_;  // chunk activations
  std::vector<float> staging_;             // host conversion of one weight run
};

// How the next token is chosen from the logits: greedy (the first largest logit) at temperature 0; else a draw
// from softmax(logits / temperature) restricted to the nucleus (the fewest most likely tokens whose probabilities
// reach top_p, Holtzman et al. 2019), renormalized. The draw takes one 64-bit value of `rng` (a uniform double
// from its top 53 bits), so a seed fixes the output on every platform.
struct Sampling {
  double temperature = 0.0;
  double top_p = 1.0;
};
int32_t sample_token(std::span<const float> logits, const Sampling& s, std::mt19937_64& rng);

// The continuation of `prompt`: at most max_new_tokens tokens, ending before the first of `stop_ids` (not
// included) or when the generator is full. on_token(id) is called as each one is chosen (to stream it).
struct Generated {
  std::vector<int32_t> tokens;
  bool stopped = false;  // a stop id ended it (else max_new_tokens or the generator's capacity)
};
Generated generate_tokens(Generator& g, std::span<const int32_t> prompt, int64_t max_new_tokens,
                          std::span<const int32_t> stop_ids, const Sampling& s, std::mt19937_64& rng,
                          const std::function<void(int32_t)>& on_token = {});

}  // namespace pl
