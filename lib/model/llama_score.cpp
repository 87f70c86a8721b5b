// LlamaModel's evaluation half (issue 43): the per-position losses and lm-eval's is_greedy of one micro-batch, for
// lib/eval's multiple-choice scoring. The forward is training's (run_forward); only what is read back differs.
#include <algorithm>

#include "core/error.h"
#include "model/llama.h"
#include "numerics/bf16.h"

namespace pl {

void LlamaModel::score(const int32_t* tokens, const int32_t* labels, std::vector<float>& losses,
                       std::vector<uint8_t>* greedy) {
  const int64_t T = B_ * S_;
  if (greedy != nullptr) greedy->assign(static_cast<size_t>(T), 0);
  greedy_out_ = greedy;
  greedy_labels_ = labels;
  try {
    queue_forward(0, tokens, labels);
  } catch (...) {
    greedy_out_ = nullptr;
    throw;
  }
  greedy_out_ = nullptr;
  losses.resize(static_cast<size_t>(T));
  copy_to_host(losses.data(), acts_.losses_all.rows(0, 1).view({T}));
}

// Each run of consecutive counted positions is one copy of its logits rows to the host (the storage dtype: BF16
// bits on a GPU, FP32 holding BF16 values on the CPU); a position is greedy when no logit before its label's is
// >= it and none after is larger (torch.argmax: the first largest). NaN logits make no position greedy.
void LlamaModel::mark_greedy_labels() {
  const int64_t T = B_ * S_, V = cfg_.vocab_size;
  const bool bf16 = acts_.logits.dtype == DType::BF16;
  std::vector<float> row_values;
  std::vector<uint16_t> row_bits;
  for (int64_t i = 0; i < T;) {
    if (greedy_labels_[i] < 0) {
      ++i;
      continue;
    }
    int64_t end = i;
    while (end < T && greedy_labels_[end] >= 0) ++end;
    const Tensor rows = acts_.logits.rows(i, end - i);
    row_values.resize(static_cast<size_t>(rows.numel()));
    if (bf16) {
      row_bits.resize(row_values.size());
      copy_to_host(row_bits.data(), rows);
      std::transform(row_bits.begin(), row_bits.end(), row_values.begin(), num::bf16_bits_to_float);
    } else {
      copy_to_host(row_values.data(), rows);
    }
    for (int64_t p = i; p < end; ++p) {
      const float* z = row_values.data() + (p - i) * V;
      const int64_t label = greedy_labels_[p];
      PL_CHECK(label < V, "internal: label {} beyond the vocabulary {}", label, V);
      const float target = z[label];
      bool first_largest = target == target;  // not NaN
      for (int64_t v = 0; v < V && first_largest; ++v) first_largest = v < label ? z[v] < target : !(z[v] > target);
      (*greedy_out_)[static_cast<size_t>(p)] = first_largest ? 1 : 0;
    }
    i = end;
  }
}

}  // namespace pl
