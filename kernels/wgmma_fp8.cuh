// wgmma.mma_async wrappers (sm_90a) for the fp8 (e4m3) attention forward.
//
// m64nNk32 with fp32 accumulators and e4m3 inputs. For 8-bit inputs wgmma has no transpose:
// both operands are K-major in shared memory (B always; A too where it is not in registers).
//   wgmma_ss_e4m3: A and B from shared memory (S = Q K^T: Q and K rows are K-major already);
//   wgmma_rs_e4m3: A from registers, B from shared memory (O += P V^T-tile: V stored
//                  transposed, keys contiguous, by the quantisation pre-pass; fp8_quantize.cuh).
// The A register fragment of k32 (per warp of the warpgroup, 16 rows x 32 columns; PTX ISA,
// "Register fragments: matrix A" for .e4m3): register i of 4 holds 4 consecutive columns,
//   reg 0: row g,     columns 4t .. 4t+3        reg 2: row g,     columns 16+4t .. 16+4t+3
//   reg 1: row g + 8, columns 4t .. 4t+3        reg 3: row g + 8, columns 16+4t .. 16+4t+3
// with g = lane / 4, t = lane % 4 and the lowest byte the lowest column. The fp32
// accumulator of S holds columns 8n + 2t, 8n + 2t + 1 of rows g, g + 8: not the same
// columns, so flash_fwd_fp8.cuh packs P in the accumulator's own column order and the
// pre-pass orders V's keys to match (fp8_quantize.cuh, fp8_key_of_column).
// Only instantiated where __CUDA_ARCH_FEAT_SM90_ALL is defined (sm_90a).
#pragma once

#include <cstdint>

namespace flashwatt {
namespace {

// Shared-memory matrix descriptor of a K-major operand in the SWB-byte swizzle (SWB 128 or
// 64: one row of the tile is SWB bytes, 8-row groups SBO = 8 * SWB bytes apart): start
// address, leading offset 16 B (unused by a swizzled K-major operand), stride offset, layout
// type (1: 128-byte swizzle, 2: 64-byte).
template <int SWB>
__device__ __forceinline__ uint64_t wgmma_desc_fp8(uint32_t addr) {
  static_assert(SWB == 128 || SWB == 64, "fp8 tiles: rows of 64 or 128 bytes");
  constexpr uint64_t kLayout = SWB == 128 ? 1 : 2;
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(16 >> 4) << 16) |
         (static_cast<uint64_t>((8 * SWB) >> 4) << 32) | (kLayout << 62);
}

// Four fp32 values to one register of four e4m3 bytes, x0 in the lowest byte, rounded to
// nearest and saturated at +-448 (cvt's first source goes to the upper byte).
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
  uint16_t lo, hi;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(lo) : "f"(x1), "f"(x0));
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(hi) : "f"(x3), "f"(x2));
  uint32_t r;
  asm("mov.b32 %0, {%1, %2};\n" : "=r"(r) : "h"(lo), "h"(hi));
  return r;
}

#define FLASHWATT_F8_D32 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}"
#define FLASHWATT_F8_D64 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}"
#define FLASHWATT_F8_OUT32 \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
  "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
  "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
  "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define FLASHWATT_F8_OUT64 \
  FLASHWATT_F8_OUT32, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
  "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
  "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
  "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

// N = 8: a tile's row sums of P over the row of ones under V^T (flash_fwd_fp8_ws.cuh, RSUM).
#define FLASHWATT_F8_D4 "{%0, %1, %2, %3}"
#define FLASHWATT_F8_OUT4 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])

// m64nNk32, R = N/2 accumulators per thread; OA, OB, OS: the operand numbers after them.
#define FLASHWATT_WGMMA_SS_E4M3(N, R, DLIST, OUTS, OA, OB, OS)                                          \
  __device__ __forceinline__ void wgmma_ss_e4m3(float (&d)[R], uint64_t a, uint64_t b, int scale_d) {   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" OS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " DLIST ", %" OA ", %" OB     \
                 ", p, 1, 1;\n}\n"                                                                        \
                 : OUTS                                                                                  \
                 : "l"(a), "l"(b), "r"(scale_d));                                                        \
  }

#define FLASHWATT_WGMMA_RS_E4M3(N, R, DLIST, OUTS, A0, A1, A2, A3, OB, OS)                               \
  __device__ __forceinline__ void wgmma_rs_e4m3(float (&d)[R], const uint32_t (&a)[4], uint64_t b,      \
                                                int scale_d) {                                           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" OS ", 0;\n"                                        \
                 "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 " DLIST ", {%" A0 ", %" A1     \
                 ", %" A2 ", %" A3 "}, %" OB ", p, 1, 1;\n}\n"                                            \
                 : OUTS                                                                                  \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d));                    \
  }

FLASHWATT_WGMMA_SS_E4M3(64, 32, FLASHWATT_F8_D32, FLASHWATT_F8_OUT32, "32", "33", "34")
FLASHWATT_WGMMA_SS_E4M3(128, 64, FLASHWATT_F8_D64, FLASHWATT_F8_OUT64, "64", "65", "66")
FLASHWATT_WGMMA_RS_E4M3(64, 32, FLASHWATT_F8_D32, FLASHWATT_F8_OUT32, "32", "33", "34", "35", "36", "37")
FLASHWATT_WGMMA_RS_E4M3(128, 64, FLASHWATT_F8_D64, FLASHWATT_F8_OUT64, "64", "65", "66", "67", "68", "69")
FLASHWATT_WGMMA_RS_E4M3(8, 4, FLASHWATT_F8_D4, FLASHWATT_F8_OUT4, "4", "5", "6", "7", "8", "9")

#undef FLASHWATT_WGMMA_RS_E4M3
#undef FLASHWATT_WGMMA_SS_E4M3
#undef FLASHWATT_F8_OUT64
#undef FLASHWATT_F8_OUT32
#undef FLASHWATT_F8_D64
#undef FLASHWATT_F8_D32
#undef FLASHWATT_F8_OUT4
#undef FLASHWATT_F8_D4

}  // namespace
}  // namespace flashwatt
