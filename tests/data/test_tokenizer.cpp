// Tokenizers: the byte tokenizer, the Llama 3 pre-tokenizer regex, tiktoken's merge rule on a tiny
// hand-made rank file, special tokens inside text, and rejection of corrupt rank files.
#include "data/test_tokenizer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "test_util.h"

namespace {

using pl::data::make_tokenizer;
using TokenizerIds = std::vector<int32_t>;

TEST(Tokenizer, ByteIdsAreTheUtf8BytesAndSpecialsAre256And257) {
  const auto tok = make_tokenizer("byte", "");
  EXPECT_EQ(tok->vocab_size(), 258);
  EXPECT_EQ(tok->bos(), 256);
  EXPECT_EQ(tok->eod(), 257);
  EXPECT_EQ(tok->encode("hé"), (TokenizerIds{104, 0xC3, 0xA9}));
  EXPECT_EQ(tok->encode(""), TokenizerIds{});
  EXPECT_EQ(tok->encode("a<|begin_of_text|>b<|end_of_text|>"), (TokenizerIds{97, 256, 98, 257}));
  // Not a special of the byte tokenizer: plain bytes.
  EXPECT_EQ(tok->encode("<|eot_id|>").size(), 10u);
  const std::string text = "Grüße, 世界!\n<|end_of_text|>x";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
  pl::test::expect_one_line_error([&] { tok->decode(TokenizerIds{258}); }, {"258"});
}

TEST(Tokenizer, InvalidUtf8IsAOneLineErrorWithTheOffset) {
  const auto tok = make_tokenizer("byte", "");
  pl::test::expect_one_line_error([&] { tok->encode(std::string("ab\xFF")); }, {"invalid UTF-8", "offset 2"});
  EXPECT_EQ(pl::data::find_invalid_utf8("ok é 世 😀"), std::string_view::npos);
  EXPECT_EQ(pl::data::find_invalid_utf8("\xC0\xAF"), 0u);          // overlong '/'
  EXPECT_EQ(pl::data::find_invalid_utf8("a\xED\xA0\x80"), 1u);     // surrogate U+D800
  EXPECT_EQ(pl::data::find_invalid_utf8("ab\xF4\x90\x80\x80"), 2u);  // U+110000
  EXPECT_EQ(pl::data::find_invalid_utf8("abc\xE4\xB8"), 3u);       // truncated
}

TEST(Tokenizer, Llama3RegexSplitsContractionsDigitsWhitespaceAndNewlines) {
  using V = std::vector<std::string>;
  const auto split = pl::data::llama3_pretokenize;
  EXPECT_EQ(split("he's here"), (V{"he", "'s", " here"}));
  // Contractions are case-insensitive and take precedence over "'" + letters.
  EXPECT_EQ(split("WE'LL"), (V{"WE", "'LL"}));
  EXPECT_EQ(split("'LLama"), (V{"'LL", "ama"}));
  EXPECT_EQ(split("12345"), (V{"123", "45"}));
  EXPECT_EQ(split("a   b"), (V{"a", "  ", " b"}));
  EXPECT_EQ(split("a  "), (V{"a", "  "}));
  EXPECT_EQ(split("a\n\nb"), (V{"a", "\n\n", "b"}));
  EXPECT_EQ(split("hi \n there"), (V{"hi", " \n", " there"}));
  EXPECT_EQ(split("Hello, world!"), (V{"Hello", ",", " world", "!"}));
  EXPECT_EQ(split("x=1;\r\n"), (V{"x", "=", "1", ";\r\n"}));
  EXPECT_EQ(split("naïve café 2024"), (V{"naïve", " café", " ", "202", "4"}));
}

class TokenizerTinyTiktoken : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = dir_.write("tiny.model", pl::test::tiny_rank_file());
    tok_ = make_tokenizer("tiktoken", path_);
  }
  pl::test::TempDir dir_;
  std::string path_;
  std::unique_ptr<pl::data::Tokenizer> tok_;
};

TEST_F(TokenizerTinyTiktoken, VocabularyIsTheRanksPlus256Specials) {
  EXPECT_EQ(tok_->vocab_size(), pl::test::kTinyVocab);
  EXPECT_EQ(tok_->bos(), pl::test::kTinyBase);
  EXPECT_EQ(tok_->eod(), pl::test::kTinyBase + 1);
  EXPECT_NE(tok_->description().find("264 ranks"), std::string::npos) << tok_->description();
}

TEST_F(TokenizerTinyTiktoken, MergesFollowRankOrderNotLeftToRight) {
  // "abc": "bc" (256) outranks "ab" (257), so b+c merges first; a left-to-right greedy merge would
  // give [ab, c] = [257, 99].
  EXPECT_EQ(tok_->encode("abc"), (TokenizerIds{97, 256}));
  EXPECT_EQ(tok_->encode("abcbc"), (TokenizerIds{97, 256, 256}));
  EXPECT_EQ(tok_->encode("ab"), TokenizerIds{257});
  // he (261) and ll (262) first, then he+ll = hell (263); "hello" itself is no token.
  EXPECT_EQ(tok_->encode("hello"), (TokenizerIds{263, 'o'}));
}

TEST_F(TokenizerTinyTiktoken, AWholePieceThatIsATokenMapsToItsRank) {
  // Neither "xy" nor "yz" is a token, so only the whole-piece lookup yields "xyz".
  EXPECT_EQ(tok_->encode("xyz"), TokenizerIds{258});
  EXPECT_EQ(tok_->encode("xyzz"), (TokenizerIds{'x', 'y', 'z', 'z'}));
  EXPECT_EQ(tok_->encode("a   b"), (TokenizerIds{97, 259, 260}));  // pieces "a", "  ", " b"
}

TEST_F(TokenizerTinyTiktoken, SpecialTokenStringsInTextBecomeTheirIds) {
  const int32_t base = pl::test::kTinyBase;
  EXPECT_EQ(tok_->encode("ab<|eot_id|>abc"), (TokenizerIds{257, base + 9, 97, 256}));
  EXPECT_EQ(tok_->encode("<|begin_of_text|><|end_of_text|>"), (TokenizerIds{base, base + 1}));
  EXPECT_EQ(tok_->encode("<|step_id|>"), TokenizerIds{base + 5});
  EXPECT_EQ(tok_->encode("<|reserved_special_token_2|>"), TokenizerIds{base + 11});
  EXPECT_EQ(tok_->encode("<|reserved_special_token_246|>"), TokenizerIds{base + 255});
  // Not a special: ordinary text (pieces "<|", "no", "|>"), and "<|<|eot_id|>" finds the special.
  EXPECT_EQ(tok_->encode("<|no|>"), (TokenizerIds{'<', '|', 'n', 'o', '|', '>'}));
  EXPECT_EQ(tok_->encode("<|<|eot_id|>"), (TokenizerIds{'<', '|', base + 9}));
  const auto& names = pl::data::llama3_special_tokens();
  ASSERT_EQ(names.size(), 256u);
  EXPECT_EQ(names[4], "<|finetune_right_pad_id|>");
  EXPECT_EQ(names[10], "<|python_tag|>");
  EXPECT_EQ(names[255], "<|reserved_special_token_246|>");
}

TEST_F(TokenizerTinyTiktoken, DecodeInvertsEncode) {
  const std::string text = "Hello, he'll call abc\n\n  xyz 12345 <|eot_id|> naïve 世界";
  EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
  pl::test::expect_one_line_error([&] { tok_->decode(TokenizerIds{pl::test::kTinyVocab}); }, {"cannot decode"});
}

TEST_F(TokenizerTinyTiktoken, HeapAndScanMergesAgreeOnLongPieces) {
  pl::data::BpeRanks ranks;
  for (int b = 0; b < 256; ++b) ranks.add(std::string(1, static_cast<char>(b)), b);
  const std::vector<std::string> merges = {"ab", "ba", "aa", "abab", "bb", "aab", "baab", "ababab", "bba"};
  for (size_t i = 0; i < merges.size(); ++i) ranks.add(merges[i], 256 + static_cast<int32_t>(i));
  std::mt19937 rng(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::string piece(1 + rng() % 300, 'a');
    for (char& c : piece) c = rng() % 3 == 0 ? 'b' : 'a';
    TokenizerIds scan, heap;
    pl::data::byte_pair_merge(piece, ranks, false, scan);
    pl::data::byte_pair_merge(piece, ranks, true, heap);
    ASSERT_EQ(scan, heap) << piece;
  }
  TokenizerIds heap;
  pl::data::BpeRanks abc;
  for (int b = 0; b < 256; ++b) abc.add(std::string(1, static_cast<char>(b)), b);
  abc.add("bc", 256);
  abc.add("ab", 257);
  pl::data::byte_pair_merge("abcbc", abc, true, heap);
  EXPECT_EQ(heap, (TokenizerIds{97, 256, 256}));
}

TEST(Tokenizer, CorruptRankFilesAreRejectedWithFileAndLine) {
  pl::test::TempDir dir;
  const std::string good = pl::test::tiny_rank_file();
  auto with_line = [&](const std::string& extra) { return good + extra + "\n"; };
  const std::string a = pl::test::base64("a"), qq = pl::test::base64("qq");
  struct Case {
    std::string text;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {with_line("!!!! 264"), {":265:", "bad base64"}},
      {with_line("cXE 264"), {":265:", "bad base64"}},  // length not a multiple of 4
      {with_line(qq + " x1"), {":265:", "bad rank"}},
      {with_line(qq + " 3"), {":265:", "duplicate rank 3", "line 4"}},
      {with_line(a + " 264"), {":265:", "duplicate token"}},
      {with_line(qq + " 300"), {":265:", "rank 300 leaves a gap", "264 is missing"}},
      // A rank near 2^31 is a gap like any other; it must not size a table (the fuzzer's 11 GB malloc).
      {with_line(qq + " 2147483647"), {":265:", "rank 2147483647 leaves a gap", "264 is missing"}},
      {with_line(qq + "  264"), {":265:", "BASE64 RANK"}},
      {"YQ== 0\n", {"byte 0x00 has no token"}},
  };
  for (const Case& c : cases) {
    const std::string path = dir.write("bad.model", c.text);
    std::vector<std::string> needles = c.needles;
    needles.push_back(path);
    pl::test::expect_one_line_error([&] { make_tokenizer("tiktoken", path); }, needles);
  }
  pl::test::expect_one_line_error([&] { make_tokenizer("tiktoken", (dir.path() / "none").string()); },
                                  {"cannot open"});
  pl::test::expect_one_line_error([&] { make_tokenizer("tiktoken", ""); }, {"--tokenizer-model"});
  pl::test::expect_one_line_error([&] { make_tokenizer("sentencepiece", ""); }, {"unknown"});
}

}  // namespace
