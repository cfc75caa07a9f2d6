// flashwatt attention forward on Hopper (sm_90a) with e4m3 operands: the wgmma kernel of
// flash_fwd_wgmma.cuh (one CTA per query tile, cp.async rings, lockstep or ping-pong
// warpgroups) with these differences (kernels/NOTES.md, "fp8 forward"):
//   * Q, K and V^T tiles are e4m3, rows of D (Q, K) or BN (V^T) bytes in the wgmma swizzle of
//     that width: 128 bytes, or 64 for head dim 64 (chunk c of row r at c ^ ((r >> 1) & 3)).
//   * S = Q K^T: wgmma m64nBNk32, both from shared memory, K-major (32 bytes per k step).
//   * O += P V: wgmma m64nDk32 with P from registers and V^T from shared memory, K-major (8-bit
//     wgmma has no transposed B). P is packed to e4m3 in the order its accumulators hold it;
//     the quantisation step wrote V^T's keys in the matching order (fp8_quantize.cuh).
//   * P is scaled by 2^8 before it is rounded (the running max minus kPShift is subtracted in
//     the exponent): in [0, 256] it stays below e4m3's 448, and values down to 2^-14 of the
//     row's maximum remain normal numbers (2^-6 unscaled). The row sum carries the same factor,
//     so O / rowsum is unchanged; the LSE takes it out.
//   * Scales per block (fp8_quantize.cuh): descale_q of the warpgroup's 64 rows times descale_k
//     of tile j is folded into tile j's softmax scale. O is kept in units of the last V tile's
//     descale: the rescale of O after P_{j-1} V_{j-1} (by alpha_j anyway) also takes the factor
//     descale_v[j-1] / descale_v[j], and the epilogue multiplies by descale_v[last] (Fp8Scales).
//     O leaves as bf16 or fp16 (T), staged through the K/V rings (the Q tile holds 1 byte per
//     element, O needs 2).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flash_fp8.cuh"
#include "flash_fwd.cuh"
#include "flash_fwd_wgmma.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"
#include "wgmma_fp8.cuh"

namespace flashwatt {
namespace {

// P = 2^(scale s - (max - kPShift)): in [0, 2^kPShift] (module comment).
constexpr float kPShift = 8.f;

template <int D, int BN, int NWG, int ST, bool PP>
struct Fp8Shape {
  static constexpr int BM = 64 * NWG;
  static constexpr int kThreads = 128 * NWG;
  static constexpr int kQBytes = BM * D;
  static constexpr int kTileBytes = BN * D;  // one K or one V^T stage
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = kQBytes + 2 * ST * kTileBytes + 1024;
  static constexpr int SN = BN / 2;  // S accumulator registers per thread
  static constexpr int ON = D / 2;   // O accumulator registers per thread
  static constexpr int KD = D / 32;  // k steps of Q K^T
  static constexpr int KN = BN / 32; // k steps of P V
  static_assert(D == 64 || D == 128, "fp8 kernel: head_dim 64 or 128");
  static_assert(BN == 128, "fp8 kernel: block_n 128 (V^T rows of 128 bytes)");
  static_assert(ST >= (PP ? 3 : 2), "fp8 kernel: at least two stages, three for ping-pong");
  // O leaves through the K and V rings as 16-bit [BM, D] in the 128-byte swizzle.
  static_assert(2 * ST * kTileBytes >= BM * D * 2, "fp8 kernel: the rings must hold the O tile");
  static constexpr int kAhead = PP ? ST - 2 : ST - 1;
};

// Byte offset of 16-byte chunk c of row r in a tile whose rows are SWB bytes, in the wgmma
// swizzle of that width (128: c ^ (r % 8); 64: c ^ ((r / 2) % 4)).
template <int SWB>
__device__ __forceinline__ uint32_t swizzled_off(int r, int c) {
  return static_cast<uint32_t>(r * SWB + ((c ^ ((r * SWB / 128) & (SWB / 16 - 1))) << 4));
}

// Copies the [ROWS, ROW_BYTES] box at (row0, col0) of a byte matrix at base (row stride in
// bytes) into a swizzled tile at dst: rows at or past rows_end and 16-byte chunks at or past
// cols_end (a multiple of 16) are zeros, written without a global read. Each thread moves one
// 16-byte chunk column of rows r0, r0 + RSTEP, ...; RSTEP is a multiple of 8, so every row a
// thread touches has the same swizzle (a base plus an immediate per row).
template <int ROWS, int ROW_BYTES, int THREADS>
__device__ __forceinline__ void load_tile_fp8(uint32_t dst, const uint8_t* __restrict__ base, int64_t row_stride,
                                              int row0, int col0, int rows_end, int cols_end, int tid) {
  constexpr int CH = ROW_BYTES / 16;
  constexpr int RSTEP = THREADS / CH;
  constexpr int ITERS = (ROWS + RSTEP - 1) / RSTEP;
  static_assert(THREADS % CH == 0 && RSTEP % 8 == 0, "fp8 tile loads: rows per step must be a multiple of 8");
  const int r0 = tid / CH;
  const int c = tid % CH;
  const uint8_t* g = base + static_cast<int64_t>(row0 + r0) * row_stride + col0 + c * 16;
  const int64_t step = static_cast<int64_t>(RSTEP) * row_stride;
  const uint32_t d0 = dst + swizzled_off<ROW_BYTES>(r0, c);
  const bool col_ok = col0 + c * 16 < cols_end;
  int rows_left = rows_end - row0 - r0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (ROWS % RSTEP == 0 || r0 + it * RSTEP < ROWS) {
      const bool ok = rows_left > 0 && col_ok;
      cp_async16(d0 + it * RSTEP * ROW_BYTES, ok ? g : base, ok ? 16 : 0);
    }
    g += step;
    rows_left -= RSTEP;
  }
}

// One row of one tile of the online softmax (online_softmax_row) with P shifted by kPShift.
// The row's maximum and sum are taken in kChains independent chains (8-column groups nt by
// nt % kChains), joined at the end: one chain made each FMNMX and each FADD wait on the one
// before it (32 in a row per tile), and in the ping-pong a consumer's warp is often alone on
// its sub-partition with nothing else to issue meanwhile (kernels/NOTES.md, "fp8 forward:
// where the time goes"). max is exact in any order; the sum's order moves its last bits.
template <int NT, typename At>
__device__ __forceinline__ float fp8_softmax_row(At&& at, float& row_max, float& row_sum, float scale_log2) {
  constexpr int kChains = NT % 4 == 0 ? 4 : 1;
  float part[kChains];
#pragma unroll
  for (int c = 0; c < kChains; ++c) part[c] = fmaxf(at(c, 0), at(c, 1));
#pragma unroll
  for (int nt = kChains; nt < NT; ++nt) part[nt % kChains] = fmaxf(part[nt % kChains], fmaxf(at(nt, 0), at(nt, 1)));
  float cur = part[0];
#pragma unroll
  for (int c = 1; c < kChains; ++c) cur = fmaxf(cur, part[c]);
  cur = quad_max(cur);
  const float m_old = row_max;
  const float m_new = fmaxf(m_old, cur * scale_log2);
  const float m_sub = (m_new == -INFINITY) ? 0.f : m_new;
  const float alpha = exp2_ftz(m_old - m_sub);
  const float m_p = m_sub - kPShift;
  row_max = m_new;
  float sums[kChains];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float p0 = exp2_ftz(fmaf(at(nt, 0), scale_log2, -m_p));
    const float p1 = exp2_ftz(fmaf(at(nt, 1), scale_log2, -m_p));
    at(nt, 0) = p0;
    at(nt, 1) = p1;
    sums[nt % kChains] = nt < kChains ? p0 + p1 : sums[nt % kChains] + (p0 + p1);
  }
  float sum = sums[0];
#pragma unroll
  for (int c = 1; c < kChains; ++c) sum += sums[c];
  row_sum = row_sum * alpha + sum;
  return alpha;
}

// The block scales one warpgroup meets in a work item (module comment): its query block's
// share of the softmax scale, and the K and V descales of its key blocks.
struct Fp8Scales {
  float q_log2;  // scale * log2(e) * descale_q of the warpgroup's 64 rows
  const float* __restrict__ dk;
  const float* __restrict__ dv;

  __device__ __forceinline__ Fp8Scales(const Fp8FwdParams& f, int b, int h, int hk, int row0) {
    const FwdParams& p = f.p;
    const int qb = min(row0 / kFp8QBlock, f.q_blocks - 1);  // rows past len_q: any block, never stored
    q_log2 = p.scale * kLog2e * f.descale_q[static_cast<int64_t>(b * p.heads + h) * f.q_blocks + qb];
    const int64_t kv = static_cast<int64_t>(b * p.kv_heads + hk) * f.kv_blocks;
    dk = f.descale_k + kv;
    dv = f.descale_v + kv;
  }
};

// T: the output type (bf16 or fp16).
template <typename T, int D, int BN, int NWG, int ST, bool PP>
__global__ void __launch_bounds__(NWG * 128, 1) flash_fwd_fp8_kernel(const Fp8FwdParams f) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Fp8Shape<D, BN, NWG, ST, PP>;
  constexpr int BM = S::BM, THREADS = S::kThreads, SN = S::SN, ON = S::ON, AHEAD = S::kAhead;
  constexpr int KD = S::KD, KN = S::KN;
  const FwdParams& p = f.p;

  extern __shared__ unsigned char smem[];
  const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sK = sQ + S::kQBytes;
  const uint32_t sV = sK + ST * S::kTileBytes;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  const int wl = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_row0 = wg * 64 + wl * 16;
  const bool lagging = PP && (wg & 1);

  const TileGrid<BM, BN> grid(p);
  const uint32_t q_base = sQ + wg * 64 * D;  // this warpgroup's 64 rows of Q

#pragma unroll 1
  for (int tile = blockIdx.x; tile < grid.total; tile += gridDim.x) {
    const TileWork<uint8_t> w = grid.template work<uint8_t>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const int hk = h / grid.group;
    const uint8_t* __restrict__ gK = w.k;
    const uint8_t* __restrict__ gV = w.v;  // V^T: D rows of vt_cols keys
    const Fp8Scales sc(f, b, h, hk, m0 + wg * 64);
    float dv_prev = sc.dv[0];  // O's unit: the descale_v of the last P V it holds

    __syncthreads();  // the previous item's readers of shared memory are done

    // Group i holds K_i and V_{i-1}, as in flash_fwd_wgmma.cuh: barrier B_j publishes group j
    // and issues group j + AHEAD; no load is guarded by a branch (rows past the keys and
    // columns past vt_cols are zero-filled without a global read).
    const int kv_rows = min(p.len_k, n_tiles * BN);
    auto load_k = [&](int slot, int j) {
      load_tile_fp8<BN, D, THREADS>(sK + slot * S::kTileBytes, gK, p.k_sl, j * BN, 0, kv_rows, D, tid);
    };
    auto load_v = [&](int slot, int j) {  // V^T columns j*BN .. j*BN + BN - 1
      load_tile_fp8<D, BN, THREADS>(sV + slot * S::kTileBytes, gV, p.v_sl, 0, j * BN, D, f.vt_cols, tid);
    };
    load_tile_fp8<BM, D, THREADS>(sQ, w.q, p.q_sl, m0, 0, p.len_q, D, tid);
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      load_k(i, i);
      if (i >= 1) load_v(i - 1, i - 1);
      cp_async_commit();
    }

    float o[ON];
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    float s[SN];
    uint32_t pf[KN][4];

    auto next_tile = [&](int j) {
      cp_async_wait<AHEAD - 1>();
      fence_proxy_async_smem();
      __syncthreads();
      const int jk = j + AHEAD;
      load_k(jk % ST, jk);
      load_v((jk - 1) % ST, jk - 1);
      cp_async_commit();
    };
    auto issue_s = [&](int j) {  // S_j = Q K_j^T
      const uint32_t k_base = sK + (j % ST) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk)
        wgmma_ss_e4m3(s, wgmma_desc_fp8<D>(q_base + kk * 32), wgmma_desc_fp8<D>(k_base + kk * 32), kk > 0 ? 1 : 0);
      wgmma_commit();
    };
    auto issue_pv = [&](int j) {  // O += P_j V_j
      const uint32_t v_base = sV + (j % ST) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) wgmma_rs_e4m3(o, pf[kk], wgmma_desc_fp8<BN>(v_base + kk * 32), 1);
      wgmma_commit();
    };
    auto softmax = [&](int j, float (&alpha)[2], auto mask, float scale_log2) {
      constexpr bool kMask = decltype(mask)::value;
      const int n0 = j * BN;
      if (kMask && (n0 + BN > p.len_k || (p.causal && n0 + BN - 1 - p.causal_offset > m0 + warp_row0))) {
#pragma unroll
        for (int i = 0; i < SN; ++i) {
          const int row = m0 + warp_row0 + g + ((i >> 1) & 1) * 8;
          const int col = n0 + (i >> 2) * 8 + 2 * t + (i & 1);
          if (col >= p.len_k || (p.causal && col - p.causal_offset > row)) s[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alpha[r] = fp8_softmax_row<BN / 8>([&](int nt, int e) -> float& { return s[4 * nt + 2 * r + e]; },
                                           row_max[r], row_sum[r], scale_log2);
    };
    // P in e4m3, A fragments in the accumulators' column order (module comment): register
    // 2r + h of k step kk holds row g + 8r, accumulator pairs 4kk + 2h and 4kk + 2h + 1.
    auto pack_p = [&]() {
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        const float* q = s + 16 * kk;
        pf[kk][0] = pack_e4m3x4(q[0], q[1], q[4], q[5]);
        pf[kk][1] = pack_e4m3x4(q[2], q[3], q[6], q[7]);
        pf[kk][2] = pack_e4m3x4(q[8], q[9], q[12], q[13]);
        pf[kk][3] = pack_e4m3x4(q[10], q[11], q[14], q[15]);
      }
    };
    auto first = [&](bool lag) {
      float alpha[2];
      next_tile(0);
      wgmma_fence();
      issue_s(0);
      if (lag) next_tile(1);
      wgmma_wait<0>();
      fence_regs(s);
      softmax(0, alpha, std::true_type{}, sc.q_log2 * sc.dk[0]);
      pack_p();
    };
    auto step = [&](int j, auto mask, bool lag) {
      float alpha[2];
      const float dk_j = sc.dk[j], dv_j = sc.dv[j];  // read before the waits, used after them
      if (!lag) next_tile(j);
      wgmma_fence();
      issue_s(j);
      issue_pv(j - 1);
      if (lag) next_tile(j + 1);
      wgmma_wait<1>();
      fence_regs(s);
      softmax(j, alpha, mask, sc.q_log2 * dk_j);
      const float to_unit = dv_prev / dv_j;  // O holds P_{j-1} V_{j-1} in units of dv_prev
      dv_prev = dv_j;
      alpha[0] *= to_unit;
      alpha[1] *= to_unit;
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
#pragma unroll
      for (int i = 0; i < ON; ++i) o[i] *= alpha[(i >> 1) & 1];
      pack_p();
    };
    const int n_clean = min(n_tiles, p.causal ? min(p.len_k, m0 + 1 + p.causal_offset) / BN : p.len_k / BN);
    auto tiles = [&](auto lag_tag) {
      constexpr bool lag = decltype(lag_tag)::value;
      first(lag);
#pragma unroll 1
      for (int j = 1; j < n_clean; ++j) step(j, std::false_type{}, lag);
#pragma unroll 1
      for (int j = max(1, n_clean); j < n_tiles; ++j) step(j, std::true_type{}, lag);
      if (!lag) {
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();
      }
    };
    if (lagging)
      tiles(std::true_type{});
    else
      tiles(std::false_type{});

    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
    fence_regs(o);
    cp_async_wait<0>();

    // ---- epilogue: every warpgroup's wgmma has read its last K/V tile before any O row is
    // staged in the rings
    __syncthreads();
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] *= dv_prev;
    const float lse_max[2] = {row_max[0] - kPShift, row_max[1] - kPShift};
    store_o_rows<T, D, BM>(p, o, lse_max, row_sum, sK, b, h, m0, warp_row0, lane);
  }
#else
  __trap();  // built without sm_90a: never launched (the launch table only lists it for sm_90a builds)
#endif
}

}  // namespace
}  // namespace flashwatt
