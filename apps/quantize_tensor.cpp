// quantize_tensor: quantize one tensor from a .npy file with the library's quantizers (NVFP4,
// MXFP8, FP8 per-tensor) and write its codes, scales, amax and dequantized values as .npy files,
// plus one grep-able telemetry line. A bridge to Python for checking numerics bit by bit.
//
//   quantize_tensor x.npy --format nvfp4 --out /tmp/x            # writes /tmp/x.codes.npy, ...
//   quantize_tensor dy.npy --format nvfp4 --rht --stochastic --seed 7 --out /tmp/dy
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <cmath>
#include <cstdio>
#include <optional>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "app_main.h"
#include "backend/ops.h"
#include "backend/quantize.h"
#include "core/error.h"
#include "io/atomic_file.h"
#include "io/file_checks.h"
#include "io/npy.h"
#include "core/tensor.h"
#include "numerics/bf16.h"

namespace {

using namespace pl;

constexpr const char* kDescription =
    "quantize_tensor: quantize one tensor from a .npy file with the training recipe's quantizers (NVFP4,\n"
    "MXFP8, FP8 per-tensor) and write its codes, scales, amax and dequantized values as .npy files.\n"
    "\n"
    "  quantize_tensor INPUT.npy --format nvfp4|mxfp8|fp8_e4m3|fp8_e5m2 --out PREFIX\n"
    "                  [--block 1x16|16x16] [--rht] [--stochastic --seed N] [--quiet]\n";

constexpr const char* kFooter =
    "INPUT is a C-order little-endian .npy array, 2-D [rows, cols] or 1-D [n] (treated as [1, n]), of\n"
    "dtype float32 ('<f4') or uint16 ('<u2', holding BF16 bit patterns). Inputs are rounded to BF16\n"
    "(round-to-nearest-even) first, as the recipe quantizes BF16 tensors. Blocks run along each row\n"
    "(consecutive elements of the last dim, the GEMM reduction dim):\n"
    "  nvfp4     E2M1 codes, E4M3 scale per 1x16 block (or per 16x16 tile with --block 16x16), FP32\n"
    "            global scale 2688/amax; needs cols % 16 == 0 (and rows % 16 == 0 for 16x16)\n"
    "  mxfp8     E4M3 codes, UE8M0 scale per 32 elements; needs cols % 32 == 0\n"
    "  fp8_e4m3  E4M3 codes, one FP32 scale per tensor (448/amax, current scaling)\n"
    "  fp8_e5m2  E5M2 codes, one FP32 scale per tensor (57344/amax)\n"
    "NVFP4 only:\n"
    "  --rht         16-point random Hadamard transform (sign mask 0xD7E8) applied along each row in\n"
    "                16-element chunks, as to a tensor already transposed for wgrad; the amax, scales\n"
    "                and codes are those of the transformed values (not with --block 16x16)\n"
    "  --stochastic  stochastic rounding of the E2M1 codes, Philox bits keyed by (--seed N, stream 0,\n"
    "                counter 0); with --rht the bits come from stream 1, the columnwise copy's stream\n"
    "NaN inputs are ignored by the amax; NVFP4 encodes them as +6, MXFP8/FP8 as their NaN code 0x7F.\n"
    "An Inf input makes the amax Inf (NVFP4: global scale 1). A warning on stderr counts NaN and Inf.\n"
    "\n"
    "Outputs (written only when everything succeeded; they replace earlier PREFIX.* outputs as one set,\n"
    "written and synced under temporary names first, so an error leaves the previous files as they were):\n"
    "  PREFIX.codes.npy            |u1 [rows, cols/2] for nvfp4 (element 2j in the low nibble),\n"
    "                              [rows, cols] otherwise\n"
    "  PREFIX.scales.npy           |u1 [rows, cols/16] E4M3 (nvfp4) or [rows, cols/32] UE8M0 (mxfp8),\n"
    "                              compact row-major; for fp8_e4m3/fp8_e5m2: <f4 [1] holding the\n"
    "                              per-tensor scale_inv (dequantized value = code value * scale_inv)\n"
    "  PREFIX.scales_swizzled.npy  |u1 [roundup(rows,128) * roundup(cols/block,4)]: the scales in\n"
    "                              cuBLASLt's 128x4 tile layout, zero padded (nvfp4 and mxfp8 only;\n"
    "                              not written for fp8_e4m3/fp8_e5m2: an earlier one is removed)\n"
    "  PREFIX.amax.npy             <f4 [1]: amax of what was quantized (after the RHT with --rht)\n"
    "  PREFIX.dequant.npy          <f4 [rows, cols]: the exact dequantized values (global scale included)\n"
    "\n"
    "Then one telemetry line on stdout (with --quiet the only line), e.g.\n"
    "  quantize_tensor: nvfp4 1x16 rht=off sr=off | shape 256x512 | amax 4.71875 | saturated 0.112190 |\n"
    "  underflow_blocks 0.000000 | rel_error 0.095274\n"
    "saturated: fraction of elements coded at the format's max magnitude (E2M1 6, E4M3 448, E5M2 57344);\n"
    "underflow_blocks: fraction of blocks with a nonzero amax whose scale is zero (fp8: of nonzero\n"
    "elements flushed to zero); rel_error: ||dequant - x|| / ||x|| against the BF16-rounded (with\n"
    "--rht: transformed) input.\n"
    "Exit status: 0 success; 1 error (one line on stderr); 2 bad command line (one line on stderr).";

struct Options {
  std::string input;
  std::string format;
  std::string out;
  std::string block = "1x16";
  bool rht = false;
  bool stochastic = false;
  uint64_t seed = 0;
  bool quiet = false;
};

QuantFormat parse_format(const std::string& s) {
  for (QuantFormat f : {QuantFormat::NVFP4, QuantFormat::MXFP8, QuantFormat::FP8_E4M3, QuantFormat::FP8_E5M2})
    if (s == quant_format_name(f)) return f;
  fail("--format {}: unknown format (use nvfp4, mxfp8, fp8_e4m3 or fp8_e5m2)", s);
}

// The input as BF16 values in FP32 storage, [rows, cols] row-major.
struct Input {
  int64_t rows = 0, cols = 0;
  std::vector<float> x;
  int64_t nan_count = 0, inf_count = 0;
};

Input load_input(const std::string& path) {
  const NpyArray a = read_npy(path);
  Input in;
  in.rows = a.shape.size() == 2 ? a.shape[0] : 1;
  in.cols = a.shape.back();
  PL_CHECK(a.dtype == "<f4" || a.dtype == "<u2",
           "{}: dtype '{}' cannot be quantized (need '<f4' float32 or '<u2' uint16 holding BF16 bits)", path, a.dtype);
  PL_CHECK(in.rows > 0 && in.cols > 0, "{}: empty array of shape [{}, {}]", path, in.rows, in.cols);
  const int64_t n = in.rows * in.cols;
  in.x.resize(static_cast<size_t>(n));
  if (a.dtype == "<f4") {
    std::memcpy(in.x.data(), a.bytes.data(), static_cast<size_t>(n) * 4);
    for (float& v : in.x) v = num::round_bf16(v);
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t b = static_cast<uint16_t>(a.bytes[2 * i] | (a.bytes[2 * i + 1] << 8));
      in.x[static_cast<size_t>(i)] = num::bf16_bits_to_float(b);
    }
  }
  for (float v : in.x) {
    in.nan_count += std::isnan(v);
    in.inf_count += std::isinf(v);
  }
  return in;
}

// Flag combinations and the output prefix, before the input is read.
void validate_flags(const Options& o, QuantFormat f, const CLI::App& app) {
  const char* fmt_name = quant_format_name(f);
  if (f != QuantFormat::NVFP4) {
    PL_CHECK(!o.rht, "--rht is an nvfp4 option; --format {} has no Hadamard transform", fmt_name);
    PL_CHECK(!o.stochastic, "--stochastic is an nvfp4 option; --format {} rounds to nearest", fmt_name);
    PL_CHECK(app.count("--block") == 0, "--block is an nvfp4 option; --format {} has fixed blocks", fmt_name);
  }
  PL_CHECK(o.block == "1x16" || o.block == "16x16", "--block {}: use 1x16 or 16x16", o.block);
  PL_CHECK(!(o.rht && o.block == "16x16"),
           "--rht cannot be combined with --block 16x16 (RHT is for 1x16-block wgrad operands)");
  PL_CHECK(!(app.count("--seed") > 0 && !o.stochastic), "--seed {} needs --stochastic", o.seed);
  PL_CHECK(!(o.stochastic && app.count("--seed") == 0), "--stochastic needs --seed N");
  PL_CHECK(!o.out.empty() && std::filesystem::path(o.out).has_filename(), "--out '{}': need a file name prefix",
           o.out);
  app::check_output_directory("--out", o.out);
}

// The format's block rules on the input's shape.
void validate_shape(const Options& o, QuantFormat f, const Input& in) {
  const int64_t blk = quant_block_size(f);
  if (blk > 1)
    PL_CHECK(in.cols % blk == 0, "{}: {} needs the number of columns (last dim) to be a multiple of {}, got {}",
             o.input, quant_format_name(f), blk, in.cols);
  if (o.block == "16x16")
    PL_CHECK(in.rows % 16 == 0, "{}: nvfp4 --block 16x16 needs the number of rows to be a multiple of 16, got {}",
             o.input, in.rows);
}

void warn_non_finite(const Options& o, QuantFormat f, const Input& in) {
  const bool nvfp4 = f == QuantFormat::NVFP4;
  if (in.nan_count > 0)
    fmt::print(stderr, "quantize_tensor: warning: {} has {} NaN elements: {} ignores NaN in the amax and {}\n", o.input,
               in.nan_count, quant_format_name(f),
               nvfp4 ? "encodes it as +6 (SPEC-NVFP4 §1.5)" : "encodes it as its NaN code 0x7F");
  if (in.inf_count > 0)
    fmt::print(stderr, "quantize_tensor: warning: {} has {} Inf elements after BF16 rounding: the amax is Inf, {}\n",
               o.input, in.inf_count,
               nvfp4 ? "so the global scale is 1 and the dequantized values are Inf/NaN (SPEC-NVFP4 §1.5)"
                     : "so the scale degenerates and the dequantized values are not meaningful");
}

struct OutFile {
  std::string suffix, dtype;
  std::vector<int64_t> shape;
  const void* data;
  size_t bytes;
};

// Publishes the files as one set (io/atomic_file.h FileSet, journal PREFIX.publish-journal): all
// written and synced under temporary names before any previous output is replaced, so a failure
// leaves the previous set as it was. `stale`: earlier outputs this format does not write, removed
// in the same publish so that no old file is left beside the new ones.
void write_outputs(const std::string& prefix, const std::vector<OutFile>& files, const std::vector<std::string>& stale) {
  FileSet set({prefix + ".publish-journal"},
              [](const std::string& msg) { std::fprintf(stderr, "quantize_tensor: %s\n", msg.c_str()); });
  for (const OutFile& f : files) {
    const std::vector<uint8_t> bytes = encode_npy(f.dtype, f.shape, f.data, f.bytes);
    set.add(prefix + f.suffix).write(bytes.data(), bytes.size());
  }
  for (const std::string& suffix : stale) {
    std::error_code ec;
    if (std::filesystem::exists(std::filesystem::symlink_status(prefix + suffix, ec)))
      set.remove_on_publish(prefix + suffix);
  }
  set.publish();
}

// The command line into `o`, checked before the input is read (flag combinations; no output may
// replace the input); an exit status when the program stops here (--help, a bad command line).
std::optional<int> parse_and_check_command_line(int argc, char** argv, Options& o) {
  CLI::App app{kDescription, "quantize_tensor"};
  app.footer(kFooter);
  app.add_option("INPUT", o.input, "Input .npy: 1-D or 2-D '<f4' float32 or '<u2' BF16 bits")->required();
  app.add_option("--format", o.format, "nvfp4 | mxfp8 | fp8_e4m3 | fp8_e5m2")
      ->required()
      ->check(CLI::IsMember({"nvfp4", "mxfp8", "fp8_e4m3", "fp8_e5m2"}));
  app.add_option("--out", o.out, "Output prefix: writes PREFIX.codes.npy, PREFIX.scales.npy, ...")->required();
  app.add_option("--block", o.block, "nvfp4 block shape: 1x16 (activations, gradients) or 16x16 (weights)")
      ->check(CLI::IsMember({"1x16", "16x16"}))
      ->capture_default_str();
  app.add_flag("--rht", o.rht, "nvfp4: 16-point RHT along each row in 16-element chunks (a wgrad operand)");
  app.add_flag("--stochastic", o.stochastic, "nvfp4: stochastic rounding (needs --seed)");
  app.add_option("--seed", o.seed, "Seed of the stochastic-rounding stream");
  app.add_flag("-q,--quiet", o.quiet, "Print only the telemetry line");
  if (const std::optional<int> rc = app::parse_command_line(app, argc, argv, "quantize_tensor")) return rc;
  // No output may replace the input (io/file_checks.h): every file --out can write, whatever the format.
  std::vector<FlagPath> outputs;
  for (const char* suffix : {".codes.npy", ".scales.npy", ".scales_swizzled.npy", ".amax.npy", ".dequant.npy"})
    outputs.push_back({"--out", o.out + suffix});
  check_outputs_apart_from_inputs({{"INPUT", o.input}}, outputs);
  validate_flags(o, parse_format(o.format), app);
  return std::nullopt;
}

// The input quantized, dequantized and measured; filled in place (the tensors point into `owner`,
// `copy` into q).
struct Quantized {
  std::vector<Buffer> owner;
  QuantizedTensor q;
  const QuantizedCopy* copy = nullptr;  // q.rowwise, or q.columnwise with --rht
  Tensor dequant;
  QuantStats stats;
};

// Quantizes [rows, cols] with blocks along each row as the recipe does, then dequantizes it and
// measures it against the BF16-rounded input (with --rht: the transformed input).
void quantize_input(const Options& o, QuantFormat f, const Input& in, Quantized& out) {
  const int64_t rows = in.rows, cols = in.cols;
  const OpContext ctx{Device::CPU, true};
  const Buffer xbuf(static_cast<size_t>(rows * cols) * sizeof(float), Device::CPU);
  const Tensor x = xbuf.as({rows, cols}, DType::F32);
  std::memcpy(x.f32(), in.x.data(), x.bytes());
  const Buffer refbuf(o.rht ? x.bytes() : 0, Device::CPU), tbuf(o.rht ? x.bytes() : 0, Device::CPU);
  Tensor reference = x;
  // Stochastic rounding from stream 0, counter 0 (the defaults), as --help says.
  const QuantizeOptions opt{.format = f, .rowwise = !o.rht, .columnwise = o.rht, .block_2d = o.block == "16x16",
                            .rht_columnwise = o.rht, .stochastic = o.stochastic, .seed = o.seed};
  if (o.rht) {
    // X is the already-transposed wgrad operand: quantize T = Xᵀ [cols, rows] asking for its
    // columnwise copy with RHT, which is X [rows, cols] blocked along its rows, RHT'd per 16-chunk.
    const Tensor t = tbuf.as({cols, rows}, DType::F32);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) t.f32()[c * rows + r] = x.f32()[r * cols + c];
    out.q = allocate_quantized(out.owner, Device::CPU, f, cols, rows, false, true);
    quantize(ctx, out.q, t, opt);
    out.copy = &out.q.columnwise;
    reference = refbuf.as({rows, cols}, DType::F32);
    columnwise_source(ctx, reference, t, true);
  } else {
    out.q = allocate_quantized(out.owner, Device::CPU, f, rows, cols, true, false);
    quantize(ctx, out.q, x, opt);
    out.copy = &out.q.rowwise;
  }
  PL_CHECK(out.copy->rows == rows && out.copy->cols == cols, "internal: quantized copy [{}, {}] is not [{}, {}]",
           out.copy->rows, out.copy->cols, rows, cols);
  out.dequant = out.owner.emplace_back(x.bytes(), Device::CPU).as({rows, cols}, DType::F32);
  dequantize(ctx, out.dequant, *out.copy, f);
  out.stats = quant_stats(ctx, *out.copy, f, reference);
}

// The .npy files of a quantized [rows, cols] input, in the order they are written and listed.
std::vector<OutFile> output_files(const Quantized& qt, QuantFormat f, int64_t rows, int64_t cols) {
  const QuantizedCopy& c = *qt.copy;
  const int64_t blk = quant_block_size(f);
  std::vector<OutFile> files;
  files.push_back({".codes.npy", "|u1", {rows, c.data.dim(1)}, c.data.data, c.data.bytes()});
  if (blk > 1) {
    files.push_back({".scales.npy", "|u1", {rows, cols / blk}, c.scales.data, c.scales.bytes()});
    files.push_back(
        {".scales_swizzled.npy", "|u1", {c.scales_swizzled.numel()}, c.scales_swizzled.data, c.scales_swizzled.bytes()});
  } else {
    files.push_back({".scales.npy", "<f4", {1}, c.scale_inv.data, sizeof(float)});
  }
  files.push_back({".amax.npy", "<f4", {1}, c.amax.data, sizeof(float)});
  files.push_back({".dequant.npy", "<f4", {rows, cols}, qt.dequant.data, qt.dequant.bytes()});
  return files;
}

// What was written (unless --quiet), then the telemetry line.
void print_summary(const Options& o, QuantFormat f, const Input& in, const std::vector<OutFile>& files,
                   const QuantStats& st) {
  const int64_t blk = quant_block_size(f);
  if (!o.quiet) {
    std::string names;
    for (const OutFile& of : files) names += (names.empty() ? "" : ", ") + o.out + of.suffix;
    std::printf("quantize_tensor: wrote %s%s\n", names.c_str(),
                blk > 1 ? "" : " (no scales_swizzled.npy: per-tensor fp8 has one scale; scales.npy holds its scale_inv)");
  }
  const std::string layout =
      f == QuantFormat::NVFP4 ? o.block : (blk > 1 ? fmt::format("1x{}", blk) : std::string("per-tensor"));
  fmt::print("quantize_tensor: {} {} rht={} sr={} | shape {}x{} | amax {} | saturated {:.6f} | underflow_blocks {:.6f} "
             "| rel_error {:.6f}\n",
             quant_format_name(f), layout, o.rht ? "on" : "off", o.stochastic ? "on" : "off", in.rows, in.cols,
             static_cast<float>(st.amax), st.saturated_fraction, st.underflow_fraction, st.relative_error);
}

int run(int argc, char** argv) {
  Options o;
  if (const std::optional<int> rc = parse_and_check_command_line(argc, argv, o)) return *rc;
  const QuantFormat f = parse_format(o.format);
  const Input in = load_input(o.input);
  validate_shape(o, f, in);
  warn_non_finite(o, f, in);
  Quantized qt;
  quantize_input(o, f, in, qt);
  const std::vector<OutFile> files = output_files(qt, f, in.rows, in.cols);
  // Per-tensor fp8 writes no swizzled scales: an earlier run's are removed in the same publish.
  write_outputs(o.out, files,
                quant_block_size(f) > 1 ? std::vector<std::string>{} : std::vector<std::string>{".scales_swizzled.npy"});
  print_summary(o, f, in, files, qt.stats);
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return pl::app::guarded_main("quantize_tensor", run, argc, argv); }
