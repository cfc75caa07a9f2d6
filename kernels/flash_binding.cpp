// torch binding of the flashwatt attention kernels: the forward (flash_fwd.cu), the
// backward (flash_bwd.cu) and the fp8 forward with its quantisation step (flash_fp8.cu).
//
// Every check runs before the launch, so a refused input never reaches the GPU.
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/extension.h>

#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "flash_bwd.cuh"
#include "flash_fp8.cuh"
#include "flash_fwd.cuh"

namespace {

// ------------------------------------------------------------------ messages
// A refusal's message is built from std::string and std::to_string and reaches TORCH_CHECK as
// one string, never through a std::ostream of this library: on the GPU image, a message with
// a number in it (TORCH_CHECK's c10::str, an ostringstream instantiated here) took the process
// down with a segmentation fault inside std::ostream::_M_insert<long> instead of raising,
// while torch's own checks, formatted inside libc10, raised. A message of a single string
// never touches a stream, which is why those refusals did raise.
// tests/gpu/test_fp8_kernel.py, test_the_extensions_own_refusals_reach_python_as_errors.
namespace message {
inline std::string part(const char* s) { return s; }
inline std::string part(const std::string& s) { return s; }
inline std::string part(bool v) { return v ? "true" : "false"; }
template <typename I, typename = std::enable_if_t<std::is_integral_v<I>>>
inline std::string part(I v) {
  return std::to_string(v);
}
inline std::string part(const c10::Device& d) { return d.str(); }
inline std::string part(at::ScalarType t) { return c10::toString(t); }
inline std::string part(at::IntArrayRef a) {
  std::string s = "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  return s + "]";
}
inline std::string part(const std::vector<int64_t>& a) { return part(at::IntArrayRef(a)); }
template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  ((s += part(a)), ...);
  return s;
}
}  // namespace message

// TORCH_CHECK with the message made by message::cat (evaluated only when cond is false).
#define FLASHWATT_CHECK(cond, ...) TORCH_CHECK(cond, message::cat(__VA_ARGS__))

int dtype_code(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return flashwatt::kFp16;
    case at::kBFloat16:
      return flashwatt::kBf16;
    case at::kFloat:
      return flashwatt::kFp32;
    default:
      return -1;
  }
}

const char* math_name(int64_t math) {
  switch (math) {
    case flashwatt::kMmaSync:
      return "mma.sync";
    case flashwatt::kWgmma:
      return "wgmma";
    case flashwatt::kFfma:
      return "ffma";
    case flashwatt::kMmaTf32:
      return "mma.sync.tf32";
    default:
      return "unknown";
  }
}

// align16: the kernel reads and writes 16 bytes at a time (every kernel but the fp32 FFMA one).
void check_operand(const at::Tensor& t, const char* name, const at::Tensor& q, bool align16) {
  FLASHWATT_CHECK(t.is_cuda(), "flashwatt custom: ", name, " must be a CUDA tensor (got ", t.device(), ")");
  FLASHWATT_CHECK(t.device() == q.device(), "flashwatt custom: ", name, " is on ", t.device(), " but q is on ", q.device());
  FLASHWATT_CHECK(t.scalar_type() == q.scalar_type(), "flashwatt custom: ", name, " has dtype ", t.scalar_type(),
              " but q has ", q.scalar_type());
  FLASHWATT_CHECK(t.dim() == 4, "flashwatt custom: ", name, " must be 4-d (batch, heads, seq_len, head_dim), got ",
              t.dim(), "-d");
  FLASHWATT_CHECK(t.stride(3) == 1, "flashwatt custom: ", name, " must have a contiguous last (head_dim) dimension");
  const int align = align16 ? 16 : 4;
  FLASHWATT_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % align == 0, "flashwatt custom: ", name,
              " data pointer must be ", align, "-byte aligned");
  if (align16) {
    const int64_t per16 = 16 / t.element_size();
    for (int d = 0; d < 3; ++d)
      FLASHWATT_CHECK(t.stride(d) % per16 == 0, "flashwatt custom: ", name, " stride(", d, ") must be a multiple of ",
                  per16, " elements for 16-byte loads, got ", t.stride(d));
  }
  const int64_t span = (t.size(2) - 1) * t.stride(2) + t.size(3);
  FLASHWATT_CHECK(span < std::numeric_limits<int32_t>::max(), "flashwatt custom: ", name,
              " rows of one head span more than 2^31 elements");
}

// The causal mask's alignment (flashwatt::CausalAlign), checked before any launch.
void check_causal_align(int64_t causal_align) {
  FLASHWATT_CHECK(causal_align == flashwatt::kCausalTopLeft || causal_align == flashwatt::kCausalBottomRight,
              "flashwatt custom: causal_align ", causal_align, " not one of 0 (top-left), 1 (bottom-right)");
}

// Runs configuration (math, block_m, block_n, warps, stages) on (B, H, L, D)-shaped views
// with any strides; writes out (same shape as q) and lse (B, H, Lq) float32 contiguous.
void forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& out, at::Tensor& lse,
             bool causal, int64_t causal_align, double scale, int64_t math, int64_t block_m, int64_t block_n,
             int64_t warps, int64_t stages, int64_t schedule, int64_t grid_cap, int64_t section, bool tile_counter,
             int64_t copies) {
  const bool align16 = math != flashwatt::kFfma;
  check_operand(q, "q", q, align16);
  check_operand(k, "k", q, align16);
  check_operand(v, "v", q, align16);
  check_operand(out, "out", q, align16);
  const int dt = dtype_code(q);
  FLASHWATT_CHECK(dt >= 0, "flashwatt custom: dtype ", q.scalar_type(), " not supported (float16, bfloat16, float32)");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Lk = k.size(2);
  FLASHWATT_CHECK(k.sizes() == v.sizes(), "flashwatt custom: k ", k.sizes(), " and v ", v.sizes(), " differ in shape");
  FLASHWATT_CHECK(k.size(0) == B, "flashwatt custom: batch of k (", k.size(0), ") differs from q (", B, ")");
  FLASHWATT_CHECK(k.size(3) == D, "flashwatt custom: head_dim of k (", k.size(3), ") differs from q (", D, ")");
  FLASHWATT_CHECK(Hkv >= 1 && H % Hkv == 0, "flashwatt custom: q heads (", H, ") must be a multiple of k/v heads (",
              Hkv, ")");
  FLASHWATT_CHECK(out.sizes() == q.sizes(), "flashwatt custom: out ", out.sizes(), " must match q ", q.sizes());
  FLASHWATT_CHECK(lse.is_cuda() && lse.device() == q.device() && lse.scalar_type() == at::kFloat &&
                  lse.is_contiguous() && lse.dim() == 3 && lse.size(0) == B && lse.size(1) == H &&
                  lse.size(2) == Lq,
              "flashwatt custom: lse must be a contiguous float32 (B, H, Lq) tensor on q's device");
  FLASHWATT_CHECK(Lq >= 1 && Lk >= 1 && B >= 1 && H >= 1, "flashwatt custom: empty input");
  check_causal_align(causal_align);
  FLASHWATT_CHECK(B * H * ((Lq + 15) / 16) < std::numeric_limits<int32_t>::max(), "flashwatt custom: too many tiles");
  const int index = flashwatt::fwd_find_config(static_cast<int>(math), dt, static_cast<int>(D),
                                               static_cast<int>(block_m), static_cast<int>(block_n),
                                               static_cast<int>(warps), static_cast<int>(stages),
                                               static_cast<int>(schedule));
  FLASHWATT_CHECK(index >= 0, "flashwatt custom: no compiled kernel for math ", math_name(math), ", dtype ",
              q.scalar_type(), ", head_dim ", D, ", block_m ", block_m, ", block_n ", block_n, ", warps ", warps,
              ", stages ", stages, ", schedule ", schedule, math == flashwatt::kWgmma ? " (wgmma needs an sm_90a build)" : "");

  flashwatt::FwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_sl = q.stride(2);
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_sl = k.stride(2);
  p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_sl = v.stride(2);
  p.o_sb = out.stride(0), p.o_sh = out.stride(1), p.o_sl = out.stride(2);
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.kv_heads = static_cast<int>(Hkv);
  p.len_q = static_cast<int>(Lq);
  p.len_k = static_cast<int>(Lk);
  p.head_dim = static_cast<int>(D);
  p.scale = static_cast<float>(scale);
  p.causal = causal ? 1 : 0;
  p.causal_offset = causal ? flashwatt::causal_offset(static_cast<int>(causal_align), p.len_q, p.len_k) : 0;
  p.grid_cap = grid_cap > 0 ? static_cast<int>(std::min<int64_t>(grid_cap, std::numeric_limits<int32_t>::max())) : 0;
  p.section = section > 0 ? static_cast<int>(std::min<int64_t>(section, B * H)) : 0;
  FLASHWATT_CHECK(copies == flashwatt::kCopiesAuto || copies == flashwatt::kCopiesThreads ||
                  copies == flashwatt::kCopiesTma,
              "flashwatt custom: copies ", copies, " not one of 0 (auto), 1 (threads), 2 (TMA)");
  p.copies = static_cast<int>(copies);

  const c10::cuda::CUDAGuard guard(q.device());
  // The persistent kernels' work items from a counter (flashwatt.kernels.custom_variants.work_order):
  // one zeroed int per call, freed in stream order after the launch.
  at::Tensor counter;
  if (tile_counter) {
    FLASHWATT_CHECK(schedule == flashwatt::kWarpSpecialized || schedule == flashwatt::kWarpSpecializedPingPong,
                "flashwatt custom: a tile counter needs a persistent (warp-specialised) schedule, not ", schedule);
    counter = at::zeros({1}, q.options().dtype(at::kInt));
    p.tile_counter = counter.data_ptr<int>();
  }
  char err[512] = {0};
  const int rc = flashwatt::fwd_launch(index, p, at::cuda::getCurrentCUDAStream().stream(), err, sizeof(err));
  FLASHWATT_CHECK(rc == 0, "flashwatt custom: ", err);
}

std::vector<std::vector<int64_t>> configs() {
  std::vector<std::vector<int64_t>> rows;
  for (int i = 0; i < flashwatt::fwd_num_configs(); ++i) {
    const flashwatt::FwdConfig c = flashwatt::fwd_config(i);
    rows.push_back({c.math, c.dtype, c.head_dim, c.block_m, c.block_n, c.warps, c.stages, c.schedule});
  }
  return rows;
}

// Facts of one compiled configuration on the current device: registers, local memory, occupancy.
std::map<std::string, int64_t> kernel_info(int64_t math, int64_t dtype, int64_t head_dim, int64_t block_m,
                                           int64_t block_n, int64_t warps, int64_t stages, int64_t schedule) {
  const int index = flashwatt::fwd_find_config(static_cast<int>(math), static_cast<int>(dtype), static_cast<int>(head_dim),
                                               static_cast<int>(block_m), static_cast<int>(block_n),
                                               static_cast<int>(warps), static_cast<int>(stages),
                                               static_cast<int>(schedule));
  FLASHWATT_CHECK(index >= 0, "flashwatt custom: no such compiled configuration");
  flashwatt::FwdKernelInfo info{};
  char err[512] = {0};
  FLASHWATT_CHECK(flashwatt::fwd_kernel_info(index, &info, err, sizeof(err)) == 0, "flashwatt custom: ", err);
  return {{"num_regs", info.num_regs},
          {"local_bytes", info.local_bytes},
          {"smem_bytes", info.smem_bytes},
          {"max_ctas_per_sm", info.max_ctas_per_sm},
          {"threads", info.threads}};
}

// Backward of attention on (B, H, L, D)-shaped views with any strides (16-byte loads and
// stores, as the forward's tensor-core kernels): writes dq (q's shape), dk and dv (k's
// shape). lse is the forward's; delta (B, H, Lq) and dq_accum (B, H, Lq, D) are float32
// contiguous workspaces the kernels fill. deterministic: dQ in a pass of its own without
// atomics (flash_bwd_dq.cuh), bit-identical run to run; dq_accum is then not used (any
// tensor, e.g. empty). fp16/bf16 only (the configuration table).
void backward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
              const at::Tensor& dout, const at::Tensor& lse, at::Tensor& dq, at::Tensor& dk, at::Tensor& dv,
              at::Tensor& delta, at::Tensor& dq_accum, bool causal, int64_t causal_align, double scale,
              int64_t block_n, int64_t block_m,
              int64_t warps, int64_t math, int64_t section, bool deterministic) {
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&q, "q"}, {&k, "k"}, {&v, "v"},
                                {&out, "out"}, {&dout, "dout"}, {&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}})
    check_operand(*t, name, q, true);
  const int dt = dtype_code(q);
  FLASHWATT_CHECK(dt == flashwatt::kFp16 || dt == flashwatt::kBf16, "flashwatt custom backward: dtype ", q.scalar_type(),
              " has no CUDA backward (float16, bfloat16)");
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Lk = k.size(2);
  FLASHWATT_CHECK(k.sizes() == v.sizes(), "flashwatt custom backward: k ", k.sizes(), " and v ", v.sizes(),
              " differ in shape");
  FLASHWATT_CHECK(k.size(0) == B && k.size(3) == D, "flashwatt custom backward: k ", k.sizes(), " does not match q ",
              q.sizes(), " in batch or head_dim");
  FLASHWATT_CHECK(Hkv >= 1 && H % Hkv == 0, "flashwatt custom backward: q heads (", H,
              ") must be a multiple of k/v heads (", Hkv, ")");
  FLASHWATT_CHECK(out.sizes() == q.sizes() && dout.sizes() == q.sizes() && dq.sizes() == q.sizes(),
              "flashwatt custom backward: out, dout and dq must have q's shape ", q.sizes());
  FLASHWATT_CHECK(dk.sizes() == k.sizes() && dv.sizes() == k.sizes(),
              "flashwatt custom backward: dk and dv must have k's shape ", k.sizes());
  FLASHWATT_CHECK(Lq >= 1 && Lk >= 1 && B >= 1 && H >= 1, "flashwatt custom backward: empty input");
  check_causal_align(causal_align);
  auto check_f32 = [&](const at::Tensor& t, const char* name, std::vector<int64_t> shape) {
    FLASHWATT_CHECK(t.is_cuda() && t.device() == q.device() && t.scalar_type() == at::kFloat && t.is_contiguous() &&
                    t.sizes() == at::IntArrayRef(shape) && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0,
                "flashwatt custom backward: ", name, " must be a contiguous, 16-byte aligned float32 ", shape,
                " tensor on q's device");
  };
  check_f32(lse, "lse", {B, H, Lq});
  check_f32(delta, "delta", {B, H, Lq});
  if (!deterministic) check_f32(dq_accum, "dq_accum", {B, H, Lq, D});
  FLASHWATT_CHECK(B * H * Lq * D < std::numeric_limits<int64_t>::max() / 4 &&
                  B * Hkv * ((Lk + 15) / 16) < std::numeric_limits<int32_t>::max(),
              "flashwatt custom backward: too many tiles");
  const int index = flashwatt::bwd_find_config(dt, static_cast<int>(D), static_cast<int>(block_n),
                                               static_cast<int>(block_m), static_cast<int>(warps),
                                               static_cast<int>(math));
  FLASHWATT_CHECK(index >= 0, "flashwatt custom backward: no compiled kernel for dtype ", q.scalar_type(), ", head_dim ",
              D, ", block_n ", block_n, ", block_m ", block_m, ", warps ", warps, ", math ", math);

  flashwatt::BwdParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.o = out.data_ptr();
  p.dout = dout.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.delta = delta.data_ptr<float>();
  // The LSE in base 2 (BwdParams::lse_log2): a workspace like delta, freed when this call
  // returns (stream-ordered: the caching allocator hands it out again only to later work).
  at::Tensor lse_log2 = at::empty_like(delta);
  p.lse_log2 = lse_log2.data_ptr<float>();
  p.dq_accum = deterministic ? nullptr : dq_accum.data_ptr<float>();  // null: the deterministic dQ pass
  p.dq = dq.data_ptr();
  p.dk = dk.data_ptr();
  p.dv = dv.data_ptr();
  p.q_sb = q.stride(0), p.q_sh = q.stride(1), p.q_sl = q.stride(2);
  p.k_sb = k.stride(0), p.k_sh = k.stride(1), p.k_sl = k.stride(2);
  p.v_sb = v.stride(0), p.v_sh = v.stride(1), p.v_sl = v.stride(2);
  p.o_sb = out.stride(0), p.o_sh = out.stride(1), p.o_sl = out.stride(2);
  p.do_sb = dout.stride(0), p.do_sh = dout.stride(1), p.do_sl = dout.stride(2);
  p.dq_sb = dq.stride(0), p.dq_sh = dq.stride(1), p.dq_sl = dq.stride(2);
  p.dk_sb = dk.stride(0), p.dk_sh = dk.stride(1), p.dk_sl = dk.stride(2);
  p.dv_sb = dv.stride(0), p.dv_sh = dv.stride(1), p.dv_sl = dv.stride(2);
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.kv_heads = static_cast<int>(Hkv);
  p.len_q = static_cast<int>(Lq);
  p.len_k = static_cast<int>(Lk);
  p.head_dim = static_cast<int>(D);
  p.scale = static_cast<float>(scale);
  p.causal = causal ? 1 : 0;
  p.causal_offset = causal ? flashwatt::causal_offset(static_cast<int>(causal_align), p.len_q, p.len_k) : 0;
  p.section = section > 0 ? static_cast<int>(std::min<int64_t>(section, B * Hkv)) : 0;

  const c10::cuda::CUDAGuard guard(q.device());
  char err[512] = {0};
  const int rc = flashwatt::bwd_launch(index, p, at::cuda::getCurrentCUDAStream().stream(), err, sizeof(err));
  FLASHWATT_CHECK(rc == 0, "flashwatt custom backward: ", err);
}

// ------------------------------------------------------------------ fp8 (flash_fp8.cu)

// An e4m3 operand: a CUDA tensor on q's device, 4-d, rows of 16-byte multiples at 16-byte
// aligned addresses (the kernels copy 16 bytes at a time).
void check_fp8_operand(const at::Tensor& t, const char* name, const at::Tensor& like) {
  FLASHWATT_CHECK(t.is_cuda() && t.device() == like.device(), "flashwatt fp8: ", name, " must be a CUDA tensor on ",
              like.device(), " (got ", t.device(), ")");
  FLASHWATT_CHECK(t.scalar_type() == at::kFloat8_e4m3fn, "flashwatt fp8: ", name, " must be float8_e4m3fn, got ",
              t.scalar_type());
  FLASHWATT_CHECK(t.dim() == 4 && t.stride(3) == 1, "flashwatt fp8: ", name,
              " must be 4-d with a contiguous last dimension, got sizes ", t.sizes(), " strides ", t.strides());
  FLASHWATT_CHECK(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 && t.stride(0) % 16 == 0 && t.stride(1) % 16 == 0 &&
                  t.stride(2) % 16 == 0,
              "flashwatt fp8: ", name, " must start 16-byte aligned with strides that are multiples of 16, got ",
              t.strides());
}

int64_t fp8_blocks(int64_t len, int64_t rows) { return (len + rows - 1) / rows; }

// Descales of (batch, heads, blocks of `rows` rows of len): float32, contiguous, on `like`'s device.
void check_descale(const at::Tensor& d, const char* name, int64_t batch, int64_t heads, int64_t len, int64_t rows,
                   const at::Tensor& like) {
  const int64_t blocks = fp8_blocks(len, rows);
  FLASHWATT_CHECK(d.is_cuda() && d.device() == like.device() && d.scalar_type() == at::kFloat && d.is_contiguous() &&
                  d.dim() == 3 && d.size(0) == batch && d.size(1) == heads && d.size(2) == blocks,
              "flashwatt fp8: ", name, " must be a contiguous float32 (", batch, ", ", heads, ", ", blocks,
              ") tensor on ", like.device(), " (one per block of ", rows, " rows), got ", d.scalar_type(), " ",
              d.sizes(), " on ", d.device());
}

void check_fp8_head_dim(int64_t head_dim) {
  FLASHWATT_CHECK(head_dim == 64 || head_dim == 128, "flashwatt fp8: head_dim ", head_dim, " not supported (64, 128)");
}

int64_t fp8_vt_cols(int64_t len_k) { return fp8_blocks(len_k, flashwatt::kFp8KeyPad) * flashwatt::kFp8KeyPad; }

// V^T of (batch, kv_heads, len_k, head_dim): (batch, kv_heads, head_dim + 8, fp8_vt_cols(len_k)) e4m3,
// contiguous (flash_fp8.cuh, kFp8VtExtraRows).
void check_vt(const at::Tensor& vt, int64_t batch, int64_t kv_heads, int64_t len_k, int64_t head_dim,
              const at::Tensor& like) {
  check_fp8_operand(vt, "vt", like);
  const std::vector<int64_t> shape{batch, kv_heads, head_dim + flashwatt::kFp8VtExtraRows, fp8_vt_cols(len_k)};
  FLASHWATT_CHECK(vt.is_contiguous() && vt.sizes() == at::IntArrayRef(shape), "flashwatt fp8: vt must be a contiguous ",
              shape, " tensor (V transposed, keys padded to a multiple of ", flashwatt::kFp8KeyPad, ", ",
              flashwatt::kFp8VtExtraRows, " rows of ones and zeros under the head dim's), got ", vt.sizes());
}

flashwatt::Fp8Tensor fp8_tensor(const at::Tensor& x, at::Tensor& out, at::Tensor* descale, int block_rows,
                                bool transposed) {
  flashwatt::Fp8Tensor t{};
  t.x = x.data_ptr();
  t.sb = x.stride(0), t.sh = x.stride(1), t.sl = x.stride(2);
  t.out = out.data_ptr();
  t.descale = descale != nullptr ? descale->data_ptr<float>() : nullptr;
  t.heads = static_cast<int>(x.size(1));
  t.len = static_cast<int>(x.size(2));
  t.block_rows = block_rows;
  t.transposed = transposed ? 1 : 0;
  t.vt_cols = transposed ? static_cast<int>(fp8_vt_cols(x.size(2))) : 0;
  return t;
}

void run_quantize(flashwatt::Fp8QuantParams& p, int in_dtype, const at::Tensor& like) {
  const c10::cuda::CUDAGuard guard(like.device());
  char err[512] = {0};
  const int rc = flashwatt::fp8_quantize_launch(p, in_dtype, at::cuda::getCurrentCUDAStream().stream(), err, sizeof(err));
  FLASHWATT_CHECK(rc == 0, "flashwatt fp8: ", err);
}

// q, k, v (fp16 or bf16, (B, H, L, D) views, 16-byte loads) to q8, k8 (contiguous e4m3 of
// their shapes), vt8 (V^T: check_vt) and descales per block (float32 (B, H, blocks of 64 rows)
// for q, (B, Hkv, blocks of 128 keys) for k and v).
void fp8_quantize(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, at::Tensor& q8, at::Tensor& k8,
                  at::Tensor& vt8, at::Tensor& descale_q, at::Tensor& descale_k, at::Tensor& descale_v) {
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&q, "q"}, {&k, "k"}, {&v, "v"}})
    check_operand(*t, name, q, true);
  const int dt = dtype_code(q);
  FLASHWATT_CHECK(dt == flashwatt::kFp16 || dt == flashwatt::kBf16, "flashwatt fp8: quantises float16 or bfloat16, not ",
              q.scalar_type());
  const int64_t B = q.size(0), H = q.size(1), Lq = q.size(2), D = q.size(3), Hkv = k.size(1), Lk = k.size(2);
  check_fp8_head_dim(D);
  FLASHWATT_CHECK(k.sizes() == v.sizes() && k.size(0) == B && k.size(3) == D && Hkv >= 1 && H % Hkv == 0,
              "flashwatt fp8: k ", k.sizes(), " and v ", v.sizes(), " do not fit q ", q.sizes());
  FLASHWATT_CHECK(Lq >= 1 && Lk >= 1 && B >= 1, "flashwatt fp8: empty input");
  check_fp8_operand(q8, "q8", q);
  check_fp8_operand(k8, "k8", q);
  FLASHWATT_CHECK(q8.is_contiguous() && q8.sizes() == q.sizes() && k8.is_contiguous() && k8.sizes() == k.sizes(),
              "flashwatt fp8: q8 and k8 must be contiguous with the shapes of q and k");
  check_vt(vt8, B, Hkv, Lk, D, q);
  check_descale(descale_q, "descale_q", B, H, Lq, flashwatt::kFp8QBlock, q);
  check_descale(descale_k, "descale_k", B, Hkv, Lk, flashwatt::kFp8KvBlock, q);
  check_descale(descale_v, "descale_v", B, Hkv, Lk, flashwatt::kFp8KvBlock, q);
  flashwatt::Fp8QuantParams p{};
  p.t[0] = fp8_tensor(q, q8, &descale_q, flashwatt::kFp8QBlock, false);
  p.t[1] = fp8_tensor(k, k8, &descale_k, flashwatt::kFp8KvBlock, false);
  p.t[2] = fp8_tensor(v, vt8, &descale_v, flashwatt::kFp8KvBlock, true);
  p.tensors = 3;
  p.batch = static_cast<int>(B);
  p.head_dim = static_cast<int>(D);
  run_quantize(p, dt, q);
}

// A pre-quantised e4m3 V (B, Hkv, Lk, D) into V^T (check_vt), keys in the kernels' order.
void fp8_transpose_v(const at::Tensor& v8, at::Tensor& vt8) {
  check_fp8_operand(v8, "v", v8);
  const int64_t B = v8.size(0), Hkv = v8.size(1), Lk = v8.size(2), D = v8.size(3);
  check_fp8_head_dim(D);
  FLASHWATT_CHECK(Lk >= 1 && B >= 1 && Hkv >= 1, "flashwatt fp8: empty v");
  check_vt(vt8, B, Hkv, Lk, D, v8);
  flashwatt::Fp8QuantParams p{};
  p.t[0] = fp8_tensor(v8, vt8, nullptr, flashwatt::kFp8KvBlock, true);
  p.tensors = 1;
  p.batch = static_cast<int>(B);
  p.head_dim = static_cast<int>(D);
  run_quantize(p, flashwatt::kFp8Input, v8);
}

// Everything fp8_forward's arguments must satisfy, checked before anything is launched.
void check_fp8_forward(const at::Tensor& q8, const at::Tensor& k8, const at::Tensor& vt8, const at::Tensor& descale_q,
                       const at::Tensor& descale_k, const at::Tensor& descale_v, const at::Tensor& out,
                       const at::Tensor& lse, int64_t causal_align, int64_t schedule, bool tile_counter) {
  check_fp8_operand(q8, "q", q8);
  check_fp8_operand(k8, "k", q8);
  const int64_t B = q8.size(0), H = q8.size(1), Lq = q8.size(2), D = q8.size(3), Hkv = k8.size(1), Lk = k8.size(2);
  check_fp8_head_dim(D);
  FLASHWATT_CHECK(k8.size(0) == B && k8.size(3) == D && Hkv >= 1 && H % Hkv == 0, "flashwatt fp8: k ", k8.sizes(),
              " does not fit q ", q8.sizes());
  FLASHWATT_CHECK(Lq >= 1 && Lk >= 1 && B >= 1, "flashwatt fp8: empty input");
  check_vt(vt8, B, Hkv, Lk, D, q8);
  check_descale(descale_q, "descale_q", B, H, Lq, flashwatt::kFp8QBlock, q8);
  check_descale(descale_k, "descale_k", B, Hkv, Lk, flashwatt::kFp8KvBlock, q8);
  check_descale(descale_v, "descale_v", B, Hkv, Lk, flashwatt::kFp8KvBlock, q8);
  FLASHWATT_CHECK(out.is_cuda() && out.device() == q8.device() && out.sizes() == q8.sizes(), "flashwatt fp8: out ",
              out.sizes(), " must be a CUDA tensor of q's shape ", q8.sizes(), " on its device");
  const int out_dtype = dtype_code(out);
  FLASHWATT_CHECK(out_dtype == flashwatt::kFp16 || out_dtype == flashwatt::kBf16, "flashwatt fp8: out must be float16 "
              "or bfloat16, not ", out.scalar_type());
  check_operand(out, "out", out, true);
  FLASHWATT_CHECK(lse.is_cuda() && lse.device() == q8.device() && lse.scalar_type() == at::kFloat && lse.is_contiguous() &&
                  lse.dim() == 3 && lse.size(0) == B && lse.size(1) == H && lse.size(2) == Lq,
              "flashwatt fp8: lse must be a contiguous float32 (B, H, Lq) tensor on q's device");
  check_causal_align(causal_align);
  FLASHWATT_CHECK(B * H * ((Lq + 15) / 16) < std::numeric_limits<int32_t>::max(), "flashwatt fp8: too many tiles");
  FLASHWATT_CHECK(flashwatt::fp8_fwd_num_configs() > 0, "flashwatt fp8: this build has no fp8 kernels (they are built "
              "for compute capability 9.0, sm_90a, only)");
  FLASHWATT_CHECK(!tile_counter || schedule == flashwatt::kWarpSpecialized ||
                  schedule == flashwatt::kWarpSpecializedPingPong,
              "flashwatt fp8: a tile counter needs a persistent (warp-specialised) schedule, not ", schedule);
}

// The launch of a checked fp8_forward: returns fp8_fwd_launch's code with its message in err.
// It throws nothing, and no function that throws holds its parameter block: Fp8FwdParams is
// 128-byte aligned (its tensor maps), so the frame that holds it is realigned, and a C++
// error is raised only from frames without one (fp8_forward, check_fp8_forward).
__attribute__((noinline)) int launch_fp8_forward(int index, const at::Tensor& q8, const at::Tensor& k8, const at::Tensor& vt8,
                       const at::Tensor& descale_q, const at::Tensor& descale_k, const at::Tensor& descale_v,
                       at::Tensor& out, at::Tensor& lse, bool causal, int64_t causal_align, double scale,
                       int64_t grid_cap, int64_t section, int* tile_counter, void* stream, char* err,
                       size_t errlen) {
  const int64_t B = q8.size(0), H = q8.size(1);
  flashwatt::Fp8FwdParams f{};
  flashwatt::FwdParams& p = f.p;
  p.q = q8.data_ptr();
  p.k = k8.data_ptr();
  p.v = vt8.data_ptr();
  p.o = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.q_sb = q8.stride(0), p.q_sh = q8.stride(1), p.q_sl = q8.stride(2);
  p.k_sb = k8.stride(0), p.k_sh = k8.stride(1), p.k_sl = k8.stride(2);
  p.v_sb = vt8.stride(0), p.v_sh = vt8.stride(1), p.v_sl = vt8.stride(2);
  p.o_sb = out.stride(0), p.o_sh = out.stride(1), p.o_sl = out.stride(2);
  p.batch = static_cast<int>(B);
  p.heads = static_cast<int>(H);
  p.kv_heads = static_cast<int>(k8.size(1));
  p.len_q = static_cast<int>(q8.size(2));
  p.len_k = static_cast<int>(k8.size(2));
  p.head_dim = static_cast<int>(q8.size(3));
  p.scale = static_cast<float>(scale);
  p.causal = causal ? 1 : 0;
  p.causal_offset = causal ? flashwatt::causal_offset(static_cast<int>(causal_align), p.len_q, p.len_k) : 0;
  p.grid_cap = grid_cap > 0 ? static_cast<int>(std::min<int64_t>(grid_cap, std::numeric_limits<int32_t>::max())) : 0;
  p.section = section > 0 ? static_cast<int>(std::min<int64_t>(section, B * H)) : 0;
  p.tile_counter = tile_counter;
  f.descale_q = descale_q.data_ptr<float>();
  f.descale_k = descale_k.data_ptr<float>();
  f.descale_v = descale_v.data_ptr<float>();
  f.q_blocks = static_cast<int>(descale_q.size(2));
  f.kv_blocks = static_cast<int>(descale_k.size(2));
  f.vt_cols = static_cast<int>(vt8.size(3));
  return flashwatt::fp8_fwd_launch(index, f, stream, err, errlen);
}

// The fp8 forward on q8 (B, H, Lq, D), k8 (B, Hkv, Lk, D), vt8 (check_vt) with their
// descales per block; out (q8's shape, fp16 or bf16, any 16-byte strides) and lse (B, H, Lq)
// float32.
void fp8_forward(const at::Tensor& q8, const at::Tensor& k8, const at::Tensor& vt8, const at::Tensor& descale_q,
                 const at::Tensor& descale_k, const at::Tensor& descale_v, at::Tensor& out, at::Tensor& lse,
                 bool causal, int64_t causal_align, double scale, int64_t math, int64_t block_m, int64_t block_n,
                 int64_t warps, int64_t stages, int64_t schedule, int64_t grid_cap, int64_t section, bool tile_counter) {
  check_fp8_forward(q8, k8, vt8, descale_q, descale_k, descale_v, out, lse, causal_align, schedule, tile_counter);
  const int index = flashwatt::fp8_fwd_find_config(static_cast<int>(math), dtype_code(out), static_cast<int>(q8.size(3)),
                                                   static_cast<int>(block_m), static_cast<int>(block_n),
                                                   static_cast<int>(warps), static_cast<int>(stages),
                                                   static_cast<int>(schedule));
  FLASHWATT_CHECK(index >= 0, "flashwatt fp8: no compiled kernel for math ", math, ", out dtype ", out.scalar_type(), ", head_dim ",
              q8.size(3), ", block_m ", block_m, ", block_n ", block_n, ", warps ", warps, ", stages ", stages,
              ", schedule ", schedule);
  const c10::cuda::CUDAGuard guard(q8.device());
  // The persistent kernels' work items from a counter: one zeroed int per call (as forward's).
  at::Tensor counter;
  if (tile_counter) counter = at::zeros({1}, q8.options().dtype(at::kInt));
  char err[512] = {0};
  const int rc = launch_fp8_forward(index, q8, k8, vt8, descale_q, descale_k, descale_v, out, lse, causal,
                                    causal_align, scale, grid_cap, section,
                                    tile_counter ? counter.data_ptr<int>() : nullptr,
                                    at::cuda::getCurrentCUDAStream().stream(), err, sizeof(err));
  FLASHWATT_CHECK(rc == 0, "flashwatt fp8: ", err);
}

std::vector<std::vector<int64_t>> fp8_configs() {
  std::vector<std::vector<int64_t>> rows;
  for (int i = 0; i < flashwatt::fp8_fwd_num_configs(); ++i) {
    const flashwatt::FwdConfig c = flashwatt::fp8_fwd_config(i);
    rows.push_back({c.math, c.dtype, c.head_dim, c.block_m, c.block_n, c.warps, c.stages, c.schedule});
  }
  return rows;
}

std::map<std::string, int64_t> fp8_kernel_info(int64_t math, int64_t out_dtype, int64_t head_dim, int64_t block_m,
                                               int64_t block_n,
                                               int64_t warps, int64_t stages, int64_t schedule) {
  const int index = flashwatt::fp8_fwd_find_config(static_cast<int>(math), static_cast<int>(out_dtype),
                                                   static_cast<int>(head_dim),
                                                   static_cast<int>(block_m), static_cast<int>(block_n),
                                                   static_cast<int>(warps), static_cast<int>(stages),
                                                   static_cast<int>(schedule));
  FLASHWATT_CHECK(index >= 0, "flashwatt fp8: no such compiled configuration");
  flashwatt::FwdKernelInfo info{};
  char err[512] = {0};
  FLASHWATT_CHECK(flashwatt::fp8_fwd_kernel_info(index, &info, err, sizeof(err)) == 0, "flashwatt fp8: ", err);
  return {{"num_regs", info.num_regs},
          {"local_bytes", info.local_bytes},
          {"smem_bytes", info.smem_bytes},
          {"max_ctas_per_sm", info.max_ctas_per_sm},
          {"threads", info.threads}};
}

std::vector<std::vector<int64_t>> backward_configs() {
  std::vector<std::vector<int64_t>> rows;
  for (int i = 0; i < flashwatt::bwd_num_configs(); ++i) {
    const flashwatt::BwdConfig c = flashwatt::bwd_config(i);
    rows.push_back({c.dtype, c.head_dim, c.block_n, c.block_m, c.warps, c.math});
  }
  return rows;
}

std::map<std::string, int64_t> backward_kernel_info(int64_t dtype, int64_t head_dim, int64_t block_n,
                                                    int64_t block_m, int64_t warps, int64_t math) {
  const int index = flashwatt::bwd_find_config(static_cast<int>(dtype), static_cast<int>(head_dim),
                                               static_cast<int>(block_n), static_cast<int>(block_m),
                                               static_cast<int>(warps), static_cast<int>(math));
  FLASHWATT_CHECK(index >= 0, "flashwatt custom backward: no such compiled configuration");
  flashwatt::BwdKernelInfo info{};
  char err[512] = {0};
  FLASHWATT_CHECK(flashwatt::bwd_kernel_info(index, &info, err, sizeof(err)) == 0, "flashwatt custom backward: ", err);
  return {{"num_regs", info.num_regs},
          {"local_bytes", info.local_bytes},
          {"smem_bytes", info.smem_bytes},
          {"max_ctas_per_sm", info.max_ctas_per_sm},
          {"threads", info.threads}};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "flashwatt attention forward and backward kernels";
  m.def("forward", &forward,
        "attention forward (q, k, v, out, lse, causal, causal_align, scale, math, block_m, block_n, warps, stages, "
        "schedule, grid_cap, section, tile_counter, copies)");
  m.def("configs", &configs, "compiled configurations: [math, dtype, head_dim, block_m, block_n, warps, stages, schedule]");
  m.def("kernel_info", &kernel_info, "registers, local bytes, shared memory and occupancy of one configuration");
  m.def("backward", &backward,
        "attention backward (q, k, v, out, dout, lse, dq, dk, dv, delta, dq_accum, causal, causal_align, scale, "
        "block_n, block_m, warps, math, section, deterministic)");
  m.def("backward_configs", &backward_configs,
        "compiled backward configurations: [dtype, head_dim, block_n, block_m, warps, math]");
  m.def("backward_kernel_info", &backward_kernel_info,
        "registers, local bytes, shared memory and occupancy of one backward configuration's main kernel");
  m.def("fp8_quantize", &fp8_quantize,
        "q, k, v (fp16/bf16) to e4m3 with descales per block (64 query rows, 128 keys): (q, k, v, q8, k8, vt8, "
        "descale_q, descale_k, descale_v)");
  m.def("fp8_transpose_v", &fp8_transpose_v, "a pre-quantised e4m3 v into the kernels' V^T: (v8, vt8)");
  m.def("fp8_forward", &fp8_forward,
        "fp8 attention forward (q8, k8, vt8, descale_q, descale_k, descale_v, out, lse, causal, causal_align, scale, "
        "math, block_m, block_n, warps, stages, schedule, grid_cap, section, tile_counter)");
  m.def("fp8_configs", &fp8_configs,
        "compiled fp8 configurations: [math, out dtype, head_dim, block_m, block_n, warps, stages, schedule]");
  m.def("fp8_kernel_info", &fp8_kernel_info, "registers, local bytes, shared memory and occupancy of one fp8 configuration");
  m.attr("FP8_KEY_PAD") = flashwatt::kFp8KeyPad;
  m.attr("FP8_Q_BLOCK") = flashwatt::kFp8QBlock;
  m.attr("FP8_KV_BLOCK") = flashwatt::kFp8KvBlock;
  m.attr("FP8_VT_EXTRA_ROWS") = flashwatt::kFp8VtExtraRows;
  m.attr("MATH_WGMMA_FP8") = flashwatt::kWgmmaFp8;
  m.attr("MATH_WGMMA_FP8_RSUM") = flashwatt::kWgmmaFp8RowSum;
  m.attr("DTYPE_FP16") = static_cast<int>(flashwatt::kFp16);
  m.attr("DTYPE_BF16") = static_cast<int>(flashwatt::kBf16);
  m.attr("DTYPE_FP32") = static_cast<int>(flashwatt::kFp32);
  m.attr("MATH_MMA_SYNC") = static_cast<int>(flashwatt::kMmaSync);
  m.attr("MATH_WGMMA") = static_cast<int>(flashwatt::kWgmma);
  m.attr("MATH_FFMA") = static_cast<int>(flashwatt::kFfma);
  m.attr("MATH_MMA_TF32") = static_cast<int>(flashwatt::kMmaTf32);
  m.attr("CAUSAL_TOP_LEFT") = static_cast<int>(flashwatt::kCausalTopLeft);
  m.attr("CAUSAL_BOTTOM_RIGHT") = static_cast<int>(flashwatt::kCausalBottomRight);
  m.attr("SCHEDULE_LOCKSTEP") = static_cast<int>(flashwatt::kLockstep);
  m.attr("SCHEDULE_PING_PONG") = static_cast<int>(flashwatt::kPingPong);
  m.attr("SCHEDULE_WARP_SPECIALIZED") = static_cast<int>(flashwatt::kWarpSpecialized);
  m.attr("SCHEDULE_WARP_SPECIALIZED_PING_PONG") = static_cast<int>(flashwatt::kWarpSpecializedPingPong);
}
