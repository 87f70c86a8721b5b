#pragma once
// LoRA adapters on a frozen base (issue 41; ../shared/SPEC-LORA.md), as Megatron-Bridge's LoRA runs them: one
// adapter per targeted linear layer of every decoder layer, A [dim, in] and B [out, dim], whose output
//   y = base(x) + bf16(bf16(B · bf16(A · drop_pre(x))) [drop_post] · alpha/dim)
// is added to the base GEMM's (Megatron-Bridge peft/lora_layers.py LoRALinear: linear_output + adapter_output;
// peft/utils.py ParallelLinearAdapter.forward: linear_in, linear_out, the post dropout, then x * (alpha / dim)).
// The adapters are the model's trainable parameters (LlamaModel's flat buffers under --peft lora); this file
// names and shapes them and draws their initial values. The forward and backward are LlamaModel's.
#include <cstdint>
#include <string>
#include <vector>

#include "config/lora_config.h"
#include "config/model_config.h"
#include "core/checksum.h"

namespace pl {

struct ParamEntry;

// The adapters' parameters in the order of the trainable flat buffers: for each layer, for each chosen target in
// model order, A then B, named as Megatron-Bridge's state dict names them
// (decoder.layers.L.self_attention.linear_qkv.adapter.linear_in.weight for A, ...linear_out.weight for B). Every
// entry is a matrix (weight decay applies, as Megatron's optimizer decays every 2-D parameter); init_std is 0
// (lora_initial_values draws them).
std::vector<ParamEntry> lora_layout(const ModelConfig& cfg, const LoraConfig& lora);
// The chosen targets before `target` (kLoraTargets: all of them): an adapter's place within its layer.
int64_t lora_targets_before(const LoraConfig& lora, int target);
// Entry index in lora_layout of target `target`'s A in `layer` (B is the next), or -1 when the target has none.
int64_t lora_entry_index(const LoraConfig& lora, int64_t layer, int target);

// The initial values of lora_layout's entry `index` (layer `layer`, target `target`, A when is_a): A from
// --lora-a-init (xavier: N(0, sqrt(2 / (in + dim))), torch.nn.init.xavier_normal_'s std; kaiming:
// U(-1/sqrt(in), 1/sqrt(in)), kaiming_uniform_(a = sqrt 5) on an [dim, in] matrix), B zero, so the first step's
// model is the base. Counter-based in (seed, index), like the base's init (model/init.h).
void lora_initial_values(const ModelConfig& cfg, const LoraConfig& lora, int target, bool is_a, uint64_t seed,
                         uint64_t index, float* out, int64_t n);

// What a LoRA checkpoint records of the frozen base it trained on (metadata.json "peft"."base"), so a resume on
// another base is refused in one line: where the base came from ("hf DIR", "checkpoint DIR", "init seed N"), the
// recipe its linear layers ran in, and the checksum of its BF16 weights (lora_base_checksum's; LlamaModel::
// base_checksum: the same on every device).
struct LoraBaseRecord {
  std::string source, recipe;
  uint64_t checksum = 0;
};

// The checksum of a base's BF16 weights, tensor by tensor (a frozen quantized-only linear keeps no BF16 copy, so its
// digest is taken when it is loaded): each param_layout entry's digest is core/checksum.h's Checksum64 of the BF16
// bits (round to nearest even) of its values; the base's is the Checksum64 of those digests in entry order, as
// little-endian 8-byte words.
uint64_t lora_bf16_digest(const float* values, int64_t n);
uint64_t lora_fold_digests(const std::vector<uint64_t>& digests);
// The same over FP32 values of the whole base in param_layout's flat order (LoraBaseChecksum fed at once).
uint64_t lora_base_checksum(const ModelConfig& cfg, const std::vector<float>& base);
// The same over values that arrive piece by piece (the merge's streamed base): each entry's pieces in flat order,
// the entries in any order; an entry in flight holds at most two checksum chunks of BF16 bits, a complete one its
// digest only.
class LoraBaseChecksum {
 public:
  explicit LoraBaseChecksum(const ModelConfig& cfg);
  void add(int64_t offset, const float* values, int64_t count);
  uint64_t checksum() const;  // every entry complete (an internal error otherwise)

 private:
  struct Entry {
    Checksum64 sum;
    std::vector<uint16_t> tail;  // BF16 bits short of a whole chunk (freed once the entry is complete)
    int64_t next = 0;            // elements added
    uint64_t digest = 0;         // once complete
  };
  std::vector<int64_t> begin_, size_;  // param_layout's entries: flat offset and elements
  std::vector<Entry> entries_;
};

// The Philox stream of the dropout mask of layer `layer`'s adapter on `target` (numerics/dropout.h): distinct
// from every other adapter's and from the stochastic rounding's streams (linear index * 4 + copy, below 2^30).
inline uint32_t lora_dropout_stream(int64_t layer, int target) {
  return 0x4000'0000u + static_cast<uint32_t>(layer * kLoraTargets + target);
}
// The seed of the adapters' dropout masks (a checkpoint records the micro-batch counter with it).
inline constexpr uint64_t kLoraDropoutSeed = 0xD40F'0A7Eull;

}  // namespace pl
