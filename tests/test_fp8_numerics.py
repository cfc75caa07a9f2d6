"""The fp8 forward's numerics on the CPU (flashwatt.kernels.fp8_numerics): the quantisation against
torch's own float8_e4m3fn casts, the order of V^T's keys against the wgmma fragment layouts, and
the error the kernel's arithmetic has against float64, which fp8's tolerance is set from."""
from __future__ import annotations

import math

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

def test_quantisation_is_a_per_head_scaled_e4m3_cast():
    x = randn((2, 3, 50, 64), 1) * torch.tensor([1.0, 100.0, 1e-3]).view(1, 3, 1, 1).to(torch.bfloat16)
    x[1, 2] = 0
    x8, descale = fn.quantize_per_head(x)
    assert x8.dtype == torch.float8_e4m3fn and descale.shape == (2, 3) and descale.dtype == torch.float32
    amax = x.float().abs().amax(dim=(2, 3))
    assert torch.equal(descale[amax > 0], (amax / 448)[amax > 0]) and descale[1, 2] == 1
    # the largest element of every head lands on +-448, and the cast is torch's own
    top = x8.float().abs().amax(dim=(2, 3))
    assert torch.equal(top[amax > 0], torch.full_like(top[amax > 0], 448.0))
    expected = (x.float() * (448 / amax.clamp_min(1e-30))[:, :, None, None]).to(torch.float8_e4m3fn)
    assert torch.equal(x8.view(torch.uint8)[amax > 0], expected.view(torch.uint8)[amax > 0])
    assert torch.count_nonzero(x8[1, 2].float()) == 0


def test_dequantised_values_are_within_e4m3_rounding():
    x = randn((1, 4, 512, 128), 2)
    x8, descale = fn.quantize_per_head(x)
    back = x8.float() * descale[:, :, None, None]
    err = (back - x.float()).abs()
    # round to nearest: at most half a unit in the last place, 2^-4 of the value in a normal
    # binade, plus half the smallest subnormal step (2^-10 of the scale) below it
    bound = x.float().abs() * 2.0 ** -4 + descale[:, :, None, None] * 2.0 ** -10
    assert (err <= bound * (1 + 1e-6)).all()
    assert 0.015 < rel(back, x) < 0.035  # about 2.6 % RMS on N(0, 1) at a per-head scale


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
    v8, _ = fn.quantize_per_head(randn((2, 2, 77, 64), 3))
    vt = fn.transpose_v(v8)
    assert vt.shape == (2, 2, 64, 128) and vt.dtype == torch.float8_e4m3fn
    keys = fn.column_keys(77)
    for col in (0, 1, 2, 5, 31, 32, 76, 77, 100, 127):
        key = int(keys[col])
        expected = v8[:, :, key].float() if key < 77 else torch.zeros(2, 2, 64)
        assert torch.equal(vt[:, :, :, col].float(), expected), col


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
    ops = [fn.quantize_per_head(x) for x in (q, k, v)]
    out, lse = fn.emulate_attention(ops[0][0], ops[1][0], ops[2][0], ops[0][1], ops[1][1], ops[2][1], causal)
    ref, ref_lse = attention64(q, k, v, causal)
    err = rel(out, ref)
    assert 0.02 < err < TOLERANCE["fp8"]["fwd"] / 1.5, err
    assert rel(lse, ref_lse) < 5e-3


def test_emulation_without_rounding_is_attention():
    """The tile-by-tile online softmax, the 2^8 shift of P and the descales cancel out: with every
    rounding taken away (float32 operands, descales of 1, P not rounded) it is attention."""
    q, k, v = (randn((2, 4, 333, 64), s, torch.float32) for s in (20, 21, 22))
    ones = torch.ones(2, 4)
    to_e4m3 = fn.to_e4m3
    try:
        fn.to_e4m3 = lambda x: x.float()
        out, lse = fn.emulate_attention(q, k[:, :2], v[:, :2], ones, ones[:, :2], ones[:, :2], True)
    finally:
        fn.to_e4m3 = to_e4m3
    ref, ref_lse = attention64(q, k[:, :2], v[:, :2], True)
    assert rel(out, ref) < 1e-5 and rel(lse, ref_lse) < 1e-5


def test_descales_scale_scores_and_output():
    q, k, v = (randn((1, 1, 200, 64), s) for s in (30, 31, 32))
    (q8, dq), (k8, dk), (v8, dv) = (fn.quantize_per_head(x) for x in (q, k, v))
    base, _ = fn.emulate_attention(q8, k8, v8, dq, dk, dv)
    # halving descale_q and doubling descale_k leaves the scores alone; doubling descale_v the
    # output doubles
    same, _ = fn.emulate_attention(q8, k8, v8, dq / 2, dk * 2, dv)
    double, _ = fn.emulate_attention(q8, k8, v8, dq, dk, dv * 2)
    assert rel(same, base) < 1e-6 and rel(double, 2 * base) < 1e-6
    sharper, _ = fn.emulate_attention(q8, k8, v8, dq * 4, dk, dv)
    assert rel(sharper, base) > 0.1
