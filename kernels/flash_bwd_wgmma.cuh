// flashwatt attention backward on Hopper (sm_90a): the five GEMMs of a step on wgmma.
//
// The algorithm of the mma.sync backward (flash_bwd.cu, kernels/NOTES.md "Backward"): one
// CTA per (block of BN = 64*NWG keys, batch, k/v head), one warpgroup per 64 keys. K and V
// stay in shared memory; Q, dO, LSE and delta of each 64-row query block stream through a
// 2-stage cp.async ring, in the wgmma 128-byte swizzle (flash_bwd_wgmma_step.cuh).
// The step (S^T, dP^T, P^T, dV, dS^T, dK, dQ and its bulk reduction) and the dK/dV store are
// flash_bwd_wgmma_step.cuh's, shared with the warp-specialised kernel (flash_bwd_wgmma_ws.cuh),
// which runs them unchanged. This kernel adds its copies (every thread issues cp.async for the
// next query block), the CTA barrier at the top of each step that makes a stage visible and
// frees the other stage and dS^T, and the barrier that publishes dS^T before dQ (the CTA's at
// head dim 128, where dQ reads every warpgroup's dS^T; the warpgroup's own at head dim 64,
// where it reads only its own).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "async_pipeline.cuh"
#include "causal_mask.cuh"
#include "flash_bwd.cuh"
#include "flash_bwd_wgmma_step.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"

namespace flashwatt {
namespace {

// Rows [row0, row0 + ROWS) of a [rows, D] global tile into a swizzled tile; rows at or past
// row_end are zero-filled without a global read. Each thread moves the same 16-byte column
// chunk of rows r0, r0 + RSTEP, ... (RSTEP a multiple of 8: one swizzle for all of them).
template <int ROWS, int D, int THREADS, typename T>
__device__ __forceinline__ void bwd_load_sw128(uint32_t dst, const T* __restrict__ src, int64_t row_stride, int row0,
                                               int row_end, int tid) {
  constexpr int CH = D / 8;
  constexpr int RSTEP = THREADS / CH;
  constexpr int ITERS = ROWS / RSTEP;
  static_assert(THREADS % CH == 0 && RSTEP % 8 == 0 && ROWS % RSTEP == 0, "tile loads must divide evenly");
  const int r0 = tid / CH;
  const int c = tid % CH;
  const T* g = src + static_cast<int64_t>(row0 + r0) * row_stride + c * 8;
  const int64_t step = static_cast<int64_t>(RSTEP) * row_stride;
  const uint32_t d0 = dst + bwd_sw128_off<ROWS>(r0, c);
  int rows_left = row_end - row0 - r0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    const bool ok = rows_left > 0;
    cp_async16(d0 + it * RSTEP * 128, ok ? g : src, ok ? 16 : 0);
    g += step;
    rows_left -= RSTEP;
  }
}

template <int D, int kNWG>
struct BwdWgShape {
  static constexpr int NWG = kNWG;     // warpgroups, 64 keys each
  static constexpr int BN = 64 * NWG;  // keys per CTA
  static constexpr int BM = 64;        // queries per step (one 128-byte swizzle atom of dS^T)
  static constexpr int kThreads = 128 * NWG;
  // dQ split among the warpgroups by head-dim columns where each one's share is a whole
  // 64-wide swizzle atom, else by keys (flash_bwd_wgmma_step.cuh).
  static constexpr bool kDqByKeys = D / NWG < 64;
  static constexpr int DQN = kDqByKeys ? D : D / NWG;    // dQ columns per warpgroup
  static constexpr int DQK = kDqByKeys ? BN / NWG : BN;  // keys its dQ sums over
  static constexpr int kKBytes = BN * D * 2;  // K or V
  static constexpr int kQBytes = BM * D * 2;  // one stage of Q or dO
  static constexpr int kOffV = kKBytes;
  static constexpr int kOffQ = 2 * kKBytes;
  static constexpr int kOffDO = kOffQ + 2 * kQBytes;
  static constexpr int kOffDS = kOffDO + 2 * kQBytes;  // dS^T: [BN keys][BM queries]
  // dQ staging: per step parity and warpgroup a [BM, DQN] fp32 tile as DQN / 32 boxes of
  // [BM, 32] in the 128-byte swizzle (8 KB each), the layout of the bulk reduction's map.
  static constexpr int kDqBoxBytes = BM * 32 * 4;
  static constexpr int kDqTileBytes = (DQN / 32) * kDqBoxBytes;
  static constexpr int kOffDQ = kOffDS + BN * BM * 2;  // a multiple of 1 KB
  static constexpr int kOffRows = kOffDQ + 2 * NWG * kDqTileBytes;
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = kOffRows + 2 * 2 * BM * 4 + 1024;
  static_assert(kOffDQ % 1024 == 0, "dQ staging must start on a 1 KB swizzle atom");
  static_assert(kSmemBytes <= 227 * 1024, "wgmma backward: shared memory");
  static_assert((D == 64 || D == 128) && NWG == 2 && DQN == 64,
                "wgmma backward: built for head_dim 64 and 128, two warpgroups (dQ as m64n64)");
  static_assert(kThreads >= 2 * BM, "one thread per LSE and per delta entry of a query block");
};

template <typename T, int D, int NWG>
__global__ void __launch_bounds__(NWG * 128, 1) flash_bwd_wgmma_kernel(const __grid_constant__ BwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = BwdWgShape<D, NWG>;
  using Step = BwdWgStep<T, D, S>;
  constexpr int BN = S::BN, BM = S::BM, THREADS = S::kThreads, DQN = S::DQN;
  constexpr int KQ = Step::KQ;  // k steps of dV and dK (queries)

  extern __shared__ unsigned char smem[];
  const uint32_t sK = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sV = sK + S::kOffV;
  const uint32_t sQ = sK + S::kOffQ;    // stage s at + s * kQBytes
  const uint32_t sdO = sK + S::kOffDO;  // stage s at + s * kQBytes
  const uint32_t sdS = sK + S::kOffDS;
  const uint32_t sDQ = sK + S::kOffDQ;  // tile (parity, warpgroup) at + (parity * NWG + wg) * kDqTileBytes
  const uint32_t sRowsAddr = sK + S::kOffRows;  // per stage: BM LSE values, then BM delta values
  const float* sRows = reinterpret_cast<const float*>(smem + (sRowsAddr - smem_addr(smem)));

  const int tid = threadIdx.x;
  const int wg = tid >> 7;        // warpgroup: keys wg*64 .. wg*64+63 of the block
  const int wl = (tid >> 5) & 3;  // warp within the warpgroup: 16 of those keys
  const int lane = tid & 31;
  const int g = lane >> 2;  // row within an 8-row group of a fragment
  const int t = lane & 3;   // column pair within a fragment
  const int warp_key0 = wg * 64 + wl * 16;

  const KeyBlockWork work = key_block_work<BN, BM>(p);
  const int b = work.b, hk = work.hk, group = work.group, n0 = work.n0;
  const int num_mb = work.num_mb, mb_first = work.mb_first, iters = work.iters;
  const float scale_log2 = p.scale * kLog2e;

  const T* __restrict__ gK = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* __restrict__ gV = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;

  auto load_step = [&](int h, int m0, int stage) {
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh;
    bwd_load_sw128<BM, D, THREADS>(sQ + stage * S::kQBytes, gQ, p.q_sl, m0, p.len_q, tid);
    bwd_load_sw128<BM, D, THREADS>(sdO + stage * S::kQBytes, gdO, p.do_sl, m0, p.len_q, tid);
    const int64_t rows = static_cast<int64_t>(b * p.heads + h) * p.len_q;
    if (tid < 2 * BM) {
      const int i = tid % BM;
      const float* src = (tid < BM ? p.lse : p.delta) + rows;
      const bool ok = m0 + i < p.len_q;
      cp_async4(sRowsAddr + (stage * 2 * BM + tid) * 4, ok ? src + m0 + i : src, ok ? 4 : 0);
    }
  };

  bwd_load_sw128<BN, D, THREADS>(sK, gK, p.k_sl, n0, p.len_k, tid);
  bwd_load_sw128<BN, D, THREADS>(sV, gV, p.v_sl, n0, p.len_k, tid);
  if (iters > 0) load_step(hk * group, mb_first * BM, 0);
  cp_async_commit();

  // The step's registers and descriptor bases (flash_bwd_wgmma_step.cuh; the same lines in
  // flash_bwd_wgmma_ws.cuh, BwdWgStep says why they are not shared).
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  float s[BM / 2], dp[BM / 2], dq[DQN / 2];
  uint32_t pf[KQ][4], dsf[KQ][4];
  // K and V rows of this warpgroup (K-major A of S^T, dP^T); K's column block of this
  // warpgroup's dQ columns (N-major B of dQ), and the first 16-key step of the keys its dQ
  // sums over (dS^T rows and K rows alike).
  // As descriptors (BwdWgStep::k_major, n_major), built once; the step's buffers' are offsets
  // from their first.
  const uint64_t k_rows = Step::k_major(sK + wg * 64 * 128);
  const uint64_t v_rows = Step::k_major(sV + wg * 64 * 128);
  const uint64_t k_cols = Step::template n_major<BN>(sK + (S::kDqByKeys ? 0 : (wg * DQN / 64) * BN * 128));
  const uint64_t q_k0 = Step::k_major(sQ), dout_k0 = Step::k_major(sdO);
  const uint64_t q_n0 = Step::template n_major<BM>(sQ), dout_n0 = Step::template n_major<BM>(sdO);
  const uint64_t ds_n = Step::template n_major<BN>(sdS);
  const int dq_kk0 = S::kDqByKeys ? wg * (S::DQK / 16) : 0;
  const int dq_col0 = S::kDqByKeys ? 0 : wg * DQN;

  int h = hk * group, m0 = mb_first * BM;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const bool head_end = m0 + BM >= num_mb * BM;
    const int h_next = head_end ? h + 1 : h;
    const int m0_next = head_end ? mb_first * BM : m0 + BM;
    cp_async_wait<0>();
    fence_proxy_async_smem();
    // The dQ tile this step stages into was last reduced two steps ago: its bulk read done.
    if ((tid & 127) == 0) bulk_wait_read<1>();
    __syncthreads();  // step it visible to all; every reader of the other stage and of dS^T is done
    if (it + 1 < iters) load_step(h_next, m0_next, (it + 1) & 1);
    cp_async_commit();
    const int stage = it & 1;
    const uint32_t stage_off = stage * S::kQBytes;
    const float* lse_s = sRows + stage * 2 * BM;
    const float* delta_s = lse_s + BM;

    Step::scores(s, dp, k_rows, v_rows, wgmma_desc_at(q_k0, stage_off), wgmma_desc_at(dout_k0, stage_off));

    // ---- P^T: element i is key warp_key0 + g + 8*((i>>1)&1), query (i>>2)*8 + 2t + (i&1)
    // (the lines of flash_bwd_wgmma_ws.cuh, which reads the LSE in base 2 and ahead of S^T's
    // wait; BwdWgStep says why they are not shared)
    const bool masked = n0 + warp_key0 + 16 > p.len_k || m0 + BM > p.len_q ||
                        (p.causal && n0 + warp_key0 + 15 > m0 + p.causal_offset);
    // Two loops, not the mask's test in one: under `if (masked)` per element the compiler kept
    // a branch and its reconvergence at every element of the unmasked steps too (32 a step),
    // on the chain both consumers run in step with each other.
    if (masked) {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) {
        const int q = (i >> 2) * 8 + 2 * t + (i & 1);
        const int key = n0 + warp_key0 + g + 8 * ((i >> 1) & 1);
        const int query = m0 + q;
        const bool hidden = key >= p.len_k || query >= p.len_q || (p.causal && key > query + p.causal_offset);
        s[i] = exp2_ftz(fmaf(hidden ? -INFINITY : s[i], scale_log2, -lse_log2_for_p(lse_s[q])));
      }
    } else {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i)
        s[i] = exp2_ftz(fmaf(s[i], scale_log2, -lse_log2_for_p(lse_s[(i >> 2) * 8 + 2 * t + (i & 1)])));
    }

    Step::dv_gemm(dv, pf, s, dp, wgmma_desc_at(dout_n0, stage_off));
    Step::ds(dp, dsf, s, delta_s, sdS, warp_key0, g, t);
    Step::dk_gemm(dk, dsf, wgmma_desc_at(q_n0, stage_off));
    if constexpr (S::kDqByKeys) {
      named_bar_sync(1 + wg, 128);  // this warpgroup's dS^T written: its dQ reads no other rows
    } else {
      __syncthreads();  // dS^T of every warpgroup written
    }
    // In the deterministic mode (p.dq_accum null) flash_bwd_dq.cuh computes dQ and this
    // step's is dropped (computed all the same: Step::dq_gemm).
    const bool dq_here = p.dq_accum != nullptr;
    Step::dq_gemm(dq, dk, dv, pf, dsf, ds_n, k_cols, dq_kk0);
    // (no stage release: the barrier at the top of the next step frees this stage for its copies)
    if (dq_here) Step::reduce_dq(dq, p.dq_accum_map, sDQ, stage, wg, tid, wl, g, t, 1 + wg, dq_col0, m0, h, b);
    h = h_next;
    m0 = m0_next;
  }
  cp_async_wait<0>();
  if ((tid & 127) == 0) bulk_wait_read<0>();  // shared memory stays until the last reduction read it
  Step::store(dk, dv, p, b, hk, n0, warp_key0, g, t);
#else
  __trap();  // built without sm_90a: never launched (the launch table lists it only for sm_90a builds)
#endif
}

}  // namespace
}  // namespace flashwatt
