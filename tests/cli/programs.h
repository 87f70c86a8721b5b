#pragma once
// The programs and model configs the CLI tests run, at the paths CMake compiles in (tests/CMakeLists.txt). One
// definition for the whole suite: it compiles in unity batches, where two test files' anonymous-namespace
// constants of one name would be one name defined twice.
#include <string>
#include <vector>

#include "test_util.h"

inline const std::string kApp = PL_APP_PATH;
inline const std::string kConvert = PL_CONVERT_CHECKPOINT_PATH;
inline const std::string kPreprocess = PL_PREPROCESS_DATA_PATH;
inline const std::string kInspect = PL_INSPECT_DATA_PATH;
inline const std::string kGenerate = PL_GENERATE_PATH;
inline const std::string kEvaluate = PL_EVALUATE_PATH;
inline const std::string kTiny = std::string(PL_CONFIG_DIR) + "/models/llama_tiny.json";
inline const std::string kTinyBytes = std::string(PL_CONFIG_DIR) + "/models/llama_tiny_bytes.json";

// pretrain_llama with `args`, stdout and stderr captured; killed after `timeout_s` (a hang fails its test).
inline pl::test::ProcessResult run_app(const std::vector<std::string>& args, double timeout_s = 300.0) {
  return pl::test::run_process(kApp, args, timeout_s);
}
