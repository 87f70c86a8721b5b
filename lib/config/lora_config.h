#pragma once
// LoRA's configuration as Megatron-Bridge's LoRA PEFT config names it (peft/lora.py; ../shared/SPEC-LORA.md):
// the rank `dim`, `alpha` (the update is scaled by alpha/dim), dropout on the adapter's input (`pre`, before A,
// as Megatron-Bridge and PEFT) or on its output (`post`: on B's output, before the alpha/dim scaling, as
// Megatron-Bridge's ParallelLinearAdapter.forward does), A's initialisation (`xavier` = xavier_normal, std
// sqrt(2/(in + dim)); `kaiming` = kaiming_uniform(a = sqrt 5), U(+-1/sqrt(in)) as PEFT; B is zero either way, so
// step 0 is the base model), and the target modules. One adapter per fused layer (Megatron-Bridge's default,
// "performant" LoRA): the fused qkv and the fused gate+up (fc1) each carry one A and one B, which is canonical
// LoRA with the A matrices of q, k, v (gate, up) tied. Never the embedding or the LM head.
// The first part of issue 41: the configuration, its checks and the adapters' shapes and parameter counts; the
// training, checkpoints and exports that use it come next.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "config/model_config.h"

namespace pl {

enum class LoraDropoutPosition { Pre, Post };
enum class LoraAInit { Xavier, Kaiming };

// The linear layers of a decoder layer an adapter can sit on, in model order: Megatron's module names, the
// same order and names as model/precision_plan.h's kLinearNames (tests/config/test_lora_config.cpp checks it).
inline constexpr int kLoraTargets = 4;
inline constexpr const char* kLoraTargetNames[kLoraTargets] = {"linear_qkv", "linear_proj", "linear_fc1",
                                                               "linear_fc2"};
using LoraTargets = std::array<bool, kLoraTargets>;

struct LoraConfig {
  int64_t dim = 32;     // --lora-dim: the rank
  double alpha = 32.0;  // --lora-alpha
  double dropout = 0.0;  // --lora-dropout, in [0, 1)
  LoraDropoutPosition dropout_position = LoraDropoutPosition::Pre;  // --lora-dropout-position
  LoraAInit a_init = LoraAInit::Xavier;                             // --lora-a-init
  LoraTargets targets = {true, true, true, true};                   // --lora-target-modules (default: all four)
  double scale() const { return alpha / static_cast<double>(dim); }
  bool has_adapters() const { return targets[0] || targets[1] || targets[2] || targets[3]; }
};
// No adapter at all: under RunLayout::lora, the frozen base alone -- an evaluation model (evaluate, the trainer's
// --downstream-eval): the BF16 weights and the recipe's quantized copies, nothing trainable (no gradients, master
// weights or moments). Not a --peft configuration: validate_lora_config refuses it.
inline LoraConfig no_adapters() {
  LoraConfig c;
  c.targets = {false, false, false, false};
  return c;
}

// --lora-target-modules: a comma-separated list of Megatron's names (linear_qkv, linear_proj, linear_fc1,
// linear_fc2), `all-linear`, or Hugging Face projection names as whole fused groups (q_proj,k_proj,v_proj =
// linear_qkv; o_proj = linear_proj; gate_proj,up_proj = linear_fc1; down_proj = linear_fc2), mixed freely.
// A partial group (PEFT's Llama default q_proj,v_proj), a name that matches no target (the embedding, the LM
// head, a wildcard) or an empty list is a one-line pl::Error naming the flag and what is missing.
LoraTargets parse_lora_target_modules(const std::string& list);
// The chosen targets as Megatron's names ("linear_qkv,linear_fc1") and as PEFT's target_modules (the Hugging
// Face projections, in model order: q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj).
std::string lora_target_names(const LoraTargets& t);
std::vector<std::string> lora_hf_target_modules(const LoraTargets& t);
// --lora-dropout-position pre|post and --lora-a-init xavier|kaiming (one-line errors naming the flag).
LoraDropoutPosition parse_lora_dropout_position(const std::string& s);
LoraAInit parse_lora_a_init(const std::string& s);
const char* lora_dropout_position_name(LoraDropoutPosition p);
const char* lora_a_init_name(LoraAInit a);
// --lora-dim >= 1, --lora-alpha > 0 and finite, --lora-dropout in [0, 1), at least one target: one line each.
void validate_lora_config(const LoraConfig& c);

// The adapter on target `target` (kLoraTargetNames index) of a layer of m: A [dim, in], B [out, dim], where in
// and out are the base layer's (qkv: hidden -> (heads + 2 groups) * head dim; proj: heads * head dim -> hidden;
// fc1: hidden -> 2 * ffn; fc2: ffn -> hidden).
struct LoraAdapterShape {
  int64_t in = 0, out = 0;
  int64_t parameters(int64_t dim) const { return dim * (in + out); }
};
LoraAdapterShape lora_adapter_shape(const ModelConfig& m, int target);
// The trainable parameters of c on m: every layer's adapters (llama3_8b at dim 32 on all four targets:
// 71,303,168, 0.89% of the model).
int64_t lora_parameter_count(const ModelConfig& m, const LoraConfig& c);

}  // namespace pl
