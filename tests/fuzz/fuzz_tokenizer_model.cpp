// Llama 3's tokenizer.model (tiktoken ranks: "base64 rank" per line) through make_tokenizer("tiktoken");
// a tokenizer it accepts then encodes a fixed text (BPE over the fuzzed ranks, specials) and decodes it.
#include <string_view>
#include <vector>

#include "data/tokenizer.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pl::fuzz::work_dir() + "/tokenizer.model";
  pl::fuzz::write_file(path, data, size);
  return pl::fuzz::run_parser([&] {
    const auto tok = pl::data::make_tokenizer("tiktoken", path);
    const std::vector<int32_t> ids = tok->encode("hello abc xyz  b\n\n<|end_of_text|> 123 don't \xc3\xa9t\xc3\xa9");
    (void)tok->decode(ids);
    (void)tok->description();
  });
}
