// pretrain_llama's flags of issue 27: FP8 delayed scaling's overrides of the recipe: Megatron's --fp8-amax-history-len, --fp8-amax-compute-algo, --fp8-margin.
#include <CLI/CLI.hpp>

#include "pretrain_llama.h"

namespace pl::pretrain {

void add_fp8_flags(CLI::App& app, Options& o) {
  (void)app;
  (void)o;
}

void validate_fp8_flags(const Options& o, const CLI::App& app) {
  (void)o;
  (void)app;
}

}  // namespace pl::pretrain
