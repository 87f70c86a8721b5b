#include "io/safetensors.h"

#include "io/json_text.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/mapped_file.h"
#include "numerics/bf16.h"

namespace pl {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as host-order values");

namespace {

namespace fs = std::filesystem;

// The reference reader refuses larger headers (MAX_HEADER_SIZE in safetensors/src/tensor.rs).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

// Exact binary16 -> binary32 (every half value is a float value).
float half_bits_to_float(uint16_t h) {
  const bool neg = (h & 0x8000u) != 0;
  const int exp = (h >> 10) & 0x1F;
  const int mant = h & 0x3FF;
  float v;
  if (exp == 0)
    v = std::ldexp(static_cast<float>(mant), -24);  // zero or subnormal: mant * 2^-24
  else if (exp == 31)
    v = mant == 0 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  else
    v = std::ldexp(static_cast<float>(1024 + mant), exp - 25);  // (1 + mant/1024) * 2^(exp-15)
  return neg ? -v : v;
}

// Bytes per element of a safetensors dtype name; 0 for a name the format does not define (or a
// sub-byte type such as F4, which this reader does not support).
size_t safetensors_itemsize(const std::string& d) {
  if (d == "BOOL" || d == "U8" || d == "I8" || d == "F8_E4M3" || d == "F8_E5M2" || d == "F8_E8M0") return 1;
  if (d == "I16" || d == "U16" || d == "F16" || d == "BF16") return 2;
  if (d == "I32" || d == "U32" || d == "F32") return 4;
  if (d == "I64" || d == "U64" || d == "F64" || d == "C64") return 8;
  return 0;
}

// numel * itemsize, or nullopt on overflow of uint64.
std::optional<uint64_t> byte_size(const std::vector<int64_t>& shape, size_t itemsize) {
  uint64_t n = itemsize;
  for (int64_t d : shape) {
    const auto ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > std::numeric_limits<uint64_t>::max() / ud) return std::nullopt;
    n *= ud;
  }
  return n;
}

// Parses the header JSON, refusing duplicate keys in any object (the format disallows them; plain
// nlohmann would keep the last one silently).
nlohmann::json parse_json_object(const std::string& path, const char* what, const char* first, const char* last) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto cb = [&](int, nlohmann::json::parse_event_t ev, nlohmann::json& parsed) {
    using E = nlohmann::json::parse_event_t;
    if (ev == E::object_start) {
      open_objects.emplace_back();
    } else if (ev == E::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == E::key && !open_objects.empty()) {
      const std::string k = parsed.get<std::string>();
      if (!open_objects.back().insert(k).second && duplicate.empty()) duplicate = k;
    }
    return true;
  };
  const nlohmann::json j = parse_json_text(std::string_view(first, static_cast<size_t>(last - first)),
                                           fmt::format("{}: {}", path, what), cb);
  if (!duplicate.empty()) fail("{}: {} has the key '{}' twice (duplicate keys are not allowed)", path, what, duplicate);
  if (!j.is_object()) fail("{}: {} must be a JSON object, got {}", path, what, j.type_name());
  return j;
}

// A JSON integer in [0, 2^63) (not a float: json_exact_integer would take 2.0).
std::optional<int64_t> non_negative_integer(const nlohmann::json& v) {
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) return std::nullopt;
  const uint64_t u = v.get<uint64_t>();
  return std::in_range<int64_t>(u) ? std::optional<int64_t>(static_cast<int64_t>(u)) : std::nullopt;
}

SafetensorsTensorInfo parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  auto bad = [&](const std::string& what) { fail("{}: tensor '{}': {}", path, name, what); };
  if (!e.is_object()) bad(fmt::format("header entry must be an object, got {}", describe_json(e)));
  SafetensorsTensorInfo t;
  t.name = name;
  if (!e.contains("dtype") || !e["dtype"].is_string()) bad("header entry needs a string 'dtype'");
  t.dtype = e["dtype"].get<std::string>();
  if (safetensors_itemsize(t.dtype) == 0)
    bad(fmt::format("unknown or unsupported dtype '{}' (known: BOOL, U8, I8, F8_E4M3, F8_E5M2, F8_E8M0, I16, U16, "
                    "F16, BF16, I32, U32, F32, F64, I64, U64, C64)",
                    t.dtype));
  if (!e.contains("shape") || !e["shape"].is_array()) bad("header entry needs a 'shape' array");
  for (const auto& d : e["shape"]) {
    const std::optional<int64_t> v = non_negative_integer(d);
    if (!v) bad(fmt::format("shape {} must hold non-negative integers", describe_json(e["shape"])));
    t.shape.push_back(*v);
  }
  if (!e.contains("data_offsets") || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
    bad("header entry needs 'data_offsets' [begin, end]");
  const std::optional<int64_t> begin = non_negative_integer(e["data_offsets"][0]),
                               end = non_negative_integer(e["data_offsets"][1]);
  if (!begin || !end)
    bad(fmt::format("data_offsets {} must be two non-negative integers", describe_json(e["data_offsets"])));
  t.begin = static_cast<uint64_t>(*begin);
  t.end = static_cast<uint64_t>(*end);
  if (t.end < t.begin) bad(fmt::format("data_offsets [{}, {}] end before they begin", t.begin, t.end));
  const std::optional<uint64_t> need = byte_size(t.shape, safetensors_itemsize(t.dtype));
  if (!need) bad(fmt::format("shape {} is too large", t.shape_str()));
  if (t.end - t.begin != *need)
    bad(fmt::format("shape {} of {} needs {} bytes but data_offsets [{}, {}] hold {}", t.shape_str(), t.dtype, *need,
                    t.begin, t.end, t.end - t.begin));
  return t;
}

// The tensors, sorted by offset as the reference reader sorts them, must tile [0, data_bytes).
void check_tiling(const std::string& path, std::vector<SafetensorsTensorInfo>& tensors, uint64_t data_bytes) {
  std::sort(tensors.begin(), tensors.end(), [](const auto& a, const auto& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t cursor = 0;
  const SafetensorsTensorInfo* prev = nullptr;
  for (const SafetensorsTensorInfo& t : tensors) {
    if (t.begin < cursor)
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' (which ends at {})", path, t.name, t.begin,
           t.end, prev->name, cursor);
    if (t.begin > cursor)
      fail("{}: tensor '{}': data_offsets [{}, {}] leave a gap of {} bytes after {} (tensors must be contiguous)", path,
           t.name, t.begin, t.end, t.begin - cursor, prev ? "tensor '" + prev->name + "'" : "the data start");
    if (t.end > data_bytes)
      fail("{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} bytes; truncated file?)",
           path, t.name, t.begin, t.end, data_bytes);
    cursor = t.end;
    prev = &t;
  }
  if (cursor != data_bytes)
    fail("{}: the tensors cover {} bytes of the {}-byte data section ({} unindexed bytes at the end)", path, cursor,
         data_bytes, data_bytes - cursor);
}

void convert_to_float(const SafetensorsTensorInfo& t, const uint8_t* src, float* out, const std::string& path) {
  const int64_t n = t.numel();
  if (t.dtype == "F32") {
    if (n > 0) std::memcpy(out, src, static_cast<size_t>(n) * 4);
  } else if (t.dtype == "BF16" || t.dtype == "F16") {
    const bool bf16 = t.dtype == "BF16";
#pragma omp parallel for schedule(static) if (n > (1 << 16))
    for (int64_t i = 0; i < n; ++i) {
      uint16_t b;
      std::memcpy(&b, src + 2 * i, 2);
      out[i] = bf16 ? num::bf16_bits_to_float(b) : half_bits_to_float(b);
    }
  } else {
    fail("{}: tensor '{}' is stored as {}; only BF16, F16 and F32 can be read as floats", path, t.name, t.dtype);
  }
}

void check_tensors_to_write(const std::vector<SafetensorsTensorOut>& tensors, bool with_data = true) {
  std::set<std::string> names;
  for (const SafetensorsTensorOut& t : tensors) {
    PL_CHECK(!t.name.empty() && t.name != "__metadata__", "write_safetensors: invalid tensor name '{}'", t.name);
    PL_CHECK(names.insert(t.name).second, "write_safetensors: tensor '{}' given twice", t.name);
    PL_CHECK(t.dtype == "BF16" || t.dtype == "F32", "write_safetensors: tensor '{}': dtype '{}' (writable: BF16, F32)",
             t.name, t.dtype);
    int64_t n = 1;
    for (int64_t d : t.shape) {
      PL_CHECK(d >= 0, "write_safetensors: tensor '{}' has a negative dimension", t.name);
      n *= d;
    }
    PL_CHECK(!with_data || n == 0 || t.data != nullptr, "write_safetensors: tensor '{}' has no data", t.name);
  }
}

uint64_t stored_bytes(const SafetensorsTensorOut& t) {
  return byte_size(t.shape, safetensors_itemsize(t.dtype)).value_or(0);
}

// The header of one file (padded to 8 bytes with spaces, like the reference serializer), with the 8-byte length
// in front; `at` gets each tensor's data offset from the file's start.
std::string file_header(const std::vector<const SafetensorsTensorOut*>& tensors,
                        const std::map<std::string, std::string>& metadata, std::vector<uint64_t>* at = nullptr) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::vector<uint64_t> offsets;
  for (const SafetensorsTensorOut* t : tensors) {
    const uint64_t n = stored_bytes(*t);
    header[t->name] = {{"dtype", t->dtype}, {"shape", t->shape}, {"data_offsets", {offset, offset + n}}};
    offsets.push_back(offset);
    offset += n;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t len = text.size();  // little-endian, as the host
  std::string out(reinterpret_cast<const char*>(&len), sizeof len);
  out += text;
  if (at)
    for (uint64_t o : offsets) at->push_back(out.size() + o);
  return out;
}

// One tensor's stored bytes from `data`, in 1 Mi-element pieces (BF16 rounded to nearest even), each handed to
// `emit(bytes, count, offset from the tensor's start)`.
void for_each_stored_piece(const SafetensorsTensorOut& t, const float* data,
                           const std::function<void(const void*, size_t, uint64_t)>& emit) {
  const int64_t n = static_cast<int64_t>(stored_bytes(t) / safetensors_itemsize(t.dtype));
  if (t.dtype == "F32") {
    emit(data, static_cast<size_t>(n) * 4, 0);
    return;
  }
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint16_t> bf16;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t m = std::min(kChunk, n - i0);
    bf16.resize(static_cast<size_t>(m));
#pragma omp parallel for schedule(static) if (m > (1 << 16))
    for (int64_t i = 0; i < m; ++i) bf16[static_cast<size_t>(i)] = num::float_to_bf16_bits(data[i0 + i]);
    emit(bf16.data(), static_cast<size_t>(m) * 2, static_cast<uint64_t>(i0) * 2);
  }
}

// Header and data of one file, written in order.
void write_file_body(AtomicFile& f, const std::vector<const SafetensorsTensorOut*>& tensors,
                     const std::map<std::string, std::string>& metadata) {
  f.write(file_header(tensors, metadata));
  for (const SafetensorsTensorOut* t : tensors)
    for_each_stored_piece(*t, t->data, [&](const void* p, size_t bytes, uint64_t) { f.write(p, bytes); });
}

bool is_weight_file_name(const std::string& name) {
  static const std::regex shard(R"(model-\d{5}-of-\d{5}\.safetensors)");
  return name == kSingleFile || name == kIndexFile || std::regex_match(name, shard);
}

}  // namespace

// ---------------------------------------------------------------------------------------------------
// Reading

int64_t SafetensorsTensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string SafetensorsTensorInfo::shape_str() const { return fmt::format("[{}]", fmt::join(shape, ", ")); }

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) fail("{}: no such file", path);
  if (fs::is_directory(path, ec)) fail("{}: is a directory, not a .safetensors file", path);
  {
    const UniqueFd fd = open_regular_file(path);  // (io/file_checks.h: a FIFO is one line, not a hang)
    const auto bytes = static_cast<size_t>(file_size(fd));
    if (bytes < 8) fail("{}: {} bytes is too short for a safetensors file (the header length alone takes 8)", path, bytes);
    map_ = MappedFile(fd, bytes);  // unmapped by its destructor, also when a check below throws
  }
  const size_t size = map_.size();
  uint64_t n = 0;  // the header length, little-endian as the host (see the static_assert above)
  std::memcpy(&n, map_.data(), sizeof n);
  if (n > kMaxHeaderBytes)
    fail("{}: header length {} exceeds the format's limit of {} bytes (not a safetensors file?)", path, n,
         kMaxHeaderBytes);
  if (n > size - 8)
    fail("{}: header length {} runs past the end of the {}-byte file (truncated, or not a safetensors file)", path, n,
         size);
  data_start_ = 8 + static_cast<size_t>(n);
  const char* h = reinterpret_cast<const char*>(map_.data() + 8);
  const nlohmann::json header = parse_json_object(path, "safetensors header", h, h + n);
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) fail("{}: '__metadata__' must be an object of strings, got {}", path, describe_json(value));
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string()) fail("{}: '__metadata__' value of '{}' must be a string, got {}", path, mk, describe_json(mv));
        metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    tensors_.push_back(parse_entry(path, key, value));
  }
  check_tiling(path, tensors_, size - data_start_);
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const SafetensorsTensorInfo* SafetensorsFile::find(const std::string& name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const SafetensorsTensorInfo& SafetensorsFile::info(const std::string& name) const {
  const SafetensorsTensorInfo* t = find(name);
  if (t == nullptr) fail("{}: no tensor '{}' in this file", path_, name);
  return *t;
}

std::span<const uint8_t> SafetensorsFile::bytes(const std::string& name) const {
  const SafetensorsTensorInfo& t = info(name);
  return {map_.data() + data_start_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

std::vector<float> SafetensorsFile::read_float(const std::string& name) const {
  std::vector<float> out(static_cast<size_t>(info(name).numel()));
  read_float(name, out.data());
  return out;
}

void SafetensorsFile::read_float(const std::string& name, float* out) const {
  const SafetensorsTensorInfo& t = info(name);
  convert_to_float(t, map_.data() + data_start_ + t.begin, out, path_);
  map_.release(data_start_ + t.begin, t.end - t.begin);  // read once: out of the resident set (mapped_file.h)
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& dir) : dir_(dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail("{}: no such directory", dir);
  const fs::path single = fs::path(dir) / kSingleFile;
  const fs::path index = fs::path(dir) / kIndexFile;
  if (fs::is_regular_file(single, ec)) {
    files_.emplace_back(single.string());
    for (const SafetensorsTensorInfo& t : files_[0].tensors()) where_[t.name] = 0;
    return;
  }
  if (!fs::is_regular_file(index, ec))
    fail("{}: holds neither {} nor {} (not a Hugging Face safetensors checkpoint)", dir, kSingleFile, kIndexFile);
  sharded_ = true;
  const std::string ip = index.string();
  const std::string text = read_regular_file(ip);
  const nlohmann::json j = parse_json_object(ip, "index", text.data(), text.data() + text.size());
  if (!j.contains("weight_map") || !j["weight_map"].is_object()) fail("{}: needs a 'weight_map' object", ip);
  std::map<std::string, std::string> shard_of;  // tensor -> shard file
  std::map<std::string, size_t> file_index;     // shard file -> files_ index
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string()) fail("{}: weight_map value of '{}' must be a file name, got {}", ip, name, describe_json(file));
    const std::string f = file.get<std::string>();
    if (f.empty() || f == "." || f == ".." || f.find('/') != std::string::npos || f.find('\\') != std::string::npos)
      fail("{}: weight_map value of '{}' must be a file name in the directory, got '{}'", ip, name, f);
    shard_of[name] = f;
    file_index.emplace(f, 0);
  }
  for (auto& [f, idx] : file_index) {
    idx = files_.size();
    const fs::path p = fs::path(dir) / f;
    if (!fs::is_regular_file(p, ec)) fail("{}: shard '{}' listed in the weight_map is missing", ip, f);
    files_.emplace_back(p.string());
  }
  for (const auto& [name, f] : shard_of) {
    const size_t idx = file_index.at(f);
    if (files_[idx].find(name) == nullptr)
      fail("{}: tensor '{}' is listed in shard '{}', which does not hold it", ip, name, f);
    where_[name] = idx;
  }
  for (const auto& [f, idx] : file_index)
    for (const SafetensorsTensorInfo& t : files_[idx].tensors()) {
      const auto it = shard_of.find(t.name);
      if (it == shard_of.end())
        fail("{}: shard '{}' holds tensor '{}', which the weight_map does not list", ip, f, t.name);
      if (it->second != f)
        fail("{}: shard '{}' holds tensor '{}', which the weight_map places in '{}'", ip, f, t.name, it->second);
    }
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, idx] : where_) out.push_back(name);
  return out;
}

const SafetensorsFile& SafetensorsCheckpoint::file_of(const std::string& name) const {
  const auto it = where_.find(name);
  if (it == where_.end()) fail("{}: no tensor '{}' in this checkpoint", dir_, name);
  return files_[it->second];
}

const SafetensorsTensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  return file_of(name).info(name);
}

uint64_t SafetensorsCheckpoint::data_bytes() const {
  uint64_t n = 0;
  for (const auto& [name, idx] : where_) {
    const SafetensorsTensorInfo& t = files_[idx].info(name);
    n += t.end - t.begin;
  }
  return n;
}

// ---------------------------------------------------------------------------------------------------
// Writing

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensorOut>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  check_tensors_to_write(tensors);
  std::vector<const SafetensorsTensorOut*> all;
  for (const SafetensorsTensorOut& t : tensors) all.push_back(&t);
  write_file_atomically(path, [&](AtomicFile& f) { write_file_body(f, all, metadata); });
}

std::vector<std::string> safetensors_shard_names(size_t num_shards) {
  if (num_shards == 1) return {kSingleFile};
  std::vector<std::string> out;
  for (size_t i = 0; i < num_shards; ++i) out.push_back(fmt::format("model-{:05d}-of-{:05d}.safetensors", i + 1, num_shards));
  return out;
}

std::vector<size_t> plan_safetensors_shards(const std::vector<SafetensorsTensorOut>& tensors, uint64_t max_shard_bytes) {
  PL_CHECK(max_shard_bytes > 0, "safetensors shard limit must be positive");
  // huggingface_hub's split_state_dict_into_shards_factory: a tensor over the limit is appended as a
  // shard of its own at once (the shard being filled carries on after it); otherwise the shard being
  // filled is closed when the next tensor would take it over the limit.
  std::vector<std::vector<size_t>> shards;
  std::vector<size_t> current;
  uint64_t current_bytes = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const uint64_t n = stored_bytes(tensors[i]);
    if (n > max_shard_bytes) {
      shards.push_back({i});
      continue;
    }
    if (current_bytes + n > max_shard_bytes) {
      shards.push_back(std::move(current));
      current.clear();
      current_bytes = 0;
    }
    current.push_back(i);
    current_bytes += n;
  }
  if (!current.empty()) shards.push_back(std::move(current));
  std::vector<size_t> shard_of(tensors.size());
  for (size_t s = 0; s < shards.size(); ++s)
    for (size_t i : shards[s]) shard_of[i] = s;
  return shard_of;
}

SafetensorsStreamWriter::SafetensorsStreamWriter(std::string dir, std::vector<SafetensorsTensorOut> tensors,
                                                 uint64_t max_shard_bytes)
    : dir_(std::move(dir)), tensors_(std::move(tensors)) {
  check_tensors_to_write(tensors_, false);
  PL_CHECK(!tensors_.empty(), "{}: no tensors to write", dir_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (!fs::is_directory(dir_, ec)) fail("{}: cannot create the directory", dir_);
  shard_ = plan_safetensors_shards(tensors_, max_shard_bytes);
  const size_t num_shards = *std::max_element(shard_.begin(), shard_.end()) + 1;
  names_ = safetensors_shard_names(num_shards);
  at_.assign(tensors_.size(), 0);
  put_.assign(tensors_.size(), false);
  for (size_t s = 0; s < num_shards; ++s) {
    std::vector<const SafetensorsTensorOut*> part;
    std::vector<size_t> which;
    for (size_t i = 0; i < tensors_.size(); ++i)
      if (shard_[i] == s) {
        part.push_back(&tensors_[i]);
        which.push_back(i);
      }
    std::vector<uint64_t> at;
    files_.push_back(std::make_unique<AtomicFile>((fs::path(dir_) / names_[s]).string()));
    files_.back()->write(file_header(part, {{"format", "pt"}}, &at));
    for (size_t k = 0; k < which.size(); ++k) at_[which[k]] = at[k];
  }
}

SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;

void SafetensorsStreamWriter::put(size_t i, const float* values) {
  PL_CHECK(i < tensors_.size() && !put_[i], "internal: safetensors tensor {} written twice or unknown", i);
  AtomicFile& f = *files_[shard_[i]];
  for_each_stored_piece(tensors_[i], values,
                        [&](const void* p, size_t bytes, uint64_t off) { f.write_at(at_[i] + off, p, bytes); });
  put_[i] = true;
}

std::vector<std::string> SafetensorsStreamWriter::finish() {
  for (size_t i = 0; i < tensors_.size(); ++i)
    PL_CHECK(put_[i], "internal: {}: tensor '{}' was never written", dir_, tensors_[i].name);
  // 1. Every file complete under its temporary name.
  for (auto& f : files_) f->finish();
  std::unique_ptr<AtomicFile> index;
  if (files_.size() > 1) {
    // transformers writes the index with sorted keys and two-space indentation.
    nlohmann::json j;
    uint64_t total = 0;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      total += stored_bytes(tensors_[i]);
      j["weight_map"][tensors_[i].name] = names_[shard_[i]];
    }
    j["metadata"]["total_size"] = total;
    const std::string text = j.dump(2) + "\n";
    index = std::make_unique<AtomicFile>((fs::path(dir_) / kIndexFile).string());
    index->write(text);
    index->finish();
  }
  std::vector<std::string> written = names_;
  if (index) written.push_back(kIndexFile);
  // 2. Into place: the shards, then away with an earlier export's weight files, then the index.
  for (auto& f : files_) f->commit();
  const std::set<std::string> keep(written.begin(), written.end());
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_weight_file_name(name) && !keep.count(name)) fs::remove(entry.path(), ec);
  }
  if (index)
    index->commit();  // its directory fsync covers the removals too
  else
    fsync_directory(dir_);  // the removals
  return written;
}

std::vector<std::string> write_safetensors_checkpoint(const std::string& dir,
                                                      const std::vector<SafetensorsTensorOut>& tensors,
                                                      uint64_t max_shard_bytes) {
  check_tensors_to_write(tensors);
  SafetensorsStreamWriter w(dir, tensors, max_shard_bytes);
  for (size_t i = 0; i < tensors.size(); ++i) w.put(i, tensors[i].data);
  return w.finish();
}

}  // namespace pl
