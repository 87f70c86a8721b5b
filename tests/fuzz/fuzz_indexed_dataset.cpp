// Megatron's .idx (MMIDIDX) through the IndexedDataset constructor, beside a .bin of the size the index
// implies (so that inputs get past the reader's .bin/.idx size check and reach get()), or of 4 KiB when
// the header is too malformed to say; every sequence the index accepts is then read back with get()
// (bounds-checked against the mapped .bin).
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "data/indexed_dataset.h"
#include "fuzz_util.h"

namespace {

// The .bin size an MMIDIDX header implies: the last pointer + the last size x the item size. Read here
// independently of the library (test code, bounds-checked); 4096 when the header cannot say, capped at
// 1 MiB so that a huge implied size does not fill the disk.
size_t implied_bin_size(const uint8_t* data, size_t size) {
  constexpr size_t kHeader = 9 + 8 + 1 + 8 + 8;  // magic, version, dtype code, sequences, documents
  if (size < kHeader) return 4096;
  static const size_t item_of_code[] = {0, 1, 1, 2, 4, 8, 8, 4, 2};  // Megatron's DType codes 1..8
  const uint8_t code = data[17];
  if (code < 1 || code > 8) return 4096;
  uint64_t n = 0;
  std::memcpy(&n, data + 18, 8);
  if (n == 0 || n > (size - kHeader) / 12) return 4096;  // int32 sizes and int64 pointers must be there
  int32_t last_size = 0;
  int64_t last_pointer = 0;
  std::memcpy(&last_size, data + kHeader + 4 * (n - 1), 4);
  std::memcpy(&last_pointer, data + kHeader + 4 * n + 8 * (n - 1), 8);
  const __int128 end = static_cast<__int128>(last_pointer) + static_cast<__int128>(last_size) * item_of_code[code];
  if (end < 0 || end > (1 << 20)) return 4096;
  return static_cast<size_t>(end);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = pl::fuzz::work_dir() + "/data";
  std::vector<uint8_t> bin(implied_bin_size(data, size));
  for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i * 7 + 1);
  pl::fuzz::write_file(prefix + ".bin", bin.data(), bin.size());
  pl::fuzz::write_file(prefix + ".idx", data, size);
  return pl::fuzz::run_parser([&] {
    const pl::data::IndexedDataset ds(prefix);
    const auto lengths = ds.sequence_lengths();
    std::vector<int32_t> out;
    for (size_t s = 0; s < std::min<size_t>(lengths.size(), 64); ++s) {
      const int64_t n = std::min<int64_t>(lengths[s], 1024);
      out.resize(static_cast<size_t>(n));
      ds.get(static_cast<int64_t>(s), 0, n, out.data());
    }
  });
}
