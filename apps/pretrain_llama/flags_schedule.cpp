// pretrain_llama's flags of issue 27: AdamW's and the learning-rate schedule's flags (Megatron's names and meanings).
#include <CLI/CLI.hpp>

#include "pretrain_llama.h"

namespace pl::pretrain {

void add_schedule_flags(CLI::App& app, Options& o) {
  (void)app;
  (void)o;
}

void validate_schedule_flags(const Options& o, const CLI::App& app) {
  (void)o;
  (void)app;
}

}  // namespace pl::pretrain
