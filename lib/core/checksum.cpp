#include "core/checksum.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "core/error.h"

namespace pl {
namespace {

constexpr uint64_t kFnvBasis = kFnv1aBasis;
uint64_t fnv_word(uint64_t h, uint64_t w) { return fnv1a_step(h, w); }

// The files are little-endian and so are the hosts we build for: one unaligned load.
static_assert(std::endian::native == std::endian::little, "checksum64 reads little-endian words");
uint64_t load_le64(const unsigned char* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);
  return w;
}

// One chunk (<= kChunkBytes): four independent lanes so the multiplies pipeline, a zero-padded
// tail word, then the lanes and the length folded together.
uint64_t chunk_digest(const unsigned char* p, size_t n) {
  uint64_t lane[4] = {kFnvBasis, kFnvBasis ^ 1, kFnvBasis ^ 2, kFnvBasis ^ 3};
  const size_t words = n / 8;
  size_t i = 0;
  for (; i + 4 <= words; i += 4)
    for (int l = 0; l < 4; ++l) lane[l] = fnv_word(lane[l], load_le64(p + (i + static_cast<size_t>(l)) * 8));
  for (; i < words; ++i) lane[i % 4] = fnv_word(lane[i % 4], load_le64(p + i * 8));
  if (n % 8) {
    unsigned char tail[8] = {};
    std::memcpy(tail, p + words * 8, n % 8);
    lane[0] = fnv_word(lane[0], load_le64(tail));
  }
  uint64_t h = kFnvBasis;
  for (uint64_t l : lane) h = fnv_word(h, l);
  return fnv_word(h, n);
}

}  // namespace

void Checksum64::update(const void* data, size_t bytes) {
  PL_CHECK(!short_seen_, "internal: checksum update after a piece that was not whole chunks");
  if (bytes == 0) return;
  const auto* p = static_cast<const unsigned char*>(data);
  const size_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  digests_.resize(chunks);
  const auto nchunks = static_cast<int64_t>(chunks);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < nchunks; ++c) {
    const size_t off = static_cast<size_t>(c) * kChunkBytes;
    digests_[static_cast<size_t>(c)] = chunk_digest(p + off, std::min(kChunkBytes, bytes - off));
  }
  for (uint64_t d : digests_) fold_ = fnv_word(fold_, d);  // file order: independent of the threads
  total_ += bytes;
  short_seen_ = bytes % kChunkBytes != 0;
}

uint64_t Checksum64::digest() const { return fnv_word(fold_, total_); }

uint64_t checksum_chunk_digest(const void* chunk, size_t bytes) {
  PL_CHECK(bytes <= Checksum64::kChunkBytes, "internal: a checksum chunk of {} bytes", bytes);
  return chunk_digest(static_cast<const unsigned char*>(chunk), bytes);
}

uint64_t checksum_from_chunks(const std::vector<uint64_t>& digests, uint64_t total) {
  PL_CHECK(digests.size() == (total + Checksum64::kChunkBytes - 1) / Checksum64::kChunkBytes,
           "internal: {} chunk digests for {} bytes", digests.size(), total);
  uint64_t fold = kFnvBasis;
  for (uint64_t d : digests) fold = fnv_word(fold, d);
  return fnv_word(fold, total);
}

uint64_t checksum64(const void* data, size_t bytes) {
  Checksum64 c;
  c.update(data, bytes);
  return c.digest();
}

}  // namespace pl
