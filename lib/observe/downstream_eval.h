#pragma once
// --downstream-eval FILE ... (issue 43): multiple-choice benchmarks scored during training as `evaluate` scores them
// (lib/eval: lm-evaluation-harness 0.4's requests and metrics), every --downstream-eval-interval iterations and at
// the run's last iteration, as an observer: the trainer's model is only read (its BF16 weights, after the step's
// overlaps are settled), so training's losses are the same with and without it. The scores come from an evaluation
// model of its own (lib/eval make_eval_model: every linear in BF16, frozen -- the default forward of `evaluate`, what
// lm-eval would score on the --to-hf export), into which the trainer's weights are copied at each evaluation; its
// memory (the BF16 weights again and one batch's activations) is named in its start-up line. Under data parallelism
// each rank scores a shard of the documents and the sums are reduced. The scores go to `publish` (the app hands them
// to the text log, TensorBoard and the JSON-lines log: TrainObserver::on_downstream_eval).
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "core/tensor.h"
#include "data/tokenizer.h"
#include "eval/harness.h"
#include "log/run_records.h"
#include "log/tensorboard.h"
#include "train/observer.h"

namespace pl::observe {

struct DownstreamEvalConfig {
  std::vector<std::string> tasks;  // --downstream-eval FILE[:FORMAT[:LABELS]] (repeatable)
  int64_t interval = 0;            // --downstream-eval-interval (0: at the end only)
  int64_t limit = 0;               // --downstream-eval-limit: the first N documents of each task (0: all)
  int64_t batch_size = 0;          // --downstream-eval-batch-size: requests per forward (0: the most choices)
  int64_t num_fewshot = 0;         // --downstream-eval-num-fewshot
  std::string fewshot_file;        // --downstream-eval-fewshot-file
};

class DownstreamEval : public TrainObserver {
 public:
  using Publish = std::function<void(const log::DownstreamEvalRecord&)>;
  // Reads the tasks and builds their requests now (a bad file is a one-line error before the run starts).
  DownstreamEval(DownstreamEvalConfig cfg, const data::Tokenizer& tok, const ModelConfig& mc, log::NoteFn note);
  // Where the scores go (the app wires it once the outputs exist).
  void set_publish(Publish publish) { publish_ = std::move(publish); }
  // The device memory of its evaluation model (the plan's; a GPU's arena must hold it beside the trainer's).
  double planned_bytes(Device device, int sm) const;
  ~DownstreamEval() override;
  // What the start-up line says: the tasks, their documents and requests, when it runs.
  std::string describe() const;
  void on_start(const RunStart& s, TrainerAccess& trainer) override;  // the evaluation model, on the run's device
  void on_iteration_end(const IterationEnd& e, TrainerAccess& trainer) override;

 private:
  void evaluate(const TrainState& state, bool last, TrainerAccess& trainer);

  DownstreamEvalConfig cfg_;
  std::vector<eval::PreparedTask> tasks_;
  Publish publish_;
  log::NoteFn note_;
  const parallel::World* world_ = nullptr;
  std::unique_ptr<LlamaModel> model_;
  ModelConfig mc_;
  int64_t rows_ = 1, longest_ = 1, last_evaluated_ = -1;
};

}  // namespace pl::observe
