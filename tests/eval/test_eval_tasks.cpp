// lib/eval/tasks.h and the requests of lib/eval/harness.h on small hand-written files: each benchmark's fields,
// lm-eval's prompts and preprocessing (HellaSwag's cleaning, Winogrande's partial scoring, MMLU's prompt and subject
// line, ARC's two layouts, PIQA's labels file), the CSV reader, the few-shot blocks, and bad input refused as
// FILE:LINE in one line.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "eval/harness.h"
#include "eval/tasks.h"
#include "test_util.h"

namespace pl::eval {
namespace {

using test::TempDir;

TEST(EvalTasks, HellaSwagIsCleanedAsLmEvalDoes) {
  EXPECT_EQ(hellaswag_preprocess("  How to cook [title] Boil water.  Then  [step] stir [header]  "),
            "How to cook. Boil water. Then  stir ");  // (Python's output, checked)
  EXPECT_EQ(hellaswag_preprocess("a [b\nc] d"), "a [b\nc] d");  // '.' stops at a newline: no match
  EXPECT_EQ(hellaswag_preprocess("x   y"), "x  y");             // one pass of "  " -> " "
  EXPECT_EQ(python_capitalize("tHEN he Jumps"), "Then he jumps");
  TempDir dir;
  const std::string f = dir.write("hs.jsonl",
                                  R"({"activity_label": "Roof shingle removal", "ctx_a": "A man is on a roof.", )"
                                  R"("ctx_b": "he starts PULLING up roofing.", "endings": ["is [title] done.", "b", "c", "d"], "label": "2"})"
                                  "\n");
  const TaskFile t = load_task_file(f);
  EXPECT_EQ(t.format, TaskFormat::HellaSwag);
  EXPECT_TRUE(t.format_detected);
  ASSERT_EQ(t.docs.size(), 1u);
  EXPECT_EQ(t.docs[0].context(0), "Roof shingle removal: A man is on a roof. He starts pulling up roofing.");
  EXPECT_EQ(t.docs[0].choices[0], "is. done.");
  EXPECT_EQ(t.docs[0].gold, 2);
  EXPECT_TRUE(reports_acc_norm(t.format));
}

TEST(EvalTasks, ArcInBothLayoutsAndNumericAnswerKeys) {
  TempDir dir;
  const std::string hf = dir.write(
      "arc.jsonl", R"({"question": "Which is a gas?", "choices": {"text": ["ice", "steam"], "label": ["1", "2"]}, "answerKey": "2"})"
                   "\n");
  const TaskFile a = load_task_file(hf);
  EXPECT_EQ(a.format, TaskFormat::Arc);
  EXPECT_EQ(a.docs[0].context(0), "Question: Which is a gas?\nAnswer:");
  EXPECT_EQ(a.docs[0].choices, (std::vector<std::string>{"ice", "steam"}));
  EXPECT_EQ(a.docs[0].gold, 1);
  const std::string orig = dir.write(
      "arc_orig.jsonl", R"({"id": "x", "question": {"stem": "Why?", "choices": [{"text": "A1", "label": "A"}, )"
                        R"({"text": "B1", "label": "B"}, {"text": "C1", "label": "C"}]}, "answerKey": "C"})"
                        "\n");
  const TaskFile b = load_task_file(orig);
  EXPECT_EQ(b.docs[0].context(0), "Question: Why?\nAnswer:");
  EXPECT_EQ(b.docs[0].gold, 2);
  const std::string bad = dir.write(
      "arc_bad.jsonl", R"({"question": "Q", "choices": {"text": ["a"], "label": ["A"]}, "answerKey": "B"})" "\n");
  test::expect_one_line_error([&] { (void)load_task_file(bad); }, {bad + ":1", "answerKey 'B'"});
}

TEST(EvalTasks, PiqaWithItsLabelsFile) {
  TempDir dir;
  const std::string f = dir.write("valid.jsonl", R"({"goal": "Open a jar", "sol1": "twist", "sol2": "hit"})"
                                                 "\n"
                                                 R"({"goal": "Dry hair", "sol1": "towel", "sol2": "oven"})"
                                                 "\n");
  const std::string labels = dir.write("valid-labels.lst", "1\n0\n");
  const TaskFile t = load_task_file(f + ":piqa:" + labels);
  EXPECT_EQ(t.format, TaskFormat::Piqa);
  EXPECT_FALSE(t.format_detected);
  ASSERT_EQ(t.docs.size(), 2u);
  EXPECT_EQ(t.docs[0].context(0), "Question: Open a jar\nAnswer:");
  EXPECT_EQ(t.docs[0].gold, 1);
  EXPECT_EQ(t.docs[1].gold, 0);
  const std::string short_labels = dir.write("short.lst", "1\n");
  test::expect_one_line_error([&] { (void)load_task_file(f + ":piqa:" + short_labels); }, {"more documents than labels"});
  // Without labels the file has no 'label' field: the document's line is named.
  test::expect_one_line_error([&] { (void)load_task_file(f); }, {f + ":1", "'label' is missing"});
}

TEST(EvalTasks, WinograndeScoresThePartialSentence) {
  TempDir dir;
  const std::string f = dir.write(
      "wg.jsonl", R"({"sentence": "The trophy does not fit in the case because the _ is too big.", "option1": "trophy", )"
                  R"("option2": "case", "answer": "1"})"
                  "\n");
  const TaskFile t = load_task_file(f);
  EXPECT_EQ(t.format, TaskFormat::Winogrande);
  EXPECT_FALSE(reports_acc_norm(t.format));
  const McDoc& d = t.docs[0];
  EXPECT_EQ(d.context(0), "The trophy does not fit in the case because the trophy");
  EXPECT_EQ(d.context(1), "The trophy does not fit in the case because the case");
  EXPECT_EQ(d.continuations[0], "is too big.");
  EXPECT_EQ(d.continuations[1], "is too big.");
  EXPECT_EQ(d.gold, 0);
  EXPECT_EQ(d.as_example(), "The trophy does not fit in the case because the trophy is too big.");
}

TEST(EvalTasks, MmluPromptSubjectLineAndTheOriginalCsv) {
  TempDir dir;
  const std::string f = dir.write("mmlu.jsonl", R"({"question": " What is 2+2? ", "subject": "high_school_math", )"
                                                R"("choices": ["3", "4", "5", "6"], "answer": 1})"
                                                "\n");
  const TaskFile t = load_task_file(f);
  EXPECT_EQ(t.format, TaskFormat::Mmlu);
  EXPECT_FALSE(reports_acc_norm(t.format));
  const McDoc& d = t.docs[0];
  EXPECT_EQ(d.context(0), "What is 2+2?\nA. 3\nB. 4\nC. 5\nD. 6\nAnswer:");
  EXPECT_EQ(d.choices, (std::vector<std::string>{"A", "B", "C", "D"}));
  EXPECT_EQ(d.description, "The following are multiple choice questions (with answers) about high school math.\n\n");
  // The original CSV: quotes, commas and a newline inside a field; the subject from the file's name.
  const std::string csv = dir.write("abstract_algebra_test.csv", "\"Find x, if \"\"x\"\"\nis 1\",0,1,2,3,B\nQ2,a,b,c,d,D\n");
  const TaskFile c = load_task_file(csv);
  ASSERT_EQ(c.docs.size(), 2u);
  EXPECT_EQ(c.docs[0].context(0), "Find x, if \"x\"\nis 1\nA. 0\nB. 1\nC. 2\nD. 3\nAnswer:");
  EXPECT_EQ(c.docs[0].gold, 1);
  EXPECT_EQ(c.docs[1].line, 3);
  EXPECT_EQ(c.docs[1].subject, "abstract_algebra");
  const std::string bad = dir.write("x_test.csv", "Q,a,b,c,d,B\nQ,a,b,c,d,E\n");
  test::expect_one_line_error([&] { (void)load_task_file(bad); }, {bad + ":2", "A, B, C or D"});
  const std::string open_quote = dir.write("y_test.csv", "Q,a,b,c,d,B\n\"never closed,a\n");
  test::expect_one_line_error([&] { (void)load_task_file(open_quote); }, {open_quote + ":2", "not closed"});
}

TEST(EvalTasks, GenericFormatNamesDetectionAndBadLines) {
  TempDir dir;
  const std::string f = dir.write("g.jsonl", R"({"context": "c", "choices": ["x", "yy"], "label": 1})"
                                             "\n\n"
                                             R"({"context": "d", "choices": ["x"], "label": 0})"
                                             "\n");
  const TaskFile t = load_task_file(f);
  EXPECT_EQ(t.format, TaskFormat::Generic);
  ASSERT_EQ(t.docs.size(), 2u);
  EXPECT_EQ(t.docs[1].line, 3);
  const TaskFile named = load_task_file(f + ":generic");
  EXPECT_FALSE(named.format_detected);
  const std::string unknown = dir.write("u.jsonl", R"({"prompt": "p", "answer": "a"})" "\n");
  test::expect_one_line_error([&] { (void)load_task_file(unknown); }, {unknown + ":1", "FORMAT"});
  const std::string broken = dir.write("b.jsonl", R"({"context": "c", "choices": ["x"], "label": 0})"
                                                  "\n{not json\n");
  test::expect_one_line_error([&] { (void)load_task_file(broken); }, {broken + ":2"});
  const std::string out_of_range = dir.write("r.jsonl", R"({"context": "c", "choices": ["x", "y"], "label": 2})" "\n");
  test::expect_one_line_error([&] { (void)load_task_file(out_of_range); }, {out_of_range + ":1", "'label'", "[0, 2)"});
  test::expect_one_line_error([&] { (void)load_task_file(dir.write("e.jsonl", "\n")); }, {"no documents"});
  EXPECT_EQ(python_strip("\xc2\xa0 a b\xe3\x80\x80\n"), "a b");  // U+00A0 and U+3000 are Python whitespace
  EXPECT_EQ(python_rstrip("x\xe2\x80\xa8"), "x");                  // U+2028
  EXPECT_EQ(python_strip("\xc3\xa9 "), "\xc3\xa9");                 // é is not
  EXPECT_EQ(code_points("naïve"), 5);
  EXPECT_EQ(code_points("日本"), 2);
}

TEST(EvalTasks, FewShotBlocksAsLmEvalBuildsThem) {
  TempDir dir;
  const auto tok = data::make_tokenizer("byte", "");
  const std::string dev = dir.write("dev.jsonl", R"({"question": "d1", "subject": "a", "choices": ["1","2","3","4"], "answer": 0})" "\n"
                                                 R"({"question": "d2", "subject": "b", "choices": ["1","2","3","4"], "answer": 1})" "\n"
                                                 R"({"question": "d3", "subject": "a", "choices": ["1","2","3","4"], "answer": 2})" "\n");
  const std::string test = dir.write("test.jsonl", R"({"question": "q", "subject": "a", "choices": ["1","2","3","4"], "answer": 3})" "\n");
  const PreparedTask t = prepare_task({test, dev, 2, 0}, *tok, {false, 4096});
  ASSERT_EQ(t.requests.size(), 4u);
  // first_n of subject a, after its description; the continuation is " " + the letter.
  EXPECT_EQ(t.requests[0].context,
            "The following are multiple choice questions (with answers) about a.\n\n"
            "d1\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: A\n\nd3\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: C\n\n"
            "q\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer:");
  EXPECT_EQ(t.requests[3].continuation, " D");
  test::expect_one_line_error([&] { (void)prepare_task({test, dev, 3, 0}, *tok, {false, 4096}); },
                              {"--num-fewshot 3", "subject 'a'"});
  test::expect_one_line_error([&] { (void)prepare_task({test, "", 1, 0}, *tok, {false, 4096}); }, {"--fewshot-file"});
  // Drawn examples: the same seed the same blocks, never the document itself when the files are one.
  std::string g;
  for (int i = 0; i < 6; ++i) g += "{\"context\": \"c" + std::to_string(i) + "\", \"choices\": [\"a\", \"b\"], \"label\": 0}\n";
  const std::string gf = dir.write("g.jsonl", g);
  const PreparedTask a = prepare_task({gf, gf, 5, 0}, *tok, {false, 4096});
  const PreparedTask b = prepare_task({gf, gf, 5, 0}, *tok, {false, 4096});
  for (size_t r = 0; r < a.requests.size(); ++r) {
    EXPECT_EQ(a.requests[r].context, b.requests[r].context);
    const std::string own = "c" + std::to_string(a.requests[r].doc) + " a\n\n";
    EXPECT_EQ(a.requests[r].context.find(own), std::string::npos) << a.requests[r].context;
  }
  test::expect_one_line_error([&] { (void)prepare_task({gf, gf, 6, 0}, *tok, {false, 4096}); }, {"5 examples to draw"});
}

}  // namespace
}  // namespace pl::eval
