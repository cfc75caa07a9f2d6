"""The causal mask's two alignments (flashwatt.kernels.custom_mask) without a GPU: the mask
against torch's own causal biases, the argument's refusals, and the forward kernels' tiled
algorithm emulated in float64 under both alignments.

`tiled_forward` below follows the forward kernels' bounds (kernels/tile_schedule.cuh,
kernels/causal_mask.cuh): the K/V tiles a query block visits, which tiles take the mask
branch (per CTA on mma.sync, per warp on tf32 and wgmma, none in the wgmma kernels' clean
loop), the three-consumer kernel's end-aligned blocks and own tiles per warpgroup (a half
width last tile), the online softmax in which a row may see no key, and the epilogue. A
bound that skips a visible key, or a tile left unmasked that needed the mask, shows here
against float64 attention with an explicit boolean mask.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from torch.nn.attention.bias import causal_lower_right, causal_upper_left

from flashwatt.kernels import custom_forward
from flashwatt.kernels.custom_mask import (
    CAUSAL_ALIGNS, CAUSAL_BOTTOM_RIGHT, CAUSAL_TOP_LEFT, causal_offset, causal_visible, check_causal_align,
)
from flashwatt.kernels.custom_variants import FFMA, MMA_SYNC, MMA_TF32, TILES, WGMMA, WS_SCHEDULES

LENGTHS = [(1, 1), (5, 5), (64, 64), (130, 130), (1, 300), (300, 1), (100, 333), (333, 100), (200, 64), (64, 200),
           (700, 500), (500, 700)]  # the last two: the wgmma kernels' clean loop under either offset


# ---------------------------------------------------------------- the mask

@pytest.mark.parametrize("Lq,Lk", LENGTHS)
def test_the_masks_are_torchs_causal_biases(Lq, Lk):
    """top_left is torch's causal_upper_left (is_causal=True), bottom_right its
    causal_lower_right; with equal lengths they are one mask."""
    with warnings.catch_warnings():  # torch warns that rows without a key give NaN in some backends
        warnings.simplefilter("ignore")
        lower_right = causal_lower_right(Lq, Lk)._materialize("cpu")
    assert torch.equal(causal_visible(Lq, Lk, CAUSAL_TOP_LEFT), causal_upper_left(Lq, Lk)._materialize("cpu"))
    assert torch.equal(causal_visible(Lq, Lk, CAUSAL_BOTTOM_RIGHT), lower_right)
    assert torch.equal(causal_visible(Lq, Lk), causal_visible(Lq, Lk, CAUSAL_TOP_LEFT))  # the default
    if Lq == Lk:
        assert torch.equal(causal_visible(Lq, Lk, CAUSAL_TOP_LEFT), causal_visible(Lq, Lk, CAUSAL_BOTTOM_RIGHT))
    # Bottom-right: the last query sees every key; with more queries than keys the first
    # Lq - Lk see none.
    visible = causal_visible(Lq, Lk, CAUSAL_BOTTOM_RIGHT)
    assert visible[-1].all()
    assert (visible.any(-1) == (torch.arange(Lq) >= Lq - Lk)).all()


def test_offsets_and_refusals():
    assert causal_offset(CAUSAL_TOP_LEFT, 100, 300) == 0 and causal_offset(CAUSAL_BOTTOM_RIGHT, 100, 300) == 200
    assert causal_offset(CAUSAL_BOTTOM_RIGHT, 300, 100) == -200 and causal_offset(CAUSAL_BOTTOM_RIGHT, 7, 7) == 0
    assert CAUSAL_ALIGNS == ("top_left", "bottom_right")
    assert all(check_causal_align(a) == a for a in CAUSAL_ALIGNS)
    for bad in ("bottom-right", "lower_right", "TOP_LEFT", "", None, 0, True):
        with pytest.raises(ValueError, match=r"causal_align must be one of 'top_left', 'bottom_right', got"):
            check_causal_align(bad)
        with pytest.raises(ValueError, match="causal_align"):
            causal_offset(bad, 3, 4)


def test_flash_forward_refuses_an_unknown_alignment_before_any_launch(monkeypatch):
    """Checked with the other arguments, with or without a mask, before the extension loads."""
    import flashwatt.build

    def no_launch():
        raise AssertionError("the extension was loaded for a call that should have been refused")

    monkeypatch.setattr(custom_forward, "check_inputs", lambda q, k, v: None)
    monkeypatch.setattr(flashwatt.build, "load_extension", no_launch)
    q = torch.zeros(1, 1, 4, 64)
    for causal in (True, False):
        with pytest.raises(ValueError, match=r"causal_align must be one of 'top_left', 'bottom_right', got 'lower'"):
            custom_forward.flash_forward(q, q, q, causal, causal_align="lower")


# ---------------------------------------------------------------- the forward's tiled algorithm

def reference(q, k, v, causal, causal_align, scale):
    """float64 attention of one head with an explicit boolean mask: (out, natural-log LSE),
    a query that sees no key giving 0 and -inf."""
    s = (q @ k.T) * scale
    if causal:
        Lq, Lk = s.shape
        offset = Lk - Lq if causal_align == "bottom_right" else 0  # written out: checks causal_offset
        s = s.masked_fill(torch.arange(Lk)[None, :] > torch.arange(Lq)[:, None] + offset, -math.inf)
    lse = torch.logsumexp(s, -1)
    empty = torch.isneginf(lse)[:, None]
    return torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0) @ v, lse


def rows_of(t, r0, n):
    """Rows r0 .. r0 + n - 1 of t, zero outside [0, len(t)) (the kernels' zero fill)."""
    tile = torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype)
    lo, hi = max(r0, 0), min(r0 + n, t.shape[0])
    if hi > lo:
        tile[lo - r0:hi - r0] = t[lo:hi]
    return tile


def kernel_kind(tile) -> str:
    """Which forward kernel's structure a tile runs (kernels/flash_fwd*.cu*)."""
    if tile.mma == MMA_SYNC:
        return "mma.sync"  # the mask test per CTA, on every tile
    if tile.mma in (MMA_TF32, FFMA):
        return "per warp"  # tf32: the mask test per warp, on every tile (fp32 masks every element)
    if tile.schedule in WS_SCHEDULES and tile.block_m == 192:
        return "three consumers"
    return "wgmma"  # tile 0 masked, a clean loop, then the mask test per warp


def tiled_forward(q, k, v, causal, scale, BM, BN, kind, offset):
    """The forward kernels' bounds and online softmax on one head in float64 (module
    docstring), a warpgroup's 64 rows at a time, each warp's 16 deciding on the mask alone."""
    Lq, Lk, D = q.shape[0], k.shape[0], q.shape[1]
    out, lse = torch.full((Lq, D), math.nan, dtype=torch.float64), torch.full((Lq,), math.nan, dtype=torch.float64)
    kv_end = lambda row_end: max(0, min(Lk, row_end + offset)) if causal else Lk  # noqa: E731 (causal_kv_end)
    end_aligned = kind == "three consumers" and causal
    num_mb = -(-Lq // BM)
    warp_row0 = torch.arange(4).repeat_interleave(16) * 16  # of each of a warpgroup's rows, within it
    for mb in range(num_mb):
        m0 = Lq - (num_mb - mb) * BM if end_aligned else mb * BM
        n_tiles = max(1, -(-kv_end(m0 + BM) // BN))
        n_clean = min(n_tiles, kv_end(m0 + 1) // BN)
        for wg in range(BM // 64):
            tiles = [(j, BN) for j in range(n_tiles)]
            if kind == "three consumers":  # this warpgroup's own tiles, the last maybe half
                wg_row0 = m0 + wg * 64
                end = 0 if wg_row0 >= Lq or wg_row0 + 64 <= 0 else kv_end(wg_row0 + 64)
                nw = -(-end // BN)
                half_last = nw > 0 and end - (nw - 1) * BN <= BN // 2
                tiles = [(j, BN // 2 if half_last and j == nw - 1 else BN) for j in range(nw)]
                n_clean = min(nw, kv_end(m0 + 1) // BN)
            rows = m0 + wg * 64 + torch.arange(64)
            warp0 = wg * 64 + warp_row0  # each row's warp's first row within the block
            Q = rows_of(q, m0 + wg * 64, 64)
            m = torch.full((64,), -math.inf, dtype=torch.float64)
            l, o = torch.zeros(64, dtype=torch.float64), torch.zeros(64, D, dtype=torch.float64)
            for j, W in tiles:
                n0 = j * BN
                K, V = rows_of(k, n0, W), rows_of(v, n0, W)
                s = Q @ K.T
                if kind == "mma.sync":  # one test for the CTA
                    masked = torch.full((64,), n0 + W > Lk or (causal and n0 + W - 1 > m0 + offset))
                else:  # one per warp; in the wgmma kernels' clean loop, none at all
                    masked = (n0 + W > Lk) | (causal & (n0 + W - 1 > m0 + offset + warp0))
                    if kind in ("wgmma", "three consumers") and 1 <= j < n_clean:
                        masked = torch.zeros(64, dtype=torch.bool)
                col = n0 + torch.arange(W)[None, :]
                hidden = (col >= Lk) | ((col > rows[:, None] + offset) & causal)
                s = s.masked_fill(masked[:, None] & hidden, -math.inf)
                m_new = torch.maximum(m, s.max(-1).values * scale)
                m_sub = torch.where(torch.isneginf(m_new), 0.0, m_new)  # online_softmax_row
                p = torch.exp(s * scale - m_sub[:, None])
                alpha = torch.exp(m - m_sub)
                m, l, o = m_new, l * alpha + p.sum(-1), o * alpha[:, None] + p @ V
            stored = (rows >= 0) & (rows < Lq)  # the epilogue: inv 0 and LSE -inf without a key
            out[rows[stored]] = (o * torch.where(l > 0, 1 / l, 0.0)[:, None])[stored]
            lse[rows[stored]] = torch.where(l > 0, m + torch.log(l), -math.inf)[stored]
    return out, lse


def _shapes():
    """One case per distinct (block_m, block_n, kernel) of TILES, named by a tile."""
    seen = {}
    for name, tile in TILES.items():
        seen.setdefault((tile.block_m, tile.block_n, kernel_kind(tile)), name)
    return sorted(seen.values())


@pytest.mark.parametrize("align", CAUSAL_ALIGNS)
@pytest.mark.parametrize("tile", _shapes())
def test_tiled_forward_matches_float64(tile, align):
    t = TILES[tile]
    kind = kernel_kind(t)
    for Lq, Lk in LENGTHS:
        g = torch.Generator().manual_seed(Lq * 1000 + Lk)
        q, k, v = (torch.randn(L, 8, generator=g, dtype=torch.float64) for L in (Lq, Lk, Lk))
        for causal in (False, True):
            offset = causal_offset(align, Lq, Lk) if causal else 0
            out, lse = tiled_forward(q, k, v, causal, 0.3, t.block_m, t.block_n, kind, offset)
            ref, ref_lse = reference(q, k, v, causal, align, 0.3)
            case = (Lq, Lk, causal)
            assert not out.isnan().any() and not lse.isnan().any(), f"{case}: rows not written"
            assert torch.allclose(out, ref, rtol=1e-10, atol=1e-12), case
            assert torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)), case
            finite = torch.isfinite(ref_lse)
            assert torch.allclose(lse[finite], ref_lse[finite], rtol=1e-12), case
            if causal and align == "bottom_right" and Lq > Lk:  # rows that see no key: exactly 0
                assert torch.count_nonzero(out[:Lq - Lk]) == 0 and torch.isneginf(lse[:Lq - Lk]).all(), case


# ---------------------------------------------------------------- the argument reaches the kernels

class _FakeExtension:
    """Records the launches flash_forward and flash_backward ask of the compiled extension."""
    CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT = 10, 11  # distinct from bools, so a swap shows
    MATH_MMA_SYNC, MATH_WGMMA, MATH_FFMA, MATH_MMA_TF32 = 0, 1, 2, 3
    SCHEDULE_LOCKSTEP, SCHEDULE_PING_PONG, SCHEDULE_WARP_SPECIALIZED, SCHEDULE_WARP_SPECIALIZED_PING_PONG = 0, 1, 2, 3

    def __init__(self):
        self.calls = []

    def forward(self, *args):
        self.calls.append(("forward", args))

    def backward(self, *args):
        self.calls.append(("backward", args))


@pytest.fixture
def fake_extension(monkeypatch):
    from types import SimpleNamespace

    import flashwatt.build
    from flashwatt.kernels import custom_backward

    ext = _FakeExtension()
    props = SimpleNamespace(major=8, minor=0, multi_processor_count=108, L2_cache_size=40 << 20)
    monkeypatch.setattr(flashwatt.build, "load_extension", lambda: ext)
    monkeypatch.setattr(custom_forward, "check_inputs", lambda q, k, v: None)
    monkeypatch.setattr(custom_forward, "capability", lambda device: (8, 0))
    monkeypatch.setattr(custom_forward, "device_properties", lambda device: props)
    monkeypatch.setattr(custom_backward, "device_properties", lambda device: props)
    return ext


@pytest.mark.parametrize("align", CAUSAL_ALIGNS)
def test_the_alignment_reaches_both_launches(fake_extension, align):
    """flash_forward and flash_backward pass the extension the alignment's code right after
    the causal flag (kernels/flash_binding.cpp: forward(..., causal, causal_align, scale, ..),
    backward(..., causal, causal_align, scale, ..)); top-left by default."""
    from flashwatt.kernels.custom_backward import backward_plan, flash_backward

    code = {CAUSAL_TOP_LEFT: _FakeExtension.CAUSAL_TOP_LEFT, CAUSAL_BOTTOM_RIGHT: _FakeExtension.CAUSAL_BOTTOM_RIGHT}
    q, k = torch.zeros(1, 2, 40, 64, dtype=torch.bfloat16), torch.zeros(1, 1, 130, 64, dtype=torch.bfloat16)
    custom_forward.flash_forward(q, k, k, True, causal_align=align)
    custom_forward.flash_forward(q, k, k, True)
    (_, fwd), (_, fwd_default) = fake_extension.calls
    assert fwd[5] is True and fwd[6] == code[align] and fwd[7] == pytest.approx(1 / 8)
    assert fwd_default[6] == _FakeExtension.CAUSAL_TOP_LEFT
    lse = torch.zeros(1, 2, 40)
    flash_backward(q, q, k, k, q, lse, True, 0.125, backward_plan("bf16", 64), causal_align=align)
    _, bwd = fake_extension.calls[-1]
    assert bwd[11] is True and bwd[12] == code[align] and bwd[13] == 0.125


# ---------------------------------------------------------------- the three consumers' turns

def c_div(a: int, b: int) -> int:
    """C's integer division (toward zero), as the kernels divide."""
    q = abs(a) // b
    return q if a >= 0 else -q


def three_consumer_protocol(n_tiles: int, nw: int, half_last: bool):
    """The K and V slots a consumer warpgroup of kernels/flash_fwd_wgmma_ws.cuh releases for
    one work item, and how many turns it takes, written out from its code: its own nw tiles
    (first, the steps, the last P V), then the tiles it does not read."""
    k_released, v_released, turns = [], [], 0
    if nw > 0:
        k_released.append(0)  # first
        turns += 1
        for j in range(1, nw):  # the steps, the last maybe at half width
            k_released.append(j)
            v_released.append(j - 1)
            turns += 1
        v_released.append(nw - 1)  # last_pv
        turns += 1
    if nw > 0 and nw < n_tiles:
        k_released.append(nw)
    for k in range(nw + 1 if nw > 0 else 0, n_tiles + 1):
        if k < n_tiles:
            k_released.append(k)
        if k > 0:
            v_released.append(k - 1)
        turns += 1
    return k_released, v_released, turns


@pytest.mark.parametrize("align", CAUSAL_ALIGNS)
def test_three_consumers_release_every_slot_once(align):
    """Whatever a warpgroup's share of an item (all, some, none: rows before 0 or, bottom-right,
    rows that see no key, where its key end and nw go below 0), it releases each K and V slot
    of the item exactly once and takes n_tiles + 1 turns, as the producer and the other
    consumers count (a slot released twice or a turn missing deadlocks the CTA)."""
    tiles = [t for t in TILES.values() if t.schedule in WS_SCHEDULES and t.block_m == 192]
    assert tiles
    for t in tiles:
        BM, BN = t.block_m, t.block_n
        for Lq, Lk in LENGTHS + [(1500, 700), (700, 1500), (2000, 100)]:
            offset = causal_offset(align, Lq, Lk)
            num_mb = -(-Lq // BM)
            for mb in range(num_mb):
                m0 = Lq - (num_mb - mb) * BM  # end-aligned blocks (causal)
                kv_end = min(Lk, m0 + BM + offset)
                n_tiles = c_div(kv_end - 1, BN) + 1 if kv_end > 0 else 1  # TileGrid, END_ALIGNED
                for cw in range(3):
                    wg_row0 = m0 + cw * 64
                    end = 0 if wg_row0 >= Lq or wg_row0 + 64 <= 0 else min(Lk, wg_row0 + 64 + offset)
                    nw = c_div(end + BN - 1, BN)
                    half_last = nw > 0 and end - (nw - 1) * BN <= BN // 2
                    k_rel, v_rel, turns = three_consumer_protocol(n_tiles, nw, half_last)
                    case = (Lq, Lk, mb, cw, n_tiles, nw)
                    assert sorted(k_rel) == list(range(n_tiles)) == sorted(v_rel), case
                    assert turns == n_tiles + 1 and nw <= n_tiles, case
