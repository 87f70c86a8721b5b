// pretrain_llama's flags of issue 27: TensorBoard event files: Megatron's --tensorboard-dir and its companions.
#include <CLI/CLI.hpp>

#include "pretrain_llama.h"

namespace pl::pretrain {

void add_tensorboard_flags(CLI::App& app, Options& o) {
  (void)app;
  (void)o;
}

void validate_tensorboard_flags(const Options& o, const CLI::App& app) {
  (void)o;
  (void)app;
}

}  // namespace pl::pretrain
