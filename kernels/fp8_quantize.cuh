// The quantisation step of the fp8 attention forward: 16-bit q, k, v to e4m3 with one scale
// per block of rows of each (batch, head), and V written transposed for the P V wgmma.
//
// Blocks: kFp8QBlock (64) query rows, one consumer warpgroup's rows in the attention kernels,
// and kFp8KvBlock (128) keys, one K/V tile. Per block of a tensor x: amax = max |x|,
// descale = amax / 448 and scale = 448 / amax, each the float32 division rounded to nearest
// (__fdiv_rn; 1 and 1 where amax is 0, the scale at most FLT_MAX), x8 = e4m3(x * scale), the
// product rounded to nearest (__fmul_rn), the cast to nearest even, saturated at +-448
// (cvt.rn.satfinite). flashwatt.kernels.fp8_numerics.quantize_blocks is the same definition in
// torch, bit for bit. The attention kernel multiplies the scores of a query block and a key
// block by descale_q * descale_k (folded into the softmax scale) and each key block's P V by
// its descale_v (folded into the rescale of O: flash_fwd_fp8.cuh).
//
// One launch for the three tensors, one CTA per block: the CTA loads its block (at most
// 128 rows x D, 32 KB at D128) into registers with 16-byte loads, reduces the block's amax,
// and writes the e4m3 block with 16-byte stores. Each input element is read once: a scale
// per (batch, head) would need its head's amax before the first cast (a second pass, or a
// grid-wide wait), which is why the blocks carry their own scales.
//
// V transposed. For 8-bit inputs wgmma reads B only K-major, so the P V product needs V^T
// (head dim rows, keys contiguous) in shared memory. It is written here, in the pass that
// casts V anyway, rather than transposed per tile in shared memory by the attention kernel:
// the cast reads and writes V once either way, and the attention kernel then loads V^T tiles
// as it loads K tiles. V^T of one head is [D + 8, vt_cols] with vt_cols = len_k rounded up to 64
// (a multiple of 16 bytes for the copies; keys past len_k are zeros); row D holds ones and rows
// D + 1 .. D + 7 zeros (kFp8VtExtraRows: the row sums of the RSUM tiles). Within every 32 keys
// the columns are permuted: column c holds key fp8_key_of_column(c), so that P, packed in
// the order its fp32 accumulators hold it, is already wgmma's A fragment (wgmma_fp8.cuh).
// Pre-quantised e4m3 V takes the same pass without a scale (T = uint8_t).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cfloat>
#include <cstdint>

#include "flash_fp8.cuh"

namespace flashwatt {
namespace {

constexpr float kE4m3Max = 448.f;
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

// Sixteen consecutive inputs of a block: two 16-byte words of 16-bit values, or one of e4m3
// bytes (the second unused).
struct Chunk16 {
  uint4 w[2];
};

template <typename T>
__device__ __forceinline__ Chunk16 load_chunk16(const T* src) {
  Chunk16 c;
  c.w[0] = *reinterpret_cast<const uint4*>(src);
  c.w[1] = sizeof(T) == 1 ? make_uint4(0u, 0u, 0u, 0u) : *reinterpret_cast<const uint4*>(src + 8);
  return c;
}

template <typename T>
__device__ __forceinline__ float chunk_amax(const Chunk16& c) {
  float m = 0.f;
  if constexpr (sizeof(T) != 1) {
    const T* e = reinterpret_cast<const T*>(c.w);
#pragma unroll
    for (int j = 0; j < 16; ++j) m = fmaxf(m, fabsf(to_float(e[j])));
  }
  return m;
}

// Sixteen inputs scaled by `scale` (16-bit) or copied (e4m3 bytes) into sixteen e4m3 bytes,
// the first input in the lowest byte.
template <typename T>
__device__ __forceinline__ uint4 to_e4m3x16(const Chunk16& c, float scale) {
  if constexpr (sizeof(T) == 1) {
    return c.w[0];
  } else {
    const T* e = reinterpret_cast<const T*>(c.w);
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint16_t lo, hi;
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
          : "=h"(lo)
          : "f"(__fmul_rn(to_float(e[4 * k + 1]), scale)), "f"(__fmul_rn(to_float(e[4 * k]), scale)));
      asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n"
          : "=h"(hi)
          : "f"(__fmul_rn(to_float(e[4 * k + 3]), scale)), "f"(__fmul_rn(to_float(e[4 * k + 2]), scale)));
      asm("mov.b32 %0, {%1, %2};\n" : "=r"(w[k]) : "h"(lo), "h"(hi));
    }
    return make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// max over the CTA (every thread gets it); `scratch` holds one float per warp.
__device__ __forceinline__ float block_max(float m, float* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = m;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kQuantThreads / 32; ++w) m = fmaxf(m, scratch[w]);
  return m;
}

// Writes a block's e4m3 rows, held as 16-byte chunks (chunk i of the CTA: index
// threadIdx.x + i * kQuantThreads, row index / PER_ROW), transposed into V^T columns
// row0 .. row0 + kFp8KvBlock - 1: through shared memory (rows padded by 4 bytes so that the
// column reads spread over the banks), keys past the block's rows as zeros.
template <int D, int MAXC>
__device__ __forceinline__ void store_vt_block(const Fp8Tensor& t, int bh, int row0, int rows, const uint4 (&e8)[MAXC]) {
  constexpr int PER_ROW = D / 16;
  constexpr int PITCH = D + 4;
  __shared__ __align__(16) uint8_t tile[kFp8KvBlock * PITCH];
#pragma unroll
  for (int i = 0; i < MAXC; ++i) {
    const int idx = threadIdx.x + i * kQuantThreads;
    const int r = idx / PER_ROW, c = idx % PER_ROW;
    const uint4 v = r < rows ? e8[i] : make_uint4(0u, 0u, 0u, 0u);
    uint32_t* dst = reinterpret_cast<uint32_t*>(tile + r * PITCH + c * 16);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  }
  __syncthreads();
  uint8_t* out = static_cast<uint8_t*>(t.out) + static_cast<int64_t>(bh) * (D + kFp8VtExtraRows) * t.vt_cols;
  const int chunks = min(kFp8KvBlock, t.vt_cols - row0) / 16;  // 16-byte pieces of a V^T row in this block
  if (threadIdx.x < kFp8VtExtraRows * (kFp8KvBlock / 16)) {  // the rows under the head dim's: ones, then zeros
    const int r = threadIdx.x / (kFp8KvBlock / 16), c = threadIdx.x % (kFp8KvBlock / 16);
    const uint32_t w = r == 0 ? 0x38383838u : 0u;  // e4m3 1.0 is 0x38
    if (c < chunks)
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(D + r) * t.vt_cols + row0 + c * 16) = make_uint4(w, w, w, w);
  }
#pragma unroll
  for (int i = 0; i < D * (kFp8KvBlock / 16) / kQuantThreads; ++i) {
    const int idx = threadIdx.x + i * kQuantThreads;
    const int d = idx / (kFp8KvBlock / 16), c = idx % (kFp8KvBlock / 16);
    if (c >= chunks) continue;
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

// One block of one tensor per CTA (module comment): blockIdx.x runs over the blocks of q,
// then k, then v (p.first_block), within a tensor (batch, head)-major.
template <typename T, int D>
__global__ void __launch_bounds__(kQuantThreads) fp8_quantize_kernel(const Fp8QuantParams p) {
  constexpr int PER_ROW = D / 16;                                  // 16-element chunks per row
  constexpr int MAXC = kFp8KvBlock * PER_ROW / kQuantThreads;      // chunks per thread, at most
  static_assert(MAXC >= 1 && kFp8KvBlock * PER_ROW % kQuantThreads == 0, "fp8 quantisation: block shape");
  int which = 0;
#pragma unroll
  for (int i = 1; i < 3; ++i) which += (i < p.tensors && static_cast<int>(blockIdx.x) >= p.first_block[i]);
  const Fp8Tensor& t = p.t[which];
  const int blk = static_cast<int>(blockIdx.x) - p.first_block[which];
  const int per_head = (t.len + t.block_rows - 1) / t.block_rows;
  const int bh = blk / per_head;
  const int rb = blk - bh * per_head;
  const int b = bh / t.heads, h = bh - b * t.heads;
  const int row0 = rb * t.block_rows;
  const int rows = min(t.block_rows, t.len - row0);
  const T* x = static_cast<const T*>(t.x) + b * t.sb + h * t.sh;

  Chunk16 in[MAXC];
  float m = 0.f;
#pragma unroll
  for (int i = 0; i < MAXC; ++i) {
    const int idx = threadIdx.x + i * kQuantThreads;
    const int r = idx / PER_ROW, c = idx % PER_ROW;
    if (r < rows) {
      in[i] = load_chunk16(x + static_cast<int64_t>(row0 + r) * t.sl + c * 16);
      m = fmaxf(m, chunk_amax<T>(in[i]));
    }
  }
  float scale = 1.f;
  if constexpr (sizeof(T) != 1) {
    __shared__ float warp_max[kQuantThreads / 32];
    const float amax = block_max(m, warp_max);
    scale = amax > 0.f ? fminf(__fdiv_rn(kE4m3Max, amax), FLT_MAX) : 1.f;
    if (threadIdx.x == 0) t.descale[blk] = amax > 0.f ? __fdiv_rn(amax, kE4m3Max) : 1.f;
  }
  uint4 e8[MAXC];
#pragma unroll
  for (int i = 0; i < MAXC; ++i) {
    const int r = (threadIdx.x + i * kQuantThreads) / PER_ROW;
    e8[i] = r < rows ? to_e4m3x16<T>(in[i], scale) : make_uint4(0u, 0u, 0u, 0u);
  }
  if (t.transposed) {
    store_vt_block<D, MAXC>(t, bh, row0, rows, e8);
    return;
  }
  uint8_t* out = static_cast<uint8_t*>(t.out) + (static_cast<int64_t>(bh) * t.len + row0) * D;
#pragma unroll
  for (int i = 0; i < MAXC; ++i) {
    const int idx = threadIdx.x + i * kQuantThreads;
    if (idx / PER_ROW < rows) *reinterpret_cast<uint4*>(out + static_cast<int64_t>(idx) * 16) = e8[i];
  }
}

}  // namespace
}  // namespace flashwatt
