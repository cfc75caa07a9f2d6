"""The warp-specialised wgmma backward tiles (kernels/flash_bwd_wgmma_ws.cuh): `wgmma_ws_n128_m64_w12`
at head dims 64 and 128, and `wgmma_ws_n128_m128_w12` (128-row query steps, each consumer's dQ
over its own 64 of them) at head dim 64; every test below runs both where they are built.

- Gradients against float64 (the measure and bounds of tests/gpu/test_custom_kernel.py's
  check_backward: fp16/bf16, full / causal top-left / causal bottom-right, lengths 1..2048 with
  ragged ends, unequal query and key lengths, MHA/GQA/MQA, both layouts, packed views, L2
  sections, dQ by atomics and by the deterministic pass), gradient buffers NaN-filled.
- Against `wgmma_n128_m64_w8`, whose steps its consumers run unchanged, from the same forward:
  dK and dV bit for bit in both dQ modes; dQ bit for bit in the deterministic mode (both
  tiles then take dQ from the same pass), and within a few units in the last place with the
  dQ reductions, whose fp32 additions land in an order that varies from run to run.
- The main kernels' resources (168 registers at launch, no local memory, 199168 bytes of
  dynamic shared memory at head dim 128, 133632 at 64 and 200192 with 128-row steps, one CTA
  of 384 threads per SM) and a compute-sanitizer memcheck run.
- Head dims 64 and 128 (at 64 each consumer's dQ sums over its own keys, or with 128-row
  steps over its own queries; dS^T is then computed before dV is issued: the same arithmetic,
  so dK and dV are the same bits as `wgmma_n128_m64_w8`'s as well).
- Off compute capability 9.0 and at head dim 256: the refusal, naming the tile.
- The default on Hopper: the plan, and operands with zero and wide strides.
"""
from __future__ import annotations

import math
import textwrap
import zlib

import pytest
import torch

from flashwatt.kernels import custom_backward
from flashwatt.kernels.custom import WGMMA_CAPABILITY, flash_forward
from flashwatt.kernels.custom_autograd import flash_attention
from flashwatt.kernels.custom_backward import BWD_TILES, backward_kernel_info, backward_plan, flash_backward
from test_custom_kernel import DTYPES, GRAD_TOL, check_backward, grad_err, make, qkv, reference_grads, run_memcheck

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]  # builds the custom kernels

WS = "wgmma_ws_n128_m64_w12"
WS_M128 = "wgmma_ws_n128_m128_w12"
BASE = "wgmma_n128_m64_w8"
D = 128  # the head dim it is the default at; DIMS: every head dim it is built for
DIMS = (64, 128)
# (tile, head dim): every warp-specialised kernel
CASES = [(WS, 64), (WS, 128), (WS_M128, 64)]
# Dynamic shared memory of BwdWsShape<D, BM> (kernels/flash_bwd_wgmma_ws.cuh): at head dim 64
# the K, V, Q and dO tiles are half as wide, the dS^T and dQ staging the same; with 128-row
# steps Q, dO and dS^T double, and the dQ staging is one tile per consumer, not two.
SMEM_BYTES = {(WS, 64): 133632, (WS, 128): 199168, (WS_M128, 64): 200192}
CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
HOPPER = CAPABILITY == WGMMA_CAPABILITY
HEADS = {"mha": (4, 4), "gqa": (8, 2), "mqa": (8, 1)}
# (causal, causal_align)
MASKS = {"full": (False, "top_left"), "causal": (True, "top_left"), "causal_br": (True, "bottom_right")}


@pytest.fixture
def poisoned_grads(monkeypatch):
    """The backward's output buffers NaN-filled, so an element it does not write fails."""
    allocate = custom_backward.grad_buffer
    monkeypatch.setattr(custom_backward, "grad_buffer", lambda t: allocate(t).fill_(float("nan")))


def check_ws(q, k, v, causal, precision, layout="bhld", tile=WS, **kw):
    """check_backward through the tile on Hopper; elsewhere the refusal naming it."""
    if not HOPPER:
        with pytest.raises(ValueError, match=rf"'{tile}' uses wgmma, built only for compute capability 9\.0"):
            check_backward(q, k, v, causal, precision, layout, backward_tile=tile, **kw)
        return None
    return check_backward(q, k, v, causal, precision, layout, backward_tile=tile, **kw)


def test_tile_is_registered_and_the_hopper_default():
    t = BWD_TILES[WS]
    assert t.warp_specialised and t.head_dims == DIMS and (t.block_n, t.block_m, t.warps) == (128, 64, 12)
    t = BWD_TILES[WS_M128]
    assert t.warp_specialised and t.head_dims == (64,) and (t.block_n, t.block_m, t.warps) == (128, 128, 12)
    for precision in ("fp16", "bf16"):
        for deterministic in (False, True):
            for head_dim in DIMS:
                assert backward_plan(precision, head_dim, None, CAPABILITY, deterministic).tile_name == (
                    {64: WS_M128, 128: WS}[head_dim] if HOPPER else "n128_m64_w8")


@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_default_tile_on_broadcast_and_strided_operands(poisoned_grads, mask, D):
    """The default backward (this tile on Hopper) on operands a model or a user
    hands over: k and v expanded over the heads and the batch (stride 0), q a slice of a wider
    tensor (row stride past the head dim), dout non-contiguous. Its TMA maps take every
    operand's own strides, or the operand is copied first (kernel_ready)."""
    causal, align = MASKS[mask]
    B, H, L = 2, 4, 300
    base_k, base_v = make((1, 1, L, D), torch.bfloat16, 31), make((1, 1, L, D), torch.bfloat16, 32)
    k, v = base_k.expand(B, H, L, D), base_v.expand(B, H, L, D)
    wide = make((B, H, L, 2 * D), torch.bfloat16, 33)
    q = wide[..., :D]
    leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]  # the views, strides kept
    assert leaves[1].stride()[:2] == (0, 0) and leaves[0].stride(2) == 2 * D
    dout = make((B, L, H, D), torch.bfloat16, 34).transpose(1, 2)
    out = flash_attention(*leaves, causal, causal_align=align)
    grads = torch.autograd.grad(out, leaves, dout)
    refs = reference_grads(*(t.detach() for t in leaves), dout, causal, causal_align=align)
    for name, g, r in zip(("dq", "dk", "dv"), grads, refs):
        err = grad_err(g, r)
        assert err <= GRAD_TOL["bf16"], f"{mask} {name}: {err:.3e}"


@pytest.mark.parametrize("tile,head_dim", CASES)
@pytest.mark.parametrize("heads", sorted(HEADS))
@pytest.mark.parametrize("L", [1, 17, 64, 129, 1000, 2048])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_gradients_against_float64(poisoned_grads, precision, mask, L, heads, tile, head_dim):
    """Equal lengths (bottom-right is then top-left: the same mask through the other
    parameter), ragged last blocks, MHA/GQA/MQA (a CTA walks every query head of its group:
    up to 8 x 32 steps through the two-stage ring), dQ by the bulk reductions."""
    causal, align = MASKS[mask]
    H, Hkv = HEADS[heads]
    B = 2 if L <= 129 else 1
    seed = zlib.crc32(f"bwdws-{precision}-{mask}-{L}-{heads}-{head_dim}".encode()) % 100_000
    check_ws(*qkv(B, H, L, head_dim, DTYPES[precision], seed, Hkv=Hkv), causal, precision, tile=tile, seed=seed,
             causal_align=align)


CROSS = [(100, 700), (700, 100), (1, 300), (300, 1), (64, 192), (200, 64), (1500, 333), (333, 1500), (63, 65),
         (65, 63)]


@pytest.mark.parametrize("tile,head_dim", CASES)
@pytest.mark.parametrize("deterministic", [False, True], ids=["atomics", "dq-pass"])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_cross_lengths(poisoned_grads, precision, mask, deterministic, tile, head_dim):
    """Lq != Lk: key blocks no query sees (they store zeros after loading K and V), the first
    causal query block past the end, rows that see no key (bottom-right, Lq > Lk: dQ exactly 0),
    a single query or key, GQA."""
    causal, align = MASKS[mask]
    for lq, lk in CROSS:
        seed = zlib.crc32(f"bwdws-cross-{precision}-{mask}-{lq}-{lk}".encode()) % 100_000
        check_ws(*qkv(2, 4, lq, head_dim, DTYPES[precision], seed, Hkv=2, Lk=lk), causal, precision, tile=tile,
                 seed=seed, deterministic=deterministic, causal_align=align)


@pytest.mark.parametrize("tile,D", CASES)
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_layouts_and_packed_views(poisoned_grads, precision, mask, tile, D):
    """blhd, and q, k, v as views of one packed (B, L, 3, H, D) tensor: the TMA maps take
    each operand's own strides."""
    causal, align = MASKS[mask]
    dt = DTYPES[precision]
    q, k, v = make((2, 333, 8, D), dt, 11), make((2, 333, 2, D), dt, 12), make((2, 333, 2, D), dt, 13)
    check_ws(q, k, v, causal, precision, "blhd", tile=tile, seed=11, causal_align=align)
    B, L, H = 2, 257, 4
    packed = make((B, L, 3, H, D), dt, 14).requires_grad_(True)
    q, k, v = (packed[:, :, i].transpose(1, 2) for i in range(3))  # (B, H, L, D) views, rows 3 H D apart
    dout = make((B, H, L, D), dt, 15)
    if not HOPPER:
        with pytest.raises(ValueError, match=rf"'{tile}' uses wgmma"):
            flash_attention(q, k, v, causal, backward_tile=tile, causal_align=align)
        return
    out = flash_attention(q, k, v, causal, backward_tile=tile, causal_align=align)
    (grad,) = torch.autograd.grad(out, packed, dout)
    refs = reference_grads(q, k, v, dout, causal, causal_align=align)
    for i, (name, r) in enumerate(zip(("dq", "dk", "dv"), refs)):
        err = grad_err(grad[:, :, i].transpose(1, 2), r)
        assert err <= GRAD_TOL[precision], f"packed {name}: {err:.3e}"


@pytest.mark.parametrize("tile,D", CASES)
@pytest.mark.parametrize("section", [1, 5, 0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_l2_sections(poisoned_grads, causal, section, tile, D):
    q, k, v = qkv(3, 4, 300, D, torch.bfloat16, 91 + section, Hkv=2)
    check_ws(q, k, v, causal, "bf16", tile=tile, seed=section, l2_section=section)


def _both_tiles(q, k, v, causal, precision, align, deterministic, dout, ws=WS):
    """(dq, dk, dv) of the tile and of wgmma_n128_m64_w8 from one forward (its out and LSE)."""
    head_dim = q.shape[-1]
    scale = 1.0 / math.sqrt(head_dim)
    out, lse = flash_forward(q, k, v, causal, scale=scale, causal_align=align)
    grads = {}
    for tile in (ws, BASE):
        plan = backward_plan(precision, head_dim, tile, CAPABILITY, deterministic)
        grads[tile] = flash_backward(dout, q, k, v, out, lse, causal, scale, plan, causal_align=align)
    return grads[ws], grads[BASE]


@pytest.mark.parametrize("tile,head_dim", CASES)
@pytest.mark.parametrize("deterministic", [True, False], ids=["dq-pass", "atomics"])
@pytest.mark.parametrize("mask", sorted(MASKS))
@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_same_gradients_as_the_wgmma_tile(precision, mask, deterministic, tile, head_dim):
    """The consumers run wgmma_n128_m64_w8's step unchanged, over the same query blocks in the
    same order, so dK and dV are the same bits; so is dQ where both take it from the
    deterministic pass. With the reductions, dQ's fp32 sums land in a varying order: each
    element within 2 units in the last place of the input dtype (plus a floor for sums that
    cancel)."""
    if not HOPPER:
        with pytest.raises(ValueError, match=rf"'{tile}' uses wgmma"):
            backward_plan(precision, head_dim, tile, CAPABILITY, deterministic)
        return
    causal, align = MASKS[mask]
    dt = DTYPES[precision]
    for B, H, Hkv, lq, lk in ((2, 8, 2, 2048, 2048), (1, 4, 1, 1000, 333), (1, 4, 2, 333, 1000), (2, 4, 4, 1, 77)):
        seed = zlib.crc32(f"bwdws-same-{precision}-{mask}-{lq}-{lk}-{head_dim}".encode()) % 100_000
        q, k, v = qkv(B, H, lq, head_dim, dt, seed, Hkv=Hkv, Lk=lk)
        dout = make(q.shape, dt, seed + 7)
        (dq, dk, dv), (dq0, dk0, dv0) = _both_tiles(q, k, v, causal, precision, align, deterministic, dout, tile)
        assert torch.equal(dk, dk0), f"dk differs from {BASE} ({B}x{H}/{Hkv}x{lq}/{lk})"
        assert torch.equal(dv, dv0), f"dv differs from {BASE} ({B}x{H}/{Hkv}x{lq}/{lk})"
        if deterministic:
            assert torch.equal(dq, dq0), f"dq differs from {BASE} in the deterministic mode"
        else:
            eps = torch.finfo(dt).eps
            floor = 1e-3 * dq0.float().abs().max().item()
            assert torch.allclose(dq.float(), dq0.float(), rtol=2 * eps, atol=floor), \
                f"dq: {(dq.float() - dq0.float()).abs().max().item():.3e} from {BASE}"


def test_deterministic_mode_is_bit_identical_twice():
    if not HOPPER:
        pytest.skip("the refusal off Hopper: test_same_gradients_as_the_wgmma_tile")
    q, k, v = qkv(2, 8, 2048, D, torch.bfloat16, 99, Hkv=2)
    dout = make(q.shape, torch.bfloat16, 98)
    runs = []
    for _ in range(2):
        leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = flash_attention(*leaves, True, backward_tile=WS, deterministic=True)
        runs.append(torch.autograd.grad(out, leaves, dout))
    for name, a, b in zip(("dq", "dk", "dv"), *runs):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"


def test_refusals_name_the_tile():
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 64, 256, torch.bfloat16, 5))
    with pytest.raises(ValueError, match=rf"'{WS}' is built for head_dim \(64, 128\), not 256"):
        flash_attention(q, k, v, False, backward_tile=WS)
    q, k, v = (t.requires_grad_(True) for t in qkv(1, 2, 64, 128, torch.float32, 5))
    with pytest.raises(ValueError, match=rf"takes no tile \(got '{WS}'\)"):
        flash_attention(q, k, v, False, backward_tile=WS)


def test_kernel_resources():
    """What ptxas reported without a GPU (kernels/NOTES.md, "Backward warp-specialised"), as
    the runtime sees it: 168 registers per thread at launch (setmaxnreg then moves them), no
    local memory, the dynamic shared memory of BwdWsShape, one CTA of 384 threads per SM."""
    if not HOPPER:
        with pytest.raises(ValueError, match=rf"'{WS}' uses wgmma"):
            backward_kernel_info("bf16", D, WS)
        return
    for tile, head_dim in CASES:
        for precision in ("fp16", "bf16"):
            info = backward_kernel_info(precision, head_dim, tile)
            assert info["path"] == "wgmma" and info["tile"] == tile and info["warp_specialised"], info
            assert (info["num_regs"], info["local_bytes"], info["threads"]) == (168, 0, 384), info
            assert info["smem_bytes"] == SMEM_BYTES[tile, head_dim] and info["max_ctas_per_sm"] == 1, info


_SANITIZER_SCRIPT = textwrap.dedent(
    f"""
    import torch
    from flashwatt.kernels.custom_autograd import flash_attention
    for dtype in (torch.float16, torch.bfloat16):
        for causal, align in ((False, "top_left"), (True, "top_left"), (True, "bottom_right")):
            for lq, lk, h, hkv in ((77, 77, 4, 2), (40, 130, 4, 2), (130, 40, 4, 1), (1, 200, 2, 2), (300, 1, 2, 1),
                                   (200, 200, 8, 1)):
                for deterministic, d, tile in ((False, 128, "{WS}"), (True, 128, "{WS}"), (False, 64, "{WS}"),
                                               (True, 64, "{WS}"), (False, 64, "{WS_M128}"), (True, 64, "{WS_M128}")):
                    q = torch.randn(2, h, lq, d, device="cuda", dtype=dtype, requires_grad=True)
                    k = torch.randn(2, hkv, lk, d, device="cuda", dtype=dtype, requires_grad=True)
                    v = torch.randn(2, hkv, lk, d, device="cuda", dtype=dtype, requires_grad=True)
                    out = flash_attention(q, k, v, causal, backward_tile=tile, l2_section=1,
                                          deterministic=deterministic, causal_align=align)
                    torch.autograd.grad(out, (q, k, v), torch.randn_like(out))
                    torch.cuda.synchronize()
    print("SANITIZER_SCRIPT_DONE")
    """
)


def test_compute_sanitizer_memcheck():
    """Out-of-bounds and misaligned accesses of the tile's kernels (TMA copies and
    reductions at ragged ends, rows that see no key, key blocks no query sees) under
    compute-sanitizer's memcheck, as tests/gpu/test_custom_kernel.py runs the other tiles."""
    if not HOPPER:
        pytest.skip("the refusal off Hopper: test_refusals_name_the_tile, test_kernel_resources")
    run_memcheck(_SANITIZER_SCRIPT)
