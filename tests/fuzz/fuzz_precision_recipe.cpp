// Precision recipe JSON (configs/recipes/*.json) through load_precision_recipe (it takes a path).
#include "config/precision_recipe.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = pl::fuzz::work_dir() + "/recipe.json";
  pl::fuzz::write_file(path, data, size);
  return pl::fuzz::run_parser([&] { (void)pl::load_precision_recipe(path); });
}
