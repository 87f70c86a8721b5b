#pragma once
// Hugging Face safetensors files, read and written by our own code (format: README "Format" of
// github.com/huggingface/safetensors, and the checks of its reference reader, safetensors/src/tensor.rs):
//
//   8 bytes   N, little-endian u64: the header length
//   N bytes   UTF-8 JSON object {"<name>": {"dtype": "BF16", "shape": [r, c], "data_offsets": [b, e]}, ...,
//             "__metadata__": {"<key>": "<string>", ...}}   (the metadata entry is optional)
//   the rest  the data section; a tensor's bytes are [b, e) relative to its start, little-endian, C order
//
// A sharded checkpoint is a directory with model.safetensors.index.json ({"metadata": {"total_size": n},
// "weight_map": {"<name>": "<shard file>"}}) beside the shard files; an unsharded one holds
// model.safetensors (transformers' SAFE_WEIGHTS_NAME / SAFE_WEIGHTS_INDEX_NAME).
//
// Every error is a one-line pl::Error naming the file (and the tensor where there is one).
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "io/mapped_file.h"

namespace pl {

class AtomicFile;  // io/atomic_file.h

struct SafetensorsTensorInfo {
  std::string name;
  std::string dtype;            // the header's spelling: "BF16", "F16", "F32", "I64", ...
  std::vector<int64_t> shape;   // may be empty (a scalar) or hold zeros (an empty tensor)
  uint64_t begin = 0, end = 0;  // data_offsets, relative to the start of the data section
  int64_t numel() const;
  std::string shape_str() const;  // "[4, 8]"
};

// One .safetensors file, mapped read-only and validated on open.
class SafetensorsFile {
 public:
  // Validates what the reference reader validates — the header length fits the file (and is at
  // most 100 MB), the header is a JSON object without duplicate keys, every entry has a known dtype,
  // a shape of non-negative integers and data_offsets [begin <= end] with end - begin ==
  // numel * itemsize, and the tensors, sorted by offset, tile the data section exactly (no gap, no
  // overlap, ending at the end of the file) — and also that __metadata__ maps strings to strings.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return path_; }
  // In data-section order.
  const std::vector<SafetensorsTensorInfo>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const SafetensorsTensorInfo* find(const std::string& name) const;
  // Fails naming the file and the tensor when absent.
  const SafetensorsTensorInfo& info(const std::string& name) const;
  // The stored bytes of one tensor.
  std::span<const uint8_t> bytes(const std::string& name) const;
  // The tensor converted to float: BF16, F16 and F32 convert exactly; any other dtype is an error.
  std::vector<float> read_float(const std::string& name) const;
  // The same into out[0, numel).
  void read_float(const std::string& name, float* out) const;

 private:
  std::string path_;
  MappedFile map_;         // the whole file
  size_t data_start_ = 0;  // 8 + N
  std::vector<SafetensorsTensorInfo> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face weights directory: model.safetensors, or model.safetensors.index.json and its shards
// (the single file wins when both exist, as in transformers' from_pretrained).
class SafetensorsCheckpoint {
 public:
  // Opens and validates every file. For a sharded checkpoint: every weight_map value must be a plain
  // file name in the directory, every tensor the index lists must be in its shard, and a shard may not
  // hold a tensor that the index does not list (or lists in another shard).
  explicit SafetensorsCheckpoint(const std::string& dir);

  const std::string& dir() const { return dir_; }
  bool sharded() const { return sharded_; }
  size_t num_files() const { return files_.size(); }
  std::vector<std::string> names() const;  // sorted
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsTensorInfo& info(const std::string& name) const;
  const SafetensorsFile& file_of(const std::string& name) const;
  std::vector<float> read_float(const std::string& name) const { return file_of(name).read_float(name); }
  void read_float(const std::string& name, float* out) const { file_of(name).read_float(name, out); }
  // The sum of every tensor's stored bytes.
  uint64_t data_bytes() const;

 private:
  std::string dir_;
  bool sharded_ = false;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;  // tensor -> files_ index
};

// A tensor to write: `numel(shape)` floats, stored as "BF16" (round to nearest even) or "F32".
struct SafetensorsTensorOut {
  std::string name;
  std::string dtype;  // "BF16" or "F32"
  std::vector<int64_t> shape;
  const float* data = nullptr;
};

// Writes one file atomically (io/atomic_file.h; on failure nothing is left). The header lists the
// tensors in the given order with contiguous offsets, carries __metadata__ (e.g. {"format": "pt"},
// which transformers expects), and is padded with spaces to a multiple of 8 bytes as the reference
// writer does, so the data section starts 8-byte aligned.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// The file names of a checkpoint of `num_shards` files: {"model.safetensors"} for one, else
// "model-00001-of-00003.safetensors", ... as transformers' save_pretrained names them.
std::vector<std::string> safetensors_shard_names(size_t num_shards);

// Which shard each tensor goes to under huggingface_hub's rule (used by transformers' save_pretrained):
// tensors in order; the shard being filled is closed when the next tensor would take it over
// max_shard_bytes; a tensor larger than the limit gets a shard of its own, appended when it is met.
std::vector<size_t> plan_safetensors_shards(const std::vector<SafetensorsTensorOut>& tensors, uint64_t max_shard_bytes);

// A checkpoint written tensor by tensor, as write_safetensors_checkpoint lays it out (the same files, shards,
// headers and index): the tensors' names, dtypes and shapes (their data pointers unused) fix every file's header
// and offsets up front; put(i, values) converts tensor i and writes it at its place, in any order, each tensor once,
// so only one tensor need ever be in memory; finish() checks that every tensor was put and publishes the set as
// write_safetensors_checkpoint does. Destroyed before finish(): the temporaries are removed, nothing is published.
class SafetensorsStreamWriter {
 public:
  SafetensorsStreamWriter(std::string dir, std::vector<SafetensorsTensorOut> tensors, uint64_t max_shard_bytes);
  ~SafetensorsStreamWriter();
  SafetensorsStreamWriter(const SafetensorsStreamWriter&) = delete;
  SafetensorsStreamWriter& operator=(const SafetensorsStreamWriter&) = delete;

  size_t size() const { return tensors_.size(); }
  const SafetensorsTensorOut& tensor(size_t i) const { return tensors_[i]; }
  void put(size_t i, const float* values);
  std::vector<std::string> finish();  // the file names written

 private:
  std::string dir_;
  std::vector<SafetensorsTensorOut> tensors_;
  std::vector<size_t> shard_;  // tensor -> file
  std::vector<uint64_t> at_;   // tensor -> its data's byte offset in its file
  std::vector<bool> put_;
  std::vector<std::string> names_;  // the files
  std::vector<std::unique_ptr<AtomicFile>> files_;
};

// Writes `tensors` into `dir` (created if needed) as model.safetensors, or, when they exceed
// max_shard_bytes, as model-0000i-of-0000n.safetensors plus model.safetensors.index.json. Every file
// is first written and fsynced under a temporary name; only when all are complete are they committed
// (the index last), and weight files of an earlier export that the new set does not include are
// removed, so a reader never mixes two exports. Returns the file names written.
std::vector<std::string> write_safetensors_checkpoint(const std::string& dir,
                                                      const std::vector<SafetensorsTensorOut>& tensors,
                                                      uint64_t max_shard_bytes);

}  // namespace pl
