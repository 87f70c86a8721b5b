// dequantize on every backend, over every quantize case (quant_test_util.h): on the CPU, each copy's
// values against an independent block-by-block decoding of its codes and scales; on the GPU, the GPU's
// dequantize of the GPU's copy bit-identical (or both NaN) to the CPU's of the CPU's copy.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "backend/quantize.h"
#include "numerics/swizzle.h"
#include "op_test_util.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace pl {
namespace {

using namespace qtest;

// out[rows, cols] = dequantize(copy) on the copy's backend, as host floats.
std::vector<float> dequantized(const QuantizedCopy& c, QuantFormat f, Device d) {
  if (d == Device::CUDA) {
    test::DeviceTensor out = test::device_tensor({c.rows, c.cols}, DType::F32);
    dequantize(test::cuda_ctx(), out.t, c, f);
    return test::to_host_floats(out.t);
  }
  Mat out(c.rows, c.cols);
  dequantize(cpu_ctx(true), out.t(), c, f);
  return out.v;
}

class Dequantize : public optest::OnBackend {};

TEST_P(Dequantize, EveryQuantizeCaseGivesTheExactBlockValues) {
  for (QuantCase& qc : quant_cases()) {
    SCOPED_TRACE(qc.name());
    Quantized cpu;
    quantize_case(cpu, qc, Device::CPU);
    if (!on_cuda()) {
      for (auto [c, col] : made_copies(cpu, qc.o))
        expect_same_floats(reference_dequantize(*c), dequantized(*c, qc.o.format, Device::CPU),
                           std::string(col ? "columnwise" : "rowwise") + " dequantize vs the block reference");
      continue;
    }
    Quantized gpu;
    quantize_case(gpu, qc, Device::CUDA);
    const auto cc = made_copies(cpu, qc.o), gc = made_copies(gpu, qc.o);
    for (size_t i = 0; i < cc.size(); ++i)
      expect_same_floats(dequantized(*cc[i].first, qc.o.format, Device::CPU),
                         dequantized(*gc[i].first, qc.o.format, Device::CUDA),
                         std::string(cc[i].second ? "columnwise" : "rowwise") + " dequantize (gpu vs cpu)");
  }
}

// The decoder itself: NVFP4's TE order (scale · amax first), MXFP8's power-of-two scales, FP8's
// scale_inv, on hand-made copies whose values are known.
TEST_P(Dequantize, HandMadeCopiesGiveTheirKnownValues) {
  std::vector<Buffer> owner;
  optest::Backend b(GetParam());
  // NVFP4 [1, 32]: block 0 scale 1.0 (E4M3 0x38), block 1 scale 0.5 (0x30); amax 2688 makes the
  // global factor 1; codes k & 0xF.
  QuantizedTensor n = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 1, 32, true, false);
  for (int k = 0; k < 16; ++k) n.rowwise.data.u8()[k] = static_cast<uint8_t>(((2 * k + 1) & 0xF) << 4 | ((2 * k) & 0xF));
  n.rowwise.scales.u8()[0] = 0x38;
  n.rowwise.scales.u8()[1] = 0x30;
  n.rowwise.amax.f32()[0] = 2688.0f;
  std::vector<float> want(32);
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int k = 0; k < 32; ++k) want[k] = e2m1[k & 0xF] * (k < 16 ? 1.0f : 0.5f);
  // The swizzled scales (what the GPU reads): every scale at its §6.2 offset, zeros elsewhere.
  std::fill_n(n.rowwise.scales_swizzled.u8(), n.rowwise.scales_swizzled.numel(), uint8_t{0});
  for (int64_t k = 0; k < 2; ++k)
    n.rowwise.scales_swizzled.u8()[num::swizzled_scale_offset(0, k, num::padded_scale_cols(2))] = n.rowwise.scales.u8()[k];
  QuantizedCopy c = n.rowwise;  // the CPU decodes the host copy, the GPU a device copy of its bytes
  if (b.cuda()) {
    QuantizedTensor g = allocate_quantized(owner, Device::CUDA, QuantFormat::NVFP4, 1, 32, true, false);
    for (auto [h, d] : {std::pair<const Tensor*, const Tensor*>{&n.rowwise.data, &g.rowwise.data},
                        {&n.rowwise.scales, &g.rowwise.scales},
                        {&n.rowwise.scales_swizzled, &g.rowwise.scales_swizzled},
                        {&n.rowwise.amax, &g.rowwise.amax}})
      copy_from_host(*d, h->data);
    c = g.rowwise;
  }
  expect_same_floats(want, dequantized(c, QuantFormat::NVFP4, GetParam()), "nvfp4 hand-made");
}

PL_INSTANTIATE_BACKENDS(Dequantize);

TEST(OpsDequantize, ShapeAndFormatMismatchesAreOneLineErrors) {
  std::vector<Buffer> owner;
  QuantizedTensor q = allocate_quantized(owner, Device::CPU, QuantFormat::NVFP4, 32, 64, true, false);
  Mat out(32, 32);
  test::expect_one_line_error([&] { dequantize(cpu_ctx(true), out.t(), q.rowwise, QuantFormat::NVFP4); },
                              {"dequantize", "[32, 32]"});
  Mat ok(32, 64);
  test::expect_one_line_error([&] { dequantize(cpu_ctx(true), ok.t(), q.rowwise, QuantFormat::MXFP8); },
                              {"dequantize", "nvfp4", "mxfp8"});
}

}  // namespace
}  // namespace pl
