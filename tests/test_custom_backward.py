"""The custom kernel's backward without a GPU: the choice of path, the PyTorch path, the
autograd wiring, and the CUDA kernel's tiled algorithm emulated in float64.

`tiled_backward` below follows kernels/flash_bwd.cu loop for loop (key blocks per CTA,
the first query block under the causal mask, the query heads of a GQA group, which
blocks take the mask branch, P from the natural-log LSE in base 2, dQ accumulated across
key blocks, the scale applied at the end), and `tiled_dq_pass` the deterministic dQ pass
(kernels/flash_bwd_dq.cuh), so a wrong bound or convention in that design shows here,
against autograd through float64 attention, under both alignments of the causal mask
(kernels/causal_mask.cuh), rows that see no key included.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.kernels import custom, custom_autograd, custom_backward
from flashwatt.kernels.custom import Custom
from flashwatt.kernels.custom_backward import (
    BWD_MMA_SYNC, BWD_TILES, BWD_TORCH_MATH, BWD_WGMMA, DEFAULT_BWD_TILE, BwdTile, backward_plan,
    math_backward_from_lse,
)

KERNELS = Path(__file__).resolve().parents[1] / "kernels"
LOG2E = 1.4426950408889634
# (causal, causal_align) of the masks the tests run: none, and causal in either alignment.
MASKS = {"full": (False, "top_left"), "causal": (True, "top_left"), "causal_br": (True, "bottom_right")}


def diagonal_offset(causal_align, Lq, Lk):
    """Key j visible to query i iff j <= i + this; written out here rather than taken from
    flashwatt.kernels.custom_mask, so that the references check it."""
    return Lk - Lq if causal_align == "bottom_right" else 0


def attention64(q, k, v, causal, scale, causal_align="top_left"):
    """float64 attention and its natural-log LSE on (B, H, L, D), k/v heads repeated for
    groups, masked by an explicit boolean mask; a query that sees no key gets an output of 0
    (and no gradient) and an LSE of -inf."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        Lq, Lk = s.shape[-2:]
        visible = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + diagonal_offset(causal_align, Lq, Lk)
        s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    # Placeholder scores in rows without a key keep the softmax (and its gradient) finite.
    empty = torch.isneginf(lse)[..., None]
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return torch.matmul(p, v), lse


def inputs(B, H, Hkv, Lq, Lk, D, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, Lq, D, generator=g, dtype=dtype)
    k = torch.randn(B, Hkv, Lk, D, generator=g, dtype=dtype)
    v = torch.randn(B, Hkv, Lk, D, generator=g, dtype=dtype)
    dout = torch.randn(B, H, Lq, D, generator=g, dtype=dtype)
    return q, k, v, dout


def autograd_reference(q, k, v, dout, causal, scale, causal_align="top_left"):
    q, k, v = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out, _ = attention64(q, k, v, causal, scale, causal_align)
    return torch.autograd.grad(out, (q, k, v), dout.double())


def lse_log2_for_p(lse):
    """kernels/causal_mask.cuh: a row that sees no key (LSE -inf) as +inf, so its P is 0."""
    return torch.where(torch.isneginf(lse), math.inf, lse * LOG2E)


def rel(x, ref):
    """||x - ref|| / ||ref||, or the absolute ||x|| where ref is exactly zero (dQ of a
    query that sees one key)."""
    err = (x.double() - ref).norm()
    return (err / ref.norm() if ref.norm() > 0 else err).item()


def tile_rows(t, r0, n, end):
    """Rows r0 .. r0 + n - 1 of t, zero past `end` (the kernels' cp.async zero fill)."""
    tile = torch.zeros((n,) + tuple(t.shape[1:]), dtype=t.dtype)
    valid = max(0, min(n, end - r0))
    tile[:valid] = t[r0:r0 + valid]
    return tile


def flat_rows(t, b, h, r0, n, lead=4):
    """Rows r0 .. r0 + n - 1 of head (b, h) of a (B, H, L) array as the warp-specialised tile
    copies LSE and delta: a box of n + lead values of a 1-d map over the flat B * H * L values,
    from the 16-byte aligned element (a multiple of lead) at or below the block's first row,
    read from the block's first row on; past L the next head's values, past the last head
    zeros."""
    assert r0 % lead == 0, "a query block starts at a multiple of the lead within its head"
    flat = t.reshape(-1)
    head0 = (b * t.shape[1] + h) * t.shape[2]
    box = tile_rows(flat, (head0 + r0) // lead * lead, n + lead, flat.numel())
    skip = head0 % lead  # kernels/flash_bwd_wgmma_ws.cuh: `lead`
    return box[skip:skip + n]


def tiled_backward(dout, q, k, v, out, lse, causal, scale, block_n, block_m, warps_per_keys=1, offset=0,
                   flat_lse_rows=False):
    """kernels/flash_bwd.cu in float64: preprocess, one 'CTA' per (key block, batch, k/v
    head) walking (query head, query block) steps, then the dQ conversion. warps_per_keys
    (KS): S^T and dP^T as the sum of KS partial products over slices of the head dim, dK
    and dV accumulated slice by slice, as the warps sharing 16 keys compute them. offset:
    BwdParams::causal_offset (key j visible to query i iff j <= i + offset). flat_lse_rows:
    a query block's LSE and delta as the warp-specialised tile copies them (`flat_rows`),
    not zero-filled past len_q."""
    B, H, Lq, D = q.shape
    slices = [slice(c * D // warps_per_keys, (c + 1) * D // warps_per_keys) for c in range(warps_per_keys)]
    Hkv, Lk = k.shape[1], k.shape[2]
    group = H // Hkv
    BN, BM = block_n, block_m
    rows = tile_rows
    delta = (dout * out).sum(-1)  # preprocess
    dq_accum = torch.zeros(B, H, Lq, D, dtype=torch.float64)
    dk, dv = torch.full_like(k, math.nan), torch.full_like(v, math.nan)
    num_mb = (Lq + BM - 1) // BM
    for nb in range((Lk + BN - 1) // BN):
        for b in range(B):
            for hk in range(Hkv):
                n0 = nb * BN
                mb_first = min(max(0, n0 - offset) // BM, num_mb) if causal else 0
                mb_count = num_mb - mb_first
                Kt, Vt = rows(k[b, hk], n0, BN, Lk), rows(v[b, hk], n0, BN, Lk)
                dk_acc = torch.zeros(BN, D, dtype=torch.float64)
                dv_acc = torch.zeros(BN, D, dtype=torch.float64)
                for it in range(group * mb_count):
                    h = hk * group + it // mb_count
                    m0 = (mb_first + it % mb_count) * BM
                    Qt, dOt = rows(q[b, h], m0, BM, Lq), rows(dout[b, h], m0, BM, Lq)
                    if flat_lse_rows:
                        lse_t, delta_t = flat_rows(lse, b, h, m0, BM), flat_rows(delta, b, h, m0, BM)
                    else:
                        lse_t, delta_t = rows(lse[b, h], m0, BM, Lq), rows(delta[b, h], m0, BM, Lq)
                    sT = sum(Kt[:, c] @ Qt[:, c].T for c in slices)  # keys x queries
                    if n0 + BN > Lk or m0 + BM > Lq or (causal and n0 + BN - 1 > m0 + offset):
                        key = n0 + torch.arange(BN)[:, None]
                        query = m0 + torch.arange(BM)[None, :]
                        hidden = (key >= Lk) | (query >= Lq) | ((key > query + offset) & causal)
                        sT = sT.masked_fill(hidden, -math.inf)
                    pT = torch.exp2(sT * (scale * LOG2E) - lse_log2_for_p(lse_t)[None, :])
                    dpT = sum(Vt[:, c] @ dOt[:, c].T for c in slices)
                    dsT = pT * (dpT - delta_t[None, :])
                    for c in slices:
                        dv_acc[:, c] += pT @ dOt[:, c]
                        dk_acc[:, c] += dsT @ Qt[:, c]
                    valid = max(0, min(BM, Lq - m0))
                    dq_accum[b, h, m0:m0 + valid] += (dsT.T @ Kt)[:valid]
                valid = max(0, min(BN, Lk - n0))
                dk[b, hk, n0:n0 + valid] = (dk_acc * scale)[:valid]
                dv[b, hk, n0:n0 + valid] = dv_acc[:valid]
    return dq_accum * scale, dk, dv


def tiled_dq_pass(dout, q, k, v, out, lse, causal, scale, block_n, offset=0, block_m=64):
    """kernels/flash_bwd_dq.cuh in float64: one 'CTA' per (query block, batch, query head)
    walking the key blocks its rows see, in order (none where its last row sees no key); each
    warp's 16 rows take the mask branch on their own bound; dQ = scale * the sum of dS K."""
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    group = H // Hkv
    BN, BM = block_n, block_m
    delta = (dout * out).sum(-1)
    dq = torch.full_like(q, math.nan)
    for b in range(B):
        for h in range(H):
            for m0 in range(0, Lq, BM):
                kv_end = max(0, min(Lk, m0 + BM + offset)) if causal else Lk
                acc = torch.zeros(BM, D, dtype=torch.float64)
                for n0 in range(0, -(-kv_end // BN) * BN, BN):
                    Kt, Vt = tile_rows(k[b, h // group], n0, BN, Lk), tile_rows(v[b, h // group], n0, BN, Lk)
                    for w0 in range(0, BM, 16):  # one warp's rows
                        Qt, dOt = tile_rows(q[b, h], m0 + w0, 16, Lq), tile_rows(dout[b, h], m0 + w0, 16, Lq)
                        row = m0 + w0 + torch.arange(16)
                        inside = row < Lq
                        lse_log2 = torch.where(inside, lse_log2_for_p(lse[b, h, row.clamp(max=Lq - 1)]), 0.0)
                        delta_r = torch.where(inside, delta[b, h, row.clamp(max=Lq - 1)], 0.0)
                        s = Qt @ Kt.T
                        if n0 + BN > Lk or (causal and n0 + BN - 1 > m0 + offset + w0):
                            key = n0 + torch.arange(BN)[None, :]
                            s = s.masked_fill((key >= Lk) | ((key > row[:, None] + offset) & causal), -math.inf)
                        p = torch.exp2(s * (scale * LOG2E) - lse_log2[:, None])
                        acc[w0:w0 + 16] += (p * (dOt @ Vt.T - delta_r[:, None])) @ Kt
                valid = min(BM, Lq - m0)
                dq[b, h, m0:m0 + valid] = (acc * scale)[:valid]
    return dq


# ---------------------------------------------------------------- the tiled algorithm

TILED_CASES = [
    # B, H, Hkv, Lq, Lk, D
    (1, 1, 1, 1, 1, 16),
    (2, 2, 2, 17, 17, 16),
    (1, 4, 2, 100, 100, 8),   # GQA
    (1, 4, 1, 130, 130, 8),   # MQA, ragged last blocks of both
    (1, 2, 1, 70, 200, 8),    # more keys than queries: top-left, key blocks no query sees
    (1, 2, 2, 200, 70, 8),    # more queries than keys: bottom-right, 130 rows that see no key
    (1, 2, 1, 1, 300, 8),     # one query (decoding): bottom-right, it sees every key
    (1, 2, 2, 300, 1, 8),     # one key: bottom-right, only the last query sees it
]


def assert_zero_where_no_key(dq, Lq, Lk, causal, causal_align):
    """Bottom-right with Lq > Lk: the first Lq - Lk queries see no key, their dQ is exactly 0."""
    if causal and causal_align == "bottom_right" and Lq > Lk:
        assert torch.count_nonzero(dq[:, :, :Lq - Lk]) == 0


@pytest.mark.parametrize("tile", sorted(BWD_TILES))
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("B,H,Hkv,Lq,Lk,D", TILED_CASES)
def test_tiled_algorithm_matches_autograd(B, H, Hkv, Lq, Lk, D, mask, tile):
    causal, align = MASKS[mask]
    t = BWD_TILES[tile]
    q, k, v, dout = inputs(B, H, Hkv, Lq, Lk, D, seed=Lq * 31 + Lk + H)
    scale = 1 / math.sqrt(D)
    out, lse = attention64(q, k, v, causal, scale, align)
    got = tiled_backward(dout, q, k, v, out, lse, causal, scale, t.block_n, t.block_m, t.warps_per_keys,
                         diagonal_offset(align, Lq, Lk), flat_lse_rows=t.warp_specialised)
    for name, g, r in zip(("dq", "dk", "dv"), got, autograd_reference(q, k, v, dout, causal, scale, align)):
        assert torch.isfinite(g).all(), f"{name}: unwritten or non-finite rows"
        assert rel(g, r) < 1e-12, f"{name}: rel err {rel(g, r):.2e}"
    assert_zero_where_no_key(got[0], Lq, Lk, causal, align)


@pytest.mark.parametrize("block_n", [64, 32], ids=["d64-d128", "d256"])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("B,H,Hkv,Lq,Lk,D", TILED_CASES)
def test_tiled_dq_pass_matches_autograd(B, H, Hkv, Lq, Lk, D, mask, block_n):
    """The deterministic dQ pass: its key blocks per query block (none for a block whose
    rows see no key) and each warp's mask bound, under both alignments."""
    causal, align = MASKS[mask]
    q, k, v, dout = inputs(B, H, Hkv, Lq, Lk, D, seed=Lq * 17 + Lk + H)
    scale = 1 / math.sqrt(D)
    out, lse = attention64(q, k, v, causal, scale, align)
    dq = tiled_dq_pass(dout, q, k, v, out, lse, causal, scale, block_n, diagonal_offset(align, Lq, Lk))
    ref = autograd_reference(q, k, v, dout, causal, scale, align)[0]
    assert torch.isfinite(dq).all() and rel(dq, ref) < 1e-12, rel(dq, ref)
    assert_zero_where_no_key(dq, Lq, Lk, causal, align)


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("Lq,Lk", [(45, 45), (45, 20), (20, 45)])
def test_tiled_algorithm_small_blocks_walk_many_steps(Lq, Lk, align):
    """Blocks smaller than the sequences (many key blocks, many query steps, BN != BM)."""
    q, k, v, dout = inputs(1, 4, 2, Lq, Lk, 8, seed=5)
    out, lse = attention64(q, k, v, True, 0.3, align)
    for bn, bm in ((16, 8), (8, 16), (16, 16)):
        got = tiled_backward(dout, q, k, v, out, lse, True, 0.3, bn, bm, offset=diagonal_offset(align, Lq, Lk))
        for g, r in zip(got, autograd_reference(q, k, v, dout, True, 0.3, align)):
            assert rel(g, r) < 1e-12
        dq = tiled_dq_pass(dout, q, k, v, out, lse, True, 0.3, bn, diagonal_offset(align, Lq, Lk), block_m=16)
        assert rel(dq, autograd_reference(q, k, v, dout, True, 0.3, align)[0]) < 1e-12


# ---------------------------------------------------------------- the PyTorch path

@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("B,H,Hkv,Lq,Lk,D", TILED_CASES)
def test_math_backward_from_lse_matches_autograd(B, H, Hkv, Lq, Lk, D, mask):
    causal, align = MASKS[mask]
    q, k, v, dout = inputs(B, H, Hkv, Lq, Lk, D, seed=7 + Lq)
    out, lse = attention64(q, k, v, causal, 0.25, align)
    # Chunks of a few rows, so the chunk loop and its masks are exercised too.
    got = math_backward_from_lse(dout, q, k, v, out, lse, causal, 0.25, chunk_elements=B * H * Lk * 7,
                                 causal_align=align)
    for g, r in zip(got, autograd_reference(q, k, v, dout, causal, 0.25, align)):
        assert g.dtype == torch.float64 and torch.isfinite(g).all() and rel(g, r) < 1e-12
    assert_zero_where_no_key(got[0], Lq, Lk, causal, align)


def test_math_backward_from_lse_refuses_an_unknown_alignment():
    q, k, v, dout = inputs(1, 1, 1, 4, 4, 8, seed=1)
    out, lse = attention64(q, k, v, True, 0.25)
    for bad in ("lower_right", "bottom-right", None):
        with pytest.raises(ValueError, match="causal_align must be one of 'top_left', 'bottom_right'"):
            math_backward_from_lse(dout, q, k, v, out, lse, True, 0.25, causal_align=bad)


def test_math_backward_from_lse_in_float32():
    q, k, v, dout = inputs(2, 4, 2, 90, 90, 32, seed=3)
    out, lse = attention64(q, k, v, True, 1 / math.sqrt(32))
    f32 = [t.float() for t in (dout, q, k, v, out)]
    got = math_backward_from_lse(*f32, lse.float(), True, 1 / math.sqrt(32))
    ref = autograd_reference(q, k, v, dout, True, 1 / math.sqrt(32))
    for g, r in zip(got, ref):
        assert g.dtype == torch.float32 and rel(g, r) < 5e-6


# ---------------------------------------------------------------- which path

@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_half_precisions_run_the_cuda_kernel(precision, D):
    plan = backward_plan(precision, D)
    assert plan.path == BWD_MMA_SYNC and plan.tile_name == DEFAULT_BWD_TILE[D]
    assert D in plan.tile.head_dims and plan.as_dict()["block_n"] == plan.tile.block_n


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_fp32_and_tf32_run_the_pytorch_path(precision, D):
    plan = backward_plan(precision, D)
    assert plan.path == BWD_TORCH_MATH and plan.tile is None and plan.as_dict() == {"path": BWD_TORCH_MATH,
                                                                                    "tile": None}


def test_refusals_name_the_reason(monkeypatch):
    for precision in ("fp16", "bf16"):
        with pytest.raises(ValueError, match=rf"head_dim 96 is not supported for {precision}"):
            backward_plan(precision, 96)
    with pytest.raises(ValueError, match="precision 'fp8'"):
        backward_plan("fp8", 64)
    with pytest.raises(ValueError, match="unknown custom backward tile 'nosuch'"):
        backward_plan("bf16", 64, "nosuch")
    # The mma.sync tiles serve both head dims; a d64-only tile stands in for the refusal.
    monkeypatch.setitem(custom_backward.BWD_TILES, "d64_only", BwdTile(128, 64, 8, (64,), "test"))
    with pytest.raises(ValueError, match=r"built for head_dim \(64,\), not 128"):
        backward_plan("bf16", 128, "d64_only")
    with pytest.raises(ValueError, match="takes no tile"):
        backward_plan("fp32", 64, "n64_m64_w4")


def test_tiles_match_the_compiled_table():
    """BWD_TILES names exactly the rows of FLASHWATT_BWD_CONFIGS in kernels/flash_bwd.cu (mma.sync)
    and the bwd_wgmma_entry rows of kEntries (wgmma: 64 keys and 4 warps per warpgroup, 64-row
    query steps), each for fp16 and bf16."""
    text = (KERNELS / "flash_bwd.cu").read_text()
    table = re.search(r"#define FLASHWATT_BWD_CONFIGS\(T, DT\)(.*?)\n\n", text, re.S).group(1)
    compiled = {tuple(map(int, m)) for m in re.findall(r"bwd_entry<T, (\d+), (\d+), (\d+), (\d+)>", table)}
    named = {(D, t.block_n, t.block_m, t.warps) for t in BWD_TILES.values() if t.math == BWD_MMA_SYNC
             for D in t.head_dims}
    assert named == compiled
    entries = re.search(r"const Entry kEntries\[\] = \{(.*?)\n\};", text, re.S).group(1)
    rows = re.findall(r"bwd_wgmma_entry<(__half|__nv_bfloat16), (\d+), (\d+)>\((kFp16|kBf16)\)", entries)
    assert all((ty == "__half") == (code == "kFp16") for ty, _, _, code in rows), rows
    wg_compiled = {(int(D), 64 * int(nwg), 64, 4 * int(nwg), ty) for ty, D, nwg, _ in rows}
    wg_named = {(D, t.block_n, t.block_m, t.warps, ty) for t in BWD_TILES.values()
                if t.math == BWD_WGMMA and not t.warp_specialised
                for D in t.head_dims for ty in ("__half", "__nv_bfloat16")}
    assert wg_named and wg_named == wg_compiled
    # The warp-specialised rows: 2 consumer warpgroups x 64 keys beside the producer's 4 warps,
    # 64-row query steps (BwdWsShape).
    # 64-row query steps unless a third argument says otherwise (BwdWsShape's BM).
    ws_rows = re.findall(r"bwd_wgmma_ws_entry<(__half|__nv_bfloat16), (\d+)(?:, (\d+))?>\((kFp16|kBf16)\)", entries)
    assert all((ty == "__half") == (code == "kFp16") for ty, _, _, code in ws_rows), ws_rows
    ws_compiled = {(int(D), 128, int(bm or 64), 12, ty) for ty, D, bm, _ in ws_rows}
    ws_named = {(D, t.block_n, t.block_m, t.warps, ty) for t in BWD_TILES.values() if t.warp_specialised
                for D in t.head_dims for ty in ("__half", "__nv_bfloat16")}
    assert ws_named and ws_named == ws_compiled
    assert all(t.math == BWD_WGMMA for t in BWD_TILES.values() if t.warp_specialised)
    for D, name in DEFAULT_BWD_TILE.items():
        assert D in BWD_TILES[name].head_dims


# ---------------------------------------------------------------- the adapter

def _cell(**kw):
    base = dict(suite="t", kernel="custom", precision="bf16", seq_len=256, batch=2, heads=4, head_dim=64,
                causal=True, pass_="fwd_bwd")
    return Cell(**{**base, **kw})


def test_custom_is_differentiable_wherever_its_forward_runs(monkeypatch):
    monkeypatch.setattr(custom, "capability", lambda device: (8, 0))
    kern, dev = Custom(), torch.device("cuda", 0)
    assert kern.differentiable
    for precision in ("fp16", "bf16", "fp32", "tf32"):
        for D in custom.HEAD_DIMS:
            fwd = kern.supports(_cell(precision=precision, head_dim=D, pass_="fwd"), dev)
            assert kern.supports(_cell(precision=precision, head_dim=D), dev) == fwd, (precision, D)
            assert fwd is None or precision == "tf32" and D == 256, (precision, D, fwd)


def _cpu_forward(calls):
    """Stands in for the CUDA forward: float64 attention on CPU, returning (out, lse)."""
    def forward(q, k, v, causal, variant="", layout="bhld", *, out=None, scale=None, precision=None, l2_section=None,
                causal_align="top_left"):
        calls.append(dict(causal=causal, variant=variant, layout=layout, scale=scale, precision=precision,
                          l2_section=l2_section, causal_align=causal_align))
        if layout == "blhd":
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        scale = scale if scale is not None else 1 / math.sqrt(q.shape[-1])
        o, lse = attention64(q.double(), k.double(), v.double(), causal, scale, causal_align)
        o = o.to(q.dtype)
        return (o.transpose(1, 2) if layout == "blhd" else o), lse.float()
    return forward


@pytest.mark.parametrize("Lq,Lk", [(37, 37), (50, 23), (23, 50)])
@pytest.mark.parametrize("layout", ["bhld", "blhd"])
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_autograd_function_wiring(monkeypatch, layout, mask, Lq, Lk):
    """flash_attention through autograd on CPU (the forward replaced by float64 attention;
    float32 inputs take the PyTorch backward): grads, GQA sums, layouts and the causal
    alignment as autograd's; rows that see no key get zero gradients, not NaN."""
    causal, align = MASKS[mask]
    calls = []
    monkeypatch.setattr(custom_autograd, "flash_forward", _cpu_forward(calls))
    monkeypatch.setattr(custom_autograd, "check_inputs", lambda q, k, v: None)
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 4, Lq, 16, generator=g)
    k, v = torch.randn(2, 2, Lk, 16, generator=g), torch.randn(2, 2, Lk, 16, generator=g)
    dout = torch.randn(2, 4, Lq, 16, generator=g)
    if layout == "blhd":
        q, k, v, dout = (t.transpose(1, 2).contiguous() for t in (q, k, v, dout))
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    out = custom_autograd.flash_attention(*leaves, causal, "m64_n64_w4_s2", layout, l2_section=3, causal_align=align)
    dq, dk, dv = torch.autograd.grad(out, leaves, dout)
    assert calls == [dict(causal=causal, variant="m64_n64_w4_s2", layout="bhld", scale=0.25, precision=None,
                          l2_section=3, causal_align=align)]
    ref_args = [t.transpose(1, 2) if layout == "blhd" else t for t in (q, k, v, dout)]
    ref = autograd_reference(*ref_args, causal, 0.25, align)
    for g, r, leaf in zip((dq, dk, dv), ref, leaves):
        assert g.shape == leaf.shape and torch.isfinite(g).all()
        g = g.transpose(1, 2) if layout == "blhd" else g
        assert rel(g, r) < 1e-5
    assert_zero_where_no_key(dq.transpose(1, 2) if layout == "blhd" else dq, Lq, Lk, causal, align)


def test_unknown_alignment_fails_before_the_forward(monkeypatch):
    calls = []
    monkeypatch.setattr(custom_autograd, "flash_forward", _cpu_forward(calls))
    monkeypatch.setattr(custom_autograd, "check_inputs", lambda q, k, v: None)
    q, k, v, dout = (t.float().requires_grad_(True) for t in inputs(1, 2, 2, 8, 8, 16, seed=2))
    for bad in ("lower_right", "BOTTOM_RIGHT", 1):
        with pytest.raises(ValueError, match=r"causal_align must be one of 'top_left', 'bottom_right', got"):
            custom_autograd.flash_attention(q, k, v, True, causal_align=bad)
    assert calls == []
    with pytest.raises(ValueError, match="causal_align"):  # the backward's own check
        custom_backward.flash_backward(dout, q, k, v, q, q[..., 0], True, 0.25, backward_plan("fp32", 16),
                                       causal_align="upper_left")


def test_no_grad_calls_the_plain_forward_and_saves_nothing(monkeypatch):
    calls = []
    monkeypatch.setattr(custom_autograd, "flash_forward", _cpu_forward(calls))
    monkeypatch.setattr(custom_autograd, "FlashAttentionFunction", None)  # would fail if used
    q, k, v, _ = (t.float() for t in inputs(1, 2, 2, 8, 8, 16, seed=1))
    out = custom_autograd.flash_attention(q, k, v, True, causal_align="bottom_right")  # no input requires grad
    assert out.grad_fn is None and len(calls) == 1 and calls[0]["causal_align"] == "bottom_right"
    leaves = [t.requires_grad_(True) for t in (q, k, v)]
    with torch.no_grad():
        out = custom_autograd.flash_attention(*leaves, True)
    assert out.grad_fn is None and len(calls) == 2


def test_unsupported_backward_fails_before_the_forward(monkeypatch):
    calls = []
    monkeypatch.setattr(custom_autograd, "flash_forward", _cpu_forward(calls))
    monkeypatch.setattr(custom_autograd, "check_inputs", lambda q, k, v: None)
    q, k, v, _ = (t.to(torch.bfloat16).requires_grad_(True) for t in inputs(1, 2, 2, 8, 8, 64, seed=2))
    with pytest.raises(ValueError, match=r"built for head_dim \(256,\), not 64"):
        custom_autograd.flash_attention(q, k, v, False, backward_tile="n64_m32_w8")
    assert calls == []


def test_wgmma_tile_plan():
    """A wgmma tile runs head dims 64 and 128, on compute capability 9.0 only."""
    wg = [name for name, t in BWD_TILES.items() if t.math == BWD_WGMMA]
    assert wg and all(BWD_TILES[name].math == BWD_MMA_SYNC for name in DEFAULT_BWD_TILE.values())
    for name in wg:
        dims = BWD_TILES[name].head_dims
        for precision, D in ((p, D) for p in ("fp16", "bf16") for D in dims):
            plan = backward_plan(precision, D, name, (9, 0))
            assert plan.path == BWD_WGMMA and plan.tile_name == name and plan.as_dict()["math"] == BWD_WGMMA
            assert backward_plan(precision, D, name).path == BWD_WGMMA  # capability not known: not checked
            for cap in ((8, 0), (8, 9), (10, 0)):
                with pytest.raises(ValueError, match=r"uses wgmma, built only for compute capability 9\.0"):
                    backward_plan(precision, D, name, cap)
        for D in sorted({64, 128, 256} - set(dims)):
            with pytest.raises(ValueError, match=rf"{name}' is built for head_dim {re.escape(str(dims))}, not {D}"):
                backward_plan("bf16", D, name, (9, 0))
    assert backward_plan("bf16", 128, None, (8, 0)).path == BWD_MMA_SYNC


def test_hopper_takes_the_wgmma_tile_by_default_where_one_exists():
    from flashwatt.kernels.custom_backward import backward_plan

    assert backward_plan("bf16", 128, capability=(9, 0)).tile_name == "wgmma_ws_n128_m64_w12"
    assert backward_plan("bf16", 128, capability=(9, 0), deterministic=True).tile_name == "wgmma_ws_n128_m64_w12"
    assert backward_plan("fp16", 128, capability=(9, 0)).path == "wgmma"
    assert backward_plan("bf16", 128, capability=(8, 0)).tile_name == "n128_m64_w8"
    assert backward_plan("bf16", 128).tile_name == "n128_m64_w8"  # capability unknown: the portable tile
    assert backward_plan("bf16", 64, capability=(9, 0)).tile_name == "wgmma_ws_n128_m128_w12"
    assert backward_plan("bf16", 256, capability=(9, 0)).tile_name == "n64_m32_w8"  # no wgmma tile at D256
    assert backward_plan("bf16", 128, "n64_m64_w4", capability=(9, 0)).tile_name == "n64_m64_w4"  # asked by name


WS_TILE = "wgmma_ws_n128_m64_w12"
WS_M128 = "wgmma_ws_n128_m128_w12"


def test_warp_specialised_tile_runs_on_hopper_only():
    """The warp-specialised tile is the default at head dim 128 on compute capability 9.0 (its
    128-row-step form at 64) and runs nowhere else: at head dim 256 or on another device it is
    refused, naming it."""
    t = BWD_TILES[WS_TILE]
    assert t.warp_specialised and t.math == BWD_WGMMA and t.head_dims == (64, 128)
    assert [name for name, tile in BWD_TILES.items() if tile.warp_specialised] == [WS_TILE, WS_M128]
    for cap in (None, (8, 0), (8, 9), (9, 0), (10, 0)):
        for D in (64, 128, 256):
            for deterministic in (False, True):
                chosen = backward_plan("bf16", D, None, cap, deterministic).tile_name
                assert (chosen == WS_TILE) == (cap == (9, 0) and D == 128), (cap, D, chosen)
                assert (chosen == WS_M128) == (cap == (9, 0) and D == 64), (cap, D, chosen)
    for precision in ("fp16", "bf16"):
        for D in (64, 128):
            plan = backward_plan(precision, D, WS_TILE, (9, 0))
            row = plan.as_dict()
            assert plan.path == BWD_WGMMA and plan.tile_name == WS_TILE
            assert (row["block_n"], row["block_m"], row["warps"], row["warp_specialised"]) == (128, 64, 12, True)
            assert backward_plan(precision, D, WS_TILE, (9, 0), deterministic=True).dq == \
                "separate pass (deterministic)"
            for cap in ((8, 0), (8, 6), (8, 9), (10, 0), (12, 0)):
                with pytest.raises(ValueError, match=rf"'{WS_TILE}' uses wgmma, built only for compute capability 9\.0"):
                    backward_plan(precision, D, WS_TILE, cap)
        with pytest.raises(ValueError, match=rf"'{WS_TILE}' is built for head_dim \(64, 128\), not 256"):
            backward_plan(precision, 256, WS_TILE, (9, 0))
    with pytest.raises(ValueError, match=rf"fp32 runs {BWD_TORCH_MATH}, which takes no tile \(got '{WS_TILE}'\)"):
        backward_plan("fp32", 128, WS_TILE, (9, 0))


def test_warp_specialised_tile_with_128_row_steps_runs_at_head_dim_64_only():
    """wgmma_ws_n128_m128_w12 (BwdWsShape<64, 128>): on compute capability 9.0 at head dim 64,
    asked for by name; refused, naming it, at head dims 128 and 256 and on other devices."""
    t = BWD_TILES[WS_M128]
    assert t.warp_specialised and t.math == BWD_WGMMA and t.head_dims == (64,)
    for precision in ("fp16", "bf16"):
        row = backward_plan(precision, 64, WS_M128, (9, 0)).as_dict()
        assert (row["block_n"], row["block_m"], row["warps"], row["warp_specialised"]) == (128, 128, 12, True)
        for D in (128, 256):
            with pytest.raises(ValueError, match=rf"'{WS_M128}' is built for head_dim \(64,\), not {D}"):
                backward_plan(precision, D, WS_M128, (9, 0))
        for cap in ((8, 0), (8, 9), (10, 0)):
            with pytest.raises(ValueError, match=rf"'{WS_M128}' uses wgmma, built only for compute capability 9\.0"):
                backward_plan(precision, 64, WS_M128, cap)
    # The other tiles' plan rows carry no new key.
    assert all("warp_specialised" not in backward_plan("bf16", D, name, (9, 0)).as_dict()
               for name, tile in BWD_TILES.items() if not tile.warp_specialised for D in tile.head_dims)


class _MBarrier:
    """An mbarrier as the PTX ISA describes it: a phase completes once `count` arrivals and
    every expected transaction byte are in; try_wait.parity(P) is true once the phase of
    parity P before the current one has completed (at once for P = 1 on a fresh barrier)."""

    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, expect_tx=0):
        self.tx += expect_tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        self._complete()

    def complete_tx(self, nbytes):
        self.tx -= nbytes
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def try_wait(self, parity):
        return (self.phase & 1) != parity


def _ws_steps(Lq, Lk, group, n0, causal, offset, BM=64):
    """The (query head index within the group, m0) of each step of a CTA, as the consumers of
    flash_bwd_wgmma_ws.cuh walk them (head_end from num_mb), and as its producer does."""
    num_mb = (Lq + BM - 1) // BM
    mb_first = min(max(0, n0 - offset) // BM, num_mb) if causal else 0
    iters = group * (num_mb - mb_first)
    consumer, producer = [], []
    h, m0 = 0, mb_first * BM
    for _ in range(iters):
        consumer.append((h, m0))
        head_end = m0 + BM >= num_mb * BM
        h, m0 = (h + 1, mb_first * BM) if head_end else (h, m0 + BM)
    h, m0 = 0, mb_first * BM
    for _ in range(iters):
        producer.append((h, m0))
        h, m0 = (h + 1, mb_first * BM) if m0 + BM >= num_mb * BM else (h, m0 + BM)
    return consumer, producer


class _NamedBarrier:
    """bar.sync / bar.arrive on one barrier id with a thread count: a phase completes when that
    many threads have arrived (arrive counts its warps in and goes on; sync counts them in and
    waits for the phase to complete)."""

    def __init__(self, threads):
        self.threads, self.arrived, self.phase = threads, 0, 0

    def arrive(self, threads):
        self.arrived += threads
        assert self.arrived <= self.threads, "more arrivals than the barrier's count in one phase"
        if self.arrived == self.threads:
            self.arrived, self.phase = 0, self.phase + 1
        return self.phase

    def sync(self, threads):
        """A generator: arrives, then yields until the phase it arrived in has completed."""
        phase = self.phase
        self.arrive(threads)
        while self.phase == phase:
            yield


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("Lq,Lk,group,causal,offset", [
    (1, 1, 1, False, 0), (64, 128, 1, False, 0), (300, 300, 2, True, 0), (1000, 1000, 4, False, 0),
    (130, 40, 1, True, -90), (40, 130, 2, True, 90), (200, 64, 1, True, 0),
])
@pytest.mark.parametrize("BM", [64, 128], ids=["m64", "m128"])
def test_warp_specialised_ring_protocol(Lq, Lk, group, causal, offset, seed, BM):
    """flash_bwd_wgmma_ws.cuh's protocol, played out step by step under random interleavings of
    the producer's thread, the TMA engine, the two consumers, the dQ writer's warp and the bulk
    reductions: the parities the kernel waits with, the stage each step reads, the one dS^T
    barrier per step with dS^T double-buffered, and each consumer's one dQ staging tile handed
    to the writer (kDqFull0 + c: the consumer arrives with 128 threads, the writer syncs with
    32) and back once the writer has seen its reduction read it (kDqEmpty0 + c, the other way
    round; released once before the first step and not after the last). Checks that nobody
    waits forever, that each consumer step reads the query block it computes and the writer
    reduces it at that block (all walk the same blocks), that no stage is refilled while a
    consumer still reads it, that no dS^T buffer is overwritten while the other consumer's dQ
    still reads it, that no dQ tile is staged into while a reduction still reads it or before
    the writer took the last one, and that no named barrier holds arrivals when the CTA exits."""
    import random

    rnd = random.Random(seed)
    for n0 in range(0, Lk, 128):
        consumer_steps, producer_steps = _ws_steps(Lq, Lk, group, n0, causal, offset, BM)
        assert consumer_steps == producer_steps
        iters = len(consumer_steps)
        kv_full, full = _MBarrier(1), [_MBarrier(1), _MBarrier(1)]
        empty = [_MBarrier(2), _MBarrier(2)]  # 256 consumer threads: one arrival per warpgroup here
        ds_barrier = _NamedBarrier(256)
        dq_full, dq_empty = [_NamedBarrier(160) for _ in (0, 1)], [_NamedBarrier(160) for _ in (0, 1)]
        stage_block = [None, None]  # what TMA last wrote into each stage
        in_flight = []  # TMA copies issued, not landed: (barrier, stage or None, block)
        readers = [set(), set()]  # consumers reading each stage
        ds_readers = [set(), set()]  # consumers whose dQ reads each dS^T buffer
        staged = [None, None]  # per consumer: the step whose dQ its tile holds
        reading = []  # bulk reductions issued whose read of their tile is not done: consumer ids

        def producer():
            kv_full.arrive(expect_tx=2)
            in_flight.extend([(kv_full, None, "k"), (kv_full, None, "v")])
            for it in range(iters):
                stage = it & 1
                while not empty[stage].try_wait(((it >> 1) & 1) ^ 1):
                    yield
                assert not readers[stage], f"stage {stage} refilled while {readers[stage]} read it"
                full[stage].arrive(expect_tx=1)
                in_flight.append((full[stage], stage, producer_steps[it]))
                yield

        def tma():  # lands the copies in flight in any order, one byte each
            while True:
                if in_flight and rnd.random() < 0.5:
                    bar, stage, block = in_flight.pop(rnd.randrange(len(in_flight)))
                    if stage is not None:
                        stage_block[stage] = block
                    bar.complete_tx(1)
                yield

        def consumer(c):
            while not kv_full.try_wait(0):
                yield
            for it in range(iters):
                stage = it & 1
                while not full[stage].try_wait((it >> 1) & 1):
                    yield
                readers[stage].add(c)
                assert stage_block[stage] == consumer_steps[it], (it, stage_block[stage], consumer_steps[it])
                yield
                buf = it & 1
                assert not (ds_readers[buf] - {c}), f"dS^T buffer {buf} overwritten while its dQ reads it"
                yield
                yield from ds_barrier.sync(128)
                ds_readers[buf].add(c)
                yield  # dQ wgmma in flight (then dK)
                ds_readers[buf].discard(c)  # dQ waited for
                yield from dq_empty[c].sync(128)
                assert c not in reading, f"consumer {c}'s dQ tile staged into while its reduction reads it"
                assert staged[c] is None, f"consumer {c}'s dQ of step {staged[c]} overwritten before the writer took it"
                staged[c] = it
                dq_full[c].arrive(128)
                yield  # dK in flight
                readers[stage].discard(c)
                empty[stage].arrive()
                yield

        def writer():
            if iters == 0:
                return
            for c in (0, 1):
                dq_empty[c].arrive(32)
            for it in range(iters):
                for c in (0, 1):
                    yield from dq_full[c].sync(32)
                    assert staged[c] == it, f"the writer reduces step {it} at consumer {c}'s dQ of step {staged[c]}"
                    staged[c] = None
                    reading.append(c)  # one lane's bulk reductions, at the block of producer_steps[it]
                while reading:  # bulk_wait_read<0>
                    yield
                if it + 1 < iters:
                    for c in (0, 1):
                        dq_empty[c].arrive(32)
                yield

        def reductions():  # the bulk reductions read their tiles in the order issued
            while True:
                if reading and rnd.random() < 0.5:
                    reading.pop(0)
                yield

        actors = {"producer": producer(), "c0": consumer(0), "c1": consumer(1), "writer": writer()}
        engines = [tma(), reductions()]
        for _ in range(100_000):
            if not actors:
                break
            for e in engines:
                next(e)
            name = rnd.choice(sorted(actors))
            try:
                next(actors[name])
            except StopIteration:
                del actors[name]
        assert not actors, f"n0 {n0}: {sorted(actors)} still waiting after {iters} steps"
        assert not in_flight, "a TMA copy still in flight when the CTA exits"
        assert not reading, "a dQ reduction still reads shared memory when the CTA exits"
        pending = [b.arrived for b in (ds_barrier, *dq_full, *dq_empty) if b.arrived]
        assert not pending, f"named barriers left with arrivals pending at exit: {pending}"


def test_deterministic_plan_follows_torch_and_says_how_dq_is_made(monkeypatch):
    """flash_attention's backward is the deterministic one (dQ by its own pass, no atomics)
    when torch.use_deterministic_algorithms(True) is on or when asked, and the plan records it."""
    from flashwatt.kernels.custom_backward import DQ_ATOMICS, DQ_PASS

    plans = []

    def backward(dout, q, k, v, out, lse, causal, scale, plan, l2_section=None, causal_align="top_left"):
        plans.append(plan)
        return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)

    monkeypatch.setattr(custom_autograd, "flash_forward", _cpu_forward([]))
    monkeypatch.setattr(custom_autograd, "flash_backward", backward)
    monkeypatch.setattr(custom_autograd, "check_inputs", lambda q, k, v: None)
    q, k, v, dout = (t.float() for t in inputs(1, 2, 2, 8, 8, 16, seed=3))

    def run(**kw):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        torch.autograd.grad(custom_autograd.flash_attention(*leaves, True, **kw), leaves, dout)
        return plans[-1].deterministic

    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert run() is False and run(deterministic=True) is True
        torch.use_deterministic_algorithms(True)
        assert run() is True and run(deterministic=False) is False
    finally:
        torch.use_deterministic_algorithms(was)
    for precision, D, cap in (("bf16", 64, None), ("fp16", 128, (8, 0)), ("bf16", 128, (9, 0))):
        assert backward_plan(precision, D, capability=cap).as_dict()["dq"] == DQ_ATOMICS
        plan = backward_plan(precision, D, capability=cap, deterministic=True)
        assert plan.deterministic and plan.as_dict()["dq"] == DQ_PASS
    assert "dq" not in backward_plan("fp32", 64, deterministic=True).as_dict()  # the PyTorch path: no atomics


def test_backward_kernel_info_records_the_dq_of_the_run(monkeypatch):
    """A fwd_bwd cell records the backward plan flash_attention will run: under
    torch.use_deterministic_algorithms(True), the dQ pass."""
    from types import SimpleNamespace

    import flashwatt.build
    from flashwatt.kernels.custom_backward import DQ_ATOMICS, DQ_PASS, backward_kernel_info

    ext = SimpleNamespace(DTYPE_FP16=0, DTYPE_BF16=1, backward_kernel_info=lambda *args: {"num_regs": 1})
    monkeypatch.setattr(flashwatt.build, "load_extension", lambda: ext)
    monkeypatch.setattr(custom_backward, "capability", lambda device: (8, 0))
    was = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(False)
        assert backward_kernel_info("bf16", 64)["dq"] == DQ_ATOMICS
        torch.use_deterministic_algorithms(True)
        assert backward_kernel_info("bf16", 64)["dq"] == DQ_PASS
    finally:
        torch.use_deterministic_algorithms(was)
