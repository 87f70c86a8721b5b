#pragma once
// A fast, deterministic 64-bit checksum for checkpoint files (not cryptographic: it detects torn
// writes, truncation and flipped bytes). An 8B model's master weights are 32 GB, so the sum must run
// at memory speed: the bytes are cut into fixed 1 MiB chunks hashed in parallel (OpenMP), each
// chunk as four interleaved FNV-1a-64 lanes over little-endian 8-byte words, and the chunk digests
// are folded in file order. The result depends only on the bytes, never on the thread count or on
// how the caller splits its updates (any split into whole chunks, the last piece possibly short).
#include <cstddef>
#include <cstdint>
#include <vector>

namespace pl {

// FNV-1a 64 (Fowler, Noll, Vo): the offset basis and the prime, and one step (xor, then multiply) of a value
// into the hash. Written once here: the checkpoint checksum's lanes (over 8-byte words), the tokenizer
// record's and the SFT mask's byte-wise hashes, the tests' index fingerprints.
inline constexpr uint64_t kFnv1aBasis = 0xCBF29CE484222325ull;
inline constexpr uint64_t kFnv1aPrime = 0x100000001B3ull;
inline constexpr uint64_t fnv1a_step(uint64_t h, uint64_t v) { return (h ^ v) * kFnv1aPrime; }
// The byte-wise FNV-1a 64 of n bytes, continuing from h (kFnv1aBasis to start).
inline uint64_t fnv1a64(const void* data, size_t n, uint64_t h = kFnv1aBasis) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = fnv1a_step(h, p[i]);
  return h;
}

class Checksum64 {
 public:
  static constexpr size_t kChunkBytes = size_t{1} << 20;

  // Adds the next `bytes` bytes. Every update but the last must be a whole number of chunks.
  void update(const void* data, size_t bytes);
  uint64_t digest() const;  // of everything added so far (does not finish the stream)

 private:
  uint64_t fold_ = kFnv1aBasis;
  uint64_t total_ = 0;
  bool short_seen_ = false;  // a piece that was not whole chunks has been added (it must be the last)
  std::vector<uint64_t> digests_;
};

// The checksum of one contiguous byte range.
uint64_t checksum64(const void* data, size_t bytes);

// The same checksum put together from pieces written by different processes (a checkpoint file written
// by every data-parallel rank): the digest of chunk c, bytes [c * kChunkBytes, min((c + 1) * kChunkBytes,
// total)), taken by whoever holds those bytes, and the file's checksum from all its chunk digests in
// order. checksum_from_chunks(digests of every chunk, total) == checksum64(data, total).
uint64_t checksum_chunk_digest(const void* chunk, size_t bytes);
uint64_t checksum_from_chunks(const std::vector<uint64_t>& digests, uint64_t total);

}  // namespace pl
