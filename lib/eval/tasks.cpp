// Benchmark files into documents with lm-eval 0.4's prompts (tasks.h). Followed: lm-evaluation-harness v0.4
// lm_eval/tasks/{hellaswag/hellaswag.yaml + utils.py, arc/arc_easy.yaml, piqa/piqa.yaml, winogrande/default.yaml +
// preprocess_winogrande.py, mmlu/default/_default_template_yaml}.
#include "eval/tasks.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/error.h"
#include "io/file_checks.h"
#include "io/json_text.h"

namespace pl::eval {

namespace {

using Json = nlohmann::json;

struct Where {
  const std::string& path;
  int64_t line;
  std::string str() const { return fmt::format("{}:{}", path, line); }
};

const Json& field(const Json& j, const char* key, const Where& w) {
  PL_CHECK(j.is_object() && j.contains(key), "{}: field '{}' is missing", w.str(), key);
  return j.at(key);
}

std::string string_field(const Json& j, const char* key, const Where& w) {
  const Json& v = field(j, key, w);
  PL_CHECK(v.is_string(), "{}: field '{}' must be a string, got {}", w.str(), key, describe_json(v));
  return v.get<std::string>();
}

std::vector<std::string> string_list(const Json& v, const char* key, const Where& w) {
  PL_CHECK(v.is_array() && !v.empty(), "{}: field '{}' must be a non-empty list of strings, got {}", w.str(), key,
           describe_json(v));
  std::vector<std::string> out;
  for (const Json& e : v) {
    PL_CHECK(e.is_string(), "{}: field '{}' must hold strings, got {}", w.str(), key, describe_json(e));
    out.push_back(e.get<std::string>());
  }
  return out;
}

// An index written as a JSON integer or a string of digits ("0", as HellaSwag's label), in [0, n).
int index_field(const Json& v, const char* key, size_t n, const Where& w) {
  std::optional<int64_t> i = json_exact_integer<int64_t>(v);
  if (!i && v.is_string()) {
    const std::string s = v.get<std::string>();
    if (!s.empty() && s.size() < 10 && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }))
      i = std::stoll(s);
  }
  PL_CHECK(i.has_value() && *i >= 0 && *i < static_cast<int64_t>(n), "{}: field '{}' must be an index in [0, {}), got {}",
           w.str(), key, n, describe_json(v));
  return static_cast<int>(*i);
}

McDoc one_context(std::string context, std::vector<std::string> choices, int gold, int64_t line) {
  McDoc d;
  d.contexts = {std::move(context)};
  d.continuations = choices;
  d.choices = std::move(choices);
  d.gold = gold;
  d.line = line;
  return d;
}

McDoc hellaswag_doc(const Json& j, const Where& w) {
  const std::string label = string_field(j, "activity_label", w);  // (read in order: a missing field is the first)
  const std::string ctx_a = string_field(j, "ctx_a", w);
  const std::string ctx = ctx_a + " " + python_capitalize(string_field(j, "ctx_b", w));
  std::vector<std::string> endings = string_list(field(j, "endings", w), "endings", w);
  for (std::string& e : endings) e = hellaswag_preprocess(e);
  const int gold = index_field(field(j, "label", w), "label", endings.size(), w);
  return one_context(hellaswag_preprocess(label + ": " + ctx), std::move(endings), gold, w.line);
}

// ARC: the Hugging Face layout (question a string, choices {text, label}) or the original one (question {stem,
// choices [{text, label}]}); gold = the index of answerKey among the labels (lm-eval: choices.label.index(answerKey)).
McDoc arc_doc(const Json& j, const Where& w) {
  const Json& q = field(j, "question", w);
  std::string stem;
  std::vector<std::string> texts, labels;
  if (q.is_object()) {
    stem = string_field(q, "stem", w);
    const Json& choices = field(q, "choices", w);
    PL_CHECK(choices.is_array() && !choices.empty(), "{}: field 'question.choices' must be a non-empty list",
             w.str());
    for (const Json& c : choices) {
      texts.push_back(string_field(c, "text", w));
      labels.push_back(string_field(c, "label", w));
    }
  } else {
    stem = string_field(j, "question", w);
    const Json& choices = field(j, "choices", w);
    texts = string_list(field(choices, "text", w), "choices.text", w);
    labels = string_list(field(choices, "label", w), "choices.label", w);
    PL_CHECK(texts.size() == labels.size(), "{}: choices.text has {} entries, choices.label {}", w.str(), texts.size(),
             labels.size());
  }
  const std::string key = string_field(j, "answerKey", w);
  const auto it = std::find(labels.begin(), labels.end(), key);
  PL_CHECK(it != labels.end(), "{}: answerKey '{}' is none of the choices' labels", w.str(), key);
  return one_context("Question: " + stem + "\nAnswer:", std::move(texts), static_cast<int>(it - labels.begin()),
                     w.line);
}

McDoc piqa_doc(const Json& j, const Where& w, const std::optional<int>& label_from_file) {
  std::vector<std::string> sols = {string_field(j, "sol1", w), string_field(j, "sol2", w)};
  const int gold = label_from_file ? *label_from_file : index_field(field(j, "label", w), "label", 2, w);
  return one_context("Question: " + string_field(j, "goal", w) + "\nAnswer:", std::move(sols), gold, w.line);
}

// lm-eval's preprocess_winogrande.py: the blank is the first '_'; the contexts are the sentence before it with
// each option, the continuation the rest after it, stripped.
McDoc winogrande_doc(const Json& j, const Where& w) {
  const std::string sentence = string_field(j, "sentence", w);
  const size_t blank = sentence.find('_');
  PL_CHECK(blank != std::string::npos, "{}: field 'sentence' has no blank '_'", w.str());
  McDoc d;
  d.choices = {string_field(j, "option1", w), string_field(j, "option2", w)};
  d.contexts = {sentence.substr(0, blank) + d.choices[0], sentence.substr(0, blank) + d.choices[1]};
  const std::string rest = python_strip(sentence.substr(blank + 1));
  d.continuations = {rest, rest};
  const Json& answer = field(j, "answer", w);
  PL_CHECK(answer.is_string() || answer.is_number(), "{}: field 'answer' must be \"1\" or \"2\"", w.str());
  const std::string a = answer.is_string() ? answer.get<std::string>() : answer.dump();
  PL_CHECK(a == "1" || a == "2", "{}: field 'answer' must be \"1\" or \"2\", got {}", w.str(), describe_json(answer));
  d.gold = a == "1" ? 0 : 1;
  d.line = w.line;
  return d;
}

McDoc mmlu_doc(const std::string& question, const std::vector<std::string>& choices, int gold, std::string subject,
               int64_t line) {
  McDoc d = one_context(fmt::format("{}\nA. {}\nB. {}\nC. {}\nD. {}\nAnswer:", python_strip(question), choices[0],
                                    choices[1], choices[2], choices[3]),
                        {"A", "B", "C", "D"}, gold, line);
  std::string pretty = subject;
  std::replace(pretty.begin(), pretty.end(), '_', ' ');
  d.description = fmt::format("The following are multiple choice questions (with answers) about {}.\n\n", pretty);
  d.subject = std::move(subject);
  return d;
}

McDoc mmlu_json_doc(const Json& j, const Where& w) {
  const std::vector<std::string> choices = string_list(field(j, "choices", w), "choices", w);
  PL_CHECK(choices.size() == 4, "{}: field 'choices' must hold 4 answers, got {}", w.str(), choices.size());
  const int gold = index_field(field(j, "answer", w), "answer", 4, w);
  return mmlu_doc(string_field(j, "question", w), choices, gold, string_field(j, "subject", w), w.line);
}

McDoc generic_doc(const Json& j, const Where& w) {
  std::vector<std::string> choices = string_list(field(j, "choices", w), "choices", w);
  const int gold = index_field(field(j, "label", w), "label", choices.size(), w);
  return one_context(string_field(j, "context", w), std::move(choices), gold, w.line);
}

bool has(const Json& j, std::initializer_list<const char*> keys) {
  return std::all_of(keys.begin(), keys.end(), [&](const char* k) { return j.contains(k); });
}

std::optional<TaskFormat> detect_format(const Json& j) {
  if (!j.is_object()) return std::nullopt;
  if (has(j, {"ctx_a", "ctx_b", "endings"})) return TaskFormat::HellaSwag;
  if (has(j, {"question", "answerKey"})) return TaskFormat::Arc;
  if (has(j, {"goal", "sol1", "sol2"})) return TaskFormat::Piqa;
  if (has(j, {"sentence", "option1", "option2"})) return TaskFormat::Winogrande;
  if (has(j, {"question", "choices", "answer"})) return TaskFormat::Mmlu;
  if (has(j, {"context", "choices", "label"})) return TaskFormat::Generic;
  return std::nullopt;
}

std::optional<TaskFormat> format_named(const std::string& name) {
  for (TaskFormat f : {TaskFormat::HellaSwag, TaskFormat::Arc, TaskFormat::Piqa, TaskFormat::Winogrande,
                       TaskFormat::Mmlu, TaskFormat::Generic})
    if (name == task_format_name(f)) return f;
  return std::nullopt;
}

// PIQA's valid-labels.lst: one 0 or 1 per line.
std::vector<int> read_labels(const std::string& path) {
  std::istringstream in(read_regular_file(path));
  std::vector<int> labels;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    line = python_strip(line);
    if (line.empty() && in.peek() == EOF) break;
    PL_CHECK(line == "0" || line == "1", "{}:{}: a PIQA label must be 0 or 1, got '{}'", path, n, line.substr(0, 40));
    labels.push_back(line == "1" ? 1 : 0);
  }
  return labels;
}

// MMLU's original CSV (no header): question, A, B, C, D, the answer letter; the subject is the file name without
// its split suffix (abstract_algebra_test.csv -> abstract_algebra), as the original loader names its tasks.
std::vector<McDoc> mmlu_csv_docs(const std::string& path) {
  std::string subject = std::filesystem::path(path).stem().string();
  for (const char* suffix : {"_test", "_dev", "_val"})
    if (subject.size() > std::strlen(suffix) && subject.ends_with(suffix)) subject.resize(subject.size() - std::strlen(suffix));
  std::vector<McDoc> docs;
  for (const CsvRow& r : parse_csv(read_regular_file(path), path)) {
    PL_CHECK(r.fields.size() == 6, "{}:{}: an MMLU row has 6 fields (question,A,B,C,D,answer), got {}", path, r.line,
             r.fields.size());
    const std::string& letter = r.fields[5];
    PL_CHECK(letter.size() == 1 && letter[0] >= 'A' && letter[0] <= 'D', "{}:{}: the answer must be A, B, C or D, got '{}'",
             path, r.line, letter.substr(0, 20));
    docs.push_back(mmlu_doc(r.fields[0], {r.fields[1], r.fields[2], r.fields[3], r.fields[4]}, letter[0] - 'A',
                            subject, r.line));
  }
  return docs;
}

McDoc json_doc(TaskFormat f, const Json& j, const Where& w, const std::optional<int>& piqa_label) {
  switch (f) {
    case TaskFormat::HellaSwag: return hellaswag_doc(j, w);
    case TaskFormat::Arc: return arc_doc(j, w);
    case TaskFormat::Piqa: return piqa_doc(j, w, piqa_label);
    case TaskFormat::Winogrande: return winogrande_doc(j, w);
    case TaskFormat::Mmlu: return mmlu_json_doc(j, w);
    case TaskFormat::Generic: return generic_doc(j, w);
  }
  PL_CHECK(false, "internal: task format {}", static_cast<int>(f));
  return {};
}

void split_spec(const std::string& spec, TaskFile& t) {
  t.path = spec;
  const size_t piqa = spec.rfind(":piqa:");
  if (piqa != std::string::npos) {
    t.path = spec.substr(0, piqa);
    t.format = TaskFormat::Piqa;
    t.format_detected = false;
    t.labels_path = spec.substr(piqa + 6);
    PL_CHECK(!t.labels_path.empty(), "--task {}: FILE:piqa:LABELS names no labels file", spec);
    return;
  }
  const size_t colon = spec.rfind(':');
  if (colon == std::string::npos) return;
  if (const std::optional<TaskFormat> f = format_named(spec.substr(colon + 1))) {
    t.path = spec.substr(0, colon);
    t.format = *f;
    t.format_detected = false;
  }
}

void read_json_lines(TaskFile& t) {
  std::optional<std::vector<int>> labels;
  if (!t.labels_path.empty()) labels = read_labels(t.labels_path);
  std::istringstream in(read_regular_file(t.path));
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (python_strip(line).empty()) continue;
    const Where w{t.path, n};
    const Json j = parse_json_text(line, w.str());
    if (t.docs.empty() && t.format_detected) {
      const std::optional<TaskFormat> f = detect_format(j);
      PL_CHECK(f.has_value(), "{}: cannot tell the benchmark from the fields of {}: name it as {}:FORMAT (hellaswag, "
               "arc, piqa, winogrande, mmlu, generic)", w.str(), describe_json(j), t.path);
      t.format = *f;
    }
    std::optional<int> label;
    if (labels) {
      PL_CHECK(t.docs.size() < labels->size(), "{}: more documents than labels in {} ({})", w.str(), t.labels_path,
               labels->size());
      label = (*labels)[t.docs.size()];
    }
    t.docs.push_back(json_doc(t.format, j, w, label));
  }
  PL_CHECK(!labels || labels->size() == t.docs.size(), "{}: {} documents but {} labels in {}", t.path, t.docs.size(),
           labels ? labels->size() : 0, t.labels_path);
}

}  // namespace

const char* task_format_name(TaskFormat f) {
  switch (f) {
    case TaskFormat::HellaSwag: return "hellaswag";
    case TaskFormat::Arc: return "arc";
    case TaskFormat::Piqa: return "piqa";
    case TaskFormat::Winogrande: return "winogrande";
    case TaskFormat::Mmlu: return "mmlu";
    case TaskFormat::Generic: return "generic";
  }
  return "?";
}

bool reports_acc_norm(TaskFormat f) { return f != TaskFormat::Winogrande && f != TaskFormat::Mmlu; }

std::string McDoc::as_example() const {
  return context(static_cast<size_t>(gold)) + " " + continuations[static_cast<size_t>(gold)];
}

TaskFile load_task_file(const std::string& spec) {
  TaskFile t;
  split_spec(spec, t);
  PL_CHECK(!t.path.empty(), "--task '{}' names no file", spec);
  const bool csv = t.path.ends_with(".csv");
  PL_CHECK(!csv || (t.format_detected || t.format == TaskFormat::Mmlu),
           "--task {}: a .csv file is read as MMLU's original layout only", spec);
  if (csv) {
    t.format = TaskFormat::Mmlu;
    t.docs = mmlu_csv_docs(t.path);
  } else {
    read_json_lines(t);
  }
  PL_CHECK(!t.docs.empty(), "{}: no documents", t.path);
  return t;
}

namespace {

// Python's str.isspace: the ASCII controls \t..\r and \x1c..\x1f, space, and Unicode's White_Space separators.
bool python_space(char32_t c) {
  return c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// The code point whose UTF-8 sequence starts at s[i], and the sequence's length (a byte that starts no valid
// sequence: itself, length 1 -- never a space).
char32_t code_point_at(const std::string& s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + len > s.size()) len = 1;
  if (len == 1) return c < 0x80 ? c : 0xFFFD;
  char32_t cp = c & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xc0) != 0x80) {
      len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b(i + k) & 0x3f);
  }
  return cp;
}

}  // namespace

std::string python_rstrip(const std::string& s) {
  size_t e = s.size();
  while (e > 0) {
    size_t start = e - 1, len = 0;
    while (start > 0 && e - start < 4 && (static_cast<unsigned char>(s[start]) & 0xc0) == 0x80) --start;
    const char32_t c = code_point_at(s, start, len);
    if (start + len != e || !python_space(c)) break;  // (a byte of no whole sequence is never a space)
    e = start;
  }
  return s.substr(0, e);
}

std::string python_strip(const std::string& s) {
  size_t b = 0, len = 0;
  while (b < s.size() && python_space(code_point_at(s, b, len))) b += len;
  return python_rstrip(s.substr(b));
}

std::string python_capitalize(const std::string& s) {
  std::string out = s;
  for (size_t i = 0; i < out.size(); ++i) {
    const char c = out[i];
    if (i == 0 && c >= 'a' && c <= 'z') out[i] = static_cast<char>(c - 'a' + 'A');
    if (i > 0 && c >= 'A' && c <= 'Z') out[i] = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string hellaswag_preprocess(const std::string& text) {
  std::string s = python_strip(text);
  for (size_t at = s.find(" [title]"); at != std::string::npos; at = s.find(" [title]", at + 2))
    s.replace(at, 8, ". ");
  std::string cut;  // re.sub("\\[.*?\\]", "", s): '.' stops at a newline
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '[') {
      const size_t close = s.find_first_of("]\n", i + 1);
      if (close != std::string::npos && s[close] == ']') {
        i = close;
        continue;
      }
    }
    cut += s[i];
  }
  std::string out;
  for (size_t i = 0; i < cut.size(); ++i) {
    out += cut[i];
    if (cut[i] == ' ' && i + 1 < cut.size() && cut[i + 1] == ' ') ++i;  // "  " -> " ", non-overlapping
  }
  return out;
}

int64_t code_points(const std::string& s) {
  return std::count_if(s.begin(), s.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

std::vector<CsvRow> parse_csv(const std::string& text, const std::string& what) {
  std::vector<CsvRow> rows;
  CsvRow row;
  std::string f;
  bool quoted = false, any = false;
  int64_t line = 1, quote_line = 0;
  const auto end_field = [&] {
    row.fields.push_back(std::move(f));
    f.clear();
  };
  const auto end_row = [&] {
    end_field();
    if (!(row.fields.size() == 1 && row.fields[0].empty())) rows.push_back(std::move(row));
    row = CsvRow{};
    any = false;
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (!any) row.line = line, any = true;
    if (quoted) {
      if (c == '"' && i + 1 < text.size() && text[i + 1] == '"') {
        f += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        if (c == '\n') ++line;
        f += c;
      }
    } else if (c == '"') {
      quoted = true;
      quote_line = line;
    } else if (c == ',') {
      end_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      ++line;
      end_row();
    } else {
      f += c;
    }
  }
  PL_CHECK(!quoted, "{}:{}: a quoted field is not closed", what, quote_line);
  if (any) end_row();
  return rows;
}

}  // namespace pl::eval
