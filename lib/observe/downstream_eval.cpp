// --downstream-eval's observer (downstream_eval.h).
#include "observe/downstream_eval.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "model/llama.h"
#include "model/memory_plan.h"
#include "numerics/bf16.h"
#include "parallel/world.h"

namespace pl::observe {

namespace {

// The trainer's BF16 weights (the device's storage: FP32 holding BF16 values on the CPU, BF16 bits on a GPU) into
// the evaluation model's frozen base, a piece at a time through the host.
void copy_weights(const LlamaModel& from, LlamaModel& to) {
  const DType storage = float_storage(from.context().device);
  const int64_t n = from.config().num_parameters(), piece = std::min<int64_t>(n, int64_t{1} << 22);
  std::vector<uint8_t> bytes(static_cast<size_t>(piece) * dtype_size(storage));
  std::vector<float> values(static_cast<size_t>(piece));
  for (int64_t b = 0; b < n; b += piece) {
    const int64_t len = std::min(piece, n - b);
    from.weights_to_host(b, len, bytes.data());
    if (storage == DType::F32) {
      std::memcpy(values.data(), bytes.data(), static_cast<size_t>(len) * 4);
    } else {
      const auto* bits = reinterpret_cast<const uint16_t*>(bytes.data());
      for (int64_t i = 0; i < len; ++i) values[static_cast<size_t>(i)] = num::bf16_bits_to_float(bits[i]);
    }
    to.write_base(b, values.data(), len);
  }
  eval::finish_eval_weights(to);
}

}  // namespace

DownstreamEval::DownstreamEval(DownstreamEvalConfig cfg, const data::Tokenizer& tok, const ModelConfig& mc,
                               log::NoteFn note)
    : cfg_(std::move(cfg)), note_(std::move(note)), mc_(mc) {
  std::vector<eval::TaskOptions> options;
  for (const std::string& spec : cfg_.tasks)
    options.push_back({spec, cfg_.fewshot_file, cfg_.num_fewshot, cfg_.limit, 1234});
  tasks_ = eval::prepare_tasks(options, tok, {false, mc.max_position_embeddings});
  rows_ = cfg_.batch_size > 0 ? cfg_.batch_size : eval::most_choices(tasks_);
  longest_ = eval::longest_request(tasks_);
}

double DownstreamEval::planned_bytes(Device device, int sm) const {
  RunLayout layout;
  layout.lora = no_adapters();
  return plan_memory(mc_, rows_, longest_, device, bf16_plan(mc_), layout, sm).total();
}

DownstreamEval::~DownstreamEval() = default;

std::string DownstreamEval::describe() const {
  std::string s = "downstream eval:";
  for (const eval::PreparedTask& t : tasks_)
    s += fmt::format(" {} ({}, {} of {} documents, {} requests{}{});", t.name, eval::task_format_name(t.file.format),
                     t.effective, t.file.docs.size(), t.requests.size(),
                     t.num_fewshot > 0 ? fmt::format(", {}-shot", t.num_fewshot) : "",
                     t.truncated > 0 ? fmt::format(", {} cut", t.truncated) : "");
  s += cfg_.interval > 0 ? fmt::format(" every {} iterations and at the end", cfg_.interval) : " at the end";
  return s + "; forward bf16 (every linear in BF16) of the trainer's weights";
}

void DownstreamEval::on_start(const RunStart& s, TrainerAccess& trainer) {
  world_ = &s.world;
  const LlamaModel& m = trainer.model();
  model_ = eval::make_eval_model(m.config(), bf16_plan(m.config()), nullptr, rows_, longest_, m.context());
  if (note_)
    note_(fmt::format("{} | its model: {} rows x {} positions, {:.3f} GB", describe(), model_->micro_batch(),
                      model_->seq_length(), model_->memory_plan().total() / 1e9));
}

void DownstreamEval::on_iteration_end(const IterationEnd& e, TrainerAccess& trainer) {
  const int64_t it = e.state.iteration;
  const bool interval = cfg_.interval > 0 && it % cfg_.interval == 0;
  if (!(interval || e.last) || it == last_evaluated_) return;
  evaluate(e.state, e.last, trainer);
  last_evaluated_ = it;
}

void DownstreamEval::evaluate(const TrainState& state, bool last, TrainerAccess& trainer) {
  const auto t0 = std::chrono::steady_clock::now();
  (void)trainer.settled_optimizer();  // the weights complete (an overlapped gather finished)
  copy_weights(trainer.model(), *model_);
  log::DownstreamEvalRecord r{state.iteration, state.consumed_samples, last, "bf16", 0.0, {}};
  for (const eval::PreparedTask& t : tasks_) {
    const std::vector<eval::ChoiceScore> scores = eval::score_requests(*model_, t.requests, *world_, {}, false);
    const eval::TaskResult res = eval::summarize_task(t, scores);
    r.tasks.push_back({t.name, eval::task_format_name(t.file.format), res.effective, res.num_fewshot,
                       res.has_acc_norm, res.acc, res.acc_stderr, res.acc_norm, res.acc_norm_stderr});
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (publish_) publish_(r);
}

}  // namespace pl::observe
