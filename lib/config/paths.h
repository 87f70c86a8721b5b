#pragma once
#include <string>

namespace pl {

// Resolves a config given by path or by name. A name (no '/' and no ".json") is looked up as
// <configs>/<kind>/<name>.json in: $PRETRAIN_LLAMA_CONFIGS, <exe>/../configs, <exe>/../../configs,
// <exe>/../share/pretrain_llama/configs, and the source tree's configs/. Fails with one line that
// lists where it looked.
std::string resolve_config(const std::string& kind, const std::string& name_or_path, const std::string& exe_path);

}  // namespace pl
