// The 16-byte paths of the elementwise CUDA kernels (lib/backend/cuda/op_util.cuh: 8 bf16 per access
// when every pointer and row is 16-byte aligned, the scalar kernels otherwise) against the CPU backend,
// bit for bit: each op on three placements of its GPU tensors (all aligned: the vector path; all
// offset by one element; only the first tensor offset: the scalar fallback) and on lengths with and
// without a multiple of 8 (the flat kernels' scalar tails, the row kernels' fallback). Results must not
// depend on the placement. The producers' output amax (RMSNorm and SwiGLU, op_list.h out_amax: one or two
// slots, -1 before the call) too, reduced in the same launch on the GPU. Skipped without a GPU (compiled,
// not run on a GPU here).
#include "ops/op_test_util.h"

namespace pl::optest {
namespace {

Tensor view(void* p, const std::vector<int64_t>& dims, DType dt, Device d) {
  Tensor t = make_view(p, dims, dt);
  t.device = d;
  return t;
}

// One tensor argument on both backends: host FP32 storage for the CPU op (outputs land in it), and a
// device copy (BF16 or F32) placed `offset` elements past a 256-byte-aligned allocation.
struct Both {
  std::vector<int64_t> dims;
  std::vector<float> host;
  DeviceTensor storage;
  Tensor gpu;
  Both(std::vector<float> values, std::vector<int64_t> d, DType dt, int64_t offset)
      : dims(std::move(d)), host(std::move(values)),
        storage(device_tensor({static_cast<int64_t>(host.size()) + 8}, dt)) {
    gpu = view(static_cast<char*>(storage.t.data) + offset * static_cast<int64_t>(dtype_size(dt)), dims, dt,
               Device::CUDA);
    if (dt == DType::BF16) {
      std::vector<uint16_t> bits(host.size());
      for (size_t i = 0; i < host.size(); ++i) bits[i] = num::float_to_bf16_bits(host[i]);
      copy_from_host(gpu, bits.data());
    } else {
      copy_from_host(gpu, host.data());
    }
  }
  Tensor cpu() { return view(host.data(), dims, DType::F32, Device::CPU); }
  void expect_same(const std::string& what) const { expect_bits_equal(to_host_floats(gpu), host, what); }
};

// Placements: {first tensor's offset, the others' offset}.
constexpr std::pair<int64_t, int64_t> kPlacements[] = {{0, 0}, {1, 1}, {1, 0}};

std::string label(const char* op, int64_t n, std::pair<int64_t, int64_t> p) {
  return std::string(op) + " n=" + std::to_string(n) + " offsets " + std::to_string(p.first) + "/" +
         std::to_string(p.second);
}

TEST(CudaVectorized, AddAndAccumulateTails) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  for (const int64_t n : {1001, 1024, 1027})
    for (const auto& p : kPlacements) {
      const std::string what = label("add/accumulate_bf16", n, p);
      Both out(std::vector<float>(n), {n}, DType::BF16, p.first);
      Both a(uniform_bf16(n, rng, -2, 2), {n}, DType::BF16, p.second), b(uniform_bf16(n, rng, -2, 2), {n},
                                                                          DType::BF16, p.second);
      add(cpu_ctx(true), out.cpu(), a.cpu(), b.cpu());
      add(cuda_ctx(), out.gpu, a.gpu, b.gpu);
      out.expect_same(what + " (add)");
      Both delta(uniform_f32(n, rng, -1, 1), {n}, DType::F32, p.second);
      accumulate_bf16(cpu_ctx(true), a.cpu(), delta.cpu());
      accumulate_bf16(cuda_ctx(), a.gpu, delta.gpu);
      a.expect_same(what + " (accumulate_bf16)");
    }
}

TEST(CudaVectorized, RmsNormRows) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 37;
  for (const int64_t h : {264, 261})
    for (const auto& p : kPlacements) {
      const std::string what = label("rmsnorm", h, p);
      Both resid(std::vector<float>(T * h), {T, h}, DType::BF16, p.first);
      Both a(uniform_bf16(T * h, rng, -2, 2), {T, h}, DType::BF16, p.second);
      Both b(uniform_bf16(T * h, rng, -2, 2), {T, h}, DType::BF16, p.second);
      Both w(uniform_bf16(h, rng, -1.5f, 1.5f), {h}, DType::BF16, p.second);
      Both out(std::vector<float>(T * h), {T, h}, DType::BF16, p.second);
      Both rstd(std::vector<float>(T), {T}, DType::F32, 0);
      Both amax1(std::vector<float>(1, -1.0f), {1}, DType::F32, 0), amax2(std::vector<float>(2, -1.0f), {2}, DType::F32, 0);
      add_rmsnorm_forward(cpu_ctx(true), resid.cpu(), out.cpu(), rstd.cpu(), a.cpu(), b.cpu(), w.cpu(), 1e-5f,
                          amax1.cpu());
      add_rmsnorm_forward(cuda_ctx(), resid.gpu, out.gpu, rstd.gpu, a.gpu, b.gpu, w.gpu, 1e-5f, amax1.gpu);
      resid.expect_same(what + " (add_rmsnorm_forward resid)");
      out.expect_same(what + " (add_rmsnorm_forward out)");
      amax1.expect_same(what + " (add_rmsnorm_forward norm_out_amax)");
      ASSERT_GT(amax1.host[0], 0.0f) << what;
      rmsnorm_forward(cpu_ctx(true), out.cpu(), rstd.cpu(), a.cpu(), w.cpu(), 1e-5f, amax2.cpu());
      rmsnorm_forward(cuda_ctx(), out.gpu, rstd.gpu, a.gpu, w.gpu, 1e-5f, amax2.gpu);
      out.expect_same(what + " (rmsnorm_forward out)");
      rstd.expect_same(what + " (rmsnorm_forward rstd)");
      amax2.expect_same(what + " (rmsnorm_forward out_amax)");
      ASSERT_EQ(amax2.host[0], amax2.host[1]) << what;
      Both dx(uniform_bf16(T * h, rng, -1, 1), {T, h}, DType::BF16, p.first);
      Both dw(uniform_f32(h, rng, -1, 1), {h}, DType::F32, 0);
      rmsnorm_backward(cpu_ctx(true), dx.cpu(), dw.cpu(), b.cpu(), a.cpu(), w.cpu(), rstd.cpu());
      rmsnorm_backward(cuda_ctx(), dx.gpu, dw.gpu, b.gpu, a.gpu, w.gpu, rstd.gpu);
      dx.expect_same(what + " (rmsnorm_backward dx)");
      dw.expect_same(what + " (rmsnorm_backward dw)");
      rmsnorm_backward_overwrite(cpu_ctx(true), dx.cpu(), dw.cpu(), b.cpu(), a.cpu(), w.cpu(), rstd.cpu());
      rmsnorm_backward_overwrite(cuda_ctx(), dx.gpu, dw.gpu, b.gpu, a.gpu, w.gpu, rstd.gpu);
      dx.expect_same(what + " (rmsnorm_backward_overwrite dx)");
    }
}

TEST(CudaVectorized, RopeAndSwiglu) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t S = 13, T = 2 * S, heads = 3, rotated = 2;  // the third head is not rotated
  for (const int64_t d : {32, 20}) {  // d/2 = 16: vectors of 8 pairs; 10: the scalar kernel
    for (const auto& p : kPlacements) {
      const std::string what = label("rope", d, p);
      Both qkv(uniform_bf16(T * heads * d, rng, -2, 2), {T, heads * d}, DType::BF16, p.first);
      Both cos(uniform_f32(S * d / 2, rng, -1, 1), {S, d / 2}, DType::F32, p.second);
      Both sin(uniform_f32(S * d / 2, rng, -1, 1), {S, d / 2}, DType::F32, p.second);
      rope_forward(cpu_ctx(true), qkv.cpu(), cos.cpu(), sin.cpu(), S, rotated, d, {});
      rope_forward(cuda_ctx(), qkv.gpu, cos.gpu, sin.gpu, S, rotated, d, {});
      qkv.expect_same(what + " (forward)");
      rope_backward(cpu_ctx(true), qkv.cpu(), cos.cpu(), sin.cpu(), S, rotated, d, {});
      rope_backward(cuda_ctx(), qkv.gpu, cos.gpu, sin.gpu, S, rotated, d, {});
      qkv.expect_same(what + " (backward)");
    }
  }
  for (const int64_t f : {24, 21})
    for (const auto& p : kPlacements) {
      const std::string what = label("swiglu", f, p);
      const int64_t Ts = 9;
      Both out(std::vector<float>(Ts * f), {Ts, f}, DType::BF16, p.first);
      Both fc1(uniform_bf16(Ts * 2 * f, rng, -4, 4), {Ts, 2 * f}, DType::BF16, p.second);
      Both dfc1(std::vector<float>(Ts * 2 * f), {Ts, 2 * f}, DType::BF16, p.second);
      Both dout(uniform_bf16(Ts * f, rng, -1, 1), {Ts, f}, DType::BF16, p.second);
      Both amax1(std::vector<float>(1, -1.0f), {1}, DType::F32, 0), amax2(std::vector<float>(2, -1.0f), {2}, DType::F32, 0);
      swiglu_forward(cpu_ctx(true), out.cpu(), fc1.cpu(), amax1.cpu());
      swiglu_forward(cuda_ctx(), out.gpu, fc1.gpu, amax1.gpu);
      out.expect_same(what + " (forward)");
      amax1.expect_same(what + " (forward out_amax)");
      swiglu_backward(cpu_ctx(true), dfc1.cpu(), dout.cpu(), fc1.cpu(), amax2.cpu());
      swiglu_backward(cuda_ctx(), dfc1.gpu, dout.gpu, fc1.gpu, amax2.gpu);
      dfc1.expect_same(what + " (backward)");
      amax2.expect_same(what + " (backward dfc1_amax)");
      ASSERT_GT(amax2.host[0], 0.0f) << what;
    }
}

TEST(CudaVectorized, EmbeddingAndCrossEntropy) {
  PL_REQUIRE_CUDA_DEVICE();
  PL_SEEDED_RNG(rng);
  const int64_t T = 33, V = 50;
  std::vector<int32_t> ids = uniform_ids(T, rng, 7);  // few distinct ids: runs of repeats in the scatter
  DeviceTensor ids_gpu = to_device_i32(ids, {T});
  const Tensor ids_cpu(ids.data(), {T}, DType::I32, Device::CPU);
  for (const int64_t h : {40, 36})
    for (const auto& p : kPlacements) {
      const std::string what = label("embedding", h, p);
      Both out(std::vector<float>(T * h), {T, h}, DType::BF16, p.first);
      Both table(uniform_bf16(V * h, rng, -1, 1), {V, h}, DType::BF16, p.second);
      Both dtable(uniform_f32(V * h, rng, -1, 1), {V, h}, DType::F32, p.second);
      embedding_forward(cpu_ctx(true), out.cpu(), ids_cpu, table.cpu());
      embedding_forward(cuda_ctx(), out.gpu, ids_gpu.t, table.gpu);
      out.expect_same(what + " (forward)");
      embedding_backward(cpu_ctx(true), dtable.cpu(), out.cpu(), ids_cpu);
      embedding_backward(cuda_ctx(), dtable.gpu, out.gpu, ids_gpu.t);
      dtable.expect_same(what + " (backward)");
    }
  // Cross-entropy: the gradients bit for bit; the loss within CUDA's logf (1 ulp; cross_entropy.cu).
  const int64_t rows = 5;
  std::vector<int32_t> targets = uniform_ids(rows, rng, 1000);
  DeviceTensor targets_gpu = to_device_i32(targets, {rows});
  const Tensor targets_cpu(targets.data(), {rows}, DType::I32, Device::CPU);
  for (const int64_t v : {1000, 1003})
    for (const auto& p : kPlacements) {
      const std::string what = label("cross_entropy_forward_backward", v, p);
      Both logits(uniform_bf16(rows * v, rng, -8, 8), {rows, v}, DType::BF16, p.first);
      Both losses(std::vector<float>(rows), {rows}, DType::F32, p.second);
      cross_entropy_forward_backward(cpu_ctx(true), losses.cpu(), logits.cpu(), targets_cpu, 0.25f);
      cross_entropy_forward_backward(cuda_ctx(), losses.gpu, logits.gpu, targets_gpu.t, 0.25f);
      logits.expect_same(what + " (dlogits)");
      expect_close_to_cpu(to_host_floats(losses.gpu), losses.host, 1e-6, 1e-5, 1.0, what + " (losses)");
    }
}

}  // namespace
}  // namespace pl::optest
