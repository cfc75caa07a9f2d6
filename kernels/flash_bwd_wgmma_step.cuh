// flashwatt attention backward on Hopper (sm_90a): the step of one 64-key warpgroup (its
// five GEMMs and the arithmetic between them) and the dK/dV store after the last step,
// shared by the two wgmma backward kernels: wgmma_n128_m64_w8 (flash_bwd_wgmma.cuh: every
// warpgroup copies and computes; cp.async stages, CTA barriers) and wgmma_ws_n128_m64_w12
// (flash_bwd_wgmma_ws.cuh: a producer warpgroup copies by TMA into a ring; the consumers meet
// on named barriers).
//
// Why shared: the warp-specialised tile runs the lockstep tile's step unchanged, so that its
// dK and dV are the same bits (the GPU tests compare the two tiles bit for bit). While it was
// being measured that step was a hand copy, so that neither kernel's instructions moved; it
// is now measured and the Hopper default (kernels/NOTES.md, "Backward warp-specialised:
// measured"), and two copies could only drift apart. Each kernel keeps what differs between
// them: where a step's Q, dO, LSE and delta sit (cp.async stage, or ring stage with the LSE/delta boxes'
// lead), which dS^T buffer it writes (one, or two by step parity), the barrier that publishes
// dS^T before dQ (CTA barrier or the consumers' named barrier), the named barrier of each
// warpgroup's dQ tile, and the ring's stage release after the step's last wait (none in the
// lockstep tile); those reach the step as arguments, or sit between its calls.
// Every function is inlined. When the step was first shared, the kernels' PTX was exactly the
// one they had with the copy (every entry of flash_bwd.cu compared for sm_80 and sm_90a), and
// what could not be shared without changing it stayed in the kernels (BwdWgStep says what);
// the warp-specialised tile has since moved on (kernels/NOTES.md, "Backward: instructions off
// the consumers' chain", "Backward: dQ to a writer warp"), its dK and dV still the same bits.
//
// The algorithm, per step, for warpgroup w (keys w*64 .. w*64+63 of the CTA's block):
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
// Shared-memory tiles use the wgmma 128-byte swizzle of the forward (flash_fwd_wgmma.cuh): a
// [rows, D] tile is D/64 column blocks of [rows, 64]; row r of a block sits at r*128 bytes
// and its 16-byte chunk c at position c ^ (r % 8).
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
#include "wgmma.cuh"

namespace flashwatt {
namespace {

// m64n64k16, A and B from shared memory, both transposed (M-major A, N-major B): dQ = dS K.
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

// The step of one 64-key warpgroup in pieces, in the order a kernel runs them. In
// wgmma_n128_m64_w8 (every warpgroup copies, computes and reduces its own dQ):
//   scores(s, dp, ..)          S^T and dP^T issued (two commit groups); S^T waited for
//   P^T into s                 the kernel's own lines (below: kept in the kernels)
//   dv_gemm(dv, pf, s, dp, ..) P^T packed into A fragments; dV issued; dP^T waited for
//   ds(dp, dsf, s, ..)         dS^T = P^T (dP^T - delta), into registers and shared memory
//   dk_gemm(dk, dsf, ..)       dK issued; this thread's dS^T stores fenced for the async proxy
//   the kernel's barrier that publishes dS^T to dQ; dq_here = p.dq_accum != nullptr
//   dq_gemm(dq, ..)            dQ issued; every wgmma of the step waited for
//   reduce_dq(dq, ..)          if dq_here: dQ staged and added by one thread's bulk reductions
// In the warp-specialised tiles (a warp of the producer warpgroup reduces dQ):
//   scores, P^T; at 64 queries dv_gemm then ds, at 128 dp_done, ds, dv_issue (dp_done says why)
//   the kernel's fence of the dS^T stores and its barrier that publishes dS^T to dQ
//   dq_dk_gemm(dq, dk, ..)     dQ issued, then dK; dQ waited for
//   stage_dq(dq, ..)           dQ into the warpgroup's staging tile, between the writer's
//                              barriers, while dK runs
//   dk_done(..)                every wgmma of the step waited for; then the ring's stage
//                              release (after this, nothing reads the step's Q, dO, LSE, delta)
// and after the last step store(dk, dv, ..). S is the kernel's shape: BN keys per CTA, BM
// queries per step, NWG computing warpgroups, the dQ split (kDqByKeys, and DQN columns over
// DQK keys per warpgroup) and the dQ staging tiles (kDqBoxBytes, kDqTileBytes).
// Fragment coordinates, as the kernels compute them: warpgroup wg holds keys wg*64 ..
// wg*64+63 of the block and its warp wl 16 of them, from warp_key0 = wg*64 + wl*16; lane
// = 4g + t, g the row within an 8-row group of a fragment, t the column pair.
//
// Kept in the kernels, because sharing them changed the kernels' PTX when tried (the functions
// below did not):
//   * the register arrays (dk, dv, s, dp, dq, pf, dsf), dK and dV's zeroing, and the
//     descriptor bases (k_rows, v_rows, k_cols, dq_kk0, dq_col0): the functions take the
//     kernel's arrays by reference, the bases as descriptors (k_major, n_major) and the
//     fragment coordinates as ints. The arrays or the coordinates held in a struct, or the
//     bases returned in one, gave other PTX.
//   * the P^T lines (the mask and exp2): in a function, the mask's loads of p.len_k, p.len_q,
//     p.causal and p.causal_offset under || and && compiled to other branches and predicates,
//     with masked computed in the kernel too. A likely reason: cicc simplifies a function's
//     body on its own before inlining it, and there p is a plain reference whose loads it
//     does not speculate as it does those of the kernel's parameter.
template <typename T, int D, typename S>
struct BwdWgStep {
  using Ops = TypeOps<T>;
  static constexpr int BN = S::BN, BM = S::BM, DQN = S::DQN;
  static constexpr int KD = D / 16;   // k steps of S^T and dP^T (head dim)
  static constexpr int KQ = BM / 16;  // k steps of dV and dK (queries)

  // Every wgmma's operands are descriptors built once per buffer by the kernel (k_major and
  // n_major below) plus an offset (wgmma_desc_at): built from the address at every wgmma they
  // took five uniform instructions each, on the step's chain.
  //   k_major(addr): a K-major operand (S^T's and dP^T's A and B), leading offset unused;
  //   n_major<ROWS>(addr): an N-major B of ROWS rows (dV's dO, dK's Q: BM rows; dQ's K: BN),
  //   and dQ's M-major A (dS^T, BN rows): column blocks ROWS * 128 bytes apart.
  static __device__ __forceinline__ uint64_t k_major(uint32_t addr) { return wgmma_desc_sw128(addr, 16, 1024); }
  template <int ROWS>
  static __device__ __forceinline__ uint64_t n_major(uint32_t addr) {
    return wgmma_desc_sw128(addr, ROWS * 128, 1024);
  }

  // ---- S^T = K Q^T and dP^T = V dO^T (two commit groups), then S^T waited for (scores_issue,
  // s_done). k_rows, v_rows: the warpgroup's 64 rows of K and V (K-major A); q, dout: the
  // step's Q and dO tiles [BM, D] (K-major B).
  static __device__ __forceinline__ void scores(float (&s)[BM / 2], float (&dp)[BM / 2], uint64_t k_rows,
                                                uint64_t v_rows, uint64_t q, uint64_t dout) {
    scores_issue(s, dp, k_rows, v_rows, q, dout);
    s_done(s);
  }

  static __device__ __forceinline__ void scores_issue(float (&s)[BM / 2], float (&dp)[BM / 2], uint64_t k_rows,
                                                      uint64_t v_rows, uint64_t q, uint64_t dout) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const uint32_t off = (kk & 3) * 32;
      wgmma_ss(s, wgmma_desc_at(k_rows, (kk >> 2) * BN * 128 + off), wgmma_desc_at(q, (kk >> 2) * BM * 128 + off),
               kk > 0 ? 1 : 0, T{});
    }
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < KD; ++kk) {
      const uint32_t off = (kk & 3) * 32;
      wgmma_ss(dp, wgmma_desc_at(v_rows, (kk >> 2) * BN * 128 + off), wgmma_desc_at(dout, (kk >> 2) * BM * 128 + off),
               kk > 0 ? 1 : 0, T{});
    }
    wgmma_commit();
  }

  static __device__ __forceinline__ void s_done(float (&s)[BM / 2]) {
    wgmma_wait<1>();  // S^T done; dP^T may still run
    fence_regs(s);
  }

  // ---- x (P^T or dS^T accumulators, m64 x BM) packed into 16-bit A fragments, one per k step
  // of 16 queries (the m64nN accumulator layout is the A-fragment layout).
  static __device__ __forceinline__ void pack_a(uint32_t (&f)[KQ][4], const float (&x)[BM / 2]) {
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) {
      f[kk][0] = Ops::pack(x[8 * kk + 0], x[8 * kk + 1]);
      f[kk][1] = Ops::pack(x[8 * kk + 2], x[8 * kk + 3]);
      f[kk][2] = Ops::pack(x[8 * kk + 4], x[8 * kk + 5]);
      f[kk][3] = Ops::pack(x[8 * kk + 6], x[8 * kk + 7]);
    }
  }

  // ---- acc += A B over the step's BM queries: A from the fragments f, B the step's [BM, D]
  // tile (dO for dV, Q for dK), N-major (n_major<BM>). Issued only: the caller fences and commits.
  static __device__ __forceinline__ void rs_chain(float (&acc)[D / 2], const uint32_t (&f)[KQ][4], uint64_t b) {
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk) wgmma_rs(acc, f[kk], wgmma_desc_at(b, kk * 16 * 128), 1, T{});
  }

  // ---- dV += P^T dO: P^T (s, after the kernel's P^T lines) packed into the A fragments pf.
  static __device__ __forceinline__ void dv_gemm(float (&dv)[D / 2], uint32_t (&pf)[KQ][4], const float (&s)[BM / 2],
                                                 float (&dp)[BM / 2], uint64_t dout_n) {
    pack_a(pf, s);
    wgmma_fence();
    rs_chain(dv, pf, dout_n);
    wgmma_commit();
    wgmma_wait<1>();  // dP^T done; dV may still run
    fence_regs(dp);
  }

  // ---- With 128 queries per step (wgmma_ws_n128_m128_w12) the order differs: S^T, P^T and
  // dP^T hold 64 + 64 registers, and P^T packed for dV beside them (the order above, dV
  // issued before dS^T) needs 32 more than a consumer's 240 with dK, dV and the rest (ptxas
  // spilled and serialised the wgmmas). So dP^T is waited for first (dp_done), dS^T computed
  // (ds, below), and only then P^T packed and dV issued (dv_issue): the dS^T arithmetic no
  // longer runs under this warpgroup's dV, but under the other consumer's GEMMs.
  static __device__ __forceinline__ void dp_done(float (&dp)[BM / 2]) {
    wgmma_wait<0>();  // dP^T done
    fence_regs(dp);
  }

  // ---- dV += P^T dO issued alone (128 queries a step, after dS^T: BwdWgStep::dp_done says why);
  // dK goes with dQ after the dS^T barrier (dq_dk_gemm).
  static __device__ __forceinline__ void dv_issue(float (&dv)[D / 2], uint32_t (&pf)[KQ][4], const float (&s)[BM / 2],
                                                  uint64_t dout_n) {
    pack_a(pf, s);
    wgmma_fence();
    rs_chain(dv, pf, dout_n);
    wgmma_commit();
  }

  // ---- The warp-specialised step's end (wgmma_ws_ tiles), after the dS^T barrier: dQ issued,
  // then dK (dK += dS^T Q), two commit groups, and dQ waited for alone, so that the kernel
  // stages dQ for the reduction while dK still runs (dk_done waits for it). A = dS^T (ds:
  // n_major<BN> of its buffer) from 16-key step dq_kk0 on, B = K (k_cols: n_major<BN> of the
  // warpgroup's column block); q_n: the step's Q, n_major<BM>. dQ is computed whether or not
  // the kernel keeps it: a wgmma under a branch makes ptxas insert warpgroup.arrive and spill.
  static __device__ __forceinline__ void dq_dk_gemm(float (&dq)[DQN / 2], float (&dk)[D / 2],
                                                    const uint32_t (&dsf)[KQ][4], uint64_t ds, uint64_t k_cols,
                                                    int dq_kk0, uint64_t q_n) {
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < S::DQK / 16; ++kk)
      bwd_wgmma_ss_tt(dq, wgmma_desc_at(ds, (dq_kk0 + kk) * 16 * 128), wgmma_desc_at(k_cols, (dq_kk0 + kk) * 16 * 128),
                      kk > 0 ? 1 : 0, T{});
    wgmma_commit();
    rs_chain(dk, dsf, q_n);
    wgmma_commit();
    wgmma_wait<1>();  // dQ done; dK may still run
    fence_regs(dq);
  }

  // ---- every wgmma of the step done (dK last); the registers they wrote or read fenced.
  static __device__ __forceinline__ void dk_done(float (&dk)[D / 2], float (&dv)[D / 2], uint32_t (&pf)[KQ][4],
                                                 uint32_t (&dsf)[KQ][4]) {
    wgmma_wait<0>();
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);
  }

  // ---- dS^T = P^T (dP^T - delta), into dp, packed into dsf (A of dK) and stored to sdS, the
  // dS^T buffer [BN keys][BM queries] the step's dQ reads. delta: the step's BM rows.
  static __device__ __forceinline__ void ds(float (&dp)[BM / 2], uint32_t (&dsf)[KQ][4], const float (&s)[BM / 2],
                                            const float* delta, uint32_t sdS, int warp_key0, int g, int t) {
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) dp[i] = s[i] * (dp[i] - delta[(i >> 2) * 8 + 2 * t + (i & 1)]);
    pack_a(dsf, dp);
    // dsf[kk][0], [2]: key row warp_key0 + g, queries 16kk + 2t (+1) and 16kk + 8 + 2t (+1)
    // (16-byte chunks 2kk and 2kk + 1); [1], [3]: key row warp_key0 + g + 8. Those are the
    // four 8x8 matrices of one stmatrix.x4 (register j of a lane: row g, columns 2t, 2t + 1 of
    // matrix j), so a k step is one instruction, not four 32-bit stores with their addresses:
    // lane 8j + r gives row r of matrix j, key row warp_key0 + r + 8 (j & 1), chunk
    // 2kk + (j >> 1), whose 16 bytes are contiguous under the swizzle.
    const int lane = 4 * g + t, j = lane >> 3;
    const int row = warp_key0 + (lane & 7) + 8 * (j & 1);
#pragma unroll
    for (int kk = 0; kk < KQ; ++kk)
      asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                       sdS + bwd_sw128_off<BN>(row, 2 * kk + (j >> 1))),
                   "r"(dsf[kk][0]), "r"(dsf[kk][1]), "r"(dsf[kk][2]), "r"(dsf[kk][3]));
  }

  // ---- dK += dS^T Q; then this thread's dS^T stores fenced for the async proxy (dQ's wgmma
  // reads them), ahead of the kernel's barrier that publishes them.
  static __device__ __forceinline__ void dk_gemm(float (&dk)[D / 2], const uint32_t (&dsf)[KQ][4], uint64_t q_n) {
    wgmma_fence();
    rs_chain(dk, dsf, q_n);
    wgmma_commit();
    fence_proxy_async_smem();
  }

  // ---- dQ (64 queries x DQN columns of this warpgroup) = dS K over its DQK keys, after the
  // kernel's dS^T barrier: A = dS^T (ds: n_major<BN> of its buffer) from 16-key step dq_kk0 on,
  // B = K (k_cols: n_major<BN> of the warpgroup's column block). Then every wgmma of the step is waited for, and the registers
  // the tensor cores wrote or read are fenced. The kernel computes dQ whether or not it keeps
  // it (reduce_dq): a wgmma under a branch makes ptxas insert warpgroup.arrive and spill.
  static __device__ __forceinline__ void dq_gemm(float (&dq)[DQN / 2], float (&dk)[D / 2], float (&dv)[D / 2],
                                                 uint32_t (&pf)[KQ][4], uint32_t (&dsf)[KQ][4], uint64_t ds,
                                                 uint64_t k_cols, int dq_kk0) {
#pragma unroll
    for (int kk = 0; kk < S::DQK / 16; ++kk)
      bwd_wgmma_ss_tt(dq, wgmma_desc_at(ds, (dq_kk0 + kk) * 16 * 128), wgmma_desc_at(k_cols, (dq_kk0 + kk) * 16 * 128),
                      kk > 0 ? 1 : 0, T{});
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs(dq);
    fence_regs(dk);
    fence_regs(dv);
    fence_regs(pf);
    fence_regs(dsf);
  }

  // ---- dQ of this warpgroup (64 queries x DQN columns, fp32) into its staging tile at `tile`,
  // then fenced for the async proxy (the bulk reduction reads it).
  // Element i of dq: query wl*16 + g + 8*((i>>1)&1), column (i>>2)*8 + 2t + (i&1) of its DQN.
  // Staged as float2 at column 8j + 2t of row wl*16 + g + 8r: box j / 4, 16-byte chunk
  // 2 (j % 4) + t / 2 of the row's 128 bytes, swizzled by row % 8 = g, so the 8 rows of a
  // store land on 8 different chunk positions (no bank conflict).
  static __device__ __forceinline__ void stage_dq(const float (&dq)[DQN / 2], uint32_t tile, int wl, int g, int t) {
    const uint32_t row_base = tile + (wl * 16 + g) * 128 + (t & 1) * 8;
#pragma unroll
    for (int j = 0; j < DQN / 8; ++j) {
      const uint32_t chunk = static_cast<uint32_t>(((2 * (j & 3) + (t >> 1)) ^ g) << 4);
#pragma unroll
      for (int r = 0; r < 2; ++r)
        asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(row_base + (j >> 2) * S::kDqBoxBytes + r * 8 * 128 + chunk),
                     "f"(dq[4 * j + 2 * r]), "f"(dq[4 * j + 2 * r + 1]));
    }
    fence_proxy_async_smem();  // the bulk reduction reads through the async proxy
  }

  // ---- a staged dQ tile added into the accumulator (map: p.dq_accum_map) at rows m0.. of head
  // h, batch b, columns dq_col0..: one thread's bulk reductions, one commit group.
  static __device__ __forceinline__ void issue_dq_reduction(const void* map, uint32_t tile, int dq_col0, int m0, int h,
                                                            int b) {
#pragma unroll
    for (int box = 0; box < DQN / 32; ++box) tma_reduce_add_4d(map, tile + box * S::kDqBoxBytes, dq_col0 + box * 32, m0, h, b);
    bulk_commit();
  }

  // ---- dQ into the accumulator from the warpgroup's own threads (wgmma_n128_m64_w8): staged
  // into its [BM, DQN] fp32 tile of this step's parity (sDQ: tile (parity, wg) at + (parity *
  // NWG + wg) * kDqTileBytes), then, after named barrier dq_barrier of the warpgroup's 128
  // threads, added by thread tid % 128 == 0's bulk reductions into rows m0.. of head h, batch b,
  // columns dq_col0...
  static __device__ __forceinline__ void reduce_dq(const float (&dq)[DQN / 2], const void* map, uint32_t sDQ,
                                                   int parity, int wg, int tid, int wl, int g, int t, int dq_barrier,
                                                   int dq_col0, int m0, int h, int b) {
    const uint32_t tile = sDQ + (parity * S::NWG + wg) * S::kDqTileBytes;
    stage_dq(dq, tile, wl, g, t);
    named_bar_sync(dq_barrier, 128);  // this warpgroup's dQ tile staged
    if ((tid & 127) == 0) issue_dq_reduction(map, tile, dq_col0, m0, h, b);
  }

  // ---- after the last step: dK (times the softmax scale, once here) and dV of this warp's 16
  // keys of the block at n0 (batch b, k/v head hk), 32 bits per store.
  static __device__ __forceinline__ void store(const float (&dk)[D / 2], const float (&dv)[D / 2], const BwdParams& p,
                                               int b, int hk, int n0, int warp_key0, int g, int t) {
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
  }
};

}  // namespace
}  // namespace flashwatt
