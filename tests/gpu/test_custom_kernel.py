"""Correctness of the custom attention forward and backward against a float64 reference.

Error measure: ||out - ref|| / ||ref|| over the whole tensor (and the same for the LSE).
Bounds: fp32 1e-5 (exact FFMA path), tf32 2e-3 (fp32 inputs that the kernel rounds to
tf32, against the unrounded inputs), fp16 5e-3, bf16 1e-2 (inputs are rounded to the
storage type before the reference sees them, so the bound covers the kernel's own
rounding of P to 16 bits and of the output). NaN or inf anywhere fails.
Outputs are NaN-filled before each launch so an unwritten element cannot pass.

Backward: dq, dk and dv each against autograd through the float64 reference (which sums
dk/dv over the query heads of a GQA group), same measure, bounds TOLERANCE[...]["grad"]
of flashwatt.vocabulary (the bounds of a fwd_bwd cell's check); where the reference is
exactly zero (one key per query: dq and dk vanish) the norm of the kernel's value must
stay under 1e-3. Gradient buffers are NaN-filled too.

The causal mask's alignment (flashwatt.kernels.custom_mask): the reference builds an
explicit boolean mask, top-left (key j visible to query i iff j <= i) or bottom-right (iff
j <= i + Lk - Lq). A query that sees no key (bottom-right, Lq > Lk) must give an output row
of exactly 0, an LSE of -inf and a dQ row of exactly 0; the relative errors are then taken
over the other rows.
"""
from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
import textwrap
import warnings
import zlib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from flashwatt.attention.cell import Cell
from flashwatt.kernels import custom_backward
from flashwatt.kernels.custom import (
    DEFAULT_TILE, TILES, VARIANTS, WGMMA, WGMMA_CAPABILITY, WS_SCHEDULES, Custom, default_tile, flash_forward,
    kernel_info, parse_variant,
)
from flashwatt.kernels.custom_autograd import flash_attention
from flashwatt.kernels.custom_backward import (
    BWD_MMA_SYNC, BWD_TILES, BWD_TORCH_MATH, BWD_WGMMA, DEFAULT_BWD_TILE, backward_kernel_info,
)
from flashwatt.vocabulary import TOLERANCE

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]  # builds the custom kernels

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
TOL = {"fp32": 1e-5, "tf32": 2e-3, "fp16": 5e-3, "bf16": 1e-2}
REPO = Path(__file__).resolve().parents[2]
CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
HOPPER = CAPABILITY == WGMMA_CAPABILITY
# The tiles of the 16- and 32-bit precisions: the fp8 tiles have their own tests
# (tests/gpu/test_fp8_kernel.py: other inputs, another reference).
NON_FP8_TILES = {name: tile for name, tile in TILES.items() if "fp8" not in tile.precisions}


def make(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def visible_keys(lq, lk, causal_align, device="cuda"):
    """(lq, lk) bool: key j visible to query i, written out from the alignment's definition."""
    offset = lk - lq if causal_align == "bottom_right" else 0
    return torch.arange(lk, device=device)[None, :] <= torch.arange(lq, device=device)[:, None] + offset


def reference(q, k, v, causal, scale=None, causal_align="top_left"):
    """float64 attention on (B, H, L, D) views, k/v heads repeated for grouped queries; a
    query that sees no key gives 0 (and no gradient) and an LSE of -inf."""
    q64, k64, v64 = q.double(), k.double(), v.double()
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k64 = k64.repeat_interleave(group, dim=1)
        v64 = v64.repeat_interleave(group, dim=1)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q64, k64.transpose(-2, -1)) * scale
    if causal:
        lq, lk = s.shape[-2], s.shape[-1]
        s = s.masked_fill(~visible_keys(lq, lk, causal_align, s.device), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isneginf(lse)[..., None]  # placeholder scores keep softmax and its gradient finite
    p = torch.softmax(s.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
    return torch.matmul(p, v64), lse


def rel_err(x, ref):
    assert torch.isfinite(x).all(), "non-finite values in the kernel's output"
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item()


def check(q, k, v, causal, precision, variant="", layout="bhld", l2_section=None, tma=None, causal_align="top_left",
          tile_counter=None):
    """Runs the kernel on NaN-poisoned output and compares out and lse with float64; rows
    that see no key must be exactly 0 with an LSE of -inf."""
    out = torch.full_like(q, float("nan"))
    got, lse = flash_forward(q, k, v, causal, variant, layout=layout, out=out, precision=precision,
                             l2_section=l2_section, tma=tma, causal_align=causal_align, tile_counter=tile_counter)
    assert got.data_ptr() == out.data_ptr()
    if layout == "blhd":
        ref, ref_lse = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal,
                                 causal_align=causal_align)
        ref = ref.transpose(1, 2)
    else:
        ref, ref_lse = reference(q, k, v, causal, causal_align=causal_align)
    empty = torch.isneginf(ref_lse)  # (B, H, Lq): queries that see no key
    if empty.any():
        rows = empty.transpose(1, 2) if layout == "blhd" else empty
        assert torch.equal(torch.isneginf(lse), empty), "LSE of rows that see no key must be -inf, and only theirs"
        assert torch.count_nonzero(got[rows]) == 0 and not got[rows].isnan().any(), "rows that see no key must be 0"
        lse, ref_lse = lse[~empty], ref_lse[~empty]
        got, ref = got[~rows], ref[~rows]
    e_out = rel_err(got, ref)
    e_lse = rel_err(lse, ref_lse)
    tol = TOL[precision]
    assert e_out <= tol, f"output rel err {e_out:.3e} > {tol:.0e}"
    assert e_lse <= tol, f"lse rel err {e_lse:.3e} > {tol:.0e}"
    return e_out, e_lse


def qkv(B, H, L, D, dtype, seed, Hkv=None, Lk=None):
    Hkv = Hkv or H
    Lk = Lk or L
    return make((B, H, L, D), dtype, seed), make((B, Hkv, Lk, D), dtype, seed + 1), make((B, Hkv, Lk, D), dtype, seed + 2)


# ---------------------------------------------------------------- the matrix

@pytest.mark.parametrize("L", [1, 7, 64, 127, 1000, 4097])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_matrix(precision, D, causal, L):
    """The default launch of each precision and head dim (tf32: d64 and d128)."""
    if precision == "tf32" and D == 256:
        q, k, v = qkv(1, 1, 8, D, torch.float32, 1)
        with pytest.raises(ValueError, match="no default for precision tf32 and head_dim 256"):
            flash_forward(q, k, v, causal, precision="tf32")
        return
    B, H = (1, 2) if L > 1000 else (2, 3)
    seed = zlib.crc32(f"{precision}-{D}-{causal}-{L}".encode()) % 100_000
    check(*qkv(B, H, L, D, DTYPES[precision], seed), causal, precision)


@pytest.mark.parametrize("L", [1, 7, 64, 127, 1000, 4097])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("path", ["mma.sync", "wgmma.lockstep", "wgmma.ping-pong", "wgmma.ws", "wgmma.ws-ping-pong",
                                  "wgmma.ws-ping-pong-3"])
def test_matrix_all_paths(path, precision, D, causal, L):
    """The same cases on the mma.sync default tile and on a wgmma tile of each schedule, the
    warp-specialised ping-pong with two and with three consumer warpgroups (Hopper;
    elsewhere the wgmma tiles must be refused with the reason, as must a tile at a head dim
    it is not built for)."""
    variant = {"mma.sync": DEFAULT_TILE[(precision, D)], "wgmma.lockstep": "wgmma_m128_n128_s2",
               "wgmma.ping-pong": "wgmma_pp_m128_n128_s3", "wgmma.ws": "wgmma_ws_m128_n128_s2",
               "wgmma.ws-ping-pong": "wgmma_ws_pp_m128_n128_s2",
               "wgmma.ws-ping-pong-3": "wgmma_ws_pp_m192_n128_s2"}[path]
    B, H = (1, 2) if L > 1000 else (2, 3)
    seed = zlib.crc32(f"{path}-{precision}-{D}-{causal}-{L}".encode()) % 100_000
    args = qkv(B, H, L, D, DTYPES[precision], seed)
    if path.startswith(WGMMA) and not HOPPER:
        with pytest.raises(ValueError, match="wgmma"):
            flash_forward(*args, causal, variant)
        return
    if D not in TILES[variant].head_dims:  # three consumers: head dim 64 only
        with pytest.raises(ValueError, match=f"built for head_dim .*not {D}"):
            flash_forward(*args, causal, variant)
        return
    check(*args, causal, precision, variant=variant)


def test_default_launch_on_this_device():
    """Hopper's default is the wgmma tile WGMMA_DEFAULT_TILE names for the key length and
    the mask; elsewhere mma.sync."""
    for precision, D in ((p, d) for p in ("fp16", "bf16") for d in (64, 128)):
        for len_k in (1024, 2048, 4096, 16384):
            for causal in (False, True):
                info = kernel_info(precision, D, len_k=len_k, causal=causal)
                expected = default_tile(precision, D, HOPPER, len_k, causal)
                assert info["tile"] == expected and (info["mma"] == WGMMA) == HOPPER, (precision, D, len_k, info)
                assert info["schedule"] == TILES[expected].schedule, info


# ---------------------------------------------------------------- layouts and GQA

@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
@pytest.mark.parametrize("D", [64, 128])
def test_blhd_layout(precision, D, causal):
    dt = DTYPES[precision]
    B, L, H = 2, 333, 4
    q, k, v = make((B, L, H, D), dt, 5), make((B, L, H, D), dt, 6), make((B, L, H, D), dt, 7)
    check(q, k, v, causal, precision, layout="blhd")


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_strided_views(precision):
    """(B, H, L, D)-shaped views of (B, L, H, D) storage, and q a slice of a packed qkv."""
    dt = DTYPES[precision]
    B, L, H, D = 2, 515, 4, 64
    packed = make((B, L, 3, H, D), dt, 21)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    assert not q.is_contiguous()
    check(q, k, v, True, precision)
    check(q, k, v, False, precision)


@pytest.mark.parametrize("Hkv", [1, 2, 4])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_gqa(precision, causal, Hkv):
    check(*qkv(2, 8, 777, 128, DTYPES[precision], 31 + Hkv, Hkv=Hkv), causal, precision)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_cross_lengths(precision):
    """Lq != Lk (non-causal and top-left causal)."""
    for lq, lk in ((100, 700), (700, 100)):
        check(*qkv(2, 2, lq, 64, DTYPES[precision], 41, Lk=lk), False, precision)
        check(*qkv(2, 2, lq, 64, DTYPES[precision], 43, Lk=lk), True, precision)


# ---------------------------------------------------------------- variants

def _variant_cases():
    cases = []
    for name, tile in NON_FP8_TILES.items():
        for D in tile.head_dims:
            for precision in tile.precisions:
                cases.append((name, D, precision))
    for name in VARIANTS:
        if name not in TILES:
            for D, precision in ((64, "bf16"), (128, "fp16"), (64, "fp32")):
                cases.append((name, D, precision))
    cases += [("m128_n64_w4_s2_sm1", 64, "fp16"), ("m64_n64_w4_s2_ctas3", 256, "bf16"), ("f32_sm1", 128, "fp32"),
              ("m128_n32_w4_s2_ctas1", 128, "bf16"), ("wgmma_m128_n128_s2_sm1", 128, "bf16"),
              ("wgmma_m128_n64_s3_ctas5", 64, "fp16")]
    return cases


def _needs_hopper(variant: str, precision: str, D: int) -> bool:
    return parse_variant(variant, precision, D).tile.mma == WGMMA


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant,D,precision", _variant_cases())
def test_variant(variant, D, precision, causal):
    args = qkv(2, 4, 1000, D, DTYPES[precision], 51)
    if _needs_hopper(variant, precision, D) and not HOPPER:
        with pytest.raises(ValueError, match="wgmma"):
            flash_forward(*args, causal, variant)
        return
    check(*args, causal, precision, variant=variant)


def test_many_ctas_per_sm():
    """Thousands of CTAs (many waves per SM), causal and not, bf16 d128 and fp16 d64."""
    check(*qkv(8, 16, 2048, 128, torch.bfloat16, 61), True, "bf16")
    check(*qkv(8, 16, 2048, 128, torch.bfloat16, 62), False, "bf16")
    check(*qkv(32, 16, 512, 64, torch.float16, 63), False, "fp16")
    if HOPPER:
        check(*qkv(8, 16, 2048, 128, torch.bfloat16, 64), True, "bf16", variant="wgmma_m128_n128_s2")
        check(*qkv(32, 16, 512, 64, torch.float16, 65), False, "fp16", variant="wgmma_m128_n128_s2")
        check(*qkv(8, 16, 2048, 128, torch.bfloat16, 66), True, "bf16", variant="wgmma_pp_m128_n64_s4")
        check(*qkv(32, 16, 512, 64, torch.float16, 67), False, "fp16", variant="wgmma_pp_m128_n128_s4_sm1")


def _ws_cases():
    return [(name, D, precision) for name, tile in NON_FP8_TILES.items() if tile.schedule in WS_SCHEDULES
            for D in tile.head_dims for precision in tile.precisions]


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "threads"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile,D,precision", _ws_cases())
def test_warp_specialized_tiles(tile, D, precision, causal, tma):
    """The persistent warp-specialised kernels (kernels/flash_fwd_wgmma_ws.cuh), with either
    copy (TMA from one producer thread, cp.async from all of them): many work items per CTA
    (rings and Q buffers wrap, mbarrier phases flip many times), one CTA for everything
    (_ctas1) and an odd grid (_ctas3), ragged and cross lengths, both layouts, packed
    strided views, GQA and MQA, K/V heads broadcast with a stride of 0."""
    dt = DTYPES[precision]
    if not HOPPER:
        with pytest.raises(ValueError, match="wgmma"):
            flash_forward(*qkv(1, 1, 64, D, dt, 1), causal, tile, tma=tma)
        return
    seed = zlib.crc32(f"ws-{tile}-{D}-{precision}-{causal}".encode()) % 100_000
    check(*qkv(8, 16, 2048, D, dt, seed), causal, precision, variant=tile, tma=tma)  # 2048 items on 132 CTAs
    check(*qkv(2, 3, 1000, D, dt, seed + 1), causal, precision, variant=f"{tile}_ctas1", tma=tma)  # one CTA: all 48
    check(*qkv(3, 2, 777, D, dt, seed + 2), causal, precision, variant=f"{tile}_ctas3", tma=tma)
    for L in (1, 7, 127, 129, 4097):
        check(*qkv(1, 2, L, D, dt, seed + 3 + L), causal, precision, variant=tile, tma=tma)
    for lq, lk in ((100, 700), (700, 100), (1, 300)):
        check(*qkv(2, 2, lq, D, dt, seed + 5, Lk=lk), causal, precision, variant=tile, tma=tma)
    q, k, v = make((2, 333, 4, D), dt, seed + 6), make((2, 333, 4, D), dt, seed + 7), make((2, 333, 4, D), dt, seed + 8)
    check(q, k, v, causal, precision, variant=tile, layout="blhd", tma=tma)
    packed = make((2, 515, 3, 4, D), dt, seed + 9)
    check(*(packed[:, :, i].transpose(1, 2) for i in range(3)), causal, precision, variant=tile, tma=tma)
    for hkv in (1, 2):
        check(*qkv(2, 8, 777, D, dt, seed + 10 + hkv, Hkv=hkv), causal, precision, variant=tile, tma=tma)
    q, k, v = qkv(2, 6, 300, D, dt, seed + 13, Hkv=1)
    check(q, k.expand(-1, 6, -1, -1), v.expand(-1, 6, -1, -1), causal, precision, variant=tile, tma=tma)


@pytest.mark.parametrize("tile,D,precision", _ws_cases())
def test_tma_and_thread_copies_agree(tile, D, precision):
    """The two copies of a warp-specialised kernel put the same bytes in the same shared
    memory and run the same arithmetic after, so their outputs and LSE are equal bit for bit
    (rows past the end and, with three consumers, before row 0, zero either way); the
    default copies with TMA; a tile without a producer refuses TMA, and tma takes a bool."""
    if not HOPPER:
        pytest.skip("the warp-specialised tiles run only on compute capability 9.0")
    dt = DTYPES[precision]
    seed = zlib.crc32(f"copies-{tile}-{D}-{precision}".encode()) % 100_000
    for B, H, Hkv, lq, lk in ((2, 4, 4, 1, 1), (2, 6, 2, 333, 333), (1, 4, 1, 1000, 300), (3, 2, 2, 129, 4097)):
        q, k, v = qkv(B, H, lq, D, dt, seed + lq, Hkv=Hkv, Lk=lk)
        for causal in (False, True):
            tma_out, tma_lse = flash_forward(q, k, v, causal, tile, tma=True)
            thr_out, thr_lse = flash_forward(q, k, v, causal, tile, tma=False)
            auto_out, auto_lse = flash_forward(q, k, v, causal, tile)
            case = (B, H, Hkv, lq, lk, causal)
            assert torch.equal(tma_out, thr_out) and torch.equal(tma_lse, thr_lse), case
            assert torch.equal(auto_out, tma_out) and torch.equal(auto_lse, tma_lse), case
    no_producer = next(name for name, t in TILES.items() if t.schedule not in WS_SCHEDULES and D in t.head_dims
                       and precision in t.precisions)
    assert kernel_info(precision, D, tile)["copies"] == "tma"
    assert kernel_info(precision, D, no_producer)["copies"] == "threads"
    with pytest.raises(ValueError, match="only the persistent .* copy with TMA"):
        flash_forward(q, k, v, True, no_producer, tma=True)
    with pytest.raises(ValueError, match="tma must be True, False or None"):
        flash_forward(q, k, v, True, tile, tma="yes")


@pytest.mark.parametrize("tile", [name for name, t in TILES.items() if t.schedule in WS_SCHEDULES and t.block_m == 192])
def test_three_consumers_own_tiles(tile):
    """The three-consumer kernel (kernels/NOTES.md, "Each warpgroup's own tiles"): each
    warpgroup computes only the K/V tiles its 64 rows see, the last at half width where at
    most 64 keys of it are visible, none for rows outside [0, len_q); under a causal mask
    the blocks end at len_q, so the first starts above row 0. Lengths on and off the 64-
    and 192-row grids, unequal lengths, GQA: out and LSE against float64, and no row
    written outside the output (a guard of 8 rows before and after every head's rows keeps
    its value); and bottom-right alignment, with rows (whole warpgroups of them) that see no
    key."""
    if not HOPPER:
        pytest.skip("the warp-specialised tiles run only on compute capability 9.0")
    guard = 8
    for lq, lk in ((1, 1), (63, 63), (64, 64), (65, 65), (128, 128), (191, 191), (192, 192), (193, 193),
                   (1000, 1000), (1024, 1024), (300, 1000), (1000, 300), (1, 300), (2000, 100)):
        # Bottom-right with lq > lk: warpgroups whose rows see no key (key end below 0).
        for causal, align in ((True, "top_left"), (False, "top_left"), (True, "bottom_right")):
            if align == "bottom_right" and lq == lk:
                continue
            seed = zlib.crc32(f"own-{tile}-{lq}-{lk}-{causal}-{align}".encode()) % 100_000
            q, k, v = qkv(2, 6, lq, 64, torch.bfloat16, seed, Hkv=2, Lk=lk)
            buf = torch.full((2, 6, lq + 2 * guard, 64), 7.0, device="cuda", dtype=torch.bfloat16)
            out = buf[:, :, guard:guard + lq]
            ref, ref_lse = reference(q, k, v, causal, causal_align=align)
            seen = torch.isfinite(ref_lse)  # rows that see a key (all but bottom-right's first lq - lk)
            for tma in (True, False):
                out.fill_(float("nan"))
                got, lse = flash_forward(q, k, v, causal, tile, out=out, tma=tma, causal_align=align)
                assert got.data_ptr() == out.data_ptr(), "the output view was copied, not written in place"
                case = (lq, lk, causal, align, tma)
                assert rel_err(got[seen], ref[seen]) <= TOL["bf16"], case
                assert rel_err(lse[seen], ref_lse[seen]) <= TOL["bf16"], case
                assert torch.count_nonzero(got[~seen]) == 0 and torch.isneginf(lse[~seen]).all(), case
                assert (buf[:, :, :guard] == 7.0).all() and (buf[:, :, guard + lq:] == 7.0).all(), case


@pytest.mark.parametrize("tile,D,precision", _ws_cases())
def test_tile_counter_hands_out_every_item_once(tile, D, precision):
    """A persistent tile's CTAs take their work items from the tile counter (the default
    under a causal mask) or by a fixed stride: each item is computed by one CTA either way,
    so the outputs and LSE agree bit for bit, whatever the grid (every SM, one CTA, three
    CTAs) and the section width; and the launch records which order ran."""
    if not HOPPER:
        pytest.skip("the warp-specialised tiles run only on compute capability 9.0")
    dt = DTYPES[precision]
    seed = zlib.crc32(f"counter-{tile}-{D}-{precision}".encode()) % 100_000
    q, k, v = qkv(4, 6, 1500, D, dt, seed, Hkv=2)
    for variant in (tile, f"{tile}_ctas1", f"{tile}_ctas3"):
        for causal in (True, False):
            for section in (None, 0, 5):
                runs = [flash_forward(q, k, v, causal, variant, l2_section=section, tile_counter=counter)
                        for counter in (True, False, True)]
                for out, lse in runs[1:]:
                    assert torch.equal(out, runs[0][0]) and torch.equal(lse, runs[0][1]), (variant, causal, section)
            check(q, k, v, causal, precision, variant=variant)
    assert kernel_info(precision, D, tile, 1500, True)["work_order"] == "tile counter"
    assert kernel_info(precision, D, tile, 1500, False)["work_order"] == "fixed stride"
    one_cta_per_tile = next(name for name, t in TILES.items() if t.schedule not in WS_SCHEDULES and D in t.head_dims
                            and precision in t.precisions)
    assert kernel_info(precision, D, one_cta_per_tile, 1500, True)["work_order"] == "one CTA per tile"
    with pytest.raises(ValueError, match="take a tile counter"):
        flash_forward(q, k, v, True, one_cta_per_tile, tile_counter=True)


def test_compiled_kernels_have_no_local_memory():
    for name, tile in NON_FP8_TILES.items():
        for D in tile.head_dims:
            for precision in tile.precisions:
                if tile.mma == WGMMA and not HOPPER:
                    continue  # not compiled for this device: test_variant checks the refusal
                info = kernel_info(precision, D, name)
                assert info["local_bytes"] == 0, f"{name} d{D} {precision}: {info}"
                assert info["max_ctas_per_sm"] >= 1, f"{name} d{D} {precision}: does not fit on an SM: {info}"


def test_build_info():
    from flashwatt.build import build_info

    info = build_info()
    assert set(info) >= {"build_key", "build_dir", "built_now", "build_seconds", "load_seconds", "arch"}
    major, minor = torch.cuda.get_device_capability()
    assert info["arch"] == ("sm_90a" if HOPPER else f"sm_{major}{minor}")
    assert (Path(info["build_dir"]) / "COMPLETE").exists()


# ---------------------------------------------------------------- adapter

def test_adapter_call_and_supports():
    kern = Custom()
    dev = torch.device("cuda")
    cell = Cell(suite="t", kernel="custom", precision="bf16", seq_len=256, batch=2, heads=4, head_dim=64, causal=True)
    assert kern.supports(cell, dev) is None
    q, k, v = qkv(2, 4, 256, 64, torch.bfloat16, 71)
    ref, _ = reference(q, k, v, True)
    assert rel_err(kern(q, k, v, cell), ref) <= TOL["bf16"]
    import dataclasses

    assert kern.differentiable
    assert kern.supports(dataclasses.replace(cell, pass_="fwd_bwd"), dev) is None
    assert kern.supports(dataclasses.replace(cell, pass_="fwd_bwd", head_dim=256), dev) is None
    assert "head_dim" in kern.supports(dataclasses.replace(cell, head_dim=96), dev)
    tf32 = dataclasses.replace(cell, precision="tf32")
    assert kern.supports(tf32, dev) is None
    q32, k32, v32 = qkv(2, 4, 256, 64, torch.float32, 72)
    ref32, _ = reference(q32, k32, v32, True)
    err = rel_err(kern(q32, k32, v32, tf32), ref32)
    assert 1e-6 < err <= TOL["tf32"], f"tf32 cell: rel err {err:.2e} (0 would mean it ran exact fp32)"
    assert "tf32" in kern.supports(dataclasses.replace(tf32, head_dim=256), dev)
    assert "variant" in kern.supports(dataclasses.replace(cell, variant="nosuch"), dev)
    assert "CUDA" in kern.supports(cell, torch.device("cpu"))


# ---------------------------------------------------------------- refusals before launch

def test_refusals():
    q, k, v = qkv(1, 2, 64, 64, torch.float16, 81)
    with pytest.raises(ValueError, match="CUDA"):
        flash_forward(q.cpu(), k.cpu(), v.cpu(), False)
    with pytest.raises(ValueError, match="dtype"):
        flash_forward(q.double(), k.double(), v.double(), False)
    with pytest.raises(ValueError, match="dtypes differ"):
        flash_forward(q, k.float(), v, False)
    with pytest.raises(ValueError, match="head_dim"):
        flash_forward(q[..., :48], k[..., :48], v[..., :48], False)
    with pytest.raises(ValueError, match="differ in shape"):
        flash_forward(q, k, v[:, :, :32], False)
    with pytest.raises(ValueError, match="multiple"):
        q3, k3, v3 = qkv(1, 3, 64, 64, torch.float16, 82, Hkv=2)
        flash_forward(q3, k3, v3, False)
    with pytest.raises(ValueError, match="4-d"):
        flash_forward(q[0], k[0], v[0], False)
    with pytest.raises(ValueError, match="variant"):
        flash_forward(q, k, v, False, variant="nosuch")
    with pytest.raises(ValueError, match="head_dim"):
        flash_forward(q, k, v, False, variant="m128_n32_w4_s2")
    with pytest.raises(ValueError, match="out"):
        flash_forward(q, k, v, False, out=torch.empty_like(q[:, :1]))
    with pytest.raises(ValueError, match="tf32 takes float32"):
        flash_forward(q, k, v, False, precision="tf32")
    torch.cuda.synchronize()


# ---------------------------------------------------------------- backward

GRAD_TOL = {precision: TOLERANCE[precision]["grad"] for precision in DTYPES}
ZERO_REF_BOUND = 1e-3


@pytest.fixture
def poisoned_grads(monkeypatch):
    """The backward's output buffers NaN-filled, so an element it does not write fails."""
    allocate = custom_backward.grad_buffer
    monkeypatch.setattr(custom_backward, "grad_buffer", lambda t: allocate(t).fill_(float("nan")))


def reference_grads(q, k, v, dout, causal, scale=None, causal_align="top_left"):
    """(dq, dk, dv) of the float64 reference on (B, H, L, D) views, by autograd."""
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, _ = reference(q64, k64, v64, causal, scale, causal_align)
    return torch.autograd.grad(out, (q64, k64, v64), dout.double())


def grad_err(g, ref):
    """||g - ref|| / ||ref||; where ref is exactly zero, ||g|| over ZERO_REF_BOUND (so
    that one bound, 1, reads the same for both)."""
    assert torch.isfinite(g).all(), "non-finite values in a gradient"
    err = (g.double() - ref).norm()
    return (err / ref.norm()).item() if ref.norm() > 0 else (err / ZERO_REF_BOUND).item()


def cancelling_terms(q, k, v, dout, causal, causal_align="top_left"):
    """||scale (P o dP) K|| and ||scale (P o dP)^T Q|| in float64, (B, H, L, D) views: the
    terms whose difference with the D = rowsum(dO o O) terms is dQ and dK. Where every query
    sees one key, P = 1 and the two cancel exactly (dQ = dK = 0); a computed gradient is then
    only the rounding of that difference, and its error is measured against these terms."""
    q64, k64, v64, do64 = (t.detach().double() for t in (q, k, v, dout))
    group = q.shape[1] // k.shape[1]
    k64, v64 = k64.repeat_interleave(group, dim=1), v64.repeat_interleave(group, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1])
    s = torch.matmul(q64, k64.transpose(-2, -1)) * scale
    if causal:
        s = s.masked_fill(~visible_keys(s.shape[-2], s.shape[-1], causal_align, s.device), float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)
    pdp = p * torch.matmul(do64, v64.transpose(-2, -1))
    return (scale * torch.matmul(pdp, k64)).norm().item(), (scale * torch.matmul(pdp.transpose(-2, -1), q64)).norm().item()


def check_backward(q, k, v, causal, precision, layout="bhld", variant="", backward_tile=None, seed=0,
                   l2_section=None, deterministic=None, causal_align="top_left"):
    """Gradients of flash_attention on q, k, v (leaves made here) against float64; the dQ
    rows of queries that see no key exactly 0."""
    dout = make(q.shape, q.dtype, seed + 1000)
    leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
    out = flash_attention(*leaves, causal, variant, layout, precision=precision if precision == "tf32" else None,
                          backward_tile=backward_tile, l2_section=l2_section, deterministic=deterministic,
                          causal_align=causal_align)
    grads = torch.autograd.grad(out, leaves, dout)
    if layout == "blhd":
        refs = reference_grads(*(t.transpose(1, 2) for t in (q, k, v, dout)), causal, causal_align=causal_align)
        refs = [r.transpose(1, 2) for r in refs]
    else:
        refs = reference_grads(q, k, v, dout, causal, causal_align=causal_align)
    lq, lk = q.shape[1 if layout == "blhd" else 2], k.shape[1 if layout == "blhd" else 2]
    if causal and causal_align == "bottom_right" and lq > lk:  # queries 0 .. lq - lk - 1 see no key
        no_key = grads[0][:, :lq - lk] if layout == "blhd" else grads[0][:, :, :lq - lk]
        assert torch.count_nonzero(no_key) == 0 and not no_key.isnan().any(), "dq of rows that see no key must be 0"
    tol = GRAD_TOL[precision]
    errs = {}
    terms = None
    for name, g, r, leaf in zip(("dq", "dk", "dv"), grads, refs, leaves):
        assert g.shape == leaf.shape and g.dtype == leaf.dtype, (name, g.shape, g.dtype)
        errs[name] = grad_err(g, r)
        bound = 1.0 if r.norm() == 0 else tol
        if r.norm() == 0 and name != "dv":  # zero by cancellation: against the terms that cancel
            if terms is None:
                views = (q, k, v, dout) if layout == "bhld" else (t.transpose(1, 2) for t in (q, k, v, dout))
                terms = dict(zip(("dq", "dk"), cancelling_terms(*views, causal, causal_align)))
            if terms[name] > 0:
                errs[name], bound = (g.double() - r).norm().item() / terms[name], tol
        assert errs[name] <= bound, f"{name}: error {errs[name]:.3e} > {bound:.0e} ({errs})"
    return errs


HEADS = {"gqa": (8, 2), "mqa": (8, 1)}


@pytest.mark.parametrize("heads", sorted(HEADS))
@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("L", [1, 17, 128, 1000, 2048])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_backward_matrix(poisoned_grads, precision, D, causal, L, layout, heads):
    """The CUDA backward (default tile) after the default forward of this device (wgmma on Hopper)."""
    H, Hkv = HEADS[heads]
    B = 2 if L <= 128 else 1
    seed = zlib.crc32(f"bwd-{precision}-{D}-{causal}-{L}-{layout}-{heads}".encode()) % 100_000
    dt = DTYPES[precision]
    if layout == "blhd":
        q, k, v = make((B, L, H, D), dt, seed), make((B, L, Hkv, D), dt, seed + 1), make((B, L, Hkv, D), dt, seed + 2)
    else:
        q, k, v = qkv(B, H, L, D, dt, seed, Hkv=Hkv)
    check_backward(q, k, v, causal, precision, layout, seed=seed)


WGMMA_BWD_TILES = [name for name, t in BWD_TILES.items() if t.math == BWD_WGMMA]


@pytest.mark.parametrize("tile", WGMMA_BWD_TILES)
@pytest.mark.parametrize("heads", sorted(HEADS) + ["mha"])
@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("L", [1, 17, 128, 1000, 2048])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_backward_matrix_wgmma_tiles(poisoned_grads, precision, D, causal, L, layout, heads, tile):
    """The matrix of test_backward_matrix through each wgmma backward tile (Hopper; elsewhere,
    and at head dims the tile is not built for, the refusal)."""
    H, Hkv = HEADS.get(heads, (4, 4))
    B = 2 if L <= 128 else 1
    seed = zlib.crc32(f"bwdwg-{precision}-{D}-{causal}-{L}-{layout}-{heads}".encode()) % 100_000
    dt = DTYPES[precision]
    if layout == "blhd":
        q, k, v = make((B, L, H, D), dt, seed), make((B, L, Hkv, D), dt, seed + 1), make((B, L, Hkv, D), dt, seed + 2)
    else:
        q, k, v = qkv(B, H, L, D, dt, seed, Hkv=Hkv)
    if D not in BWD_TILES[tile].head_dims:
        with pytest.raises(ValueError, match="is built for head_dim"):
            check_backward(q, k, v, causal, precision, layout, backward_tile=tile, seed=seed)
        return
    if not HOPPER:
        with pytest.raises(ValueError, match="wgmma"):
            check_backward(q, k, v, causal, precision, layout, backward_tile=tile, seed=seed)
        return
    check_backward(q, k, v, causal, precision, layout, backward_tile=tile, seed=seed)


@pytest.mark.parametrize("tile,D", [(name, D) for name in WGMMA_BWD_TILES for D in BWD_TILES[name].head_dims])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_backward_cross_lengths_wgmma_tiles(poisoned_grads, precision, tile, D):
    """Lq != Lk through each wgmma tile and head dim: key blocks no query sees, the causal
    first query block past the end, a single query or key."""
    if not HOPPER:
        pytest.skip("wgmma tiles run only on compute capability 9.0")
    for lq, lk in ((100, 700), (700, 100), (1, 300), (300, 1), (64, 192), (200, 64)):
        for causal in (False, True):
            args = qkv(2, 4, lq, D, DTYPES[precision], 95 + lq, Hkv=2, Lk=lk)
            check_backward(*args, causal, precision, backward_tile=tile, seed=lq)


def _section_launches():
    """Forward launches whose work order the sections reorder: the default of each head dim
    on this device, the mma.sync tile, and on Hopper a warp-specialised persistent tile
    capped to 3 CTAs (each CTA walks many items across section boundaries)."""
    out = [("", 64), ("", 128), ("m64_n64_w4_s2", 64)]
    if HOPPER:
        out += [("wgmma_ws_pp_m128_n128_s2_ctas3", 128), ("wgmma_ws_pp_m192_n128_s2_ctas3", 64),
                ("wgmma_pp_m128_n128_s4", 64)]
    return out


@pytest.mark.parametrize("section", [1, 5, 0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("variant,D", _section_launches())
def test_l2_sections_forward(variant, D, causal, section):
    """12 (batch, head) pairs in sections of 1, 5 (5, 5, 2: the last one narrower) and one
    section, grouped queries, a ragged length: every tile written once and right."""
    q, k, v = qkv(3, 4, 300, D, torch.bfloat16, 77 + section, Hkv=2)
    check(q, k, v, causal, "bf16", variant, l2_section=section)


@pytest.mark.parametrize("section", [1, 5, 0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile,D", [(name, D) for name, t in BWD_TILES.items() for D in t.head_dims])
def test_l2_sections_backward(poisoned_grads, tile, D, causal, section):
    """The backward's key blocks in sections of 1, 5 (of 6 (batch, k/v head) pairs: the last
    section narrower) and one, grouped queries, ragged lengths."""
    if BWD_TILES[tile].math == BWD_WGMMA and not HOPPER:
        pytest.skip("wgmma tiles run only on compute capability 9.0")
    q, k, v = qkv(3, 4, 300, D, torch.bfloat16, 91 + section, Hkv=2)
    check_backward(q, k, v, causal, "bf16", backward_tile=tile, seed=section, l2_section=section)


def test_l2_section_refusals():
    q, k, v = qkv(1, 2, 64, 64, torch.bfloat16, 5)
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="l2_section"):
            flash_forward(q, k, v, False, l2_section=bad)
    torch.cuda.synchronize()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile,D", [(name, D) for name, t in BWD_TILES.items() for D in t.head_dims])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_backward_every_tile_after_the_mma_sync_forward(poisoned_grads, precision, tile, D, causal):
    """Each compiled backward tile, after the mma.sync forward (its LSE) on every device
    (a wgmma tile off Hopper: the refusal)."""
    args = qkv(2, 4, 1000, D, DTYPES[precision], 91, Hkv=2)
    if BWD_TILES[tile].math == BWD_WGMMA and not HOPPER:
        with pytest.raises(ValueError, match="uses wgmma"):
            check_backward(*args, causal, precision, variant=DEFAULT_TILE[(precision, D)], backward_tile=tile)
        return
    check_backward(*args, causal, precision, variant=DEFAULT_TILE[(precision, D)], backward_tile=tile, seed=91)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("tile,D", [(name, D) for name, t in BWD_TILES.items() for D in t.head_dims])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_deterministic_backward(poisoned_grads, precision, tile, D, causal):
    """The deterministic backward (dQ by its own pass, no atomics) through each tile: against
    float64 over MHA, GQA and MQA, ragged and cross lengths (key blocks no query sees, a
    single query or key), both layouts; and bit-identical gradients from a second run."""
    if BWD_TILES[tile].math == BWD_WGMMA and not HOPPER:
        pytest.skip("wgmma tiles run only on compute capability 9.0")
    dt = DTYPES[precision]
    for B, H, Hkv, lq, lk in ((2, 4, 4, 1000, 1000), (1, 8, 2, 300, 700), (2, 8, 1, 700, 100), (1, 4, 2, 1, 17),
                              (1, 4, 2, 17, 1)):
        seed = lq * 7 + lk
        check_backward(*qkv(B, H, lq, D, dt, seed, Hkv=Hkv, Lk=lk), causal, precision, backward_tile=tile, seed=seed,
                       deterministic=True)
    q, k, v = (make((2, 333, h, D), dt, 97 + h) for h in (4, 2, 2))
    check_backward(q, k, v, causal, precision, "blhd", backward_tile=tile, seed=97, deterministic=True)

    q, k, v = qkv(2, 8, 2048, D, dt, 99, Hkv=2)
    dout = make(q.shape, dt, 98)
    runs = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = flash_attention(*leaves, causal, backward_tile=tile, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two runs of the deterministic backward"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_backward_after_each_wgmma_schedule(poisoned_grads, precision, causal):
    """The LSE of both wgmma schedules feeds the backward (Hopper; elsewhere: the refusal)."""
    args = qkv(1, 4, 1000, 128, DTYPES[precision], 93, Hkv=2)
    for variant in ("wgmma_m128_n128_s2", "wgmma_pp_m128_n128_s3"):
        if not HOPPER:
            with pytest.raises(ValueError, match="wgmma"):
                check_backward(*args, causal, precision, variant=variant)
            continue
        check_backward(*args, causal, precision, variant=variant, seed=93)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32"])
def test_backward_cross_lengths(poisoned_grads, precision):
    """Lq != Lk, full and top-left causal (more keys than queries: key blocks no query sees)."""
    for lq, lk in ((100, 700), (700, 100), (1, 300), (300, 1)):
        for causal in (False, True):
            check_backward(*qkv(2, 4, lq, 64, DTYPES[precision], 95 + lq, Hkv=2, Lk=lk), causal, precision, seed=lq)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_backward_packed_qkv_views(precision):
    """q, k, v as (B, H, L, D) views of one packed (B, L, 3, H, D) leaf: the gradient lands in it."""
    dt = DTYPES[precision]
    B, L, H, D = 2, 515, 4, 64
    packed = make((B, L, 3, H, D), dt, 97).requires_grad_(True)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))
    dout = make((B, H, L, D), dt, 98)
    out = flash_attention(q, k, v, True, precision=precision if precision == "tf32" else None)
    (grad,) = torch.autograd.grad(out, packed, dout)
    refs = reference_grads(q, k, v, dout, True)
    for i, (name, r) in enumerate(zip(("dq", "dk", "dv"), refs)):
        err = grad_err(grad[:, :, i].transpose(1, 2), r)
        assert err <= GRAD_TOL[precision], f"{name}: {err:.3e}"


@pytest.mark.parametrize("L", [17, 1000])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_backward_pytorch_path(poisoned_grads, precision, D, causal, L):
    """fp32 (exact) and tf32 run the PyTorch backward from the saved LSE."""
    if precision == "tf32" and D == 256:
        q, k, v = qkv(1, 2, 8, D, torch.float32, 1)
        with pytest.raises(ValueError, match="no default for precision tf32 and head_dim 256"):
            check_backward(q, k, v, causal, precision)
        return
    seed = zlib.crc32(f"bwd-{precision}-{D}-{causal}-{L}".encode()) % 100_000
    errs = check_backward(*qkv(2, 4, L, D, torch.float32, seed, Hkv=2), causal, precision, seed=seed)
    if precision == "tf32":
        assert max(errs.values()) > 1e-6, f"tf32 backward as exact as fp32 ({errs}): did the forward run tf32?"


def test_backward_refusals():
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 64, 64, torch.bfloat16, 99))
    with pytest.raises(ValueError, match=r"built for head_dim \(256,\), not 64"):
        flash_attention(q, k, v, False, backward_tile="n64_m32_w8")
    with pytest.raises(ValueError, match="unknown custom backward tile"):
        flash_attention(q, k, v, False, backward_tile="nosuch")


def test_backward_kernels_have_no_local_memory():
    for name, tile in BWD_TILES.items():
        if tile.math == BWD_WGMMA and not HOPPER:
            continue
        for D in tile.head_dims:
            for precision in ("fp16", "bf16"):
                info = backward_kernel_info(precision, D, name)
                assert info["path"] == tile.math and info["local_bytes"] == 0, info
                assert info["max_ctas_per_sm"] >= 1, f"{name} d{D} {precision}: does not fit on an SM: {info}"


@pytest.mark.parametrize("precision,D,path", [("bf16", 64, None), ("fp16", 128, None),
                                              ("bf16", 256, BWD_MMA_SYNC), ("fp32", 64, BWD_TORCH_MATH)])
def test_fwd_bwd_cell_runs_ok(precision, D, path):
    """A fwd_bwd cell of custom through the job function: checked against float64, timed
    (in a CUDA graph), its record naming the backward path (None: the device's default,
    wgmma on Hopper at D64 and D128, mma.sync elsewhere)."""
    from flashwatt.kernels.custom_backward import backward_plan
    from flashwatt.attention.job import run_cell

    if path is None:
        expected = backward_plan(precision, D, capability=torch.cuda.get_device_capability())
        path = expected.path

    cell = Cell(suite="seed", kernel="custom", precision=precision, seq_len=512, batch=2, heads=4, head_dim=D,
                causal=True, pass_="fwd_bwd")
    settings = {"energy": False, "warmup_ms": 50, "min_repeats": 5, "min_time_ms": 50}
    rec = run_cell(cell, settings).record
    assert rec["status"] == "ok", rec.get("reason") or rec.get("traceback")
    assert rec["check"]["grad_rel_err"] <= TOLERANCE[precision]["grad"]
    assert rec["backward"]["path"] == path
    if path != BWD_TORCH_MATH:
        expected = backward_plan(precision, D, capability=torch.cuda.get_device_capability())
        assert rec["backward"]["tile"] == expected.tile_name and rec["backward"]["local_bytes"] == 0
    assert rec["timing"]["method"] == "cuda_graph", rec["timing"]


# ---------------------------------------------------------------- causal alignment

ALIGNS = ["top_left", "bottom_right"]
# (Lq, Lk): fewer queries than keys (chunked prefill, decoding: one query), more queries than
# keys (bottom-right: the first Lq - Lk see no key, whole query blocks of them included),
# lengths off every tile grid, and past 1024 keys (the persistent tiles' tile counter).
ALIGN_LENGTHS = [(1, 300), (100, 333), (333, 100), (300, 1), (64, 192), (200, 64), (130, 257), (700, 1500),
                 (1500, 700)]


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_alignment_forward(precision, D, align):
    """The default launch of each precision and head dim (tf32: d64 and d128) under both
    alignments: against float64 with an explicit mask, rows that see no key exactly 0 and
    their LSE -inf."""
    if precision == "tf32" and D == 256:
        pytest.skip("tf32 runs head dims 64 and 128")
    for lq, lk in ALIGN_LENGTHS:
        seed = zlib.crc32(f"align-{precision}-{D}-{align}-{lq}-{lk}".encode()) % 100_000
        check(*qkv(2, 3, lq, D, DTYPES[precision], seed, Lk=lk), True, precision, causal_align=align)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_alignments_agree_on_equal_lengths(precision):
    """With Lq == Lk both alignments are one mask: bit-identical outputs and LSE."""
    for L in (1, 77, 128, 1000):
        q, k, v = qkv(2, 4, L, 64, DTYPES[precision], 7 + L, Hkv=2)
        tl = flash_forward(q, k, v, True, precision=precision, causal_align="top_left")
        br = flash_forward(q, k, v, True, precision=precision, causal_align="bottom_right")
        assert torch.equal(tl[0], br[0]) and torch.equal(tl[1], br[1]), L
        leaves = [[t.detach().clone().requires_grad_(True) for t in (q, k, v)] for _ in range(2)]
        dout = make(q.shape, q.dtype, 99)
        p = precision if precision == "tf32" else None
        grads = [torch.autograd.grad(flash_attention(*lv, True, precision=p, causal_align=a, deterministic=True),
                                     lv, dout) for lv, a in zip(leaves, ALIGNS)]
        for a, b in zip(*grads):
            assert torch.equal(a, b), L


def _align_tile_cases():
    return [(name, D, precision) for name, tile in NON_FP8_TILES.items() for D in tile.head_dims
            for precision in tile.precisions[:1]]


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("tile,D,precision", _align_tile_cases())
def test_alignment_every_tile(tile, D, precision, align):
    """Every tile under both alignments (Hopper's wgmma tiles of every schedule: lockstep,
    ping-pong, warp-specialised with two and three consumers, TMA and thread copies, the tile
    counter and a fixed stride, a persistent grid of 3 CTAs), GQA, the blhd layout."""
    dt = DTYPES[precision]
    if TILES[tile].mma == WGMMA and not HOPPER:
        with pytest.raises(ValueError, match="wgmma"):
            flash_forward(*qkv(1, 1, 64, D, dt, 1), True, tile, causal_align=align)
        return
    persistent = TILES[tile].schedule in WS_SCHEDULES
    for lq, lk in ALIGN_LENGTHS:
        seed = zlib.crc32(f"align-tile-{tile}-{D}-{align}-{lq}-{lk}".encode()) % 100_000
        args = qkv(2, 4, lq, D, dt, seed, Hkv=2, Lk=lk)
        check(*args, True, precision, variant=tile, causal_align=align)
        if persistent:
            check(*args, True, precision, variant=f"{tile}_ctas3", causal_align=align, tma=False, tile_counter=True)
            check(*args, True, precision, variant=tile, causal_align=align, tile_counter=False)
    q, k, v = make((2, 333, 4, D), dt, 5), make((2, 100, 2, D), dt, 6), make((2, 100, 2, D), dt, 7)
    check(q, k, v, True, precision, variant=tile, layout="blhd", causal_align=align)
    check(q[:, :100], k, v, True, precision, variant=tile, layout="blhd", causal_align=align)


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("Hkv", [1, 2])
@pytest.mark.parametrize("precision", ["fp16", "bf16", "fp32", "tf32"])
def test_alignment_gqa(precision, Hkv, align):
    for lq, lk in ((777, 300), (300, 777)):
        check(*qkv(2, 8, lq, 128, DTYPES[precision], 31 + Hkv + lq, Hkv=Hkv, Lk=lk), True, precision,
              causal_align=align)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "dq-pass"])
@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_alignment_backward(poisoned_grads, precision, D, align, deterministic):
    """The CUDA backward (the device's default tile) under both alignments, with dQ by atomics
    and by the deterministic pass: MHA, GQA and MQA, both layouts, dQ of rows that see no
    key exactly 0."""
    dt = DTYPES[precision]
    for lq, lk in ALIGN_LENGTHS:
        for H, Hkv in ((4, 4), (8, 2), (8, 1)):
            seed = zlib.crc32(f"align-bwd-{precision}-{D}-{align}-{lq}-{lk}-{Hkv}".encode()) % 100_000
            check_backward(*qkv(1, H, lq, D, dt, seed, Hkv=Hkv, Lk=lk), True, precision, seed=seed,
                           deterministic=deterministic, causal_align=align)
    q, k, v = make((2, 333, 4, D), dt, 97), make((2, 100, 2, D), dt, 98), make((2, 100, 2, D), dt, 99)
    check_backward(q, k, v, True, precision, "blhd", seed=97, deterministic=deterministic, causal_align=align)


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("tile,D", [(name, D) for name, t in BWD_TILES.items() for D in t.head_dims])
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_alignment_backward_every_tile(poisoned_grads, precision, tile, D, align):
    """Each backward tile (wgmma on Hopper) under both alignments, after the mma.sync and the
    default forward, with atomics and with the deterministic dQ pass (bit-identical twice)."""
    if BWD_TILES[tile].math == BWD_WGMMA and not HOPPER:
        pytest.skip("wgmma tiles run only on compute capability 9.0")
    dt = DTYPES[precision]
    for lq, lk in ALIGN_LENGTHS:
        seed = zlib.crc32(f"align-bwdtile-{tile}-{D}-{align}-{lq}-{lk}".encode()) % 100_000
        args = qkv(1, 4, lq, D, dt, seed, Hkv=2, Lk=lk)
        for deterministic in (False, True):
            check_backward(*args, True, precision, backward_tile=tile, seed=seed, deterministic=deterministic,
                           causal_align=align)
        check_backward(*args, True, precision, variant=DEFAULT_TILE[(precision, D)], backward_tile=tile, seed=seed,
                       causal_align=align)
    q, k, v = qkv(2, 8, 1500, D, dt, 3, Hkv=2, Lk=700)
    dout = make(q.shape, dt, 4)
    runs = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = flash_attention(*leaves, True, backward_tile=tile, deterministic=True, causal_align=align)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two runs of the deterministic backward"


@pytest.mark.parametrize("align", ALIGNS)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_alignment_backward_pytorch_path(poisoned_grads, precision, D, align):
    """fp32 and tf32: the PyTorch backward from the saved LSE, whose -inf rows give P = 0."""
    if precision == "tf32" and D == 256:
        pytest.skip("tf32 runs head dims 64 and 128")
    for lq, lk in ((100, 333), (333, 100), (300, 1), (1, 300)):
        seed = zlib.crc32(f"align-math-{precision}-{D}-{align}-{lq}-{lk}".encode()) % 100_000
        check_backward(*qkv(2, 4, lq, D, torch.float32, seed, Hkv=2, Lk=lk), True, precision, seed=seed,
                       causal_align=align)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_bottom_right_matches_sdpa_causal_lower_right(precision):
    """Against torch's own bottom-right mask (causal_lower_right) where a backend of SDPA runs
    it, on the rows that see a key (torch may give NaN on the others), forward and backward."""
    from torch.nn.attention.bias import causal_lower_right

    dt = DTYPES[precision]
    compared = 0
    for lq, lk in ((100, 333), (1, 300), (64, 192), (333, 100), (700, 1500)):
        q, k, v = qkv(2, 4, lq, 64, dt, lq + lk)
        dout = make(q.shape, dt, 5)
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        ours = flash_attention(*leaves, True, causal_align="bottom_right")
        ours_grads = torch.autograd.grad(ours, leaves, dout)
        sdpa_leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch warns of NaN rows where Lq > Lk
                theirs = F.scaled_dot_product_attention(*sdpa_leaves, attn_mask=causal_lower_right(lq, lk))
                theirs_grads = torch.autograd.grad(theirs, sdpa_leaves, dout)
        except RuntimeError:
            continue  # no SDPA backend for this case
        seen = visible_keys(lq, lk, "bottom_right").any(-1)  # rows that see a key
        if not all(torch.isfinite(t).all() for t in (theirs[:, :, seen], *theirs_grads[1:])):
            continue  # this backend's NaN rows reached its dK and dV
        tol = TOL[precision]
        assert ((ours - theirs)[:, :, seen].norm() / theirs[:, :, seen].norm()).item() <= tol, (lq, lk)
        # Each against float64: gradients this small (one row over 300 keys) sit in fp16's
        # subnormals, where ours and torch's differ from each other more than from the truth.
        refs = reference_grads(q, k, v, dout, True, causal_align="bottom_right")
        for name, a, b, r in zip(("dq", "dk", "dv"), ours_grads, theirs_grads, refs):
            a, b, r = (a[:, :, seen], b[:, :, seen], r[:, :, seen]) if name == "dq" else (a, b, r)
            ours_err, theirs_err = grad_err(a, r), grad_err(b, r)
            assert ours_err <= max(2 * GRAD_TOL[precision], 1.5 * theirs_err), (name, lq, lk, ours_err, theirs_err)
        compared += 1
    assert compared, "SDPA ran none of the cases"


def test_alignment_refusals():
    """An unknown alignment is refused before any launch, with or without a mask and a gradient."""
    q, k, v = qkv(1, 2, 64, 64, torch.bfloat16, 5, Lk=32)
    for bad in ("lower_right", "bottom-right", None):
        for causal in (True, False):
            with pytest.raises(ValueError, match=r"causal_align must be one of 'top_left', 'bottom_right'"):
                flash_forward(q, k, v, causal, causal_align=bad)
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            with pytest.raises(ValueError, match="causal_align"):
                flash_attention(*leaves, causal, causal_align=bad)
    torch.cuda.synchronize()


# ---------------------------------------------------------------- memory checker (last: slowest)

_SANITIZER_SCRIPT = textwrap.dedent(
    """
    import torch
    from flashwatt.kernels.custom import flash_forward
    hopper = torch.cuda.get_device_capability() == (9, 0)
    cases = [(torch.float16, 64, "", None), (torch.bfloat16, 128, "m64_n64_w4_s2_sm1", None),
             (torch.float32, 64, "", None), (torch.float32, 128, "", "tf32")]
    if hopper:
        cases += [(torch.bfloat16, 128, "wgmma_m128_n128_s2", None), (torch.float16, 64, "wgmma_m128_n64_s3_sm1", None),
                  (torch.bfloat16, 128, "wgmma_pp_m128_n64_s4", None), (torch.float16, 64, "wgmma_pp_m128_n128_s3_sm1", None),
                  (torch.bfloat16, 128, "wgmma_ws_pp_m128_n128_s2", None), (torch.bfloat16, 64, "wgmma_ws_pp_m192_n128_s2", None),
                  (torch.float16, 64, "wgmma_ws_m192_n128_s2_ctas1", None)]
    for dtype, D, variant, precision in cases:
        for causal in (False, True):
            for tma in ((True, False) if "_ws_" in variant else (None,)):  # both copies of a persistent tile
                q = torch.randn(1, 2, 77, D, device="cuda", dtype=dtype)
                k = torch.randn(1, 1, 77, D, device="cuda", dtype=dtype)
                v = torch.randn(1, 1, 77, D, device="cuda", dtype=dtype)
                out, lse = flash_forward(q, k, v, causal, variant, precision=precision, tma=tma)
                torch.cuda.synchronize()
        # Bottom-right alignment: query blocks whose rows see no key (130 queries, 40 keys) and
        # more keys than queries.
        for lq, lk in ((130, 40), (40, 130)):
            for tma in ((True, False) if "_ws_" in variant else (None,)):
                q = torch.randn(1, 2, lq, D, device="cuda", dtype=dtype)
                k = torch.randn(1, 1, lk, D, device="cuda", dtype=dtype)
                v = torch.randn(1, 1, lk, D, device="cuda", dtype=dtype)
                flash_forward(q, k, v, True, variant, precision=precision, tma=tma, causal_align="bottom_right")
                torch.cuda.synchronize()
    # L2 sections of 2 of 5 (batch, head) pairs (the last narrower), the defaults and a persistent grid of 3.
    for variant in ("", "ctas3"):
        for causal in (False, True):
            q, k, v = (torch.randn(5, 1, 200, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            flash_forward(q, k, v, causal, variant, l2_section=2)
            torch.cuda.synchronize()
    # The backward: every CUDA tile, GQA, ragged lengths, and the PyTorch path.
    from flashwatt.kernels.custom_autograd import flash_attention
    from flashwatt.kernels.custom_backward import BWD_TILES
    bwd_cases = [(dtype, D, tile) for dtype in (torch.float16, torch.bfloat16)
                 for tile, t in BWD_TILES.items() for D in t.head_dims
                 if hopper or t.math != "wgmma"] + [(torch.float32, 64, None)]
    for dtype, D, tile in bwd_cases:
        for causal in (False, True):
            for lq, lk in ((77, 77), (40, 130), (130, 40)):
                for deterministic in (False, True):  # the dQ atomics, or the dQ pass
                    for align in (("top_left", "bottom_right") if causal and lq != lk else ("top_left",)):
                        q = torch.randn(1, 4, lq, D, device="cuda", dtype=dtype, requires_grad=True)
                        k = torch.randn(1, 2, lk, D, device="cuda", dtype=dtype, requires_grad=True)
                        v = torch.randn(1, 2, lk, D, device="cuda", dtype=dtype, requires_grad=True)
                        out = flash_attention(q, k, v, causal, backward_tile=tile, l2_section=1,
                                              deterministic=deterministic, causal_align=align)
                        torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
                        torch.cuda.synchronize()
    print("SANITIZER_SCRIPT_DONE")
    """
)


def run_memcheck(script: str) -> None:
    """Run `script` (which prints SANITIZER_SCRIPT_DONE at its end) under compute-sanitizer's
    memcheck, the extension built first outside it (same cache, inherited env); fail on any
    error it reports or a script that did not finish."""
    from flashwatt.build import load_extension

    load_extension()
    tool = shutil.which("compute-sanitizer") or "/usr/local/cuda/bin/compute-sanitizer"
    if not Path(tool).exists():
        pytest.fail("compute-sanitizer not found on PATH nor in /usr/local/cuda/bin")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")])
    proc = subprocess.run(
        [tool, "--tool", "memcheck", "--error-exitcode", "3", sys.executable, "-c", script],
        capture_output=True, text=True, env=env, timeout=600,
    )
    text = proc.stdout + proc.stderr
    assert "SANITIZER_SCRIPT_DONE" in text, text[-4000:]
    assert proc.returncode == 0 and "ERROR SUMMARY: 0 errors" in text, text[-4000:]


def test_compute_sanitizer_memcheck():
    run_memcheck(_SANITIZER_SCRIPT)
