#include "data/blended_dataset.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/checked_math.h"
#include "core/error.h"
#include "core/host_memory.h"

namespace pl::data {

void build_blending_indices(std::span<const double> weights, int64_t size, std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index) {
  const size_t n = weights.size();
  PL_CHECK(n >= 1 && n <= static_cast<size_t>(std::numeric_limits<int16_t>::max()) + 1,
           "blend: {} datasets (must be 1..32768: dataset ids are int16)", n);
  PL_CHECK(size >= 0, "blend: size must be >= 0, got {}", size);
  check_host_memory(checked_mul(size, sizeof(int16_t) + sizeof(int64_t), "the blend's indices' size"),
                    fmt::format("building the blend's indices ({} samples)", size),
                    "lower --train-iters, --eval-iters or --global-batch-size");
  dataset_index.assign(static_cast<size_t>(size), 0);
  dataset_sample_index.assign(static_cast<size_t>(size), 0);
  std::vector<int64_t> count(n, 0);
  for (int64_t k = 0; k < size; ++k) {
    const double kd = std::max(static_cast<double>(k), 1.0);
    size_t best = 0;
    double best_error = weights[0] * kd - static_cast<double>(count[0]);
    for (size_t d = 1; d < n; ++d) {
      const double error = weights[d] * kd - static_cast<double>(count[d]);
      if (error > best_error) {
        best = d;
        best_error = error;
      }
    }
    dataset_index[static_cast<size_t>(k)] = static_cast<int16_t>(best);
    dataset_sample_index[static_cast<size_t>(k)] = count[best]++;
  }
}

std::vector<double> normalize_blend_weights(std::span<const double> weights) {
  double sum = 0.0;
  for (size_t i = 0; i < weights.size(); ++i) {
    PL_CHECK(std::isfinite(weights[i]) && weights[i] > 0.0, "--data-path: weight {} of dataset {} must be > 0",
             weights[i], i + 1);
    sum += weights[i];
  }
  PL_CHECK(std::isfinite(sum), "--data-path: the weights sum to {} (each must be finite and their sum too)", sum);
  std::vector<double> out(weights.begin(), weights.end());
  for (double& w : out) w /= sum;
  return out;
}

int64_t blended_dataset_samples(int64_t target, double normalized_weight, double surplus) {
  const double share = std::ceil(static_cast<double>(target) * normalized_weight);
  return static_cast<int64_t>(std::ceil(share * (1.0 + surplus)));
}

BlendedDataset::BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets, std::vector<double> weights,
                               int64_t size)
    : datasets_(std::move(datasets)), weights_(std::move(weights)) {
  PL_CHECK(!datasets_.empty() && datasets_.size() == weights_.size(), "blend: {} datasets but {} weights",
           datasets_.size(), weights_.size());
  for (const auto& d : datasets_)
    PL_CHECK(d != nullptr && d->sample_length() == datasets_.front()->sample_length(),
             "blend: datasets differ in sample length");
  build_blending_indices(weights_, size, dataset_index_, dataset_sample_index_);
  std::vector<int64_t> needed(datasets_.size(), 0);
  for (size_t k = 0; k < dataset_index_.size(); ++k) {
    const auto d = static_cast<size_t>(dataset_index_[k]);
    needed[d] = std::max(needed[d], dataset_sample_index_[k] + 1);
  }
  for (size_t d = 0; d < datasets_.size(); ++d)
    PL_CHECK(needed[d] <= datasets_[d]->size(), "blend: dataset {} has {} samples but the blend takes {} from it",
             d + 1, datasets_[d]->size(), needed[d]);
}

void BlendedDataset::get(int64_t idx, std::span<int32_t> out) const {
  PL_CHECK(idx >= 0 && idx < size(), "blended dataset: sample {} out of range [0, {})", idx, size());
  const auto k = static_cast<size_t>(idx);
  datasets_[static_cast<size_t>(dataset_index_[k])]->get(dataset_sample_index_[k], out);
}

}  // namespace pl::data
