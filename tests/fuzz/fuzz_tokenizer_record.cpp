// The tokenizer sidecar "<prefix>.tokenizer.json" (lib/data/tokenizer_record) through read_tokenizer_record.
#include "data/tokenizer_record.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string prefix = pl::fuzz::work_dir() + "/corpus_text_document";
  pl::fuzz::write_file(pl::data::tokenizer_record_path(prefix), data, size);
  return pl::fuzz::run_parser([&] { (void)pl::data::read_tokenizer_record(prefix); });
}
