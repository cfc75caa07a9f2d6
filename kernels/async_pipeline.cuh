// mbarriers, TMA copies and reductions, and setmaxnreg (sm_90a): the pieces of the
// producer/consumer pipelines that the warp-specialised forward (flash_fwd_wgmma_ws.cuh,
// flash_fwd_fp8_ws.cuh) and the wgmma backward (flash_bwd_wgmma.cuh, flash_bwd_wgmma_ws.cuh)
// share, kept in one place so that the two sides cannot drift apart in how they order the
// proxies and phases. Used only where __CUDA_ARCH_FEAT_SM90_ALL is defined.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace flashwatt {
namespace {

// ------------------------------------------------------------------------------ mbarrier

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

// Blocks until the phase of parity `parity` of the barrier has completed (acquire).
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "FW_MBAR_WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra FW_MBAR_WAIT;\n"
      "}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}

// One arrival (release): this thread's earlier shared-memory reads and writes are done.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// One arrival once every cp.async this thread issued so far has completed; .noinc: the
// arrival is one of the count the barrier was initialised with.
__device__ __forceinline__ void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}

// One arrival that also expects `bytes` more to land through TMA copies completing on
// this barrier (its phase completes when both the arrivals and the bytes are in).
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// ------------------------------------------------------------------------------ TMA loads

// TMA: the box at coordinates (c0 .. c3) of the 4-d tensor map at `map` (a kernel
// parameter's generic address) into shared memory at dst, completing its bytes on `bar`.
// Elements outside the tensor, below 0 included, land as zeros and count as bytes.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const void* map, int c0, int c1, int c2, int c3,
                                            uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// The same for a 1-d map: the box starting at element c0, whose address must be 16-byte
// aligned (TMA faults on an innermost start that is not).
__device__ __forceinline__ void tma_load_1d(uint32_t dst, const void* map, int c0, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(bar)
      : "memory");
}

__device__ __forceinline__ void tma_prefetch_map(const void* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Rows [row0, row0 + ROWS) of head (h, b) of a tensor map over (D, L, heads, batch) into
// a swizzled [ROWS, D] tile: one box of [ROWS, 64] per 64 columns, the layout of
// load_tile_sw128 (the map's 128-byte swizzle is the wgmma one). Rows outside [0, L) are
// zeros. The caller expects ROWS * D * 2 bytes on `bar`.
template <int ROWS, int D>
__device__ __forceinline__ void tma_load_tile(uint32_t dst, const void* map, int row0, int h, int b, uint32_t bar) {
#pragma unroll
  for (int c = 0; c < D / 64; ++c) tma_load_4d(dst + c * ROWS * 128, map, c * 64, row0, h, b, bar);
}

// -------------------------------------------------------------------- TMA reductions

// TMA: adds the fp32 box at shared memory src (the map's 128-byte swizzle) into the tensor
// of the 4-d map at coordinates (c0 .. c3); elements outside the tensor are not written.
// Completion is tracked per thread in bulk groups.
__device__ __forceinline__ void tma_reduce_add_4d(const void* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile(
      "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
          reinterpret_cast<uint64_t>(map)),
      "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
      : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Waits until at most N of this thread's bulk groups still read shared memory.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}

// ------------------------------------------------------------------------------ setmaxnreg

template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}

}  // namespace
}  // namespace flashwatt
