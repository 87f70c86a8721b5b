// cost::stream_triad (backend/op_costs.h), on its own until the lead moves it into op_costs.cpp's table
// (then delete this file): the probe's triad a = b + s·c is one multiply and one add per element, 2·n
// FLOPs; bytes 3·n·4 (b and c read, a written, as STREAM counts them: the write-allocate read of `a` is not
// counted); the working set is the three arrays (a aliasing b or c: two).
#include "backend/op_costs.h"

namespace pl::cost {

OpCosts stream_triad(const OpContext&, const Tensor& a, const Tensor& b, const Tensor& c, float) {
  const double n = static_cast<double>(a.numel()), array = n * static_cast<double>(dtype_size(a.dtype));
  const bool aliased = a.data != nullptr && (a.data == b.data || a.data == c.data);
  OpCosts costs;
  costs.phase[0] = OpCost{nullptr, OpKind::Elementwise, "fp32", 2.0 * n, 3.0 * array, (aliased ? 2.0 : 3.0) * array};
  return costs;
}

}  // namespace pl::cost
