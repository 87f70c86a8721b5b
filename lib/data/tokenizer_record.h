#pragma once
// The sidecar preprocess_data writes next to "<prefix>.bin/.idx": "<prefix>.tokenizer.json", saying
// which tokenizer made the token ids (so the trainer can take eod and the vocabulary size from the
// data instead of trusting a flag). Megatron has no such file; a Megatron-made dataset has none.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace pl::data {

struct TokenizerRecord {
  std::string type;        // "byte" or "tiktoken"
  std::string model_path;  // absolute path of the tokenizer model file ("" for byte)
  int64_t model_size = 0;  // its size in bytes
  std::string model_fnv1a64;  // FNV-1a 64 of its bytes, 16 lowercase hex digits ("" for byte)
  int64_t vocab_size = 0;
  int32_t eod = 0;
  int32_t bos = 0;
  bool append_eod = false;   // each non-empty document ends with eod
  bool prepend_bos = false;  // each document starts with bos
  // The dataset it was published with (optional; -1 / "" when absent, as in files written before
  // these fields): the .bin's size and the checksum64 (core/checksum.h) of the .idx, 16 lowercase
  // hex digits. IndexedDataset refuses a .bin/.idx that does not match them.
  int64_t data_bin_bytes = -1;
  std::string data_idx_checksum64;
};

std::string tokenizer_record_path(const std::string& prefix);  // "<prefix>.tokenizer.json"

// FNV-1a 64 of a file's bytes as 16 lowercase hex digits; its size goes to *size.
std::string fnv1a64_file_hex(const std::string& path, int64_t* size);

// Written atomically (io/atomic_file.h).
void write_tokenizer_record(const std::string& prefix, const TokenizerRecord& record);
// The file's contents (for a writer that publishes it with other files: io/atomic_file.h FileSet).
std::string tokenizer_record_text(const TokenizerRecord& record);

// std::nullopt when "<prefix>.tokenizer.json" does not exist; a malformed file is a one-line error.
std::optional<TokenizerRecord> read_tokenizer_record(const std::string& prefix);
// The same record read from a file of any name (a Hugging Face export's kHfTokenizerRecordName).
std::optional<TokenizerRecord> read_tokenizer_record_file(const std::string& path);

// What convert_checkpoint --to-hf writes beside config.json when the checkpoint's data has a record, so that the
// generate tool finds the tokenizer of an exported model (Hugging Face's tokenizer.json is not made).
inline constexpr const char* kHfTokenizerRecordName = "pretrain_llama_tokenizer.json";

// The first dataset prefix a pretrain_llama command line (argv, as a checkpoint's metadata keeps it) trains on:
// --data-path PREFIX, or the first prefix of a blend "W1 P1 W2 P2"; "" without --data-path (mock data).
std::string data_prefix_of_command_line(const std::vector<std::string>& argv);

}  // namespace pl::data
