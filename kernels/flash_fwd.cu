// flashwatt attention forward: a FlashAttention-2 style kernel.
//
// fp16 / bf16 (tensor cores, sm_80+):
//   one CTA owns a tile of block_m query rows; each warp owns 16*MT of them.
//   K/V tiles of block_n rows stream through a `stages`-deep cp.async ring in
//   XOR-swizzled shared memory. S = Q K^T and O += P V run on
//   mma.sync.m16n8k16 with fp32 accumulators; operands come from ldmatrix
//   (.trans for V). The S accumulator fragment is repacked in registers as the
//   A operand of P V. Online softmax keeps the running max and sum per row in
//   base-2 units (log2(e) folded into the scale, exp2f). O and the natural-log
//   LSE are written once, O through shared memory as 16-byte stores.
// fp32: a plain FFMA kernel with the same online softmax (exact fp32 path); the
// opt-in tf32 precision runs fp32 inputs on tensor cores (flash_fwd_tf32.cuh).
//
// Causal masking is top-left or bottom-right aligned (key j visible to query i iff
// j <= i + causal_offset: causal_mask.cuh), tiles past the diagonal are skipped and
// only tiles that cross the diagonal or the ragged end of the keys are masked.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>

#include "flash_fwd.cuh"
#include "flash_fwd_tf32.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "smem_tile.cuh"
#include "tile_schedule.cuh"
#if defined(FLASHWATT_WGMMA)
#include "flash_fwd_wgmma.cuh"
#include "flash_fwd_wgmma_ws.cuh"
#include "tensor_map.cuh"
#endif

namespace flashwatt {
namespace {

// ------------------------------------------------------- tensor-core kernel

template <int D, int BM, int BN, int NW, int ST>
struct TcShape {
  static constexpr int kThreads = NW * 32;
  static constexpr int MT = BM / (16 * NW);  // 16-row m tiles per warp
  static constexpr int NT = BN / 8;          // 8-column n tiles of S
  static constexpr int DT = D / 8;           // 8-column n tiles of O
  static constexpr int KD = D / 16;          // k steps of Q K^T
  static constexpr int KN = BN / 16;         // k steps of P V
  static constexpr int CH = D / 8;           // 16-byte chunks per smem row
  // Keep Q's A fragments in registers when S, O and Q fit comfortably.
  static constexpr bool kQInRegs = (MT * BN / 2 + MT * D / 2 + MT * D / 4) <= 192;
  static constexpr int kSmemBytes = (BM + 2 * ST * BN) * (D * 2 + 16);
  static constexpr bool kSkipRescale = D >= 128;
  static_assert(BM % (16 * NW) == 0 && MT >= 1, "block_m must be a multiple of 16 * warps");
  static_assert(BN % 16 == 0, "block_n must be a multiple of 16");
  static_assert(D % 64 == 0, "head_dim must be a multiple of 64 for the swizzle");
  static_assert(ST >= 2, "at least two K/V stages");
  static_assert((BM * CH) % kThreads == 0 && (BN * CH) % kThreads == 0, "tile loads must divide evenly");
};

template <typename T, int D, int BM, int BN, int NW, int ST>
__global__ void __launch_bounds__(NW * 32, 1) flash_fwd_tc_kernel(const FwdParams p) {
  using S = TcShape<D, BM, BN, NW, ST>;
  using Ops = TypeOps<T>;
  constexpr int MT = S::MT, NT = S::NT, DT = S::DT, KD = S::KD, KN = S::KN, CH = S::CH;
  constexpr int THREADS = S::kThreads;
  constexpr bool QREG = S::kQInRegs;

  extern __shared__ __align__(128) unsigned char smem[];
  const uint32_t sQ = smem_addr(smem);
  constexpr uint32_t kKVStageBytes = BN * padded_row_bytes<D>();
  const uint32_t sK = sQ + BM * padded_row_bytes<D>();
  const uint32_t sV = sK + ST * kKVStageBytes;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;  // row within an 8-row group of a fragment
  const int t = lane & 3;   // column pair within a fragment

  // Per-lane ldmatrix coordinates (row within the 16-row block, chunk offset).
  const int a_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // A operand (Q): matrices (r0,c0),(r8,c0),(r0,c8),(r8,c8)
  const int a_chk = lane >> 4;
  const int b_row = (lane & 7) + (lane >> 4) * 8;  // B operand from K: (n0,k0),(n0,k8),(n8,k0),(n8,k8)
  const int b_chk = (lane >> 3) & 1;
  const int v_row = (lane & 7) + ((lane >> 3) & 1) * 8;  // B operand from V (trans): (k0,d0),(k8,d0),(k0,d8),(k8,d8)
  const int v_chk = lane >> 4;

  const int warp_row0 = warp * 16 * MT;
  const TileGrid<BM, BN> grid(p);
  const float scale_log2 = p.scale * kLog2e;

#pragma unroll 1
  for (int tile = blockIdx.x; tile < grid.total; tile += gridDim.x) {
    const TileWork<T> w = grid.template work<T>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const T* __restrict__ gQ = w.q;
    const T* __restrict__ gK = w.k;
    const T* __restrict__ gV = w.v;

    __syncthreads();  // the previous tile's readers of shared memory are done

    load_padded_tile<BM, D, THREADS>(sQ, gQ, p.q_sl, m0, p.len_q, tid);
    cp_async_commit();
#pragma unroll
    for (int s = 0; s < ST - 1; ++s) {
      if (s < n_tiles) {
        load_padded_tile<BN, D, THREADS>(sK + s * kKVStageBytes, gK, p.k_sl, s * BN, p.len_k, tid);
        load_padded_tile<BN, D, THREADS>(sV + s * kKVStageBytes, gV, p.v_sl, s * BN, p.len_k, tid);
      }
      cp_async_commit();
    }

    float o[MT][DT][4];
    float row_max[MT][2];
    float row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.f;
      }
      row_max[mt][0] = row_max[mt][1] = -INFINITY;
      row_sum[mt][0] = row_sum[mt][1] = 0.f;
    }
    uint32_t qf[QREG ? MT : 1][QREG ? KD : 1][4];

#pragma unroll 1
    for (int j = 0; j < n_tiles; ++j) {
      cp_async_wait<ST - 2>();
      __syncthreads();  // tile j visible to all; slot (j-1)%ST free for refill
      {
        const int jn = j + ST - 1;
        if (jn < n_tiles) {
          const int slot = jn % ST;
          load_padded_tile<BN, D, THREADS>(sK + slot * kKVStageBytes, gK, p.k_sl, jn * BN, p.len_k, tid);
          load_padded_tile<BN, D, THREADS>(sV + slot * kKVStageBytes, gV, p.v_sl, jn * BN, p.len_k, tid);
        }
        cp_async_commit();
      }
      if constexpr (QREG) {
        if (j == 0) {
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
            for (int kk = 0; kk < KD; ++kk)
              ldmatrix_x4(qf[mt][kk], sQ + padded_off<D>(warp_row0 + mt * 16 + a_row, kk * 2 + a_chk));
          }
        }
      }
      const uint32_t sKs = sK + (j % ST) * kKVStageBytes;
      const uint32_t sVs = sV + (j % ST) * kKVStageBytes;

      // ---- S = Q K^T
      float s[MT][NT][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.f;
        }
      }
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          if constexpr (QREG) {
#pragma unroll
            for (int e = 0; e < 4; ++e) a[mt][e] = qf[mt][kk][e];
          } else {
            ldmatrix_x4(a[mt], sQ + padded_off<D>(warp_row0 + mt * 16 + a_row, kk * 2 + a_chk));
          }
        }
#pragma unroll
        for (int nn = 0; nn < NT / 2; ++nn) {
          uint32_t bk[4];
          ldmatrix_x4(bk, sKs + padded_off<D>(nn * 16 + b_row, kk * 2 + b_chk));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Ops::mma(s[mt][2 * nn], a[mt], bk[0], bk[1]);
            Ops::mma(s[mt][2 * nn + 1], a[mt], bk[2], bk[3]);
          }
        }
      }

      // ---- mask the ragged end of the keys and the diagonal
      const int n0 = j * BN;
      // (Key col is visible to row iff col - causal_offset <= row: the offset goes with the
      // keys, counted afresh each step, rather than with the rows, whose loop-long sum with it
      // cost a register: kernels/NOTES.md, "Bottom-right causal alignment".)
      if (n0 + BN > p.len_k || (p.causal && n0 + BN - 1 - p.causal_offset > m0)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              const int row = m0 + warp_row0 + mt * 16 + g + (e >> 1) * 8;
              const int col = n0 + nt * 8 + 2 * t + (e & 1);
              if (col >= p.len_k || (p.causal && col - p.causal_offset > row)) s[mt][nt][e] = -INFINITY;
            }
          }
        }
      }

      // ---- online softmax (base 2)
      float alpha[MT][2];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int r = 0; r < 2; ++r)
          alpha[mt][r] = online_softmax_row<NT>([&](int nt, int e) -> float& { return s[mt][nt][2 * r + e]; },
                                                row_max[mt][r], row_sum[mt][r], scale_log2);
      }
      // Rescale O only when some row of the warp saw a new maximum (alpha != 1): after
      // the first tiles this is rare, and multiplying by 1 is exact, so skipping is too.
      bool rescale = false;
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) rescale |= (alpha[mt][0] != 1.f) | (alpha[mt][1] != 1.f);
      // At d64 the vote and branch cost more than the FMULs they save (measured), so
      // that head dim always rescales.
      if (!S::kSkipRescale || __any_sync(0xffffffffu, rescale)) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
          for (int dt = 0; dt < DT; ++dt) {
            o[mt][dt][0] *= alpha[mt][0];
            o[mt][dt][1] *= alpha[mt][0];
            o[mt][dt][2] *= alpha[mt][1];
            o[mt][dt][3] *= alpha[mt][1];
          }
        }
      }

      // ---- O += P V, P taken straight from the S accumulators
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        uint32_t pa[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          pa[mt][0] = Ops::pack(s[mt][2 * kk][0], s[mt][2 * kk][1]);
          pa[mt][1] = Ops::pack(s[mt][2 * kk][2], s[mt][2 * kk][3]);
          pa[mt][2] = Ops::pack(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
          pa[mt][3] = Ops::pack(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dd = 0; dd < DT / 2; ++dd) {
          uint32_t bv[4];
          ldmatrix_x4_trans(bv, sVs + padded_off<D>(kk * 16 + v_row, dd * 2 + v_chk));
#pragma unroll
          for (int mt = 0; mt < MT; ++mt) {
            Ops::mma(o[mt][2 * dd], pa[mt], bv[0], bv[1]);
            Ops::mma(o[mt][2 * dd + 1], pa[mt], bv[2], bv[3]);
          }
        }
      }
    }
    cp_async_wait<0>();  // only empty groups can be pending here

    // ---- epilogue: normalise, write LSE, stage O in this warp's own Q rows, store 16 B per lane
    float* lse = p.lse + static_cast<int64_t>(b * p.heads + h) * p.len_q;
    __syncwarp();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float l = quad_sum(row_sum[mt][r]);
        const float inv = l > 0.f ? 1.f / l : 0.f;
        const int lrow = warp_row0 + mt * 16 + g + r * 8;
        const int row = m0 + lrow;
        if (t == 0 && row < p.len_q) lse[row] = row_lse(row_max[mt][r], l);
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const uint32_t packed = Ops::pack(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
          const uint32_t addr = sQ + padded_off<D>(lrow, dt) + t * 4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(packed));
        }
      }
    }
    __syncwarp();
    // The same loop as store_o_rows (flash_fwd_wgmma.cuh) over the padded layout; one helper
    // for both changed the PTX of 30 kernels, these among them, so each keeps its own.
    T* gO = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
    constexpr int WROWS = 16 * MT;
#pragma unroll
    for (int it = 0; it < WROWS * CH / 32; ++it) {
      const int idx = lane + it * 32;
      const int r = idx / CH;
      const int c = idx % CH;
      const int row = m0 + warp_row0 + r;
      uint4 val;
      asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                   : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                   : "r"(sQ + padded_off<D>(warp_row0 + r, c)));
      if (row < p.len_q) st_global_v4(gO + static_cast<int64_t>(row) * p.o_sl + c * 8, val);
    }
  }
}

// ------------------------------------------------------------- fp32 kernel

constexpr int kF32BM = 64;
constexpr int kF32BN = 32;
constexpr int kF32Threads = 256;  // 4 threads per query row

template <int D>
struct F32Shape {
  static constexpr int kSmemFloats = kF32BM * (D + 1) + kF32BN * (D + 1) + kF32BN * D + kF32BM * (kF32BN + 1);
  static constexpr int kSmemBytes = kSmemFloats * 4;
};

// Two CTAs per SM up to head dim 128 (128 registers a thread), as it ran before the causal
// offset, with which ptxas took up to 155 registers (one CTA) for the same code, unasked.
template <int D>
__global__ void __launch_bounds__(kF32Threads, D <= 128 ? 2 : 1) flash_fwd_f32_kernel(const FwdParams p) {
  constexpr int BM = kF32BM, BN = kF32BN, DP = D + 1, PP = BN + 1;
  constexpr int NC = BN / 4;  // score columns per thread
  constexpr int OC = D / 4;   // output columns per thread
  extern __shared__ __align__(16) float fsm[];
  float* sQ = fsm;
  float* sK = sQ + BM * DP;
  float* sV = sK + BN * DP;
  float* sP = sV + BN * D;

  const int tid = threadIdx.x;
  const int r = tid >> 2;
  const int c = tid & 3;
  const TileGrid<BM, BN> grid(p);
  const float scale_log2 = p.scale * kLog2e;

#pragma unroll 1
  for (int tile = blockIdx.x; tile < grid.total; tile += gridDim.x) {
    const TileWork<float> w = grid.template work<float>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const float *gQ = w.q, *gK = w.k, *gV = w.v;

    __syncthreads();
    for (int idx = tid; idx < BM * D; idx += kF32Threads) {
      const int rr = idx / D, d = idx % D;
      const int row = m0 + rr;
      sQ[rr * DP + d] = row < p.len_q ? gQ[static_cast<int64_t>(row) * p.q_sl + d] : 0.f;
    }
    float o[OC];
#pragma unroll
    for (int i = 0; i < OC; ++i) o[i] = 0.f;
    float m_run = -INFINITY, l_run = 0.f;
    const int row = m0 + r;

#pragma unroll 1
    for (int j = 0; j < n_tiles; ++j) {
      const int n0 = j * BN;
      __syncthreads();
      for (int idx = tid; idx < BN * D; idx += kF32Threads) {
        const int rr = idx / D, d = idx % D;
        const int key = n0 + rr;
        const bool ok = key < p.len_k;
        sK[rr * DP + d] = ok ? gK[static_cast<int64_t>(key) * p.k_sl + d] : 0.f;
        sV[rr * D + d] = ok ? gV[static_cast<int64_t>(key) * p.v_sl + d] : 0.f;
      }
      __syncthreads();
      float s[NC];
#pragma unroll
      for (int i = 0; i < NC; ++i) s[i] = 0.f;
#pragma unroll 8
      for (int d = 0; d < D; ++d) {
        const float qd = sQ[r * DP + d];
#pragma unroll
        for (int i = 0; i < NC; ++i) s[i] = fmaf(qd, sK[(c + 4 * i) * DP + d], s[i]);
      }
      // The online softmax step written out rather than online_softmax_row: this kernel
      // must stay exact to 1e-5, so exp2f instead of ex2.approx.ftz, and each thread holds
      // every 4th column of its row, with P going to shared memory, not fragment pairs.
      float cur = -INFINITY;
#pragma unroll
      for (int i = 0; i < NC; ++i) {
        const int col = n0 + c + 4 * i;
        if (col >= p.len_k || (p.causal && col - p.causal_offset > row)) s[i] = -INFINITY;
        cur = fmaxf(cur, s[i]);
      }
      cur = quad_max(cur);
      const float m_new = fmaxf(m_run, cur * scale_log2);
      const float m_sub = (m_new == -INFINITY) ? 0.f : m_new;
      const float alpha = exp2f(m_run - m_sub);
      m_run = m_new;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < NC; ++i) {
        const float pv = exp2f(fmaf(s[i], scale_log2, -m_sub));
        sum += pv;
        sP[r * PP + c + 4 * i] = pv;
      }
      l_run = l_run * alpha + quad_sum(sum);
#pragma unroll
      for (int i = 0; i < OC; ++i) o[i] *= alpha;
      __syncwarp();  // the 4 threads of a row are in one warp
#pragma unroll 4
      for (int jj = 0; jj < BN; ++jj) {
        const float pj = sP[r * PP + jj];
#pragma unroll
        for (int i = 0; i < OC; ++i) o[i] = fmaf(pj, sV[jj * D + c + 4 * i], o[i]);
      }
    }
    if (row < p.len_q) {
      const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
      float* gO = static_cast<float*>(p.o) + b * p.o_sb + h * p.o_sh + static_cast<int64_t>(row) * p.o_sl;
#pragma unroll
      for (int i = 0; i < OC; ++i) gO[c + 4 * i] = o[i] * inv;
      if (c == 0)
        p.lse[static_cast<int64_t>(b * p.heads + h) * p.len_q + row] = row_lse(m_run, l_run);
    }
  }
}

// ------------------------------------------------------------ config table

using KernelFn = void (*)(const FwdParams);

struct Entry {
  FwdConfig cfg;
  KernelFn fn;
  int smem;
  int threads;
  bool persistent = false;  // grid of one CTA per SM when no cap is given
  KernelFn fn_tma = nullptr;  // the same kernel with TMA copies (warp-specialised kernels)
};

template <typename T, int D, int BM, int BN, int NW, int ST>
constexpr Entry tc_entry(int dtype) {
  return Entry{FwdConfig{kMmaSync, dtype, D, BM, BN, NW, ST, kLockstep}, &flash_fwd_tc_kernel<T, D, BM, BN, NW, ST>,
               TcShape<D, BM, BN, NW, ST>::kSmemBytes, NW * 32};
}

#if defined(FLASHWATT_WGMMA)
template <typename T, int D, int BN, int NWG, int ST, bool PP>
constexpr Entry wg_entry(int dtype) {
  using S = WgShape<D, BN, NWG, ST, PP>;
  return Entry{FwdConfig{kWgmma, dtype, D, S::BM, BN, NWG * 4, ST, PP ? kPingPong : kLockstep},
               &flash_fwd_wgmma_kernel<T, D, BN, NWG, ST, PP>,
               S::kSmemBytes, S::kThreads};
}

// Warp-specialised: NWG consumer warpgroups (64 q rows each) + 1 producer warpgroup.
template <typename T, int D, int BN, int NWG, int ST, bool PP>
constexpr Entry ws_entry(int dtype) {
  using S = WsShape<D, BN, NWG, ST, PP>;
  return Entry{FwdConfig{kWgmma, dtype, D, S::BM, BN, S::kThreads / 32, ST, PP ? kWarpSpecializedPingPong : kWarpSpecialized},
               &flash_fwd_wgmma_ws_kernel<T, D, BN, NWG, ST, PP, false>, S::kSmemBytes, S::kThreads, true,
               &flash_fwd_wgmma_ws_kernel<T, D, BN, NWG, ST, PP, true>};
}
#endif

template <int D>
constexpr Entry f32_entry() {
  return Entry{FwdConfig{kFfma, kFp32, D, kF32BM, kF32BN, kF32Threads / 32, 1, kLockstep}, &flash_fwd_f32_kernel<D>,
               F32Shape<D>::kSmemBytes, kF32Threads};
}

template <int D>
constexpr Entry tf32_entry() {
  return Entry{FwdConfig{kMmaTf32, kFp32, D, kT32BM, kT32BN, kT32Threads / 32, 2, kLockstep}, &flash_fwd_tf32_kernel<D>,
               T32Shape<D>::kSmemBytes, kT32Threads};
}

// The named variants of src/flashwatt/kernels/custom_variants.py map onto these rows.
#define FLASHWATT_TC_CONFIGS(T, DT)                                                                \
  tc_entry<T, 64, 128, 64, 4, 2>(DT), tc_entry<T, 64, 128, 64, 4, 3>(DT), tc_entry<T, 64, 64, 64, 4, 2>(DT),  \
      tc_entry<T, 64, 128, 64, 8, 2>(DT), tc_entry<T, 128, 128, 32, 4, 2>(DT), tc_entry<T, 128, 128, 32, 4, 3>(DT),         \
      tc_entry<T, 128, 128, 48, 4, 2>(DT),                                                                   \
      tc_entry<T, 128, 128, 64, 8, 2>(DT), tc_entry<T, 128, 64, 64, 4, 2>(DT),                              \
      tc_entry<T, 256, 64, 32, 4, 2>(DT), tc_entry<T, 256, 64, 64, 4, 2>(DT)

// Hopper (sm_90a builds): wgmma tiles, rows of Q = 64 per warpgroup; lockstep, then ping-pong,
// then warp-specialised (free-running consumers, then ping-pong consumers).
#define FLASHWATT_WGMMA_CONFIGS(T, DT)                                                                      \
  wg_entry<T, 64, 128, 2, 2, false>(DT), wg_entry<T, 64, 128, 2, 3, false>(DT),                             \
      wg_entry<T, 64, 64, 2, 3, false>(DT), wg_entry<T, 128, 128, 2, 2, false>(DT),                         \
      wg_entry<T, 128, 128, 2, 3, false>(DT), wg_entry<T, 128, 64, 2, 3, false>(DT),                        \
      wg_entry<T, 128, 64, 3, 2, false>(DT), wg_entry<T, 64, 128, 2, 3, true>(DT),                          \
      wg_entry<T, 64, 128, 2, 4, true>(DT), wg_entry<T, 128, 128, 2, 3, true>(DT),                          \
      wg_entry<T, 128, 64, 2, 4, true>(DT),                                                                 \
      ws_entry<T, 64, 128, 2, 2, false>(DT), ws_entry<T, 128, 128, 2, 2, false>(DT),                        \
      ws_entry<T, 64, 128, 2, 2, true>(DT), ws_entry<T, 128, 128, 2, 2, true>(DT),                          \
      ws_entry<T, 64, 128, 2, 3, true>(DT), ws_entry<T, 128, 64, 2, 4, true>(DT),                           \
      ws_entry<T, 64, 128, 3, 2, false>(DT), ws_entry<T, 64, 128, 3, 2, true>(DT)

const Entry kEntries[] = {
    FLASHWATT_TC_CONFIGS(__half, kFp16),
    FLASHWATT_TC_CONFIGS(__nv_bfloat16, kBf16),
    f32_entry<64>(),
    f32_entry<128>(),
    f32_entry<256>(),
    tf32_entry<64>(),
    tf32_entry<128>(),  // d256 would need 128 O registers per thread on top: it spills
#if defined(FLASHWATT_WGMMA)
    FLASHWATT_WGMMA_CONFIGS(__half, kFp16),
    FLASHWATT_WGMMA_CONFIGS(__nv_bfloat16, kBf16),
#endif
};
constexpr int kNumEntries = sizeof(kEntries) / sizeof(kEntries[0]);

int report(char* err, size_t errlen, const char* what, cudaError_t code) {
  if (err && errlen) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(code));
  return static_cast<int>(code) ? static_cast<int>(code) : 1;
}

#if defined(FLASHWATT_WGMMA)
static_assert(sizeof(CUtensorMap) == sizeof(FwdTensorMaps::q) && alignof(FwdTensorMaps) >= alignof(CUtensorMap),
              "FwdTensorMaps holds CUtensorMaps");

// The tensor maps of q, k and v for configuration `e`.
bool encode_tensor_maps(const Entry& e, FwdParams& p, char* why, size_t whylen) {
  // Boxes of [tile rows, 64] 16-bit elements: one per 64 columns of a tile (tma_load_tile).
  const int d = e.cfg.head_dim;
  const CUtensorMapDataType type =
      e.cfg.dtype == kBf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return encode_map_4d(p.maps.q, "q", type, 2, p.q, d, p.len_q, p.heads, p.batch, p.q_sl, p.q_sh, p.q_sb, 64,
                       e.cfg.block_m, why, whylen) &&
         encode_map_4d(p.maps.k, "k", type, 2, p.k, d, p.len_k, p.kv_heads, p.batch, p.k_sl, p.k_sh, p.k_sb, 64,
                       e.cfg.block_n, why, whylen) &&
         encode_map_4d(p.maps.v, "v", type, 2, p.v, d, p.len_k, p.kv_heads, p.batch, p.v_sl, p.v_sh, p.v_sb, 64,
                       e.cfg.block_n, why, whylen);
}
#endif

}  // namespace

int fwd_num_configs() { return kNumEntries; }

FwdConfig fwd_config(int index) { return kEntries[index].cfg; }

int fwd_find_config(int math, int dtype, int head_dim, int block_m, int block_n, int warps, int stages, int schedule) {
  for (int i = 0; i < kNumEntries; ++i) {
    const FwdConfig& c = kEntries[i].cfg;
    if (c.math == math && c.dtype == dtype && c.head_dim == head_dim && c.block_m == block_m && c.block_n == block_n &&
        c.warps == warps && c.stages == stages && c.schedule == schedule)
      return i;
  }
  return -1;
}

int fwd_launch(int index, const FwdParams& params, void* stream, char* err, size_t errlen) {
  if (index < 0 || index >= kNumEntries) {
    if (err && errlen) snprintf(err, errlen, "no compiled configuration with index %d", index);
    return 1;
  }
  const Entry& e = kEntries[index];
  // The kernel and its parameters: with TMA copies, a copy of the parameters that carries
  // the tensor maps.
  KernelFn fn = e.fn;
  const FwdParams* args = &params;
  if (params.copies == kCopiesTma && e.fn_tma == nullptr) {
    if (err && errlen)
      snprintf(err, errlen, "TMA copies need a warp-specialised configuration (an sm_90a build); index %d is not one",
               index);
    return 1;
  }
#if defined(FLASHWATT_WGMMA)
  FwdParams with_maps;
  if (e.fn_tma != nullptr && params.copies != kCopiesThreads) {
    with_maps = params;
    char why[256] = {0};
    if (encode_tensor_maps(e, with_maps, why, sizeof(why))) {
      fn = e.fn_tma;
      args = &with_maps;
    } else if (params.copies == kCopiesTma) {
      if (err && errlen) snprintf(err, errlen, "TMA copies: %s", why);
      return 1;
    }
  }
#endif
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return report(err, errlen, "cudaGetDevice", st);
  // Raising the dynamic shared-memory limit is per device and kernel; remember which are done.
  static unsigned long long configured[kNumEntries][2] = {};
  const unsigned long long bit = 1ull << (device & 63);
  unsigned long long& done = configured[index][fn == e.fn ? 0 : 1];
  if (!(done & bit)) {
    st = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
    if (st != cudaSuccess) return report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
    done |= bit;
  }
  const long long tiles =
      static_cast<long long>((params.len_q + e.cfg.block_m - 1) / e.cfg.block_m) * params.batch * params.heads;
  long long grid = tiles;
  if (params.grid_cap > 0 && grid > params.grid_cap) grid = params.grid_cap;
  if (params.grid_cap <= 0 && e.persistent) {
    // One CTA per SM (these kernels fit one per SM); the multiprocessor count per device, looked up once.
    static int sm_count[64] = {};
    int& sms = sm_count[device & 63];
    if (sms == 0) {
      st = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (st != cudaSuccess) return report(err, errlen, "cudaDeviceGetAttribute(multiprocessor count)", st);
    }
    if (grid > sms) grid = sms;
  }
  if (grid > 0x7fffffffLL) grid = 0x7fffffffLL;
  if (grid <= 0) return 0;
  fn<<<static_cast<unsigned>(grid), e.threads, e.smem, static_cast<cudaStream_t>(stream)>>>(*args);
  st = cudaGetLastError();
  if (st != cudaSuccess) return report(err, errlen, "kernel launch", st);
  return 0;
}

int fwd_kernel_info(int index, FwdKernelInfo* info, char* err, size_t errlen) {
  if (index < 0 || index >= kNumEntries) {
    if (err && errlen) snprintf(err, errlen, "no compiled configuration with index %d", index);
    return 1;
  }
  const Entry& e = kEntries[index];
  cudaFuncAttributes attr;
  cudaError_t st = cudaFuncGetAttributes(&attr, e.fn);
  if (st != cudaSuccess) return report(err, errlen, "cudaFuncGetAttributes", st);
  st = cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
  if (st != cudaSuccess) return report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
  int blocks = 0;
  st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, e.fn, e.threads, e.smem);
  if (st != cudaSuccess) return report(err, errlen, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", st);
  info->num_regs = attr.numRegs;
  info->local_bytes = static_cast<int>(attr.localSizeBytes);
  info->smem_bytes = e.smem;
  info->max_ctas_per_sm = blocks;
  info->threads = e.threads;
  return 0;
}

}  // namespace flashwatt
