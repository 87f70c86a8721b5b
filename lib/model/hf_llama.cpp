#include "model/hf_llama.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "config/json_reader.h"
#include "core/error.h"
#include "io/json_text.h"
#include "core/tensor.h"
#include "io/atomic_file.h"
#include "io/safetensors.h"
#include "model/llama.h"
#include "model/precision_plan.h"

namespace pl {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_null(const json& j, const char* key) { return !j.contains(key) || j[key].is_null(); }

// Our integer shape fields and their config.json names (LlamaConfig), in LlamaConfig's order.
struct HfShapeField {
  const char* ours;
  const char* hf;
  int64_t ModelConfig::*value;
};
constexpr HfShapeField kHfShape[] = {
    {"num_layers", "num_hidden_layers", &ModelConfig::num_layers},
    {"hidden_size", "hidden_size", &ModelConfig::hidden_size},
    {"ffn_hidden_size", "intermediate_size", &ModelConfig::ffn_hidden_size},
    {"num_attention_heads", "num_attention_heads", &ModelConfig::num_attention_heads},
    {"num_query_groups", "num_key_value_heads", &ModelConfig::num_query_groups},
    {"kv_channels", "head_dim", &ModelConfig::kv_channels},
    {"vocab_size", "vocab_size", &ModelConfig::vocab_size},
};

// Accepts an integer, a list of integers or null (HF's bos/eos_token_id).
std::vector<int64_t> token_ids(const JsonReader& r, const json& j, const char* key) {
  if (is_null(j, key)) return {};
  const json& v = j[key];
  if (v.is_number_integer()) return {v.get<int64_t>()};
  const auto integer = [](const json& x) { return x.is_number_integer(); };
  if (!v.is_array() || !std::all_of(v.begin(), v.end(), integer))
    r.fail_field(key, "must be an integer or a list of integers, got " + describe_json(v));
  return v.get<std::vector<int64_t>>();
}

// bos/eos ids must name tokens: HF configs use -1 or an id past the vocabulary for "none", which a
// consumer would read as a real (pad) id; refused with one line, and so are our own export flags.
void check_special_token_ids(const std::optional<int64_t>& bos, const std::vector<int64_t>& eos, int64_t vocab_size,
                             const std::string& what) {
  auto check = [&](int64_t id, const char* name) {
    PL_CHECK(id >= 0 && id < vocab_size, "{}: {} {} is outside the vocabulary [0, {})", what, name, id, vocab_size);
  };
  if (bos) check(*bos, "bos_token_id");
  for (const int64_t id : eos) check(id, "eos_token_id");
}

// rope_theta and the Llama 3.1 scaling, from the legacy fields (rope_theta + rope_scaling, what
// every Llama 3.x config.json on the Hub holds) or transformers v5's rope_parameters.
void read_rope(const json& j, const std::string& file, ModelConfig& m) {
  JsonReader top(j, file);
  const bool v5 = !is_null(j, "rope_parameters");
  const json* scaling = nullptr;
  std::string prefix;
  if (v5) {
    scaling = &j["rope_parameters"];
    prefix = "rope_parameters.";
    if (!scaling->is_object()) top.fail_field("rope_parameters", "must be an object, got " + scaling->dump());
    JsonReader rp(*scaling, file, prefix);
    m.rotary_base = rp.number("rope_theta", 10000.0);
  } else {
    m.rotary_base = top.number("rope_theta", 10000.0);  // LlamaConfig's default
    if (!is_null(j, "rope_scaling")) {
      scaling = &j["rope_scaling"];
      prefix = "rope_scaling.";
      if (!scaling->is_object()) top.fail_field("rope_scaling", "must be an object or null, got " + scaling->dump());
    }
  }
  m.rope_scaling = false;
  if (scaling == nullptr) return;
  JsonReader r(*scaling, file, prefix);
  // "type" is the pre-4.43 spelling of "rope_type".
  const std::string type = r.has("rope_type") ? r.string("rope_type") : r.string("type", "default");
  if (type == "default") return;
  if (type != "llama3")
    r.fail_field(r.has("rope_type") ? "rope_type" : "type",
                 fmt::format("is '{}'; only 'llama3' (Llama 3.1 frequency scaling) or no scaling can be expressed by "
                             "our model config",
                             type));
  m.rope_scaling = true;
  m.rope_scaling_factor = r.number("factor");
  m.rope_low_freq_factor = r.number("low_freq_factor");
  m.rope_high_freq_factor = r.number("high_freq_factor");
  m.rope_original_max_position = r.integer("original_max_position_embeddings");
  if (m.rope_scaling_factor < 1.0) r.fail_field("factor", fmt::format("must be >= 1, got {}", m.rope_scaling_factor));
  if (!(m.rope_high_freq_factor > m.rope_low_freq_factor))
    r.fail_field("high_freq_factor", "must exceed low_freq_factor");
  if (m.rope_original_max_position <= 0) r.fail_field("original_max_position_embeddings", "must be positive");
}

// Checks with HF's field names, before validate_model_config (which names ours).
void check_hf_shapes(const JsonReader& r, const ModelConfig& m) {
  auto positive = [&](const char* key, int64_t v) {
    if (v <= 0) r.fail_field(key, fmt::format("must be positive, got {}", v));
  };
  for (const HfShapeField& f : kHfShape) positive(f.hf, m.*f.value);
  positive("max_position_embeddings", m.max_position_embeddings);
  if (m.hidden_size % m.num_attention_heads != 0)
    r.fail_field("num_attention_heads", fmt::format("= {} does not divide hidden_size = {} (our model config requires it)",
                                                    m.num_attention_heads, m.hidden_size));
  if (m.num_attention_heads % m.num_query_groups != 0)
    r.fail_field("num_key_value_heads", fmt::format("= {} does not divide num_attention_heads = {}", m.num_query_groups,
                                                    m.num_attention_heads));
  if (m.kv_channels % 2 != 0) r.fail_field("head_dim", fmt::format("= {} must be even for rotary embeddings", m.kv_channels));
  if (m.vocab_size < 2) r.fail_field("vocab_size", "must be at least 2");
  if (!(m.rotary_base > 1.0)) r.fail_field("rope_theta", fmt::format("must be > 1, got {}", m.rotary_base));
  if (!(m.layernorm_epsilon > 0.0)) r.fail_field("rms_norm_eps", "must be > 0");
  if (!(m.init_method_std > 0.0)) r.fail_field("initializer_range", "must be > 0");
}

}  // namespace

HfLlamaConfig read_hf_llama_config(const std::string& path) {
  const json j = read_json_file(path);
  JsonReader r(j, path);
  HfLlamaConfig out;
  ModelConfig& m = out.model;
  m.file = path;
  m.name = fs::path(path).parent_path().filename().string();
  if (m.name.empty()) m.name = "hf_llama";

  const std::string model_type = r.string("model_type");
  if (model_type != "llama")
    r.fail_field("model_type", fmt::format("is '{}'; only 'llama' (LlamaForCausalLM) can be imported", model_type));
  if (!is_null(j, "architectures")) {
    const json& a = j["architectures"];
    const auto llama = [](const json& x) { return x.is_string() && x.get<std::string>() == "LlamaForCausalLM"; };
    if (!a.is_array() || std::none_of(a.begin(), a.end(), llama)) r.fail_field("architectures", "must list LlamaForCausalLM, got " + describe_json(a));
  }
  if (!is_null(j, "quantization_config"))
    r.fail_field("quantization_config", "is present: pre-quantized weights cannot be imported (use a BF16/FP16/FP32 checkpoint)");
  const std::string act = r.string("hidden_act", "silu");
  if (act != "silu") r.fail_field("hidden_act", fmt::format("is '{}'; our MLP is SwiGLU (silu)", act));
  if (r.boolean("attention_bias", false)) r.fail_field("attention_bias", "is true; our attention projections have no bias");
  if (r.boolean("mlp_bias", false)) r.fail_field("mlp_bias", "is true; our MLP projections have no bias");
  if (r.number("attention_dropout", 0.0) != 0.0) r.fail_field("attention_dropout", "must be 0 (our attention has no dropout)");

  m.num_layers = r.integer("num_hidden_layers");
  m.hidden_size = r.integer("hidden_size");
  m.ffn_hidden_size = r.integer("intermediate_size");
  m.num_attention_heads = r.integer("num_attention_heads");
  m.num_query_groups = is_null(j, "num_key_value_heads") ? m.num_attention_heads : r.integer("num_key_value_heads");
  m.kv_channels = is_null(j, "head_dim") ? (m.num_attention_heads > 0 ? m.hidden_size / m.num_attention_heads : 0)
                                         : r.integer("head_dim");
  m.vocab_size = r.integer("vocab_size");
  m.max_position_embeddings = r.integer("max_position_embeddings", 2048);
  m.seq_length = m.max_position_embeddings;
  m.layernorm_epsilon = r.number("rms_norm_eps", 1e-6);
  m.init_method_std = r.number("initializer_range", 0.02);
  read_rope(j, path, m);
  check_hf_shapes(r, m);
  validate_model_config(m);

  out.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
  const std::vector<int64_t> bos = token_ids(r, j, "bos_token_id");
  if (!bos.empty()) out.bos_token_id = bos[0];
  out.eos_token_ids = token_ids(r, j, "eos_token_id");
  check_special_token_ids(out.bos_token_id, out.eos_token_ids, m.vocab_size, path);
  if (!is_null(j, "torch_dtype") && j["torch_dtype"].is_string()) out.torch_dtype = j["torch_dtype"].get<std::string>();
  else if (!is_null(j, "dtype") && j["dtype"].is_string()) out.torch_dtype = j["dtype"].get<std::string>();  // v5
  return out;
}

void check_hf_expressible(const ModelConfig& m) {
  const std::string& f = m.file;
  auto refuse = [&](const char* ours, const char* hf, const std::string& what) {
    fail("{}: field '{}' (Hugging Face '{}') {}: LlamaConfig cannot express it", f, ours, hf, what);
  };
  if (m.max_position_embeddings <= 0) refuse("max_position_embeddings", "max_position_embeddings", "must be positive");
  if (m.num_query_groups <= 0 || m.num_attention_heads % m.num_query_groups != 0)
    refuse("num_query_groups", "num_key_value_heads", "must divide num_attention_heads");
  if (m.kv_channels <= 0 || m.kv_channels % 2 != 0) refuse("kv_channels", "head_dim", "must be even and positive");
  validate_model_config(m);
}

std::string hf_llama_config_json(const ModelConfig& m, const HfExportOptions& opts) {
  check_hf_expressible(m);
  json j;  // std::map underneath: sorted keys, as transformers' to_json_string(sort_keys=True)
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["attention_bias"] = false;
  j["attention_dropout"] = 0.0;
  j["hidden_act"] = "silu";
  for (const HfShapeField& f : kHfShape) j[f.hf] = m.*f.value;
  j["max_position_embeddings"] = m.max_position_embeddings;
  j["rms_norm_eps"] = m.layernorm_epsilon;
  j["initializer_range"] = m.init_method_std;
  j["mlp_bias"] = false;
  j["pretraining_tp"] = 1;
  j["rope_theta"] = m.rotary_base;
  if (m.rope_scaling)
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", m.rope_scaling_factor},
                         {"low_freq_factor", m.rope_low_freq_factor},
                         {"high_freq_factor", m.rope_high_freq_factor},
                         {"original_max_position_embeddings", m.rope_original_max_position}};
  else
    j["rope_scaling"] = nullptr;
  j["tie_word_embeddings"] = false;  // our embedding and LM head are separate tensors
  j["torch_dtype"] = "bfloat16";
  j["use_cache"] = true;
  check_special_token_ids(opts.bos_token_id, opts.eos_token_ids, m.vocab_size, "config.json export (--bos-token-id/--eos-token-id)");
  if (opts.bos_token_id) j["bos_token_id"] = *opts.bos_token_id;
  if (opts.eos_token_ids.size() == 1) j["eos_token_id"] = opts.eos_token_ids[0];
  else if (!opts.eos_token_ids.empty()) j["eos_token_id"] = opts.eos_token_ids;
  return j.dump(2) + "\n";
}

void check_hf_config_matches(const ModelConfig& hf, const ModelConfig& given) {
  auto differ = [&](const char* ours, const char* hf_name, const std::string& a, const std::string& b) {
    fail("{} and {} disagree on '{}' (config.json '{}'): {} vs {}", given.file, hf.file, ours, hf_name, b, a);
  };
  auto same = [&](const char* ours, const char* hf_name, auto a, auto b) {  // (integers or doubles)
    if (a != b) differ(ours, hf_name, fmt::format("{}", a), fmt::format("{}", b));
  };
  for (const HfShapeField& f : kHfShape) same(f.ours, f.hf, hf.*f.value, given.*f.value);
  same("rotary_base", "rope_theta", hf.rotary_base, given.rotary_base);
  same("layernorm_epsilon", "rms_norm_eps", hf.layernorm_epsilon, given.layernorm_epsilon);
  if (hf.rope_scaling != given.rope_scaling)
    differ("rope_scaling", "rope_scaling", hf.rope_scaling ? "llama3" : "none", given.rope_scaling ? "llama3" : "none");
  if (hf.rope_scaling) {
    same("rope_scaling_factor", "rope_scaling.factor", hf.rope_scaling_factor, given.rope_scaling_factor);
    same("rope_low_freq_factor", "rope_scaling.low_freq_factor", hf.rope_low_freq_factor, given.rope_low_freq_factor);
    same("rope_high_freq_factor", "rope_scaling.high_freq_factor", hf.rope_high_freq_factor,
             given.rope_high_freq_factor);
    same("rope_original_max_position", "rope_scaling.original_max_position_embeddings",
             hf.rope_original_max_position, given.rope_original_max_position);
  }
}

ModelConfig hf_model_config_for_run(const std::string& dir, const std::string& given_model_path) {
  const std::string path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("--init-from-hf {}: no such directory", dir);
  if (!fs::is_regular_file(path, ec)) fail("--init-from-hf {}: no config.json in it", dir);
  const ModelConfig hf = read_hf_llama_config(path).model;
  if (!given_model_path.empty()) check_hf_config_matches(hf, load_model_config(given_model_path));
  return hf;
}

int64_t HfTensorSlot::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::vector<HfTensorSlot> hf_llama_tensor_layout(const ModelConfig& cfg) {
  // Our offsets come from the model's own parameter layout, so this mapping can never drift from
  // what LlamaModel allocates.
  const std::vector<ParamEntry> layout = param_layout(cfg);
  std::map<std::string, const ParamEntry*> ours;
  for (const ParamEntry& e : layout) ours[e.name] = &e;
  auto entry = [&](const std::string& name) -> const ParamEntry& {
    const auto it = ours.find(name);
    PL_CHECK(it != ours.end(), "internal: no parameter '{}' in the model layout", name);
    return *it->second;
  };
  const int64_t h = cfg.hidden_size, f = cfg.ffn_hidden_size, q = cfg.q_dim(), kv = cfg.kv_dim();
  std::vector<HfTensorSlot> out;
  auto whole = [&](std::string hf, const std::string& mine, std::vector<int64_t> shape) {
    out.push_back({std::move(hf), std::move(shape), entry(mine).offset});
  };
  // Rows [row0, row0 + rows) of one of our [*, cols] matrices.
  auto rows = [&](std::string hf, const std::string& mine, int64_t row0, int64_t nrows) {
    const ParamEntry& e = entry(mine);
    out.push_back({std::move(hf), {nrows, e.cols}, e.offset + row0 * e.cols});
  };
  whole("model.embed_tokens.weight", "embedding.word_embeddings.weight", {cfg.vocab_size, h});
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    const std::string hf = fmt::format("model.layers.{}.", l), mine = fmt::format("decoder.layers.{}.", l);
    rows(hf + "self_attn.q_proj.weight", mine + "self_attention.linear_qkv.weight", 0, q);
    rows(hf + "self_attn.k_proj.weight", mine + "self_attention.linear_qkv.weight", q, kv);
    rows(hf + "self_attn.v_proj.weight", mine + "self_attention.linear_qkv.weight", q + kv, kv);
    whole(hf + "self_attn.o_proj.weight", mine + "self_attention.linear_proj.weight", {h, q});
    rows(hf + "mlp.gate_proj.weight", mine + "mlp.linear_fc1.weight", 0, f);
    rows(hf + "mlp.up_proj.weight", mine + "mlp.linear_fc1.weight", f, f);
    whole(hf + "mlp.down_proj.weight", mine + "mlp.linear_fc2.weight", {h, f});
    whole(hf + "input_layernorm.weight", mine + "self_attention.linear_qkv.layer_norm_weight", {h});
    whole(hf + "post_attention_layernorm.weight", mine + "mlp.linear_fc1.layer_norm_weight", {h});
  }
  whole("model.norm.weight", "decoder.final_layernorm.weight", {h});
  whole("lm_head.weight", "output_layer.weight", {cfg.vocab_size, h});
  return out;
}

std::string HfImportReport::describe() const {
  std::string s = fmt::format("initialized from Hugging Face checkpoint {} ({} tensors, {:.2f} GB, dtype {})", dir,
                              num_tensors, static_cast<double>(stored_bytes) / 1e9, fmt::join(dtypes, "+"));
  if (tied_embeddings)
    s += " | tie_word_embeddings: lm_head starts as a copy of embed_tokens and is trained as a separate tensor";
  if (!ignored.empty()) s += fmt::format(" | ignored: {}", fmt::join(ignored, ", "));
  return s;
}

HfImportReport import_hf(const std::string& dir, LlamaModel& model) {
  // Under LoRA into the frozen base (the adapters keep their values: init_adapters).
  HfImportReport rep = read_hf_weights(dir, model.config(), [&](int64_t offset, const float* values, int64_t count) {
    model.write_base(offset, values, count);
  });
  model.sync_weights_from_master();
  model.zero_grads();
  return rep;
}

HfImportReport read_hf_weights(const std::string& dir, const ModelConfig& cfg, const FlatWeightWriter& write) {
  const std::string config_path = (fs::path(dir) / "config.json").string();
  std::error_code ec;
  if (!fs::is_regular_file(config_path, ec)) fail("{}: no config.json (not a Hugging Face model directory)", dir);
  const HfLlamaConfig hf = read_hf_llama_config(config_path);
  check_hf_config_matches(hf.model, cfg);
  const SafetensorsCheckpoint ckpt(dir);

  HfImportReport rep;
  rep.dir = dir;
  rep.tied_embeddings = hf.tie_word_embeddings;
  // Which HF tensor fills each slot: itself, except a tied LM head, which reads the embedding.
  std::vector<HfTensorSlot> slots = hf_llama_tensor_layout(cfg);
  auto source_of = [&](const HfTensorSlot& s) -> std::string {
    return hf.tie_word_embeddings && s.name == "lm_head.weight" ? "model.embed_tokens.weight" : s.name;
  };
  // 1. Names, shapes and dtypes, before anything is written.
  std::set<std::string> used;
  for (const HfTensorSlot& s : slots) {
    const std::string src = source_of(s);
    if (!ckpt.contains(src))
      fail("{}: tensor '{}' is missing (a LlamaForCausalLM with {} layers needs it)", dir, src, cfg.num_layers);
    const SafetensorsTensorInfo& t = ckpt.info(src);
    if (t.shape != s.shape)
      fail("{}: tensor '{}' in {} has shape {}, config.json implies [{}]", dir, src,
           fs::path(ckpt.file_of(src).path()).filename().string(), t.shape_str(), fmt::join(s.shape, ", "));
    if (t.dtype != "BF16" && t.dtype != "F16" && t.dtype != "F32")
      fail("{}: tensor '{}' is stored as {}; only BF16, F16 and F32 weights can be imported", dir, src, t.dtype);
    if (used.insert(src).second) {
      rep.stored_bytes += t.end - t.begin;
      rep.dtypes.insert(t.dtype);
    }
  }
  for (const std::string& name : ckpt.names()) {
    if (used.count(name)) continue;
    if (name.ends_with(".rotary_emb.inv_freq") || (hf.tie_word_embeddings && name == "lm_head.weight")) {
      rep.ignored.push_back(name);
      continue;
    }
    fail("{}: tensor '{}' in {} is not part of a LlamaForCausalLM of this config (unexpected tensor)", dir, name,
         fs::path(ckpt.file_of(name).path()).filename().string());
  }
  rep.num_tensors = static_cast<int64_t>(used.size());

  // 2. Tensor by tensor through a host staging vector into `write` (a model's FP32 masters, as
  // init_parameters writes them; with the distributed optimizer each rank keeps the part in its shard).
  std::vector<float> staging;
  for (const HfTensorSlot& s : slots) {
    staging.resize(static_cast<size_t>(s.numel()));
    ckpt.read_float(source_of(s), staging.data());
    write(s.offset, staging.data(), s.numel());
  }
  return rep;
}

std::vector<std::string> export_hf(const ModelConfig& cfg, std::span<const float> master, const std::string& dir,
                                   const HfExportOptions& opts) {
  PL_CHECK(static_cast<int64_t>(master.size()) == cfg.num_parameters(),
           "export_hf: {} master weights given, {} has {} parameters", master.size(), cfg.name, cfg.num_parameters());
  HfExportStream stream(cfg, dir, opts);
  stream.write(0, master.data(), cfg.num_parameters());
  return stream.finish();
}

std::vector<std::string> export_hf(LlamaModel& model, const std::string& dir, const HfExportOptions& opts) {
  PL_CHECK(!model.sharded(), "export_hf: the master weights are sharded over the data-parallel ranks; export "
           "from a checkpoint instead (convert_checkpoint)");
  PL_CHECK(!model.lora(), "export_hf: a LoRA model's master weights are its adapters, not a Hugging Face model "
           "(merging them into the base is not built yet)");
  std::vector<float> host(static_cast<size_t>(model.num_params()));
  copy_to_host(host.data(), model.master().flat);
  return export_hf(model.config(), host, dir, opts);
}

}  // namespace pl
