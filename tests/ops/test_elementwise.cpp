// add (with aliasing and rounding) and fill_zero.
#include "op_test_util.h"

namespace pl::optest {
namespace {

TEST(OpsElementwise, AddIsExactFp32Sum) {
  std::mt19937 rng(701);
  HostF32 a = random_f32({13, 29}, rng), b = random_f32({13, 29}, rng), out({13, 29});
  add(cpu_ctx(false), out.t(), a.t(), b.t());
  for (size_t i = 0; i < out.size(); ++i) ASSERT_EQ(out[i], static_cast<float>(double(a[i]) + double(b[i])));
}

TEST(OpsElementwise, AddAliasingAndRounding) {
  std::mt19937 rng(702);
  HostF32 a = random_f32({1000}, rng, -1, 1, true), b = random_f32({1000}, rng, -1, 1, true);
  HostF32 a0 = a, b0 = b;
  add(cpu_ctx(true), a.t(), a.t(), b.t());  // out aliases a
  expect_bf16_representable(a.v, "a + b");
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], num::round_bf16(a0[i] + b0[i])) << i;
  add(cpu_ctx(false), b.t(), a0.t(), b.t());  // out aliases b
  for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], a0[i] + b0[i]) << i;
}

TEST(OpsElementwise, FillZero) {
  std::mt19937 rng(703);
  HostF32 x = random_f32({(1 << 19) + 37}, rng);  // more than one 1 MiB chunk, with a tail
  fill_zero(cpu_ctx(true), x.t());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(num::float_bits(x[i]), 0u) << i;
  HostI32 ids({17}, 5);
  fill_zero(cpu_ctx(false), ids.t());
  for (int32_t v : ids.v) ASSERT_EQ(v, 0);
}

TEST(OpsElementwise, ErrorsNameTheOp) {
  HostF32 a({4, 8}), b({8, 4}), out({4, 8});
  expect_error_naming("add", [&] { add(cpu_ctx(false), out.t(), a.t(), b.t()); });
  expect_error_naming("add", [&] { add(cpu_ctx(false), b.t(), a.t(), a.t()); });
}

}  // namespace
}  // namespace pl::optest
