"""The launch configurations of flashwatt's own forward kernel: tiles and named variants.

A *variant* names the launch configuration, the knobs a power-aware scheduler turns:
    <tile>[_sm<N> | _ctas<N>]
where <tile> is one of TILES (rows of Q per CTA, K/V rows per tile, warps, pipeline
stages; `wgmma_` tiles need Hopper), `_sm<N>` runs a persistent grid of N CTAs per
multiprocessor and `_ctas<N>` a persistent grid of at most N CTAs in total (`wgmma_ws_`
tiles are persistent already: one CTA per SM without a cap, taking causal work items from a
counter: `work_order`). The tile may be left out ("sm1", "ctas64") to keep the default
tile; "" is the default tile with one CTA per query tile.

Pure Python (no torch): config validation checks variant names with `check_variant_name`;
`parse_variant` resolves one for a cell's precision, head dim, device and key length.
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# The instructions a tile computes with (FwdMath in kernels/flash_fwd.cuh; WGMMA_FP8: the fp8
# forward's wgmma with e4m3 operands, kernels/flash_fp8.cuh).
MMA_SYNC, WGMMA, FFMA, MMA_TF32, WGMMA_FP8 = "mma.sync", "wgmma", "ffma", "mma.sync.tf32", "wgmma.e4m3"
# the fp8 wgmma whose P V also sums each row of P (a row of ones under V^T; kWgmmaFp8RowSum)
WGMMA_FP8_RSUM = "wgmma.e4m3+rowsum"
# Tiles whose instructions exist only in the sm_90a build.
HOPPER_MATH = (WGMMA, WGMMA_FP8, WGMMA_FP8_RSUM)
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
    # fp8 (e4m3) forward on Hopper (kernels/flash_fwd_fp8.cuh): Q, K and V^T tiles in e4m3, 128 keys per tile.
    "wgmma_fp8_m128_n128_s2": Tile(128, 128, 8, 2, (64, 128), ("fp8",), "fp8 wgmma (e4m3 operands), 2 warpgroups x 64 q rows, 128-key tiles, 2 stages", WGMMA_FP8),
    "wgmma_fp8_pp_m128_n128_s3": Tile(128, 128, 8, 3, (64, 128), ("fp8",), "as wgmma_fp8_m128_n128_s2 with the warpgroups in ping-pong, 3 stages", WGMMA_FP8, PING_PONG),
    # Warp-specialised, persistent (kernels/flash_fwd_fp8_ws.cuh): a producer warpgroup copying with TMA,
    # 2 consumer warpgroups taking turns, K and V^T rings of <stages> slots, O staged in a buffer of its own.
    "wgmma_fp8_ws_pp_m128_n128_s2": Tile(128, 128, 12, 2, (64, 128), ("fp8",), "fp8 wgmma warp-specialised ping-pong, persistent: producer warpgroup (TMA) + 2 consumer warpgroups x 64 q rows, 128-key tiles, 2 slots", WGMMA_FP8, WARP_SPECIALIZED_PING_PONG),
    "wgmma_fp8_ws_pp_m128_n128_s3": Tile(128, 128, 12, 3, (64, 128), ("fp8",), "as wgmma_fp8_ws_pp_m128_n128_s2 with 3 K/V slots", WGMMA_FP8, WARP_SPECIALIZED_PING_PONG),
    "wgmma_fp8_ws_m128_n128_s2": Tile(128, 128, 12, 2, (64, 128), ("fp8",), "as wgmma_fp8_ws_pp_m128_n128_s2 with the consumers issuing their wgmma freely (no ping-pong turns)", WGMMA_FP8, WARP_SPECIALIZED),
    # 3 consumer warpgroups (192 q rows per K/V tile read, 160 registers each), as
    # wgmma_ws_pp_m192_n128_s2 is for 16-bit inputs; blocks start at row 0 (a warpgroup's rows are one
    # query block of the quantisation), not end-aligned under a causal mask as the 16-bit one's. At head
    # dim 128 each consumer finishes its P V within its turn before it issues S (flash_fwd_fp8_ws.cuh,
    # kSerialPv): S, O and P of two tiles do not fit in 160 registers.
    "wgmma_fp8_ws_pp_m192_n128_s2": Tile(192, 128, 16, 2, (64, 128), ("fp8",), "fp8 wgmma warp-specialised ping-pong, persistent: producer warpgroup (TMA) + 3 consumer warpgroups x 64 q rows, 128-key tiles, 2 slots", WGMMA_FP8, WARP_SPECIALIZED_PING_PONG),
    "wgmma_fp8_ws_pp_m192_n128_s3": Tile(192, 128, 16, 3, (64, 128), ("fp8",), "as wgmma_fp8_ws_pp_m192_n128_s2 with 3 K/V slots", WGMMA_FP8, WARP_SPECIALIZED_PING_PONG),
    # The row sums of P from the tensor cores (flash_fwd_fp8_ws.cuh, RSUM): P V with N = D + 8 over the row
    # of ones under V^T, no FADD per score in the softmax; O normalised by the sum of P as rounded to e4m3.
    "wgmma_fp8_ws_pp_m128_n128_s2_rsum": Tile(128, 128, 12, 2, (64, 128), ("fp8",), "as wgmma_fp8_ws_pp_m128_n128_s2 with the row sums of P from the tensor cores (P V over a row of ones under V^T)", WGMMA_FP8_RSUM, WARP_SPECIALIZED_PING_PONG),
    "wgmma_fp8_ws_pp_m192_n128_s3_rsum": Tile(192, 128, 16, 3, (64,), ("fp8",), "as wgmma_fp8_ws_pp_m192_n128_s3 with the row sums of P from the tensor cores", WGMMA_FP8_RSUM, WARP_SPECIALIZED_PING_PONG),
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
    # fp8 runs on Hopper only (custom_fp8 refuses other devices before a tile is chosen): the
    # fastest tile of the benches (kernels/NOTES.md, "fp8 forward: measured", "fp8 at head dim
    # 64: three consumers", "Row sums tile by tile: measured"): at head dim 64 three consumer
    # warpgroups with the row sums on the tensor cores (under a causal mask to 1024 keys two,
    # WGMMA_DEFAULT_TILE); at 128 three consumer warpgroups (under a causal mask to 4096 keys
    # two, WGMMA_DEFAULT_TILE).
    ("fp8", 64): "wgmma_fp8_ws_pp_m192_n128_s3_rsum",
    ("fp8", 128): "wgmma_fp8_ws_pp_m192_n128_s2",
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
# fp8 at head dim 64 (NOTES, "fp8 at head dim 64: three consumers", "Row sums tile by tile:
# measured"): three consumer warpgroups, three stages, the row sums on the tensor cores (5-12 %
# ahead of the plain two-stage tile from 1024 keys); under a causal mask to 1024 keys two
# consumers, as fast as it there and 5-6 % ahead of the plain three (they skip more of the
# masked tiles: 128 query rows a work item against 192).
WGMMA_DEFAULT_TILE[("fp8", 64)] = ((1024, "wgmma_fp8_ws_pp_m192_n128_s3_rsum", "wgmma_fp8_ws_pp_m128_n128_s3"),
                                   (None, "wgmma_fp8_ws_pp_m192_n128_s3_rsum", "wgmma_fp8_ws_pp_m192_n128_s3_rsum"))
# fp8 at head dim 128 (NOTES, "fp8 forward: the step's latency"): three consumer warpgroups
# without a mask (0-9 % ahead of two at every length, two runs) and under a causal mask from
# 8192 keys (2-10 %); two under a causal mask to 4096 keys, where a work item of 128 query rows
# skips more of the masked tiles (three: 4 % behind at 1024 keys, -2 to +3 % from 2048).
WGMMA_DEFAULT_TILE[("fp8", 128)] = ((4096, "wgmma_fp8_ws_pp_m192_n128_s2", "wgmma_fp8_ws_pp_m128_n128_s2"),
                                    (None, "wgmma_fp8_ws_pp_m192_n128_s2", "wgmma_fp8_ws_pp_m192_n128_s2"))


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
    if tile.mma in HOPPER_MATH and capability is not None and not wgmma:
        cap = ".".join(map(str, capability))
        raise ValueError(f"custom variant {variant!r} uses {tile.mma}, built only for compute capability 9.0 "
                         f"(device has {cap})")
    if head_dim not in tile.head_dims:
        raise ValueError(f"custom variant {variant!r} is built for head_dim {tile.head_dims}, not {head_dim}")
    if precision not in tile.precisions:
        raise ValueError(f"custom variant {variant!r} runs {'/'.join(tile.precisions)}, not {precision}")
    return Launch(tile_name, tile, sm, ctas)



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
