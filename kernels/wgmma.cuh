// wgmma.mma_async wrappers (sm_90a) for the Hopper attention forward kernel.
//
// m64nNk16 with fp32 accumulators, 16-bit inputs. wgmma_ss: A and B from shared
// memory through matrix descriptors, both K-major; scale_d == 0 overwrites d (d = A B)
// instead of accumulating. wgmma_rs: A from registers (the mma.sync m16n8k16 A fragment
// layout, per warp of the warpgroup), B from shared memory N-major (transposed). Both
// take scale_d. The last argument only selects the input type.
// Only instantiated where __CUDA_ARCH_FEAT_SM90_ALL is defined (sm_90a).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace flashwatt {
namespace {

// 64-bit shared-memory matrix descriptor for a 128-byte-swizzled operand: start address,
// leading- and stride-dimension byte offsets (all in 16-byte units), swizzle mode 1.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

// The descriptor of the tile `bytes` further on in shared memory, from another's with the same
// layout: the start address is the low field in 16-byte units, and a CTA's shared memory
// (under 256 KB) keeps it from carrying into the next field. Building a descriptor from its
// address at every wgmma took five uniform instructions each (kernels/NOTES.md, "fp8 forward:
// the step's latency"); from a base built once it is one add.
__device__ __forceinline__ uint64_t wgmma_desc_at(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }

__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }

template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// Tells the compiler an accumulator register may change here (an async wgmma writes it),
// so no read or write of it moves across a fence or wait.
template <int N>
__device__ __forceinline__ void fence_regs(float (&r)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(r[i])::"memory");
}

// The register A operand of an in-flight wgmma_rs: the tensor cores read these registers
// until the wait, so the compiler must not treat them as free once the instruction is
// issued; this keeps them live up to the wait. (It does not stop ptxas from moving the
// wait for P V ahead of the softmax: kernels/NOTES.md, v5 and v7.)
template <int N>
__device__ __forceinline__ void fence_regs(uint32_t (&r)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i)
    asm volatile("" : "+r"(r[i][0]), "+r"(r[i][1]), "+r"(r[i][2]), "+r"(r[i][3])::"memory");
}

// Orders this thread's generic-proxy shared-memory writes (cp.async, st.shared) before
// later reads by the tensor cores' async proxy; needed before the barrier that publishes them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The accumulator operands: {%0, ..., %R-1} in the instruction, "+f"(d[i]) as constraints.
#define FLASHWATT_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASHWATT_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLASHWATT_OUT32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FLASHWATT_OUT64 \
  FLASHWATT_OUT32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// m64nNk16 with R = N/2 accumulators per thread; TY is the PTX input type, CT the C++ one.
// The operand numbers after the accumulators (A, B, scale_d) are spelled out per R.
#define FLASHWATT_WGMMA_SS(N, R, TY, CT, DLIST, OUTS, OA, OB, OS)                                      \
  __device__ __forceinline__ void wgmma_ss(float (&d)[R], uint64_t a, uint64_t b, int scale_d, CT) {   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" OS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " DLIST ", %" OA ", %" OB  \
                 ", p, 1, 1, 0, 0;\n}\n"                                                                  \
                 : OUTS                                                                                  \
                 : "l"(a), "l"(b), "r"(scale_d));                                                        \
  }

#define FLASHWATT_WGMMA_RS(N, R, TY, CT, DLIST, OUTS, A0, A1, A2, A3, OB, OS)                            \
  __device__ __forceinline__ void wgmma_rs(float (&d)[R], const uint32_t (&a)[4], uint64_t b, int scale_d, \
                                           CT) {                                                         \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" OS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " " DLIST ", {%" A0 ", %" A1 \
                 ", %" A2 ", %" A3 "}, %" OB ", p, 1, 1, 1;\n}\n"                                          \
                 : OUTS                                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));                    \
  }

FLASHWATT_WGMMA_SS(64, 32, "f16", __half, FLASHWATT_D32, FLASHWATT_OUT32, "32", "33", "34")
FLASHWATT_WGMMA_SS(64, 32, "bf16", __nv_bfloat16, FLASHWATT_D32, FLASHWATT_OUT32, "32", "33", "34")
FLASHWATT_WGMMA_SS(128, 64, "f16", __half, FLASHWATT_D64, FLASHWATT_OUT64, "64", "65", "66")
FLASHWATT_WGMMA_SS(128, 64, "bf16", __nv_bfloat16, FLASHWATT_D64, FLASHWATT_OUT64, "64", "65", "66")
FLASHWATT_WGMMA_RS(64, 32, "f16", __half, FLASHWATT_D32, FLASHWATT_OUT32, "32", "33", "34", "35", "36", "37")
FLASHWATT_WGMMA_RS(64, 32, "bf16", __nv_bfloat16, FLASHWATT_D32, FLASHWATT_OUT32, "32", "33", "34", "35", "36", "37")
FLASHWATT_WGMMA_RS(128, 64, "f16", __half, FLASHWATT_D64, FLASHWATT_OUT64, "64", "65", "66", "67", "68", "69")
FLASHWATT_WGMMA_RS(128, 64, "bf16", __nv_bfloat16, FLASHWATT_D64, FLASHWATT_OUT64, "64", "65", "66", "67", "68", "69")

#undef FLASHWATT_WGMMA_RS
#undef FLASHWATT_WGMMA_SS
#undef FLASHWATT_OUT64
#undef FLASHWATT_OUT32
#undef FLASHWATT_D64
#undef FLASHWATT_D32

}  // namespace
}  // namespace flashwatt
