// convert_checkpoint: a pretrain_llama checkpoint as a Hugging Face Llama directory (config.json +
// BF16 safetensors from the FP32 master weights), for evaluation tools and transformers; a LoRA checkpoint's
// adapters as PEFT's files (--to-peft), or merged into its base (--merge-lora --to-hf). The
// directory appears (or replaces the previous one, with --overwrite) only once complete.
//
//   convert_checkpoint --load checkpoints/run1 --to-hf hf/run1                  # the latest iteration
//   convert_checkpoint --load checkpoints/run1/iter_0000500 --to-hf hf/it500 --max-shard-size 2GB
//   convert_checkpoint --load checkpoints/lora1 --to-peft peft/lora1            # adapter_config.json + safetensors
//   convert_checkpoint --load checkpoints/lora1 --merge-lora --to-hf hf/merged  # W + (alpha/dim)·B·A, BF16
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <filesystem>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "app_main.h"
#include "core/checked_math.h"
#include "core/error.h"
#include "core/host_memory.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "data/tokenizer_record.h"
#include "model/hf_llama.h"
#include "model/lora_export.h"
#include "train/checkpoint.h"

namespace {

using namespace pl;

struct Options {
  std::string load, to_hf, to_peft, init_from_hf, max_shard_size = "5GB";
  bool overwrite = false, merge_lora = false;
  std::optional<int64_t> bos;
  std::vector<int64_t> eos;
};

// "5GB", "500MB", "100KB" (powers of 1000, as save_pretrained's max_shard_size) or plain bytes.
uint64_t parse_size(const std::string& s) {
  uint64_t v = 0;
  const char* end = s.data() + s.size();
  const auto [p, ec] = std::from_chars(s.data(), end, v);
  PL_CHECK(ec == std::errc() && p != s.data(), "--max-shard-size must be a byte count or N[KB|MB|GB], got '{}'", s);
  const std::string unit(p, end);
  uint64_t mult = unit.empty() ? 1 : 0;
  for (const auto& [name, m] :
       {std::pair{"B", 1ull}, {"KB", 1000ull}, {"MB", 1000ull * 1000}, {"GB", 1000ull * 1000 * 1000}})
    if (unit == name) mult = m;
  PL_CHECK(mult != 0 && v > 0, "--max-shard-size must be a byte count or N[KB|MB|GB], got '{}'", s);
  return checked_mul_u64(v, mult, fmt::format("--max-shard-size '{}'", s));
}

namespace fs = std::filesystem;

// The tokenizer record of the first dataset the checkpoint's run named (--data-path in its saved command line),
// without the fields that tie it to that dataset's files; nullopt for mock data or a dataset without a record.
std::optional<data::TokenizerRecord> training_tokenizer(const VerifiedCheckpoint& ckpt) {
  const std::string prefix = data::data_prefix_of_command_line(ckpt.command_line);
  if (prefix.empty()) return std::nullopt;
  std::optional<data::TokenizerRecord> r = data::read_tokenizer_record(prefix);
  if (r) {
    r->data_bin_bytes = -1;
    r->data_idx_checksum64.clear();
  }
  return r;
}

// The output directory: absent, empty, or (with --overwrite) an earlier export of the same kind (config.json beside
// HF weights, adapter_config.json beside PEFT's), never a directory of other files.
fs::path checked_output_dir(const Options& o, const char* out_flag, const std::string& out_dir, bool peft) {
  const fs::path out = fs::path(out_dir).lexically_normal();
  std::error_code ec;
  PL_CHECK(!fs::exists(out, ec) || (fs::is_directory(out, ec) && (fs::is_empty(out, ec) || o.overwrite)),
           "{} {}: {} (pass --overwrite to replace it)", out_flag, out.string(),
           fs::is_directory(out, ec) ? "the directory is not empty" : "exists and is not a directory");
  // --overwrite replaces an earlier export only (config.json beside its weights), never a directory of other files.
  const char* marker = peft ? "adapter_config.json" : "config.json";
  if (o.overwrite && !fs::is_empty(out, ec))
    check_replaceable_output(out_flag, out.string(), peft ? "a PEFT export" : "a Hugging Face export",
                             [marker](const std::string& p) {
                               std::error_code e;
                               return fs::is_regular_file(fs::path(p) / marker, e) ? std::string()
                                                                                    : std::string("no ") + marker;
                             });
  return out;
}

// --to-peft: the adapters (the checkpoint's master weights) as PEFT's two files, the base named as the record says.
int export_adapters(const Options& o, const VerifiedCheckpoint& ckpt, const fs::path& out,
                    std::chrono::steady_clock::time_point t0) {
  const std::vector<float> adapters = read_master_weights(ckpt);
  const std::string& source = ckpt.lora_base.source;
  const std::string base_model = !o.init_from_hf.empty() ? o.init_from_hf
                                 : source.starts_with("hf ") ? source.substr(3)
                                                             : std::string();
  std::vector<std::string> files;
  write_directory_atomically(out.string(), [&](const std::string& tmp) {
    files = export_peft(ckpt.model, *ckpt.lora, adapters, tmp, base_model);
  });
  fmt::print("convert_checkpoint: {} (iteration {}, LoRA dim {} alpha {} on {}, {} adapter parameters, base {}) -> "
             "{}: {} ({:.1f} s, host peak {:.2f} GB)\n",
             ckpt.path, ckpt.iteration, ckpt.lora->dim, ckpt.lora->alpha, lora_target_names(ckpt.lora->targets),
             adapters.size(), source, o.to_peft, fmt::join(files, ", "),
             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
             static_cast<double>(peak_resident_bytes()) / 1e9);
  return 0;
}

// --to-hf (with --merge-lora for a LoRA checkpoint): the Hugging Face directory, tensor by tensor.
int export_hf_dir(const Options& o, const VerifiedCheckpoint& ckpt, const fs::path& out, HfExportOptions opts,
                  std::chrono::steady_clock::time_point t0) {
  // Tensor by tensor (HfExportStream): the checkpoint's master file piece by piece, or under --merge-lora the base
  // from its record with each targeted tensor's rows merged in FP32 as it completes (the checksum of the base checked
  // at its end, before anything is published). Host memory: the adapters and the tensors in flight, never the model.
  const std::vector<float> adapters = ckpt.lora ? read_master_weights(ckpt) : std::vector<float>{};
  const auto export_into = [&](const std::string& dir) {
    if (!ckpt.lora) {
      HfExportStream stream(ckpt.model, dir, opts);
      stream_master_weights(ckpt, [&](int64_t off, const float* v, int64_t n) { stream.write(off, v, n); });
      return stream.finish();
    }
    HfExportStream stream(ckpt.model, dir, opts, [&](const HfTensorSlot& s, float* v) {
      merge_lora_into_tensor(ckpt.model, *ckpt.lora, adapters, s.offset, s.numel(), v);
    });
    stream_lora_base(ckpt, o.init_from_hf, [&](int64_t off, const float* v, int64_t n) { stream.write(off, v, n); });
    return stream.finish();
  };
  // The tokenizer of the data the checkpoint trained on, when its record is there: beside config.json (for the
  // generate tool), and bos/eos in config.json unless given.
  const std::optional<data::TokenizerRecord> tok = training_tokenizer(ckpt);
  if (tok && !opts.bos_token_id) opts.bos_token_id = tok->bos;
  if (tok && opts.eos_token_ids.empty()) opts.eos_token_ids = {tok->eod};
  // A fresh sibling directory replaces `out` only when complete: `out` is always the old export or
  // the new one, never a mix of shards (a crash leaves a *.tmp-<pid> sibling, which is never read).
  std::vector<std::string> files;
  write_directory_atomically(out.string(), [&](const std::string& tmp) {
    files = export_into(tmp);
    if (!tok) return;
    write_file_atomically((fs::path(tmp) / data::kHfTokenizerRecordName).string(), data::tokenizer_record_text(*tok));
    files.push_back(data::kHfTokenizerRecordName);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("convert_checkpoint: {} (iteration {}, model {}, {} parameters, recipe {}{}) -> {}: {} ({:.2f} GB of BF16 "
             "weights, {:.1f} s, host peak {:.2f} GB)\n",
             ckpt.path, ckpt.iteration, ckpt.model.name, ckpt.model.num_parameters(), ckpt.recipe_name,
             ckpt.lora ? fmt::format("; LoRA dim {} merged into the base {}", ckpt.lora->dim, ckpt.lora_base.source) : "",
             o.to_hf,
             fmt::join(files, ", "), 2.0 * static_cast<double>(ckpt.model.num_parameters()) / 1e9, seconds,
             static_cast<double>(peak_resident_bytes()) / 1e9);
  return 0;
}

int run(int argc, char** argv) {
  Options o;
  CLI::App app{"convert_checkpoint: a pretrain_llama checkpoint -> a Hugging Face LlamaForCausalLM directory"};
  app.add_option("--load", o.load, "Checkpoint: a --save directory (its latest iteration) or one iter_ directory")
      ->required();
  app.add_option("--to-hf", o.to_hf, "Output directory (config.json, model*.safetensors)");
  app.add_option("--to-peft", o.to_peft, "A LoRA checkpoint's adapters as PEFT's directory (adapter_config.json, "
                                         "adapter_model.safetensors)");
  app.add_flag("--merge-lora", o.merge_lora, "With --to-hf, of a LoRA checkpoint: its base with the adapters merged "
                                             "in (W + alpha/dim * B·A in FP32, rounded to BF16 once)");
  app.add_option("--init-from-hf", o.init_from_hf, "A LoRA checkpoint's base, when the Hugging Face directory its "
                                                   "record names has moved (its weights checksum is checked)");
  app.add_option("--max-shard-size", o.max_shard_size, "Largest safetensors file before sharding")
      ->capture_default_str();
  app.add_option("--bos-token-id", o.bos, "bos_token_id for config.json (e.g. 128000 for Llama 3)");
  app.add_option("--eos-token-id", o.eos, "eos_token_id(s) for config.json (e.g. 128001)");
  app.add_flag("--overwrite", o.overwrite, "Replace an existing, non-empty --to-hf directory (as a whole, once the new "
                                           "export is complete)");
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "convert_checkpoint")) return *rc;
  PL_CHECK(o.to_hf.empty() != o.to_peft.empty(), "give one output: --to-hf DIR or --to-peft DIR");
  PL_CHECK(!o.merge_lora || !o.to_hf.empty(), "--merge-lora writes a Hugging Face directory: give --to-hf DIR");
  const bool peft = !o.to_peft.empty();
  const char* out_flag = peft ? "--to-peft" : "--to-hf";
  const std::string& out_dir = peft ? o.to_peft : o.to_hf;
  // The output onto, inside or around the checkpoint: --overwrite would replace it (io/file_checks.h).
  check_outputs_apart_from_inputs({{"--load", o.load}}, {{out_flag, out_dir}});

  HfExportOptions opts{.max_shard_bytes = parse_size(o.max_shard_size), .bos_token_id = o.bos,
                       .eos_token_ids = o.eos};
  const fs::path out = checked_output_dir(o, out_flag, out_dir, peft);
  const auto t0 = std::chrono::steady_clock::now();
  const VerifiedCheckpoint ckpt = verify_checkpoint(o.load);
  check_hf_expressible(ckpt.model);
  if (ckpt.lora) {
    PL_CHECK(peft || o.merge_lora,
             "--load {}: a LoRA checkpoint (its adapters only): --to-peft DIR writes them, --merge-lora --to-hf DIR "
             "merges them into their base",
             ckpt.path);
  } else {
    PL_CHECK(!peft && !o.merge_lora && o.init_from_hf.empty(),
             "--load {}: not a LoRA checkpoint (no adapters): {} applies to a checkpoint of --peft lora", ckpt.path,
             peft ? "--to-peft" : (o.merge_lora ? "--merge-lora" : "--init-from-hf"));
  }
  if (peft) return export_adapters(o, ckpt, out, t0);
  return export_hf_dir(o, ckpt, out, opts, t0);
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("convert_checkpoint", run, argc, argv); }
