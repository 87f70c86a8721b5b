#include "config/paths.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace pl {

namespace fs = std::filesystem;

std::string resolve_config(const std::string& kind, const std::string& name_or_path, const std::string& exe_path) {
  const char* what = kind == "models" ? "model" : "recipe";  // the flag, and what it names
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  if (looks_like_path) {
    // (Anything there that is not a regular file -- a FIFO, a directory -- is named by its reader.)
    PL_CHECK(fs::exists(name_or_path), "{}: no such file (--{})", name_or_path, what);
    return name_or_path;
  }
  std::vector<fs::path> roots;
  if (const char* env = std::getenv("PRETRAIN_LLAMA_CONFIGS")) roots.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::weakly_canonical(fs::path(exe_path), ec);
  if (!ec && exe.has_parent_path()) {
    const fs::path dir = exe.parent_path();
    roots.push_back(dir / ".." / "configs");
    roots.push_back(dir / ".." / ".." / "configs");
    roots.push_back(dir / ".." / "share" / "pretrain_llama" / "configs");
  }
  roots.emplace_back(fs::path(PL_SOURCE_DIR) / "configs");
  std::string tried;
  std::vector<fs::path> seen;
  for (const fs::path& r : roots) {
    const fs::path p = fs::weakly_canonical(r / kind / (name_or_path + ".json"), ec);
    if (std::find(seen.begin(), seen.end(), p) != seen.end()) continue;
    seen.push_back(p);
    if (fs::is_regular_file(p)) return p.string();
    tried += (tried.empty() ? "" : ", ") + p.string();
  }
  fail("--{}: no {} named '{}' (looked for {})", what, what, name_or_path, tried);
}

}  // namespace pl
