#pragma once
// PL_VECTOR_CLONES: GCC function multiversioning for the CPU backend's hot per-row and per-range loops.
// The build targets the x86-64 baseline (SSE2: the binary runs on any x86-64 machine, no -march=native),
// so a marked function is compiled three times, for the baseline, AVX2 and x86-64-v4 (AVX-512 F/BW/DQ/VL: the
// quantizers' byte and mask operations need BW), and the dynamic
// loader picks the widest one the CPU supports (an ifunc resolver calling __builtin_cpu_supports).
// The clones compute bit-identical results: the loops use IEEE multiplies, adds, divides, square roots
// and comparisons only (each correctly rounded at any vector width), FMA contraction is off for the
// whole build (-ffp-contract=off), and every reduction runs in an order written in the source (lanes),
// never one the vectorizer chooses. An OpenMP region's body is outlined into a function without the
// clones, so a marked function is what the region calls (one row or one range per call), not the region.
// Defining PL_VECTOR_CLONES empty before including this header builds the baseline code only (a way to check
// that the clones agree, e.g. -DPL_VECTOR_CLONES= on one file).
#if defined(PL_VECTOR_CLONES)
// given by the includer
#elif defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define PL_VECTOR_CLONES __attribute__((target_clones("default", "avx2", "arch=x86-64-v4")))
#else
#define PL_VECTOR_CLONES
#endif
