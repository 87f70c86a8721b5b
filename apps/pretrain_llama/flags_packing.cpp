// pretrain_llama's flags of issue 27: document-aware packing: Megatron's --eod-mask-loss, --reset-position-ids, --reset-attention-mask.
#include <CLI/CLI.hpp>

#include "pretrain_llama.h"

namespace pl::pretrain {

void add_packing_flags(CLI::App& app, Options& o) {
  (void)app;
  (void)o;
}

void validate_packing_flags(const Options& o, const CLI::App& app) {
  (void)o;
  (void)app;
}

}  // namespace pl::pretrain
