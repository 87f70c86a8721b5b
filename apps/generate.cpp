// generate: the continuation of a prompt by a trained model — what anyone does first after fine-tuning (issue 28).
// The weights come from a pretrain_llama checkpoint (--load, its FP32 masters) or a Hugging Face Llama directory
// (--init-from-hf); the model runs with a KV cache (model/generator.h), every linear layer in BF16; the
// continuation goes to stdout as it is made, everything else to stderr. A LoRA checkpoint (--load of a --peft lora
// run) runs its base with the adapters merged in (W + alpha/dim·B·A in FP32, rounded to BF16 once: the same
// function as base + adapters, to one BF16 rounding of the weights); its base comes from the checkpoint's record,
// or from --init-from-hf when that directory moved (its checksum is checked either way).
//
//   generate --load checkpoints/sft --prompt "What is 2+2?" --chat
//   generate --init-from-hf hf/sft --prompt "Once upon a time" --max-new-tokens 64 --temperature 0.8 --top-p 0.9
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "app_main.h"
#include "weights_source.h"
#include "backend/ops.h"
#include "core/error.h"
#include "data/sft_format.h"
#include "data/tokenizer.h"
#include "data/tokenizer_record.h"
#include "data/utf8_stream.h"
#include "io/file_checks.h"
#include "model/generator.h"
#include "model/hf_llama.h"
#include "model/lora_export.h"
#include "train/checkpoint.h"

namespace {

using namespace pl;
namespace fs = std::filesystem;

struct Options {
  app::WeightsFlags w;
  std::string prompt, system, device = "cpu";
  bool chat = false, raw_bytes = false;
  int64_t max_new_tokens = 128;
  double temperature = 0.0, top_p = 1.0;
  uint64_t seed = 1234;
};

// The prompt's token ids: the text as it is, or (--chat) a user turn, after an optional system message, in the
// chat template of the tokenizer (data/sft_format.h), ending with the assistant's header.
std::vector<int32_t> prompt_ids(const Options& o, const data::Tokenizer& tok) {
  if (!o.chat) {
    PL_CHECK(o.system.empty(), "--system needs --chat");
    return tok.encode(o.prompt);
  }
  std::vector<data::ChatMessage> msgs;
  if (!o.system.empty()) msgs.push_back({"system", o.system});
  msgs.push_back({"user", o.prompt});
  return data::chat_prompt(msgs, tok);
}

std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"generate: the continuation of a prompt by a pretrain_llama checkpoint or a Hugging Face Llama "
               "(greedy at temperature 0), with a KV cache; the text to stdout, the rest to stderr"};
  app::add_weights_flags(app, o.w);
  app.add_option("--prompt", o.prompt, "The text to continue (with --chat: the user's message)")->required();
  app.add_flag("--chat", o.chat, "Wrap the prompt in the chat template (Llama 3's with a tiktoken tokenizer, the "
                                 "plain one with the byte tokenizer) and answer it as the assistant");
  app.add_option("--system", o.system, "--chat: a system message before the prompt");
  app.add_option("--max-new-tokens", o.max_new_tokens, "Tokens to generate at most")->capture_default_str();
  app.add_option("--temperature", o.temperature, "0: greedy; else sample from softmax(logits / T)")
      ->capture_default_str();
  app.add_option("--top-p", o.top_p, "Sample from the smallest set of tokens whose probability reaches P")
      ->capture_default_str();
  app.add_option("--seed", o.seed, "Seed of the sampling")->capture_default_str();
  app.add_option("--device", o.device, "cpu | cuda")->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  app.add_flag("--raw-bytes", o.raw_bytes, "Write the tokens' bytes as they are (default: complete UTF-8, a character "
                                           "held back until whole, U+FFFD for an invalid sequence)");
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "generate")) return rc;
  PL_CHECK(o.max_new_tokens >= 1, "--max-new-tokens {} must be at least 1", o.max_new_tokens);
  PL_CHECK(o.temperature >= 0.0, "--temperature {} must be >= 0 (0: greedy)", o.temperature);
  PL_CHECK(o.top_p > 0.0 && o.top_p <= 1.0, "--top-p {} must be in (0, 1]", o.top_p);
  return std::nullopt;
}

int run(int argc, char** argv) {
  Options o;
  if (const std::optional<int> rc = parse(argc, argv, o)) return *rc;
  const auto t0 = std::chrono::steady_clock::now();
  const app::WeightsSource src = app::open_weights(o.w);
  const std::optional<VerifiedCheckpoint>& ckpt = src.ckpt;
  const ModelConfig& cfg = src.cfg;
  std::string tok_source;
  const std::unique_ptr<data::Tokenizer> tok = app::find_tokenizer(o.w, src, tok_source);
  PL_CHECK(tok->vocab_size() <= cfg.vocab_size, "the tokenizer ({}) has {} ids but model {} only {}",
           tok->description(), tok->vocab_size(), cfg.name, cfg.vocab_size);
  const std::vector<int32_t> prompt = prompt_ids(o, *tok);
  PL_CHECK(!prompt.empty(), "--prompt: the text tokenizes to nothing");
  PL_CHECK(static_cast<int64_t>(prompt.size()) < cfg.max_position_embeddings,
           "--prompt: {} tokens, but model {} has {} positions (max_position_embeddings), and one more is needed for "
           "the answer",
           prompt.size(), cfg.name, cfg.max_position_embeddings);
  DeviceStateHandle state;
  const OpContext ctx = app::open_device(o.device, state);
  // A request beyond the positions left runs to the model's last position (no sum that could overflow).
  const int64_t positions_left = cfg.max_position_embeddings - static_cast<int64_t>(prompt.size());
  const int64_t capacity = static_cast<int64_t>(prompt.size()) + std::min(o.max_new_tokens, positions_left);
  Generator g(cfg, ctx, capacity);
  const auto write = [&](int64_t off, const float* v, int64_t n) { g.write_weights(off, v, n); };
  if (ckpt && ckpt->lora) {  // the base from its record, tensor by tensor, each merged as it completes
    const std::vector<float> adapters = read_master_weights(*ckpt);
    HfTensorGatherer merged(cfg, [&](const HfTensorSlot& s, size_t, float* v) {
      merge_lora_into_tensor(cfg, *ckpt->lora, adapters, s.offset, s.numel(), v);
      write(s.offset, v, s.numel());
    });
    stream_lora_base(*ckpt, o.w.init_from_hf, [&](int64_t off, const float* v, int64_t n) { merged.write(off, v, n); });
  } else if (ckpt) {
    stream_master_weights(*ckpt, write);
  } else {
    read_hf_weights(o.w.init_from_hf, cfg, write);
  }
  const auto t1 = std::chrono::steady_clock::now();
  fmt::print(stderr, "generate | model {} ({} parameters) from {}{} on {}, weights loaded in {:.1f} s | tokenizer {} "
             "(from {}) | prompt {} tokens{} | {}\n",
             cfg.name, cfg.num_parameters(), ckpt ? ckpt->path : o.w.init_from_hf,
             ckpt && ckpt->lora ? fmt::format(" (LoRA dim {} merged into its base {})", ckpt->lora->dim,
                                              o.w.init_from_hf.empty() ? ckpt->lora_base.source : "hf " + o.w.init_from_hf)
                                : "",
             o.device,
             std::chrono::duration<double>(t1 - t0).count(), tok->description(), tok_source, prompt.size(),
             o.chat ? fmt::format(" (chat template {})", data::chat_template_name(data::chat_template_for(*tok))) : "",
             o.temperature == 0.0 ? std::string("greedy")
                                  : fmt::format("temperature {} top-p {} seed {}", o.temperature, o.top_p, o.seed));
  std::mt19937_64 rng(o.seed);
  const std::vector<int32_t> stops = data::answer_stop_ids(*tok);
  data::Utf8Stream text;
  const auto write_stdout = [](const std::string& s) {
    std::fwrite(s.data(), 1, s.size(), stdout);
    std::fflush(stdout);
  };
  const Generated out = generate_tokens(g, prompt, o.max_new_tokens, stops, {o.temperature, o.top_p}, rng,
                                        [&](int32_t id) {
                                          const std::string piece = tok->decode(std::span<const int32_t>(&id, 1));
                                          write_stdout(o.raw_bytes ? piece : text.push(piece));
                                        });
  if (!o.raw_bytes) write_stdout(text.finish());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  fmt::print(stderr, "generate | {} tokens in {:.2f} s ({:.1f} tokens/s, prompt included), {}\n", out.tokens.size(),
             secs, static_cast<double>(out.tokens.size()) / std::max(secs, 1e-9),
             out.stopped ? "stopped at an end-of-answer token"
                         : (static_cast<int64_t>(out.tokens.size()) < o.max_new_tokens ? "stopped at the model's last position"
                                                                                      : "stopped at --max-new-tokens"));
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("generate", run, argc, argv); }
