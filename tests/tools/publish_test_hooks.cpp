// Linked into the test-only builds preprocess_data_test_hooks and quantize_tensor_test_hooks (the
// same app source, tests/CMakeLists.txt): before main, installs FileSet's publish hook from the
// environment, so that a CLI test can kill or fail the real program at a test point of its publish
// (io/atomic_file.h). The production programs never read these variables.
//   PL_TEST_PUBLISH_KILL_AT=k  SIGKILL at point k
//   PL_TEST_PUBLISH_FAIL_AT=k  a pl::Error at point k (rolled back in-process, like any error there)
#include <signal.h>

#include <cstdlib>

#include "core/error.h"
#include "io/atomic_file.h"

namespace {

int point_from(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr ? std::atoi(value) : -1;
}

[[maybe_unused]] const bool kInstalled = [] {
  const int kill_at = point_from("PL_TEST_PUBLISH_KILL_AT"), fail_at = point_from("PL_TEST_PUBLISH_FAIL_AT");
  pl::set_publish_test_hook([=](int point) {
    if (point == kill_at) ::raise(SIGKILL);
    PL_CHECK(point != fail_at, "publish: forced failure at point {} (PL_TEST_PUBLISH_FAIL_AT)", point);
  });
  return true;
}();

}  // namespace
