// A checkpoint's metadata.json through verify_checkpoint: the input is written as metadata.json and a
// manifest listing it with its true size and checksum (the saver's format) is written beside it, so
// every input reaches the metadata parser; the --save directory's tracker names iteration 3.
#include <fmt/format.h>

#include "core/checksum.h"
#include "fuzz_util.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string top = [] {
    const std::string t = pl::fuzz::work_dir() + "/ck";
    std::filesystem::create_directories(t + "/iter_0000003");
    pl::fuzz::write_file(t + "/" + pl::kCheckpointTracker, "3\n");
    return t;
  }();
  const std::string dir = top + "/iter_0000003";
  pl::fuzz::write_file(dir + "/metadata.json", data, size);
  pl::fuzz::write_file(
      dir + "/manifest.json",
      fmt::format(R"({{"format_version": 1, "iteration": 3, "files": [{{"name": "metadata.json", "dtype": "json", )"
                  R"("bytes": {}, "checksum": "0x{:016x}"}}]}})",
                  size, pl::checksum64(data, size)));
  return pl::fuzz::run_parser([&] { (void)pl::verify_checkpoint(top, /*read_contents=*/false); });
}
