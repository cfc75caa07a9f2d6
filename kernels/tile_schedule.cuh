// Which (query tile, batch, head) a CTA works on, shared by every attention forward kernel,
// and the L2 section order that the backward kernels share with it.
//
// The grid covers ceil(len_q / BM) query tiles x batch x heads; a CTA takes work items
// blockIdx.x, blockIdx.x + gridDim.x, ... (one each without a CTA cap).
//
// Work items are ordered in L2 sections (FlashAttention-3's tile scheduler does the same):
// the (batch, head) pairs are cut into sections of `section` pairs, a section's items come
// before the next section's, and within a section the longest (causal) block of every pair
// comes first, then the next longest, the pairs of a block adjacent. The CTAs resident at
// one time therefore work on few heads, whose K/V (forward) or Q, dO and dQ accumulator
// (backward) stay in L2 while every block of those heads reads them; with all pairs in one
// section (section 0), the CTAs of a wave each read a different head and, at short L with
// many heads, the wave's working set overflows L2 and each block re-reads from HBM.
#pragma once

#include <cuda_runtime.h>

#include "causal_mask.cuh"
#include "flash_fwd.cuh"

namespace flashwatt {
namespace {

// Work item `item` of `blocks` blocks x `pairs` (batch, head) pairs in sections of
// `section` pairs (<= 0 or >= pairs: one section): its block rank (0 = the first, i.e. the
// longest) and its pair.
struct SectionItem {
  int rank, pair;
};

__device__ __forceinline__ SectionItem section_item(int item, int blocks, int pairs, int section) {
  if (section <= 0 || section > pairs) section = pairs;
  const int per_section = section * blocks;
  const int s = item / per_section;
  const int in_section = item - s * per_section;
  const int first = s * section;
  const int width = min(section, pairs - first);  // the last section may be narrower
  const int rank = in_section / width;
  return SectionItem{rank, first + (in_section - rank * width)};
}

// One work item: its batch and head, first query row, number of K/V tiles to visit
// (causal: none past the diagonal of its last row) and where its Q, K and V rows start.
// n_tiles is at least 1: a block whose rows see no key (bottom-right alignment with
// len_q > len_k, causal_mask.cuh) visits tile 0 with every score masked, which writes O = 0
// and LSE = -inf, so that no kernel needs a path (or, warp-specialised, a producer/consumer
// protocol) for an item without tiles.
template <typename T>
struct TileWork {
  int b, h, m0, n_tiles;
  const T* q;
  const T* k;
  const T* v;
};

// With END_ALIGNED (the three-consumer kernel) and a causal mask, the blocks end at len_q
// rather than start at 0: the first block starts at m0 = len_q - num_mb * BM <= 0 and
// holds the partial one, which under the mask is then the shortest (its rows see fewest
// keys) instead of the longest with only a few rows. The shift is worked out per item
// from the parameters, which keeps it out of the kernels' live registers.
template <int BM, int BN, bool END_ALIGNED = false>
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
    const SectionItem it = section_item(tile, num_mb, bh_count, p.section);
    const int mb = num_mb - 1 - it.rank;
    const int bh = it.pair;
    w.b = bh / p.heads;
    w.h = bh % p.heads;
    const int hk = w.h / group;
    w.m0 = END_ALIGNED && p.causal ? p.len_q - (num_mb - mb) * BM : mb * BM;
    w.q = static_cast<const T*>(p.q) + w.b * p.q_sb + w.h * p.q_sh;
    w.k = static_cast<const T*>(p.k) + w.b * p.k_sb + hk * p.k_sh;
    w.v = static_cast<const T*>(p.v) + w.b * p.v_sb + hk * p.v_sh;
    // Keys below kv_end; <= 0 where no row of the block sees a key: one tile, all masked.
    // Two spellings of the same count: with any one of them ptxas 13.0 either spilled in a
    // warp-specialised producer (24 registers) or serialised the three-consumer kernel's
    // wgmma (kernels/NOTES.md, "Bottom-right causal alignment").
    const int kv_end = p.causal ? min(p.len_k, w.m0 + BM + p.causal_offset) : p.len_k;
    w.n_tiles = END_ALIGNED ? (kv_end > 0 ? (kv_end - 1) / BN + 1 : 1) : max(1, (kv_end + BN - 1) / BN);
    return w;
  }
};

// A backward CTA's work item: key block n0 of BN keys (the lowest first: under a causal mask
// the longest), batch b, k/v head hk, in L2 sections; and the (query head of the group,
// query block of BM rows) pairs it walks: from the first query block with a row that sees
// key n0 under the mask (causal_mask.cuh), `iters` in all. Shared by every backward kernel.
struct KeyBlockWork {
  int b, hk, group, n0, num_mb, mb_first, iters;
};

template <int BN, int BM, typename Params>
__device__ __forceinline__ KeyBlockWork key_block_work(const Params& p) {
  const SectionItem item = section_item(blockIdx.x, (p.len_k + BN - 1) / BN, p.batch * p.kv_heads, p.section);
  KeyBlockWork w;
  w.b = item.pair / p.kv_heads;
  w.hk = item.pair % p.kv_heads;
  w.group = p.heads / p.kv_heads;
  w.n0 = item.rank * BN;
  w.num_mb = (p.len_q + BM - 1) / BM;
  w.mb_first = p.causal ? min(causal_first_query(p, w.n0) / BM, w.num_mb) : 0;
  w.iters = w.group * (w.num_mb - w.mb_first);
  return w;
}

}  // namespace
}  // namespace flashwatt
