#pragma once
// NumPy .npy files (format versions 1.0 and 2.0, little-endian, C order), for tools that exchange
// tensors with Python: reading 1-D or 2-D arrays of dtype '<f4' (float32), '<u2' (uint16; BF16 bit
// patterns by convention), '<i4'/'<i8' (int32/int64: dataset index caches) and '|u1' (uint8), and
// writing the same dtypes as version 1.0 files.
// Every error is a one-line pl::Error naming the file and what is wrong with it.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace pl {

struct NpyArray {
  std::string dtype;           // "<f4", "<u2" or "|u1" ('<u1' and '=u1' files are reported as "|u1")
  std::vector<int64_t> shape;  // 1 or 2 dims
  std::vector<uint8_t> bytes;  // the raw little-endian data, C order, numel * itemsize bytes

  int64_t numel() const;
  size_t itemsize() const { return npy_itemsize(dtype); }
  static size_t npy_itemsize(const std::string& dtype);  // 4, 2 or 1; 0 for any other dtype
};

// Reads a whole .npy file. Fails (one line naming `path`) on a missing or unreadable file, bad magic,
// an unsupported version, a malformed header, fortran_order True, an unsupported or big-endian dtype,
// 0-D or more than 2-D shapes, and data shorter (truncated) or longer than the shape needs.
NpyArray read_npy(const std::string& path);

// The complete bytes of a version 1.0 .npy file: magic, version, header length, the header dict
// padded with spaces so that the data starts at a multiple of 64 bytes, a trailing newline, then
// `data`. dtype must be "<f4", "<u2" or "|u1"; `bytes` must equal numel(shape) * itemsize.
std::vector<uint8_t> encode_npy(const std::string& dtype, const std::vector<int64_t>& shape, const void* data,
                                size_t bytes);

// Writes encode_npy(...) to `path` atomically (io/atomic_file.h, temporary "<path>.tmp").
void write_npy(const std::string& path, const std::string& dtype, const std::vector<int64_t>& shape,
               const void* data, size_t bytes);

}  // namespace pl
