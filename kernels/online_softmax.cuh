// The online softmax step shared by the tensor-core attention kernels, and the quad
// reductions and row epilogue that the fp32 kernel shares with them.
//
// A query row's scores are spread over the 4 threads of a quad (lanes 4g .. 4g+3), each
// holding NT pairs of adjacent columns. Work is in base 2: log2(e) is folded into the
// scale, so P = 2^(s * scale_log2 - m) with m the running maximum in those units.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "ptx.cuh"

namespace flashwatt {
namespace {

// The maximum and the sum over the quad that shares a row.
__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  x += __shfl_xor_sync(0xffffffffu, x, 2);
  return x;
}

// One row of one K/V tile: `at(nt, e)` is this thread's score e (0, 1) of pair nt. Updates
// the running max and the thread's partial sum, replaces the scores by unnormalised P,
// and returns alpha, the factor that rescales what O held before this tile. A row with
// nothing visible yet (all -inf) keeps P = 0 instead of NaN.
template <int NT, typename At>
__device__ __forceinline__ float online_softmax_row(At&& at, float& row_max, float& row_sum, float scale_log2) {
  float cur = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) cur = fmaxf(cur, fmaxf(at(nt, 0), at(nt, 1)));
  cur = quad_max(cur);
  const float m_old = row_max;
  const float m_new = fmaxf(m_old, cur * scale_log2);
  const float m_sub = (m_new == -INFINITY) ? 0.f : m_new;
  const float alpha = exp2_ftz(m_old - m_sub);
  row_max = m_new;
  float sum = 0.f;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float p0 = exp2_ftz(fmaf(at(nt, 0), scale_log2, -m_sub));
    const float p1 = exp2_ftz(fmaf(at(nt, 1), scale_log2, -m_sub));
    at(nt, 0) = p0;
    at(nt, 1) = p1;
    sum += p0 + p1;
  }
  row_sum = row_sum * alpha + sum;  // this thread's part; quad_sum() at the end
  return alpha;
}

// Natural-log LSE of a row from its running max (base-2 units) and its sum.
__device__ __forceinline__ float row_lse(float row_max, float row_sum) {
  return row_sum > 0.f ? (row_max + log2f(row_sum)) * kLn2 : -INFINITY;
}

}  // namespace
}  // namespace flashwatt
