#pragma once
// Megatron's BlendedDataset: several sample sources mixed by weight, sample k drawn from the dataset
// whose share lags its weight the most (SPEC-MEGATRON §5.9).
// Followed: Megatron-LM megatron/core/datasets/blended_dataset.py and helpers.cpp
// build_blending_indices; blended_megatron_dataset_builder.py _get_size_per_split_per_dataset.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "data/gpt_dataset.h"

namespace pl::data {

// Megatron's mid_level_dataset_surplus: each blended dataset is built 0.5% larger than its share.
inline constexpr double kMidLevelDatasetSurplus = 0.005;

// helpers.cpp build_blending_indices: for k in [0, size), pick the dataset d with the largest
// weights[d] * max(k, 1) - count[d] (ties: the lowest d); record d and count[d], then count[d]++.
void build_blending_indices(std::span<const double> weights, int64_t size, std::vector<int16_t>& dataset_index,
                            std::vector<int64_t>& dataset_sample_index);

// Weights divided by their sum (all must be finite and > 0; one-line error otherwise).
std::vector<double> normalize_blend_weights(std::span<const double> weights);

// Samples each dataset of a blend must provide for a split of `target` samples:
// ceil(ceil(target * weight) * (1 + surplus)).
int64_t blended_dataset_samples(int64_t target, double normalized_weight, double surplus = kMidLevelDatasetSurplus);

class BlendedDataset final : public SampleSource {
 public:
  // weights: normalized; size: the samples of the blend. Every dataset must hold at least the
  // samples the blending index takes from it (one-line error naming the dataset otherwise).
  BlendedDataset(std::vector<std::shared_ptr<const SampleSource>> datasets, std::vector<double> weights, int64_t size);

  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  int64_t sample_length() const override { return datasets_.front()->sample_length(); }
  // dataset[dataset_index[idx]][dataset_sample_index[idx]]
  void get(int64_t idx, std::span<int32_t> out) const override;

  const std::vector<int16_t>& dataset_index() const { return dataset_index_; }
  const std::vector<double>& weights() const { return weights_; }

 private:
  std::vector<std::shared_ptr<const SampleSource>> datasets_;
  std::vector<double> weights_;
  std::vector<int16_t> dataset_index_;
  std::vector<int64_t> dataset_sample_index_;
};

}  // namespace pl::data
