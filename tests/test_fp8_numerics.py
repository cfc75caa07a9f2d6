"""The fp8 forward's numerics on the CPU (flashwatt.kernels.fp8_numerics): the quantisation against
torch's own float8_e4m3fn casts, the order of V^T's keys against the wgmma fragment layouts, and
the error the kernel's arithmetic has against float64, which fp8's tolerance is set from."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from flashwatt.kernels import fp8_numerics as fn
from flashwatt.vocabulary import TOLERANCE


def randn(shape, seed, dtype=torch.bfloat16):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


def rel(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def attention64(q, k, v, causal=False):
    group = q.shape[1] // k.shape[1]
    q, k, v = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


# ---------------------------------------------------------------- quantisation

def test_scales_are_float32_divisions_rounded_to_nearest():
    """descale = amax / 448 and scale = 448 / amax, each the correctly rounded float32 division
    (numpy's float32 division is IEEE's), whatever device torch runs on; amax * (1 / 448), the
    multiplication torch's CUDA division by a number turns it into, is not the same number."""
    g = np.random.default_rng(5)
    amax = np.concatenate([g.uniform(1e-3, 1e3, 20000), 2.0 ** g.uniform(-100, 100, 20000),
                           [448.0, 7.0, 1.0, 3.5, np.finfo(np.float32).tiny, 1e30]]).astype(np.float32)
    t = torch.from_numpy(amax)
    assert np.array_equal(fn.descale_of(t).numpy(), amax / np.float32(448))
    with np.errstate(over="ignore"):
        quotient = np.float32(448) / amax
    assert np.array_equal(fn.scale_of(t).numpy(), np.minimum(quotient, np.finfo(np.float32).max))
    assert fn.scale_of(t)[-2] == np.finfo(np.float32).max  # 448 / 1.2e-38 overflows: the largest float
    tiny = torch.tensor([0.0, 1e-37, -3e-38]).view(1, 1, 3, 1)
    x8, d = fn.quantize_blocks(tiny, 64)
    assert not torch.isnan(x8.float()).any() and torch.isfinite(d).all()
    by_reciprocal = (amax * (np.float32(1) / np.float32(448))).astype(np.float32)
    assert not np.array_equal(by_reciprocal, amax / np.float32(448))
    zero = torch.zeros(3)
    assert fn.descale_of(zero).tolist() == [1.0] * 3 and fn.scale_of(zero).tolist() == [1.0] * 3


def test_quantisation_is_a_per_block_scaled_e4m3_cast():
    x = randn((2, 3, 150, 64), 1) * torch.tensor([1.0, 100.0, 1e-3]).view(1, 3, 1, 1).to(torch.bfloat16)
    x[:, :, 64:128] *= 8  # the second block of every head larger: its own scale
    x[1, 2, :64] = 0  # a block of zeros: descale 1, values 0
    x8, descale = fn.quantize_blocks(x, 64)
    assert x8.dtype == torch.float8_e4m3fn and x8.shape == x.shape
    assert descale.shape == (2, 3, 3) and descale.dtype == torch.float32  # 150 rows: blocks of 64, 64, 22
    xf = x.float().numpy()
    for blk, rows in enumerate((slice(0, 64), slice(64, 128), slice(128, 150))):
        amax = np.abs(xf[:, :, rows]).max(axis=(2, 3))
        nonzero = amax > 0
        expected = np.where(nonzero, amax / np.float32(448), np.float32(1))
        assert np.array_equal(descale[:, :, blk].numpy(), expected), blk
        scale = np.where(nonzero, np.float32(448) / np.where(nonzero, amax, 1), np.float32(1)).astype(np.float32)
        cast = torch.from_numpy((xf[:, :, rows] * scale[:, :, None, None]).astype(np.float32)).clamp(-448, 448)
        assert torch.equal(x8[:, :, rows].view(torch.uint8), cast.to(torch.float8_e4m3fn).view(torch.uint8)), blk
        # the largest element of every block lands on +-448
        top = x8[:, :, rows].float().abs().amax(dim=(2, 3)).numpy()
        assert np.array_equal(top[nonzero], np.full(nonzero.sum(), 448.0, dtype=np.float32)), blk
    assert descale[1, 2, 0] == 1 and torch.count_nonzero(x8[1, 2, :64].float()) == 0
    assert descale[0, 0, 1] > 4 * descale[0, 0, 0]  # not one scale per head
    q8, _ = fn.quantize_blocks(x, 150)  # one block: the per-head scale
    assert torch.equal(q8.view(torch.uint8), fn.quantize_blocks(x, 1000)[0].view(torch.uint8))


def test_dequantised_values_are_within_e4m3_rounding():
    x = randn((1, 4, 512, 128), 2)
    x8, descale = fn.quantize_blocks(x, fn.KV_BLOCK)
    d = fn.per_row(descale, fn.KV_BLOCK, 512)[..., None]
    back = x8.float() * d
    err = (back - x.float()).abs()
    # round to nearest: at most half a unit in the last place, 2^-4 of the value in a normal
    # binade, plus half the smallest subnormal step (2^-10 of the scale) below it
    bound = x.float().abs() * 2.0 ** -4 + d * 2.0 ** -10
    assert (err <= bound * (1 + 1e-6)).all()
    assert 0.015 < rel(back, x) < 0.035  # about 2.6 % RMS on N(0, 1)


def test_saturation_and_rounding_of_to_e4m3():
    got = fn.to_e4m3(torch.tensor([500.0, -1e9, 448.0, 1.0625, 1.1875, 0.0])).float()
    # 1.0625 is halfway between 1 and 1.125 (ties to even: 1); 1.1875 halfway to 1.25 (even: 1.25)
    assert got.tolist() == [448.0, -448.0, 448.0, 1.0, 1.25, 0.0]


# ---------------------------------------------------------------- V^T and the fragment layouts

def test_key_order_is_a_permutation_of_each_32():
    assert sorted(fn.key_of_column(c) for c in range(32)) == list(range(32))
    keys = fn.column_keys(100)
    assert len(keys) == fn.padded_keys(100) == 128
    assert sorted(keys.tolist()) == list(range(128))


def test_transpose_v_holds_each_key_in_its_column_and_zeros_past_the_end():
    v8, _ = fn.quantize_blocks(randn((2, 2, 77, 64), 3), fn.KV_BLOCK)
    vt = fn.transpose_v(v8)
    assert vt.shape == (2, 2, 64 + fn.VT_EXTRA_ROWS, 128) and vt.dtype == torch.float8_e4m3fn
    keys = fn.column_keys(77)
    for col in (0, 1, 2, 5, 31, 32, 76, 77, 100, 127):
        key = int(keys[col])
        expected = v8[:, :, key].float() if key < 77 else torch.zeros(2, 2, 64)
        assert torch.equal(vt[:, :, :64, col].float(), expected), col
    # under the head dim's rows: ones, then zeros, so that P V^T's column 64 is P's row sum
    assert (vt[:, :, 64].float() == 1).all() and (vt[:, :, 65:].float() == 0).all()
    p = torch.rand(2, 2, 5, 128)
    assert torch.allclose((p @ vt.float().transpose(2, 3))[..., 64], p.sum(-1))


def test_the_row_sum_of_rounded_p_is_as_accurate():
    """The tiles that sum P on the tensor cores sum it rounded to e4m3 (it is what P V weighs V
    by): O is then normalised by the weights it was made of; against float64 the error stays
    e4m3's, and the LSE moves by e4m3's rounding averaged over a row."""
    q, k, v = (randn((1, 2, 500, 64), s) for s in (50, 51, 52))
    (q8, dq), (k8, dk), (v8, dv) = fn.quantize_qkv(q, k, v)
    ref, ref_lse = attention64(q, k, v, True)
    plain, plain_lse = fn.emulate_attention(q8, k8, v8, dq, dk, dv, True)
    rounded, rounded_lse = fn.emulate_attention(q8, k8, v8, dq, dk, dv, True, sum_of_rounded_p=True)
    assert rel(rounded, ref) < TOLERANCE["fp8"]["fwd"] / 1.5 and rel(rounded_lse, ref_lse) < 5e-3
    assert 0 < rel(rounded, plain) < 1e-2 and not torch.equal(rounded_lse, plain_lse)


def test_p_in_accumulator_order_times_v_transposed_is_p_v():
    """One warpgroup's O += P V as wgmma computes it: P packed the way flash_fwd_fp8.cuh packs the
    S accumulators (register r of k step kk: accumulators 16kk + {0,1,4,5}, {2,3,6,7},
    {8,9,12,13}, {10,11,14,15}), each byte read at the k32 A fragment's column (PTX: register r,
    byte e of thread (g, t): row g + 8 (r & 1), column 4t + e + 16 (r >> 1)), times V^T as the
    quantisation writes it. With keys in their natural order in V^T this is wrong."""
    P = torch.randint(-3, 4, (64, 128)).double()
    V = torch.randint(-3, 4, (128, 64)).double()

    def product(keys):
        vt = V[keys].T  # V^T[d, column] = V[key of column, d]
        out = torch.zeros(64, 64, dtype=torch.float64)
        packs = [[0, 1, 4, 5], [2, 3, 6, 7], [8, 9, 12, 13], [10, 11, 14, 15]]
        for kk in range(4):
            a = torch.zeros(64, 32, dtype=torch.float64)
            for warp in range(4):
                for lane in range(32):
                    g, t = lane >> 2, lane & 3
                    for r, accumulators in enumerate(packs):
                        for e, i in enumerate(accumulators):  # accumulator i: row, column (a key)
                            value = P[16 * warp + g + 8 * ((i >> 1) & 1), 32 * kk + (i >> 2) * 8 + 2 * t + (i & 1)]
                            a[16 * warp + g + 8 * (r & 1), 4 * t + e + 16 * (r >> 1)] = value
            out += a @ vt[:, 32 * kk:32 * kk + 32].T
        return out

    assert torch.equal(product(fn.column_keys(128)), P @ V)
    assert not torch.equal(product(torch.arange(128)), P @ V)


# ---------------------------------------------------------------- the kernel's arithmetic

@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_emulated_error_sets_the_tolerance(D, causal):
    """About 5 % against float64 on N(0, 1) inputs (vocabulary.TOLERANCE["fp8"]: twice that),
    far above bf16's rounding, far below a wrong result."""
    q, k, v = (randn((1, 2, 300, D), s) for s in (10, 11, 12))
    (q8, dq), (k8, dk), (v8, dv) = fn.quantize_qkv(q, k, v)
    out, lse = fn.emulate_attention(q8, k8, v8, dq, dk, dv, causal)
    ref, ref_lse = attention64(q, k, v, causal)
    err = rel(out, ref)
    assert 0.02 < err < TOLERANCE["fp8"]["fwd"] / 1.5, err
    assert rel(lse, ref_lse) < 5e-3


def test_emulation_without_rounding_is_attention():
    """The tile-by-tile online softmax, the 2^8 shift of P and the descales cancel out: with every
    rounding taken away (float32 operands, descales of 1, P not rounded) it is attention."""
    q, k, v = (randn((2, 4, 333, 64), s, torch.float32) for s in (20, 21, 22))
    ones_q, ones_kv = torch.ones(2, 4, fn.blocks(333, fn.Q_BLOCK)), torch.ones(2, 2, fn.blocks(333, fn.KV_BLOCK))
    to_e4m3 = fn.to_e4m3
    try:
        fn.to_e4m3 = lambda x: x.float()
        out, lse = fn.emulate_attention(q, k[:, :2], v[:, :2], ones_q, ones_kv, ones_kv, True)
    finally:
        fn.to_e4m3 = to_e4m3
    ref, ref_lse = attention64(q, k[:, :2], v[:, :2], True)
    assert rel(out, ref) < 1e-5 and rel(lse, ref_lse) < 1e-5


def test_descales_scale_scores_and_output():
    q, k, v = (randn((1, 1, 300, 64), s) for s in (30, 31, 32))
    (q8, dq), (k8, dk), (v8, dv) = fn.quantize_qkv(q, k, v)
    base, _ = fn.emulate_attention(q8, k8, v8, dq, dk, dv)
    # halving descale_q and doubling descale_k leaves the scores alone; doubling descale_v the
    # output doubles
    same, _ = fn.emulate_attention(q8, k8, v8, dq / 2, dk * 2, dv)
    double, _ = fn.emulate_attention(q8, k8, v8, dq, dk, dv * 2)
    assert rel(same, base) < 1e-6 and rel(double, 2 * base) < 1e-6
    sharper, _ = fn.emulate_attention(q8, k8, v8, dq * 4, dk, dv)
    assert rel(sharper, base) > 0.1
    # each block's descale scales its own rows (Q) or keys (K, V) only
    for name, d, rows in (("q", dq, fn.Q_BLOCK), ("k", dk, fn.KV_BLOCK), ("v", dv, fn.KV_BLOCK)):
        moved = d.clone()
        moved[:, :, 1] *= 3
        args = {"q": (moved, dk, dv), "k": (dq, moved, dv), "v": (dq, dk, moved)}[name]
        out, _ = fn.emulate_attention(q8, k8, v8, *args)
        if name == "q":  # only the rows of query block 1 change
            second = slice(rows, 2 * rows)
            assert torch.equal(out[:, :, :rows], base[:, :, :rows]) and rel(out[:, :, second], base[:, :, second]) > 0.1
        else:
            assert rel(out, base) > 0.05, name


@pytest.mark.parametrize("causal", [False, True])
def test_blocks_of_very_different_magnitudes_keep_their_precision(causal):
    """K and V whose key blocks differ by 2^10 in magnitude and Q whose row blocks do: each block
    has its own scale, so the error stays at e4m3's (one scale per head would push the small
    blocks into e4m3's subnormals)."""
    q, k, v = (randn((1, 2, 400, 128), s) for s in (40, 41, 42))
    for x, rows in ((q, fn.Q_BLOCK), (k, fn.KV_BLOCK), (v, fn.KV_BLOCK)):
        x[:, :, rows:2 * rows] *= 2.0 ** -10
    (q8, dq), (k8, dk), (v8, dv) = fn.quantize_qkv(q, k, v)
    out, _ = fn.emulate_attention(q8, k8, v8, dq, dk, dv, causal)
    ref, _ = attention64(q, k, v, causal)
    assert rel(out, ref) < TOLERANCE["fp8"]["fwd"] / 1.5
