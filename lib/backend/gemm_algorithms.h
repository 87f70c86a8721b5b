#pragma once
// Which cuBLASLt algorithm each GEMM of a run uses (issue 39), as values the rest of the program can keep,
// send and store without a CUDA header.
//
// cuBLASLt's heuristic ranks the algorithms it thinks fastest for a GEMM; its first is not always the
// fastest on the machine. A run therefore times the heuristic's first few per GEMM once, before the loop
// (pretrain_llama's selection pass: one forward and backward whose results are thrown away), takes the
// fastest, rank 0's choice going to every rank, and a checkpoint stores the list, which a resume installs
// again: the same algorithms, so the same bits (each algorithm is deterministic on its own: every
// cuBLASLt reduction scheme is sequential, cublasLt.h cublasLtReductionScheme_t). Megatron's
// --deterministic-mode skips the timing: the heuristic's first, the choice two fresh runs of the same
// GPU and library agree on. On the CPU there is nothing to choose: the list is empty.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace pl {

// How a GEMM's algorithm is chosen when its plan is made.
enum class GemmAlgorithmPolicy : uint8_t {
  Heuristic,  // cuBLASLt's first (the default outside the selection pass; --deterministic-mode)
  Timed,      // the fastest of the heuristic's first `candidates`, each run on the call's own operands:
              // it writes the call's output several times (and adds into it when the GEMM accumulates),
              // so only a pass whose results are thrown away may use it
};

// One GEMM's choice. `key` names the GEMM (transposes, m n k, leading dimensions, types, scale mode,
// pointer mode, fast accumulation, operand alignments): the same text on every rank and run of the same
// model and flags. `algo` is cuBLASLt's opaque cublasLtMatmulAlgo_t (8 x uint64), kept as it is.
struct GemmAlgorithmChoice {
  std::string key;
  std::array<uint64_t, 8> algo{};
  std::string description;  // "id 31 tile 7 stages 18 split-k 1 reduction 0" (cublasLtMatmulAlgoConfigGetAttribute)
  std::string source;       // "heuristic", "timed", "checkpoint"
  int candidates = 1;       // how many the heuristic returned and were timed (1: not timed)
  int chosen = 0;           // the index of the chosen one among them (0: the heuristic's first)
  double heuristic_ms = 0;  // timed: the heuristic's first's time per call; 0 when not timed
  double chosen_ms = 0;     // timed: the chosen one's
  bool operator==(const GemmAlgorithmChoice& o) const;  // (written out: nvcc compiles this header as C++17)
};

struct GemmAlgorithms {
  std::string device;   // where they were chosen: the GPU's name and cuBLASLt's version ("" on the CPU)
  std::vector<GemmAlgorithmChoice> choices;
  bool empty() const { return choices.empty(); }
  bool operator==(const GemmAlgorithms& o) const { return device == o.device && choices == o.choices; }
};

// The checkpoint's gemm_algorithms.json: {"device": ..., "choices": [{"key", "algo": [8 hex strings],
// "description", "source", "candidates", "chosen", "heuristic_ms", "chosen_ms"}, ...]}.
std::string gemm_algorithms_json(const GemmAlgorithms& g);
// Its reader: every field checked (types, 16 hex digits per algo word, finite non-negative times, a key
// only once); a one-line error naming `what` (the file) and the element.
GemmAlgorithms gemm_algorithms_from_json(const nlohmann::json& j, const std::string& what);
// One line for the banner: how many GEMMs, how many timed, how many took another than the heuristic's first
// and the time of the timed calls with the chosen algorithms against the heuristic's first.
std::string gemm_algorithms_summary(const GemmAlgorithms& g);

}  // namespace pl
