// The causal mask of the attention kernels (forward and backward), in both alignments.
//
// Key j is visible to query i iff j <= i + p.causal_offset (FwdParams, BwdParams):
//   top-left     (offset 0)              query i sees keys 0 .. i, as torch's is_causal;
//   bottom-right (offset len_k - len_q)  the last query sees every key, as FlashAttention
//                                        >= 2.1 and torch.nn.attention.bias.causal_lower_right
//                                        (chunked prefill, decoding with a cache).
// The two agree when len_q == len_k. Bottom-right with len_q > len_k leaves the first
// len_q - len_k queries with no key: their row of O is 0 and their LSE is -inf, the log
// of an empty sum (what torch.logsumexp gives, and the value that drops out when partial
// results are merged by their LSE). The backward computes P = exp(scale s - LSE) from it;
// with every s of such a row masked to -inf that is exp(-inf + inf) = NaN, so it reads a
// -inf LSE as +inf (lse_log2_for_p): P = 0, and dS = P (dP - delta) = 0, for those rows.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "ptx.cuh"

namespace flashwatt {
namespace {

// The keys [0, end) that rows below row_end may see: all of them without a mask; under it
// those up to the diagonal of row row_end - 1, none where that row sees no key (end 0).
template <typename Params>
__device__ __forceinline__ int causal_kv_end(const Params& p, int row_end) {
  return p.causal ? max(0, min(p.len_k, row_end + p.causal_offset)) : p.len_k;
}

// The first query that sees `key` under the mask (0 where every query does).
template <typename Params>
__device__ __forceinline__ int causal_first_query(const Params& p, int key) {
  return max(0, key - p.causal_offset);
}

// The LSE of a row in base-2 units as the backward subtracts it from scale * s: a row that
// sees no key (LSE -inf) as +inf, so that its P is 0 rather than NaN (header comment).
__device__ __forceinline__ float lse_log2_for_p(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

}  // namespace
}  // namespace flashwatt
