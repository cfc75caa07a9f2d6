// flashwatt fp8 (e4m3) attention forward: the launch table of the attention kernels and the
// quantisation step (flash_fp8.cuh is the API; kernels/NOTES.md, "fp8 forward").
//
// Hopper only: the kernels are compiled for sm_90a builds (FLASHWATT_WGMMA). Other builds
// keep an empty table and refuse every launch with a message naming why.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "flash_fp8.cuh"
#include "flash_fwd.cuh"
#if defined(FLASHWATT_WGMMA)
#include "flash_fwd_fp8.cuh"
#include "flash_fwd_fp8_ws.cuh"
#include "fp8_quantize.cuh"
#include "tensor_map.cuh"
#endif

namespace flashwatt {
namespace {

using Fp8KernelFn = void (*)(const Fp8FwdParams);

struct Fp8Entry {
  FwdConfig cfg;
  Fp8KernelFn fn;
  int smem;
  int threads;
  bool persistent = false;  // warp-specialised: one CTA per SM without a cap, TMA copies from tensor maps
};

int fp8_report(char* err, size_t errlen, const char* what, cudaError_t code) {
  if (err && errlen) snprintf(err, errlen, "%s: %s", what, cudaGetErrorString(code));
  return static_cast<int>(code) ? static_cast<int>(code) : 1;
}

int fp8_refuse(char* err, size_t errlen, const char* why) {
  if (err && errlen) snprintf(err, errlen, "%s", why);
  return 1;
}

#if defined(FLASHWATT_WGMMA)
template <typename T, int D, int BN, int NWG, int ST, bool PP>
constexpr Fp8Entry fp8_entry(int out_dtype) {
  using S = Fp8Shape<D, BN, NWG, ST, PP>;
  return Fp8Entry{FwdConfig{kWgmmaFp8, out_dtype, D, S::BM, BN, NWG * 4, ST, PP ? kPingPong : kLockstep},
                  &flash_fwd_fp8_kernel<T, D, BN, NWG, ST, PP>, S::kSmemBytes, S::kThreads};
}

template <typename T, int D, int BN, int NWG, int ST, bool PP, bool RSUM = false>
constexpr Fp8Entry fp8_ws_entry(int out_dtype) {
  using S = Fp8WsShape<D, BN, NWG, ST, PP, RSUM>;
  return Fp8Entry{FwdConfig{RSUM ? kWgmmaFp8RowSum : kWgmmaFp8, out_dtype, D, S::BM, BN, S::kThreads / 32, ST,
                            PP ? kWarpSpecializedPingPong : kWarpSpecialized},
                  &flash_fwd_fp8_ws_kernel<T, D, BN, NWG, ST, PP, RSUM>, S::kSmemBytes, S::kThreads, true};
}

// The named fp8 tiles of src/flashwatt/kernels/custom_variants.py map onto these rows.
#define FLASHWATT_FP8_CONFIGS(T, DT)                                                                  \
  fp8_entry<T, 64, 128, 2, 2, false>(DT), fp8_entry<T, 128, 128, 2, 2, false>(DT),                    \
      fp8_entry<T, 64, 128, 2, 3, true>(DT), fp8_entry<T, 128, 128, 2, 3, true>(DT),                  \
      fp8_ws_entry<T, 64, 128, 2, 2, true>(DT), fp8_ws_entry<T, 128, 128, 2, 2, true>(DT),            \
      fp8_ws_entry<T, 64, 128, 2, 3, true>(DT), fp8_ws_entry<T, 128, 128, 2, 3, true>(DT),            \
      fp8_ws_entry<T, 64, 128, 3, 2, true>(DT), fp8_ws_entry<T, 64, 128, 3, 3, true>(DT),            \
      fp8_ws_entry<T, 64, 128, 2, 2, true, true>(DT), fp8_ws_entry<T, 128, 128, 2, 2, true, true>(DT), \
      fp8_ws_entry<T, 64, 128, 3, 3, true, true>(DT), fp8_ws_entry<T, 128, 128, 3, 2, true>(DT),      \
      fp8_ws_entry<T, 128, 128, 3, 3, true>(DT), fp8_ws_entry<T, 64, 128, 2, 2, false>(DT),          \
      fp8_ws_entry<T, 128, 128, 2, 2, false>(DT)

const Fp8Entry kFp8Entries[] = {
    FLASHWATT_FP8_CONFIGS(__nv_bfloat16, kBf16),
    FLASHWATT_FP8_CONFIGS(__half, kFp16),
};
constexpr int kNumFp8Entries = sizeof(kFp8Entries) / sizeof(kFp8Entries[0]);

// The tensor maps of the persistent kernels' TMA copies: q and k rows of head_dim bytes in the
// swizzle of that width, V^T rows of block_n keys in the 128-byte one (head_dim of them, or
// with the rows of ones and zeros under them for the RSUM tiles).
bool encode_fp8_maps(const Fp8Entry& e, Fp8FwdParams& f, char* why, size_t whylen) {
  FwdParams& p = f.p;
  const int d = e.cfg.head_dim;
  const CUtensorMapSwizzle rows = d == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8;
  const int vrows = d + (e.cfg.math == kWgmmaFp8RowSum ? kFp8VtExtraRows : 0);
  return encode_map_4d(p.maps.q, "q", u8, 1, p.q, d, p.len_q, p.heads, p.batch, p.q_sl, p.q_sh, p.q_sb, d,
                       e.cfg.block_m, why, whylen, rows) &&
         encode_map_4d(p.maps.k, "k", u8, 1, p.k, d, p.len_k, p.kv_heads, p.batch, p.k_sl, p.k_sh, p.k_sb, d,
                       e.cfg.block_n, why, whylen, rows) &&
         encode_map_4d(p.maps.v, "vt", u8, 1, p.v, f.vt_cols, vrows, p.kv_heads, p.batch, p.v_sl, p.v_sh, p.v_sb,
                       e.cfg.block_n, vrows, why, whylen, CU_TENSOR_MAP_SWIZZLE_128B);
}
#else
const Fp8Entry* const kFp8Entries = nullptr;
constexpr int kNumFp8Entries = 0;
#endif

constexpr const char* kNoFp8Build =
    "the fp8 kernels are built only for compute capability 9.0 (sm_90a, wgmma with e4m3 operands); this build "
    "has none";

}  // namespace

int fp8_fwd_num_configs() { return kNumFp8Entries; }

FwdConfig fp8_fwd_config(int index) { return kFp8Entries[index].cfg; }

int fp8_fwd_find_config(int math, int out_dtype, int head_dim, int block_m, int block_n, int warps, int stages,
                        int schedule) {
  for (int i = 0; i < kNumFp8Entries; ++i) {
    const FwdConfig& c = kFp8Entries[i].cfg;
    if (c.math == math && c.dtype == out_dtype && c.head_dim == head_dim && c.block_m == block_m && c.block_n == block_n &&
        c.warps == warps && c.stages == stages && c.schedule == schedule)
      return i;
  }
  return -1;
}

int fp8_fwd_launch(int index, const Fp8FwdParams& params, void* stream, char* err, size_t errlen) {
  if (kNumFp8Entries == 0) return fp8_refuse(err, errlen, kNoFp8Build);
  if (index < 0 || index >= kNumFp8Entries) {
    if (err && errlen) snprintf(err, errlen, "no compiled fp8 configuration with index %d", index);
    return 1;
  }
  const Fp8Entry& e = kFp8Entries[index];
  const Fp8FwdParams* args = &params;
#if defined(FLASHWATT_WGMMA)
  Fp8FwdParams with_maps;
  if (e.persistent) {
    with_maps = params;
    char why[256] = {0};
    if (!encode_fp8_maps(e, with_maps, why, sizeof(why))) {
      if (err && errlen) snprintf(err, errlen, "fp8 TMA copies: %s", why);
      return 1;
    }
    args = &with_maps;
  }
#endif
  int device = 0;
  cudaError_t st = cudaGetDevice(&device);
  if (st != cudaSuccess) return fp8_report(err, errlen, "cudaGetDevice", st);
  static unsigned long long configured[kNumFp8Entries > 0 ? kNumFp8Entries : 1] = {};
  const unsigned long long bit = 1ull << (device & 63);
  if (!(configured[index] & bit)) {
    st = cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
    if (st != cudaSuccess) return fp8_report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
    configured[index] |= bit;
  }
  const FwdParams& p = params.p;
  long long grid = static_cast<long long>((p.len_q + e.cfg.block_m - 1) / e.cfg.block_m) * p.batch * p.heads;
  if (p.grid_cap > 0 && grid > p.grid_cap) grid = p.grid_cap;
  if (p.grid_cap <= 0 && e.persistent) {  // one CTA per SM
    static int sm_count[64] = {};
    int& sms = sm_count[device & 63];
    if (sms == 0) {
      st = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
      if (st != cudaSuccess) return fp8_report(err, errlen, "cudaDeviceGetAttribute(multiprocessor count)", st);
    }
    if (grid > sms) grid = sms;
  }
  if (p.tile_counter != nullptr && !e.persistent)
    return fp8_refuse(err, errlen, "a tile counter needs a persistent (warp-specialised) fp8 configuration");
  if (grid > 0x7fffffffLL) grid = 0x7fffffffLL;
  if (grid <= 0) return 0;
  e.fn<<<static_cast<unsigned>(grid), e.threads, e.smem, static_cast<cudaStream_t>(stream)>>>(*args);
  st = cudaGetLastError();
  if (st != cudaSuccess) return fp8_report(err, errlen, "fp8 kernel launch", st);
  return 0;
}

int fp8_fwd_kernel_info(int index, FwdKernelInfo* info, char* err, size_t errlen) {
  if (kNumFp8Entries == 0) return fp8_refuse(err, errlen, kNoFp8Build);
  if (index < 0 || index >= kNumFp8Entries) {
    if (err && errlen) snprintf(err, errlen, "no compiled fp8 configuration with index %d", index);
    return 1;
  }
  const Fp8Entry& e = kFp8Entries[index];
  cudaFuncAttributes attr;
  cudaError_t st = cudaFuncGetAttributes(&attr, e.fn);
  if (st != cudaSuccess) return fp8_report(err, errlen, "cudaFuncGetAttributes", st);
  st = cudaFuncSetAttribute(e.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, e.smem);
  if (st != cudaSuccess) return fp8_report(err, errlen, "cudaFuncSetAttribute(max dynamic shared memory)", st);
  int blocks = 0;
  st = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, e.fn, e.threads, e.smem);
  if (st != cudaSuccess) return fp8_report(err, errlen, "cudaOccupancyMaxActiveBlocksPerMultiprocessor", st);
  info->num_regs = attr.numRegs;
  info->local_bytes = static_cast<int>(attr.localSizeBytes);
  info->smem_bytes = e.smem;
  info->max_ctas_per_sm = blocks;
  info->threads = e.threads;
  return 0;
}

int fp8_quantize_launch(Fp8QuantParams& params, int in_dtype, void* stream_ptr, char* err, size_t errlen) {
#if defined(FLASHWATT_WGMMA)
  const cudaStream_t stream = static_cast<cudaStream_t>(stream_ptr);
  if (params.tensors < 1 || params.tensors > 3) {
    if (err && errlen) snprintf(err, errlen, "fp8 quantisation: %d tensors (1 to 3)", params.tensors);
    return 1;
  }
  if (params.head_dim != 64 && params.head_dim != 128) {
    if (err && errlen) snprintf(err, errlen, "fp8 quantisation: head_dim %d (64 or 128)", params.head_dim);
    return 1;
  }
  long long blocks = 0;
  for (int i = 0; i < params.tensors; ++i) {
    const Fp8Tensor& t = params.t[i];
    if (t.block_rows != kFp8QBlock && t.block_rows != kFp8KvBlock) {
      if (err && errlen) snprintf(err, errlen, "fp8 quantisation: block_rows %d (%d or %d)", t.block_rows, kFp8QBlock,
                                  kFp8KvBlock);
      return 1;
    }
    if (t.transposed && t.block_rows != kFp8KvBlock) {
      if (err && errlen) snprintf(err, errlen, "fp8 quantisation: V^T is written in blocks of %d keys", kFp8KvBlock);
      return 1;
    }
    if ((in_dtype != kFp8Input) != (t.descale != nullptr)) {
      if (err && errlen) snprintf(err, errlen, "fp8 quantisation: a descale buffer goes with 16-bit inputs only");
      return 1;
    }
    params.first_block[i] = static_cast<int>(blocks);
    blocks += static_cast<long long>(params.batch) * t.heads * ((t.len + t.block_rows - 1) / t.block_rows);
    if (blocks > 0x7fffffffLL) {
      if (err && errlen) snprintf(err, errlen, "fp8 quantisation: more than 2^31 blocks");
      return 1;
    }
  }
  for (int i = params.tensors; i < 4; ++i) params.first_block[i] = static_cast<int>(blocks);
  if (blocks == 0) return 0;
  const dim3 grid(static_cast<unsigned>(blocks));
  const bool d64 = params.head_dim == 64;
  switch (in_dtype) {
    case kBf16:
      d64 ? fp8_quantize_kernel<__nv_bfloat16, 64><<<grid, kQuantThreads, 0, stream>>>(params)
          : fp8_quantize_kernel<__nv_bfloat16, 128><<<grid, kQuantThreads, 0, stream>>>(params);
      break;
    case kFp16:
      d64 ? fp8_quantize_kernel<__half, 64><<<grid, kQuantThreads, 0, stream>>>(params)
          : fp8_quantize_kernel<__half, 128><<<grid, kQuantThreads, 0, stream>>>(params);
      break;
    case kFp8Input:
      d64 ? fp8_quantize_kernel<uint8_t, 64><<<grid, kQuantThreads, 0, stream>>>(params)
          : fp8_quantize_kernel<uint8_t, 128><<<grid, kQuantThreads, 0, stream>>>(params);
      break;
    default:
      if (err && errlen) snprintf(err, errlen, "fp8 quantisation: input dtype code %d", in_dtype);
      return 1;
  }
  const cudaError_t st = cudaGetLastError();
  if (st != cudaSuccess) return fp8_report(err, errlen, "fp8 quantisation launch", st);
  return 0;
#else
  (void)params, (void)in_dtype, (void)stream_ptr;
  return fp8_refuse(err, errlen, kNoFp8Build);
#endif
}

}  // namespace flashwatt
