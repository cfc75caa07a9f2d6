// flashwatt attention forward for the opt-in tf32 precision: fp32 inputs on tensor cores.
//
// mma.sync m16n8k8 with tf32 operands and fp32 accumulators. Q, K and V stay fp32 in
// shared memory and are rounded to tf32 (cvt.rna) as each fragment is read; P is the S
// accumulator, exponentiated in fp32 and rounded the same way. Softmax, masking and
// the output are as in the fp16/bf16 kernel. One CTA: 4 warps x 16 query rows; 32-row
// K/V tiles in a 2-stage cp.async ring. Shared-memory rows are padded by 4 words, which
// makes every fragment read below conflict-free (row pitch = 4 banks mod 32).
//
// P V needs P as an A fragment (row g holds keys t and t+4) while the accumulator holds
// keys 2t and 2t+1. Any order of the 8 keys of a k step gives the same sum as long as V
// is read in that order too, so A takes the keys as they are (logical k t -> key 2t,
// k t+4 -> key 2t+1) and B reads V rows 2t and 2t+1: no shuffles.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "flash_fwd.cuh"
#include "online_softmax.cuh"
#include "ptx.cuh"
#include "tile_schedule.cuh"

namespace flashwatt {
namespace {

constexpr int kT32BM = 64;
constexpr int kT32BN = 32;
constexpr int kT32Threads = 128;

template <int D>
struct T32Shape {
  static constexpr int kPitch = D + 4;  // floats per shared-memory row
  static constexpr int kSmemBytes = (kT32BM + 2 * 2 * kT32BN) * kPitch * 4;  // Q, 2 stages of K and V
  static_assert(D % 32 == 0, "tf32 kernel: head_dim a multiple of 32");
};

// Copies rows [row0, row0 + ROWS) of an fp32 [rows, D] tile into padded shared memory,
// 16 bytes per cp.async; rows at or past row_end are zero-filled.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile_f32(uint32_t dst, const float* __restrict__ src, int64_t row_stride,
                                              int row0, int row_end, int tid) {
  constexpr int CH = D / 4;
  constexpr int PITCH_BYTES = (D + 4) * 4;
  static_assert((ROWS * CH) % THREADS == 0, "tile loads must divide evenly");
#pragma unroll
  for (int it = 0; it < ROWS * CH / THREADS; ++it) {
    const int idx = tid + it * THREADS;
    const int r = idx / CH;
    const int c = idx % CH;
    const bool ok = row0 + r < row_end;
    const float* g = ok ? src + static_cast<int64_t>(row0 + r) * row_stride + c * 4 : src;
    cp_async16(dst + r * PITCH_BYTES + c * 16, g, ok ? 16 : 0);
  }
}

template <int D>
__global__ void __launch_bounds__(kT32Threads, 1) flash_fwd_tf32_kernel(const FwdParams p) {
  constexpr int BM = kT32BM, BN = kT32BN, THREADS = kT32Threads, P = T32Shape<D>::kPitch;
  constexpr int NT = BN / 8;  // 8-column n tiles of S
  constexpr int DT = D / 8;   // 8-column n tiles of O
  constexpr int KD = D / 8;   // k steps of Q K^T
  constexpr int KN = BN / 8;  // k steps of P V
  extern __shared__ __align__(16) float tsm[];
  const float* qs = tsm;
  const float* ks = tsm + BM * P;
  const float* vs = ks + 2 * BN * P;
  const uint32_t sQ = smem_addr(tsm);
  const uint32_t sK = sQ + BM * P * 4;
  const uint32_t sV = sK + 2 * BN * P * 4;

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int g = lane >> 2;
  const int t = lane & 3;
  const int warp_row0 = warp * 16;

  const TileGrid<BM, BN> grid(p);
  const float scale_log2 = p.scale * kLog2e;

#pragma unroll 1
  for (int tile = blockIdx.x; tile < grid.total; tile += gridDim.x) {
    const TileWork<float> w = grid.template work<float>(p, tile);
    const int b = w.b, h = w.h, m0 = w.m0, n_tiles = w.n_tiles;
    const float *gQ = w.q, *gK = w.k, *gV = w.v;

    __syncthreads();  // the previous tile's readers of shared memory are done
    load_tile_f32<BM, D, THREADS>(sQ, gQ, p.q_sl, m0, p.len_q, tid);
    load_tile_f32<BN, D, THREADS>(sK, gK, p.k_sl, 0, p.len_k, tid);
    load_tile_f32<BN, D, THREADS>(sV, gV, p.v_sl, 0, p.len_k, tid);
    cp_async_commit();

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[dt][e] = 0.f;
    }
    float row_max[2] = {-INFINITY, -INFINITY};
    float row_sum[2] = {0.f, 0.f};

#pragma unroll 1
    for (int j = 0; j < n_tiles; ++j) {
      if (j + 1 < n_tiles) {  // stage (j+1)%2 held tile j-1, released by the barrier ending iteration j-1
        const int slot = (j + 1) & 1;
        load_tile_f32<BN, D, THREADS>(sK + slot * BN * P * 4, gK, p.k_sl, (j + 1) * BN, p.len_k, tid);
        load_tile_f32<BN, D, THREADS>(sV + slot * BN * P * 4, gV, p.v_sl, (j + 1) * BN, p.len_k, tid);
      }
      cp_async_commit();
      cp_async_wait<1>();
      __syncthreads();  // tile j visible to all
      const float* kt = ks + (j & 1) * BN * P;
      const float* vt = vs + (j & 1) * BN * P;

      // ---- S = Q K^T
      float s[NT][4];
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = 0.f;
      }
#pragma unroll
      for (int kk = 0; kk < KD; ++kk) {
        const float* qr = qs + (warp_row0 + g) * P + kk * 8 + t;
        const uint32_t a[4] = {to_tf32(qr[0]), to_tf32(qr[8 * P]), to_tf32(qr[4]), to_tf32(qr[8 * P + 4])};
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const float* kr = kt + (nt * 8 + g) * P + kk * 8 + t;
          mma_tf32(s[nt], a, to_tf32(kr[0]), to_tf32(kr[4]));
        }
      }

      // ---- mask the ragged end of the keys and the diagonal
      const int n0 = j * BN;
      if (n0 + BN > p.len_k || (p.causal && n0 + BN - 1 - p.causal_offset > m0 + warp_row0)) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int row = m0 + warp_row0 + g + (e >> 1) * 8;
            const int col = n0 + nt * 8 + 2 * t + (e & 1);
            if (col >= p.len_k || (p.causal && col - p.causal_offset > row)) s[nt][e] = -INFINITY;
          }
        }
      }

      // ---- online softmax (base 2); P is rounded to tf32, so exp2_ftz is exact enough
      float alpha[2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
        alpha[r] = online_softmax_row<NT>([&](int nt, int e) -> float& { return s[nt][2 * r + e]; }, row_max[r],
                                          row_sum[r], scale_log2);
#pragma unroll
      for (int dt = 0; dt < DT; ++dt) {
        o[dt][0] *= alpha[0];
        o[dt][1] *= alpha[0];
        o[dt][2] *= alpha[1];
        o[dt][3] *= alpha[1];
      }

      // ---- O += P V, keys of each k step in the accumulator's order (header comment)
#pragma unroll
      for (int kk = 0; kk < KN; ++kk) {
        const uint32_t a[4] = {to_tf32(s[kk][0]), to_tf32(s[kk][2]), to_tf32(s[kk][1]), to_tf32(s[kk][3])};
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const float* vr = vt + (kk * 8 + 2 * t) * P + dt * 8 + g;
          mma_tf32(o[dt], a, to_tf32(vr[0]), to_tf32(vr[P]));
        }
      }
      __syncthreads();  // stage j&1 is refilled at iteration j+1
    }
    cp_async_wait<0>();  // only empty groups can be pending here

    // ---- epilogue: normalise, write LSE and O (8 bytes per lane and row)
    float* lse = p.lse + static_cast<int64_t>(b * p.heads + h) * p.len_q;
    float* gO = static_cast<float*>(p.o) + b * p.o_sb + h * p.o_sh;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float l = quad_sum(row_sum[r]);
      const float inv = l > 0.f ? 1.f / l : 0.f;
      const int row = m0 + warp_row0 + g + r * 8;
      if (row >= p.len_q) continue;
      if (t == 0) lse[row] = row_lse(row_max[r], l);
      float* orow = gO + static_cast<int64_t>(row) * p.o_sl;
#pragma unroll
      for (int dt = 0; dt < DT; ++dt)
        *reinterpret_cast<float2*>(orow + dt * 8 + 2 * t) = make_float2(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    }
  }
}

}  // namespace
}  // namespace flashwatt
