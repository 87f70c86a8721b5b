#pragma once
// Hugging Face Llama interop: config.json <-> ModelConfig, and LlamaForCausalLM safetensors weights
// <-> our flat FP32 master buffer.
//
// Sources followed: transformers' LlamaConfig (field names and defaults) and modeling_llama.py
// (rotate_half RoPE, q/k/v/o and gate/up/down projections), Megatron-Bridge's LlamaBridge (which HF
// tensor feeds which Megatron parameter; config mapping), huggingface_hub's shard naming.
//
// Tensor mapping (ours is Megatron's naming; rows of our fused weights are contiguous blocks):
//   model.embed_tokens.weight                    [V, h]      embedding.word_embeddings.weight
//   model.layers.i.input_layernorm.weight        [h]         decoder.layers.i.self_attention.linear_qkv.layer_norm_weight
//   model.layers.i.self_attn.q_proj.weight       [nq*d, h]   linear_qkv rows [0, nq*d)
//   model.layers.i.self_attn.k_proj.weight       [nkv*d, h]  linear_qkv rows [nq*d, nq*d + nkv*d)
//   model.layers.i.self_attn.v_proj.weight       [nkv*d, h]  linear_qkv rows [nq*d + nkv*d, (nq + 2 nkv)*d)
//   model.layers.i.self_attn.o_proj.weight       [h, nq*d]   decoder.layers.i.self_attention.linear_proj.weight
//   model.layers.i.post_attention_layernorm.weight [h]       decoder.layers.i.mlp.linear_fc1.layer_norm_weight
//   model.layers.i.mlp.gate_proj.weight          [f, h]      linear_fc1 rows [0, f)   (the gate half: swiglu.h)
//   model.layers.i.mlp.up_proj.weight            [f, h]      linear_fc1 rows [f, 2f)
//   model.layers.i.mlp.down_proj.weight          [h, f]      decoder.layers.i.mlp.linear_fc2.weight
//   model.norm.weight                            [h]         decoder.final_layernorm.weight
//   lm_head.weight                               [V, h]      output_layer.weight
// Unlike Megatron's linear_qkv (interleaved per query group, which Megatron-Bridge's QKVMapping
// builds), our qkv rows are all q heads, then all k heads, then all v heads (attention.cpp's
// QkvLayout), so q/k/v are plain row blocks. No permutation of q/k rows is needed either: HF
// checkpoints are stored for rotate_half (x_i pairs with x_{i+d/2} within each head), which is
// exactly the pairing of our RoPE (backend/cpu/rope.cpp); transformers' convert_llama_weights_to_hf
// permutes Meta's interleaved checkpoints into that form before they reach the Hub.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "io/safetensors.h"

namespace pl {

class LlamaModel;

// What config.json says, mapped onto our ModelConfig, plus the fields we carry but do not model.
struct HfLlamaConfig {
  ModelConfig model;
  bool tie_word_embeddings = false;
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // eos_token_id may be one id or a list
  std::string torch_dtype;             // as written ("bfloat16", ...); informational
};

// Reads and maps config.json. Refused with a one-line error naming the file and the field: a
// model_type other than "llama", architectures without LlamaForCausalLM, hidden_act other than silu,
// attention_bias / mlp_bias true, attention_dropout != 0, a rope type other than llama3 (or none),
// quantization_config (pre-quantized weights), and shapes our model cannot run (e.g.
// num_attention_heads not dividing hidden_size). Absent fields take LlamaConfig's defaults.
// seq_length (not an HF field) is set to max_position_embeddings, as Megatron-Bridge does.
HfLlamaConfig read_hf_llama_config(const std::string& config_json_path);

// The config.json text (sorted keys, 2-space indent, as transformers writes it) for `cfg`:
// architectures ["LlamaForCausalLM"], model_type "llama", torch_dtype "bfloat16", the rope settings
// (rope_theta, rope_scaling {rope_type "llama3", ...} or null), head_dim always (transformers >= 4.45
// reads it; older versions assume hidden_size / num_attention_heads), tie_word_embeddings false.
struct HfExportOptions {
  uint64_t max_shard_bytes = 5'000'000'000;  // save_pretrained's default max_shard_size "5GB"
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
};
std::string hf_llama_config_json(const ModelConfig& cfg, const HfExportOptions& opts = {});

// Refuses (one line naming the field) a ModelConfig that HF's LlamaConfig cannot express. Every
// config that passes validate_model_config maps onto LlamaConfig (head_dim carries kv_channels,
// rope_scaling carries our Llama 3.1 scaling), so in practice this is validation with the HF field
// named alongside ours.
void check_hf_expressible(const ModelConfig& cfg);

// --init-from-hf together with --model: every field that changes the forward pass must agree
// (shapes, rope, norm epsilon); else one line naming both files and the field.
void check_hf_config_matches(const ModelConfig& from_hf, const ModelConfig& given);

// The model config for a run started from `dir`: dir/config.json, cross-checked against the config
// file `given_model_path` when it is not empty.
ModelConfig hf_model_config_for_run(const std::string& dir, const std::string& given_model_path);

// One HF tensor and where it lives in our flat parameter buffer (a contiguous range, see above).
struct HfTensorSlot {
  std::string name;            // HF name
  std::vector<int64_t> shape;  // HF shape: [rows, cols], or [h] for norms
  int64_t offset = 0;          // element offset in the flat buffer
  int64_t numel() const;
};
// In transformers' state_dict order (the order save_pretrained shards in).
std::vector<HfTensorSlot> hf_llama_tensor_layout(const ModelConfig& cfg);

struct HfImportReport {
  std::string dir;
  int64_t num_tensors = 0;     // HF tensors read
  uint64_t stored_bytes = 0;   // their bytes on disk
  std::set<std::string> dtypes;
  bool tied_embeddings = false;   // lm_head initialised from embed_tokens
  std::vector<std::string> ignored;  // tensors present but not used (rotary_emb.inv_freq, a tied lm_head)
  // "initialized from Hugging Face checkpoint DIR (N tensors, X.XX GB, dtype BF16)" (+ notes)
  std::string describe() const;
};

// Loads dir's weights (BF16/F16/F32 stored) into the model's FP32 master weights, then
// sync_weights_from_master() and zero_grads(). dir/config.json must describe the model's shape.
// Every tensor of the layout must be present with its exact shape; a tensor the layout does not
// know is an error, except *.rotary_emb.inv_freq (buffers some old checkpoints saved; we compute
// them) and, with tie_word_embeddings, lm_head.weight. With tie_word_embeddings our separate LM head
// starts as a copy of embed_tokens (the forward pass is then HF's exactly; training updates the two
// separately) and the report says so: refusing would lock out tied models such as Llama 3.2 1B.
// Everything is checked (names, shapes, dtypes) before any weight is written.
HfImportReport import_hf(const std::string& dir, LlamaModel& model);
// Receives the weights of a flat layout (LlamaModel::param_entries' offsets), a contiguous run at a time (the HF
// import here, a checkpoint's masters in train/checkpoint.h).
using FlatWeightWriter = std::function<void(int64_t offset, const float* values, int64_t count)>;
// The same checks and reads without a model: every tensor of dir (whose config.json must describe `cfg`'s shape)
// as FP32 values into `write`, tensor by tensor (what the generate tool loads without a training model's state).
HfImportReport read_hf_weights(const std::string& dir, const ModelConfig& cfg, const FlatWeightWriter& write);

// Flat parameter values arriving in pieces (a checkpoint's master file piece by piece, a base from its source; each
// element once, in any order) gathered into whole Hugging Face tensors, each a contiguous flat range
// (hf_llama_tensor_layout): `gathered(slot, values)` once per complete tensor, `values` the gatherer's FP32 buffer
// (writable: the merge adds its rows there), freed after the call; a write that holds a whole tensor goes to `whole`
// instead, uncopied, when one is given. Host memory: the tensors in flight, never the model.
class HfTensorGatherer {
 public:
  using Gathered = std::function<void(const HfTensorSlot& slot, size_t index, float* values)>;
  using Whole = std::function<void(const HfTensorSlot& slot, size_t index, const float* values)>;
  HfTensorGatherer(const ModelConfig& cfg, Gathered gathered, Whole whole = {});
  void write(int64_t offset, const float* values, int64_t count);  // a FlatWeightWriter
  const std::vector<HfTensorSlot>& slots() const { return slots_; }
  // Tensors begun and not complete (0 once every value has arrived), and the most FP32 values held at once.
  size_t incomplete() const { return pending_.size(); }
  std::string first_incomplete() const { return pending_.empty() ? "" : slots_[pending_.begin()->first].name; }
  int64_t peak_pending_elements() const { return peak_pending_; }

 private:
  struct Pending {
    std::vector<float> values;
    int64_t written = 0;
  };
  Gathered gathered_;
  Whole whole_;
  std::vector<HfTensorSlot> slots_;
  std::vector<size_t> by_offset_;  // slot indices in flat order
  std::map<size_t, Pending> pending_;
  int64_t pending_elements_ = 0, peak_pending_ = 0;
};

// An HF directory written as the flat parameter values arrive: HfTensorGatherer's tensors, each passed to `adjust`
// (the LoRA merge of its rows; may be empty) and written at its place (io/safetensors.h SafetensorsStreamWriter).
// finish() writes config.json after the weights and returns the files written; the same files, bytes and sharding
// as export_hf below, which is this stream fed with the whole buffer.
class HfExportStream {
 public:
  using Adjust = std::function<void(const HfTensorSlot& slot, float* values)>;
  HfExportStream(const ModelConfig& cfg, const std::string& dir, const HfExportOptions& opts = {}, Adjust adjust = {});
  ~HfExportStream();
  void write(int64_t offset, const float* values, int64_t count) { gatherer_.write(offset, values, count); }
  std::vector<std::string> finish();
  int64_t peak_pending_elements() const { return gatherer_.peak_pending_elements(); }

 private:
  std::string config_text_, dir_;
  Adjust adjust_;
  std::unique_ptr<SafetensorsStreamWriter> writer_;
  HfTensorGatherer gatherer_;
};

// The host memory of streaming a model's weights tensor by tensor (read_hf_weights into a model, the merge's
// HfExportStream): the largest Hugging Face tensor in FP32 (the reader's staging, or the writer's gathering) with
// its BF16 bytes (the mapped pages being read, or the writer's pieces), and under LoRA the frozen base's assembly
// of its largest linear in FP32 with its BF16 rounding (LlamaModel::write_frozen_linear). An estimate of what the
// process adds to its resident set, never the model's FP32 values.
struct HfStreamingPeak {
  double bytes = 0;
  std::string largest;  // "model.embed_tokens.weight [128256, 8192]"
};
HfStreamingPeak hf_streaming_host_peak(const ModelConfig& cfg, bool lora);

// Writes an HF directory (safetensors BF16, rounded to nearest even from the FP32 masters, sharded
// above opts.max_shard_bytes with model.safetensors.index.json; then config.json) from host master
// weights in our flat layout (cfg.num_parameters() floats) — what a checkpoint converter holds.
// Returns the files written.
std::vector<std::string> export_hf(const ModelConfig& cfg, std::span<const float> master, const std::string& dir,
                                   const HfExportOptions& opts = {});
// The same from a live model (its master weights copied to the host first).
std::vector<std::string> export_hf(LlamaModel& model, const std::string& dir, const HfExportOptions& opts = {});

}  // namespace pl
