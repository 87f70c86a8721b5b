// pretrain_llama's flags of issue 43: multiple-choice benchmarks scored during training (observe/downstream_eval.h).
// Megatron has no such flags; the names follow its --eval-* family, the meanings lm-eval's (--limit, num_fewshot).
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "core/error.h"
#include "data/tokenizer_record.h"
#include "pretrain_llama.h"

namespace pl::pretrain {

void add_downstream_flags(CLI::App& app, Options& o) {
  observe::DownstreamEvalConfig& d = o.outputs.downstream;
  app.add_option("--downstream-eval", d.tasks,
                 "Score this multiple-choice benchmark during training as `evaluate` does (FILE[:FORMAT[:LABELS]]: "
                 "hellaswag, arc, piqa, winogrande, mmlu or generic; repeat for more): one line per task, TensorBoard "
                 "scalars and JSON-lines \"eval\" records");
  app.add_option("--downstream-eval-interval", d.interval,
                 "Score every N iterations, and at the last (default: --eval-interval's value)");
  app.add_option("--downstream-eval-limit", d.limit, "Score the first N documents of each task (0: all)")
      ->capture_default_str();
  app.add_option("--downstream-eval-batch-size", d.batch_size,
                 "Requests per forward of the evaluation model (default: the most choices of a document)");
  app.add_option("--downstream-eval-num-fewshot", d.num_fewshot, "Examples before each question")
      ->capture_default_str();
  app.add_option("--downstream-eval-fewshot-file", d.fewshot_file, "The examples' file (same format as the tasks)");
}

void validate_downstream_flags(const Options& o, const CLI::App& app) {
  const observe::DownstreamEvalConfig& d = o.outputs.downstream;
  if (d.tasks.empty()) {
    for (const char* flag : {"--downstream-eval-interval", "--downstream-eval-limit", "--downstream-eval-batch-size",
                             "--downstream-eval-num-fewshot", "--downstream-eval-fewshot-file"})
      PL_CHECK(app.count(flag) == 0, "{} needs --downstream-eval FILE (the benchmark to score)", flag);
    return;
  }
  PL_CHECK(o.peft == "none", "--downstream-eval with --peft {}: not supported during LoRA training (score the saved "
           "checkpoint with `evaluate --load`, which reads base + adapters)", o.peft);
  PL_CHECK(d.interval >= 0, "--downstream-eval-interval must be >= 1 (0: --eval-interval's), got {}", d.interval);
  PL_CHECK(d.limit >= 0, "--downstream-eval-limit must be >= 0 (0: all), got {}", d.limit);
  PL_CHECK(d.batch_size >= 0, "--downstream-eval-batch-size must be >= 1 (0: the most choices), got {}", d.batch_size);
  PL_CHECK(d.num_fewshot >= 0, "--downstream-eval-num-fewshot must be >= 0, got {}", d.num_fewshot);
  PL_CHECK(d.num_fewshot == 0 || !d.fewshot_file.empty(),
           "--downstream-eval-num-fewshot {} needs --downstream-eval-fewshot-file FILE", d.num_fewshot);
  PL_CHECK(o.data.data_path.size() >= 1,
           "--downstream-eval needs the tokenizer of the training data: mock data has none (give --data-path of a "
           "preprocess_data dataset)");
}

std::unique_ptr<observe::DownstreamEval> make_downstream_eval(const Options& o, const ModelConfig& mc,
                                                              log::NoteFn note) {
  observe::DownstreamEvalConfig d = o.outputs.downstream;
  if (d.tasks.empty()) return nullptr;
  if (d.interval == 0) d.interval = o.train.eval_interval;
  // The data's tokenizer: the record preprocess_data wrote beside the first prefix (a blend's prefixes share one:
  // the data pipeline checks them).
  const std::string prefix = data::parse_data_path(o.data.data_path).prefixes.front();
  const std::optional<data::TokenizerRecord> rec = data::read_tokenizer_record(prefix);
  PL_CHECK(rec.has_value(), "--downstream-eval needs the tokenizer of the training data: {} has no {}", prefix,
           data::tokenizer_record_path(prefix));
  const std::unique_ptr<data::Tokenizer> tok = data::make_tokenizer(rec->type, rec->model_path);
  return std::make_unique<observe::DownstreamEval>(std::move(d), *tok, mc, std::move(note));
}

}  // namespace pl::pretrain
