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

// One of q, k, v for the quantisation step (kernels/fp8_quantize.cuh).
struct Fp8Tensor {
  const void* x;       // (batch, heads, len, head_dim), last dimension contiguous: 16-bit, or e4m3 (V only)
  int64_t sb, sh, sl;  // its strides, elements
  void* out;           // e4m3: (batch, heads, len, head_dim) contiguous, or V^T (batch, heads, head_dim, vt_cols)
  float* amax;         // per (batch, head), zeroed by fp8_quantize_launch
  float* descale;      // per (batch, head): amax / 448, or 1 where amax is 0
  int heads, len;
  int transposed;      // 1: V^T, keys permuted within 32 (fp8_key_of_column)
  int vt_cols;         // V^T: columns per row, len rounded up to kFp8KeyPad
};

// V^T rows are padded to a multiple of this many keys (zeros past len_k).
constexpr int kFp8KeyPad = 64;

struct Fp8QuantParams {
  Fp8Tensor t[3];
  int tensors;  // how many of t are used (3: q, k, v; 1: a pre-quantised V to transpose)
  int batch, head_dim;
};

// The attention forward on e4m3 operands.
//   p.q, p.k: e4m3 (batch, heads / kv_heads, len, head_dim) rows, strides in elements (= bytes);
//   p.v: V^T (batch, kv_heads, head_dim, vt_cols) from the quantisation step, p.v_sl its row
//        stride (vt_cols), p.v_sh, p.v_sb the head and batch strides;
//   p.o: 16-bit output (out_dtype), p.lse as FwdParams.
// Scores are q8 . k8 * scale * descale_q * descale_k, the output (P V8) * descale_v / rowsum.
struct Fp8FwdParams {
  FwdParams p;
  const float* descale_q;  // (batch, heads) contiguous
  const float* descale_k;  // (batch, kv_heads) contiguous
  const float* descale_v;  // (batch, kv_heads) contiguous
  int vt_cols;
};

// Rows of the fp8 configuration table: FwdConfig with math kWgmmaFp8 and dtype the output's.
constexpr int kWgmmaFp8 = 4;

int fp8_fwd_num_configs();
FwdConfig fp8_fwd_config(int index);
int fp8_fwd_find_config(int out_dtype, int head_dim, int block_m, int block_n, int warps, int stages, int schedule);
int fp8_fwd_launch(int index, const Fp8FwdParams& params, void* stream, char* err, size_t errlen);
int fp8_fwd_kernel_info(int index, FwdKernelInfo* info, char* err, size_t errlen);

// in_dtype: kFp16 or kBf16 (amax, scale and cast of every tensor), or kFp8Input (copy of a
// pre-quantised V into V^T; amax and descale untouched). Zeroes the amax of each tensor first.
constexpr int kFp8Input = 3;
int fp8_quantize_launch(const Fp8QuantParams& params, int in_dtype, void* stream, char* err, size_t errlen);

}  // namespace flashwatt
