#pragma once
// Multiple-choice scoring as lm-evaluation-harness 0.4 does it (issue 43): each document's candidates are requests
// (context, " " + choice); each request's log-likelihood is the sum over its continuation tokens of log p(token |
// everything before it), from the model's own loss path (LlamaModel::score: training's forward and cross-entropy);
// acc = argmax of the sums, acc_norm = argmax of sum / len(choice) in code points (lm_eval/api/task.py
// process_results), stderr the sample standard deviation / sqrt(n) (lm_eval/api/metrics.py mean_stderr).
// Tokenization is lm-eval's _encode_pair (lm_eval/api/model.py TemplateLM): the context's trailing whitespace moves
// to the continuation, the continuation's tokens are encode(context + continuation) after encode(context)'s length;
// an empty context is the BOS token alone (prefix_token_id); a sequence longer than max_length + 1 tokens loses its
// first tokens (HFLM._loglikelihood_tokens).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "eval/tasks.h"

namespace pl {
class LlamaModel;
namespace parallel {
class World;
}
}  // namespace pl

namespace pl::eval {

// One --task (or --downstream-eval) and how it is run.
struct TaskOptions {
  std::string spec;          // FILE[:FORMAT[:LABELS]]
  std::string fewshot_spec;  // the few-shot examples' file (same formats); needed when num_fewshot > 0
  int64_t num_fewshot = 0;
  int64_t limit = 0;               // score the first `limit` documents (0: all), as lm-eval's --limit
  uint64_t fewshot_seed = 1234;    // lm-eval's fewshot_seed (its default)
};

struct EncodeOptions {
  bool add_bos = false;     // lm-eval's add_bos_token model argument (default off): BOS before every context
  int64_t max_length = 0;   // the longest input (tokens) a request may have; its left is cut beyond it
};

// The token ids of one request, lm-eval's _encode_pair (above). `context` may be empty.
struct EncodedPair {
  std::vector<int32_t> context, continuation;
};
EncodedPair encode_pair(const data::Tokenizer& tok, const std::string& context, const std::string& continuation,
                        bool add_bos);

struct Request {
  int64_t doc = 0;
  int choice = 0;
  std::string context, continuation;  // the strings (continuation with its delimiter)
  std::vector<int32_t> tokens;        // the model's input: (context + continuation) ids without the last, left-cut
  int64_t continuation_tokens = 0;    // the last positions of `tokens` that predict the continuation
  int32_t last_token = 0;             // the continuation's last token (predicted by the last position)
};

struct PreparedTask {
  std::string name;  // the task's key in the results: the file's stem (made unique by the caller)
  TaskFile file;
  int64_t num_fewshot = 0;
  uint64_t fewshot_seed = 1234;
  std::string fewshot_path;
  int64_t effective = 0;  // documents scored: the first `effective` of file.docs
  std::vector<Request> requests;  // document by document, choice by choice
  int64_t truncated = 0;          // requests whose left was cut to max_length
};

// Loads the task and its few-shot file and builds every request: MMLU's few-shot examples are the first k of the
// file of the document's subject (lm-eval's first_n sampler on dev), the others k drawn without replacement by a
// std::mt19937_64 seeded with fewshot_seed, document after document (not lm-eval's draws sample for sample: its
// sampler is Python's random.Random); a document is never its own example when the two files are one.
PreparedTask prepare_task(const TaskOptions& o, const data::Tokenizer& tok, const EncodeOptions& enc);

// Every task of `options` prepared, each named by its file's stem with "_2", "_3", ... where two files share one
// (two files stay two tasks).
std::vector<PreparedTask> prepare_tasks(std::span<const TaskOptions> options, const data::Tokenizer& tok,
                                        const EncodeOptions& enc);

// The longest model input of the tasks' requests (the evaluation model's sequence length), and the most choices of
// one of their documents (the default rows per forward: one document's candidates together).
int64_t longest_request(std::span<const PreparedTask> tasks);
int64_t most_choices(std::span<const PreparedTask> tasks);

struct ChoiceScore {
  double loglikelihood = 0.0;
  bool greedy = false;  // every continuation token is the argmax of its logits (lm-eval's is_greedy)
};

// The requests' scores through `model` (a micro-batch of B rows of S positions: S >= longest_request; B any), one
// request per row, padded at the end: under data parallelism rank r scores the documents d with d % size == r and
// the scores are summed over the ranks (World::all_reduce_sum), so every rank returns them all. `progress` (may be
// empty) is called after each forward with the requests done so far on this rank. Without `greedy` no logits are
// read back and every ChoiceScore::greedy is false (the training-time evaluation reports acc and acc_norm only).
std::vector<ChoiceScore> score_requests(LlamaModel& model, std::span<const Request> requests,
                                        const parallel::World& world,
                                        const std::function<void(int64_t done, int64_t total)>& progress = {},
                                        bool greedy = true);

struct DocResult {
  double acc = 0.0, acc_norm = 0.0;
  int predicted = 0;  // argmax of the log-likelihoods
};
struct TaskResult {
  std::string name;
  TaskFormat format = TaskFormat::Generic;
  bool has_acc_norm = false;
  int64_t original = 0, effective = 0, num_fewshot = 0;
  double acc = 0.0, acc_stderr = 0.0, acc_norm = 0.0, acc_norm_stderr = 0.0;  // stderr NaN below 2 documents
  std::vector<DocResult> docs;
};
// acc, acc_norm and their standard errors from the scores of the task's requests (in its request order).
TaskResult summarize_task(const PreparedTask& t, std::span<const ChoiceScore> scores);

// lm-eval's mean_stderr: sqrt(sum (x - mean)^2 / (n - 1)) / sqrt(n); NaN for n < 2.
double mean_stderr(std::span<const double> values);

}  // namespace pl::eval

namespace pl {
struct PrecisionPlan;
struct OpContext;
struct LoraConfig;
struct ModelConfig;
}  // namespace pl

namespace pl::eval {

// The evaluation model: `rows` requests of up to `longest` tokens per forward (the length rounded up to the plan's
// token block when a linear is quantized: --recipe), every linear in `plan`'s formats, frozen -- no adapters, or
// `lora`'s (a LoRA checkpoint scored as base + adapters): no gradients, master weights of the base or moments.
// Its weights are written by the caller (LlamaModel::write_base; a LoRA checkpoint's adapters: write_master), then
// made ready by finish_eval_weights.
std::unique_ptr<LlamaModel> make_eval_model(const ModelConfig& cfg, const PrecisionPlan& plan,
                                            const LoraConfig* lora, int64_t rows, int64_t longest,
                                            const OpContext& ctx);
void finish_eval_weights(LlamaModel& model);

}  // namespace pl::eval
