// Row-major 16-bit tiles in shared memory with each row padded by 16 bytes, as the
// mma.sync forward and backward lay them out (kernels/NOTES.md v1): the 8 row addresses
// of one ldmatrix phase, and of one phase of 16-byte cp.async or 32-bit stores, fall in
// different bank groups, and every fragment address is a per-lane base plus a constant
// (no per-step address registers, unlike an XOR swizzle).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "ptx.cuh"

namespace flashwatt {
namespace {

// Bytes of one padded row of COLS 16-bit elements.
template <int COLS>
__host__ __device__ constexpr int padded_row_bytes() {
  return COLS * 2 + 16;
}

// Byte offset of 16-byte chunk `chunk` (8 elements) of row `row`.
template <int COLS>
__device__ __forceinline__ uint32_t padded_off(int row, int chunk) {
  return static_cast<uint32_t>(row * padded_row_bytes<COLS>() + chunk * 16);
}

// Copies ROWS rows of a [rows, COLS] global tile, global rows row0 .. row0 + ROWS - 1 of
// `src` (row 0 at src), into padded shared memory at dst; rows at or past row_end are
// zero-filled without a global read. Each thread moves one 16-byte chunk of every
// (THREADS / chunks-per-row)-th row.
template <int ROWS, int COLS, int THREADS, typename T>
__device__ __forceinline__ void load_padded_tile(uint32_t dst, const T* __restrict__ src, int64_t row_stride,
                                                 int row0, int row_end, int tid) {
  constexpr int CH = COLS / 8;
  constexpr int RSTEP = THREADS / CH;
  constexpr int ITERS = ROWS / RSTEP;
  static_assert(THREADS % CH == 0 && ROWS % RSTEP == 0, "tile loads must divide evenly");
  const int r0 = tid / CH;
  const int c = tid % CH;
  const T* g = src + static_cast<int64_t>(row0 + r0) * row_stride + c * 8;
  const int64_t step = static_cast<int64_t>(RSTEP) * row_stride;
  dst += padded_off<COLS>(r0, c);
  int rows_left = row_end - row0 - r0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const bool ok = rows_left > 0;
    cp_async16(dst + it * RSTEP * padded_row_bytes<COLS>(), ok ? g : src, ok ? 16 : 0);
    g += step;
    rows_left -= RSTEP;
  }
}

}  // namespace
}  // namespace flashwatt
