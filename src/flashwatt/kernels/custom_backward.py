"""The backward pass of flashwatt's own attention kernel: which path computes it, and the paths.

Two paths, chosen by precision and head dim (`backward_plan`), never silently: the plan is
part of what `Custom.describe` records for a fwd_bwd cell.

- `mma.sync` (fp16, bf16; head dims 64, 128 and 256): kernels/flash_bwd.cu, FlashAttention-2's
  backward. P is recomputed per tile from q, k and the forward's LSE; dK and dV accumulate
  in fp32 registers (summed over the query heads of a GQA group by the CTA itself), dQ in
  an fp32 buffer through atomics, converted to the input dtype at the end. Not
  bit-reproducible run to run (the order of the dQ atomics varies), unless the plan is
  deterministic: then dQ comes from a pass of its own (kernels/flash_bwd_dq.cuh), one CTA
  per query block walking its key blocks in order, with no atomics; dK and dV never used
  any. Deterministic by default when torch.are_deterministic_algorithms_enabled().
- `wgmma` (fp16, bf16; head dims 64 and 128; Hopper, compute capability 9.0 only): the
  same algorithm with the five GEMMs of a step on wgmma (kernels/flash_bwd_wgmma.cuh), one
  warpgroup per 64 keys, each adding its dQ tile into the fp32 buffer with a TMA bulk
  reduction (atomic adds as well, in an order that varies). The default on Hopper is
  `wgmma_ws_n128_m64_w12`, which runs the steps of `wgmma_n128_m64_w8` in two consumer
  warpgroups fed by a producer warpgroup's TMA copies (kernels/flash_bwd_wgmma_ws.cuh): the
  same dK and dV bit for bit, the backward alone 1.14-1.25x faster at head dim 128 and
  1.22-1.38x at 64 on an H200. At head dim 64 the default is its form with 128-row query
  steps, `wgmma_ws_n128_m128_w12` (each consumer's dQ over its own 64 queries: half the dQ
  reductions), the same dK and dV bits again, 1.04-1.18x faster still.
- `torch.math_from_lse` (fp32, tf32): the same equations in PyTorch, chunked over query
  rows so the scores never take more than about 256 MiB. Exact fp32 for fp32 cells; for
  tf32 cells the matmuls run at whatever `torch.backends.cuda.matmul.allow_tf32` says,
  which flashwatt.measure sets to tf32 for them.

At head dim 256 a warp's 16 keys would need 256 fp32 registers per thread for dK and dV
alone, so two warps share each group of 16 keys, each owning half the head dim's columns
of dK and dV and adding the other's partial S^T and dP^T (`n64_m32_w8`; kernels/NOTES.md,
"Head dim 256").

Conventions shared with the forward (kernels/flash_fwd.cuh): lse is float32 (B, H, Lq),
the natural log of sum_j exp(scale * q_i . k_j) over the visible keys, -inf for a query
that sees none (its P is taken as 0: zero gradients); the causal mask is aligned top-left
(key j visible to query i iff j <= i) or bottom-right (iff j <= i + Lk - Lq), as the
forward's causal_align (flashwatt.kernels.custom_mask); query head h reads k/v head
h // (H // Hkv).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flashwatt.kernels import l2_sections
from flashwatt.kernels.custom_inputs import capability, device_properties, kernel_ready
from flashwatt.kernels.custom_mask import CAUSAL_TOP_LEFT, causal_offset, check_causal_align, extension_code

# The backward paths (recorded in a fwd_bwd cell's record).
BWD_MMA_SYNC = "mma.sync"
BWD_WGMMA = "wgmma"
# The wgmma kernels are built only for compute capability 9.0 (sm_90a; flashwatt.build).
BWD_WGMMA_CAPABILITY = (9, 0)
# BwdMath of kernels/flash_bwd.cuh.
_BWD_MATH_CODE = {BWD_MMA_SYNC: 0, BWD_WGMMA: 1}
BWD_TORCH_MATH = "torch.math_from_lse"

# Scores chunk of the PyTorch path: at most this many elements (float32: 256 MiB).
MATH_CHUNK_ELEMENTS = 1 << 26


@dataclass(frozen=True)
class BwdTile:
    block_n: int  # key/value rows per CTA (16 per warp, or per pair of warps at head dim 256)
    block_m: int  # query rows per step
    warps: int
    head_dims: tuple[int, ...]
    description: str
    math: str = BWD_MMA_SYNC  # BWD_MMA_SYNC or BWD_WGMMA
    # A producer warpgroup copies for the others by TMA (kernels/flash_bwd_wgmma_ws.cuh); its
    # 4 warps are among `warps`.
    warp_specialised: bool = False

    @property
    def warps_per_keys(self) -> int:
        """mma.sync tiles: warps sharing a group of 16 keys, each owning head_dim / this
        columns of the group's dK and dV (kernels/flash_bwd.cu, BwdShape::KS)."""
        return 16 * self.warps // self.block_n if self.math == BWD_MMA_SYNC else 1

    def as_dict(self) -> dict:
        row = {"block_n": self.block_n, "block_m": self.block_m, "warps": self.warps, "math": self.math,
               "warps_per_keys": self.warps_per_keys, "head_dims": list(self.head_dims),
               "description": self.description}
        if self.warp_specialised:  # only where true: the other tiles' rows read as they did
            row["warp_specialised"] = True
        return row


# The rows of kEntries in kernels/flash_bwd.cu (each for fp16 and bf16; wgmma rows only in
# sm_90a builds).
BWD_TILES: dict[str, BwdTile] = {
    "n128_m64_w8": BwdTile(128, 64, 8, (64, 128),
                           "128 keys per CTA, 8 warps x 16 keys, 64-row query steps (d64 and d128 default)"),
    "n64_m64_w4": BwdTile(64, 64, 4, (64, 128),
                          "64 keys per CTA, 4 warps x 16 keys, 64-row query steps (the first d128 default)"),
    "n64_m32_w8": BwdTile(64, 32, 8, (256,),
                          "64 keys per CTA, 8 warps: each 16 keys shared by 2 warps of 128 head-dim columns, "
                          "32-row query steps (d256 default)"),
    "wgmma_n128_m64_w8": BwdTile(128, 64, 8, (64, 128),
                                 "Hopper: 128 keys per CTA, 2 warpgroups x 64 keys, 64-row query steps, "
                                 "all five GEMMs on wgmma", BWD_WGMMA),
    "wgmma_ws_n128_m64_w12": BwdTile(128, 64, 12, (64, 128),
                                     "Hopper, warp-specialised: a producer warpgroup copying by TMA (K, V once; Q, "
                                     "dO, LSE, delta in a 2-stage mbarrier ring) whose second warp adds the "
                                     "consumers' staged dQ by bulk reductions, and 2 consumer warpgroups x 64 keys "
                                     "running the steps of wgmma_n128_m64_w8 (the Hopper default at head dim 128)",
                                     BWD_WGMMA, warp_specialised=True),
    "wgmma_ws_n128_m128_w12": BwdTile(128, 128, 12, (64,),
                                      "Hopper, warp-specialised, head dim 64: as wgmma_ws_n128_m64_w12 with 128-row "
                                      "query steps, each consumer's dQ over its own 64 of them (every dQ row reduced "
                                      "once per step, not twice; the Hopper default at head dim 64)", BWD_WGMMA,
                                      warp_specialised=True),
}
DEFAULT_BWD_TILE = {64: "n128_m64_w8", 128: "n128_m64_w8", 256: "n64_m32_w8"}
# On Hopper (compute capability 9.0) a wgmma tile where one exists: on an H100
# wgmma_n128_m64_w8 ran fwd+bwd at 1.03-1.36x the mma.sync tile for bf16 D128, L 512-16384,
# causal and full, and the D64 backward alone at 1.02-1.07x; the warp-specialised tile ran
# the backward alone at 1.14-1.25x wgmma_n128_m64_w8 at D128 and 1.22-1.38x at D64 on an
# H200, every shape of its bench; at D64 its 128-row-step form ran the backward alone at
# 1.04-1.18x that (1.32-1.42x FlashAttention-2), every shape of its bench on an H200
# (kernels/NOTES.md, "Backward on wgmma: measured", "Backward on wgmma at head dim 64",
# "Backward warp-specialised: measured", "Backward at head dim 64: 128 queries per step").
WGMMA_DEFAULT_BWD_TILE = {64: "wgmma_ws_n128_m128_w12", 128: "wgmma_ws_n128_m64_w12"}
BWD_HALF_PRECISIONS = ("fp16", "bf16")
BWD_MATH_PRECISIONS = ("fp32", "tf32")


# How a plan computes dQ (recorded in the plan's row).
DQ_ATOMICS = "fp32 atomics"
DQ_PASS = "separate pass (deterministic)"


@dataclass(frozen=True)
class BackwardPlan:
    path: str  # BWD_MMA_SYNC, BWD_WGMMA or BWD_TORCH_MATH
    tile_name: str | None  # the CUDA tile (mma.sync path only)
    deterministic: bool = False  # CUDA paths: dQ by the separate pass, bit-identical run to run

    @property
    def tile(self) -> BwdTile | None:
        return BWD_TILES[self.tile_name] if self.tile_name else None

    @property
    def dq(self) -> str | None:
        """How dQ is computed on the CUDA paths (None on the PyTorch path)."""
        if self.path == BWD_TORCH_MATH:
            return None
        return DQ_PASS if self.deterministic else DQ_ATOMICS

    def as_dict(self) -> dict:
        row = {"path": self.path, "tile": self.tile_name}
        if self.dq is not None:
            row["dq"] = self.dq
        if self.tile is not None:
            row.update(self.tile.as_dict())
        return row


def backward_plan(precision: str, head_dim: int, tile: str | None = None,
                  capability: tuple[int, int] | None = None, deterministic: bool = False) -> BackwardPlan:
    """The backward path (and CUDA tile, None: the default) for a precision and head dim;
    ValueError naming what is not supported. capability: the device's compute capability
    (None: unknown), which a wgmma tile needs to be 9.0 and which picks the Hopper default.
    deterministic: dQ without atomics (the CUDA paths; the PyTorch path has none anyway)."""
    if precision in BWD_MATH_PRECISIONS:
        if tile:
            raise ValueError(f"custom backward: {precision} runs {BWD_TORCH_MATH}, which takes no tile (got {tile!r})")
        return BackwardPlan(BWD_TORCH_MATH, None, bool(deterministic))
    if precision not in BWD_HALF_PRECISIONS:
        raise ValueError(f"custom backward: precision {precision!r} not supported "
                         f"({', '.join(BWD_HALF_PRECISIONS + BWD_MATH_PRECISIONS)})")
    if head_dim not in DEFAULT_BWD_TILE:
        raise ValueError(f"custom backward: head_dim {head_dim} is not supported for {precision} "
                         f"(the CUDA backward is built for head_dim {', '.join(map(str, DEFAULT_BWD_TILE))})")
    hopper = capability is not None and tuple(capability) == BWD_WGMMA_CAPABILITY
    name = tile or (WGMMA_DEFAULT_BWD_TILE.get(head_dim) if hopper else None) or DEFAULT_BWD_TILE[head_dim]
    if name not in BWD_TILES:
        raise ValueError(f"unknown custom backward tile {name!r}; allowed: {', '.join(BWD_TILES)}")
    if head_dim not in BWD_TILES[name].head_dims:
        raise ValueError(f"custom backward tile {name!r} is built for head_dim {BWD_TILES[name].head_dims}, "
                         f"not {head_dim}")
    math_kind = BWD_TILES[name].math
    if math_kind == BWD_WGMMA and capability is not None and tuple(capability) != BWD_WGMMA_CAPABILITY:
        cap = ".".join(map(str, capability))
        raise ValueError(f"custom backward tile {name!r} uses wgmma, built only for compute capability 9.0 "
                         f"(device has {cap})")
    return BackwardPlan(math_kind, name, bool(deterministic))


def grad_buffer(t):
    """An output buffer shaped and laid out like t where the kernel can write it with
    16-byte stores (torch.empty_like keeps a dense tensor's strides), else contiguous."""
    import torch

    buf = torch.empty_like(t)
    return buf if kernel_ready(buf) is buf else torch.empty(t.shape, dtype=t.dtype, device=t.device)


def flash_backward(dout, q, k, v, out, lse, causal: bool, scale: float, plan: BackwardPlan,
                   l2_section: int | None = None, causal_align: str = CAUSAL_TOP_LEFT):
    """(dq, dk, dv) of attention on (B, H, L, D) views, from the forward's out and lse,
    by `plan` (see backward_plan). dq has q's shape, dk and dv k's. l2_section: (batch, k/v
    head) pairs per L2 section of the CUDA kernels' CTA order (flashwatt.kernels.l2_sections;
    None: sized for the device's L2, 0: one section). causal_align: the forward's
    (flashwatt.kernels.custom_mask)."""
    check_causal_align(causal_align)
    if plan.path == BWD_TORCH_MATH:
        return math_backward_from_lse(dout, q, k, v, out, lse, causal, scale, causal_align=causal_align)
    import torch

    from flashwatt.build import load_extension

    l2_sections.check(l2_section)
    q_k, k_k, v_k, o_k, do_k = (kernel_ready(t) for t in (q, k, v, out, dout))
    B, H, Lq, D = q.shape
    if l2_section is None:
        l2_section = l2_sections.backward_section(B * k.shape[1], Lq, D, q.element_size(), H // k.shape[1],
                                                  device_properties(q.device).L2_cache_size)
    dq, dk, dv = grad_buffer(q), grad_buffer(k), grad_buffer(v)
    delta = torch.empty((B, H, Lq), dtype=torch.float32, device=q.device)
    # The deterministic pass writes dq directly: no fp32 accumulator.
    accum_shape = (0,) if plan.deterministic else (B, H, Lq, D)
    dq_accum = torch.empty(accum_shape, dtype=torch.float32, device=q.device)
    tile = plan.tile
    ext = load_extension()
    ext.backward(q_k, k_k, v_k, o_k, do_k, lse.contiguous(), dq, dk, dv, delta, dq_accum, bool(causal),
                 extension_code(ext, causal_align), float(scale), tile.block_n, tile.block_m, tile.warps,
                 _BWD_MATH_CODE[tile.math], int(l2_section), bool(plan.deterministic))
    return dq, dk, dv


def math_backward_from_lse(dout, q, k, v, out, lse, causal: bool, scale: float,
                           chunk_elements: int = MATH_CHUNK_ELEMENTS, *, causal_align: str = CAUSAL_TOP_LEFT):
    """The backward equations in PyTorch (float32, or float64 for float64 inputs), from
    the forward's LSE, chunked over query rows:
        P = exp(scale * q k^T - lse), delta = rowsum(dout * out),
        dV = P^T dout, dS = P * (dout v^T - delta), dQ = scale * dS k, dK = scale * dS^T q,
    dK and dV summed over the query heads of each k/v head; a query that sees no key (lse
    -inf) has P = 0. Any device."""
    import torch

    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    group = H // Hkv
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf, of, dof = (t.to(work) for t in (q, k, v, out, dout))
    if group > 1:
        kf = kf.repeat_interleave(group, dim=1)
        vf = vf.repeat_interleave(group, dim=1)
    # A query that sees no key (bottom-right alignment, Lq > Lk) has lse -inf and every score
    # -inf: read as +inf, its P is exp(-inf) = 0 instead of exp(-inf + inf) = NaN.
    lse = lse.to(work).masked_fill(lse == -math.inf, math.inf)
    delta = (dof * of).sum(-1)
    dq = torch.empty((B, H, Lq, D), dtype=work, device=q.device)
    dk = torch.zeros((B, H, Lk, D), dtype=work, device=q.device)
    dv = torch.zeros((B, H, Lk, D), dtype=work, device=q.device)
    rows = max(1, min(Lq, chunk_elements // max(1, B * H * Lk)))
    keys = torch.arange(Lk, device=q.device)
    offset = causal_offset(causal_align, Lq, Lk)  # key j visible to query i iff j <= i + offset
    for r0 in range(0, Lq, rows):
        r1 = min(Lq, r0 + rows)
        s = torch.matmul(qf[:, :, r0:r1], kf.transpose(-2, -1)) * scale
        if causal:
            queries = torch.arange(r0, r1, device=q.device)
            s = s.masked_fill(keys[None, :] > queries[:, None] + offset, -math.inf)
        p = torch.exp(s - lse[:, :, r0:r1, None])
        do_rows = dof[:, :, r0:r1]
        dv += torch.matmul(p.transpose(-2, -1), do_rows)
        ds = p * (torch.matmul(do_rows, vf.transpose(-2, -1)) - delta[:, :, r0:r1, None])
        dq[:, :, r0:r1] = torch.matmul(ds, kf) * scale
        dk += torch.matmul(ds.transpose(-2, -1), qf[:, :, r0:r1])
    dk *= scale
    if group > 1:
        dk = dk.view(B, Hkv, group, Lk, D).sum(2)
        dv = dv.view(B, Hkv, group, Lk, D).sum(2)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


def backward_kernel_info(precision: str, head_dim: int, tile: str | None = None) -> dict:
    """The plan, and for the CUDA path the main kernel's registers, local memory, shared
    memory and occupancy on the current device (needs a GPU). Deterministic as
    flash_attention's default: when torch.are_deterministic_algorithms_enabled()."""
    import torch

    plan = backward_plan(precision, head_dim, tile, capability(torch.device("cuda")),
                         torch.are_deterministic_algorithms_enabled())
    info = plan.as_dict()
    if plan.path != BWD_TORCH_MATH:
        from flashwatt.build import load_extension

        ext = load_extension()
        code = {"fp16": ext.DTYPE_FP16, "bf16": ext.DTYPE_BF16}[precision]
        t = plan.tile
        info.update(dict(ext.backward_kernel_info(code, head_dim, t.block_n, t.block_m, t.warps,
                                                  _BWD_MATH_CODE[t.math])))
    return info
