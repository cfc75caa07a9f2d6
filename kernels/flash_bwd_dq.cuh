// dQ of the attention backward in a pass of its own, without atomics: the deterministic
// mode (kernels/NOTES.md, "Deterministic dQ").
//
// The main backward kernels walk the query blocks of a key block and add each block's
// share of dQ into an fp32 buffer with atomics, whose order varies from run to run. Here
// one CTA owns a block of BM query rows of one query head and walks its key blocks in
// order, recomputing what it needs from the forward's LSE and delta = rowsum(dO * O):
//   S  = Q K^T,  P = exp(scale S - LSE),  dP = dO V^T,  dS = P * (dP - delta),
//   dQ += dS K                      (fp32 registers; times scale once, at the end)
// so every dQ element is one fixed sequence of fp32 additions: bit-identical run to run.
// The price is S and dP once more (three GEMMs here against the main kernel's dQ GEMM),
// which the main kernel then skips. Each warp owns 16 query rows; S and dP are accumulators
// with queries as rows, so dS is repacked in registers as the A operand of dS K exactly as
// the forward repacks P, and K is read transposed by ldmatrix as the forward reads V.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "causal_mask.cuh"
#include "flash_bwd.cuh"
#include "ptx.cuh"
#include "smem_tile.cuh"
#include "tile_schedule.cuh"

namespace flashwatt {
namespace {

template <int D, int BM, int BN, int NW>
struct BwdDqShape {
  static constexpr int kThreads = NW * 32;
  static constexpr int KD = D / 16;   // 16-wide k steps over head_dim (S, dP)
  static constexpr int NT = BN / 8;   // 8-key n tiles of S and dP
  static constexpr int KN = BN / 16;  // 16-key k steps of dQ
  static constexpr int DT = D / 8;    // 8-wide n tiles of dQ
  static constexpr int kRowBytes = padded_row_bytes<D>();
  static constexpr int kOffDO = BM * kRowBytes;                 // after Q
  static constexpr int kOffKV = 2 * BM * kRowBytes;             // K, V of stage 0, then of stage 1
  static constexpr int kStageBytes = 2 * BN * kRowBytes;
  static constexpr int kSmemBytes = kOffKV + 2 * kStageBytes;
  static_assert(BM == 16 * NW, "each warp owns 16 query rows");
  static_assert(BN % 16 == 0 && D % 64 == 0, "tile shape");
};

// Grid: one CTA per (query block, batch, query head), in L2 sections of p.section * group
// (batch, query head) pairs; under a causal mask the longest blocks (the last rows) first.
template <typename T, int D, int BM, int BN, int NW>
__global__ void __launch_bounds__(NW * 32, 2) flash_bwd_dq_kernel(const BwdParams p) {
  using S = BwdDqShape<D, BM, BN, NW>;
  using Ops = TypeOps<T>;
  constexpr int KD = S::KD, NT = S::NT, KN = S::KN, DT = S::DT, THREADS = S::kThreads;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_addr(smem);
  const uint32_t sdO = sQ + S::kOffDO;
  const uint32_t sKV = sQ + S::kOffKV;  // stage s: K at + s * kStageBytes, V BN rows later

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  // ldmatrix lane coordinates (as flash_bwd.cu): A row-major [m][k]; B from [n][k] rows;
  // B (.trans) from [k][n] rows.
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int a_chk = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8;
  const int b_chk = (lane >> 3) & 1;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;
  const int v_chk = lane >> 4;

  const int group = p.heads / p.kv_heads;
  const int num_mb = (p.len_q + BM - 1) / BM;
  const SectionItem item = section_item(blockIdx.x, num_mb, p.batch * p.heads, p.section * group);
  const int mb = p.causal ? num_mb - 1 - item.rank : item.rank;
  const int b = item.pair / p.heads;
  const int h = item.pair % p.heads;
  const int hk = h / group;
  const int m0 = mb * BM;
  const int num_nb = (p.len_k + BN - 1) / BN;
  // Causal: keys past the diagonal of the block's last row are never read (none where that
  // row sees no key: causal_mask.cuh); dQ of such a block is 0.
  const int n_tiles = p.causal ? (causal_kv_end(p, m0 + BM) + BN - 1) / BN : num_nb;
  const float scale_log2 = p.scale * kLog2e;

  const T* gQ = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
  const T* gdO = static_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh;
  const T* gK = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* gV = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;
  auto load_kv = [&](int j) {
    const uint32_t st = sKV + (j & 1) * S::kStageBytes;
    load_padded_tile<BN, D, THREADS>(st, gK, p.k_sl, j * BN, p.len_k, tid);
    load_padded_tile<BN, D, THREADS>(st + BN * S::kRowBytes, gV, p.v_sl, j * BN, p.len_k, tid);
  };
  load_padded_tile<BM, D, THREADS>(sQ, gQ, p.q_sl, m0, p.len_q, tid);
  load_padded_tile<BM, D, THREADS>(sdO, gdO, p.do_sl, m0, p.len_q, tid);
  if (n_tiles > 0) load_kv(0);
  cp_async_commit();

  // LSE (in base-2 units, a row that sees no key's as +inf: causal_mask.cuh) and delta of
  // this thread's two rows; rows past len_q read 0 and are never stored.
  const int warp_q0 = warp * 16;
  const int64_t rows = static_cast<int64_t>(b * p.heads + h) * p.len_q;
  float lse_log2[2], delta[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + warp_q0 + g + 8 * r;
    lse_log2[r] = row < p.len_q ? lse_log2_for_p(p.lse[rows + row]) : 0.f;
    delta[r] = row < p.len_q ? p.delta[rows + row] : 0.f;
  }

  float dq[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dq[dt][e] = 0.f;
  }

#pragma unroll 1
  for (int j = 0; j < n_tiles; ++j) {
    cp_async_wait<0>();
    __syncthreads();  // tile j visible to all; every reader of tile j - 1's stage is done
    if (j + 1 < n_tiles) load_kv(j + 1);
    cp_async_commit();
    const uint32_t sK = sKV + (j & 1) * S::kStageBytes;
    const uint32_t sV = sK + BN * S::kRowBytes;
    const int n0 = j * BN;

    // ---- S = Q K^T and dP = dO V^T (16 queries x BN keys per warp)
    float s[NT][4], dp[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = dp[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t aq[4], ao[4];
      ldmatrix_x4(aq, sQ + padded_off<D>(warp_q0 + a_row, kk * 2 + a_chk));
      ldmatrix_x4(ao, sdO + padded_off<D>(warp_q0 + a_row, kk * 2 + a_chk));
#pragma unroll
      for (int nn = 0; nn < NT / 2; ++nn) {
        uint32_t bk[4], bv[4];
        ldmatrix_x4(bk, sK + padded_off<D>(nn * 16 + b_row, kk * 2 + b_chk));
        ldmatrix_x4(bv, sV + padded_off<D>(nn * 16 + b_row, kk * 2 + b_chk));
        Ops::mma(s[2 * nn], aq, bk[0], bk[1]);
        Ops::mma(s[2 * nn + 1], aq, bk[2], bk[3]);
        Ops::mma(dp[2 * nn], ao, bv[0], bv[1]);
        Ops::mma(dp[2 * nn + 1], ao, bv[2], bv[3]);
      }
    }

    // ---- P, then dS = P (dP - delta) in place of dP: element e of tile nt is query
    // m0 + warp_q0 + g + 8 * (e >> 1), key n0 + nt * 8 + 2t + (e & 1). Masked: P = 0, dS = 0.
    const bool masked = n0 + BN > p.len_k || (p.causal && n0 + BN - 1 > m0 + p.causal_offset + warp_q0);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e];
        if (masked) {
          const int query = m0 + warp_q0 + g + 8 * (e >> 1);
          const int key = n0 + nt * 8 + 2 * t + (e & 1);
          if (key >= p.len_k || (p.causal && key > query + p.causal_offset)) x = -INFINITY;
        }
        const float pr = exp2_ftz(fmaf(x, scale_log2, -lse_log2[e >> 1]));
        dp[nt][e] = pr * (dp[nt][e] - delta[e >> 1]);
      }
    }

    // ---- dQ += dS K: dS from the accumulators (16-bit, as the main kernel rounds it),
    // K read transposed
#pragma unroll
    for (int kk = 0; kk < KN; ++kk) {
      uint32_t da[4];
      da[0] = Ops::pack(dp[2 * kk][0], dp[2 * kk][1]);
      da[1] = Ops::pack(dp[2 * kk][2], dp[2 * kk][3]);
      da[2] = Ops::pack(dp[2 * kk + 1][0], dp[2 * kk + 1][1]);
      da[3] = Ops::pack(dp[2 * kk + 1][2], dp[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < DT / 2; ++dd) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, sK + padded_off<D>(kk * 16 + v_row, dd * 2 + v_chk));
        Ops::mma(dq[2 * dd], da, bk[0], bk[1]);
        Ops::mma(dq[2 * dd + 1], da, bk[2], bk[3]);
      }
    }
  }
  cp_async_wait<0>();  // only an empty group (or, with no tile, Q and dO) can be pending

  // ---- dQ (times scale) of this warp's 16 rows, 32 bits per store
  T* gdQ = static_cast<T*>(p.dq) + b * p.dq_sb + h * p.dq_sh;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = m0 + warp_q0 + g + 8 * r;
    if (row < p.len_q) {
      T* dst = gdQ + static_cast<int64_t>(row) * p.dq_sl + 2 * t;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<uint32_t*>(dst + dt * 8) = Ops::pack(dq[dt][2 * r] * p.scale, dq[dt][2 * r + 1] * p.scale);
    }
  }
}

}  // namespace
}  // namespace flashwatt
