// Plain C++ launch API of the flashwatt attention backward kernels (flash_bwd.cu).
//
// Like flash_fwd.cuh, it names no CUDA or torch type: flash_bwd.cu (nvcc) and
// flash_binding.cpp (host compiler, torch) both include it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashwatt {

// All strides are in elements; every head_dim dimension is contiguous. q, o, dout and dq
// are (batch, heads, len_q, head_dim)-shaped, k, v, dk and dv (batch, kv_heads, len_k,
// head_dim); query head h reads k/v head h / (heads / kv_heads), as in the forward.
struct BwdParams {
  const void* q;
  const void* k;
  const void* v;
  const void* o;     // the forward's output
  const void* dout;  // gradient of the loss with respect to o
  const float* lse;  // (batch, heads, len_q), contiguous: the forward's natural-log LSE of scale * q.k
  float* delta;      // (batch, heads, len_q), contiguous workspace: rowsum(dout * o) in fp32
  float* lse_log2;   // as delta: the LSE in base 2 as P's exponent subtracts it (lse_log2_for_p),
                     // written by the preprocessing for the warp-specialised tiles (their step
                     // reads it as it is: FlashAttention-3 scales its LSE once the same way)
  float* dq_accum;   // (batch, heads, len_q, head_dim), contiguous fp32 workspace (zeroed by the kernels);
                     // null: the deterministic mode, dQ in a pass of its own without atomics
  void* dq;
  void* dk;
  void* dv;
  int64_t q_sb, q_sh, q_sl;
  int64_t k_sb, k_sh, k_sl;
  int64_t v_sb, v_sh, v_sl;
  int64_t o_sb, o_sh, o_sl;
  int64_t do_sb, do_sh, do_sl;
  int64_t dq_sb, dq_sh, dq_sl;
  int64_t dk_sb, dk_sh, dk_sl;
  int64_t dv_sb, dv_sh, dv_sl;
  int batch, heads, kv_heads, len_q, len_k, head_dim;
  float scale;  // the forward's softmax scale
  int causal;         // as the forward: key j is visible to query i iff j <= i + causal_offset
  int causal_offset;  // 0 (top-left) or len_k - len_q (bottom-right): causal_offset() of flash_fwd.cuh
  int section;  // (batch, k/v head) pairs per L2 section of the CTA order (tile_schedule.cuh); 0: one section
  // The wgmma kernel's dQ reductions: a tensor map (CUtensorMap, 128 opaque bytes) of dq_accum,
  // written by bwd_launch.
  alignas(128) unsigned char dq_accum_map[128];
};

// How a backward tile's main kernel multiplies.
enum BwdMath : int {
  kBwdMmaSync = 0,  // mma.sync m16n8k16 (sm_80+), flash_bwd.cu
  kBwdWgmma = 1,    // wgmma (sm_90a builds only), flash_bwd_wgmma.cuh (and, with 12 warps, flash_bwd_wgmma_ws.cuh)
};

// One compiled backward tile configuration (fp16/bf16).
struct BwdConfig {
  int dtype;     // FwdDtype (flash_fwd.cuh)
  int head_dim;
  int block_n;   // key/value rows per CTA (mma.sync: 16 per warp; wgmma: 64 per warpgroup)
  int block_m;   // query rows per step of the CTA's loop
  int warps;     // of the main kernel's CTA, a producer warpgroup's included
  int math;      // BwdMath
};

struct BwdKernelInfo {
  int num_regs;         // of the main kernel
  int local_bytes;
  int smem_bytes;
  int max_ctas_per_sm;
  int threads;
};

int bwd_num_configs();
BwdConfig bwd_config(int index);

// Returns the index of the compiled configuration, or -1 when none matches.
int bwd_find_config(int dtype, int head_dim, int block_n, int block_m, int warps, int math);

// Runs the three kernels of the backward on `stream` (a cudaStream_t): the row
// preprocessing (delta, zeroed dq_accum), the main kernel (dk, dv, dq_accum) and the dq
// conversion; with params.dq_accum null, the dq pass (flash_bwd_dq.cuh) instead of the
// conversion. Returns 0 on success; otherwise writes a message into err and returns non-zero.
int bwd_launch(int index, const BwdParams& params, void* stream, char* err, size_t errlen);

// Register, local-memory and occupancy facts of configuration `index`'s main kernel.
int bwd_kernel_info(int index, BwdKernelInfo* info, char* err, size_t errlen);

}  // namespace flashwatt
