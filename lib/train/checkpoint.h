#pragma once
// Checkpoints: save and resume bit-identically, atomically.
//
// Layout (Megatron's names, megatron/training/checkpointing.py: get_checkpoint_name,
// get_checkpoint_tracker_filename):
//   DIR/latest_checkpointed_iteration.txt   the iteration of the newest complete checkpoint
//   DIR/iter_0000010/master_fp32.bin         one file per flat state buffer (DESIGN "State in flat
//                    weights_bf16.bin        buffers"): raw little-endian, the flat layout of
//                    adam_m_fp32.bin         LlamaModel::param_entries(); the moments in their
//                    adam_v_fp32.bin         dtypes (adam_m_bf16.bin / adam_v_bf16.bin under
//                                            --exp-avg-dtype / --exp-avg-sq-dtype bf16; the
//                                            manifest's dtype says which; the other dtype converts on load)
//                    metadata.json           model config, recipe, train state, data position, RNG,
//                                            command line, timestamp
//                    manifest.json           format version; per file name, dtype, shape, bytes, checksum
// A checkpoint is written into DIR/iter_0000010.tmp-<pid>/, every file and the directory fsynced,
// then renamed to iter_0000010 and DIR fsynced; only then is the tracker replaced (tmp + rename +
// fsync): io/atomic_file.h. A crash at any moment leaves the previous checkpoint loadable; leftover
// *.tmp-* entries are ignored by load and removed by the next successful save.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "backend/gemm_algorithms.h"
#include "config/model_config.h"
#include "config/train_config.h"
#include "io/fd.h"
#include "parallel/world.h"
#include "model/hf_llama.h"
#include "model/llama.h"
#include "train/optimizer.h"
#include "train/trainer.h"

namespace pl {

inline constexpr const char* kCheckpointTracker = "latest_checkpointed_iteration.txt";
inline constexpr int kCheckpointFormatVersion = 1;

// What the run is, recorded in metadata.json and compared on load.
struct RunDescription {
  ModelConfig model;
  std::string recipe_name, recipe_file;
  std::vector<std::string> plan;          // the precision plan, one line per layer group
  TrainConfig train;
  std::vector<std::string> command_line;  // argv
  std::string data;                       // e.g. "mock (seed 1234, vocab 512)"
  // cuBLASLt's algorithm per GEMM as the run chose them (backend/gemm_algorithms.h): saved as
  // gemm_algorithms.json when not empty, so a resume installs the same ones (read_gemm_algorithms).
  GemmAlgorithms gemm_algorithms;
  // --peft lora: the adapters' configuration and the frozen base's record (metadata.json "peft"); the flat
  // state files then hold the adapters only. The base's checksum is filled in before the first save.
  std::optional<LoraConfig> lora;
  LoraBaseRecord lora_base;
};

struct SaveReport {
  std::string path;   // DIR/iter_0000010
  double bytes = 0;   // state files + metadata + manifest
  double seconds = 0; // from the first byte to the tracker update (pruning excluded)
  std::vector<std::string> pruned;  // iter_ directories removed by keep_last
};

// Test seam: called once per file of a save (state files, metadata.json, manifest.json, the tracker)
// with its name, after half of its first piece is written; a test stalls (to kill -9 the process in
// the middle of a save: tests/tools/checkpoint_stall.cpp) or throws there.
using CheckpointWriteHook = std::function<void(const std::string& file_name)>;

// Writes the checkpoint of `state` (the state after iteration state.iteration) into `dir` as
// described above, then, when keep_last > 0, removes all but the newest keep_last iter_ directories.
// Data-parallel ranks (`world` with more than one rank) all call it: rank 0 writes and publishes the
// directory; with the distributed optimizer (model.sharded()) every rank writes the elements of its shard
// into rank 0's temporary directory (positioned writes; the files are the same bytes for any rank count)
// and sends rank 0 the checksum digests of the 1 MiB chunks it wrote whole. Every rank returns once the
// checkpoint is published (the report's bytes are rank 0's).
SaveReport save_checkpoint(const std::string& dir, int64_t keep_last, const LlamaModel& model, const AdamW& opt,
                           const TrainState& state, const RunDescription& run, const CheckpointWriteHook& hook = {},
                           const parallel::World* world = nullptr);

// --save DIR claimed at start-up (issue 14, class 10), so that what would fail at the first save (hours
// in) fails before the first iteration, and two runs never save into one directory:
// - DIR is created if missing; a DIR that is not a directory, or where no file can be created, is a
//   one-line error;
// - DIR/pretrain_llama.lock is opened and locked with flock(LOCK_EX | LOCK_NB) for the life of the
//   object; it holds the owner's pid and host, which a second run names in its one-line refusal. The
//   lock file itself stays (removing it would race with a run that has just opened it). flock on NFS is
//   emulated with POSIX locks by Linux (since 2.6.12), so ranks on different hosts exclude each other too.
// With data parallelism only rank 0 (the writer of the directory) holds it.
class SaveDirectoryLock {
 public:
  explicit SaveDirectoryLock(const std::string& dir);
  SaveDirectoryLock(const SaveDirectoryLock&) = delete;
  SaveDirectoryLock& operator=(const SaveDirectoryLock&) = delete;
  // One checkpoint of `bytes` must fit in the free space of DIR's file system (a save writes the new
  // checkpoint before it prunes old ones): otherwise a one-line error with both figures.
  void check_free_space(uint64_t bytes) const;
  static constexpr const char* kLockFile = "pretrain_llama.lock";

 private:
  std::string dir_;
  UniqueFd fd_;  // holds the flock until closed
};

// The bytes one checkpoint of this model and optimizer takes on disk (state files; metadata and manifest
// are a few KB and are counted as 1 MB).
uint64_t checkpoint_bytes(const LlamaModel& model, const AdamW& opt);

// One state file as the manifest lists it.
struct CheckpointFile {
  std::string name, dtype;  // dtype: f32 | bf16 | json
  int64_t numel = 0;
  uint64_t bytes = 0;
  uint64_t checksum = 0;
};

// A checkpoint found and verified on disk: every listed file exists with its size and checksum.
// Nothing has been loaded into a model.
struct VerifiedCheckpoint {
  std::string path;  // the iter_ directory
  int64_t iteration = 0;
  std::vector<CheckpointFile> files;
  ModelConfig model;  // shape fields as saved
  std::string recipe_name;
  bool fp8_delayed_scaling = false;  // the saving run kept FP8 delayed-scaling state (absent before issue 38: false)
  TrainConfig train;  // the batch and schedule settings as saved
  TrainState state;
  int64_t optimizer_steps = 0;
  std::vector<std::string> command_line;  // the saving run's argv (empty in checkpoints that lack it)
  double bytes = 0, seconds = 0;  // verified bytes and the time it took
  // A LoRA checkpoint (metadata.json "peft"): its adapters' configuration and its base's record; empty: every
  // parameter's state.
  std::optional<LoraConfig> lora;
  LoraBaseRecord lora_base;
};

// True when `dir` holds neither a tracker nor an iter_ directory (leftover *.tmp-* ignored): Megatron
// then starts from random (checkpointing.py, _load_base_checkpoint: "could not find the metadata file").
bool checkpoint_dir_is_empty(const std::string& dir);

// `load` is a --save directory (the tracker names the iteration) or one iter_ directory. Reads the
// manifest and metadata and verifies every file's size and checksum. Any problem: a one-line
// pl::Error naming the file and the mismatch.
// read_contents false: the files' sizes only (the other data-parallel ranks, when rank 0 reads every byte).
VerifiedCheckpoint verify_checkpoint(const std::string& load, bool read_contents = true);

// Refuses (one line naming the field) a checkpoint of another model shape; returns one log line per
// allowed difference (recipe, batch sizes, sequence length, schedule).
std::vector<std::string> compare_checkpoint_with_run(const VerifiedCheckpoint& ckpt, const ModelConfig& model,
                                                     const std::string& recipe_name, const TrainConfig& train);

// --load with --peft lora or of a LoRA checkpoint (one line naming what does not fit, else nothing): a LoRA
// checkpoint needs --peft lora with the same adapter shapes (dim, targets); a full checkpoint under --peft lora is
// the frozen base and needs --finetune (its weights only).
void check_checkpoint_peft(const VerifiedCheckpoint& ckpt, const std::optional<LoraConfig>& run_lora, bool finetune);

// The elements of a checkpoint's flat state files: every parameter of ckpt.model, or a LoRA checkpoint's adapters.
int64_t checkpoint_flat_elements(const VerifiedCheckpoint& ckpt);
// The FP32 master weights of a verified checkpoint, in the flat layout of LlamaModel::param_entries()
// for ckpt.model (the adapters' lora_layout for a LoRA checkpoint; re-checking the checksum as it reads): what an
// export needs, without building a model or its optimizer state.
std::vector<float> read_master_weights(const VerifiedCheckpoint& ckpt);
// The same a piece at a time (offsets in floats of the flat layout), so a reader keeps no copy of all of them: the
// checksum is checked at the end, after every piece went to `write` (a caller discards what it built on an error).
void stream_master_weights(const VerifiedCheckpoint& ckpt, const FlatWeightWriter& write);

// A LoRA checkpoint's frozen base as FP32 values in param_layout's order, from where its record says it came from
// ("hf DIR": that directory, or `hf_dir` when given, the record's path having moved; "checkpoint DIR": that full
// checkpoint's master weights; "init seed N": the random initialisation of seed N), checked against the record's
// checksum of its BF16 weights: a base that changed since the adapters were trained is one line naming both. The
// whole base in memory: the streamed merge's reference in the tests (the programs use stream_lora_base below).
std::vector<float> read_lora_base(const VerifiedCheckpoint& ckpt, const std::string& hf_dir = "");
// The same base streamed into `write` (each entry's values in flat order, one tensor or piece at a time: host memory
// bounded by the largest tensor), its checksum taken as it passes and checked at the end: a caller writing an output
// writes it into a temporary that the mismatch's exception discards.
void stream_lora_base(const VerifiedCheckpoint& ckpt, const std::string& hf_dir, const FlatWeightWriter& write);

// Reads the state files into the model's master weights and bf16 weights and the optimizer's
// moments (re-checking each checksum as it reads), re-quantizes the weights of quantized layers, and
// returns the train state to continue from. With the distributed optimizer each rank reads its shard's
// range of every file (any data-parallel size: the files do not depend on it) and the weights are
// all-gathered; the checksums are rank 0's verify_checkpoint's.
// weights_only (Megatron's --finetune: "load model for finetuning; do not load optimizer or rng state from
// checkpoint and set iteration to 0"): the master and bf16 weights only; the moments, the optimizer's step count
// and FP8 delayed scaling's histories stay as they are (fresh), and the returned state is iteration 0.
TrainState restore_checkpoint(const VerifiedCheckpoint& ckpt, LlamaModel& model, AdamW& opt, bool weights_only = false);

// The cuBLASLt algorithms the checkpoint's run chose (its gemm_algorithms.json; empty when it has none: the CPU,
// or a checkpoint of an older build), checked against the manifest's checksum.
GemmAlgorithms read_gemm_algorithms(const VerifiedCheckpoint& c);
inline constexpr const char* kGemmAlgorithmsFile = "gemm_algorithms.json";

}  // namespace pl
