"""The fp8 (e4m3) forward of flashwatt's own kernel, on Hopper (kernels/flash_fp8.cu;
kernels/NOTES.md, "fp8 forward").

Two ways in:

- `flash_forward_fp8(q, k, v, causal)` with float16 or bfloat16 q, k, v: the call quantises
  them (one scale per block of 64 query rows or 128 keys of each (batch, head): `quantize`,
  flashwatt.kernels.fp8_numerics.quantize_blocks), runs the e4m3 kernel and returns the output
  in the inputs' dtype. The quantisation is part of the call, so its time and energy are in
  the call's; `quantize` and `fp8_forward` time it apart (flashwatt.attention.job's parts).
- `flash_forward_fp8(q8, k8, v8, causal, descales=(dq, dk, dv))` with float8_e4m3fn tensors
  and their float32 descales (x ~ x8 * descale), one per (batch, head) ((B, H) and (B, Hkv)) or
  one per block as `quantize` makes them: the call only transposes V into the layout the kernel
  reads (`prepare`); the output is bf16 unless asked otherwise.

Both need compute capability 9.0 (sm_90a: wgmma with e4m3 operands) and head dim 64 or 128;
anything else is refused before any launch (`fp8_refusal`). Any lengths, causal (top-left or
bottom-right, flashwatt.kernels.custom_mask) or full, grouped-query attention, (B, H, L, D)
or (B, L, H, D) layouts. Forward only. What the kernel computes, bit for bit up to summation
order, is flashwatt.kernels.fp8_numerics.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from flashwatt.kernels import l2_sections
from flashwatt.kernels.custom_inputs import capability, device_properties, kernel_ready
from flashwatt.kernels.custom_mask import CAUSAL_TOP_LEFT, check_causal_align, extension_code
from flashwatt.kernels.custom_variants import (
    LOCKSTEP, PING_PONG, WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG, WGMMA_FP8, WGMMA_FP8_RSUM, WORK_TILE_COUNTER,
    WS_SCHEDULES, Tile, parse_variant, work_order,
)

FP8_CAPABILITY = (9, 0)
FP8_HEAD_DIMS = (64, 128)


def fp8_refusal(device_capability: tuple[int, int] | None, head_dim: int | None = None) -> str | None:
    """Why the fp8 forward cannot run on a device of this compute capability at this head dim,
    in one line, or None."""
    if device_capability is not None and tuple(device_capability) != FP8_CAPABILITY:
        cap = ".".join(map(str, device_capability))
        return (f"custom fp8 needs compute capability 9.0 (sm_90a: wgmma with e4m3 operands); this device has "
                f"{cap}" + (" (its fp8 tensor cores have no kernel here)" if tuple(device_capability) >= (8, 9) else
                            " (no fp8 tensor cores)"))
    if head_dim is not None and head_dim not in FP8_HEAD_DIMS:
        return f"custom fp8 runs head_dim {', '.join(map(str, FP8_HEAD_DIMS))} (asked for {head_dim})"
    return None


@dataclass(frozen=True)
class Fp8Operands:
    """What the fp8 kernel reads: e4m3 q (B, H, Lq, D) and k (B, Hkv, Lk, D), V^T (B, Hkv, D,
    Lk padded: flashwatt.kernels.fp8_numerics.transpose_v) and the float32 descales per block
    (B, H, blocks of Q_BLOCK rows) for q, (B, Hkv, blocks of KV_BLOCK keys) for k and v."""

    q: object
    k: object
    vt: object
    descale_q: object
    descale_k: object
    descale_v: object

    @property
    def len_k(self) -> int:
        return int(self.k.shape[2])


def _check_device(t, head_dim: int) -> None:
    if t.device.type != "cuda":
        raise ValueError(f"custom fp8: inputs must be on a CUDA device (are on {t.device})")
    reason = fp8_refusal(capability(t.device), head_dim)
    if reason is not None:
        raise ValueError(reason)


def _check_shapes(q, k, v) -> None:
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"custom fp8: {name} must be a 4-d tensor (B, H, L, D)")
    B, H, _, D = q.shape
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"custom fp8: k {tuple(k.shape)} and v {tuple(v.shape)} do not fit q {tuple(q.shape)}")
    if k.shape[1] < 1 or H % k.shape[1]:
        raise ValueError(f"custom fp8: q heads ({H}) must be a multiple of k/v heads ({k.shape[1]})")
    if min(q.shape[0], q.shape[1], q.shape[2], k.shape[2]) < 1:
        raise ValueError("custom fp8: empty input")


def _vt_buffer(B: int, Hkv: int, Lk: int, D: int, device):
    import torch

    from flashwatt.kernels.fp8_numerics import VT_EXTRA_ROWS, padded_keys

    return torch.empty((B, Hkv, D + VT_EXTRA_ROWS, padded_keys(Lk)), dtype=torch.float8_e4m3fn, device=device)


def quantize(q, k, v) -> Fp8Operands:
    """q, k, v (float16 or bfloat16, (B, H, L, D) views) in e4m3 with one scale per block of
    rows (fp8_numerics.quantize_blocks), V transposed: one kernel launch for the three, each
    input read once."""
    import torch

    from flashwatt.build import load_extension
    from flashwatt.kernels.fp8_numerics import KV_BLOCK, Q_BLOCK, blocks

    _check_shapes(q, k, v)
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"custom fp8: quantises float16 or bfloat16 q, k, v of one dtype (got {q.dtype}, "
                         f"{k.dtype}, {v.dtype})")
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    _check_device(q, D)
    q, k, v = kernel_ready(q), kernel_ready(k), kernel_ready(v)
    f32 = dict(dtype=torch.float32, device=q.device)
    kv_blocks = (B, Hkv, blocks(Lk, KV_BLOCK))
    ops = Fp8Operands(torch.empty(q.shape, dtype=torch.float8_e4m3fn, device=q.device),
                      torch.empty(k.shape, dtype=torch.float8_e4m3fn, device=q.device),
                      _vt_buffer(B, Hkv, Lk, D, q.device),
                      torch.empty((B, H, blocks(Lq, Q_BLOCK)), **f32), torch.empty(kv_blocks, **f32),
                      torch.empty(kv_blocks, **f32))
    load_extension().fp8_quantize(q, k, v, ops.q, ops.k, ops.vt, ops.descale_q, ops.descale_k, ops.descale_v)
    return ops


def prepare(q8, k8, v8, descale_q, descale_k, descale_v) -> Fp8Operands:
    """Pre-quantised float8_e4m3fn q8, k8, v8 (B, H, L, D) with their float32 descales, one per
    (batch, head) ((B, H) for q, (B, Hkv) for k and v) or one per block ((B, H, blocks of
    Q_BLOCK rows), (B, Hkv, blocks of KV_BLOCK keys)), as the kernel reads them: V transposed
    (one launch), per-head descales spread over the blocks."""
    import torch

    from flashwatt.build import load_extension

    _check_shapes(q8, k8, v8)
    for name, t in (("q", q8), ("k", k8), ("v", v8)):
        if t.dtype != torch.float8_e4m3fn:
            raise ValueError(f"custom fp8: pre-quantised {name} must be float8_e4m3fn, got {t.dtype}")
    B, H, Lq, D = q8.shape
    Hkv, Lk = k8.shape[1], k8.shape[2]
    _check_device(q8, D)
    descales = [block_descales(d, name, B, heads, length, rows, q8.device)
                for name, d, heads, length, rows in (("descale_q", descale_q, H, Lq, "q"),
                                                     ("descale_k", descale_k, Hkv, Lk, "kv"),
                                                     ("descale_v", descale_v, Hkv, Lk, "kv"))]
    vt = _vt_buffer(B, Hkv, Lk, D, q8.device)
    load_extension().fp8_transpose_v(kernel_ready(v8), vt)
    return Fp8Operands(kernel_ready(q8), kernel_ready(k8), vt, *descales)


def block_descales(d, name: str, batch: int, heads: int, length: int, rows: str, device):
    """A caller's descales as the kernel reads them: float32 (batch, heads, blocks) contiguous on
    `device`, from one per (batch, head) (spread over its blocks) or one per block already.
    rows: "q" (blocks of Q_BLOCK query rows) or "kv" (blocks of KV_BLOCK keys)."""
    import torch

    from flashwatt.kernels.fp8_numerics import KV_BLOCK, Q_BLOCK, blocks

    n = blocks(length, Q_BLOCK if rows == "q" else KV_BLOCK)
    shape = tuple(d.shape) if isinstance(d, torch.Tensor) else None
    if shape == (batch, heads):
        d = d[:, :, None].expand(batch, heads, n)
    elif shape != (batch, heads, n):
        raise ValueError(f"custom fp8: {name} must be a ({batch}, {heads}) tensor, one scale per (batch, head), or "
                         f"({batch}, {heads}, {n}), one per block of {Q_BLOCK if rows == 'q' else KV_BLOCK} rows"
                         + (f"; got shape {shape}" if shape is not None else f"; got {type(d).__name__}"))
    return d.to(device=device, dtype=torch.float32).contiguous()


def counter_choice(tile: Tile, tile_name: str, causal: bool, len_k: int, tile_counter: bool | None) -> bool:
    """Whether a launch takes its work items from a tile counter: work_order's choice where the
    caller leaves it (None), the caller's where the tile can (the persistent, warp-specialised
    ones); a counter asked of a one-CTA-per-tile tile is refused here, before the extension."""
    if tile_counter is None:
        return work_order(tile, causal, len_k) == WORK_TILE_COUNTER
    if tile_counter and tile.schedule not in WS_SCHEDULES:
        raise ValueError(f"custom fp8: tile {tile_name} runs one CTA per tile; only the persistent "
                         f"(warp-specialised) tiles take a tile counter")
    return bool(tile_counter)


def fp8_forward(ops: Fp8Operands, causal: bool, variant: str = "", *, out=None, out_dtype=None,
                scale: float | None = None, causal_align: str = CAUSAL_TOP_LEFT, l2_section: int | None = None,
                tile_counter: bool | None = None):
    """The e4m3 kernel on prepared operands; returns (out, lse) as flash_forward does. out
    (optional, (B, H, Lq, D) views of float16 or bfloat16) is written in place; else a new
    tensor of out_dtype (default bfloat16). tile_counter: whether a persistent tile's CTAs take
    their work items from a counter (None: work_order's choice, as for 16-bit inputs)."""
    import torch

    from flashwatt.build import load_extension

    check_causal_align(causal_align)
    l2_sections.check(l2_section)
    B, H, Lq, D = ops.q.shape
    _check_device(ops.q, D)
    launch = parse_variant(variant, "fp8", D, capability(ops.q.device), ops.len_k, bool(causal))
    if out is None:
        out = torch.empty((B, H, Lq, D), dtype=out_dtype or torch.bfloat16, device=ops.q.device)
    elif tuple(out.shape) != (B, H, Lq, D) or out.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"custom fp8: out must be float16 or bfloat16 of shape {(B, H, Lq, D)}, got "
                         f"{out.dtype} {tuple(out.shape)}")
    target, out_k = out, kernel_ready(out)
    lse = torch.empty((B, H, Lq), dtype=torch.float32, device=ops.q.device)
    props = device_properties(ops.q.device)
    grid_cap = launch.max_ctas
    if launch.ctas_per_sm:
        per_sm = launch.ctas_per_sm * props.multi_processor_count
        grid_cap = min(grid_cap, per_sm) if grid_cap else per_sm
    if l2_section is None:
        l2_section = l2_sections.forward_section(B * H, ops.len_k, D, 1, H // ops.k.shape[1], props.L2_cache_size,
                                                 bool(causal))
    ext = load_extension()
    t = launch.tile
    tile_counter = counter_choice(t, launch.tile_name, bool(causal), ops.len_k, tile_counter)
    ext.fp8_forward(ops.q, ops.k, ops.vt, ops.descale_q, ops.descale_k, ops.descale_v, out_k, lse, bool(causal),
                    extension_code(ext, causal_align), float(scale if scale is not None else 1.0 / math.sqrt(D)),
                    math_code(ext, t), t.block_m, t.block_n, t.warps, t.stages, schedule_code(ext, t), int(grid_cap),
                    int(l2_section), bool(tile_counter))
    if out_k is not target:
        target.copy_(out_k)
    return target, lse


def math_code(ext, tile: Tile) -> int:
    """The extension's FwdConfig.math of an fp8 tile (kWgmmaFp8, kWgmmaFp8RowSum)."""
    return {WGMMA_FP8: ext.MATH_WGMMA_FP8, WGMMA_FP8_RSUM: ext.MATH_WGMMA_FP8_RSUM}[tile.mma]


def schedule_code(ext, tile: Tile) -> int:
    """The extension's FwdSchedule of an fp8 tile."""
    return {LOCKSTEP: ext.SCHEDULE_LOCKSTEP, PING_PONG: ext.SCHEDULE_PING_PONG,
            WARP_SPECIALIZED: ext.SCHEDULE_WARP_SPECIALIZED,
            WARP_SPECIALIZED_PING_PONG: ext.SCHEDULE_WARP_SPECIALIZED_PING_PONG}[tile.schedule]


def flash_forward_fp8(q, k, v, causal: bool, variant: str = "", layout: str = "bhld", *, descales=None, out=None,
                      out_dtype=None, scale: float | None = None, causal_align: str = CAUSAL_TOP_LEFT,
                      l2_section: int | None = None, tile_counter: bool | None = None):
    """Attention forward in fp8; returns (out, lse) (module docstring).

    q, k, v: float16/bfloat16 (quantised in the call; out in their dtype unless out_dtype
    says otherwise) or float8_e4m3fn with `descales` = (descale_q, descale_k, descale_v)
    (out bfloat16 unless asked otherwise). layout "bhld" or "blhd" as flash_forward's, for
    q, k, v and out alike."""
    import torch

    if layout not in ("bhld", "blhd"):
        raise ValueError(f"custom fp8: layout {layout!r} not in ('bhld', 'blhd')")
    _check_shapes(q, k, v)
    if layout == "blhd":
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        out = out.transpose(1, 2) if out is not None else None
    check_causal_align(causal_align)
    if q.dtype == torch.float8_e4m3fn:
        if descales is None or len(descales) != 3:
            raise ValueError("custom fp8: pre-quantised float8_e4m3fn inputs need descales=(descale_q, descale_k, "
                             "descale_v), float32 per (batch, head) or per block")
        ops = prepare(q, k, v, *descales)
        dtype = out_dtype or torch.bfloat16
    else:
        if descales is not None:
            raise ValueError(f"custom fp8: descales go with float8_e4m3fn inputs; {q.dtype} inputs are quantised "
                             "in the call")
        ops = quantize(q, k, v)
        dtype = out_dtype or q.dtype
    if out is None and layout == "blhd":
        B, H, Lq, D = q.shape
        out = torch.empty((B, Lq, H, D), dtype=dtype, device=q.device).transpose(1, 2)
    got, lse = fp8_forward(ops, causal, variant, out=out, out_dtype=dtype, scale=scale, causal_align=causal_align,
                           l2_section=l2_section, tile_counter=tile_counter)
    return (got.transpose(1, 2) if layout == "blhd" else got), lse


def fp8_kernel_info(head_dim: int, variant: str = "", len_k: int | None = None, causal: bool = False,
                    out_dtype: str = "bf16") -> dict:
    """Registers, local memory, shared memory and occupancy of the fp8 variant's kernel on the
    current device (needs a GPU)."""
    import torch

    from flashwatt.build import load_extension
    from flashwatt.kernels.fp8_numerics import P_SHIFT

    device = torch.device("cuda")
    reason = fp8_refusal(capability(device), head_dim)
    if reason is not None:
        raise ValueError(reason)
    launch = parse_variant(variant, "fp8", head_dim, capability(device), len_k, causal)
    ext = load_extension()
    t = launch.tile
    code = {"fp16": ext.DTYPE_FP16, "bf16": ext.DTYPE_BF16}[out_dtype]
    info = dict(ext.fp8_kernel_info(math_code(ext, t), code, head_dim, t.block_m, t.block_n, t.warps, t.stages,
                                    schedule_code(ext, t)))
    info.update(tile=launch.tile_name, mma=t.mma, schedule=t.schedule, ctas_per_sm_cap=launch.ctas_per_sm,
                max_ctas=launch.max_ctas, work_order=work_order(t, bool(causal), len_k),
                copies="tma" if t.schedule in (WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG) else "threads",
                quantization="per block of 64 query rows or 128 keys: descale = amax / 448",
                p_scale=f"2^{P_SHIFT}")
    return info
