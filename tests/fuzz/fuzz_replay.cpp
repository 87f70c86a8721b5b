// fuzz_replay: runs saved inputs through the fuzz targets' entry points without libFuzzer, in the normal
// (gcc) build. ctest FuzzRegression.<parser> replays tests/fuzz/regressions/<parser>/ (inputs that once
// crashed a parser) and the seed corpus tests/fuzz/corpus/<parser>/: every input must end in success or a
// pl::Error (anything else aborts in run_parser, or crashes), and with --min-accepted N at least N of them
// must be accepted (the seeds are valid files: a harness that refuses everything tests nothing).
//
//   fuzz_replay [--min-accepted N] [--min-refused N] PARSER FILE_OR_DIR...
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz_util.h"

// Each fuzz_<parser>.cpp is compiled into this program with LLVMFuzzerTestOneInput renamed to
// pl_fuzz_<parser> (tests/CMakeLists.txt).
#define PL_FUZZ_PARSERS(X)                                                                                 \
  X(model_config) X(precision_recipe) X(indexed_dataset) X(safetensors) X(safetensors_index) X(npy)       \
  X(tokenizer_record) X(tokenizer_model) X(checkpoint_manifest) X(checkpoint_metadata)
#define PL_FUZZ_DECLARE(p) extern "C" int pl_fuzz_##p(const uint8_t* data, size_t size);
PL_FUZZ_PARSERS(PL_FUZZ_DECLARE)

namespace {
struct Parser {
  const char* name;
  int (*entry)(const uint8_t*, size_t);
};
#define PL_FUZZ_ENTRY(p) Parser{#p, pl_fuzz_##p},
const Parser kParsers[] = {PL_FUZZ_PARSERS(PL_FUZZ_ENTRY)};

int usage(const char* why) {
  std::fprintf(stderr, "fuzz_replay: %s\nusage: fuzz_replay [--min-accepted N] [--min-refused N] PARSER FILE_OR_DIR...\n", why);
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  long min_accepted = 0, min_refused = 0;
  int i = 1;
  for (; i + 1 < argc && std::string(argv[i]).rfind("--min-", 0) == 0; i += 2) {
    const std::string opt = argv[i];
    const long v = std::strtol(argv[i + 1], nullptr, 10);
    if (opt == "--min-accepted") min_accepted = v;
    else if (opt == "--min-refused") min_refused = v;
    else return usage(("unknown option " + opt).c_str());
  }
  if (argc - i < 2) return usage("needs a parser and at least one input");
  const std::string name = argv[i++];
  const auto parser = std::find_if(std::begin(kParsers), std::end(kParsers), [&](const Parser& p) { return name == p.name; });
  if (parser == std::end(kParsers)) return usage(("unknown parser " + name).c_str());

  std::vector<std::filesystem::path> inputs;
  for (; i < argc; ++i) {
    const std::filesystem::path p = argv[i];
    if (std::filesystem::is_directory(p)) {
      for (const auto& e : std::filesystem::directory_iterator(p))
        if (e.is_regular_file()) inputs.push_back(e.path());
    } else if (std::filesystem::is_regular_file(p)) {
      inputs.push_back(p);
    } else {
      return usage(("no such file or directory: " + p.string()).c_str());
    }
  }
  std::sort(inputs.begin(), inputs.end());
  long accepted = 0, refused = 0;
  for (const auto& path : inputs) {
    std::ifstream in(path, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    parser->entry(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    if (pl::fuzz::last_accepted) {
      ++accepted;
      std::printf("%s: accepted\n", path.c_str());
    } else {
      ++refused;
      std::printf("%s: pl::Error: %s\n", path.c_str(), pl::fuzz::last_error.c_str());
    }
  }
  std::printf("fuzz_replay %s: %zu inputs, %ld accepted, %ld refused with a pl::Error\n", name.c_str(), inputs.size(),
              accepted, refused);
  if (inputs.empty() || accepted < min_accepted || refused < min_refused) {
    std::fprintf(stderr, "fuzz_replay %s: expected at least %ld accepted and %ld refused inputs\n", name.c_str(),
                 min_accepted, min_refused);
    return 1;
  }
  return 0;
}
