// The quantisation step of the fp8 attention forward: 16-bit q, k, v to e4m3 with one scale
// per (batch, head), and V written transposed for the P V wgmma.
//
// Per head h of a tensor x: amax = max |x[b, h]|, descale = amax / 448 (1 where amax is 0),
// x8 = e4m3(x * (448 / amax)) rounded to nearest, saturated at +-448 (cvt .satfinite). The
// attention kernel multiplies the scores by descale_q * descale_k (folded into the softmax
// scale) and the output by descale_v. Two launches for all three tensors: fp8_amax_kernel
// (one atomicMax per block into a zeroed float per head: non-negative floats order as their
// bit patterns) and fp8_cast_kernel, each over blockIdx.z = the tensor.
//
// V transposed. For 8-bit inputs wgmma reads B only K-major, so the P V product needs V^T
// (head dim rows, keys contiguous) in shared memory. It is written here, in the pass that
// casts V anyway, rather than transposed per tile in shared memory by the attention kernel:
// the cast reads and writes V once either way, and the attention kernel then loads V^T tiles
// as it loads K tiles. V^T of one head is [D, vt_cols] with vt_cols = len_k rounded up to 64
// (a multiple of 16 bytes for the copies; keys past len_k are zeros). Within every 32 keys
// the columns are permuted: column c holds key fp8_key_of_column(c), so that P, packed in
// the order its fp32 accumulators hold it, is already wgmma's A fragment (wgmma_fp8.cuh).
// Pre-quantised e4m3 V takes the same pass without a scale (fp8_cast_kernel with T = uint8_t).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flash_fp8.cuh"

namespace flashwatt {
namespace {

constexpr float kE4m3Max = 448.f;
constexpr int kQuantRows = kFp8KeyPad;  // rows (keys) of one tensor head per block
constexpr int kQuantThreads = 256;

// The key in column c of a 32-key group of V^T: thread t of a quad holds accumulator columns
// 2t, 2t+1, 8+2t, 8+2t+1 of each 16, which wgmma's k32 A fragment reads as columns 4t .. 4t+3.
__host__ __device__ constexpr int fp8_key_of_column(int c) {
  return (c & 16) + 2 * ((c & 15) >> 2) + (c & 1) + 8 * ((c >> 1) & 1);
}

template <typename T>
__device__ __forceinline__ float to_float(T x);
template <>
__device__ __forceinline__ float to_float<__half>(__half x) { return __half2float(x); }
template <>
__device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

// max |x| over this block's rows of one (batch, head) of one tensor, into amax (atomicMax on
// the bit pattern: every value is >= 0).
template <typename T, int D>
__global__ void __launch_bounds__(kQuantThreads) fp8_amax_kernel(const Fp8QuantParams p) {
  const Fp8Tensor& t = p.t[blockIdx.z];
  const int bh = blockIdx.x;  // (batch, head) in x: B * H may pass y's 65535
  if (bh >= p.batch * t.heads) return;
  const int row0 = blockIdx.y * kQuantRows;
  if (row0 >= t.len) return;
  const int b = bh / t.heads, h = bh % t.heads;
  const T* x = static_cast<const T*>(t.x) + b * t.sb + h * t.sh;
  constexpr int V = 8;  // elements per 16-byte load
  constexpr int PER_ROW = D / V;
  float m = 0.f;
  for (int i = threadIdx.x; i < kQuantRows * PER_ROW; i += kQuantThreads) {
    const int r = row0 + i / PER_ROW;
    if (r >= t.len) break;
    const uint4 raw = *reinterpret_cast<const uint4*>(x + static_cast<int64_t>(r) * t.sl + (i % PER_ROW) * V);
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int j = 0; j < V; ++j) m = fmaxf(m, fabsf(to_float(e[j])));
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ float warp_max[kQuantThreads / 32];
  if ((threadIdx.x & 31) == 0) warp_max[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
#pragma unroll
    for (int w = 1; w < kQuantThreads / 32; ++w) m = fmaxf(m, warp_max[w]);
    atomicMax(reinterpret_cast<int*>(t.amax + bh), __float_as_int(m));
  }
}

// Eight inputs scaled by `inv` (16-bit) or copied (e4m3 bytes) into eight e4m3 bytes.
template <typename T>
__device__ __forceinline__ uint2 to_e4m3x8(const uint4& raw, float inv) {
  if constexpr (sizeof(T) == 1) {
    return make_uint2(raw.x, raw.y);  // 16 bytes loaded, 8 used: the caller loads 8-byte halves
  } else {
    const T* e = reinterpret_cast<const T*>(&raw);
    uint32_t w[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      uint16_t lo, hi;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
          : "=h"(lo) : "f"(to_float(e[4 * k + 1]) * inv), "f"(to_float(e[4 * k]) * inv));
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
          : "=h"(hi) : "f"(to_float(e[4 * k + 3]) * inv), "f"(to_float(e[4 * k + 2]) * inv));
      asm("mov.b32 %0, {%1, %2};\n" : "=r"(w[k]) : "h"(lo), "h"(hi));
    }
    return make_uint2(w[0], w[1]);
  }
}

// This block's rows of one (batch, head) of one tensor in e4m3: row by row for q and k, as
// the permuted V^T for v (module comment). T = uint8_t: e4m3 inputs, copied (V^T only).
template <typename T, int D>
__global__ void __launch_bounds__(kQuantThreads) fp8_cast_kernel(const Fp8QuantParams p) {
  const Fp8Tensor& t = p.t[blockIdx.z];
  const int bh = blockIdx.x;  // (batch, head) in x: B * H may pass y's 65535
  if (bh >= p.batch * t.heads) return;
  const int row0 = blockIdx.y * kQuantRows;
  const int rows_out = t.transposed ? t.vt_cols : t.len;
  if (row0 >= rows_out) return;
  const int b = bh / t.heads, h = bh % t.heads;
  const T* x = static_cast<const T*>(t.x) + b * t.sb + h * t.sh;
  float inv = 1.f;
  if constexpr (sizeof(T) != 1) {
    const float amax = t.amax[bh];
    inv = amax > 0.f ? kE4m3Max / amax : 1.f;
    if (blockIdx.y == 0 && threadIdx.x == 0) t.descale[bh] = amax > 0.f ? amax / kE4m3Max : 1.f;
  }
  constexpr int V = 8;  // elements per conversion
  constexpr int PER_ROW = D / V;
  auto load8 = [&](int r, int c8) -> uint2 {  // elements c8*8 .. c8*8+7 of row r, zeros past len
    if (r >= t.len) return make_uint2(0u, 0u);
    const T* src = x + static_cast<int64_t>(r) * t.sl + c8 * V;
    if constexpr (sizeof(T) == 1) return *reinterpret_cast<const uint2*>(src);
    return to_e4m3x8<T>(*reinterpret_cast<const uint4*>(src), inv);
  };
  if (!t.transposed) {
    uint8_t* out = static_cast<uint8_t*>(t.out) + static_cast<int64_t>(bh) * t.len * D;
    for (int i = threadIdx.x; i < kQuantRows * PER_ROW; i += kQuantThreads) {
      const int r = row0 + i / PER_ROW;
      if (r >= t.len) break;
      *reinterpret_cast<uint2*>(out + static_cast<int64_t>(r) * D + (i % PER_ROW) * V) = load8(r, i % PER_ROW);
    }
    return;
  }
  // V^T: the block's 64 keys land in shared memory as e4m3 rows (padded by 4 bytes so that
  // the column reads below spread over the banks), then leave as 16-byte pieces of V^T rows.
  constexpr int PITCH = D + 4;
  __shared__ __align__(16) uint8_t tile[kQuantRows * PITCH];
  for (int i = threadIdx.x; i < kQuantRows * PER_ROW; i += kQuantThreads) {
    const int r = i / PER_ROW, c8 = i % PER_ROW;
    const uint2 v = load8(row0 + r, c8);
    *reinterpret_cast<uint32_t*>(tile + r * PITCH + c8 * V) = v.x;
    *reinterpret_cast<uint32_t*>(tile + r * PITCH + c8 * V + 4) = v.y;
  }
  __syncthreads();
  uint8_t* out = static_cast<uint8_t*>(t.out) + static_cast<int64_t>(bh) * D * t.vt_cols;
  constexpr int CHUNKS = kQuantRows / 16;  // 16-byte pieces of one V^T row in this block
  for (int i = threadIdx.x; i < D * CHUNKS; i += kQuantThreads) {
    const int d = i / CHUNKS, c = i % CHUNKS;
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint32_t word = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = c * 16 + k * 4 + e;  // column within the block: group col / 32
        const int key = (col & ~31) + fp8_key_of_column(col & 31);
        word |= static_cast<uint32_t>(tile[key * PITCH + d]) << (8 * e);
      }
      w[k] = word;
    }
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(d) * t.vt_cols + row0 + c * 16) =
        make_uint4(w[0], w[1], w[2], w[3]);
  }
}

}  // namespace
}  // namespace flashwatt
