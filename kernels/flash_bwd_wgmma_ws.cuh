// flashwatt attention backward on Hopper (sm_90a), warp-specialised: the step of
// flash_bwd_wgmma.cuh (flash_bwd_wgmma_step.cuh; head dims 64 and 128) fed by a producer
// warpgroup through TMA.
//
// Why (kernels/NOTES.md, "Backward alone: where it stands", "Backward warp-specialised"):
// in wgmma_n128_m64_w8 the two computing warpgroups also issue, wait for and fence their own
// cp.async copies of the next query block, and meet at a CTA barrier at the top of every
// step, so each step's chain (S^T, P^T, dV, dP^T, dS^T, dK, dQ) runs exposed behind the
// copies' issue and the barrier. Here, as in the forward's v6 (flash_fwd_wgmma_ws.cuh):
//   * warpgroup 0 is the producer. One of its threads issues every copy with TMA: K and V
//     once per CTA (on kv_full), then per query block Q, dO and that block's LSE and
//     delta into a two-stage ring (full/empty mbarriers per stage, the stage's bytes
//     expected on full). Its warp 1 is the dQ writer: it adds each consumer's staged dQ
//     tile into the fp32 accumulator by TMA bulk reductions and hands the tile back once
//     they have read it, on two named barriers per consumer (as FlashAttention-3's
//     backward does), so no consumer waits on a reduction's issue. The warpgroup's
//     registers go to the consumers (setmaxnreg: 24 for it, 240 for each consumer; 384
//     threads x 168 at launch).
//   * warpgroups 1 and 2 are the consumers: keys 0..63 and 64..127 of the CTA's block
//     (M = 64 of every key-major wgmma), each running the step of wgmma_n128_m64_w8 (the
//     same five GEMMs, the same P^T and dS^T arithmetic), except that dK is issued after
//     the dS^T barrier, behind dQ, and dQ is staged for the writer while dK runs (kernels/
//     NOTES.md, "Backward: instructions off the consumers' chain"). dK and dV come out
//     bit-identical to that tile's. The step is shared with that tile, not copied: both
//     kernels call the functions of flash_bwd_wgmma_step.cuh, which says what each kernel
//     still holds itself and why; this file adds the copies, barriers, the dQ hand-off and
//     the stage release around them (this tile is the Hopper default at head dim 128, and
//     its form with 128-row query steps at 64: "Backward at head dim 64: 128 queries per
//     step").
//   * at head dim 128 the consumers meet once per step, on a named barrier of their 256
//     threads (the producer never joins it) that publishes dS^T to the other's dQ. dS^T is
//     double-buffered by step parity so that no second barrier has to guard its reuse:
//     a warpgroup writes buffer (it & 1) only after the barrier of step it - 1, which the
//     other passed only after the dQ of step it - 2 that read that buffer had completed.
//     At head dim 64 each consumer's dQ sums over its own 64 keys (as wgmma_n128_m64_w8's
//     warpgroups do there): it reads its own dS^T rows only, and meets its own 128 threads,
//     the same argument holding within the warpgroup.
//   * a stage goes back to the producer (each consumer thread arrives on its empty barrier)
//     once the step's last wgmma that reads Q or dO (dK) has completed and the thread's
//     LSE and delta reads are done, i.e. after the step's final wait.
//   * each consumer has one dQ staging tile. It stages step it's dQ after a sync on
//     kDqEmpty0 + c (the writer's release of step it - 1's tile, or its release before the
//     first step) and arrives on kDqFull0 + c; the writer syncs on that, issues the
//     reductions, waits until they have read both consumers' tiles, and releases them
//     (not after the last step, so no barrier holds arrivals when the CTA exits).
// Stage s of the ring holds the query blocks it = s, s + 2, ...: use n = it / 2 completes
// phase n of full[s] (the producer's one arrival plus the stage's bytes) and of empty[s]
// (256 arrivals); consumers wait full with parity n & 1, the producer waits empty with
// parity (n & 1) ^ 1, true at once for n = 0 (a fresh barrier).
// LSE and delta travel as boxes of a 1-d map over the contiguous (batch, heads, len_q)
// floats, starting at the 16-byte aligned element at or below the block's first row (the
// consumers skip the 0-3 floats before it): rows past len_q read the next head's values (or
// zeros past the end), which the step masks exactly as the zero-filled rows of
// wgmma_n128_m64_w8 (P = 0 wherever the query is past len_q, and dS a zero).
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

// The parameters of the warp-specialised backward kernel: the launch's, and the TMA maps
// bwd_launch encodes (CUtensorMap, 128 opaque bytes each, read from the kernel parameters).
// Kept out of BwdParams so that no other backward kernel's parameters change.
struct BwdWsParams {
  BwdParams p;
  alignas(128) unsigned char q[128];     // (head dim, len_q, heads, batch), boxes [64 rows, 64]
  alignas(128) unsigned char dout[128];  // as q
  alignas(128) unsigned char k[128];     // (head dim, len_k, kv_heads, batch), boxes [128 rows, 64]
  alignas(128) unsigned char v[128];     // as k
  alignas(128) unsigned char lse[128];    // the batch * heads * len_q floats, boxes of BwdWsShape::kRowBox
  alignas(128) unsigned char delta[128];  // as lse
};
static_assert(sizeof(BwdWsParams) <= 4096, "kernel parameters: 4 KB");

namespace {

// BM_ queries per step: 64 (wgmma_ws_n128_m64_w12, head dims 64 and 128) or, at head dim 64,
// 128 (wgmma_ws_n128_m128_w12), where each consumer's dQ takes its own 64 of the step's queries.
template <int D, int BM_ = 64>
struct BwdWsShape {
  static constexpr int NWG = 2;      // consumer warpgroups, 64 keys each
  static constexpr int BN = 64 * NWG;  // keys per CTA
  static constexpr int BM = BM_;       // queries per step
  static constexpr int kThreads = 128 * (NWG + 1);  // + the producer warpgroup
  static constexpr int kConsumers = 128 * NWG;
  // dQ split among the consumers. With 64 queries per step as flash_bwd_wgmma.cuh splits it:
  // by head-dim columns where each one's share is a whole 64-wide swizzle atom (head dim 128),
  // else by keys (head dim 64: each consumer's dQ sums over its own 64 keys, all columns, and
  // both are reduced into the same rows). With 128 queries per step, by queries: consumer c
  // takes queries c*64 .. c*64+63, all columns, over all BN keys, so every dQ row is reduced
  // once per step instead of twice (at head dim 64 the reductions' fp32 traffic is as large,
  // per FLOP, as twice head dim 128's; kernels/NOTES.md, "Backward at head dim 64: 128 queries
  // per step").
  static constexpr bool kDqByQueries = BM == 64 * NWG;
  static constexpr bool kDqByKeys = !kDqByQueries && D / NWG < 64;
  static constexpr int DQN = kDqByKeys || kDqByQueries ? D : D / NWG;  // dQ columns per consumer
  static constexpr int DQK = kDqByKeys ? BN / NWG : BN;                // keys its dQ sums over
  static constexpr int DQM = 64;                                        // its dQ rows (queries)
  static constexpr bool kDqByCols = !kDqByKeys && !kDqByQueries;
  static constexpr int kKBytes = BN * D * 2;    // K or V
  static constexpr int kQBytes = BM * D * 2;    // one stage of Q or dO
  static constexpr int kDsBytes = BN * BM * 2;  // one dS^T buffer: [BN keys][BM queries]
  // A query block's LSE or delta arrives as a box of a 1-d map that starts at the 16-byte
  // aligned element at or below the block's first row (TMA faults on an innermost start that
  // is not 16-byte aligned): up to 3 floats ahead of the block, then its BM rows. Each box
  // in a 128-byte aligned slot (a TMA destination).
  static constexpr int kRowLead = 4;                      // floats per 16 bytes
  static constexpr int kRowBox = BM + kRowLead;           // floats per box
  static constexpr int kRowSlotBytes = (kRowBox * 4 + 127) / 128 * 128;
  static constexpr int kOffV = kKBytes;
  static constexpr int kOffQ = 2 * kKBytes;
  static constexpr int kOffDO = kOffQ + 2 * kQBytes;
  static constexpr int kOffDS = kOffDO + 2 * kQBytes;
  // dQ staging as flash_bwd_wgmma.cuh: per consumer a [DQM, DQN] fp32 tile, DQN / 32 boxes
  // of [DQM, 32] in the 128-byte swizzle; one per consumer, which its next step stages into
  // again once the dQ writer has seen the reduction read it (the dQ barriers below).
  static constexpr int kDqBoxBytes = DQM * 32 * 4;
  static constexpr int kDqTileBytes = (DQN / 32) * kDqBoxBytes;
  static constexpr int kOffDQ = kOffDS + 2 * kDsBytes;
  static constexpr int kOffRows = kOffDQ + NWG * kDqTileBytes;  // per stage: LSE, then delta
  // + 1 KB: the dynamic shared-memory base is rounded up to the 1 KB swizzle atom.
  static constexpr int kSmemBytes = kOffRows + 2 * 2 * kRowSlotBytes + 1024;
  // Bytes a stage's full barrier expects: Q, dO, LSE, delta; K and V on kv_full.
  static constexpr uint32_t kStageBytes = 2 * kQBytes + 2 * kRowBox * 4;
  static constexpr uint32_t kKvBytes = 2 * kKBytes;
  // setmaxnreg (multiples of 8): the launch gives 384 threads 168 registers each (65536 /
  // 384, rounded down to 8); the producer's one thread and the dQ writer's warp only walk the
  // query blocks, the consumers hold dK, dV (64 + 64), S^T, dP^T (32 + 32) and dQ (32)
  // accumulators.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;
  // Named barriers: 1 for the consumers' dS^T (256 threads; by keys, each consumer's dQ reads
  // its own dS^T rows only and meets on its own, 2 + c). Consumer c's dQ tile between it and
  // the dQ writer (warp 1 of the producer warpgroup; 128 + 32 threads, the side that only
  // signals arrives): kDqFull0 + c, staged (the consumer arrives, the writer waits), and
  // kDqEmpty0 + c, read by its reduction (the writer arrives, the consumer waits).
  static constexpr int kDsBarrier = 1;
  static constexpr int kDqBarrier0 = 2;
  static constexpr int kDqFull0 = kDqBarrier0 + NWG;
  static constexpr int kDqEmpty0 = kDqFull0 + NWG;
  static constexpr int kDqHandoffThreads = 128 + 32;
  static_assert((D == 64 || D == 128) && DQN == 64, "warp-specialised wgmma backward: dQ as m64n64 per consumer");
  static_assert(BM == 64 || (BM == 128 && D == 64), "warp-specialised wgmma backward: 128 queries per step at head dim 64 only");
  static_assert(kDqByQueries || BM == DQM, "dQ rows: a consumer's are the step's, or its own 64 of them");
  static_assert(kOffDQ % 1024 == 0 && kOffDS % 1024 == 0, "swizzled tiles must start on a 1 KB atom");
  static_assert(kOffRows % 128 == 0 && kRowSlotBytes % 128 == 0, "TMA destinations: 128-byte aligned");
  static_assert(BM % kRowLead == 0, "a query block starts kRowLead-aligned within its head");
  static_assert(kSmemBytes <= 227 * 1024, "warp-specialised wgmma backward: shared memory");
  static_assert(128 * kProducerRegs + kConsumers * kConsumerRegs <= 65536, "setmaxnreg: register file");
};

template <typename T, int D, int BM_>
__global__ void __launch_bounds__(BwdWsShape<D, BM_>::kThreads, 1)
    flash_bwd_wgmma_ws_kernel(const __grid_constant__ BwdWsParams a) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using S = BwdWsShape<D, BM_>;
  using Step = BwdWgStep<T, D, S>;
  constexpr int BN = S::BN, BM = S::BM, DQN = S::DQN;
  constexpr int KQ = Step::KQ;  // k steps of dV and dK (queries)
  const BwdParams& p = a.p;

  extern __shared__ unsigned char smem[];
  __shared__ __align__(8) uint64_t bars[5];
  const uint32_t sK = (smem_addr(smem) + 1023u) & ~1023u;
  const uint32_t sV = sK + S::kOffV;
  const uint32_t sQ = sK + S::kOffQ;    // stage s at + s * kQBytes
  const uint32_t sdO = sK + S::kOffDO;  // stage s at + s * kQBytes
  const uint32_t sdS = sK + S::kOffDS;  // buffer (it & 1) at + (it & 1) * kDsBytes
  const uint32_t sDQ = sK + S::kOffDQ;  // tile (parity, consumer) at + (parity * NWG + c) * kDqTileBytes
  const uint32_t sRowsAddr = sK + S::kOffRows;
  const float* sRows = reinterpret_cast<const float*>(smem + (sRowsAddr - smem_addr(smem)));
  const uint32_t kv_full = smem_addr(bars);
  const uint32_t full = kv_full + 8;   // + 8 * stage
  const uint32_t empty = full + 2 * 8;  // + 8 * stage

  const int tid = threadIdx.x;
  const int wg = tid >> 7;
  if (tid == 0) {
    mbar_init(kv_full, 1);
#pragma unroll
    for (int s = 0; s < 2; ++s) {
      mbar_init(full + 8 * s, 1);
      mbar_init(empty + 8 * s, S::kConsumers);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const KeyBlockWork work = key_block_work<BN, BM>(p);
  const int b = work.b, hk = work.hk, group = work.group, n0 = work.n0;
  const int num_mb = work.num_mb, mb_first = work.mb_first, iters = work.iters;

  // In the deterministic mode (p.dq_accum null) flash_bwd_dq.cuh computes dQ: the consumers
  // compute and stage theirs all the same (no branch between their wgmmas: BwdWgStep::dq_dk_gemm)
  // and the writer keeps the barriers' rhythm without reducing.
  const bool dq_here = p.dq_accum != nullptr;

  if (wg == 0) {
    setmaxnreg_dec<S::kProducerRegs>();
    if ((tid >> 5) == 1) {
      // -------------------------------------------------------------- dQ writer
      // Each step: consumer c's staged tile added into the accumulator by one lane's bulk
      // reductions as soon as it is staged (kDqFull0 + c); once both have been read, each
      // consumer may stage into its tile again (kDqEmpty0 + c). The consumers never wait on
      // a reduction's issue or read, only on a release a whole step old. Its first release is
      // the arrival before the loop; after the last step none, so no barrier is left with
      // arrivals pending when the CTA exits.
      if (iters == 0) return;
      const int lane = tid & 31;
#pragma unroll
      for (int c = 0; c < S::NWG; ++c) named_bar_arrive(S::kDqEmpty0 + c, S::kDqHandoffThreads);
      int h = hk * group, m0 = mb_first * BM;
#pragma unroll 1
      for (int it = 0; it < iters; ++it) {
#pragma unroll
        for (int c = 0; c < S::NWG; ++c) {
          named_bar_sync(S::kDqFull0 + c, S::kDqHandoffThreads);
          if (dq_here && lane == 0)
            Step::issue_dq_reduction(p.dq_accum_map, sDQ + c * S::kDqTileBytes, S::kDqByCols ? c * DQN : 0,
                                     m0 + (S::kDqByQueries ? c * S::DQM : 0), h, b);
        }
        if (lane == 0) bulk_wait_read<0>();  // both tiles read (shared memory stays until then)
        __syncwarp();
        if (it + 1 < iters) {
#pragma unroll
          for (int c = 0; c < S::NWG; ++c) named_bar_arrive(S::kDqEmpty0 + c, S::kDqHandoffThreads);
        }
        if (m0 + BM >= num_mb * BM) {
          ++h;
          m0 = mb_first * BM;
        } else {
          m0 += BM;
        }
      }
      return;
    }
    // ---------------------------------------------------------------- producer
    if (tid != 0) return;
    tma_prefetch_map(a.q);
    tma_prefetch_map(a.dout);
    tma_prefetch_map(a.lse);
    tma_prefetch_map(a.delta);
    // K and V even where no query block follows (a key block no query sees): the consumers
    // wait for them either way, so nothing is in flight when the CTA exits.
    mbar_arrive_expect_tx(kv_full, S::kKvBytes);
    tma_load_tile<BN, D>(sK, a.k, n0, hk, b, kv_full);
    tma_load_tile<BN, D>(sV, a.v, n0, hk, b, kv_full);
    int h = hk * group, m0 = mb_first * BM;
#pragma unroll 1
    for (int it = 0; it < iters; ++it) {
      const int stage = it & 1;
      mbar_wait(empty + 8 * stage, ((it >> 1) & 1) ^ 1);
      const uint32_t bar = full + 8 * stage;
      mbar_arrive_expect_tx(bar, S::kStageBytes);
      tma_load_tile<BM, D>(sQ + stage * S::kQBytes, a.q, m0, h, b, bar);
      tma_load_tile<BM, D>(sdO + stage * S::kQBytes, a.dout, m0, h, b, bar);
      // bwd_launch refuses more than 2^31 - 1 rows, so the row index fits the coordinate.
      const int row = ((b * p.heads + h) * p.len_q + m0) & ~(S::kRowLead - 1);
      const uint32_t rows = sRowsAddr + stage * 2 * S::kRowSlotBytes;
      tma_load_1d(rows, a.lse, row, bar);
      tma_load_1d(rows + S::kRowSlotBytes, a.delta, row, bar);
      if (m0 + BM >= num_mb * BM) {
        ++h;
        m0 = mb_first * BM;
      } else {
        m0 += BM;
      }
    }
    return;
  }

  // ------------------------------------------------------------------ consumers
  setmaxnreg_inc<S::kConsumerRegs>();
  // Consumer cw takes keys cw*64 .. cw*64+63 of the block. Read from lane 0 so the compiler
  // knows it is the same in the whole warp: the descriptor bases built from it then live in
  // uniform registers, not in each thread's with a move to a uniform one before every wgmma.
  const int cw = __shfl_sync(0xffffffffu, wg, 0) - 1;
  const int wl = (tid >> 5) & 3;  // warp within the warpgroup: 16 of those keys
  const int lane = tid & 31;
  const int g = lane >> 2;  // row within an 8-row group of a fragment
  const int t = lane & 3;   // column pair within a fragment
  const int warp_key0 = cw * 64 + wl * 16;
  const float scale_log2 = p.scale * kLog2e;

  // The step's registers and descriptor bases (flash_bwd_wgmma_step.cuh; the same lines in
  // flash_bwd_wgmma.cuh, BwdWgStep says why they are not shared).
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  float s[BM / 2], dp[BM / 2], dq[DQN / 2];
  uint32_t pf[KQ][4], dsf[KQ][4];
  // K and V rows of this consumer (K-major A of S^T, dP^T); K's column block of its dQ
  // columns (N-major B of dQ), and the first 16-key step of the keys its dQ sums over (dS^T
  // rows and K rows alike).
  // As descriptors (BwdWgStep::k_major, n_major), built once; the step's buffers' are offsets
  // from their first.
  const uint64_t k_rows = Step::k_major(sK + cw * 64 * 128);
  const uint64_t v_rows = Step::k_major(sV + cw * 64 * 128);
  const uint64_t k_cols = Step::template n_major<BN>(sK + (S::kDqByCols ? (cw * DQN / 64) * BN * 128 : 0));
  const uint64_t q_k0 = Step::k_major(sQ), dout_k0 = Step::k_major(sdO);
  const uint64_t q_n0 = Step::template n_major<BM>(sQ), dout_n0 = Step::template n_major<BM>(sdO);
  const int dq_kk0 = S::kDqByKeys ? cw * (S::DQK / 16) : 0;
  // By queries, this consumer's dQ rows: its 64 of the step's queries, dS^T's column block cw.
  const uint64_t ds_n = Step::template n_major<BN>(sdS + (S::kDqByQueries ? cw * BN * 128 : 0));

  mbar_wait(kv_full, 0);
  int h = hk * group, m0 = mb_first * BM;
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    const bool head_end = m0 + BM >= num_mb * BM;
    const int h_next = head_end ? h + 1 : h;
    const int m0_next = head_end ? mb_first * BM : m0 + BM;
    const int stage = it & 1;
    const uint32_t stage_off = stage * S::kQBytes;
    const uint32_t sdSb = sdS + stage * S::kDsBytes;
    // The block's first row within its LSE and delta boxes (m0 is a multiple of kRowLead).
    const int lead = ((b * p.heads + h) * p.len_q) & (S::kRowLead - 1);
    const float* lse_s = sRows + stage * 2 * (S::kRowSlotBytes / 4) + lead;
    const float* delta_s = lse_s + S::kRowSlotBytes / 4;
    mbar_wait(full + 8 * stage, (it >> 1) & 1);  // TMA wrote through the async proxy: no fence

    Step::scores_issue(s, dp, k_rows, v_rows, wgmma_desc_at(q_k0, stage_off), wgmma_desc_at(dout_k0, stage_off));
    // The step's LSE (in base 2: BwdParams::lse_log2) read while S^T runs, not after its wait
    // (as FlashAttention-3 does): element i's query is (i>>2)*8 + 2t + (i&1), so BM / 4 values.
    // With 128-row steps the 32 registers are not there (ptxas spilled 24 bytes): read after.
    constexpr bool kLseAhead = BM == 64;
    float lse_ahead[kLseAhead ? BM / 4 : 1];
    if constexpr (kLseAhead) {
#pragma unroll
      for (int j = 0; j < BM / 4; ++j) lse_ahead[j] = lse_s[(j >> 1) * 8 + 2 * t + (j & 1)];
    }
    auto lse_of = [&](int i) {
      if constexpr (kLseAhead) return lse_ahead[2 * (i >> 2) + (i & 1)];
      else return lse_s[(i >> 2) * 8 + 2 * t + (i & 1)];
    };
    Step::s_done(s);

    // ---- P^T: element i is key warp_key0 + g + 8*((i>>1)&1), query (i>>2)*8 + 2t + (i&1)
    // (the lines of flash_bwd_wgmma.cuh, which reads the natural-log LSE; BwdWgStep says why
    // they are not shared)
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
        s[i] = exp2_ftz(fmaf(hidden ? -INFINITY : s[i], scale_log2, -lse_of(i)));
      }
    } else {
#pragma unroll
      for (int i = 0; i < BM / 2; ++i) s[i] = exp2_ftz(fmaf(s[i], scale_log2, -lse_of(i)));
    }

    if constexpr (S::kDqByQueries) {  // 128 queries: dS^T before dV (BwdWgStep::dp_done says why)
      Step::dp_done(dp);
      Step::ds(dp, dsf, s, delta_s, sdSb, warp_key0, g, t);
      Step::dv_issue(dv, pf, s, wgmma_desc_at(dout_n0, stage_off));
    } else {
      Step::dv_gemm(dv, pf, s, dp, wgmma_desc_at(dout_n0, stage_off));
      Step::ds(dp, dsf, s, delta_s, sdSb, warp_key0, g, t);
    }
    fence_proxy_async_smem();  // this thread's dS^T stores, for the dQ wgmma's reads (async proxy)
    // dS^T written (both consumers', or by keys this one's).
    if constexpr (S::kDqByKeys) {
      named_bar_sync(S::kDqBarrier0 + cw, 128);
    } else {
      named_bar_sync(S::kDsBarrier, S::kConsumers);
    }
    // dQ, then dK; dQ staged while dK runs, into the tile the writer released a step ago.
    Step::dq_dk_gemm(dq, dk, dsf, wgmma_desc_at(ds_n, stage * S::kDsBytes), k_cols, dq_kk0,
                     wgmma_desc_at(q_n0, stage_off));
    named_bar_sync(S::kDqEmpty0 + cw, S::kDqHandoffThreads);
    Step::stage_dq(dq, sDQ + cw * S::kDqTileBytes, wl, g, t);
    named_bar_arrive(S::kDqFull0 + cw, S::kDqHandoffThreads);
    Step::dk_done(dk, dv, pf, dsf);
    mbar_arrive(empty + 8 * stage);  // Q, dO, LSE and delta of this stage read: the producer may refill it
    h = h_next;
    m0 = m0_next;
  }
  Step::store(dk, dv, p, b, hk, n0, warp_key0, g, t);
#else
  __trap();  // built without sm_90a: never launched (the launch table lists it only for sm_90a builds)
#endif
}

}  // namespace
}  // namespace flashwatt
