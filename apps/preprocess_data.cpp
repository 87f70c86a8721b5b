// preprocess_data: tokenize JSON-lines or plain-text documents into a Megatron indexed dataset
// ("<prefix>_<key>_document.bin/.idx") plus a sidecar "<prefix>_<key>_document.tokenizer.json".
// Followed: Megatron-LM tools/preprocess_data.py at the pinned commit d7288711 (flag names, output
// names, Encoder.encode: a document whose text tokenizes to nothing gets no eod and no sequence,
// only a document boundary; --append-eod adds eod to every other document; the progress line).
//
//   preprocess_data --input corpus.jsonl --output-prefix data/my --tokenizer-type tiktoken
//                   --tokenizer-model tokenizer.model --append-eod --workers 8
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "app_main.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/json_text.h"
#include "data/indexed_dataset.h"
#include "data/sft_dataset.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"

namespace {

using namespace pl;
using pl::data::Tokenizer;

constexpr const char* kDescription =
    "preprocess_data: tokenize documents into a Megatron indexed dataset (.bin/.idx), as Megatron-LM's\n"
    "tools/preprocess_data.py does, without Python.\n"
    "\n"
    "  preprocess_data --input FILE [FILE...] --output-prefix PREFIX --tokenizer-type byte|tiktoken\n"
    "                  [--tokenizer-model tokenizer.model] [--append-eod] [--workers N]\n"
    "  preprocess_data --dataset-type sft --input chats.jsonl --output-prefix data/sft --tokenizer-type byte\n"
    "                  [--max-seq-length N [--overlong truncate|drop]]\n";

constexpr const char* kFooter =
    "Input: JSON lines (one object per line; the text is the string under each --json-keys key; blank\n"
    "lines are skipped) or plain text (--text-document paragraph: blank-line separated paragraphs are\n"
    "documents; line: every line; file: the whole file; whitespace-only documents are skipped). Files\n"
    "are read in the order given; --input-format auto takes .json/.jsonl as JSON lines, else text.\n"
    "Text must be UTF-8. Tokenizers:\n"
    "  byte      ids 0..255 = the UTF-8 bytes, <|begin_of_text|> = 256, <|end_of_text|> = 257 (eod)\n"
    "  tiktoken  a Llama 3 tokenizer.model (base64 token + rank per line), Llama 3's regex and BPE,\n"
    "            then 256 Llama 3.1 special tokens (<|begin_of_text|> = N, <|end_of_text|> = N+1 = eod)\n"
    "Special-token strings in the text become their ids. A document that tokenizes to nothing adds no\n"
    "sequence (Megatron records only a document boundary for it) and gets no eod.\n"
    "--prepend-bos puts <|begin_of_text|> first in every document: Megatron with a Hugging Face Llama 3\n"
    "tokenizer (HuggingFaceTokenizer, special tokens included, its default) does that.\n"
    "\n"
    "Outputs, for each key K (K = text for plain text), written only when everything succeeded:\n"
    "  PREFIX_K_document.bin/.idx        token ids, dtype uint16 if the vocabulary is < 65500, else int32\n"
    "  PREFIX_K_document.tokenizer.json  the tokenizer (type, model file path, size and FNV-1a 64,\n"
    "                                    vocab_size, eod, bos, append_eod, prepend_bos)\n"
    "They replace earlier outputs as one set: all are written and synced under temporary names first,\n"
    "so a failure (or kill) leaves the previous files intact; an interrupted replacement is completed\n"
    "or undone by the next run (one line on stderr says which).\n"
    "Pass PREFIX_K_document as the data path. Progress goes to stderr every --log-interval documents;\n"
    "one summary line per key goes to stdout. The output is the same for any --workers.\n"
    "\n"
    "--dataset-type sft (supervised fine-tuning): JSON lines, each {\"input\": ..., \"output\": ...} (NeMo's SFT\n"
    "format: ids(input) + ids(\" \") + ids(output) + eod) or {\"messages\": [{\"role\", \"content\"}, ...]} (an\n"
    "optional system message, then user and assistant alternating, ending with assistant; the Llama 3 chat\n"
    "template with a tiktoken tokenizer, a plain one with the byte tokenizer). Writes exactly PREFIX.bin/.idx (one\n"
    "example per document), PREFIX.loss_mask (a byte per token: 1 for the answers and the end token after each,\n"
    "the tokens the loss learns), PREFIX.sft.json and PREFIX.tokenizer.json; pass PREFIX as --data-path.\n"
    "--max-seq-length N: an example of more than N tokens is truncated (its input first, then its end, as NeMo)\n"
    "or, with --overlong drop, left out; both are counted in the summary line.\n"
    "\n"
    "Exit status: 0 success; 1 error (one line on stderr, naming FILE:LINE for a bad document);\n"
    "2 bad command line.";

struct Options {
  std::vector<std::string> inputs;
  std::string output_prefix;
  std::string tokenizer_type;
  std::string tokenizer_model;
  std::vector<std::string> json_keys{"text"};
  std::string input_format = "auto";
  std::string text_document = "paragraph";
  bool append_eod = false;
  bool prepend_bos = false;
  int workers = 1;
  int64_t log_interval = 1000;
  std::string dataset_type = "pretrain";  // pretrain | sft
  int64_t max_seq_length = 0;             // sft: 0 = no limit (the flag left out; 0 given is refused)
  std::string overlong = "truncate";      // sft: truncate | drop
  bool max_seq_length_given = false, overlong_given = false;
  bool sft() const { return dataset_type == "sft"; }
};

enum class Format { jsonl, text };

Format format_of(const std::string& path, const std::string& input_format) {
  if (input_format == "jsonl") return Format::jsonl;
  if (input_format == "text") return Format::text;
  const std::string ext = std::filesystem::path(path).extension().string();
  return ext == ".json" || ext == ".jsonl" ? Format::jsonl : Format::text;
}

// One document as read: its raw text (a JSON line, or the plain text itself) and where it starts.
struct RawDocument {
  const std::string* file = nullptr;
  int64_t line = 0;
  Format format = Format::text;
  std::string raw;
};

bool is_blank(std::string_view s) { return s.find_first_not_of(" \t\r\n\f\v") == std::string_view::npos; }

// Streams documents from the input files in order, a batch at a time.
class DocumentReader {
 public:
  DocumentReader(const std::vector<std::string>& files, const Options& o) : files_(files), o_(o) {}

  // Appends up to `max_docs` documents (or about `max_bytes`); false when the inputs are exhausted.
  bool next_batch(std::vector<RawDocument>& batch, size_t max_docs, size_t max_bytes) {
    batch.clear();
    size_t bytes = 0;
    while (batch.size() < max_docs && bytes < max_bytes) {
      if (in_ == nullptr && !open_next()) break;
      RawDocument d;
      if (!read_document(d)) {
        in_.reset();
        continue;
      }
      bytes += d.raw.size();
      batch.push_back(std::move(d));
    }
    return !batch.empty();
  }

 private:
  bool open_next() {
    if (next_file_ >= files_.size()) return false;
    file_ = &files_[next_file_++];
    in_ = std::make_unique<RegularFileStream>(*file_);  // checked again on the descriptor that is read
    format_ = format_of(*file_, o_.input_format);
    line_ = 0;
    return true;
  }

  bool getline(std::string& line) {
    if (!std::getline(*in_, line)) {
      PL_CHECK(!in_->bad(), "{}: read error", *file_);
      return false;
    }
    ++line_;
    return true;
  }

  bool read_document(RawDocument& d) {
    d.file = file_;
    d.format = format_;
    std::string line;
    if (format_ == Format::jsonl || o_.text_document == "line") {
      while (getline(line)) {
        if (is_blank(line)) continue;
        d.line = line_;
        d.raw = std::move(line);
        return true;
      }
      return false;
    }
    if (o_.text_document == "file") {
      if (line_ != 0) return false;
      d.line = 1;
      d.raw.assign(std::istreambuf_iterator<char>(*in_), std::istreambuf_iterator<char>());
      PL_CHECK(!in_->bad(), "{}: read error", *file_);
      line_ = 1;
      return !is_blank(d.raw);
    }
    // paragraph: the lines up to the next blank line, joined with '\n'
    while (getline(line)) {
      if (is_blank(line)) {
        if (d.raw.empty()) continue;
        return true;
      }
      if (d.raw.empty()) d.line = line_;
      else d.raw.push_back('\n');
      d.raw += line;
    }
    return !d.raw.empty();
  }

  const std::vector<std::string>& files_;
  const Options& o_;
  size_t next_file_ = 0;
  const std::string* file_ = nullptr;
  std::unique_ptr<RegularFileStream> in_;
  Format format_ = Format::text;
  int64_t line_ = 0;
};

// The text under `key` of a JSON line; errors name FILE:LINE.
std::string json_text(const RawDocument& d, const std::string& key, const nlohmann::json& j) {
  const auto it = j.find(key);
  PL_CHECK(it != j.end(), "{}:{}: key '{}' is missing", *d.file, d.line, key);
  PL_CHECK(it->is_string(), "{}:{}: key '{}' is a {}, expected a string", *d.file, d.line, key, it->type_name());
  return it->get<std::string>();
}

// Token ids of one document for each key (Encoder.encode): [bos] + encode(text) [+ eod if non-empty].
std::vector<std::vector<int32_t>> encode_document(const RawDocument& d, const Options& o, const Tokenizer& tok) {
  std::vector<std::string> texts;
  if (d.format == Format::jsonl) {
    const nlohmann::json j = parse_json_text(d.raw, fmt::format("{}:{}", *d.file, d.line));
    PL_CHECK(j.is_object(), "{}:{}: expected a JSON object, found a {}", *d.file, d.line, j.type_name());
    for (const std::string& key : o.json_keys) texts.push_back(json_text(d, key, j));
  } else {
    texts.push_back(d.raw);
  }
  std::vector<std::vector<int32_t>> out;
  for (const std::string& text : texts) {
    std::vector<int32_t> ids;
    if (o.prepend_bos) ids.push_back(tok.bos());
    try {
      const std::vector<int32_t> body = tok.encode(text);
      ids.insert(ids.end(), body.begin(), body.end());
    } catch (const pl::Error& e) {
      fail("{}:{}: {}", *d.file, d.line, e.what());
    }
    if (!ids.empty() && o.append_eod) ids.push_back(tok.eod());
    out.push_back(std::move(ids));
  }
  return out;
}

struct Encoded {
  std::vector<std::vector<int32_t>> ids;  // per key
  std::string error;                      // non-empty when the document failed
};

// Runs encode(batch[i]) -> out[i] on `workers` threads (an error is kept in out[i].error); results land in input
// order, so the output is the same for any number of workers.
template <class Out, class Encode>
void encode_parallel(const std::vector<RawDocument>& batch, int workers, std::vector<Out>& out, Encode&& encode) {
  out.assign(batch.size(), Out{});
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < batch.size(); i = next.fetch_add(1)) {
      try {
        encode(batch[i], out[i]);
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    }
  };
  const size_t helpers = std::min<size_t>(static_cast<size_t>(workers) - 1, batch.size());
  std::vector<std::thread> threads;
  try {
    for (size_t t = 0; t < helpers; ++t) threads.emplace_back(work);
  } catch (const std::system_error& e) {
    // Out of threads: let the started ones finish (a joinable thread must not be destroyed).
    for (std::thread& t : threads) t.join();
    fail("--workers {}: could only start {} threads ({})", workers, threads.size() + 1, e.what());
  }
  work();
  for (std::thread& t : threads) t.join();
}


std::string output_prefix_for(const Options& o, const std::string& key) {
  return fmt::format("{}_{}_document", o.output_prefix, key);
}

// The flags of the other dataset type are refused in one line, not ignored.
void check_sft_options(const Options& o) {
  if (!o.sft()) {
    PL_CHECK(!o.max_seq_length_given && !o.overlong_given,
             "--max-seq-length and --overlong apply to --dataset-type sft");
    return;
  }
  PL_CHECK(o.json_keys == std::vector<std::string>{"text"},
           "--json-keys does not apply to --dataset-type sft (its keys are input/output or messages)");
  PL_CHECK(!o.append_eod, "--append-eod does not apply to --dataset-type sft (each example ends with its own end "
                          "token)");
  // "No limit" is the flag's absence: 0 is refused like 1, and --overlong alone would do nothing.
  PL_CHECK(!o.max_seq_length_given || o.max_seq_length >= 2,
           "--max-seq-length {} must be at least 2 (for no limit, leave the flag out)", o.max_seq_length);
  PL_CHECK(!o.overlong_given || o.max_seq_length_given,
           "--overlong {} needs --max-seq-length N (the length beyond which examples are cut or dropped)", o.overlong);
  for (const std::string& in : o.inputs)
    PL_CHECK(format_of(in, o.input_format) == Format::jsonl,
             "--input {}: --dataset-type sft reads JSON lines (a .json/.jsonl name, or --input-format jsonl)", in);
}

void check_options(const Options& o) {
  PL_CHECK(o.workers >= 1, "--workers {} must be at least 1", o.workers);
  PL_CHECK(o.log_interval >= 1, "--log-interval {} must be at least 1", o.log_interval);
  PL_CHECK(!o.json_keys.empty(), "--json-keys needs at least one key");
  for (size_t i = 0; i < o.json_keys.size(); ++i)
    for (size_t k = 0; k < i; ++k)
      PL_CHECK(o.json_keys[i] != o.json_keys[k], "--json-keys: '{}' is given twice", o.json_keys[i]);
  for (const std::string& in : o.inputs) {
    std::error_code ec;
    PL_CHECK(std::filesystem::exists(in, ec), "--input {}: no such file", in);
    check_regular_file(in);  // a FIFO or a directory: one line (io/file_checks.h), not a hang
    PL_CHECK(format_of(in, o.input_format) == Format::jsonl || o.json_keys == std::vector<std::string>{"text"},
             "--input {}: plain text has only the key 'text'; --json-keys applies to JSON lines", in);
  }
  check_sft_options(o);
  app::check_output_directory("--output-prefix", o.output_prefix);
  // No output may replace an input (io/file_checks.h): --input, --tokenizer-model against every final file.
  std::vector<FlagPath> inputs, output_paths;
  for (const std::string& in : o.inputs) inputs.push_back({"--input", in});
  inputs.push_back({"--tokenizer-model", o.tokenizer_model});
  if (o.sft()) {
    const std::string& p = o.output_prefix;
    for (const std::string& f : {p + ".bin", p + ".idx", data::sft_loss_mask_path(p), data::sft_record_path(p),
                                 data::tokenizer_record_path(p)})
      output_paths.push_back({"--output-prefix", f});
  }
  for (const std::string& key : o.sft() ? std::vector<std::string>{} : o.json_keys) {
    const std::string p = output_prefix_for(o, key);
    for (const std::string& f : {p + ".bin", p + ".idx", data::tokenizer_record_path(p)})
      output_paths.push_back({"--output-prefix", f});
  }
  check_outputs_apart_from_inputs(inputs, output_paths);
}

data::TokenizerRecord make_record(const Options& o, const Tokenizer& tok) {
  data::TokenizerRecord r;
  r.type = o.tokenizer_type;
  if (!o.tokenizer_model.empty()) {
    r.model_path = std::filesystem::absolute(o.tokenizer_model).lexically_normal().string();
    r.model_fnv1a64 = data::fnv1a64_file_hex(o.tokenizer_model, &r.model_size);
  }
  r.vocab_size = tok.vocab_size();
  r.eod = tok.eod();
  r.bos = tok.bos();
  r.append_eod = o.append_eod;
  r.prepend_bos = o.prepend_bos;
  return r;
}

struct KeyStats {
  int64_t documents = 0, empty = 0, tokens = 0;
};

// Megatron's progress line (Partition.print_processing_stats), to stderr.
void print_progress(int64_t count, double elapsed_s, int64_t bytes) {
  const double e = std::max(elapsed_s, 1e-9);
  fmt::print(stderr, "Processed {} documents ({} docs/s, {} MB/s).\n", count, static_cast<double>(count) / e,
             static_cast<double>(bytes) / e / 1024.0 / 1024.0);
}

// Every input document, a batch at a time: encode(document, out) on the worker threads, then, in input order,
// consume(out) (an encoding error stops the run with its FILE:LINE message), with Megatron's progress line.
template <class Out, class Encode, class Consume>
void for_each_encoded(const Options& o, Encode&& encode, Consume&& consume) {
  DocumentReader reader(o.inputs, o);
  std::vector<RawDocument> batch;
  std::vector<Out> encoded;
  int64_t count = 0, bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  while (reader.next_batch(batch, 4096, size_t{64} << 20)) {
    encode_parallel(batch, o.workers, encoded, encode);
    for (size_t i = 0; i < batch.size(); ++i) {
      if (!encoded[i].error.empty()) throw pl::Error(encoded[i].error);
      consume(encoded[i]);
      ++count;
      bytes += static_cast<int64_t>(batch[i].raw.size());
      if (count % o.log_interval == 0)
        print_progress(count, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), bytes);
    }
  }
}

// ---- --dataset-type sft ------------------------------------------------------------------------------

struct SftEncoded {
  data::SftExample example;
  std::string error;
};

// One JSON line as an SFT example (data/sft_format.h); every error names FILE:LINE.
data::SftExample encode_sft_line(const RawDocument& d, const Options& o, const Tokenizer& tok) {
  const std::string where = fmt::format("{}:{}", *d.file, d.line);
  const nlohmann::json j = parse_json_text(d.raw, where);
  try {
    return data::encode_sft_example(j, tok, o.prepend_bos);
  } catch (const pl::Error& e) {
    fail("{}: {}", where, e.what());
  }
}

// What --max-seq-length does to one example: true to keep it (perhaps truncated), false to drop it.
bool fit_sft_example(data::SftExample& e, const Options& o, data::SftRecord& r) {
  if (o.max_seq_length <= 0 || static_cast<int64_t>(e.tokens.size()) <= o.max_seq_length) return true;
  if (o.overlong == "drop" || (data::truncate_sft_example(e, o.max_seq_length) && e.answer_tokens() == 0)) {
    ++r.dropped;  // too long, or no answer token left after the cut
    return false;
  }
  ++r.truncated;
  return true;
}

// Every example of the inputs into `w`, in input order; returns the record's caller-side fields.
data::SftRecord write_sft_examples(const Options& o, const Tokenizer& tok, data::SftDatasetWriter& w) {
  data::SftRecord r;
  r.max_seq_length = o.max_seq_length;
  r.overlong = o.overlong;
  r.chat_template = data::chat_template_name(data::chat_template_for(tok));
  r.prepend_bos = o.prepend_bos;
  for_each_encoded<SftEncoded>(
      o, [&](const RawDocument& d, SftEncoded& e) { e.example = encode_sft_line(d, o, tok); },
      [&](SftEncoded& e) {
        if (fit_sft_example(e.example, o, r)) w.add(e.example);
      });
  return r;
}

int run_sft(const Options& o, const Tokenizer& tok, const data::TokenizerRecord& record) {
  FileSet outputs({data::indexed_dataset_journal_path(o.output_prefix)},
                  [](const std::string& msg) { std::fprintf(stderr, "preprocess_data: %s\n", msg.c_str()); });
  data::SftDatasetWriter w(o.output_prefix, record, outputs);
  w.finalize(write_sft_examples(o, tok, w));
  outputs.publish();
  const data::SftRecord& r = w.record();
  const std::string& p = o.output_prefix;
  fmt::print("preprocess_data: sft: {} examples ({} chats, {} input/output), {} tokens, {} answer tokens ({:.1f}%), "
             "{} truncated, {} dropped{}; template {}, {}; wrote {}.bin, {}.idx, {}, {}, {}\n",
             r.examples, r.chat_examples, r.examples - r.chat_examples, r.tokens, r.answer_tokens,
             100.0 * static_cast<double>(r.answer_tokens) / std::max<double>(1.0, static_cast<double>(r.tokens)),
             r.truncated, r.dropped,
             o.max_seq_length > 0 ? fmt::format(" (--max-seq-length {}, --overlong {})", o.max_seq_length, o.overlong)
                                  : std::string(),
             r.chat_template, tok.description(), p, p, data::sft_loss_mask_path(p), data::sft_record_path(p),
             data::tokenizer_record_path(p));
  return 0;
}

// The command line into `o`; an exit status when the program stops here (--help, a bad command line).
std::optional<int> parse_command_line(int argc, char** argv, Options& o) {
  CLI::App app{kDescription, "preprocess_data"};
  app.footer(kFooter);
  app.add_option("--input", o.inputs, "Input file(s): JSON lines or plain text (repeatable)")->required();
  app.add_option("--output-prefix", o.output_prefix, "Output prefix: writes PREFIX_<key>_document.bin/.idx")
      ->required();
  app.add_option("--tokenizer-type", o.tokenizer_type, "byte | tiktoken")
      ->required()
      ->check(CLI::IsMember({"byte", "tiktoken"}));
  app.add_option("--tokenizer-model", o.tokenizer_model, "tiktoken: Llama 3 tokenizer.model");
  app.add_option("--json-keys", o.json_keys, "Keys to extract from each JSON line")->capture_default_str();
  app.add_option("--input-format", o.input_format, "auto | jsonl | text (auto: .json/.jsonl are JSON lines)")
      ->check(CLI::IsMember({"auto", "jsonl", "text"}))
      ->capture_default_str();
  app.add_option("--text-document", o.text_document, "Plain text documents: paragraph | line | file")
      ->check(CLI::IsMember({"paragraph", "line", "file"}))
      ->capture_default_str();
  app.add_flag("--append-eod", o.append_eod, "Append the eod token (<|end_of_text|>) to each non-empty document");
  app.add_flag("--prepend-bos", o.prepend_bos, "Start each document with <|begin_of_text|>");
  app.add_option("--workers", o.workers, "Tokenizer threads")->capture_default_str();
  app.add_option("--log-interval", o.log_interval, "Documents between progress lines")->capture_default_str();
  app.add_option("--dataset-type", o.dataset_type, "pretrain | sft (supervised fine-tuning examples)")
      ->check(CLI::IsMember({"pretrain", "sft"}))
      ->capture_default_str();
  app.add_option("--max-seq-length", o.max_seq_length, "sft: examples longer than this many tokens are cut or dropped");
  app.add_option("--overlong", o.overlong, "sft: truncate | drop the examples longer than --max-seq-length")
      ->check(CLI::IsMember({"truncate", "drop"}))
      ->capture_default_str();
  const std::optional<int> rc = app::parse_command_line(app, argc, argv, "preprocess_data");
  o.max_seq_length_given = app.count("--max-seq-length") > 0;
  o.overlong_given = app.count("--overlong") > 0;
  return rc;
}


// Every input document, tokenized, into each key's writer, in input order.
std::vector<KeyStats> write_documents(const Options& o, const Tokenizer& tok,
                                      std::vector<data::IndexedDatasetWriter>& writers) {
  std::vector<KeyStats> stats(writers.size());
  for_each_encoded<Encoded>(
      o, [&](const RawDocument& d, Encoded& e) { e.ids = encode_document(d, o, tok); },
      [&](const Encoded& e) {
        for (size_t k = 0; k < writers.size(); ++k) {
          const std::vector<int32_t>& ids = e.ids[k];
          if (ids.empty()) {
            writers[k].add_empty_document();
            ++stats[k].empty;
          } else {
            writers[k].add_document(ids);
          }
          ++stats[k].documents;
          stats[k].tokens += static_cast<int64_t>(ids.size());
        }
      });
  return stats;
}

int run(int argc, char** argv) {
  Options o;
  if (const std::optional<int> rc = parse_command_line(argc, argv, o)) return *rc;
  check_options(o);
  const std::unique_ptr<Tokenizer> tok = data::make_tokenizer(o.tokenizer_type, o.tokenizer_model);
  const data::TokenizerRecord record = make_record(o, *tok);
  if (o.sft()) return run_sft(o, *tok, record);

  // Every key's .bin/.idx/sidecar are published together (io/atomic_file.h FileSet): written under
  // this process's temporary names, and the previous outputs replaced only when all are complete.
  // An interrupted publish of an earlier run is completed or undone here first.
  std::vector<std::string> journals;
  for (const std::string& key : o.json_keys)
    journals.push_back(data::indexed_dataset_journal_path(output_prefix_for(o, key)));
  FileSet outputs(journals, [](const std::string& msg) { std::fprintf(stderr, "preprocess_data: %s\n", msg.c_str()); });
  std::vector<data::IndexedDatasetWriter> writers;
  for (const std::string& key : o.json_keys)
    writers.emplace_back(output_prefix_for(o, key), tok->vocab_size(), &outputs);
  const std::vector<KeyStats> stats = write_documents(o, *tok, writers);

  // Publish: every output or none; the sidecar records its .bin's size and .idx's checksum.
  for (size_t k = 0; k < writers.size(); ++k) {
    writers[k].finalize();
    data::TokenizerRecord r = record;
    r.data_bin_bytes = static_cast<int64_t>(writers[k].bin_bytes());
    r.data_idx_checksum64 = fmt::format("{:016x}", writers[k].idx_checksum());
    outputs.add(data::tokenizer_record_path(output_prefix_for(o, o.json_keys[k]))).write(data::tokenizer_record_text(r));
  }
  outputs.publish();

  for (size_t k = 0; k < writers.size(); ++k) {
    const std::string p = output_prefix_for(o, o.json_keys[k]);
    fmt::print("preprocess_data: {} documents ({} empty), {} tokens, dtype {}, {}; wrote {}.bin, {}.idx, {}\n",
               stats[k].documents, stats[k].empty, stats[k].tokens,
               data::indexed_dtype_name(static_cast<uint8_t>(writers[k].dtype())), tok->description(), p, p,
               data::tokenizer_record_path(p));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("preprocess_data", run, argc, argv); }
