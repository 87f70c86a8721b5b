// A .npy file (magic, version, header dict, data) through read_npy.
#include "fuzz_util.h"
#include "io/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pl::fuzz::work_dir() + "/array.npy";
  pl::fuzz::write_file(path, data, size);
  return pl::fuzz::run_parser([&] {
    const pl::NpyArray a = pl::read_npy(path);
    if (a.bytes.size() != static_cast<size_t>(a.numel()) * a.itemsize()) {
      std::fprintf(stderr, "pl_fuzz: FINDING: read_npy returned %zu bytes for %lld elements\n", a.bytes.size(),
                   static_cast<long long>(a.numel()));
      std::abort();
    }
  });
}
