#include "log/megatron_log.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <ctime>

namespace pl::log {

std::string iteration_line(const IntervalRecord& r, const std::string& timestamp) {
  std::string s = fmt::format(" [{}]", timestamp);
  s += fmt::format(" iteration {:8d}/{:8d} |", r.iteration, r.train_iters);
  s += fmt::format(" consumed samples: {:12d} |", r.consumed_samples);
  s += fmt::format(" elapsed time per iteration (ms): {:.1f} |", r.seconds_per_iteration * 1000.0);
  s += fmt::format(" learning rate: {:.6E} |", r.learning_rate);
  s += fmt::format(" global batch size: {:5d} |", r.global_batch_size);
  if (r.lm_loss) s += fmt::format(" lm loss: {:.6E} |", *r.lm_loss);
  s += fmt::format(" loss scale: {:.1f} |", r.loss_scale);
  s += fmt::format(" grad norm: {:.3f} |", r.grad_norm);
  if (r.params_norm) s += fmt::format(" params norm: {:.3f} |", *r.params_norm);  // (Megatron: after num zeros)
  s += fmt::format(" number of skipped iterations: {:3d} |", r.skipped_iterations);
  s += fmt::format(" number of nan iterations: {:3d} |", r.nan_iterations);
  return s;
}

std::string step_time_line(double seconds_per_iteration, double tflops_per_gpu) {
  return fmt::format("Step Time : {:.2f}s GPU utilization: {:.1f}MODEL_TFLOP/s/GPU", seconds_per_iteration,
                     tflops_per_gpu);
}

std::string saving_checkpoint_line(int64_t iteration, const std::string& dir) {
  return fmt::format("saving checkpoint at iteration {:7d} to {} in pl_flat format", iteration, dir);
}

std::string saved_checkpoint_line(int64_t iteration, const std::string& dir, const std::string& path, double bytes,
                                  double seconds) {
  return fmt::format("  successfully saved checkpoint from iteration {:7d} to {} ({}: {:.3f} GB in {:.2f} s, {:.2f} GB/s)",
                     iteration, dir, path, bytes / 1e9, seconds, bytes / 1e9 / std::max(seconds, 1e-9));
}

std::string loading_checkpoint_line(const std::string& dir, int64_t iteration) {
  return fmt::format(" loading checkpoint from {} at iteration {}", dir, iteration);
}

std::string loaded_checkpoint_line(const std::string& dir, int64_t iteration, const std::string& path, double bytes,
                                   double seconds) {
  return fmt::format("  successfully loaded checkpoint from {} [ t 1/1, p 1/1 ] at iteration {} ({}: {:.3f} GB verified "
                     "and read in {:.2f} s, {:.2f} GB/s)",
                     dir, iteration, path, bytes / 1e9, seconds, bytes / 1e9 / std::max(seconds, 1e-9));
}

std::array<std::string, 2> no_checkpoint_lines(const std::string& dir, const std::string& tracker) {
  return {fmt::format("WARNING: could not find the metadata file {}/{}", dir, tracker),
          "    will not load any checkpoints and will start from random"};
}

std::string python_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  if (x == 0.0) return std::signbit(x) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: scientific when exp < -4 or exp >= 16.
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, end);  // e.g. "-1.2345e+01"
  const size_t epos = sci.find('e');
  const int exp10 = std::stoi(sci.substr(epos + 1));
  std::string digits = sci.substr(0, epos);  // the mantissa, its sign and point removed
  const bool neg = digits[0] == '-';
  if (neg) digits.erase(0, 1);
  std::erase(digits, '.');
  std::string out;
  if (exp10 < -4 || exp10 >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out.append(".").append(digits, 1);
    out += fmt::format("e{}{:02d}", exp10 < 0 ? '-' : '+', std::abs(exp10));
  } else if (exp10 < 0) {
    out.append("0.").append(static_cast<size_t>(-exp10 - 1), '0').append(digits);
  } else {
    const size_t int_len = static_cast<size_t>(exp10) + 1;
    out = digits.size() <= int_len ? digits + std::string(int_len - digits.size(), '0') + ".0"
                                   : digits.substr(0, int_len) + "." + digits.substr(int_len);
  }
  return neg ? "-" + out : out;
}

std::string python_round5_repr(double x) {
  if (x == 0.0 || !std::isfinite(x)) return python_float_repr(x);
  const int ndigits = -static_cast<int>(std::floor(std::log10(std::abs(x)))) + 4;
  // Python's round() is correctly rounded on the decimal value; formatting with that many
  // fractional digits and reading back gives the same double for these magnitudes.
  if (ndigits >= 0) return python_float_repr(std::stod(fmt::format("{:.{}f}", x, ndigits)));
  const double p = std::pow(10.0, -ndigits);
  return python_float_repr(std::nearbyint(x / p) * p);
}

std::string memory_line(int rank, int64_t iteration, const MemoryStats& s) {
  auto gb = [](size_t bytes) { return python_round5_repr(static_cast<double>(bytes) / 1e9); };
  // Bridge MEMORY_KEYS order. The CPU backend has no caching allocator: active = allocated,
  // inactive = 0, reserved = allocated, and nothing is ever retired.
  std::string m = fmt::format("(after {} iterations) memory (GB)", iteration);
  m += " | mem-allocated-gigabytes: " + gb(s.allocated);
  m += " | mem-active-gigabytes: " + gb(s.allocated);
  m += " | mem-inactive-gigabytes: " + gb(0);
  m += " | mem-reserved-gigabytes: " + gb(s.reserved);
  m += " | mem-max-allocated-gigabytes: " + gb(s.max_allocated);
  m += " | mem-max-active-gigabytes: " + gb(s.max_allocated);
  m += " | mem-max-inactive-gigabytes: " + gb(0);
  m += " | mem-max-reserved-gigabytes: " + gb(s.max_reserved);
  m += fmt::format(" | mem-alloc-retires: {}", 0);
  m += fmt::format(" | mem-allocated-count: {}", s.alloc_count);
  return fmt::format("[Rank {}] {}", rank, m);
}

std::string final_memory_line(const MemoryStats& s) {
  return fmt::format("FINAL mem-reserved-gigabytes: {:.3f} | mem-max-reserved-gigabytes: {:.3f} | "
                     "mem-max-allocated-gigabytes: {:.3f}",
                     s.reserved / 1e9, s.max_reserved / 1e9, s.max_allocated / 1e9);
}

std::string parameter_lines(double transformer_params, double embedding_params, double bytes_per_param) {
  const double total = transformer_params + embedding_params;
  std::string s = fmt::format("Number of parameters in transformer layers in billions: {: .2f}\n",
                              transformer_params / 1e9);
  s += fmt::format("Number of parameters in embedding layers in billions: {:.2f}\n", embedding_params / 1e9);
  s += fmt::format("Total number of parameters in billions: {:.2f}\n", total / 1e9);
  s += fmt::format("Number of parameters in most loaded shard in billions: {:.4f}\n", total / 1e9);
  s += fmt::format("Theoretical memory footprints: weight and optimizer={:.2f} MB",
                   total * bytes_per_param / (1024.0 * 1024.0));
  return s;
}

std::string now_timestamp() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

std::array<std::string, 3> validation_lines(const std::string& prefix, double lm_loss) {
  // Followed: Megatron-LM megatron/training/training.py evaluate_and_print_results.
  const std::string line = fmt::format(" validation loss at {} | lm loss value: {:.6E} | lm loss PPL: {:.6E} | ", prefix,
                                       lm_loss, std::exp(std::min(20.0, lm_loss)));
  const std::string rule(line.size() + 1, '-');
  return {rule, line, rule};
}

std::vector<std::string> downstream_eval_lines(const DownstreamEvalRecord& r) {
  const auto num = [](double v) { return std::isfinite(v) ? fmt::format("{:.4f}", v) : std::string("nan"); };
  std::vector<std::string> lines;
  for (const DownstreamTaskScore& t : r.tasks) {
    std::string line = fmt::format(" downstream eval at iteration {} | {} | acc: {} | acc_stderr: {} | ", r.iteration,
                                   t.task, num(t.acc), num(t.acc_stderr));
    if (t.has_acc_norm) line += fmt::format("acc_norm: {} | acc_norm_stderr: {} | ", num(t.acc_norm), num(t.acc_norm_stderr));
    line += fmt::format("documents: {} | {}-shot | forward: {} | {:.1f} s | ", t.documents, t.num_fewshot, r.forward,
                        r.seconds);
    lines.push_back(std::move(line));
  }
  return lines;
}

std::vector<std::string> timer_lines(std::span<const TimerReading> timers, const std::string& option) {
  std::vector<TimerOverRanks> one;
  for (const TimerReading& t : timers) one.push_back({t.name, {{0, t.ms}}});
  return timer_lines(std::span<const TimerOverRanks>(one), option);
}

std::vector<std::string> timer_lines(std::span<const TimerOverRanks> timers, const std::string& option) {
  // Followed: Megatron-LM megatron/core/timers.py, Timers._get_global_min_max_time_string and
  // Timers._get_all_ranks_time_string (the header, the 48-character '.' padding, {:.2f} ms).
  std::vector<std::string> out;
  if (timers.empty()) return out;
  const bool all = option == "all", max_only = option == "max";
  out.push_back(all ? "times across ranks (ms):" : max_only ? "max time across ranks (ms):"
                                                            : "(min, max) time across ranks (ms):");
  for (const TimerOverRanks& t : timers) {
    if (all) {
      out.push_back(fmt::format("  {}:", t.name));
      for (const auto& [rank, ms] : t.rank_ms) out.push_back(fmt::format("     rank {:2d}: {:.2f}", rank, ms));
      continue;
    }
    double lo = t.rank_ms.front().second, hi = lo;
    for (const auto& rm : t.rank_ms) {
      lo = std::min(lo, rm.second);
      hi = std::max(hi, rm.second);
    }
    const std::string padded = fmt::format("{:.<48}", std::string(t.name) + " ");
    out.push_back(max_only ? fmt::format("    {}: {:.2f}", padded, hi)
                           : fmt::format("    {}: ({:.2f}, {:.2f})", padded, lo, hi));
  }
  return out;
}

}  // namespace pl::log
