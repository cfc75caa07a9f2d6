"""The fp8 (e4m3) attention forward on the GPU: quantisation, kernel, refusals, the cell and the
scheduler's rung (kernels/flash_fp8.cu, flashwatt.kernels.custom_fp8; kernels/NOTES.md, "fp8 forward").

Two references, both float64-checked measures ||out - ref|| / ||ref||:

- float64 attention of the 16-bit inputs the user passed: bound TOLERANCE["fp8"]["fwd"] = 0.1.
  e4m3 keeps 3 mantissa bits (unit roundoff 2^-4); at one scale per head an N(0, 1) element
  is off by 2.6 % RMS, and Q, K, V and P are each rounded, which gives about 5 % on these
  inputs (flashwatt.kernels.fp8_numerics, which tests/test_fp8_numerics.py measures on the CPU);
  the bound is twice that.
- the emulation of the kernel's own arithmetic on the kernel's own e4m3 operands
  (fp8_numerics.emulate_attention, in float32 on the GPU; for the `_rsum` tiles with the row
  sums of P as rounded to e4m3): bound EMULATION_TOL = 1e-2 over at least FEW_ROWS rows,
  EMULATION_TOL_FEW_ROWS = 3e-2 over fewer. What may differ there is summation order (the fp8
  tensor cores accumulate Q K^T in fewer bits than fp32, about 14), ex2.approx against exp2, and
  so a P that rounds to the neighbouring e4m3 value. Such a flip moves its row by about
  2^-3 / sqrt(keys) of the row's norm, and at head dim 128 they are not rare: a relative error
  of 2^-14 to 2^-12 in S, put into the emulation on the CPU, moved 8 rows of 300 keys by up to
  1.1-2.2 % (norm over the 8 rows; single rows up to 4 %), and an H200 measured 1.02 % on such
  a case (one row 3 %, the others under 1 %) with every tile alike. Over many rows that averages
  to well under 1e-2, while a wrong layout (a key order, a swizzle, a descale) is off by tens of
  per cent at any row count. The LSE is held to the emulation's by the same bounds.

The quantisation step must equal its torch definition bit for bit (fp8_numerics.quantize_blocks,
transpose_v). Outputs are NaN-filled before each launch, so an unwritten element fails.
Off Hopper every fp8 call must be refused, naming the device's compute capability. Calls that
could take the host process down (capped grids, the extension's own C++ refusals) run in a child
interpreter, so that a crash fails their test, naming the call, and the session goes on.
"""
from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest
import torch

from flashwatt.attention.cell import Cell
from flashwatt.kernels import fp8_numerics as fn
from flashwatt.kernels.custom import Custom, flash_forward
from flashwatt.kernels.custom_fp8 import FP8_CAPABILITY, block_descales, flash_forward_fp8, fp8_kernel_info, quantize
from flashwatt.kernels.custom_variants import TILES, WGMMA_FP8_RSUM, WS_SCHEDULES, parse_variant
from flashwatt.vocabulary import TOLERANCE

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]  # builds the custom kernels

CAPABILITY = torch.cuda.get_device_capability() if torch.cuda.is_available() else None
HOPPER = CAPABILITY == FP8_CAPABILITY
TOL = TOLERANCE["fp8"]["fwd"]
EMULATION_TOL = 1e-2
EMULATION_TOL_FEW_ROWS, FEW_ROWS = 3e-2, 64
FP8_TILES = [name for name, tile in TILES.items() if "fp8" in tile.precisions]


def make(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def qkv(B, H, Lq, D, seed, Hkv=None, Lk=None, dtype=torch.bfloat16):
    Hkv, Lk = Hkv or H, Lk or Lq
    return make((B, H, Lq, D), dtype, seed), make((B, Hkv, Lk, D), dtype, seed + 1), make((B, Hkv, Lk, D), dtype, seed + 2)


def reference(q, k, v, causal, causal_align="top_left"):
    """float64 attention, k/v heads repeated for grouped queries; rows that see no key give 0."""
    group = q.shape[1] // k.shape[1]
    q64, k64, v64 = q.double(), k.double().repeat_interleave(group, 1), v.double().repeat_interleave(group, 1)
    s = q64 @ k64.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if causal:
        lq, lk = s.shape[-2:]
        offset = lk - lq if causal_align == "bottom_right" else 0
        seen = torch.arange(lk, device=s.device)[None, :] <= torch.arange(lq, device=s.device)[:, None] + offset
        s = s.masked_fill(~seen, float("-inf"))
    empty = torch.isneginf(s.amax(-1, keepdim=True))
    p = torch.softmax(s.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)
    return p @ v64


def rel(x, ref):
    assert torch.isfinite(x).all(), "non-finite values in the kernel's output"
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-300)).item()


def check(q, k, v, causal, variant="", causal_align="top_left", **launch):
    """The call on 16-bit inputs against float64 (<= TOL) and against the emulation on the
    kernel's own operands (<= EMULATION_TOL); rows that see no key exactly 0 with LSE -inf."""
    out = torch.full_like(q, float("nan"))
    got, lse = flash_forward_fp8(q, k, v, causal, variant, out=out, causal_align=causal_align, **launch)
    assert got.data_ptr() == out.data_ptr() and got.dtype == q.dtype
    ops = quantize(q, k, v)  # the kernel's own operands, V read back from its V^T
    rsum = parse_variant(variant, "fp8", q.shape[-1], CAPABILITY, k.shape[2], causal).tile.mma == WGMMA_FP8_RSUM
    emu, emu_lse = fn.emulate_attention(ops.q, ops.k, _v_from_vt(ops.vt, k.shape[2]), ops.descale_q, ops.descale_k,
                                        ops.descale_v, causal, causal_align=causal_align, sum_of_rounded_p=rsum)
    ref = reference(q, k, v, causal, causal_align)
    empty = torch.isneginf(emu_lse)
    if empty.any():
        assert torch.count_nonzero(got[empty]) == 0 and torch.isneginf(lse[empty]).all(), "rows that see no key"
    keep = ~empty
    e_ref, e_emu = rel(got[keep], ref[keep]), rel(got[keep], emu[keep])
    e_lse = rel(lse[keep], emu_lse[keep])
    bound = EMULATION_TOL if int(keep.sum()) >= FEW_ROWS else EMULATION_TOL_FEW_ROWS
    assert e_ref <= TOL, f"output against float64: rel err {e_ref:.3e} > {TOL:g}"
    assert e_emu <= bound, f"output against the emulation: rel err {e_emu:.3e} > {bound:g} ({int(keep.sum())} rows)"
    assert e_lse <= bound, f"LSE against the emulation: rel err {e_lse:.3e}"
    return e_ref, e_emu


def _v_from_vt(vt, len_k):
    """V (B, H, len_k, D) e4m3 read back from the kernel's V^T: inverts fp8_numerics.transpose_v."""
    keys = fn.column_keys(len_k).to(vt.device)
    B, H, rows, cols = vt.shape
    D = rows - fn.VT_EXTRA_ROWS
    v = torch.zeros((B, H, cols, D), dtype=torch.float32, device=vt.device)
    v[:, :, keys] = vt[:, :, :D].float().transpose(2, 3)
    return v[:, :, :len_k].to(fn.E4M3)


def refused(fn_call, match=r"compute capability 9\.0.*this device has"):
    with pytest.raises(ValueError, match=match):
        fn_call()


# ---------------------------------------------------------------- quantisation

@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("lq,lk,Hkv", [(1, 1, 2), (77, 130, 1), (1000, 333, 2), (256, 4097, 4)])
def test_quantisation_is_its_torch_definition(D, dtype, lq, lk, Hkv):
    """The descale of every block, the e4m3 bits of q and k, and V^T (keys permuted, zeros past
    len_k), against fp8_numerics.quantize_blocks computed on the same device."""
    seed = zlib.crc32(f"quant-{D}-{dtype}-{lq}-{lk}".encode()) % 100_000
    q, k, v = qkv(2, 4, lq, D, seed, Hkv=Hkv, Lk=lk, dtype=dtype)
    v[0, 0] = 0  # a head of zeros: descale 1, values 0
    q[1, 1, :min(lq, 64)] *= 2.0 ** -20  # a block far smaller than its neighbours: its own scale
    if not HOPPER:
        return refused(lambda: quantize(q, k, v))
    ops = quantize(q, k, v)
    (q8, dq), (k8, dk), (v8, dv) = fn.quantize_qkv(q, k, v)
    for name, got, want in (("q", ops.q, q8), ("k", ops.k, k8), ("V^T", ops.vt, fn.transpose_v(v8))):
        differ = (got.view(torch.uint8) != want.view(torch.uint8)).sum().item()
        assert differ == 0, f"{name}: {differ} of {got.numel()} e4m3 values differ from the definition"
    for name, got, want in (("q", ops.descale_q, dq), ("k", ops.descale_k, dk), ("v", ops.descale_v, dv)):
        assert got.shape == want.shape and torch.equal(got, want), (name, (got - want).abs().max().item())
    assert (dv[0, 0] == 1).all()
    assert torch.equal(_v_from_vt(ops.vt, lk).view(torch.uint8), v8.view(torch.uint8))


def test_strided_inputs_quantise_as_contiguous_ones():
    q, k, v = (make((2, 300, 4, 128), torch.bfloat16, s).transpose(1, 2) for s in (1, 2, 3))
    if not HOPPER:
        return refused(lambda: quantize(q, k, v))
    a, b = quantize(q, k, v), quantize(q.contiguous(), k.contiguous(), v.contiguous())
    for x, y in ((a.q, b.q), (a.k, b.k), (a.vt, b.vt)):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


# ---------------------------------------------------------------- the forward

@pytest.mark.parametrize("L", [1, 7, 127, 128, 1000, 2049])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("tile", FP8_TILES)
def test_matrix(tile, D, causal, L):
    B, H = (1, 2) if L > 1000 else (2, 3)
    seed = zlib.crc32(f"fp8-{tile}-{D}-{causal}-{L}".encode()) % 100_000
    args = qkv(B, H, L, D, seed)
    if not HOPPER:
        return refused(lambda: flash_forward_fp8(*args, causal, tile))
    if D not in TILES[tile].head_dims:  # the three-consumer tiles: head dim 64 only
        with pytest.raises(ValueError, match=rf"built for head_dim \(64,\), not {D}"):
            flash_forward_fp8(*args, causal, tile)
        return
    check(*args, causal, tile)


def _in_child(code: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter with this one's import path (and tests/gpu on it), from the
    repository root: a call that takes its process down fails the test that ran it, with the
    child's output, instead of ending the session."""
    root = Path(__file__).resolve().parents[2]
    path = [str(Path(__file__).resolve().parent), *(p for p in sys.path if p)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    return subprocess.run([sys.executable, "-X", "faulthandler", "-c", code], cwd=root, env=env,
                          capture_output=True, text=True, timeout=timeout)


def _child_report(proc: subprocess.CompletedProcess) -> str:
    calls = [line for line in proc.stdout.splitlines() if line.startswith("CALL ")]
    how = f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit code {proc.returncode}"
    return (f"child process: {how}; its last call: {calls[-1] if calls else 'none'}\n"
            f"--- stdout (tail)\n{proc.stdout[-2000:]}\n--- stderr (tail)\n{proc.stderr[-4000:]}")


def capped_grid_calls(tile: str) -> None:
    """The calls of test_capped_grids_visit_every_item, each announced on stdout before it runs
    (run in a child process by the test)."""
    args = qkv(2, 4, 1000, max(TILES[tile].head_dims), 21, Hkv=2)
    calls = [(causal, f"{tile}_{cap}", None) for causal in (False, True) for cap in ("ctas3", "sm1")]
    if TILES[tile].schedule in WS_SCHEDULES:  # items from a counter, or by a fixed stride
        calls += [(True, variant, counter) for counter in (True, False) for variant in (tile, f"{tile}_ctas3")]
    for causal, variant, counter in calls:
        print(f"CALL causal={causal} variant={variant} tile_counter={counter}", flush=True)
        check(*args, causal, variant, **({} if counter is None else {"tile_counter": counter}))
    print("DONE", flush=True)


@pytest.mark.parametrize("tile", FP8_TILES)
def test_capped_grids_visit_every_item(tile):
    """A persistent grid of 3 CTAs, and of one per SM: each CTA takes item after item, the
    shared memory of one reused for the next (its O staged through the K/V rings, or the
    persistent kernels' O buffer); the persistent tiles with and without a tile counter. A
    tile counter asked of a one-CTA-per-tile tile is refused before the extension."""
    args = qkv(2, 4, 1000, max(TILES[tile].head_dims), 21, Hkv=2)
    if not HOPPER:
        return refused(lambda: flash_forward_fp8(*args, True, f"{tile}_ctas3"))
    proc = _in_child(f"import test_fp8_kernel as t; t.capped_grid_calls({tile!r})")
    assert proc.returncode == 0 and "DONE" in proc.stdout, _child_report(proc)
    if TILES[tile].schedule not in WS_SCHEDULES:
        with pytest.raises(ValueError, match="only the persistent .* tiles take a tile counter"):
            flash_forward_fp8(*args, True, tile, tile_counter=True)


def test_the_extensions_own_refusals_reach_python_as_errors():
    """What the C++ binding refuses (TORCH_CHECK in kernels/flash_binding.cpp, before a launch or
    on the launch's error code) must raise RuntimeError in Python, not end the process: the
    fp8 forward with an lse of the wrong shape, with a tile counter on a one-CTA-per-tile
    tile, with a tile that is not compiled; V^T of a bf16 v; the 16-bit forward with an lse of
    the wrong shape and with an unknown copies value. Several of these messages carry numbers,
    which once crashed the process from the binding's own formatting. A crash names the call
    (_child_report)."""
    if not HOPPER:
        return
    code = """
import torch
from flashwatt.build import load_extension
from flashwatt.kernels.custom_fp8 import quantize
import test_fp8_kernel as t
q, k, v = t.qkv(1, 2, 256, 64, 5)
ops, ext = quantize(q, k, v), load_extension()
out, lse, bad = torch.empty_like(q), torch.empty((1, 2, 256), device="cuda"), torch.empty(3, device="cuda")
lock = ext.SCHEDULE_LOCKSTEP
cases = [("lse", bad, 128, lock, False), ("counter", lse, 128, lock, True), ("tile", lse, 64, lock, False)]
for name, l, block_m, schedule, counter in cases:
    print("CALL fp8", name, flush=True)
    try:
        ext.fp8_forward(ops.q, ops.k, ops.vt, ops.descale_q, ops.descale_k, ops.descale_v, out, l, False,
                        ext.CAUSAL_TOP_LEFT, 0.125, ext.MATH_WGMMA_FP8, block_m, 128, 8, 2, schedule, 0, 0, counter)
        print("NOT RAISED", name)
    except RuntimeError as err:
        print("RAISED", name, str(err).splitlines()[0])
print("CALL fp8 transpose", flush=True)  # thrown from a frame without a 128-byte aligned parameter block
try:
    ext.fp8_transpose_v(v, ops.vt)
    print("NOT RAISED transpose")
except RuntimeError as err:
    print("RAISED transpose", str(err).splitlines()[0])
# the 16-bit forward: an lse of the wrong shape; an unknown copies value (a message with a number in it)
for name, l, copies in (("bf16", bad, 0), ("copies", lse, 7)):
    print("CALL", name, flush=True)
    try:
        ext.forward(q, k, v, out, l, False, ext.CAUSAL_TOP_LEFT, 0.125, ext.MATH_MMA_SYNC, 64, 64, 4, 2, lock, 0, 0,
                    False, copies)
        print("NOT RAISED", name)
    except RuntimeError as err:
        print("RAISED", name, str(err).splitlines()[0])
"""
    proc = _in_child(code)
    assert proc.returncode == 0, _child_report(proc)
    raised = {line.split()[1]: line for line in proc.stdout.splitlines() if line.startswith("RAISED")}
    assert set(raised) == {"lse", "counter", "tile", "transpose", "bf16", "copies"}, proc.stdout
    # Messages with numbers (the binding formats them without a stream: flash_binding.cpp)
    assert "copies 7 not one of" in raised["copies"] and "block_m 64" in raised["tile"], proc.stdout
    assert "lse must be a contiguous float32" in raised["lse"] and "lse must be" in raised["bf16"]
    assert "tile counter needs a persistent" in raised["counter"]
    assert "no compiled kernel" in raised["tile"] and "must be float8_e4m3fn" in raised["transpose"]


# (Lq, Lk): fewer queries than keys, more (bottom-right: the first Lq - Lk see no key), off the grid
ALIGN_LENGTHS = [(1, 300), (100, 333), (333, 100), (300, 1), (130, 257), (700, 1500)]


@pytest.mark.parametrize("align", ["top_left", "bottom_right"])
@pytest.mark.parametrize("D", [64, 128])
def test_causal_alignments_and_gqa(D, align):
    for Hkv in (1, 2, 4):
        for lq, lk in ALIGN_LENGTHS:
            seed = zlib.crc32(f"fp8-align-{D}-{align}-{Hkv}-{lq}-{lk}".encode()) % 100_000
            args = qkv(2, 4, lq, D, seed, Hkv=Hkv, Lk=lk)
            if not HOPPER:
                return refused(lambda: flash_forward_fp8(*args, True, causal_align=align))
            for tile in (t for t in FP8_TILES if D in TILES[t].head_dims):
                check(*args, True, tile, causal_align=align)
            check(*args, False, causal_align=align)


@pytest.mark.parametrize("D", [64, 128])
def test_pre_quantised_inputs(D):
    """float8_e4m3fn q, k, v with descales of the caller's own (not amax / 448: the kernel must
    use the ones it is given) against the emulation and float64 of what they stand for."""
    q, k, v = qkv(2, 4, 500, D, 31, Hkv=2, Lk=700)
    g = torch.Generator(device="cuda").manual_seed(32)
    dq, dk, dv = (torch.rand((2, h), generator=g, device="cuda") * 0.02 + 0.001 for h in (4, 2, 2))
    q8, k8, v8 = (fn.to_e4m3(x.float() / d[:, :, None, None]) for x, d in ((q, dq), (k, dk), (v, dv)))
    if not HOPPER:
        return refused(lambda: flash_forward_fp8(q8, k8, v8, True, descales=(dq, dk, dv)))
    blocks = [block_descales(d, name, 2, d.shape[1], length, rows, "cuda")
              for name, d, length, rows in (("q", dq, 500, "q"), ("k", dk, 700, "kv"), ("v", dv, 700, "kv"))]
    for causal in (False, True):
        out, lse = flash_forward_fp8(q8, k8, v8, causal, descales=(dq, dk, dv))
        assert out.dtype == torch.bfloat16
        emu, emu_lse = fn.emulate_attention(q8, k8, v8, *blocks, causal)
        assert rel(out, emu) <= EMULATION_TOL and rel(lse, emu_lse) <= EMULATION_TOL
        deq = [x.float() * d[:, :, None, None] for x, d in ((q8, dq), (k8, dk), (v8, dv))]
        assert rel(out, reference(*deq, causal)) <= TOL
    half, _ = flash_forward_fp8(q8, k8, v8, False, descales=(dq, dk, dv), out_dtype=torch.float16)
    assert half.dtype == torch.float16
    assert rel(half, fn.emulate_attention(q8, k8, v8, *blocks, False)[0]) <= EMULATION_TOL
    # descales of the caller's own per block, each block's different: the kernel must apply each
    # where its block is (a query block per warpgroup, a key block per K/V tile)
    per_block = [b * (0.5 + torch.rand(b.shape, generator=g, device="cuda")) for b in blocks]
    for causal in (False, True):
        out, lse = flash_forward_fp8(q8, k8, v8, causal, descales=tuple(per_block))
        emu, emu_lse = fn.emulate_attention(q8, k8, v8, *per_block, causal)
        assert rel(out, emu) <= EMULATION_TOL and rel(lse, emu_lse) <= EMULATION_TOL, causal
        assert rel(out, fn.emulate_attention(q8, k8, v8, *blocks, causal)[0]) > 0.05  # the blocks' scales count
    with pytest.raises(ValueError, match="need descales"):
        flash_forward_fp8(q8, k8, v8, False)
    with pytest.raises(ValueError, match=r"descale_k must be a \(2, 2\) tensor"):
        flash_forward_fp8(q8, k8, v8, False, descales=(dq, dq, dv))


def test_blhd_layout_and_fp16_inputs():
    q, k, v = (make((2, 333, h, 128), torch.float16, s) for s, h in ((41, 4), (42, 2), (43, 2)))
    if not HOPPER:
        return refused(lambda: flash_forward_fp8(q, k, v, True, layout="blhd"))
    out, _ = flash_forward_fp8(q, k, v, True, layout="blhd")
    assert out.shape == q.shape and out.dtype == torch.float16
    ref = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True).transpose(1, 2)
    assert rel(out, ref) <= TOL
    bhld, _ = flash_forward_fp8(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), True)
    assert torch.equal(bhld.transpose(1, 2), out)


def test_flash_forward_and_the_cell_kernel_dispatch_fp8():
    q, k, v = qkv(2, 4, 600, 64, 51)
    cell = Cell(suite="t", kernel="custom", precision="fp8", seq_len=600, batch=2, heads=4, head_dim=64, causal=True)
    kern = Custom()
    if not HOPPER:
        assert f"this device has {CAPABILITY[0]}.{CAPABILITY[1]}" in kern.supports(cell, torch.device("cuda"))
        return refused(lambda: flash_forward(q, k, v, True, precision="fp8"))
    a, _ = flash_forward(q, k, v, True, precision="fp8")
    b, _ = flash_forward_fp8(q, k, v, True)
    with torch.no_grad():
        c = kern(q, k, v, cell)
    assert torch.equal(a, b) and torch.equal(a, c)
    assert kern.supports(cell, torch.device("cuda")) is None
    assert "head_dim" in kern.supports(dataclasses.replace(cell, head_dim=256), torch.device("cuda"))
    assert "forward only" in kern.supports(dataclasses.replace(cell, pass_="fwd_bwd"), torch.device("cuda"))
    with pytest.raises(ValueError, match="no backward"):
        kern(q.requires_grad_(), k, v, cell)


# ---------------------------------------------------------------- refusals

def test_refusals_name_what_is_wrong():
    q, k, v = qkv(1, 2, 64, 64, 61)
    if not HOPPER:
        cap = f"{CAPABILITY[0]}.{CAPABILITY[1]}"
        refused(lambda: flash_forward_fp8(q, k, v, False), match=rf"compute capability 9\.0.*this device has {cap}")
        with pytest.raises(ValueError, match=r"wgmma\.e4m3, built only for compute capability 9\.0"):
            from flashwatt.kernels.custom_variants import parse_variant
            parse_variant(FP8_TILES[0], "fp8", 64, CAPABILITY)
        return
    with pytest.raises(ValueError, match="head_dim 64, 128"):
        flash_forward_fp8(*qkv(1, 2, 64, 256, 62), False)
    with pytest.raises(ValueError, match="float16 or bfloat16"):
        flash_forward_fp8(q.float(), k.float(), v.float(), False)
    with pytest.raises(ValueError, match="multiple of k/v heads"):
        flash_forward_fp8(*qkv(1, 3, 64, 64, 63, Hkv=2), False)
    with pytest.raises(ValueError, match="variant"):
        flash_forward_fp8(q, k, v, False, "wgmma_m128_n128_s2")  # a bf16 tile
    with pytest.raises(ValueError, match="causal_align"):
        flash_forward_fp8(q, k, v, True, causal_align="middle")
    with pytest.raises(ValueError, match="CUDA"):
        flash_forward_fp8(q.cpu(), k.cpu(), v.cpu(), False)


def test_kernels_have_no_local_memory():
    for tile in FP8_TILES:
        for D in TILES[tile].head_dims:
            if not HOPPER:
                return refused(lambda: fp8_kernel_info(D, tile))
            info = fp8_kernel_info(D, tile)
            assert info["local_bytes"] == 0 and info["max_ctas_per_sm"] >= 1, (tile, D, info)


# ---------------------------------------------------------------- the cell and the scheduler

def test_fp8_cell_records_its_error_beside_bf16_and_its_parts():
    from flashwatt.attention.job import run_cell

    cell = Cell(suite="seed", kernel="custom", precision="fp8", seq_len=1024, batch=2, heads=8, head_dim=128,
                causal=True)
    settings = {"energy": False, "warmup_ms": 30, "min_repeats": 5, "min_time_ms": 30}
    rec = run_cell(cell, settings).record
    if not HOPPER:
        assert rec["status"] == "skipped" and "compute capability 9.0" in rec["reason"], rec
        return
    assert rec["status"] == "ok", rec.get("reason") or rec.get("traceback")
    check = rec["check"]
    assert 0 < check["rel_err_bf16_same_inputs"] < check["rel_err"] <= TOL, check
    parts = rec["parts"]
    assert set(parts) == {"quantize", "attention"}
    assert 0 < parts["quantize"]["median_ms"] < rec["timing"]["median_ms"]
    assert 0 < parts["attention"]["median_ms"] < rec["timing"]["median_ms"]


def test_the_scheduler_runs_fp8_only_within_the_tolerance():
    from flashwatt.control.configuration import ControlError, candidates
    from flashwatt.control.controller import Controller

    assert not any(c.precision == "fp8" for c in candidates("bf16", precision_opt_in=True, tolerance=0.05))
    assert any(c.label == "custom fp8" for c in candidates("bf16", precision_opt_in=True, tolerance=0.1))
    q, k, v = qkv(4, 16, 2048, 128, 71)
    ctl = Controller("static", configuration="custom fp8", cache=None, precision_tolerance=TOL)
    try:
        if not HOPPER:  # the one configuration refused (its reason: Custom.supports, tested above)
            with pytest.raises(ControlError, match="no configuration could run shape"):
                ctl.attention(q, k, v, causal=True)
            return
        with torch.no_grad():
            out = ctl.attention(q, k, v, causal=True)
        assert out.dtype == torch.bfloat16 and rel(out[0, :2], reference(q[0, :2], k[0, :2], v[0, :2], True)) <= TOL
        checks = ctl.checks()  # the sampled float64 check ran and passed
        assert list(checks["config"]) == ["custom fp8"] and bool(checks["passed"].iloc[0]), checks
        assert 0 < checks["rel_err"].iloc[0] <= TOL
    finally:
        ctl.close()


# ---------------------------------------------------------------- the benchmark

def test_the_benchmark_times_fp8_beside_our_bf16_forward(tmp_path):
    """`python -m flashwatt.bench --dtypes fp8`: the call, its kernel and its quantisation apart,
    our bf16 forward, in the same rounds; fp8 outputs checked against FlashAttention-2's."""
    import csv

    from flashwatt import bench

    out = tmp_path / "bench.csv"
    rc = bench.main(["--dtypes", "fp8", "--shapes", "2x8x1024x128", "--masks", "causal", "--min-time-ms", "20",
                     "--rounds", "2", "--out", str(out)])
    assert rc == 0
    rows = {(r["kernel"], r["variant"], r["part"], r["dtype"]): r for r in csv.DictReader(out.open())}
    fp8, bf16 = rows[("custom", "", "", "fp8")], rows[("custom", "", "", "bf16")]
    parts = [rows[("custom", "", part, "fp8")] for part in ("attention", "quantize")]
    if not HOPPER:
        assert math.isnan(float(fp8["tflops"])) and float(bf16["tflops"]) > 1.0
        return
    assert float(fp8["rel_err_vs_flash"]) <= TOL and float(bf16["rel_err_vs_flash"]) <= TOLERANCE["bf16"]["fwd"]
    for r in (fp8, bf16, *parts):
        assert float(r["tflops"]) > 1.0 and r["rounds"] == "2", r
    # the parts are each shorter than the whole call
    assert all(float(p["ms"]) < float(fp8["ms"]) for p in parts)
    assert ("cudnn_fp8", "", "", "fp8") in rows  # a peer: timed where its frontend is installed
