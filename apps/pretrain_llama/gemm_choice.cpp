// cuBLASLt's algorithm per GEMM, chosen once before the loop (issue 39; backend/gemm_algorithms.h says why and
// how). The order: a --load checkpoint's list where it was chosen on this GPU and cuBLASLt (so a resume runs the
// same algorithms, bit for bit); else the heuristic's first under --deterministic-mode (what two fresh runs on one
// GPU and library agree on); else the fastest of the heuristic's first kCandidates per GEMM, timed in one
// discarded step of the model (LlamaModel::run_discarded_step), rank 0's choice installed on every rank.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "backend/device_info.h"
#include "core/error.h"
#include "io/json_text.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

namespace {

constexpr int kCandidates = 4;  // the heuristic's first four per GEMM are timed

// Rank 0's list to every rank (its JSON text over the World), installed where it differs.
GemmAlgorithms agree_with_rank0(const OpContext& ctx, const parallel::World& world, GemmAlgorithms mine) {
  if (world.size() <= 1) return mine;
  std::string text = world.rank() == 0 ? gemm_algorithms_json(mine) : std::string();
  uint64_t n = text.size();
  world.broadcast(&n, sizeof n, 0);
  text.resize(n);
  world.broadcast(text.data(), n, 0);
  const GemmAlgorithms rank0 = gemm_algorithms_from_json(parse_json_text(text, "rank 0's cuBLASLt algorithms"),
                                                         "rank 0's cuBLASLt algorithms");
  const std::vector<std::string> refused = install_gemm_algorithms(ctx, rank0);
  PL_CHECK(refused.empty(), "rank {}: cuBLASLt refuses rank 0's algorithm for {} (the ranks' GPUs or libraries differ)",
           world.rank(), refused.front());
  return rank0;
}

void print_choices(const GemmAlgorithms& g, const Options& o, const Logger& out) {
  out->info("pretrain_llama |   {}", gemm_algorithms_summary(g));
  if (o.train.timing_log_level < 2) return;
  for (const GemmAlgorithmChoice& c : g.choices)
    out->info("pretrain_llama |     {}: {} ({}{})", c.key, c.description, c.source,
              c.source == "timed" ? fmt::format(", {} of {}: {:.3f} ms, the heuristic's first {:.3f} ms", c.chosen + 1,
                                                c.candidates, c.chosen_ms, c.heuristic_ms)
                                  : std::string());
}

}  // namespace

GemmAlgorithms choose_gemm_algorithms(const Options& o, const std::optional<VerifiedCheckpoint>& resume,
                                      LlamaModel& model, const parallel::World& world, const Logger& out) {
  const OpContext& ctx = model.context();
  if (ctx.device != Device::CUDA) return {};
  const std::string here = gemm_algorithm_choices(ctx).device;
  GemmAlgorithms saved = resume ? read_gemm_algorithms(*resume) : GemmAlgorithms{};
  if (!saved.empty() && saved.device == here) {
    for (GemmAlgorithmChoice& c : saved.choices) c.source = "checkpoint";
    const std::vector<std::string> refused = install_gemm_algorithms(ctx, saved);
    PL_CHECK(refused.empty(), "{}: cuBLASLt refuses the checkpoint's algorithm for {} on {}", o.load, refused.front(),
             here);
    print_choices(saved, o, out);
    return saved;
  }
  if (!saved.empty())
    out->info("pretrain_llama |   the checkpoint's cuBLASLt algorithms were chosen on {}; this is {}: chosen again "
              "(the resumed run is not bit for bit the saved run's)",
              saved.device, here);
  if (!o.train.deterministic_mode) {
    set_gemm_algorithm_policy(ctx, GemmAlgorithmPolicy::Timed, kCandidates);
    model.run_discarded_step();
    set_gemm_algorithm_policy(ctx, GemmAlgorithmPolicy::Heuristic, 1);
  } else {
    model.run_discarded_step();  // every GEMM's plan made now, with the heuristic's first
  }
  const GemmAlgorithms chosen = agree_with_rank0(ctx, world, gemm_algorithm_choices(ctx));
  print_choices(chosen, o, out);
  return chosen;
}

}  // namespace pl::pretrain
