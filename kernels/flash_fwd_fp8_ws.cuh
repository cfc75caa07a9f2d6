// flashwatt fp8 (e4m3) attention forward on Hopper (sm_90a): warp-specialised and persistent,
// as flash_fwd_wgmma_ws.cuh is for 16-bit inputs, with the fp8 arithmetic of flash_fwd_fp8.cuh.
//
//   * warpgroup 0, the producer, copies with TMA from one thread: Q of each work item into
//     one of two buffers, K and V^T tiles into rings of ST slots, each copy completing its
//     bytes on the slot's "full" mbarrier (kernels/NOTES.md, "TMA copies"). The e4m3 operands
//     come from the quantisation step, contiguous with 16-byte strides, so their tensor maps
//     always encode: there is no thread-copy variant. The maps' swizzle is the tiles' own
//     (Q and K rows of D bytes: 128-byte swizzle at head dim 128, 64-byte at 64; V^T rows of
//     128 keys: 128-byte).
//   * warpgroups 1 .. NWG (2 or 3), the consumers, 64 query rows each: S_j = Q K_j^T issued with
//     O += P_{j-1} V_{j-1}, P packed to e4m3 straight from the S registers; they release a
//     slot on its "empty" mbarrier once the wgmma that read it has completed; with PP they
//     take turns to issue their wgmma (named barriers 1 and 2), so one's softmax runs under
//     the other's GEMMs.
//   * the grid is persistent (one CTA per SM unless capped), work items by a fixed stride or,
//     with a tile counter, the next one no CTA has taken; -1 in item_of_q stops the consumers.
//   * scales per block as in flash_fwd_fp8.cuh (Fp8Scales): per consumer, its 64 query rows'
//     descale_q and each K tile's descale_k in the softmax scale, O in units of the last V
//     tile's descale_v.
//   * RSUM: the row sums of P from the tensor cores. V^T has a row of e4m3 ones under the head
//     dim's rows (fp8_quantize.cuh), so P times those rows gives each row's sum of P as rounded
//     to e4m3 (the weights O is made of): the softmax drops its FADD per score. The V^T slots
//     hold D + 8 rows. A P V of its own, m64n8k32 over the 8 rows, sums each tile afresh
//     (scale-d 0 at its first k step) and the tiles' sums add up in fp32, rescaled by alpha
//     there: summed over a whole row in the fp8 wgmma's accumulator (O's P V at N = D + 8, as
//     first built), which keeps fewer bits than fp32 as it adds, a row of 2049 keys was 2 %
//     off (kernels/NOTES.md, "After the first run"); a tile's 128 keys stay well inside it.
//   * O leaves through a buffer of its own ([BM, D] 16-bit: the Q buffer holds 1 byte per
//     element), each warp staging only its own rows (store_o_rows), so the next item's Q can
//     land while the consumers still store this one's O.
// Barrier phases as in flash_fwd_wgmma_ws.cuh: use n of a slot completes phase n of its full
// and of its empty barrier; consumers wait full with parity n & 1, the producer waits empty
// with parity (n & 1) ^ 1 before filling use n.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "flash_fp8.cuh"
#include "flash_fwd.cuh"
#include "flash_fwd_fp8.cuh"
#include "flash_fwd_wgmma.cuh"
#include "flash_fwd_wgmma_ws.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"
#include "wgmma.cuh"
#include "wgmma_fp8.cuh"

namespace flashwatt {
namespace {

template <int D, int BN, int NWG_, int ST, bool PP, bool RSUM_ = false>
struct Fp8WsShape {
  static constexpr int NWG = NWG_;  // consumer warpgroups, 64 q rows each
  static constexpr bool RSUM = RSUM_;  // the row sums of P from the tensor cores (module comment)
  static constexpr int BM = 64 * NWG;
  static constexpr int kThreads = 128 * (NWG + 1);
  static constexpr int VROWS = D + (RSUM ? kFp8VtExtraRows : 0);  // V^T rows a slot holds: P V's N
  static constexpr int kQBytes = BM * D;      // one of two Q buffers
  static constexpr int kTileBytes = BN * D;   // one K slot
  static constexpr int kVTileBytes = BN * VROWS;  // one V^T slot (a multiple of the 1 KB swizzle atom)
  static constexpr int kOBytes = BM * D * 2;  // the O staging buffer, 16-bit
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = 2 * kQBytes + ST * (kTileBytes + kVTileBytes) + kOBytes + 1024;
  static constexpr int SN = BN / 2;
  static constexpr int OD = D / 2;      // O accumulators per thread
  static constexpr int KD = D / 32;
  static constexpr int KN = BN / 32;
  // setmaxnreg: two consumers take 240 registers each; three (head dim 64 only: S 64, O 32 and
  // P 16 registers) 160, the producer what is left (flash_fwd_wgmma_ws.cuh's split).
  static constexpr int kProducerRegs = NWG == 2 ? 24 : 32;
  static constexpr int kConsumerRegs = NWG == 2 ? 240 : 160;
  // Three consumers at head dim 128 (160 registers: S 64, O 64) cannot hold P_{j-1} (16) while
  // S_j is in flight: each waits for its P V within its turn and issues S_j after it (the
  // tensor cores stay busy with that P V meanwhile, and two other consumers hide the wait).
  static constexpr bool kSerialPv = NWG == 3 && D == 128;
  static constexpr int kBarriers = 4 + 4 * ST;
  static_assert(D == 64 || D == 128, "fp8 kernel: head_dim 64 or 128");
  static_assert(BN == 128, "fp8 kernel: block_n 128 (V^T rows of 128 bytes)");
  static_assert(ST >= 2, "fp8 warp-specialised kernel: at least two K/V slots");
  static_assert(NWG == 2 || NWG == 3, "fp8 warp-specialised kernel: two or three consumers");
  static_assert(kVTileBytes % 1024 == 0, "fp8 warp-specialised kernel: V^T slots on the swizzle atom");
  static_assert(kSmemBytes <= 227 * 1024, "fp8 warp-specialised kernel: shared memory");
  static_assert(128 * kProducerRegs + 128 * NWG * kConsumerRegs <= 65536, "setmaxnreg: register file");
};

template <typename T, int D, int BN, int NWG, int ST, bool PP, bool RSUM>
__global__ void __launch_bounds__(128 * (NWG + 1), 1) flash_fwd_fp8_ws_kernel(const __grid_constant__ Fp8FwdParams f) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = Fp8WsShape<D, BN, NWG, ST, PP, RSUM>;
  constexpr int BM = S::BM, SN = S::SN, OD = S::OD, KD = S::KD, KN = S::KN;
  constexpr int CONSUMERS = 128 * S::NWG;
  const FwdParams& p = f.p;

  extern __shared__ unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[S::kBarriers];
  __shared__ int item_of_q[2];
  const uint32_t sQ = (smem_addr(smem) + 1023u) & ~1023u;  // Q buffers 0 and 1
  const uint32_t sK = sQ + 2 * S::kQBytes;
  const uint32_t sV = sK + ST * S::kTileBytes;
  const uint32_t sO = sV + ST * S::kVTileBytes;
  const uint32_t q_full = smem_addr(bars);
  const uint32_t q_empty = q_full + 2 * 8;
  const uint32_t k_full = q_empty + 2 * 8;
  const uint32_t k_empty = k_full + ST * 8;
  const uint32_t v_full = k_empty + ST * 8;
  const uint32_t v_empty = v_full + ST * 8;

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      mbar_init(q_full + 8 * i, 1);  // the producer's one arrival, with Q's bytes (or the stop)
      mbar_init(q_empty + 8 * i, CONSUMERS);
    }
#pragma unroll
    for (int i = 0; i < ST; ++i) {
      mbar_init(k_full + 8 * i, 1);
      mbar_init(k_empty + 8 * i, CONSUMERS);
      mbar_init(v_full + 8 * i, 1);
      mbar_init(v_empty + 8 * i, CONSUMERS);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const TileGrid<BM, BN> grid(p);

  if (wg == 0) {
    // ---------------------------------------------------------------- producer
    setmaxnreg_dec<S::kProducerRegs>();
    if (tid != 0) return;
    tma_prefetch_map(p.maps.q);
    tma_prefetch_map(p.maps.k);
    tma_prefetch_map(p.maps.v);
    int u0 = 0;  // ring tiles used by earlier work items
    int tile = blockIdx.x;
#pragma unroll 1
    for (int li = 0;; ++li) {
      const int qb = li & 1;
      mbar_wait(q_empty + 8 * qb, ((li >> 1) & 1) ^ 1);
      if (tile >= grid.total) {  // tell the consumers there is nothing left
        item_of_q[qb] = -1;
        mbar_arrive(q_full + 8 * qb);
        break;
      }
      item_of_q[qb] = tile;  // released by the arrival of the Q copy below
      const TileWork<uint8_t> w = grid.template work<uint8_t>(p, tile);
      const int hk = w.h / grid.group;
      mbar_arrive_expect_tx(q_full + 8 * qb, S::kQBytes);
      tma_load_4d(sQ + qb * S::kQBytes, p.maps.q, 0, w.m0, w.h, w.b, q_full + 8 * qb);
      int slot = u0 % ST;
      int par = (u0 / ST) & 1;
#pragma unroll 1
      for (int j = 0; j < w.n_tiles; ++j) {
        mbar_wait(k_empty + 8 * slot, par ^ 1);
        mbar_arrive_expect_tx(k_full + 8 * slot, S::kTileBytes);
        tma_load_4d(sK + slot * S::kTileBytes, p.maps.k, 0, j * BN, hk, w.b, k_full + 8 * slot);
        mbar_wait(v_empty + 8 * slot, par ^ 1);
        mbar_arrive_expect_tx(v_full + 8 * slot, S::kVTileBytes);
        tma_load_4d(sV + slot * S::kVTileBytes, p.maps.v, j * BN, 0, hk, w.b, v_full + 8 * slot);
        if (++slot == ST) {
          slot = 0;
          par ^= 1;
        }
      }
      u0 += w.n_tiles;
      tile = p.tile_counter != nullptr ? gridDim.x + atomicAdd(p.tile_counter, 1) : tile + gridDim.x;
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  setmaxnreg_inc<S::kConsumerRegs>();
  const int cw = wg - 1;
  const int wl = (tid >> 5) & 3;
  const int lane = tid & 31;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_row0 = cw * 64 + wl * 16;
  constexpr int kTurnThreads = 256;
  const int my_turn = 1 + cw;
  const int next_turn = 1 + (cw + 1) % S::NWG;
  if (PP && cw == S::NWG - 1) named_bar_arrive(1, kTurnThreads);

  const uint64_t k_desc0 = wgmma_desc_fp8<D>(sK), v_desc0 = wgmma_desc_fp8<BN>(sV);
  int u0 = 0;
#pragma unroll 1
  for (int li = 0;; ++li) {
    const int qb = li & 1;
    mbar_wait(q_full + 8 * qb, (li >> 1) & 1);
    const int tile = *static_cast<volatile int*>(&item_of_q[qb]);
    if (tile < 0) break;
    const TileWork<uint8_t> w = grid.template work<uint8_t>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const int hk = h / grid.group;
    const Fp8Scales sc(f, b, h, hk, m0 + cw * 64);
    float dv_prev = sc.dv[0];  // O's unit: the descale_v of the last P V it holds (flash_fwd_fp8.cuh)
    const uint32_t q_base = sQ + qb * S::kQBytes + cw * 64 * D;

    float o[OD];
#pragma unroll
    for (int i = 0; i < OD; ++i) o[i] = 0.f;
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};
    float tile_sums[2] = {0.f, 0.f};  // RSUM: the rows' sums of P so far, in fp32, at the last tile's max
    float rs8[4];                     // RSUM: one tile's, from its own P V (rows g, g + 8)
    float s[SN];
    uint32_t pf[KN][4];

    auto slot_of = [&](int j) { return (u0 + j) % ST; };
    auto parity_of = [&](int j) { return static_cast<uint32_t>(((u0 + j) / ST) & 1); };
    auto wait_full = [&](uint32_t full, int j) { mbar_wait(full + 8 * slot_of(j), parity_of(j)); };
    auto release = [&](uint32_t empty, int j) { mbar_arrive(empty + 8 * slot_of(j)); };
    auto turn_wait = [&]() {
      if constexpr (PP) named_bar_sync(my_turn, kTurnThreads);
    };
    auto turn_pass = [&]() {
      if constexpr (PP) named_bar_arrive(next_turn, kTurnThreads);
    };
    // Descriptors from the buffers' first ones plus offsets (wgmma_desc_at): built from the
    // address at every wgmma, each took five uniform instructions while the turn was held.
    const uint64_t q_desc = wgmma_desc_fp8<D>(q_base);
    auto issue_s = [&](int j) {
      const uint64_t k_desc = wgmma_desc_at(k_desc0, slot_of(j) * S::kTileBytes);
#pragma unroll
      for (int kk = 0; kk < KD; ++kk)
        wgmma_ss_e4m3(s, wgmma_desc_at(q_desc, kk * 32), wgmma_desc_at(k_desc, kk * 32), kk > 0 ? 1 : 0);
      wgmma_commit();
    };
    auto issue_pv = [&](int j) {
      const uint64_t v_desc = wgmma_desc_at(v_desc0, slot_of(j) * S::kVTileBytes);
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        wgmma_rs_e4m3(o, pf[kk], wgmma_desc_at(v_desc, kk * 32), 1);
        if constexpr (RSUM)  // the rows D..D+7 of the slot: ones, then zeros
          wgmma_rs_e4m3(rs8, pf[kk], wgmma_desc_at(v_desc, D * BN + kk * 32), kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    auto take_tile_sums = [&]() {  // the last P V's sums, at its tile's max
      if constexpr (RSUM) {
        fence_regs(rs8);
#pragma unroll
        for (int r = 0; r < 2; ++r) tile_sums[r] += rs8[2 * r] + rs8[2 * r + 1];
      }
    };
    auto softmax = [&](int j, float (&alpha)[2], auto mask, float scale_log2) {
      constexpr bool kMask = decltype(mask)::value;
      const int n0 = j * BN;
      if (kMask && (n0 + BN > p.len_k || (p.causal && n0 + BN - 1 > m0 + p.causal_offset + warp_row0))) {
#pragma unroll
        for (int i = 0; i < SN; ++i) {
          const int last_key = m0 + p.causal_offset + warp_row0 + g + ((i >> 1) & 1) * 8;
          const int col = n0 + (i >> 2) * 8 + 2 * t + (i & 1);
          if (col >= p.len_k || (p.causal && col > last_key)) s[i] = -INFINITY;
        }
      }
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alpha[r] = fp8_softmax_row<BN / 8>([&](int nt, int e) -> float& { return s[4 * nt + 2 * r + e]; },
                                           row_max[r], row_sum[r], scale_log2);
    };
    auto pack_p = [&]() {  // flash_fwd_fp8.cuh: the accumulators' column order
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        const float* q = s + 16 * kk;
        pf[kk][0] = pack_e4m3x4(q[0], q[1], q[4], q[5]);
        pf[kk][1] = pack_e4m3x4(q[2], q[3], q[6], q[7]);
        pf[kk][2] = pack_e4m3x4(q[8], q[9], q[12], q[13]);
        pf[kk][3] = pack_e4m3x4(q[10], q[11], q[14], q[15]);
      }
    };
    // The next tile's descales are read a step ahead: read at the top of their own step, the
    // load was still in flight at the softmax's first multiply (kernels/NOTES.md, "fp8 forward:
    // the step's latency").
    float dk_next = sc.dk[min(1, n_tiles - 1)], dv_next = sc.dv[min(1, n_tiles - 1)];
    auto step = [&](int j, auto mask) {
      float alpha[2];
      const float dk_j = dk_next, dv_j = dv_next;
      const int j_next = min(j + 1, n_tiles - 1);
      dk_next = sc.dk[j_next];
      dv_next = sc.dv[j_next];
      const float to_unit = dv_prev / dv_j;  // O holds P_{j-1} V_{j-1} in units of dv_prev
      dv_prev = dv_j;
      wait_full(k_full, j);
      wait_full(v_full, j - 1);
      turn_wait();
      wgmma_fence();
      if constexpr (S::kSerialPv) {  // P_{j-1} V_{j-1} done before S_j takes registers
        issue_pv(j - 1);
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        release(v_empty, j - 1);
        take_tile_sums();
        wgmma_fence();
        issue_s(j);
      } else {
        issue_s(j);
        issue_pv(j - 1);
      }
      turn_pass();
      if constexpr (S::kSerialPv) {
        wgmma_wait<0>();
      } else {
        wgmma_wait<1>();
      }
      fence_regs(s);
      release(k_empty, j);
      softmax(j, alpha, mask, sc.q_log2 * dk_j);
      const float alpha_o[2] = {alpha[0] * to_unit, alpha[1] * to_unit};  // the row sums take alpha alone
      if constexpr (!S::kSerialPv) {
        wgmma_wait<0>();
        fence_regs(o);
        fence_regs(pf);
        release(v_empty, j - 1);
        take_tile_sums();  // P_{j-1}'s sums at max j-1, then all of them at max j
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) tile_sums[r] *= alpha[r];
#pragma unroll
      for (int i = 0; i < OD; ++i) o[i] *= alpha_o[(i >> 1) & 1];
      pack_p();
    };
    {  // tile 0: no P V in flight yet
      float alpha[2];
      wait_full(k_full, 0);
      turn_wait();
      wgmma_fence();
      issue_s(0);
      turn_pass();
      wgmma_wait<0>();
      fence_regs(s);
      release(k_empty, 0);
      softmax(0, alpha, std::true_type{}, sc.q_log2 * sc.dk[0]);
      pack_p();
    }
    const int n_clean = min(n_tiles, p.causal ? min(p.len_k, m0 + 1 + p.causal_offset) / BN : p.len_k / BN);
#pragma unroll 1
    for (int j = 1; j < n_clean; ++j) step(j, std::false_type{});
#pragma unroll 1
    for (int j = max(1, n_clean); j < n_tiles; ++j) step(j, std::true_type{});
    {  // O += P V of the last tile
      wait_full(v_full, n_tiles - 1);
      turn_wait();
      wgmma_fence();
      issue_pv(n_tiles - 1);
      turn_pass();
      wgmma_wait<0>();
      fence_regs(o);
      release(v_empty, n_tiles - 1);
      take_tile_sums();
    }
    u0 += n_tiles;
    mbar_arrive(q_empty + 8 * qb);  // every S of this item has read its Q

    // ---- epilogue, O staged through this warp's own rows of the O buffer
#pragma unroll
    for (int i = 0; i < OD; ++i) o[i] *= dv_prev;
    if constexpr (RSUM) {  // (column D of rows g and g + 8 at the quad's thread 0; the rest 0)
#pragma unroll
      for (int r = 0; r < 2; ++r) row_sum[r] = tile_sums[r];
    }
    const float lse_max[2] = {row_max[0] - kPShift, row_max[1] - kPShift};
    __syncwarp();  // this warp's reads of its O rows for the item before are done
    store_o_rows<T, D, BM>(p, o, lse_max, row_sum, sO, b, h, m0, warp_row0, lane);
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
