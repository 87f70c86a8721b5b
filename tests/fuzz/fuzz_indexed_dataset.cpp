// Megatron's .idx (MMIDIDX) through the IndexedDataset constructor, beside a fixed 4 KiB .bin; every
// sequence the index accepts is then read back with get() (bounds-checked against the mapped .bin).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "data/indexed_dataset.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = [] {
    const std::string p = pl::fuzz::work_dir() + "/data";
    std::vector<uint8_t> bin(4096);
    for (size_t i = 0; i < bin.size(); ++i) bin[i] = static_cast<uint8_t>(i * 7 + 1);
    pl::fuzz::write_file(p + ".bin", bin.data(), bin.size());
    return p;
  }();
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
