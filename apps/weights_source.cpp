// generate's and evaluate's weights, tokenizer and device (weights_source.h).
#include "weights_source.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/error.h"
#include "data/tokenizer_record.h"
#include "model/hf_llama.h"

namespace pl::app {

namespace fs = std::filesystem;

std::string WeightsSource::describe() const {
  if (!ckpt) return "hf " + hf_dir;
  if (!ckpt->lora) return ckpt->path;
  return fmt::format("{} (LoRA dim {} over its base {})", ckpt->path, ckpt->lora->dim,
                     hf_dir.empty() ? ckpt->lora_base.source : "hf " + hf_dir);
}

WeightsSource open_weights(const WeightsFlags& f) {
  const std::string &load = f.load, &init_from_hf = f.init_from_hf;
  PL_CHECK(!load.empty() || !init_from_hf.empty(), "give the weights: --load DIR or --init-from-hf DIR");
  WeightsSource w;
  w.hf_dir = init_from_hf;
  if (!load.empty()) {
    w.ckpt = verify_checkpoint(load);
    w.cfg = w.ckpt->model;
    PL_CHECK(init_from_hf.empty() || w.ckpt->lora,
             "--load {} and --init-from-hf {}: give one (--init-from-hf with --load names a LoRA checkpoint's base)",
             load, init_from_hf);
  } else {
    w.cfg = read_hf_llama_config((fs::path(init_from_hf) / "config.json").string()).model;
  }
  return w;
}

std::unique_ptr<data::Tokenizer> find_tokenizer(const WeightsFlags& f, const WeightsSource& w, std::string& source) {
  const std::string &type = f.tokenizer_type, &model_path = f.tokenizer_model;
  if (!type.empty()) {
    source = "--tokenizer-type " + type;
    return data::make_tokenizer(type, model_path);
  }
  std::optional<data::TokenizerRecord> rec;
  if (!w.ckpt) {
    const fs::path dir(w.hf_dir);
    std::error_code ec;
    for (const fs::path& p : {dir / "original" / "tokenizer.model", dir / "tokenizer.model"})
      if (fs::is_regular_file(p, ec)) {
        source = p.string();
        return data::make_tokenizer("tiktoken", p.string());
      }
    source = (dir / data::kHfTokenizerRecordName).string();
    rec = data::read_tokenizer_record_file(source);
  } else {
    const std::string prefix = data::data_prefix_of_command_line(w.ckpt->command_line);
    if (!prefix.empty()) {
      source = data::tokenizer_record_path(prefix);
      rec = data::read_tokenizer_record(prefix);
    }
  }
  PL_CHECK(rec.has_value(),
           "no tokenizer found ({} does not exist; a Hugging Face tokenizer.json is not read): give --tokenizer-type "
           "byte, or --tokenizer-type tiktoken --tokenizer-model tokenizer.model",
           source.empty() ? "the checkpoint's run used mock data, which" : source);
  return data::make_tokenizer(rec->type, rec->model_path);
}

void add_weights_flags(CLI::App& app, WeightsFlags& f) {
  app.add_option("--load", f.load, "A checkpoint: a --save directory (its latest) or one iter_ directory");
  app.add_option("--init-from-hf", f.init_from_hf, "A Hugging Face Llama directory (config.json, safetensors); with "
                                                   "--load of a LoRA checkpoint, its base");
  app.add_option("--tokenizer-type", f.tokenizer_type, "byte | tiktoken (default: the one the weights were "
                                                       "trained with, when a record says so)")
      ->check(CLI::IsMember({"byte", "tiktoken"}));
  app.add_option("--tokenizer-model", f.tokenizer_model, "tiktoken: Llama 3 tokenizer.model");
}

OpContext open_device(const std::string& device, DeviceStateHandle& state) {
  OpContext ctx;
  ctx.round_bf16 = true;
  if (device == "cpu") return ctx;
  std::string why;
  PL_CHECK(cuda_device_count(&why) > 0, "--device cuda: no CUDA device ({})", why);
  ctx.device = Device::CUDA;
  state = open_device_state(Device::CUDA);
  ctx.gpu = state.get();
  return ctx;
}

}  // namespace pl::app
