#pragma once
// LoRA's adapters outside training (issue 41): merged into a base's weights, and written and read as PEFT's files
// (../shared/SPEC-LORA.md). The adapters are FP32 values in lora_layout's flat order (a LoRA checkpoint's master
// weights); a base is FP32 values in param_layout's flat order (a Hugging Face directory's tensors, a full
// checkpoint's master weights).
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "config/lora_config.h"
#include "config/model_config.h"

namespace pl {

// base += (alpha/dim) · B·A for every adapter, in FP32: each element of B·A summed over the rank in order, scaled,
// then added to the base's value; the caller rounds the result once (export_hf writes BF16, round to nearest even).
// Megatron-Bridge merges the same way (FP32, rounded once: its PR #2574), and never into quantized codes.
void merge_lora_into(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                     std::span<float> base);
// The same for one tensor of the base, `values` = its flat range [offset, offset + count) within one param_layout
// entry (a Hugging Face tensor: q_proj's rows of the fused qkv, ...): the rows of a targeted linear it holds get
// their merge, element for element as merge_lora_into computes them; any other tensor is left as it is.
void merge_lora_into_tensor(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                            int64_t offset, int64_t count, float* values);

// PEFT's adapter_config.json for `lora` (the fields Megatron-Bridge's export writes: peft_type LORA, task_type
// CAUSAL_LM, r, lora_alpha, lora_dropout, the Hugging Face target_modules, bias none, ...).
std::string peft_adapter_config_json(const LoraConfig& lora, const std::string& base_model_name_or_path);
// adapter_config.json and adapter_model.safetensors (F32, metadata {"format": "pt"}) into dir: PEFT's tensor names
// (base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight, ...), A [dim, in] and B [out, dim] as
// nn.Linear holds them; a fused adapter's A under each projection of its group and its B split by the rows the Hugging
// Face export splits the fused weight into (q | k | v; gate | up). Returns the files written.
std::vector<std::string> export_peft(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                                     const std::string& dir, const std::string& base_model_name_or_path);
// The adapters of a PEFT directory in lora_layout's flat order, and their configuration: r, lora_alpha, lora_dropout
// and target_modules (whole fused groups only) from adapter_config.json; each group's projections must carry one
// and the same A. Any problem: one line naming the file and the tensor or field.
struct PeftAdapters {
  LoraConfig lora;
  std::vector<float> adapters;
};
PeftAdapters read_peft(const std::string& dir, const ModelConfig& cfg);

}  // namespace pl
