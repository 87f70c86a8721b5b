// pretrain_llama's flags of issue 28 (supervised fine-tuning): Megatron's --finetune and --packing-algorithm (NeMo's
// PackedSequenceSpecs.packing_algorithm). An SFT dataset itself needs no flag: --data-path PREFIX names it
// (data/sft_dataset.h). Followed: Megatron-LM megatron/training/arguments.py ("--finetune: Load model for
// finetuning. Do not load optimizer or rng state from checkpoint and set iteration to 0. Assumed when loading
// a release checkpoint."), megatron/training/checkpointing.py load_checkpoint (what it skips).
#include <CLI/CLI.hpp>

#include "core/error.h"
#include "data/sft_dataset.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

void add_sft_flags(CLI::App& app, Options& o) {
  app.add_flag("--finetune", o.finetune,
               "Load model for finetuning: --load's weights only (no optimizer state, no step count), iteration and "
               "consumed samples from 0; with --init-from-hf the weights come from Hugging Face (always weights "
               "only). --dry-run needs neither");
  app.add_option("--packing-algorithm", o.data.packing_algorithm,
                 "SFT data: how examples are packed into sequences, NeMo's first_fit_shuffle or first_fit_decreasing")
      ->capture_default_str();
}

void validate_sft_flags(const Options& o, const CLI::App& app) {
  (void)data::parse_packing_algorithm(o.data.packing_algorithm);  // a name it does not know: one line
  PL_CHECK(!o.finetune || o.dry_run || !o.load.empty() || !o.init_from_hf.empty(),
           "--finetune needs the weights to start from: --load DIR (a checkpoint) or --init-from-hf DIR");
  PL_CHECK(!(o.finetune && !o.load.empty() && !o.init_from_hf.empty()),
           "--finetune takes its weights from --load or from --init-from-hf, not both");
  PL_CHECK(!(app.count("--packing-algorithm") && o.data.data_path.empty()),
           "--packing-algorithm applies to an SFT dataset (--data-path PREFIX with PREFIX.sft.json)");
}

}  // namespace pl::pretrain
