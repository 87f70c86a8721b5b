#pragma once
// Checked arithmetic for every size computed from user input (flags, configs, file headers): a
// product or sum that does not fit int64 is a one-line pl::Error naming what was being computed and
// its operands, never a wrapped value that a later check accepts (issue 14, class 11). Plain
// arithmetic stays fine on values these functions have already bounded.
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "core/error.h"

namespace pl {

// a * b; `what` names the quantity ("--train-iters x --global-batch-size").
inline int64_t checked_mul(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("{} overflows a 64-bit integer ({} x {})", what, a, b);
  return r;
}

inline int64_t checked_add(int64_t a, int64_t b, std::string_view what) {
  int64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) fail("{} overflows a 64-bit integer ({} + {})", what, a, b);
  return r;
}

inline uint64_t checked_mul_u64(uint64_t a, uint64_t b, std::string_view what) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) fail("{} overflows a 64-bit integer ({} x {})", what, a, b);
  return r;
}

// The product of all factors, checked at each step.
inline int64_t checked_product(std::initializer_list<int64_t> factors, std::string_view what) {
  int64_t r = 1;
  for (const int64_t f : factors) r = checked_mul(r, f, what);
  return r;
}

}  // namespace pl
