// flashwatt attention forward on Hopper (sm_90a): wgmma.
//
// One CTA owns 64*NWG query rows, one warpgroup (4 warps) per 64 of them. K and V
// tiles of BN rows stream through ST-deep cp.async rings. Shared-memory tiles use the
// wgmma 128-byte swizzle: a [rows, D] tile is D/64 column blocks of [rows, 64]; row r of
// a block sits at r*128 bytes and its 16-byte chunk c at position c ^ (r % 8).
//   S = Q K^T   wgmma, A (Q) and B (K) from shared memory, both K-major.
//   O += P V    wgmma, A (P) from registers: the S accumulators rounded to 16 bits are
//               already in the A-fragment layout; B (V) from shared memory, N-major.
// Software pipelining as in FlashAttention-3: S_j = Q K_j^T is issued together with
// O += P_{j-1} V_{j-1}, so that the softmax of S_j can run while that P V is in flight.
// (ptxas 13.0 schedules the final wait ahead of the exponentials, kernels/NOTES.md v4:
// the tensor cores are then kept busy by the other warpgroup's wgmma instead.)
// Two schedules of the warpgroups (PP):
//   lockstep   every warpgroup issues its wgmma right after the barrier that publishes
//              K_j, V_{j-1}; all then run their softmax at the same time, while the
//              tensor cores wait.
//   ping-pong  odd warpgroups run half an iteration behind: they issue tile j's wgmma
//              after finishing tile j-1's softmax, and wait for it after the next
//              barrier. Their softmax runs under the even warpgroups' wgmma and the
//              other way round (FlashAttention-3's ping-pong, here from the phase shift
//              alone). A lagging warpgroup reads a K/V slot one barrier longer, so the
//              ring prefetches one tile less for the same stages.
// Online softmax in base 2 with log2(e) folded into the scale, as the mma.sync kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flash_fwd.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"

namespace flashwatt {
namespace {

template <int D, int BN, int NWG, int ST, bool PP>
struct WgShape {
  static constexpr int BM = 64 * NWG;
  static constexpr int kThreads = 128 * NWG;
  static constexpr int kQBytes = BM * D * 2;
  static constexpr int kTileBytes = BN * D * 2;  // one K or V stage
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = kQBytes + 2 * ST * kTileBytes + 1024;
  static constexpr int SN = BN / 2;  // S accumulator registers per thread
  static constexpr int ON = D / 2;   // O accumulator registers per thread
  static_assert(D == 64 || D == 128, "wgmma kernel: head_dim 64 or 128");
  static_assert(BN == 64 || BN == 128, "wgmma kernel: block_n 64 or 128");
  static_assert(ST >= (PP ? 3 : 2), "wgmma kernel: at least two stages, three for ping-pong");
  // K/V tiles loaded ahead of the one being published (module comment).
  static constexpr int kAhead = PP ? ST - 2 : ST - 1;
};

// Byte offset of 16-byte chunk c (of D/8 per row) of row r in a swizzled [ROWS, D] tile.
template <int ROWS>
__device__ __forceinline__ uint32_t sw128_off(int r, int c) {
  return static_cast<uint32_t>((c >> 3) * ROWS * 128 + r * 128 + (((c & 7) ^ (r & 7)) << 4));
}

// Copies rows [row0, row0 + ROWS) of a [rows, D] global tile into a swizzled smem tile;
// rows at or past row_end, and with BELOW_ZERO rows below 0 (row0 < 0), are zero-filled.
// Each thread moves the same 16-byte column chunk of rows r0, r0 + RSTEP, ...; RSTEP is a
// multiple of 8, so the swizzle of every row a thread touches is the same and each address
// is a base plus an immediate.
template <int ROWS, int D, int THREADS, bool BELOW_ZERO = false, typename T>
__device__ __forceinline__ void load_tile_sw128(uint32_t dst, const T* __restrict__ src, int64_t row_stride,
                                                int row0, int row_end, int tid) {
  constexpr int CH = D / 8;
  constexpr int RSTEP = THREADS / CH;
  constexpr int ITERS = (ROWS + RSTEP - 1) / RSTEP;
  static_assert(THREADS % CH == 0 && RSTEP % 8 == 0, "tile loads: rows per step must be a multiple of 8");
  const int r0 = tid / CH;
  const int c = tid % CH;
  const T* g = src + static_cast<int64_t>(row0 + r0) * row_stride + c * 8;
  const int64_t step = static_cast<int64_t>(RSTEP) * row_stride;
  const uint32_t d0 = dst + sw128_off<ROWS>(r0, c);
  int rows_left = row_end - row0 - r0;
#pragma unroll
  for (int it = 0; it < ITERS; ++it) {
    if (ROWS % RSTEP == 0 || r0 + it * RSTEP < ROWS) {
      const bool ok = rows_left > 0 && (!BELOW_ZERO || row0 + r0 + it * RSTEP >= 0);
      cp_async16(d0 + it * RSTEP * 128, ok ? g : src, ok ? 16 : 0);
    }
    g += step;
    rows_left -= RSTEP;
  }
}

// The epilogue of one warp's 16 query rows (warp_row0 ..) of a BM-row work item at m0
// (rows at or past len_q not stored, nor with BELOW_ZERO rows below 0: m0 < 0 where
// causal blocks end at len_q):
// O normalised by the row sums, the rows' LSE, and O staged through the warp's own rows of
// the swizzled Q tile at sq (whose only readers, this warpgroup's S wgmma, are done) so
// that it leaves in 16-byte stores, one row chunk per lane.
template <typename T, int D, int BM, bool BELOW_ZERO = false>
__device__ __forceinline__ void store_o_rows(const FwdParams& p, const float (&o)[D / 2], const float (&row_max)[2],
                                             const float (&row_sum)[2], uint32_t sq, int b, int h, int m0,
                                             int warp_row0, int lane) {
  using Ops = TypeOps<T>;
  constexpr int CH = D / 8;  // 16-byte chunks per row
  const int g = lane >> 2;
  const int t = lane & 3;
  float* lse = p.lse + static_cast<int64_t>(b * p.heads + h) * p.len_q;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const float l = quad_sum(row_sum[r]);
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int lrow = warp_row0 + g + r * 8;
    const int row = m0 + lrow;
    if (t == 0 && row < p.len_q && (!BELOW_ZERO || row >= 0)) lse[row] = row_lse(row_max[r], l);
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      const uint32_t packed = Ops::pack(o[4 * dt + 2 * r] * inv, o[4 * dt + 2 * r + 1] * inv);
      asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(sq + sw128_off<BM>(lrow, dt) + t * 4), "r"(packed));
    }
  }
  __syncwarp();
  T* gO = static_cast<T*>(p.o) + b * p.o_sb + h * p.o_sh;
#pragma unroll
  for (int it = 0; it < 16 * CH / 32; ++it) {
    const int idx = lane + it * 32;
    const int r = idx / CH;
    const int c = idx % CH;
    const int row = m0 + warp_row0 + r;
    uint4 val;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                 : "r"(sq + sw128_off<BM>(warp_row0 + r, c)));
    if (row < p.len_q && (!BELOW_ZERO || row >= 0)) st_global_v4(gO + static_cast<int64_t>(row) * p.o_sl + c * 8, val);
  }
}

template <typename T, int D, int BN, int NWG, int ST, bool PP>
__global__ void __launch_bounds__(NWG * 128, 1) flash_fwd_wgmma_kernel(const FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WgShape<D, BN, NWG, ST, PP>;
  using Ops = TypeOps<T>;
  constexpr int BM = S::BM, THREADS = S::kThreads, SN = S::SN, ON = S::ON, AHEAD = S::kAhead;
  constexpr int KD = D / 16;   // k steps of Q K^T
  constexpr int KN = BN / 16;  // k steps of P V

  extern __shared__ unsigned char smem[];
  const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sK = sQ + S::kQBytes;
  const uint32_t sV = sK + ST * S::kTileBytes;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;           // warpgroup: query rows wg*64 .. wg*64+63
  const int wl = (tid >> 5) & 3;     // warp within the warpgroup: 16 of those rows
  const int lane = tid & 31;
  const int g = lane >> 2;           // row within an 8-row group of a fragment
  const int t = lane & 3;            // column pair within a fragment
  const int warp_row0 = wg * 64 + wl * 16;
  const bool lagging = PP && (wg & 1);  // warpgroup-uniform

  const TileGrid<BM, BN> grid(p);
  const float scale_log2 = p.scale * kLog2e;

  // Descriptor addresses: Q rows of this warpgroup; k step kk is column block kk/4 at
  // byte kk%4 * 32 of the swizzled row (the hardware applies the XOR to the address).
  const uint32_t q_base = sQ + wg * 64 * 128;

#pragma unroll 1
  for (int tile = blockIdx.x; tile < grid.total; tile += gridDim.x) {
    const TileWork<T> w = grid.template work<T>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const T* __restrict__ gQ = w.q;
    const T* __restrict__ gK = w.k;
    const T* __restrict__ gV = w.v;

    __syncthreads();  // the previous tile's readers of shared memory are done

    // Group i holds K_i and V_{i-1}. The prologue issues groups 0 .. AHEAD-1; the barrier
    // B_j that publishes group j (K_j, V_{j-1}) then issues group j + AHEAD into the slots
    // that every warpgroup has finished reading. Loads are not guarded by branches: rows
    // at or past kv_rows are zero-filled without a global read, so a lagging warpgroup
    // can pass a barrier between its wgmma and the wait for it (a branch there would make
    // ptxas wait for the wgmma first).
    const int kv_rows = min(p.len_k, n_tiles * BN);
    load_tile_sw128<BM, D, THREADS>(sQ, gQ, p.q_sl, m0, p.len_q, tid);
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      load_tile_sw128<BN, D, THREADS>(sK + i * S::kTileBytes, gK, p.k_sl, i * BN, kv_rows, tid);
      if (i >= 1) load_tile_sw128<BN, D, THREADS>(sV + (i - 1) * S::kTileBytes, gV, p.v_sl, (i - 1) * BN, kv_rows, tid);
      cp_async_commit();
    }

    float o[ON];
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    float s[SN];
    uint32_t pf[KN][4];

    // Barrier B_j: wait for group j (K_j, V_{j-1}), publish it, refill the freed slots.
    auto next_tile = [&](int j) {
      cp_async_wait<AHEAD - 1>();
      fence_proxy_async_smem();
      __syncthreads();  // K_j, V_{j-1} visible to all; the slots refilled below are free
      const int jk = j + AHEAD;
      load_tile_sw128<BN, D, THREADS>(sK + (jk % ST) * S::kTileBytes, gK, p.k_sl, jk * BN, kv_rows, tid);
      load_tile_sw128<BN, D, THREADS>(sV + ((jk - 1) % ST) * S::kTileBytes, gV, p.v_sl, (jk - 1) * BN, kv_rows, tid);
      cp_async_commit();
    };
    auto issue_s = [&](int j) {  // S_j = Q K_j^T
      const uint32_t k_base = sK + (j % ST) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const uint32_t off = (kk & 3) * 32;
        const uint64_t da = wgmma_desc_sw128(q_base + (kk >> 2) * BM * 128 + off, 16, 1024);
        const uint64_t db = wgmma_desc_sw128(k_base + (kk >> 2) * BN * 128 + off, 16, 1024);
        wgmma_ss(s, da, db, kk > 0 ? 1 : 0, T{});
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int j) {  // O += P_j V_j
      const uint32_t v_base = sV + (j % ST) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < KN; ++kk)
        wgmma_rs(o, pf[kk], wgmma_desc_sw128(v_base + kk * 16 * 128, BN * 128, 1024), 1, T{});
      wgmma_commit();
    };
    // Masks S_j (where kMask), updates the running max and sum, turns S_j into
    // unnormalised P in place (fp32) and returns the factor that rescales what O held
    // before this tile.
    auto softmax = [&](int j, float (&alpha)[2], auto mask) {
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
        alpha[r] = online_softmax_row<BN / 8>([&](int nt, int e) -> float& { return s[4 * nt + 2 * r + e]; },
                                              row_max[r], row_sum[r], scale_log2);
    };
    auto pack_p = [&]() {  // the S accumulator layout is the A-fragment layout of P V
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        pf[kk][0] = Ops::pack(s[8 * kk + 0], s[8 * kk + 1]);
        pf[kk][1] = Ops::pack(s[8 * kk + 2], s[8 * kk + 3]);
        pf[kk][2] = Ops::pack(s[8 * kk + 4], s[8 * kk + 5]);
        pf[kk][3] = Ops::pack(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };

    // Tile 0 alone (no P V in flight yet), so that the loop body has no wgmma in a branch:
    // ptxas serialises wgmma it cannot track across branches.
    auto first = [&](bool lag) {
      float alpha[2];
      next_tile(0);
      wgmma_fence();
      issue_s(0);
      if (lag) next_tile(1);  // the lagging warpgroup waits for S_0 after B_1
      wgmma_wait<0>();
      fence_regs(s);
      softmax(0, alpha, std::true_type{});
      pack_p();
    };
    // Iteration j >= 1: S_j is issued with P_{j-1} V_{j-1}, meant to let the softmax of
    // S_j run while that P V is in flight (ptxas 13.0 places the P V wait before the
    // exponentials, and pinning it after them measured ~3 % slower: kernels/NOTES.md, v5
    // and v7). The tiles that need no mask for any row of
    // this CTA (all K rows present, all at or left of the diagonal) run in a loop of their
    // own, without the mask test and its branch. A leading warpgroup passes B_j before its
    // wgmma, a lagging one B_{j+1} after them.
    auto step = [&](int j, auto mask, bool lag) {
      float alpha[2];
      if (!lag) next_tile(j);
      wgmma_fence();
      issue_s(j);
      issue_pv(j - 1);
      if (lag) next_tile(j + 1);
      wgmma_wait<1>();  // S_j is done; P_{j-1} V_{j-1} may still run
      fence_regs(s);
      softmax(j, alpha, mask);
      wgmma_wait<0>();  // P_{j-1} V_{j-1} is done: O and P may be touched again
      fence_regs(o);
      fence_regs(pf);
#pragma unroll
      for (int i = 0; i < ON; ++i) o[i] *= alpha[(i >> 1) & 1];
      pack_p();
    };
    // Tiles whose every key the CTA's first row sees (<= 0 where it sees no whole tile).
    const int n_clean = min(n_tiles, p.causal ? min(p.len_k, m0 + 1 + p.causal_offset) / BN : p.len_k / BN);
    // Each role runs its own copy of the loops (role is warpgroup-uniform and constant, so
    // no branch lies inside a loop). Both pass B_0 .. B_n: n_tiles + 1 barriers.
    auto tiles = [&](auto lag_tag) {
      constexpr bool lag = decltype(lag_tag)::value;
      first(lag);
#pragma unroll 1
      for (int j = 1; j < n_clean; ++j) step(j, std::false_type{}, lag);
#pragma unroll 1
      for (int j = max(1, n_clean); j < n_tiles; ++j) step(j, std::true_type{}, lag);
      if (!lag) {  // B_n: V of the last tile; the lagging warpgroup passed it in its last step
        cp_async_wait<0>();
        fence_proxy_async_smem();
        __syncthreads();
      }
    };
    if (lagging)
      tiles(std::true_type{});
    else
      tiles(std::false_type{});

    // ---- O += P V of the last tile
    wgmma_fence();
    issue_pv(n_tiles - 1);
    wgmma_wait<0>();
    fence_regs(o);
    cp_async_wait<0>();  // the lagging warpgroup's zero-fill group issued at B_n, before the slots are reused

    // ---- epilogue
    store_o_rows<T, D, BM>(p, o, row_max, row_sum, sQ, b, h, m0, warp_row0, lane);
  }
#else
  __trap();  // built without sm_90a: never launched (the launch table only lists it for sm_90a builds)
#endif
}

}  // namespace
}  // namespace flashwatt
