// lm-eval 0.4's outputs (results.h). Followed: lm_eval/evaluator.py (simple_evaluate's results dictionary),
// lm_eval/evaluator_utils.py and lm_eval/utils.py (make_table), lm_eval/loggers/evaluation_tracker.py (samples).
#include "eval/results.h"

#include <fmt/format.h>

#include <cmath>

namespace pl::eval {

using Json = nlohmann::ordered_json;

Json json_number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

namespace {

// lm-eval writes "N/A" for the standard error of fewer than two documents (evaluator_utils.py).
Json stderr_value(double v) { return std::isfinite(v) ? Json(v) : Json("N/A"); }

// The task's configuration as lm-eval's "configs" entry names it (the parts that decide the requests).
Json task_config(const PreparedTask& t) {
  Json metrics = Json::array({Json{{"metric", "acc"}, {"aggregation", "mean"}, {"higher_is_better", true}}});
  if (reports_acc_norm(t.file.format))
    metrics.push_back(Json{{"metric", "acc_norm"}, {"aggregation", "mean"}, {"higher_is_better", true}});
  return Json{{"task", t.name},
              {"dataset_path", t.file.path},
              {"format", task_format_name(t.file.format)},
              {"format_detected", t.file.format_detected},
              {"output_type", "multiple_choice"},
              {"target_delimiter", " "},
              {"fewshot_delimiter", "\n\n"},
              {"num_fewshot", t.num_fewshot},
              {"fewshot_file", t.fewshot_path.empty() ? Json() : Json(t.fewshot_path)},
              {"fewshot_sampler", t.num_fewshot == 0 ? Json()
                                  : t.file.format == TaskFormat::Mmlu
                                      ? Json("first_n (same subject)")
                                      : Json(fmt::format("mt19937_64 seed {}", t.fewshot_seed))},
              {"metric_list", metrics},
              {"truncated_requests", t.truncated}};
}

}  // namespace

Json results_json(std::span<const PreparedTask> tasks, std::span<const TaskResult> results, const Json& config) {
  Json res = Json::object(), configs = Json::object(), versions = Json::object(), nshot = Json::object(),
       higher = Json::object(), nsamples = Json::object();
  for (size_t i = 0; i < results.size(); ++i) {
    const TaskResult& r = results[i];
    Json m{{"alias", r.name}, {"acc,none", json_number(r.acc)}, {"acc_stderr,none", stderr_value(r.acc_stderr)}};
    Json hib{{"acc", true}};
    if (r.has_acc_norm) {
      m["acc_norm,none"] = json_number(r.acc_norm);
      m["acc_norm_stderr,none"] = stderr_value(r.acc_norm_stderr);
      hib["acc_norm"] = true;
    }
    res[r.name] = m;
    configs[r.name] = task_config(tasks[i]);
    versions[r.name] = 1.0;
    nshot[r.name] = r.num_fewshot;
    higher[r.name] = hib;
    nsamples[r.name] = Json{{"original", r.original}, {"effective", r.effective}};
  }
  return Json{{"results", res},   {"configs", configs},        {"versions", versions}, {"n-shot", nshot},
              {"higher_is_better", higher}, {"n-samples", nsamples}, {"config", config}};
}

std::vector<Json> sample_records(const PreparedTask& t, const TaskResult& r, std::span<const ChoiceScore> scores) {
  std::vector<Json> out;
  size_t i = 0;
  for (int64_t d = 0; d < t.effective; ++d) {
    const McDoc& doc = t.file.docs[static_cast<size_t>(d)];
    Json args = Json::array(), resps = Json::array(), filtered = Json::array(), lengths = Json::array();
    for (size_t c = 0; c < doc.choices.size(); ++c, ++i) {
      const Request& q = t.requests[i];
      args.push_back(Json::array({q.context, q.continuation}));
      const Json pair = Json::array({json_number(scores[i].loglikelihood), scores[i].greedy});
      resps.push_back(Json::array({pair}));
      filtered.push_back(pair);
      lengths.push_back(code_points(doc.choices[c]));
    }
    Json rec{{"doc_id", d},
             {"source_line", doc.line},
             {"target", doc.gold},
             {"choices", doc.choices},
             {"choice_lengths", lengths},
             {"arguments", args},
             {"resps", resps},
             {"filtered_resps", filtered},
             {"acc", r.docs[static_cast<size_t>(d)].acc}};
    if (r.has_acc_norm) rec["acc_norm"] = r.docs[static_cast<size_t>(d)].acc_norm;
    out.push_back(std::move(rec));
  }
  return out;
}

std::vector<std::string> results_table(std::span<const TaskResult> results) {
  const auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.4f}", v) : std::string("N/A"); };
  size_t w = 5;
  for (const TaskResult& r : results) w = std::max(w, r.name.size());
  std::vector<std::string> lines = {
      fmt::format("|{:<{}}|Version|Filter|n-shot| Metric |   |Value |   |Stderr|", "Tasks", w),
      fmt::format("|{:-<{}}|------:|------|-----:|--------|---|-----:|---|-----:|", "", w)};
  for (const TaskResult& r : results) {
    lines.push_back(fmt::format("|{:<{}}|{:>7}|none  |{:>6}|acc     |↑  |{:>6}|±  |{:>6}|", r.name, w, 1, r.num_fewshot,
                                num(r.acc), num(r.acc_stderr)));
    if (r.has_acc_norm)
      lines.push_back(fmt::format("|{:<{}}|{:>7}|none  |{:>6}|acc_norm|↑  |{:>6}|±  |{:>6}|", "", w, "", r.num_fewshot,
                                  num(r.acc_norm), num(r.acc_norm_stderr)));
  }
  return lines;
}

}  // namespace pl::eval
