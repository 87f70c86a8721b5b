#include "train/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/checksum.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/fd.h"
#include "io/file_checks.h"
#include "io/json_text.h"
#include "train/checkpoint_metadata.h"
#include "train/checkpoint_state.h"

namespace pl {
namespace fs = std::filesystem;
using nlohmann::json;
using checkpoint_state::file_to_tensor_dtype;
using checkpoint_state::kFp8StateFile;
using checkpoint_state::state_buffers;
using checkpoint_state::state_to_host;
using checkpoint_state::StateBuffer;
using checkpoint_state::tensor_to_file_dtype;

namespace {

// Host staging for device<->file copies: bounded memory for any model size, and a whole number of
// checksum chunks so one streaming checksum covers the file.
constexpr size_t kPieceBytes = size_t{64} << 20;
static_assert(kPieceBytes % Checksum64::kChunkBytes == 0);

constexpr const char* kManifest = "manifest.json";
constexpr const char* kMetadata = "metadata.json";

std::string iter_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- files with their checksums --------------------------------------------------------------

// One file of a save, written atomically (io/atomic_file.h) with its checksum taken on the way; the
// test hook runs once, after half of the first piece.
class ChecksummedFile {
 public:
  ChecksummedFile(const fs::path& path, const CheckpointWriteHook& hook, const std::string& tmp_suffix = ".tmp")
      : file_(path.string(), tmp_suffix), name_(path.filename().string()), hook_(hook) {}
  void write(const void* data, size_t bytes) {
    const auto* p = static_cast<const char*>(data);
    size_t done = 0;
    if (first_ && hook_) {
      done = bytes / 2;
      file_.write(p, done);
      hook_(name_);
    }
    first_ = false;
    file_.write(p + done, bytes - done);
    checksum_.update(data, bytes);
  }
  CheckpointFile commit(const std::string& dtype, int64_t numel) {
    file_.commit();
    return CheckpointFile{name_, dtype, numel, file_.bytes_written(), checksum_.digest()};
  }

 private:
  AtomicFile file_;
  std::string name_;
  const CheckpointWriteHook& hook_;
  bool first_ = true;
  Checksum64 checksum_;
};

CheckpointFile write_text_file(const fs::path& path, const std::string& text, const CheckpointWriteHook& hook,
                               const std::string& tmp_suffix = ".tmp") {
  ChecksummedFile f(path, hook, tmp_suffix);
  f.write(text.data(), text.size());
  return f.commit("json", 0);
}

// ---- state buffers <-> files -------------------------------------------------------------------

CheckpointFile write_state_buffer(const fs::path& dir, const StateBuffer& b, std::vector<char>& staging,
                                  const CheckpointWriteHook& hook) {
  ChecksummedFile f(dir / b.name, hook);
  const size_t file_elem = dtype_size(b.file_dtype), tensor_elem = dtype_size(b.tensor.dtype);
  const int64_t n = b.tensor.numel();
  const auto per_piece = static_cast<int64_t>(kPieceBytes / file_elem);
  staging.resize(static_cast<size_t>(per_piece) * std::max(file_elem, tensor_elem));
  for (int64_t off = 0; off < n; off += per_piece) {
    const int64_t cnt = std::min(per_piece, n - off);
    state_to_host(b, staging.data(), off, cnt);
    tensor_to_file_dtype(staging.data(), b.tensor.dtype, staging.data(), b.file_dtype, static_cast<size_t>(cnt));
    f.write(staging.data(), static_cast<size_t>(cnt) * file_elem);
  }
  return f.commit(dtype_name(b.file_dtype), n);
}

// ---- data-parallel ranks: each writes and reads its own range --------------------------------
//
// With the distributed optimizer every rank writes the flat elements of its shard ([shard.begin,
// shard.real_end())) of every state file (positioned writes into files rank 0 created at their full
// size), so the files are the same, byte for byte, whatever the number of ranks. The checksum of a file
// is put together from its 1 MiB chunks (core/checksum.h): each rank digests the chunks wholly inside
// the bytes it wrote; rank 0 gathers those and reads back only the chunks that straddle two ranks.

// This rank's flat elements of every state file: its shard's real elements.
std::pair<int64_t, int64_t> rank_elements(const LlamaModel& model) {
  return {model.shard().real_begin(), model.shard().real_end()};
}

// Writes flat elements [lo, hi) of b into `path` (a file of `numel` elements of b.file_dtype) and returns
// (chunk index, digest) pairs of the checksum chunks wholly inside the bytes written (the file's last,
// short chunk included when the range reaches the end). Pieces are cut at chunk boundaries.
std::vector<uint64_t> write_state_range(const fs::path& path, const StateBuffer& b, int64_t lo, int64_t hi,
                                        int64_t numel, std::vector<char>& staging) {
  std::vector<uint64_t> out;
  if (lo >= hi) return out;
  const size_t fe = dtype_size(b.file_dtype), te = dtype_size(b.tensor.dtype);
  const uint64_t K = Checksum64::kChunkBytes, total = static_cast<uint64_t>(numel) * fe;
  const uint64_t end = static_cast<uint64_t>(hi) * fe;
  staging.resize(kPieceBytes / fe * std::max(fe, te));
  const UniqueFd fd = open_fd(path.string(), O_WRONLY);
  for (uint64_t pos = static_cast<uint64_t>(lo) * fe; pos < end;) {
    const uint64_t next = std::min(end, pos % K ? (pos / K + 1) * K : pos + kPieceBytes);
    const auto e0 = static_cast<int64_t>(pos / fe), cnt = static_cast<int64_t>((next - pos) / fe);
    state_to_host(b, staging.data(), e0 - b.first, cnt);
    tensor_to_file_dtype(staging.data(), b.tensor.dtype, staging.data(), b.file_dtype, static_cast<size_t>(cnt));
    pwrite_all(fd, staging.data(), next - pos, pos);
    for (uint64_t c = (pos + K - 1) / K; c * K < next; ++c) {
      const uint64_t chunk_end = std::min((c + 1) * K, total);
      if (chunk_end <= next) out.insert(out.end(), {c, checksum_chunk_digest(staging.data() + (c * K - pos), chunk_end - c * K)});
    }
    pos = next;
  }
  fsync_fd(fd);
  return out;
}

// Rank 0: the file's checksum from the digests every rank sent ((chunk, digest) pairs), reading back the
// chunks nobody could digest whole.
uint64_t checksum_from_ranks(const fs::path& path, uint64_t total, const std::vector<uint64_t>& pairs) {
  const uint64_t K = Checksum64::kChunkBytes, chunks = (total + K - 1) / K;
  std::vector<uint64_t> digests(chunks);
  std::vector<bool> have(chunks, false);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) {
    PL_CHECK(pairs[i] < chunks, "internal: chunk {} of {} in {}", pairs[i], chunks, path.string());
    digests[pairs[i]] = pairs[i + 1];
    have[pairs[i]] = true;
  }
  std::vector<char> chunk(K);
  UniqueFd fd;
  for (uint64_t c = 0; c < chunks; ++c) {
    if (have[c]) continue;
    if (!fd.valid()) fd = open_regular_file(path.string());
    const size_t bytes = static_cast<size_t>(std::min(K, total - c * K));
    pread_exact(fd, chunk.data(), bytes, c * K);
    digests[c] = checksum_chunk_digest(chunk.data(), bytes);
  }
  return checksum_from_chunks(digests, total);
}

// Sends a string from rank 0 to every rank.
std::string broadcast_string(const parallel::World& world, std::string s) {
  uint64_t n = s.size();
  world.broadcast(&n, sizeof n, 0);
  s.resize(n);
  world.broadcast(s.data(), n, 0);
  return s;
}

// ---- directory housekeeping --------------------------------------------------------------------

bool is_tmp_name(const std::string& name) { return name.find(".tmp-") != std::string::npos; }

// iter_NNNNNNN (digits only) -> iteration; -1 otherwise.
int64_t iteration_of_dir_name(const std::string& name) {
  if (name.rfind("iter_", 0) != 0 || name.size() <= 5) return -1;
  const std::string digits = name.substr(5);
  if (digits.size() > 18 || !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;  // not one of ours (and past int64)
  return std::stoll(digits);
}

std::vector<std::pair<int64_t, fs::path>> iteration_dirs(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const int64_t it = iteration_of_dir_name(e.path().filename().string());
    if (it >= 0 && e.is_directory()) out.emplace_back(it, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Leftovers of interrupted saves (ours are all complete by now): the "*.tmp-<pid>" and "*.tmp-prune-<pid>"
// entries of this process and of processes that no longer exist, and any *.tmp-* name without a pid. Another
// live process's temporary is left alone (the directory lock keeps a second run out, but a temporary must
// never be taken from under its writer).
// Called after the save is published: a leftover that cannot be removed is only a leftover, so it does
// not fail the save (the next save tries again).
void remove_tmp_entries(const fs::path& dir) {
  try {
    remove_dead_temporaries(dir.string(), [](const std::string& name) {
      if (!is_tmp_name(name)) return -1L;
      return std::max(0L, pid_after(std::string_view(name).substr(name.rfind('-') + 1), ""));
    });
  } catch (const Error&) {
  }
}

// Deletes all but the newest keep_last iter_ directories; each is renamed to a *.tmp-* name first so a
// crash in the middle of a deletion never leaves a half-deleted directory under a valid name.
std::vector<std::string> prune(const fs::path& dir, int64_t keep_last, int64_t current) {
  std::vector<std::string> removed;
  auto dirs = iteration_dirs(dir);
  if (keep_last <= 0 || static_cast<int64_t>(dirs.size()) <= keep_last) return removed;
  dirs.resize(dirs.size() - static_cast<size_t>(keep_last));
  for (const auto& [it, path] : dirs) {
    if (it == current) continue;
    const fs::path doomed = path.string() + fmt::format(".tmp-prune-{}", ::getpid());
    rename_path(path.string(), doomed.string());
    std::error_code ec;
    fs::remove_all(doomed, ec);
    removed.push_back(path.filename().string());
  }
  fsync_directory(dir.string());
  return removed;
}

// ---- reading -----------------------------------------------------------------------------------

std::string read_small_file(const fs::path& path) { return read_regular_file(path.string()); }

json parse_json_file(const fs::path& path) { return parse_json_text(read_small_file(path), path.string()); }

template <class T>
T field(const json& j, const char* key, const fs::path& file) {
  return json_field<T>(j, key, file.string());
}

uint64_t parse_hex64(const std::string& s, const fs::path& file) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 16);
  PL_CHECK(s.rfind("0x", 0) == 0 && errno == 0 && end != nullptr && *end == '\0', "{}: bad checksum '{}'",
           file.string(), s);
  return v;
}

// Streams a file through `staging`, piece by piece, calling on_piece(data, bytes, offset) for each and
// returning the checksum of the bytes read. Reads exactly `expected_bytes`.
template <class OnPiece>
uint64_t stream_file(const fs::path& path, uint64_t expected_bytes, std::vector<char>& staging, OnPiece on_piece) {
  const UniqueFd fd = open_regular_file(path.string());
  Checksum64 sum;
  // (no larger than the file: verifying a 2 KB metadata.json need not allocate and zero 64 MiB)
  staging.resize(std::max(staging.size(), static_cast<size_t>(std::min<uint64_t>(kPieceBytes, expected_bytes))));
  uint64_t done = 0;
  while (done < expected_bytes) {
    const size_t want = static_cast<size_t>(std::min<uint64_t>(kPieceBytes, expected_bytes - done));
    const size_t got = read_up_to(fd, staging.data(), want);
    PL_CHECK(got == want, "{}: read {} of {} bytes (truncated?)", path.string(), done + got, expected_bytes);
    sum.update(staging.data(), want);
    on_piece(staging.data(), want, done);
    done += want;
  }
  return sum.digest();
}

void verify_file(const fs::path& dir, const CheckpointFile& f, std::vector<char>& staging, bool read_contents) {
  const fs::path path = dir / f.name;
  std::error_code ec;
  PL_CHECK(fs::exists(fs::symlink_status(path, ec)), "{}: missing (listed in {})", path.string(), kManifest);
  // Through the one reader's check, so a FIFO or a directory is named as such and never blocks.
  const uint64_t size = file_size(open_regular_file(path.string()));
  PL_CHECK(size == f.bytes, "{}: {} bytes but the manifest says {} ({})", path.string(), size, f.bytes,
           size < f.bytes ? "truncated" : "longer than written");
  if (!read_contents) return;
  const uint64_t sum = stream_file(path, f.bytes, staging, [](const char*, size_t, uint64_t) {});
  PL_CHECK(sum == f.checksum, "{}: checksum {} but the manifest says {} (the file is corrupted)", path.string(),
           hex64(sum), hex64(f.checksum));
}

// The iter_ directory `load` designates: itself, or the one its tracker names.
fs::path resolve_iteration_dir(fs::path load) {
  if (load.filename().empty()) load = load.parent_path();  // "D/iter_0000010/"
  std::error_code ec;
  PL_CHECK(fs::is_directory(load, ec), "--load {}: no such directory", load.string());
  if (iteration_of_dir_name(load.filename().string()) >= 0 || fs::exists(load / kManifest, ec)) return load;
  const fs::path tracker = load / kCheckpointTracker;
  if (!fs::exists(tracker, ec)) {
    // An iter_ directory is complete once renamed into place; a crash before the tracker update of the
    // first save leaves one without a tracker. The newest is the one the tracker would have named
    // (verify_checkpoint still checks every file).
    const auto dirs = iteration_dirs(load);
    PL_CHECK(!dirs.empty(), "--load {}: missing tracker {} (no complete checkpoint to resume from)", load.string(),
             tracker.string());
    return dirs.back().second;
  }
  std::string text = read_small_file(tracker);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
  PL_CHECK(digits && text.size() < 18, "{}: holds '{}', not an iteration number", tracker.string(), text);
  const fs::path dir = load / iter_dir_name(std::stoll(text));
  PL_CHECK(fs::is_directory(dir, ec), "{} names iteration {} but {} is missing", tracker.string(), text,
           dir.string());
  return dir;
}

}  // namespace

// ---- public ------------------------------------------------------------------------------------

namespace {

// The sharded save's part on every rank: this rank's range of every state file in `tmp`; returns the
// (buffer, chunk, digest) triples of the chunks it digested, for rank 0.
std::vector<uint64_t> write_rank_ranges(const fs::path& tmp, const LlamaModel& model, const AdamW& opt) {
  const auto [lo, hi] = rank_elements(model);
  std::vector<uint64_t> triples;
  std::vector<char> staging;
  const std::vector<StateBuffer> buffers = state_buffers(model, opt);
  for (size_t i = 0; i < buffers.size(); ++i) {
    const std::vector<uint64_t> pairs = write_state_range(tmp / buffers[i].name, buffers[i], lo, hi, model.num_params(), staging);
    for (size_t k = 0; k < pairs.size(); k += 2) triples.insert(triples.end(), {i, pairs[k], pairs[k + 1]});
  }
  return triples;
}

// Rank 0 of a sharded save: creates every state file at its full size, lets the ranks write their ranges,
// and returns the files with their checksums.
std::vector<CheckpointFile> write_sharded_state(const fs::path& tmp, const LlamaModel& model, const AdamW& opt,
                                                const parallel::World& world) {
  const std::vector<StateBuffer> buffers = state_buffers(model, opt);
  const int64_t n = model.num_params();
  for (const StateBuffer& b : buffers) {
    const UniqueFd fd = open_fd((tmp / b.name).string(), O_WRONLY | O_CREAT | O_TRUNC);
    const off_t bytes = static_cast<off_t>(static_cast<uint64_t>(n) * dtype_size(b.file_dtype));
    PL_CHECK(::ftruncate(fd.get(), bytes) == 0, "{}: cannot size to {} bytes: {}", fd.path(), bytes, std::strerror(errno));
  }
  broadcast_string(world, tmp.string());
  const std::vector<uint64_t> mine = write_rank_ranges(tmp, model, opt);
  // Every rank has written and fsynced its ranges once its digests arrive.
  const std::vector<uint64_t> all = world.gather(mine, 0);
  std::vector<std::vector<uint64_t>> pairs(buffers.size());
  PL_CHECK(all.size() % 3 == 0, "internal: {} values gathered, not (buffer, chunk, digest) triples", all.size());
  for (size_t i = 0; i < all.size(); i += 3) {
    PL_CHECK(all[i] < buffers.size(), "internal: buffer {} in the gathered digests", all[i]);
    pairs[all[i]].insert(pairs[all[i]].end(), {all[i + 1], all[i + 2]});
  }
  std::vector<CheckpointFile> files;
  for (size_t i = 0; i < buffers.size(); ++i) {
    const StateBuffer& b = buffers[i];
    const uint64_t bytes = static_cast<uint64_t>(n) * dtype_size(b.file_dtype);
    files.push_back({b.name, dtype_name(b.file_dtype), n, bytes, checksum_from_ranks(tmp / b.name, bytes, pairs[i])});
  }
  return files;
}

}  // namespace

SaveReport save_checkpoint(const std::string& dir_s, int64_t keep_last, const LlamaModel& model, const AdamW& opt,
                           const TrainState& state, const RunDescription& run, const CheckpointWriteHook& hook,
                           const parallel::World* world) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir(dir_s);
  const fs::path final_path = dir / iter_dir_name(state.iteration);
  const bool ranks = world != nullptr && world->size() > 1;
  PL_CHECK(!model.sharded() || world != nullptr, "internal: a sharded checkpoint save without its world");
  SaveReport r;
  r.path = final_path.string();
  if (ranks && world->rank() != 0) {
    // Only rank 0 writes the directory; with the distributed optimizer every rank writes its ranges into it.
    if (model.sharded()) {
      const fs::path tmp = broadcast_string(*world, "");
      (void)world->gather(write_rank_ranges(tmp, model, opt), 0);
    }
    world->barrier();  // rank 0 has published the checkpoint
    r.seconds = seconds_since(t0);
    return r;
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  PL_CHECK(!ec, "--save {}: cannot create the directory: {}", dir_s, ec.message());
  std::vector<CheckpointFile> files;
  CheckpointFile manifest;
  write_directory_atomically(final_path.string(), [&](const std::string& tmp) {
    if (model.sharded()) {
      files = write_sharded_state(tmp, model, opt, *world);
    } else {
      std::vector<char> staging;
      for (const StateBuffer& b : state_buffers(model, opt)) files.push_back(write_state_buffer(tmp, b, staging, hook));
    }
    std::vector<char> fp8_staging;
    const StateBuffer fp8{kFp8StateFile, model.delayed_scaling().all, DType::F32};
    if (model.delayed_scaling().enabled()) files.push_back(write_state_buffer(tmp, fp8, fp8_staging, hook));
    if (!run.gemm_algorithms.empty())
      files.push_back(write_text_file(fs::path(tmp) / kGemmAlgorithmsFile, gemm_algorithms_json(run.gemm_algorithms), hook));
    const std::string meta = checkpoint_metadata_text(state, opt.steps_taken(), run, model.delayed_scaling().enabled());
    files.push_back(write_text_file(fs::path(tmp) / kMetadata, meta, hook));
    manifest = write_text_file(fs::path(tmp) / kManifest, checkpoint_manifest_text(state.iteration, files), hook);
  }, process_tmp_suffix());
  // The tracker last (Megatron: iter_finalize_fn writes it after the checkpoint), replaced atomically.
  write_text_file(dir / kCheckpointTracker, fmt::format("{}\n", state.iteration), hook, process_tmp_suffix());

  r.bytes = static_cast<double>(manifest.bytes);
  for (const CheckpointFile& f : files) r.bytes += static_cast<double>(f.bytes);
  r.seconds = seconds_since(t0);
  remove_tmp_entries(dir);
  r.pruned = prune(dir, keep_last, state.iteration);
  if (ranks) world->barrier();
  return r;
}

uint64_t checkpoint_bytes(const LlamaModel& model, const AdamW& opt) {
  uint64_t total = 1'000'000;  // metadata.json, manifest.json, the tracker
  for (const StateBuffer& b : state_buffers(model, opt))
    total += static_cast<uint64_t>(model.num_params()) * dtype_size(b.file_dtype);
  if (model.delayed_scaling().enabled()) total += static_cast<uint64_t>(model.delayed_scaling().all.bytes());
  return total;
}

bool checkpoint_dir_is_empty(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return true;
  if (fs::exists(fs::path(dir) / kCheckpointTracker, ec)) return false;
  return iteration_dirs(dir).empty();
}

VerifiedCheckpoint verify_checkpoint(const std::string& load, bool read_contents) {
  const auto t0 = std::chrono::steady_clock::now();
  const fs::path dir = resolve_iteration_dir(fs::path(load));
  const fs::path manifest_path = dir / kManifest;
  std::error_code ec;
  PL_CHECK(fs::exists(manifest_path, ec), "{}: missing (the checkpoint is incomplete)", manifest_path.string());
  const json manifest = parse_json_file(manifest_path);
  const int version = field<int>(manifest, "format_version", manifest_path);
  PL_CHECK(version == kCheckpointFormatVersion, "{}: format version {}, this build reads {}", manifest_path.string(),
           version, kCheckpointFormatVersion);

  VerifiedCheckpoint v;
  v.path = dir.string();
  v.iteration = field<int64_t>(manifest, "iteration", manifest_path);
  const json list = field<json>(manifest, "files", manifest_path);
  PL_CHECK(list.is_array(), "{}: 'files' is not a list", manifest_path.string());
  std::vector<char> staging;
  for (const json& e : list) {
    CheckpointFile f;
    f.name = field<std::string>(e, "name", manifest_path);
    f.dtype = field<std::string>(e, "dtype", manifest_path);
    f.bytes = field<uint64_t>(e, "bytes", manifest_path);
    f.checksum = parse_hex64(field<std::string>(e, "checksum", manifest_path), manifest_path);
    if (f.dtype != "json") f.numel = field<int64_t>(e, "numel", manifest_path);
    PL_CHECK(f.name.find('/') == std::string::npos && !f.name.empty(), "{}: bad file name '{}'",
             manifest_path.string(), f.name);
    verify_file(dir, f, staging, read_contents || f.dtype == "json");
    v.bytes += static_cast<double>(f.bytes);
    v.files.push_back(f);
  }
  const bool has_meta = std::any_of(v.files.begin(), v.files.end(), [](const CheckpointFile& f) { return f.name == kMetadata; });
  PL_CHECK(has_meta, "{}: lists no {}", manifest_path.string(), kMetadata);

  read_checkpoint_metadata((dir / kMetadata).string(), manifest_path.string(), v);
  // Present where the saving recipe needs it: resumed without it, the histories would restart from zero unsaid.
  const bool has_fp8 =
      std::any_of(v.files.begin(), v.files.end(), [](const CheckpointFile& f) { return f.name == kFp8StateFile; });
  PL_CHECK(has_fp8 || !v.fp8_delayed_scaling,
           "{}: saved by an FP8 delayed-scaling recipe ({}), but lists no {}: the amax histories and scales are missing",
           manifest_path.string(), v.recipe_name, kFp8StateFile);
  v.seconds = seconds_since(t0);
  return v;
}

GemmAlgorithms read_gemm_algorithms(const VerifiedCheckpoint& c) {
  const auto f = std::find_if(c.files.begin(), c.files.end(),
                              [](const CheckpointFile& g) { return g.name == kGemmAlgorithmsFile; });
  if (f == c.files.end()) return {};
  const std::string path = (fs::path(c.path) / f->name).string();
  const std::string text = read_regular_file(path);
  PL_CHECK(text.size() == f->bytes && checksum64(text.data(), text.size()) == f->checksum,
           "{}: changed since the checkpoint was verified (size or checksum)", path);
  return gemm_algorithms_from_json(parse_json_text(text, path), path);
}

int64_t checkpoint_flat_elements(const VerifiedCheckpoint& c) {
  return c.lora ? lora_parameter_count(c.model, *c.lora) : c.model.num_parameters();
}

std::vector<float> read_master_weights(const VerifiedCheckpoint& c) {
  std::vector<float> out(static_cast<size_t>(checkpoint_flat_elements(c)));
  stream_master_weights(c, [&](int64_t offset, const float* values, int64_t count) {
    std::copy(values, values + count, out.begin() + offset);
  });
  return out;
}

void stream_master_weights(const VerifiedCheckpoint& c, const FlatWeightWriter& write) {
  const fs::path dir(c.path);
  const CheckpointFile* master = nullptr;
  for (const CheckpointFile& f : c.files)
    if (f.name == "master_fp32.bin") master = &f;
  PL_CHECK(master != nullptr, "{}: lists no master_fp32.bin", (dir / kManifest).string());
  const int64_t n = checkpoint_flat_elements(c);
  PL_CHECK(master->dtype == "f32" && master->numel == n &&
               master->bytes == static_cast<uint64_t>(master->numel) * sizeof(float),
           "{}: {} elements of {} ({} bytes), but {} has {} {}", (dir / master->name).string(), master->numel,
           master->dtype, master->bytes, c.model.name, n, c.lora ? "adapter parameters" : "parameters");
  std::vector<char> staging;
  std::vector<float> piece;
  const uint64_t sum = stream_file(dir / master->name, master->bytes, staging, [&](const char* data, size_t bytes, uint64_t off) {
    // (the pieces are whole floats: kPieceBytes is a multiple of 4, as restore_checkpoint relies on too)
    piece.resize(bytes / sizeof(float));
    std::memcpy(piece.data(), data, bytes);
    write(static_cast<int64_t>(off / sizeof(float)), piece.data(), static_cast<int64_t>(piece.size()));
  });
  PL_CHECK(sum == master->checksum, "{}: checksum {} but the manifest says {} (the file is corrupted)",
           (dir / master->name).string(), hex64(sum), hex64(master->checksum));
}

namespace {

// The file state buffer `b` loads from, checked against the model's `n` parameters; b.file_dtype becomes
// the file's when it was saved under the other weight mode (bf16 vs --fp32-reference) or, for a moment,
// in the other dtype (fp32 <-> bf16, the precision-aware optimizer's): converted on load, bf16 -> fp32
// exactly, fp32 -> bf16 rounded to nearest even (compare_checkpoint_with_run's line).
const CheckpointFile& file_for_buffer(const VerifiedCheckpoint& c, StateBuffer& b, int64_t n) {
  const fs::path dir(c.path);
  auto find = [&](const std::string& name) -> const CheckpointFile* {
    for (const CheckpointFile& f : c.files)
      if (f.name == name) return &f;
    return nullptr;
  };
  const CheckpointFile* f = find(b.name);
  const bool moment = b.name.rfind("adam_", 0) == 0;
  if (f == nullptr && b.name.rfind("weights_", 0) == 0)
    f = find(b.name == "weights_bf16.bin" ? "weights_fp32.bin" : "weights_bf16.bin");
  if (f == nullptr && moment)
    f = find(b.name.substr(0, b.name.rfind('_')) + (b.tensor.dtype == DType::BF16 ? "_fp32.bin" : "_bf16.bin"));
  PL_CHECK(f != nullptr, "{}: lists no {}", (dir / kManifest).string(), b.name);
  if (f->name != b.name) b.file_dtype = f->dtype == "bf16" ? DType::BF16 : DType::F32;
  PL_CHECK(f->numel == n, "{}: {} elements but the model has {} parameters", (dir / f->name).string(), f->numel, n);
  PL_CHECK(f->bytes == static_cast<uint64_t>(n) * dtype_size(b.file_dtype),
           "{}: the manifest says {} bytes for {} elements of {}", (dir / f->name).string(), f->bytes, n,
           dtype_name(b.file_dtype));
  PL_CHECK(f->dtype == dtype_name(b.file_dtype), "{}: dtype {}, expected {}", (dir / f->name).string(), f->dtype,
           dtype_name(b.file_dtype));
  PL_CHECK(b.file_dtype == b.tensor.dtype || (b.file_dtype == DType::BF16 && b.tensor.dtype == DType::F32) ||
               (moment && b.file_dtype == DType::F32 && b.tensor.dtype == DType::BF16),
           "{}: a {} file cannot be loaded into {} state", (dir / f->name).string(), f->dtype,
           dtype_name(b.tensor.dtype));
  return *f;
}

}  // namespace

// A poisoned state is refused before it is used: a NaN amax or scale would make every later step NaN (and the
// run would blame the learning rate). Amaxes are finite and >= 0, scales finite and > 0.
static void check_fp8_state_values(const std::string& path, const char* data, int64_t first, int64_t cnt,
                                   int64_t history_elements) {
  for (int64_t k = 0; k < cnt; ++k) {
    float v;
    std::memcpy(&v, data + k * 4, 4);
    const int64_t i = first + k;
    const bool is_scale = i >= history_elements;
    PL_CHECK(std::isfinite(v) && (is_scale ? v > 0.0f : v >= 0.0f),
             "{}: element {} ({} {}) is {}: the FP8 delayed-scaling state is corrupt (an amax must be finite and "
             ">= 0, a scale finite and > 0)",
             path, i, is_scale ? "scale" : "amax history entry", is_scale ? i - history_elements : i, v);
  }
}

// FP8 delayed scaling's histories and scales. A checkpoint without them (another recipe's) leaves TE's initial
// state (history 0, scale 1), as TE's set_extra_state does without FP8 state; another size is refused.
static void restore_fp8_state(const VerifiedCheckpoint& c, LlamaModel& model, std::vector<char>& staging) {
  const DelayedScalingState& ds = model.delayed_scaling();
  const auto f =
      std::find_if(c.files.begin(), c.files.end(), [](const CheckpointFile& g) { return g.name == kFp8StateFile; });
  if (!ds.enabled() || f == c.files.end()) return;
  const fs::path path = fs::path(c.path) / f->name;
  const int64_t n = ds.all.numel();
  PL_CHECK(f->dtype == "f32" && f->numel == n && f->bytes == static_cast<uint64_t>(n) * sizeof(float),
           "{}: {} {} elements, but this run's FP8 delayed scaling keeps {} (amax history {} x {} tensors + scales): "
           "was it saved with another --fp8-amax-history-len or model?",
           path.string(), f->numel, f->dtype, n, ds.history.dim(0), ds.history.dim(1));
  const int64_t history_elements = ds.history.numel();  // `all` is the history [len, n], then the scales [n]
  const uint64_t sum = stream_file(path, f->bytes, staging, [&](const char* data, size_t bytes, uint64_t off) {
    const auto first = static_cast<int64_t>(off / 4), cnt = static_cast<int64_t>(bytes / 4);
    check_fp8_state_values(path.string(), data, first, cnt, history_elements);
    copy_from_host(ds.all.rows(first, cnt), data);
  });
  PL_CHECK(sum == f->checksum, "{}: changed while loading (checksum {} vs {})", path.string(), hex64(sum),
           hex64(f->checksum));
}

TrainState restore_checkpoint(const VerifiedCheckpoint& c, LlamaModel& model, AdamW& opt, bool weights_only) {
  const fs::path dir(c.path);
  std::vector<std::pair<StateBuffer, CheckpointFile>> plan;
  for (StateBuffer b : state_buffers(model, opt)) {
    if (weights_only && b.name.rfind("adam_", 0) == 0) continue;  // --finetune: no optimizer state
    const CheckpointFile& f = file_for_buffer(c, b, model.num_params());
    plan.emplace_back(b, f);
  }
  // Everything checked: now the model is overwritten.
  std::vector<char> staging, converted;
  if (model.sharded()) {
    // This rank's range of every file (verified whole by rank 0), then the weights gathered.
    const auto [lo, hi] = rank_elements(model);
    for (const auto& [b, f] : plan) {
      if (lo >= hi) break;
      const size_t file_elem = dtype_size(b.file_dtype), tensor_elem = dtype_size(b.tensor.dtype);
      const auto per_piece = static_cast<int64_t>(kPieceBytes / file_elem);
      staging.resize(kPieceBytes);
      converted.resize(static_cast<size_t>(per_piece) * tensor_elem);
      const UniqueFd fd = open_regular_file((dir / f.name).string());
      for (int64_t e = lo; e < hi; e += per_piece) {
        const int64_t cnt = std::min(per_piece, hi - e);
        pread_exact(fd, staging.data(), static_cast<size_t>(cnt) * file_elem, static_cast<uint64_t>(e) * file_elem);
        file_to_tensor_dtype(staging.data(), b.file_dtype, converted.data(), b.tensor.dtype, static_cast<size_t>(cnt));
        copy_from_host(b.tensor.rows(e - b.first, cnt), converted.data());
      }
    }
    model.gather_weights();
  }
  for (const auto& [b, f] : plan) {
    if (model.sharded()) break;
    if (b.from_master) continue;  // made from the master below (sync_weights_from_master)
    const size_t file_elem = dtype_size(b.file_dtype), tensor_elem = dtype_size(b.tensor.dtype);
    converted.resize(kPieceBytes / file_elem * tensor_elem);
    // (b captured by an init-capture: clang before 16 cannot capture a structured binding; tests/fuzz builds this with clang 14)
    const uint64_t sum = stream_file(dir / f.name, f.bytes, staging, [&, &b = b](const char* data, size_t bytes, uint64_t off) {
      const auto first = static_cast<int64_t>(off / file_elem), cnt = static_cast<int64_t>(bytes / file_elem);
      file_to_tensor_dtype(data, b.file_dtype, converted.data(), b.tensor.dtype, static_cast<size_t>(cnt));
      copy_from_host(b.tensor.rows(first, cnt), converted.data());
    });
    PL_CHECK(sum == f.checksum, "{}: changed while loading (checksum {} vs {}); the model is now partly loaded",
             (dir / f.name).string(), hex64(sum), hex64(f.checksum));
  }
  // The quantized copies of the restored bf16 weights (FP8 primary weights: the kept weights and the copies
  // from the restored master), after the FP8 histories whose scales they use.
  const auto prepare = [&] { model.fp8_primary_weights() ? model.sync_weights_from_master() : model.prepare_weights(); };
  if (weights_only) {  // --finetune: fresh moments, step count, FP8 histories and iteration (Megatron's)
    prepare();
    return TrainState{};
  }
  opt.restore_steps_taken(c.optimizer_steps);
  restore_fp8_state(c, model, staging);
  prepare();
  return c.state;
}

}  // namespace pl
