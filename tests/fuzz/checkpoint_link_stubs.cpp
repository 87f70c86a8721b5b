// verify_checkpoint (what the checkpoint targets fuzz) builds no model, but restore_checkpoint and the state
// buffers (lib/train/checkpoint.cpp, checkpoint_state.cpp) call these LlamaModel members, whose definitions
// (model/llama.cpp) would bring the whole model and backend into the fuzz build. Stand-ins that abort
// if ever reached (they cannot be: the targets call verify_checkpoint only).
#include <cstdio>
#include <cstdlib>

#include "model/llama.h"

namespace pl {
void LlamaModel::gather_weights() {
  std::fputs("pl_fuzz: LlamaModel::gather_weights reached (stub)\n", stderr);
  std::abort();
}
void LlamaModel::prepare_weights() {
  std::fputs("pl_fuzz: LlamaModel::prepare_weights reached (stub)\n", stderr);
  std::abort();
}
void LlamaModel::sync_weights_from_master() {
  std::fputs("pl_fuzz: LlamaModel::sync_weights_from_master reached (stub)\n", stderr);
  std::abort();
}
void LlamaModel::weights_to_host(int64_t, int64_t, void*) const {
  std::fputs("pl_fuzz: LlamaModel::weights_to_host reached (stub)\n", stderr);
  std::abort();
}
}  // namespace pl
