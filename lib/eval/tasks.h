#pragma once
// Multiple-choice benchmark files as lm-evaluation-harness 0.4 reads them (issue 43): HellaSwag, ARC, PIQA,
// Winogrande, MMLU and a generic layout, each turned into documents with lm-eval's prompts (its task YAMLs and
// their utils.py), so the requests `evaluate` scores are the strings lm-eval would score. The user gives the files
// (JSON lines, as Hugging Face's datasets write them, or MMLU's original CSV); nothing is downloaded.
//
//   format      fields (one JSON object per line)                         prompt (doc_to_text)             choices
//   hellaswag   activity_label, ctx_a, ctx_b, endings[], label            preprocess(activity_label + ": " +  preprocess(ending)
//                                                                         ctx_a + " " + ctx_b.capitalize())
//   arc         question, choices{text[], label[]}, answerKey   (HF)     "Question: {question}\nAnswer:"    choices.text
//               question{stem, choices[{text, label}]}, answerKey (original; answerKey may be "1".."4")
//   piqa        goal, sol1, sol2, label   (or the original valid.jsonl    "Question: {goal}\nAnswer:"        sol1, sol2
//               with its valid-labels.lst: FILE:piqa:LABELS)
//   winogrande  sentence, option1, option2, answer "1"|"2"                partial scoring: the contexts are the sentence up to
//               the blank with each option, the one continuation the rest of the sentence (acc only)
//   mmlu        question, subject, choices[4], answer 0-3 (HF cais/mmlu)   "{question.strip()}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer:"
//               or the original CSV rows question,A,B,C,D,letter (the subject from the file name: x_test.csv)
//               choices "A".."D"; the description "The following are multiple choice questions (with answers)
//               about {subject}.\n\n" before the few-shot examples (acc only)
//   generic     context, choices[], label                                 context                          choices
//
// Each candidate's continuation is " " + choice (lm-eval's target_delimiter); acc_norm divides by the choice's
// length in Unicode code points (not counting the delimiter). A bad line is one pl::Error naming FILE:LINE.
#include <cstdint>
#include <string>
#include <vector>

namespace pl::eval {

enum class TaskFormat { HellaSwag, Arc, Piqa, Winogrande, Mmlu, Generic };
const char* task_format_name(TaskFormat f);  // "hellaswag", ...
// The lm-eval metrics of a format: acc always; acc_norm for all but Winogrande and MMLU (their task YAMLs').
bool reports_acc_norm(TaskFormat f);

// One document: its context(s), the choices (without the delimiter), the gold index.
struct McDoc {
  // One context for every choice, or one per choice (Winogrande's partial scoring: lm-eval's multiple inputs).
  std::vector<std::string> contexts;
  // The continuation of each choice without the delimiter (Winogrande: the same rest of the sentence for each);
  // acc_norm's lengths are those of `choices`.
  std::vector<std::string> continuations;
  std::vector<std::string> choices;
  int gold = 0;
  std::string description;  // MMLU: the subject's line, before the few-shot examples (else empty)
  std::string subject;      // MMLU: for the few-shot examples of the same subject
  int64_t line = 0;         // where it was read (1-based), for messages
  const std::string& context(size_t choice) const { return contexts.size() == 1 ? contexts[0] : contexts[choice]; }
  // How the document reads as a few-shot example: its context (Winogrande: the gold option's) + " " + the gold
  // continuation (lm-eval's doc_to_text + target_delimiter + doc_to_target).
  std::string as_example() const;
};

struct TaskFile {
  std::string path;
  TaskFormat format = TaskFormat::Generic;
  bool format_detected = true;  // false: named in the spec
  std::string labels_path;      // PIQA's original labels file, when given
  std::vector<McDoc> docs;
};

// FILE[:FORMAT[:LABELS]] -> the file, the format (named, or detected from the first record's fields, or .csv:
// MMLU's original layout) and its documents. One-line errors name FILE:LINE and what is wrong.
TaskFile load_task_file(const std::string& spec);

// HellaSwag's text cleaning (lm-eval tasks/hellaswag/utils.py preprocess): strip, " [title]" -> ". ", every
// "[...]" on one line removed, then each "  " -> " " (one left-to-right pass, as Python's str.replace).
std::string hellaswag_preprocess(const std::string& text);
// Python's str.capitalize() on ASCII letters (the first upper, the rest lower); other characters as they are
// (Python also changes the case of non-ASCII letters: HellaSwag's ctx_b is English, rarely affected).
std::string python_capitalize(const std::string& s);
// Python's str.strip() / str.rstrip() on UTF-8 text: every character str.isspace accepts (ASCII's, \x1c-\x1f,
// U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000).
std::string python_strip(const std::string& s);
std::string python_rstrip(const std::string& s);
// The length of UTF-8 text in code points (Python's len of a str).
int64_t code_points(const std::string& s);

// The rows of a CSV file (RFC 4180: quoted fields with "", commas and newlines inside quotes), each with the
// line it starts on; a quote left open at the end is one error naming the line.
struct CsvRow {
  std::vector<std::string> fields;
  int64_t line = 0;
};
std::vector<CsvRow> parse_csv(const std::string& text, const std::string& what);

}  // namespace pl::eval
