// model.safetensors.index.json through SafetensorsCheckpoint (a sharded Hugging Face directory), beside
// two fixed shards: model-00001-of-00002.safetensors holds "a" and "b", model-00002-of-00002 holds "c".
#include <vector>

#include "fuzz_util.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = pl::fuzz::work_dir() + "/hf";
    std::filesystem::create_directories(d);
    static const std::vector<float> v = {1.0f, -2.0f, 0.5f, 3.0f, 4.0f, -0.25f};
    pl::write_safetensors(d + "/model-00001-of-00002.safetensors",
                          {{"a", "BF16", {2, 2}, v.data()}, {"b", "F32", {2}, v.data() + 4}});
    pl::write_safetensors(d + "/model-00002-of-00002.safetensors", {{"c", "F32", {3}, v.data()}});
    return d;
  }();
  pl::fuzz::write_file(dir + "/model.safetensors.index.json", data, size);
  return pl::fuzz::run_parser([&] {
    const pl::SafetensorsCheckpoint ck(dir);
    for (const std::string& name : ck.names()) (void)ck.read_float(name);
    (void)ck.data_bytes();
  });
}
