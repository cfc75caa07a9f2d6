"""flashwatt's own FlashAttention kernels: the forward (kernels/flash_fwd.cu) and its backward.

fp16/bf16 run on tensor cores with fp32 accumulation through mma.sync (FlashAttention-2
style); on Hopper (compute capability 9.0, an sm_90a build) the `wgmma_` tiles run a
wgmma kernel (kernels/flash_fwd_wgmma.cuh), the `wgmma_pp_` ones with the warpgroups in
ping-pong, the `wgmma_ws_` ones a warp-specialised persistent kernel (a producer warpgroup
that copies with TMA, mbarriers; kernels/flash_fwd_wgmma_ws.cuh), and a wgmma tile is the
fp16/bf16 default there (by head dim and key length).
fp32 runs an exact FFMA path; the opt-in tf32 precision runs fp32 inputs on tensor cores,
rounded to tf32 (kernels/flash_fwd_tf32.cuh, d64/d128). Head dims 64, 128 and 256; causal
(top-left aligned, as torch's is_causal) and full masks; any sequence length; (B, H, L, D)
and (B, L, H, D) layouts through strides; grouped-query attention (q heads a multiple of
k/v heads). The backward (flashwatt.kernels.custom_backward: CUDA kernels for fp16/bf16 at
head dims 64, 128 and 256, wgmma ones on Hopper at 64 and 128, an exact PyTorch path from the
saved LSE for fp32 and tf32) makes `Custom` differentiable wherever its forward runs, through
flashwatt.kernels.custom_autograd.

A *variant* names the launch configuration, the knobs a power-aware scheduler turns:
    <tile>[_sm<N> | _ctas<N>]
where <tile> is one of TILES (rows of Q per CTA, K/V rows per tile, warps, pipeline
stages; `wgmma_` tiles need Hopper), `_sm<N>` runs a persistent grid of N CTAs per multiprocessor and `_ctas<N>` a
persistent grid of at most N CTAs in total (`wgmma_ws_` tiles are persistent already: one CTA
per SM without a cap, taking causal work items from a counter: `work_order`). The tile may be
left out ("sm1", "ctas64")
to keep the default tile; "" is the default tile with one CTA per query tile.
"""
from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

from flashwatt.attention.cell import Cell
from flashwatt.kernels import l2_sections

HEAD_DIMS = (64, 128, 256)
PRECISIONS = ("fp16", "bf16", "fp32", "tf32")


# The instructions a tile computes with (FwdMath in kernels/flash_fwd.cuh).
MMA_SYNC, WGMMA, FFMA, MMA_TF32 = "mma.sync", "wgmma", "ffma", "mma.sync.tf32"
# wgmma kernels are built only for compute capability 9.0 (sm_90a); see flashwatt.build.
WGMMA_CAPABILITY = (9, 0)
# How a wgmma CTA's warpgroups share the tensor cores (FwdSchedule, kernels/flash_fwd_wgmma.cuh):
# all after the same barrier, or odd warpgroups half an iteration behind (ping-pong).
LOCKSTEP, PING_PONG = "lockstep", "ping-pong"
# Warp-specialised wgmma kernels (kernels/flash_fwd_wgmma_ws.cuh): a producer warpgroup feeds
# two or three consumer warpgroups through mbarrier-guarded shared-memory rings on a persistent
# grid (one CTA per SM unless capped), copying with TMA (flash_forward's tma); the consumers
# run free or take turns (ping-pong).
WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG = "ws", "ws-ping-pong"
WS_SCHEDULES = (WARP_SPECIALIZED, WARP_SPECIALIZED_PING_PONG)


@dataclass(frozen=True)
class Tile:
    block_m: int
    block_n: int
    warps: int
    stages: int
    head_dims: tuple[int, ...]
    precisions: tuple[str, ...]
    description: str
    mma: str = MMA_SYNC
    schedule: str = LOCKSTEP

    def as_dict(self) -> dict:
        return {
            "mma": self.mma,
            "schedule": self.schedule,
            "block_m": self.block_m,
            "block_n": self.block_n,
            "warps": self.warps,
            "stages": self.stages,
            "head_dims": list(self.head_dims),
            "precisions": list(self.precisions),
            "description": self.description,
        }


_HALF = ("fp16", "bf16")
TILES: dict[str, Tile] = {
    "m128_n64_w4_s2": Tile(128, 64, 4, 2, (64,), _HALF, "128 q rows, 64-row K/V tiles, 4 warps x 32 rows, 2 stages (d64 default)"),
    "m128_n64_w4_s3": Tile(128, 64, 4, 3, (64,), _HALF, "as m128_n64_w4_s2 with a 3-stage K/V pipeline"),
    "m64_n64_w4_s2": Tile(64, 64, 4, 2, (64, 128, 256), _HALF, "64 q rows, 4 warps x 16 rows, 2 stages: small CTAs, more per SM"),
    "m128_n64_w8_s2": Tile(128, 64, 8, 2, (64, 128), _HALF, "128 q rows, 8 warps x 16 rows, 2 stages"),
    "m128_n32_w4_s2": Tile(128, 32, 4, 2, (128,), _HALF, "128 q rows, 32-row K/V tiles, 4 warps x 32 rows"),
    "m128_n32_w4_s3": Tile(128, 32, 4, 3, (128,), _HALF, "as m128_n32_w4_s2 with a 3-stage K/V pipeline"),
    "m128_n48_w4_s2": Tile(128, 48, 4, 2, (128,), _HALF, "128 q rows, 48-row K/V tiles, 4 warps x 32 rows (d128 default)"),
    "m64_n32_w4_s2": Tile(64, 32, 4, 2, (256,), _HALF, "64 q rows, 32-row K/V tiles, 4 warps x 16 rows (d256 default)"),
    "f32": Tile(64, 32, 8, 1, (64, 128, 256), ("fp32",), "exact fp32 FFMA path: 64 q rows, 32-row K/V tiles, 256 threads", FFMA),
    "tf32": Tile(64, 32, 4, 2, (64, 128), ("tf32",), "fp32 inputs rounded to tf32 on mma.sync m16n8k8: 64 q rows, 32-row K/V tiles, 4 warps, 2 stages", MMA_TF32),
    # Hopper: 64 q rows per warpgroup of 4 warps.
    "wgmma_m128_n128_s2": Tile(128, 128, 8, 2, (64, 128), _HALF, "wgmma, 2 warpgroups x 64 q rows, 128-row K/V tiles, 2 stages", WGMMA),
    "wgmma_m128_n128_s3": Tile(128, 128, 8, 3, (64, 128), _HALF, "as wgmma_m128_n128_s2 with a 3-stage K/V pipeline", WGMMA),
    "wgmma_m128_n64_s3": Tile(128, 64, 8, 3, (64, 128), _HALF, "wgmma, 2 warpgroups x 64 q rows, 64-row K/V tiles, 3 stages", WGMMA),
    "wgmma_m192_n64_s2": Tile(192, 64, 12, 2, (128,), _HALF, "wgmma, 3 warpgroups x 64 q rows, 64-row K/V tiles, 2 stages", WGMMA),
    # Ping-pong: the second warpgroup half an iteration behind the first. A stage more for
    # the same prefetch depth (the lagging warpgroup holds its K/V slots one barrier longer).
    "wgmma_pp_m128_n128_s3": Tile(128, 128, 8, 3, (64, 128), _HALF, "wgmma ping-pong, 2 warpgroups x 64 q rows, 128-row K/V tiles, 3 stages", WGMMA, PING_PONG),
    "wgmma_pp_m128_n128_s4": Tile(128, 128, 8, 4, (64,), _HALF, "as wgmma_pp_m128_n128_s3 with 4 stages", WGMMA, PING_PONG),
    "wgmma_pp_m128_n64_s4": Tile(128, 64, 8, 4, (128,), _HALF, "wgmma ping-pong, 2 warpgroups x 64 q rows, 64-row K/V tiles, 4 stages", WGMMA, PING_PONG),
    # Warp-specialised, persistent: 12 warps = a producer warpgroup (cp.async into K and V
    # rings of <stages> slots each, completion on mbarriers, 24 registers) + 2 consumer
    # warpgroups x 64 q rows (240 registers); Q double-buffered across work items.
    "wgmma_ws_m128_n128_s2": Tile(128, 128, 12, 2, (64, 128), _HALF, "wgmma warp-specialised, persistent: producer warpgroup + 2 free-running consumer warpgroups x 64 q rows, 128-row K/V tiles, 2 slots", WGMMA, WARP_SPECIALIZED),
    "wgmma_ws_pp_m128_n128_s2": Tile(128, 128, 12, 2, (64, 128), _HALF, "as wgmma_ws_m128_n128_s2 with the consumers taking turns to issue their wgmma (ping-pong)", WGMMA, WARP_SPECIALIZED_PING_PONG),
    "wgmma_ws_pp_m128_n128_s3": Tile(128, 128, 12, 3, (64,), _HALF, "as wgmma_ws_pp_m128_n128_s2 with 3 K/V slots", WGMMA, WARP_SPECIALIZED_PING_PONG),
    "wgmma_ws_pp_m128_n64_s4": Tile(128, 64, 12, 4, (128,), _HALF, "wgmma warp-specialised ping-pong, persistent: 64-row K/V tiles, 4 slots", WGMMA, WARP_SPECIALIZED_PING_PONG),
    # 16 warps: a producer warpgroup + 3 consumer warpgroups x 64 q rows (160 registers
    # each, head dim 64 only): each K/V tile read from shared memory serves 192 query rows.
    "wgmma_ws_m192_n128_s2": Tile(192, 128, 16, 2, (64,), _HALF, "wgmma warp-specialised, persistent: producer warpgroup + 3 free-running consumer warpgroups x 64 q rows, 128-row K/V tiles, 2 slots", WGMMA, WARP_SPECIALIZED),
    "wgmma_ws_pp_m192_n128_s2": Tile(192, 128, 16, 2, (64,), _HALF, "as wgmma_ws_m192_n128_s2 with the consumers taking turns to issue their wgmma (ping-pong)", WGMMA, WARP_SPECIALIZED_PING_PONG),
}

DEFAULT_TILE = {
    ("fp16", 64): "m128_n64_w4_s2",
    ("bf16", 64): "m128_n64_w4_s2",
    ("fp16", 128): "m128_n48_w4_s2",
    ("bf16", 128): "m128_n48_w4_s2",
    ("fp16", 256): "m64_n32_w4_s2",
    ("bf16", 256): "m64_n32_w4_s2",
    ("fp32", 64): "f32",
    ("fp32", 128): "f32",
    ("fp32", 256): "f32",
    ("tf32", 64): "tf32",
    ("tf32", 128): "tf32",
}

# Defaults on Hopper, where they differ from DEFAULT_TILE: per (precision, head_dim), rows
# (bound, tile without a mask, tile under a causal mask) for K/V lengths up to the bound,
# bounds in increasing order, None for any length (kernels/NOTES.md, v5, v6 and "L2
# sections"). Head dim 64: three consumer warpgroups (192 q rows per K/V tile read) in
# ping-pong from 257 keys, where under a causal mask each warpgroup computes only the tiles
# its own rows see (NOTES, "Head dim 64: three consumer warpgroups", "Each warpgroup's own
# tiles", and for causal 257-512 keys "Where the forward stands (TMA copies)"); below, two.
# Head dim 128: the
# warp-specialised persistent tile at every length, under a causal mask with its items from
# the tile counter (work_order), which beat the one-CTA-per-tile ping-pong tile from 2048
# keys (NOTES, "A tile counter for causal persistent grids").
WGMMA_DEFAULT_TILE: dict[tuple[str, int], tuple[tuple[int | None, str, str], ...]] = {
    (precision, 64): ((256, "wgmma_ws_pp_m128_n128_s2", "wgmma_ws_pp_m128_n128_s2"),
                      (None, "wgmma_ws_pp_m192_n128_s2", "wgmma_ws_pp_m192_n128_s2"))
    for precision in ("fp16", "bf16")
}
WGMMA_DEFAULT_TILE.update({
    (precision, 128): ((None, "wgmma_ws_pp_m128_n128_s2", "wgmma_ws_pp_m128_n128_s2"),)
    for precision in ("fp16", "bf16")
})


def default_tile(precision: str, head_dim: int, wgmma: bool, len_k: int | None = None, causal: bool = False) -> str:
    """The default tile's name; on Hopper (wgmma) it may depend on the K/V length (None:
    the longest) and the mask."""
    key = (precision, head_dim)
    if key not in DEFAULT_TILE:
        raise ValueError(f"custom kernel has no default for precision {precision} and head_dim {head_dim}")
    if wgmma and key in WGMMA_DEFAULT_TILE:
        for bound, full, masked in WGMMA_DEFAULT_TILE[key]:
            if bound is None or (len_k is not None and len_k <= bound):
                return masked if causal else full
    return DEFAULT_TILE[key]

# Every name the config and the records may use (grammar above; these are the listed ones).
VARIANTS: dict[str, dict] = {"": {"description": "default tile for the head dim and precision, one CTA per query tile"}}
VARIANTS.update({name: tile.as_dict() for name, tile in TILES.items()})
VARIANTS.update(
    {
        "sm1": {"description": "default tile, persistent grid of 1 CTA per SM", "ctas_per_sm": 1},
        "sm2": {"description": "default tile, persistent grid of 2 CTAs per SM", "ctas_per_sm": 2},
        "ctas66": {"description": "default tile, at most 66 CTAs (half an H100/H200 at 1 per SM)", "max_ctas": 66},
    }
)

_CAP = re.compile(r"(?:(?P<tile>[a-z0-9_]+)_)?(?:sm(?P<sm>\d+)|ctas(?P<ctas>\d+))")


@dataclass(frozen=True)
class Launch:
    tile_name: str
    tile: Tile
    ctas_per_sm: int  # 0: not capped per SM
    max_ctas: int  # 0: not capped


def _split_variant(variant: str) -> tuple[str, int, int]:
    """(tile name or "" for the default, CTAs per SM cap, total CTA cap) by the grammar in the
    module docstring; ValueError naming the problem when `variant` follows none of its forms."""
    variant = variant or ""
    match = _CAP.fullmatch(variant)
    tile_name = (match.group("tile") or "") if match else variant
    if tile_name and tile_name not in TILES:
        forms = ", ".join([*TILES, "<tile>_sm<N>", "<tile>_ctas<N>", "sm<N>", "ctas<N>"])
        raise ValueError(f"unknown custom variant {variant!r}; allowed: \"\" (the default), {forms}")
    sm = int(match.group("sm") or 0) if match else 0
    ctas = int(match.group("ctas") or 0) if match else 0
    if match and sm < 1 and ctas < 1:
        raise ValueError(f"custom variant {variant!r}: CTA caps must be at least 1")
    return tile_name, sm, ctas


def check_variant_name(variant: str) -> None:
    """The config-time check: the name follows the grammar; whether it fits a cell's
    precision, head dim and device is decided per cell by parse_variant."""
    _split_variant(variant)


@functools.lru_cache(maxsize=512)  # on every call's host path: short kernels are launch-bound
def parse_variant(variant: str, precision: str, head_dim: int, capability: tuple[int, int] | None = None,
                  len_k: int | None = None, causal: bool = False) -> Launch:
    """The launch a variant names for this precision and head dim on a device of this compute
    capability (None: mma.sync defaults, no wgmma check), K/V length and mask (which pick
    among Hopper defaults; len_k None: the longest); ValueError with a reason if none."""
    tile_name, sm, ctas = _split_variant(variant)
    wgmma = capability is not None and tuple(capability) == WGMMA_CAPABILITY
    if not tile_name:
        tile_name = default_tile(precision, head_dim, wgmma, len_k, bool(causal))
    tile = TILES[tile_name]
    if tile.mma == WGMMA and capability is not None and not wgmma:
        cap = ".".join(map(str, capability))
        raise ValueError(f"custom variant {variant!r} uses wgmma, built only for compute capability 9.0 (device has {cap})")
    if head_dim not in tile.head_dims:
        raise ValueError(f"custom variant {variant!r} is built for head_dim {tile.head_dims}, not {head_dim}")
    if precision not in tile.precisions:
        raise ValueError(f"custom variant {variant!r} runs {'/'.join(tile.precisions)}, not {precision}")
    return Launch(tile_name, tile, sm, ctas)


def _precision_of(dtype, precision: str | None) -> str:
    """The cell precision these inputs run at: their dtype's, or tf32 asked for on float32."""
    import torch

    natural = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}.get(dtype, str(dtype))
    if precision is None or precision == natural:
        return natural
    if precision == "tf32" and dtype == torch.float32:
        return "tf32"
    raise ValueError(f"custom kernel: precision {precision!r} does not run {dtype} inputs (tf32 takes float32)")


def _check_inputs(q, k, v) -> None:
    import torch

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"custom kernel: {name} must be a torch.Tensor")
        if t.device.type != "cuda":
            raise ValueError(f"custom kernel: {name} must be on a CUDA device (is on {t.device})")
        if t.dim() != 4:
            raise ValueError(f"custom kernel: {name} must be 4-d, got shape {tuple(t.shape)}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"custom kernel: q, k, v on different devices ({q.device}, {k.device}, {v.device})")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"custom kernel: q, k, v dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"custom kernel: dtype {q.dtype} not supported (float16, bfloat16, float32)")
    if _capability(q.device) < (8, 0):
        raise ValueError("custom kernel: needs compute capability 8.0 or newer")
    B, H, L, D = q.shape
    if D not in HEAD_DIMS:
        raise ValueError(f"custom kernel: head_dim {D} not supported ({', '.join(map(str, HEAD_DIMS))})")
    if k.shape != v.shape:
        raise ValueError(f"custom kernel: k {tuple(k.shape)} and v {tuple(v.shape)} differ in shape")
    if k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"custom kernel: k/v {tuple(k.shape)} do not match q {tuple(q.shape)} in batch or head_dim")
    if k.shape[1] < 1 or H % k.shape[1]:
        raise ValueError(f"custom kernel: q heads ({H}) must be a multiple of k/v heads ({k.shape[1]})")
    if min(B, H, L, k.shape[2]) < 1:
        raise ValueError("custom kernel: empty input")


def _kernel_ready(t):
    """A view the kernel can read with 16-byte loads; a copy in fresh memory only if it
    cannot (`contiguous()` would hand back a contiguous tensor that starts off alignment).
    Written out rather than looped: it runs on four tensors in every call's host path."""
    b, h, l, d = t.stride()
    elem = t.element_size()
    if d == 1 and t.data_ptr() % 16 == 0 and (b * elem) % 16 == 0 and (h * elem) % 16 == 0 and (l * elem) % 16 == 0:
        return t
    import torch

    return t.clone(memory_format=torch.contiguous_format)


@functools.lru_cache(maxsize=64)
def _properties_of(index: int):
    import torch

    return torch.cuda.get_device_properties(index)


def device_properties(device):
    """torch's properties of a CUDA device (index None: the current one), looked up once per
    device: the launch path reads its capability, SM count and L2 size on every call."""
    import torch

    device = torch.device(device)
    return _properties_of(device.index if device.index is not None else torch.cuda.current_device())


def _capability(device) -> tuple[int, int]:
    """Compute capability of a CUDA device (index None: the current one)."""
    props = device_properties(device)
    return (props.major, props.minor)


def flash_forward(q, k, v, causal: bool, variant: str = "", layout: str = "bhld", *, out=None, scale: float | None = None,
                  precision: str | None = None, l2_section: int | None = None, tile_counter: bool | None = None,
                  tma: bool | None = None):
    """Attention forward; returns (out, lse).

    precision: None runs the inputs' own (fp16, bf16, exact fp32); "tf32" runs float32
    inputs on tensor cores, rounded to tf32.
    layout "bhld": q (B, H, Lq, D), k/v (B, Hkv, Lk, D); "blhd": q (B, Lq, H, D), k/v
    (B, Lk, Hkv, D). Any strides with a contiguous head_dim. out (optional) must have q's
    shape and dtype; it is written in place. lse is float32 (B, H, Lq), natural log.
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

    if layout not in ("bhld", "blhd"):
        raise ValueError(f"custom kernel: layout {layout!r} not in ('bhld', 'blhd')")
    if layout == "blhd":
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor) or t.dim() != 4:
                raise ValueError(f"custom kernel: {name} must be a 4-d tensor")
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if out is not None:
            out = out.transpose(1, 2)
    _check_inputs(q, k, v)
    l2_sections.check(l2_section)
    B, H, L, D = q.shape
    launch = parse_variant(variant, _precision_of(q.dtype, precision), D, _capability(q.device), k.shape[2],
                           bool(causal))
    if out is None:
        if layout == "blhd" or (q.stride(1) < q.stride(2)):
            out = torch.empty((B, L, H, D), dtype=q.dtype, device=q.device).transpose(1, 2)
        else:
            out = torch.empty((B, H, L, D), dtype=q.dtype, device=q.device)
    elif out.shape != q.shape or out.dtype != q.dtype or out.device != q.device:
        raise ValueError(f"custom kernel: out {tuple(out.shape)} {out.dtype} must match q {tuple(q.shape)} {q.dtype}")
    target = out
    out_k = _kernel_ready(out)
    lse = torch.empty((B, H, L), dtype=torch.float32, device=q.device)
    q_k, k_k, v_k = _kernel_ready(q), _kernel_ready(k), _kernel_ready(v)
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
    ext.forward(
        q_k, k_k, v_k, out_k, lse, bool(causal), float(scale if scale is not None else 1.0 / math.sqrt(D)),
        _mma_code(ext, t), t.block_m, t.block_n, t.warps, t.stages, _schedule_code(ext, t), int(grid_cap),
        int(l2_section), bool(tile_counter), _COPIES[tma],
    )
    if out_k is not target:
        target.copy_(out_k)
    return (target.transpose(1, 2) if layout == "blhd" else target), lse


# flash_forward's `tma` as the extension's FwdCopies (kernels/flash_fwd.cuh).
_COPIES = {None: 0, False: 1, True: 2}

# How a launch hands its work items (query tiles) to CTAs.
WORK_ONE_CTA_PER_TILE, WORK_FIXED_STRIDE, WORK_TILE_COUNTER = "one CTA per tile", "fixed stride", "tile counter"
# Below this many keys a causal item is a few K/V tiles long and the counter's atomic per
# item cost more than the balance gained (H100: 0.96-0.99 at 512 keys, 1.01-1.14 from 1024).
TILE_COUNTER_MIN_KEYS = 1024


def work_order(tile: Tile, causal: bool, len_k: int | None = None) -> str:
    """One CTA per tile (the hardware hands CTAs to SMs as they free up); for the persistent
    tiles, items by a fixed stride where they are of equal length (no mask) or short, else
    from a counter as CTAs free up: causal items differ in length, and a fixed stride over
    an order cut into L2 sections leaves CTAs with unequal work (kernels/NOTES.md, "A tile
    counter for causal persistent grids"). len_k None: the longest."""
    if tile.schedule not in WS_SCHEDULES:
        return WORK_ONE_CTA_PER_TILE
    long_enough = len_k is None or len_k >= TILE_COUNTER_MIN_KEYS
    return WORK_TILE_COUNTER if causal and long_enough else WORK_FIXED_STRIDE


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

    launch = parse_variant(variant, precision, head_dim, _capability(torch.device("cuda")), len_k, causal)
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


class Custom:
    name = "custom"
    differentiable = True

    def supports(self, cell: Cell, device) -> str | None:
        if getattr(device, "type", str(device)) != "cuda":
            return f"custom needs a CUDA device (running on {getattr(device, 'type', device)})"
        cap = _capability(device)
        if cap < (8, 0):
            return f"custom needs compute capability 8.0 or newer (device has {cap[0]}.{cap[1]})"
        if cell.head_dim not in HEAD_DIMS:
            return f"custom supports head_dim {', '.join(map(str, HEAD_DIMS))} (cell asks for {cell.head_dim})"
        if cell.precision not in PRECISIONS:
            return f"custom runs {', '.join(PRECISIONS)} (cell asks for {cell.precision})"
        if cell.pass_ == "fwd_bwd":
            from flashwatt.kernels.custom_backward import backward_plan

            try:
                backward_plan(cell.precision, cell.head_dim)
            except ValueError as err:
                return str(err)
        try:
            parse_variant(cell.variant, cell.precision, cell.head_dim, cap, cell.seq_len, cell.causal)
        except ValueError as err:
            return str(err)
        return None

    def __call__(self, q, k, v, cell: Cell):
        # Differentiable when a gradient may be asked for; otherwise the plain forward.
        from flashwatt.kernels.custom_autograd import flash_attention

        return flash_attention(q, k, v, cell.causal, cell.variant, precision=cell.precision)

    def describe(self, cell: Cell) -> dict:
        """The build (key, build and load seconds), the launch the cell's variant resolved to
        and, for a fwd_bwd cell, the backward's path (CUDA tile or the PyTorch path)."""
        from flashwatt.build import build_info

        details = {"build": build_info(),
                   "launch": kernel_info(cell.precision, cell.head_dim, cell.variant, cell.seq_len, cell.causal)}
        if cell.pass_ == "fwd_bwd":
            from flashwatt.kernels.custom_backward import backward_kernel_info

            details["backward"] = backward_kernel_info(cell.precision, cell.head_dim)
        return details
