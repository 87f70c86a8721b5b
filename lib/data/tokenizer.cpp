// Byte and tiktoken (Llama 3) tokenizers. Facts followed (no code copied):
//   - meta-llama/llama-models models/llama3_1/api/tokenizer.py, first commit 1f0feb7 (2024-07-08,
//     the Llama 3.1 release): the pre-tokenizer regex `pat_str`, 256 special tokens after the base
//     ranks, their names and order, bos = <|begin_of_text|>, eos = <|end_of_text|>.
//   - openai/tiktoken: the tokenizer.model line format (base64 token, space, rank; empty lines
//     ignored) and the merge rule (lowest-rank adjacent pair first, leftmost on ties; a piece that
//     is a whole token maps straight to its rank); encode() with allowed_special="all" matches
//     special-token strings first and runs regex + BPE on the text between them.
// Not reproduced: llama-models' encode() also cuts its input into 400k-character chunks and runs of
// at most 25k consecutive (non-)whitespace characters to dodge a tiktoken crash; that changes the
// tokens only inside such pathological runs. Hugging Face's Llama 3 tokenizer does not cut either.
#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "io/file_checks.h"

namespace pl::data {

namespace {

// Llama 3's pre-tokenizer, llama-models `Tokenizer.pat_str` (identical in meta-llama/llama3):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
// with \s and \S spelled out as the Unicode White_Space set (U+0009..U+000D, U+0085 and \p{Z}),
// which is what \s means to tiktoken's Rust regex engine. PCRE2's \s with PCRE2_UCP also matches
// U+180E (whitespace before Unicode 6.3); a check against Python's `regex` module on random text
// found U+180E to be the only difference.
#define PL_WS "\\t\\n\\x0B\\f\\r\\x{85}\\p{Z}"
constexpr const char* kLlama3Pattern =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^" PL_WS "\\p{L}\\p{N}]+[\\r\\n]*|[" PL_WS
    "]*[\\r\\n]+|[" PL_WS "]+(?![^" PL_WS "])|[" PL_WS "]+";
#undef PL_WS

constexpr int kNumLlama3Specials = 256;
constexpr const char* kBeginOfText = "<|begin_of_text|>";
constexpr const char* kEndOfText = "<|end_of_text|>";

// Special-token string -> id, and the scan that splits text at special-token occurrences.
class SpecialTokens {
 public:
  void add(const std::string& name, int32_t id) { ids_.add(name, id); }
  int32_t id(std::string_view name) const { return ids_.rank(name); }

  // Calls on_text(segment) for ordinary text and on_special(id) for each special-token string,
  // in order. Every special has the form "<|name|>" (no "|>" inside), so a candidate is "<|" up to
  // the next "|>"; the leftmost occurrence of a known name wins, as with tiktoken's alternation.
  template <class OnText, class OnSpecial>
  void split(std::string_view text, OnText&& on_text, OnSpecial&& on_special) const {
    size_t done = 0, from = 0;
    while (true) {
      const size_t open = text.find("<|", from);
      if (open == std::string_view::npos) break;
      const size_t close = text.find("|>", open + 2);
      if (close == std::string_view::npos) break;
      const int32_t id = ids_.rank(text.substr(open, close + 2 - open));
      if (id < 0) {
        from = open + 1;
        continue;
      }
      if (open > done) on_text(text.substr(done, open - done));
      on_special(id);
      done = from = close + 2;
    }
    if (done < text.size()) on_text(text.substr(done));
  }

 private:
  BpeRanks ids_;  // (the same string_view-keyed map as the ranks)
};

void check_valid_utf8(std::string_view text) {
  const size_t bad = find_invalid_utf8(text);
  PL_CHECK(bad == std::string_view::npos, "invalid UTF-8 at byte offset {} (byte 0x{:02X})", bad,
           static_cast<unsigned char>(text[bad]));
}

// ---- byte -------------------------------------------------------------------------------------

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() {
    specials_.add(kBeginOfText, kBos);
    specials_.add(kEndOfText, kEod);
  }
  std::vector<int32_t> encode(std::string_view text) const override {
    check_valid_utf8(text);
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    specials_.split(
        text, [&](std::string_view s) { for (const char c : s) ids.push_back(static_cast<unsigned char>(c)); },
        [&](int32_t id) { ids.push_back(id); });
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (const int32_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
      else if (id == kBos) out += kBeginOfText;
      else if (id == kEod) out += kEndOfText;
      else fail("byte tokenizer: cannot decode id {} (vocabulary is [0, 258))", id);
    }
    return out;
  }
  int64_t vocab_size() const override { return 258; }
  int32_t eod() const override { return kEod; }
  int32_t bos() const override { return kBos; }
  int32_t special_id(std::string_view name) const override { return specials_.id(name); }
  std::string description() const override {
    return "byte (256 byte ids + <|begin_of_text|>=256, <|end_of_text|>=257; vocab 258)";
  }

 private:
  static constexpr int32_t kBos = 256, kEod = 257;
  SpecialTokens specials_;
};

// ---- tiktoken file ----------------------------------------------------------------------------

int base64_value(unsigned char c) {
  constexpr std::string_view kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const size_t v = kAlphabet.find(static_cast<char>(c));
  return v == std::string_view::npos ? -1 : static_cast<int>(v);
}

// Strict standard base64 (RFC 4648 alphabet, '=' padding only at the end); false when malformed.
bool decode_base64(std::string_view in, std::string& out) {
  out.clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  while (pad < 2 && in[in.size() - 1 - pad] == '=') ++pad;
  const size_t data = in.size() - pad;
  uint32_t acc = 0;
  int bits = 0;
  for (size_t i = 0; i < data; ++i) {
    const int v = base64_value(static_cast<unsigned char>(in[i]));
    if (v < 0) return false;
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back(static_cast<char>((acc >> bits) & 0xFF));
    }
  }
  // Leftover bits must be zero padding (a canonical encoding).
  return (acc & ((1u << bits) - 1)) == 0 && !out.empty();
}

bool parse_rank(std::string_view s, int32_t& rank) {
  if (s.empty() || s.size() > 10) return false;
  int64_t v = 0;
  for (const char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  if (v > std::numeric_limits<int32_t>::max()) return false;
  rank = static_cast<int32_t>(v);
  return true;
}

struct RankFile {
  BpeRanks ranks;
  std::vector<std::string> token_bytes;  // by rank
};

// Reads and validates a tiktoken rank file: every line "base64 rank"; ranks unique and exactly
// 0..N-1; tokens unique; every single byte a token (else BPE could end on a non-token).
// Nothing is sized by a rank read from the file: a line "YQ== 2000000000" must cost a line's memory,
// not a 2^31-entry table (the fuzzer's finding), so ranks are checked in a hash while reading and
// placed only after the token count N is known.
RankFile load_rank_file(const std::string& path) {
  RegularFileStream in(path);  // (io/file_checks.h: a FIFO or a directory is one line, not a hang)
  RankFile f;
  std::unordered_map<int32_t, int64_t> line_of_rank;
  std::vector<std::pair<int32_t, std::string>> rank_and_bytes;  // in file order
  int32_t max_rank = -1;
  std::string line, bytes;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    PL_CHECK(sp != std::string::npos && line.find(' ', sp + 1) == std::string::npos,
             "{}:{}: expected 'BASE64 RANK' (two fields separated by one space)", path, line_no);
    const std::string_view b64(line.data(), sp), rank_text(line.data() + sp + 1, line.size() - sp - 1);
    PL_CHECK(decode_base64(b64, bytes), "{}:{}: bad base64 token '{}'", path, line_no, b64);
    int32_t rank = 0;
    PL_CHECK(parse_rank(rank_text, rank), "{}:{}: bad rank '{}' (need an integer in [0, 2^31))", path, line_no,
             rank_text);
    const auto [first, is_new_rank] = line_of_rank.emplace(rank, line_no);
    PL_CHECK(is_new_rank, "{}:{}: duplicate rank {} (first on line {})", path, line_no, rank, first->second);
    const int32_t previous = f.ranks.rank(bytes);
    PL_CHECK(previous < 0, "{}:{}: duplicate token '{}' (already rank {})", path, line_no, b64, previous);
    f.ranks.add(bytes, rank);
    rank_and_bytes.emplace_back(rank, bytes);
    max_rank = std::max(max_rank, rank);
  }
  PL_CHECK(!in.bad(), "{}: read error", path);
  const size_t n = rank_and_bytes.size();
  PL_CHECK(n > 0, "{}: no tokens", path);
  if (static_cast<size_t>(max_rank) != n - 1) {  // ranks are unique, so some rank < n is missing
    int32_t missing = 0;
    while (line_of_rank.count(missing) != 0) ++missing;
    fail("{}:{}: rank {} leaves a gap: ranks must be exactly 0..{} ({} tokens) but rank {} is missing", path,
         line_of_rank.at(max_rank), max_rank, n - 1, n, missing);
  }
  f.token_bytes.resize(n);
  for (auto& [rank, token] : rank_and_bytes) f.token_bytes[static_cast<size_t>(rank)] = std::move(token);
  for (int b = 0; b < 256; ++b)
    PL_CHECK(f.ranks.rank(std::string(1, static_cast<char>(b))) >= 0,
             "{}: byte 0x{:02X} has no token (every single byte needs a rank)", path, b);
  return f;
}

// ---- PCRE2 ------------------------------------------------------------------------------------

struct CodeDeleter {
  void operator()(pcre2_code* c) const { pcre2_code_free(c); }
};
struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

std::string pcre2_message(int code) {
  std::array<PCRE2_UCHAR, 256> buf{};
  pcre2_get_error_message(code, buf.data(), buf.size());
  return std::string(reinterpret_cast<const char*>(buf.data()));
}

// Compiled once; JIT when the library has it (the interpreter otherwise: same matches, slower).
std::unique_ptr<pcre2_code, CodeDeleter> compile_pattern(const char* pattern) {
  int err = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_UCP, &err, &offset, nullptr);
  PL_CHECK(code != nullptr, "tokenizer regex does not compile at offset {}: {}", offset, pcre2_message(err));
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // failure is fine: pcre2_match then interprets
  return std::unique_ptr<pcre2_code, CodeDeleter>(code);
}

// One match-data block per thread; one ovector pair suffices since only the whole match is used.
pcre2_match_data* thread_match_data() {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create(1, nullptr));
  PL_CHECK(md != nullptr, "tokenizer: out of memory for PCRE2 match data");
  return md.get();
}

// Llama 3's pre-tokenizer: the regex compiled once, applied with per-thread match data.
class Llama3Splitter {
 public:
  Llama3Splitter() : regex_(compile_pattern(kLlama3Pattern)) {}

  // Calls on_piece(piece) for each regex match of `text` in order; `text` must be valid UTF-8.
  template <class OnPiece>
  void for_each_piece(std::string_view text, OnPiece&& on_piece) const {
    pcre2_match_data* md = thread_match_data();
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    while (pos < text.size()) {
      // Validated by the caller, so the per-call UTF check (which rescans the subject) is skipped.
      const int rc = pcre2_match(regex_.get(), subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;  // cannot happen: every character matches some branch
      PL_CHECK(rc >= 0, "tokenizer regex failed at byte {}: {}", pos, pcre2_message(rc));
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t begin = ov[0], end = ov[1];
      if (end == begin) {  // no branch matches empty text, but never loop forever
        ++pos;
        while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
        continue;
      }
      on_piece(text.substr(begin, end - begin));
      pos = end;
    }
  }

 private:
  std::unique_ptr<pcre2_code, CodeDeleter> regex_;
};

// ---- tiktoken ---------------------------------------------------------------------------------

// Pieces up to this many bytes use the simple quadratic merge (fast for the short pieces that make
// up almost all text); longer ones (long runs of spaces or punctuation) use the heap.
constexpr size_t kHeapMergeMinBytes = 96;

class TiktokenTokenizer final : public Tokenizer {
 public:
  explicit TiktokenTokenizer(const std::string& path) : path_(path) {
    RankFile f = load_rank_file(path);
    ranks_ = std::move(f.ranks);
    token_bytes_ = std::move(f.token_bytes);
    num_base_ = static_cast<int32_t>(token_bytes_.size());
    const auto& names = llama3_special_tokens();
    for (size_t i = 0; i < names.size(); ++i) specials_.add(names[i], num_base_ + static_cast<int32_t>(i));
    bos_ = specials_.id(kBeginOfText);
    eod_ = specials_.id(kEndOfText);
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    check_valid_utf8(text);
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 8);
    // Between the specials: regex pieces, each to its rank or its merged ranks.
    const auto on_piece = [&](std::string_view piece) { encode_piece(piece, ids); };
    specials_.split(
        text, [&](std::string_view s) { splitter_.for_each_piece(s, on_piece); }, [&](int32_t id) { ids.push_back(id); });
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    const auto& names = llama3_special_tokens();
    for (const int32_t id : ids) {
      PL_CHECK(id >= 0 && id < vocab_size(), "tiktoken tokenizer: cannot decode id {} (vocabulary is [0, {}))", id,
               vocab_size());
      if (id < num_base_) out += token_bytes_[static_cast<size_t>(id)];
      else out += names[static_cast<size_t>(id - num_base_)];
    }
    return out;
  }
  int64_t vocab_size() const override { return int64_t{num_base_} + kNumLlama3Specials; }
  int32_t eod() const override { return eod_; }
  int32_t bos() const override { return bos_; }
  int32_t special_id(std::string_view name) const override { return specials_.id(name); }
  std::string description() const override {
    return fmt::format("tiktoken {} ({} ranks + {} Llama 3.1 specials = {} ids)", path_, num_base_,
                       kNumLlama3Specials, vocab_size());
  }

 private:
  void encode_piece(std::string_view piece, std::vector<int32_t>& ids) const {
    const int32_t whole = ranks_.rank(piece);
    if (whole >= 0) ids.push_back(whole);
    else byte_pair_merge(piece, ranks_, piece.size() >= kHeapMergeMinBytes, ids);
  }

  std::string path_;
  Llama3Splitter splitter_;
  BpeRanks ranks_;
  std::vector<std::string> token_bytes_;
  int32_t num_base_ = 0, bos_ = 0, eod_ = 0;
  SpecialTokens specials_;
};

constexpr int32_t kNoRank = std::numeric_limits<int32_t>::max();

int32_t rank_or_none(const BpeRanks& ranks, std::string_view piece, size_t begin, size_t end) {
  const int32_t r = ranks.rank(piece.substr(begin, end - begin));
  return r < 0 ? kNoRank : r;
}

int32_t part_rank(const BpeRanks& ranks, std::string_view part) {
  const int32_t r = ranks.rank(part);
  PL_CHECK(r >= 0, "tokenizer: merged part of {} bytes has no rank (single bytes must all be tokens)", part.size());
  return r;
}

// Quadratic merge: fine for short pieces; scratch vectors are per thread to avoid allocations.
void merge_by_scan(std::string_view piece, const BpeRanks& ranks, std::vector<int32_t>& out) {
  thread_local std::vector<size_t> starts;  // part k spans [starts[k], starts[k+1])
  thread_local std::vector<int32_t> pair;   // pair[k]: rank of part k joined with part k+1
  const size_t n = piece.size();
  starts.resize(n + 1);
  for (size_t i = 0; i <= n; ++i) starts[i] = i;
  pair.resize(n - 1);
  for (size_t k = 0; k + 1 < n; ++k) pair[k] = rank_or_none(ranks, piece, k, k + 2);
  while (!pair.empty()) {
    const auto best = std::min_element(pair.begin(), pair.end());  // first of the minima = leftmost
    if (*best == kNoRank) break;
    const size_t k = static_cast<size_t>(best - pair.begin());
    starts.erase(starts.begin() + static_cast<std::ptrdiff_t>(k) + 1);
    pair.erase(pair.begin() + static_cast<std::ptrdiff_t>(k));
    if (k + 2 < starts.size()) pair[k] = rank_or_none(ranks, piece, starts[k], starts[k + 2]);
    if (k > 0) pair[k - 1] = rank_or_none(ranks, piece, starts[k - 1], starts[k + 1]);
  }
  for (size_t k = 0; k + 1 < starts.size(); ++k)
    out.push_back(part_rank(ranks, piece.substr(starts[k], starts[k + 1] - starts[k])));
}

// O(n log n) merge: parts in a linked list, candidate pairs in a min-heap ordered by (rank, start).
// A part's start never changes (a merge keeps the left start), so the smallest start among equal
// ranks is the leftmost pair, the rule of merge_by_scan. Stale heap entries are recognised by a
// per-part version bumped whenever the pair starting at that part changes.
void merge_by_heap(std::string_view piece, const BpeRanks& ranks, std::vector<int32_t>& out) {
  const size_t n = piece.size();
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<size_t> next(n), prev(n);
  std::vector<uint32_t> version(n, 0);
  std::vector<char> alive(n, 1);
  for (size_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : kNone;
    prev[i] = i > 0 ? i - 1 : kNone;
  }
  auto end_of = [&](size_t k) { return next[k] == kNone ? n : next[k]; };
  struct Cand {
    int32_t rank;
    size_t start;
    uint32_t version;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : start > o.start; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push_pair = [&](size_t k) {  // the pair (k, next[k]) if it is a token
    if (next[k] == kNone) return;
    const int32_t r = rank_or_none(ranks, piece, k, end_of(next[k]));
    if (r != kNoRank) heap.push({r, k, version[k]});
  };
  for (size_t k = 0; k < n; ++k) push_pair(k);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    if (!alive[c.start] || version[c.start] != c.version) continue;
    const size_t right = next[c.start];
    alive[right] = 0;
    next[c.start] = next[right];
    if (next[right] != kNone) prev[next[right]] = c.start;
    ++version[c.start];
    push_pair(c.start);
    if (prev[c.start] != kNone) {
      ++version[prev[c.start]];
      push_pair(prev[c.start]);
    }
  }
  for (size_t k = 0; k != kNone; k = next[k]) out.push_back(part_rank(ranks, piece.substr(k, end_of(k) - k)));
}

}  // namespace

void byte_pair_merge(std::string_view piece, const BpeRanks& ranks, bool use_heap, std::vector<int32_t>& out) {
  if (piece.empty()) return;
  if (piece.size() == 1) {
    out.push_back(part_rank(ranks, piece));
    return;
  }
  if (use_heap) merge_by_heap(piece, ranks, out);
  else merge_by_scan(piece, ranks, out);
}

std::vector<std::string> llama3_pretokenize(std::string_view text) {
  static const Llama3Splitter splitter;
  check_valid_utf8(text);
  std::vector<std::string> pieces;
  splitter.for_each_piece(text, [&](std::string_view p) { pieces.emplace_back(p); });
  return pieces;
}

const std::vector<std::string>& llama3_special_tokens() {
  // llama-models 1f0feb7 models/llama3_1/api/tokenizer.py: 11 named tokens, then
  // <|reserved_special_token_{2 + i}|> up to 256 in all. (Hugging Face's Llama 3.1 tokenizer.json
  // names id base+5 <|reserved_special_token_2|> instead of <|step_id|> and numbers the reserved
  // tokens from 3; the ids of every named token used here agree.)
  static const std::vector<std::string> names = [] {
    std::vector<std::string> v = {"<|begin_of_text|>",  "<|end_of_text|>",      "<|reserved_special_token_0|>",
                                  "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|step_id|>",
                                  "<|start_header_id|>", "<|end_header_id|>",  "<|eom_id|>",
                                  "<|eot_id|>",         "<|python_tag|>"};
    for (size_t i = 0; v.size() < static_cast<size_t>(kNumLlama3Specials); ++i)
      v.push_back(fmt::format("<|reserved_special_token_{}|>", 2 + i));
    return v;
  }();
  return names;
}

size_t find_invalid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t cp = 0, min = 0;
    if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
    else return i;
    if (i + len > n) return i;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return i;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
    i += len;
  }
  return std::string_view::npos;
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& type, const std::string& model_path) {
  if (type == "byte") {
    PL_CHECK(model_path.empty(), "--tokenizer-model {}: the byte tokenizer takes no model file", model_path);
    return std::make_unique<ByteTokenizer>();
  }
  if (type == "tiktoken") {
    PL_CHECK(!model_path.empty(), "the tiktoken tokenizer needs --tokenizer-model (Llama 3's tokenizer.model)");
    return std::make_unique<TiktokenTokenizer>(model_path);
  }
  fail("tokenizer type '{}' is unknown (use byte or tiktoken)", type);
}

}  // namespace pl::data
