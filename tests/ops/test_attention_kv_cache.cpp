// attention_kv_cache (the generate tool's attention, issue 28) against a double-precision reference, against
// attention_forward (with past = 0 it is causal attention over one sequence), appended a row at a time against
// all rows at once, and its errors. Cpu/ and Cuda/AttentionKvCache.* run the same cases on each backend (the GPU
// against the CPU backend within bf16 rounding: the additions run in another order, keys split over warps).
#include "op_test_util.h"

namespace pl::optest {
namespace {

struct KvCase {
  int64_t n, past, nq, nkv, d, capacity;
  int64_t W() const { return (nq + 2 * nkv) * d; }
  int64_t kv() const { return nkv * d; }
};

// The reference: rows [0, past) of the caches as given, then the n new rows' k/v, every query row i of the new
// ones over cached rows 0..past+i, in double.
std::vector<double> attention_kv_cache_reference(const KvCase& c, const std::vector<float>& kc, const std::vector<float>& vc,
                                                 const std::vector<float>& qkv) {
  std::vector<double> out(static_cast<size_t>(c.n * c.nq * c.d));
  const auto key = [&](int64_t j, int64_t g, int64_t e, bool v) -> double {
    if (j >= c.past) return qkv[(j - c.past) * c.W() + (c.nq + (v ? c.nkv : 0) + g) * c.d + e];
    return (v ? vc : kc)[j * c.kv() + g * c.d + e];
  };
  for (int64_t i = 0; i < c.n; ++i)
    for (int64_t h = 0; h < c.nq; ++h) {
      const int64_t g = h / (c.nq / c.nkv), keys = c.past + i + 1;
      std::vector<double> s(static_cast<size_t>(keys));
      double m = -1e300, sum = 0.0;
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0;
        for (int64_t e = 0; e < c.d; ++e) dot += qkv[i * c.W() + h * c.d + e] * key(j, g, e, false);
        s[j] = dot / std::sqrt(static_cast<double>(c.d));
        m = std::max(m, s[j]);
      }
      for (double& x : s) sum += (x = std::exp(x - m));
      for (int64_t e = 0; e < c.d; ++e) {
        double a = 0.0;
        for (int64_t j = 0; j < keys; ++j) a += s[j] * key(j, g, e, true);
        out[(i * c.nq + h) * c.d + e] = a / sum;
      }
    }
  return out;
}

class AttentionKvCache : public OnBackend {};
PL_INSTANTIATE_BACKENDS(AttentionKvCache);

// A prompt (past 0), a decode step (n 1) and a chunk after a prompt, GQA and MHA, odd head dims: the output within
// bf16 rounding of double, the caches' new rows the qkv's k/v heads exactly, their old rows untouched.
TEST_P(AttentionKvCache, MatchesDoubleAndWritesTheNewRowsIntoTheCache) {
  std::mt19937 rng(2801);
  for (const KvCase c : {KvCase{7, 0, 4, 2, 16, 9}, KvCase{1, 13, 4, 1, 32, 20}, KvCase{5, 6, 6, 6, 24, 11},
                         KvCase{3, 40, 8, 2, 64, 50}}) {
    SCOPED_TRACE(fmt::format("n {} past {} heads {}/{} d {}", c.n, c.past, c.nq, c.nkv, c.d));
    HostF32 qkv = random_f32({c.n, c.W()}, rng, -2, 2, true);
    HostF32 kc = random_f32({c.capacity, c.kv()}, rng, -2, 2, true), vc = random_f32({c.capacity, c.kv()}, rng, -2, 2, true);
    const std::vector<double> ref = attention_kv_cache_reference(c, kc.v, vc.v, qkv.v);
    std::vector<float> kc_after, vc_after;
    const std::vector<float> out = run_close(
        GetParam(),
        [&](Backend& b) {
          std::vector<float> q = qkv.v, k = kc.v, v = vc.v, o(static_cast<size_t>(c.n * c.nq * c.d), NAN);
          const DType dt = b.cuda() ? DType::BF16 : DType::F32;
          attention_kv_cache(b.ctx(), b.put(o, {c.n, c.nq * c.d}, dt), b.put(k, {c.capacity, c.kv()}, dt),
                             b.put(v, {c.capacity, c.kv()}, dt), b.put(q, {c.n, c.W()}, dt), c.past, c.nq, c.nkv, c.d);
          kc_after = b.get(k);
          vc_after = b.get(v);
          return b.get(o);
        },
        // (any element may round to the neighbouring bf16 value: the GPU adds in another order; the double
        // reference below judges both backends)
        1.0 / 64, 1e-3, 1.0, "out");
    expect_bf16_close(out, ref, "out vs double", 1.0 / 64, 2e-3);
    for (int64_t r = 0; r < c.capacity; ++r)
      for (int64_t e = 0; e < c.kv(); ++e) {
        const bool fresh = r >= c.past && r < c.past + c.n;
        const size_t at = static_cast<size_t>(r * c.kv() + e);
        const float want_k = fresh ? qkv.v[(r - c.past) * c.W() + c.nq * c.d + e] : kc.v[at];
        const float want_v = fresh ? qkv.v[(r - c.past) * c.W() + c.nq * c.d + c.kv() + e] : vc.v[at];
        ASSERT_EQ(kc_after[at], want_k) << "k cache row " << r;
        ASSERT_EQ(vc_after[at], want_v) << "v cache row " << r;
      }
  }
}

// Appending row by row gives what appending them all at once gives (each query row's keys, in order, are the
// same), and with past = 0 the result is attention_forward's causal attention of the sequence.
TEST_P(AttentionKvCache, RowByRowEqualsAllAtOnceAndCausalAttention) {
  std::mt19937 rng(2802);
  const KvCase c{9, 0, 4, 2, 32, 9};
  HostF32 qkv = random_f32({c.n, c.W()}, rng, -2, 2, true);
  Backend b(GetParam());
  const DType dt = b.cuda() ? DType::BF16 : DType::F32;
  std::vector<float> k(static_cast<size_t>(c.capacity * c.kv())), v(k.size());
  std::vector<float> all(static_cast<size_t>(c.n * c.nq * c.d), NAN), q = qkv.v;
  attention_kv_cache(b.ctx(), b.put(all, {c.n, c.nq * c.d}, dt), b.put(k, {c.capacity, c.kv()}, dt),
                     b.put(v, {c.capacity, c.kv()}, dt), b.put(q, {c.n, c.W()}, dt), 0, c.nq, c.nkv, c.d);
  const std::vector<float> at_once = b.get(all);
  std::vector<float> k2(k.size()), v2(k.size()), one_by_one;
  const Tensor kt = b.put(k2, {c.capacity, c.kv()}, dt), vt = b.put(v2, {c.capacity, c.kv()}, dt);
  for (int64_t i = 0; i < c.n; ++i) {
    std::vector<float> row(qkv.v.begin() + i * c.W(), qkv.v.begin() + (i + 1) * c.W()), o(c.nq * c.d, NAN);
    attention_kv_cache(b.ctx(), b.put(o, {1, c.nq * c.d}, dt), kt, vt, b.put(row, {1, c.W()}, dt), i, c.nq, c.nkv, c.d);
    const std::vector<float> got = b.get(o);
    one_by_one.insert(one_by_one.end(), got.begin(), got.end());
  }
  expect_bits_equal(one_by_one, at_once, "row by row vs all at once");
  if (b.cuda()) return;  // (cuDNN's attention sums in its own order: the CPU compares the two ops exactly enough)
  std::vector<float> out(at_once.size(), NAN), lse(static_cast<size_t>(c.nq * c.n)), q2 = qkv.v;
  attention_forward(b.ctx(), host_view(out, {c.n, c.nq * c.d}), host_view(lse, {1, c.nq, c.n}),
                    host_view(q2, {c.n, c.W()}), AttentionShape{1, c.n, c.nq, c.nkv, c.d});
  std::vector<double> ref(out.begin(), out.end());
  expect_bf16_close(at_once, ref, "kv cache vs attention_forward", 1.0 / 128, 1e-3);
}

TEST(OpsAttentionKvCache, ErrorsNameTheOp) {
  const OpContext ctx = cpu_ctx(true);
  HostF32 qkv({2, 64}), out({2, 32}), kc({4, 16}), vc({4, 16}), small({1, 16});
  // 2 query heads, 1 kv head of dim 16: qkv 64 wide, out 32, caches 16.
  expect_error_naming("attention_kv_cache", [&] { attention_kv_cache(ctx, out.t(), kc.t(), vc.t(), qkv.t(), 3, 2, 1, 16); });
  expect_error_naming("attention_kv_cache", [&] { attention_kv_cache(ctx, out.t(), kc.t(), small.t(), qkv.t(), 0, 2, 1, 16); });
  expect_error_naming("attention_kv_cache", [&] { attention_kv_cache(ctx, out.t(), kc.t(), vc.t(), qkv.t(), 0, 3, 2, 16); });
  expect_error_naming("attention_kv_cache", [&] { attention_kv_cache(ctx, out.t(), kc.t(), vc.t(), qkv.t(), 0, 2, 1, 8); });
  attention_kv_cache(ctx, out.t(), kc.t(), vc.t(), qkv.t(), 2, 2, 1, 16);  // fits exactly: no error
}

}  // namespace
}  // namespace pl::optest
