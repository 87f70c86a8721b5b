// Requests, their scores through the model and the task's metrics (harness.h). Followed: lm-evaluation-harness
// v0.4 lm_eval/api/model.py (TemplateLM.loglikelihood, _encode_pair), lm_eval/models/huggingface.py
// (_loglikelihood_tokens: the left cut, is_greedy), lm_eval/api/task.py (ConfigurableTask.process_results for
// multiple_choice: acc, acc_norm), lm_eval/api/samplers.py (ContextSampler.get_context, FirstNSampler),
// lm_eval/api/metrics.py (mean_stderr).
#include "eval/harness.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <random>

#include "core/error.h"
#include "model/llama.h"
#include "parallel/world.h"

namespace pl::eval {

namespace {

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec;
  return std::filesystem::equivalent(a, b, ec);
}

// The few-shot examples of document `d`: lm-eval's labeled examples joined by "\n\n" and followed by it.
std::string fewshot_block(const PreparedTask& t, const TaskFile& shots, bool same, size_t d, std::mt19937_64& rng) {
  const size_t k = static_cast<size_t>(t.num_fewshot);
  std::vector<size_t> chosen;
  if (t.file.format == TaskFormat::Mmlu) {  // first_n of the document's subject
    const std::string& subject = t.file.docs[d].subject;
    for (size_t i = 0; i < shots.docs.size() && chosen.size() < k; ++i)
      if (shots.docs[i].subject == subject && !(same && i == d)) chosen.push_back(i);
    PL_CHECK(chosen.size() == k, "--num-fewshot {}: {} has {} examples of subject '{}'", k, shots.path, chosen.size(),
             subject);
  } else {
    const size_t pool = shots.docs.size() - (same && d < shots.docs.size() ? 1 : 0);
    PL_CHECK(pool >= k, "--num-fewshot {}: {} has {} examples to draw from", k, shots.path, pool);
    while (chosen.size() < k) {
      const size_t i = static_cast<size_t>(rng() % shots.docs.size());
      if ((same && i == d) || std::find(chosen.begin(), chosen.end(), i) != chosen.end()) continue;
      chosen.push_back(i);
    }
  }
  std::string block;
  for (size_t i : chosen) block += shots.docs[i].as_example() + "\n\n";
  return block;
}

void add_request(PreparedTask& t, const data::Tokenizer& tok, const EncodeOptions& enc, int64_t doc, int choice,
                 std::string context, std::string continuation) {
  const EncodedPair p = encode_pair(tok, context, continuation, enc.add_bos);
  const McDoc& d = t.file.docs[static_cast<size_t>(doc)];
  // (lm-eval asserts it too: a context of whitespace only leaves no token to predict the continuation from.)
  PL_CHECK(!p.context.empty(), "{}:{}: the context of choice {} is whitespace only: nothing to condition on",
           t.file.path, d.line, choice);
  PL_CHECK(!p.continuation.empty(), "{}:{}: choice {} (\"{}\") tokenizes to nothing after its context", t.file.path,
           d.line, choice, continuation.substr(0, 40));
  const int64_t n = static_cast<int64_t>(p.continuation.size());
  PL_CHECK(n <= enc.max_length, "{}:{}: choice {} has {} tokens, more than the {} positions a request may have",
           t.file.path, d.line, choice, n, enc.max_length);
  std::vector<int32_t> all = p.context;
  all.insert(all.end(), p.continuation.begin(), p.continuation.end());
  const int64_t cut = std::max<int64_t>(0, static_cast<int64_t>(all.size()) - (enc.max_length + 1));
  if (cut > 0) ++t.truncated;
  Request r{doc, choice, std::move(context), std::move(continuation),
            std::vector<int32_t>(all.begin() + cut, all.end() - 1), n, all.back()};
  t.requests.push_back(std::move(r));
}

}  // namespace

EncodedPair encode_pair(const data::Tokenizer& tok, const std::string& context, const std::string& continuation,
                        bool add_bos) {
  EncodedPair p;
  if (context.empty()) {  // lm-eval's loglikelihood: [prefix_token_id] and the continuation alone
    p.context = {tok.bos()};
    p.continuation = tok.encode(continuation);
    return p;
  }
  std::string ctx = context, cont = continuation;
  const size_t end = python_rstrip(ctx).size();
  if (end < ctx.size()) {
    cont = ctx.substr(end) + cont;
    ctx.resize(end);
  }
  const std::vector<int32_t> whole = tok.encode(ctx + cont);
  p.context = tok.encode(ctx);
  if (p.context.size() < whole.size()) p.continuation.assign(whole.begin() + static_cast<std::ptrdiff_t>(p.context.size()), whole.end());
  if (add_bos) p.context.insert(p.context.begin(), tok.bos());
  return p;
}

PreparedTask prepare_task(const TaskOptions& o, const data::Tokenizer& tok, const EncodeOptions& enc) {
  PL_CHECK(o.num_fewshot >= 0, "--num-fewshot {} must be >= 0", o.num_fewshot);
  PL_CHECK(o.limit >= 0, "--limit {} must be >= 0", o.limit);
  PL_CHECK(enc.max_length >= 1, "internal: max_length {}", enc.max_length);
  PreparedTask t;
  t.file = load_task_file(o.spec);
  t.name = std::filesystem::path(t.file.path).stem().string();
  t.num_fewshot = o.num_fewshot;
  t.fewshot_seed = o.fewshot_seed;
  const int64_t total = static_cast<int64_t>(t.file.docs.size());
  t.effective = o.limit > 0 ? std::min(o.limit, total) : total;
  std::optional<TaskFile> shots;
  if (o.num_fewshot > 0) {
    PL_CHECK(!o.fewshot_spec.empty(), "--num-fewshot {} for {} needs --fewshot-file (the examples' file: a train or "
             "dev split)", o.num_fewshot, t.file.path);
    shots = load_task_file(o.fewshot_spec);
    t.fewshot_path = shots->path;
    PL_CHECK(shots->format == t.file.format, "--fewshot-file {} is {}, but {} is {}", shots->path,
             task_format_name(shots->format), t.file.path, task_format_name(t.file.format));
  }
  const bool same = shots && same_file(shots->path, t.file.path);
  std::mt19937_64 rng(o.fewshot_seed);
  for (int64_t d = 0; d < t.effective; ++d) {
    const McDoc& doc = t.file.docs[static_cast<size_t>(d)];
    const std::string prefix = doc.description + (shots ? fewshot_block(t, *shots, same, static_cast<size_t>(d), rng) : "");
    for (size_t c = 0; c < doc.choices.size(); ++c)
      add_request(t, tok, enc, d, static_cast<int>(c), prefix + doc.context(c), " " + doc.continuations[c]);
  }
  return t;
}

std::vector<PreparedTask> prepare_tasks(std::span<const TaskOptions> options, const data::Tokenizer& tok,
                                        const EncodeOptions& enc) {
  std::vector<PreparedTask> tasks;
  std::map<std::string, int> seen;
  for (const TaskOptions& o : options) {
    tasks.push_back(prepare_task(o, tok, enc));
    const int n = ++seen[tasks.back().name];
    if (n > 1) tasks.back().name += fmt::format("_{}", n);
  }
  return tasks;
}

int64_t most_choices(std::span<const PreparedTask> tasks) {
  int64_t most = 1;
  for (const PreparedTask& t : tasks)
    for (const McDoc& d : t.file.docs) most = std::max(most, static_cast<int64_t>(d.choices.size()));
  return most;
}

int64_t longest_request(std::span<const PreparedTask> tasks) {
  int64_t longest = 1;
  for (const PreparedTask& t : tasks)
    for (const Request& r : t.requests) longest = std::max(longest, static_cast<int64_t>(r.tokens.size()));
  return longest;
}

std::vector<ChoiceScore> score_requests(LlamaModel& model, std::span<const Request> requests,
                                        const parallel::World& world,
                                        const std::function<void(int64_t, int64_t)>& progress, bool want_greedy) {
  const int64_t B = model.micro_batch(), S = model.seq_length();
  std::vector<size_t> mine;
  for (size_t i = 0; i < requests.size(); ++i)
    if (requests[i].doc % world.size() == world.rank()) mine.push_back(i);
  std::vector<double> flat(2 * requests.size(), 0.0);  // (log-likelihood, greedy) per request
  std::vector<int32_t> tokens(static_cast<size_t>(B * S)), labels(tokens.size());
  std::vector<float> losses;
  std::vector<uint8_t> greedy;
  for (size_t first = 0; first < mine.size(); first += static_cast<size_t>(B)) {
    const size_t rows = std::min(mine.size() - first, static_cast<size_t>(B));
    std::fill(tokens.begin(), tokens.end(), 0);
    std::fill(labels.begin(), labels.end(), -1);
    for (size_t r = 0; r < rows; ++r) {
      const Request& q = requests[mine[first + r]];
      const int64_t L = static_cast<int64_t>(q.tokens.size());
      PL_CHECK(L <= S, "internal: a request of {} tokens in a model of {} positions", L, S);
      int32_t* row = tokens.data() + static_cast<int64_t>(r) * S;
      std::copy(q.tokens.begin(), q.tokens.end(), row);
      // Position p predicts token p + 1: the continuation's n tokens are predicted by positions L-n .. L-1, the
      // last of them being the one token not in the input.
      for (int64_t k = 0; k < q.continuation_tokens; ++k) {
        const int64_t p = L - q.continuation_tokens + k;
        labels[static_cast<size_t>(static_cast<int64_t>(r) * S + p)] =
            p + 1 < L ? row[p + 1] : q.last_token;
      }
    }
    model.score(tokens.data(), labels.data(), losses, want_greedy ? &greedy : nullptr);
    for (size_t r = 0; r < rows; ++r) {
      const Request& q = requests[mine[first + r]];
      const int64_t base = static_cast<int64_t>(r) * S + static_cast<int64_t>(q.tokens.size()) - q.continuation_tokens;
      double ll = 0.0;
      bool all_greedy = true;
      for (int64_t k = 0; k < q.continuation_tokens; ++k) {
        ll -= static_cast<double>(losses[static_cast<size_t>(base + k)]);
        all_greedy = want_greedy && all_greedy && greedy[static_cast<size_t>(base + k)] != 0;
      }
      flat[2 * mine[first + r]] = ll;
      flat[2 * mine[first + r] + 1] = all_greedy ? 1.0 : 0.0;
    }
    if (progress) progress(static_cast<int64_t>(first + rows), static_cast<int64_t>(mine.size()));
  }
  world.all_reduce_sum(flat);
  std::vector<ChoiceScore> scores(requests.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = {flat[2 * i], flat[2 * i + 1] != 0.0};
  return scores;
}

double mean_stderr(std::span<const double> v) {
  const size_t n = v.size();
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  double mean = 0.0;
  for (double x : v) mean += x;
  mean /= static_cast<double>(n);
  double ss = 0.0;
  for (double x : v) ss += (x - mean) * (x - mean);
  return std::sqrt(ss / static_cast<double>(n - 1)) / std::sqrt(static_cast<double>(n));
}

TaskResult summarize_task(const PreparedTask& t, std::span<const ChoiceScore> scores) {
  PL_CHECK(scores.size() == t.requests.size(), "internal: {} scores for {} requests", scores.size(), t.requests.size());
  TaskResult res;
  res.name = t.name;
  res.format = t.file.format;
  res.has_acc_norm = reports_acc_norm(t.file.format);
  res.original = static_cast<int64_t>(t.file.docs.size());
  res.effective = t.effective;
  res.num_fewshot = t.num_fewshot;
  std::vector<double> acc, acc_norm;
  size_t i = 0;
  for (int64_t d = 0; d < t.effective; ++d) {
    const McDoc& doc = t.file.docs[static_cast<size_t>(d)];
    int best = 0, best_norm = 0;  // np.argmax: the first largest
    double top = 0.0, top_norm = 0.0;
    for (size_t c = 0; c < doc.choices.size(); ++c, ++i) {
      const double ll = scores[i].loglikelihood;
      const double norm = ll / static_cast<double>(code_points(doc.choices[c]));
      if (c == 0 || ll > top) top = ll, best = static_cast<int>(c);
      if (c == 0 || norm > top_norm) top_norm = norm, best_norm = static_cast<int>(c);
    }
    res.docs.push_back({best == doc.gold ? 1.0 : 0.0, best_norm == doc.gold ? 1.0 : 0.0, best});
    acc.push_back(res.docs.back().acc);
    acc_norm.push_back(res.docs.back().acc_norm);
  }
  const auto mean = [](const std::vector<double>& v) {
    double s = 0.0;
    for (double x : v) s += x;
    return v.empty() ? std::numeric_limits<double>::quiet_NaN() : s / static_cast<double>(v.size());
  };
  res.acc = mean(acc);
  res.acc_stderr = mean_stderr(acc);
  res.acc_norm = mean(acc_norm);
  res.acc_norm_stderr = mean_stderr(acc_norm);
  return res;
}

}  // namespace pl::eval

namespace pl::eval {

std::unique_ptr<LlamaModel> make_eval_model(const ModelConfig& cfg, const PrecisionPlan& plan, const LoraConfig* lora,
                                            int64_t rows, int64_t longest, const OpContext& ctx) {
  PL_CHECK(rows >= 1, "--batch-size {} must be >= 1", rows);
  const LinearPlan& q = plan.quantized();
  const int64_t block = std::max(q.block_multiple, ctx.device == Device::CUDA ? q.gpu_multiple : int64_t{1});
  const int64_t seq = (longest + block - 1) / block * block;
  RunLayout layout;
  layout.lora = lora != nullptr ? *lora : no_adapters();
  return std::make_unique<LlamaModel>(cfg, rows, seq, ctx, plan, layout);
}

// The adapters' BF16 weights from their masters and every quantized copy of the base from its BF16 weights.
void finish_eval_weights(LlamaModel& model) {
  if (model.num_params() > 0)
    model.sync_weights_from_master();
  else
    model.prepare_weights();
}

}  // namespace pl::eval
