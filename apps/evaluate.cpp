// evaluate: multiple-choice benchmarks scored as lm-evaluation-harness 0.4 scores them (issue 43) -- HellaSwag,
// ARC, PIQA, Winogrande, MMLU and a generic layout (lib/eval/tasks.h) -- from a pretrain_llama checkpoint (--load:
// its FP32 masters; a LoRA checkpoint as its base + adapters) or a Hugging Face Llama directory (--init-from-hf).
// Each candidate's log-likelihood comes from training's own forward and loss (LlamaModel::score); by default every
// linear runs in BF16 (what lm-eval scores on the --to-hf export), with --recipe NAME through that recipe's
// quantized forward. Under MPI each rank scores a shard of the documents and the scores are summed. The table goes
// to stdout, progress to stderr; --output writes lm-eval's results JSON, --log-samples its per-document samples.
//
//   evaluate --load checkpoints/run --task hellaswag_val.jsonl --task arc_easy_test.jsonl --limit 500
//   evaluate --init-from-hf hf/llama --task mmlu_test.jsonl --num-fewshot 5 --fewshot-file mmlu_dev.jsonl
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app_main.h"
#include "config/paths.h"
#include "config/precision_recipe.h"
#include "core/error.h"
#include "eval/harness.h"
#include "eval/results.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "parallel/communicator.h"
#include "parallel/world.h"
#include "weights_source.h"

namespace {

using namespace pl;
namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

struct Options {
  app::WeightsFlags w;
  std::string device = "cpu", recipe, output;
  std::vector<std::string> tasks, fewshot_files;
  int64_t limit = 0, num_fewshot = 0, batch_size = 0, max_length = 0;
  uint64_t fewshot_seed = 1234;
  bool log_samples = false, add_bos = false;
};

std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"evaluate: multiple-choice benchmarks (HellaSwag, ARC, PIQA, Winogrande, MMLU, generic) scored as "
               "lm-evaluation-harness 0.4 does, from a checkpoint or a Hugging Face Llama; the table to stdout"};
  app::add_weights_flags(app, o.w);
  app.add_option("--task", o.tasks, "FILE[:FORMAT[:LABELS]]: a benchmark file (JSON lines, or MMLU's CSV); FORMAT "
                                    "hellaswag|arc|piqa|winogrande|mmlu|generic (default: from its fields); "
                                    "FILE:piqa:LABELS for PIQA's valid.jsonl + valid-labels.lst; repeat for more")
      ->required();
  app.add_option("--num-fewshot", o.num_fewshot, "Examples before each question (lm-eval's num_fewshot)")
      ->capture_default_str();
  app.add_option("--fewshot-file", o.fewshot_files, "The examples' file (a train or dev split, same format): one, or "
                                                    "one per --task in order");
  app.add_option("--fewshot-seed", o.fewshot_seed, "Seed of the few-shot draws (lm-eval's fewshot_seed)")
      ->capture_default_str();
  app.add_option("--limit", o.limit, "Score the first N documents of each task (0: all)")->capture_default_str();
  app.add_option("--batch-size", o.batch_size, "Requests (candidates) per forward (default: the most choices of a "
                                               "document)");
  app.add_option("--max-length", o.max_length, "The longest request in tokens; longer ones lose their left (default: "
                                               "the model's max_position_embeddings)");
  app.add_flag("--add-bos-token", o.add_bos, "Put <|begin_of_text|> before every context (lm-eval's add_bos_token)");
  app.add_option("--recipe", o.recipe, "Score through this precision recipe's quantized forward (a name in "
                                       "configs/recipes/ or a JSON file; default: every linear in BF16)");
  app.add_option("--device", o.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_option("--output", o.output, "Write lm-eval's results JSON here");
  app.add_flag("--log-samples", o.log_samples, "With --output: samples_<task>.jsonl beside it, one record per "
                                               "document (every choice's log-likelihood and is_greedy)");
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "evaluate")) return rc;
  PL_CHECK(o.num_fewshot >= 0, "--num-fewshot {} must be >= 0", o.num_fewshot);
  PL_CHECK(o.limit >= 0, "--limit {} must be >= 0 (0: all)", o.limit);
  PL_CHECK(o.batch_size >= 0, "--batch-size {} must be >= 1 (0: the most choices of a document)", o.batch_size);
  PL_CHECK(o.max_length >= 0, "--max-length {} must be >= 1 (0: the model's max_position_embeddings)", o.max_length);
  PL_CHECK(o.fewshot_files.empty() || o.fewshot_files.size() == 1 || o.fewshot_files.size() == o.tasks.size(),
           "--fewshot-file given {} times for {} --task: give one, or one per task", o.fewshot_files.size(),
           o.tasks.size());
  PL_CHECK(o.fewshot_files.empty() || o.num_fewshot > 0, "--fewshot-file needs --num-fewshot K > 0");
  PL_CHECK(!o.log_samples || !o.output.empty(), "--log-samples needs --output (the samples go beside it)");
  return std::nullopt;
}

std::string samples_path(const Options& o, const std::string& task) {
  return (fs::path(o.output).parent_path() / fmt::format("samples_{}.jsonl", task)).string();
}

// Every output before anything runs: apart from the inputs, and replacing only this program's own earlier output.
void check_outputs(const Options& o, const std::vector<eval::PreparedTask>& tasks) {
  if (o.output.empty()) return;
  std::vector<FlagPath> inputs = {{"--load", o.w.load}, {"--init-from-hf", o.w.init_from_hf}};
  for (const std::string& t : o.tasks) inputs.push_back({"--task", t});
  std::vector<FlagPath> outputs = {{"--output", o.output}};
  for (const eval::PreparedTask& t : tasks) {
    inputs.push_back({"--task", t.file.path});
    if (o.log_samples) outputs.push_back({"--log-samples", samples_path(o, t.name)});
  }
  check_outputs_apart_from_inputs(inputs, outputs);
  check_replaceable_output("--output", o.output, "a results file", [](const std::string& p) {
    return json_file_lacks(p, {"results", "n-samples", "config"});
  });
  for (size_t i = 1; i < outputs.size(); ++i)
    check_replaceable_output("--log-samples", outputs[i].path, "a samples file", [](const std::string& p) {
      return json_lines_file_lacks(p, {"doc_id", "arguments", "resps"});
    });
}

std::vector<eval::PreparedTask> prepare_tasks(const Options& o, const data::Tokenizer& tok, int64_t max_length) {
  std::vector<eval::TaskOptions> options;
  for (size_t i = 0; i < o.tasks.size(); ++i)
    options.push_back({o.tasks[i], o.fewshot_files.empty() ? "" : o.fewshot_files[o.fewshot_files.size() == 1 ? 0 : i],
                       o.num_fewshot, o.limit, o.fewshot_seed});
  return eval::prepare_tasks(options, tok, {o.add_bos, max_length});
}

// The weights into the evaluation model: a checkpoint's masters, a Hugging Face directory, or a LoRA checkpoint's
// base (streamed from where its record says) with its adapters.
void load_weights(const app::WeightsSource& src, LlamaModel& model) {
  const auto write_base = [&](int64_t off, const float* v, int64_t n) { model.write_base(off, v, n); };
  if (src.ckpt && src.ckpt->lora) {
    stream_lora_base(*src.ckpt, src.hf_dir, write_base);
    const std::vector<float> adapters = read_master_weights(*src.ckpt);
    model.write_master(0, adapters.data(), static_cast<int64_t>(adapters.size()));
  } else if (src.ckpt) {
    stream_master_weights(*src.ckpt, write_base);
  } else {
    read_hf_weights(src.hf_dir, model.config(), write_base);
  }
  eval::finish_eval_weights(model);
}

Json run_config(const Options& o, const app::WeightsSource& src, const LlamaModel& m, const std::string& forward,
                const std::string& tok) {
  return Json{{"model", "pretrain_llama"},
              {"model_args", src.describe()},
              {"model_name", m.config().name},
              {"forward", forward},
              {"tokenizer", tok},
              {"add_bos_token", o.add_bos},
              {"batch_size", m.micro_batch()},
              {"max_length", m.seq_length()},
              {"device", o.device},
              {"limit", o.limit > 0 ? Json(o.limit) : Json()},
              {"num_fewshot", o.num_fewshot},
              {"fewshot_seed", o.fewshot_seed}};
}

void write_outputs(const Options& o, const std::vector<eval::PreparedTask>& tasks,
                   const std::vector<eval::TaskResult>& results,
                   const std::vector<std::vector<eval::ChoiceScore>>& scores, const Json& config) {
  if (o.output.empty()) return;
  write_file_atomically(o.output, eval::results_json(tasks, results, config).dump(2) + "\n");
  fmt::print(stderr, "evaluate | wrote {}\n", o.output);
  if (!o.log_samples) return;
  for (size_t i = 0; i < tasks.size(); ++i) {
    std::string text;
    for (const Json& r : eval::sample_records(tasks[i], results[i], scores[i])) text += r.dump() + "\n";
    write_file_atomically(samples_path(o, tasks[i].name), text);
    fmt::print(stderr, "evaluate | wrote {} ({} documents)\n", samples_path(o, tasks[i].name), tasks[i].effective);
  }
}

int run(const parallel::World& world, int argc, char** argv) {
  Options o;
  if (const std::optional<int> rc = parse(argc, argv, o)) return *rc;
  const auto t0 = std::chrono::steady_clock::now();
  const app::WeightsSource src = app::open_weights(o.w);
  const ModelConfig& cfg = src.cfg;
  std::string tok_source;
  const std::unique_ptr<data::Tokenizer> tok = app::find_tokenizer(o.w, src, tok_source);
  PL_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer ({}) has {} ids but model {} only {}",
           tok->description(), tok->vocab_size(), cfg.name, cfg.vocab_size);
  const int64_t max_length = o.max_length > 0 ? o.max_length : cfg.max_position_embeddings;
  PL_CHECK(max_length <= cfg.max_position_embeddings, "--max-length {} is beyond model {}'s {} positions", max_length,
           cfg.name, cfg.max_position_embeddings);
  std::vector<eval::PreparedTask> tasks = prepare_tasks(o, *tok, max_length);
  check_outputs(o, tasks);
  const PrecisionPlan plan = o.recipe.empty() ? bf16_plan(cfg)
                                              : make_precision_plan(cfg, load_precision_recipe(resolve_config(
                                                                             "recipes", o.recipe, argv[0])));
  const std::string forward = o.recipe.empty() ? "bf16 (every linear in BF16)" : "recipe " + plan.recipe_name;
  DeviceStateHandle state;
  if (o.device == "cuda") parallel::select_local_device(world);  // under MPI: this rank's GPU of the node
  const OpContext ctx = app::open_device(o.device, state);
  std::unique_ptr<LlamaModel> model =
      eval::make_eval_model(cfg, plan, src.ckpt && src.ckpt->lora ? &*src.ckpt->lora : nullptr,
                            o.batch_size > 0 ? o.batch_size : eval::most_choices(tasks), eval::longest_request(tasks), ctx);
  load_weights(src, *model);
  const bool speaks = world.rank() == 0;
  if (speaks)
    fmt::print(stderr, "evaluate | model {} ({} parameters) from {} on {}{}, loaded in {:.1f} s | tokenizer {} (from "
               "{}) | forward {} | {} rows x {} positions per forward\n",
               cfg.name, cfg.num_parameters(), src.describe(), o.device,
               world.size() > 1 ? fmt::format(" x {} ranks", world.size()) : "",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), tok->description(),
               tok_source, forward, model->micro_batch(), model->seq_length());
  std::vector<eval::TaskResult> results;
  std::vector<std::vector<eval::ChoiceScore>> scores;
  for (const eval::PreparedTask& t : tasks) {
    const auto t1 = std::chrono::steady_clock::now();
    auto last = t1;
    scores.push_back(eval::score_requests(*model, t.requests, world, [&](int64_t done, int64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (!speaks || (done < total && now - last < std::chrono::seconds(10))) return;
      last = now;
      fmt::print(stderr, "evaluate | {}: {} of {} requests on this rank ({:.1f} s)\n", t.name, done, total,
                 std::chrono::duration<double>(now - t1).count());
    }));
    results.push_back(eval::summarize_task(t, scores.back()));
    if (speaks)
      fmt::print(stderr, "evaluate | {} ({}{}, {} of {} documents, {}-shot, {} requests{}): {:.1f} s\n", t.name,
                 eval::task_format_name(t.file.format), t.file.format_detected ? ", from its fields" : "", t.effective,
                 t.file.docs.size(), t.num_fewshot, t.requests.size(),
                 t.truncated > 0 ? fmt::format(", {} cut to --max-length", t.truncated) : "",
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
  }
  if (!speaks) return 0;
  fmt::print("evaluate: {} | forward {} | tokenizer {}\n", src.describe(), forward, tok->description());
  for (const std::string& line : eval::results_table(results)) fmt::print("{}\n", line);
  write_outputs(o, tasks, results, scores, run_config(o, src, *model, forward, tok->description()));
  return 0;
}

// Under MPI an error on one rank ends every rank, so none waits in the scores' reduction (app_main.h).
int run_rank(int argc, char** argv) {
  const parallel::World world(argc, argv);
  return app::on_every_rank("evaluate", world, [&] { return run(world, argc, argv); });
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("evaluate", run_rank, argc, argv); }
