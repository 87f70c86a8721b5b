// Model config JSON (configs/models/*.json): the in-memory half of load_model_config, i.e.
// parse_json_text (the nesting limit) then model_config_from_json (fields, then validation).
#include <string_view>

#include "config/model_config.h"
#include "fuzz_util.h"
#include "io/json_text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return pl::fuzz::run_parser([&] {
    const std::string_view text(reinterpret_cast<const char*>(data), size);
    const pl::ModelConfig m = pl::model_config_from_json(pl::parse_json_text(text, "fuzz.json"), "fuzz.json");
    (void)m;
  });
}
