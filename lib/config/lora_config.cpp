#include "config/lora_config.h"

#include <cmath>
#include <set>

#include "core/error.h"

namespace pl {

namespace {

// The Hugging Face projections of each target (Llama's module names), in the order PEFT lists them.
const std::vector<std::vector<std::string>>& hf_groups() {
  static const std::vector<std::vector<std::string>> groups = {
      {"q_proj", "k_proj", "v_proj"}, {"o_proj"}, {"gate_proj", "up_proj"}, {"down_proj"}};
  return groups;
}

std::string trimmed(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t"), e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

std::vector<std::string> split_commas(const std::string& list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t comma = list.find(',', start);
    out.push_back(trimmed(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

std::string joined(const std::vector<std::string>& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : ",") + n;
  return s;
}

// Target index of Megatron name `name`, or -1.
int megatron_target(const std::string& name) {
  for (int k = 0; k < kLoraTargets; ++k)
    if (name == kLoraTargetNames[k]) return k;
  return -1;
}

// Target index of Hugging Face projection `name`, or -1.
int hf_target(const std::string& name) {
  for (int k = 0; k < kLoraTargets; ++k)
    for (const std::string& p : hf_groups()[static_cast<size_t>(k)])
      if (name == p) return k;
  return -1;
}

}  // namespace

LoraTargets parse_lora_target_modules(const std::string& list) {
  constexpr const char* kKnown =
      "linear_qkv, linear_proj, linear_fc1, linear_fc2, all-linear, or the Hugging Face projections in whole groups: "
      "q_proj,k_proj,v_proj / o_proj / gate_proj,up_proj / down_proj";
  LoraTargets t = {false, false, false, false};
  std::set<std::string> hf_given;
  for (const std::string& name : split_commas(list)) {
    PL_CHECK(!name.empty(), "--lora-target-modules '{}' has an empty name (a comma-separated list of {})", list,
             kKnown);
    if (name == "all-linear") {
      t = {true, true, true, true};
    } else if (const int k = megatron_target(name); k >= 0) {
      t[static_cast<size_t>(k)] = true;
    } else if (hf_target(name) >= 0) {
      hf_given.insert(name);
    } else {
      fail("--lora-target-modules: '{}' names no LoRA target (the embedding and the LM head never take one): use {}",
           name, kKnown);
    }
  }
  for (int k = 0; k < kLoraTargets; ++k) {
    const std::vector<std::string>& group = hf_groups()[static_cast<size_t>(k)];
    std::vector<std::string> missing;
    for (const std::string& p : group)
      if (!hf_given.contains(p)) missing.push_back(p);
    if (missing.size() == group.size()) continue;  // none of this group given by its HF names
    PL_CHECK(missing.empty(),
             "--lora-target-modules '{}' gives part of {} without {}: one adapter sits on the fused layer, so give "
             "{} together (or {})",
             list, kLoraTargetNames[k], joined(missing), joined(group), kLoraTargetNames[k]);
    t[static_cast<size_t>(k)] = true;
  }
  return t;
}

std::string lora_target_names(const LoraTargets& t) {
  std::vector<std::string> names;
  for (int k = 0; k < kLoraTargets; ++k)
    if (t[static_cast<size_t>(k)]) names.emplace_back(kLoraTargetNames[k]);
  return joined(names);
}

std::vector<std::string> lora_hf_target_modules(const LoraTargets& t) {
  std::vector<std::string> names;
  for (int k = 0; k < kLoraTargets; ++k)
    if (t[static_cast<size_t>(k)])
      for (const std::string& p : hf_groups()[static_cast<size_t>(k)]) names.push_back(p);
  return names;
}

LoraDropoutPosition parse_lora_dropout_position(const std::string& s) {
  if (s == "pre") return LoraDropoutPosition::Pre;
  if (s == "post") return LoraDropoutPosition::Post;
  fail("--lora-dropout-position must be pre (on the adapter's input, before A) or post (on the adapter's output, "
       "before the alpha/dim scaling), got '{}'",
       s);
}

LoraAInit parse_lora_a_init(const std::string& s) {
  if (s == "xavier") return LoraAInit::Xavier;
  if (s == "kaiming") return LoraAInit::Kaiming;
  fail("--lora-a-init must be xavier or kaiming, got '{}'", s);
}

const char* lora_dropout_position_name(LoraDropoutPosition p) { return p == LoraDropoutPosition::Pre ? "pre" : "post"; }
const char* lora_a_init_name(LoraAInit a) { return a == LoraAInit::Xavier ? "xavier" : "kaiming"; }

void validate_lora_config(const LoraConfig& c) {
  PL_CHECK(c.dim >= 1, "--lora-dim must be >= 1, got {}", c.dim);
  PL_CHECK(std::isfinite(c.alpha) && c.alpha > 0.0, "--lora-alpha must be a finite number > 0, got {}", c.alpha);
  PL_CHECK(c.dropout >= 0.0 && c.dropout < 1.0, "--lora-dropout must be in [0, 1), got {}", c.dropout);
  bool any = false;
  for (bool t : c.targets) any = any || t;
  PL_CHECK(any, "--lora-target-modules chooses no target");
}

LoraAdapterShape lora_adapter_shape(const ModelConfig& m, int target) {
  switch (target) {
    case 0: return {m.hidden_size, m.qkv_dim()};
    case 1: return {m.q_dim(), m.hidden_size};
    case 2: return {m.hidden_size, 2 * m.ffn_hidden_size};
    case 3: return {m.ffn_hidden_size, m.hidden_size};
  }
  fail("internal: LoRA target {} of {}", target, kLoraTargets);
}

int64_t lora_parameter_count(const ModelConfig& m, const LoraConfig& c) {
  int64_t per_layer = 0;
  for (int k = 0; k < kLoraTargets; ++k)
    if (c.targets[static_cast<size_t>(k)]) per_layer += lora_adapter_shape(m, k).parameters(c.dim);
  return m.num_layers * per_layer;
}

}  // namespace pl
