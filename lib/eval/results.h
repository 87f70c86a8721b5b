#pragma once
// What `evaluate` writes (issue 43): lm-evaluation-harness 0.4's results JSON (results.<task> with "acc,none",
// "acc_stderr,none", "acc_norm,none", "acc_norm_stderr,none" and its alias; configs, versions, n-shot,
// higher_is_better, n-samples.<task>.{original, effective}, config), its per-document samples (--log-samples: each
// request's context and continuation, each choice's log-likelihood and is_greedy, so a reader can recompute every
// score), and the table it prints (lm_eval/utils.py make_table's columns).
#include <nlohmann/json.hpp>

#include <span>
#include <string>
#include <vector>

#include "eval/harness.h"

namespace pl::eval {

// `config`: the run's settings (model, model_args, batch_size, device, limit, ...), written as "config".
nlohmann::ordered_json results_json(std::span<const PreparedTask> tasks, std::span<const TaskResult> results,
                                    const nlohmann::ordered_json& config);
// One line per scored document of task t (JSON objects in document order).
std::vector<nlohmann::ordered_json> sample_records(const PreparedTask& t, const TaskResult& r,
                                                   std::span<const ChoiceScore> scores);
// The markdown table: | Tasks | Version | Filter | n-shot | Metric | | Value | | Stderr |, one row per metric.
std::vector<std::string> results_table(std::span<const TaskResult> results);
// A number as the JSON writes it: NaN as null (a standard error of fewer than two documents is "N/A", lm-eval's).
nlohmann::ordered_json json_number(double v);

}  // namespace pl::eval
