// Host side of the TMA copies and reductions (sm_90a builds): tensor maps over the 4-d
// (head dim, rows, heads, batch) views the kernels address, and over per-row fp32 arrays,
// encoded by the driver.
//
// The driver's cuTensorMapEncodeTiled is looked up through the runtime, so the extension
// needs no link to libcuda. A map is 128 opaque bytes that a kernel reads from its
// parameters (__grid_constant__).
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

namespace flashwatt {
namespace {

// cuTensorMapEncodeTiled, looked up once; null where the driver has none.
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

// A map of `name` over dims (head_dim, rows, heads, batch) with strides in elements of
// element_bytes (of dims 1 .. 3), boxes of [box_rows, box_cols] in the given swizzle (128-byte
// by default: box_cols * element_bytes == 128, the wgmma layout for 16-bit types; the fp8
// forward's rows of 64 bytes take the 64-byte one), elements outside the dims read as zeros
// and are not written. Returns false with the reason in why.
inline bool encode_map_4d(unsigned char* map, const char* name, CUtensorMapDataType type, int element_bytes,
                          const void* base, int head_dim, int rows, int heads, int batch, int64_t sl, int64_t sh,
                          int64_t sb, int box_cols, int box_rows, char* why, size_t whylen,
                          CUtensorMapSwizzle swizzle = CU_TENSOR_MAP_SWIZZLE_128B) {
  static_assert(sizeof(CUtensorMap) == 128, "a tensor map is 128 bytes");
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    snprintf(why, whylen, "the driver has no cuTensorMapEncodeTiled");
    return false;
  }
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(head_dim), static_cast<cuuint64_t>(rows),
                              static_cast<cuuint64_t>(heads), static_cast<cuuint64_t>(batch)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(sl) * element_bytes,
                                 static_cast<cuuint64_t>(sh) * element_bytes,
                                 static_cast<cuuint64_t>(sb) * element_bytes};  // bytes
  const cuuint32_t box[4] = {static_cast<cuuint32_t>(box_cols), static_cast<cuuint32_t>(box_rows), 1, 1};
  const cuuint32_t element_strides[4] = {1, 1, 1, 1};
  const CUresult rc = encode(reinterpret_cast<CUtensorMap*>(map), type, 4, const_cast<void*>(base), dims, strides,
                             box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    snprintf(why, whylen,
             "cuTensorMapEncodeTiled refused %s (error %d; strides in elements: rows %lld, heads %lld, batch %lld)",
             name, static_cast<int>(rc), static_cast<long long>(sl), static_cast<long long>(sh),
             static_cast<long long>(sb));
    return false;
  }
  return true;
}

// A map of `name` over `count` contiguous fp32 values (a per-row array such as the LSE),
// boxes of box_elems without a swizzle; elements past the end read as zeros. A box must
// start at a 16-byte aligned element (a multiple of 4): TMA faults on others. Returns false
// with the reason in why.
inline bool encode_map_1d_f32(unsigned char* map, const char* name, const float* base, int64_t count, int box_elems,
                              char* why, size_t whylen) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) {
    snprintf(why, whylen, "the driver has no cuTensorMapEncodeTiled");
    return false;
  }
  const cuuint64_t dims[1] = {static_cast<cuuint64_t>(count)};
  // A rank-1 map has no stride to give; a valid one (the array's bytes rounded up to 16)
  // rather than a null pointer, which not every driver may take for "none".
  const cuuint64_t strides[1] = {(static_cast<cuuint64_t>(count) * 4 + 15) / 16 * 16};
  const cuuint32_t box[1] = {static_cast<cuuint32_t>(box_elems)};
  const cuuint32_t element_strides[1] = {1};
  const CUresult rc = encode(reinterpret_cast<CUtensorMap*>(map), CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 1,
                             const_cast<float*>(base), dims, strides, box, element_strides,
                             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (rc != CUDA_SUCCESS) {
    snprintf(why, whylen, "cuTensorMapEncodeTiled refused %s (error %d; %lld floats)", name, static_cast<int>(rc),
             static_cast<long long>(count));
    return false;
  }
  return true;
}

}  // namespace
}  // namespace flashwatt
