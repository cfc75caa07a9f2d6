// flashwatt attention backward: the FlashAttention-2 algorithm on mma.sync (sm_80+).
//
// Three kernels per call (kernels/NOTES.md, "Backward"):
//   1. preprocess: per query row, delta_i = sum_d dO[i,d] * O[i,d] in fp32, and the row
//      of the fp32 dQ accumulator zeroed;
//   2. main: one CTA per (block of BN keys, batch, k/v head). K and V of the block stay
//      in shared memory; the CTA walks the query blocks of every query head of its group
//      (GQA/MQA: dK and dV are summed over the group in registers) and per block
//        S^T  = K Q^T                       (keys x queries, fp32)
//        P^T  = exp(scale S^T - LSE)        (from the forward's LSE: no row max, no sum)
//        dV  += P^T dO
//        dP^T = V dO^T
//        dS^T = P^T * (dP^T - delta)
//        dK  += dS^T Q                      (times scale once, at the end)
//        dQ  += dS K                        (dS through shared memory, fp32 atomics)
//   3. convert: dQ = scale * dQ_accum in the input dtype.
// Deterministic mode (p.dq_accum null): the main kernel adds nothing into dQ, and instead
// of the conversion flash_bwd_dq.cuh computes dQ in a pass of its own, without atomics.
// Each warp owns 16 keys (at head dim 256 a pair of warps does, each with half the
// columns: BwdShape::KS): S^T, dP^T, dK and dV are accumulators with keys as rows, so
// P^T and dS^T are repacked in registers as the A operand of dV and dK exactly as the
// forward repacks P, and only dS^T goes through shared memory (for dQ, whose rows are
// queries). Causal masking is aligned as in the forward (top-left or bottom-right:
// causal_mask.cuh): query blocks wholly before the first query that sees a key block are
// never visited, and only blocks that cross the diagonal or a ragged end (keys or queries)
// take the mask branch. Rows that see no key (LSE -inf) get P = 0, hence zero gradients.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "causal_mask.cuh"
#include "flash_bwd.cuh"
#include "flash_bwd_dq.cuh"
#include "flash_fwd.cuh"
#include "ptx.cuh"
#include "smem_tile.cuh"
#include "tile_schedule.cuh"

namespace flashwatt {
namespace {

// Two 16-bit values of one 32-bit word as floats (the low half first).
template <typename T>
struct HalfPair;

template <>
struct HalfPair<__half> {
  __device__ __forceinline__ static float2 unpack(uint32_t w) {
    return __half22float2(*reinterpret_cast<const __half2*>(&w));
  }
};

template <>
struct HalfPair<__nv_bfloat16> {
  __device__ __forceinline__ static float2 unpack(uint32_t w) {
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&w));
  }
};

// dst[0] += x, dst[1] += y in global memory (dst 8-byte aligned), without a return value.
// sm_90 has a vector reduction: one instruction and one L2 request per 8 bytes instead of
// two; older architectures take two scalar ones.
__device__ __forceinline__ void red_add2(float* dst, float x, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(dst), "f"(x), "f"(y));
#else
  atomicAdd(dst, x);
  atomicAdd(dst + 1, y);
#endif
}

// ------------------------------------------------ row kernels (pre and post)

// Both row kernels give each query row D/8 threads of one warp, 8 elements (16 bytes of
// the input dtype) each, 256 threads per CTA.
constexpr int kRowThreads = 256;

template <int D>
struct RowShape {
  static constexpr int kThreadsPerRow = D / 8;
  static constexpr int kRowsPerCta = kRowThreads / kThreadsPerRow;
  static_assert(32 % kThreadsPerRow == 0, "a row's threads must sit in one warp");
};

template <typename T, int D>
__global__ void __launch_bounds__(kRowThreads) flash_bwd_preprocess_kernel(const BwdParams p) {
  using R = RowShape<D>;
  const int64_t total = static_cast<int64_t>(p.batch) * p.heads * p.len_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * R::kRowsPerCta + threadIdx.x / R::kThreadsPerRow;
  const int c = threadIdx.x % R::kThreadsPerRow;
  float dot = 0.f;
  if (row < total) {
    const int64_t bh = row / p.len_q;
    const int i = static_cast<int>(row % p.len_q);
    const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
    const T* o = static_cast<const T*>(p.o) + b * p.o_sb + h * p.o_sh + static_cast<int64_t>(i) * p.o_sl + c * 8;
    const T* d = static_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh + static_cast<int64_t>(i) * p.do_sl + c * 8;
    const uint4 ov = *reinterpret_cast<const uint4*>(o);
    const uint4 dv = *reinterpret_cast<const uint4*>(d);
    const uint32_t ow[4] = {ov.x, ov.y, ov.z, ov.w};
    const uint32_t dw[4] = {dv.x, dv.y, dv.z, dv.w};
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 a = HalfPair<T>::unpack(ow[e]);
      const float2 g = HalfPair<T>::unpack(dw[e]);
      dot = fmaf(a.x, g.x, fmaf(a.y, g.y, dot));
    }
    // The main kernel adds every key block's share of dQ into this row (unless the
    // deterministic dQ pass computes dQ instead).
    if (p.dq_accum != nullptr) {
      float4* acc = reinterpret_cast<float4*>(p.dq_accum + row * D + c * 8);
      acc[0] = make_float4(0.f, 0.f, 0.f, 0.f);
      acc[1] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
#pragma unroll
  for (int off = R::kThreadsPerRow / 2; off > 0; off /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, off);
  if (row < total && c == 0) {
    p.delta[row] = dot;
    p.lse_log2[row] = lse_log2_for_p(p.lse[row]);
  }
}

template <typename T, int D>
__global__ void __launch_bounds__(kRowThreads) flash_bwd_convert_dq_kernel(const BwdParams p) {
  using R = RowShape<D>;
  using Ops = TypeOps<T>;
  const int64_t total = static_cast<int64_t>(p.batch) * p.heads * p.len_q;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * R::kRowsPerCta + threadIdx.x / R::kThreadsPerRow;
  const int c = threadIdx.x % R::kThreadsPerRow;
  if (row >= total) return;
  const int64_t bh = row / p.len_q;
  const int i = static_cast<int>(row % p.len_q);
  const int b = static_cast<int>(bh / p.heads), h = static_cast<int>(bh % p.heads);
  const float4* acc = reinterpret_cast<const float4*>(p.dq_accum + row * D + c * 8);
  const float4 x = acc[0], y = acc[1];
  uint4 out;
  out.x = Ops::pack(x.x * p.scale, x.y * p.scale);
  out.y = Ops::pack(x.z * p.scale, x.w * p.scale);
  out.z = Ops::pack(y.x * p.scale, y.y * p.scale);
  out.w = Ops::pack(y.z * p.scale, y.w * p.scale);
  T* dq = static_cast<T*>(p.dq) + b * p.dq_sb + h * p.dq_sh + static_cast<int64_t>(i) * p.dq_sl + c * 8;
  st_global_v4(dq, out);
}

// ------------------------------------------------------------- main kernel

template <int D, int BN, int BM, int NW>
struct BwdShape {
  static constexpr int kThreads = NW * 32;
  // Warps sharing a group of 16 keys (BN = 16 NW / KS), each owning D / KS columns of the
  // group's dK and dV: at head dim 256 one warp's dK and dV would need 256 fp32 registers
  // per thread, two warps of 128 columns need what head dim 128 does. S^T and dP^T
  // contract over the whole head dim, so each warp of a pair computes them over its own
  // columns and the two add each other's partial sums through shared memory.
  static constexpr int KS = 16 * NW / BN;
  static constexpr int DW = D / KS;    // this warp's head-dim columns
  static constexpr int NTQ = BM / 8;   // 8-query n tiles of S^T and dP^T
  static constexpr int KQ = BM / 16;   // 16-query k steps of dV and dK
  static constexpr int KD = DW / 16;   // 16-wide k steps over the warp's columns (S^T, dP^T)
  static constexpr int DT = DW / 8;    // 8-wide n tiles of the warp's dK and dV
  static constexpr int KN = BN / 16;   // 16-key k steps of dQ
  static constexpr int QM = BM / 16;   // 16-row query tiles of dQ
  static constexpr int WQ = NW / QM;   // warps sharing one dQ query tile (each a column slice)
  static constexpr int DQC = D / WQ;   // dQ columns per warp
  static constexpr int DQT = DQC / 8;  // 8-wide n tiles of a warp's dQ
  // K and V as A fragments in registers when they are small (d64: 2 x 16 registers).
  static constexpr bool kKVInRegs = DW <= 64;
  static constexpr int kRowBytes = padded_row_bytes<D>();
  static constexpr int kQStageBytes = BM * kRowBytes;
  // K, V; Q and dO in two stages each; dS^T (keys x queries); LSE and delta in two stages;
  // with KS = 2 each warp's partial S^T or dP^T (one fragment of 16 bytes per lane and n tile).
  static constexpr int kOffV = BN * kRowBytes;
  static constexpr int kOffQ = 2 * BN * kRowBytes;
  static constexpr int kOffDO = kOffQ + 2 * kQStageBytes;
  static constexpr int kOffDS = kOffDO + 2 * kQStageBytes;
  static constexpr int kOffRows = kOffDS + BN * padded_row_bytes<BM>();
  static constexpr int kOffPartial = kOffRows + 2 * 2 * BM * 4;
  static constexpr int kPartialBytes = KS > 1 ? NW * NTQ * 32 * 16 : 0;
  static constexpr int kSmemBytes = kOffPartial + kPartialBytes;
  static_assert(BN * KS == 16 * NW && (KS == 1 || KS == 2), "16 keys per warp, or per pair of warps");
  static_assert(BM % 16 == 0 && NW % QM == 0 && D % WQ == 0 && DQT % 2 == 0, "dQ warp split must divide evenly");
  static_assert(D % 64 == 0 && DW % 32 == 0, "head_dim must be a multiple of 64");
  static_assert(kThreads >= 2 * BM, "one thread per LSE and per delta entry of a query block");
};

template <typename T, int D, int BN, int BM, int NW>
__global__ void __launch_bounds__(NW * 32, 1) flash_bwd_kernel(const BwdParams p) {
  using S = BwdShape<D, BN, BM, NW>;
  using Ops = TypeOps<T>;
  constexpr int NTQ = S::NTQ, KQ = S::KQ, KD = S::KD, DT = S::DT, KN = S::KN, QM = S::QM, DQT = S::DQT;
  constexpr int KS = S::KS;
  constexpr int THREADS = S::kThreads;
  constexpr bool KVREG = S::kKVInRegs;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sK = smem_addr(smem);
  const uint32_t sV = sK + S::kOffV;
  const uint32_t sQ = sK + S::kOffQ;    // stage s at + s * kQStageBytes
  const uint32_t sdO = sK + S::kOffDO;  // stage s at + s * kQStageBytes
  const uint32_t sdS = sK + S::kOffDS;
  // Per stage: BM LSE values, then BM delta values.
  const float* sRows = reinterpret_cast<const float*>(smem + S::kOffRows);
  const uint32_t sRowsAddr = sK + S::kOffRows;
  const uint32_t sPartial = sK + S::kOffPartial;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;  // row within an 8-row group of a fragment
  const int t = lane & 3;   // column pair within a fragment

  // ldmatrix lane coordinates, as in the forward (row within 16, 16-byte chunk offset):
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // A, row-major [m][k] (K, V)
  const int a_chk = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8;  // B from [n][k] rows (Q, dO for S^T, dP^T);
  const int b_chk = (lane >> 3) & 1;               // also A (.trans) from dS^T stored [k][m]
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // B (.trans) from [k][n] rows (dO, Q, K)
  const int v_chk = lane >> 4;

  // Work item: key block n0, batch b, k/v head hk, and its (query head, query block) pairs
  // (tile_schedule.cuh).
  const KeyBlockWork work = key_block_work<BN, BM>(p);
  const int b = work.b, hk = work.hk, group = work.group, n0 = work.n0;
  const int num_mb = work.num_mb, mb_first = work.mb_first, iters = work.iters;
  const float scale_log2 = p.scale * kLog2e;

  const T* __restrict__ gK = static_cast<const T*>(p.k) + b * p.k_sb + hk * p.k_sh;
  const T* __restrict__ gV = static_cast<const T*>(p.v) + b * p.v_sb + hk * p.v_sh;

  // Q, dO, LSE and delta of the query block at row m0 of query head h into stage `stage`.
  auto load_step = [&](int h, int m0, int stage) {
    const T* gQ = static_cast<const T*>(p.q) + b * p.q_sb + h * p.q_sh;
    const T* gdO = static_cast<const T*>(p.dout) + b * p.do_sb + h * p.do_sh;
    load_padded_tile<BM, D, THREADS>(sQ + stage * S::kQStageBytes, gQ, p.q_sl, m0, p.len_q, tid);
    load_padded_tile<BM, D, THREADS>(sdO + stage * S::kQStageBytes, gdO, p.do_sl, m0, p.len_q, tid);
    const int64_t rows = static_cast<int64_t>(b * p.heads + h) * p.len_q;
    if (tid < 2 * BM) {
      const int i = tid % BM;
      const float* src = (tid < BM ? p.lse : p.delta) + rows;
      const bool ok = m0 + i < p.len_q;
      cp_async4(sRowsAddr + (stage * 2 * BM + tid) * 4, ok ? src + m0 + i : src, ok ? 4 : 0);
    }
  };

  load_padded_tile<BN, D, THREADS>(sK, gK, p.k_sl, n0, p.len_k, tid);
  load_padded_tile<BN, D, THREADS>(sV, gV, p.v_sl, n0, p.len_k, tid);
  if (iters > 0) load_step(hk * group, mb_first * BM, 0);
  cp_async_commit();

  float dk[DT][4];
  float dv[DT][4];
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[dt][e] = dv[dt][e] = 0.f;
  }
  uint32_t kf[KVREG ? KD : 1][4];
  uint32_t vf[KVREG ? KD : 1][4];

  const int warp_key0 = (warp / KS) * 16;  // this warp's first key within the block
  const int dc = (warp % KS) * (S::DW / 8);  // first 16-byte chunk of its head-dim columns
  // KS = 2: this warp's partial sums (over its head-dim columns) plus its partner's, which
  // has the same 16 keys and lanes; both warps then hold the same sums (a + b == b + a).
  auto add_partner_partial = [&](float (&acc)[NTQ][4]) {
    const uint32_t mine = sPartial + ((warp * NTQ) * 32 + lane) * 16;
    const uint32_t other = sPartial + (((warp ^ 1) * NTQ) * 32 + lane) * 16;
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt)
      asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(mine + nt * 512), "f"(acc[nt][0]),
                   "f"(acc[nt][1]), "f"(acc[nt][2]), "f"(acc[nt][3]));
    named_bar_sync(1 + warp / KS, 32 * KS);
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
      float x[4];
      asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                   : "=f"(x[0]), "=f"(x[1]), "=f"(x[2]), "=f"(x[3])
                   : "r"(other + nt * 512));
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[nt][e] += x[e];
    }
  };
  const int dq_m = warp % QM;       // this warp's 16-row query tile of dQ
  const int dq_c0 = (warp / QM) * S::DQC;  // and its first dQ column

  // (query head, first query row) of the current step and of the next: carried from step
  // to step rather than divided out of `it` (no integer division in the loop).
  int h = hk * group, m0 = mb_first * BM;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const bool head_end = m0 + BM >= num_mb * BM;
    const int h_next = head_end ? h + 1 : h;
    const int m0_next = head_end ? mb_first * BM : m0 + BM;
    cp_async_wait<0>();
    __syncthreads();  // step it visible to all; every reader of the other stage and of dS^T is done
    if (it + 1 < iters) load_step(h_next, m0_next, (it + 1) & 1);
    cp_async_commit();
    if constexpr (KVREG) {
      if (it == 0) {
#pragma unroll
        for (int kk = 0; kk < KD; ++kk) {
          ldmatrix_x4(kf[kk], sK + padded_off<D>(warp_key0 + a_row, dc + kk * 2 + a_chk));
          ldmatrix_x4(vf[kk], sV + padded_off<D>(warp_key0 + a_row, dc + kk * 2 + a_chk));
        }
      }
    }
    const int stage = it & 1;
    const uint32_t sQs = sQ + stage * S::kQStageBytes;
    const uint32_t sdOs = sdO + stage * S::kQStageBytes;
    const float* lse_s = sRows + stage * 2 * BM;
    const float* delta_s = lse_s + BM;

    // ---- S^T = K Q^T (16 keys x BM queries per warp)
    float s[NTQ][4];
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (KVREG) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = kf[kk][e];
      } else {
        ldmatrix_x4(a, sK + padded_off<D>(warp_key0 + a_row, dc + kk * 2 + a_chk));
      }
#pragma unroll
      for (int nn = 0; nn < NTQ / 2; ++nn) {
        uint32_t bq[4];
        ldmatrix_x4(bq, sQs + padded_off<D>(nn * 16 + b_row, dc + kk * 2 + b_chk));
        Ops::mma(s[2 * nn], a, bq[0], bq[1]);
        Ops::mma(s[2 * nn + 1], a, bq[2], bq[3]);
      }
    }

    if constexpr (KS > 1) add_partner_partial(s);

    // ---- P^T = exp(scale * S^T - LSE): element e of tile nt is key
    // warp_key0 + g + 8 * (e >> 1), query nt * 8 + 2t + (e & 1) of the block.
    const bool masked = n0 + BN > p.len_k || m0 + BM > p.len_q || (p.causal && n0 + BN - 1 - p.causal_offset > m0);
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
      const float2 lse = *reinterpret_cast<const float2*>(lse_s + nt * 8 + 2 * t);
      const float lse_log2[2] = {lse_log2_for_p(lse.x), lse_log2_for_p(lse.y)};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[nt][e];
        if (masked) {
          const int key = n0 + warp_key0 + g + 8 * (e >> 1);
          const int query = m0 + nt * 8 + 2 * t + (e & 1);
          if (key >= p.len_k || query >= p.len_q || (p.causal && key - p.causal_offset > query)) x = -INFINITY;
        }
        s[nt][e] = exp2_ftz(fmaf(x, scale_log2, -lse_log2[e & 1]));
      }
    }

    // ---- dV += P^T dO (P^T straight from the accumulators, as the forward's P)
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      uint32_t pa[4];
      pa[0] = Ops::pack(s[2 * kk][0], s[2 * kk][1]);
      pa[1] = Ops::pack(s[2 * kk][2], s[2 * kk][3]);
      pa[2] = Ops::pack(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[3] = Ops::pack(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dd = 0; dd < DT / 2; ++dd) {
        uint32_t bo[4];
        ldmatrix_x4_trans(bo, sdOs + padded_off<D>(kk * 16 + v_row, dc + dd * 2 + v_chk));
        Ops::mma(dv[2 * dd], pa, bo[0], bo[1]);
        Ops::mma(dv[2 * dd + 1], pa, bo[2], bo[3]);
      }
    }

    // ---- dP^T = V dO^T
    float ds[NTQ][4];
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) ds[nt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      uint32_t a[4];
      if constexpr (KVREG) {
#pragma unroll
        for (int e = 0; e < 4; ++e) a[e] = vf[kk][e];
      } else {
        ldmatrix_x4(a, sV + padded_off<D>(warp_key0 + a_row, dc + kk * 2 + a_chk));
      }
#pragma unroll
      for (int nn = 0; nn < NTQ / 2; ++nn) {
        uint32_t bo[4];
        ldmatrix_x4(bo, sdOs + padded_off<D>(nn * 16 + b_row, dc + kk * 2 + b_chk));
        Ops::mma(ds[2 * nn], a, bo[0], bo[1]);
        Ops::mma(ds[2 * nn + 1], a, bo[2], bo[3]);
      }
    }

    if constexpr (KS > 1) {
      named_bar_sync(1 + warp / KS, 32 * KS);  // the partner has read this warp's partial S^T
      add_partner_partial(ds);
    }

    // ---- dS^T = P^T (dP^T - delta); masked entries have P = 0, hence dS = 0
#pragma unroll
    for (int nt = 0; nt < NTQ; ++nt) {
      const float2 delta = *reinterpret_cast<const float2*>(delta_s + nt * 8 + 2 * t);
      ds[nt][0] = s[nt][0] * (ds[nt][0] - delta.x);
      ds[nt][1] = s[nt][1] * (ds[nt][1] - delta.y);
      ds[nt][2] = s[nt][2] * (ds[nt][2] - delta.x);
      ds[nt][3] = s[nt][3] * (ds[nt][3] - delta.y);
    }

    // ---- dK += dS^T Q, and dS^T (16-bit, the precision the mma reads it at) to shared memory
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      uint32_t da[4];
      da[0] = Ops::pack(ds[2 * kk][0], ds[2 * kk][1]);
      da[1] = Ops::pack(ds[2 * kk][2], ds[2 * kk][3]);
      da[2] = Ops::pack(ds[2 * kk + 1][0], ds[2 * kk + 1][1]);
      da[3] = Ops::pack(ds[2 * kk + 1][2], ds[2 * kk + 1][3]);
      // da[0], da[2]: key row g, queries 16kk + 2t (+1) and 16kk + 8 + 2t (+1); da[1], da[3]: key row g + 8.
      const uint32_t row_g = sdS + padded_off<BM>(warp_key0 + g, 0) + (kk * 16 + 2 * t) * 2;
      const uint32_t row_g8 = row_g + 8 * padded_row_bytes<BM>();
      if (KS == 1 || warp % KS == 0) {  // both warps of a pair hold the same dS^T
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row_g), "r"(da[0]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row_g + 16), "r"(da[2]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row_g8), "r"(da[1]));
        asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(row_g8 + 16), "r"(da[3]));
      }
#pragma unroll
      for (int dd = 0; dd < DT / 2; ++dd) {
        uint32_t bq[4];
        ldmatrix_x4_trans(bq, sQs + padded_off<D>(kk * 16 + v_row, dc + dd * 2 + v_chk));
        Ops::mma(dk[2 * dd], da, bq[0], bq[1]);
        Ops::mma(dk[2 * dd + 1], da, bq[2], bq[3]);
      }
    }
    __syncthreads();  // all of dS^T written

    // ---- dQ (BM x D) += dS K: A = dS read transposed from dS^T, B = K read transposed
    float dq[DQT][4];
#pragma unroll
    for (int dt = 0; dt < DQT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) dq[dt][e] = 0.f;
    }
#pragma unroll
    for (int kk = 0; kk < KN; ++kk) {
      uint32_t a[4];
      ldmatrix_x4_trans(a, sdS + padded_off<BM>(kk * 16 + b_row, dq_m * 2 + b_chk));
#pragma unroll
      for (int dd = 0; dd < DQT / 2; ++dd) {
        uint32_t bk[4];
        ldmatrix_x4_trans(bk, sK + padded_off<D>(kk * 16 + v_row, dq_c0 / 8 + dd * 2 + v_chk));
        Ops::mma(dq[2 * dd], a, bk[0], bk[1]);
        Ops::mma(dq[2 * dd + 1], a, bk[2], bk[3]);
      }
    }
    // In the deterministic mode (p.dq_accum null) flash_bwd_dq.cuh computes dQ and this
    // block's share is dropped: skipping the GEMM above under that branch costs a spill.
    float* dq_rows = p.dq_accum + static_cast<int64_t>(b * p.heads + h) * p.len_q * D;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + dq_m * 16 + g + 8 * r;
      if (p.dq_accum != nullptr && row < p.len_q) {
        float* dst = dq_rows + static_cast<int64_t>(row) * D + dq_c0 + 2 * t;
#pragma unroll
        for (int dt = 0; dt < DQT; ++dt) red_add2(dst + dt * 8, dq[dt][2 * r], dq[dt][2 * r + 1]);
      }
    }
    h = h_next;
    m0 = m0_next;
  }
  cp_async_wait<0>();  // only an empty group (or, with no step at all, K and V) can be pending

  // ---- epilogue: dK (times scale) and dV of this warp's 16 keys and columns, 32 bits per store
  T* gdK = static_cast<T*>(p.dk) + b * p.dk_sb + hk * p.dk_sh;
  T* gdV = static_cast<T*>(p.dv) + b * p.dv_sb + hk * p.dv_sh;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int key = n0 + warp_key0 + g + 8 * r;
    if (key < p.len_k) {
      T* dk_row = gdK + static_cast<int64_t>(key) * p.dk_sl + dc * 8 + 2 * t;
      T* dv_row = gdV + static_cast<int64_t>(key) * p.dv_sl + dc * 8 + 2 * t;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        *reinterpret_cast<uint32_t*>(dk_row + dt * 8) = Ops::pack(dk[dt][2 * r] * p.scale, dk[dt][2 * r + 1] * p.scale);
        *reinterpret_cast<uint32_t*>(dv_row + dt * 8) = Ops::pack(dv[dt][2 * r], dv[dt][2 * r + 1]);
      }
    }
  }
}

}  // namespace
}  // namespace flashwatt

#if defined(FLASHWATT_WGMMA)
#include "flash_bwd_wgmma.cuh"
#include "flash_bwd_wgmma_ws.cuh"
#include "tensor_map.cuh"
#endif

namespace flashwatt {
namespace {

// ------------------------------------------------------------ config table

using KernelFn = void (*)(const BwdParams);

struct Entry {
  BwdConfig cfg;
  KernelFn preprocess;
  KernelFn main;
  KernelFn convert_dq;
  int smem;
  int threads;
  KernelFn dq;  // the deterministic dQ pass (flash_bwd_dq.cuh)
  int dq_smem;
#if defined(FLASHWATT_WGMMA)
  // The warp-specialised main kernel (flash_bwd_wgmma_ws.cuh), which takes its TMA maps
  // beside the parameters; `main` is null in its rows.
  void (*ws_main)(const BwdWsParams) = nullptr;
#endif
};

// The main kernel of a row, for the runtime's attribute and occupancy queries.
const void* main_kernel(const Entry& e) {
#if defined(FLASHWATT_WGMMA)
  if (e.ws_main != nullptr) return reinterpret_cast<const void*>(e.ws_main);
#endif
  return reinterpret_cast<const void*>(e.main);
}

// The deterministic dQ pass: 64 query rows (4 warps) per CTA, 64-key steps; 32-key steps
// at head dim 256, so that Q, dO and two stages of K and V fit an A100's 163 KB.
constexpr int kDqBM = 64, kDqWarps = 4;
template <int D>
constexpr int dq_block_n() {
  return D <= 128 ? 64 : 32;
}
template <typename T, int D>
constexpr KernelFn dq_pass() {
  return &flash_bwd_dq_kernel<T, D, kDqBM, dq_block_n<D>(), kDqWarps>;
}
template <int D>
constexpr int dq_pass_smem() {
  return BwdDqShape<D, kDqBM, dq_block_n<D>(), kDqWarps>::kSmemBytes;
}

template <typename T, int D, int BN, int BM, int NW>
constexpr Entry bwd_entry(int dtype) {
  return Entry{BwdConfig{dtype, D, BN, BM, NW}, &flash_bwd_preprocess_kernel<T, D>, &flash_bwd_kernel<T, D, BN, BM, NW>,
               &flash_bwd_convert_dq_kernel<T, D>, BwdShape<D, BN, BM, NW>::kSmemBytes, NW * 32, dq_pass<T, D>(),
               dq_pass_smem<D>()};
}

#if defined(FLASHWATT_WGMMA)
template <typename T, int D, int NWG>
constexpr Entry bwd_wgmma_entry(int dtype) {
  using S = BwdWgShape<D, NWG>;
  return Entry{BwdConfig{dtype, D, S::BN, S::BM, 4 * NWG, kBwdWgmma}, &flash_bwd_preprocess_kernel<T, D>,
               &flash_bwd_wgmma_kernel<T, D, NWG>, &flash_bwd_convert_dq_kernel<T, D>, S::kSmemBytes, S::kThreads,
               dq_pass<T, D>(), dq_pass_smem<D>()};
}

// The warp-specialised tiles: 12 warps, the producer warpgroup's 4 among them; BM queries
// per step.
template <typename T, int D, int BM = 64>
constexpr Entry bwd_wgmma_ws_entry(int dtype) {
  using S = BwdWsShape<D, BM>;
  return Entry{BwdConfig{dtype, D, S::BN, S::BM, S::kThreads / 32, kBwdWgmma}, &flash_bwd_preprocess_kernel<T, D>,
               nullptr, &flash_bwd_convert_dq_kernel<T, D>, S::kSmemBytes, S::kThreads, dq_pass<T, D>(),
               dq_pass_smem<D>(), &flash_bwd_wgmma_ws_kernel<T, D, BM>};
}
#endif

// The backward tiles of src/flashwatt/kernels/custom_backward.py map onto these rows
// (the wgmma rows exist only in sm_90a builds).
#define FLASHWATT_BWD_CONFIGS(T, DT) \
  bwd_entry<T, 64, 128, 64, 8>(DT), bwd_entry<T, 64, 64, 64, 4>(DT), bwd_entry<T, 128, 64, 64, 4>(DT), \
      bwd_entry<T, 128, 128, 64, 8>(DT), bwd_entry<T, 256, 64, 32, 8>(DT)

const Entry kEntries[] = {
    FLASHWATT_BWD_CONFIGS(__half, kFp16),
    FLASHWATT_BWD_CONFIGS(__nv_bfloat16, kBf16),
#if defined(FLASHWATT_WGMMA)
    bwd_wgmma_entry<__half, 64, 2>(kFp16),
    bwd_wgmma_entry<__nv_bfloat16, 64, 2>(kBf16),
    bwd_wgmma_entry<__half, 128, 2>(kFp16),
    bwd_wgmma_entry<__nv_bfloat16, 128, 2>(kBf16),
    bwd_wgmma_ws_entry<__half, 64>(kFp16),
    bwd_wgmma_ws_entry<__nv_bfloat16, 64>(kBf16),
    bwd_wgmma_ws_entry<__half, 128>(kFp16),
    bwd_wgmma_ws_entry<__nv_bfloat16, 128>(kBf16),
    bwd_wgmma_ws_entry<__half, 64, 128>(kFp16),
    bwd_wgmma_ws_entry<__nv_bfloat16, 64, 128>(kBf16),
#endif
};
constexpr int kNumEntries = sizeof(kEntries) / sizeof(kEntries[0]);

int report(char* err, size_t errlen, const char* what, cudaError_t code) {
  if (err && errlen) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(code));
  return static_cast<int>(code) ? static_cast<int>(code) : 1;
}

#if defined(FLASHWATT_WGMMA)
// The dQ accumulator's map for the wgmma tiles' bulk reductions: boxes of [64 rows, 32]
// fp32 (128 bytes) over the contiguous (batch, heads, len_q, head_dim) workspace.
bool encode_dq_accum_map(BwdParams& p, char* why, size_t whylen) {
  const int64_t d = p.head_dim, lq = p.len_q;
  return encode_map_4d(p.dq_accum_map, "dq_accum", CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, p.dq_accum, d, p.len_q, p.heads,
                       p.batch, d, lq * d, p.heads * lq * d, 32, 64, why, whylen);
}

// The warp-specialised tile's maps (flash_bwd_wgmma_ws.cuh, BwdWsParams): Q and dO in boxes
// of [block_m rows, 64 columns], K and V in boxes of [block_n rows, 64], both in the 128-byte
// swizzle of its tiles; LSE and delta in boxes of block_m + 4 floats of the flat (batch,
// heads, len_q) arrays (BwdWsShape::kRowBox: block_m + kRowLead); in the atomics mode the dQ
// accumulator's. False with the reason in err, which names the tile.
bool encode_ws_maps(BwdWsParams& ws, const BwdParams& p, const BwdConfig& cfg, char* err, size_t errlen) {
  ws.p = p;
  char tile[64];
  snprintf(tile, sizeof(tile), "wgmma_ws_n%d_m%d_w%d", cfg.block_n, cfg.block_m, cfg.warps);
  const int64_t rows = static_cast<int64_t>(p.batch) * p.heads * p.len_q;
  if (rows > 0x7fffffffLL) {  // the kernel's LSE and delta coordinates are 32-bit
    if (err && errlen)
      snprintf(err, errlen, "backward tile %s: %lld query rows (batch x heads x len_q) exceed 2^31 - 1", tile,
               static_cast<long long>(rows));
    return false;
  }
  const int row_box = cfg.block_m + BwdWsShape<128>::kRowLead;
  const CUtensorMapDataType type =
      cfg.dtype == kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  const int d = cfg.head_dim;
  char why[256] = {0};
  const bool ok =
      encode_map_4d(ws.q, "q", type, 2, p.q, d, p.len_q, p.heads, p.batch, p.q_sl, p.q_sh, p.q_sb, 64, cfg.block_m,
                    why, sizeof(why)) &&
      encode_map_4d(ws.dout, "dout", type, 2, p.dout, d, p.len_q, p.heads, p.batch, p.do_sl, p.do_sh, p.do_sb, 64,
                    cfg.block_m, why, sizeof(why)) &&
      encode_map_4d(ws.k, "k", type, 2, p.k, d, p.len_k, p.kv_heads, p.batch, p.k_sl, p.k_sh, p.k_sb, 64,
                    cfg.block_n, why, sizeof(why)) &&
      encode_map_4d(ws.v, "v", type, 2, p.v, d, p.len_k, p.kv_heads, p.batch, p.v_sl, p.v_sh, p.v_sb, 64,
                    cfg.block_n, why, sizeof(why)) &&
      encode_map_1d_f32(ws.lse, "lse", p.lse_log2, rows, row_box, why, sizeof(why)) &&
      encode_map_1d_f32(ws.delta, "delta", p.delta, rows, row_box, why, sizeof(why)) &&
      (p.dq_accum == nullptr || encode_dq_accum_map(ws.p, why, sizeof(why)));
  if (!ok && err && errlen) snprintf(err, errlen, "backward tile %s (TMA copies): %s", tile, why);
  return ok;
}
#endif

}  // namespace

int bwd_num_configs() { return kNumEntries; }

BwdConfig bwd_config(int index) { return kEntries[index].cfg; }

int bwd_find_config(int dtype, int head_dim, int block_n, int block_m, int warps, int math) {
  for (int i = 0; i < kNumEntries; ++i) {
    const BwdConfig& c = kEntries[i].cfg;
    if (c.dtype == dtype && c.head_dim == head_dim && c.block_n == block_n && c.block_m == block_m &&
        c.warps == warps && c.math == math)
      return i;
  }
  return -1;
}

int bwd_launch(int index, const BwdParams& params, void* stream_ptr, char* err, size_t errlen) {
  if (index < 0 || index >= kNumEntries) {
    if (err && errlen) snprintf(err, errlen, "no compiled backward configuration with index %d", index);
    return 1;
  }
  const Entry& e = kEntries[index];
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return report(err, errlen, "cudaGetDevice", st);
  static unsigned long long configured[kNumEntries] = {};
  const unsigned long long bit = 1ull << (device & 63);
  if (!(configured[index] & bit)) {
    st = cudaFuncSetAttribute(main_kernel(e), cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
    if (st != cudaSuccess) return report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
    st = cudaFuncSetAttribute(e.dq, cudaFuncAttributeMaxDynamicSharedMemorySize, e.dq_smem);
    if (st != cudaSuccess) return report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory, dQ pass)", st);
    configured[index] |= bit;
  }
  const bool deterministic = params.dq_accum == nullptr;
  const long long rows = static_cast<long long>(params.batch) * params.heads * params.len_q;
  const long long rows_per_cta = kRowThreads / (e.cfg.head_dim / 8);
  const long long row_ctas = (rows + rows_per_cta - 1) / rows_per_cta;
  const long long main_ctas =
      static_cast<long long>((params.len_k + e.cfg.block_n - 1) / e.cfg.block_n) * params.batch * params.kv_heads;
  const long long dq_ctas = static_cast<long long>((params.len_q + kDqBM - 1) / kDqBM) * params.batch * params.heads;
  if (rows <= 0 || main_ctas <= 0) return 0;
  if (row_ctas > 0x7fffffffLL || main_ctas > 0x7fffffffLL || dq_ctas > 0x7fffffffLL) {
    if (err && errlen) snprintf(err, errlen, "backward grid too large (%lld, %lld, %lld CTAs)", row_ctas, main_ctas,
                                dq_ctas);
    return 1;
  }
#if defined(FLASHWATT_WGMMA)
  // The warp-specialised kernel's copies are all TMA: its maps are encoded before anything
  // is launched, so that a refusal leaves no half-run backward behind.
  BwdWsParams ws;
  if (e.ws_main != nullptr && !encode_ws_maps(ws, params, e.cfg, err, errlen)) return 1;
#endif
  e.preprocess<<<static_cast<unsigned>(row_ctas), kRowThreads, 0, stream>>>(params);
  st = cudaGetLastError();
  if (st != cudaSuccess) return report(err, errlen, "backward preprocess launch", st);
  const BwdParams* args = &params;
#if defined(FLASHWATT_WGMMA)
  // The wgmma kernel adds its dQ tiles into dq_accum by TMA bulk reductions: boxes of
  // [64 rows, 32] fp32 (128 bytes) over the contiguous (batch, heads, len_q, head_dim) workspace.
  BwdParams with_map;
  if (e.cfg.math == kBwdWgmma && e.ws_main == nullptr && !deterministic) {
    with_map = params;
    char why[256] = {0};
    if (!encode_dq_accum_map(with_map, why, sizeof(why))) {
      if (err && errlen) snprintf(err, errlen, "backward dQ reductions: %s", why);
      return 1;
    }
    args = &with_map;
  }
  if (e.ws_main != nullptr) {
    e.ws_main<<<static_cast<unsigned>(main_ctas), e.threads, e.smem, stream>>>(ws);
  } else {
    e.main<<<static_cast<unsigned>(main_ctas), e.threads, e.smem, stream>>>(*args);
  }
#else
  e.main<<<static_cast<unsigned>(main_ctas), e.threads, e.smem, stream>>>(*args);
#endif
  st = cudaGetLastError();
  if (st != cudaSuccess) return report(err, errlen, "backward kernel launch", st);
  if (deterministic) {
    e.dq<<<static_cast<unsigned>(dq_ctas), kDqWarps * 32, e.dq_smem, stream>>>(params);
    st = cudaGetLastError();
    if (st != cudaSuccess) return report(err, errlen, "backward dq pass launch", st);
    return 0;
  }
  e.convert_dq<<<static_cast<unsigned>(row_ctas), kRowThreads, 0, stream>>>(params);
  st = cudaGetLastError();
  if (st != cudaSuccess) return report(err, errlen, "backward dq conversion launch", st);
  return 0;
}

int bwd_kernel_info(int index, BwdKernelInfo* info, char* err, size_t errlen) {
  if (index < 0 || index >= kNumEntries) {
    if (err && errlen) snprintf(err, errlen, "no compiled backward configuration with index %d", index);
    return 1;
  }
  const Entry& e = kEntries[index];
  cudaFuncAttributes attr;
  cudaError_t st = cudaFuncGetAttributes(&attr, main_kernel(e));
  if (st != cudaSuccess) return report(err, errlen, "cudaFuncGetAttributes", st);
  st = cudaFuncSetAttribute(main_kernel(e), cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
  if (st != cudaSuccess) return report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
  int blocks = 0;
  st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, main_kernel(e), e.threads, e.smem);
  if (st != cudaSuccess) return report(err, errlen, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", st);
  info->num_regs = attr.numRegs;
  info->local_bytes = static_cast<int>(attr.localSizeBytes);
  info->smem_bytes = e.smem;
  info->max_ctas_per_sm = blocks;
  info->threads = e.threads;
  return 0;
}

}  // namespace flashwatt
