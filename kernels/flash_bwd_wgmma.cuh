// flashwatt attention backward on Hopper (sm_90a): the five GEMMs of a step on wgmma.
//
// The algorithm of the mma.sync backward (flash_bwd.cu, kernels/NOTES.md "Backward"): one
// CTA per (block of BN = 64*NWG keys, batch, k/v head), one warpgroup per 64 keys. K and V
// stay in shared memory; Q, dO, LSE and delta of each 64-row query block stream through a
// 2-stage cp.async ring. Shared-memory tiles use the wgmma 128-byte swizzle of the forward
// (flash_fwd_wgmma.cuh): a [rows, D] tile is D/64 column blocks of [rows, 64]; row r of a
// block sits at r*128 bytes and its 16-byte chunk c at position c ^ (r % 8).
// Per step, for warpgroup w (keys w*64 .. w*64+63 of the block):
//   S^T  = K_w Q^T      wgmma SS, m64 n64 (queries) k16 (head dim): A = K rows, B = Q rows,
//                       both K-major (head dim contiguous), as the forward's Q K^T.
//   dP^T = V_w dO^T     the same with V and dO.
//   P^T  = exp2(scale*log2e*S^T - log2e*LSE), dS^T = P^T (dP^T - delta) in registers.
//                       (A row that sees no key: LSE -inf read as +inf, so P = 0: causal_mask.cuh.)
//   dV  += P^T dO       wgmma RS, m64 nD k16 (queries): A = P^T from the accumulators (the
//                       m64nN accumulator layout is the A-fragment layout, as the forward's
//                       P), B = dO [query][d]: N-major, as the forward's V in P V.
//   dK  += dS^T Q       the same with dS^T and Q.
//   dQ  += dS K         wgmma SS, m64 (queries) n64 k16 (keys): at head dim 128 warpgroup w
//                       takes head-dim columns w*64 .. over all BN keys, at head dim 64 (one
//                       64-wide swizzle atom, which an n32 wgmma cannot address half of) all
//                       columns over its own 64 keys, the two adding into the same dQ rows.
//                       A = dS, read from dS^T stored [key][query] in shared memory (the
//                       16-bit values the mma reads), i.e. M-major (transposed A, as
//                       FlashAttention-3 reads dS); B = K [key][d]: N-major. Each warpgroup
//                       stages its fp32 dQ in shared memory and one of its threads adds the
//                       tile into the dQ accumulator with a TMA bulk reduction
//                       (kernels/NOTES.md, "dQ by bulk reductions"), as FlashAttention-3.
// dK is multiplied by the scale once, at the store.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "async_pipeline.cuh"
#include "causal_mask.cuh"
#include "flash_bwd.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"

namespace flashwatt {
namespace {

// m64n64k16, A and B from shared memory, both transposed (M-major A, N-major B).
#define FLASHWATT_BWD_WGMMA_SS_TT(TY, CT)                                                                     \
  __device__ __forceinline__ void bwd_wgmma_ss_tt(float (&d)[32], uint64_t a, uint64_t b, int scale_d, CT) {  \
    asm volatile(                                                                                             \
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"                                                          \
        "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY                                               \
        " {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, "   \
        "%21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 1, 1;\n}\n"                \
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),     \
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),            \
          "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]),          \
          "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]),          \
          "+f"(d[29]), "+f"(d[30]), "+f"(d[31])                                                               \
        : "l"(a), "l"(b), "r"(scale_d));                                                                      \
  }
FLASHWATT_BWD_WGMMA_SS_TT("f16", __half)
FLASHWATT_BWD_WGMMA_SS_TT("bf16", __nv_bfloat16)
#undef FLASHWATT_BWD_WGMMA_SS_TT

// Byte offset of 16-byte chunk c of row r in a 128-byte-swizzled [ROWS, cols] tile.
template <int ROWS>
__device__ __forceinline__ uint32_t bwd_sw128_off(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

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

template <int D, int NWG>
struct BwdWgShape {
  static constexpr int BN = 64 * NWG;  // keys per CTA
  static constexpr int BM = 64;        // queries per step (one 128-byte swizzle atom of dS^T)
  static constexpr int kThreads = 128 * NWG;
  // dQ split among the warpgroups by head-dim columns where each one's share is a whole
  // 64-wide swizzle atom, else by keys (kernel comment above).
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
  using Ops = TypeOps<T>;
  constexpr int BN = S::BN, BM = S::BM, THREADS = S::kThreads, DQN = S::DQN;
  constexpr int KD = D / 16;   // k steps of S^T and dP^T (head dim)
  constexpr int KQ = BM / 16;  // k steps of dV and dK (queries)

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

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  float s[BM / 2], dp[BM / 2], dq[DQN / 2];
  uint32_t pf[KQ][4], dsf[KQ][4];

  // Descriptor bases: K and V rows of this warpgroup (K-major A of S^T, dP^T); K's column
  // block of this warpgroup's dQ columns (N-major B of dQ), and the first 16-key step of
  // the keys its dQ sums over (dS^T rows and K rows alike).
  const uint32_t k_rows = sK + wg * 64 * 128;
  const uint32_t v_rows = sV + wg * 64 * 128;
  const uint32_t k_cols = sK + (S::kDqByKeys ? 0 : (wg * DQN / 64) * BN * 128);
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
    const uint32_t sQs = sQ + stage * S::kQBytes;
    const uint32_t sdOs = sdO + stage * S::kQBytes;
    const float* lse_s = sRows + stage * 2 * BM;
    const float* delta_s = lse_s + BM;

    // ---- S^T = K Q^T and dP^T = V dO^T (two commit groups)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const uint32_t off = (kk & 3) * 32;
      wgmma_ss(s, wgmma_desc_sw128(k_rows + (kk >> 2) * BN * 128 + off, 16, 1024),
               wgmma_desc_sw128(sQs + (kk >> 2) * BM * 128 + off, 16, 1024), kk > 0 ? 1 : 0, T{});
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const uint32_t off = (kk & 3) * 32;
      wgmma_ss(dp, wgmma_desc_sw128(v_rows + (kk >> 2) * BN * 128 + off, 16, 1024),
               wgmma_desc_sw128(sdOs + (kk >> 2) * BM * 128 + off, 16, 1024), kk > 0 ? 1 : 0, T{});
    }
    wgmma_commit();
    wgmma_wait<1>();  // S^T done; dP^T may still run
    fence_regs(s);

    // ---- P^T: element i is key warp_key0 + g + 8*((i>>1)&1), query (i>>2)*8 + 2t + (i&1)
    const bool masked = n0 + warp_key0 + 16 > p.len_k || m0 + BM > p.len_q ||
                        (p.causal && n0 + warp_key0 + 15 > m0 + p.causal_offset);
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
      const int q = (i >> 2) * 8 + 2 * t + (i & 1);
      float x = s[i];
      if (masked) {
        const int key = n0 + warp_key0 + g + 8 * ((i >> 1) & 1);
        const int query = m0 + q;
        if (key >= p.len_k || query >= p.len_q || (p.causal && key > query + p.causal_offset)) x = -INFINITY;
      }
      s[i] = exp2_ftz(fmaf(x, scale_log2, -lse_log2_for_p(lse_s[q])));
    }
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      pf[kk][0] = Ops::pack(s[8 * kk + 0], s[8 * kk + 1]);
      pf[kk][1] = Ops::pack(s[8 * kk + 2], s[8 * kk + 3]);
      pf[kk][2] = Ops::pack(s[8 * kk + 4], s[8 * kk + 5]);
      pf[kk][3] = Ops::pack(s[8 * kk + 6], s[8 * kk + 7]);
    }

    // ---- dV += P^T dO
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) wgmma_rs(dv, pf[kk], wgmma_desc_sw128(sdOs + kk * 16 * 128, BM * 128, 1024), 1, T{});
    wgmma_commit();
    wgmma_wait<1>();  // dP^T done; dV may still run
    fence_regs(dp);

    // ---- dS^T = P^T (dP^T - delta), to registers (A of dK) and shared memory (for dQ)
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) dp[i] = s[i] * (dp[i] - delta_s[(i >> 2) * 8 + 2 * t + (i & 1)]);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      dsf[kk][0] = Ops::pack(dp[8 * kk + 0], dp[8 * kk + 1]);
      dsf[kk][1] = Ops::pack(dp[8 * kk + 2], dp[8 * kk + 3]);
      dsf[kk][2] = Ops::pack(dp[8 * kk + 4], dp[8 * kk + 5]);
      dsf[kk][3] = Ops::pack(dp[8 * kk + 6], dp[8 * kk + 7]);
    }
    {
      // dsf[kk][0], [2]: key row warp_key0 + g, queries 16kk + 2t (+1) and 16kk + 8 + 2t (+1)
      // (16-byte chunks 2kk and 2kk + 1); [1], [3]: key row warp_key0 + g + 8.
      const int r0 = warp_key0 + g, r1 = r0 + 8;
#pragma unroll
      for (int kk = 0; kk < KQ; ++kk) {
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + bwd_sw128_off<BN>(r0, 2 * kk) + 4 * t), "r"(dsf[kk][0]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + bwd_sw128_off<BN>(r1, 2 * kk) + 4 * t), "r"(dsf[kk][1]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + bwd_sw128_off<BN>(r0, 2 * kk + 1) + 4 * t),
                     "r"(dsf[kk][2]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sdS + bwd_sw128_off<BN>(r1, 2 * kk + 1) + 4 * t),
                     "r"(dsf[kk][3]));
      }
    }

    // ---- dK += dS^T Q
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) wgmma_rs(dk, dsf[kk], wgmma_desc_sw128(sQs + kk * 16 * 128, BM * 128, 1024), 1, T{});
    wgmma_commit();

    fence_proxy_async_smem();
    if constexpr (S::kDqByKeys) {
      named_bar_sync(1 + wg, 128);  // this warpgroup's dS^T written: its dQ reads no other rows
    } else {
      __syncthreads();  // dS^T of every warpgroup written
    }

    // ---- dQ (64 queries x DQN columns of this warpgroup) = dS K over its DQK keys. In the
    // deterministic mode (p.dq_accum null) flash_bwd_dq.cuh computes dQ and this result is
    // dropped: a wgmma under a branch makes ptxas insert warpgroup.arrive and spill.
    const bool dq_here = p.dq_accum != nullptr;
#pragma unroll
    for (int kk = 0; kk < S::DQK / 16; ++kk)
      bwd_wgmma_ss_tt(dq, wgmma_desc_sw128(sdS + (dq_kk0 + kk) * 16 * 128, BN * 128, 1024),
                      wgmma_desc_sw128(k_cols + (dq_kk0 + kk) * 16 * 128, BN * 128, 1024), kk > 0 ? 1 : 0, T{});
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dq);
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);

    // element i of dq: query wl*16 + g + 8*((i>>1)&1), column dq_col0 + (i>>2)*8 + 2t + (i&1).
    // Staged as float2 at column 8j + 2t of row wl*16 + g + 8r: box j / 4, 16-byte chunk
    // 2 (j % 4) + t / 2 of the row's 128 bytes, swizzled by row % 8 = g, so the 8 rows of a
    // store land on 8 different chunk positions (no bank conflict).
    if (dq_here) {
      const uint32_t tile = sDQ + ((it & 1) * NWG + wg) * S::kDqTileBytes;
      const uint32_t row_base = tile + (wl * 16 + g) * 128 + (t & 1) * 8;
#pragma unroll
      for (int j = 0; j < DQN / 8; ++j) {
        const uint32_t chunk = static_cast<uint32_t>(((2 * (j & 3) + (t >> 1)) ^ g) << 4);
#pragma unroll
        for (int r = 0; r < 2; ++r)
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(row_base + (j >> 2) * S::kDqBoxBytes + r * 8 * 128 +
                                                                      chunk),
                       "f"(dq[4 * j + 2 * r]), "f"(dq[4 * j + 2 * r + 1]));
      }
      fence_proxy_async_smem();      // the bulk reduction reads through the async proxy
      named_bar_sync(1 + wg, 128);  // this warpgroup's dQ tile staged
      if ((tid & 127) == 0) {
#pragma unroll
        for (int box = 0; box < DQN / 32; ++box)
          tma_reduce_add_4d(p.dq_accum_map, tile + box * S::kDqBoxBytes, dq_col0 + box * 32, m0, h, b);
        bulk_commit();
      }
    }
    h = h_next;
    m0 = m0_next;
  }
  cp_async_wait<0>();
  if ((tid & 127) == 0) bulk_wait_read<0>();  // shared memory stays until the last reduction read it

  // ---- epilogue: dK (times scale) and dV of this warp's 16 keys, 32 bits per store
  T* gdK = static_cast<T*>(p.dk) + b * p.dk_sb + hk * p.dk_sh;
  T* gdV = static_cast<T*>(p.dv) + b * p.dv_sb + hk * p.dv_sh;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + warp_key0 + g + 8 * r;
    if (key < p.len_k) {
      T* dk_row = gdK + static_cast<int64_t>(key) * p.dk_sl + 2 * t;
      T* dv_row = gdV + static_cast<int64_t>(key) * p.dv_sl + 2 * t;
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        *reinterpret_cast<uint32_t*>(dk_row + j * 8) =
            Ops::pack(dk[4 * j + 2 * r] * p.scale, dk[4 * j + 2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_row + j * 8) = Ops::pack(dv[4 * j + 2 * r], dv[4 * j + 2 * r + 1]);
      }
    }
  }
#else
  __trap();  // built without sm_90a: never launched (the launch table lists it only for sm_90a builds)
#endif
}

}  // namespace
}  // namespace flashwatt
