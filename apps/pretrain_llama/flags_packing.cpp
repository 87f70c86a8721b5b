// pretrain_llama's flags of issue 27: document-aware packing: Megatron's --eod-mask-loss, --reset-position-ids,
// --reset-attention-mask, and --calculate-per-token-loss. Names and meanings followed: Megatron-LM
// megatron/training/arguments.py (the three data flags), megatron/core/transformer/transformer_config.py
// (calculate_per_token_loss), megatron/core/datasets/gpt_dataset.py _get_ltor_masks_and_position_ids (what the
// data flags do: lib/data/documents.h) and megatron/core/pipeline_parallel/schedules.py (the normalization:
// lib/train/trainer.cpp loss_gradient_scale).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "data/data_pipeline.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

void add_packing_flags(CLI::App& app, Options& o) {
  TrainConfig& t = o.train;
  app.add_flag("--eod-mask-loss", t.eod_mask_loss,
               "Mask loss for the end of document tokens: no loss on a position whose input token is EOD (the "
               "EOD id from mock data, or from the data's .tokenizer.json)");
  app.add_flag("--reset-position-ids", t.reset_position_ids,
               "Reset position ids after end-of-document token: RoPE positions restart at 0 after each EOD");
  app.add_flag("--reset-attention-mask", t.reset_attention_mask,
               "Reset self attention mask after end-of-document token: attention causal within each document "
               "(an EOD ends its document)");
  app.add_flag("--calculate-per-token-loss", t.calculate_per_token_loss,
               "Normalize the loss by the tokens counted over the global batch (all micro-batches and ranks) "
               "instead of per micro-batch; the reported lm loss is Σ loss / Σ counted tokens either way");
}

// (Booleans: nothing to range-check. The one error of these flags, data without an EOD id, is raised once the
// data is read: data::document_packing.)
void validate_packing_flags(const Options& o, const CLI::App& app) {
  (void)o;
  (void)app;
}

// The flags as the model's layout carries them (the EOD id is the data's: main.cpp fills it in); an SFT dataset
// brings its own (explicit documents: data::packing_for_data).
data::DocumentPacking packing_flags(const Options& o) {
  const TrainConfig& t = o.train;
  return data::packing_for_data(data::data_path_is_sft(o.data.data_path),
                                {.eod = -1,
                                 .eod_mask_loss = t.eod_mask_loss,
                                 .reset_position_ids = t.reset_position_ids,
                                 .reset_attention_mask = t.reset_attention_mask});
}

// The start-up line of a run with any of these flags (none: no line, the log stays today's).
std::string packing_line(const data::DocumentPacking& p, const TrainConfig& t) {
  if (!p.any() && !t.calculate_per_token_loss) return "";
  if (p.explicit_documents)
    return fmt::format("documents: the SFT dataset's examples (positions, attention and loss inside each; the loss on "
                       "answer tokens only); loss normalized {}",
                       t.calculate_per_token_loss
                           ? "by the answer tokens counted over the global batch (--calculate-per-token-loss)"
                           : "per micro-batch by its answer tokens (the default, as NeMo 2's masked-token loss; "
                             "--calculate-per-token-loss for the global batch's)");
  std::string flags;
  for (const auto& [on, name] : {std::pair{p.eod_mask_loss, "--eod-mask-loss"},
                                 {p.reset_position_ids, "--reset-position-ids"},
                                 {p.reset_attention_mask, "--reset-attention-mask"}})
    if (on) flags += fmt::format("{}{}", flags.empty() ? "" : " ", name);
  return fmt::format("documents: {}; loss normalized {}", p.any() ? fmt::format("EOD {} ({})", p.eod, flags) : "not split",
                     t.calculate_per_token_loss ? "by the tokens counted over the global batch (--calculate-per-token-loss)"
                                                : "per micro-batch by its counted tokens");
}

}  // namespace pl::pretrain
