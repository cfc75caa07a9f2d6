"""The forward of flashwatt's own attention kernel (kernels/flash_fwd.cu): `flash_forward`
launches the tile a variant names (flashwatt.kernels.custom_variants) and returns the output
and the LSE; `kernel_info` reports the compiled kernel's resources.

fp16/bf16 run on tensor cores with fp32 accumulation through mma.sync (FlashAttention-2
style); on Hopper (compute capability 9.0, an sm_90a build) the `wgmma_` tiles run a
wgmma kernel (kernels/flash_fwd_wgmma.cuh), the `wgmma_pp_` ones with the warpgroups in
ping-pong, the `wgmma_ws_` ones a warp-specialised persistent kernel (a producer warpgroup
that copies with TMA, mbarriers; kernels/flash_fwd_wgmma_ws.cuh). fp32 runs an exact FFMA
path; the opt-in tf32 precision runs fp32 inputs on tensor cores, rounded to tf32
(kernels/flash_fwd_tf32.cuh). A causal mask is aligned top-left (the default) or
bottom-right where the lengths differ (flashwatt.kernels.custom_mask).
"""
from __future__ import annotations

import math

from flashwatt.kernels import l2_sections
from flashwatt.kernels.custom_inputs import capability, check_inputs, device_properties, kernel_ready, precision_of
from flashwatt.kernels.custom_mask import CAUSAL_TOP_LEFT, check_causal_align, extension_code
from flashwatt.kernels.custom_variants import (
    FFMA, LOCKSTEP, MMA_SYNC, MMA_TF32, PING_PONG, WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG, WGMMA,
    WORK_TILE_COUNTER, WS_SCHEDULES, Tile, parse_variant, work_order,
)


def flash_forward(q, k, v, causal: bool, variant: str = "", layout: str = "bhld", *, out=None, scale: float | None = None,
                  precision: str | None = None, l2_section: int | None = None, tile_counter: bool | None = None,
                  tma: bool | None = None, causal_align: str = CAUSAL_TOP_LEFT):
    """Attention forward; returns (out, lse).

    precision: None runs the inputs' own (fp16, bf16, exact fp32); "tf32" runs float32
    inputs on tensor cores, rounded to tf32; "fp8" quantises 16-bit inputs in the call and
    runs the e4m3 kernel on Hopper (flashwatt.kernels.custom_fp8, which also takes
    pre-quantised inputs with their scales).
    layout "bhld": q (B, H, Lq, D), k/v (B, Hkv, Lk, D); "blhd": q (B, Lq, H, D), k/v
    (B, Lk, Hkv, D). Any strides with a contiguous head_dim. out (optional) must have q's
    shape and dtype; it is written in place. lse is float32 (B, H, Lq), natural log; -inf
    (and a row of zeros in out) for a query that sees no key.
    causal_align: "top_left" or "bottom_right", where a causal mask's diagonal lies when
    Lq != Lk (flashwatt.kernels.custom_mask); checked even without a mask.
    l2_section: (batch, head) pairs per L2 section of the work order
    (flashwatt.kernels.l2_sections; None: sized for the device's L2, 0: one section).
    tile_counter: whether a persistent (warp-specialised) tile's CTAs take their work items
    from a counter as they free up rather than by a fixed stride (None: `work_order`'s choice).
    tma: how a persistent (warp-specialised) tile's producer copies Q, K and V into shared
    memory: True with the tensor memory accelerator (an error where the driver cannot map
    the operands), False with 16-byte copies from its threads, None TMA where it can.
    Every check runs before the launch.
    """
    import torch

    from flashwatt.build import load_extension

    if precision == "fp8":
        from flashwatt.kernels.custom_fp8 import flash_forward_fp8

        if tma is False:
            raise ValueError("custom kernel: the fp8 tiles copy with TMA (persistent ones) or with their compute "
                             "threads (the others); tma=False does not choose between them")
        return flash_forward_fp8(q, k, v, causal, variant, layout, out=out, scale=scale, causal_align=causal_align,
                                 l2_section=l2_section, tile_counter=tile_counter)
    if layout not in ("bhld", "blhd"):
        raise ValueError(f"custom kernel: layout {layout!r} not in ('bhld', 'blhd')")
    if layout == "blhd":
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"custom kernel: {name} must be a 4-d tensor")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if out is not None:
            out = out.transpose(1, 2)
    check_inputs(q, k, v)
    check_causal_align(causal_align)
    l2_sections.check(l2_section)
    B, H, L, D = q.shape
    launch = parse_variant(variant, precision_of(q.dtype, precision), D, capability(q.device), k.shape[2],
                           bool(causal))
    if out is None:
        if layout == "blhd" or (q.stride(1) < q.stride(2)):
            out = torch.empty((B, L, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
        else:
            out = torch.empty((B, H, L, D), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"custom kernel: out {tuple(out.shape)} {out.dtype} must match q {tuple(q.shape)} {q.dtype}")
    target = out
    out_k = kernel_ready(out)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
    q_k, k_k, v_k = kernel_ready(q), kernel_ready(k), kernel_ready(v)
    grid_cap = launch.max_ctas
    if launch.ctas_per_sm:
        per_sm = launch.ctas_per_sm * device_properties(q.device).multi_processor_count
        grid_cap = min(grid_cap, per_sm) if grid_cap else per_sm
    if l2_section is None:
        l2_section = l2_sections.forward_section(B * H, k.shape[2], D, q.element_size(), H // k.shape[1],
                                                 device_properties(q.device).L2_cache_size, bool(causal))
    t = launch.tile
    if tile_counter is None:
        tile_counter = work_order(t, bool(causal), k.shape[2]) == WORK_TILE_COUNTER
    elif tile_counter and t.schedule not in WS_SCHEDULES:
        raise ValueError(f"custom kernel: tile {launch.tile_name} runs one CTA per tile; only the persistent "
                         f"(warp-specialised) tiles take a tile counter")
    if tma not in _COPIES:
        raise ValueError(f"custom kernel: tma must be True, False or None, got {tma!r}")
    if tma and t.schedule not in WS_SCHEDULES:
        raise ValueError(f"custom kernel: tile {launch.tile_name} copies with its compute threads; only the "
                         f"persistent (warp-specialised) tiles copy with TMA")
    ext = load_extension()
    scale = float(scale if scale is not None else 1.0 / math.sqrt(D))
    ext.forward(
        q_k, k_k, v_k, out_k, lse, bool(causal), extension_code(ext, causal_align), scale,
        _mma_code(ext, t), t.block_m, t.block_n, t.warps, t.stages, _schedule_code(ext, t), int(grid_cap),
        int(l2_section), bool(tile_counter), _COPIES[tma],
    )
    if out_k is not target:
        target.copy_(out_k)
    return (target.transpose(1, 2) if layout == "blhd" else target), lse


# flash_forward's `tma` as the extension's FwdCopies (kernels/flash_fwd.cuh).
_COPIES = {None: 0, False: 1, True: 2}

def _mma_code(ext, tile: Tile) -> int:
    return {MMA_SYNC: ext.MATH_MMA_SYNC, WGMMA: ext.MATH_WGMMA, FFMA: ext.MATH_FFMA, MMA_TF32: ext.MATH_MMA_TF32}[tile.mma]


def _schedule_code(ext, tile: Tile) -> int:
    return {LOCKSTEP: ext.SCHEDULE_LOCKSTEP, PING_PONG: ext.SCHEDULE_PING_PONG,
            WARP_SPECIALIZED: ext.SCHEDULE_WARP_SPECIALIZED,
            WARP_SPECIALIZED_PING_PONG: ext.SCHEDULE_WARP_SPECIALIZED_PING_PONG}[tile.schedule]


def kernel_info(precision: str, head_dim: int, variant: str = "", len_k: int | None = None,
                causal: bool = False) -> dict:
    """Registers, local memory, shared memory and occupancy of the variant's kernel on the
    current device for K/V length len_k and the mask (needs a GPU)."""
    import torch

    from flashwatt.build import load_extension

    if precision == "fp8":
        from flashwatt.kernels.custom_fp8 import fp8_kernel_info

        return fp8_kernel_info(head_dim, variant, len_k, causal)

    launch = parse_variant(variant, precision, head_dim, capability(torch.device("cuda")), len_k, causal)
    ext = load_extension()
    code = {"fp16": ext.DTYPE_FP16, "bf16": ext.DTYPE_BF16, "fp32": ext.DTYPE_FP32, "tf32": ext.DTYPE_FP32}[precision]
    t = launch.tile
    info = dict(ext.kernel_info(_mma_code(ext, t), code, head_dim, t.block_m, t.block_n, t.warps, t.stages,
                                _schedule_code(ext, t)))
    # copies: how the tile moves Q, K and V into shared memory by default (flash_forward's tma).
    info.update(tile=launch.tile_name, mma=t.mma, schedule=t.schedule, ctas_per_sm_cap=launch.ctas_per_sm,
                max_ctas=launch.max_ctas, work_order=work_order(t, bool(causal), len_k),
                copies="tma" if t.schedule in WS_SCHEDULES else "threads")
    return info
