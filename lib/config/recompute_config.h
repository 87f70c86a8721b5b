#pragma once
// Activation recomputation with Megatron's flags and meanings (issue 42): --recompute-granularity full,
// --recompute-method uniform|block, --recompute-num-layers N. Followed: Megatron-LM's
// megatron/core/transformer/transformer_block.py (_checkpointed_forward):
//   uniform N: the layers go in chunks of N; only each chunk's input is kept; the chunk's forward runs again just
//     before its backward, so every layer is recomputed and N layers' activations are alive at once. (MCore
//     indexes past the last layer when N does not divide the layer count; here the last chunk is shorter.)
//   block N: each of the first N layers keeps only its input and recomputes its forward before its backward; the
//     other layers keep their activations: N trades memory for time layer by layer.
// `--recompute-granularity full` alone is uniform 1 (one layer per chunk: the old --recompute full). Selective
// granularity (only the attention core) is not built: flags.cpp refuses it in one line.
#include <algorithm>
#include <cstdint>
#include <string>

namespace pl {

struct RecomputeConfig {
  enum class Method { None, Uniform, Block };
  Method method = Method::None;
  int64_t num_layers = 0;  // --recompute-num-layers (0 with Method::None)

  static RecomputeConfig full() { return {Method::Uniform, 1}; }
  bool on() const { return method != Method::None; }
  // Whether layer l's forward runs again in the backward.
  bool recomputed(int64_t l) const {
    return method == Method::Uniform || (method == Method::Block && l < num_layers);
  }
  // Layer l's chunk [chunk_begin, chunk_end): recomputed together, from chunk_begin's kept input.
  int64_t chunk_begin(int64_t l) const { return method == Method::Uniform ? l / num_layers * num_layers : l; }
  int64_t chunk_end(int64_t l, int64_t layers) const {
    return method == Method::Uniform ? std::min(chunk_begin(l) + num_layers, layers) : l + 1;
  }
  // Whether layer l's input lives in a buffer of its own for the whole step (else: one shared by the layers at
  // the same place of every uniform chunk, refilled by the chunk's recomputation).
  bool keeps_input(int64_t l) const { return method != Method::Uniform || l % num_layers == 0; }
  // The layer whose set of activations (norm outputs, qkv, attention, MLP, LoRA's A outputs) layer l uses: the
  // first layer of that set; layers that share a set are never alive together. No recomputation: each layer its
  // own; uniform N: N sets (by place in the chunk), those of the first chunk; block N: layer 0's for the N
  // recomputed layers, its own for each of the rest.
  int64_t activation_owner(int64_t l) const {
    if (method == Method::Uniform) return l % num_layers;
    if (method == Method::Block && l < num_layers) return 0;
    return l;
  }
  // The layers whose forward runs twice per micro-batch (of `layers`).
  int64_t recomputed_layers(int64_t layers) const {
    return method == Method::Uniform ? layers : method == Method::Block ? std::min(num_layers, layers) : 0;
  }
  // The resolved three as Megatron's flags print them: "full, uniform, 1" or "none".
  std::string describe() const {
    if (!on()) return "none";
    return std::string("full, ") + (method == Method::Uniform ? "uniform" : "block") + ", " +
           std::to_string(num_layers);
  }
  // The flags that ask for it: "--recompute-granularity full --recompute-method block --recompute-num-layers 4";
  // uniform 1 as the short "--recompute-granularity full".
  std::string flags() const {
    if (!on()) return "";
    if (*this == full()) return "--recompute-granularity full";
    return "--recompute-granularity full --recompute-method " +
           std::string(method == Method::Uniform ? "uniform" : "block") +
           " --recompute-num-layers " + std::to_string(num_layers);
  }
  friend bool operator==(const RecomputeConfig&, const RecomputeConfig&) = default;
};

}  // namespace pl
