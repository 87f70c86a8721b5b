// checkpoint_stall MODEL_JSON DIR ITERATION FILE: saves a checkpoint of a freshly initialised model
// as iteration ITERATION into DIR through save_checkpoint, with the write hook stopping forever after
// half of FILE's first piece (e.g. "adam_m_fp32.bin", "latest_checkpointed_iteration.txt"), so that
// tests/cli/test_checkpoint_cli.cpp can kill -9 a process in the middle of a save. Test-only: the
// library has no switch for this. Exits 0 if FILE was never written (the test then fails).
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "config/model_config.h"
#include "core/error.h"
#include "model/llama.h"
#include "train/checkpoint.h"
#include "train/optimizer.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: checkpoint_stall MODEL_JSON DIR ITERATION FILE\n");
    return 2;
  }
  try {
    const std::string stall_at = argv[4];
    pl::RunDescription run;
    run.model = pl::load_model_config(argv[1]);
    run.recipe_name = "bf16_mixed";
    run.command_line.assign(argv, argv + argc);
    pl::LlamaModel model(run.model, 1, 16, pl::OpContext{});
    model.init_parameters(1);
    pl::AdamW opt(model, pl::OptimizerConfig{});
    pl::TrainState state;
    state.iteration = std::stoll(argv[3]);
    pl::save_checkpoint(argv[2], 0, model, opt, state, run, [&](const std::string& file) {
      if (file != stall_at) return;
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    });
  } catch (const std::exception& e) {
    std::fprintf(stderr, "checkpoint_stall: %s\n", e.what());
    return 1;
  }
  return 0;
}
