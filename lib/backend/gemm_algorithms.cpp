#include "backend/gemm_algorithms.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"

namespace pl {

bool GemmAlgorithmChoice::operator==(const GemmAlgorithmChoice& o) const {
  return key == o.key && algo == o.algo && description == o.description && source == o.source &&
         candidates == o.candidates && chosen == o.chosen && heuristic_ms == o.heuristic_ms && chosen_ms == o.chosen_ms;
}

std::string gemm_algorithms_json(const GemmAlgorithms& g) {
  nlohmann::ordered_json choices = nlohmann::ordered_json::array();
  for (const GemmAlgorithmChoice& c : g.choices) {
    nlohmann::ordered_json words = nlohmann::ordered_json::array();
    for (uint64_t w : c.algo) words.push_back(fmt::format("{:016x}", w));
    choices.push_back({{"key", c.key},
                       {"algo", words},
                       {"description", c.description},
                       {"source", c.source},
                       {"candidates", c.candidates},
                       {"chosen", c.chosen},
                       {"heuristic_ms", c.heuristic_ms},
                       {"chosen_ms", c.chosen_ms}});
  }
  const nlohmann::ordered_json j{{"device", g.device}, {"choices", choices}};
  return j.dump(1) + "\n";
}

namespace {

// The field `name` of choice `i`, of the JSON type `want` ("string", "number", "integer", "array").
const nlohmann::json& field(const nlohmann::json& c, const char* name, const char* want, const std::string& what,
                            size_t i) {
  PL_CHECK(c.is_object() && c.contains(name), "{}: choice {} has no \"{}\"", what, i, name);
  const nlohmann::json& v = c.at(name);
  const bool ok = std::string_view(want) == "string"    ? v.is_string()
                  : std::string_view(want) == "integer" ? v.is_number_integer()
                  : std::string_view(want) == "number"  ? v.is_number()
                                                        : v.is_array();
  PL_CHECK(ok, "{}: choice {}: \"{}\" must be a{} {}", what, i, name, want[0] == 'i' || want[0] == 'a' ? "n" : "",
           want);
  return v;
}

uint64_t hex_word(const nlohmann::json& w, const std::string& what, size_t i) {
  const std::string s = w.is_string() ? w.get<std::string>() : "";
  PL_CHECK(s.size() == 16 && s.find_first_not_of("0123456789abcdef") == std::string::npos,
           "{}: choice {}: an algo word must be 16 lower-case hex digits", what, i);
  return std::stoull(s, nullptr, 16);
}

}  // namespace

GemmAlgorithms gemm_algorithms_from_json(const nlohmann::json& j, const std::string& what) {
  PL_CHECK(j.is_object() && j.contains("device") && j.at("device").is_string() && j.contains("choices") &&
               j.at("choices").is_array(),
           "{}: not a GEMM algorithm list (an object with \"device\" and \"choices\")", what);
  GemmAlgorithms g;
  g.device = j.at("device").get<std::string>();
  std::set<std::string> keys;
  const nlohmann::json& list = j.at("choices");
  for (size_t i = 0; i < list.size(); ++i) {
    const nlohmann::json& c = list[i];
    GemmAlgorithmChoice x;
    x.key = field(c, "key", "string", what, i).get<std::string>();
    PL_CHECK(keys.insert(x.key).second, "{}: choice {}: the GEMM {} is listed twice", what, i, x.key);
    const nlohmann::json& words = field(c, "algo", "array", what, i);
    PL_CHECK(words.size() == x.algo.size(), "{}: choice {}: \"algo\" must have {} words", what, i, x.algo.size());
    for (size_t k = 0; k < x.algo.size(); ++k) x.algo[k] = hex_word(words[k], what, i);
    x.description = field(c, "description", "string", what, i).get<std::string>();
    x.source = field(c, "source", "string", what, i).get<std::string>();
    x.candidates = field(c, "candidates", "integer", what, i).get<int>();
    x.chosen = field(c, "chosen", "integer", what, i).get<int>();
    PL_CHECK(x.candidates >= 1 && x.chosen >= 0 && x.chosen < x.candidates,
             "{}: choice {}: chosen {} of {} candidates", what, i, x.chosen, x.candidates);
    x.heuristic_ms = field(c, "heuristic_ms", "number", what, i).get<double>();
    x.chosen_ms = field(c, "chosen_ms", "number", what, i).get<double>();
    PL_CHECK(std::isfinite(x.heuristic_ms) && std::isfinite(x.chosen_ms) && x.heuristic_ms >= 0 && x.chosen_ms >= 0,
             "{}: choice {}: times must be finite and >= 0", what, i);
    g.choices.push_back(std::move(x));
  }
  return g;
}

std::string gemm_algorithms_summary(const GemmAlgorithms& g) {
  int timed = 0, other = 0, restored = 0;
  double heuristic = 0, chosen = 0;
  for (const GemmAlgorithmChoice& c : g.choices) {
    restored += c.source == "checkpoint" ? 1 : 0;
    if (c.candidates <= 1 || c.source != "timed") continue;
    ++timed;
    other += c.chosen != 0 ? 1 : 0;
    heuristic += c.heuristic_ms;
    chosen += c.chosen_ms;
  }
  std::string s = fmt::format("cuBLASLt algorithms: {} GEMM shapes", g.choices.size());
  if (restored > 0) s += fmt::format(", {} from the checkpoint", restored);
  if (timed > 0)
    s += fmt::format(", {} timed: {} took another than the heuristic's first ({:.3f} ms per call of each timed shape "
                     "together, against {:.3f} ms with the heuristic's first)",
                     timed, other, chosen, heuristic);
  else if (restored == 0)
    s += ", the heuristic's first for each";
  return s;
}

}  // namespace pl
