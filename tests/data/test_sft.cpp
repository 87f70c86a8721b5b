// Supervised fine-tuning data (issue 28): the two JSON shapes and the chat templates token by token (the Llama 3
// specials against the tokenizer's ids), the refusals, NeMo's truncation, NeMo's packing algorithms against
// numpy-made goldens, and a written set read back as packs.
#include <gtest/gtest.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/documents.h"
#include "data/numpy_rng.h"
#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "io/atomic_file.h"
#include "sft_test_util.h"
#include "test_tokenizer.h"
#include "test_util.h"

namespace pl::data {
namespace {

using nlohmann::json;

std::unique_ptr<Tokenizer> byte_tok() { return make_tokenizer("byte", ""); }

// The tiny tiktoken vocabulary (test_tokenizer.h) with Llama 3.1's 256 specials after its 264 ranks.
struct TinyTiktoken {
  test::TempDir dir;
  std::unique_ptr<Tokenizer> tok;
  TinyTiktoken() {
    const std::string path = dir.path() / "tiny.model";
    std::ofstream(path) << test::tiny_rank_file();
    tok = make_tokenizer("tiktoken", path);
  }
};

std::vector<int32_t> sft_bytes_of(const std::string& s) {
  std::vector<int32_t> v;
  for (const char c : s) v.push_back(static_cast<unsigned char>(c));
  return v;
}

std::vector<int32_t> concat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

// The tokens whose answer flag is 1.
std::vector<int32_t> answer_part(const SftExample& e) {
  std::vector<int32_t> v;
  for (size_t i = 0; i < e.tokens.size(); ++i)
    if (e.answer[i]) v.push_back(e.tokens[i]);
  return v;
}

TEST(SftFormat, InputOutputIsNemosTemplateWithEodAndOnlyTheOutputIsAnAnswer) {
  const auto tok = byte_tok();
  const SftExample e = encode_sft_example(json{{"input", "2+2?"}, {"output", "4"}}, *tok, false);
  EXPECT_EQ(e.tokens, concat({sft_bytes_of("2+2?"), sft_bytes_of(" "), sft_bytes_of("4"), {257}}));
  EXPECT_EQ(answer_part(e), concat({sft_bytes_of("4"), {257}}));
  EXPECT_FALSE(e.chat);
  EXPECT_EQ(e.input_begin, 0);
  EXPECT_EQ(e.input_end, 4);
  const SftExample b = encode_sft_example(json{{"input", "x"}, {"output", "y"}}, *tok, true);
  EXPECT_EQ(b.tokens, concat({{256}, sft_bytes_of("x"), sft_bytes_of(" "), sft_bytes_of("y"), {257}}));
  EXPECT_EQ(b.answer_tokens(), 2);
}

TEST(SftFormat, Llama3ChatTemplateUsesTheTokenizersHeaderAndEndOfTurnIds) {
  TinyTiktoken t;
  const Tokenizer& tok = *t.tok;
  ASSERT_EQ(chat_template_for(tok), ChatTemplate::llama3);
  // Llama 3.1's specials: <|begin_of_text|> base+0, <|start_header_id|> base+6, <|end_header_id|> base+7,
  // <|eom_id|> base+8, <|eot_id|> base+9 (with base 128000 these are 128000, 128006, 128007, 128008, 128009).
  const int32_t base = test::kTinyBase;
  EXPECT_EQ(tok.special_id("<|start_header_id|>"), base + 6);
  EXPECT_EQ(tok.special_id("<|eot_id|>"), base + 9);
  EXPECT_EQ(tok.special_id("<|not_a_special|>"), -1);
  const json chat = {{"messages",
                      {{{"role", "system"}, {"content", "be brief"}},
                       {{"role", "user"}, {"content", "  hello \n"}},
                       {{"role", "assistant"}, {"content", "hell"}}}}};
  const SftExample e = encode_sft_example(chat, tok, false);
  const auto header = [&](const std::string& role) {
    return concat({{base + 6}, tok.encode(role), {base + 7}, tok.encode("\n\n")});
  };
  EXPECT_EQ(e.tokens, concat({{base}, header("system"), tok.encode("be brief"), {base + 9}, header("user"),
                              tok.encode("hello"), {base + 9}, header("assistant"), tok.encode("hell"), {base + 9}}));
  EXPECT_EQ(answer_part(e), concat({tok.encode("hell"), {base + 9}}));
  EXPECT_EQ(tok.encode("hell"), std::vector<int32_t>{263});  // (the content was BPE-encoded: he + ll)
  EXPECT_TRUE(e.chat);
  // The generation prompt: the messages, then the assistant's header; answers stop at eod, eom or eot.
  const std::vector<ChatMessage> msgs = {{"user", "hello"}};
  EXPECT_EQ(chat_prompt(msgs, tok), concat({{base}, header("user"), tok.encode("hello"), {base + 9}, header("assistant")}));
  EXPECT_EQ(answer_stop_ids(tok), (std::vector<int32_t>{base + 1, base + 8, base + 9}));
}

TEST(SftFormat, PlainChatTemplateForTheByteTokenizer) {
  const auto tok = byte_tok();
  ASSERT_EQ(chat_template_for(*tok), ChatTemplate::plain);
  const json chat = {{"messages",
                      {{{"role", "user"}, {"content", "hi"}},
                       {{"role", "assistant"}, {"content", "yo"}},
                       {{"role", "user"}, {"content", "and?"}},
                       {{"role", "assistant"}, {"content", " ok "}}}}};
  const SftExample e = encode_sft_example(chat, *tok, false);
  EXPECT_EQ(e.tokens, concat({{256}, sft_bytes_of("<|user|>\nhi\n<|assistant|>\nyo"), {257},
                              sft_bytes_of("<|user|>\nand?\n<|assistant|>\nok"), {257}}));
  EXPECT_EQ(answer_part(e), concat({sft_bytes_of("yo"), {257}, sft_bytes_of("ok"), {257}}));
  const std::vector<ChatMessage> msgs = {{"user", "hi"}};
  EXPECT_EQ(chat_prompt(msgs, *tok), concat({{256}, sft_bytes_of("<|user|>\nhi\n<|assistant|>\n")}));
  EXPECT_EQ(answer_stop_ids(*tok), std::vector<int32_t>{257});
}

TEST(SftFormat, MalformedObjectsAreOneLineErrors) {
  const auto tok = byte_tok();
  const auto refused = [&](const json& j, std::vector<std::string> needles) {
    test::expect_one_line_error([&] { encode_sft_example(j, *tok, false); }, needles);
  };
  refused(json{{"input", "q"}}, {"'output'", "missing"});
  refused(json{{"input", "q"}, {"output", 3}}, {"'output'", "number", "string"});
  refused(json{{"input", "q"}, {"output", " \n "}}, {"empty answer"});
  refused(json{{"text", "q"}}, {"'input' and 'output', or 'messages'"});
  refused(json::array({1, 2}), {"JSON object", "array"});
  refused(json{{"messages", "hi"}, {"input", "q"}}, {"both"});
  refused(json{{"messages", "hi"}}, {"'messages'", "array"});
  refused(json{{"messages", json::array()}}, {"'messages' is empty"});
  refused(json{{"messages", {{{"role", "assistant"}, {"content", "a"}}}}},
          {"message 1", "'assistant'", "'user' was expected"});
  refused(json{{"messages", {{{"role", "user"}, {"content", "q"}}, {{"role", "user"}, {"content", "q"}}}}},
          {"message 2", "'user'", "'assistant' was expected"});
  refused(json{{"messages", {{{"role", "user"}, {"content", "q"}}}}}, {"message 1", "ends with 'user'"});
  refused(json{{"messages", {{{"role", "user"}, {"content", "q"}}, {{"role", "tool"}, {"content", "x"}}}}},
          {"message 2", "unknown role 'tool'"});
  refused(json{{"messages", {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", " "}}}}},
          {"message 2", "empty answer"});
  refused(json{{"messages", {{{"role", "user"}}}}}, {"message 1", "'content'", "missing"});
  refused(json{{"messages", {{{"role", "system"}, {"content", "s"}}}}}, {"system message and nothing else"});
}

TEST(SftFormat, TruncationCutsTheInputFirstThenTheEnd) {
  const auto tok = byte_tok();
  SftExample e = encode_sft_example(json{{"input", "abcdef"}, {"output", "XY"}}, *tok, false);  // 6 + 1 + 2 + 1
  EXPECT_FALSE(truncate_sft_example(e, 10));
  ASSERT_TRUE(truncate_sft_example(e, 7));  // three of the input's end go
  EXPECT_EQ(e.tokens, concat({sft_bytes_of("abc "), sft_bytes_of("XY"), {257}}));
  EXPECT_EQ(answer_part(e), concat({sft_bytes_of("XY"), {257}}));
  ASSERT_TRUE(truncate_sft_example(e, 2));  // the input is gone, then the end of the example
  EXPECT_EQ(e.tokens, sft_bytes_of(" X"));
  EXPECT_EQ(answer_part(e), sft_bytes_of("X"));
  SftExample c = encode_sft_example(
      json{{"messages", {{{"role", "user"}, {"content", "q"}}, {{"role", "assistant"}, {"content", "abc"}}}}}, *tok,
      false);
  const std::vector<int32_t> whole = c.tokens;
  ASSERT_TRUE(truncate_sft_example(c, static_cast<int64_t>(whole.size()) - 2));  // a chat: the end
  EXPECT_EQ(c.tokens, std::vector<int32_t>(whole.begin(), whole.end() - 2));
  EXPECT_EQ(answer_part(c), sft_bytes_of("ab"));
}

// Goldens: NeMo's create_packing_strategy + first_fit_* + fill_packing_strategy written again in Python with
// numpy.random.RandomState(seed) as the RNG (numpy 1.24), for these lengths and packs of 8.
TEST(SftPacking, NemosAlgorithmsMatchNumpyGoldens) {
  const std::vector<int64_t> lengths = {3, 1, 4, 1, 5, 2, 6, 5, 3, 5, 8, 2, 7, 1, 4};
  using Bins = std::vector<std::vector<int64_t>>;
  const std::map<std::pair<PackingAlgorithm, uint32_t>, Bins> golden = {
      {{PackingAlgorithm::first_fit_shuffle, 1234}, {{12, 13}, {4, 1, 3}, {6, 5}, {10}, {7, 0}, {2, 14}, {9, 8}, {11}}},
      {{PackingAlgorithm::first_fit_shuffle, 7}, {{2, 0, 1}, {4, 3, 13}, {6, 5}, {10}, {12}, {14, 8}, {9, 11}, {7}}},
      {{PackingAlgorithm::first_fit_decreasing, 1234}, {{10}, {12, 13}, {6, 5}, {7, 0}, {9, 8}, {4, 11, 3}, {2, 14}, {1}}},
      {{PackingAlgorithm::first_fit_decreasing, 7}, {{10}, {12, 1}, {6, 5}, {4, 8}, {7, 0}, {9, 11, 3}, {14, 2}, {13}}},
  };
  for (const auto& [key, bins] : golden) {
    SCOPED_TRACE(fmt::format("{} seed {}", packing_algorithm_name(key.first), key.second));
    RandomStateMt rng(key.second);
    EXPECT_EQ(pack_examples(lengths, 8, key.first, rng), bins);
  }
}

TEST(SftPacking, EveryExampleOnceAndNoPackOverfull) {
  std::mt19937 gen(28);
  std::vector<int64_t> lengths(500);
  for (int64_t& l : lengths) l = 1 + static_cast<int64_t>(gen() % 64);
  for (const PackingAlgorithm a : {PackingAlgorithm::first_fit_shuffle, PackingAlgorithm::first_fit_decreasing}) {
    RandomStateMt rng(5);
    const auto bins = pack_examples(lengths, 64, a, rng);
    std::vector<int> seen(lengths.size(), 0);
    int64_t total = 0;
    for (const auto& b : bins) {
      int64_t fill = 0;
      for (const int64_t e : b) {
        ++seen[static_cast<size_t>(e)];
        fill += lengths[static_cast<size_t>(e)];
      }
      EXPECT_LE(fill, 64);
      total += fill;
    }
    EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    // First fit wastes less than half of every pack but one: no two packs could have been merged.
    EXPECT_LT(static_cast<int64_t>(bins.size()), 2 * (total + 63) / 64 + 1);
  }
  EXPECT_EQ(parse_packing_algorithm("first_fit_decreasing"), PackingAlgorithm::first_fit_decreasing);
  test::expect_one_line_error([] { parse_packing_algorithm("best_fit"); }, {"best_fit", "first_fit_shuffle"});
}

// A written set read back: every example exactly once across the packs, its inputs tokens [0, n-1), its labels the
// next token where that token is an answer, its positions 0.., the padding eod with no loss.
struct WrittenSet {
  test::TempDir dir;
  std::vector<SftExample> examples;
  std::string prefix;
  explicit WrittenSet(const std::vector<json>& objects) : prefix(test::write_sft_set(dir.path(), objects, &examples)) {}
};

std::vector<json> qa_objects(int n) {
  std::vector<json> v;
  for (int i = 0; i < n; ++i)
    v.push_back(json{{"input", fmt::format("question {}{}", i, std::string(static_cast<size_t>(i % 5), '?'))},
                     {"output", fmt::format("answer {}", i)}});
  return v;
}

TEST(SftDataset, PacksHoldEveryExampleWithShiftedMaskedLabels) {
  const WrittenSet w(qa_objects(12));
  const SftRecord rec = read_sft_record(w.prefix);
  EXPECT_EQ(rec.examples, 12);
  EXPECT_TRUE(is_sft_dataset(w.prefix));
  constexpr int64_t S = 48;
  const SftData d(w.prefix, "1,0,0", S, PackingAlgorithm::first_fit_shuffle, 1234);
  ASSERT_GT(d.packs(Split::train), 0);
  EXPECT_EQ(d.packs(Split::valid), 0);
  std::vector<int> seen(12, 0);
  std::vector<int32_t> tok(S), lab(S), pos(S);
  for (int64_t p = 0; p < d.packs(Split::train); ++p) {
    d.sample(Split::train, p, tok, lab, pos);
    int64_t at = 0;
    // An example's inputs are its tokens but the last (its eod, 257), so the first 257 starts the padding.
    while (at < S && tok[at] != 257) {
      // The example that starts here: find it by its tokens.
      ASSERT_EQ(pos[at], 0);
      int found = -1;
      for (size_t e = 0; e < w.examples.size(); ++e) {
        const auto& x = w.examples[e].tokens;
        const auto n = static_cast<int64_t>(x.size()) - 1;
        if (at + n <= S && std::equal(x.begin(), x.end() - 1, tok.begin() + at) &&
            (at + n == S || pos[at + n] == 0))
          found = static_cast<int>(e);
      }
      ASSERT_GE(found, 0) << "pack " << p << " position " << at;
      ++seen[static_cast<size_t>(found)];
      const SftExample& x = w.examples[static_cast<size_t>(found)];
      const auto n = static_cast<int64_t>(x.tokens.size()) - 1;
      for (int64_t t = 0; t < n; ++t) {
        EXPECT_EQ(pos[at + t], t);
        EXPECT_EQ(lab[at + t], x.answer[t + 1] ? x.tokens[t + 1] : kIgnoredLabel) << "position " << t;
      }
      at += n;
    }
    for (int64_t t = at; t < S; ++t) {  // the padding: one segment with no loss
      EXPECT_EQ(tok[t], 257);
      EXPECT_EQ(lab[t], kIgnoredLabel);
      EXPECT_EQ(pos[t], t - at);
    }
  }
  EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
  // Sample k is pack k mod packs: the packs again after the last.
  std::vector<int32_t> again(S), lab2(S), pos2(S);
  d.sample(Split::train, d.packs(Split::train), again, lab2, pos2);
  d.sample(Split::train, 0, tok, lab, pos);
  EXPECT_EQ(again, tok);
  // The document boundaries the model derives from the positions: one per example, one for the padding.
  std::vector<int32_t> off(S + 1);
  const int64_t docs = document_offsets_from_positions(pos, S, off);
  int64_t starts = 0;
  for (int64_t t = 0; t < S; ++t) starts += pos[t] == 0 ? 1 : 0;
  EXPECT_EQ(docs, starts);
  const std::vector<std::string> summary = d.summary();
  EXPECT_NE(summary[0].find("SFT dataset: 12 examples, packed into"), std::string::npos) << summary[0];
  EXPECT_NE(summary[0].find("sequences of 48 tokens, answer tokens"), std::string::npos) << summary[0];
}

TEST(SftDataset, SplitsAreOverExamplesAndLongExamplesAreCutAtLoad) {
  const WrittenSet w(qa_objects(40));
  const SftData d(w.prefix, "30,10,0", 64, PackingAlgorithm::first_fit_decreasing, 1);
  EXPECT_GT(d.packs(Split::train), 0);
  EXPECT_GT(d.packs(Split::valid), 0);
  EXPECT_EQ(d.packs(Split::test), 0);
  // Packs of 12 positions: every example (20 tokens or more) takes 12 positions, its end cut, and is counted.
  const SftData small(w.prefix, "1,0,0", 12, PackingAlgorithm::first_fit_shuffle, 1);
  const std::vector<std::string> s = small.summary();
  EXPECT_TRUE(std::any_of(s.begin(), s.end(), [](const std::string& l) {
    return l.find("longer than --seq-length + 1 = 13 tokens had their end cut") != std::string::npos;
  }));
}

TEST(SftDataset, FilesThatDoNotBelongTogetherAreRefused) {
  const WrittenSet w(qa_objects(4));
  {  // a mask of another run (same size, other bytes)
    std::fstream f(sft_loss_mask_path(w.prefix), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3);
    f.put('\x01');
  }
  test::expect_one_line_error([&] { SftData(w.prefix, "1,0,0", 32, PackingAlgorithm::first_fit_shuffle, 1); },
                              {".loss_mask", "checksum", "not from the same run"});
  std::filesystem::resize_file(sft_loss_mask_path(w.prefix), 5);
  test::expect_one_line_error([&] { SftData(w.prefix, "1,0,0", 32, PackingAlgorithm::first_fit_shuffle, 1); },
                              {".loss_mask", "5 bytes"});
  // The record gone, the mask left: half a set, refused rather than read as pretraining data (issue 38).
  std::filesystem::remove(sft_record_path(w.prefix));
  test::expect_one_line_error([&] { is_sft_dataset(w.prefix); }, {".loss_mask is there but", ".sft.json is missing"});
  std::filesystem::remove(sft_loss_mask_path(w.prefix));
  EXPECT_FALSE(is_sft_dataset(w.prefix));
}

}  // namespace
}  // namespace pl::data
