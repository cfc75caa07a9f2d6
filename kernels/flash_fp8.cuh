// Plain C++ launch API of the fp8 (e4m3) attention forward (flash_fp8.cu): the quantisation
// step and the attention kernels. Like flash_fwd.cuh it names no CUDA or torch type.
//
// The kernels exist only in sm_90a builds (FLASHWATT_WGMMA): elsewhere fp8_fwd_num_configs()
// is 0 and every launch is refused with a message, before any work.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flash_fwd.cuh"

namespace flashwatt {

// Rows per scale: a consumer warpgroup's query rows (the kernels' 128-row tiles hold two
// such blocks, one per warpgroup) and one K/V tile's keys (the kernels' block_n).
constexpr int kFp8QBlock = 64;
constexpr int kFp8KvBlock = 128;

// V^T rows are padded to a multiple of this many keys (zeros past len).
constexpr int kFp8KeyPad = 64;

// V^T has this many rows under the head dim's: the first e4m3 ones (0x38) in every column, the
// rest zeros, so that a P V of N = head_dim + 8 also sums each row of P on the tensor cores
// (the RSUM tiles, flash_fwd_fp8_ws.cuh); the other tiles read the head dim's rows only.
constexpr int kFp8VtExtraRows = 8;

// One of q, k, v for the quantisation step (kernels/fp8_quantize.cuh).
struct Fp8Tensor {
  const void* x;       // (batch, heads, len, head_dim), last dimension contiguous: 16-bit, or e4m3 (V only)
  int64_t sb, sh, sl;  // its strides, elements
  void* out;           // e4m3: (batch, heads, len, head_dim) contiguous, or V^T (batch, heads, head_dim + 8, vt_cols)
  float* descale;      // (batch, heads, blocks of block_rows) contiguous: amax / 448, 1 where amax is 0;
                       // null for an e4m3 input (its descales are the caller's)
  int heads, len;
  int block_rows;      // rows per scale: kFp8QBlock (q) or kFp8KvBlock (k, v)
  int transposed;      // 1: V^T, keys permuted within 32 (fp8_key_of_column)
  int vt_cols;         // V^T: columns per row, len rounded up to kFp8KeyPad
};

struct Fp8QuantParams {
  Fp8Tensor t[3];
  int tensors;         // how many of t are used (3: q, k, v; 1: a pre-quantised V to transpose)
  int batch, head_dim;
  int first_block[4];  // the CTA of each tensor's first block; first_block[tensors]: the grid (fp8_quantize_launch)
};

// The attention forward on e4m3 operands.
//   p.q, p.k: e4m3 (batch, heads / kv_heads, len, head_dim) rows, strides in elements (= bytes);
//   p.v: V^T (batch, kv_heads, head_dim + kFp8VtExtraRows, vt_cols) from the quantisation step, p.v_sl its row
//        stride (vt_cols), p.v_sh, p.v_sb the head and batch strides;
//   p.o: 16-bit output (out_dtype), p.lse as FwdParams.
// Scores of query block a and key block j are q8 . k8 * scale * descale_q[a] * descale_k[j]; the
// output is sum_j (P_j V8_j) * descale_v[j] / rowsum.
struct Fp8FwdParams {
  FwdParams p;
  const float* descale_q;  // (batch, heads, q_blocks) contiguous
  const float* descale_k;  // (batch, kv_heads, kv_blocks) contiguous
  const float* descale_v;  // (batch, kv_heads, kv_blocks) contiguous
  int q_blocks;            // len_q rounded up to kFp8QBlock, in blocks
  int kv_blocks;           // len_k rounded up to kFp8KvBlock, in blocks
  int vt_cols;
};

// Rows of the fp8 configuration table: FwdConfig with math kWgmmaFp8 (or kWgmmaFp8RowSum: the
// warp-specialised tiles that take P's row sums from the tensor cores) and dtype the output's.
constexpr int kWgmmaFp8 = 4;
constexpr int kWgmmaFp8RowSum = 5;

int fp8_fwd_num_configs();
FwdConfig fp8_fwd_config(int index);
int fp8_fwd_find_config(int math, int out_dtype, int head_dim, int block_m, int block_n, int warps, int stages,
                        int schedule);
int fp8_fwd_launch(int index, const Fp8FwdParams& params, void* stream, char* err, size_t errlen);
int fp8_fwd_kernel_info(int index, FwdKernelInfo* info, char* err, size_t errlen);

// in_dtype: kFp16 or kBf16 (amax, scale and cast of every block of every tensor, one launch),
// or kFp8Input (copy of a pre-quantised V into V^T; no descale written). Fills first_block.
constexpr int kFp8Input = 3;
int fp8_quantize_launch(Fp8QuantParams& params, int in_dtype, void* stream, char* err, size_t errlen);

}  // namespace flashwatt
