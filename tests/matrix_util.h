#pragma once
// A small host matrix for the quantization tests: BF16-valued random data, transposes, and a
// double-precision y = a·bᵀ reference.
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/tensor.h"
#include "numerics/bf16.h"

namespace pl::test {

struct Mat {
  int64_t rows, cols;
  std::vector<float> v;
  Mat(int64_t r, int64_t c, float fill = 0.0f) : rows(r), cols(c), v(static_cast<size_t>(r * c), fill) {}
  Tensor t() { return Tensor(v.data(), {rows, cols}, DType::F32); }
};

// Gaussian values of std `scale`, rounded to BF16, plus `outliers` entries 40x larger.
inline Mat random_bf16(int64_t r, int64_t c, uint32_t seed, float scale = 1.0f, int outliers = 0) {
  Mat m(r, c);
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, scale);
  for (auto& x : m.v) x = num::round_bf16(nd(rng));
  for (int i = 0; i < outliers; ++i) m.v[rng() % m.v.size()] = num::round_bf16(nd(rng) * 40.0f);
  return m;
}

inline Mat transpose(const Mat& m) {
  Mat t(m.cols, m.rows);
  for (int64_t r = 0; r < m.rows; ++r)
    for (int64_t c = 0; c < m.cols; ++c) t.v[c * m.rows + r] = m.v[r * m.cols + c];
  return t;
}

// y = a·bᵀ accumulated in double.
inline Mat matmul_nt(const Mat& a, const Mat& b) {
  Mat y(a.rows, b.rows);
  for (int64_t i = 0; i < a.rows; ++i)
    for (int64_t j = 0; j < b.rows; ++j) {
      double s = 0.0;
      for (int64_t k = 0; k < a.cols; ++k) s += static_cast<double>(a.v[i * a.cols + k]) * b.v[j * b.cols + k];
      y.v[i * b.rows + j] = static_cast<float>(s);
    }
  return y;
}

// ‖got − want‖ / ‖want‖
inline double rel_diff(const Mat& got, const Mat& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.v.size(); ++i) {
    num += (got.v[i] - want.v[i]) * static_cast<double>(got.v[i] - want.v[i]);
    den += static_cast<double>(want.v[i]) * want.v[i];
  }
  return std::sqrt(num / den);
}

}  // namespace pl::test
