#include "model/lora_export.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/json_text.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/lora.h"
#include "model/memory_plan.h"

namespace pl {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

namespace {

// One Hugging Face projection of a fused target: its PEFT module path and the rows of the fused B it takes.
struct HfProjection {
  std::string module;  // "self_attn.q_proj"
  int64_t row0 = 0, rows = 0;
};

// The projections of target k, with the Hugging Face export's row split of the fused weight (hf_llama.cpp).
std::vector<HfProjection> hf_projections(const ModelConfig& m, int k) {
  const int64_t q = m.q_dim(), kv = m.kv_dim(), f = m.ffn_hidden_size, h = m.hidden_size;
  switch (k) {
    case 0: return {{"self_attn.q_proj", 0, q}, {"self_attn.k_proj", q, kv}, {"self_attn.v_proj", q + kv, kv}};
    case 1: return {{"self_attn.o_proj", 0, h}};
    case 2: return {{"mlp.gate_proj", 0, f}, {"mlp.up_proj", f, f}};
    case 3: return {{"mlp.down_proj", 0, h}};
  }
  fail("internal: LoRA target {}", k);
}

std::string peft_name(int64_t layer, const std::string& module, char ab) {
  return fmt::format("base_model.model.model.layers.{}.{}.lora_{}.weight", layer, module, ab);
}

// The base's entry of linear `k`'s weight in `layer` (param_layout: ln1, qkv, proj, ln2, fc1, fc2 per layer).
const ParamEntry& base_weight_entry(const std::vector<ParamEntry>& layout, int64_t layer, int k) {
  constexpr int kEntryOfLinear[kLoraTargets] = {1, 2, 4, 5};
  return layout[static_cast<size_t>(1 + layer * static_cast<int64_t>(kEntriesPerLayer) + kEntryOfLinear[k])];
}

}  // namespace

namespace {

// rows [row0, row0 + rows) of w [out, in] += s · (B·A) of those rows: A [r, in], B [out, r]; each element of B·A
// summed over the rank in order, scaled, then added (the order every merge here keeps).
void add_scaled_ba_rows(const float* a, const float* b, int64_t r, int64_t in, int64_t row0, int64_t rows, float s,
                        float* w) {
#pragma omp parallel for schedule(static)
  for (int64_t o = row0; o < row0 + rows; ++o)
    for (int64_t c = 0; c < in; ++c) {
      float acc = 0.0f;
      for (int64_t j = 0; j < r; ++j) acc += b[o * r + j] * a[j * in + c];
      w[(o - row0) * in + c] += s * acc;
    }
}

void check_adapter_count(const ModelConfig& cfg, const LoraConfig& lora, size_t adapters) {
  PL_CHECK(static_cast<int64_t>(adapters) == lora_parameter_count(cfg, lora),
           "internal: merging {} adapter values ({} expected)", adapters, lora_parameter_count(cfg, lora));
}

}  // namespace

void merge_lora_into(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                     std::span<float> base) {
  check_adapter_count(cfg, lora, adapters.size());
  PL_CHECK(static_cast<int64_t>(base.size()) == cfg.num_parameters(), "internal: merging into {} base values ({} expected)",
           base.size(), cfg.num_parameters());
  const std::vector<ParamEntry> layout = param_layout(cfg);
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      const ParamEntry& e = base_weight_entry(layout, l, k);
      merge_lora_into_tensor(cfg, lora, adapters, e.offset, e.numel(), base.data() + e.offset);
    }
}

void merge_lora_into_tensor(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                            int64_t offset, int64_t count, float* values) {
  check_adapter_count(cfg, lora, adapters.size());
  const std::vector<ParamEntry> layout = param_layout(cfg), entries = lora_layout(cfg, lora);
  const auto it = std::upper_bound(layout.begin(), layout.end(), offset,
                                   [](int64_t o, const ParamEntry& e) { return o < e.offset; });
  const auto i = static_cast<size_t>(it - layout.begin()) - 1;
  const ParamEntry& e = layout[i];
  const int k = linear_of_entry(cfg, i);
  if (k < 0) return;
  PL_CHECK(offset + count <= e.offset + e.numel() && (offset - e.offset) % e.cols == 0 && count % e.cols == 0,
           "internal: merging flat range [{}, {}) that is not whole rows of {}", offset, offset + count, e.name);
  const int64_t l = static_cast<int64_t>((i - 1) / kEntriesPerLayer), a_index = lora_entry_index(lora, l, k);
  if (a_index < 0) return;
  const ParamEntry &ea = entries[static_cast<size_t>(a_index)], &eb = entries[static_cast<size_t>(a_index + 1)];
  add_scaled_ba_rows(adapters.data() + ea.offset, adapters.data() + eb.offset, lora.dim, ea.cols,
                     (offset - e.offset) / e.cols, count / e.cols, static_cast<float>(lora.scale()), values);
}

std::string peft_adapter_config_json(const LoraConfig& lora, const std::string& base_model) {
  ordered_json j;
  j["peft_type"] = "LORA";
  j["task_type"] = "CAUSAL_LM";
  j["base_model_name_or_path"] = base_model;
  j["r"] = lora.dim;
  j["lora_alpha"] = lora.alpha;
  j["lora_dropout"] = lora.dropout;
  j["target_modules"] = lora_hf_target_modules(lora.targets);
  j["bias"] = "none";
  j["fan_in_fan_out"] = false;
  j["use_rslora"] = false;
  j["use_dora"] = false;
  j["init_lora_weights"] = true;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  j["rank_pattern"] = ordered_json::object();
  j["alpha_pattern"] = ordered_json::object();
  return j.dump(2) + "\n";
}

std::vector<std::string> export_peft(const ModelConfig& cfg, const LoraConfig& lora, std::span<const float> adapters,
                                     const std::string& dir, const std::string& base_model) {
  PL_CHECK(static_cast<int64_t>(adapters.size()) == lora_parameter_count(cfg, lora),
           "internal: exporting {} adapter values, {} expected", adapters.size(), lora_parameter_count(cfg, lora));
  const std::vector<ParamEntry> entries = lora_layout(cfg, lora);
  std::vector<SafetensorsTensorOut> tensors;
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      const int64_t i = lora_entry_index(lora, l, k);
      if (i < 0) continue;
      const ParamEntry &a = entries[static_cast<size_t>(i)], &b = entries[static_cast<size_t>(i + 1)];
      for (const HfProjection& p : hf_projections(cfg, k)) {
        tensors.push_back({peft_name(l, p.module, 'A'), "F32", {a.rows, a.cols}, adapters.data() + a.offset});
        tensors.push_back(
            {peft_name(l, p.module, 'B'), "F32", {p.rows, b.cols}, adapters.data() + b.offset + p.row0 * b.cols});
      }
    }
  fs::create_directories(dir);
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), tensors);
  write_file_atomically((fs::path(dir) / "adapter_config.json").string(), peft_adapter_config_json(lora, base_model));
  return {"adapter_model.safetensors", "adapter_config.json"};
}

PeftAdapters read_peft(const std::string& dir, const ModelConfig& cfg) {
  const std::string config_path = (fs::path(dir) / "adapter_config.json").string();
  const nlohmann::json j = parse_json_text(read_regular_file(config_path), config_path);
  PL_CHECK(j.value("peft_type", std::string()) == "LORA", "{}: peft_type must be \"LORA\"", config_path);
  PeftAdapters out;
  LoraConfig& c = out.lora;
  PL_CHECK(j.contains("r") && j["r"].is_number_integer(), "{}: 'r' must be an integer", config_path);
  PL_CHECK(j.contains("lora_alpha") && j["lora_alpha"].is_number(), "{}: 'lora_alpha' must be a number", config_path);
  PL_CHECK(j.contains("target_modules") && j["target_modules"].is_array(), "{}: 'target_modules' must be a list",
           config_path);
  c.dim = j["r"].get<int64_t>();
  c.alpha = j["lora_alpha"].get<double>();
  c.dropout = j.value("lora_dropout", 0.0);
  std::string targets;
  for (const auto& t : j["target_modules"]) {
    PL_CHECK(t.is_string(), "{}: target_modules must hold names", config_path);
    targets += (targets.empty() ? "" : ",") + t.get<std::string>();
  }
  c.targets = parse_lora_target_modules(targets);
  validate_lora_config(c);
  const std::string path = (fs::path(dir) / "adapter_model.safetensors").string();
  const SafetensorsFile file(path);
  const std::vector<ParamEntry> entries = lora_layout(cfg, c);
  out.adapters.assign(static_cast<size_t>(lora_parameter_count(cfg, c)), 0.0f);
  std::vector<float> staging;
  std::set<std::string> read_names;
  const auto read = [&](const std::string& name, std::vector<int64_t> shape, float* dst) {
    const SafetensorsTensorInfo& t = file.info(name);
    PL_CHECK(t.shape == shape, "{}: tensor '{}' has shape {}, the adapters of dim {} on model {} need [{}]", path,
             name, t.shape_str(), c.dim, cfg.name, fmt::join(shape, ", "));
    file.read_float(name, dst);
  };
  for (int64_t l = 0; l < cfg.num_layers; ++l)
    for (int k = 0; k < kLoraTargets; ++k) {
      const int64_t i = lora_entry_index(c, l, k);
      if (i < 0) continue;
      const ParamEntry &a = entries[static_cast<size_t>(i)], &b = entries[static_cast<size_t>(i + 1)];
      float* a_dst = out.adapters.data() + a.offset;
      bool first = true;
      for (const HfProjection& p : hf_projections(cfg, k)) {
        const std::string a_name = peft_name(l, p.module, 'A');
        if (first) {
          read(a_name, {a.rows, a.cols}, a_dst);
        } else {  // one fused adapter: every projection of the group carries the same A
          staging.resize(static_cast<size_t>(a.numel()));
          read(a_name, {a.rows, a.cols}, staging.data());
          PL_CHECK(std::equal(staging.begin(), staging.end(), a_dst),
                   "{}: '{}' differs from the A of the other projections of {} (one adapter sits on the fused layer: "
                   "their A must be one matrix)",
                   path, a_name, kLoraTargetNames[k]);
        }
        first = false;
        read(peft_name(l, p.module, 'B'), {p.rows, b.cols}, out.adapters.data() + b.offset + p.row0 * b.cols);
        read_names.insert(a_name);
        read_names.insert(peft_name(l, p.module, 'B'));
      }
    }
  // Nothing else: PEFT's modules_to_save (an LM head, embeddings) or adapters on modules this model does not adapt.
  for (const SafetensorsTensorInfo& t : file.tensors())
    PL_CHECK(read_names.contains(t.name), "{}: tensor '{}' is not a LoRA adapter of {} on {} (unexpected tensor)",
             path, t.name, lora_target_names(c.targets), cfg.name);
  return out;
}

}  // namespace pl
