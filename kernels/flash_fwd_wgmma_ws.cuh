// flashwatt attention forward on Hopper (sm_90a): warp-specialised, persistent wgmma kernel.
//
// Why (kernels/NOTES.md, v6): at L = 1024 a CTA of flash_fwd_wgmma.cuh visits only 8-16
// K/V tiles. Each CTA first loads Q and the first K/V tiles with nothing to compute
// (one CTA per SM: the SM idles), then drains its pipeline and stores O while no load
// for the next query tile is in flight; every K/V tile costs a CTA-wide barrier in which
// the compute warps also issue and wait for their own cp.async. Here:
//   * warpgroup 0 is a producer: it only copies into shared-memory rings and signals each
//     copy's completion on an mbarrier, either with TMA from one thread (the tensor
//     memory accelerator moves a whole tile and completes its bytes on the barrier;
//     kernels/NOTES.md, "TMA copies") or with cp.async, 16 B per thread of all 128
//     (cp.async.mbarrier.arrive.noinc); it gives its registers to the consumers
//     (setmaxnreg: 24 for the producer, 240 for each of two consumers; 32 and 160 with three).
//   * warpgroups 1 .. NWG are consumers, 64 query rows each, as the wgmma kernel: S_j = Q K_j^T
//     issued with O += P_{j-1} V_{j-1}, P straight from the S registers. They wait on the
//     "full" mbarrier of the slot they read and release it on its "empty" mbarrier once
//     the wgmma that read it has completed; no CTA-wide barrier in the loop.
//   * the grid is persistent (one CTA per SM, longest causal items first as everywhere):
//     a CTA's first item is blockIdx.x, the next ones strided by gridDim.x or, with a
//     tile counter (FwdParams::tile_counter: causal items of unequal length), the next one
//     no CTA has taken, fetched by the producer as it frees up. The producer publishes each
//     item's index beside its Q buffer with that buffer's q_full mbarrier, and an index of
//     -1 stops the consumers. K and V slots form one ring across work items
//     and Q is double-buffered, so the producer loads the next item's Q and first K/V
//     tiles while the consumers finish the current one and store its O.
//   * ping-pong (PP): the consumers take turns to issue their wgmma, ordered by one named
//     barrier each (FlashAttention-3), so one consumer's softmax runs under the others'
//     GEMMs. Without PP they run free.
// K and V have separate rings (ST slots each) with their own barriers, so S_j can start
// as soon as K_j has landed, before V_j.
//
// Barrier phases: slot s of a ring is used for the ring's tiles u = s, s + ST, s + 2 ST, ...
// (u counts tiles over all work items of the CTA). Use n = u / ST of the slot completes
// phase n of its full barrier (the producer's 128 cp.async arrivals, or its one TMA
// arrival with the tile's bytes) and phase n of its
// empty barrier (128 arrivals per consumer). Consumers wait full with parity n & 1; the
// producer, before filling use n, waits for phase n - 1 of empty: parity (n & 1) ^ 1, which
// for n = 0 (a fresh barrier in phase 0) returns at once. Q buffers likewise by work item,
// their full barrier with one more arrival: the producer's thread 0 publishing the index.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "async_pipeline.cuh"
#include "flash_fwd.cuh"
#include "flash_fwd_wgmma.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"

namespace flashwatt {
namespace {

// ------------------------------------------------------------------------------ kernel

template <int D, int BN, int NWG_, int ST, bool PP>
struct WsShape {
  static constexpr int NWG = NWG_;  // consumer warpgroups, 64 q rows each
  static constexpr int BM = 64 * NWG;
  static constexpr int kThreads = 128 * (NWG + 1);  // + the producer warpgroup
  static constexpr int kQBytes = BM * D * 2;         // one of two Q buffers
  static constexpr int kTileBytes = BN * D * 2;      // one K or V slot
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = 2 * kQBytes + 2 * ST * kTileBytes + 1024;
  static constexpr int SN = BN / 2;
  static constexpr int ON = D / 2;
  // setmaxnreg (multiples of 8, the whole file of 65536 at most): two consumers 240 each
  // beside a producer of 24 (the launch gives each of the 384 threads 168); three consumers
  // 160 each beside a producer of 32 (512 threads, 128 each at launch), FlashAttention-3's
  // split. At 160 a consumer holds S (BN / 2), O (D / 2) and P (BN / 4) registers, which
  // fit with D * BN <= 64 * 128 (the built three-consumer tiles: head dim 64, BN 128).
  static constexpr int kProducerRegs = NWG == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = NWG == 2 ? 240 : 160;
  // Barriers: Q full/empty x 2 buffers, K full/empty x ST, V full/empty x ST.
  static constexpr int kBarriers = 4 + 4 * ST;
  // Named barrier of the producer warpgroup alone (the consumers' turns take 1 .. NWG).
  static constexpr int kProducerBarrier = 8;
  static_assert(NWG == 2 || (NWG == 3 && D * BN <= 64 * 128), "warp-specialised kernel: 3 consumers need D * BN <= 64 * 128");
  static_assert(D == 64 || D == 128, "wgmma kernel: head_dim 64 or 128");
  static_assert(BN == 64 || BN == 128, "wgmma kernel: block_n 64 or 128");
  static_assert(ST >= 2, "warp-specialised kernel: at least two K/V slots");
  static_assert(kSmemBytes <= 227 * 1024, "warp-specialised kernel: shared memory");
  static_assert(128 * kProducerRegs + 128 * NWG * kConsumerRegs <= 65536, "setmaxnreg: register file");
};

// TMA: the producer's copies are TMA loads issued by its thread 0 from the tensor maps in
// p.maps (each full barrier then counts one arrival, with the bytes it expects); otherwise
// 16-byte cp.async from all 128 producer threads (128 arrivals).
template <typename T, int D, int BN, int NWG, int ST, bool PP, bool TMA>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) flash_fwd_wgmma_ws_kernel(const __grid_constant__ FwdParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = WsShape<D, BN, NWG, ST, PP>;
  using Ops = TypeOps<T>;
  constexpr int BM = S::BM, SN = S::SN, ON = S::ON;
  constexpr int KD = D / 16;   // k steps of Q K^T
  constexpr int KN = BN / 16;  // k steps of P V
  constexpr int CONSUMERS = 128 * S::NWG;

  extern __shared__ unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[S::kBarriers];
  // The work item whose Q is in buffer qb (-1: none left, which keeps the item count out of
  // the consumers' registers), published with q_full; and the producer's next item under a
  // tile counter.
  __shared__ int item_of_q[2];
  __shared__ int next_item[2];
  const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;  // Q buffers 0 and 1
  const uint32_t sK = sQ + 2 * S::kQBytes;
  const uint32_t sV = sK + ST * S::kTileBytes;
  const uint32_t q_full = smem_addr(bars);  // + 8 * buffer
  const uint32_t q_empty = q_full + 2 * 8;
  const uint32_t k_full = q_empty + 2 * 8;  // + 8 * slot
  const uint32_t k_empty = k_full + ST * 8;
  const uint32_t v_full = k_empty + ST * 8;
  const uint32_t v_empty = v_full + ST * 8;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  // Arrivals that fill a slot: one per copying thread.
  constexpr uint32_t kFillers = TMA ? 1 : 128;
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      // The producer's copies, and its thread 0 with item_of_q (TMA: the same arrival).
      mbar_init(q_full + 8 * i, TMA ? 1 : 128 + 1);
      mbar_init(q_empty + 8 * i, CONSUMERS);
    }
#pragma unroll
    for (int i = 0; i < ST; ++i) {
      mbar_init(k_full + 8 * i, kFillers);
      mbar_init(k_empty + 8 * i, CONSUMERS);
      mbar_init(v_full + 8 * i, kFillers);
      mbar_init(v_empty + 8 * i, CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  // Three consumers skip the rows and tiles a warpgroup does not need (below), so under a
  // causal mask the partial block goes first, where it has the fewest tiles.
  const TileGrid<BM, BN, S::NWG == 3> grid(p);

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    setmaxnreg_dec<S::kProducerRegs>();
    if constexpr (TMA) {
      // One thread issues every copy; the rest of the warpgroup has nothing to do.
      if (tid != 0) return;
      // The maps into the constant cache ahead of the first copy (here rather than beside
      // the barriers' initialisation, where ptxas 13.0 serialised the three-consumer wgmma).
      tma_prefetch_map(p.maps.q);
      tma_prefetch_map(p.maps.k);
      tma_prefetch_map(p.maps.v);
    }
    const int ptid = tid;  // 0 .. 127 (TMA: 0 alone)
    // Rows [row0, row0 + ROWS) of head (h, b) of q, k or v into the tile at dst, completing
    // on `full`: a TMA box per 64 columns with the tile's bytes expected, or this thread's
    // cp.async share and its arrival.
    auto fill = [&](auto rows, uint32_t dst, const void* map, const T* src, int64_t row_stride, int row0, int len,
                    int h, int b, uint32_t full) {
      constexpr int ROWS = decltype(rows)::value;
      if constexpr (TMA) {
        mbar_arrive_expect_tx(full, ROWS * D * 2);
        tma_load_tile<ROWS, D>(dst, map, row0, h, b, full);
      } else {
        load_tile_sw128<ROWS, D, 128, ROWS == BM && S::NWG == 3>(dst, src, row_stride, row0, len, ptid);
        cp_async_mbar_arrive(full);
      }
    };
    using QRows = std::integral_constant<int, BM>;
    using KvRows = std::integral_constant<int, BN>;
    int u0 = 0;  // ring tiles used by earlier work items
    // Work items: blockIdx.x first; then, under a tile counter (causal work of unequal
    // length), the next one any CTA has not taken, as it frees up, else a fixed stride.
    int tile = blockIdx.x;
#pragma unroll 1
    for (int li = 0;; ++li) {
      const int qb = li & 1;
      mbar_wait(q_empty + 8 * qb, ((li >> 1) & 1) ^ 1);
      if (tile >= grid.total) {  // tell the consumers there is nothing left
        if (ptid == 0) {
          item_of_q[qb] = -1;
          mbar_arrive(q_full + 8 * qb);
        }
        if constexpr (!TMA) mbar_arrive(q_full + 8 * qb);
        break;
      }
      if (ptid == 0) {  // before the copies: fewer live registers in the producer's 24
        item_of_q[qb] = tile;
        // release: the consumers read item_of_q after their wait (TMA: the arrival of the
        // Q copy below releases it)
        if constexpr (!TMA) mbar_arrive(q_full + 8 * qb);
      }
      const TileWork<T> w = grid.template work<T>(p, tile);
      const int hk = w.h / grid.group;
      fill(QRows{}, sQ + qb * S::kQBytes, p.maps.q, w.q, p.q_sl, w.m0, p.len_q, w.h, w.b, q_full + 8 * qb);
      int slot = u0 % ST;
      int par = (u0 / ST) & 1;
#pragma unroll 1
      for (int j = 0; j < w.n_tiles; ++j) {
        mbar_wait(k_empty + 8 * slot, par ^ 1);
        fill(KvRows{}, sK + slot * S::kTileBytes, p.maps.k, w.k, p.k_sl, j * BN, p.len_k, hk, w.b, k_full + 8 * slot);
        mbar_wait(v_empty + 8 * slot, par ^ 1);
        fill(KvRows{}, sV + slot * S::kTileBytes, p.maps.v, w.v, p.v_sl, j * BN, p.len_k, hk, w.b, v_full + 8 * slot);
        if (++slot == ST) {
          slot = 0;
          par ^= 1;
        }
      }
      u0 += w.n_tiles;
      if (p.tile_counter != nullptr) {
        // Taken once this item's copies are issued, ST tiles ahead of the consumers: late
        // enough that a CTA takes an item when it is nearly free, early enough that the
        // atomic's round trip hides under the consumers' last tiles. One slot per Q buffer:
        // thread 0 rewrites a slot only after the producer barrier of the item between.
        if constexpr (TMA) {
          tile = gridDim.x + atomicAdd(p.tile_counter, 1);  // the one producer thread
        } else {
          if (ptid == 0) next_item[qb] = gridDim.x + atomicAdd(p.tile_counter, 1);
          named_bar_sync(S::kProducerBarrier, 128);
          tile = next_item[qb];
        }
      } else {
        tile += gridDim.x;
      }
    }
    // Nothing of this thread's still in flight when it exits (the consumers wait for every
    // TMA copy issued here before they exit).
    if constexpr (!TMA) cp_async_wait<0>();
    return;
  }

  // ------------------------------------------------------------------ consumers
  setmaxnreg_inc<S::kConsumerRegs>();
  const int cw = wg - 1;             // consumer warpgroup: query rows cw*64 .. cw*64+63
  const int wl = (tid >> 5) & 3;     // warp within the warpgroup: 16 of those rows
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_row0 = cw * 64 + wl * 16;
  const float scale_log2 = p.scale * kLog2e;
  // Ping-pong: the consumers issue their wgmma in turn, 0, 1, .., NWG - 1, 0, ..: consumer
  // cw waits with bar.sync on barrier 1 + cw, then passes the turn with bar.arrive on its
  // successor's (each barrier: 128 syncing + 128 arriving threads). The last consumer
  // hands consumer 0 the first turn.
  constexpr int kTurnThreads = 256;
  const int my_turn = 1 + cw;
  const int next_turn = 1 + (cw + 1) % S::NWG;
  if (PP && cw == S::NWG - 1) named_bar_arrive(1, kTurnThreads);

  int u0 = 0;
#pragma unroll 1
  for (int li = 0;; ++li) {
    const int qb = li & 1;
    mbar_wait(q_full + 8 * qb, (li >> 1) & 1);
    const int tile = *static_cast<volatile int*>(&item_of_q[qb]);
    if (tile < 0) break;
    const TileWork<T> w = grid.template work<T>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const uint32_t sQb = sQ + qb * S::kQBytes;
    const uint32_t q_base = sQb + cw * 64 * 128;

    float o[ON];
#pragma unroll
    for (int i = 0; i < ON; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    float s[SN];
    uint32_t pf[KN][4];

    auto slot_of = [&](int j) { return (u0 + j) % ST; };
    auto parity_of = [&](int j) { return static_cast<uint32_t>(((u0 + j) / ST) & 1); };
    // Wait until tile j of a ring has landed; make the threads' copies visible to the tensor
    // cores' proxy. TMA writes through that proxy already, but without the fence ptxas 13.0
    // serialises the wgmma of the three 160-register consumers (C7511), so they keep it.
    auto wait_full = [&](uint32_t full, int j) {
      mbar_wait(full + 8 * slot_of(j), parity_of(j));
      if constexpr (!TMA || S::NWG == 3) fence_proxy_async_smem();
    };
    auto release = [&](uint32_t empty, int j) { mbar_arrive(empty + 8 * slot_of(j)); };
    auto turn_wait = [&]() {
      if constexpr (PP) named_bar_sync(my_turn, kTurnThreads);
    };
    auto turn_pass = [&]() {
      if constexpr (PP) named_bar_arrive(next_turn, kTurnThreads);
    };
    // W: the keys of a tile this warpgroup computes, BN or (three consumers: a last tile
    // with at most BN / 2 visible keys) BN / 2, the first half of the slot: the same
    // descriptors, a narrower wgmma for S and half the k steps of P V.
    using Full = std::integral_constant<int, BN>;
    using Half = std::integral_constant<int, BN / 2>;
    auto issue_s = [&](int j, auto width) {  // S_j = Q K_j^T
      constexpr int W = decltype(width)::value;
      float(&sw)[W / 2] = reinterpret_cast<float(&)[W / 2]>(s);
      const uint32_t k_base = sK + slot_of(j) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const uint32_t off = (kk & 3) * 32;
        const uint64_t da = wgmma_desc_sw128(q_base + (kk >> 2) * BM * 128 + off, 16, 1024);
        const uint64_t db = wgmma_desc_sw128(k_base + (kk >> 2) * BN * 128 + off, 16, 1024);
        wgmma_ss(sw, da, db, kk > 0 ? 1 : 0, T{});
      }
      wgmma_commit();
    };
    auto issue_pv = [&](int j, auto width) {  // O += P_j V_j
      constexpr int W = decltype(width)::value;
      const uint32_t v_base = sV + slot_of(j) * S::kTileBytes;
#pragma unroll
      for (int kk = 0; kk < W / 16; ++kk)
        wgmma_rs(o, pf[kk], wgmma_desc_sw128(v_base + kk * 16 * 128, BN * 128, 1024), 1, T{});
      wgmma_commit();
    };
    auto softmax = [&](int j, float (&alpha)[2], auto mask, auto width) {
      constexpr bool kMask = decltype(mask)::value;
      constexpr int W = decltype(width)::value;
      const int n0 = j * BN;
      // The offset goes with this warp's rows here (with the keys, as in flash_fwd.cu,
      // ptxas 13.0 serialised the three consumers' wgmma: kernels/NOTES.md, "Bottom-right
      // causal alignment").
      if (kMask && (n0 + W > p.len_k || (p.causal && n0 + W - 1 > m0 + p.causal_offset + warp_row0))) {
#pragma unroll
        for (int i = 0; i < W / 2; ++i) {
          const int last_key = m0 + p.causal_offset + warp_row0 + g + ((i >> 1) & 1) * 8;  // this row sees
          const int col = n0 + (i >> 2) * 8 + 2 * t + (i & 1);
          if (col >= p.len_k || (p.causal && col > last_key)) s[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alpha[r] = online_softmax_row<W / 8>([&](int nt, int e) -> float& { return s[4 * nt + 2 * r + e]; },
                                             row_max[r], row_sum[r], scale_log2);
    };
    auto pack_p = [&](auto width) {
      constexpr int W = decltype(width)::value;
#pragma unroll
      for (int kk = 0; kk < W / 16; ++kk) {
        pf[kk][0] = Ops::pack(s[8 * kk + 0], s[8 * kk + 1]);
        pf[kk][1] = Ops::pack(s[8 * kk + 2], s[8 * kk + 3]);
        pf[kk][2] = Ops::pack(s[8 * kk + 4], s[8 * kk + 5]);
        pf[kk][3] = Ops::pack(s[8 * kk + 6], s[8 * kk + 7]);
      }
    };
    // Iteration j >= 1: S_j with P_{j-1} V_{j-1}; K_j is released once S_j is done, V_{j-1}
    // once P V is. Nothing between a wgmma's issue and its wait branches. `width` is tile
    // j's; tile j - 1 was full.
    auto step = [&](int j, auto mask, auto width) {
      float alpha[2];
      wait_full(k_full, j);
      wait_full(v_full, j - 1);
      turn_wait();
      wgmma_fence();
      issue_s(j, width);
      issue_pv(j - 1, Full{});
      turn_pass();
      wgmma_wait<1>();
      fence_regs(s);
      release(k_empty, j);
      softmax(j, alpha, mask, width);
      wgmma_wait<0>();
      fence_regs(o);
      fence_regs(pf);
      release(v_empty, j - 1);
#pragma unroll
      for (int i = 0; i < ON; ++i) o[i] *= alpha[(i >> 1) & 1];
      pack_p(width);
    };
    auto first = [&](auto width) {  // tile 0: no P V in flight yet
      float alpha[2];
      wait_full(k_full, 0);  // also publishes Q (same fence; TMA: Q landed with q_full)
      turn_wait();
      wgmma_fence();
      issue_s(0, width);
      turn_pass();
      wgmma_wait<0>();
      fence_regs(s);
      release(k_empty, 0);
      softmax(0, alpha, std::true_type{}, width);
      pack_p(width);
    };
    auto last_pv = [&](int j, auto width) {  // O += P V of this warpgroup's last tile
      wait_full(v_full, j);
      turn_wait();
      wgmma_fence();
      issue_pv(j, width);
      turn_pass();
      wgmma_wait<0>();
      fence_regs(o);
      release(v_empty, j);
    };

    if constexpr (S::NWG == 2) {
      // Every consumer computes every tile of the item (its two row halves differ by at most
      // half a tile; skipping that half measured slower: kernels/NOTES.md, "Each
      // warpgroup's own tiles").
      first(Full{});
      const int n_clean = min(n_tiles, p.causal ? min(p.len_k, m0 + 1 + p.causal_offset) / BN : p.len_k / BN);
#pragma unroll 1
      for (int j = 1; j < n_clean; ++j) step(j, std::false_type{}, Full{});
#pragma unroll 1
      for (int j = max(1, n_clean); j < n_tiles; ++j) step(j, std::true_type{}, Full{});
      last_pv(n_tiles - 1, Full{});
    } else {
      // Three consumers: this warpgroup's own tiles (kernels/NOTES.md, "Each warpgroup's
      // own tiles"). Its rows see keys below kv_end, up to 128 fewer than the item's last
      // row, so of the item's tiles it computes the first nw, the last of them at half width
      // where at most BN / 2 of its keys are visible; rows wholly outside [0, len_q), or
      // (bottom-right alignment) that see no key, compute none: kv_end <= 0 gives nw <= 0
      // (below 0 where kv_end <= -BN), which every test below reads as none (clamping kv_end
      // at 0 serialised the wgmma). It still takes a turn for every tile, so the consumers'
      // turns stay in step.
      const int wg_row0 = m0 + cw * 64;
      const int kv_end = wg_row0 >= p.len_q || wg_row0 + 64 <= 0
                             ? 0
                             : (p.causal ? min(p.len_k, wg_row0 + 64 + p.causal_offset) : p.len_k);
      const int nw = (kv_end + BN - 1) / BN;
      const bool half_last = nw > 0 && kv_end - (nw - 1) * BN <= BN / 2;
      const int n_clean = min(nw, p.causal ? min(p.len_k, m0 + 1 + p.causal_offset) / BN : p.len_k / BN);
      if (nw > 0) {
        if (nw == 1 && half_last) {
          first(Half{});
        } else {
          first(Full{});
        }
#pragma unroll 1
        for (int j = 1; j < n_clean; ++j) step(j, std::false_type{}, Full{});
#pragma unroll 1
        for (int j = max(1, n_clean); j < nw - (half_last ? 1 : 0); ++j) step(j, std::true_type{}, Full{});
        if (half_last) {
          if (nw > 1) step(nw - 1, std::true_type{}, Half{});
          last_pv(nw - 1, Half{});
        } else {
          last_pv(nw - 1, Full{});
        }
      }
      // The tiles it does not read: released as its turns come, turn k where the others
      // read K_k and V_{k-1}, so it waits for no copy that needs a later turn of theirs.
      if (nw > 0 && nw < n_tiles) {
        wait_full(k_full, nw);
        release(k_empty, nw);
      }
#pragma unroll 1
      for (int k = nw > 0 ? nw + 1 : 0; k <= n_tiles; ++k) {
        if (k < n_tiles) {
          wait_full(k_full, k);
          release(k_empty, k);
        }
        if (k > 0) {  // V_{k-1}, past the warpgroup's own tiles as every k here (none before K_0)
          wait_full(v_full, k - 1);
          release(v_empty, k - 1);
        }
        turn_wait();
        turn_pass();
      }
    }
    u0 += n_tiles;

    // ---- epilogue, O staged through this warp's own rows of its Q buffer
    store_o_rows<T, D, BM, S::NWG == 3>(p, o, row_max, row_sum, sQb, b, h, m0, warp_row0, lane);
    // The staging above wrote and read the buffer through the generic proxy; the next TMA
    // copy into it writes through the async proxy, after them.
    if constexpr (TMA) fence_proxy_async_smem();
    mbar_arrive(q_empty + 8 * qb);  // this buffer may take the Q of work item li + 2
  }
  // Consumer 0 takes the turn the last consumer passed after its last wgmma, so no arrival
  // on a named barrier is left pending when the CTA exits.
  if (PP && cw == 0) named_bar_sync(1, kTurnThreads);
#else
  __trap();  // built without sm_90a: never launched
#endif
}

}  // namespace
}  // namespace flashwatt
