// inspect_data: the data a pretrain_llama run would read, without training: the summary of every
// dataset and split, and the token ids of chosen samples exactly as the trainer feeds them. The way
// to check a data pipeline by eye, or against Megatron sample by sample.
//
//   inspect_data --mock --seq-length 4096 --sample 0
//   inspect_data --data-path data/sample/license_byte_text_document --model llama_tiny_bytes
//                --seq-length 128 --sample 0:4 --from valid --eval-iters 2
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app_main.h"
#include "config/model_config.h"
#include "config/paths.h"
#include "config/train_config.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "data/data_pipeline.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"

namespace {

using namespace pl;

struct Options {
  bool mock = false;
  data::DataConfig data;
  TrainConfig train;
  std::string model = "llama3_8b";
  std::string samples;       // "i" or "i:j" (half-open)
  std::string from = "train";
  bool decode = false;
};

// The tokenizer that made the data, from the first dataset's .tokenizer.json (preprocess_data's).
std::unique_ptr<data::Tokenizer> recorded_tokenizer(const Options& o) {
  const data::DataBlend blend = data::parse_data_path(o.data.data_path);
  const std::optional<data::TokenizerRecord> rec = data::read_tokenizer_record(blend.prefixes.front());
  PL_CHECK(rec.has_value(), "--decode: {} has no tokenizer record (only data made by preprocess_data has one)",
           data::tokenizer_record_path(blend.prefixes.front()));
  return data::make_tokenizer(rec->type, rec->model_path);
}

std::string escaped(const std::string& text);
std::pair<int64_t, int64_t> parse_sample_range(const std::string& s);

// SFT data (data/sft_dataset.h): each pack of --sample, example by example: its positions, its inputs and, with
// --decode, the inputs' text and the answer tokens the loss learns there ("[answers] ...").
int print_sft_packs(const Options& o, const data::SftData& sft, data::Split from) {
  const int64_t packs = sft.packs(from);
  PL_CHECK(packs > 0, "the {} split has no data", o.from);
  const auto [first, last] = parse_sample_range(o.samples);
  const std::unique_ptr<data::Tokenizer> tokenizer = o.decode ? recorded_tokenizer(o) : nullptr;
  const auto S = static_cast<size_t>(sft.seq_length());
  std::vector<int32_t> tok(S), lab(S), pos(S);
  for (int64_t i = first; i < last; ++i) {
    sft.sample(from, i, tok, lab, pos);
    fmt::print("sample {} of {} (pack {} of {}):\n", i, o.from, i % packs, packs);
    for (size_t b = 0; b < S;) {
      size_t e = b + 1;
      while (e < S && pos[e] != 0) ++e;
      std::vector<int32_t> in(tok.begin() + static_cast<std::ptrdiff_t>(b), tok.begin() + static_cast<std::ptrdiff_t>(e)), ans;
      for (size_t t = b; t < e; ++t)
        if (lab[t] != data::kIgnoredLabel) ans.push_back(lab[t]);
      fmt::print("  positions [{}, {}): {} tokens, {} answer labels{}\n", b, e, e - b, ans.size(),
                 ans.empty() ? " (padding)" : "");
      if (tokenizer) {
        fmt::print("    text: {}\n", escaped(tokenizer->decode(in)));
        if (!ans.empty()) fmt::print("    [answers] {}\n", escaped(tokenizer->decode(ans)));
      } else {
        fmt::print("    {}\n", fmt::join(in, " "));
      }
      b = e;
    }
  }
  return 0;
}

// Decoded text on one line: control characters escaped as \n, \t, \xNN.
std::string escaped(const std::string& text) {
  std::string out;
  for (const unsigned char c : text) {
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20 || c == 0x7f) out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  return out;
}

data::Split parse_split_name(const std::string& s) {
  for (data::Split split : {data::Split::train, data::Split::valid, data::Split::test})
    if (s == data::split_name(split)) return split;
  fail("--from must be train, valid or test, got '{}'", s);
}

int64_t parse_index(const std::string& s, const std::string& whole) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  PL_CHECK(ec == std::errc() && end == s.data() + s.size() && v >= 0,
           "--sample must be an index i or a range i:j of indices >= 0, got '{}'", whole);
  return v;
}

// "7" -> [7, 8); "3:6" -> [3, 6).
std::pair<int64_t, int64_t> parse_sample_range(const std::string& s) {
  const size_t colon = s.find(':');
  if (colon == std::string::npos) {
    const int64_t i = parse_index(s, s);
    return {i, checked_add(i, 1, fmt::format("--sample {}", s))};
  }
  const int64_t a = parse_index(s.substr(0, colon), s), b = parse_index(s.substr(colon + 1), s);
  PL_CHECK(a < b, "--sample range '{}' is empty", s);
  return {a, b};
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"inspect_data: the datasets, splits and samples a pretrain_llama run would read (same flags, same "
               "order, same token ids)"};
  TrainConfig& t = o.train;
  app.add_flag("--mock", o.mock, "Megatron's mock data (what pretrain_llama reads without --data-path)");
  app.add_option("--data-path", o.data.data_path, "PREFIX, or a blend 'W1 PREFIX1 W2 PREFIX2 ...' (as pretrain_llama)")
      ->expected(1, -1);
  app.add_option("--split", o.data.split, "Train/validation/test proportions")->capture_default_str();
  app.add_option("--data-cache-path", o.data.cache_path, "GPTDataset index cache (default <prefix>/cache/...)");
  app.add_option("--data-seed", o.data.seed, "Seed of the dataset shuffles")->capture_default_str();
  app.add_option("--model", o.model, "Model config (mock data takes its vocabulary from it)")->capture_default_str();
  app.add_option("--seq-length", t.seq_length, "Tokens per sample")->capture_default_str();
  app.add_option("--train-iters", t.train_iters, "Training iterations (sizes the train split)")->capture_default_str();
  app.add_option("--global-batch-size", t.global_batch_size, "Samples per iteration")->capture_default_str();
  app.add_option("--eval-interval", t.eval_interval, "Iterations between validation runs")->capture_default_str();
  app.add_option("--eval-iters", t.eval_iters, "Global batches per validation run")->capture_default_str();
  app.add_option("--sample", o.samples, "Print sample i, or samples i:j (half-open), of the --from split");
  app.add_option("--from", o.from, "Split the samples come from: train, valid or test")->capture_default_str();
  app.add_flag("--decode", o.decode,
               "Also print each sample as text, with the tokenizer named in the data's .tokenizer.json");
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "inspect_data")) return *rc;
  PL_CHECK(o.mock != !o.data.data_path.empty(), "give exactly one of --mock and --data-path");
  PL_CHECK(!(o.decode && o.mock), "--decode needs --data-path data made by preprocess_data (mock ids are not text)");
  t.micro_batch_size = 1;  // the sample order does not depend on it
  validate_train_config(t);
  const data::Split from = parse_split_name(o.from);
  const ModelConfig mc = load_model_config(resolve_config("models", o.model, argv[0]));

  const data::TrainingData d(data::data_config_for_run(o.data, mc.vocab_size, t.seq_length,
                                                       {t.train_samples(), t.valid_samples(), t.test_samples()}));
  fmt::print("inspect_data | seq length {}, {} iterations x global batch {}, validation {}\n", t.seq_length,
             t.train_iters, t.global_batch_size,
             t.eval_iters > 0 ? fmt::format("every {} iterations x {} batches", t.eval_interval, t.eval_iters)
                              : std::string("off (--eval-iters 0)"));
  for (const std::string& line : d.summary()) fmt::print("inspect_data | {}\n", line);
  if (o.samples.empty()) return 0;
  if (d.sft()) return print_sft_packs(o, *d.sft_data(), from);

  const data::SampleSource* src = d.split(from);
  PL_CHECK(src != nullptr, "the {} split has no data", o.from);
  const auto [first, last] = parse_sample_range(o.samples);
  PL_CHECK(last <= src->size(), "--sample {}: the {} split has {} samples", o.samples, o.from, src->size());
  const std::unique_ptr<data::Tokenizer> tokenizer = o.decode ? recorded_tokenizer(o) : nullptr;
  std::vector<int32_t> text(static_cast<size_t>(src->sample_length()));
  for (int64_t i = first; i < last; ++i) {
    src->get(i, text);
    // Where the trainer meets it: the sampler reads train samples in order, global batch by global batch.
    const std::string where = from == data::Split::train
                                  ? fmt::format(" (iteration {}, position {} of its global batch)",
                                                i / t.global_batch_size + 1, i % t.global_batch_size)
                                  : "";
    fmt::print("sample {} of {}{}: {} ids (tokens = ids[0:{}], labels = ids[1:{}])\n", i, o.from, where, text.size(),
               t.seq_length, t.seq_length + 1);
    fmt::print("{}\n", fmt::join(text, " "));
    if (tokenizer) fmt::print("text: {}\n", escaped(tokenizer->decode(text)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("inspect_data", run, argc, argv); }
