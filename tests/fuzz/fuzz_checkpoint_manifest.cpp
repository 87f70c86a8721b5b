// A checkpoint's manifest.json through verify_checkpoint (sizes only, as the non-zero data-parallel
// ranks verify), in an iter_0000003 directory holding the four state files of llama_tiny at their
// sizes (sparse) and the metadata.json seed of fuzz_checkpoint_metadata (so that a manifest listing it
// with its real checksum reaches the metadata checks).
#include <fstream>
#include <iterator>
#include <utility>

#include "fuzz_util.h"
#include "train/checkpoint.h"

#ifndef PL_FUZZ_CORPUS_DIR
#error "PL_FUZZ_CORPUS_DIR (tests/fuzz/corpus) must be defined by tests/fuzz/CMakeLists.txt"
#endif

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    const std::string d = pl::fuzz::work_dir() + "/ck/iter_0000003";
    std::filesystem::create_directories(d);
    const std::pair<const char*, uintmax_t> state[] = {{"master_fp32.bin", 3150848},
                                                       {"weights_bf16.bin", 1575424},
                                                       {"adam_m_fp32.bin", 3150848},
                                                       {"adam_v_fp32.bin", 3150848}};
    for (const auto& [name, bytes] : state) {
      pl::fuzz::write_file(d + "/" + name, "", 0);
      std::filesystem::resize_file(d + "/" + name, bytes);
    }
    std::ifstream in(std::string(PL_FUZZ_CORPUS_DIR) + "/checkpoint_metadata/metadata_llama_tiny_iter3.json",
                     std::ios::binary);
    const std::string meta((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (meta.empty()) {
      std::fprintf(stderr, "pl_fuzz: cannot read the metadata seed under %s\n", PL_FUZZ_CORPUS_DIR);
      std::abort();
    }
    pl::fuzz::write_file(d + "/metadata.json", meta);
    return d;
  }();
  pl::fuzz::write_file(dir + "/manifest.json", data, size);
  return pl::fuzz::run_parser([&] { (void)pl::verify_checkpoint(dir, /*read_contents=*/false); });
}
