// Plain C++ launch API of the flashwatt attention forward kernels.
//
// This header is included by flash_fwd.cu (compiled by nvcc) and by
// flash_binding.cpp (compiled by the host compiler with torch). It names no
// CUDA or torch type, so the kernels can be compiled and inspected without torch.
#pragma once

#include <cstddef>
#include <cstdint>

namespace flashwatt {

enum FwdDtype : int { kFp16 = 0, kBf16 = 1, kFp32 = 2 };

// How the producer of a warp-specialised kernel moves Q, K and V into shared memory.
enum FwdCopies : int {
  kCopiesAuto = 0,     // TMA where the tensor maps of q, k and v encode, else the threads
  kCopiesThreads = 1,  // 16-byte cp.async issued by the producer's 128 threads
  kCopiesTma = 2,      // the tensor memory accelerator, from one thread; an error where it cannot
};

// How the causal mask is aligned where len_q != len_k (kernels/causal_mask.cuh).
enum CausalAlign : int {
  kCausalTopLeft = 0,      // key j visible to query i iff j <= i, as torch's is_causal
  kCausalBottomRight = 1,  // iff j <= i + len_k - len_q, as FlashAttention >= 2.1
};

// The causal_offset of FwdParams and BwdParams for an alignment.
inline int causal_offset(int align, int len_q, int len_k) { return align == kCausalBottomRight ? len_k - len_q : 0; }

// Tensor maps (CUtensorMap: 128 opaque bytes, 128-byte aligned as cuda.h declares it) of q, k and v for the TMA
// copies, encoded by fwd_launch; the kernel reads them from its parameters.
struct alignas(128) FwdTensorMaps {
  unsigned char q[128], k[128], v[128];
};

// All strides are in elements. The last dimension (head_dim) must be contiguous.
struct FwdParams {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;  // (batch, heads, len_q), contiguous, natural-log LSE
  int64_t q_sb, q_sh, q_sl;
  int64_t k_sb, k_sh, k_sl;
  int64_t v_sb, v_sh, v_sl;
  int64_t o_sb, o_sh, o_sl;
  int batch, heads, kv_heads, len_q, len_k, head_dim;
  float scale;  // softmax scale applied to q.k
  int causal;         // 1: key j is visible to query i iff j <= i + causal_offset
  int causal_offset;  // 0 (top-left) or len_k - len_q (bottom-right): causal_offset(), causal_mask.cuh
  int grid_cap; // 0: one CTA per (q tile, batch, head), or one per SM for the persistent (warp-specialised)
                // kernels; > 0: persistent grid of at most this many CTAs
  int section;  // (batch, head) pairs per L2 section of the work order (tile_schedule.cuh); 0: one section
  int* tile_counter;  // persistent (warp-specialised) kernels: a zeroed int from which CTAs take their work
                      // items after the first as they free up; null: items blockIdx.x + k * gridDim.x
  int copies;         // warp-specialised kernels: FwdCopies
  FwdTensorMaps maps; // written by fwd_launch where the copies are TMA
};

// The instructions a configuration computes with.
enum FwdMath : int {
  kMmaSync = 0,  // fp16/bf16 tensor cores, mma.sync m16n8k16 (sm_80+)
  kWgmma = 1,    // fp16/bf16 tensor cores, wgmma (sm_90a builds only)
  kFfma = 2,     // fp32 inputs, exact fp32 FFMA
  kMmaTf32 = 3,  // fp32 inputs rounded to tf32, mma.sync m16n8k8 (the opt-in tf32 precision)
};

// How the warpgroups of a wgmma CTA are scheduled (kernels/flash_fwd_wgmma.cuh).
enum FwdSchedule : int {
  kLockstep = 0,  // all warpgroups issue their wgmma after the same barrier (every non-wgmma kernel too)
  kPingPong = 1,  // odd warpgroups half an iteration behind: softmax of one under the other's wgmma
  // Warp-specialised (kernels/flash_fwd_wgmma_ws.cuh): a producer warpgroup copies K/V/Q
  // into mbarrier-guarded rings, two consumer warpgroups compute; persistent grid.
  kWarpSpecialized = 2,          // the consumers run free
  kWarpSpecializedPingPong = 3,  // the consumers take turns issuing their wgmma (named barriers)
};

// One compiled tile configuration.
struct FwdConfig {
  int math;     // FwdMath
  int dtype;
  int head_dim;
  int block_m;  // query rows per CTA
  int block_n;  // key/value rows per shared-memory tile
  int warps;    // warps per CTA (wgmma: 4 per warpgroup)
  int stages;   // K/V shared-memory pipeline depth
  int schedule; // FwdSchedule
};

struct FwdKernelInfo {
  int num_regs;
  int local_bytes;       // stack frame / spill space per thread
  int smem_bytes;        // dynamic shared memory per CTA
  int max_ctas_per_sm;   // occupancy limit from registers and shared memory
  int threads;
};

int fwd_num_configs();
FwdConfig fwd_config(int index);

// Returns the index of the compiled configuration, or -1 when none matches.
int fwd_find_config(int math, int dtype, int head_dim, int block_m, int block_n, int warps, int stages, int schedule);

// Launches configuration `index` on `stream` (a cudaStream_t). Returns 0 on success;
// otherwise writes a message into err (errlen bytes) and returns non-zero.
int fwd_launch(int index, const FwdParams& params, void* stream, char* err, size_t errlen);

// Register, local-memory and occupancy facts of configuration `index` on the current device.
int fwd_kernel_info(int index, FwdKernelInfo* info, char* err, size_t errlen);

}  // namespace flashwatt
