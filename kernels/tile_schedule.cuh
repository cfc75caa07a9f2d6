// Which (query tile, batch, head) a CTA works on, shared by every attention forward kernel.
//
// The grid covers ceil(len_q / BM) query tiles x batch x heads; a CTA takes work items
// blockIdx.x, blockIdx.x + gridDim.x, ... (one each without a CTA cap). Longest (causal)
// query tiles come first, and all heads of one query tile are adjacent.
#pragma once

#include <cuda_runtime.h>

#include "flash_fwd.cuh"

namespace flashwatt {
namespace {

// One work item: its batch and head, first query row, number of K/V tiles to visit
// (causal: none above the diagonal) and where its Q, K and V rows start.
template <typename T>
struct TileWork {
  int b, h, m0, n_tiles;
  const T* q;
  const T* k;
  const T* v;
};

template <int BM, int BN>
struct TileGrid {
  int num_mb, bh_count, total, group;

  __device__ __forceinline__ explicit TileGrid(const FwdParams& p)
      : num_mb((p.len_q + BM - 1) / BM),
        bh_count(p.batch * p.heads),
        total(num_mb * bh_count),
        group(p.heads / p.kv_heads) {}

  template <typename T>
  __device__ __forceinline__ TileWork<T> work(const FwdParams& p, int tile) const {
    TileWork<T> w;
    const int mb = num_mb - 1 - tile / bh_count;
    const int bh = tile % bh_count;
    w.b = bh / p.heads;
    w.h = bh % p.heads;
    const int hk = w.h / group;
    w.m0 = mb * BM;
    w.q = static_cast<const T*>(p.q) + w.b * p.q_sb + w.h * p.q_sh;
    w.k = static_cast<const T*>(p.k) + w.b * p.k_sb + hk * p.k_sh;
    w.v = static_cast<const T*>(p.v) + w.b * p.v_sb + hk * p.v_sh;
    const int kv_end = p.causal ? min(p.len_k, w.m0 + BM) : p.len_k;
    w.n_tiles = (kv_end + BN - 1) / BN;
    return w;
  }
};

}  // namespace
}  // namespace flashwatt
