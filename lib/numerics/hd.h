#pragma once
// PL_HD marks functions compiled for both host and device. Numerics live once, here, and both
// backends call them (DESIGN rule 2), so per-element results are bit-identical across backends.
#if defined(__CUDACC__)
#define PL_HD __host__ __device__ __forceinline__
#else
#define PL_HD inline
#endif
