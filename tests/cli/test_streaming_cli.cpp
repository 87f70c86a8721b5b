// Issue 42: the weights stream tensor by tensor. On a 65 M-parameter model (260 MB of FP32 values; its largest tensor
// 1 M elements, 4 MB in FP32), written as a sharded Hugging Face directory:
//   - reading it back (read_hf_weights, what --init-from-hf runs) grows the process's resident set by about one
//     tensor, not by the model (VmHWM, reset before, less the resident set before);
//   - convert_checkpoint --merge-lora --to-hf of a LoRA checkpoint over it peaks within a few tensors of the same
//     program's --to-peft export of the adapters alone (both print their VmHWM), and its merged tensors are those
//     of the whole-model merge (read_lora_base + merge_lora_into), bit for bit after the BF16 rounding.
// The memory bounds are not measured under AddressSanitizer (its quarantine keeps freed buffers resident), which
// runs the same paths in the ConvertCheckpoint and Lora CLI tests.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "config/model_config.h"
#include "io/safetensors.h"
#include "model/hf_llama.h"
#include "model/init.h"
#include "model/llama.h"
#include "model/lora_export.h"
#include "numerics/bf16.h"
#include "test_util.h"
#include "train/checkpoint.h"

namespace {

using namespace pl;
namespace fs = std::filesystem;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kMemoryMeasurable = false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kMemoryMeasurable = false;
#else
constexpr bool kMemoryMeasurable = true;
#endif
#else
constexpr bool kMemoryMeasurable = true;
#endif

// A /proc/self/status field in bytes ("VmRSS", "VmHWM").
int64_t status_bytes(const std::string& key) {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(key + ":")) return std::stoll(line.substr(key.size() + 1)) * 1024;
  return -1;
}

// 24 layers of hidden 512, FFN 1024, 8 heads with 8 KV groups, vocabulary 2048.
std::string write_model_config(const fs::path& dir) {
  const std::string path = (dir / "llama_stream.json").string();
  std::ofstream(path) << R"({"name": "llama_stream", "num_layers": 24, "hidden_size": 512, "ffn_hidden_size": 1024,
    "num_attention_heads": 8, "num_query_groups": 8, "kv_channels": 64, "vocab_size": 2048,
    "make_vocab_size_divisible_by": 128, "seq_length": 64, "max_position_embeddings": 8192,
    "rotary_base": 500000.0, "rope_scaling": false, "layernorm_epsilon": 1e-5, "init_method_std": 0.02})";
  return path;
}

// "host peak X GB" of a convert_checkpoint line, in bytes.
double printed_host_peak(const std::string& out) {
  std::smatch m;
  if (!std::regex_search(out, m, std::regex("host peak ([0-9.]+) GB"))) return -1;
  return std::stod(m[1]) * 1e9;
}

TEST(StreamingCli, ImportAndMergeHoldATensorNotTheModel) {
  test::TempDir tmp;
  const ModelConfig cfg = load_model_config(write_model_config(tmp.path()));
  const std::vector<HfTensorSlot> slots = hf_llama_tensor_layout(cfg);
  int64_t largest = 0;
  for (const HfTensorSlot& s : slots) largest = std::max(largest, s.numel());
  const double model_fp32 = 4.0 * static_cast<double>(cfg.num_parameters());
  ASSERT_GT(model_fp32, 60.0 * 4.0 * static_cast<double>(largest)) << "the model must dwarf its largest tensor";

  // The base, written entry by entry (never the whole model in memory), sharded at 40 MB.
  const std::string hf = (tmp.path() / "base").string();
  {
    HfExportStream stream(cfg, hf, HfExportOptions{.max_shard_bytes = 40'000'000});
    const std::vector<ParamEntry> layout = param_layout(cfg);
    std::vector<float> values;
    for (size_t i = 0; i < layout.size(); ++i) {
      values.resize(static_cast<size_t>(layout[i].numel()));
      initial_parameter_values(layout[i], i, 7, values.data());
      stream.write(layout[i].offset, values.data(), layout[i].numel());
    }
    stream.finish();
    EXPECT_LE(stream.peak_pending_elements(), largest);
  }
  ASSERT_TRUE(fs::exists(fs::path(hf) / "model.safetensors.index.json")) << "a sharded checkpoint";

  // 1. The import: the resident set's high-water mark, reset first (/proc/self/clear_refs 5; a fork would
  // inherit this process's OpenMP threads' state), grows by about one tensor.
  if (kMemoryMeasurable) {
    const bool reset = static_cast<bool>(std::ofstream("/proc/self/clear_refs") << "5");
    const int64_t before = status_bytes("VmRSS");
    read_hf_weights(hf, cfg, [](int64_t, const float*, int64_t) {});
    const double growth = static_cast<double>(status_bytes("VmHWM") - before);
    if (reset)
      EXPECT_LT(growth, 48e6) << "reading " << model_fp32 / 1e6 << " MB of FP32 values grew the process by "
                              << growth / 1e6 << " MB (largest tensor " << 4.0 * largest / 1e6 << " MB in FP32)";
  }

  // 2. A LoRA checkpoint over it (one step, so B is no longer zero), then the PEFT export and the merge.
  const std::string ckpt = (tmp.path() / "lora").string(), peft = (tmp.path() / "peft").string(),
                    merged = (tmp.path() / "merged").string();
  const test::ProcessResult train = test::run_process(
      PL_APP_PATH, {"--device", "cpu", "--init-from-hf", hf, "--peft", "lora", "--lora-dim", "8", "--disable-fp4",
                    "--train-iters", "1", "--global-batch-size", "1", "--micro-batch-size", "1", "--seq-length", "32",
                    "--lr", "1e-2", "--save", ckpt},
      300.0);
  ASSERT_EQ(train.exit_code, 0) << train.err;
  const test::ProcessResult to_peft =
      test::run_process(PL_CONVERT_CHECKPOINT_PATH, {"--load", ckpt, "--to-peft", peft}, 300.0);
  ASSERT_EQ(to_peft.exit_code, 0) << to_peft.err;
  const test::ProcessResult merge = test::run_process(
      PL_CONVERT_CHECKPOINT_PATH, {"--load", ckpt, "--merge-lora", "--to-hf", merged, "--max-shard-size", "40MB"}, 300.0);
  ASSERT_EQ(merge.exit_code, 0) << merge.err;
  if (kMemoryMeasurable) {
    const double adapters_only = printed_host_peak(to_peft.out), with_base = printed_host_peak(merge.out);
    ASSERT_GT(adapters_only, 0) << to_peft.out;
    ASSERT_GT(with_base, 0) << merge.out;
    EXPECT_LT(with_base - adapters_only, 48e6) << "merging " << model_fp32 / 1e6 << " MB of FP32 base values: "
                                               << merge.out << " against the adapters alone: " << to_peft.out;
  }

  // 3. The streamed merge is the whole-model merge, tensor for tensor.
  const VerifiedCheckpoint c = verify_checkpoint(ckpt);
  std::vector<float> expected = read_lora_base(c);
  merge_lora_into(c.model, *c.lora, read_master_weights(c), expected);
  const SafetensorsCheckpoint out(merged);
  std::vector<float> got;
  size_t changed = 0;
  for (const HfTensorSlot& s : slots) {
    got.resize(static_cast<size_t>(s.numel()));
    out.read_float(s.name, got.data());
    for (int64_t i = 0; i < s.numel(); ++i)
      ASSERT_EQ(got[static_cast<size_t>(i)], num::round_bf16(expected[static_cast<size_t>(s.offset + i)]))
          << s.name << " element " << i;
  }
  std::vector<float> base = read_lora_base(c);
  for (size_t i = 0; i < base.size(); ++i) changed += num::round_bf16(base[i]) != num::round_bf16(expected[i]);
  EXPECT_GT(changed, base.size() / 10) << "the adapters moved the targeted weights";
}

}  // namespace
