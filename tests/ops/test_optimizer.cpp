// sum_of_squares (thread-count invariance, the documented fp32 schedule bit for bit, accuracy against
// double), AdamW against a hand-computed double step, and the master -> param copy.
// Cpu/Optimizer.* and Cuda/Optimizer.* run the same cases on each backend (the GPU also against the
// CPU backend, bit for bit); OpsOptimizer.* are CPU-only; CudaOptimizer.* GPU-only (device range table).
#include <limits>
#include <optional>

#include "numerics/adamw.h"
#include "numerics/reduce.h"
#include "op_test_util.h"

namespace pl::optest {
namespace {

TEST(OpsOptimizer, SumOfSquaresMatchesDoubleAndIgnoresThreadCount) {
  std::mt19937 rng(901);
  const int64_t n = 3 * 65536 + 1234;  // several chunks and a tail
  HostF32 x = random_f32({n}, rng, -3, 3);
  double ref = 0.0;
  for (float v : x.v) ref += double(v) * v;
  double one, two, three;
  {
    ScopedThreads t(1);
    one = sum_of_squares(cpu_ctx(false), x.t());
  }
  {
    ScopedThreads t(2);
    two = sum_of_squares(cpu_ctx(false), x.t());
  }
  {
    ScopedThreads t(3);  // chunks split unevenly over threads
    three = sum_of_squares(cpu_ctx(false), x.t());
  }
  EXPECT_EQ(one, three) << "the result must not depend on the thread count";
  EXPECT_EQ(one, two) << "the result must not depend on the thread count";
  // fp32 lanes of 256 terms, then 8 tree levels per chunk and 8 per group level: relative error
  // <= ~(256 + 24) 2^-24 ~ 1.7e-5 in the worst case, far less in practice.
  EXPECT_NEAR(one, ref, 2e-5 * ref);
  // Shape does not matter, only the flat element order.
  EXPECT_EQ(sum_of_squares(cpu_ctx(true), x.t().view({2, n / 2})), one);
  HostF32 empty({0});
  EXPECT_EQ(sum_of_squares(cpu_ctx(false), empty.t()), 0.0);
}

// The schedule of numerics/reduce.h written out here with plain loops (not the header's helpers): chunks
// of 65536 elements; in a chunk, element i goes to lane i % 256, each lane summed in order in fp32 from
// +0; lanes combined by the stride tree (s = 128..1: lane[k] += lane[k + s]); chunk partials in groups
// of 256 (padded with +0), each group by the same tree, level after level until one value is left.
float documented_sum_of_squares(const std::vector<float>& x) {
  const auto tree256 = [](float* a) {
    for (int s = 128; s >= 1; s /= 2)
      for (int k = 0; k < s; ++k) a[k] = a[k] + a[k + s];
    return a[0];
  };
  std::vector<float> part;
  for (size_t c0 = 0; c0 < x.size(); c0 += 65536) {
    float lane[256] = {};
    for (size_t i = c0; i < std::min(x.size(), c0 + 65536); ++i) lane[(i - c0) % 256] += x[i] * x[i];
    part.push_back(tree256(lane));
  }
  while (part.size() > 1) {
    std::vector<float> next;
    for (size_t g = 0; g < part.size(); g += 256) {
      float slot[256] = {};
      for (size_t k = 0; k < 256 && g + k < part.size(); ++k) slot[k] = part[g + k];
      next.push_back(tree256(slot));
    }
    part = next;
  }
  return part.empty() ? 0.0f : part[0];
}

TEST(OpsOptimizer, SumOfSquaresFollowsTheDocumentedFp32Schedule) {
  std::mt19937 rng(902);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-3.0f, 3.0f);
  // One chunk with a partial lane round; several chunks; more than 256 chunks (two tree levels).
  for (int64_t n : {int64_t{1}, int64_t{1000}, int64_t{3 * 65536 + 12345}, int64_t{300 * 65536 + 7}}) {
    HostF32 x({n});
    for (float& v : x.v) v = nd(rng) * std::pow(10.0f, ex(rng));  // six decades: the order matters
    const double got = sum_of_squares(cpu_ctx(false), x.t());
    const float want = documented_sum_of_squares(x.v);
    EXPECT_EQ(got, static_cast<double>(want)) << "n = " << n;
    double ref = 0.0;
    for (float v : x.v) ref += double(v) * v;
    EXPECT_NEAR(got, ref, 2e-5 * ref) << "n = " << n;
  }
}

struct Hyper {
  double lr, b1, b2, eps, wd, scale;
};

// One AdamW (decoupled weight decay, bias-corrected) step in double, by hand.
void ref_adamw(std::vector<double>& p, std::vector<double>& m, std::vector<double>& v,
               const std::vector<double>& g, const Hyper& h, int64_t step) {
  const double bc1 = 1.0 - std::pow(h.b1, double(step)), bc2 = 1.0 - std::pow(h.b2, double(step));
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = g[i] * h.scale;
    m[i] = h.b1 * m[i] + (1.0 - h.b1) * gi;
    v[i] = h.b2 * v[i] + (1.0 - h.b2) * gi * gi;
    const double update = (m[i] / bc1) / (std::sqrt(v[i] / bc2) + h.eps) + h.wd * p[i];
    p[i] -= h.lr * update;
  }
}

TEST(OpsOptimizer, AdamWUsesSharedElementAndLargeStep) {
  std::mt19937 rng(903);
  const int64_t n = 257;
  HostF32 master = random_f32({n}, rng), m = random_f32({n}, rng, -0.1f, 0.1f),
          v = random_f32({n}, rng, 0, 0.01f);
  HostF32 grad = random_f32({n}, rng), param({n});
  const AdamWStep st{3e-4f, 0.9f, 0.95f, 1e-8f, 0.0f, 10000, 1.0f};
  HostF32 em = master, e1 = m, e2 = v;
  num::AdamWHyper h{st.lr, st.beta1, st.beta2, st.eps, st.weight_decay, 1.0f, 1.0f, st.grad_scale};
  h.bias_correction1 = float(1.0 - std::pow(double(st.beta1), 10000.0));
  h.bias_correction2 = float(1.0 - std::pow(double(st.beta2), 10000.0));
  for (int64_t i = 0; i < n; ++i) num::adamw_element(em[i], e1[i], e2[i], grad[i], h);
  adamw_update(cpu_ctx(false), param.t(), master.t(), grad.t(), m.t(), v.t(), st);
  EXPECT_TRUE(bitwise_equal(master.v, em.v));
  EXPECT_TRUE(bitwise_equal(m.v, e1.v));
  EXPECT_TRUE(bitwise_equal(v.v, e2.v));
  EXPECT_TRUE(bitwise_equal(param.v, master.v)) << "param = master when !round_bf16";
}

// The multi-tensor step over flat buffers equals one adamw_update per tensor (weight decay 0 on the
// tensors listed as no-decay ranges) bit for bit: master, m, v and param, over several steps, with
// rounding on and off, ranges at the start, in the middle, adjacent to each other and at the end.
TEST(OpsOptimizer, AdamWMultiTensorEqualsPerTensorBitForBit) {
  std::mt19937 rng(905);
  // Tensor sizes and whether each decays (false: a "norm weight", a no-decay range).
  const std::vector<std::pair<int64_t, bool>> tensors = {{7, false},   {300, true}, {1000, true}, {33, false},
                                                         {65, false},  {4096, true}, {1, false},  {512, true},
                                                         {17, false}};
  int64_t n = 0;
  std::vector<int64_t> ranges;  // merged, as train/optimizer.cpp builds them
  for (const auto& [size, decays] : tensors) {
    if (!decays) {
      if (!ranges.empty() && ranges.back() == n)
        ranges.back() = n + size;
      else
        ranges.insert(ranges.end(), {n, n + size});
    }
    n += size;
  }
  ASSERT_EQ(ranges.size(), 8u) << "the two adjacent no-decay tensors merge into one range";
  const ElementRanges no_decay{ranges.data(), nullptr, static_cast<int64_t>(ranges.size() / 2)};
  for (bool round : {true, false}) {
    SCOPED_TRACE(round ? "round_bf16" : "fp32");
    HostF32 master = random_f32({n}, rng, -1, 1), m = random_f32({n}, rng, -0.1f, 0.1f),
            v = random_f32({n}, rng, 0, 0.01f), param({n});
    HostF32 master2 = master, m2 = m, v2 = v, param2({n});
    for (int64_t step = 1; step <= 3; ++step) {
      HostF32 grad = random_f32({n}, rng, -2, 2);
      const AdamWStep st{1e-3f * float(step), 0.9f, 0.95f, 1e-8f, 0.033f, step, step == 2 ? 0.37f : 1.0f};
      int64_t off = 0;
      for (const auto& [size, decays] : tensors) {
        AdamWStep s = st;
        s.weight_decay = decays ? st.weight_decay : 0.0f;
        adamw_update(cpu_ctx(round), param.t().rows(off, size), master.t().rows(off, size), grad.t().rows(off, size),
                     m.t().rows(off, size), v.t().rows(off, size), s);
        off += size;
      }
      adamw_update_multi(cpu_ctx(round), param2.t(), master2.t(), grad.t(), m2.t(), v2.t(), no_decay, st);
      ASSERT_TRUE(bitwise_equal(master2.v, master.v)) << "master at step " << step;
      ASSERT_TRUE(bitwise_equal(m2.v, m.v)) << "m at step " << step;
      ASSERT_TRUE(bitwise_equal(v2.v, v.v)) << "v at step " << step;
      ASSERT_TRUE(bitwise_equal(param2.v, param.v)) << "param at step " << step;
    }
    // Decay really differs between the two kinds of element (else the ranges would be untested).
    HostF32 a = master, am({n}), av({n}), ap({n}), b = master, bm({n}), bv({n}), bp({n}), g({n});
    const AdamWStep st{1e-2f, 0.9f, 0.95f, 1e-8f, 0.5f, 1, 1.0f};
    adamw_update_multi(cpu_ctx(round), ap.t(), a.t(), g.t(), am.t(), av.t(), no_decay, st);
    adamw_update(cpu_ctx(round), bp.t(), b.t(), g.t(), bm.t(), bv.t(), st);  // decay everywhere
    EXPECT_EQ(a[0], master[0]) << "element 0 is in a no-decay range: zero gradient leaves it unchanged";
    EXPECT_NE(b[0], master[0]);
    EXPECT_EQ(a[10], b[10]) << "element 10 decays in both";
  }
}

TEST(OpsOptimizer, AdamWMultiTensorRejectsBadRanges) {
  HostF32 a({10});
  const AdamWStep st{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.0f};
  const int64_t unsorted[] = {5, 7, 2, 3}, outside[] = {8, 11}, inverted[] = {4, 2};
  for (const int64_t* r : {unsorted, outside, inverted}) {
    const ElementRanges bad{r, nullptr, r == unsorted ? 2 : 1};
    expect_error_naming("adamw_update_multi",
                        [&] { adamw_update_multi(cpu_ctx(false), a.t(), a.t(), a.t(), a.t(), a.t(), bad, st); });
  }
}

TEST(OpsOptimizer, ErrorsNameTheOp) {
  HostF32 a({10}), b({11});
  HostI32 ia({10});
  AdamWStep st{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f};
  expect_error_naming("adamw_update",
                      [&] { adamw_update(cpu_ctx(false), a.t(), a.t(), b.t(), a.t(), a.t(), st); });
  st.step = 0;
  expect_error_naming("adamw_update",
                      [&] { adamw_update(cpu_ctx(false), a.t(), a.t(), a.t(), a.t(), a.t(), st); });
  expect_error_naming("copy_master_to_param", [&] { copy_master_to_param(cpu_ctx(false), b.t(), a.t()); });
  expect_error_naming("sum_of_squares", [&] { sum_of_squares(cpu_ctx(false), ia.t()); });
}

// ---- on every backend (Cpu/ and Cuda/Optimizer.*) -------------------------------------------------

class Optimizer : public OnBackend {};
PL_INSTANTIATE_BACKENDS(Optimizer);

// Within 2e-5 of double (see SumOfSquaresMatchesDoubleAndIgnoresThreadCount). Exact between backends:
// the GPU follows the CPU's fp32 summation schedule (numerics/reduce.h: chunks of 65536, 256 lanes,
// fixed lane tree, chunk partials by the group tree). A partial last chunk with a partial lane round;
// more than 256 chunks (two levels of the group tree); six decades: the summation order matters.
TEST_P(Optimizer, SumOfSquares) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> ex(-3.0f, 3.0f);
  Backend k(GetParam());
  for (int64_t n : {int64_t{5}, int64_t{3 * 65536 + 12345}, int64_t{300 * 65536 + 77}}) {
    std::vector<float> x(n);
    for (float& v : x) v = nd(rng) * std::pow(10.0f, ex(rng));
    double ref = 0.0;
    for (float v : x) ref += double(v) * v;
    const double got = sum_of_squares(k.ctx(), k.put(x, {n}, DType::F32));
    EXPECT_NEAR(got, ref, 2e-5 * ref) << "n = " << n;
    if (!on_cuda()) continue;
    const double cpu = sum_of_squares(cpu_ctx(true), host_view(x, {n}));
    EXPECT_EQ(got, cpu) << "n = " << n << ", difference " << got - cpu;
  }
}

// The chunk partials: the tree over all of them is sum_of_squares bit for bit, and the partials of two
// chunk-aligned halves, concatenated, are the partials of the whole (the distributed optimizer's norm).
TEST_P(Optimizer, SumOfSquaresChunksAreTheNormsPartials) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  Backend k(GetParam());
  const int64_t K = num::kSumSquaresChunk, n = 5 * K + 777;
  std::vector<float> x(n);
  for (float& v : x) v = nd(rng);
  const Tensor xt = k.put(x, {n}, DType::F32);
  auto partials = [&](std::vector<float>& out, const Tensor& of) {
    sum_of_squares_chunks(k.ctx(), k.put(out, {static_cast<int64_t>(out.size())}, DType::F32), of);
    return k.get(out);
  };
  std::vector<float> w(6), l(2), h(4), bad(5);
  const std::vector<float> whole = partials(w, xt);
  std::vector<float> tree = whole;
  EXPECT_EQ(static_cast<double>(num::group_tree_sum(tree.data(), 6)), sum_of_squares(k.ctx(), xt));
  std::vector<float> both = partials(l, xt.rows(0, 2 * K));
  const std::vector<float> hi = partials(h, xt.rows(2 * K, n - 2 * K));
  both.insert(both.end(), hi.begin(), hi.end());
  EXPECT_EQ(both, whole);
  EXPECT_THROW(partials(bad, xt), Error);  // x needs [6] partials
}

// AdamW against a hand-computed double step: from zero moments over three steps, and from a trained
// state at step 7 (n = 100003); param = round_bf16(master), BF16 or F32 storage. Exact between
// backends: one num::adamw_element per element with the hyper-parameters built as the CPU builds them.
TEST_P(Optimizer, AdamWMatchesHandComputedStep) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (DType param_dtype : {DType::BF16, DType::F32})
    for (bool fresh : {true, false}) {
      SCOPED_TRACE(std::string("param ") + dtype_name(param_dtype) + (fresh ? ", from zero moments" : ", at step 7"));
      const int64_t n = fresh ? 1000 : 100003;
      AdamWStep st = fresh ? AdamWStep{0.05f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 0.5f}
                           : AdamWStep{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 7, 0.8f};
      // The float hyper-parameters, exactly, in double.
      const Hyper h{st.lr, st.beta1, st.beta2, st.eps, st.weight_decay, st.grad_scale};
      std::vector<float> master(n), m(n, 0.0f), v(n, 0.0f), grad(n);
      for (int64_t i = 0; i < n; ++i) {
        master[i] = fresh ? u(rng) : 0.02f * nd(rng);
        if (!fresh) m[i] = 1e-3f * nd(rng), v[i] = 1e-6f * std::abs(nd(rng));
      }
      for (int steps = fresh ? 3 : 1; steps > 0; --steps, ++st.step) {
        for (float& g : grad) g = fresh ? 2.0f * u(rng) : 1e-2f * nd(rng);
        const std::vector<float> got = run_exact(GetParam(), [&](Backend& k) {  // [master | m | v | param]
          std::vector<float> ma = master, mm = m, vv = v, p(n);
          adamw_update(k.ctx(), k.put(p, {n}, param_dtype), k.put(ma, {n}, DType::F32), k.put(grad, {n}, DType::F32),
                       k.put(mm, {n}, DType::F32), k.put(vv, {n}, DType::F32), st);
          return joined({k.get(ma), k.get(mm), k.get(vv), k.get(p)});
        }, "adamw [master | m | v | param] at step " + std::to_string(st.step));
        std::vector<double> pd(master.begin(), master.end()), md(m.begin(), m.end()), vd(v.begin(), v.end());
        ref_adamw(pd, md, vd, std::vector<double>(grad.begin(), grad.end()), h, st.step);
        // Compare the change of the master weights (not just the weights) so the update is checked tightly.
        std::vector<double> delta(n), ref_delta(n);
        for (int64_t i = 0; i < n; ++i) {
          delta[i] = double(got[i]) - master[i];
          ref_delta[i] = pd[i] - master[i];
        }
        // Continue from the op's state.
        master.assign(got.begin(), got.begin() + n);
        m.assign(got.begin() + n, got.begin() + 2 * n);
        v.assign(got.begin() + 2 * n, got.begin() + 3 * n);
        expect_close(delta, ref_delta, 1e-5, "master update at step " + std::to_string(st.step));
        expect_close(m, md, 1e-6, "m at step " + std::to_string(st.step));
        expect_close(v, vd, 1e-6, "v at step " + std::to_string(st.step));
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[3 * n + i], num::round_bf16(master[i])) << i;
      }
    }
}

// param = round_bf16(master), or master itself without rounding; F32 or BF16 storage. Exact between
// backends, including Inf, NaN, subnormals and rounding ties.
TEST_P(Optimizer, CopyMasterToParam) {
  PL_SEEDED_RNG(rng);
  const int64_t n = 4099;
  std::vector<float> master = uniform_f32(n, rng, -2.0f, 2.0f);
  master[0] = std::numeric_limits<float>::infinity();
  master[1] = -std::numeric_limits<float>::infinity();
  master[2] = std::numeric_limits<float>::quiet_NaN();
  master[3] = 1e-40f;                        // subnormal
  master[4] = num::bits_float(0x3F808000u);  // a tie: rounds to even (down)
  master[5] = num::bits_float(0x3F818000u);  // a tie: rounds to even (up)
  master[6] = 3.4e38f;                       // rounds to +Inf in bf16
  for (bool round : {true, false})
    for (DType dt : {DType::F32, DType::BF16}) {
      if (!round && dt == DType::BF16) continue;  // a BF16 param is always rounded
      const std::string what = std::string(dtype_name(dt)) + " param" + (round ? ", rounded" : ", not rounded");
      const std::vector<float> param = run_exact(GetParam(), [&](Backend& k) {
        std::vector<float> p(n);
        copy_master_to_param(k.ctx(round), k.put(p, {n}, dt), k.put(master, {n}, DType::F32));
        return k.get(p);
      }, what);
      std::vector<float> want = master;
      if (round) {
        for (float& x : want) x = num::round_bf16(x);
        expect_bf16_representable(param, what);
      }
      EXPECT_TRUE(bitwise_equal(param, want)) << what;
    }
}

// ---- the precision-aware optimizer's BF16 moments ------------------------------------------------------

// The double-precision reference of a BF16 store: the nearest bf16 value of x, ties to the even
// mantissa, |x| past the largest finite bf16's rounding boundary -> +-Inf (as RNE does).
double ref_bf16(float x) {
  if (std::isnan(x) || std::isinf(x)) return x;
  const double d = x;
  if (d == 0.0) return d;
  int e;
  std::frexp(std::abs(d), &e);                      // |d| in [2^(e-1), 2^e)
  const int q = std::max(e - 8, -133);              // spacing 2^q: 8 significant bits, subnormals below 2^-126
  const double ulp = std::ldexp(1.0, q);
  const double lo = std::floor(d / ulp) * ulp, hi = lo + ulp;
  double r;
  if (d - lo < hi - d) r = lo;
  else if (d - lo > hi - d) r = hi;
  else r = std::fmod(std::abs(lo / ulp), 2.0) == 0.0 ? lo : hi;  // tie: the even multiple of the spacing
  const double max_bf16 = std::ldexp(255.0, 120);                  // 0x7F7F
  if (std::abs(r) > max_bf16) return std::copysign(std::numeric_limits<double>::infinity(), d);
  return r;
}

// num::state_store / state_load for a BF16 state against the double reference: random values over the
// whole range, ties both ways, subnormals, the overflow boundary (-> Inf) and signed zeros; FP32 states
// are plain copies.
TEST(OpsOptimizer, Bf16StateStoreRoundsToNearestEvenAgainstDouble) {
  PL_SEEDED_RNG(rng);
  std::uniform_int_distribution<uint32_t> bits(0, 0x7F7FFFFFu);
  std::vector<float> xs = {0.0f, -0.0f, 1.0f, num::bits_float(0x3F808000u) /* tie, down to even */,
                           num::bits_float(0x3F818000u) /* tie, up to even */, num::bits_float(0x3F808001u),
                           num::bits_float(0x00008000u) /* subnormal tie */, num::bits_float(0x00018000u),
                           1e-40f, -3e-39f, num::bits_float(0x7F7F7FFFu) /* just below the overflow tie */,
                           num::bits_float(0x7F7F8000u) /* the overflow tie: -> Inf */, 3.4e38f, -3.4e38f};
  for (int i = 0; i < 100000; ++i) {
    const float x = num::bits_float(bits(rng));
    xs.push_back(i % 2 ? x : -x);
  }
  for (float x : xs) {
    uint16_t b = 0;
    num::state_store(b, x);
    const float back = num::state_load(b);
    const double want = ref_bf16(x);
    ASSERT_TRUE(back == want && std::signbit(back) == std::signbit(x))
        << "x = " << x << " (0x" << std::hex << num::float_bits(x) << "): stored " << back << ", want " << want;
    float f = 0.0f;
    num::state_store(f, x);
    ASSERT_EQ(num::float_bits(num::state_load(f)), num::float_bits(x));
  }
}

// A BF16 master-weight step with BF16 moments (any of the four m/v dtype pairs): every element loads its
// moments to FP32, computes the FP32 step and stores them RNE, so the master weights and params equal the
// FP32-moment step's from the same (bf16-valued) state bit for bit, and the stored moments are exactly
// round_bf16 of the FP32 step's. Exact between backends.
TEST_P(Optimizer, AdamWBf16MomentsLoadComputeFp32AndStoreRne) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 70001;
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    m[i] = num::round_bf16(1e-3f * nd(rng));  // bf16 values: the state a BF16 moment holds
    v[i] = num::round_bf16(1e-6f * std::abs(nd(rng)));
    grad[i] = 1e-2f * nd(rng);
  }
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 7, 0.8f};
  // The FP32-moment step on the CPU: the reference.
  std::vector<float> r_param(n), r_master = master, r_m = m, r_v = v;
  adamw_update(cpu_ctx(true), host_view(r_param, {n}), host_view(r_master, {n}), host_view(grad, {n}),
               host_view(r_m, {n}), host_view(r_v, {n}), step);
  for (DType mt : {DType::F32, DType::BF16})
    for (DType vt : {DType::F32, DType::BF16}) {
      const std::string what = std::string("m ") + dtype_name(mt) + ", v " + dtype_name(vt);
      SCOPED_TRACE(what);
      auto run = [&](Backend& k) {  // [master | m | v | param]
        std::vector<float> p(n), ma = master;
        std::vector<float> mf = m, vf = v;
        std::vector<uint16_t> mb(n), vb(n);
        for (int64_t i = 0; i < n; ++i) mb[i] = num::float_to_bf16_bits(m[i]), vb[i] = num::float_to_bf16_bits(v[i]);
        std::optional<DeviceTensor> dm, dv;
        auto moment = [&](std::vector<float>& f, std::vector<uint16_t>& b, DType dt) {
          if (dt == DType::F32) return k.put(f, {n}, DType::F32);
          if (!k.cuda()) return Tensor(b.data(), {n}, DType::BF16, Device::CPU);
          return (&f == &mf ? dm : dv).emplace(to_device(f, {n}, DType::BF16)).t;
        };
        const Tensor tm = moment(mf, mb, mt), tv = moment(vf, vb, vt);
        adamw_update(k.ctx(), k.put(p, {n}, DType::F32), k.put(ma, {n}, DType::F32), k.put(grad, {n}, DType::F32),
                     tm, tv, step);
        auto back = [&](const Tensor& t, std::vector<float>& f, const std::vector<uint16_t>& b) {
          if (t.dtype == DType::F32) return k.get(f);
          if (k.cuda()) return to_host_floats(t);
          std::vector<float> out(n);
          for (int64_t i = 0; i < n; ++i) out[i] = num::bf16_bits_to_float(b[i]);
          return out;
        };
        return joined({k.get(ma), back(tm, mf, mb), back(tv, vf, vb), k.get(p)});
      };
      const std::vector<float> got = run_exact(GetParam(), run, "adamw " + what);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(num::float_bits(got[i]), num::float_bits(r_master[i])) << "master " << i;
        const float want_m = mt == DType::BF16 ? num::round_bf16(r_m[i]) : r_m[i];
        const float want_v = vt == DType::BF16 ? num::round_bf16(r_v[i]) : r_v[i];
        ASSERT_EQ(num::float_bits(got[n + i]), num::float_bits(want_m)) << "m " << i;
        ASSERT_EQ(num::float_bits(got[2 * n + i]), num::float_bits(want_v)) << "v " << i;
        ASSERT_EQ(num::float_bits(got[3 * n + i]), num::float_bits(r_param[i])) << "param " << i;
      }
      // The stored moments differ from the FP32 ones somewhere (the rounding is real, not a no-op).
      if (mt == DType::BF16) {
        int64_t differ = 0;
        for (int64_t i = 0; i < n; ++i) differ += got[n + i] != r_m[i];
        EXPECT_GT(differ, n / 2);
      }
    }
}

// A moment of another dtype than F32/BF16 is refused, naming the op and the tensor.
// BF16 main grads (--main-grads-dtype bf16): the gradient is read as its bf16 value, widened exactly, so
// a step from BF16 gradients equals the FP32-gradient step from the same (bf16-representable) values, bit
// for bit, on every backend: the GPU's BF16 grads, and the CPU reading bf16 bits (the offload's host copy
// of a GPU's gradients). sum_of_squares of the GPU's BF16 grads equals the CPU's sum of the same values.
TEST_P(Optimizer, AdamWAndTheNormReadBf16GradsAsTheirValues) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 50021;
  std::vector<float> master(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    grad[i] = num::round_bf16(1e-2f * nd(rng));  // the values BF16 main grads hold
  }
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 3, 0.7f};
  std::vector<float> r_param(n), r_master = master, r_m(n), r_v(n);
  adamw_update(cpu_ctx(true), host_view(r_param, {n}), host_view(r_master, {n}), host_view(grad, {n}),
               host_view(r_m, {n}), host_view(r_v, {n}), step);
  const double r_norm = sum_of_squares(cpu_ctx(true), host_view(grad, {n}));
  auto run = [&](Backend& k) {  // [master | m | v | param | norm]
    std::vector<float> p(n), ma = master, m(n), v(n), g = grad;
    std::vector<uint16_t> gb(n);
    for (int64_t i = 0; i < n; ++i) gb[i] = num::float_to_bf16_bits(grad[i]);
    // The GPU: its BF16 storage; the CPU: the bf16 bits a GPU's gradients arrive as on the host.
    const Tensor tg = k.cuda() ? k.put(g, {n}, DType::BF16) : Tensor(gb.data(), {n}, DType::BF16, Device::CPU);
    adamw_update(k.ctx(), k.put(p, {n}, DType::F32), k.put(ma, {n}, DType::F32), tg, k.put(m, {n}, DType::F32),
                 k.put(v, {n}, DType::F32), step);
    const float norm = k.cuda() ? static_cast<float>(sum_of_squares(k.ctx(), tg)) : static_cast<float>(r_norm);
    return joined({k.get(ma), k.get(m), k.get(v), k.get(p), std::vector<float>{norm}});
  };
  const std::vector<float> got = run_exact(GetParam(), run, "adamw with bf16 grads");
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(num::float_bits(got[i]), num::float_bits(r_master[i])) << "master " << i;
    ASSERT_EQ(num::float_bits(got[n + i]), num::float_bits(r_m[i])) << "m " << i;
    ASSERT_EQ(num::float_bits(got[2 * n + i]), num::float_bits(r_v[i])) << "v " << i;
    ASSERT_EQ(num::float_bits(got[3 * n + i]), num::float_bits(r_param[i])) << "param " << i;
  }
  EXPECT_EQ(got[4 * n], static_cast<float>(r_norm));
}

// FP8 primary weights: the step with an empty param ([0]) writes the same master and moments and no weights
// (CudaOptimizer.AdamwUpdateMulti checks the GPU's against these).
TEST(OpsOptimizer, AdamWWithoutParamUpdatesTheSameState) {
  PL_SEEDED_RNG(rng);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int64_t n = 70001;
  std::vector<float> master(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    grad[i] = 1e-2f * nd(rng);
  }
  const std::vector<int64_t> ranges = {100, 4196, 60000, 60100};
  const ElementRanges no_decay{ranges.data(), nullptr, 2};
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 2, 0.8f};
  auto run = [&](bool with_param) {  // [master | m | v]
    std::vector<float> p(n), ma = master, m(n), v(n);
    const Tensor param = with_param ? host_view(p, {n}) : Tensor(nullptr, {0}, DType::F32, Device::CPU);
    adamw_update_multi(cpu_ctx(true), param, host_view(ma, {n}), host_view(grad, {n}), host_view(m, {n}),
                       host_view(v, {n}), no_decay, step);
    return joined({ma, m, v});
  };
  const std::vector<float> with = run(true), without = run(false);
  EXPECT_TRUE(bitwise_equal(with, without));
  EXPECT_FALSE(bitwise_equal(with, joined({master, std::vector<float>(2 * n)})));  // the step did something
  // A param of another length is still refused.
  std::vector<float> a(4), short_param(3);
  expect_error_naming("adamw_update_multi", [&] {
    adamw_update_multi(cpu_ctx(true), host_view(short_param, {3}), host_view(a, {4}), host_view(a, {4}),
                       host_view(a, {4}), host_view(a, {4}), ElementRanges{}, step);
  });
}

TEST(OpsOptimizer, AdamWRefusesAnI32Moment) {
  std::vector<float> a(4);
  std::vector<int32_t> bad(4);
  const Tensor t = host_view(a, {4});
  expect_error_naming("adamw_update_multi", [&] {
    adamw_update(cpu_ctx(true), t, t, t, Tensor(bad.data(), {4}, DType::I32, Device::CPU), t,
                 AdamWStep{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f, 1, 1.0f});
  });
}

// Exact: the multi-tensor step (one launch over the flat buffers, weight decay 0 inside the no-decay
// ranges read from a device table) against the CPU's multi-tensor step, which itself equals the
// per-tensor steps bit for bit (OpsOptimizer.AdamWMultiTensorEqualsPerTensorBitForBit). Ranges at the
// start, in the middle, one element long and at the end.
TEST(CudaOptimizer, AdamwUpdateMulti) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t n = (int64_t{1} << 20) + 4097;
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> master(n), m(n), v(n), grad(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * nd(rng);
    m[i] = 1e-3f * nd(rng);
    v[i] = 1e-6f * std::abs(nd(rng));
    grad[i] = 1e-2f * nd(rng);
  }
  const std::vector<int64_t> ranges = {0, 4096, 10000, 10001, 500000, 504096, n - 4096, n};
  DeviceTensor d_ranges = device_tensor({static_cast<int64_t>(ranges.size()) * 2}, DType::I32);
  copy_from_host(d_ranges.t, ranges.data());
  const ElementRanges host_ranges{ranges.data(), nullptr, 4};
  const ElementRanges dev_ranges{ranges.data(), static_cast<const int64_t*>(d_ranges.t.data), 4};
  const AdamWStep step{3e-4f, 0.9f, 0.95f, 1e-8f, 0.033f, 7, 0.8f};
  std::vector<float> c_param(n), c_master = master, c_m = m, c_v = v;
  adamw_update_multi(cpu_ctx(true), host_view(c_param, {n}), host_view(c_master, {n}), host_view(grad, {n}),
                     host_view(c_m, {n}), host_view(c_v, {n}), host_ranges, step);
  for (DType param_dtype : {DType::BF16, DType::F32}) {
    SCOPED_TRACE(std::string("param ") + dtype_name(param_dtype));
    DeviceTensor d_param = device_tensor({n}, param_dtype);
    DeviceTensor d_master = to_device(master, {n}, DType::F32);
    DeviceTensor d_m = to_device(m, {n}, DType::F32);
    DeviceTensor d_v = to_device(v, {n}, DType::F32);
    DeviceTensor d_grad = to_device(grad, {n}, DType::F32);
    adamw_update_multi(cuda_ctx(), d_param.t, d_master.t, d_grad.t, d_m.t, d_v.t, dev_ranges, step);
    expect_bits_equal(to_host_floats(d_master.t), c_master, "adamw_multi master");
    expect_bits_equal(to_host_floats(d_m.t), c_m, "adamw_multi m");
    expect_bits_equal(to_host_floats(d_v.t), c_v, "adamw_multi v");
    expect_bits_equal(to_host_floats(d_param.t), c_param, "adamw_multi param");
  }
  {  // FP8 primary weights: no param ([0]), the same master and moments
    DeviceTensor d_master = to_device(master, {n}, DType::F32);
    DeviceTensor d_m = to_device(m, {n}, DType::F32);
    DeviceTensor d_v = to_device(v, {n}, DType::F32);
    DeviceTensor d_grad = to_device(grad, {n}, DType::F32);
    adamw_update_multi(cuda_ctx(), Tensor(nullptr, {0}, DType::BF16, Device::CUDA), d_master.t, d_grad.t, d_m.t, d_v.t,
                       dev_ranges, step);
    expect_bits_equal(to_host_floats(d_master.t), c_master, "adamw_multi without param: master");
    expect_bits_equal(to_host_floats(d_m.t), c_m, "adamw_multi without param: m");
    expect_bits_equal(to_host_floats(d_v.t), c_v, "adamw_multi without param: v");
  }
  // A missing device table is refused before any launch.
  DeviceTensor d_master = to_device(master, {n}, DType::F32);
  expect_error_containing([&] {
    adamw_update_multi(cuda_ctx(), d_master.t, d_master.t, d_master.t, d_master.t, d_master.t, host_ranges, step);
  }, {"adamw_update_multi", "device table"});
}

}  // namespace
}  // namespace pl::optest
