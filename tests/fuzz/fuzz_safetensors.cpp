// A .safetensors file (8-byte header length, JSON header, data) through SafetensorsFile's validation;
// every tensor it accepts is then read (its bytes, and as floats where the dtype converts).
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pl::fuzz::work_dir() + "/model.safetensors";
  pl::fuzz::write_file(path, data, size);
  return pl::fuzz::run_parser([&] {
    const pl::SafetensorsFile f(path);
    std::vector<float> out;
    for (const pl::SafetensorsTensorInfo& t : f.tensors()) {
      (void)f.bytes(t.name);
      if ((t.dtype == "F32" || t.dtype == "BF16" || t.dtype == "F16") && t.numel() <= (1 << 16)) {
        out.resize(static_cast<size_t>(t.numel()));
        f.read_float(t.name, out.data());
      }
    }
  });
}
