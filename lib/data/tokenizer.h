#pragma once
// Tokenizers for preprocess_data: text -> token ids, knowing no device.
//   byte      ids 0..255 are the bytes of the UTF-8 text, then two specials (vocab 258); needs no file.
//   tiktoken  Llama 3's tokenizer.model (one "base64(token bytes) rank" per line): the Llama 3
//             pre-tokenizer regex, then byte-pair merges by rank, then Llama 3.1's 256 specials.
// Special-token strings that occur in the text are encoded as their ids (what the Hugging Face
// Llama 3 tokenizer does by default, and tiktoken with allowed_special="all").
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pl::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Token ids of `text`, which must be valid UTF-8 (else a one-line pl::Error giving the byte
  // offset). No BOS/EOD is added. Thread-safe.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // The text of `ids` (specials as their strings); for inspection. Unknown ids are an error.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;  // <|end_of_text|>
  virtual int32_t bos() const = 0;  // <|begin_of_text|>
  // The id of the special token `name` ("<|eot_id|>"), or -1 when this tokenizer has no such special.
  virtual int32_t special_id(std::string_view name) const = 0;
  // One line, e.g. "tiktoken tokenizer.model (128000 ranks + 256 specials = 128256)".
  virtual std::string description() const = 0;
};

// type "byte" (model_path must be empty) or "tiktoken" (model_path required). Errors are one line.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path);

// The 256 special tokens appended after the base vocabulary, in id order (Llama 3.1).
const std::vector<std::string>& llama3_special_tokens();

// The pieces Llama 3's pre-tokenizer regex cuts `text` into (before BPE; no special-token handling).
std::vector<std::string> llama3_pretokenize(std::string_view text);

// Byte offset of the first invalid UTF-8 sequence in `s` (overlong forms, surrogates and code
// points above U+10FFFF are invalid), or std::string_view::npos when `s` is valid.
size_t find_invalid_utf8(std::string_view s);

// Token bytes -> rank, looked up by string_view without building a std::string (the BPE hot loop).
class BpeRanks {
 public:
  // False when `bytes` is already present (the map is left unchanged).
  bool add(std::string bytes, int32_t rank) { return map_.emplace(std::move(bytes), rank).second; }
  // The rank of `bytes`, or -1.
  int32_t rank(std::string_view bytes) const {
    const auto it = map_.find(bytes);
    return it == map_.end() ? -1 : it->second;
  }
  size_t size() const { return map_.size(); }
  void reserve(size_t n) { map_.reserve(n); }

 private:
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> map_;
};

// Byte-pair merge of one pre-tokenized piece, tiktoken's rule: start from single bytes and
// repeatedly merge the adjacent pair whose concatenation has the lowest rank (leftmost on ties)
// until no adjacent pair is a token. Every single byte must have a rank. Appends the ranks of the
// final parts to `out`. Exposed for tests; `use_heap` picks the O(n log n) variant used for
// long pieces (both give the same result).
void byte_pair_merge(std::string_view piece, const BpeRanks& ranks, bool use_heap, std::vector<int32_t>& out);

}  // namespace pl::data
